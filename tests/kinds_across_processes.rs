//! Shared holds and permits across processes on one Redis and on one
//! PostgreSQL (issue 23): never more than `n` permit holders, never a writer
//! beside a reader, and a writer queued behind a stream of readers goes
//! before every reader that came after it. The other processes are this
//! test binary run again, with their role and store in the environment;
//! what happens inside the critical sections is counted atomically in the
//! server itself (a Lua script on Redis, a function serialised by an
//! advisory lock on PostgreSQL), so every process sees one count.
#![cfg(any(feature = "redis", feature = "postgres"))]

mod common;

use std::time::Duration;

use tower_lock::backend::{AcquireRequest, Holder};
use tower_lock::{LockKey, LockKind, SharedBackend};

const ROLE: &str = "TOWER_LOCK_TEST_KINDS_ROLE";
const URL: &str = "TOWER_LOCK_TEST_KINDS_URL";
const STORE: &str = "TOWER_LOCK_TEST_KINDS_STORE";
const ROUNDS: usize = 12;
const PERMITS: u32 = 2;

/// Where the processes lock and count: `redis` or `postgres`.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    #[cfg(feature = "redis")]
    Redis,
    #[cfg(feature = "postgres")]
    Postgres,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            #[cfg(feature = "redis")]
            Kind::Redis => "redis",
            #[cfg(feature = "postgres")]
            Kind::Postgres => "postgres",
        }
    }

    fn from_name(name: &str) -> Kind {
        match name {
            #[cfg(feature = "redis")]
            "redis" => Kind::Redis,
            #[cfg(feature = "postgres")]
            "postgres" => Kind::Postgres,
            other => panic!("unknown store {other}"),
        }
    }

    fn backend(self, url: &str) -> SharedBackend {
        match self {
            #[cfg(feature = "redis")]
            Kind::Redis => SharedBackend::new(tower_lock::RedisBackend::from_url(url).unwrap()),
            #[cfg(feature = "postgres")]
            Kind::Postgres => SharedBackend::new(
                tower_lock::backend::postgres::PostgresBackend::from_url(url).unwrap(),
            ),
        }
    }
}

/// A server of `Kind` for one test, with its URL.
enum Server {
    #[cfg(feature = "redis")]
    Redis(common::redis_server::RedisServer),
    #[cfg(feature = "postgres")]
    Postgres(common::pg_server::PgServer),
}

impl Server {
    async fn start(kind: Kind) -> Server {
        match kind {
            #[cfg(feature = "redis")]
            Kind::Redis => Server::Redis(common::redis_server::RedisServer::start()),
            #[cfg(feature = "postgres")]
            Kind::Postgres => {
                let server = common::pg_server::PgServer::start();
                // The lock tables and the counters' functions, before any
                // child locks or enters.
                tower_lock::backend::postgres::PostgresBackend::from_url(&server.url())
                    .unwrap()
                    .migrate()
                    .await
                    .unwrap();
                Counters::connect(kind, &server.url()).await.setup().await;
                Server::Postgres(server)
            }
        }
    }

    fn url(&self) -> String {
        match self {
            #[cfg(feature = "redis")]
            Server::Redis(s) => s.url(),
            #[cfg(feature = "postgres")]
            Server::Postgres(s) => s.url(),
        }
    }
}

/// Enter a critical section as `who` (`r` reader, `w` writer, `p` permit
/// holder): counts it in, and records in `bad` any entry beside what it
/// must not meet (a writer beside anyone, a reader beside a writer, more
/// than `PERMITS` permit holders); `max:<who>` keeps the largest count seen.
#[cfg(feature = "redis")]
const ENTER_LUA: &str = r"
local who = ARGV[1]
local n = redis.call('INCR', 'in:' .. who)
if n > tonumber(redis.call('GET', 'max:' .. who) or '0') then
  redis.call('SET', 'max:' .. who, n)
end
local r = tonumber(redis.call('GET', 'in:r') or '0')
local w = tonumber(redis.call('GET', 'in:w') or '0')
if (who == 'w' and (w > 1 or r > 0)) or (who == 'r' and w > 0)
  or (who == 'p' and n > tonumber(ARGV[2])) then
  redis.call('INCR', 'bad')
end
return n
";

