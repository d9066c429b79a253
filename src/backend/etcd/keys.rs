//! The key layout and the values stored under it (see the module docs'
//! table). Every key of one lock starts with `<prefix><n>:<E>/`, `E` =
//! [`LockKey::encoded`] and `n` its byte length: two locks' key ranges
//! never overlap, whatever their keys contain.

use std::time::{Duration, SystemTime};

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, SortOrder, SortTarget, TxnOp};

use crate::key::LockKey;
use crate::metadata::LockMetadata;
use crate::spec::LockKind;
use crate::time::unix_ms;

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

/// What a holder key stores: `"<acquired ms> <expires ms> <ttl ms>"`, then
/// ` <kind>` for a shared hold or a permit (`shared`, `permits=N`: an
/// exclusive hold's value is unchanged, so are its keys and its cost), then
/// `\n` and the metadata's JSON when there is some. Times are the wall
/// clock of the process that wrote it (etcd has no clock to read); every
/// write of a holder key stores a new value, which a pending expiry
/// compares to know the lock is still the one it was armed for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct HolderValue {
    pub(super) acquired_ms: u64,
    pub(super) expires_ms: u64,
    pub(super) ttl_ms: u64,
    pub(super) kind: LockKind,
    pub(super) metadata: Option<LockMetadata>,
}

impl HolderValue {
    /// Acquired at `now` for `ttl`.
    pub(super) fn new(
        now: SystemTime,
        ttl: Duration,
        kind: LockKind,
        metadata: Option<&LockMetadata>,
    ) -> Self {
        let now_ms = unix_ms(now);
        let ttl_ms = ceil_ms(ttl);
        HolderValue {
            acquired_ms: now_ms,
            expires_ms: now_ms.saturating_add(ttl_ms),
            ttl_ms,
            kind,
            metadata: metadata.cloned(),
        }
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = format!("{} {} {}", self.acquired_ms, self.expires_ms, self.ttl_ms);
        push_kind(&mut out, self.kind);
        if let Some(m) = &self.metadata {
            out.push('\n');
            out.push_str(m.as_json());
        }
        out.into_bytes()
    }

    pub(super) fn decode(bytes: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(bytes).ok()?;
        let (head, metadata) = match text.split_once('\n') {
            Some((head, json)) => (head, Some(LockMetadata::from_json(json).ok()?)),
            None => (text, None),
        };
        let mut fields = head.split(' ');
        let mut number = || fields.next()?.parse::<u64>().ok();
        let (acquired_ms, expires_ms, ttl_ms) = (number()?, number()?, number()?);
        let kind = parse_kind(fields.next())?;
        if fields.next().is_some() {
            return None;
        }
        Some(HolderValue {
            acquired_ms,
            expires_ms,
            ttl_ms,
            kind,
            metadata,
        })
    }

    pub(super) fn acquired_at(&self) -> SystemTime {
        from_ms(self.acquired_ms)
    }

    pub(super) fn expires_at(&self) -> SystemTime {
        from_ms(self.expires_ms)
    }

    /// Time left by this process's clock.
    pub(super) fn remaining(&self) -> Duration {
        Duration::from_millis(self.expires_ms.saturating_sub(unix_ms(SystemTime::now())))
    }
}

/// What a waiter key stores: `"<ttl ms> <attempt> <deadline ms> <owner>"`,
/// then ` <kind>` when not exclusive (owner tokens have no spaces), then
/// `\n` and the metadata's JSON when there is some: everything a
/// release needs to hand the lock to it. Past its deadline (its max wait,
/// by its process's clock) an entry is skipped: its waiter has given up,
/// or its process is gone, or it was written by a call whose reply never
/// came and landed after the waiter left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct WaiterValue {
    pub(super) ttl_ms: u64,
    pub(super) attempt: u64,
    pub(super) deadline_ms: u64,
    pub(super) owner: String,
    pub(super) kind: LockKind,
    pub(super) metadata: Option<LockMetadata>,
}

impl WaiterValue {
    /// Whether its max wait is over, by this process's clock.
    pub(super) fn is_past(&self) -> bool {
        self.deadline_ms <= unix_ms(SystemTime::now())
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = format!(
            "{} {} {} {}",
            self.ttl_ms, self.attempt, self.deadline_ms, self.owner
        );
        push_kind(&mut out, self.kind);
        if let Some(m) = &self.metadata {
            out.push('\n');
            out.push_str(m.as_json());
        }
        out.into_bytes()
    }

    pub(super) fn decode(bytes: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(bytes).ok()?;
        let (head, metadata) = match text.split_once('\n') {
            Some((head, json)) => (head, Some(LockMetadata::from_json(json).ok()?)),
            None => (text, None),
        };
        let mut fields = head.splitn(5, ' ');
        let ttl_ms = fields.next()?.parse().ok()?;
        let attempt = fields.next()?.parse().ok()?;
        let deadline_ms = fields.next()?.parse().ok()?;
        let owner = fields.next()?.to_owned();
        let kind = parse_kind(fields.next())?;
        Some(WaiterValue {
            ttl_ms,
            attempt,
            deadline_ms,
            owner,
            kind,
            metadata,
        })
    }
}

