//! Balances in etcd, beside the locks (`--etcd`): `bank/balance/{id}` holds a
//! balance; fenced (`--fenced`), `bank/fenced/{id}` holds `"<balance>
//! <fence>"`, changed by a transaction conditioned on the revision read (the
//! check and the change one atomic step; tried again when another write
//! came between).

use super::*;

#[cfg(feature = "etcd")]
pub(crate) use store::EtcdStore;

#[cfg(feature = "etcd")]
mod store {
    use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};

    use super::{ApiError, STORE_TIMEOUT, stale_fence};

    /// A client on every endpoint (balanced), with its calls bounded
    /// (boxed: a `Client` is several kB, the other stores a few words).
    #[derive(Clone)]
    pub(crate) struct EtcdStore(Box<Client>);

    fn plain(id: &str) -> String {
        format!("bank/balance/{id}")
    }

    fn fenced(id: &str) -> String {
        format!("bank/fenced/{id}")
    }

    fn unavailable(detail: String) -> ApiError {
        // Details go to the log, not to clients.
        tracing::warn!(error = %detail, "balance store error");
        ApiError::store("the balance store is unavailable")
    }

    async fn bounded<T>(
        call: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, ApiError> {
        match tokio::time::timeout(STORE_TIMEOUT, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(unavailable(e.to_string())),
            Err(_) => Err(unavailable(format!("no answer within {STORE_TIMEOUT:?}"))),
        }
    }

    fn parse(value: &[u8]) -> Result<(i64, u64), ApiError> {
        let text = std::str::from_utf8(value).unwrap_or("");
        let (balance, fence) = text.split_once(' ').unwrap_or(("", ""));
        match (balance.parse(), fence.parse()) {
            (Ok(b), Ok(f)) => Ok((b, f)),
            _ => Err(ApiError::store("a stored balance is not a number")),
        }
    }

    impl EtcdStore {
        pub(crate) async fn connect(endpoints: &[String]) -> Result<Self, String> {
            let options = etcd_client::ConnectOptions::new().with_timeout(STORE_TIMEOUT);
            Client::connect(endpoints, Some(options))
                .await
                .map(|c| EtcdStore(Box::new(c)))
                .map_err(|e| format!("bad --etcd endpoints: {e}"))
        }

        /// Exports of `id` running now, plus `delta`: a compare-and-swap on
        /// the count's revision, again until it lands.
        pub(crate) async fn add_running(&self, id: &str, delta: i64) -> Result<i64, ApiError> {
            let key = format!("bank/exporting/{id}");
            let deadline = tokio::time::Instant::now() + STORE_TIMEOUT;
            loop {
                let reply = bounded(self.0.kv_client().get(key.clone(), None)).await?;
                let (count, rev) = match reply.kvs().first() {
                    None => (0, 0),
                    Some(kv) => {
                        let count = std::str::from_utf8(kv.value())
                            .ok()
                            .and_then(|v| v.parse::<i64>().ok())
                            .ok_or_else(|| ApiError::store("a stored count is not a number"))?;
                        (count, kv.mod_revision())
                    }
                };
                let next = count + delta;
                let txn = Txn::new()
                    .when([Compare::mod_revision(key.clone(), CompareOp::Equal, rev)])
                    .and_then([TxnOp::put(key.clone(), next.to_string(), None)]);
                if bounded(self.0.kv_client().txn(txn)).await?.succeeded() {
                    return Ok(next);
                }
                if tokio::time::Instant::now() > deadline {
                    return Err(unavailable("the export count kept changing".into()));
                }
            }
        }

        pub(crate) async fn get(&self, id: &str) -> Result<i64, ApiError> {
            let reply = bounded(self.0.kv_client().get(plain(id), None)).await?;
            match reply.kvs().first() {
                None => Ok(0),
                Some(kv) => std::str::from_utf8(kv.value())
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| ApiError::store("a stored balance is not a number")),
            }
        }

        pub(crate) async fn set(&self, id: &str, balance: i64) -> Result<(), ApiError> {
            bounded(self.0.kv_client().put(plain(id), balance.to_string(), None)).await?;
            Ok(())
        }

        /// Balance, highest fence seen, and the revision they were read at
        /// (0: never written).
        async fn read(&self, id: &str) -> Result<(i64, u64, i64), ApiError> {
            let reply = bounded(self.0.kv_client().get(fenced(id), None)).await?;
            match reply.kvs().first() {
                None => Ok((0, 0, 0)),
                Some(kv) => {
                    let (b, f) = parse(kv.value())?;
                    Ok((b, f, kv.mod_revision()))
                }
            }
        }

        /// Store `balance` (or keep the one read) with `fence`, unless the
        /// account has seen a higher fence.
        async fn fence(&self, id: &str, fence: u64, balance: Option<i64>) -> Result<i64, ApiError> {
            let deadline = tokio::time::Instant::now() + STORE_TIMEOUT;
            loop {
                let (stored, seen, rev) = self.read(id).await?;
                if seen > fence {
                    return Err(stale_fence());
                }
                let value = balance.unwrap_or(stored);
                let txn = Txn::new()
                    .when([Compare::mod_revision(fenced(id), CompareOp::Equal, rev)])
                    .and_then([TxnOp::put(fenced(id), format!("{value} {fence}"), None)]);
                if bounded(self.0.kv_client().txn(txn)).await?.succeeded() {
                    return Ok(stored);
                }
                if tokio::time::Instant::now() > deadline {
                    return Err(unavailable("the account kept changing".into()));
                }
            }
        }

        pub(crate) async fn read_fenced(&self, id: &str, fence: u64) -> Result<i64, ApiError> {
            self.fence(id, fence, None).await
        }

        pub(crate) async fn write_fenced(
            &self,
            id: &str,
            balance: i64,
            fence: u64,
        ) -> Result<(), ApiError> {
            self.fence(id, fence, Some(balance)).await.map(drop)
        }

        pub(crate) async fn account(&self, id: &str) -> Result<(i64, u64), ApiError> {
            let (balance, fence, _) = self.read(id).await?;
            Ok((balance, fence))
        }
    }
}

#[cfg(not(feature = "etcd"))]
pub(crate) async fn etcd_bank(_endpoints: &str) -> Result<Bank, String> {
    Err("--etcd needs tower-lock's `etcd` feature".to_owned())
}

/// Locks and balances in the etcd cluster at `endpoints` (comma-separated).
#[cfg(feature = "etcd")]
pub(crate) async fn etcd_bank(endpoints: &str) -> Result<Bank, String> {
    let list: Vec<String> = endpoints
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
        .collect();
    let locks = tower_lock::EtcdBackend::from_endpoints(&list)
        .map_err(|e| format!("bad --etcd endpoints: {e}"))?;
    let balances = EtcdStore::connect(&list).await?;
    // etcd may come up later: warn, serve, and answer 503 until it does.
    if balances.get("bank-start").await.is_err() {
        eprintln!("bank: warning: etcd at {endpoints} does not answer yet");
    }
    Ok(Bank {
        locks: SharedBackend::new(locks),
        balances: Balances::Etcd(balances),
        fenced: false,
        statements_computed: AtomicU64::new(0),
        exports: Exports::default(),
    })
}
