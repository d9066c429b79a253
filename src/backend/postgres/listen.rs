//! Wake-ups for waiters: one `LISTEN` connection per backend (shared by its
//! clones), on one channel of its own.
//!
//! A waiter registers under a ticket (a number unique to this backend) and
//! joins the key's queue with that ticket and this backend's channel. When
//! a release hands it the lock, the server function `NOTIFY`s the channel
//! with `"<ticket> <fence> <acquired µs>"` (delivered when that transaction
//! commits, so a waiter never sees a hand-off that rolled back), and the
//! reader task passes it to that waiter: the waiter returns the lease
//! without another round trip. The waiter then at the head of the queue is
//! told how long the new holder holds (`"w <ticket> <µs>"`), so it wakes
//! when that TTL runs out, not at the old holder's expiry. Flight news
//! (`"f ..."`) is the only other thing sent to the channel.
//!
//! A grant can reach a ticket whose call is gone: the call was dropped
//! after it queued, and the hand-off came before the leave its drop sends
//! (which would pass the lock on itself). Nobody would use that lock until
//! its TTL ran out, so the grant is passed on at once (`_pass_on`: the next
//! waiter gets it). A ticket stays known from its waiter's first attempt to
//! the end of its call, also while it is not listening (the connection is
//! being replaced), so a live waiter's grant is never passed on; a grant it
//! claims through the database instead (its re-check found the lock handed
//! to it) is marked claimed there, so a late notification of it passes
//! nothing on either.
//!
//! Pooled connections cannot listen (a pool hands them to others, and a
//! transaction-mode pooler like PgBouncer does not keep a session at all),
//! so this connection is opened from the backend's own connection settings,
//! on demand (the first time a waiter finds a lock busy), and replaced after
//! it dies. When it dies (server killed or restarted, connection
//! terminated, keep-alive unanswered) every registered waiter's sender is
//! dropped, which tells it to re-check at once and listen again: a hand-off
//! notified while nobody listened is then found by that re-check, since an
//! acquire is idempotent for the attempt the lock was handed to.

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio::time::{Instant, timeout, timeout_at};
use tokio_postgres::{AsyncMessage, Client, Connection};

use super::Tls;
use super::error::{pg_error, timed_out};
pub(super) use super::notify::{FlightNews, Grant, Wake};
use super::notify::{parse_flight, parse_free_in, parse_grant};
use crate::error::LockError;

/// How often an idle listening connection proves it is alive. Catches
/// half-open connections that never report an error.
const KEEPALIVE: Duration = Duration::from_secs(1);

/// A grant that reached a ticket whose call is gone: to be passed on.
#[derive(Debug)]
pub(super) struct Orphan {
    /// The stored key.
    pub(super) key: String,
    pub(super) ticket: i64,
    pub(super) fence: u64,
}

/// What to do with an [`Orphan`] (the backend passes it on).
pub(super) type OnOrphan = Box<dyn Fn(Orphan) + Send + Sync>;

/// What a listening waiter hears: hints of when its lock may be free, then
/// at most one grant; closed (`None`) when the connection died.
pub(super) type Wakes = mpsc::UnboundedReceiver<Wake>;

pub(super) struct Listener {
    config: tokio_postgres::Config,
    tls: Tls,
    channel: String,
    dispatch: Arc<Dispatch>,
    connecting: tokio::sync::Mutex<()>,
    next_ticket: AtomicI64,
}

struct Dispatch {
    inner: Mutex<DispatchInner>,
    on_orphan: OnOrphan,
}

#[derive(Default)]
struct DispatchInner {
    /// The generation of the live connection, if any.
    up: Option<u64>,
    generation: u64,
    /// Every waiter's ticket while its call lasts: with where what it
    /// hears goes while it listens, `None` while it does not (and once its
    /// grant went).
    waiters: HashMap<i64, Option<mpsc::UnboundedSender<Wake>>>,
    /// Flight watchers: ticket → where the published result's news goes.
    flights: HashMap<i64, oneshot::Sender<FlightNews>>,
    reader: Option<AbortHandle>,
}

