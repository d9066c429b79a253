//! A small standalone benchmark of the PostgreSQL backend beside the raw
//! SQL lease loop and advisory locks, on a private server (or `--url`), one
//! JSON line per run. Scratch for issue 11, until `lockbench` takes
//! `--backend postgres://…`; see `notes/pg-benchmarks.md`.
//!
//! ```sh
//! cargo run --release --features postgres --example pg_bench_scratch -- --seconds 5
//! cargo run --release --features postgres --example pg_bench_scratch -- --seconds 5 --only serial,raw-serial
//! ```
//!
//! Workloads (accounting as `lockbench`/WORKLOADS.md: 200 warm-up cycles,
//! ops = cycles completed in the window, latency of cycles started in it):
//! - `serial`, `parallel32`: `LockBackend::acquire` + `release` on a fresh
//!   key per cycle, 1 / 32 tasks.
//! - `contended16`: 16 tasks on one key, wait up to 10 s, hold 1 ms.
//! - `raw-serial`, `raw-parallel32`: the cheapest correct lease loop in SQL,
//!   prepared: `INSERT … ON CONFLICT (key) DO UPDATE … WHERE expires_at <
//!   now()` then `DELETE … WHERE key AND owner`, on one connection per task
//!   (`raw-parallel32-pipelined`: 32 tasks over 2 pipelined connections).
//! - `adv-serial`, `adv-parallel32`: `pg_try_advisory_lock` /
//!   `pg_advisory_unlock` (session-bound: a connection per task).
//! - in `alternate` only (raw and backend in interleaved slices, 3 rounds):
//!   `fn-serial` (the backend's functions called directly), `cte-serial` and
//!   `cte7-serial` (its statements, with 2 and with all 7 parameters),
//!   `plain-serial` (its fast-path INSERT/DELETE alone): where the time of
//!   `serial` goes. `PGX_SETUP=sql` runs `sql` first on those connections.
//! - `held`: `serial` with 10^3..10^6 other locks held (rows inserted by SQL).
//! - `churn`: N distinct keys locked and released by 32 tasks, then the
//!   table's row count.
#![allow(missing_docs)]

#[path = "../tests/common/pg_server.rs"]
#[allow(unreachable_pub)]
mod pg_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio_postgres::{Client, NoTls, Statement};
use tower_lock::backend::postgres::PostgresBackend;
use tower_lock::{AcquireRequest, LockBackend, LockKey, new_owner_token};

static CONNECTIONS: AtomicUsize = AtomicUsize::new(0);
const TTL: Duration = Duration::from_secs(30);
const WARMUP: usize = 200;
const WARMUP_WORKER: usize = 1 << 20;

struct Tally {
    ops: usize,
    lat_us: Vec<u64>,
    errors: usize,
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn report(name: &str, seconds: f64, mut t: Tally, extra: serde_json::Value) {
    t.lat_us.sort_unstable();
    let mut v = json!({
        "workload": name,
        "ops_per_s": (t.ops as f64 / seconds).round(),
        "ops": t.ops,
        "p50_us": pct(&t.lat_us, 0.5),
        "p99_us": pct(&t.lat_us, 0.99),
        "errors": t.errors,
    });
    if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
        for (k, x) in extra {
            v.insert(k.clone(), x.clone());
        }
    }
    println!("{v}");
}

