//! [`LockMetadata`]: a small JSON object stored with a lock (who took it and
//! why), returned by every lookup.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Number, Value};

use crate::error::LockError;

/// The largest metadata accepted: 4 KiB of compact JSON.
///
/// Metadata travels with every status lookup and is stored beside the lock
/// in the backend; it is meant for a few fields (`"by"`, `"reason"`,
/// `"job_id"`), not for payloads.
pub const MAX_METADATA_BYTES: usize = 4096;

/// The deepest nesting accepted: the metadata object is level 1, an object
/// or array in it level 2, and so on.
///
/// Far more than a few fields need, and far below what every backend reads
/// back: serde_json stops at 128 levels, so deeper metadata stored in Redis
/// or PostgreSQL would come back as none (200 levels fit in 4 KiB).
pub const MAX_METADATA_DEPTH: usize = 32;

/// The longest JSON text read back as metadata. A backend may write the
/// [`MAX_METADATA_BYTES`] it was given out longer: PostgreSQL's `jsonb`
/// writes numbers without exponent (`1e308` as 309 digits), about 50 times
/// the size for an array of such numbers.
const MAX_STORED_TEXT: usize = MAX_METADATA_BYTES * 64;

/// A small JSON object stored with a lock: who took it and why.
///
/// Set with [`LockSpec::metadata`](crate::LockSpec::metadata); returned by
/// [`LockStatus::metadata`](crate::LockStatus), [`HeldLock::metadata`](crate::HeldLock::metadata),
/// a [`LockToken`](crate::LockToken) and its restore, and the admin API (when
/// its [`show_metadata`](crate::admin::Admin::show_metadata) is on).
///
/// Always a JSON object, at most [`MAX_METADATA_BYTES`] bytes of compact
/// JSON, nested at most [`MAX_METADATA_DEPTH`] levels, without a NUL
/// character (`\u0000`, which PostgreSQL's `jsonb` cannot hold) in any
/// string or key; anything else is [`LockError::InvalidMetadata`], on every
/// backend alike. Held as its compact JSON text (what backends store),
/// shared: cloning is a reference count. A lock without metadata costs
/// nothing extra anywhere.
///
/// Every backend gives back exactly what was stored. For that, the text is
/// made in the one form they all keep: keys in order, and the few numbers
/// PostgreSQL's `jsonb` (which holds them as `numeric`) would give back
/// otherwise written as it gives them: `-0.0` as `0.0`, a whole float from
/// 10<sup>16</sup> up that fits a 64-bit integer as that integer (`1e16` as
/// `10000000000000000`). Every number keeps its value.
///
/// ```
/// use serde_json::json;
/// use tower_lock::LockMetadata;
///
/// let meta = LockMetadata::new(json!({"by": "nightly-cron", "reason": "monthly report"})).unwrap();
/// assert_eq!(meta.as_json(), r#"{"by":"nightly-cron","reason":"monthly report"}"#);
/// assert_eq!(meta.to_value()["by"], "nightly-cron");
/// assert!(LockMetadata::new(json!(["not", "an", "object"])).is_err());
/// ```
///
/// Its `Debug` shows only the size: metadata may carry user data, and lock
/// handles are logged.
#[derive(Clone, PartialEq, Eq)]
pub struct LockMetadata(Arc<str>);

impl LockMetadata {
    /// Metadata from a JSON value, which must be an object within the
    /// limits (see [`LockMetadata`]).
    pub fn new(value: impl Into<Value>) -> Result<Self, LockError> {
        match value.into() {
            Value::Object(mut map) => {
                if check_object(&map, 1)? {
                    rewrite_object(&mut map);
                }
                Self::written(&map)
            }
            _ => Err(LockError::InvalidMetadata(
                "lock metadata must be a JSON object",
            )),
        }
    }

    /// Metadata from a JSON object.
    pub fn from_map(map: &Map<String, Value>) -> Result<Self, LockError> {
        // Checked first: the copy (and the writing) of a map nested without
        // limit would recurse without limit.
        if check_object(map, 1)? {
            let mut map = map.clone();
            rewrite_object(&mut map);
            return Self::written(&map);
        }
        Self::written(map)
    }

    /// Metadata from JSON text (as a backend stored it): parsed, checked as
    /// [`LockMetadata::new`] checks a value, and kept in compact form.
    pub fn from_json(text: &str) -> Result<Self, LockError> {
        if text.len() > MAX_STORED_TEXT {
            return Err(too_large());
        }
        let value: Value = serde_json::from_str(text)
            .map_err(|_| LockError::InvalidMetadata("lock metadata is not valid JSON"))?;
        Self::new(value)
    }