/// A waiter as read from etcd.
#[derive(Clone, Debug)]
pub(super) struct Waiter {
    pub(super) key: Vec<u8>,
    pub(super) mod_revision: i64,
    pub(super) lease: i64,
    pub(super) value: WaiterValue,
}

impl Waiter {
    pub(super) fn from_kv(kv: &KeyValue) -> Option<Self> {
        Some(Waiter {
            key: kv.key().to_vec(),
            mod_revision: kv.mod_revision(),
            lease: kv.lease(),
            value: WaiterValue::decode(kv.value())?,
        })
    }
}

/// A holder as read from etcd.
#[derive(Clone, Debug)]
pub(super) struct HeldKey {
    pub(super) key: Vec<u8>,
    /// The kind, as its key says.
    pub(super) kind: LockKind,
    pub(super) owner: String,
    pub(super) attempt: u64,
    /// The fence: the revision that created the key.
    pub(super) fence: u64,
    pub(super) value: HolderValue,
    pub(super) raw_value: Vec<u8>,
    /// Written again since it was made (an extension, a refresh, a claim):
    /// some call has it.
    pub(super) rewritten: bool,
}

impl HeldKey {
    pub(super) fn from_kv(keys: &LockKeys, kv: &KeyValue) -> Option<Self> {
        let (kind, owner, attempt) = keys.parse_hold(kv.key())?;
        Some(HeldKey {
            key: kv.key().to_vec(),
            kind,
            owner: owner.to_owned(),
            attempt,
            fence: u64::try_from(kv.create_revision()).ok()?,
            value: HolderValue::decode(kv.value())?,
            raw_value: kv.value().to_vec(),
            rewritten: kv.mod_revision() != kv.create_revision(),
        })
    }
}

/// ` <kind>` after a value's fields, for a kind other than exclusive.
fn push_kind(out: &mut String, kind: LockKind) {
    if kind != LockKind::Exclusive {
        out.push(' ');
        out.push_str(&kind.to_string());
    }
}

/// The optional kind field: exclusive when absent; `None` when malformed.
fn parse_kind(field: Option<&str>) -> Option<LockKind> {
    match field {
        None => Some(LockKind::Exclusive),
        // Written by push_kind only: "exclusive" is never stored.
        Some(text) => text.parse().ok().filter(|k| *k != LockKind::Exclusive),
    }
}

/// Whole milliseconds, rounded up.
pub(super) fn ceil_ms(d: Duration) -> u64 {
    let ms = d.as_millis();
    let ms = if d.subsec_nanos().is_multiple_of(1_000_000) {
        ms
    } else {
        ms + 1
    };
    u64::try_from(ms).unwrap_or(u64::MAX)
}

pub(super) fn from_ms(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    #[test]
    fn values_round_trip() {
        let meta = LockMetadata::new(json!({"by": "cron\nx"})).unwrap();
        let now = SystemTime::now();
        let exclusive = LockKind::Exclusive;
        let v = HolderValue::new(now, Duration::from_micros(1500), exclusive, Some(&meta));
        assert_eq!(v.ttl_ms, 2);
        assert_eq!(HolderValue::decode(&v.encode()), Some(v));
        let w = WaiterValue {
            ttl_ms: 30_000,
            attempt: 9,
            deadline_ms: 1_795_000_000_000,
            owner: "o-1".into(),
            kind: exclusive,
            metadata: Some(meta),
        };
        assert_eq!(WaiterValue::decode(&w.encode()), Some(w));
        assert_eq!(HolderValue::decode(b"1 2"), None);
    }

    #[test]
    fn kinds_are_stored_and_exclusive_values_are_unchanged() {
        // An exclusive hold stores what it stored before kinds existed.
        let v = HolderValue::new(
            from_ms(1_000),
            Duration::from_secs(2),
            LockKind::Exclusive,
            None,
        );
        assert_eq!(v.encode(), b"1000 3000 2000");
        for kind in [LockKind::Shared, LockKind::Permits(3)] {
            let v = HolderValue::new(from_ms(1_000), Duration::from_secs(2), kind, None);
            assert_eq!(HolderValue::decode(&v.encode()).map(|v| v.kind), Some(kind));
            let w = WaiterValue {
                ttl_ms: 1,
                attempt: 2,
                deadline_ms: 3,
                owner: "o".into(),
                kind,
                metadata: None,
            };
            let back = WaiterValue::decode(&w.encode()).unwrap();
            assert_eq!((back.owner.as_str(), back.kind), ("o", kind));
        }
        assert_eq!(
            WaiterValue::decode(b"1 2 3 o").map(|w| w.kind),
            Some(LockKind::Exclusive)
        );
        // Malformed kinds are refused, not read as exclusive.
        assert_eq!(HolderValue::decode(b"1 2 3 permits=0"), None);
        assert_eq!(HolderValue::decode(b"1 2 3 exclusive"), None);
        assert_eq!(WaiterValue::decode(b"1 2 3 o bogus"), None);
    }
}
