//! Waiting for a busy lock.
//!
//! A waiter's attempt leaves an entry in the lock's queue (on its process's
//! lease: a dead waiter's entry goes with it); the queue is ordered by the
//! entries' create revisions. The waiter then watches the entry just before
//! its own, or the holder key once it is the oldest (one watcher per key:
//! a release wakes one waiter). A release hands the lock straight to the
//! oldest entry; that waiter sees its holder key created on its watch and
//! returns without another round trip. When what it watches goes away for
//! another reason (a waiter ahead left, a holder's lease ran out), it reads
//! the queue again: it watches its new predecessor, or, oldest with no
//! holder, hands the lock to itself. A jittered, capped re-read is only a
//! safety net for a watch that went quiet.
//!
//! Each watch starts at the revision etcd sets it up at, never at a past
//! one: a watch from the past starts unsynced, and etcd delivers its events
//! only on its next catch-up pass (every 100 ms), which made every hand-off
//! under contention wait for one (≈ 40 ms each). Once etcd says the watch
//! is set up, the waiter reads the queue again if anything changed since
//! its last read (the watch's revision says), and keeps the watch across
//! re-reads while it watches the same key.

use std::time::{Duration, SystemTime};

use etcd_client::{GetOptions, SortOrder, SortTarget, Txn, TxnOp};
use tokio::time::{Instant, sleep_until};

use super::EtcdBackend;
use super::conn::bad_reply;
use super::handoff::{Giving, Snapshot};
use super::keys::{HeldKey, LockKeys, Waiter};
use super::kinds::{earliest_end, fits};
use super::leave::WaitGuard;
use super::near::Told;
use super::ops::{Attempt, kvs_at, revision};
use super::place::{Place, Target, handed_over, jitter};
use super::watch::Note;
use crate::backend::Lease;
use crate::error::LockError;
use crate::spec::{AcquireRequest, MAX_TTL};

/// First and largest interval of the safety-net re-read while waiting.
const RECHECK_FIRST: Duration = Duration::from_millis(250);
const RECHECK_MAX: Duration = Duration::from_secs(2);

/// What a read of the queue found for a waiter.
enum Seen {
    /// The lock is ours (handed over); whether our entry is still queued
    /// (the hold came through another entry of the same owner and attempt:
    /// a retry of the same request, waiting beside this call).
    Granted(Lease, bool),
    /// Our entry is gone and the lock is not ours (our lease ran out).
    Lost,
    /// Still waiting: watch from here.
    Waiting(Place),
}

