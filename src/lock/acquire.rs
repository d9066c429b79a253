//! Taking locks: one lock, guarded against cancellation and lost replies,
//! and all the locks of one request, in one order, bounded in time, checked
//! before the handler runs.

use std::time::SystemTime;

use smol_str::SmolStr;

use super::held::HeldExtras;
use super::registry::Defaults;
use super::release::Finish;
use super::{HeldLock, Locks};
use crate::backend::{BoxFuture, Holder, Lease, SharedBackend};
use crate::error::LockError;
use crate::observe::{self, Meter, acquire_span};
use crate::spec::{AcquireRequest, LockSpec};

// ---------------------------------------------------------------------------
// One lock

/// Take the lock described by `req` at once, if the backend can answer
/// without waiting or I/O (see [`LockBackend::try_acquire_now`]).
pub(crate) fn acquire_now(
    backend: &SharedBackend,
    req: &AcquireRequest,
    meter: &Meter,
) -> Option<Result<HeldLock, LockError>> {
    let sent = tokio::time::Instant::now();
    let result = backend.try_acquire_now(req)?;
    let span = acquire_span(req.key(), req.max_wait());
    Some(acquired(req, result, sent, sent, meter, &span))
}

/// The outcome of an acquisition, counted and traced (in `span`, made by
/// [`acquire_span`]); `sent` is when the backend was asked, `started` when
/// the lock's TTL began at the earliest.
pub(crate) fn acquired(
    req: &AcquireRequest,
    result: Result<Lease, LockError>,
    sent: tokio::time::Instant,
    started: tokio::time::Instant,
    meter: &Meter,
    span: &tracing::Span,
) -> Result<HeldLock, LockError> {
    // The clock is read only for someone: metrics compiled in, or a span.
    if cfg!(feature = "metrics") || !span.is_disabled() {
        let outcome = observe::outcome(&result);
        let wait = sent.elapsed();
        meter.acquisition_of(req.kind(), outcome, Some(wait));
        observe::close_span(span, outcome, wait);
    }
    span.in_scope(|| match &result {
        Ok(lease) => tracing::debug!(
            key = %req.key().digest(),
            fence = lease.fence,
            "lock acquired"
        ),
        Err(e) => {
            meter.backend_error("acquire", e);
            tracing::debug!(key = %req.key().digest(), code = e.code(), "lock not acquired")
        }
    });
    result.map(|lease| {
        let expiry = started + lease.lasts();
        // The minimum hold counts from when the TTL started.
        let hold_until = req.min_hold().map(|d| started + d);
        let extras = HeldExtras::new(req.metadata().cloned(), hold_until, req.kind());
        HeldLock::new(
            req.key().clone(),
            req.owner_arc().clone(),
            lease,
            expiry,
            extras,
            meter.clone(),
        )
    })
}

/// A call that may take `req`'s lock, under way: until `done`, what it may
/// have taken is released from `Drop` (a call dropped mid-way, or whose
/// reply was lost). The fence was never learnt; the owner token, made for
/// this call alone, names the acquisition by itself.
pub(crate) struct InFlight<'a> {
    pub(crate) backend: &'a SharedBackend,
    pub(crate) req: &'a AcquireRequest,
    pub(crate) done: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.done {
            let (backend, key, owner) = (
                self.backend.clone(),
                self.req.key().clone(),
                self.req.owner_arc().clone(),
            );
            drop(Finish::start(Box::pin(async move {
                let _ = backend.release(&key, Holder::owner_only(&owner)).await;
            })));
        }
    }
}

/// Acquire, and if this future is dropped while the backend call is in
/// flight, or the call fails with [`LockError::BackendUnavailable`], release
/// best-effort with the owner token: a request that was cancelled, or whose
/// reply was lost, may still have taken the lock on the server. Only for a
/// token generated for this call (see [`AcquireRequest`]'s `fresh_owner`).
pub(crate) async fn acquire_guarded(
    backend: &SharedBackend,
    req: &AcquireRequest,
    meter: &Meter,
) -> Result<HeldLock, LockError> {
    if let Some(result) = acquire_now(backend, req, meter) {
        return result;
    }
    // Only a token made for this call: a caller's own token may hold the
    // lock already (acquire is idempotent for it), or again by the time a
    // release would land (a retry).
    let mut guard = InFlight {
        backend,
        req,
        done: !req.has_fresh_owner(),
    };
    let sent = tokio::time::Instant::now();
    let acquire = backend.acquire(req);
    // The span only when someone listens: building one costs more than an
    // in-memory acquisition.
    let span = acquire_span(req.key(), req.max_wait());
    let result = if span.is_disabled() {
        acquire.await
    } else {
        tracing::Instrument::instrument(acquire, span.clone()).await
    };
    // An unreachable backend may still have taken the lock (the reply came
    // after the op timeout, or the connection broke after sending): the
    // guard releases it with the owner token, as for a dropped call.
    guard.done |= !matches!(result, Err(LockError::BackendUnavailable(_)));
    drop(guard);
    // The lock's TTL started between sending and now. Without waiting, the
    // send time is the safe (early) estimate. After a wait it started when
    // the lock was handed over, which the lease dates.
    let started = match &result {
        Ok(lease) if !req.max_wait().is_zero() => ttl_start(
            sent,
            tokio::time::Instant::now(),
            SystemTime::now(),
            lease.acquired_at,
        ),
        _ => sent,
    };
    acquired(req, result, sent, started, meter, &span)
}

