//! Balances in PostgreSQL.

use super::*;

#[cfg(not(feature = "postgres"))]
pub(crate) async fn postgres_bank(_url: &str) -> Result<Bank, String> {
    Err("--postgres needs tower-lock's `postgres` feature".to_owned())
}

/// Locks and balances in the PostgreSQL database at `url`.
#[cfg(feature = "postgres")]
pub(crate) async fn postgres_bank(url: &str) -> Result<Bank, String> {
    let locks = tower_lock::PostgresBackend::from_url(url)
        .map_err(|e| format!("bad --postgres URL: {e}"))?;
    // Balances get a pool of their own, so lock waiters can never starve the
    // holder's balance read/write of connections.
    let store = postgres_store::Store::new(url)?;
    // The database may come up later: warn, serve (503 until it answers),
    // and create the tables as soon as it does.
    if let Err(e) = store.set_up(&locks).await {
        eprintln!("bank: warning: PostgreSQL at the --postgres URL does not answer yet ({e})");
        let (store, locks) = (store.clone(), locks.clone());
        tokio::spawn(async move {
            while store.set_up(&locks).await.is_err() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }
    Ok(Bank {
        locks: SharedBackend::new(locks),
        balances: Balances::Postgres(store),
        fenced: false,
        statements_computed: AtomicU64::new(0),
        exports: Exports::default(),
    })
}

/// Balances in PostgreSQL: `bank_balances(id text primary key, balance
/// bigint, fence bigint)` (the fence: the highest a fenced deposit read or
/// wrote the account with).
#[cfg(feature = "postgres")]
pub(crate) mod postgres_store {
    use deadpool_postgres::{Manager, Pool};

    use super::{ApiError, STORE_TIMEOUT, stale_fence};
    use axum::http::StatusCode;

    #[derive(Clone)]
    pub(crate) struct Store {
        pool: Pool,
    }

    /// A fence as PostgreSQL's `bigint` (fences stay far below 2^63).
    pub(crate) fn fence_sql(fence: u64) -> Result<i64, ApiError> {
        i64::try_from(fence).map_err(|_| ApiError::store("a fence beyond bigint"))
    }

    impl Store {
        pub(crate) fn new(url: &str) -> Result<Store, String> {
            let config: tokio_postgres::Config = url
                .parse()
                .map_err(|e| format!("bad --postgres URL: {e}"))?;
            // TLS as the lock backend speaks it: with feature `postgres-tls`,
            // through the system's OpenSSL (`sslmode=require` in the URL to
            // insist on it), else plain.
            #[cfg(feature = "postgres-tls")]
            let manager = {
                let tls = native_tls::TlsConnector::new()
                    .map_err(|e| format!("TLS for --postgres: {e}"))?;
                Manager::new(config, postgres_native_tls::MakeTlsConnector::new(tls))
            };
            #[cfg(not(feature = "postgres-tls"))]
            let manager = Manager::new(config, tokio_postgres::NoTls);
            let pool = Pool::builder(manager)
                .max_size(16)
                .build()
                .map_err(|e| format!("bad --postgres URL: {e}"))?;
            Ok(Store { pool })
        }

        /// The lock schema and the balances table, if the database answers.
        pub(crate) async fn set_up(
            &self,
            locks: &tower_lock::PostgresBackend,
        ) -> Result<(), String> {
            locks.migrate().await.map_err(|e| e.to_string())?;
            self.run(async |c: &tokio_postgres::Client| {
                c.batch_execute(
                    "CREATE TABLE IF NOT EXISTS bank_balances \
                     (id text PRIMARY KEY, balance bigint NOT NULL); \
                     ALTER TABLE bank_balances \
                     ADD COLUMN IF NOT EXISTS fence bigint NOT NULL DEFAULT 0; \
                     CREATE TABLE IF NOT EXISTS bank_exports \
                     (id text PRIMARY KEY, running bigint NOT NULL)",
                )
                .await
            })
            .await
            .map_err(|e| e.message)
        }

        /// Exports of `id` running now, plus `delta` (one statement).
        pub(crate) async fn add_running(&self, id: &str, delta: i64) -> Result<i64, ApiError> {
            let row = self
                .run(async |c: &tokio_postgres::Client| {
                    c.query_one(
                        "INSERT INTO bank_exports (id, running) VALUES ($1, $2) \
                         ON CONFLICT (id) DO UPDATE \
                         SET running = bank_exports.running + excluded.running \
                         RETURNING running",
                        &[&id, &delta],
                    )
                    .await
                })
                .await?;
            Ok(row.get(0))
        }

        pub(crate) async fn get(&self, id: &str) -> Result<i64, ApiError> {
            let row = self
                .run(async |c: &tokio_postgres::Client| {
                    c.query_opt("SELECT balance FROM bank_balances WHERE id = $1", &[&id])
                        .await
                })
                .await?;
            Ok(row.map_or(0, |r| r.get(0)))
        }

        pub(crate) async fn set(&self, id: &str, balance: i64) -> Result<(), ApiError> {
            self.run(async |c: &tokio_postgres::Client| {
                c.execute(
                    "INSERT INTO bank_balances (id, balance) VALUES ($1, $2) \
                     ON CONFLICT (id) DO UPDATE SET balance = excluded.balance",
                    &[&id, &balance],
                )
                .await
            })
            .await
            .map(|_| ())
        }

        /// The balance for a deposit holding `fence`, remembering the fence
        /// unless the account has seen a higher one (then: stale). One
        /// statement: the check and the change are atomic.
        pub(crate) async fn read_fenced(&self, id: &str, fence: u64) -> Result<i64, ApiError> {
            let fence = fence_sql(fence)?;
            let row = self
                .run(async |c: &tokio_postgres::Client| {
                    c.query_opt(
                        "INSERT INTO bank_balances (id, balance, fence) VALUES ($1, 0, $2) \
                         ON CONFLICT (id) DO UPDATE SET fence = excluded.fence \
                         WHERE bank_balances.fence <= excluded.fence \
                         RETURNING balance",
                        &[&id, &fence],
                    )
                    .await
                })
                .await?;
            row.map(|r| r.get(0)).ok_or_else(stale_fence)
        }

        /// Write `balance` with `fence` unless the account has seen a higher
        /// fence (then: stale, nothing written). One statement.
        pub(crate) async fn write_fenced(
            &self,
            id: &str,
            balance: i64,
            fence: u64,
        ) -> Result<(), ApiError> {
            let fence = fence_sql(fence)?;
            let written = self
                .run(async |c: &tokio_postgres::Client| {
                    c.execute(
                        "INSERT INTO bank_balances (id, balance, fence) VALUES ($1, $2, $3) \
                         ON CONFLICT (id) DO UPDATE \
                         SET balance = excluded.balance, fence = excluded.fence \
                         WHERE bank_balances.fence <= excluded.fence",
                        &[&id, &balance, &fence],
                    )
                    .await
                })
                .await?;
            if written == 1 {
                Ok(())
            } else {
                Err(stale_fence())
            }
        }

        /// Balance and highest accepted fence of an account.
        pub(crate) async fn account(&self, id: &str) -> Result<(i64, u64), ApiError> {
            let row = self
                .run(async |c: &tokio_postgres::Client| {
                    c.query_opt(
                        "SELECT balance, fence FROM bank_balances WHERE id = $1",
                        &[&id],
                    )
                    .await
                })
                .await?;
            Ok(row.map_or((0, 0), |r| {
                (r.get(0), u64::try_from(r.get::<_, i64>(1)).unwrap_or(0))
            }))
        }

        /// Run `f` on a pooled connection within [`STORE_TIMEOUT`].
        async fn run<T>(
            &self,
            f: impl AsyncFnOnce(&tokio_postgres::Client) -> Result<T, tokio_postgres::Error>,
        ) -> Result<T, ApiError> {
            let attempt = async {
                let conn = self.pool.get().await.map_err(|e| e.to_string())?;
                f(&conn).await.map_err(|e| e.to_string())
            };
            let result = match tokio::time::timeout(STORE_TIMEOUT, attempt).await {
                Ok(result) => result,
                Err(_) => Err(format!("no answer within {STORE_TIMEOUT:?}")),
            };
            result.map_err(|detail| {
                // Details go to the log, not to clients.
                tracing::warn!(error = %detail, "balance store error");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "STORE_UNAVAILABLE",
                    "the balance store is unavailable",
                )
            })
        }
    }
}
