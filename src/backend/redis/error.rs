//! Everything that goes wrong talking to Redis, as [`LockError`]s: the
//! layer answers `503` for all of them, and no message carries a key or an
//! owner.

use std::fmt;

use deadpool_redis::PoolError;
use deadpool_redis::redis::RedisError;

use crate::error::LockError;

pub(super) fn redis_error(e: &RedisError) -> LockError {
    LockError::BackendUnavailable(format!("Redis: {e}"))
}

pub(super) fn timed_out(what: &str) -> LockError {
    LockError::BackendUnavailable(format!("timed out {what}"))
}

pub(super) fn pool_error(e: PoolError) -> LockError {
    match e {
        PoolError::Backend(e) => redis_error(&e),
        other => LockError::BackendUnavailable(format!("Redis pool: {other}")),
    }
}

pub(super) fn config_error(e: &dyn fmt::Display) -> LockError {
    LockError::BackendUnavailable(format!("invalid Redis configuration: {e}"))
}

/// A reply that does not have the shape the script returns: a bug, or
/// something else writing to our keys. Never a panic.
pub(super) fn bad_reply(what: &str) -> LockError {
    LockError::BackendUnavailable(format!("unexpected reply from Redis to {what}"))
}
