//! Drives the `bank` example (`examples/bank/`) as a client would: spawn the
//! compiled binary with `--listen 127.0.0.1:0`, read `listening on ADDR` from
//! its stdout and talk HTTP to it. Nothing here depends on its code.
//!
//! The binary is `target/<profile>/examples/bank` next to this test's own
//! directory; `cargo build --example bank` with this test's own features runs
//! first (a no-op when fresh). `BANK_BIN=/path/to/bank` overrides it.
//!
//! Most tests use the in-memory backend; `three_processes_share_one_redis`
//! runs three banks on one private redis-server, and the `*_postgres` tests
//! (feature `postgres`) the same on one private PostgreSQL.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http::{Method, StatusCode, header};
use tokio::task::JoinSet;

mod common;

use common::bank::{
    ADMIN_TOKEN, AUTH, Bank, bank_binary, handler_ran, seen_locked, spawn_post, until_it_happened,
    wait_until_locked, within_timeout,
};

// ---------------------------------------------------------------------------
// The tests

#[tokio::test]
async fn concurrent_deposits_are_serialised() {
    within_timeout(async {
        let bank = Bank::start();
        let http = bank.http();
        let mut tasks = JoinSet::new();
        for _ in 0..40 {
            let http = http.clone();
            tasks.spawn(async move {
                http.post("/accounts/alice/deposit?amount=1&hold_ms=2&wait_ms=5000")
                    .await
            });
        }
        let mut done = Vec::new();
        while let Some(reply) = tasks.join_next().await {
            let reply = reply.unwrap();
            reply.assert_json(StatusCode::OK);
            done.push((reply.int("balance"), reply.uint("fence")));
        }

        // Each deposit saw the previous one's write: the balances are exactly
        // 1..=40, and in that (lock) order the fencing tokens strictly grow.
        done.sort();
        let balances: Vec<i64> = done.iter().map(|&(b, _)| b).collect();
        assert_eq!(balances, (1..=40).collect::<Vec<_>>(), "lost updates");
        for pair in done.windows(2) {
            assert!(pair[0].1 < pair[1].1, "fences not increasing: {done:?}");
        }

        let reply = http.get("/accounts/alice").await;
        reply.assert_json(StatusCode::OK);
        assert_eq!(reply.json, serde_json::json!({ "balance": 40 }));
    })
    .await;
}

