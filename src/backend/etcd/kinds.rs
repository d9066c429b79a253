//! Shared holds and permits (`LockKind`) on etcd.
//!
//! Every hold of a key is a holder key of its own, on its holder's lease,
//! with its own fence (the revision that created it), TTL and metadata. The
//! kind is in the key, so that the holds of each family are one contiguous
//! range a transaction can compare as a whole (etcd compares every key of a
//! range; an empty range compares as a missing key):
//!
//! | kind | holder key | range |
//! |---|---|---|
//! | exclusive | `h/<owner> <attempt>` | `[h/!, h0)` (owner tokens are visible ASCII: they start at `!`) |
//! | shared | `h/ s <owner> <attempt>` | `[h/ s , h/ s!)` |
//! | `Permits(n)` | `h/ p<n> <owner> <attempt>` | `[h/ p<n> , h/ p<n>!)` |
//!
//! The holds of a shared or permits group sort before an exclusive holder
//! (a space before any owner), all under `h/`: "nobody holds it" is still
//! the one range `[h/, h0)` empty, and an exclusive lock's keys, values and
//! transactions are those it had before kinds existed.
//!
//! - A **shared** newcomer is granted in one transaction: no exclusive
//!   holder, no permits, nobody queued (range-empty compares).
//! - A **permit** newcomer cannot compare a count: it reads the holds, and
//!   when fewer than `n` are held and nobody waits, it takes one in a
//!   transaction conditioned on no hold of its range having been written
//!   since that read (every key's mod revision at most the read's: a new
//!   hold fails it; a hold that went away only leaves more room), tried
//!   again on conflict.
//! - A request of another **family** than the holders' never queues: its
//!   queue entry is written in a nested transaction whose compare is "no
//!   hold of another family", and a refusal is [`LockError::KindMismatch`].
//! - A **hand-off** grants the head of the queue and then, one transaction
//!   each (so that each gets a greater fence), every following waiter that
//!   fits beside the holds, stopping at the first that does not. A waiter
//!   at the head that fits beside the holds (one left behind by two
//!   releases that crossed, or by a releaser that died between two grants)
//!   is granted by whoever sees it first, as an orphaned queue always was:
//!   the waiter itself, woken by its watch.
//!
//! [`LockError::KindMismatch`]: crate::LockError::KindMismatch

use std::time::Duration;

use etcd_client::{Compare, CompareOp};

use super::keys::{HeldKey, LockKeys, Waiter};
use crate::spec::LockKind;

/// The tag a hold's kind puts before its owner in its holder key: nothing
/// for an exclusive hold, ` s ` for a shared one, ` p<n> ` for a permit.
pub(super) fn tag(kind: LockKind) -> String {
    match kind {
        LockKind::Permits(n) => format!(" p{n} "),
        LockKind::Shared => " s ".to_owned(),
        _ => String::new(),
    }
}

/// The kind of a holder key's tail after `h/`, and the `<owner> <attempt>`
/// rest; `None` for a tag [`tag`] never writes.
pub(super) fn untag(tail: &str) -> Option<(LockKind, &str)> {
    let Some(tagged) = tail.strip_prefix(' ') else {
        return Some((LockKind::Exclusive, tail));
    };
    let (tag, rest) = tagged.split_once(' ')?;
    let kind = match tag {
        "s" => LockKind::Shared,
        _ => {
            let n: u32 = tag.strip_prefix('p')?.parse().ok()?;
            // Only the canonical spelling: one range per `n`.
            (tag[1..] == n.to_string()).then_some(())?;
            let kind = LockKind::Permits(n);
            kind.validate().ok()?;
            kind
        }
    };
    Some((kind, rest))
}

/// Nobody holds anything in `[start, end)`.
fn empty(start: Vec<u8>, end: Vec<u8>) -> Compare {
    Compare::create_revision(start, CompareOp::Equal, 0).with_range(end)
}

impl LockKeys {
    /// The range of `kind`'s own holds: exclusive, shared, or permits of
    /// this `n`.
    pub(super) fn kind_range(&self, kind: LockKind) -> (Vec<u8>, Vec<u8>) {
        match kind {
            LockKind::Permits(_) | LockKind::Shared => {
                let tag = tag(kind);
                let open = tag.trim_end();
                (
                    self.with(format!("h/{tag}").as_bytes()),
                    self.with(format!("h/{open}!").as_bytes()),
                )
            }
            _ => (self.with(b"h/!"), self.holders().1),
        }
    }

