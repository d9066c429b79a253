//! Validated lock keys and their storage encoding.

use smol_str::SmolStr;
use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};
use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfc_quick};

use crate::error::LockError;

/// The longest key a user may give, in bytes of UTF-8 after NFC normalisation.
pub const MAX_KEY_BYTES: usize = 512;

/// Where a key lives: its own route's namespace or the shared global one.
///
/// One scope, one name in Rust: [`Scope::Route`]. On the wire (the
/// `lock-scope` response header, the admin API, a client-directed lock's
/// header, see [`ClientLocks`](crate::ClientLocks)) route scope is spelt
/// `function`, Forrst's name for it; a client may also send `route`.
/// Global scope is `global` everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Scope {
    /// The key is namespaced by the matched route pattern (`/orders/{id}`):
    /// the same key on two routes names two different locks. The default.
    #[default]
    Route,
    /// The bare key, shared by every route (and job) that uses it.
    Global,
}

/// A validated, NFC-normalised key together with its namespace.
///
/// Two different (scope, key) pairs never share a stored key: the storage
/// encoding tags the scope and length-prefixes the route pattern, so a key
/// containing `:` cannot reach another route's namespace.
///
/// ```
/// use tower_lock::LockKey;
///
/// let key = LockKey::global("account:7").unwrap();
/// assert_eq!(key.key(), "account:7");
/// assert!(LockKey::global("").is_err());
/// ```
#[derive(Clone)]
pub struct LockKey {
    // Inline up to 23 bytes: most keys cost no allocation.
    key: SmolStr,
    route: Option<SmolStr>,
    // SipHash of (key, route) with a per-process random seed, computed once:
    // a lock operation hashes its key without going over the bytes again.
    hash: u64,
}

/// The bit of [`LockKey::hash_code`] that marks a single-flight key: one
/// no hash table uses (the memory table takes its slot from the low bits,
/// its tag from the top 7 and its shard from bits 32..38).
const FLIGHT_BIT: u64 = 1 << 45;

impl PartialEq for LockKey {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.key == other.key && self.route == other.route
    }
}

impl Eq for LockKey {}

impl Hash for LockKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// By key, then route: the same order in every process (the layer takes a
/// request's locks in this order).
impl Ord for LockKey {
    fn cmp(&self, other: &Self) -> Ordering {
        (&self.key, &self.route, self.is_flight()).cmp(&(
            &other.key,
            &other.route,
            other.is_flight(),
        ))
    }
}

impl PartialOrd for LockKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl LockKey {
    /// A key in the global namespace.
    pub fn global(key: impl AsRef<str>) -> Result<Self, LockError> {
        Ok(Self::new(normalise(key.as_ref())?, None))
    }

    /// A key in the namespace of the route pattern `route` (e.g. `/orders/{id}`).
    /// The pattern holds no control characters, as a key
    /// ([`LockError::InvalidKey`]); any length (a long encoded form is
    /// hashed, see [`LockKey::encoded`]).
    pub fn route(route: impl AsRef<str>, key: impl AsRef<str>) -> Result<Self, LockError> {
        let route = route.as_ref();
        if has_control(route) {
            return Err(LockError::InvalidKey(
                "the route contains control characters",
            ));
        }
        Self::in_route(&SmolStr::new(route), key.as_ref())
    }

    /// [`LockKey::route`] with the route pattern already shared, as the
    /// layer keeps it for a request.
    pub(crate) fn in_route(route: &SmolStr, key: &str) -> Result<Self, LockError> {
        Ok(Self::new(normalise(key)?, Some(route.clone())))
    }

    /// The key of a single-flight (see [`SingleFlight`](crate::flight::SingleFlight)):
    /// the flight's lock and its stored result live under it, in a namespace
    /// of their own (`f:` in [`LockKey::encoded`]), so no lock of either
    /// scope can name them.
    ///
    /// Kept as it is, not normalised as lock keys are: two canonically
    /// equivalent but different strings (a path's `caf%C3%A9` and
    /// `cafe%CC%81`) may name different resources, and sharing one's
    /// response with the other would answer a request with what it did not
    /// ask for. (Merging them costs a lock only some waiting.)
    pub(crate) fn flight(key: &str) -> Result<Self, LockError> {
        let mut k = Self::new(checked(key)?, None);
        // Marked in its hash, so it is never equal to the global lock of the
        // same name (and the key stays as small as before).
        k.hash |= FLIGHT_BIT;
        Ok(k)
    }

