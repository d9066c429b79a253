//! [`EtcdBackend`]: locks whose grants are decided by etcd's Raft consensus
//! (feature `etcd`): a lock acknowledged by a majority of the cluster
//! survives the loss of any minority of its members, and is never granted
//! twice across a failover.
//!
//! # Guarantees
//!
//! - **Consensus, not replication**: every grant, release and hand-off is
//!   one etcd transaction, conditioned on the state it changes (an etcd
//!   `Txn`: compare, then write): committed by a majority before it is
//!   answered, or not at all. A leader change or the loss of a minority
//!   never loses an acknowledged grant, so never grants it again.
//! - **Fencing tokens from etcd's revision**: a lock's fence is the revision
//!   that created its holder key. etcd's revision is one counter for the
//!   whole cluster, raised by every write, stored in the Raft log: it
//!   strictly increases across releases, expiries, restarts and leader
//!   changes, for every key, and nothing per key outlives its lock.
//! - **One transaction per lock and release**: an acquisition of a free
//!   lock (its metadata included) and a release nobody waits behind are
//!   one transaction each, as the bare put-if-absent and delete of etcd's
//!   own lock recipes. Status is one linearizable read.
//! - **Fair, direct hand-off**: waiters queue as keys ordered by their
//!   create revision. A release hands the lock straight to the oldest (in
//!   the same transaction: new fence, its TTL); a newcomer never barges
//!   past the queue, also after a holder's lease ran out (whoever sees
//!   that first hands the lock to the queue's head).
//! - **Shared holds and permits** ([`LockKind`](crate::LockKind)): each
//!   hold is a holder key of its own (own lease, fence, TTL, metadata);
//!   the kind is in the key, so that each family is one key range a
//!   transaction compares whole. A shared hold is granted in one
//!   transaction (no writer, no permits, nobody queued); a permit beside
//!   others after a read, by a transaction that fails if any hold was
//!   made since. A request of another family is refused
//!   ([`LockError::KindMismatch`]) in the same transaction that would
//!   queue it, never queued. A hand-off grants the head of the queue and
//!   every following waiter that fits (consecutive readers, permits while
//!   there is room), one transaction each: each gets a greater fence.
//! - **No polling, no herd**: each waiter watches one key, the waiter
//!   before it (or the holder, when it is the oldest); the hand-off itself
//!   wakes it, with its lease in the event. A jittered, capped re-read is
//!   only a safety net.
//! - **TTLs to the millisecond, leases as the backstop**: a lock's TTL is
//!   kept by the process that holds it, which releases the lock when it
//!   runs out (with a hand-off); etcd's lease (whole seconds) frees the
//!   locks of a process that died or stopped, one lease TTL after its last
//!   keep-alive and never before the expiry it reported (see Limits).
//! - **Fails closed, never hangs**: every call is bounded by the op timeout
//!   (connecting included), `acquire` by its max wait plus the op timeout.
//!   Anything that prevents an answer is [`LockError::BackendUnavailable`].
//!   Calls go to one endpoint at a time; one that fails or times out sends
//!   the next calls to the next endpoint.
//!
//! # Key layout
//!
//! With the default prefix `tower-lock/`, `E` = [`LockKey::encoded`] and
//! `n` its byte length (so no lock's keys are a prefix of another's):
//!
//! | key | lease | value |
//! |---|---|---|
//! | `tower-lock/<n>:E/h/<owner> <attempt>`; `…/h/ s <owner> <attempt>` for a shared hold, `…/h/ p<N> <owner> <attempt>` for one of `N` permits | the holder process's | `"<acquired ms> <expires ms> <ttl ms>"`, ` <kind>` for a shared hold or permit (`shared`, `permits=N`), and `\n<metadata JSON>`; its create revision is the fence. One per hold: an exclusive lock has one, a shared or permits group one per holder (sorted before an exclusive holder's) |
//! | `tower-lock/<n>:E/q/<id>` | the waiter process's | `"<ttl ms> <attempt> <deadline ms> <owner>"`, ` <kind>` when not exclusive, and `\n<metadata JSON>`: one per waiting acquire call, ordered by create revision; skipped and deleted by a hand-off once its deadline (the max wait's end) has passed |
//! | `tower-lock/<n>:E/r` | the publisher process's (deleted by its timer when no longer kept) | a single-flight's latest result (`E` = `f:<name>`): `"<seq> <fresh until ms>\n"` and its bytes |
//! | `tower-lock/o/<owner> <n>:E` | the acquirer's | the owner index (opt-in, [`index_owners`](EtcdBackend::index_owners)): `E` unhashed; a hint checked on every lookup |
//!
//! A lock with nobody holding or waiting has no key. The leases are one per
//! backend (and its clones) and TTL bucket (2, 3, 4, 5, 6, 8, 10, 12, 15,
//! 20, … s, the smallest of at least the TTL + 1 s), kept alive every
//! 500 ms while the backend lives.
//!
//! # Limits
//!
//! - A majority of the members must be reachable: without one, etcd
//!   answers nothing, and every call fails (closed) after the op timeout.
//! - A lock's TTL is kept by its holder's process. If that process dies or
//!   stops, its locks are freed when its lease runs out: between one and
//!   about two TTLs (plus 1 to 2.5 s) after they were taken or last
//!   extended. Its waiters' entries go the same way.
//! - Times shown by [`LockBackend::status`] and sent in `Retry-After` are
//!   the wall clock of the process that wrote them (etcd has no clock a
//!   client can read); across machines they are as good as their clock
//!   synchronisation. Correctness never depends on them.
//! - Keys left by an interrupted operation are on the lease of the process
//!   that wrote them and go with it.

