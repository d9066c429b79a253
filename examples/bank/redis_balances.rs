//! Balances in Redis or a Redis Cluster.

use super::*;

/// Fenced balances in Redis: a hash `bank:fenced:{id}` with `balance` and
/// `fence`, each operation one script (the check and the change atomic).
#[cfg(feature = "redis")]
pub(crate) mod redis_fenced {
    use std::sync::LazyLock;

    use deadpool_redis::redis::Script;

    use super::{ApiError, RedisStore, redis_query_script, stale_fence};

    static READ: LazyLock<Script> = LazyLock::new(|| {
        Script::new(
            "local f = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0') \
             if f > tonumber(ARGV[1]) then return {-1, ''} end \
             redis.call('HSET', KEYS[1], 'fence', ARGV[1]) \
             return {1, redis.call('HGET', KEYS[1], 'balance') or '0'}",
        )
    });
    static WRITE: LazyLock<Script> = LazyLock::new(|| {
        Script::new(
            "local f = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0') \
             if f > tonumber(ARGV[2]) then return -1 end \
             redis.call('HSET', KEYS[1], 'balance', ARGV[1], 'fence', ARGV[2]) \
             return 1",
        )
    });

    pub(crate) fn key(id: &str) -> String {
        format!("bank:fenced:{id}")
    }

    pub(crate) async fn read(store: &RedisStore, id: &str, fence: u64) -> Result<i64, ApiError> {
        let mut inv = READ.prepare_invoke();
        inv.key(key(id)).arg(fence);
        let (code, balance): (i64, String) = redis_query_script(store, inv).await?;
        if code < 0 {
            return Err(stale_fence());
        }
        balance
            .parse()
            .map_err(|_| ApiError::store("a stored balance is not a number"))
    }

    pub(crate) async fn write(
        store: &RedisStore,
        id: &str,
        balance: i64,
        fence: u64,
    ) -> Result<(), ApiError> {
        let mut inv = WRITE.prepare_invoke();
        inv.key(key(id)).arg(balance).arg(fence);
        match redis_query_script::<i64>(store, inv).await? {
            1 => Ok(()),
            _ => Err(stale_fence()),
        }
    }

    pub(crate) async fn account(store: &RedisStore, id: &str) -> Result<(i64, u64), ApiError> {
        let mut cmd = deadpool_redis::redis::cmd("HMGET");
        cmd.arg(key(id)).arg("balance").arg("fence");
        let (balance, fence): (Option<i64>, Option<u64>) = super::redis_query(store, cmd).await?;
        Ok((balance.unwrap_or(0), fence.unwrap_or(0)))
    }
}

#[cfg(feature = "redis")]
pub(crate) fn redis_balance_key(id: &str) -> String {
    format!("bank:balance:{id}")
}

/// Run one command on a pooled connection, within [`STORE_TIMEOUT`].
#[cfg(feature = "redis")]
pub(crate) async fn redis_query<T: deadpool_redis::redis::FromRedisValue>(
    store: &RedisStore,
    cmd: deadpool_redis::redis::Cmd,
) -> Result<T, ApiError> {
    redis_run(store, async |conn| cmd.query_async::<T>(conn).await).await
}

/// Run one script on a pooled connection, within [`STORE_TIMEOUT`].
#[cfg(feature = "redis")]
pub(crate) async fn redis_query_script<T: deadpool_redis::redis::FromRedisValue>(
    store: &RedisStore,
    invocation: deadpool_redis::redis::ScriptInvocation<'_>,
) -> Result<T, ApiError> {
    redis_run(store, async |conn| invocation.invoke_async::<T>(conn).await).await
}

#[cfg(feature = "redis")]
pub(crate) async fn redis_run<T>(
    store: &RedisStore,
    f: impl AsyncFnOnce(&mut StoreConn) -> deadpool_redis::redis::RedisResult<T>,
) -> Result<T, ApiError> {
    let attempt = async {
        let mut conn = store.conn().await?;
        f(&mut conn).await.map_err(|e| e.to_string())
    };
    let result = match tokio::time::timeout(STORE_TIMEOUT, attempt).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {STORE_TIMEOUT:?}")),
    };
    result.map_err(|detail| {
        // Details go to the log, not to clients.
        tracing::warn!(error = %detail, "balance store error");
        ApiError::store("the balance store is unavailable")
    })
}

#[cfg(not(feature = "redis"))]
pub(crate) async fn redis_bank(_url: &str) -> Result<Bank, String> {
    Err("--redis needs tower-lock's `redis` feature".to_owned())
}

/// Locks and balances in the Redis at `url`.
#[cfg(feature = "redis")]
pub(crate) async fn redis_bank(url: &str) -> Result<Bank, String> {
    use deadpool_redis::{Config, Runtime};

    let locks = redis_lock_backend(url)?;
    // Balances get a pool of their own, so lock waiters can never starve the
    // holder's balance read/write of connections.
    let balances = RedisStore::Pool(
        Config::from_url(url)
            .create_pool(Some(Runtime::Tokio1))
            .map_err(|e| format!("bad --redis URL: {e}"))?,
    );
    // Redis may come up later: warn, serve, and answer 503 until it does.
    let mut ping = deadpool_redis::redis::cmd("PING");
    ping.arg("bank");
    if redis_query::<String>(&balances, ping).await.is_err() {
        eprintln!("bank: warning: Redis at {url} does not answer yet");
    }
    Ok(Bank {
        locks,
        balances: Balances::Redis(balances),
        fenced: false,
        statements_computed: AtomicU64::new(0),
        exports: Exports::default(),
    })
}