/// Run `workers` loops of `cycle(worker, i)` for `seconds` after a warm-up.
async fn run<F, Fut>(workers: usize, seconds: f64, cycle: F) -> Tally
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let cycle = Arc::new(cycle);
    // Warm-up as a worker of its own (`WARMUP_WORKER`), kept out of the
    // per-worker statistics.
    for i in 0..WARMUP {
        cycle(WARMUP_WORKER, i).await;
    }
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for w in 0..workers {
        let cycle = cycle.clone();
        tasks.push(tokio::spawn(async move {
            let mut t = Tally {
                ops: 0,
                lat_us: Vec::new(),
                errors: 0,
            };
            let mut i = 0;
            while Instant::now() < end {
                let t0 = Instant::now();
                let ok = cycle(w, i).await;
                let t1 = Instant::now();
                i += 1;
                if !ok {
                    t.errors += 1;
                    continue;
                }
                t.lat_us.push((t1 - t0).as_micros() as u64);
                if t1 <= end {
                    t.ops += 1;
                }
            }
            t
        }));
    }
    let mut all = Tally {
        ops: 0,
        lat_us: Vec::new(),
        errors: 0,
    };
    for task in tasks {
        let t = task.await.unwrap();
        all.ops += t.ops;
        all.lat_us.extend(t.lat_us);
        all.errors += t.errors;
    }
    all
}

fn key(prefix: &str, w: usize, i: usize) -> LockKey {
    LockKey::global(format!("{prefix}:{w}:{i}")).unwrap()
}

async fn backend_loop(b: &PostgresBackend, name: &str, workers: usize, seconds: f64) {
    let b = b.clone();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let t = run(workers, seconds, move |w, i| {
        let b = b.clone();
        let k = key(&tag, w, i);
        async move {
            let owner = new_owner_token();
            let r = AcquireRequest::new(k.clone(), owner.as_str(), TTL, Duration::ZERO).unwrap();
            b.acquire(&r).await.is_ok() && b.release(&k, &owner).await.is_ok()
        }
    })
    .await;
    report(
        name,
        seconds,
        t,
        json!({"peer": "tower-lock postgres", "connections": CONNECTIONS.load(Ordering::Relaxed)}),
    );
}