/// The same on PostgreSQL: named counters in a table, `enter` serialised by
/// a transaction-scoped advisory lock (so its reads of the other counters
/// are never stale), and a list of fences.
#[cfg(feature = "postgres")]
const SETUP_SQL: &str = r"
CREATE TABLE IF NOT EXISTS kinds_counters (name text PRIMARY KEY, n bigint NOT NULL);
CREATE TABLE IF NOT EXISTS kinds_list (name text NOT NULL, value bigint NOT NULL);
CREATE OR REPLACE FUNCTION kinds_add(p_name text, p_by bigint) RETURNS bigint
LANGUAGE sql AS $$
  INSERT INTO kinds_counters (name, n) VALUES (p_name, p_by)
    ON CONFLICT (name) DO UPDATE SET n = kinds_counters.n + p_by
    RETURNING n
$$;
CREATE OR REPLACE FUNCTION kinds_get(p_name text) RETURNS bigint
LANGUAGE sql AS $$ SELECT coalesce((SELECT n FROM kinds_counters WHERE name = p_name), 0) $$;
CREATE OR REPLACE FUNCTION kinds_enter(who text, permits bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE n bigint; r bigint; w bigint;
BEGIN
  PERFORM pg_advisory_xact_lock(7);
  n := kinds_add('in:' || who, 1);
  IF n > kinds_get('max:' || who) THEN
    PERFORM kinds_add('max:' || who, n - kinds_get('max:' || who));
  END IF;
  r := kinds_get('in:r');
  w := kinds_get('in:w');
  IF (who = 'w' AND (w > 1 OR r > 0)) OR (who = 'r' AND w > 0) OR (who = 'p' AND n > permits) THEN
    PERFORM kinds_add('bad', 1);
  END IF;
  RETURN n;
END
$$;
";

/// A connection to the counters.
enum Counters {
    #[cfg(feature = "redis")]
    Redis(deadpool_redis::redis::aio::MultiplexedConnection),
    #[cfg(feature = "postgres")]
    Postgres(tokio_postgres::Client),
}

impl Counters {
    async fn connect(kind: Kind, url: &str) -> Counters {
        match kind {
            #[cfg(feature = "redis")]
            Kind::Redis => Counters::Redis(
                deadpool_redis::redis::Client::open(url)
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap(),
            ),
            #[cfg(feature = "postgres")]
            Kind::Postgres => {
                let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(connection);
                Counters::Postgres(client)
            }
        }
    }

    #[cfg(feature = "postgres")]
    async fn setup(&mut self) {
        if let Counters::Postgres(client) = self {
            client.batch_execute(SETUP_SQL).await.unwrap();
        }
    }

    async fn enter(&mut self, who: &str) {
        match self {
            #[cfg(feature = "redis")]
            Counters::Redis(conn) => {
                let _: i64 = deadpool_redis::redis::Script::new(ENTER_LUA)
                    .arg(who)
                    .arg(PERMITS)
                    .invoke_async(conn)
                    .await
                    .unwrap();
            }
            #[cfg(feature = "postgres")]
            Counters::Postgres(client) => {
                client
                    .execute("SELECT kinds_enter($1, $2)", &[&who, &i64::from(PERMITS)])
                    .await
                    .unwrap();
            }
        }
    }

    async fn add(&mut self, name: &str, by: i64) {
        match self {
            #[cfg(feature = "redis")]
            Counters::Redis(conn) => {
                let _: i64 = deadpool_redis::redis::cmd("INCRBY")
                    .arg(name)
                    .arg(by)
                    .query_async(conn)
                    .await
                    .unwrap();
            }
            #[cfg(feature = "postgres")]
            Counters::Postgres(client) => {
                client
                    .execute("SELECT kinds_add($1, $2)", &[&name, &by])
                    .await
                    .unwrap();
            }
        }
    }

    async fn get(&mut self, name: &str) -> i64 {
        match self {
            #[cfg(feature = "redis")]
            Counters::Redis(conn) => {
                let v: Option<i64> = deadpool_redis::redis::cmd("GET")
                    .arg(name)
                    .query_async(conn)
                    .await
                    .unwrap();
                v.unwrap_or(0)
            }
            #[cfg(feature = "postgres")]
            Counters::Postgres(client) => client
                .query_one("SELECT kinds_get($1)", &[&name])
                .await
                .unwrap()
                .get(0),
        }
    }

    async fn push(&mut self, name: &str, value: u64) {
        match self {
            #[cfg(feature = "redis")]
            Counters::Redis(conn) => {
                let _: i64 = deadpool_redis::redis::cmd("RPUSH")
                    .arg(name)
                    .arg(value)
                    .query_async(conn)
                    .await
                    .unwrap();
            }
            #[cfg(feature = "postgres")]
            Counters::Postgres(client) => {
                let value = i64::try_from(value).unwrap();
                client
                    .execute(
                        "INSERT INTO kinds_list (name, value) VALUES ($1, $2)",
                        &[&name, &value],
                    )
                    .await
                    .unwrap();
            }
        }
    }

    async fn list(&mut self, name: &str) -> Vec<u64> {
        match self {
            #[cfg(feature = "redis")]
            Counters::Redis(conn) => deadpool_redis::redis::cmd("LRANGE")
                .arg(name)
                .arg(0)
                .arg(-1)
                .query_async(conn)
                .await
                .unwrap(),
            #[cfg(feature = "postgres")]
            Counters::Postgres(client) => client
                .query("SELECT value FROM kinds_list WHERE name = $1", &[&name])
                .await
                .unwrap()
                .iter()
                .map(|row| u64::try_from(row.get::<_, i64>(0)).unwrap())
                .collect(),
        }
    }
}

fn key() -> LockKey {
    LockKey::global("kinds-across-processes").unwrap()
}

/// One critical section of kind `kind` held as `owner`, counted as `who`;
/// the fence it was granted.
async fn hold_once(
    backend: &SharedBackend,
    counters: &mut Counters,
    owner: &str,
    kind: LockKind,
    who: &str,
    inside: Duration,
) -> u64 {
    let req = AcquireRequest::new(
        key(),
        owner,
        Duration::from_secs(30),
        Duration::from_secs(60),
    )
    .unwrap()
    .with_kind(kind)
    .unwrap();
    let lease = backend.acquire(&req).await.expect("acquired");
    counters.enter(who).await;
    tokio::time::sleep(inside).await;
    counters.add(&format!("in:{who}"), -1).await;
    backend
        .release(&key(), Holder::new(owner, lease.fence))
        .await
        .expect("released");
    lease.fence
}

/// A child process: its role's rounds, then `DONE`. Does nothing when the
/// test harness runs it on its own.
#[tokio::test]
async fn child() {
    let (Ok(role), Ok(url), Ok(store)) = (
        std::env::var(ROLE),
        std::env::var(URL),
        std::env::var(STORE),
    ) else {
        return;
    };
    let store = Kind::from_name(&store);
    let backend = store.backend(&url);
    let mut counters = Counters::connect(store, &url).await;
    let me = std::process::id();
    let rounds = if role == "readers" {
        4 * ROUNDS
    } else {
        ROUNDS
    };
    for i in 0..rounds {
        let owner = format!("{role}-{me}-{i}");
        let c = &mut counters;
        match role.as_str() {
            "permits" => {
                let kind = LockKind::Permits(PERMITS);
                hold_once(&backend, c, &owner, kind, "p", Duration::from_millis(20)).await;
            }
            // Mostly readers, a writer every third round.
            "mixed" if i % 3 == 2 => {
                let kind = LockKind::Exclusive;
                hold_once(&backend, c, &owner, kind, "w", Duration::from_millis(10)).await;
            }
            "mixed" => {
                let kind = LockKind::Shared;
                hold_once(&backend, c, &owner, kind, "r", Duration::from_millis(20)).await;
            }
            // A stream of overlapping readers; each records its fence once
            // the parent says a writer is queued.
            "readers" => {
                let late = c.get("writer-queued").await == 1;
                if late {
                    c.add("waiting-late", 1).await;
                }
                let kind = LockKind::Shared;
                let fence =
                    hold_once(&backend, c, &owner, kind, "r", Duration::from_millis(40)).await;
                if late {
                    c.push("late-readers", fence).await;
                }
            }
            other => panic!("unknown role {other}"),
        }
    }
    println!("DONE");
}

fn spawn_child(store: Kind, url: &str, role: &str) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(URL, url)
        .env(STORE, store.name())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn a child process")
}