#[tokio::test]
async fn busy_account_is_429_with_retry_after() {
    within_timeout(async {
        let bank = Bank::start_with(&["--admin-token", ADMIN_TOKEN]);
        let http = bank.http();

        let holder = spawn_post(&http, "/accounts/bob/deposit?amount=10&hold_ms=1000");
        wait_until_locked(&http, "account:bob").await;

        // No waiting allowed: refused at once, without running the handler.
        let started = Instant::now();
        let busy = http.post("/accounts/bob/deposit?amount=1&wait_ms=0").await;
        assert!(started.elapsed() < Duration::from_millis(500));
        busy.assert_json(StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(busy.error_code(), "LOCK_ACQUISITION_FAILED");
        let retry_after: u64 = busy.headers[header::RETRY_AFTER]
            .to_str()
            .unwrap()
            .parse()
            .expect("Retry-After in whole seconds");
        assert!((1..=30).contains(&retry_after), "Retry-After {retry_after}");

        // Waiting less than the holder holds: a timeout, also 429.
        let timeout = http
            .post("/accounts/bob/deposit?amount=1&wait_ms=100")
            .await;
        timeout.assert_json(StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(timeout.error_code(), "LOCK_TIMEOUT");
        assert!(timeout.headers.contains_key(header::RETRY_AFTER));

        // Other accounts are not blocked.
        let other = http.post("/accounts/carol/deposit?amount=1").await;
        other.assert_json(StatusCode::OK);

        let holder = holder.await.unwrap();
        holder.assert_json(StatusCode::OK);
        assert_eq!(holder.int("balance"), 10);
        assert_eq!(
            http.get("/accounts/bob").await.int("balance"),
            10,
            "a refused deposit changed the balance"
        );

        // The lock is released by the time the response has arrived.
        let next = http.post("/accounts/bob/deposit?amount=1").await;
        next.assert_json(StatusCode::OK);
        assert_eq!(next.int("balance"), 11);
        assert!(next.uint("fence") > holder.uint("fence"));
    })
    .await;
}

#[tokio::test]
async fn bad_parameters_are_400_json() {
    within_timeout(async {
        let bank = Bank::start();
        let http = bank.http();
        for query in [
            "",
            "?hold_ms=1",
            "?amount=",
            "?amount=abc",
            "?amount=1.5",
            "?amount=99999999999999999999",
            "?amount=1&amount=2",
            "?amount=1&hold_ms=-1",
            "?amount=1&wait_ms=soon",
            "?amount=1&ttl_ms=1e3",
            // Over the route's bounds (a lock kept for a year, a request
            // held for centuries).
            "?amount=1&keep=true&ttl_ms=31536000000",
            "?amount=1&hold_ms=18446744073709551615",
            "?amount=1&wait_ms=60001",
            "?amount=1&pause_ms=60001",
        ] {
            let reply = http.post(&format!("/accounts/dave/deposit{query}")).await;
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "query {query:?}");
            reply.assert_json(StatusCode::BAD_REQUEST);
            assert_eq!(reply.error_code(), "BAD_REQUEST", "query {query:?}");
            assert!(reply.json["error"]["message"].is_string());
        }
        assert_eq!(http.get("/accounts/dave").await.int("balance"), 0);

        // Any i64 is an amount, negative ones included (percent-encoded too).
        let reply = http.post("/accounts/dave/deposit?amount=%2D5").await;
        reply.assert_json(StatusCode::OK);
        assert_eq!(reply.int("balance"), -5);
        let reply = http
            .post("/accounts/dave/deposit?amount=-9223372036854775803")
            .await;
        assert_eq!(reply.int("balance"), i64::MIN);
        // Overflow is refused, not wrapped (and never a panic).
        let reply = http.post("/accounts/dave/deposit?amount=-1").await;
        reply.assert_json(StatusCode::BAD_REQUEST);
        assert_eq!(http.get("/accounts/dave").await.int("balance"), i64::MIN);
    })
    .await;
}

#[tokio::test]
async fn unknown_account_has_balance_zero() {
    within_timeout(async {
        let bank = Bank::start();
        let reply = bank.http().get("/accounts/nobody").await;
        reply.assert_json(StatusCode::OK);
        assert_eq!(reply.json, serde_json::json!({ "balance": 0 }));
    })
    .await;
}

/// `ttl_ms` shorter than the hold: the lock expires under the first deposit,
/// the second one gets in, and one update is lost. The fences show it.
#[tokio::test]
async fn a_ttl_shorter_than_the_hold_loses_an_update() {
    within_timeout(async {
        let bank = Bank::start_with(&["--admin-token", ADMIN_TOKEN]);
        let http = &bank.http();
        until_it_happened(|n| async move {
            // The second deposit comes once the first holds the lock; a
            // lock that came and went unseen (a stalled machine) is no
            // scenario either.
            let slow = spawn_post(
                http,
                &format!("/accounts/erin{n}/deposit?amount=1&hold_ms=1500&ttl_ms=100"),
            );
            if !seen_locked(http, &format!("account:erin{n}"), &slow).await {
                return None;
            }
            let fast = http
                .post(&format!("/accounts/erin{n}/deposit?amount=1&wait_ms=5000"))
                .await;
            fast.assert_json(StatusCode::OK);
            let slow = slow.await.unwrap();
            handler_ran(&slow)?;
            slow.assert_json(StatusCode::OK);
            assert!(fast.uint("fence") > slow.uint("fence"));
            assert_eq!(fast.int("balance"), 1);
            assert_eq!(slow.int("balance"), 1);
            let account = http.get(&format!("/accounts/erin{n}")).await;
            assert_eq!(account.int("balance"), 1);
            Some(())
        })
        .await;
    })
    .await;
}

/// The example is built with exactly this test's features, so each of the
/// crate's features must be in that list.
#[test]
fn every_feature_reaches_the_example_build() {
    let manifest = include_str!("../Cargo.toml");
    let section = manifest
        .split("[features]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("a [features] table");
    for line in section.lines() {
        let Some((name, _)) = line.split_once(" = ") else {
            continue;
        };
        if name == "default" || name.starts_with('#') {
            continue;
        }
        assert!(
            common::bank::FEATURES.iter().any(|&(f, _)| f == name),
            "feature `{name}` is missing from tests/common/bank.rs FEATURES"
        );
    }
}

#[test]
fn unknown_flag_prints_usage_and_exits_2() {
    let mut child = Command::new(bank_binary())
        .arg("--frobnicate")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bank");
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("bank --frobnicate did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("usage"), "stderr: {stderr}");
    assert!(out.stdout.is_empty());
}

/// Three bank processes on one Redis take 300 concurrent deposits spread
/// over all three, some waiting and some not: every `200` is counted exactly
/// once in the final balance, and every refusal is a `429` with
/// `Retry-After`.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_one_redis() {
    within_timeout(async {
        let redis = common::redis_server::RedisServer::start();
        let url = redis.url();
        let banks: Vec<Bank> = (0..3)
            .map(|_| Bank::start_with(&["--redis", &url]))
            .collect();
        let clients: Vec<common::bank::Http> = banks.iter().map(Bank::http).collect();

        let mut deposits = JoinSet::new();
        for i in 0..300u64 {
            let http = clients[i as usize % 3].clone();
            let amount = i + 1;
            let wait_ms = [0, 20, 200, 5_000][i as usize % 4];
            deposits.spawn(async move {
                let path =
                    format!("/accounts/shared/deposit?amount={amount}&hold_ms=1&wait_ms={wait_ms}");
                (amount, http.post(&path).await)
            });
        }
        let (mut sum, mut accepted, mut refused) = (0u64, 0, 0);
        let mut fences = Vec::new();
        while let Some(done) = deposits.join_next().await {
            let (amount, reply) = done.unwrap();
            match reply.status {
                StatusCode::OK => {
                    sum += amount;
                    accepted += 1;
                    fences.push(reply.uint("fence"));
                }
                StatusCode::TOO_MANY_REQUESTS => {
                    let retry_after: u64 = reply.headers[header::RETRY_AFTER]
                        .to_str()
                        .unwrap()
                        .parse()
                        .expect("Retry-After in whole seconds");
                    assert!(retry_after >= 1);
                    refused += 1;
                }
                other => panic!("{}: unexpected {other}: {}", reply.what, reply.json),
            }
        }
        eprintln!("{accepted} deposits accepted, {refused} refused");
        assert!(accepted > 0);
        for http in &clients {
            assert_eq!(
                http.get("/accounts/shared").await.uint("balance"),
                sum,
                "the balance differs from the sum of accepted deposits: updates were lost"
            );
        }
        fences.sort_unstable();
        fences.dedup();
        assert_eq!(fences.len(), accepted, "two deposits got the same fence");
    })
    .await;
}

/// Three bank processes on one Redis Cluster (`--redis-cluster`) take 300
/// concurrent deposits on accounts whose locks live on different shards,
/// some waiting and some not: per account, every `200` is counted exactly
/// once and every fence is distinct; every refusal is a `429`.
#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_one_redis_cluster() {
    use std::collections::{BTreeSet, HashMap};

    use common::redis_cluster::RedisCluster;

    within_timeout(async {
        let cluster = RedisCluster::shared();
        let urls = cluster.urls_arg();
        let banks: Vec<Bank> = (0..3)
            .map(|_| Bank::start_with(&["--redis-cluster", &urls]))
            .collect();
        let clients: Vec<common::bank::Http> = banks.iter().map(Bank::http).collect();
        // Accounts (unique to this test: the cluster is shared) whose locks
        // are spread over the shards.
        let accounts: Vec<String> = (0..4)
            .map(|i| format!("cl{}-{i}", std::process::id()))
            .collect();
        let shards: BTreeSet<u16> = accounts
            .iter()
            .map(|a| {
                let slot = cluster
                    .cmd(
                        cluster.live_port(),
                        &["CLUSTER", "KEYSLOT", &format!("lock:{{g:account:{a}}}")],
                    )
                    .parse()
                    .unwrap();
                cluster.owner_of(slot)
            })
            .collect();
        eprintln!("the accounts' locks live on {} shards", shards.len());

        let mut deposits = JoinSet::new();
        for i in 0..300u64 {
            let http = clients[i as usize % 3].clone();
            let account = accounts[(i as usize / 3) % accounts.len()].clone();
            let amount = i + 1;
            let wait_ms = [0, 20, 200, 5_000][i as usize % 4];
            deposits.spawn(async move {
                let path = format!(
                    "/accounts/{account}/deposit?amount={amount}&hold_ms=1&wait_ms={wait_ms}"
                );
                (account, amount, http.post(&path).await)
            });
        }
        let mut sums: HashMap<String, (u64, Vec<u64>)> = HashMap::new();
        let mut refused = 0;
        while let Some(done) = deposits.join_next().await {
            let (account, amount, reply) = done.unwrap();
            match reply.status {
                StatusCode::OK => {
                    let entry = sums.entry(account).or_default();
                    entry.0 += amount;
                    entry.1.push(reply.uint("fence"));
                }
                StatusCode::TOO_MANY_REQUESTS => {
                    assert!(reply.headers.contains_key(header::RETRY_AFTER));
                    refused += 1;
                }
                other => panic!("{}: unexpected {other}: {}", reply.what, reply.json),
            }
        }
        eprintln!("{refused} deposits refused");
        assert_eq!(sums.len(), accounts.len(), "an account got no deposit");
        for (account, (sum, mut fences)) in sums {
            for http in &clients {
                assert_eq!(
                    http.get(&format!("/accounts/{account}"))
                        .await
                        .uint("balance"),
                    sum,
                    "{account}: the balance differs from the sum of accepted deposits"
                );
            }
            let accepted = fences.len();
            fences.sort_unstable();
            fences.dedup();
            assert_eq!(
                fences.len(),
                accepted,
                "{account}: two deposits got the same fence"
            );
        }
    })
    .await;
}

/// Redis goes away under a running bank: requests fail closed with `503
/// LOCK_BACKEND_UNAVAILABLE` (never waiting out their max wait, never running
/// the handler unlocked), and the first request after Redis is back succeeds.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_is_503_and_the_first_request_after_it_succeeds() {
    within_timeout(async {
        let mut redis = common::redis_server::RedisServer::start();
        let bank = Bank::start_with(&["--redis", &redis.url()]);
        let http = bank.http();
        http.post("/accounts/out/deposit?amount=1")
            .await
            .assert_json(StatusCode::OK);

        redis.kill();
        let started = Instant::now();
        let down = http
            .post("/accounts/out/deposit?amount=1&wait_ms=10000")
            .await;
        let took = started.elapsed();
        down.assert_json(StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(down.error_code(), "LOCK_BACKEND_UNAVAILABLE");
        assert!(down.headers.contains_key(header::RETRY_AFTER));
        eprintln!("Redis down: 503 after {took:?}");
        assert!(
            took < Duration::from_secs(5),
            "waited {took:?}: an unreachable backend must not eat the max wait"
        );

        redis.restart();
        let started = Instant::now();
        let first = http.post("/accounts/out/deposit?amount=1").await;
        first.assert_json(StatusCode::OK);
        eprintln!(
            "first request after the restart: 200 in {:?}",
            started.elapsed()
        );
        // The restarted Redis is empty: the balance starts again.
        assert_eq!(first.int("balance"), 1);
    })
    .await;
}

/// The process holding a lock is SIGKILLed: it never releases, and a waiter
/// in another process gets the lock when the holder's TTL runs out.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_process_frees_the_lock_at_its_ttl() {
    within_timeout(async {
        let redis = common::redis_server::RedisServer::start();
        let url = redis.url();
        let holder_bank = Bank::start_with(&["--redis", &url]);
        let waiter_bank = Bank::start_with(&["--redis", &url, "--admin-token", ADMIN_TOKEN]);
        let waiter = waiter_bank.http();

        let holder = tokio::spawn({
            let http = holder_bank.http();
            async move {
                let req = http::Request::post(format!(
                    "{}/accounts/dead/deposit?amount=100&hold_ms=30000&ttl_ms=1000",
                    http.base
                ))
                .body(http_body_util::Empty::new())
                .unwrap();
                // Its process dies mid-handler: the request fails.
                http.client.request(req).await.is_err()
            }
        });
        wait_until_locked(&waiter, "account:dead").await;
        drop(holder_bank); // SIGKILL, mid-handler
        assert!(holder.await.unwrap(), "the killed holder answered");
        let status = waiter
            .send_with(Method::GET, "/admin/locks/account:dead", &[AUTH])
            .await;
        let started = Instant::now();
        let remaining = Duration::from_millis(status.uint("ttl_remaining_ms"));

        let res = waiter
            .post("/accounts/dead/deposit?amount=5&wait_ms=10000")
            .await;
        res.assert_json(StatusCode::OK);
        let after_expiry = started.elapsed().saturating_sub(remaining);
        eprintln!("holder killed: waiter got the lock {after_expiry:?} after the TTL ended");
        // The dead holder never wrote.
        assert_eq!(res.int("balance"), 5);
    })
    .await;
}