/// When a lock granted after a wait started its TTL, by this process's
/// clock: `now` less the lease's age by the wall clock, kept between `sent`
/// and `now`. A backend on another machine dates the lease by its own clock:
/// if that runs behind, the estimate errs early (the safe side), bounded by
/// `sent`; if ahead, it falls back to `now`, late by at most the delivery.
fn ttl_start(
    sent: tokio::time::Instant,
    now: tokio::time::Instant,
    wall_now: SystemTime,
    acquired_at: SystemTime,
) -> tokio::time::Instant {
    let age = wall_now.duration_since(acquired_at).unwrap_or_default();
    now.checked_sub(age)
        .map_or(sent, |start| start.clamp(sent, now))
}

// ---------------------------------------------------------------------------
// A request's locks

/// Acquire the one lock `req` (made from `spec`), waiting.
pub(crate) fn acquire_one(
    backend: SharedBackend,
    route: SmolStr,
    spec: LockSpec,
    req: AcquireRequest,
    defaults: Defaults,
    meter: Meter,
) -> BoxFuture<'static, Result<Locks, LockError>> {
    Box::pin(async move {
        let held = acquire_guarded(&backend, &req, &meter).await?;
        let locks = holding(backend, route, defaults, held, &spec, meter);
        ready_to_run(locks).await
    })
}

/// A request's registry holding its one lock `held`, taken for `spec`.
pub(crate) fn holding(
    backend: SharedBackend,
    route: SmolStr,
    defaults: Defaults,
    held: HeldLock,
    spec: &LockSpec,
    meter: Meter,
) -> Locks {
    let locks = Locks::new(backend, route, defaults, meter);
    // A fresh registry is never closed.
    let _ = locks.register(held, spec.get_auto_release(), spec.get_watchdog());
    locks
}

/// Acquire `first` and every spec in `rest`, in one global order (sorted by
/// key) so that two requests locking the same keys cannot deadlock; on any
/// failure give back what was taken.
///
/// The whole acquisition waits at most the largest max wait of the specs,
/// and never longer than a lock it already took has left (unless the
/// watchdog renews that one): a lock must not run out while the request
/// waits for the next.
pub(crate) fn acquire_all(
    backend: SharedBackend,
    route: SmolStr,
    first: LockSpec,
    rest: Vec<LockSpec>,
    defaults: Defaults,
    meter: Meter,
) -> BoxFuture<'static, Result<Locks, LockError>> {
    Box::pin(async move {
        let mut reqs = Vec::with_capacity(1 + rest.len());
        for spec in std::iter::once(&first).chain(&rest) {
            let req = spec
                .to_request(&route)
                .inspect_err(|e| meter.acquisition(observe::error_outcome(e), None))?;
            reqs.push((req, spec));
        }
        reqs.sort_by(|a, b| a.0.key().cmp(b.0.key()));
        // Sorted by key then route: one key named twice sits side by side,
        // and so does one key in both scopes. Named twice alike it is one
        // lock; as two kinds it is neither (taking the first let a request
        // that asked for the exclusive lock run beside another's shared
        // hold); with other settings, neither (the first one's TTL, wait,
        // release, watchdog, minimum hold, owner or metadata were taken,
        // silently); in both scopes, neither.
        let clash = reqs.windows(2).find_map(|w| {
            let ((a, sa), (b, sb)) = (&w[0], &w[1]);
            if a.key() == b.key() {
                if a.kind() != b.kind() {
                    return Some(LockError::InvalidKind(
                        "a request cannot lock one key as two kinds",
                    ));
                }
                let alike = a.ttl() == b.ttl()
                    && a.max_wait() == b.max_wait()
                    && a.metadata() == b.metadata()
                    && sa.get_auto_release() == sb.get_auto_release()
                    && sa.get_watchdog() == sb.get_watchdog()
                    && sa.get_min_hold() == sb.get_min_hold()
                    && sa.get_owner() == sb.get_owner();
                (!alike).then_some(LockError::InvalidKey(
                    "a request cannot name one key twice with other settings",
                ))
            } else {
                (a.key().key() == b.key().key()).then_some(LockError::InvalidKey(
                    "a request cannot lock one key in both route and global scope",
                ))
            }
        });
        if let Some(e) = clash {
            meter.acquisition(observe::error_outcome(&e), None);
            return Err(e);
        }
        reqs.dedup_by(|a, b| a.0.key() == b.0.key());
        let longest = reqs.iter().map(|(r, _)| r.max_wait()).max();
        let start = tokio::time::Instant::now();
        let deadline = start + longest.unwrap_or_default().min(crate::spec::MAX_TTL);
        let locks = Locks::new(backend.clone(), route, defaults, meter.clone());
        for (req, spec) in &reqs {
            let now = tokio::time::Instant::now();
            let mut until = deadline;
            if let Some(expiry) = locks.earliest_expiry() {
                until = until.min(expiry);
            }
            let asked = req.max_wait();
            let req = req.with_max_wait(asked.min(until.saturating_duration_since(now)));
            match acquire_guarded(&backend, &req, &meter).await {
                Ok(lock) => {
                    let _ = locks.register(lock, spec.get_auto_release(), spec.get_watchdog());
                }
                Err(e) => {
                    give_back(&locks).await;
                    // A lock that may wait, tried without waiting because the
                    // request's wait was used up on its other locks: the wait
                    // ran out, as the error says.
                    return Err(match e {
                        LockError::AcquisitionFailed { retry_after } if !asked.is_zero() => {
                            LockError::Timeout {
                                waited: start.elapsed(),
                                retry_after,
                            }
                        }
                        e => e,
                    });
                }
            }
        }
        ready_to_run(locks).await
    })
}

