//! Where balances live: the store's operations, and memory.

use super::*;

impl Bank {
    /// [`Balances::write_fenced`], finding out whether a write that got no
    /// answer (the store went away mid-call) landed: the fence names this
    /// write, since no other deposit writes with it. Looked up until
    /// [`STORE_TIMEOUT`] has passed; only a store away for all of it leaves
    /// the outcome unknown (`503`).
    pub(crate) async fn write_fenced(
        &self,
        id: &str,
        balance: i64,
        fence: u64,
    ) -> Result<(), ApiError> {
        let err = match self.balances.write_fenced(id, balance, fence).await {
            Err(e) if e.code == "STORE_UNAVAILABLE" => e,
            done => return done,
        };
        #[cfg(any(feature = "redis", feature = "postgres", feature = "etcd"))]
        {
            let deadline = tokio::time::Instant::now() + STORE_TIMEOUT;
            while tokio::time::Instant::now() < deadline {
                match self.balances.account(id).await {
                    Ok((stored, seen)) if seen == fence && stored == balance => return Ok(()),
                    // Not written (and never will be: the call's connection is
                    // gone); another fence: someone newer used the account.
                    Ok(_) => return Err(err),
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            tracing::warn!("a fenced write's outcome is unknown: the store stayed away");
        }
        Err(err)
    }
}

/// A deposit refused by the store: a newer lock holder has read or written
/// the account since this deposit's lock was taken.
pub(crate) fn stale_fence() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "STALE_FENCE",
        "a deposit holding a newer lock on this account has used it since this one's lock \
         was taken (this deposit's lock was lost): nothing was written",
    )
}

/// One account in memory: its balance, and the highest fence a fenced
/// deposit has read or written it with.
#[derive(Default, Clone, Copy)]
pub(crate) struct Account {
    balance: i64,
    fence: u64,
    /// Exports of the account running now.
    running: i64,
}

/// Where balances are kept. Unknown accounts have balance 0 (and fence 0).
pub(crate) enum Balances {
    Memory(Mutex<HashMap<String, Account>>),
    #[cfg(feature = "redis")]
    Redis(RedisStore),
    #[cfg(feature = "postgres")]
    Postgres(postgres_store::Store),
    #[cfg(feature = "etcd")]
    Etcd(EtcdStore),
}

impl Balances {
    pub(crate) async fn get(&self, id: &str) -> Result<i64, ApiError> {
        match self {
            Balances::Memory(map) => Ok(memory(map).get(id).map_or(0, |a| a.balance)),
            #[cfg(feature = "redis")]
            Balances::Redis(store) => {
                let mut cmd = deadpool_redis::redis::cmd("GET");
                cmd.arg(redis_balance_key(id));
                redis_query::<Option<i64>>(store, cmd)
                    .await
                    .map(|b| b.unwrap_or(0))
            }
            #[cfg(feature = "postgres")]
            Balances::Postgres(store) => store.get(id).await,
            #[cfg(feature = "etcd")]
            Balances::Etcd(store) => store.get(id).await,
        }
    }

    pub(crate) async fn set(&self, id: &str, balance: i64) -> Result<(), ApiError> {
        match self {
            Balances::Memory(map) => {
                memory(map).entry(id.to_owned()).or_default().balance = balance;
                Ok(())
            }
            #[cfg(feature = "redis")]
            Balances::Redis(store) => {
                let mut cmd = deadpool_redis::redis::cmd("SET");
                cmd.arg(redis_balance_key(id)).arg(balance);
                redis_query::<()>(store, cmd).await
            }
            #[cfg(feature = "postgres")]
            Balances::Postgres(store) => store.set(id, balance).await,
            #[cfg(feature = "etcd")]
            Balances::Etcd(store) => store.set(id, balance).await,
        }
    }
}

