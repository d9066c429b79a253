//! Fenced writes end to end: the `bank` example with `--fenced`, driven as a
//! client would, shows that a holder which outlives its lease (a TTL shorter
//! than its work, a pause between its last check and its write, a process
//! frozen by SIGSTOP) loses nobody's deposit: the store refuses its write.
//!
//! Each scenario runs on the in-memory backend (one bank process) and, with
//! their features, on one private Redis and one private PostgreSQL shared by
//! two bank processes: the stale holder in one, the newer holder in the
//! other.
//!
//! The invariant every scenario checks: the account's final balance is the
//! sum of the deposits that answered `200`, and its fence is the newest
//! writer's.

use http::StatusCode;
use serde_json::json;

mod common;

use common::bank::{
    ADMIN_TOKEN, Bank, Http, Reply, handler_ran, seen_locked, spawn_post, until_it_happened,
    within_timeout,
};
use tokio::task::JoinHandle;

/// Where the banks of a scenario keep their locks and balances.
enum Store {
    Memory,
    #[cfg(feature = "redis")]
    Redis(common::redis_server::RedisServer),
    #[cfg(feature = "postgres")]
    Postgres(common::pg_server::PgServer),
}

impl Store {
    /// The banks of a scenario, all `--fenced` with the admin API: one
    /// process for memory (its locks live in it), two sharing the server
    /// otherwise.
    fn banks(&self, fenced: bool) -> Vec<Bank> {
        let mut args = vec!["--admin-token".to_owned(), ADMIN_TOKEN.to_owned()];
        if fenced {
            args.push("--fenced".to_owned());
        }
        let server = self.server_args();
        let processes = if server.is_empty() { 1 } else { 2 };
        args.extend(server);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        (0..processes).map(|_| Bank::start_with(&args)).collect()
    }

    /// The bank flags naming the server, if any.
    fn server_args(&self) -> Vec<String> {
        match self {
            Store::Memory => Vec::new(),
            #[cfg(feature = "redis")]
            Store::Redis(server) => vec!["--redis".to_owned(), server.url()],
            #[cfg(feature = "postgres")]
            Store::Postgres(server) => vec!["--postgres".to_owned(), server.url()],
        }
    }
}

/// The stale holder's bank and the newer holder's (the same one on memory).
fn holder_and_newcomer(banks: &[Bank]) -> (Http, Http) {
    (banks[0].http(), banks[banks.len() - 1].http())
}

/// A deposit by `a` on account `id` with `query`, once `b` has seen its lock
/// held; `None` when its short-TTL lock came and went before any poll
/// answered (a stalled machine): the scenario did not happen (see
/// [`until_it_happened`]).
async fn seen_holder(a: &Http, b: &Http, id: &str, query: &str) -> Option<JoinHandle<Reply>> {
    let holder = spawn_post(a, &format!("/accounts/{id}/deposit?{query}"));
    seen_locked(b, &format!("account:{id}"), &holder)
        .await
        .then_some(holder)
}

/// Run `scenario` on every store this build has.
macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                within_timeout(super::$scenario(Store::Memory)).await;
            }

            #[cfg(feature = "redis")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                let server = common::redis_server::RedisServer::start();
                within_timeout(super::$scenario(Store::Redis(server))).await;
            }

            #[cfg(feature = "postgres")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let server = common::pg_server::PgServer::start();
                within_timeout(super::$scenario(Store::Postgres(server))).await;
            }
        }
    )*};
}

on_every_store!(
    ttl_shorter_than_the_hold_loses_nothing,
    a_pause_after_the_last_check_is_refused_by_the_store,
    a_stale_write_between_the_newer_holders_read_and_write_is_refused,
    fenced_balances_answer_their_fence,
);

