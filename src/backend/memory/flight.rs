//! Single-flight in memory: each flight's latest result and the wake-up of
//! its waiters, beside the flight's lock (an ordinary entry of the table,
//! under its `f:` key).
//!
//! One mutex over the flights orders every step of theirs: `begin` checks
//! the result and tries the lock under it, `publish` checks the lock, hands
//! it on, stores the result and wakes the waiters under it. Lock order:
//! this mutex, then a shard's (never the other way round).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::watch;
use tokio::time::Instant;

use super::table::Inner;
use crate::backend::{FlightPublish, FlightResult, FlightStart, FlightWait};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::{AcquireRequest, MAX_TTL, owners_match};

/// The flights of one backend.
#[derive(Default)]
pub(super) struct Flights {
    map: Mutex<FlightMap>,
}

#[derive(Default)]
struct FlightMap {
    slots: HashMap<LockKey, Slot>,
    ops_since_sweep: usize,
}

/// One flight: its stored result and the channel its waiters watch.
struct Slot {
    stored: Option<Stored>,
    /// The latest result published (waiters compare its `seq`).
    tx: watch::Sender<Option<FlightResult>>,
}

struct Stored {
    result: FlightResult,
    /// New callers get it until then.
    fresh_until: Instant,
    /// Kept for waiters that read it once they hold the lock until then,
    /// while there are any.
    keep_until: Instant,
}

impl Slot {
    fn new() -> Self {
        Slot {
            stored: None,
            tx: watch::Sender::new(None),
        }
    }

    /// The stored result, if still kept at `now`: while it answers new
    /// callers, and past that only while callers that waited for it are
    /// still waiting (each holds a receiver until it has its result).
    fn kept(&self, now: Instant) -> Option<&Stored> {
        let waited = self.tx.receiver_count() > 0;
        self.stored
            .as_ref()
            .filter(|s| s.fresh_until > now || (waited && s.keep_until > now))
    }

    /// Drop the result once it is no longer kept, from the channel too: a
    /// later caller must neither read it nor be woken with it.
    fn prune(&mut self, now: Instant) {
        if self.stored.is_some() && self.kept(now).is_none() {
            self.stored = None;
            self.tx.send_replace(None);
        }
    }
}

impl Flights {
    fn lock(&self) -> MutexGuard<'_, FlightMap> {
        // Every critical section leaves the map consistent.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl FlightMap {
    /// Count an operation; drop flights nobody waits on and whose result is
    /// gone, once there have been four times as many operations as flights
    /// (amortised O(1), memory bounded by the live flights).
    fn maybe_sweep(&mut self, now: Instant) {
        self.ops_since_sweep += 1;
        if self.ops_since_sweep >= (4 * self.slots.len()).max(64) {
            self.ops_since_sweep = 0;
            self.slots
                .retain(|_, slot| slot.kept(now).is_some() || slot.tx.receiver_count() > 0);
        }
    }
}

impl Inner {
    pub(super) fn flight_begin(&self, req: &AcquireRequest) -> Result<FlightStart, LockError> {
        let now = Instant::now();
        let mut flights = self.flights.lock();
        flights.maybe_sweep(now);
        let slot = flights
            .slots
            .entry(req.key().clone())
            .or_insert_with(Slot::new);
        slot.prune(now);
        let seen = match slot.kept(now) {
            Some(stored) if stored.fresh_until > now => {
                return Ok(FlightStart::Fresh(stored.result.clone()));
            }
            Some(stored) => stored.result.seq,
            None => 0,
        };
        match self.acquire_now(&req.with_max_wait(std::time::Duration::ZERO)) {
            Some(Ok(lease)) => Ok(FlightStart::Leader(lease)),
            Some(Err(LockError::AcquisitionFailed { .. })) => {
                let mut rx = slot.tx.subscribe();
                Ok(FlightStart::Busy(FlightWait {
                    seen,
                    result: Box::pin(async move {
                        loop {
                            if let Some(result) =
                                rx.borrow_and_update().as_ref().filter(|r| r.seq > seen)
                            {
                                return Ok(result.clone());
                            }
                            if rx.changed().await.is_err() {
                                return Err(LockError::BackendUnavailable(
                                    "the flight's wake-up is gone".into(),
                                ));
                            }
                        }
                    }),
                }))
            }
            Some(Err(e)) => Err(e),
            // A request that does not wait always gets an answer.
            None => Err(LockError::BackendUnavailable(
                "no answer for a flight's lock".into(),
            )),
        }
    }

    pub(super) fn flight_result(&self, key: &LockKey) -> Option<FlightResult> {
        let now = Instant::now();
        let flights = self.flights.lock();
        flights
            .slots
            .get(key)
            .and_then(|slot| slot.kept(now))
            .map(|stored| stored.result.clone())
    }

    pub(super) fn flight_publish(
        &self,
        key: &LockKey,
        owner: &str,
        publish: &FlightPublish,
    ) -> Result<(), LockError> {
        let mut flights = self.flights.lock();
        // The leader's own lock, still held: release it (handing it on).
        let released = self.free_if(key, |e, expired, _| {
            if expired {
                // Not held by anyone: free it for waiters right away, as a
                // release would; the result is not stored.
                Ok(Err(LockError::NotFound))
            } else if e.fence != publish.fence || !owners_match(&e.owner, owner) {
                Err(Err(LockError::OwnershipMismatch))
            } else {
                Ok(Ok(()))
            }
        });
        released.unwrap_or(Err(LockError::NotFound))?;
        // Stored before the mutex is let go: a waiter handed the lock reads
        // the result under it.
        let now = Instant::now();
        let slot = flights.slots.entry(key.clone()).or_insert_with(Slot::new);
        if slot.kept(now).is_some_and(|s| s.result.seq > publish.fence) {
            return Ok(());
        }
        let result = FlightResult {
            seq: publish.fence,
            value: publish.value.clone(),
        };
        slot.stored = Some(Stored {
            result: result.clone(),
            fresh_until: after(now, publish.result_ttl),
            keep_until: after(now, publish.keep.max(publish.result_ttl)),
        });
        slot.tx.send_replace(Some(result));
        // Nobody waits for it and it answers nobody new (zero result TTL):
        // not kept at all.
        slot.prune(now);
        Ok(())
    }
}

/// `now + d`, with `d` clamped to [`MAX_TTL`] as the Redis and PostgreSQL
/// backends clamp it: `Duration::MAX` ("forever") must not overflow.
fn after(now: Instant, d: std::time::Duration) -> Instant {
    // A year after now is always representable; the fallback is unreachable.
    now.checked_add(d.min(MAX_TTL)).unwrap_or(now)
}
