//! The `bank` example's shared reads and export permits, driven as a
//! client would (see `bank_example.rs` for how the binary is found).
//!
//! - `POST /accounts/{id}/export` is limited to 2 at once per account
//!   across processes: the store's count of running exports (its own
//!   atomic counter, not the lock's view) never passes 2, as `GET /stats`
//!   of every process shows, and does reach 2.
//! - `GET /accounts/{id}` takes a shared hold: a read that comes while a
//!   deposit holds the account waits for it and sees its write.

use http::StatusCode;
use tokio::task::JoinSet;

mod common;

use common::bank::{ADMIN_TOKEN, Bank, Http, seen_locked, spawn_post, within_timeout};

/// 24 exports of one account (40 ms of work each), spread over `clients`,
/// half of them waiting for a permit: every answer is `200` or `429`, no
/// export ever started beside two others, and two did run together.
async fn exports_never_pass_two_at_once(clients: &[Http]) {
    let mut exports = JoinSet::new();
    for i in 0..24 {
        let http = clients[i % clients.len()].clone();
        let wait_ms = if i % 2 == 0 { 0 } else { 10_000 };
        exports.spawn(async move {
            http.post(&format!(
                "/accounts/acme/export?work_ms=40&wait_ms={wait_ms}"
            ))
            .await
        });
    }
    let (mut done, mut busy) = (0, 0);
    while let Some(reply) = exports.join_next().await {
        let reply = reply.unwrap();
        match reply.status {
            StatusCode::OK => {
                done += 1;
                let running = reply.uint("running");
                assert!((1..=2).contains(&running), "{}", reply.json);
            }
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(reply.error_code(), "LOCK_ACQUISITION_FAILED");
                busy += 1;
            }
            other => panic!("{}: unexpected {other}: {}", reply.what, reply.json),
        }
    }
    assert!(
        done >= 12,
        "every waiting export got a permit: {done} done, {busy} busy"
    );
    let mut most = 0;
    for http in clients {
        let stats = http.get("/stats").await;
        stats.assert_json(StatusCode::OK);
        let seen = stats.json["max_concurrent_exports"]["acme"]
            .as_u64()
            .unwrap_or(0);
        assert!(seen <= 2, "more than 2 exports ran at once: {}", stats.json);
        most = most.max(seen);
    }
    assert_eq!(most, 2, "two exports never ran together");
}

#[tokio::test]
async fn exports_are_limited_to_two_per_account() {
    within_timeout(async {
        let bank = Bank::start();
        exports_never_pass_two_at_once(&[bank.http()]).await;
    })
    .await;
}

#[tokio::test]
async fn bad_export_parameters_are_400() {
    within_timeout(async {
        let bank = Bank::start();
        let http = bank.http();
        for bad in [
            "work_ms=x",
            "work_ms=60001",
            "wait_ms=-1",
            "work_ms=1&work_ms=2",
        ] {
            let reply = http.post(&format!("/accounts/acme/export?{bad}")).await;
            reply.assert_json(StatusCode::BAD_REQUEST);
            assert_eq!(reply.error_code(), "BAD_REQUEST", "{bad}");
        }
    })
    .await;
}

/// A read that arrives while a deposit holds the account waits for the
/// deposit (a shared hold never runs beside the exclusive one) and sees its
/// write; without the hold it would answer the old balance at once.
#[tokio::test]
async fn a_read_waits_for_a_running_deposit_and_sees_its_write() {
    within_timeout(async {
        let bank = Bank::start_with(&["--admin-token", ADMIN_TOKEN]);
        let http = bank.http();
        let deposit = spawn_post(&http, "/accounts/rita/deposit?amount=7&hold_ms=400");
        // Seen held, or already done (a stalled machine): either way the
        // read must answer the deposit's balance.
        seen_locked(&http, "account:rita", &deposit).await;
        let read = http.get("/accounts/rita").await;
        read.assert_json(StatusCode::OK);
        assert_eq!(read.int("balance"), 7, "the read ran beside the deposit");
        deposit.await.unwrap().assert_json(StatusCode::OK);
    })
    .await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_are_limited_across_three_processes_on_redis() {
    within_timeout(async {
        let redis = common::redis_server::RedisServer::start();
        let url = redis.url();
        let banks: Vec<Bank> = (0..3)
            .map(|_| Bank::start_with(&["--redis", &url]))
            .collect();
        let clients: Vec<Http> = banks.iter().map(Bank::http).collect();
        exports_never_pass_two_at_once(&clients).await;
    })
    .await;
}

/// The same limit on etcd: three bank processes on one 3-member cluster,
/// its permits and its own export count both in etcd.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_are_limited_across_three_processes_on_etcd() {
    within_timeout(async {
        let cluster = common::etcd_cluster::EtcdCluster::start(3);
        let endpoints = cluster.endpoints_arg();
        let banks: Vec<Bank> = (0..3)
            .map(|_| Bank::start_with(&["--etcd", &endpoints]))
            .collect();
        let clients: Vec<Http> = banks.iter().map(Bank::http).collect();
        exports_never_pass_two_at_once(&clients).await;
    })
    .await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_are_limited_across_three_processes_on_postgres() {
    within_timeout(async {
        let pg = common::pg_server::PgServer::start();
        let url = pg.url();
        let banks: Vec<Bank> = (0..3)
            .map(|_| Bank::start_with(&["--postgres", &url]))
            .collect();
        let clients: Vec<Http> = banks.iter().map(Bank::http).collect();
        exports_never_pass_two_at_once(&clients).await;
    })
    .await;
}
