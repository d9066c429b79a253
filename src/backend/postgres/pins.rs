//! Cleanup in order: which connection a caller's next call must go to.
//!
//! A call dropped before its reply came (its caller was cancelled or gave
//! up) may still run on the server: it is in its connection's pipeline.
//! What cleans up after it (the layer's release of what a cancelled acquire
//! may have taken, a dropped waiter's leave) must run after it; sent on
//! another connection it could run first, find nothing to clean up, and the
//! dropped call would then take the lock, or queue, for a caller that is
//! gone. PostgreSQL runs a connection's statements in the order they were
//! sent, so a dropped call *pins* its caller (key and owner) to its
//! connection: that caller's next calls go there, behind it. The pin goes
//! once a call sent on that connection after the pin was made has been
//! answered (then the dropped one was answered before it), or with the
//! connection. Calls of callers without a pin go to the least busy
//! connection, so a lone caller stays on one warm server process.
//!
//! A connection given up on because a call on it timed out is not used
//! again (a statement still running would hold up everything behind it),
//! but what was sent on it may still run: the server stops a statement at
//! its `statement_timeout`, and a commit waiting for the disk or a
//! synchronous standby not even then. So it *drains*: an empty query is
//! sent behind what it carries, and until that is answered (or the drain
//! gives up after the op timeout: a half-open connection answers nothing)
//! a caller pinned to it waits before its next call, which then has an op
//! timeout of its own. The drain's end is that bound too when its task is
//! gone without ending it (dropped with its runtime: the connection, driven
//! from another, may still carry the call, so the drain must not end
//! sooner).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, timeout_at};

/// A caller: the hash of a stored key and an owner token.
pub(super) fn caller(key: &str, owner: &str) -> u64 {
    // FNV-1a, with a byte no UTF-8 text holds between the two.
    let fnv = |h: u64, b: u8| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    let h = key.bytes().fold(0xcbf2_9ce4_8422_2325, fnv);
    owner.bytes().fold(fnv(h, 0xff), fnv)
}

/// Where a dropped call went out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pin {
    /// The slot (index) of its connection.
    pub(super) slot: usize,
    /// That connection's generation.
    pub(super) generation: u64,
    /// When the pin was made (see [`Pins::now`]).
    made: u64,
}

#[derive(Default)]
struct Map {
    pins: HashMap<u64, Pin>,
    /// Connections (slot, generation) given up on that still drain, each
    /// with the clock when its drain began and the time it gives up.
    draining: Vec<Drain>,
}

/// A connection given up on that drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Drain {
    slot: usize,
    generation: u64,
    /// The clock when it began.
    since: u64,
    /// When it gives up, ended or not.
    until: Instant,
}

impl Drain {
    /// Whether connection `generation` of `slot` still drains by it at `now`.
    fn covers(&self, slot: usize, generation: u64, now: Instant) -> bool {
        (self.slot, self.generation) == (slot, generation) && self.until > now
    }
}

impl Map {
    /// When connection `generation` of `slot` ends draining, if it does.
    fn draining(&self, slot: usize, generation: u64, now: Instant) -> Option<Instant> {
        self.draining
            .iter()
            .filter(|d| d.covers(slot, generation, now))
            .map(|d| d.until)
            .max()
    }
}

#[derive(Default)]
pub(super) struct Pins {
    map: Mutex<Map>,
    /// `map.pins.len()`, read without the lock: no pin is the common case.
    len: AtomicUsize,
    /// A clock that ticks when a pin is made.
    clock: AtomicU64,
    /// Woken when a connection has drained.
    drained: Notify,
}

