//! The [`LockBackend`] trait, the backends that implement it, and everything
//! a backend author needs, in one module.
//!
//! Built in: [`memory::MemoryBackend`] (this process), [`redis::RedisBackend`]
//! (feature `redis`). The layer, the handles and the admin API hold a
//! backend through a [`SharedBackend`], which any `LockBackend` converts
//! into.
//!
//! # Writing a backend
//!
//! A backend stores locks somewhere every instance of an app can reach, and
//! implements [`LockBackend`]: five operations, each meant to be **one atomic
//! round trip** (a script, a statement, a server-side function: never
//! read-then-write from the client). The contract, which the crate's
//! behavioural suite (`tests/behaviour/`) checks for every built-in backend:
//!
//! - **Keys.** [`LockKey::encoded`] is the injective storage form of (scope,
//!   key), hashed when longer than the limit you pass; prefix it as you like.
//! - **Acquire** takes the lock if it is free, or its holder's TTL has passed,
//!   and returns a [`Lease`]: a fencing token strictly greater than any the
//!   key had before (never reset by release or expiry), and the times by the
//!   store's clock. An acquire of the holder's own attempt (same owner token
//!   **and** [`AcquireRequest::attempt`]) is a retry: same fence, TTL
//!   refreshed. The same owner with another attempt is another acquirer.
//! - **Waiting.** A busy lock with a max wait: the acquirer queues, first
//!   come first served. A release hands the lock straight to the oldest live
//!   waiter (new fence, its own TTL) and wakes only it; a newcomer never
//!   barges past live waiters, also when the holder's lease ran out (the
//!   next acquirer hands the expired lock to the queue's head). Waiters wake
//!   on the hand-off or at the holder's expiry, not by polling; a waiter
//!   that gives up or is dropped leaves the queue (and passes on a lock
//!   handed to it meanwhile). The wait ends with
//!   [`LockError::AcquisitionFailed`] (no wait) or [`LockError::Timeout`],
//!   with the holder's remaining TTL.
//! - **Release** and **extend** name the acquisition, not only the owner
//!   ([`Holder`]: owner token and fence, compared in the same atomic step):
//!   [`LockError::NotFound`] if nothing is held, [`LockError::OwnershipMismatch`]
//!   if another owner holds it, or the same owner under another fence (a
//!   later acquisition by a reused custom owner). `extend` sets the remaining TTL (check it with
//!   [`validate_ttl`]) and never revives an expired lock. **Force release**
//!   frees whoever holds, handing over to the queue as a release does.
//! - **Kinds** ([`AcquireRequest::kind`], [`LockKind`](crate::LockKind)).
//!   A shared acquisition holds beside other shared holds; `Permits(n)`
//!   beside fewer than `n` holds of `Permits(n)`; exclusive alone. Each hold
//!   has its own owner, attempt, fence (from the same sequence as exclusive
//!   ones: strictly greater than any earlier acquisition of the key), TTL
//!   and metadata; release, extend, claim and renewals name one hold by
//!   its [`Holder`]. A request of another family than the key's live
//!   holders (permits beside shared/exclusive, another `n`) is
//!   [`LockError::KindMismatch`] at once, never queued. The queue is one
//!   FIFO across kinds: a newcomer joins the holders only when nobody live
//!   is queued; when holds end (release, expiry, force release), the head
//!   of the queue is granted, and after it every following waiter that fits
//!   beside what is held (consecutive shared waiters; permits while there is
//!   room), stopping at the first that does not. A busy answer's
//!   `retry_after` is the earliest expiry among the holds. A backend that
//!   holds exclusive locks only answers [`LockError::Unsupported`] for
//!   another kind, never an exclusive lock instead.
//! - **Status** answers who holds the lock, with [`LockStatus::waiters`]
//!   and the holder's [`LockStatus::metadata`]: what its acquisition carried
//!   ([`AcquireRequest::metadata`]), never an earlier holder's. For a key
//!   held shared or under permits, [`LockStatus::of_holders`] builds it from
//!   every live [`Hold`]; [`LockBackend::held_by`] lists one entry per hold
//!   of the owner.
//! - **Lookups by owner** ([`LockBackend::held_by`]) list the locks an owner
//!   token holds now, verified against the locks; an index they need must
//!   not cost the default acquire/release path a round trip (make it
//!   opt-in, or keep it in the same statement).
//! - **Failures.** Anything that prevents an answer is
//!   [`LockError::BackendUnavailable`], within a bounded time (an op
//!   timeout; acquire within max wait + op timeout). A call repeated after a
//!   lost reply must be safe: only repeat what is idempotent.
//!
//! **Single-flight** ([`SingleFlight`](crate::flight::SingleFlight)) needs three
//! more operations, on keys of their own namespace ([`LockKey::is_flight`]):
//! [`flight_begin`](LockBackend::flight_begin),
//! [`flight_result`](LockBackend::flight_result) and
//! [`flight_publish`](LockBackend::flight_publish). Their defaults answer
//! [`LockError::Unsupported`].
//!
//! Optional: [`LockBackend::extend_many`] (the watchdog renews every due
//! lock in one call: override it to use one round trip),
//! [`LockBackend::extend_each`] (the same renewals completing one by one,
//! for a store spread over several servers), and
//! [`LockBackend::try_acquire_now`]/[`try_release_now`](LockBackend::try_release_now),
//! for a store in this process only, which let the layer take and give back
//! a lock without a future.
//!
//! To check a backend, run the suite against it: add it beside memory and
//! Redis in `tests/behaviour/main.rs` (a harness function that starts the
//! store, gives a [`SharedBackend`] and a second handle on the same store).
//!
//! # Why an object-safe trait with boxed futures
//!
//! Handlers receive their locks through one extractor type ([`Locks`]), and
//! owned handles ([`OwnedLock`]) move into background jobs; neither should
//! carry the backend as a type parameter, and apps pick a backend from their
//! configuration at run time (`--redis URL`, `--postgres URL` or in-memory). So the layer keeps
//! an `Arc<dyn LockBackend>`. The price is one small allocation per call,
//! which is noise next to a network round trip and still allows millions of
//! in-memory cycles per second.
//!
//! [`Locks`]: crate::Locks
//! [`OwnedLock`]: crate::OwnedLock

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

