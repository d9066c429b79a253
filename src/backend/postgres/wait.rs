//! Acquiring, with waiting: the loop and its drop guard.
//!
//! A busy lock queues the call (a ticket) in the waiters table and sleeps
//! until, whichever comes first: the release hands it the lock (a
//! notification on the backend's `LISTEN` connection, which carries the
//! lease), the holder's TTL runs out (a crashed holder never notifies; the
//! next call then hands the expired lock to the queue's head), its own max
//! wait ends, or, as a safety net only, a capped, jittered interval. The
//! holder's expiry is the one its last attempt saw, until the server tells
//! it another: a waiter that comes to the head of the queue behind a
//! hand-off hears how long the new holder holds.

use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use super::PostgresBackend;
use super::error::bad_reply;
use super::listen::{Orphan, Wake, Wakes};
use super::ops::{Attempt, Left, Ticket, ceil_ms, col, server_time};
use super::statements::Statement;
use crate::backend::Lease;
use crate::backend::retry::leave_until;
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::{AcquireRequest, MAX_TTL};

/// First and largest interval of the safety-net re-check while waiting.
const RECHECK_FIRST: Duration = Duration::from_millis(250);
const RECHECK_MAX: Duration = Duration::from_secs(2);

impl PostgresBackend {
    pub(super) async fn acquire_inner(&self, req: &AcquireRequest) -> Result<Lease, LockError> {
        let start = Instant::now();
        if req.max_wait().is_zero() {
            return match self.attempt(req, None, self.deadline()).await? {
                Attempt::Acquired(lease) => Ok(lease),
                Attempt::Busy { retry_after, .. } => Err(LockError::AcquisitionFailed {
                    retry_after: Some(retry_after),
                }),
            };
        }
        // (A wait longer than a year is as good as forever and keeps the
        // arithmetic far from overflow.)
        let deadline = start + req.max_wait().min(MAX_TTL);
        let hard_end = deadline + self.op_timeout;
        let listener = &self.shared.listener;
        let mut guard = WaitGuard {
            backend: self,
            key: req.key(),
            owner: req.owner(),
            ticket: listener.waiter_ticket(),
            queued: false,
            until: deadline,
        };
        // Registered before the first attempt when the connection listens,
        // so that attempt can already join the queue.
        let mut grant_rx: Option<Wakes> = listener.register(guard.ticket);
        let mut recheck = RECHECK_FIRST;
        // Queue entries this call created. After a hand-off the lock can be
        // taken back (its TTL ran out before we read the grant, a force
        // release) and a re-check queues us again; a grant read after that
        // may be the old one, so from the second entry on a grant is
        // checked against the lock before it is believed.
        let mut entries = 0u32;
        loop {
            let now = Instant::now();
            let end = (now + self.op_timeout).min(hard_end);
            let ticket = guard.ticket();
            let queue = grant_rx.as_ref().map(|_| {
                (
                    ceil_ms(deadline.saturating_duration_since(now)).max(1),
                    ticket,
                )
            });
            guard.queued |= queue.is_some();
            let queuing = queue.is_some();
            let retry_after = match self.attempt(req, queue, end).await? {
                Attempt::Acquired(lease) => {
                    // The function took us out of the queue.
                    guard.queued = false;
                    return Ok(lease);
                }
                Attempt::Busy {
                    retry_after,
                    queued_anew,
                } => {
                    entries += u32::from(queued_anew);
                    if queuing {
                        // A first queueing call re-sent after its reply was
                        // lost finds the entry its first run made ("not
                        // anew"): a busy answer to a queueing call means
                        // this call has had an entry, so the first counts
                        // whatever the function says (an entry made later,
                        // after a hand-off, is then the second, and its
                        // grants are checked).
                        entries = entries.max(1);
                    }
                    if queued_anew {
                        // Our place in the queue dates from here (the same
                        // event as the in-memory backend's; the chaos
                        // checker's first-come rule reads it).
                        tracing::debug!(key = %req.key().digest(), "lock busy: waiting");
                    }
                    retry_after
                }
            };
            let now = Instant::now();
            if now >= deadline {
                return self
                    .give_up(&mut guard, req, start, retry_after, hard_end)
                    .await;
            }
            let Some(rx) = grant_rx.as_mut() else {
                // Listen, then try again at once: a release between the
                // failed attempt and the LISTEN is not missed.
                let end = (now + self.op_timeout).min(hard_end);
                grant_rx = Some(
                    listener
                        .subscribe(guard.ticket, end, self.op_timeout)
                        .await?,
                );
                continue;
            };
            // Wake when handed the lock, when the holder's TTL runs out (it
            // may have died without releasing), at our own deadline, or, as
            // a safety net only, after a capped, jittered interval.
            let mut holder_expires = now + retry_after + Duration::from_millis(1);
            let safety_net = now + jitter(recheck);
            recheck = (recheck * 2).min(RECHECK_MAX);
            loop {
                let wake_at = holder_expires.min(safety_net).min(deadline);
                tokio::select! {
                    biased;
                    woke = rx.recv() => match woke {
                        Some(Wake::Granted(grant)) if entries <= 1 => {
                            // The hand-off took us out of the queue.
                            guard.queued = false;
                            let at = server_time(grant.acquired_us);
                            return Ok(Lease::new(grant.fence, at, at, req.ttl()));
                        }
                        Some(Wake::Granted(_)) => {
                            // Maybe a stale grant: leave the queue, keeping
                            // the lock only if it is ours now. Never left
                            // behind: a later hand-off to a finished request
                            // would idle the lock for a whole TTL.
                            let end = (Instant::now() + self.op_timeout).min(hard_end);
                            let left = self
                                .leave(req.key(), req.owner(), guard.ticket(), true, req.ttl(), end)
                                .await?;
                            guard.queued = false;
                            match left {
                                Left::Claimed(lease) => return Ok(lease),
                                Left::NotHeld(_) => {
                                    entries = 0;
                                    grant_rx = listener.register(guard.ticket);
                                }
                                Left::Dropped => return Err(super::error::bad_reply("leave")),
                            }
                        }
                        // At the head now, behind a holder whose TTL ends
                        // then (it may never release): sleep until then.
                        Some(Wake::FreeIn(free_in)) => {
                            holder_expires = Instant::now() + free_in + Duration::from_millis(1);
                            continue;
                        }
                        // The connection died: re-check now (the lock may be
                        // ours already), listening again if still busy.
                        None => grant_rx = None,
                    },
                    () = sleep_until(wake_at) => {}
                }
                break;
            }
        }
    }