/// Where Redis balances live: a server's pool, or a cluster.
#[cfg(feature = "redis")]
pub(crate) enum RedisStore {
    Pool(deadpool_redis::Pool),
    #[cfg(feature = "redis-cluster")]
    Cluster(Box<cluster::Store>),
}

/// A connection to the balances' Redis.
#[cfg(feature = "redis")]
pub(crate) enum StoreConn {
    Pool(deadpool_redis::Connection),
    #[cfg(feature = "redis-cluster")]
    Cluster(deadpool_redis::redis::cluster_async::ClusterConnection),
}

#[cfg(feature = "redis")]
impl RedisStore {
    pub(crate) async fn conn(&self) -> Result<StoreConn, String> {
        match self {
            RedisStore::Pool(pool) => pool
                .get()
                .await
                .map(StoreConn::Pool)
                .map_err(|e| e.to_string()),
            #[cfg(feature = "redis-cluster")]
            RedisStore::Cluster(store) => store.conn().await.map(StoreConn::Cluster),
        }
    }
}

#[cfg(feature = "redis")]
impl deadpool_redis::redis::aio::ConnectionLike for StoreConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a deadpool_redis::redis::Cmd,
    ) -> deadpool_redis::redis::RedisFuture<'a, deadpool_redis::redis::Value> {
        match self {
            StoreConn::Pool(c) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            StoreConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a deadpool_redis::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> deadpool_redis::redis::RedisFuture<'a, Vec<deadpool_redis::redis::Value>> {
        match self {
            StoreConn::Pool(c) => c.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "redis-cluster")]
            StoreConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            StoreConn::Pool(c) => c.get_db(),
            #[cfg(feature = "redis-cluster")]
            StoreConn::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(not(feature = "redis-cluster"))]
pub(crate) async fn redis_cluster_bank(_urls: &str) -> Result<Bank, String> {
    Err("--redis-cluster needs tower-lock's `redis-cluster` feature".to_owned())
}

/// Locks and balances in the Redis Cluster some of whose nodes `urls`
/// (comma-separated) names.
#[cfg(feature = "redis-cluster")]
pub(crate) async fn redis_cluster_bank(urls: &str) -> Result<Bank, String> {
    let nodes: Vec<String> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    let locks = tower_lock::RedisBackend::from_cluster_urls(nodes.iter().map(String::as_str))
        .map_err(|e| format!("bad --redis-cluster URLs: {e}"))?;
    let store = RedisStore::Cluster(Box::new(cluster::Store::new(nodes)?));
    // The cluster may come up later: warn, serve, and answer 503 until it does.
    let mut ping = deadpool_redis::redis::cmd("PING");
    ping.arg("bank");
    if redis_query::<String>(&store, ping).await.is_err() {
        eprintln!("bank: warning: the Redis Cluster does not answer yet");
    }
    Ok(Bank {
        locks: SharedBackend::new(locks),
        balances: Balances::Redis(store),
        fenced: false,
        statements_computed: AtomicU64::new(0),
        exports: Exports::default(),
    })
}

/// Balances in a Redis Cluster: one connection (a multiplexed one per
/// node), opened on first use and again after a failed attempt.
#[cfg(feature = "redis-cluster")]
pub(crate) mod cluster {
    use deadpool_redis::redis::cluster::ClusterClient;
    use deadpool_redis::redis::cluster_async::ClusterConnection;
    use tokio::sync::OnceCell;

    pub(crate) struct Store {
        client: ClusterClient,
        conn: OnceCell<ClusterConnection>,
    }

    impl Store {
        pub(super) fn new(nodes: Vec<String>) -> Result<Self, String> {
            let client = ClusterClient::builder(nodes)
                // STORE_TIMEOUT bounds every call; retries just have to be
                // quick enough to fit in it during a failover.
                .min_retry_wait(2)
                .max_retry_wait(100)
                .build()
                .map_err(|e| format!("bad --redis-cluster URLs: {e}"))?;
            Ok(Store {
                client,
                conn: OnceCell::new(),
            })
        }

        pub(super) async fn conn(&self) -> Result<ClusterConnection, String> {
            self.conn
                .get_or_try_init(|| self.client.get_async_connection())
                .await
                .cloned()
                .map_err(|e| e.to_string())
        }
    }
}

/// The Redis lock backend for `url`, with a pool of its own.
#[cfg(feature = "redis")]
pub(crate) fn redis_lock_backend(url: &str) -> Result<SharedBackend, String> {
    let backend =
        tower_lock::RedisBackend::from_url(url).map_err(|e| format!("bad --redis URL: {e}"))?;
    Ok(SharedBackend::new(backend))
}