mod conn;
mod expiry;
mod flight;
mod handoff;
mod keys;
mod kinds;
mod leases;
mod leave;
mod lookup;
mod near;
mod ops;
mod passing;
mod place;
#[cfg(test)]
mod retry_test;
mod take;
mod values;
mod wait;
mod watch;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::ConnectOptions;

use self::conn::{Conn, config_error};
use self::expiry::Expiries;
use self::leases::Leases;
use self::watch::Watches;
use super::{
    BoxFuture, ExtendRequest, FlightPublish, FlightResult, FlightStart, HeldBy, Holder, Lease,
    LockBackend, LockStatus, join_all,
};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::{AcquireRequest, MAX_TTL};

/// Locks in an etcd cluster, through etcd-client. Cheap to clone (clones
/// share connections, leases and waiters).
///
/// See the [module documentation](self) for guarantees, key layout and
/// limits.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_lock::backend::etcd::EtcdBackend;
/// use tower_lock::LockKey;
/// use tower_lock::backend::{AcquireRequest, Holder, LockBackend};
///
/// # async fn demo() -> Result<(), tower_lock::LockError> {
/// let backend = EtcdBackend::from_endpoints(["http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://10.0.0.3:2379"])?
///     .prefix("myapp/locks/")
///     .op_timeout(Duration::from_secs(1));
///
/// let key = LockKey::global("nightly-report")?;
/// let req = AcquireRequest::new(key.clone(), "worker-1", Duration::from_secs(30), Duration::from_secs(5))?;
/// let lease = backend.acquire(&req).await?;
/// println!("fence {}", lease.fence);
/// backend.release(&key, Holder::new("worker-1", lease.fence)).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct EtcdBackend {
    shared: Arc<Shared>,
    prefix: Arc<str>,
    op_timeout: Duration,
    index_owners: bool,
}

struct Shared {
    conn: Conn,
    endpoints: Vec<String>,
    options: ConnectOptions,
    leases: Leases,
    expiries: Expiries,
    watches: Watches,
    handed: handoff::Handed,
    passing: passing::Passing,
    waits: leave::LiveWaits,
    near: near::NearWaiters,
}