impl Balances {
    /// Add `delta` to the number of exports of `id` running now (in every
    /// process sharing the store), atomically; the new number.
    pub(crate) async fn add_running(&self, id: &str, delta: i64) -> Result<i64, ApiError> {
        match self {
            Balances::Memory(map) => {
                let mut map = memory(map);
                let account = map.entry(id.to_owned()).or_default();
                account.running += delta;
                Ok(account.running)
            }
            #[cfg(feature = "redis")]
            Balances::Redis(store) => {
                let mut cmd = deadpool_redis::redis::cmd("INCRBY");
                cmd.arg(format!("bank:exporting:{id}")).arg(delta);
                redis_query::<i64>(store, cmd).await
            }
            #[cfg(feature = "postgres")]
            Balances::Postgres(store) => store.add_running(id, delta).await,
            #[cfg(feature = "etcd")]
            Balances::Etcd(store) => store.add_running(id, delta).await,
        }
    }

    /// The balance, for a deposit holding the lock with `fence`: refused if
    /// the account has seen a higher fence, else the fence is remembered (in
    /// one atomic step with the check).
    pub(crate) async fn read_fenced(&self, id: &str, fence: u64) -> Result<i64, ApiError> {
        match self {
            Balances::Memory(map) => memory_fenced(map, id, fence, |account| account.balance),
            #[cfg(feature = "redis")]
            Balances::Redis(store) => redis_fenced::read(store, id, fence).await,
            #[cfg(feature = "postgres")]
            Balances::Postgres(store) => store.read_fenced(id, fence).await,
            #[cfg(feature = "etcd")]
            Balances::Etcd(store) => store.read_fenced(id, fence).await,
        }
    }

    /// Write `balance` with `fence`: refused (nothing written) if the account
    /// has seen a higher fence, in one atomic step with the check.
    pub(crate) async fn write_fenced(
        &self,
        id: &str,
        balance: i64,
        fence: u64,
    ) -> Result<(), ApiError> {
        match self {
            Balances::Memory(map) => memory_fenced(map, id, fence, |account| {
                account.balance = balance;
            }),
            #[cfg(feature = "redis")]
            Balances::Redis(store) => redis_fenced::write(store, id, balance, fence).await,
            #[cfg(feature = "postgres")]
            Balances::Postgres(store) => store.write_fenced(id, balance, fence).await,
            #[cfg(feature = "etcd")]
            Balances::Etcd(store) => store.write_fenced(id, balance, fence).await,
        }
    }

    /// Balance and highest accepted fence of an account (fenced mode).
    pub(crate) async fn account(&self, id: &str) -> Result<(i64, u64), ApiError> {
        match self {
            Balances::Memory(map) => {
                let a = memory(map).get(id).copied().unwrap_or_default();
                Ok((a.balance, a.fence))
            }
            #[cfg(feature = "redis")]
            Balances::Redis(store) => redis_fenced::account(store, id).await,
            #[cfg(feature = "postgres")]
            Balances::Postgres(store) => store.account(id).await,
            #[cfg(feature = "etcd")]
            Balances::Etcd(store) => store.account(id).await,
        }
    }
}

/// The in-memory account `id` for a deposit holding `fence`, under the map's
/// lock (so the check and `f` are one step): refused if the account has seen
/// a higher fence, else the fence is remembered and `f` runs.
pub(crate) fn memory_fenced<T>(
    map: &Mutex<HashMap<String, Account>>,
    id: &str,
    fence: u64,
    f: impl FnOnce(&mut Account) -> T,
) -> Result<T, ApiError> {
    let mut map = memory(map);
    let account = map.entry(id.to_owned()).or_default();
    if account.fence > fence {
        return Err(stale_fence());
    }
    account.fence = fence;
    Ok(f(account))
}

pub(crate) fn memory(
    map: &Mutex<HashMap<String, Account>>,
) -> std::sync::MutexGuard<'_, HashMap<String, Account>> {
    map.lock().unwrap_or_else(|e| e.into_inner())
}
