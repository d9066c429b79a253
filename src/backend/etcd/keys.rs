//! The key layout (see the module docs' table; what the keys store is in
//! `values.rs`). Every key of one lock starts with `<prefix><n>:<E>/`, `E` =
//! [`LockKey::encoded`] and `n` its byte length: two locks' key ranges
//! never overlap, whatever their keys contain.

use etcd_client::{Compare, CompareOp, GetOptions, SortOrder, SortTarget, TxnOp};

use crate::key::LockKey;
use crate::spec::LockKind;

/// The longest `E` stored: longer encodings are hashed (etcd takes long
/// keys, but every key of a lock repeats it).
const MAX_STORED_KEY: usize = 512;

/// The keys of one lock.
#[derive(Clone)]
pub(super) struct LockKeys {
    base: Vec<u8>,
    /// Where `<n>:<E>` starts in `base`.
    prefix_len: usize,
}

/// The byte after `/`: the end of a `…/` prefix range.
const AFTER_SLASH: u8 = b'/' + 1;

impl LockKeys {
    pub(super) fn new(prefix: &str, key: &LockKey) -> Self {
        let e = key.encoded(MAX_STORED_KEY);
        let mut base = Vec::with_capacity(prefix.len() + e.len() + 8);
        base.extend_from_slice(prefix.as_bytes());
        base.extend_from_slice(format!("{}:", e.len()).as_bytes());
        base.extend_from_slice(e.as_bytes());
        base.push(b'/');
        LockKeys {
            base,
            prefix_len: prefix.len(),
        }
    }

