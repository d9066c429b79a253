//! Wake-ups for waiters: one pub/sub connection per backend (shared by its
//! clones), subscribed to one channel of its own.
//!
//! A waiter registers under a process-unique id and joins the key's queue in
//! Redis with that id and this backend's channel. When a release hands the
//! lock to it, the script publishes `"<id> <fence> <acquired ms>"` to the
//! channel, and the reader task passes it to that waiter: the waiter
//! returns the lease without another round trip. The waiter then at the
//! head of the queue hears how long the new holder holds (`"w <id> <ms>"`),
//! so it wakes when that TTL runs out, not at the old holder's expiry.
//! Flight results (`"f ..."`) are the only other messages: a process only
//! receives messages for its own waiters.
//!
//! The subscription is made on demand (the first time a waiter finds a lock
//! busy) and replaced after it dies. When it dies (Redis killed or
//! restarted, connection killed, keep-alive `PING` unanswered) every
//! registered waiter's sender is dropped, which tells it to re-check at once
//! and subscribe again: a grant published while nobody listened is then
//! found by that re-check, since acquire is idempotent for the owner it was
//! granted to.

use std::collections::HashMap;
#[cfg(feature = "redis-cluster")]
use std::collections::HashSet;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use deadpool_redis::redis::Client;
use deadpool_redis::redis::aio::{PubSubSink, PubSubStream};
use futures_core::Stream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio::time::{Instant, timeout, timeout_at};

use super::error::{redis_error, timed_out};
use crate::error::LockError;
pub(super) use message::Wake;
use message::{parse_flight, parse_free_in, parse_grant};

mod message;

/// What a listening waiter hears: hints of when its lock may be free, then
/// at most one grant; closed (`None`) when the subscription died.
pub(super) type Wakes = mpsc::UnboundedReceiver<Wake>;

/// How often an idle subscription proves it is alive. Catches half-open
/// connections that never report an error.
const KEEPALIVE: Duration = Duration::from_secs(1);

/// A flight's result, published to the callers that wait for it (see
/// `flight.rs`): `"f <seq> <id>[,<id>…]\n<value>"`, one message per channel
/// for all of that channel's watchers.
pub(super) type FlightNews = crate::backend::FlightResult;

/// Where the subscription is made.
pub(super) enum Transport {
    /// One server: `SUBSCRIBE` to the backend's channel.
    Single(Box<Client>),
    /// A cluster: `SSUBSCRIBE` to the backend's channel of each hash slot
    /// it waits in, on the shard owning that slot.
    #[cfg(feature = "redis-cluster")]
    Cluster(super::cluster::Nodes),
}

pub(super) struct Wakeups {
    transport: Transport,
    channel: String,
    dispatch: Arc<Dispatch>,
    connecting: tokio::sync::Mutex<()>,
    next_id: AtomicU64,
}

#[derive(Default)]
struct Dispatch {
    inner: Mutex<DispatchInner>,
}

#[derive(Default)]
struct DispatchInner {
    /// The generation of the live subscription, if any.
    up: Option<u64>,
    generation: u64,
    /// Waiter id → (hash slot of its lock, where what it hears goes).
    waiters: HashMap<u64, (u16, mpsc::UnboundedSender<Wake>)>,
    /// Flight watcher id → (hash slot of its flight, where its result goes).
    flights: HashMap<u64, (u16, oneshot::Sender<FlightNews>)>,
    reader: Option<AbortHandle>,
    /// Cluster: the slots whose channel is subscribed on the live
    /// connection; the connection itself, to subscribe more.
    #[cfg(feature = "redis-cluster")]
    slots: HashSet<u16>,
    #[cfg(feature = "redis-cluster")]
    sharded: Option<deadpool_redis::redis::cluster_async::ClusterConnection>,
}

