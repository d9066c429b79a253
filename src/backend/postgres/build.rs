//! Making a [`PostgresBackend`]: the shortcuts from a URL or an
//! application's pool with the default settings, and [`PostgresBuilder`]
//! for the others (names, connections, op timeout, TLS).

use std::fmt;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

use super::error::config_error;
use super::schema::{Names, check_name};
use super::{PostgresBackend, Shared, Tls};
use crate::error::LockError;
use crate::spec::MAX_TTL;

/// Connections of a pool made from a URL.
const POOL_SIZE: usize = 16;

impl PostgresBackend {
    /// The default schema, `tower_lock`.
    pub const DEFAULT_SCHEMA: &'static str = "tower_lock";
    /// The default table, `locks`.
    pub const DEFAULT_TABLE: &'static str = "locks";
    /// The default bound on one backend call, 2 s.
    pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(2);
    /// The default number of connections operations run on, 2.
    pub const DEFAULT_CONNECTIONS: usize = 2;

    /// Settings other than the defaults: names, connections, op timeout,
    /// TLS of the `LISTEN` connection. Each setter is infallible; the step
    /// that makes the backend checks them all.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_lock::PostgresBackend;
    ///
    /// let backend = PostgresBackend::builder()
    ///     .schema("app")
    ///     .table("job_locks")
    ///     .op_timeout(Duration::from_secs(1))
    ///     .build("postgres://app:secret@10.0.0.5/app")?;
    /// assert_eq!((backend.get_schema(), backend.get_table()), ("app", "job_locks"));
    /// # Ok::<(), tower_lock::LockError>(())
    /// ```
    pub fn builder() -> PostgresBuilder {
        PostgresBuilder::default()
    }

    /// A backend with its own pool, from a URL:
    /// `postgres://[user[:password]@]host[:port][/dbname][?param=value…]`
    /// or the `key=value` form (`host=/run/postgresql dbname=app`), as
    /// [`tokio_postgres::Config`] parses them. A password goes in the URL.
    /// The default settings; [`builder`](PostgresBackend::builder) for
    /// others.
    ///
    /// With the feature `postgres-tls`, `sslmode=require` (or `prefer`, the
    /// default) speaks TLS through the system's OpenSSL, verifying the
    /// server's certificate against the system's roots (see
    /// [`from_url_with_tls`](PostgresBackend::from_url_with_tls) for your
    /// own CA); without it, `sslmode=require` fails to connect.
    ///
    /// Nothing is connected yet: connection errors show up as
    /// [`LockError::BackendUnavailable`] from the first calls. Run
    /// [`migrate`](PostgresBackend::migrate) once before the first lock.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] if the URL is invalid.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        PostgresBuilder::default().build(url)
    }

    /// [`from_url`](PostgresBackend::from_url) with your own TLS settings
    /// (a private CA, client certificates) for every connection.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] if the URL is invalid.
    #[cfg(feature = "postgres-tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres-tls")))]
    pub fn from_url_with_tls(url: &str, tls: native_tls::TlsConnector) -> Result<Self, LockError> {
        PostgresBuilder::default().build_with_tls(url, tls)
    }

    /// A backend on the application's existing pool, with the default
    /// settings ([`builder`](PostgresBackend::builder) for others).
    ///
    /// Operations run on a few connections taken from `pool` for good (the
    /// pool opens others in their place); `pool` also replaces them when
    /// they break. Waiting needs a `LISTEN` connection, which a pooled
    /// connection cannot be (and a transaction-mode pooler cannot carry), so
    /// `listen_url` says where to open that one: usually the URL the pool
    /// was made from, or the server's own address when the pool goes
    /// through PgBouncer. It is opened without TLS, unless the feature
    /// `postgres-tls` is on (then as [`from_url`](PostgresBackend::from_url)
    /// does; [`PostgresBuilder::listen_tls`] sets your own).
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] if `listen_url` is invalid.
    pub fn from_pool(pool: Pool, listen_url: &str) -> Result<Self, LockError> {
        PostgresBuilder::default().build_on_pool(pool, listen_url)
    }

    /// [`from_pool`](PostgresBackend::from_pool) with the `LISTEN`
    /// connection's settings as a [`tokio_postgres::Config`].
    pub fn from_pool_and_config(pool: Pool, listen_config: tokio_postgres::Config) -> Self {
        let tls = default_tls().unwrap_or(Tls::None);
        PostgresBuilder::default().make(pool, listen_config, tls, Names::default())
    }

    /// The schema the tables live in.
    pub fn get_schema(&self) -> &str {
        &self.shared.conns.names().schema
    }

    /// The lock table's name.
    pub fn get_table(&self) -> &str {
        &self.shared.conns.names().table
    }

    /// The bound on one backend call.
    pub fn get_op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// The pool connections come from.
    pub fn get_pool(&self) -> &Pool {
        self.shared.conns.pool()
    }
}