/// Deposit A holds 1.5 s on a 300 ms TTL without the watchdog; B waits and
/// gets the lock when A's lease ends. A finds its lease over before writing
/// (`LOCK_LOST`): nothing written, B's deposit stands.
async fn ttl_shorter_than_the_hold_loses_nothing(store: Store) {
    let banks = store.banks(true);
    let (a, b) = holder_and_newcomer(&banks);
    let (a, b) = (&a, &b);
    until_it_happened(|n| async move {
        let query = "amount=10&hold_ms=1500&ttl_ms=300";
        let t = format!("t{n}");
        let holder = seen_holder(a, b, &t, query).await?;

        let newer = b
            .post(&format!("/accounts/{t}/deposit?amount=5&wait_ms=20000"))
            .await;
        newer.assert_json(StatusCode::OK);
        assert_eq!(newer.int("balance"), 5);

        let stale = holder.await.unwrap();
        handler_ran(&stale)?;
        stale.assert_json(StatusCode::CONFLICT);
        assert_eq!(stale.error_code(), "LOCK_LOST", "{}", stale.json);

        let account = b.get(&format!("/accounts/{t}")).await;
        assert_eq!(
            account.json,
            json!({"balance": 5, "fence": newer.uint("fence")}),
            "the final balance is the sum of the 200 deposits"
        );
        Some(())
    })
    .await;
}

/// The pause no check in the handler can catch: A passes its `LOCK_LOST`
/// check with its lease still good, then pauses (`pause_ms`, as a GC or swap
/// would) past its 300 ms TTL; B takes the lock and deposits. A's write
/// reaches the store with the older fence and is refused (`STALE_FENCE`).
/// Only the store's fence check stands between A and a lost update here.
async fn a_pause_after_the_last_check_is_refused_by_the_store(store: Store) {
    let banks = store.banks(true);
    let (a, b) = holder_and_newcomer(&banks);
    let (a, b) = (&a, &b);
    until_it_happened(|n| async move {
        let query = "amount=10&pause_ms=1500&ttl_ms=300";
        let p = format!("p{n}");
        let holder = seen_holder(a, b, &p, query).await?;

        let newer = b
            .post(&format!("/accounts/{p}/deposit?amount=5&wait_ms=20000"))
            .await;
        newer.assert_json(StatusCode::OK);

        let stale = holder.await.unwrap();
        handler_ran(&stale)?;
        stale.assert_json(StatusCode::CONFLICT);
        assert_eq!(stale.error_code(), "STALE_FENCE", "{}", stale.json);
        let account = b.get(&format!("/accounts/{p}")).await;
        assert_eq!(
            account.json,
            json!({"balance": 5, "fence": newer.uint("fence")}),
            "the refused write changed nothing"
        );

        // The account goes on: the next deposit builds on B's.
        let next = a.post(&format!("/accounts/{p}/deposit?amount=1")).await;
        next.assert_json(StatusCode::OK);
        assert_eq!(next.int("balance"), 6);
        assert!(next.uint("fence") > newer.uint("fence"));
        Some(())
    })
    .await;
}

/// Why the store remembers the fence a deposit *read* with, not only the
/// one it wrote with: A's lease ends while it pauses; B takes the lock and
/// reads the balance, then holds it a while. A wakes and writes before B
/// does. A check on writes alone would accept A's write (no newer fence has
/// written yet), and B's write would then overwrite it: a lost update with
/// both answering 200.
async fn a_stale_write_between_the_newer_holders_read_and_write_is_refused(store: Store) {
    let banks = store.banks(true);
    let (a, b) = holder_and_newcomer(&banks);
    let (a, b) = (&a, &b);
    until_it_happened(|n| async move {
        let query = "amount=10&pause_ms=800&ttl_ms=300";
        let r = format!("r{n}");
        let holder = seen_holder(a, b, &r, query).await?;

        // B holds from ~300 ms to ~2300 ms: A writes (at ~800 ms) in between.
        let newer = spawn_post(
            b,
            &format!("/accounts/{r}/deposit?amount=5&wait_ms=20000&hold_ms=2000"),
        );
        let stale = holder.await.unwrap();
        handler_ran(&stale)?;
        stale.assert_json(StatusCode::CONFLICT);
        assert_eq!(stale.error_code(), "STALE_FENCE", "{}", stale.json);
        let newer = newer.await.unwrap();
        newer.assert_json(StatusCode::OK);

        let account = b.get(&format!("/accounts/{r}")).await;
        assert_eq!(
            account.json,
            json!({"balance": 5, "fence": newer.uint("fence")})
        );
        Some(())
    })
    .await;
}