impl Dispatch {
    fn lock(&self) -> MutexGuard<'_, DispatchInner> {
        // Every critical section leaves the map consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deliver(&self, payload: &str) {
        if let Some(news) = payload.strip_prefix("f ") {
            let Some((ticket, news)) = parse_flight(news) else {
                return;
            };
            let watcher = self.lock().flights.remove(&ticket);
            if let Some(tx) = watcher {
                let _ = tx.send(news);
            }
            return;
        }
        if let Some(news) = payload.strip_prefix("w ") {
            let Some((ticket, free_in)) = parse_free_in(news) else {
                return;
            };
            if let Some(Some(tx)) = self.lock().waiters.get(&ticket) {
                // A call gone meanwhile hears nothing: nothing to pass on.
                let _ = tx.send(Wake::FreeIn(free_in));
            }
            return;
        }
        let Some((ticket, grant, key)) = parse_grant(payload) else {
            return;
        };
        let found = self.lock().waiters.get_mut(&ticket).map(Option::take);
        let waiter = match found {
            Some(Some(tx)) => tx,
            // Alive, not listening: its re-check finds the lock its own.
            Some(None) => return,
            None => {
                self.orphaned(key, ticket, grant);
                return;
            }
        };
        if let Err(mpsc::error::SendError(Wake::Granted(grant))) = waiter.send(Wake::Granted(grant))
        {
            // Its call was dropped just now.
            self.orphaned(key, ticket, grant);
        }
    }

    /// `ticket`'s call is gone: its grant goes on to the next waiter.
    fn orphaned(&self, key: Option<&str>, ticket: i64, grant: Grant) {
        // (A notification without the key comes from the functions of an
        // older version: the waiter's own leave passes the lock on.)
        if let Some(key) = key {
            (self.on_orphan)(Orphan {
                key: key.to_owned(),
                ticket,
                fence: grant.fence,
            });
        }
    }

    /// The connection of `generation` died: wake every waiter to re-check.
    fn down(&self, generation: u64) {
        let dropped = {
            let mut inner = self.lock();
            if inner.up != Some(generation) {
                return;
            }
            inner.up = None;
            inner.reader = None;
            // The waiters stay known (their calls go on), not listening.
            let waiters: Vec<_> = inner
                .waiters
                .values_mut()
                .filter_map(Option::take)
                .collect();
            (waiters, std::mem::take(&mut inner.flights))
        };
        drop(dropped);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let reader = self.dispatch.lock().reader.take();
        if let Some(reader) = reader {
            reader.abort();
        }
    }
}

impl Listener {
    /// A listener (not listening yet) whose grants to calls that are gone
    /// go to `on_orphan`.
    pub(super) fn new(config: tokio_postgres::Config, tls: Tls, on_orphan: OnOrphan) -> Self {
        Listener {
            config,
            tls,
            // Lowercase, unquoted-safe, 43 bytes (< 63).
            channel: format!("tower_lock_{}", uuid::Uuid::new_v4().simple()),
            dispatch: Arc::new(Dispatch {
                inner: Mutex::default(),
                on_orphan,
            }),
            connecting: tokio::sync::Mutex::new(()),
            next_ticket: AtomicI64::new(1),
        }
    }

    /// This backend's channel, as stored with its queue entries.
    pub(super) fn channel(&self) -> &str {
        &self.channel
    }

    /// A fresh ticket (a flight watcher's).
    pub(super) fn next_ticket(&self) -> i64 {
        self.next_ticket.fetch_add(1, Ordering::Relaxed)
    }

    /// A fresh waiter's ticket, known as a live call's until
    /// [`unregister`](Listener::unregister).
    pub(super) fn waiter_ticket(&self) -> i64 {
        let ticket = self.next_ticket();
        self.dispatch.lock().waiters.insert(ticket, None);
        ticket
    }

    /// Register `ticket` if the connection is listening (so any hand-off
    /// notified from now on reaches it); `None` if it is not.
    pub(super) fn register(&self, ticket: i64) -> Option<Wakes> {
        let mut inner = self.dispatch.lock();
        inner.up?;
        let (tx, rx) = mpsc::unbounded_channel();
        inner.waiters.insert(ticket, Some(tx));
        Some(rx)
    }

    /// `ticket`'s call is over: a grant to it from now on is passed on.
    pub(super) fn unregister(&self, ticket: i64) {
        let removed = self.dispatch.lock().waiters.remove(&ticket);
        drop(removed);
    }

    /// Register flight watcher `ticket`, listening first if needed, by
    /// `end`: it hears the `seq` of the first result published to it, or
    /// nothing if the connection dies.
    pub(super) async fn watch_flight(
        &self,
        ticket: i64,
        end: Instant,
        op_timeout: Duration,
    ) -> Result<FlightWatch, LockError> {
        let register = || {
            let mut inner = self.dispatch.lock();
            inner.up?;
            let (tx, rx) = oneshot::channel();
            inner.flights.insert(ticket, tx);
            Some(FlightWatch {
                ticket,
                rx,
                dispatch: Arc::clone(&self.dispatch),
            })
        };
        for _ in 0..2 {
            if let Some(watch) = register() {
                return Ok(watch);
            }
            Box::pin(self.connect(end, op_timeout)).await?;
        }
        register().ok_or_else(|| {
            LockError::BackendUnavailable("PostgreSQL LISTEN connection lost".into())
        })
    }

    /// Register `ticket`, listening first if needed, by `end`.
    pub(super) async fn subscribe(
        &self,
        ticket: i64,
        end: Instant,
        op_timeout: Duration,
    ) -> Result<Wakes, LockError> {
        // Two rounds cover a connection that dies right after being made.
        for _ in 0..2 {
            if let Some(rx) = self.register(ticket) {
                return Ok(rx);
            }
            // Boxed: rare, and large.
            Box::pin(self.connect(end, op_timeout)).await?;
        }
        self.register(ticket).ok_or_else(|| {
            LockError::BackendUnavailable("PostgreSQL LISTEN connection lost".into())
        })
    }