/// A [`PostgresBackend`] with settings other than the defaults, from
/// [`PostgresBackend::builder`]. The setters never fail: what they were
/// given is checked by the step that makes the backend
/// ([`build`](PostgresBuilder::build) and its `build_*` siblings, one per
/// way to reach the database), so a mistake is one
/// [`LockError::InvalidConfig`] at the end of the chain, not a `Result`
/// in its middle.
#[derive(Clone)]
#[must_use = "a builder does nothing until `build` makes the backend"]
pub struct PostgresBuilder {
    schema: String,
    table: String,
    connections: usize,
    op_timeout: Duration,
    /// The `LISTEN` connection's own TLS, when set.
    listen_tls: Option<Tls>,
}

impl Default for PostgresBuilder {
    fn default() -> Self {
        PostgresBuilder {
            schema: PostgresBackend::DEFAULT_SCHEMA.to_owned(),
            table: PostgresBackend::DEFAULT_TABLE.to_owned(),
            connections: PostgresBackend::DEFAULT_CONNECTIONS,
            op_timeout: PostgresBackend::DEFAULT_OP_TIMEOUT,
            listen_tls: None,
        }
    }
}

impl fmt::Debug for PostgresBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBuilder")
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("connections", &self.connections)
            .field("op_timeout", &self.op_timeout)
            .finish_non_exhaustive()
    }
}

impl PostgresBuilder {
    /// Keep the table, sequences and functions in schema `schema` instead
    /// of `tower_lock`: 1 to 40 characters of `a-z`, `0-9` and `_`, not
    /// starting with a digit (checked by `build`).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Name the table `table` instead of `locks` (its other objects are
    /// named after it: `<table>_waiters`, `<table>_fence`, …): 1 to 40
    /// characters of `a-z`, `0-9` and `_`, not starting with a digit
    /// (checked by `build`).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Run operations on `connections` connections taken from the pool (1
    /// to 64, default 2). Each pipelines concurrent operations; more let the
    /// server work on more independent keys at once.
    pub fn connections(mut self, connections: usize) -> Self {
        self.connections = connections.clamp(1, 64);
        self
    }

    /// Bound every backend call by `op_timeout` (default 2 s), connecting
    /// and preparing included, at least 1 ms, at most a year (longer is as
    /// good as forever); the server also stops a statement after it
    /// (`statement_timeout`, at most its own maximum of about 24 days).
    /// `acquire` with a max wait returns within max wait + `op_timeout`.
    pub fn op_timeout(mut self, op_timeout: Duration) -> Self {
        self.op_timeout = op_timeout.clamp(Duration::from_millis(1), MAX_TTL);
        self
    }

    /// Open the `LISTEN` connection with these TLS settings (by default,
    /// those of the backend's own connections: see
    /// [`PostgresBackend::from_pool`]).
    #[cfg(feature = "postgres-tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres-tls")))]
    pub fn listen_tls(mut self, tls: native_tls::TlsConnector) -> Self {
        self.listen_tls = Some(Tls::Native(postgres_native_tls::MakeTlsConnector::new(tls)));
        self
    }

