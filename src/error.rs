//! [`LockError`] and its stable machine codes.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Everything that can go wrong while taking, keeping or giving back a lock.
///
/// Every variant has a stable machine code ([`LockError::code`]) that the
/// middleware puts in its JSON error bodies, and an HTTP status
/// ([`LockError::status`]) it answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockError {
    /// The lock is held by someone else and the spec allowed no waiting.
    ///
    /// `retry_after` is the holder's remaining TTL, when the backend knows it.
    AcquisitionFailed {
        /// How long until the current holder's lock expires.
        retry_after: Option<Duration>,
    },
    /// The lock stayed held for the whole max wait.
    Timeout {
        /// How long the caller waited.
        waited: Duration,
        /// How long until the current holder's lock expires.
        retry_after: Option<Duration>,
    },
    /// A lock taken for the request ran out before the handler could run:
    /// while the request waited for another of its locks, or right as it was
    /// handed over. The handler did not run; the request's locks are given
    /// back.
    Expired,
    /// No lock is held under that key (never taken, released, or expired).
    NotFound,
    /// The lock is held, but by another owner token.
    OwnershipMismatch,
    /// The request already released this lock ([`Locks::release`](crate::Locks::release)),
    /// or its locks were released with the response.
    AlreadyReleased,
    /// The key is empty, too long, or otherwise unusable.
    InvalidKey(&'static str),
    /// The TTL is zero, shorter than a millisecond, or absurdly long.
    InvalidTtl(&'static str),
    /// The owner token is empty, too long or not printable ASCII.
    InvalidOwner(&'static str),
    /// A lock kind that cannot be used: zero permits, more than
    /// [`MAX_PERMITS`](crate::MAX_PERMITS), or a `Lock-Mode` header that is
    /// not `exclusive`, `shared` or `permits=N`.
    InvalidKind(&'static str),
    /// The key is held under another family of [`LockKind`](crate::LockKind)
    /// (permits beside shared or exclusive holders, or another number of
    /// permits): refused at once, never queued.
    KindMismatch,
    /// The lock's metadata is not a JSON object, is larger than
    /// [`MAX_METADATA_BYTES`](crate::MAX_METADATA_BYTES), nested deeper than
    /// [`MAX_METADATA_DEPTH`](crate::MAX_METADATA_DEPTH), or has a NUL
    /// character in a string or key.
    InvalidMetadata(&'static str),
    /// A lock header of a client-directed lock ([`ClientLocks`](crate::ClientLocks))
    /// is missing or cannot be read.
    InvalidHeader(&'static str),
    /// A client-directed lock asks for more than the server allows: a TTL or
    /// wait over its limit, a key outside the allowed ones, global scope
    /// where it is not allowed.
    NotAllowed(&'static str),
    /// The backend could not be reached or answered with an error in time.
    ///
    /// The middleware never runs a handler unlocked because of this: it
    /// answers `503 Service Unavailable`. The [`BackendError`] says what
    /// failed, and its cause is this error's
    /// [`source`](std::error::Error::source).
    BackendUnavailable(BackendError),
    /// A backend was configured wrongly (a URL that does not parse, a schema
    /// name that is not an identifier): returned where it is built, never
    /// from a lock operation, and not retryable.
    InvalidConfig(String),
    /// The backend does not implement this operation, or cannot as
    /// configured (e.g. a third-party backend without single-flight, a
    /// lookup by owner on a Redis backend without its owner index).
    Unsupported(&'static str),
}

impl LockError {
    /// The stable machine code, e.g. `"LOCK_TIMEOUT"`.
    ///
    /// ```
    /// use tower_lock::LockError;
    /// assert_eq!(LockError::NotFound.code(), "LOCK_NOT_FOUND");
    /// ```
    pub fn code(&self) -> &'static str {
        match self {
            LockError::AcquisitionFailed { .. } => "LOCK_ACQUISITION_FAILED",
            LockError::Timeout { .. } => "LOCK_TIMEOUT",
            LockError::Expired => "LOCK_EXPIRED",
            LockError::NotFound => "LOCK_NOT_FOUND",
            LockError::OwnershipMismatch => "LOCK_OWNERSHIP_MISMATCH",
            LockError::AlreadyReleased => "LOCK_ALREADY_RELEASED",
            LockError::InvalidKey(_) => "LOCK_INVALID_KEY",
            LockError::InvalidTtl(_) => "LOCK_INVALID_TTL",
            LockError::InvalidOwner(_) => "LOCK_INVALID_OWNER",
            LockError::InvalidMetadata(_) => "LOCK_INVALID_METADATA",
            LockError::InvalidKind(_) => "LOCK_INVALID_KIND",
            LockError::KindMismatch => "LOCK_KIND_MISMATCH",
            LockError::InvalidHeader(_) => "LOCK_INVALID_HEADER",
            LockError::NotAllowed(_) => "LOCK_NOT_ALLOWED",
            LockError::BackendUnavailable(_) => "LOCK_BACKEND_UNAVAILABLE",
            LockError::InvalidConfig(_) => "LOCK_INVALID_CONFIG",
            LockError::Unsupported(_) => "LOCK_UNSUPPORTED",
        }
    }

    /// The HTTP status the middleware answers with for this error.
    ///
    /// `429` for a busy lock (or one that ran out while the request waited
    /// for another), `503` for an unreachable backend, `400` for a
    /// bad key/TTL/owner/metadata or lock header, `404`/`409`/`410` for
    /// release and extend errors, `501` for an operation the backend does
    /// not implement.
    pub fn status(&self) -> http::StatusCode {
        use http::StatusCode;
        match self {
            LockError::AcquisitionFailed { .. }
            | LockError::Timeout { .. }
            | LockError::Expired => StatusCode::TOO_MANY_REQUESTS,
            LockError::NotFound => StatusCode::NOT_FOUND,
            LockError::OwnershipMismatch | LockError::KindMismatch => StatusCode::CONFLICT,
            LockError::AlreadyReleased => StatusCode::GONE,
            LockError::InvalidKey(_)
            | LockError::InvalidTtl(_)
            | LockError::InvalidOwner(_)
            | LockError::InvalidMetadata(_)
            | LockError::InvalidKind(_)
            | LockError::InvalidHeader(_)
            | LockError::NotAllowed(_) => StatusCode::BAD_REQUEST,
            LockError::BackendUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            LockError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
            LockError::InvalidConfig(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The holder's remaining TTL for a busy lock, if known.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LockError::AcquisitionFailed { retry_after }
            | LockError::Timeout { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether trying again later can succeed (busy lock or backend down).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LockError::AcquisitionFailed { .. }
                | LockError::Timeout { .. }
                | LockError::Expired
                | LockError::BackendUnavailable(_)
        )
    }

    /// `Retry-After` in whole seconds: the holder's remaining TTL rounded up,
    /// at least 1 (1 when unknown).
    pub fn retry_after_secs(&self) -> u64 {
        retry_after_secs(self.retry_after().unwrap_or(Duration::from_secs(1)))
    }
}

/// Whole seconds, rounded up, never 0 (a `Retry-After: 0` invites a hot loop).
pub(crate) fn retry_after_secs(d: Duration) -> u64 {
    let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    secs.max(1)
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::AcquisitionFailed { .. } => f.write_str("the resource is locked"),
            LockError::Timeout { waited, .. } => write!(
                f,
                "the resource stayed locked for the whole wait of {} ms",
                waited.as_millis()
            ),
            LockError::Expired => f.write_str(
                "a lock of this request ran out before the handler could run; try again",
            ),
            LockError::NotFound => f.write_str("no lock is held under this key"),
            LockError::OwnershipMismatch => f.write_str("the lock is held by another owner"),
            LockError::AlreadyReleased => f.write_str("the lock was already released"),
            LockError::InvalidKey(why) => write!(f, "invalid lock key: {why}"),
            LockError::InvalidTtl(why) => write!(f, "invalid lock TTL: {why}"),
            LockError::InvalidOwner(why) => write!(f, "invalid owner token: {why}"),
            LockError::InvalidMetadata(why) => write!(f, "invalid lock metadata: {why}"),
            LockError::InvalidKind(why) => write!(f, "invalid lock kind: {why}"),
            LockError::KindMismatch => f.write_str(
                "the lock is held under another kind (permits beside shared or exclusive holds, or another number of permits)",
            ),
            LockError::InvalidHeader(why) => write!(f, "invalid lock header: {why}"),
            LockError::NotAllowed(why) => write!(f, "lock not allowed: {why}"),
            LockError::BackendUnavailable(why) => write!(f, "lock backend unavailable: {why}"),
            LockError::InvalidConfig(why) => write!(f, "invalid lock backend configuration: {why}"),
            LockError::Unsupported(what) => f.write_str(what),
        }
    }
}

impl Error for LockError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            LockError::BackendUnavailable(e) => e.cause(),
            _ => None,
        }
    }
}

/// What a backend says when it cannot answer ([`LockError::BackendUnavailable`]):
/// what failed, for operators (never shown to clients), and the error that
/// caused it, if any, as the [`LockError`]'s
/// [`source`](std::error::Error::source).
///
/// ```
/// use std::error::Error;
/// use tower_lock::LockError;
/// use tower_lock::backend::BackendError;
///
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
/// let err = LockError::BackendUnavailable(BackendError::new("redis acquire").with_source(io));
/// assert_eq!(err.to_string(), "lock backend unavailable: redis acquire");
/// assert_eq!(err.source().unwrap().to_string(), "refused");
/// ```
#[derive(Clone)]
pub struct BackendError {
    message: Arc<str>,
    cause: Option<Arc<dyn Error + Send + Sync>>,
}

impl BackendError {
    /// What failed, without a cause.
    pub fn new(message: impl Into<String>) -> Self {
        BackendError {
            message: Arc::from(message.into()),
            cause: None,
        }
    }

    /// The same, caused by `cause`.
    pub fn with_source(mut self, cause: impl Error + Send + Sync + 'static) -> Self {
        self.cause = Some(Arc::new(cause));
        self
    }

    /// What failed (without the cause).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The cause, if any.
    pub fn cause(&self) -> Option<&(dyn Error + 'static)> {
        self.cause.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

impl From<String> for BackendError {
    fn from(message: String) -> Self {
        BackendError::new(message)
    }
}

impl From<&str> for BackendError {
    fn from(message: &str) -> Self {
        BackendError::new(message)
    }
}

/// Two backend errors are equal when they say the same (their causes are
/// not compared: most error types cannot be).
impl PartialEq for BackendError {
    fn eq(&self, other: &Self) -> bool {
        self.message == other.message
    }
}

impl Eq for BackendError {}

impl fmt::Debug for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("BackendError");
        d.field("message", &self.message);
        if let Some(cause) = &self.cause {
            d.field("cause", cause);
        }
        d.finish()
    }
}

/// The message alone: the cause is the [`LockError`]'s `source`.
impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(30)), 30);
        assert_eq!(retry_after_secs(Duration::MAX), u64::MAX);
    }

    #[test]
    fn codes_are_stable() {
        let all = [
            LockError::AcquisitionFailed { retry_after: None },
            LockError::Timeout {
                waited: Duration::ZERO,
                retry_after: None,
            },
            LockError::Expired,
            LockError::NotFound,
            LockError::OwnershipMismatch,
            LockError::AlreadyReleased,
            LockError::InvalidKey("x"),
            LockError::InvalidTtl("x"),
            LockError::InvalidOwner("x"),
            LockError::InvalidMetadata("x"),
            LockError::InvalidKind("x"),
            LockError::KindMismatch,
            LockError::InvalidHeader("x"),
            LockError::NotAllowed("x"),
            LockError::Unsupported("x"),
            LockError::BackendUnavailable("x".into()),
            LockError::InvalidConfig("x".into()),
        ];
        let codes: Vec<_> = all.iter().map(LockError::code).collect();
        assert_eq!(
            codes,
            [
                "LOCK_ACQUISITION_FAILED",
                "LOCK_TIMEOUT",
                "LOCK_EXPIRED",
                "LOCK_NOT_FOUND",
                "LOCK_OWNERSHIP_MISMATCH",
                "LOCK_ALREADY_RELEASED",
                "LOCK_INVALID_KEY",
                "LOCK_INVALID_TTL",
                "LOCK_INVALID_OWNER",
                "LOCK_INVALID_METADATA",
                "LOCK_INVALID_KIND",
                "LOCK_KIND_MISMATCH",
                "LOCK_INVALID_HEADER",
                "LOCK_NOT_ALLOWED",
                "LOCK_UNSUPPORTED",
                "LOCK_BACKEND_UNAVAILABLE",
                "LOCK_INVALID_CONFIG",
            ]
        );
    }
}