impl Dispatch {
    fn lock(&self) -> MutexGuard<'_, DispatchInner> {
        // Every critical section leaves the map consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deliver(&self, payload: &[u8]) {
        if let Some(news) = payload.strip_prefix(b"f ") {
            return self.deliver_flight(news);
        }
        if let Some(news) = payload.strip_prefix(b"w ") {
            if let Some((id, free_in)) = parse_free_in(news)
                && let Some((_, tx)) = self.lock().waiters.get(&id)
            {
                let _ = tx.send(Wake::FreeIn(free_in));
            }
            return;
        }
        let Some((id, grant)) = parse_grant(payload) else {
            return;
        };
        let waiter = self.lock().waiters.remove(&id);
        if let Some((_, tx)) = waiter {
            // A waiter that is gone meanwhile leaves the queue with a script
            // that also releases a lock handed to it.
            let _ = tx.send(Wake::Granted(grant));
        }
    }

    fn deliver_flight(&self, news: &[u8]) {
        let Some((seq, ids, value)) = parse_flight(news) else {
            return;
        };
        let result = FlightNews {
            seq,
            value: std::sync::Arc::from(value),
        };
        let watchers: Vec<_> = {
            let mut inner = self.lock();
            ids.filter_map(|id| inner.flights.remove(&id)).collect()
        };
        for (_, tx) in watchers {
            let _ = tx.send(result.clone());
        }
    }

    /// The subscription of `generation` died: wake every waiter to re-check.
    fn down(&self, generation: u64) {
        let dropped = {
            let mut inner = self.lock();
            if inner.up != Some(generation) {
                return;
            }
            inner.up = None;
            inner.reader = None;
            #[cfg(feature = "redis-cluster")]
            {
                inner.slots.clear();
                inner.sharded = None;
            }
            (
                std::mem::take(&mut inner.waiters),
                std::mem::take(&mut inner.flights),
            )
        };
        drop(dropped);
    }

    /// Cluster: messages of the slots `lost` selects may have been missed
    /// (a node's connection dropped, a slot moved away): forget their
    /// subscriptions and wake their waiters to re-check and subscribe again.
    #[cfg(feature = "redis-cluster")]
    fn lost(&self, generation: u64, lost: impl Fn(u16) -> bool) {
        let dropped = {
            let mut inner = self.lock();
            if inner.up != Some(generation) {
                return;
            }
            inner.slots.retain(|&slot| !lost(slot));
            (
                take_where(&mut inner.waiters, &lost),
                take_where(&mut inner.flights, &lost),
            )
        };
        drop(dropped);
    }
}

/// The entries of `map` whose slot `lost` selects, taken out.
#[cfg(feature = "redis-cluster")]
fn take_where<T>(map: &mut HashMap<u64, (u16, T)>, lost: impl Fn(u16) -> bool) -> Vec<(u16, T)> {
    let ids: Vec<u64> = map
        .iter()
        .filter(|(_, (slot, _))| lost(*slot))
        .map(|(&id, _)| id)
        .collect();
    ids.iter().filter_map(|id| map.remove(id)).collect()
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        let reader = self.dispatch.lock().reader.take();
        if let Some(reader) = reader {
            reader.abort();
        }
    }
}

impl Wakeups {
    pub(super) fn new(transport: Transport) -> Self {
        Wakeups {
            transport,
            channel: format!("tower-lock:wake:{}", uuid::Uuid::new_v4().simple()),
            dispatch: Arc::default(),
            connecting: tokio::sync::Mutex::new(()),
            next_id: AtomicU64::new(1),
        }
    }

    /// This backend's channel for a lock in hash `slot`, as stored with its
    /// queue entries. On a cluster it carries a hash tag of that slot, so
    /// the scripts can `SPUBLISH` to it (and they tell it by that brace).
    pub(super) fn channel(&self, slot: u16) -> std::borrow::Cow<'_, str> {
        let _ = slot;
        match &self.transport {
            Transport::Single(_) => std::borrow::Cow::Borrowed(&self.channel),
            #[cfg(feature = "redis-cluster")]
            Transport::Cluster(_) => std::borrow::Cow::Owned(format!(
                "{}:{{{}}}",
                self.channel,
                super::keys::slot_hash_tag(slot)
            )),
        }
    }

    /// A fresh waiter id.
    pub(super) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Register waiter `id`, waiting for a lock in hash `slot`, if the
    /// subscription that would carry its grant is live (so any grant
    /// published from now on reaches it); `None` if it is not.
    pub(super) fn register(&self, id: u64, slot: u16) -> Option<Wakes> {
        let mut inner = self.dispatch.lock();
        if !self.listening(&inner, slot) {
            return None;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        inner.waiters.insert(id, (slot, tx));
        Some(rx)
    }

    /// Whether a message published now to this backend's channel of `slot`
    /// reaches the reader.
    fn listening(&self, inner: &DispatchInner, slot: u16) -> bool {
        let _ = slot;
        #[cfg(feature = "redis-cluster")]
        if matches!(self.transport, Transport::Cluster(_)) && !inner.slots.contains(&slot) {
            return false;
        }
        inner.up.is_some()
    }

    pub(super) fn unregister(&self, id: u64) {
        let removed = self.dispatch.lock().waiters.remove(&id);
        drop(removed);
    }

    /// Register flight watcher `id` (a flight in hash `slot`), subscribing
    /// first if needed, by `end`: its receiver gets the first result
    /// published to it, or is dropped when the subscription dies.
    pub(super) async fn watch_flight(
        &self,
        id: u64,
        slot: u16,
        end: Instant,
        op_timeout: Duration,
    ) -> Result<FlightWatch, LockError> {
        let register = || {
            let mut inner = self.dispatch.lock();
            if !self.listening(&inner, slot) {
                return None;
            }
            let (tx, rx) = oneshot::channel();
            inner.flights.insert(id, (slot, tx));
            Some(FlightWatch {
                id,
                rx,
                dispatch: Arc::clone(&self.dispatch),
            })
        };
        for _ in 0..2 {
            if let Some(watch) = register() {
                return Ok(watch);
            }
            Box::pin(self.connect(slot, end, op_timeout)).await?;
        }
        register()
            .ok_or_else(|| LockError::BackendUnavailable("Redis pub/sub connection lost".into()))
    }

    /// Register waiter `id` for hash `slot`, subscribing first if needed,
    /// by `end`.
    pub(super) async fn subscribe(
        &self,
        id: u64,
        slot: u16,
        end: Instant,
        op_timeout: Duration,
    ) -> Result<Wakes, LockError> {
        // Two rounds cover a subscription that dies right after being made.
        for _ in 0..2 {
            if let Some(rx) = self.register(id, slot) {
                return Ok(rx);
            }
            // Boxed: rare, and large.
            Box::pin(self.connect(slot, end, op_timeout)).await?;
        }
        self.register(id, slot)
            .ok_or_else(|| LockError::BackendUnavailable("Redis pub/sub connection lost".into()))
    }

    async fn connect(
        &self,
        slot: u16,
        end: Instant,
        op_timeout: Duration,
    ) -> Result<(), LockError> {
        let _ = slot;
        match &self.transport {
            Transport::Single(client) => self.connect_single(client, end, op_timeout).await,
            #[cfg(feature = "redis-cluster")]
            Transport::Cluster(nodes) => {
                sharded::subscribe(self, nodes, slot, end, op_timeout).await
            }
        }
    }

    async fn connect_single(
        &self,
        client: &Client,
        end: Instant,
        op_timeout: Duration,
    ) -> Result<(), LockError> {
        let _single_flight = timeout_at(end, self.connecting.lock())
            .await
            .map_err(|_| timed_out("waiting for the Redis pub/sub connection"))?;
        if self.dispatch.lock().up.is_some() {
            return Ok(());
        }
        let pubsub = match timeout_at(end, client.get_async_pubsub()).await {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(e)) => return Err(redis_error(&e)),
            Err(_) => return Err(timed_out("connecting to Redis for pub/sub")),
        };
        let (mut sink, stream) = pubsub.split();
        match timeout_at(end, sink.subscribe(&self.channel)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(redis_error(&e)),
            Err(_) => return Err(timed_out("subscribing to Redis")),
        }
        let old_reader = {
            let mut inner = self.dispatch.lock();
            inner.generation += 1;
            let generation = inner.generation;
            // Spawned under the lock, so the reader cannot report its
            // connection down before it is recorded as up.
            let reader = tokio::spawn(read(
                Arc::clone(&self.dispatch),
                generation,
                sink,
                stream,
                op_timeout,
            ));
            inner.up = Some(generation);
            inner.reader.replace(reader.abort_handle())
        };
        if let Some(old) = old_reader {
            old.abort();
        }
        Ok(())
    }
}

