//! Where a lock lives in Redis: its key and the keys beside it, all in one
//! cluster hash slot (see the storage layout in the module docs).
//!
//! Fences come from one counter per hash slot, `{prefix}{fence:<t>}`, where
//! `<t>` is the first string (shortest first, then in the order of
//! [`TAG_ALPHABET`]) whose `fence:<t>` hashes to the lock's slot. The
//! choice is a pure function of the slot, so every process and every
//! version picks the same counter for a slot: two counters for one slot
//! would hand out fences that go backwards.

use std::sync::LazyLock;

use super::RedisBackend;
use super::invoke::Invocation;
use crate::key::LockKey;

/// The longest stored key, in bytes: longer encodings are hashed.
pub(super) const MAX_STORED_KEY: usize = 1024;
/// The longest suffix appended to a lock's key (`:forced`).
pub(super) const LONGEST_SUFFIX: usize = ":forced".len();
/// Redis Cluster's number of hash slots.
pub(super) const SLOTS: u16 = 16_384;
/// The characters of a slot's counter tag, in enumeration order.
const TAG_ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
/// What every counter's hash tag starts with. No [`LockKey::encoded`] starts
/// so (they start `g:`, `r<n>:`, `f:` or `h:`), so no lock key is ever a counter.
const COUNTER_TAG: &str = "fence:";

/// Which keys of a lock a script is given.
#[derive(Clone, Copy)]
pub(super) enum Keys {
    /// lock, fence counter (the slot's), queue, waiters, the lock's own
    /// legacy fence counter (`{E}:fence`, migrated on first use), holds
    /// (`{E}:h`, shared holds and permits). The exclusive acquire and the
    /// release: their scripts find the holds' expiry index by name (see
    /// [`Keys::AllAndIndex`]).
    All,
    /// [`Keys::All`], then the holds' expiry index (`{E}:he`). Not sent with
    /// the exclusive acquire and release, whose fast paths never touch it:
    /// a key more costs every call server time (measured 0.3 µs, 5 % of a
    /// release); their slow paths name it as `{E}:h` + `e`, in the same
    /// hash slot.
    AllAndIndex,
    /// [`Keys::All`], then `{E}:forced` (force release's nonce).
    AllAndForced,
    /// The lock, then `{E}:m` (its metadata), then `{E}:h` (holds) and
    /// `{E}:he` (their expiries).
    LockAndMeta,
    /// [`Keys::All`], then `{E}:m` (its metadata).
    AllAndMeta,
    /// [`Keys::All`], then a flight's `{E}:r` (result), `{E}:rf` (fresh
    /// marker) and `{E}:fw` (watchers).
    Flight,
    /// A flight's result only.
    FlightResult,
}

impl RedisBackend {
    /// `{prefix}{<tag>}`: the lock's own key, whose `{<tag>}` every other key
    /// of the lock shares. The tag is [`LockKey::encoded`] with `\`, `{` and
    /// `}` escaped, so a brace in the key (route patterns like
    /// `/orders/{id}` have them) cannot shorten the cluster hash tag.
    pub(super) fn lock_key(&self, key: &LockKey) -> String {
        let room = MAX_STORED_KEY.saturating_sub(self.prefix.len() + 2 + LONGEST_SUFFIX);
        let mut encoded = key.encoded(room);
        if encoded.contains(['{', '}', '\\']) {
            let escaped = escape_braces(&encoded);
            // Too long once escaped: the hashed form (`h:<sha256>`) never
            // needs escaping and cannot equal an unhashed encoding.
            encoded = if escaped.len() <= room {
                escaped
            } else {
                key.encoded(0)
            };
        }
        let mut buf = String::with_capacity(self.prefix.len() + encoded.len() + 2 + LONGEST_SUFFIX);
        buf.push_str(&self.prefix);
        buf.push('{');
        buf.push_str(&encoded);
        buf.push('}');
        buf
    }

