//! Joining a flight, as the leader or as one who gets the leader's result:
//! the part [`SingleFlight::run`](super::SingleFlight::run) and the HTTP
//! layer share. Values are bytes here; encoding is theirs.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{FlightPublish, FlightResult, FlightStart, FlightWait, SharedBackend};
use crate::error::LockError;
use crate::key::LockKey;
use crate::lock::OwnedLock;
use crate::lock::acquire::{InFlight, acquire_guarded, acquired};
use crate::lock::release::release_detached;
use crate::observe::{self, Meter};
use crate::spec::AcquireRequest;

/// How a flight's settings reach the engine.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub(crate) max_wait: Duration,
    pub(crate) lock_ttl: Duration,
    pub(crate) watchdog: bool,
}

/// What joining a flight gave this caller.
pub(crate) enum Role {
    /// Another caller's result: one published while this caller waited, or
    /// (`stored`) one published before it came and kept for the result TTL.
    Shared { result: FlightResult, stored: bool },
    /// This caller computes.
    Leader(Box<Leader>),
}

/// The caller that computes: it holds the flight's lock (renewed by the
/// watchdog while it computes) until it publishes or gives up. Dropped
/// without either (the computation panicked or was cancelled), the lock is
/// released and the next waiter computes.
pub(crate) struct Leader {
    backend: SharedBackend,
    key: LockKey,
    lock: OwnedLock,
    keep: Duration,
}

impl Leader {
    /// Share `value`: stored for `result_ttl` (and kept for those already
    /// waiting), every waiter woken with it, the lock released, in one step.
    /// If that fails the lock is released and the next waiter computes.
    pub(crate) async fn publish(self, value: Arc<[u8]>, result_ttl: Duration) {
        let publish = FlightPublish {
            fence: self.lock.fence(),
            value,
            result_ttl,
            keep: self.keep.max(result_ttl),
        };
        let owner = self.lock.info().owner().to_owned();
        match self
            .backend
            .flight_publish(&self.key, &owner, &publish)
            .await
        {
            Ok(()) => self.lock.released_by_backend(),
            Err(e) => {
                observe::flight_publish_failed(&self.backend, &e);
                tracing::warn!(
                    key = %self.key.digest(),
                    code = e.code(),
                    error = %e,
                    "a single-flight result could not be shared; the next waiter computes"
                );
                let _ = self.lock.release().await;
            }
        }
    }

    /// Give up without a result to share (the computation failed, or its
    /// result must not be shared): the lock goes to the next waiter, which
    /// computes.
    pub(crate) async fn abandon(self) {
        let _ = self.lock.release().await;
    }

    /// The fence of the flight's lock (the result's `seq` once published).
    pub(crate) fn fence(&self) -> u64 {
        self.lock.fence()
    }
}

/// Join the flight `key`: its fresh result, or its lock (then compute), or
/// wait for whichever comes first of the leader's result and the lock (a
/// leader that fails or dies passes the lock on). Waits at most
/// `settings.max_wait` ([`LockError::Timeout`] after it). `refuses_stored`:
/// the caller will not use a stored result (it asks for a fresh answer),
/// so one found is not counted as `fresh`: the caller counts the flight it
/// then joins instead.
pub(crate) async fn join(
    backend: &SharedBackend,
    key: LockKey,
    settings: Settings,
    refuses_stored: bool,
) -> Result<Role, LockError> {
    let (outcome, role) = match begin(backend, key, settings).await {
        Ok((outcome, role)) => (outcome, Ok(role)),
        Err(e) => (observe::error_outcome(&e), Err(e)),
    };
    if !(refuses_stored && matches!(role, Ok(Role::Shared { stored: true, .. }))) {
        observe::flight(backend, outcome);
    }
    role
}