impl Pins {
    fn map(&self) -> MutexGuard<'_, Map> {
        // Every critical section leaves the map whole.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pin of `caller`, if it has one.
    pub(super) fn get(&self, caller: u64) -> Option<Pin> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.map().pins.get(&caller).copied()
    }

    /// The pin of `caller` once its connection is not draining (the caller
    /// waits for a call given up on to finish before its next goes out),
    /// and whether it waited. `Err` when `end` came first.
    pub(super) async fn settled(
        &self,
        caller: u64,
        end: Instant,
    ) -> Result<(Option<Pin>, bool), ()> {
        let mut waited = false;
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            // Registered before the look, so that no drain is missed.
            drained.as_mut().enable();
            let gives_up = {
                let map = self.map();
                let pin = map.pins.get(&caller);
                match pin.and_then(|p| map.draining(p.slot, p.generation, Instant::now())) {
                    Some(until) => until,
                    None => return Ok((pin.copied(), waited)),
                }
            };
            waited = true;
            if end < gives_up {
                timeout_at(end, drained).await.map_err(|_| ())?;
            } else {
                // The drain gives up first (also when nothing ends it).
                let _ = timeout_at(gives_up, drained).await;
            }
        }
    }

    /// Connection `generation` of `slot` was given up on while a call on
    /// it was under way: it drains (see the module docs) for at most
    /// `bound`, and the call's `caller` (if any) is pinned to it, both at
    /// once. Returns when the drain began, for [`Pins::drained`].
    pub(super) fn draining(
        &self,
        caller: Option<u64>,
        slot: usize,
        generation: u64,
        bound: Duration,
    ) -> u64 {
        let now = Instant::now();
        let mut map = self.map();
        // Drains that gave up without being ended (their task gone).
        map.draining.retain(|d| d.until > now);
        let made = self.pin_in(&mut map, caller, slot, generation);
        map.draining.push(Drain {
            slot,
            generation,
            since: made,
            until: now + bound,
        });
        made
    }

    /// Pin `caller` (if any) to connection `generation` of `slot` in `map`;
    /// the clock's tick for it.
    fn pin_in(&self, map: &mut Map, caller: Option<u64>, slot: usize, generation: u64) -> u64 {
        let made = self.clock.fetch_add(1, Ordering::AcqRel) + 1;
        if let Some(caller) = caller {
            let pin = Pin {
                slot,
                generation,
                made,
            };
            map.pins.insert(caller, pin);
            self.len.store(map.pins.len(), Ordering::Release);
        }
        made
    }

    /// The drain begun at `since` ended: the connection answered what was
    /// sent behind the calls given up on (or the drain gave up). Pins made
    /// on it by then go; one made later (a call sent after the drain's
    /// query) waits for another drain, or goes with the connection.
    pub(super) fn drained(&self, slot: usize, generation: u64, since: u64) {
        let mut map = self.map();
        if let Some(i) = map
            .draining
            .iter()
            .position(|d| (d.slot, d.generation, d.since) == (slot, generation, since))
        {
            map.draining.swap_remove(i);
        }
        map.pins
            .retain(|_, p| (p.slot, p.generation) != (slot, generation) || p.made > since);
        self.len.store(map.pins.len(), Ordering::Release);
        drop(map);
        self.drained.notify_waiters();
    }

    /// The time a call takes just before it is sent: a call sent at or
    /// after a pin's time was sent after the call that made the pin.
    pub(super) fn now(&self) -> u64 {
        self.clock.load(Ordering::Acquire)
    }

    /// A call of `caller`, sent on connection `generation` of `slot`, was
    /// dropped before its reply came.
    pub(super) fn pin(&self, caller: u64, slot: usize, generation: u64) {
        let mut map = self.map();
        self.pin_in(&mut map, Some(caller), slot, generation);
    }

    /// A call sent at `sent` on connection `generation` of `slot` was
    /// answered: so was everything sent there before it, and the pins made
    /// before it there (or on a connection of the slot it replaced, unless
    /// that one still drains) go.
    pub(super) fn answered(&self, slot: usize, generation: u64, sent: u64) {
        if self.len.load(Ordering::Acquire) == 0 {
            return;
        }
        let now = Instant::now();
        let mut map = self.map();
        let Map { pins, draining } = &mut *map;
        pins.retain(|_, p| {
            p.slot != slot
                || p.generation > generation
                || (p.generation == generation && p.made > sent)
                || draining.iter().any(|d| d.covers(p.slot, p.generation, now))
        });
        self.len.store(pins.len(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pin_lasts_until_a_later_call_on_its_connection_is_answered() {
        let pins = Pins::default();
        let (a, b) = (caller("g:k", "o1"), caller("g:k", "o2"));
        assert_ne!(a, b);
        assert_ne!(caller("g:ko", "1"), caller("g:k", "o1"));
        let before = pins.now();
        pins.pin(a, 1, 7);
        let pin = pins.get(a).unwrap();
        assert_eq!((pin.slot, pin.generation), (1, 7));
        assert_eq!(pins.get(b), None);
        // Sent before the pin, or on another slot: proves nothing.
        pins.answered(1, 7, before);
        pins.answered(0, 7, pins.now());
        assert_eq!(pins.get(a), Some(pin));
        pins.answered(1, 7, pins.now());
        assert_eq!(pins.get(a), None);
        // A connection of the slot since replaced: its pins go too, but
        // not the other way round.
        pins.pin(a, 1, 7);
        pins.answered(1, 6, pins.now());
        assert!(pins.get(a).is_some());
        pins.answered(1, 8, 0);
        assert_eq!(pins.get(a), None);
    }

    /// A drain whose task is gone (dropped with its runtime) never ends
    /// it: it gives up at its bound, never sooner (the connection may still
    /// carry the call) and never later (the caller's calls would wait for
    /// good).
    #[tokio::test(start_paused = true)]
    async fn a_drain_nobody_ends_gives_up_at_its_bound() {
        use std::time::Duration;
        let pins = std::sync::Arc::new(Pins::default());
        let a = caller("g:k", "o1");
        pins.draining(Some(a), 1, 7, Duration::from_secs(1));
        let waiting = tokio::spawn({
            let pins = pins.clone();
            async move {
                pins.settled(a, Instant::now() + Duration::from_secs(5))
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(999)).await;
        assert!(!waiting.is_finished(), "ended before its bound");
        let (pin, waited) = waiting.await.unwrap().unwrap();
        assert!(waited);
        assert_eq!(pin.map(|p| (p.slot, p.generation)), Some((1, 7)));
        // Given up, it is not draining any more for the next call either.
        let end = Instant::now() + Duration::from_millis(1);
        assert!(!pins.settled(a, end).await.unwrap().1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_pinned_to_a_draining_connection_waits_for_its_drain() {
        let pins = std::sync::Arc::new(Pins::default());
        let (a, b, c) = (
            caller("g:k", "o1"),
            caller("g:k", "o2"),
            caller("g:k", "o3"),
        );
        pins.pin(b, 0, 7);
        let since = pins.draining(Some(a), 1, 7, std::time::Duration::from_secs(60));
        // A call answered on the slot's next connection says nothing of
        // what the draining one still carries.
        pins.answered(1, 8, pins.now());
        assert!(pins.get(a).is_some());
        // A caller pinned elsewhere goes on; one pinned to it waits, up to
        // its own end.
        let end = Instant::now() + std::time::Duration::from_secs(1);
        assert_eq!(pins.settled(b, end).await.unwrap().0.unwrap().slot, 0);
        assert!(pins.settled(a, end).await.is_err());
        let waiting = tokio::spawn({
            let pins = pins.clone();
            async move {
                pins.settled(a, Instant::now() + std::time::Duration::from_secs(1))
                    .await
            }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        // A call of another caller given up on later on the same connection
        // (sent after the first drain's query): its pin outlives the first
        // drain and waits for its own.
        let later = pins.draining(Some(c), 1, 7, std::time::Duration::from_secs(60));
        pins.drained(1, 7, since);
        assert_eq!(waiting.await.unwrap(), Ok((None, true)));
        assert_eq!(pins.get(a), None);
        assert!(pins.get(b).is_some());
        assert!(pins.settled(c, end).await.is_err(), "still draining");
        pins.drained(1, 7, later);
        assert_eq!(pins.get(c), None);
    }
}
