//! Shared holds and permits across processes on one Redis (issue 23): never
//! more than `n` permit holders, never a writer beside a reader, and a
//! writer queued behind a stream of readers goes before every reader that
//! came after it. The other processes are this test binary run again, with
//! their role in the environment; what happens inside the critical sections
//! is counted atomically in Redis itself, so every process sees one count.
//! Also: the holds' expiry index stays the holds' own.
#![cfg(feature = "redis")]

mod common;

use std::time::Duration;

use common::redis_server::RedisServer;
use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{Client, Script};
use tower_lock::backend::{AcquireRequest, Holder};
use tower_lock::{LockKey, LockKind, RedisBackend, SharedBackend};

const ROLE: &str = "TOWER_LOCK_TEST_KINDS_ROLE";
const URL: &str = "TOWER_LOCK_TEST_KINDS_URL";
const ROUNDS: usize = 12;
const PERMITS: u32 = 2;

/// Enter a critical section as `who` (`r` reader, `w` writer, `p` permit
/// holder): counts it in, and records in `bad` any entry beside what it
/// must not meet (a writer beside anyone, a reader beside a writer, more
/// than `PERMITS` permit holders); `max:<who>` keeps the largest count seen.
const ENTER: &str = r"
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

fn key() -> LockKey {
    LockKey::global("kinds-across-processes").unwrap()
}