// What backend authors need beside the trait and is not at the crate root
// is exported here; what the root has (`LockError`, `LockKey`, ...) only
// there: one path per item.
pub use crate::error::BackendError;
use crate::error::LockError;
pub use crate::key::KeyDigest;
use crate::key::LockKey;
pub use crate::spec::{AcquireRequest, validate_ttl};
pub use flight::{FlightPublish, FlightResult, FlightStart, FlightWait};
pub use holder::Holder;
pub use lease::{ExtendRequest, HeldBy, Hold, Lease, LockStatus};

pub(crate) use arc::join_all;
pub use shared::{AsSharedBackend, SharedBackend};

mod arc;
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub mod etcd;
mod flight;
mod holder;
mod lease;
pub mod memory;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(any(feature = "redis", feature = "etcd"))]
mod retry;
mod shared;

/// A boxed, `Send` future, as returned by [`LockBackend`] methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A store that can hold locks: in memory, Redis, PostgreSQL, and others.
///
/// Contract shared by every implementation (the behavioural test suite runs
/// the same tests against each):
/// - `acquire` takes the lock if it is free or its holder's TTL has passed,
///   else waits up to `max_wait` (woken by the release or by the holder's
///   expiry, not by polling) and then fails with
///   [`LockError::AcquisitionFailed`] (no wait) or [`LockError::Timeout`],
///   carrying the holder's remaining TTL.
/// - `release` and `extend` check the acquisition ([`Holder`]: owner token
///   and fence): [`LockError::NotFound`] when nothing is held (or it
///   expired), [`LockError::OwnershipMismatch`] when another acquisition
///   holds it (another owner, or the same owner under another fence). `extend` sets the remaining TTL to `ttl`
///   (expires = now + ttl) and never revives an expired lock.
/// - Every failure to reach the store is [`LockError::BackendUnavailable`],
///   within a bounded time.
pub trait LockBackend: Send + Sync + 'static {
    /// A short static name for the kind of store (`memory`, `redis`,
    /// `postgres`): the `backend` label of the crate's metrics (feature
    /// `metrics`). Never a URL or anything per instance. The default is
    /// `custom`.
    fn name(&self) -> &'static str {
        "custom"
    }

    /// Whether this backend holds locks of `kind` (see
    /// [`LockKind`](crate::LockKind)). The default, for a backend written
    /// before kinds existed, is exclusive locks only: `acquire` must then
    /// answer [`LockError::Unsupported`] for any other kind. Apps can ask
    /// before they offer a route that needs shared holds or permits.
    ///
    /// ```
    /// use tower_lock::{LockBackend, LockKind, MemoryBackend};
    ///
    /// assert!(MemoryBackend::new().supports(LockKind::Shared));
    /// ```
    fn supports(&self, kind: crate::spec::LockKind) -> bool {
        kind == crate::spec::LockKind::Exclusive
    }

    /// Take the lock described by `req`, waiting up to its max wait.
    fn acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Lease, LockError>>;

    /// Give back the lock `key` if `holder` is the acquisition holding it
    /// (owner token and fence, see [`Holder`]).
    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
    ) -> BoxFuture<'a, Result<(), LockError>>;

    /// Replace the remaining TTL of the lock `key` with `ttl`, if `holder`
    /// is the acquisition holding it.
    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Lease, LockError>>;

    /// Take over the acquisition `holder` (owner token and fence, both
    /// required) as a new acquisition of the same owner: one atomic step
    /// that gives the lock a fresh fence (as a hand-off would: strictly
    /// greater than any before), records `attempt` as its attempt, and
    /// keeps its expiry and metadata. What a job's restore of a
    /// [`LockToken`](crate::LockToken) does, so that a token delivered twice
    /// restores once: the second claim names a fence that is gone
    /// ([`LockError::OwnershipMismatch`]).
    ///
    /// A claim repeated after a lost reply finds the lock held by the same
    /// owner under `attempt` and answers the same lease again.
    /// [`LockError::NotFound`] when nothing is held; the default answers
    /// [`LockError::Unsupported`].
    fn claim<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
        attempt: u64,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        let _ = (key, holder, attempt);
        Box::pin(std::future::ready(Err(LockError::Unsupported(
            "this lock backend cannot claim a lock (restore a token)",
        ))))
    }

    /// Remove the lock whoever holds it. `Ok(true)` if one was held.
    fn force_release<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>>;

    /// Who holds the lock and until when; `Ok(None)` when it is free.
    fn status<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<LockStatus>, LockError>>;

    // -- Lookups (SyncGuard's `getById` / `owns`). --

    /// The locks `owner` holds now, at most `limit`, sorted by key.
    ///
    /// A generated owner token holds one lock at most; a custom one
    /// ([`LockSpec::owner`](crate::LockSpec::owner)) may hold several. Every
    /// answer is checked against the locks themselves: a lock is listed only
    /// while `owner` holds it (compared in constant time). A backend may
    /// need an index for this, and answers [`LockError::Unsupported`]
    /// without it (Redis: `RedisBackend::index_owners`).
    fn held_by<'a>(
        &'a self,
        owner: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<HeldBy>, LockError>>;

    /// Whether `owner` holds the lock `key` now. The default asks
    /// [`status`](LockBackend::status) and compares the owner tokens in
    /// constant time.
    fn owns<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move {
            let status = self.status(key).await?;
            Ok(status.is_some_and(|s| crate::spec::owners_match(&s.owner, owner)))
        })
    }

    /// Take the lock at once, if the answer needs neither waiting nor I/O;
    /// `None` when it needs either, and the caller then uses
    /// [`acquire`](LockBackend::acquire).
    ///
    /// A store in this process answers whenever the lock is free, or busy
    /// and `req` does not wait; the layer then takes the lock without
    /// allocating a future. An answer must be the one `acquire` would give.
    /// The default is `None`, right for any backend behind a network.
    fn try_acquire_now(&self, req: &AcquireRequest) -> Option<Result<Lease, LockError>> {
        let _ = req;
        None
    }

    /// Release at once, if that needs no I/O; `None` when it does, and the
    /// caller then uses [`release`](LockBackend::release). The default is
    /// `None`.
    fn try_release_now(&self, key: &LockKey, holder: Holder<'_>) -> Option<Result<(), LockError>> {
        let _ = (key, holder);
        None
    }

    /// Extend several locks at once, one result per request, in order.
    ///
    /// The watchdog renews every due lock of a tick with one call. The
    /// default runs [`extend`](LockBackend::extend) one by one; remote
    /// backends override it to use one round trip.
    fn extend_many<'a>(
        &'a self,
        batch: &'a [ExtendRequest],
    ) -> BoxFuture<'a, Vec<Result<Lease, LockError>>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(batch.len());
            for req in batch {
                out.push(self.extend(&req.key, req.holder(), req.ttl).await);
            }
            out
        })
    }

    /// The same renewals as [`extend_many`](LockBackend::extend_many), one
    /// future per request (in order), for a backend whose locks live on
    /// independent servers (a Redis Cluster's shards): the watchdog then
    /// applies each result as it comes, so a slow server delays only its
    /// own locks' renewals. Polled together, the futures should still cost
    /// one round trip per server (pipelined).
    ///
    /// The default is `None`: the watchdog renews with one
    /// [`extend_many`](LockBackend::extend_many) call, which suits a backend
    /// on one server.
    fn extend_each<'a>(
        &'a self,
        batch: &'a [ExtendRequest],
    ) -> Option<Vec<BoxFuture<'a, Result<Lease, LockError>>>> {
        let _ = batch;
        None
    }

    /// Single-flight, one atomic step for the flight `req.key()`: the stored
    /// result if it still answers new callers ([`FlightStart::Fresh`]); else
    /// the flight's lock if it is free, taken as [`acquire`] without waiting
    /// would ([`FlightStart::Leader`]); else a registration for a wake-up
    /// with the next result ([`FlightStart::Busy`]), made before this step
    /// returns so that no result published after it is missed.
    ///
    /// `req.max_wait()` is how long the caller will wait if the flight is
    /// busy (it waits on the lock with [`acquire`] and on the wake-up
    /// together); this call itself never waits.
    ///
    /// [`acquire`]: LockBackend::acquire
    fn flight_begin<'a>(
        &'a self,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<FlightStart, LockError>> {
        let _ = req;
        Box::pin(std::future::ready(Err(LockError::Unsupported(
            "this lock backend does not implement single-flight",
        ))))
    }

    /// The newest result stored for the flight `key` while it is kept
    /// ([`FlightPublish::keep`]), fresh or not: for a caller that waited and
    /// now holds the flight's lock, to see whether a result came meanwhile.
    fn flight_result<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<FlightResult>, LockError>> {
        let _ = key;
        Box::pin(std::future::ready(Err(LockError::Unsupported(
            "this lock backend does not implement single-flight",
        ))))
    }

    /// One atomic step for the leader of the flight `key`, holding its lock
    /// as `owner` with the fence `publish.fence`: store the result (unless a
    /// result with a larger `seq` is stored already), wake every registered
    /// waiter with it, and release the lock (handing it on as
    /// [`release`](LockBackend::release) does). Checked like a release:
    /// [`LockError::NotFound`] or [`LockError::OwnershipMismatch`] when the
    /// caller no longer holds the lock, and then nothing is stored.
    fn flight_publish<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a str,
        publish: &'a FlightPublish,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        let _ = (key, owner, publish);
        Box::pin(std::future::ready(Err(LockError::Unsupported(
            "this lock backend does not implement single-flight",
        ))))
    }
}