/// `GET /accounts/{id}` in fenced mode: the balance and the highest fence
/// the account accepted (0 for an account nobody used).
async fn fenced_balances_answer_their_fence(store: Store) {
    let banks = store.banks(true);
    let (a, b) = holder_and_newcomer(&banks);
    let fresh = a.get("/accounts/new").await;
    fresh.assert_json(StatusCode::OK);
    assert_eq!(fresh.json, json!({"balance": 0, "fence": 0}));

    let first = a.post("/accounts/new/deposit?amount=7").await;
    first.assert_json(StatusCode::OK);
    let second = b.post("/accounts/new/deposit?amount=3").await;
    second.assert_json(StatusCode::OK);
    assert!(second.uint("fence") > first.uint("fence"));
    for http in [&a, &b] {
        let account = http.get("/accounts/new").await;
        assert_eq!(
            account.json,
            json!({"balance": 10, "fence": second.uint("fence")})
        );
    }
}

/// Without `--fenced` the bank keeps its old behaviour, which is the lost
/// update fencing prevents: the holder that outlived its lease writes over
/// the newer holder's deposit, and both answered 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fencing_the_late_holder_overwrites_the_newer_deposit() {
    within_timeout(async {
        let banks = Store::Memory.banks(false);
        let http = &banks[0].http();
        until_it_happened(|n| async move {
            let query = "amount=10&hold_ms=1500&ttl_ms=300";
            let u = format!("u{n}");
            let holder = seen_holder(http, http, &u, query).await?;
            let newer = http
                .post(&format!("/accounts/{u}/deposit?amount=5&wait_ms=20000"))
                .await;
            newer.assert_json(StatusCode::OK);
            let stale = holder.await.unwrap();
            handler_ran(&stale)?;
            stale.assert_json(StatusCode::OK);

            let account = http.get(&format!("/accounts/{u}")).await;
            assert_eq!(
                account.json,
                json!({"balance": 10}),
                "both deposits answered 200 but B's 5 is gone (and no fence is shown)"
            );
            Some(())
        })
        .await;
    })
    .await;
}

/// SIGSTOP the bank process that holds a lock, past its TTL; another process
/// deposits meanwhile; SIGCONT: the frozen holder's write is refused
/// (`STALE_FENCE`) and nothing is lost.
///
/// Without the stop the holder would write in time (its 2 s pause ends
/// within its 3 s TTL): the freeze alone makes it stale. The stop must land
/// after the holder's last check, which follows its read within a
/// millisecond: the test sees the read (the account takes the holder's
/// fence) and then waits 200 ms, to land well inside the 2 s pause, not to
/// synchronise with it.
#[cfg(any(feature = "redis", feature = "postgres"))]
async fn a_frozen_holder_process_writes_nothing(store: Store) {
    let mut banks = store.banks(true);
    let (a, b) = holder_and_newcomer(&banks);
    let holder = spawn_post(
        &a,
        "/accounts/s/deposit?amount=10&pause_ms=2000&ttl_ms=3000",
    );
    while b.get("/accounts/s").await.uint("fence") == 0 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let newer = {
        banks[0].stop();
        // Continued even if the newer deposit fails the test.
        let _resume = Resume(&banks[0]);
        b.post("/accounts/s/deposit?amount=5&wait_ms=20000").await
    };
    newer.assert_json(StatusCode::OK);

    let stale = holder.await.unwrap();
    stale.assert_json(StatusCode::CONFLICT);
    assert_eq!(stale.error_code(), "STALE_FENCE", "{}", stale.json);
    let account = b.get("/accounts/s").await;
    assert_eq!(
        account.json,
        json!({"balance": 5, "fence": newer.uint("fence")})
    );
    for bank in &mut banks {
        assert!(bank.is_running(), "a bank died");
    }
}

/// SIGCONT on drop.
#[cfg(any(feature = "redis", feature = "postgres"))]
struct Resume<'a>(&'a Bank);

#[cfg(any(feature = "redis", feature = "postgres"))]
impl Drop for Resume<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_process_writes_nothing_redis() {
    let server = common::redis_server::RedisServer::start();
    within_timeout(a_frozen_holder_process_writes_nothing(Store::Redis(server))).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_process_writes_nothing_postgres() {
    let server = common::pg_server::PgServer::start();
    within_timeout(a_frozen_holder_process_writes_nothing(Store::Postgres(
        server,
    )))
    .await;
}

/// `--fenced` is a switch: `--fenced=false` is the plain bank, anything else
/// after `=` is a usage error (the flag named, a failure exit status).
#[test]
fn fenced_takes_no_value() {
    let bank = common::bank::bank_binary();
    let out = std::process::Command::new(&bank)
        .args(["--listen", "127.0.0.1:0", "--fenced=maybe"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--fenced"), "{stderr}");
}