    /// A checked object, written compactly and held if within the size.
    fn written(map: &Map<String, Value>) -> Result<Self, LockError> {
        // Writing a `Map` of `Value`s cannot fail.
        let text = serde_json::to_string(map).unwrap_or_default();
        if text.len() > MAX_METADATA_BYTES {
            return Err(too_large());
        }
        Ok(LockMetadata(Arc::from(text)))
    }

    /// The compact JSON text, as stored.
    pub fn as_json(&self) -> &str {
        &self.0
    }

    /// The object as a JSON value.
    pub fn to_value(&self) -> Value {
        // Checked to be a JSON object when made.
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }

    /// The size of the compact JSON text, in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it is the empty object `{}`.
    pub fn is_empty(&self) -> bool {
        &*self.0 == "{}"
    }
}

fn too_large() -> LockError {
    LockError::InvalidMetadata("lock metadata is larger than 4096 bytes of compact JSON")
}

/// Check an object at nesting level `depth`: within [`MAX_METADATA_DEPTH`],
/// no NUL anywhere. `Ok(true)` when [`rewrite_object`] has work to do: keys
/// out of order (serde_json's `preserve_order`) or a number a backend would
/// give back otherwise (see [`as_jsonb_keeps`]). Recurses at most
/// `MAX_METADATA_DEPTH + 1` deep, however deep the value.
fn check_object(map: &Map<String, Value>, depth: usize) -> Result<bool, LockError> {
    within_depth(depth)?;
    let mut rewrite = !map.keys().is_sorted();
    for (key, value) in map {
        without_nul(key)?;
        rewrite |= check(value, depth + 1)?;
    }
    Ok(rewrite)
}

/// [`check_object`] for any value at nesting level `depth`.
fn check(value: &Value, depth: usize) -> Result<bool, LockError> {
    match value {
        Value::Null | Value::Bool(_) => Ok(false),
        Value::Number(n) => Ok(as_jsonb_keeps(n).is_some()),
        Value::String(s) => without_nul(s).map(|()| false),
        Value::Array(items) => {
            within_depth(depth)?;
            let mut rewrite = false;
            for item in items {
                rewrite |= check(item, depth + 1)?;
            }
            Ok(rewrite)
        }
        Value::Object(map) => check_object(map, depth),
    }
}

fn within_depth(depth: usize) -> Result<(), LockError> {
    if depth > MAX_METADATA_DEPTH {
        return Err(LockError::InvalidMetadata(
            "lock metadata is nested deeper than 32 levels",
        ));
    }
    Ok(())
}

fn without_nul(s: &str) -> Result<(), LockError> {
    if s.contains('\0') {
        return Err(LockError::InvalidMetadata(
            "lock metadata has a NUL character (\\u0000) in a string or key",
        ));
    }
    Ok(())
}

/// Put a checked object in the form every backend keeps: keys in order,
/// numbers as `jsonb` keeps them.
fn rewrite_object(map: &mut Map<String, Value>) {
    map.sort_keys();
    map.values_mut().for_each(rewrite);
}

fn rewrite(value: &mut Value) {
    match value {
        Value::Number(n) => {
            if let Some(kept) = as_jsonb_keeps(n) {
                *n = kept;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(rewrite),
        Value::Object(map) => rewrite_object(map),
        Value::Null | Value::Bool(_) | Value::String(_) => {}
    }
}

/// The number PostgreSQL gives back for `n`, if not `n` itself. `jsonb`
/// holds numbers as `numeric` and writes them without exponent: `-0.0`
/// comes back `0.0` (no negative zero), and a whole float from 1e16 up
/// (which serde_json writes `1e16`) as its digits, read back as an integer
/// when one fits. Any other float comes back as itself: serde_json reads
/// its digits, written either way, to the same `f64` (its
/// `float_roundtrip`, on in Cargo.toml).
fn as_jsonb_keeps(n: &Number) -> Option<Number> {
    if !n.is_f64() {
        return None;
    }
    let f = n.as_f64()?;
    if f == 0.0 && f.is_sign_negative() {
        return Number::from_f64(0.0);
    }
    if f.fract() != 0.0 || f.abs() < 1e16 {
        return None;
    }
    // Whole, so exact as an integer within these bounds (2^64 and -2^63).
    if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
        Some(Number::from(f as u64))
    } else if (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
        Some(Number::from(f as i64))
    } else {
        None
    }
}

impl fmt::Debug for LockMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockMetadata")
            .field("bytes", &self.0.len())
            .finish()
    }
}