/// `locks` if every one is still held with time left, so the handler may
/// run; else they are given back and the request fails with
/// [`LockError::Expired`]. A lock can run out before the handler starts: a
/// hand-off read late, a reply slower than the TTL.
async fn ready_to_run(locks: Locks) -> Result<Locks, LockError> {
    if !locks.any_lost() {
        return Ok(locks);
    }
    tracing::warn!("a lock ran out before the handler could run; the request is refused");
    locks.record_lost();
    give_back(&locks).await;
    Err(LockError::Expired)
}

/// Release every lock of a request that will not run. Finished in a task if
/// this request is dropped meanwhile (client gone, outer timeout): the
/// registry is closed, so nothing else would release them.
async fn give_back(locks: &Locks) {
    if let Some(release) = locks.close_and_release_all() {
        release.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::time::Instant;

    #[test]
    fn a_lease_that_ends_before_its_ttl_is_believed_only_until_it_ends() {
        // etcd, fault-schedule seed 1073: a waiter handed the lock while
        // etcd could not confirm its lease's keep-alives was told the lock
        // ends in 307 ms (its lease's known end), with a TTL of 381 ms. The
        // handle believed the TTL, said "held" past the end, and a write
        // under its fence landed after the next holder was granted.
        let at = SystemTime::now();
        let ttl = Duration::from_millis(381);
        let short = Lease {
            fence: 1,
            acquired_at: at,
            expires_at: at + Duration::from_millis(307),
            ttl,
        };
        assert_eq!(short.lasts(), Duration::from_millis(307));
        let req = AcquireRequest::new(
            crate::LockKey::global("k").unwrap(),
            "o",
            ttl,
            Duration::from_secs(1),
        )
        .unwrap();
        let started = Instant::now();
        let lock = acquired(
            &req,
            Ok(short.clone()),
            started,
            started,
            &Meter::default(),
            &tracing::Span::none(),
        )
        .unwrap();
        assert_eq!(lock.expiry(), started + Duration::from_millis(307));
        // A lease dated later than its start (a restore, a retry that kept
        // the first acquisition's date) still runs its TTL.
        let later = Lease {
            acquired_at: at - Duration::from_secs(5),
            expires_at: at + ttl,
            ..short.clone()
        };
        assert_eq!(later.lasts(), ttl);
        // Already over by the backend's word: over.
        let over = Lease {
            expires_at: at - Duration::from_millis(1),
            ..short
        };
        assert_eq!(over.lasts(), Duration::ZERO);
    }

    #[test]
    fn ttl_start_after_a_wait_is_dated_by_the_lease() {
        let sent = Instant::now();
        let now = sent + Duration::from_secs(10);
        let wall = SystemTime::now();
        let at = |age_ms: u64| ttl_start(sent, now, wall, wall - Duration::from_millis(age_ms));
        // Handed over 3 ms before the reply was read: 3 ms before now.
        assert_eq!(at(3), now - Duration::from_millis(3));
        // Never before the request was sent, never after now.
        assert_eq!(at(60_000), sent);
        assert_eq!(
            ttl_start(sent, now, wall, wall + Duration::from_secs(1)),
            now
        );
    }
}