/// Three bank processes on one PostgreSQL database take 300 concurrent
/// deposits spread over all three, some waiting and some not: every `200`
/// is counted exactly once in the final balance, every fence is distinct,
/// and every refusal is a `429` with `Retry-After`.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_one_postgres() {
    within_timeout(async {
        let pg = common::pg_server::PgServer::start();
        let url = pg.url();
        let banks: Vec<Bank> = (0..3)
            .map(|_| Bank::start_with(&["--postgres", &url]))
            .collect();
        let clients: Vec<common::bank::Http> = banks.iter().map(Bank::http).collect();

        let mut deposits = JoinSet::new();
        for i in 0..300u64 {
            let http = clients[i as usize % 3].clone();
            let amount = i + 1;
            let wait_ms = [0, 20, 200, 5_000][i as usize % 4];
            deposits.spawn(async move {
                let path =
                    format!("/accounts/shared/deposit?amount={amount}&hold_ms=1&wait_ms={wait_ms}");
                (amount, http.post(&path).await)
            });
        }
        let (mut sum, mut accepted, mut refused) = (0u64, 0, 0);
        let mut fences = Vec::new();
        while let Some(done) = deposits.join_next().await {
            let (amount, reply) = done.unwrap();
            match reply.status {
                StatusCode::OK => {
                    sum += amount;
                    accepted += 1;
                    fences.push(reply.uint("fence"));
                }
                StatusCode::TOO_MANY_REQUESTS => {
                    let retry_after: u64 = reply.headers[header::RETRY_AFTER]
                        .to_str()
                        .unwrap()
                        .parse()
                        .expect("Retry-After in whole seconds");
                    assert!(retry_after >= 1);
                    refused += 1;
                }
                other => panic!("{}: unexpected {other}: {}", reply.what, reply.json),
            }
        }
        eprintln!("postgres: {accepted} deposits accepted, {refused} refused");
        assert!(accepted > 0);
        for http in &clients {
            assert_eq!(
                http.get("/accounts/shared").await.uint("balance"),
                sum,
                "the balance differs from the sum of accepted deposits: updates were lost"
            );
        }
        assert_eq!(
            pg.psql("SELECT balance FROM bank_balances WHERE id = 'shared'"),
            sum.to_string(),
            "the balance lives in the database"
        );
        fences.sort_unstable();
        fences.dedup();
        assert_eq!(fences.len(), accepted, "two deposits got the same fence");
        // Released locks leave no rows behind.
        assert_eq!(pg.psql("SELECT count(*) FROM tower_lock.locks"), "0");
    })
    .await;
}

