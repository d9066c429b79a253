//! Where a waiter stands in a lock's queue, what it watches, and how it
//! reads what its watch delivers (see `wait.rs`).

use std::time::Duration;

use etcd_client::KeyValue;

use super::keys::LockKeys;
use super::ops::Queued;

/// Where a waiter stands, as last read.
pub(super) struct Place {
    pub(super) entry: Vec<u8>,
    /// Its create revision.
    pub(super) revision: i64,
    /// The entry just before it; `None`: it is the oldest.
    pub(super) before: Option<Vec<u8>>,
    /// Watch from the revision after this one.
    pub(super) read_at: i64,
}

impl Place {
    /// Told that the entry is the oldest as read at revision `at`: whether
    /// that is news (an older read said it had a predecessor).
    pub(super) fn heads(&mut self, at: i64) -> bool {
        if self.before.is_none() || at <= self.read_at {
            return false;
        }
        self.before = None;
        self.read_at = at;
        true
    }
}

impl From<Queued> for Place {
    fn from(q: Queued) -> Self {
        Place {
            entry: q.entry,
            revision: q.revision,
            before: q.before,
            read_at: q.revision,
        }
    }
}

/// What a waiter watches: the entry just before its own, or (the oldest)
/// the holders' range.
#[derive(Clone, PartialEq, Eq)]
pub(super) enum Target {
    Before(Vec<u8>),
    Holders(Vec<u8>, Vec<u8>),
}

impl Target {
    pub(super) fn of(place: &Place, keys: &LockKeys) -> Self {
        match &place.before {
            Some(before) => Target::Before(before.clone()),
            None => {
                let (start, stop) = keys.holders();
                Target::Holders(start, stop)
            }
        }
    }

    /// The key and range end to watch.
    pub(super) fn into_parts(self) -> (Vec<u8>, Option<Vec<u8>>) {
        match self {
            Target::Before(key) => (key, None),
            Target::Holders(start, stop) => (start, Some(stop)),
        }
    }
}

/// The put of our holder key among `events`, if it is news to a waiter at
/// `place`: a hand-off to its entry creates the key (a put that rewrites
/// it, an extension or a refresh of a hold of this request's other call,
/// is no grant to this entry: taken as one, it left the entry queued, to be
/// granted again later for no call), and comes after its last read (which
/// would have seen it). One at or before that read is stale: a watch kept across
/// a re-join can still deliver the hand-off to the entry we had before,
/// since lost (the lock was force-released or ran out while this process
/// stood still). Taken as a grant, it answered with a lease already over
/// and left the new entry queued, to be granted to nobody (a hold of the
/// owner's that nobody knew of, until its TTL).
pub(super) fn handed_over<'e>(
    events: &'e [(bool, KeyValue)],
    mine: &[u8],
    place: &Place,
) -> Option<&'e KeyValue> {
    events
        .iter()
        .find(|(put, kv)| {
            *put && kv.key() == mine
                && kv.create_revision() == kv.mod_revision()
                && kv.mod_revision() > place.read_at
        })
        .map(|(_, kv)| kv)
}

/// `d` scaled by a random factor in [0.5, 1).
pub(super) fn jitter(d: Duration) -> Duration {
    let fraction = 0.5 + (crate::spec::new_attempt_id() >> 11) as f64 / (1u64 << 53) as f64 / 2.0;
    d.mul_f64(fraction)
}