    pub(super) fn with(&self, tail: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.base.len() + tail.len());
        k.extend_from_slice(&self.base);
        k.extend_from_slice(tail);
        k
    }

    /// `[…/h/, …/h0)`: the holder keys (one exclusive, or the holds of a
    /// shared or permits group; see `kinds.rs`).
    pub(super) fn holders(&self) -> (Vec<u8>, Vec<u8>) {
        (self.with(b"h/"), self.with(&[b'h', AFTER_SLASH]))
    }

    /// The holder key of one acquisition of `kind`: `…/h/<owner> <attempt>`
    /// for an exclusive one, with the kind's tag before the owner for
    /// another (`…/h/ s <owner> <attempt>`, `…/h/ p<n> <owner> <attempt>`).
    pub(super) fn holder(&self, kind: LockKind, owner: &str, attempt: u64) -> Vec<u8> {
        let tag = super::kinds::tag(kind);
        self.with(format!("h/{tag}{owner} {attempt}").as_bytes())
    }

    /// The range of `owner`'s holder keys: `[…/h/<owner> , …/h/<owner>!)`
    /// (owner tokens have no spaces, and `!` follows the space).
    pub(super) fn owner_holders(&self, owner: &str) -> (Vec<u8>, Vec<u8>) {
        (
            self.with(format!("h/{owner} ").as_bytes()),
            self.with(format!("h/{owner}!").as_bytes()),
        )
    }

    /// The range of `owner`'s holds of `kind` (see [`Self::holder`]).
    pub(super) fn owner_holds(&self, kind: LockKind, owner: &str) -> (Vec<u8>, Vec<u8>) {
        let tag = super::kinds::tag(kind);
        (
            self.with(format!("h/{tag}{owner} ").as_bytes()),
            self.with(format!("h/{tag}{owner}!").as_bytes()),
        )
    }

    /// `[…/q/, …/q0)`: the waiters.
    pub(super) fn queue(&self) -> (Vec<u8>, Vec<u8>) {
        (self.with(b"q/"), self.with(&[b'q', AFTER_SLASH]))
    }

    /// `…/q/<id>`: one waiter.
    pub(super) fn waiter(&self, id: u64) -> Vec<u8> {
        self.with(format!("q/{id:016x}").as_bytes())
    }

    /// `…/r`: a single-flight's latest result.
    pub(super) fn result(&self) -> Vec<u8> {
        self.with(b"r")
    }

    /// `<prefix>o/<owner> <n>:<E>`: the owner index entry of `owner` for
    /// this lock (opt-in, see `EtcdBackend::index_owners`).
    pub(super) fn index(&self, owner: &str) -> Vec<u8> {
        let (prefix, lock) = self.base.split_at(self.prefix_len);
        let mut k = Vec::with_capacity(self.base.len() + owner.len() + 4);
        k.extend_from_slice(prefix);
        k.extend_from_slice(format!("o/{owner} ").as_bytes());
        k.extend_from_slice(&lock[..lock.len() - 1]);
        k
    }

    /// Owner and attempt of a holder key of this lock.
    pub(super) fn parse_holder<'k>(&self, key: &'k [u8]) -> Option<(&'k str, u64)> {
        self.parse_hold(key)
            .map(|(_, owner, attempt)| (owner, attempt))
    }

    /// Kind, owner and attempt of a holder key of this lock.
    pub(super) fn parse_hold<'k>(&self, key: &'k [u8]) -> Option<(LockKind, &'k str, u64)> {
        let tail = key
            .strip_prefix(self.base.as_slice())?
            .strip_prefix(b"h/")?;
        let (kind, rest) = super::kinds::untag(std::str::from_utf8(tail).ok()?)?;
        let (owner, attempt) = rest.rsplit_once(' ')?;
        Some((kind, owner, attempt.parse().ok()?))
    }

    // -- Conditions and reads used by several transactions. --

    /// Nobody holds the lock.
    pub(super) fn free(&self) -> Compare {
        let (start, end) = self.holders();
        // Over a range, every key must match; an empty range compares as a
        // missing key (create revision 0).
        Compare::create_revision(start, CompareOp::Equal, 0).with_range(end)
    }

    /// Nobody waits.
    pub(super) fn nobody_queued(&self) -> Compare {
        let (start, end) = self.queue();
        Compare::create_revision(start, CompareOp::Equal, 0).with_range(end)
    }

    /// `owner` holds the lock, under `fence` when given.
    pub(super) fn held_by(&self, owner: &str, fence: Option<u64>) -> Compare {
        let (start, end) = self.owner_holders(owner);
        let compare = Compare::create_revision;
        match fence.map(i64::try_from) {
            None => compare(start, CompareOp::Greater, 0).with_range(end),
            Some(Ok(f)) => compare(start, CompareOp::Equal, f).with_range(end),
            // A fence no revision can be: never held.
            Some(Err(_)) => compare(start, CompareOp::Less, 0).with_range(end),
        }
    }

    /// `owner` holds nothing of this lock.
    pub(super) fn owner_free(&self, owner: &str) -> Compare {
        let (start, end) = self.owner_holders(owner);
        Compare::create_revision(start, CompareOp::Equal, 0).with_range(end)
    }

    /// Read every holder, oldest grant first.
    pub(super) fn get_holders(&self) -> TxnOp {
        self.read_holders(GetOptions::new())
    }

    /// Read every holder, oldest grant first, with `options` besides.
    pub(super) fn read_holders(&self, options: GetOptions) -> TxnOp {
        let (start, end) = self.holders();
        let options = options.with_range(end);
        TxnOp::get(
            start,
            Some(options.with_sort(SortTarget::Create, SortOrder::Ascend)),
        )
    }

    /// Read the oldest waiter.
    pub(super) fn get_head(&self) -> TxnOp {
        let (start, end) = self.queue();
        TxnOp::get(
            start,
            Some(
                GetOptions::new()
                    .with_range(end)
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1),
            ),
        )
    }

    /// Count the waiters.
    pub(super) fn count_queue(&self) -> TxnOp {
        let (start, end) = self.queue();
        TxnOp::get(
            start,
            Some(GetOptions::new().with_range(end).with_count_only()),
        )
    }
}

/// The range of `owner`'s index entries under `prefix`.
pub(super) fn index_range(prefix: &str, owner: &str) -> (Vec<u8>, Vec<u8>) {
    (
        format!("{prefix}o/{owner} ").into_bytes(),
        format!("{prefix}o/{owner}!").into_bytes(),
    )
}

pub(super) use super::values::{HeldKey, HolderValue, Waiter, WaiterValue, ceil_ms};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_ranges_never_overlap() {
        let a = LockKeys::new("p/", &LockKey::global("a").unwrap());
        let b = LockKeys::new("p/", &LockKey::global("a/h/b").unwrap());
        let (start, end) = a.holders();
        let x = LockKind::Exclusive;
        let hb = b.holder(x, "o", 1);
        assert!(!(hb >= start && hb < end), "another lock's holder in range");
        let (start, end) = a.owner_holders("o");
        assert!(a.holder(x, "o", 7) >= start && a.holder(x, "o", 7) < end);
        assert!(a.holder(x, "o!", 7) >= end || a.holder(x, "o!", 7) < start);
        assert!(a.holder(x, "oo", 7) >= end);
        assert_eq!(a.parse_holder(&a.holder(x, "x/y", 42)), Some(("x/y", 42)));
    }
}
