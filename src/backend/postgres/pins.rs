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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

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
pub(super) struct Pins {
    map: Mutex<HashMap<u64, Pin>>,
    /// `map.len()`, read without the lock: no pin is the common case.
    len: AtomicUsize,
    /// A clock that ticks when a pin is made.
    clock: AtomicU64,
}

impl Pins {
    fn map(&self) -> MutexGuard<'_, HashMap<u64, Pin>> {
        // Every critical section leaves the map whole.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pin of `caller`, if it has one.
    pub(super) fn get(&self, caller: u64) -> Option<Pin> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.map().get(&caller).copied()
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
        let made = self.clock.fetch_add(1, Ordering::AcqRel) + 1;
        map.insert(
            caller,
            Pin {
                slot,
                generation,
                made,
            },
        );
        self.len.store(map.len(), Ordering::Release);
    }

    /// A call sent at `sent` on connection `generation` of `slot` was
    /// answered: so was everything sent there before it, and the pins made
    /// before it there (or on a connection of the slot it replaced) go.
    pub(super) fn answered(&self, slot: usize, generation: u64, sent: u64) {
        if self.len.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut map = self.map();
        map.retain(|_, p| {
            p.slot != slot
                || p.generation > generation
                || (p.generation == generation && p.made > sent)
        });
        self.len.store(map.len(), Ordering::Release);
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
}