/// Three bank processes on one etcd cluster (3 members), `--fenced`: every
/// accepted deposit is counted exactly once in the final balance, every
/// fence is distinct, every refusal is a `429` with `Retry-After`, and the
/// released locks leave no key behind.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_one_etcd() {
    within_timeout(async {
        let cluster = common::etcd_cluster::EtcdCluster::start(3);
        let endpoints = cluster.endpoints_arg();
        let banks: Vec<Bank> = (0..3)
            .map(|_| Bank::start_with(&["--etcd", &endpoints, "--fenced"]))
            .collect();
        let clients: Vec<common::bank::Http> = banks.iter().map(Bank::http).collect();

        let mut deposits = JoinSet::new();
        for i in 0..120u64 {
            let http = clients[i as usize % 3].clone();
            let amount = i + 1;
            let wait_ms = [0, 20, 200, 5_000][i as usize % 4];
            deposits.spawn(async move {
                let path =
                    format!("/accounts/shared/deposit?amount={amount}&hold_ms=1&wait_ms={wait_ms}");
                (amount, http.post(&path).await)
            });
        }
        let (mut sum, mut accepted) = (0u64, 0);
        let mut fences = Vec::new();
        while let Some(done) = deposits.join_next().await {
            let (amount, reply) = done.unwrap();
            match reply.status {
                StatusCode::OK => {
                    sum += amount;
                    accepted += 1;
                    fences.push(reply.uint("fence"));
                }
                StatusCode::TOO_MANY_REQUESTS => {
                    let retry_after: u64 = reply.headers[header::RETRY_AFTER]
                        .to_str()
                        .unwrap()
                        .parse()
                        .expect("Retry-After in whole seconds");
                    assert!(retry_after >= 1);
                }
                other => panic!("{}: unexpected {other}: {}", reply.what, reply.json),
            }
        }
        assert!(accepted > 0);
        for http in &clients {
            assert_eq!(
                http.get("/accounts/shared").await.uint("balance"),
                sum,
                "the balance differs from the sum of accepted deposits: updates were lost"
            );
        }
        fences.sort_unstable();
        fences.dedup();
        assert_eq!(fences.len(), accepted, "two deposits got the same fence");
        assert_eq!(
            cluster.count_prefix("tower-lock/"),
            0,
            "released locks left keys"
        );
    })
    .await;
}

