//! Everything that goes wrong talking to Redis, as [`LockError`]s: the
//! layer answers `503` for all of them, and no message carries a key or an
//! owner.

use std::fmt;

use deadpool_redis::PoolError;
use deadpool_redis::redis::RedisError;

use crate::error::{BackendError, LockError};

/// The driver's error, kept as the cause (`source`).
pub(super) fn redis_error(e: &RedisError) -> LockError {
    LockError::BackendUnavailable(BackendError::new("Redis").with_source(e.clone()))
}

pub(super) fn timed_out(what: &str) -> LockError {
    LockError::BackendUnavailable(format!("timed out {what}").into())
}

pub(super) fn pool_error(e: PoolError) -> LockError {
    match e {
        PoolError::Backend(e) => redis_error(&e),
        other => LockError::BackendUnavailable(BackendError::new("Redis pool").with_source(other)),
    }
}

/// A configuration the backend cannot use: an error where it is built
/// (not retryable), never a `503`.
pub(super) fn config_error(e: &dyn fmt::Display) -> LockError {
    LockError::InvalidConfig(format!("Redis: {e}"))
}

/// A reply that does not have the shape the script returns: a bug, or
/// something else writing to our keys. Never a panic.
pub(super) fn bad_reply(what: &str) -> LockError {
    LockError::BackendUnavailable(format!("unexpected reply from Redis to {what}").into())
}