/// [`join`], with the outcome to count: `fresh` (a stored result), `leader`
/// or `shared` (a result published while this caller waited).
async fn begin(
    backend: &SharedBackend,
    key: LockKey,
    settings: Settings,
) -> Result<(&'static str, Role), LockError> {
    let req = AcquireRequest::fresh(key, settings.lock_ttl, settings.max_wait)?;
    let sent = tokio::time::Instant::now();
    // Dropped mid-call (the client went away), the step may still have
    // taken the lock: given back with the owner token made for this call.
    let mut beginning = InFlight {
        backend,
        req: &req,
        done: false,
    };
    let started = backend.flight_begin(&req).await;
    // An unreachable backend may have taken the lock before its reply was
    // lost: the guard gives it back (also if this caller goes away then).
    beginning.done = !matches!(started, Err(LockError::BackendUnavailable(_)));
    drop(beginning);
    match started {
        Ok(FlightStart::Fresh(result)) => Ok((
            "fresh",
            Role::Shared {
                result,
                stored: true,
            },
        )),
        Ok(FlightStart::Leader(lease)) => {
            // A flight's lock is counted as a flight, not as a lock.
            let lock = acquired(
                &req,
                Ok(lease),
                sent,
                sent,
                &Meter::none(),
                &tracing::Span::none(),
            )?;
            let leader = leader(backend, &req, lock, settings);
            Ok(("leader", Role::Leader(Box::new(leader))))
        }
        Ok(FlightStart::Busy(wait)) => {
            let role = follow(backend, &req, wait, settings).await?;
            let outcome = match role {
                Role::Shared { .. } => "shared",
                Role::Leader(_) => "leader",
            };
            Ok((outcome, role))
        }
        // (An unreachable backend's lock, if any, is given back by the
        // guard above.)
        Err(e) => Err(e),
    }
}

/// Wait for the leader's result or for the lock, whichever comes first.
async fn follow(
    backend: &SharedBackend,
    req: &AcquireRequest,
    wait: FlightWait,
    settings: Settings,
) -> Result<Role, LockError> {
    let FlightWait { seen, result } = wait;
    let mut result = Some(result);
    // Guarded: dropped when the result wins, it leaves the queue and gives
    // back a lock handed to it meanwhile.
    let meter = Meter::none();
    let acquire = acquire_guarded(backend, req, &meter);
    tokio::pin!(acquire);
    loop {
        tokio::select! {
            // A result at hand wins over a lock handed over at the same
            // time: taking the lock would cost a read and a release.
            biased;
            shared = async { result.as_mut().expect("guarded by the branch condition").await },
                if result.is_some() =>
            {
                match shared {
                    Ok(result) => {
                        return Ok(Role::Shared {
                            result,
                            stored: false,
                        });
                    }
                    // The wake-up cannot come any more: wait on the lock
                    // alone, and read the result once it is ours.
                    Err(_) => result = None,
                }
            }
            held = &mut acquire => {
                // The lock is ours: the leader failed or died, or it
                // published and we got the lock before its wake-up. Until
                // it leads, a drop (the caller went away during the read)
                // gives the lock back.
                let lock = Unled(backend, Some(held?));
                let read = backend.flight_result(req.key()).await;
                let lock = lock.into_inner();
                return match read {
                    Ok(Some(shared)) if shared.seq > seen => {
                        let _ = OwnedLock::from_parts(backend.clone(), lock, None).release().await;
                        Ok(Role::Shared {
                            result: shared,
                            stored: false,
                        })
                    }
                    Ok(_) => Ok(Role::Leader(Box::new(leader(backend, req, lock, settings)))),
                    Err(e) => {
                        let _ = OwnedLock::from_parts(backend.clone(), lock, None).release().await;
                        Err(e)
                    }
                };
            }
        }
    }
}

/// A flight's lock handed to a follower that does not lead yet: dropped
/// with it, the lock is given back.
struct Unled<'a>(&'a SharedBackend, Option<crate::HeldLock>);

impl Unled<'_> {
    fn into_inner(mut self) -> crate::HeldLock {
        self.1.take().expect("taken once")
    }
}

impl Drop for Unled<'_> {
    fn drop(&mut self) {
        if let Some(lock) = self.1.take() {
            release_detached(self.0, smallvec::smallvec![lock]);
        }
    }
}

fn leader(
    backend: &SharedBackend,
    req: &AcquireRequest,
    lock: crate::HeldLock,
    settings: Settings,
) -> Leader {
    let watch = settings.watchdog.then(|| lock.watch(backend));
    Leader {
        backend: backend.clone(),
        key: req.key().clone(),
        lock: OwnedLock::from_parts(backend.clone(), lock, watch),
        keep: settings.max_wait,
    }
}
