//! The table, sequences and functions, and `migrate()`.
//!
//! The SQL lives in `schema.sql` (tables, sequences), `functions.sql` (one
//! PL/pgSQL function per lock operation) and `flight.sql` (single-flight's),
//! with `{schema}` and `{table}` replaced by the backend's names. Names are plain lowercase identifiers,
//! checked here, so the rendered SQL needs no escaping beyond quoting.

use tokio_postgres::Client;

use super::error::pg_error;
use crate::error::LockError;

const SCHEMA_SQL: &str = include_str!("schema.sql");
const FUNCTIONS_SQL: &str = include_str!("functions.sql");
const FLIGHT_SQL: &str = include_str!("flight.sql");

/// The longest schema or table name accepted: the longest derived name
/// (`<table>_flight_watchers`) then stays within PostgreSQL's 63 bytes.
pub(super) const MAX_NAME: usize = 40;

/// Where the backend keeps its locks: `"<schema>"."<table>"` and the objects
/// named after the table (`<table>_waiters`, `<table>_fence`, `<table>_acquire`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Names {
    pub(super) schema: String,
    pub(super) table: String,
}

impl Default for Names {
    fn default() -> Self {
        Names {
            schema: "tower_lock".to_owned(),
            table: "locks".to_owned(),
        }
    }
}

/// A schema or table name: 1 to [`MAX_NAME`] bytes of `[a-z0-9_]`, not
/// starting with a digit.
pub(super) fn check_name(name: &str, what: &'static str) -> Result<(), LockError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(LockError::InvalidConfig(format!(
            "invalid PostgreSQL {what} name: use 1 to {MAX_NAME} characters of a-z, 0-9 \
             and _, not starting with a digit"
        )))
    }
}

impl Names {
    /// `template` with the names filled in.
    pub(super) fn render(&self, template: &str) -> String {
        template
            .replace("{schema}", &self.schema)
            .replace("{table}", &self.table)
    }

    /// `"<schema>"."<table><suffix>"`.
    pub(super) fn object(&self, suffix: &str) -> String {
        format!("\"{}\".\"{}{suffix}\"", self.schema, self.table)
    }

    /// Everything `migrate()` runs, as one script.
    pub(super) fn script(&self) -> String {
        let mut sql = self.render(SCHEMA_SQL);
        sql.push('\n');
        sql.push_str(&self.render(FUNCTIONS_SQL));
        sql.push('\n');
        sql.push_str(&self.render(FLIGHT_SQL));
        sql
    }
}

/// Create or update the schema in one transaction, serialised with any
/// other instance migrating at the same time (concurrent `CREATE … IF NOT
/// EXISTS` can otherwise fail on the catalogs' unique indexes).
pub(super) async fn migrate(client: &Client, names: &Names) -> Result<(), LockError> {
    let script = format!(
        "BEGIN;\n\
         SELECT pg_advisory_xact_lock(hashtext('tower-lock migrate'));\n\
         {}\n\
         COMMIT;",
        names.script()
    );
    match client.batch_execute(&script).await {
        Ok(()) => Ok(()),
        Err(e) => {
            // The failed transaction is still open on this connection.
            let _ = client.batch_execute("ROLLBACK").await;
            Err(pg_error(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for good in [
            "locks",
            "tower_lock",
            "a",
            "_x",
            "t2",
            &"a".repeat(MAX_NAME),
        ] {
            assert!(check_name(good, "table").is_ok(), "{good}");
        }
        for bad in [
            "",
            "Locks",
            "1st",
            "a-b",
            "a\"b",
            "a.b",
            "ä",
            &"a".repeat(MAX_NAME + 1),
        ] {
            assert!(check_name(bad, "table").is_err(), "{bad}");
        }
    }

    #[test]
    fn rendered_sql_has_no_placeholders_left() {
        let names = Names {
            schema: "app".into(),
            table: "my_locks".into(),
        };
        let sql = names.script();
        assert!(!sql.contains("{schema}") && !sql.contains("{table}"));
        assert!(sql.contains("\"app\".\"my_locks_acquire\""));
        assert_eq!(names.object("_waiters"), "\"app\".\"my_locks_waiters\"");
        // The longest derived identifier fits PostgreSQL's 63 bytes.
        assert!(MAX_NAME + "_flight_watchers".len() <= 63);
    }
}
