//! Driver, pool and time-out errors as [`LockError`]s.
//!
//! Everything that prevents an answer is [`LockError::BackendUnavailable`]:
//! the layer then answers `503` and never runs a handler unlocked. Messages
//! carry the driver's text and SQLSTATE, never keys, owners or passwords.

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

use crate::error::{BackendError, LockError};

/// A driver error: the server's SQLSTATE and message, or the I/O failure;
/// the driver's error is kept as the cause (`source`).
pub(super) fn pg_error(e: tokio_postgres::Error) -> LockError {
    let message = pg_message(&e);
    LockError::BackendUnavailable(BackendError::new(message).with_source(e))
}

fn pg_message(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        if *code == SqlState::UNDEFINED_FUNCTION
            || *code == SqlState::UNDEFINED_TABLE
            || *code == SqlState::INVALID_SCHEMA_NAME
        {
            return format!(
                "PostgreSQL: the tower-lock schema is missing or outdated \
                 (run PostgresBackend::migrate() or the SQL of PostgresBackend::schema_sql()): {}",
                db.message()
            );
        }
        if *code == SqlState::QUERY_CANCELED {
            return format!(
                "PostgreSQL cancelled the statement (statement_timeout): {}",
                db.message()
            );
        }
        return format!("PostgreSQL error {}: {}", code.code(), db.message());
    }
    "PostgreSQL".to_owned()
}

/// A pool checkout that failed (connecting, or the pool's own limits).
pub(super) fn pool_error(e: PoolError) -> LockError {
    match e {
        PoolError::Backend(e) => pg_error(e),
        other => {
            LockError::BackendUnavailable(BackendError::new("PostgreSQL pool").with_source(other))
        }
    }
}

/// No answer in time.
pub(super) fn timed_out(what: &str) -> LockError {
    LockError::BackendUnavailable(format!("timed out {what}").into())
}

/// A reply without the shape the function returns: a bug, or a schema of
/// another version. Never a panic.
pub(super) fn bad_reply(what: &str) -> LockError {
    LockError::BackendUnavailable(format!("unexpected reply from PostgreSQL to {what}").into())
}

/// A configuration the backend cannot use: an error where it is built
/// (not retryable), never a `503`.
pub(super) fn config_error(e: &dyn std::fmt::Display) -> LockError {
    LockError::InvalidConfig(format!("PostgreSQL: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_failure() {
        assert_eq!(
            timed_out("waiting for PostgreSQL").to_string(),
            "lock backend unavailable: timed out waiting for PostgreSQL"
        );
        assert!(bad_reply("acquire").to_string().contains("acquire"));
        assert!(matches!(
            pool_error(PoolError::Closed),
            LockError::BackendUnavailable(_)
        ));
    }
}