async fn finished(child: tokio::process::Child) {
    let out = child.wait_with_output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("DONE"), "{stdout}");
}

/// Three processes take `Permits(2)` over and over: two hold at once at
/// times, never three.
async fn never_more_than_n_permit_holders_across_processes(store: Kind) {
    let server = Server::start(store).await;
    let url = server.url();
    let children: Vec<_> = (0..3)
        .map(|_| spawn_child(store, &url, "permits"))
        .collect();
    for child in children {
        finished(child).await;
    }
    let mut counters = Counters::connect(store, &url).await;
    assert_eq!(counters.get("bad").await, 0, "more than {PERMITS} holders");
    assert_eq!(counters.get("max:p").await, i64::from(PERMITS));
    assert_eq!(store.backend(&url).status(&key()).await.unwrap(), None);
}

/// Three processes mix readers and writers: readers hold together, a writer
/// never beside anyone.
async fn never_a_writer_beside_a_reader_across_processes(store: Kind) {
    let server = Server::start(store).await;
    let url = server.url();
    let children: Vec<_> = (0..3).map(|_| spawn_child(store, &url, "mixed")).collect();
    for child in children {
        finished(child).await;
    }
    let mut counters = Counters::connect(store, &url).await;
    assert_eq!(counters.get("bad").await, 0, "a writer met someone");
    assert_eq!(counters.get("max:w").await, 1);
    assert!(counters.get("max:r").await >= 2, "readers never overlapped");
}

