//! Driver, pool and time-out errors as [`LockError`]s.
//!
//! Everything that prevents an answer is [`LockError::BackendUnavailable`]:
//! the layer then answers `503` and never runs a handler unlocked. Messages
//! carry the driver's text and SQLSTATE, never keys, owners or passwords.

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

use crate::error::LockError;

/// A driver error: the server's SQLSTATE and message, or the I/O failure.
pub(super) fn pg_error(e: &tokio_postgres::Error) -> LockError {
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        if *code == SqlState::UNDEFINED_FUNCTION
            || *code == SqlState::UNDEFINED_TABLE
            || *code == SqlState::INVALID_SCHEMA_NAME
        {
            return LockError::BackendUnavailable(format!(
                "PostgreSQL: the tower-lock schema is missing or outdated \
                 (run PostgresBackend::migrate() or the SQL of PostgresBackend::schema_sql()): {}",
                db.message()
            ));
        }
        if *code == SqlState::QUERY_CANCELED {
            return LockError::BackendUnavailable(format!(
                "PostgreSQL cancelled the statement (statement_timeout): {}",
                db.message()
            ));
        }
        return LockError::BackendUnavailable(format!(
            "PostgreSQL error {}: {}",
            code.code(),
            db.message()
        ));
    }
    LockError::BackendUnavailable(format!("PostgreSQL: {e}"))
}

/// A pool checkout that failed (connecting, or the pool's own limits).
pub(super) fn pool_error(e: PoolError) -> LockError {
    match e {
        PoolError::Backend(e) => pg_error(&e),
        other => LockError::BackendUnavailable(format!("PostgreSQL pool: {other}")),
    }
}

/// No answer in time.
pub(super) fn timed_out(what: &str) -> LockError {
    LockError::BackendUnavailable(format!("timed out {what}"))
}

/// A reply without the shape the function returns: a bug, or a schema of
/// another version. Never a panic.
pub(super) fn bad_reply(what: &str) -> LockError {
    LockError::BackendUnavailable(format!("unexpected reply from PostgreSQL to {what}"))
}

/// A configuration the backend cannot use.
pub(super) fn config_error(e: &dyn std::fmt::Display) -> LockError {
    LockError::BackendUnavailable(format!("invalid PostgreSQL configuration: {e}"))
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