    /// Add the lock's keys to `inv` (see [`Keys`]); the lock's hash slot.
    pub(super) fn keys(&self, inv: &mut Invocation<'_>, key: &LockKey, which: Keys) -> u16 {
        let mut buf = self.lock_key(key);
        let slot = slot_of(&buf);
        if let Keys::FlightResult = which {
            buf.push_str(":r");
            inv.key(buf.as_str());
            return slot;
        }
        inv.key(buf.as_str());
        let base = buf.len();
        if let Keys::LockAndMeta = which {
            buf.push_str(":m");
            inv.key(buf.as_str());
            buf.truncate(base);
            buf.push_str(":h");
            inv.key(buf.as_str());
            buf.push('e');
            inv.key(buf.as_str());
            return slot;
        }
        inv.key(self.counter_key(slot).as_str());
        let suffixes: &[&str] = match which {
            Keys::AllAndIndex => &[":q", ":w", ":fence", ":h", ":he"],
            Keys::AllAndForced => &[":q", ":w", ":fence", ":h", ":he", ":forced"],
            Keys::AllAndMeta => &[":q", ":w", ":fence", ":h", ":he", ":m"],
            Keys::Flight => &[":q", ":w", ":fence", ":h", ":he", ":r", ":rf", ":fw"],
            _ => &[":q", ":w", ":fence", ":h"],
        };
        for suffix in suffixes {
            buf.truncate(base);
            buf.push_str(suffix);
            inv.key(buf.as_str());
        }
        slot
    }

    /// The hash slot of `key`'s lock.
    pub(super) fn slot(&self, key: &LockKey) -> u16 {
        slot_of(&self.lock_key(key))
    }

    /// `{prefix}{fence:<t>}`: the fence counter of hash slot `slot`.
    pub(super) fn counter_key(&self, slot: u16) -> String {
        let tag = slot_tag(slot);
        let mut buf = String::with_capacity(self.prefix.len() + COUNTER_TAG.len() + tag.len() + 2);
        buf.push_str(&self.prefix);
        buf.push('{');
        buf.push_str(COUNTER_TAG);
        buf.push_str(tag);
        buf.push('}');
        buf
    }

    /// The Redis key of the counter that `key`'s fencing tokens come from:
    /// one counter per cluster hash slot, shared by every lock of that slot
    /// (on a single server too), so the number of counters stays bounded
    /// (at most 16,384) however many distinct keys are locked.
    ///
    /// For operators and tests; locking never needs it.
    ///
    /// ```
    /// # #[cfg(feature = "redis")] {
    /// use tower_lock::backend::redis::RedisBackend;
    /// use tower_lock::LockKey;
    ///
    /// let backend = RedisBackend::from_url("redis://127.0.0.1:6379").unwrap();
    /// let counter = backend.fence_counter_key(&LockKey::global("order-42").unwrap());
    /// assert!(counter.starts_with("lock:{fence:"));
    /// # }
    /// ```
    pub fn fence_counter_key(&self, key: &LockKey) -> String {
        self.counter_key(slot_of(&self.lock_key(key)))
    }
}

/// The cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag (the
/// text between the first `{` and the next `}`, when not empty), else of
/// the whole key, modulo 16,384.
pub(super) fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = match bytes.iter().position(|&b| b == b'{') {
        Some(open) => match bytes[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    crc16(hashed) % SLOTS
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), Redis
/// Cluster's key hash.
fn crc16(bytes: &[u8]) -> u16 {
    static TABLE: LazyLock<[u16; 256]> = LazyLock::new(|| {
        let mut table = [0u16; 256];
        for (i, entry) in table.iter_mut().enumerate() {
            let mut crc = (i as u16) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
            *entry = crc;
        }
        table
    });
    let table = &*TABLE;
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ table[usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// The counter tag `<t>` of every slot (see the module docs).
static SLOT_TAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut tags: Vec<Option<String>> = vec![None; usize::from(SLOTS)];
    let mut missing = usize::from(SLOTS);
    let mut buf = String::from(COUNTER_TAG);
    // Four characters give 15 million candidates: every slot is found long
    // before (in practice with at most three).
    'lengths: for len in 1..=4u32 {
        let n = TAG_ALPHABET.len().pow(len);
        for mut i in 0..n {
            buf.truncate(COUNTER_TAG.len());
            let mut chars = [0u8; 4];
            for c in chars[..len as usize].iter_mut().rev() {
                *c = TAG_ALPHABET[i % TAG_ALPHABET.len()];
                i /= TAG_ALPHABET.len();
            }
            buf.extend(chars[..len as usize].iter().map(|&c| char::from(c)));
            let slot = usize::from(crc16(buf.as_bytes()) % SLOTS);
            if tags[slot].is_none() {
                tags[slot] = Some(buf[COUNTER_TAG.len()..].to_owned());
                missing -= 1;
                if missing == 0 {
                    break 'lengths;
                }
            }
        }
    }
    tags.into_iter()
        .map(|t| t.expect("every slot has a tag of at most four characters"))
        .collect()
});