/// Two processes stream overlapping readers; a writer in a third queues
/// among them. Every reader that asked after the writer was queued is
/// granted after it (a fence above the writer's): the writer waits only for
/// the readers holding when it queued, not for the stream.
async fn a_writer_behind_a_stream_of_readers_goes_before_later_readers(store: Kind) {
    let server = Server::start(store).await;
    let url = server.url();
    let readers: Vec<_> = (0..2)
        .map(|_| spawn_child(store, &url, "readers"))
        .collect();
    let backend = store.backend(&url);
    let mut counters = Counters::connect(store, &url).await;
    // Wait until the readers stream, then hold a read of our own, so that
    // the writer surely finds readers holding.
    while counters.get("max:r").await < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let anchor = AcquireRequest::new(
        key(),
        "anchor",
        Duration::from_secs(30),
        Duration::from_secs(60),
    )
    .unwrap()
    .with_kind(LockKind::Shared)
    .unwrap();
    let anchored = backend.acquire(&anchor).await.unwrap();
    let writer = {
        let backend = backend.clone();
        tokio::spawn(async move {
            let req = AcquireRequest::new(
                key(),
                "writer",
                Duration::from_secs(30),
                Duration::from_secs(60),
            )
            .unwrap();
            backend.acquire(&req).await.expect("the writer is served")
        })
    };
    // Queued (state, read through the status), then the readers are told.
    loop {
        let queued = backend
            .status(&key())
            .await
            .unwrap()
            .is_some_and(|s| s.waiters >= 1 && s.kind == LockKind::Shared);
        if queued {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    counters.add("writer-queued", 1).await;
    // Let a later reader come and queue behind the writer, then let go. A
    // reader that read the flag before it was set but asked after the
    // writer queued waits behind the writer too (a second waiter): with both
    // streams held up that way, no reader would ever see the flag, so that
    // also counts as "a reader came after the writer".
    loop {
        let late = counters.get("waiting-late").await >= 1;
        let behind = backend
            .status(&key())
            .await
            .unwrap()
            .is_some_and(|s| s.waiters >= 2);
        if late || behind {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    backend
        .release(&key(), Holder::new("anchor", anchored.fence))
        .await
        .unwrap();
    let lease = writer.await.unwrap();
    backend
        .release(&key(), Holder::new("writer", lease.fence))
        .await
        .unwrap();
    for child in readers {
        finished(child).await;
    }
    let late = counters.list("late-readers").await;
    assert!(!late.is_empty(), "no reader came after the writer");
    assert!(
        late.iter().all(|&f| f > lease.fence),
        "a reader that came after the writer was let in before it: writer {} / {late:?}",
        lease.fence
    );
}

/// Each scenario on each store this build has (not in a child process).
macro_rules! on_stores {
    ($($store:ident: $feature:literal => $kind:expr;)*) => {$(
        #[cfg(feature = $feature)]
        mod $store {
            use super::*;

            fn parent() -> bool {
                std::env::var(ROLE).is_err()
            }

            #[tokio::test]
            async fn never_more_than_n_permit_holders() {
                if parent() {
                    never_more_than_n_permit_holders_across_processes($kind).await;
                }
            }

            #[tokio::test]
            async fn never_a_writer_beside_a_reader() {
                if parent() {
                    never_a_writer_beside_a_reader_across_processes($kind).await;
                }
            }

            #[tokio::test]
            async fn a_writer_behind_a_stream_of_readers_goes_before_later_readers() {
                if parent() {
                    super::a_writer_behind_a_stream_of_readers_goes_before_later_readers($kind)
                        .await;
                }
            }
        }
    )*};
}

on_stores! {
    redis: "redis" => Kind::Redis;
    postgres: "postgres" => Kind::Postgres;
}