    async fn connect(&self, end: Instant, op_timeout: Duration) -> Result<(), LockError> {
        let _single_flight = timeout_at(end, self.connecting.lock())
            .await
            .map_err(|_| timed_out("waiting for the PostgreSQL LISTEN connection"))?;
        if self.dispatch.lock().up.is_some() {
            return Ok(());
        }
        match &self.tls {
            Tls::None => {
                let connecting = self.config.connect(tokio_postgres::NoTls);
                self.start(connecting, end, op_timeout).await
            }
            #[cfg(feature = "postgres-tls")]
            Tls::Native(connector) => {
                let connecting = self.config.connect(connector.clone());
                self.start(connecting, end, op_timeout).await
            }
        }
    }

    async fn start<S, T>(
        &self,
        connecting: impl Future<Output = Result<(Client, Connection<S, T>), tokio_postgres::Error>>,
        end: Instant,
        op_timeout: Duration,
    ) -> Result<(), LockError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (client, connection) = match timeout_at(end, connecting).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err(pg_error(e)),
            Err(_) => return Err(timed_out("connecting to PostgreSQL to LISTEN")),
        };
        let (ready_tx, ready_rx) = oneshot::channel();
        let old_reader = {
            let mut inner = self.dispatch.lock();
            inner.generation += 1;
            let generation = inner.generation;
            let reader = tokio::spawn(run(
                Arc::clone(&self.dispatch),
                generation,
                client,
                connection,
                format!("LISTEN {}", self.channel),
                op_timeout,
                ready_tx,
            ));
            inner.reader.replace(reader.abort_handle())
        };
        if let Some(old) = old_reader {
            old.abort();
        }
        match timeout_at(end, ready_rx).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(LockError::BackendUnavailable(
                "PostgreSQL LISTEN connection closed while starting".into(),
            )),
            Err(_) => {
                if let Some(reader) = self.dispatch.lock().reader.take() {
                    reader.abort();
                }
                Err(timed_out("waiting for PostgreSQL to LISTEN"))
            }
        }
    }
}

/// A flight watcher's registration: [`FlightWatch::news`] resolves with the
/// news of the result published to it; dropped, it is forgotten.
pub(super) struct FlightWatch {
    ticket: i64,
    rx: oneshot::Receiver<FlightNews>,
    dispatch: Arc<Dispatch>,
}

impl FlightWatch {
    /// The news published to this watcher; `None` if none can come any more.
    pub(super) async fn news(&mut self) -> Option<FlightNews> {
        (&mut self.rx).await.ok()
    }
}

impl Drop for FlightWatch {
    fn drop(&mut self) {
        let removed = self.dispatch.lock().flights.remove(&self.ticket);
        drop(removed);
    }
}

/// Drive the connection: `LISTEN`, then deliver notifications and prove the
/// connection alive every [`KEEPALIVE`], until it dies (or is aborted).
async fn run<S, T>(
    dispatch: Arc<Dispatch>,
    generation: u64,
    client: Client,
    mut connection: Connection<S, T>,
    listen: String,
    op_timeout: Duration,
    ready: oneshot::Sender<Result<(), LockError>>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    // Whatever ends this task (death, abort), the waiters are told.
    let _cleanup = Cleanup {
        dispatch: Arc::clone(&dispatch),
        generation,
    };
    // The client's queries are answered through the connection, which only
    // this task polls: each query runs beside the polling below.
    let mut listening = Box::pin(client.batch_execute(&listen));
    loop {
        tokio::select! {
            biased;
            msg = poll_fn(|cx| connection.poll_message(cx)) => match msg {
                Some(Ok(AsyncMessage::Notification(n))) => dispatch.deliver(n.payload()),
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    let _ = ready.send(Err(pg_error(e)));
                    return;
                }
                None => return,
            },
            listened = &mut listening => {
                match listened {
                    Ok(()) => {
                        dispatch.lock().up = Some(generation);
                        let _ = ready.send(Ok(()));
                    }
                    Err(e) => {
                        let _ = ready.send(Err(pg_error(e)));
                        return;
                    }
                }
                break;
            }
        }
    }
    drop(listening);
    let mut alive = Box::pin(keep_alive(&client, op_timeout));
    loop {
        tokio::select! {
            biased;
            msg = poll_fn(|cx| connection.poll_message(cx)) => match msg {
                Some(Ok(AsyncMessage::Notification(n))) => dispatch.deliver(n.payload()),
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            },
            () = &mut alive => return,
        }
    }
}

struct Cleanup {
    dispatch: Arc<Dispatch>,
    generation: u64,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.dispatch.down(self.generation);
    }
}

/// Returns when the connection stops answering.
async fn keep_alive(client: &Client, op_timeout: Duration) {
    loop {
        tokio::time::sleep(KEEPALIVE).await;
        let pong = timeout(op_timeout, client.simple_query("")).await;
        if !matches!(pong, Ok(Ok(_))) {
            return;
        }
    }
}

#[cfg(test)]
#[path = "listen_test.rs"]
mod tests;