/// The counter tag of `slot`.
fn slot_tag(slot: u16) -> &'static str {
    &SLOT_TAGS[usize::from(slot % SLOTS)]
}

/// A hash tag's text for `slot` (`fence:<t>`, the counter's): put between
/// braces in a name, it puts that name in `slot`.
#[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
pub(super) fn slot_hash_tag(slot: u16) -> String {
    format!("{COUNTER_TAG}{}", slot_tag(slot))
}

impl RedisBackend {
    /// `{prefix}o:{<owner>}`: the owner index of `owner` (opt-in), in the
    /// owner's own hash tag (braces escaped as in lock keys).
    pub(super) fn owner_key(&self, owner: &str) -> String {
        let escaped = escape_braces(owner);
        let mut buf = String::with_capacity(self.prefix.len() + escaped.len() + 4);
        buf.push_str(&self.prefix);
        buf.push_str("o:{");
        buf.push_str(&escaped);
        buf.push('}');
        buf
    }
}

/// Injective escaping of `\`, `{` and `}` (as `\\`, `\(`, `\)`).
fn escape_braces(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '{' => out.push_str("\\("),
            '}' => out.push_str("\\)"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_brace_free_hash_tag_and_fit() {
        let backend = RedisBackend::from_url("redis://127.0.0.1:1").unwrap();
        let key = LockKey::route("/orders/{id}", "a}b").unwrap();
        let stored = backend.lock_key(&key);
        assert_eq!(stored, r"lock:{r12:/orders/\(id\):a\)b}");
        // The hash tag is everything between the first `{` and the next `}`.
        let tag = &stored[stored.find('{').unwrap() + 1..stored.find('}').unwrap()];
        assert_eq!(tag.len() + "lock:{}".len(), stored.len());

        let long = LockKey::route("/r/{x}", "}".repeat(512)).unwrap();
        let stored = backend.lock_key(&long);
        assert!(
            stored.starts_with("lock:{h:") && stored.len() < 100,
            "{stored}"
        );
        let longest = LockKey::global("k".repeat(512)).unwrap();
        assert!(backend.lock_key(&longest).len() + LONGEST_SUFFIX <= MAX_STORED_KEY);
    }

    #[test]
    fn slots_are_redis_clusters() {
        // Values from Redis' own `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(slot_of("foo{{bar}}zap"), slot_of("{bar"));
    }

    /// Every slot has a counter in that very slot, and the choice is pinned:
    /// changing it would make two versions draw one slot's fences from two
    /// counters.
    #[test]
    fn every_slot_has_a_counter_of_its_own_and_the_names_are_fixed() {
        let backend = RedisBackend::from_url("redis://127.0.0.1:1").unwrap();
        let mut names = std::collections::HashSet::new();
        for slot in 0..SLOTS {
            let counter = backend.counter_key(slot);
            assert_eq!(slot_of(&counter), slot, "{counter}");
            assert!(counter.len() <= "lock:{fence:xyz}".len(), "{counter}");
            assert!(names.insert(counter));
        }
        let pinned: Vec<_> = [0, 1, 12182, 16383]
            .into_iter()
            .map(|s| backend.counter_key(s))
            .collect();
        assert_eq!(pinned, PINNED_COUNTERS);
        let key = LockKey::route("/orders/{id}", "a}b").unwrap();
        assert_eq!(
            slot_of(&backend.fence_counter_key(&key)),
            slot_of(&backend.lock_key(&key))
        );
    }

    const PINNED_COUNTERS: [&str; 4] = [
        "lock:{fence:APl}",
        "lock:{fence:B1f}",
        "lock:{fence:4YY}",
        "lock:{fence:2VO}",
    ];

    #[test]
    fn escaping_is_injective() {
        let inputs = ["a{b", "a\\(b", "a\\{b", "a}", "a\\)", "\\", "{}"];
        let escaped: Vec<_> = inputs.iter().map(|s| escape_braces(s)).collect();
        for (i, a) in escaped.iter().enumerate() {
            assert!(!a.contains(['{', '}']));
            for b in &escaped[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