impl Shared {
    fn new(endpoints: Vec<String>, options: ConnectOptions) -> Arc<Self> {
        Arc::new(Shared {
            conn: Conn::new(endpoints.clone(), options.clone()),
            endpoints,
            options,
            leases: Leases::default(),
            expiries: Expiries::default(),
            watches: Watches::default(),
            handed: handoff::Handed::default(),
            passing: passing::Passing::default(),
            waits: leave::LiveWaits::default(),
            near: near::NearWaiters::default(),
        })
    }
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No connection options: they may hold a password.
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.shared.endpoints)
            .field("prefix", &self.prefix)
            .field("op_timeout", &self.op_timeout)
            .field("index_owners", &self.index_owners)
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// The default key prefix, `tower-lock/`.
    pub const DEFAULT_PREFIX: &'static str = "tower-lock/";
    /// The default bound on one backend call, 2 s.
    pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(2);

    /// A backend on the cluster whose members' client endpoints are given:
    /// `http://host:port` (or `host:port`), `https://…` with the feature
    /// `etcd-tls`. Name every member (or several): calls go to one at a
    /// time and move to the next when it fails.
    ///
    /// Nothing is connected yet: connection errors show up as
    /// [`LockError::BackendUnavailable`] from the first calls.
    ///
    /// # Errors
    ///
    /// [`LockError::BackendUnavailable`] if no endpoint is given or one is
    /// not a `host:port` or an `http(s)://` URL.
    pub fn from_endpoints<I, S>(endpoints: I) -> Result<Self, LockError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let endpoints: Vec<String> = endpoints
            .into_iter()
            .map(|e| check_endpoint(e.as_ref()))
            .collect::<Result<_, _>>()?;
        if endpoints.is_empty() {
            return Err(config_error("no endpoint"));
        }
        let options = ConnectOptions::new()
            .with_require_leader(true)
            .with_keep_alive_while_idle(false)
            // etcd refuses HTTP/2 pings more often than every 5 s.
            .with_keep_alive(Duration::from_secs(6), Duration::from_secs(2));
        Ok(Self::with(endpoints, options))
    }

    /// [`from_endpoints`](EtcdBackend::from_endpoints) from one string:
    /// endpoints separated by commas, optionally after `etcd://`
    /// (`etcd://10.0.0.1:2379,10.0.0.2:2379`).
    ///
    /// # Errors
    ///
    /// As [`from_endpoints`](EtcdBackend::from_endpoints).
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let list = url.strip_prefix("etcd://").unwrap_or(url);
        Self::from_endpoints(list.split(',').map(str::trim).filter(|e| !e.is_empty()))
    }

    fn with(endpoints: Vec<String>, options: ConnectOptions) -> Self {
        EtcdBackend {
            shared: Shared::new(endpoints, options),
            prefix: Arc::from(Self::DEFAULT_PREFIX),
            op_timeout: Self::DEFAULT_OP_TIMEOUT,
            index_owners: false,
        }
    }

    /// The same backend with other connection options: a fresh set of
    /// connections, leases and waiters.
    fn rebuilt(mut self, options: ConnectOptions) -> Self {
        self.shared = Shared::new(self.shared.endpoints.clone(), options);
        self
    }

    /// Authenticate as `user` with `password` (etcd's auth must be on).
    pub fn user(self, user: impl Into<String>, password: impl Into<String>) -> Self {
        let options = self.shared.options.clone().with_user(user, password);
        self.rebuilt(options)
    }

    /// Speak TLS to `https://` endpoints with these settings (a CA, a
    /// client certificate and key; see [`etcd_client::TlsOptions`]).
    #[cfg(feature = "etcd-tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "etcd-tls")))]
    pub fn tls(self, tls: etcd_client::TlsOptions) -> Self {
        let options = self.shared.options.clone().with_tls(tls);
        self.rebuilt(options)
    }

    /// Put every key under `prefix` instead of `tower-lock/`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Arc::from(prefix.into());
        self
    }

    /// Bound every backend call by `op_timeout` (default 2 s), connecting
    /// included; at least 1 ms, at most a year. `acquire` with a max wait
    /// returns within max wait + `op_timeout`.
    pub fn op_timeout(mut self, op_timeout: Duration) -> Self {
        self.op_timeout = op_timeout.clamp(Duration::from_millis(1), MAX_TTL);
        self
    }

    /// Keep an index from owner tokens to their locks, so that
    /// [`LockBackend::held_by`] can answer (default off: it then answers
    /// [`LockError::Unsupported`]). The entry is written in the same
    /// transaction as the acquisition (no round trip more) and removed
    /// with the release; it is a hint, checked against the lock on every
    /// lookup.
    pub fn index_owners(mut self, on: bool) -> Self {
        self.index_owners = on;
        self
    }

    /// The endpoints.
    pub fn get_endpoints(&self) -> &[String] {
        &self.shared.endpoints
    }

    /// The key prefix.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// The bound on one backend call.
    pub fn get_op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// Whether the owner index is kept.
    pub fn get_index_owners(&self) -> bool {
        self.index_owners
    }
}