    /// The flight `key` of the HTTP layer for a request of `method`: a GET's
    /// is [`LockKey::flight`]`(key)` itself; any other method's is `key`,
    /// a unit separator (U+001F, which no validated key contains, so no
    /// user's key can name it) and the method: a flight of its own, as a
    /// HEAD's response must never answer a GET.
    pub(crate) fn flight_of_method(key: &str, method: &http::Method) -> Result<Self, LockError> {
        if *method == http::Method::GET {
            return Self::flight(key);
        }
        let key = checked(key)?;
        let mut k = Self::new(
            SmolStr::new(format!("{key}\u{1f}{}", method.as_str())),
            None,
        );
        k.hash |= FLIGHT_BIT;
        Ok(k)
    }

    /// The flight, beside this one, of the requests that refuse its stored
    /// result (they ask for an answer made after they came): this key, two
    /// unit separators (a method, after one, is never empty, so no method's
    /// flight is named so) and `fresh`. Its answer is kept for nobody: a
    /// burst of such requests runs the handler once, and the stored result
    /// of this flight stays.
    pub(crate) fn refreshing(&self) -> Self {
        let mut k = Self::new(SmolStr::new(format!("{}\u{1f}\u{1f}fresh", self.key)), None);
        k.hash |= FLIGHT_BIT;
        k
    }

    /// Whether this is a single-flight key (see [`LockKey::encoded`]).
    pub fn is_flight(&self) -> bool {
        self.hash & FLIGHT_BIT != 0
    }

    fn new(key: SmolStr, route: Option<SmolStr>) -> Self {
        static SEED: OnceLock<RandomState> = OnceLock::new();
        let mut hasher = SEED.get_or_init(RandomState::new).build_hasher();
        // 0xff never occurs in UTF-8: it separates the key from the route.
        hasher.write(key.as_bytes());
        hasher.write_u8(0xff);
        if let Some(route) = &route {
            hasher.write(route.as_bytes());
        }
        let hash = hasher.finish() & !FLIGHT_BIT;
        LockKey { key, route, hash }
    }

    /// A hash of the key, equal for equal keys, computed when it was made.
    pub(crate) fn hash_code(&self) -> u64 {
        self.hash
    }

    /// The user's key, NFC-normalised.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The route pattern of a route-scoped key, `None` for a global one.
    pub fn route_pattern(&self) -> Option<&str> {
        self.route.as_deref()
    }

    /// The scope of this key.
    pub fn scope(&self) -> Scope {
        if self.route.is_some() {
            Scope::Route
        } else {
            Scope::Global
        }
    }

    /// The injective encoding of (scope, key), without any backend prefix.
    ///
    /// `g:<key>` for a global key, `r<n>:<route>:<key>` for a route-scoped one
    /// (`n` = byte length of the route pattern), `f:<key>` for the key of a
    /// single-flight (its lock and stored result). When the encoding is longer
    /// than `max_len` bytes it is replaced by `h:<sha256 hex>` of itself, so
    /// backends with key-length limits never see an over-long key. The
    /// hashed form is 66 bytes, so `max_len` must be at least that.
    pub fn encoded(&self, max_len: usize) -> String {
        let full = match &self.route {
            None if self.is_flight() => format!("f:{}", self.key),
            None => format!("g:{}", self.key),
            Some(route) => format!("r{}:{}:{}", route.len(), route, self.key),
        };
        if full.len() <= max_len {
            full
        } else {
            format!("h:{}", hex(&Sha256::digest(full.as_bytes())))
        }
    }