    /// No hold of another family than `kind`'s (see
    /// [`LockKind::same_family`]): the compares of a queue entry's nested
    /// transaction.
    pub(super) fn no_other_family(&self, kind: LockKind) -> Vec<Compare> {
        let (all, all_end) = self.holders();
        match kind {
            LockKind::Permits(_) => {
                let (start, end) = self.kind_range(kind);
                vec![empty(all, start), empty(end, all_end)]
            }
            _ => vec![empty(self.with(b"h/ p"), self.with(b"h/ q"))],
        }
    }

    /// When a newcomer of `kind` may take a hold at once, under holder key
    /// `holder`. `room_at`: for a permit, the revision of a read that saw
    /// fewer than `n` held and nobody queued (without one, only a free key
    /// is taken at once).
    pub(super) fn grant_when(
        &self,
        kind: LockKind,
        holder: &[u8],
        room_at: Option<i64>,
    ) -> Vec<Compare> {
        let mut when = match (kind, room_at) {
            (LockKind::Shared, _) => {
                let (start, end) = self.kind_range(LockKind::Exclusive);
                let mut when = self.no_other_family(kind);
                when.push(empty(start, end));
                // Not ours already: a retry of a shared hold (a lost reply,
                // or a twin call of this request handed it) meets the
                // conditions above too, and its put would rewrite the hold
                // under its old create revision (the fence) while reporting
                // the new revision as the fence; the attempt's refresh
                // answers it instead. (Exclusive: the key must be free; a
                // permit: no hold written since the read.)
                when.push(Compare::create_revision(holder, CompareOp::Equal, 0));
                when
            }
            (LockKind::Permits(_), Some(at)) => {
                let (start, end) = self.kind_range(kind);
                let mut when = self.no_other_family(kind);
                when.push(Compare::mod_revision(start, CompareOp::Less, at + 1).with_range(end));
                when
            }
            _ => vec![self.free()],
        };
        when.push(self.nobody_queued());
        when
    }

    /// No hold was made or written since revision `at` (a hold that went
    /// away since is not seen: it only leaves more room).
    pub(super) fn holds_unchanged_since(&self, at: i64) -> Compare {
        let (start, end) = self.holders();
        Compare::mod_revision(start, CompareOp::Less, at + 1).with_range(end)
    }
}

impl Waiter {
    /// The holder key a hand-off gives this waiter.
    pub(super) fn holder_key(&self, keys: &LockKeys) -> Vec<u8> {
        keys.holder(self.value.kind, &self.value.owner, self.value.attempt)
    }
}

/// How `holders` hold the key, `None` when nobody does: exclusive when any
/// hold is.
pub(super) fn held_as<'a>(holders: impl IntoIterator<Item = &'a HeldKey>) -> Option<LockKind> {
    let mut held = None;
    for h in holders {
        if h.kind == LockKind::Exclusive {
            return Some(LockKind::Exclusive);
        }
        held = Some(h.kind);
    }
    held
}

/// Whether a hold of `kind` fits beside `holders` now.
pub(super) fn fits<'a>(kind: LockKind, holders: impl IntoIterator<Item = &'a HeldKey>) -> bool {
    let holders: Vec<&HeldKey> = holders.into_iter().collect();
    match held_as(holders.iter().copied()) {
        None => true,
        Some(held) => kind.fits_beside(held, holders.len()),
    }
}

/// Whether a request of `kind` is of another family than some holder.
pub(super) fn mismatched(kind: LockKind, holders: &[HeldKey]) -> bool {
    holders.iter().any(|h| !kind.same_family(h.kind))
}

/// A busy answer's `retry_after`: the earliest expiry among the holds.
pub(super) fn earliest_end(holders: &[HeldKey]) -> Duration {
    holders
        .iter()
        .map(|h| h.value.remaining())
        .min()
        .unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::LockKey;

    #[test]
    fn each_family_is_one_range_and_keys_parse_back() {
        let keys = LockKeys::new("p/", &LockKey::global("k").unwrap());
        let kinds = [
            LockKind::Exclusive,
            LockKind::Shared,
            LockKind::Permits(2),
            LockKind::Permits(20),
        ];
        let (all, all_end) = keys.holders();
        for kind in kinds {
            for owner in ["!", "a", "~~", "p2", "s"] {
                let key = keys.holder(kind, owner, 7);
                assert_eq!(keys.parse_hold(&key), Some((kind, owner, 7)));
                assert!(key >= all && key < all_end);
                for other in kinds {
                    let (start, end) = keys.kind_range(other);
                    let inside = key >= start && key < end;
                    assert_eq!(inside, other == kind, "{kind} {owner} in {other}'s range");
                }
            }
        }
        for bad in ["h/ p02 o 1", "h/ p0 o 1", "h/ x o 1", "h/ p2o 1"] {
            assert_eq!(keys.parse_hold(&keys.with(bad.as_bytes())), None, "{bad}");
        }
    }
}
