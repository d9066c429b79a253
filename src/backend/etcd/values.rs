//! What an etcd lock's keys store: a holder key's value, a waiter's entry,
//! and both as read back (`LockKeys` in `keys.rs` names the keys).

use std::time::{Duration, SystemTime};

use etcd_client::KeyValue;

use super::keys::LockKeys;
use crate::metadata::LockMetadata;
use crate::spec::LockKind;
use crate::time::unix_ms;

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
        let out = format!("{} {} {}", self.acquired_ms, self.expires_ms, self.ttl_ms);
        with_tail(out, self.kind, self.metadata.as_ref())
    }

    pub(super) fn decode(bytes: &[u8]) -> Option<Self> {
        let (head, metadata) = split_tail(bytes)?;
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
        let out = format!(
            "{} {} {} {}",
            self.ttl_ms, self.attempt, self.deadline_ms, self.owner
        );
        with_tail(out, self.kind, self.metadata.as_ref())
    }

    pub(super) fn decode(bytes: &[u8]) -> Option<Self> {
        let (head, metadata) = split_tail(bytes)?;
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
    /// Written again since it was made (an extension, a refresh): some call
    /// has it. (A claim makes a new key, under the claiming attempt.)
    pub(super) rewritten: bool,
    /// The lease it is on: a hand-off writes it on the lease of the queue
    /// entry it goes through (so of the process whose entry that was); a
    /// take, a refresh, an extension or a claim on the writer's own.
    pub(super) lease: i64,
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
            lease: kv.lease(),
        })
    }
}

/// A value's fields `out`, then ` <kind>` for a kind other than exclusive,
/// then `\n` and the metadata's JSON when there is some.
fn with_tail(mut out: String, kind: LockKind, metadata: Option<&LockMetadata>) -> Vec<u8> {
    if kind != LockKind::Exclusive {
        out.push(' ');
        out.push_str(&kind.to_string());
    }
    if let Some(m) = metadata {
        out.push('\n');
        out.push_str(m.as_json());
    }
    out.into_bytes()
}

/// A stored value's line of fields and its metadata (after `\n`, if any);
/// `None` when not UTF-8 or the metadata is malformed.
fn split_tail(bytes: &[u8]) -> Option<(&str, Option<LockMetadata>)> {
    let text = std::str::from_utf8(bytes).ok()?;
    Some(match text.split_once('\n') {
        Some((head, json)) => (head, Some(LockMetadata::from_json(json).ok()?)),
        None => (text, None),
    })
}

/// The optional kind field: exclusive when absent; `None` when malformed.
fn parse_kind(field: Option<&str>) -> Option<LockKind> {
    match field {
        None => Some(LockKind::Exclusive),
        // Written by with_tail only: "exclusive" is never stored.
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