    /// The backend, with its own pool from `url` (as
    /// [`PostgresBackend::from_url`]).
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] if the URL, the schema or the table
    /// name is invalid.
    pub fn build(self, url: &str) -> Result<PostgresBackend, LockError> {
        let names = self.names()?;
        let config: tokio_postgres::Config = url.parse().map_err(|e| config_error(&e))?;
        let tls = default_tls()?;
        let pool = own_pool(&config, &tls)?;
        Ok(self.make(pool, config, tls, names))
    }

    /// [`build`](PostgresBuilder::build) with your own TLS settings for
    /// every connection (as [`PostgresBackend::from_url_with_tls`]).
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] if the URL, the schema or the table
    /// name is invalid.
    #[cfg(feature = "postgres-tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres-tls")))]
    pub fn build_with_tls(
        self,
        url: &str,
        tls: native_tls::TlsConnector,
    ) -> Result<PostgresBackend, LockError> {
        let names = self.names()?;
        let config: tokio_postgres::Config = url.parse().map_err(|e| config_error(&e))?;
        let tls = Tls::Native(postgres_native_tls::MakeTlsConnector::new(tls));
        let pool = own_pool(&config, &tls)?;
        Ok(self.make(pool, config, tls, names))
    }

    /// The backend on the application's `pool`, its `LISTEN` connection
    /// opened from `listen_url` (as [`PostgresBackend::from_pool`]).
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] if `listen_url`, the schema or the
    /// table name is invalid.
    pub fn build_on_pool(self, pool: Pool, listen_url: &str) -> Result<PostgresBackend, LockError> {
        let listen_config: tokio_postgres::Config =
            listen_url.parse().map_err(|e| config_error(&e))?;
        self.build_on_pool_and_config(pool, listen_config)
    }

    /// [`build_on_pool`](PostgresBuilder::build_on_pool) with the `LISTEN`
    /// connection's settings as a [`tokio_postgres::Config`].
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] if the schema or the table name is
    /// invalid, or the system's TLS settings cannot be loaded.
    pub fn build_on_pool_and_config(
        self,
        pool: Pool,
        listen_config: tokio_postgres::Config,
    ) -> Result<PostgresBackend, LockError> {
        let names = self.names()?;
        let tls = default_tls()?;
        Ok(self.make(pool, listen_config, tls, names))
    }

    /// The names, checked: the one place a bad name is reported.
    fn names(&self) -> Result<Names, LockError> {
        check_name(&self.schema, "schema")?;
        check_name(&self.table, "table")?;
        Ok(Names {
            schema: self.schema.clone(),
            table: self.table.clone(),
        })
    }

    /// The backend, from checked names; `tls` is the `LISTEN` connection's
    /// unless [`listen_tls`](PostgresBuilder::listen_tls) set another.
    fn make(
        self,
        pool: Pool,
        listen_config: tokio_postgres::Config,
        tls: Tls,
        names: Names,
    ) -> PostgresBackend {
        PostgresBackend {
            shared: Shared::new(
                pool,
                listen_config,
                self.listen_tls.unwrap_or(tls),
                names,
                self.connections,
                self.op_timeout,
            ),
            op_timeout: self.op_timeout,
        }
    }
}

/// The backend's own pool, for a backend made from a URL.
fn own_pool(config: &tokio_postgres::Config, tls: &Tls) -> Result<Pool, LockError> {
    let manager_config = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = match tls {
        Tls::None => Manager::from_config(config.clone(), tokio_postgres::NoTls, manager_config),
        #[cfg(feature = "postgres-tls")]
        Tls::Native(connector) => {
            Manager::from_config(config.clone(), connector.clone(), manager_config)
        }
    };
    Pool::builder(manager)
        .max_size(POOL_SIZE)
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| config_error(&e))
}

/// TLS for connections the backend makes itself: none, or with the feature
/// `postgres-tls` the system's OpenSSL with its default roots.
fn default_tls() -> Result<Tls, LockError> {
    #[cfg(feature = "postgres-tls")]
    {
        let connector = native_tls::TlsConnector::new().map_err(|e| config_error(&e))?;
        Ok(Tls::Native(postgres_native_tls::MakeTlsConnector::new(
            connector,
        )))
    }
    #[cfg(not(feature = "postgres-tls"))]
    {
        Ok(Tls::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "No timeout" spelled as the longest duration is a year, as on the
    /// other backends: a deadline of `now + Duration::MAX` panicked on the
    /// first call.
    #[tokio::test]
    async fn an_endless_op_timeout_is_a_year_and_calls_do_not_panic() {
        let b = PostgresBackend::builder()
            .op_timeout(Duration::MAX)
            .build("postgres://u@127.0.0.1:1/db")
            .unwrap();
        assert_eq!(b.get_op_timeout(), MAX_TTL);
        // Nothing listens on port 1: an error, not a panic.
        let key = crate::LockKey::global("k").unwrap();
        assert!(crate::LockBackend::status(&b, &key).await.is_err());
    }

    #[tokio::test]
    async fn the_builder_keeps_settings_and_checks_names_when_it_builds() {
        let b = PostgresBackend::builder()
            .op_timeout(Duration::from_millis(300))
            .schema("app")
            .table("my_locks")
            .connections(3)
            .build("postgres://u:pw@127.0.0.1:1/db")
            .unwrap();
        assert_eq!((b.get_schema(), b.get_table()), ("app", "my_locks"));
        assert_eq!(b.get_op_timeout(), Duration::from_millis(300));
        assert!(b.schema_sql().contains("\"app\".\"my_locks_waiters\""));
        let shown = format!("{b:?}");
        assert!(!shown.contains("pw"), "{shown}");
        assert!(shown.contains("connections: 3"), "{shown}");
        let url = "postgres://u@127.0.0.1:1/db";
        let bad_table = PostgresBackend::builder().table("Bad-Name").build(url);
        assert!(matches!(bad_table, Err(LockError::InvalidConfig(_))));
        let bad_schema = PostgresBackend::builder().schema("").build(url);
        assert!(matches!(bad_schema, Err(LockError::InvalidConfig(_))));
        assert!(PostgresBackend::from_url("postgres://[::1").is_err());
    }
}