    /// The key whose unhashed [`encoded`](LockKey::encoded) form is
    /// `encoded`; `None` for a hashed form or anything else.
    pub fn from_encoded(encoded: &str) -> Option<LockKey> {
        if let Some(key) = encoded.strip_prefix("g:") {
            return LockKey::global(key).ok();
        }
        if let Some(key) = encoded.strip_prefix("f:") {
            return LockKey::flight(key).ok();
        }
        let rest = encoded.strip_prefix('r')?;
        let (len, rest) = rest.split_once(':')?;
        let len: usize = len.parse().ok()?;
        let route = rest.get(..len)?;
        let key = rest.get(len..)?.strip_prefix(':')?;
        // Stored by a lock already taken: its route as the layer had it.
        Self::in_route(&SmolStr::new(route), key).ok()
    }

    /// `prefix` followed by [`LockKey::encoded`].
    pub fn storage_key(&self, prefix: &str, max_len: usize) -> String {
        let mut out = String::with_capacity(prefix.len() + self.key.len() + 8);
        out.push_str(prefix);
        out.push_str(&self.encoded(max_len.saturating_sub(prefix.len())));
        out
    }

    /// A short, stable digest of the key for logs, so raw keys (which may
    /// carry user data) never reach them. Computed only when formatted.
    pub fn digest(&self) -> KeyDigest<'_> {
        KeyDigest(self)
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockKey")
            .field("scope", &self.scope())
            .field("digest", &format_args!("{}", self.digest()))
            .finish()
    }
}

/// Lazily computed short hash of a [`LockKey`] (see [`LockKey::digest`]).
pub struct KeyDigest<'a>(&'a LockKey);

impl fmt::Display for KeyDigest<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digest = Sha256::digest(self.0.encoded(usize::MAX).as_bytes());
        f.write_str(&hex(&digest[..6]))
    }
}

impl fmt::Debug for KeyDigest<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 0xf) as usize] as char);
    }
    s
}

/// `key` as a [`LockKey`] keeps it (NFC), or why it cannot be one. Whatever
/// checks a key before it is locked must check this form: the lock is taken
/// on it.
pub(crate) fn normalise(key: &str) -> Result<SmolStr, LockError> {
    // ASCII is NFC already, and its control characters are single bytes.
    let key = if key.is_ascii() {
        Cow::Borrowed(key)
    } else {
        nfc(key)
    };
    checked(&key)
}