/// PostgreSQL goes away under a running bank: requests fail closed with
/// `503 LOCK_BACKEND_UNAVAILABLE` (never waiting out their max wait, never
/// running the handler unlocked), and the first request after the server is
/// back succeeds, on the balance it had (the data survives a restart).
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_is_503_and_the_first_request_after_it_succeeds() {
    within_timeout(async {
        let mut pg = common::pg_server::PgServer::start();
        let bank = Bank::start_with(&["--postgres", &pg.url()]);
        let http = bank.http();
        http.post("/accounts/out/deposit?amount=1")
            .await
            .assert_json(StatusCode::OK);

        pg.kill();
        let started = Instant::now();
        let down = http
            .post("/accounts/out/deposit?amount=1&wait_ms=10000")
            .await;
        let took = started.elapsed();
        down.assert_json(StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(down.error_code(), "LOCK_BACKEND_UNAVAILABLE");
        assert!(down.headers.contains_key(header::RETRY_AFTER));
        eprintln!("PostgreSQL down: 503 after {took:?}");
        assert!(
            took < Duration::from_secs(5),
            "waited {took:?}: an unreachable backend must not eat the max wait"
        );

        pg.restart();
        let started = Instant::now();
        let first = http.post("/accounts/out/deposit?amount=1").await;
        first.assert_json(StatusCode::OK);
        eprintln!(
            "first request after the PostgreSQL restart: 200 in {:?}",
            started.elapsed()
        );
        assert_eq!(first.int("balance"), 2, "the balance survived the restart");
    })
    .await;
}

/// A bank that starts while PostgreSQL is down serves 503 and works as soon
/// as the database is there (it creates its tables then).
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bank_started_before_postgres_works_once_it_is_up() {
    within_timeout(async {
        let mut pg = common::pg_server::PgServer::start();
        let url = pg.url();
        pg.kill();
        let bank = Bank::start_with(&["--postgres", &url]);
        let http = bank.http();
        let down = http.post("/accounts/late/deposit?amount=1").await;
        down.assert_json(StatusCode::SERVICE_UNAVAILABLE);
        pg.restart();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let reply = http.post("/accounts/late/deposit?amount=1").await;
            if reply.status == StatusCode::OK {
                assert_eq!(reply.int("balance"), 1);
                break;
            }
            assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
            assert!(Instant::now() < deadline, "never recovered: {}", reply.json);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// The process holding a lock is SIGKILLed: it never releases, and a waiter
/// in another process gets the lock when the holder's TTL runs out (on the
/// database's clock), not later than TTL + a small margin.
/// With feature `postgres-tls`, `--postgres …?sslmode=require` speaks TLS on
/// every connection, the balance store's and the lock backend's (waiting
/// included), verified against the roots OpenSSL trusts (here the test's own
/// CA, through `SSL_CERT_FILE`).
#[cfg(feature = "postgres-tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bank_speaks_tls_to_postgres() {
    within_timeout(async {
        let pg = common::pg_server::PgServer::start();
        let ca = pg.require_tls();
        let url = format!("{}?sslmode=require", pg.url());
        let bank = Bank::start_with_env(
            &["--postgres", &url, "--admin-token", ADMIN_TOKEN],
            &[("SSL_CERT_FILE", ca.as_os_str())],
        );
        let http = bank.http();
        // A deposit that waits on another holds the LISTEN connection too.
        let first = spawn_post(&http, "/accounts/tls/deposit?amount=5&hold_ms=300");
        // Seen held, or already done (a stalled machine): the second
        // deposit waits for it either way.
        seen_locked(&http, "account:tls", &first).await;
        let second = http
            .post("/accounts/tls/deposit?amount=7&wait_ms=5000")
            .await;
        second.assert_json(StatusCode::OK);
        first.await.unwrap().assert_json(StatusCode::OK);
        assert_eq!(http.get("/accounts/tls").await.int("balance"), 12);
        assert_eq!(
            pg.plain_client_connections(),
            0,
            "every connection encrypted"
        );
    })
    .await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_process_frees_the_lock_at_its_ttl_postgres() {
    within_timeout(async {
        let pg = common::pg_server::PgServer::start();
        let url = pg.url();
        let holder_bank = Bank::start_with(&["--postgres", &url]);
        let waiter_bank = Bank::start_with(&["--postgres", &url, "--admin-token", ADMIN_TOKEN]);
        let waiter = waiter_bank.http();

        let holder = tokio::spawn({
            let http = holder_bank.http();
            async move {
                let req = http::Request::post(format!(
                    "{}/accounts/dead/deposit?amount=100&hold_ms=30000&ttl_ms=1000",
                    http.base
                ))
                .body(http_body_util::Empty::new())
                .unwrap();
                http.client.request(req).await.is_err()
            }
        });
        wait_until_locked(&waiter, "account:dead").await;
        drop(holder_bank); // SIGKILL, mid-handler
        assert!(holder.await.unwrap(), "the killed holder answered");

        let status = waiter
            .send_with(Method::GET, "/admin/locks/account:dead", &[AUTH])
            .await;
        let started = Instant::now();
        let remaining = Duration::from_millis(status.uint("ttl_remaining_ms"));
        let res = waiter
            .post("/accounts/dead/deposit?amount=5&wait_ms=10000")
            .await;
        res.assert_json(StatusCode::OK);
        // Includes the deposit itself (two balance queries) and HTTP.
        let after_expiry = started.elapsed().saturating_sub(remaining);
        eprintln!(
            "holder killed (postgres): the waiter's deposit answered {after_expiry:?} after the TTL ended"
        );
        assert!(after_expiry < Duration::from_secs(1), "{after_expiry:?}");
        // The dead holder never wrote.
        assert_eq!(res.int("balance"), 5);
    })
    .await;
}

#[tokio::test]
async fn keep_true_keeps_the_lock_until_the_admin_api_releases_it() {
    within_timeout(async {
        let bank = Bank::start_with(&["--admin-token", ADMIN_TOKEN]);
        let http = bank.http();
        let kept = http.post("/accounts/kim/deposit?amount=5&keep=true").await;
        kept.assert_json(StatusCode::OK);
        let header = |name: &str| {
            kept.headers
                .get(name)
                .unwrap_or_else(|| panic!("no {name} header"))
                .to_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(header("lock-key"), "account:kim");
        let owner = header("lock-owner");
        let fence: u64 = header("lock-fence").parse().unwrap();
        assert_eq!(fence, kept.uint("fence"));
        assert!(header("lock-expires-at").ends_with('Z'));

        // Held after the response.
        let busy = http.post("/accounts/kim/deposit?amount=1").await;
        busy.assert_json(StatusCode::TOO_MANY_REQUESTS);

        // The admin API wants the bearer token.
        let anon = http.get("/admin/locks/account:kim").await;
        anon.assert_json(StatusCode::UNAUTHORIZED);
        let status = http
            .send_with(Method::GET, "/admin/locks/account:kim", &[AUTH])
            .await;
        status.assert_json(StatusCode::OK);
        assert_eq!(status.json["locked"], true);
        assert_eq!(status.json["key"], "account:kim");
        assert_eq!(status.uint("fence"), fence);
        assert!(status.uint("ttl_remaining_ms") <= 30_000);

        // Wrong owner: 409. The echoed owner header: released.
        let wrong = http
            .send_with(
                Method::DELETE,
                "/admin/locks/account:kim",
                &[AUTH, ("lock-owner", "not-the-owner")],
            )
            .await;
        wrong.assert_json(StatusCode::CONFLICT);
        assert_eq!(wrong.error_code(), "LOCK_OWNERSHIP_MISMATCH");
        let released = http
            .send_with(
                Method::DELETE,
                &format!("/admin/locks/{}", header("lock-key")),
                &[AUTH, ("lock-owner", &owner)],
            )
            .await;
        released.assert_json(StatusCode::OK);
        let again = http
            .send_with(
                Method::DELETE,
                "/admin/locks/account:kim",
                &[AUTH, ("lock-owner", &owner)],
            )
            .await;
        again.assert_json(StatusCode::NOT_FOUND);
        assert_eq!(again.error_code(), "LOCK_NOT_FOUND");

        let next = http.post("/accounts/kim/deposit?amount=1").await;
        next.assert_json(StatusCode::OK);
        assert_eq!(next.int("balance"), 6);
        assert!(
            next.headers.get("lock-owner").is_none(),
            "an auto-released lock is advertised"
        );
    })
    .await;
}

#[tokio::test]
async fn admin_force_release_frees_a_kept_lock() {
    within_timeout(async {
        let bank = Bank::start_with(&["--admin-token", ADMIN_TOKEN]);
        let http = bank.http();
        http.post("/accounts/fay/deposit?amount=1&keep=true")
            .await
            .assert_json(StatusCode::OK);
        let anon = http
            .send_with(Method::DELETE, "/admin/locks/account:fay?force=true", &[])
            .await;
        anon.assert_json(StatusCode::UNAUTHORIZED);
        let forced = http
            .send_with(
                Method::DELETE,
                "/admin/locks/account:fay?force=true",
                &[AUTH],
            )
            .await;
        forced.assert_json(StatusCode::OK);
        assert_eq!(forced.json["forced"], true);
        let status = http
            .send_with(Method::GET, "/admin/locks/account:fay", &[AUTH])
            .await;
        assert_eq!(
            status.json,
            serde_json::json!({"key": "account:fay", "locked": false})
        );
        http.post("/accounts/fay/deposit?amount=1")
            .await
            .assert_json(StatusCode::OK);
    })
    .await;
}

#[tokio::test]
async fn watchdog_keeps_the_lock_past_its_ttl() {
    within_timeout(async {
        let bank = Bank::start_with(&["--admin-token", ADMIN_TOKEN]);
        let http = &bank.http();
        until_it_happened(|n| async move {
            let holder = spawn_post(
                http,
                &format!(
                    "/accounts/wes{n}/deposit?amount=10&hold_ms=1500&ttl_ms=300&watchdog=true"
                ),
            );
            if !seen_locked(http, &format!("account:wes{n}"), &holder).await {
                return None;
            }
            // Three TTLs later the lock is still held (renewed): a deposit
            // that does not wait is refused, and no update is lost.
            tokio::time::sleep(Duration::from_millis(900)).await;
            let busy = http
                .post(&format!("/accounts/wes{n}/deposit?amount=1"))
                .await;
            let holder = holder.await.unwrap();
            handler_ran(&holder)?;
            busy.assert_json(StatusCode::TOO_MANY_REQUESTS);
            holder.assert_json(StatusCode::OK);
            assert_eq!(
                http.get(&format!("/accounts/wes{n}")).await.int("balance"),
                10
            );
            Some(())
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn no_admin_api_without_a_token() {
    within_timeout(async {
        let bank = Bank::start();
        let http = bank.http();
        let res = http.get("/admin/locks/account:1").await;
        res.assert_json(StatusCode::NOT_FOUND);
    })
    .await;
}

/// Wrong or missing credentials never release a lock, nor reveal anything
/// about it (not whether it is held, nor its fence, nor its owner): every
/// admin call answers the same `401` body, and the lock stays as it was.
#[tokio::test]
async fn admin_calls_without_the_right_token_release_and_reveal_nothing() {
    within_timeout(async {
        let bank = Bank::start_with(&["--admin-token", ADMIN_TOKEN]);
        let http = bank.http();
        let kept = http
            .post("/accounts/vault/deposit?amount=1&keep=true")
            .await;
        kept.assert_json(StatusCode::OK);
        let owner = kept.headers["lock-owner"].to_str().unwrap().to_owned();
        let fence = kept.uint("fence").to_string();

        let bad_credentials: &[&[(&str, &str)]] = &[
            &[],
            &[("authorization", "Bearer wrong")],
            &[("authorization", "Bearer t0ke")],
            &[("authorization", "Bearer t0ken0")],
            &[("authorization", "Bearer  t0ken")],
            &[("authorization", "Basic t0ken")],
            &[("authorization", "t0ken")],
            &[("authorization", "")],
            // The owner token is not an admin credential.
            &[("authorization", &format!("Bearer {owner}"))],
        ];
        let calls = [
            (Method::GET, "/admin/locks/account:vault"),
            (Method::DELETE, "/admin/locks/account:vault"),
            (Method::DELETE, "/admin/locks/account:vault?force=true"),
            (Method::GET, "/admin/locks/account:nobody"),
        ];
        let mut first_body = None;
        for credentials in bad_credentials {
            for (method, path) in &calls {
                let mut headers = credentials.to_vec();
                headers.push(("lock-owner", &owner));
                let reply = http.send_with(method.clone(), path, &headers).await;
                reply.assert_json(StatusCode::UNAUTHORIZED);
                assert_eq!(reply.error_code(), "UNAUTHORIZED");
                assert_eq!(reply.headers[header::WWW_AUTHENTICATE], "Bearer");
                let body = reply.json.to_string();
                assert!(
                    reply.json.as_object().unwrap().keys().eq(["error"]) && !body.contains(&owner),
                    "{credentials:?} {method} {path}: {body}"
                );
                // The same answer whether the lock exists or not.
                assert_eq!(first_body.get_or_insert_with(|| body.clone()), &body);
            }
        }

        // Untouched: still held, same fence, and the owner still releases it.
        let status = http
            .send_with(Method::GET, "/admin/locks/account:vault", &[AUTH])
            .await;
        assert_eq!(status.json["locked"], true);
        assert_eq!(status.uint("fence").to_string(), fence);
        http.post("/accounts/vault/deposit?amount=1")
            .await
            .assert_json(StatusCode::TOO_MANY_REQUESTS);
        http.send_with(
            Method::DELETE,
            "/admin/locks/account:vault",
            &[AUTH, ("lock-owner", &owner)],
        )
        .await
        .assert_json(StatusCode::OK);
    })
    .await;
}

// ---------------------------------------------------------------------------
// Statements: one computation per burst (single-flight)

/// `statements_computed` of one bank.
async fn computed(http: &common::bank::Http) -> u64 {
    let stats = http.get("/stats").await;
    stats.assert_json(StatusCode::OK);
    stats.uint("statements_computed")
}

/// `n` concurrent statement requests for `account`, spread over `clients`;
/// their replies.
async fn statement_burst(
    clients: &[common::bank::Http],
    account: &str,
    query: &str,
    n: usize,
) -> Vec<common::bank::Reply> {
    let mut set = JoinSet::new();
    for i in 0..n {
        let http = clients[i % clients.len()].clone();
        let path = format!("/accounts/{account}/statement?{query}");
        set.spawn(async move { http.get(&path).await });
    }
    let mut replies = Vec::new();
    while let Some(reply) = set.join_next().await {
        replies.push(reply.unwrap());
    }
    replies
}

/// Every reply is the same `200` statement of `account` (one computation);
/// one of them says it led, the others that they shared.
fn assert_one_statement(replies: &[common::bank::Reply], account: &str) {
    for r in replies {
        r.assert_json(StatusCode::OK);
        assert_eq!(r.json, replies[0].json, "{}: another computation", r.what);
    }
    assert_eq!(replies[0].json["account"], account);
    assert!(replies[0].json["balance"].is_i64());
    assert!(replies[0].json["computation"].is_u64());
    let leaders = replies
        .iter()
        .filter(|r| r.headers["single-flight"] == "leader")
        .count();
    assert_eq!(leaders, 1, "exactly one request computed");
}

/// Three banks sharing a store: 30 concurrent statement requests spread
/// over them run one computation in all.
async fn three_banks_share_one_statement(flag: &str, url: &str) {
    let banks: Vec<Bank> = (0..3).map(|_| Bank::start_with(&[flag, url])).collect();
    let clients: Vec<common::bank::Http> = banks.iter().map(Bank::http).collect();
    clients[0]
        .post("/accounts/st/deposit?amount=42")
        .await
        .assert_json(StatusCode::OK);
    let mut before = 0;
    for http in &clients {
        before += computed(http).await;
    }
    let replies = statement_burst(&clients, "st", "work_ms=1500", 30).await;
    assert_one_statement(&replies, "st");
    assert_eq!(replies[0].json["balance"], 42);
    let mut after = 0;
    for http in &clients {
        after += computed(http).await;
    }
    assert_eq!(after - before, 1, "the three banks computed more than once");
}

#[tokio::test]
async fn a_statement_burst_computes_once() {
    within_timeout(async {
        let bank = Bank::start();
        let http = bank.http();
        let replies =
            statement_burst(std::slice::from_ref(&http), "solo", "work_ms=1000", 12).await;
        assert_one_statement(&replies, "solo");
        assert_eq!(computed(&http).await, 1);
        // The result TTL defaults to 0: the next request computes again.
        let next = http.get("/accounts/solo/statement?work_ms=0").await;
        next.assert_json(StatusCode::OK);
        assert_ne!(next.json["computation"], replies[0].json["computation"]);
        assert_eq!(computed(&http).await, 2);
    })
    .await;
}

#[tokio::test]
async fn a_statement_result_ttl_answers_later_requests() {
    within_timeout(async {
        let bank = Bank::start();
        let http = bank.http();
        let first = http
            .get("/accounts/cached/statement?work_ms=0&result_ttl_ms=60000")
            .await;
        first.assert_json(StatusCode::OK);
        let again = http
            .get("/accounts/cached/statement?work_ms=0&result_ttl_ms=60000")
            .await;
        again.assert_json(StatusCode::OK);
        assert_eq!(again.json, first.json);
        assert_eq!(again.headers["single-flight"], "shared");
        assert_eq!(computed(&http).await, 1);
    })
    .await;
}

/// A failed computation is a `500` JSON error, never shared nor stored:
/// each waiting request computes in turn.
#[tokio::test]
async fn a_failed_statement_is_500_and_not_shared() {
    within_timeout(async {
        let bank = Bank::start();
        let http = bank.http();
        let replies = statement_burst(
            std::slice::from_ref(&http),
            "broken",
            "work_ms=50&fail=true&result_ttl_ms=60000",
            4,
        )
        .await;
        for r in &replies {
            r.assert_json(StatusCode::INTERNAL_SERVER_ERROR);
            assert_eq!(r.error_code(), "STATEMENT_FAILED");
            assert_eq!(r.headers["single-flight"], "leader");
        }
        assert_eq!(computed(&http).await, 4);
        // Bad parameters: 400, nothing computed.
        for bad in [
            "work_ms=x",
            "work_ms=60001",
            "fail=maybe",
            "result_ttl_ms=-1",
        ] {
            let r = http.get(&format!("/accounts/broken/statement?{bad}")).await;
            r.assert_json(StatusCode::BAD_REQUEST);
        }
        assert_eq!(computed(&http).await, 4);
    })
    .await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_one_statement_on_redis() {
    within_timeout(async {
        let redis = common::redis_server::RedisServer::start();
        three_banks_share_one_statement("--redis", &redis.url()).await;
    })
    .await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_one_statement_on_postgres() {
    within_timeout(async {
        let pg = common::pg_server::PgServer::start();
        three_banks_share_one_statement("--postgres", &pg.url()).await;
    })
    .await;
}

/// The bank computing a statement is killed: the requests waiting in the
/// other banks get one statement, computed by one of them once the dead
/// leader's lock runs out.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_statement_leader_is_replaced() {
    within_timeout(async {
        let redis = common::redis_server::RedisServer::start();
        let url = redis.url();
        let leader_bank = Bank::start_with(&["--redis", &url]);
        let banks: Vec<Bank> = (0..2)
            .map(|_| Bank::start_with(&["--redis", &url]))
            .collect();
        let clients: Vec<common::bank::Http> = banks.iter().map(Bank::http).collect();
        let leader = leader_bank.http();
        let dying = tokio::spawn(async move {
            let _ = leader
                .try_send_with(Method::GET, "/accounts/dead/statement?work_ms=60000", &[])
                .await;
        });
        let watcher = leader_bank.http();
        while computed(&watcher).await == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let others = {
            let clients = clients.clone();
            tokio::spawn(async move { statement_burst(&clients, "dead", "work_ms=100", 8).await })
        };
        drop(leader_bank); // SIGKILL, mid-computation
        let _ = dying.await;
        let replies = others.await.unwrap();
        assert_one_statement(&replies, "dead");
        assert_eq!(
            computed(&clients[0]).await + computed(&clients[1]).await,
            1,
            "one bank took over"
        );
    })
    .await;
}
