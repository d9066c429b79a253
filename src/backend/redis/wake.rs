//! Wake-ups for waiters: one pub/sub connection per backend (shared by its
//! clones), subscribed to one channel of its own.
//!
//! A waiter registers under a process-unique id and joins the key's queue in
//! Redis with that id and this backend's channel. When a release hands the
//! lock to it, the script publishes `"<id> <fence> <acquired ms>"` to the
//! channel, and the reader task completes that waiter's oneshot: the waiter
//! returns the lease without another round trip. Nothing else is published,
//! so a process only receives messages for its own waiters.
//!
//! The subscription is made on demand (the first time a waiter finds a lock
//! busy) and replaced after it dies. When it dies (Redis killed or
//! restarted, connection killed, keep-alive `PING` unanswered) every
//! registered waiter's oneshot is dropped, which tells it to re-check at once
//! and subscribe again: a grant published while nobody listened is then
//! found by that re-check, since acquire is idempotent for the owner it was
//! granted to.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use deadpool_redis::redis::Client;
use deadpool_redis::redis::aio::{PubSubSink, PubSubStream};
use futures_core::Stream;
use tokio::sync::oneshot;
use tokio::task::AbortHandle;
use tokio::time::{Instant, timeout, timeout_at};

use super::error::{redis_error, timed_out};
use crate::error::LockError;

/// How often an idle subscription proves it is alive. Catches half-open
/// connections that never report an error.
const KEEPALIVE: Duration = Duration::from_secs(1);

/// The lock was handed to a waiter.
#[derive(Debug, Clone, Copy)]
pub(super) struct Grant {
    pub(super) fence: u64,
    pub(super) acquired_ms: u64,
}

pub(super) struct Wakeups {
    client: Client,
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
    waiters: HashMap<u64, oneshot::Sender<Grant>>,
    reader: Option<AbortHandle>,
}

impl Dispatch {
    fn lock(&self) -> MutexGuard<'_, DispatchInner> {
        // Every critical section leaves the map consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deliver(&self, payload: &[u8]) {
        let Some((id, grant)) = parse_grant(payload) else {
            return;
        };
        let waiter = self.lock().waiters.remove(&id);
        if let Some(tx) = waiter {
            // A waiter that is gone meanwhile leaves the queue with a script
            // that also releases a lock handed to it.
            let _ = tx.send(grant);
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
            std::mem::take(&mut inner.waiters)
        };
        drop(dropped);
    }
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
    pub(super) fn new(client: Client) -> Self {
        Wakeups {
            client,
            channel: format!("tower-lock:wake:{}", uuid::Uuid::new_v4().simple()),
            dispatch: Arc::default(),
            connecting: tokio::sync::Mutex::new(()),
            next_id: AtomicU64::new(1),
        }
    }

    /// This backend's channel, as stored with its queue entries.
    pub(super) fn channel(&self) -> &str {
        &self.channel
    }

    /// A fresh waiter id.
    pub(super) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Register waiter `id` if the subscription is live (so any grant
    /// published from now on reaches it); `None` if it is not.
    pub(super) fn register(&self, id: u64) -> Option<oneshot::Receiver<Grant>> {
        let mut inner = self.dispatch.lock();
        inner.up?;
        let (tx, rx) = oneshot::channel();
        inner.waiters.insert(id, tx);
        Some(rx)
    }

    pub(super) fn unregister(&self, id: u64) {
        let removed = self.dispatch.lock().waiters.remove(&id);
        drop(removed);
    }

    /// Register waiter `id`, subscribing first if needed, by `end`.
    pub(super) async fn subscribe(
        &self,
        id: u64,
        end: Instant,
        op_timeout: Duration,
    ) -> Result<oneshot::Receiver<Grant>, LockError> {
        // Two rounds cover a subscription that dies right after being made.
        for _ in 0..2 {
            if let Some(rx) = self.register(id) {
                return Ok(rx);
            }
            // Boxed: rare, and large.
            Box::pin(self.connect(end, op_timeout)).await?;
        }
        self.register(id)
            .ok_or_else(|| LockError::BackendUnavailable("Redis pub/sub connection lost".into()))
    }

    async fn connect(&self, end: Instant, op_timeout: Duration) -> Result<(), LockError> {
        let _single_flight = timeout_at(end, self.connecting.lock())
            .await
            .map_err(|_| timed_out("waiting for the Redis pub/sub connection"))?;
        if self.dispatch.lock().up.is_some() {
            return Ok(());
        }
        let pubsub = match timeout_at(end, self.client.get_async_pubsub()).await {
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

/// `"<id> <fence> <acquired ms>"`.
fn parse_grant(payload: &[u8]) -> Option<(u64, Grant)> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut parts = text.split(' ');
    let id = parts.next()?.parse().ok()?;
    let fence = parts.next()?.parse().ok()?;
    let acquired_ms = parts.next()?.parse().ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some((id, Grant { fence, acquired_ms }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_parse_strictly() {
        let (id, g) = parse_grant(b"7 42 1700000000123").unwrap();
        assert_eq!((id, g.fence, g.acquired_ms), (7, 42, 1_700_000_000_123));
        assert!(parse_grant(b"7 42").is_none());
        assert!(parse_grant(b"7 42 1 x").is_none());
        assert!(parse_grant(b"a 42 1").is_none());
        assert!(parse_grant(&[0xff, b' ']).is_none());
    }
}
