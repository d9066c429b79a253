//! Waiting for a busy lock: the wait loop (woken by the hand-off, the
//! holder's expiry or the max wait; a capped, jittered re-check is only a
//! safety net) and the guard that leaves the queue when a waiter goes away.

use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use super::RedisBackend;
use super::error::bad_reply;
use super::ops::{Attempt, LeaveMode, Left};
use super::scripts::{ceil_ms, server_time};
use super::wake::{Wake, Wakes};
use crate::backend::Lease;
use crate::backend::retry::leave_until;
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::{AcquireRequest, MAX_TTL};

/// First and largest interval of the safety-net re-check while waiting.
const RECHECK_FIRST: Duration = Duration::from_millis(250);
const RECHECK_MAX: Duration = Duration::from_secs(2);

impl RedisBackend {
    pub(super) async fn acquire_inner(&self, req: &AcquireRequest) -> Result<Lease, LockError> {
        let start = Instant::now();
        let ttl_ms = ceil_ms(req.ttl());
        if req.max_wait().is_zero() {
            return match self.attempt(req, ttl_ms, None, self.deadline()).await? {
                Attempt::Acquired(lease) => Ok(lease),
                Attempt::Mismatch => Err(LockError::KindMismatch),
                Attempt::Busy { retry_after, .. } => Err(LockError::AcquisitionFailed {
                    retry_after: Some(retry_after),
                }),
            };
        }
        // (A wait longer than a year is as good as forever and keeps the
        // arithmetic far from overflow.)
        let deadline = start + req.max_wait().min(MAX_TTL);
        let hard_end = deadline + self.op_timeout;
        let wake = &self.shared.wake;
        let mut guard = WaitGuard {
            backend: self,
            key: req.key(),
            owner: req.owner(),
            id: wake.next_id(),
            queued: false,
            until: deadline,
        };
        // Registered before the first attempt when the subscription is live.
        // Every attempt joins the queue, the first too, live subscription or
        // not: the queue's order is arrival at the server, and a waiter that
        // first subscribed would let newcomers in ahead of it meanwhile. A
        // hand-off published before we listen is not lost: the attempt
        // after subscribing finds the lock ours (acquire is idempotent for
        // the attempt it was handed to).
        let slot = self.slot(req.key());
        let mut grant_rx: Option<Wakes> = wake.register(guard.id, slot);
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
            let queue = Some((
                ceil_ms(deadline.saturating_duration_since(now)).max(1),
                guard.id,
            ));
            guard.queued = true;
            let retry_after = match self.attempt(req, ttl_ms, queue, end).await? {
                Attempt::Acquired(lease) => {
                    // The script took us out of the queue.
                    guard.queued = false;
                    return Ok(lease);
                }
                // Refused before queueing: only an entry of an earlier
                // attempt is left to leave.
                Attempt::Mismatch => {
                    guard.queued = entries > 0;
                    return Err(LockError::KindMismatch);
                }
                Attempt::Busy {
                    retry_after,
                    queued_anew,
                    sent_twice,
                } => {
                    // A first attempt re-sent after its reply was lost finds
                    // the entry its first run made ("not anew"): any busy
                    // answer means this call has had an entry, so the first
                    // counts whatever the script says (an entry made later,
                    // after a hand-off, is then the second, and its grants
                    // are checked). A later attempt sent twice may have
                    // made a new entry in its first run: it counts as one
                    // (at worst a grant is checked that did not need it).
                    entries = (entries + u32::from(queued_anew || sent_twice)).max(1);
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
                // Subscribe, then try again at once: a release between the
                // failed attempt and the subscription is not missed.
                let end = (now + self.op_timeout).min(hard_end);
                grant_rx = Some(wake.subscribe(guard.id, slot, end, self.op_timeout).await?);
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
                            let at = server_time(grant.acquired_ms);
                            return Ok(Lease::new(grant.fence, at, at, req.ttl()));
                        }
                        Some(Wake::Granted(_)) => {
                            // Maybe a stale grant: leave the queue, keeping
                            // the lock only if it is ours now. Never left
                            // behind: a later hand-off to a finished request
                            // would idle the lock for a whole TTL.
                            let end = (Instant::now() + self.op_timeout).min(hard_end);
                            let left = self
                                .leave(req.key(), req.owner(), guard.id, LeaveMode::Claim, req.ttl(), end)
                                .await?;
                            guard.queued = false;
                            match left {
                                Left::Claimed(lease) => return Ok(lease),
                                Left::NotHeld(_) => {
                                    entries = 0;
                                    grant_rx = wake.register(guard.id, slot);
                                }
                                Left::Dropped => return Err(bad_reply("leave")),
                            }
                        }
                        // At the head now, behind a holder whose TTL ends
                        // then (it may never release): sleep until then.
                        Some(Wake::FreeIn(free_in)) => {
                            holder_expires = Instant::now() + free_in + Duration::from_millis(1);
                            continue;
                        }
                        // The subscription died: re-check now (the lock may
                        // be ours already), subscribing again if still busy.
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
            .leave(
                req.key(),
                req.owner(),
                guard.id,
                LeaveMode::Claim,
                req.ttl(),
                end,
            )
            .await?;
        guard.queued = false;
        match left {
            Left::Claimed(lease) => Ok(lease),
            Left::NotHeld(holder_remaining) => Err(LockError::Timeout {
                waited: start.elapsed(),
                retry_after: Some(holder_remaining),
            }),
            Left::Dropped => Err(bad_reply("leave")),
        }
    }
}

/// A waiter's registration and (once `queued`) its queue entry in Redis.
/// Dropped without being cleared (the acquire future was cancelled, or it
/// failed), it leaves the queue in the background, releasing the lock if it
/// was handed over meanwhile: nobody would ever release it otherwise.
///
/// When Redis cannot be reached (a failover under way), leaving is retried,
/// backing off, until the entry's own deadline, after which the scripts
/// ignore it anyway: an entry left behind would be handed the lock by the
/// next release, which then idles for the hand-off's whole TTL. A pause
/// ends early (after 50 ms; never two pauses in a row) when Redis answers
/// another script call of this backend after a failure
/// (`backend/retry.rs`): once the app's own calls get through again, the
/// entry goes with them. A process that sends nothing else waits out the
/// pause (at most 1 s); on a cluster an answer from any shard counts.
///
/// A leave goes behind the waiter's last attempt when that one is still in
/// flight (`trail.rs`). Should that connection stall, the leave stalls with
/// it, and the entry an earlier attempt made stays queued meanwhile: a
/// hand-off to it would idle the lock. So in that case each try also sends
/// a leave on the current connection (a fresh one once the stalled one
/// timed out); what the attempt does when it lands, the leave behind it
/// undoes.
struct WaitGuard<'a> {
    backend: &'a RedisBackend,
    key: &'a LockKey,
    owner: &'a str,
    id: u64,
    queued: bool,
    /// The entry's deadline in Redis (the waiter's max wait).
    until: Instant,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.backend.shared.wake.unregister(self.id);
        if !self.queued {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to run it on: the entry expires at its deadline.
            return;
        };
        let backend = self.backend.clone();
        let key = self.key.clone();
        let owner = self.owner.to_owned();
        let id = self.id;
        let until = self.until;
        runtime.spawn(async move {
            let (key, owner) = (&key, &owner);
            let answers = backend.shared.conn.answers();
            leave_until(Some(answers), key, until, || async {
                let end = backend.deadline();
                let behind = backend.leave(key, owner, id, LeaveMode::Drop, Duration::ZERO, end);
                if backend.shared.trails.of(owner).is_some() {
                    let now =
                        backend.leave(key, owner, id, LeaveMode::DropNow, Duration::ZERO, end);
                    tokio::join!(behind, now).0
                } else {
                    behind.await
                }
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