async fn counters(url: &str) -> MultiplexedConnection {
    Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn get(conn: &mut MultiplexedConnection, name: &str) -> i64 {
    let v: Option<i64> = deadpool_redis::redis::cmd("GET")
        .arg(name)
        .query_async(conn)
        .await
        .unwrap();
    v.unwrap_or(0)
}

/// One critical section of kind `kind` held as `owner`, counted as `who`;
/// the fence it was granted.
async fn hold_once(
    backend: &SharedBackend,
    conn: &mut MultiplexedConnection,
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
    let _: i64 = Script::new(ENTER)
        .arg(who)
        .arg(PERMITS)
        .invoke_async(conn)
        .await
        .unwrap();
    tokio::time::sleep(inside).await;
    let _: i64 = deadpool_redis::redis::cmd("DECR")
        .arg(format!("in:{who}"))
        .query_async(conn)
        .await
        .unwrap();
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
    let (Ok(role), Ok(url)) = (std::env::var(ROLE), std::env::var(URL)) else {
        return;
    };
    let backend = SharedBackend::new(RedisBackend::from_url(&url).unwrap());
    let mut conn = counters(&url).await;
    let me = std::process::id();
    let rounds = if role == "readers" {
        4 * ROUNDS
    } else {
        ROUNDS
    };
    for i in 0..rounds {
        let owner = format!("{role}-{me}-{i}");
        match role.as_str() {
            "permits" => {
                let kind = LockKind::Permits(PERMITS);
                hold_once(
                    &backend,
                    &mut conn,
                    &owner,
                    kind,
                    "p",
                    Duration::from_millis(20),
                )
                .await;
            }
            // Mostly readers, a writer every third round.
            "mixed" if i % 3 == 2 => {
                let kind = LockKind::Exclusive;
                hold_once(
                    &backend,
                    &mut conn,
                    &owner,
                    kind,
                    "w",
                    Duration::from_millis(10),
                )
                .await;
            }
            "mixed" => {
                let kind = LockKind::Shared;
                hold_once(
                    &backend,
                    &mut conn,
                    &owner,
                    kind,
                    "r",
                    Duration::from_millis(20),
                )
                .await;
            }
            // A stream of overlapping readers; each records its fence once
            // the parent says a writer is queued.
            "readers" => {
                let late = get(&mut conn, "writer-queued").await == 1;
                if late {
                    let _: i64 = deadpool_redis::redis::cmd("INCR")
                        .arg("waiting-late")
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
                let kind = LockKind::Shared;
                let fence = hold_once(
                    &backend,
                    &mut conn,
                    &owner,
                    kind,
                    "r",
                    Duration::from_millis(40),
                )
                .await;
                if late {
                    let _: i64 = deadpool_redis::redis::cmd("RPUSH")
                        .arg("late-readers")
                        .arg(fence)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
            }
            other => panic!("unknown role {other}"),
        }
    }
    println!("DONE");
}

fn spawn_child(url: &str, role: &str) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(URL, url)
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
#[tokio::test]
async fn never_more_than_n_permit_holders_across_processes() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let server = RedisServer::start();
    let children: Vec<_> = (0..3)
        .map(|_| spawn_child(&server.url(), "permits"))
        .collect();
    for child in children {
        finished(child).await;
    }
    let mut conn = counters(&server.url()).await;
    assert_eq!(
        get(&mut conn, "bad").await,
        0,
        "more than {PERMITS} holders"
    );
    assert_eq!(get(&mut conn, "max:p").await, i64::from(PERMITS));
    let backend = RedisBackend::from_url(&server.url()).unwrap();
    use tower_lock::backend::LockBackend;
    assert_eq!(backend.status(&key()).await.unwrap(), None);
}

/// Three processes mix readers and writers: readers hold together, a writer
/// never beside anyone.
#[tokio::test]
async fn never_a_writer_beside_a_reader_across_processes() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let server = RedisServer::start();
    let children: Vec<_> = (0..3)
        .map(|_| spawn_child(&server.url(), "mixed"))
        .collect();
    for child in children {
        finished(child).await;
    }
    let mut conn = counters(&server.url()).await;
    assert_eq!(get(&mut conn, "bad").await, 0, "a writer met someone");
    assert_eq!(get(&mut conn, "max:w").await, 1);
    assert!(
        get(&mut conn, "max:r").await >= 2,
        "readers never overlapped"
    );
}

/// Two processes stream overlapping readers; a writer in a third queues
/// among them. Every reader that asked after the writer was queued is
/// granted after it (a fence above the writer's): the writer waits only for
/// the readers holding when it queued, not for the stream.
#[tokio::test]
async fn a_writer_behind_a_stream_of_readers_goes_before_later_readers() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let server = RedisServer::start();
    let url = server.url();
    let readers: Vec<_> = (0..2).map(|_| spawn_child(&url, "readers")).collect();
    let backend = SharedBackend::new(RedisBackend::from_url(&url).unwrap());
    let mut conn = counters(&url).await;
    // Wait until the readers stream, then hold a read of our own, so that
    // the writer surely finds readers holding.
    while get(&mut conn, "max:r").await < 1 {
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
    let _: () = deadpool_redis::redis::cmd("SET")
        .arg("writer-queued")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    // Let later readers come and queue behind the writer, then let go.
    while get(&mut conn, "waiting-late").await < 1 {
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
    let late: Vec<u64> = deadpool_redis::redis::cmd("LRANGE")
        .arg("late-readers")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!late.is_empty(), "no reader came after the writer");
    assert!(
        late.iter().all(|&f| f > lease.fence),
        "a reader that came after the writer was let in before it: writer {} / {late:?}",
        lease.fence
    );
}

/// The holds' expiry index (`{E}:he`: each hold's fence scored by its
/// expiry, beside the holds' hash `{E}:h`) follows the holds as they are
/// taken, extended, run out and released, and both keys go with the last
/// hold: nothing of a shared key outlives its holds.
#[tokio::test]
async fn kinds_expiry_index_follows_the_holds_and_goes_with_the_last() {
    use tower_lock::backend::LockBackend;
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let server = RedisServer::start();
    let backend = RedisBackend::from_url(&server.url()).unwrap();
    let key = LockKey::global("index").unwrap();
    let (hash, index) = ("lock:{g:index}:h", "lock:{g:index}:he");
    let shared = |owner: &str, ttl: Duration| {
        AcquireRequest::new(key.clone(), owner, ttl, Duration::ZERO)
            .unwrap()
            .with_kind(LockKind::Shared)
            .unwrap()
    };
    let long = Duration::from_secs(30);
    let a = backend.acquire(&shared("a", long)).await.unwrap();
    let short = backend
        .acquire(&shared("short", Duration::from_millis(300)))
        .await
        .unwrap();
    let b = backend.acquire(&shared("b", long)).await.unwrap();
    assert_eq!(server.cmd(&["ZCARD", index]), "3");
    // The kind, then per hold its value and its acquisition's index entry.
    assert_eq!(server.cmd(&["HLEN", hash]), "7");

    let score = |fence: u64| -> u64 {
        let s = server.cmd(&["ZSCORE", index, &fence.to_string()]);
        s.parse()
            .unwrap_or_else(|_| panic!("no expiry for {fence}: {s}"))
    };
    let before = score(b.fence);
    backend
        .extend(&key, Holder::new("b", b.fence), Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        score(b.fence) >= before + 29_000,
        "the extension did not move b's expiry"
    );

    // Let the short hold's server-side TTL run out (that wait is the point):
    // the next script that looks drops it from both keys.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let c = backend.acquire(&shared("c", long)).await.unwrap();
    assert_eq!(server.cmd(&["ZCARD", index]), "3");
    assert_eq!(server.cmd(&["HLEN", hash]), "7");
    assert_eq!(
        server.cmd(&["HEXISTS", hash, &short.fence.to_string()]),
        "0"
    );

    for (owner, fence) in [("a", a.fence), ("b", b.fence), ("c", c.fence)] {
        backend
            .release(&key, Holder::new(owner, fence))
            .await
            .unwrap();
    }
    assert_eq!(server.cmd(&["EXISTS", hash, index]), "0");
}