    /// The max wait is over: leave the queue, unless the lock was handed to
    /// us at the last moment, in which case it is ours.
    async fn give_up(
        &self,
        guard: &mut WaitGuard<'_>,
        req: &AcquireRequest,
        start: Instant,
        retry_after: Duration,
        hard_end: Instant,
    ) -> Result<Lease, LockError> {
        if !guard.queued {
            return Err(LockError::Timeout {
                waited: start.elapsed(),
                retry_after: Some(retry_after),
            });
        }
        let end = self.deadline().min(hard_end);
        let left = self
            .leave(req.key(), req.owner(), guard.ticket(), true, req.ttl(), end)
            .await?;
        guard.queued = false;
        match left {
            Left::Claimed(lease) => Ok(lease),
            Left::NotHeld(holder_remaining) => Err(LockError::Timeout {
                waited: start.elapsed(),
                retry_after: Some(holder_remaining),
            }),
            Left::Dropped => Err(super::error::bad_reply("leave")),
        }
    }
}

impl PostgresBackend {
    /// Pass on a grant that reached a waiter of this backend after its call
    /// was gone (see `Listener`); whether there was anything to pass on.
    pub(super) async fn pass_on(&self, orphan: &Orphan) -> Result<bool, LockError> {
        const WHAT: &str = "pass on";
        let fence = i64::try_from(orphan.fence).map_err(|_| bad_reply(WHAT))?;
        let row = self
            .shared
            .conns
            .query_one(
                Statement::PassOn,
                &[
                    &orphan.key,
                    &self.shared.listener.channel(),
                    &orphan.ticket,
                    &fence,
                ],
                None,
                self.deadline(),
                self.op_timeout,
            )
            .await?;
        Ok(col::<i32>(&row, 0, WHAT)? == 1)
    }
}

/// A waiter's registration and (once `queued`) its row in the waiters
/// table. Dropped without being cleared (the acquire future was cancelled,
/// or it failed), it leaves the queue in the background, passing on the
/// lock if it was handed over meanwhile: nobody would ever release it
/// otherwise.
struct WaitGuard<'a> {
    backend: &'a PostgresBackend,
    key: &'a LockKey,
    owner: &'a str,
    ticket: i64,
    queued: bool,
    /// The entry's deadline on the server (the waiter's max wait).
    until: Instant,
}

impl<'a> WaitGuard<'a> {
    fn ticket(&self) -> Ticket<'a> {
        Ticket {
            channel: self.backend.shared.listener.channel(),
            id: self.ticket,
        }
    }
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.backend.shared.listener.unregister(self.ticket);
        if !self.queued {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to run it on: the entry is skipped after its
            // deadline, and a lock handed to it expires at its TTL.
            return;
        };
        let backend = self.backend.clone();
        let key = self.key.clone();
        let owner = self.owner.to_owned();
        let id = self.ticket;
        let until = self.until;
        // Retried, backing off, while the server cannot be reached and the
        // entry is live: an entry left behind is handed the lock by the next
        // release, which then idles for the hand-off's whole TTL (and an
        // outage strands every waiter that gave up during it). Past the
        // entry's deadline the functions skip it: nothing left to do.
        runtime.spawn(async move {
            let key = &key;
            leave_until(None, key, until, || async {
                let end = backend.deadline();
                let ticket = Ticket {
                    channel: backend.shared.listener.channel(),
                    id,
                };
                backend
                    .leave(key, &owner, ticket, false, Duration::ZERO, end)
                    .await
            })
            .await;
        });
    }
}

/// `d` scaled by a random factor in [0.5, 1).
fn jitter(d: Duration) -> Duration {
    use std::cell::Cell;
    use std::hash::{BuildHasher, RandomState};
    thread_local! {
        static STATE: Cell<u64> = Cell::new(RandomState::new().hash_one(0x5eed_u64) | 1);
    }
    let r = STATE.with(|s| {
        // xorshift64
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    });
    let fraction = 0.5 + (r >> 11) as f64 / (1u64 << 53) as f64 / 2.0;
    d.mul_f64(fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..1000 {
            let j = jitter(Duration::from_millis(100));
            assert!(j >= Duration::from_millis(50) && j < Duration::from_millis(100));
        }
    }
}