/// An endpoint as etcd-client takes it: `http(s)://host:port` or
/// `host:port`.
fn check_endpoint(endpoint: &str) -> Result<String, LockError> {
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .unwrap_or(endpoint);
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    let ok = !authority.is_empty()
        && !authority.contains(['/', '@', ' ', '?', '#'])
        && authority.parse::<http::uri::Authority>().is_ok();
    if ok {
        Ok(endpoint.to_owned())
    } else {
        Err(config_error(
            "an endpoint must be host:port or http(s)://host:port",
        ))
    }
}

impl LockBackend for EtcdBackend {
    fn name(&self) -> &'static str {
        "etcd"
    }

    /// Every kind: exclusive, shared holds and permits.
    fn supports(&self, _kind: crate::spec::LockKind) -> bool {
        true
    }

    fn acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(self.acquire_inner(req))
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(self.release_inner(key, holder))
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(self.extend_inner(key, holder, ttl))
    }

    fn claim<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
        attempt: u64,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(self.claim_inner(key, holder, attempt))
    }

    /// All extensions go out together (HTTP/2 multiplexes them on the one
    /// connection), so a watchdog tick costs about one round trip however
    /// many locks it renews.
    fn extend_many<'a>(
        &'a self,
        batch: &'a [ExtendRequest],
    ) -> BoxFuture<'a, Vec<Result<Lease, LockError>>> {
        Box::pin(join_all(
            batch
                .iter()
                .map(|r| self.extend_inner(&r.key, r.holder(), r.ttl))
                .collect(),
        ))
    }

    fn force_release<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(self.force_release_inner(key))
    }

    fn status<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<LockStatus>, LockError>> {
        Box::pin(self.status_inner(key))
    }

    /// Through the owner index ([`index_owners`](EtcdBackend::index_owners));
    /// [`LockError::Unsupported`] without it.
    fn held_by<'a>(
        &'a self,
        owner: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<HeldBy>, LockError>> {
        Box::pin(self.held_by_inner(owner, limit))
    }

    fn flight_begin<'a>(
        &'a self,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<FlightStart, LockError>> {
        Box::pin(self.flight_begin_inner(req))
    }

    fn flight_result<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<FlightResult>, LockError>> {
        Box::pin(self.flight_result_inner(key))
    }

    fn flight_publish<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a str,
        publish: &'a FlightPublish,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(self.flight_publish_inner(key, owner, publish))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_traits<T: Clone + Send + Sync + 'static + LockBackend>() {}

    #[test]
    fn is_clone_send_sync_backend() {
        assert_traits::<EtcdBackend>();
    }

    #[test]
    fn builders_check_endpoints_and_keep_settings() {
        let b = EtcdBackend::from_url("etcd://127.0.0.1:2379,127.0.0.2:2379")
            .unwrap()
            .prefix("app/")
            .op_timeout(Duration::from_millis(300))
            .index_owners(true)
            .user("u", "secret-pw");
        assert_eq!(b.get_endpoints(), ["127.0.0.1:2379", "127.0.0.2:2379"]);
        assert_eq!(
            (b.get_prefix(), b.get_op_timeout()),
            ("app/", Duration::from_millis(300))
        );
        assert!(b.get_index_owners());
        assert!(!format!("{b:?}").contains("secret-pw"));
        assert!(EtcdBackend::from_url("etcd://").is_err());
        assert!(EtcdBackend::from_endpoints(["http://a b:1"]).is_err());
        assert!(EtcdBackend::from_endpoints(Vec::<String>::new()).is_err());
        assert!(EtcdBackend::from_endpoints(["http://u:p@h:1"]).is_err());
    }
}

// The integration tests' cluster helper, for the tests at the seams (its
// own `unsafe` is for kill(2)).
#[cfg(test)]
#[allow(unreachable_pub, missing_docs)]
#[path = "../../../tests/common/etcd_cluster.rs"]
mod etcd_cluster;