async fn connect(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

const RAW_TABLE: &str = "CREATE TABLE IF NOT EXISTS leases (key text PRIMARY KEY, owner text NOT NULL, expires_at timestamptz NOT NULL)";
const RAW_ACQUIRE: &str = "INSERT INTO leases (key, owner, expires_at) VALUES ($1, $2, now() + interval '30 s') \
     ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at \
     WHERE leases.expires_at < now()";
const RAW_RELEASE: &str = "DELETE FROM leases WHERE key = $1 AND owner = $2";

struct RawConn {
    client: Client,
    acquire: Statement,
    release: Statement,
}

const FN_ACQUIRE: &str = "SELECT code, fence, acquired_us, now_us, remaining_us, created \
     FROM tower_lock.locks_acquire($1, $2, 1, 30000, 0, NULL, NULL)";
const FN_RELEASE: &str = "SELECT tower_lock.locks_release($1, $2)";

async fn raw_conn(url: &str) -> Arc<RawConn> {
    raw_conn_with(url, RAW_ACQUIRE, RAW_RELEASE).await
}

async fn raw_conn_with(url: &str, acquire: &str, release: &str) -> Arc<RawConn> {
    let client = connect(url).await;
    let acquire = client.prepare(acquire).await.unwrap();
    let release = client.prepare(release).await.unwrap();
    Arc::new(RawConn {
        client,
        acquire,
        release,
    })
}

async fn raw_loop(url: &str, name: &str, workers: usize, conns: usize, seconds: f64) {
    let mut pool = Vec::new();
    for _ in 0..conns {
        pool.push(raw_conn(url).await);
    }
    let pool = Arc::new(pool);
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let t = run(workers, seconds, move |w, i| {
        let c = pool[w % pool.len()].clone();
        let k = format!("{tag}:{w}:{i}");
        async move {
            let owner = new_owner_token();
            matches!(c.client.execute(&c.acquire, &[&k, &owner]).await, Ok(1))
                && matches!(c.client.execute(&c.release, &[&k, &owner]).await, Ok(1))
        }
    })
    .await;
    report(
        name,
        seconds,
        t,
        json!({"peer": "raw lease loop (tokio-postgres, prepared)", "connections": conns}),
    );
}

const CTE_ACQUIRE: &str = "WITH fast AS ( \
   INSERT INTO tower_lock.locks AS l (key, owner, attempt, fence, acquired_at, expires_at) \
   VALUES ($1::text, $2::text, 1, nextval('tower_lock.locks_fence'), now(), now() + 30000 * interval '1 millisecond') \
   ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, attempt = excluded.attempt, fence = excluded.fence, \
     acquired_at = excluded.acquired_at, expires_at = excluded.expires_at, queued = false, granted_to = NULL \
   WHERE l.expires_at <= now() AND NOT l.queued RETURNING l.fence) \
 SELECT 1, fence FROM fast UNION ALL \
 SELECT a.code, a.fence FROM tower_lock.locks_acquire($1, $2, 1, 30000, 0, NULL, NULL) AS a \
 WHERE NOT EXISTS (SELECT 1 FROM fast)";
const CTE_RELEASE: &str = "WITH fast AS (DELETE FROM tower_lock.locks AS l WHERE l.key = $1::text AND l.owner = $2::text \
   AND l.expires_at > now() AND NOT l.queued RETURNING 1) \
 SELECT 1 FROM fast UNION ALL SELECT tower_lock.locks_release($1, $2) WHERE NOT EXISTS (SELECT 1 FROM fast)";
const PLAIN_ACQUIRE: &str = "INSERT INTO tower_lock.locks AS l (key, owner, attempt, fence, acquired_at, expires_at) \
   VALUES ($1::text, $2::text, 1, nextval('tower_lock.locks_fence'), now(), now() + 30000 * interval '1 millisecond') \
   ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, attempt = excluded.attempt, fence = excluded.fence, \
     acquired_at = excluded.acquired_at, expires_at = excluded.expires_at, queued = false, granted_to = NULL \
   WHERE l.expires_at <= now() AND NOT l.queued RETURNING 1, l.fence";
const PLAIN_RELEASE: &str = "DELETE FROM tower_lock.locks AS l WHERE l.key = $1::text AND l.owner = $2::text \
   AND l.expires_at > now() AND NOT l.queued RETURNING 1";

const CTE7_ACQUIRE: &str = "WITH fast AS ( \
   INSERT INTO tower_lock.locks AS l (key, owner, attempt, fence, acquired_at, expires_at) \
   VALUES ($1::text, $2::text, $3::bigint, nextval('\"tower_lock\".\"locks_fence\"'), now(), \
           now() + $4::bigint * interval '1 millisecond') \
   ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, attempt = excluded.attempt, fence = excluded.fence, \
     acquired_at = excluded.acquired_at, expires_at = excluded.expires_at, queued = false, granted_to = NULL \
   WHERE l.expires_at <= now() AND NOT l.queued RETURNING l.fence) \
 SELECT 1, fence, tower_lock.locks_us(now()), tower_lock.locks_us(now()), NULL::bigint, false FROM fast UNION ALL \
 SELECT a.code, a.fence, a.acquired_us, a.now_us, a.remaining_us, a.created \
 FROM tower_lock.locks_acquire($1, $2, $3, $4, $5::bigint, $6::text, $7::bigint) AS a \
 WHERE NOT EXISTS (SELECT 1 FROM fast)";

async fn cte7_loop(url: &str, name: &str, seconds: f64) {
    let c = raw_conn_with(url, CTE7_ACQUIRE, CTE_RELEASE).await;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let t = run(1, seconds, move |w, i| {
        let c = c.clone();
        let k = format!("g:{tag}:{w}:{i}");
        async move {
            let owner = new_owner_token();
            let none: Option<&str> = None;
            let nt: Option<i64> = None;
            let got = c
                .client
                .query_one(
                    &c.acquire,
                    &[&k, &owner, &7i64, &30000i64, &0i64, &none, &nt],
                )
                .await
                .is_ok_and(|r| r.get::<_, i32>(0) == 1);
            got && c
                .client
                .query_one(&c.release, &[&k, &owner])
                .await
                .is_ok_and(|r| r.get::<_, i32>(0) == 1)
        }
    })
    .await;
    report(name, seconds, t, json!({"connections": 1}));
}

async fn sql_loop(url: &str, name: &str, acquire: &str, release: &str, seconds: f64) {
    let c = raw_conn_with(url, acquire, release).await;
    if let Ok(setup) = std::env::var("PGX_SETUP") {
        c.client.batch_execute(&setup).await.unwrap();
    }
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let t = run(1, seconds, move |w, i| {
        let c = c.clone();
        let k = format!("g:{tag}:{w}:{i}");
        async move {
            let owner = new_owner_token();
            let got = c
                .client
                .query_one(&c.acquire, &[&k, &owner])
                .await
                .is_ok_and(|r| r.get::<_, i32>(0) == 1);
            got && c
                .client
                .query_one(&c.release, &[&k, &owner])
                .await
                .is_ok_and(|r| r.get::<_, i32>(0) == 1)
        }
    })
    .await;
    report(name, seconds, t, json!({"connections": 1}));
}

/// The backend's own functions called directly on one connection: the
/// backend's SQL without its Rust code.
async fn fn_loop(url: &str, name: &str, workers: usize, seconds: f64) {
    let c = raw_conn_with(url, FN_ACQUIRE, FN_RELEASE).await;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let t = run(workers, seconds, move |w, i| {
        let c = c.clone();
        let k = format!("g:{tag}:{w}:{i}");
        async move {
            let owner = new_owner_token();
            let got = c
                .client
                .query_one(&c.acquire, &[&k, &owner])
                .await
                .is_ok_and(|r| r.get::<_, i32>(0) == 1);
            got && c
                .client
                .query_one(&c.release, &[&k, &owner])
                .await
                .is_ok_and(|r| r.get::<_, i32>(0) == 1)
        }
    })
    .await;
    report(
        name,
        seconds,
        t,
        json!({"peer": "the backend's SQL functions, called directly", "connections": 1}),
    );
}

async fn adv_loop(url: &str, name: &str, workers: usize, seconds: f64) {
    let mut pool = Vec::new();
    for _ in 0..workers {
        let c = connect(url).await;
        let lock = c
            .prepare("SELECT pg_try_advisory_lock($1::bigint)")
            .await
            .unwrap();
        let unlock = c
            .prepare("SELECT pg_advisory_unlock($1::bigint)")
            .await
            .unwrap();
        pool.push(Arc::new((c, lock, unlock)));
    }
    let pool = Arc::new(pool);
    let t = run(workers, seconds, move |w, i| {
        let c = pool[w % pool.len()].clone();
        let k = ((w as i64) << 40) + i as i64;
        async move {
            let (client, lock, unlock) = &*c;
            let got = client
                .query_one(lock, &[&k])
                .await
                .is_ok_and(|r| r.get::<_, bool>(0));
            got && client
                .query_one(unlock, &[&k])
                .await
                .is_ok_and(|r| r.get::<_, bool>(0))
        }
    })
    .await;
    report(
        name,
        seconds,
        t,
        json!({"peer": "advisory locks (session-bound, no TTL, no fence)", "connections": workers}),
    );
}

async fn contended(b: &PostgresBackend, seconds: f64) {
    let holders = Arc::new(AtomicUsize::new(0));
    let max_holders = Arc::new(AtomicUsize::new(0));
    let last = Arc::new(AtomicUsize::new(usize::MAX));
    let same = Arc::new(AtomicUsize::new(0));
    let held_us = Arc::new(AtomicUsize::new(0));
    let waits = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let hot = LockKey::global(format!("hot:{}", uuid::Uuid::new_v4().simple())).unwrap();
    let b2 = b.clone();
    let (h, m, l, s, hu, ws) = (
        holders.clone(),
        max_holders.clone(),
        last.clone(),
        same.clone(),
        held_us.clone(),
        waits.clone(),
    );
    let t = run(16, seconds, move |w, _| {
        let b = b2.clone();
        let hot = hot.clone();
        let (h, m, l, s, hu, ws) = (
            h.clone(),
            m.clone(),
            l.clone(),
            s.clone(),
            hu.clone(),
            ws.clone(),
        );
        async move {
            let owner = new_owner_token();
            let r = AcquireRequest::new(hot.clone(), owner.as_str(), TTL, Duration::from_secs(10))
                .unwrap();
            let t0 = Instant::now();
            if b.acquire(&r).await.is_err() {
                return false;
            }
            let waited = t0.elapsed().as_micros() as u64;
            let n = h.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(n, Ordering::SeqCst);
            if w != WARMUP_WORKER {
                ws.lock().unwrap().push(waited);
                if l.swap(w, Ordering::SeqCst) == w {
                    s.fetch_add(1, Ordering::SeqCst);
                }
            }
            let t0 = Instant::now();
            tokio::time::sleep(Duration::from_millis(1)).await;
            hu.fetch_add(t0.elapsed().as_micros() as usize, Ordering::SeqCst);
            h.fetch_sub(1, Ordering::SeqCst);
            b.release(&hot, &owner).await.is_ok()
        }
    })
    .await;
    let ops = t.ops.max(1);
    let mut waits = waits.lock().unwrap().clone();
    waits.sort_unstable();
    let acquisitions = waits.len().max(2);
    let util = held_us.load(Ordering::SeqCst) as f64 / (seconds * 1e6);
    report(
        "contended16",
        seconds,
        t,
        json!({
            "peer": "tower-lock postgres",
            "max_concurrent_holders": max_holders.load(Ordering::SeqCst),
            "same_worker_reacquire_pct": (1000.0 * same.load(Ordering::SeqCst) as f64 / (acquisitions - 1) as f64).round() / 10.0,
            "wait_p50_us": pct(&waits, 0.5),
            "wait_p99_us": pct(&waits, 0.99),
            "wait_max_us": waits.last().copied().unwrap_or(0),
            "handoffs_counted": ops,
            "utilisation": (util * 1000.0).round() / 1000.0,
            "note": "p50/p99 = whole cycle (wait + 1 ms hold + release); utilisation = time held / window",
        }),
    );
}

/// `serial` with N other locks held, in slices alternating with `serial`
/// on an empty table of its own (`tower_lock.empty`), so the ratio does not
/// carry the shared machine's drift.
async fn held(b: &PostgresBackend, url: &str, seconds: f64) {
    let empty = b.clone().with_table("empty").unwrap();
    empty.migrate().await.unwrap();
    let c = connect(url).await;
    let mut have = 0i64;
    for n in [1_000i64, 10_000, 100_000, 1_000_000] {
        c.batch_execute(&format!(
            "INSERT INTO tower_lock.locks (key, owner, attempt, fence, acquired_at, expires_at) \
             SELECT 'g:held:' || i, 'o', 1, nextval('tower_lock.locks_fence'), now(), now() + interval '1 day' \
             FROM generate_series({}, {n}) AS i",
            have + 1
        ))
        .await
        .unwrap();
        c.batch_execute("ANALYZE tower_lock.locks").await.unwrap();
        have = n;
        for round in 0..3 {
            let s = seconds / 3.0;
            backend_loop(&empty, &format!("held-{n}-empty#{round}"), 1, s).await;
            backend_loop(b, &format!("held-{n}#{round}"), 1, s).await;
        }
    }
    c.batch_execute("DELETE FROM tower_lock.locks WHERE key LIKE 'g:held:%'")
        .await
        .unwrap();
    // (VACUUM refuses to run inside a transaction, so not in a batch.)
    c.batch_execute("VACUUM tower_lock.locks").await.unwrap();
}

async fn churn(b: &PostgresBackend, url: &str, n: usize) {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    for _ in 0..32 {
        let (b, next, tag) = (b.clone(), next.clone(), tag.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return;
                }
                let k = LockKey::global(format!("churn:{tag}:{i}")).unwrap();
                let r = AcquireRequest::new(k.clone(), "o", TTL, Duration::ZERO).unwrap();
                b.acquire(&r).await.unwrap();
                b.release(&k, "o").await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    let c = connect(url).await;
    let rows: i64 = c
        .query_one("SELECT count(*) FROM tower_lock.locks", &[])
        .await
        .unwrap()
        .get(0);
    let size: i64 = c
        .query_one("SELECT pg_total_relation_size('tower_lock.locks')", &[])
        .await
        .unwrap()
        .get(0);
    println!(
        "{}",
        json!({"workload": "churn", "distinct_keys": n, "seconds": secs, "ops_per_s": (n as f64 / secs).round(),
               "rows_after": rows, "table_bytes_after": size})
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut seconds = 5.0;
    let mut url = None;
    let mut only: Option<Vec<String>> = None;
    let mut churn_n = 100_000;
    let mut connections = PostgresBackend::DEFAULT_CONNECTIONS;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => seconds = args.next().unwrap().parse().unwrap(),
            "--url" => url = args.next(),
            "--only" => only = Some(args.next().unwrap().split(',').map(String::from).collect()),
            "--churn" => churn_n = args.next().unwrap().parse().unwrap(),
            "--connections" => connections = args.next().unwrap().parse().unwrap(),
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    let server = url.is_none().then(pg_server::PgServer::start);
    let url = url.unwrap_or_else(|| server.as_ref().unwrap().url());
    let b = PostgresBackend::from_url(&url)
        .unwrap()
        .with_connections(connections);
    CONNECTIONS.store(connections, Ordering::Relaxed);
    b.migrate().await.unwrap();
    connect(&url).await.batch_execute(RAW_TABLE).await.unwrap();
    let on = |w: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == w));
    if on("alternate") {
        // Raw and backend in alternating slices, so the shared machine's
        // drift hits both alike.
        for round in 0..3 {
            let s = seconds / 3.0;
            raw_loop(&url, &format!("raw-serial#{round}"), 1, 1, s).await;
            fn_loop(&url, &format!("fn-serial#{round}"), 1, s).await;
            sql_loop(
                &url,
                &format!("cte-serial#{round}"),
                CTE_ACQUIRE,
                CTE_RELEASE,
                s,
            )
            .await;
            sql_loop(
                &url,
                &format!("plain-serial#{round}"),
                PLAIN_ACQUIRE,
                PLAIN_RELEASE,
                s,
            )
            .await;
            cte7_loop(&url, &format!("cte7-serial#{round}"), s).await;
            backend_loop(&b, &format!("serial#{round}"), 1, s).await;
            raw_loop(&url, &format!("raw-parallel32#{round}"), 32, 32, s).await;
            raw_loop(&url, &format!("raw-parallel32-pipelined#{round}"), 32, 2, s).await;
            backend_loop(&b, &format!("parallel32#{round}"), 32, s).await;
        }
    }
    if on("raw-serial") {
        raw_loop(&url, "raw-serial", 1, 1, seconds).await;
    }
    if on("serial") {
        backend_loop(&b, "serial", 1, seconds).await;
    }
    if on("adv-serial") {
        adv_loop(&url, "adv-serial", 1, seconds).await;
    }
    if on("raw-parallel32") {
        raw_loop(&url, "raw-parallel32", 32, 32, seconds).await;
    }
    if on("raw-parallel32-pipelined") {
        raw_loop(&url, "raw-parallel32-pipelined", 32, 2, seconds).await;
    }
    if on("parallel32") {
        backend_loop(&b, "parallel32", 32, seconds).await;
    }
    if on("adv-parallel32") {
        adv_loop(&url, "adv-parallel32", 32, seconds).await;
    }
    if on("contended16") {
        contended(&b, seconds).await;
    }
    if on("held") {
        held(&b, &url, seconds).await;
    }
    if on("churn") {
        churn(&b, &url, churn_n).await;
    }
}
