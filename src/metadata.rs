//! [`LockMetadata`]: a small JSON object stored with a lock (who took it and
//! why), returned by every lookup.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::error::LockError;

/// The largest metadata accepted: 4 KiB of compact JSON.
///
/// Metadata travels with every status lookup and is stored beside the lock
/// in the backend; it is meant for a few fields (`"by"`, `"reason"`,
/// `"job_id"`), not for payloads.
pub const MAX_METADATA_BYTES: usize = 4096;

/// A small JSON object stored with a lock: who took it and why.
///
/// Set with [`LockSpec::metadata`](crate::LockSpec::metadata); returned by
/// [`LockStatus::metadata`](crate::LockStatus), [`HeldLock::metadata`](crate::HeldLock::metadata),
/// a [`LockToken`](crate::LockToken) and its restore, and the admin API (when
/// its [`show_metadata`](crate::admin::Admin::show_metadata) is on).
///
/// Always a JSON object, at most [`MAX_METADATA_BYTES`] bytes of compact
/// JSON; anything else is [`LockError::InvalidMetadata`]. Held as its
/// compact JSON text (what backends store), shared: cloning is a reference
/// count. A lock without metadata costs nothing extra anywhere.
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
    /// Metadata from a JSON value, which must be an object of at most
    /// [`MAX_METADATA_BYTES`] bytes once written compactly.
    pub fn new(value: impl Into<Value>) -> Result<Self, LockError> {
        match value.into() {
            Value::Object(map) => Self::from_map(&map),
            _ => Err(LockError::InvalidMetadata(
                "lock metadata must be a JSON object",
            )),
        }
    }

    /// Metadata from a JSON object.
    pub fn from_map(map: &Map<String, Value>) -> Result<Self, LockError> {
        // Writing a `Map` of `Value`s cannot fail.
        let text = serde_json::to_string(map).unwrap_or_default();
        Self::checked(text)
    }

    /// Metadata from JSON text (as a backend stored it): parsed, checked to
    /// be an object within the size limit, and kept in compact form.
    pub fn from_json(text: &str) -> Result<Self, LockError> {
        if text.len() > MAX_METADATA_BYTES * 4 {
            return Err(too_large());
        }
        let value: Value = serde_json::from_str(text)
            .map_err(|_| LockError::InvalidMetadata("lock metadata is not valid JSON"))?;
        Self::new(value)
    }

    fn checked(text: String) -> Result<Self, LockError> {
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
}