/// A flight watcher's registration: [`FlightWatch::news`] resolves with the
/// result published to it; dropped, it is forgotten.
pub(super) struct FlightWatch {
    id: u64,
    rx: oneshot::Receiver<FlightNews>,
    dispatch: Arc<Dispatch>,
}

impl FlightWatch {
    /// The result published to this watcher; `None` if none can come any
    /// more (the subscription died).
    pub(super) async fn news(&mut self) -> Option<FlightNews> {
        (&mut self.rx).await.ok()
    }
}

impl Drop for FlightWatch {
    fn drop(&mut self) {
        let removed = self.dispatch.lock().flights.remove(&self.id);
        drop(removed);
    }
}

/// Deliver grants until the connection dies, then mark it down.
async fn read(
    dispatch: Arc<Dispatch>,
    generation: u64,
    sink: PubSubSink,
    mut stream: PubSubStream,
    op_timeout: Duration,
) {
    let (dead_tx, mut dead_rx) = oneshot::channel::<()>();
    let keepalive = tokio::spawn(keep_alive(sink, op_timeout, dead_tx));
    // Whatever ends this task (death, abort), the keep-alive goes with it and
    // the waiters are told.
    let _cleanup = Cleanup {
        dispatch: Arc::clone(&dispatch),
        generation,
        keepalive: keepalive.abort_handle(),
    };
    loop {
        tokio::select! {
            biased;
            msg = next(&mut stream) => match msg {
                Some(msg) => dispatch.deliver(msg.get_payload_bytes()),
                None => return,
            },
            _ = &mut dead_rx => return,
        }
    }
}

struct Cleanup {
    dispatch: Arc<Dispatch>,
    generation: u64,
    keepalive: AbortHandle,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.keepalive.abort();
        self.dispatch.down(self.generation);
    }
}

async fn keep_alive(mut sink: PubSubSink, op_timeout: Duration, dead: oneshot::Sender<()>) {
    loop {
        tokio::time::sleep(KEEPALIVE).await;
        let pong = timeout(op_timeout, sink.ping::<deadpool_redis::redis::Value>()).await;
        if !matches!(pong, Ok(Ok(_))) {
            let _ = dead.send(());
            return;
        }
    }
}

async fn next(stream: &mut PubSubStream) -> Option<deadpool_redis::redis::Msg> {
    std::future::poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx)).await
}

#[cfg(feature = "redis-cluster")]
mod sharded;