/// `key` as it is, or why it cannot be a key (empty, too long, a control
/// character): a flight's key, which is never normalised
/// ([`LockKey::flight`]); a lock's after [`normalise`].
fn checked(key: &str) -> Result<SmolStr, LockError> {
    if key.is_empty() {
        return Err(LockError::InvalidKey("the key is empty"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(LockError::InvalidKey(
            "the key is longer than 512 bytes of UTF-8",
        ));
    }
    if has_control(key) {
        return Err(LockError::InvalidKey("the key contains control characters"));
    }
    Ok(SmolStr::new(key))
}

/// Whether `text` holds a control character (ASCII's are single bytes: a
/// byte scan where the text is ASCII).
fn has_control(text: &str) -> bool {
    if text.is_ascii() {
        text.bytes().any(|b| b.is_ascii_control())
    } else {
        text.chars().any(char::is_control)
    }
}

/// `key` in NFC, the form a [`LockKey`] keeps: what a user's key is
/// compared with a held one in (borrowed when it is NFC already).
pub(crate) fn nfc(key: &str) -> Cow<'_, str> {
    if key.is_ascii() || is_nfc_quick(key.chars()) == IsNormalized::Yes {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(key.nfc().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_is_checked_as_a_key_is() {
        assert!(LockKey::route("/orders/{id}", "7").is_ok());
        for bad in ["/a\0b", "/a\nb", "/a\u{85}b"] {
            let e = LockKey::route(bad, "7").unwrap_err();
            assert_eq!(e.code(), "LOCK_INVALID_KEY", "{bad:?}");
        }
        // Any length: its encoded form is hashed when long.
        let long = "r".repeat(MAX_KEY_BYTES * 2);
        let key = LockKey::route(&long, "7").unwrap();
        assert!(key.encoded(usize::MAX).len() > MAX_KEY_BYTES * 2);
    }

    #[test]
    fn normalises_to_nfc() {
        let decomposed = LockKey::global("cafe\u{301}").unwrap();
        let composed = LockKey::global("caf\u{e9}").unwrap();
        assert_eq!(decomposed, composed);
        assert_eq!(decomposed.encoded(1024), composed.encoded(1024));
    }

    #[test]
    fn short_keys_are_stored_inline() {
        let short = LockKey::global("order:1234567890").unwrap();
        assert!(!short.key.is_heap_allocated());
        let long = LockKey::global("k".repeat(100)).unwrap();
        assert!(long.key.is_heap_allocated());
        assert_eq!(long.key(), "k".repeat(100));
        assert_eq!(long.clone(), long);
    }

    #[test]
    fn rejects_bad_keys() {
        assert!(matches!(LockKey::global(""), Err(LockError::InvalidKey(_))));
        assert!(matches!(
            LockKey::global("a".repeat(513)),
            Err(LockError::InvalidKey(_))
        ));
        assert!(LockKey::global("a".repeat(512)).is_ok());
        assert!(matches!(
            LockKey::global("a\nb"),
            Err(LockError::InvalidKey(_))
        ));
        // 171 three-byte characters = 513 bytes.
        assert!(LockKey::global("\u{20ac}".repeat(171)).is_err());
    }

    #[test]
    fn long_keys_are_hashed_and_fit() {
        let key = LockKey::route("/a/very/long/route/pattern", "k".repeat(512)).unwrap();
        let stored = key.storage_key("lock:", 128);
        assert!(stored.len() <= 128, "{stored}");
        assert!(stored.starts_with("lock:h:"));
        let other = LockKey::route("/a/very/long/route/pattern", "k".repeat(511)).unwrap();
        assert_ne!(stored, other.storage_key("lock:", 128));
    }

    #[test]
    fn encodings_decode_back() {
        for key in [
            LockKey::global("a:b").unwrap(),
            LockKey::route("/o/{id}", "x:1").unwrap(),
            LockKey::route("", "k").unwrap(),
            LockKey::flight("report").unwrap(),
        ] {
            assert_eq!(LockKey::from_encoded(&key.encoded(4096)), Some(key));
        }
        let long = LockKey::global("k".repeat(500)).unwrap();
        assert_eq!(LockKey::from_encoded(&long.encoded(100)), None);
        for bad in ["", "x:1", "r:a", "r9:/a:b", "r2:/ab"] {
            assert_eq!(LockKey::from_encoded(bad), None, "{bad}");
        }
    }

    #[test]
    fn flight_keys_are_a_namespace_of_their_own() {
        let flight = LockKey::flight("report").unwrap();
        let global = LockKey::global("report").unwrap();
        assert_ne!(flight, global);
        assert_ne!(flight.encoded(4096), global.encoded(4096));
        assert_eq!(flight.encoded(4096), "f:report");
        assert_eq!(flight, LockKey::flight("report").unwrap());
        assert!(flight.is_flight() && !global.is_flight());
        assert!(LockKey::flight("").is_err());
    }

    #[test]
    fn each_method_has_flights_of_its_own() {
        let get = LockKey::flight_of_method("page", &http::Method::GET).unwrap();
        let head = LockKey::flight_of_method("page", &http::Method::HEAD).unwrap();
        assert_eq!(get, LockKey::flight("page").unwrap());
        assert_ne!(get, head);
        assert_ne!(get.encoded(4096), head.encoded(4096));
        assert!(head.is_flight());
        // No key a user can give names another method's flight.
        assert!(LockKey::flight("page\u{1f}HEAD").is_err());
        assert!(LockKey::flight_of_method("", &http::Method::HEAD).is_err());
    }

    #[test]
    fn colons_do_not_cross_namespaces() {
        let a = LockKey::route("/a", "b:c").unwrap();
        let b = LockKey::route("/a:b", "c").unwrap();
        let g = LockKey::global("r2:/a:b:c").unwrap();
        assert_ne!(a.encoded(4096), b.encoded(4096));
        assert_ne!(a.encoded(4096), g.encoded(4096));
    }
}
