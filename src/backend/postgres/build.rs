//! Making a [`PostgresBackend`]: from a URL or an application's pool, and
//! the builder methods (names, connections, op timeout, TLS).

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

use super::error::config_error;
use super::schema::{Names, check_name};
use super::{PostgresBackend, Shared, Tls};
use crate::error::LockError;

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

    /// A backend with its own pool, from a URL:
    /// `postgres://[user[:password]@]host[:port][/dbname][?param=value…]`
    /// or the `key=value` form (`host=/run/postgresql dbname=app`), as
    /// [`tokio_postgres::Config`] parses them. A password goes in the URL.
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
        let config: tokio_postgres::Config = url.parse().map_err(|e| config_error(&e))?;
        Self::from_pg_config(config, default_tls()?)
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
        let config: tokio_postgres::Config = url.parse().map_err(|e| config_error(&e))?;
        Self::from_pg_config(
            config,
            Tls::Native(postgres_native_tls::MakeTlsConnector::new(tls)),
        )
    }

    fn from_pg_config(config: tokio_postgres::Config, tls: Tls) -> Result<Self, LockError> {
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match &tls {
            Tls::None => {
                Manager::from_config(config.clone(), tokio_postgres::NoTls, manager_config)
            }
            #[cfg(feature = "postgres-tls")]
            Tls::Native(connector) => {
                Manager::from_config(config.clone(), connector.clone(), manager_config)
            }
        };
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| config_error(&e))?;
        Ok(Self::new(pool, config, tls))
    }

    /// A backend on the application's existing pool.
    ///
    /// Operations run on a few connections taken from `pool` for good (the
    /// pool opens others in their place); `pool` also replaces them when
    /// they break. Waiting needs a `LISTEN` connection, which a pooled
    /// connection cannot be (and a transaction-mode pooler cannot carry), so
    /// `listen_url` says where to open that one: usually the URL the pool
    /// was made from, or the server's own address when the pool goes
    /// through PgBouncer. It is opened without TLS, unless the feature
    /// `postgres-tls` is on (then as [`from_url`](PostgresBackend::from_url)
    /// does; [`listen_tls`](PostgresBackend::listen_tls) sets your
    /// own).
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] if `listen_url` is invalid.
    pub fn from_pool(pool: Pool, listen_url: &str) -> Result<Self, LockError> {
        let config: tokio_postgres::Config = listen_url.parse().map_err(|e| config_error(&e))?;
        Ok(Self::new(pool, config, default_tls()?))
    }

    /// [`from_pool`](PostgresBackend::from_pool) with the `LISTEN`
    /// connection's settings as a [`tokio_postgres::Config`].
    pub fn from_pool_and_config(pool: Pool, listen_config: tokio_postgres::Config) -> Self {
        let tls = default_tls().unwrap_or(Tls::None);
        Self::new(pool, listen_config, tls)
    }

    fn new(pool: Pool, listen_config: tokio_postgres::Config, tls: Tls) -> Self {
        PostgresBackend {
            shared: Shared::new(
                pool,
                listen_config,
                tls,
                Names::default(),
                Self::DEFAULT_CONNECTIONS,
                Self::DEFAULT_OP_TIMEOUT,
            ),
            op_timeout: Self::DEFAULT_OP_TIMEOUT,
        }
    }

    /// The same backend (pool, settings) with other names, connection
    /// count or op timeout: a fresh set of connections and its own
    /// `LISTEN` channel.
    fn rebuilt(&self, names: Names, connections: usize) -> Arc<Shared> {
        let shared = &self.shared;
        Shared::new(
            shared.conns.pool().clone(),
            shared.listen_config.clone(),
            shared.tls.clone(),
            names,
            connections,
            self.op_timeout,
        )
    }

    /// Keep the table, sequences and functions in schema `schema` instead
    /// of `tower_lock`: 1 to 40 characters of `a-z`, `0-9` and `_`.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] for a name outside those rules.
    pub fn schema(mut self, schema: &str) -> Result<Self, LockError> {
        check_name(schema, "schema")?;
        let names = Names {
            schema: schema.to_owned(),
            ..self.shared.conns.names().clone()
        };
        self.shared = self.rebuilt(names, self.shared.conns.connections());
        Ok(self)
    }

    /// Name the table `table` instead of `locks` (its other objects are
    /// named after it: `<table>_waiters`, `<table>_fence`, …): 1 to 40
    /// characters of `a-z`, `0-9` and `_`.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] for a name outside those rules.
    pub fn table(mut self, table: &str) -> Result<Self, LockError> {
        check_name(table, "table")?;
        let names = Names {
            table: table.to_owned(),
            ..self.shared.conns.names().clone()
        };
        self.shared = self.rebuilt(names, self.shared.conns.connections());
        Ok(self)
    }

    /// Run operations on `connections` connections taken from the pool (1
    /// to 64, default 2). Each pipelines concurrent operations; more let the
    /// server work on more independent keys at once.
    pub fn connections(mut self, connections: usize) -> Self {
        let names = self.shared.conns.names().clone();
        self.shared = self.rebuilt(names, connections.clamp(1, 64));
        self
    }

    /// Bound every backend call by `op_timeout` (default 2 s), connecting
    /// and preparing included, at least 1 ms; the server also stops a
    /// statement after it (`statement_timeout`). `acquire` with a max wait
    /// returns within max wait + `op_timeout`.
    pub fn op_timeout(mut self, op_timeout: Duration) -> Self {
        self.op_timeout = op_timeout.max(Duration::from_millis(1));
        // Connections made from now on get the new statement_timeout.
        let names = self.shared.conns.names().clone();
        self.shared = self.rebuilt(names, self.shared.conns.connections());
        self
    }

    /// Open the `LISTEN` connection with these TLS settings.
    #[cfg(feature = "postgres-tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres-tls")))]
    pub fn listen_tls(mut self, tls: native_tls::TlsConnector) -> Self {
        let shared = &self.shared;
        self.shared = Shared::new(
            shared.conns.pool().clone(),
            shared.listen_config.clone(),
            Tls::Native(postgres_native_tls::MakeTlsConnector::new(tls)),
            shared.conns.names().clone(),
            shared.conns.connections(),
            self.op_timeout,
        );
        self
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

    #[tokio::test]
    async fn builders_check_names_and_keep_settings() {
        let b = PostgresBackend::from_url("postgres://u:pw@127.0.0.1:1/db")
            .unwrap()
            .op_timeout(Duration::from_millis(300))
            .schema("app")
            .unwrap()
            .table("my_locks")
            .unwrap()
            .connections(3);
        assert_eq!((b.get_schema(), b.get_table()), ("app", "my_locks"));
        assert_eq!(b.get_op_timeout(), Duration::from_millis(300));
        assert!(b.schema_sql().contains("\"app\".\"my_locks_waiters\""));
        let shown = format!("{b:?}");
        assert!(!shown.contains("pw"), "{shown}");
        assert!(b.clone().table("Bad-Name").is_err());
        assert!(b.clone().schema("").is_err());
        assert!(PostgresBackend::from_url("postgres://[::1").is_err());
    }
}
