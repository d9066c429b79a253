//! Where a lock lives in Redis: its key and the keys beside it, all with
//! one cluster hash tag (see the storage layout in the module docs).

use deadpool_redis::redis::ScriptInvocation;

use super::RedisBackend;
use crate::key::LockKey;

/// The longest stored key, in bytes: longer encodings are hashed.
pub(super) const MAX_STORED_KEY: usize = 1024;
/// The longest suffix appended to a lock's key (`:forced`).
pub(super) const LONGEST_SUFFIX: usize = ":forced".len();
/// The suffixes of a lock's other keys: fence counter, queue, waiters.
pub(super) const ALL: &[&str] = &[":fence", ":q", ":w"];
/// The suffix of the key holding a lock's metadata.
pub(super) const META: &str = ":m";

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

    /// Add the lock's key to `inv`, then its keys with each of `suffixes`.
    pub(super) fn keys(&self, inv: &mut ScriptInvocation<'_>, key: &LockKey, suffixes: &[&str]) {
        let mut buf = self.lock_key(key);
        inv.key(buf.as_str());
        let base = buf.len();
        for suffix in suffixes {
            buf.truncate(base);
            buf.push_str(suffix);
            inv.key(buf.as_str());
        }
    }
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