impl EtcdBackend {
    pub(super) async fn acquire_inner(&self, req: &AcquireRequest) -> Result<Lease, LockError> {
        let start = Instant::now();
        let keys = self.keys(req.key());
        if req.max_wait().is_zero() {
            return match self
                .attempt(req, &keys, None, None, self.deadline())
                .await?
            {
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
        let until = std::time::SystemTime::now() + req.max_wait().min(MAX_TTL);
        let mut guard = WaitGuard::new(self, &keys, req, until);
        let mut place = match self.join(&mut guard, hard_end).await? {
            Attempt::Acquired(lease) => return Ok(lease),
            Attempt::Busy { queued, .. } => {
                Place::from(queued.ok_or_else(|| bad_reply("acquire"))?)
            }
        };
        let mut recheck = RECHECK_FIRST;
        // The open watch and what it watches: kept across re-reads while the
        // target stays (a synced watch misses nothing from its creation on).
        let mut watching: Option<(Target, super::watch::Watch)> = None;
        // Told by this process that our entry is the oldest (see `near`).
        let mut headed = false;
        // The revision of what woke us, if a watch did (see `look`).
        let mut seen_at: Option<i64> = None;
        loop {
            if Instant::now() >= deadline {
                return self.give_up(&mut guard, start, hard_end).await;
            }
            let end = (Instant::now() + self.op_timeout).min(hard_end);
            // What to watch: the entry before ours, or the holders.
            let target = Target::of(&place, &keys);
            if watching.as_ref().is_none_or(|(t, _)| *t != target) {
                // (The old watch, if any, is cancelled as it drops.)
                watching = None;
                let (key, range_end) = target.clone().into_parts();
                if let Ok(watch) = self
                    .shared
                    .watches
                    .watch(&self.shared, key, range_end, None, end)
                    .await
                {
                    watching = Some((target, watch));
                }
            }
            let wake_at = (Instant::now() + jitter(recheck)).min(deadline);
            recheck = (recheck * 2).min(RECHECK_MAX);
            if let Some((_, watch)) = watching.as_mut() {
                let mut woken = false;
                while !woken {
                    tokio::select! {
                        biased;
                        told = guard.told() => match told {
                            // Handed over by this process (see `near`).
                            Told::Granted(h, lease) => {
                                guard.entry = None;
                                return Ok(self.granted(req, &h, lease));
                            }
                            // The oldest now: watch the holders, no read.
                            Told::Head(at) => if place.heads(at) {
                                headed = true;
                                break;
                            },
                        },
                        note = watch.next() => match note {
                            // Set up: what changed between our read and
                            // then reached no watch; read again unless
                            // nothing did.
                            Note::Created(at) => {
                                woken = at != place.read_at;
                                seen_at = Some(at);
                            }
                            Note::Events(events) => {
                                // Handed over: our holder key was created.
                                let mine = keys.holder(req.kind(), req.owner(), req.attempt());
                                if let Some(kv) = handed_over(&events, &mine, &place)
                                    && let Some(h) = HeldKey::from_kv(&keys, kv)
                                {
                                    guard.entry = None;
                                    return Ok(self.granted(req, &h, kv.lease()));
                                }
                                // The holder was rewritten (extended): keep
                                // watching; anything else: read again.
                                woken = events.iter().any(|(put, kv)| {
                                    !*put || keys.parse_holder(kv.key()).is_none()
                                });
                                seen_at = events.iter().map(|(_, kv)| kv.mod_revision()).max();
                            }
                            Note::Gone => {
                                watching = None;
                                seen_at = None;
                                break;
                            }
                        },
                        () = sleep_until(wake_at) => {
                            woken = true;
                            seen_at = None;
                        }
                    }
                }
            } else {
                // No watch now (etcd unreachable): read again a bit later.
                tokio::select! {
                    told = guard.told() => match told {
                        Told::Granted(h, lease) => {
                            guard.entry = None;
                            return Ok(self.granted(req, &h, lease));
                        }
                        Told::Head(at) => headed = place.heads(at),
                    },
                    () = sleep_until(wake_at) => {}
                }
            }
            if std::mem::take(&mut headed) {
                continue;
            }
            let end = (Instant::now() + self.op_timeout).min(hard_end);
            let seen = match self.look(req, &keys, &place, seen_at.take(), end).await {
                Ok(seen) => seen,
                // etcd cannot answer now (a leader election, a member
                // gone): the entry stays queued, consensus keeps it. Read
                // again shortly, until the max wait ends.
                Err(LockError::BackendUnavailable(_)) if Instant::now() < deadline => {
                    recheck = RECHECK_FIRST / 2;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match seen {
                Seen::Granted(lease, queued) => {
                    // Still queued: the guard takes the entry out of the
                    // queue as it drops, and gives nothing back (the hold
                    // is ours; its other call, here or in another process,
                    // may have rewritten it since our read). Left there,
                    // the entry would be handed the lock again once it came
                    // to the head, for no call: held on our lease, with no
                    // timer, as long as this process lives.
                    if queued {
                        guard.answered = true;
                    } else {
                        guard.entry = None;
                    }
                    return Ok(lease);
                }
                Seen::Waiting(next) => place = next,
                Seen::Lost => match self.join(&mut guard, end).await? {
                    Attempt::Acquired(lease) => return Ok(lease),
                    Attempt::Busy { queued, .. } => {
                        place = Place::from(queued.ok_or_else(|| bad_reply("acquire"))?);
                    }
                },
            }
        }
    }

    /// An attempt that queues when busy, under a fresh entry id, which the
    /// guard knows before it is sent: an entry made by an attempt whose
    /// reply never came still leaves the queue.
    async fn join(
        &self,
        guard: &mut WaitGuard<'_>,
        hard_end: Instant,
    ) -> Result<Attempt, LockError> {
        let end = (Instant::now() + self.op_timeout).min(hard_end);
        let id = crate::spec::new_attempt_id();
        guard.queue_as(guard.keys.waiter(id));
        let until = Some(guard.until);
        // Until its reply is read, the attempt may still land (and queue the
        // entry again after a leave).
        guard.in_flight = true;
        let attempt = self
            .attempt(guard.req, guard.keys, Some(id), until, end)
            .await?;
        guard.in_flight = false;
        match &attempt {
            // Taken at once: no entry was made.
            Attempt::Acquired(_) => guard.entry = None,
            // Our place in the queue dates from here (the same event as the
            // other backends'; the chaos checker's first-come rule reads it).
            Attempt::Busy {
                queued: Some(_), ..
            } => tracing::debug!(key = %guard.key.digest(), "lock busy: waiting"),
            Attempt::Busy { .. } => {}
        }
        Ok(attempt)
    }

    /// Whether a waiting call that found its holder key held as `h` (on
    /// `lease`; `queued`: its own entry still there) must take it over
    /// ([`EtcdBackend::take_over`]) before answering with it: the hold came
    /// through another call's entry (a twin of this request, same owner
    /// and attempt, so the same holder key, queued here or in another
    /// process), whose leave may give it back, and nobody has written it
    /// since the hand-off. It came through our own entry when that entry
    /// is gone (a hand-off deletes the entry it goes through) and the hold
    /// is on one of our leases (a hand-off writes it on the entry's). One
    /// written since (the twin's extension or refresh) is some call's, which
    /// a leave never gives back, and may last longer than our TTL: taken
    /// over, it would end sooner than its holder was told.
    fn must_take_over(&self, h: &HeldKey, queued: bool, lease: i64) -> bool {
        let ours = !queued && self.shared.leases.known_until(lease).is_some();
        !ours && !h.rewritten
    }

    /// The lock handed to us as `h` (on our lease `lease`): ours until its
    /// stored expiry, or sooner if etcd keeps our lease less long.
    fn granted(&self, req: &AcquireRequest, h: &HeldKey, lease: i64) -> Lease {
        let (now, at) = (SystemTime::now(), Instant::now());
        let mut left = h
            .value
            .expires_at()
            .duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(req.ttl());
        if let Some(until) = self.shared.leases.known_until(lease) {
            left = left.min(until.saturating_duration_since(at));
        }
        self.shared.expiries.arm(
            self,
            req.key(),
            h.key.clone(),
            h.raw_value.clone(),
            Some(h.fence),
            at + left,
        );
        Lease {
            fence: h.fence,
            acquired_at: h.value.acquired_at(),
            expires_at: now + left,
            ttl: req.ttl(),
        }
    }

    /// Read the lock again for a waiter at `place`: granted, lost, or where
    /// it stands now (handing the lock to itself when it is the oldest and
    /// nobody holds it).
    ///
    /// `at_least`: the revision of what woke the waiter (a watch event, or
    /// the revision its new watch was set up at). The watch delivers every
    /// change after it, so a read at that revision or later misses
    /// nothing: it is answered by the member the connection uses (the
    /// leader, when it is known) as that member has applied the log (a
    /// serializable read: no round of heartbeats to the other members to
    /// confirm the leadership first, as a linearizable read takes), and
    /// linearizably when that member is behind it (or behind the waiter's
    /// last read, which an event from before it may predate). Without it (the
    /// safety-net re-read, which is there for a watch that went quiet) the
    /// read is linearizable.
    async fn look(
        &self,
        req: &AcquireRequest,
        keys: &LockKeys,
        place: &Place,
        at_least: Option<i64>,
        end: Instant,
    ) -> Result<Seen, LockError> {
        const WHAT: &str = "waiting";
        let mine = keys.holder(req.kind(), req.owner(), req.attempt());
        // Never older than what the waiter read last (a watch kept across a
        // re-join can deliver events from before it).
        let mut at_least = at_least.map(|r| r.max(place.read_at));
        // (One more turn than hand-offs to retry: a read from a member
        // behind `at_least`.)
        for _ in 0..5 {
            let serializable = at_least.is_some();
            let options = |o: GetOptions| {
                if serializable {
                    o.with_serializable()
                } else {
                    o
                }
            };
            let (start, stop) = keys.queue();
            let before = TxnOp::get(
                start,
                Some(options(
                    GetOptions::new()
                        .with_range(stop)
                        .with_max_create_revision(place.revision - 1)
                        .with_sort(SortTarget::Create, SortOrder::Descend)
                        .with_limit(1)
                        .with_keys_only(),
                )),
            );
            let txn = Txn::new().and_then([
                keys.read_holders(options(GetOptions::new())),
                before,
                TxnOp::get(place.entry.clone(), Some(options(GetOptions::new()))),
            ]);
            let reply = self.shared.conn.txn(WHAT, txn, end).await?;
            let read_at = revision(&reply, WHAT)?;
            if at_least.take().is_some_and(|r| read_at < r) {
                // The member asked has not applied what woke us: ask
                // through the leader.
                continue;
            }
            let holder_kvs = kvs_at(&reply, 0, WHAT)?;
            let holders = holder_kvs
                .iter()
                .map(|kv| HeldKey::from_kv(keys, kv).ok_or_else(|| bad_reply(WHAT)))
                .collect::<Result<Vec<_>, _>>()?;
            let entry = kvs_at(&reply, 2, WHAT)?;
            if let Some((h, kv)) = holders.iter().zip(&holder_kvs).find(|(h, _)| h.key == mine) {
                let queued = !entry.is_empty();
                if self.must_take_over(h, queued, kv.lease()) {
                    match self.take_over(req, h, end).await? {
                        Some(lease) => return Ok(Seen::Granted(lease, queued)),
                        // Given back meanwhile: read again.
                        None => continue,
                    }
                }
                let lease = self.granted(req, h, kv.lease());
                return Ok(Seen::Granted(lease, queued));
            }
            let Some(entry) = entry.first().and_then(Waiter::from_kv) else {
                return Ok(Seen::Lost);
            };
            let before = kvs_at(&reply, 1, WHAT)?.first().map(|kv| kv.key().to_vec());
            if before.is_some() || !fits(req.kind(), &holders) {
                return Ok(Seen::Waiting(Place {
                    entry: place.entry.clone(),
                    revision: place.revision,
                    before,
                    read_at,
                }));
            }
            // The oldest, and it fits beside the holds (nobody holds it,
            // or a hand-off stopped short of it): take it.
            let snapshot = Snapshot {
                holders,
                head: Some(entry),
                at: read_at,
            };
            self.pass_on(keys, snapshot, Giving::Nothing, &[], end)
                .await?;
        }
        Err(bad_reply(WHAT))
    }

    /// The max wait is over: leave the queue, unless the lock was handed to
    /// us at the last moment, in which case it is ours.
    async fn give_up(
        &self,
        guard: &mut WaitGuard<'_>,
        start: Instant,
        hard_end: Instant,
    ) -> Result<Lease, LockError> {
        let end = self.deadline().min(hard_end);
        let req = guard.req;
        let Some(entry) = guard.entry.clone() else {
            return Err(LockError::Timeout {
                waited: start.elapsed(),
                retry_after: None,
            });
        };
        let keys = guard.keys;
        let txn = self.leaving(keys, req.owner(), entry);
        let reply = self.shared.conn.txn("leaving the queue", txn, end).await?;
        guard.entry = None;
        let last = reply.op_responses().len().saturating_sub(1);
        let holders = kvs_at(&reply, last, "leaving the queue")?
            .iter()
            .map(|kv| Some((HeldKey::from_kv(keys, kv)?, kv.lease())))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad_reply("leaving the queue"))?;
        let mine = keys.holder(req.kind(), req.owner(), req.attempt());
        if let Some((h, lease)) = holders.iter().find(|(h, _)| h.key == mine) {
            // (Our entry is gone now: whose it was, its lease says.)
            if self.must_take_over(h, false, *lease) {
                if let Some(lease) = self.take_over(req, h, end).await? {
                    return Ok(lease);
                }
                return Err(LockError::Timeout {
                    waited: start.elapsed(),
                    retry_after: None,
                });
            }
            return Ok(self.granted(req, h, *lease));
        }
        let holders: Vec<HeldKey> = holders.into_iter().map(|(h, _)| h).collect();
        Err(LockError::Timeout {
            waited: start.elapsed(),
            retry_after: Some(earliest_end(&holders)),
        })
    }
}

#[cfg(test)]
#[path = "wait_test.rs"]
mod wait_test;