impl Serialize for LockMetadata {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for LockMetadata {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        LockMetadata::new(value).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_only_within_the_cap() {
        assert!(LockMetadata::new(json!({})).unwrap().is_empty());
        assert!(LockMetadata::new(json!("x")).is_err());
        assert!(LockMetadata::new(json!(null)).is_err());
        // {"k":"…"} is 8 bytes around the string.
        let fits = "a".repeat(MAX_METADATA_BYTES - 8);
        assert_eq!(
            LockMetadata::new(json!({ "k": fits })).unwrap().len(),
            MAX_METADATA_BYTES
        );
        let over = "a".repeat(MAX_METADATA_BYTES - 7);
        assert_eq!(
            LockMetadata::new(json!({ "k": over })).unwrap_err().code(),
            "LOCK_INVALID_METADATA"
        );
    }

    #[test]
    fn round_trips_through_text_and_serde() {
        let m = LockMetadata::from_json(r#"{ "by" : "me", "n": [1, 2] }"#).unwrap();
        assert_eq!(m.as_json(), r#"{"by":"me","n":[1,2]}"#);
        let again: LockMetadata =
            serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(again, m);
        assert!(LockMetadata::from_json("[1]").is_err());
        assert!(LockMetadata::from_json("{").is_err());
        assert!(!format!("{m:?}").contains("me"), "Debug hides the content");
    }

    /// `{"n":{"n":…}}`, `depth` objects.
    fn nested(depth: usize) -> Map<String, Value> {
        let mut map = Map::new();
        for _ in 1..depth {
            map = Map::from_iter([("n".to_owned(), Value::Object(map))]);
        }
        map
    }

    #[test]
    fn nesting_is_limited_however_deep_the_value() {
        let limit = nested(MAX_METADATA_DEPTH);
        assert!(LockMetadata::from_map(&limit).is_ok());
        assert!(LockMetadata::new(limit).is_ok());
        for depth in [MAX_METADATA_DEPTH + 1, 200, 1_000] {
            let deep = nested(depth);
            let e = LockMetadata::from_map(&deep).unwrap_err();
            assert_eq!(e.code(), "LOCK_INVALID_METADATA", "{depth}");
            assert!(e.to_string().contains("deeper"), "{e}");
            assert!(LockMetadata::new(deep).is_err());
        }
        // Arrays count as levels too.
        let mut array = json!(1);
        for _ in 1..MAX_METADATA_DEPTH {
            array = json!([array]);
        }
        assert!(LockMetadata::new(json!({ "a": array.clone() })).is_ok());
        assert!(LockMetadata::new(json!({ "a": [array] })).is_err());
    }

    #[test]
    fn nul_is_refused_in_strings_and_keys() {
        for bad in [
            json!({ "a": "\u{0}" }),
            json!({ "\u{0}": 1 }),
            json!({ "a": [{ "b": "x\u{0}" }] }),
        ] {
            let e = LockMetadata::new(bad.clone()).unwrap_err();
            assert!(e.to_string().contains("NUL"), "{bad}: {e}");
        }
        assert!(LockMetadata::from_json(r#"{"a":"\u0000"}"#).is_err());
        // Other control characters are kept (escaped).
        let m = LockMetadata::new(json!({ "a": "\u{1}\n" })).unwrap();
        assert_eq!(m.as_json(), r#"{"a":"\u0001\n"}"#);
    }

    #[test]
    fn numbers_are_written_as_postgres_gives_them_back() {
        let m = LockMetadata::new(json!({ "n": [
            -0.0, 1e16, -1e16, 18_446_744_073_709_549_568.0, 1.8446744073709552e19,
            -9.223372036854776e18, -9.223372036854778e18, 9_999_999_999_999_998.0, 1.5, 1e-7,
        ] }))
        .unwrap();
        // 2^64 and below -2^63: no integer fits, jsonb's digits read back as
        // the same float.
        assert_eq!(
            m.as_json(),
            "{\"n\":[0.0,10000000000000000,-10000000000000000,18446744073709549568,\
             1.8446744073709552e+19,-9223372036854775808,-9.223372036854778e+18,\
             9999999999999998.0,1.5,1e-7]}"
        );
    }

    proptest::proptest! {
        #[test]
        fn every_float_keeps_its_value(bits: u64) {
            let f = f64::from_bits(bits);
            proptest::prop_assume!(f.is_finite());
            let m = LockMetadata::new(json!({ "f": f })).unwrap();
            // Read back as a backend reads it: from the text.
            let back = LockMetadata::from_json(m.as_json()).unwrap();
            proptest::prop_assert_eq!(&back, &m);
            proptest::prop_assert_eq!(back.to_value()["f"].as_f64(), Some(f));
        }
    }
}
