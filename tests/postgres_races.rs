//! `PostgresBackend` under races and faults (issue 21, round 3), each made
//! to happen on purpose against a real, private PostgreSQL: another
//! session holding a lock row, a statement stalled by a trigger, a sweep in
//! an open transaction, database defaults that differ from the backend's,
//! connections cut behind the client's back. Every test asserts where the
//! lock is (and with which fence), never how fast something went.
#![cfg(feature = "postgres")]

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::pg_server::PgServer;
use common::proxy::Proxy;
use tokio::time::Instant;
use tokio_postgres::{Client, NoTls};
use tower_lock::backend::postgres::PostgresBackend;
use tower_lock::backend::{AcquireRequest, FlightStart, Holder, Lease};
use tower_lock::{JobSpec, LockBackend, LockError, LockKey, LockKind, OwnedLock, SharedBackend};

const SEC: Duration = Duration::from_secs(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn backend(url: &str) -> PostgresBackend {
    let b = PostgresBackend::from_url(url).unwrap();
    b.migrate().await.unwrap();
    b
}

fn key(name: &str) -> LockKey {
    LockKey::global(name).unwrap()
}

fn req(name: &str, owner: &str, ttl: Duration, wait: Duration) -> AcquireRequest {
    AcquireRequest::new(key(name), owner, ttl, wait).unwrap()
}

/// A session of the test's own (another client of the database), driven
/// by its connection task.
async fn session(server: &PgServer) -> Client {
    let (client, connection) = tokio_postgres::connect(&server.url(), NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// One lock taken and released on `b`: its connection set up, its
/// statements prepared, before a test stages its fault.
async fn warm_up(b: &PostgresBackend) {
    b.acquire(&req("warm", "w", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    b.release(&key("warm"), Holder::owner_only("w"))
        .await
        .unwrap();
}

/// A server, a backend straight to it, a proxy in front of it, and a
/// backend through the proxy (op timeout 1 s, `connections` connections,
/// warmed up).
async fn behind_a_proxy(connections: usize) -> (PgServer, PostgresBackend, Proxy, PostgresBackend) {
    let server = PgServer::start();
    let direct = backend(&server.url()).await;
    let proxy = Proxy::start(server.port()).await;
    let b = PostgresBackend::builder()
        .op_timeout(SEC)
        .connections(connections)
        .build(&proxy.postgres_url())
        .unwrap();
    warm_up(&b).await;
    (server, direct, proxy, b)
}

/// One number from the server (psql, blocking).
fn count(server: &PgServer, q: &str) -> i64 {
    server.psql(q).parse().unwrap()
}

/// Wait until `n` other sessions wait for a lock of kind `event`
/// (`pg_stat_activity.wait_event`: `tuple`, `transactionid`, `advisory`).
async fn blocked(server: &PgServer, event: &str, n: i64) {
    let q = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND wait_event = '{event}' AND pid <> pg_backend_pid()"
    );
    let deadline = Instant::now() + 10 * SEC;
    while count(server, &q) < n {
        assert!(Instant::now() < deadline, "never {n} blocked on {event}");
        tokio::time::sleep(ms(2)).await;
    }
}

/// Either a transaction lock or a tuple lock: a statement waiting for a
/// row another transaction holds waits for one or the other.
async fn blocked_on_a_row(server: &PgServer, n: i64) {
    let deadline = Instant::now() + 10 * SEC;
    while count(server, BLOCKED_ON_A_ROW) < n {
        assert!(Instant::now() < deadline, "never {n} blocked on a row");
        tokio::time::sleep(ms(2)).await;
    }
}

/// How many other sessions wait for a row (or the transaction holding it).
const BLOCKED_ON_A_ROW: &str = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
     AND wait_event IN ('transactionid', 'tuple') AND pid <> pg_backend_pid()";

/// Wait until the count `q` reads `n` on the server (`what` names it).
async fn until_count(server: &PgServer, q: &str, n: i64, what: &str) {
    let deadline = Instant::now() + 10 * SEC;
    while count(server, q) != n {
        assert!(Instant::now() < deadline, "never {what}");
        tokio::time::sleep(ms(20)).await;
    }
}

/// A shared hold of key "k" for `owner`, no wait.
fn shared_k(owner: &str, ttl: Duration) -> AcquireRequest {
    req("k", owner, ttl, Duration::ZERO)
        .with_kind(LockKind::Shared)
        .unwrap()
}

/// Wait until `n` waiters are queued on `name`.
async fn queued(server: &PgServer, name: &str, n: i64) {
    let q = format!("SELECT count(*) FROM tower_lock.locks_waiters WHERE key = 'g:{name}'");
    let deadline = Instant::now() + 10 * SEC;
    while count(server, &q) != n {
        assert!(Instant::now() < deadline, "never {n} queued on {name}");
        tokio::time::sleep(ms(2)).await;
    }
}

fn spawn_acquire(
    b: &PostgresBackend,
    req: AcquireRequest,
) -> tokio::task::JoinHandle<Result<Lease, LockError>> {
    let b = b.clone();
    tokio::spawn(async move { b.acquire(&req).await })
}

/// Every grant of a lock, in the order they were made: an audit table
/// written at each commit that inserted or changed a lock row (a deferred
/// trigger, so what it records is what committed, while the committing
/// transaction still holds the key's row), numbered as it is written.
fn audit_grants(server: &PgServer) {
    server.psql(
        "CREATE TABLE grants (id bigserial PRIMARY KEY, key text, owner text, fence bigint);
         CREATE FUNCTION audit_grant() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           INSERT INTO grants (key, owner, fence)
             SELECT l.key, l.owner, l.fence FROM tower_lock.locks AS l WHERE l.key = NEW.key;
           RETURN NULL;
         END $$;
         CREATE CONSTRAINT TRIGGER audit_grant AFTER INSERT OR UPDATE ON tower_lock.locks
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION audit_grant();",
    );
}

/// The grants of `name` in grant order: (owner, fence).
fn grants(server: &PgServer, name: &str) -> Vec<(String, u64)> {
    server
        .psql(&format!(
            "SELECT owner || ' ' || fence FROM grants WHERE key = 'g:{name}' ORDER BY id"
        ))
        .lines()
        .map(|l| {
            let (owner, fence) = l.rsplit_once(' ').unwrap();
            (owner.to_owned(), fence.parse().unwrap())
        })
        .fold(Vec::new(), |mut grants, g| {
            // (A commit that only extended the lock records it again.)
            if grants.last() != Some(&g) {
                grants.push(g);
            }
            grants
        })
}

fn assert_fences_grow(grants: &[(String, u64)]) {
    assert!(
        grants.windows(2).all(|w| w[0].1 < w[1].1),
        "fences must grow in the order the lock was granted: {grants:?}"
    );
}

// ------------------------------------------------------- 2. fence order

/// A release that waits behind another session's row lock hands the lock
/// to a queued waiter; a newcomer that started meanwhile (when the
/// hand-off's lease was dated from the release's start, it found that
/// lease expired and took over under the fence it had drawn before
/// waiting, lower than the waiter's). Fences follow grant order, and the
/// waiter's lease starts at its grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_held_up_by_a_row_lock_grants_in_fence_order() {
    let server = PgServer::start();
    let b = backend(&server.url()).await;
    // Another instance: the newcomer's statement does not queue behind the
    // release on a connection they share.
    let other = backend(&server.url()).await;
    audit_grants(&server);
    let held = b
        .acquire(&req("k", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let waiter = spawn_acquire(&b, req("k", "waiter", 300 * ms(1), 10 * SEC));
    queued(&server, "k", 1).await;

    let s = session(&server).await;
    s.batch_execute("BEGIN; SELECT 1 FROM tower_lock.locks WHERE key = 'g:k' FOR UPDATE")
        .await
        .unwrap();
    let release = tokio::spawn({
        let b = b.clone();
        async move {
            b.release(&key("k"), Holder::new("holder", held.fence))
                .await
        }
    });
    blocked_on_a_row(&server, 1).await;
    // More than the waiter's TTL passes while the release waits.
    tokio::time::sleep(ms(400)).await;
    let newcomer = tokio::spawn({
        let other = other.clone();
        async move {
            other
                .acquire(&req("k", "newcomer", 30 * SEC, Duration::ZERO))
                .await
        }
    });
    blocked_on_a_row(&server, 2).await;
    let before_grant: SystemTime = s
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .unwrap()
        .get(0);
    s.batch_execute("COMMIT").await.unwrap();

    release.await.unwrap().unwrap();
    let lease = waiter.await.unwrap().unwrap();
    let newcomer = newcomer.await.unwrap();
    assert!(
        lease.acquired_at >= before_grant,
        "the hand-off's lease starts at the grant, not when the release started"
    );
    if let Ok(taken) = &newcomer {
        assert!(taken.fence > lease.fence, "{taken:?} after {lease:?}");
    }
    assert_fences_grow(&grants(&server, "k"));
}

/// A waiter's re-check that started before its hand-off and waited for
/// the row (behind the release that handed the lock over) finds the lock
/// its own, and refreshes its TTL: from then, not from its own start, which
/// came before the grant and would cut the lease it reports (dated from
/// the grant) short on the server. Chaos checker, PostgreSQL seed 1055: the
/// lock went to the next waiter 10 ms before its holder's lease ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recheck_behind_its_hand_off_keeps_the_whole_lease() {
    let server = PgServer::start();
    let proxy = Proxy::start(server.port()).await;
    let b = backend(&proxy.postgres_url()).await;
    let holder = backend(&server.url()).await;
    let held = holder
        .acquire(&req("k", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let ttl = 30 * SEC;
    let waiter = spawn_acquire(&b, req("k", "waiter", ttl, 20 * SEC));
    queued(&server, "k", 1).await;
    // The grant's notification will not reach the waiter: its re-check
    // finds the lock.
    proxy.hold_pubsub(true);
    // Its re-checks wait in the network until the release waits for the
    // row: the release comes first.
    proxy.hold_commands(true);
    let s = session(&server).await;
    s.batch_execute("BEGIN; SELECT 1 FROM tower_lock.locks WHERE key = 'g:k' FOR UPDATE")
        .await
        .unwrap();
    let release = tokio::spawn({
        let holder = holder.clone();
        async move {
            holder
                .release(&key("k"), Holder::new("holder", held.fence))
                .await
        }
    });
    blocked_on_a_row(&server, 1).await;
    proxy.hold_commands(false);
    // The waiter's re-check (its safety net) waits behind the release.
    blocked_on_a_row(&server, 2).await;
    // The hand-off comes well after the re-check started.
    tokio::time::sleep(ms(300)).await;
    s.batch_execute("COMMIT").await.unwrap();
    release.await.unwrap().unwrap();
    let lease = waiter.await.unwrap().unwrap();
    proxy.hold_pubsub(false);

    let row = s
        .query_one(
            "SELECT owner, fence, acquired_at, expires_at FROM tower_lock.locks WHERE key = 'g:k'",
            &[],
        )
        .await
        .unwrap();
    let (owner, fence): (String, i64) = (row.get(0), row.get(1));
    let (acquired, expires): (SystemTime, SystemTime) = (row.get(2), row.get(3));
    assert_eq!((owner.as_str(), fence as u64), ("waiter", lease.fence));
    // The handle believes the whole TTL from the grant (the reply dates it
    // from where the stored one counts from, not from the re-check's
    // start) ...
    assert_eq!(lease.lasts(), ttl);
    // ... and the server keeps it that long.
    assert!(
        expires
            .duration_since(lease.acquired_at)
            .unwrap_or_default()
            >= ttl,
        "the lease reported from {:?} lasts {ttl:?}, the server keeps the lock only until \
         {:?} after it",
        lease.acquired_at,
        expires
            .duration_since(lease.acquired_at)
            .unwrap_or_default()
    );
    assert!(acquired <= lease.acquired_at + ms(1));
}

/// A waiter's re-check that finds its predecessor's TTL run out is handed
/// the lock then (no release ever came): its lease runs the whole TTL from
/// that hand-off, in what the handle believes and on the server. The reply
/// dated the TTL from the call's start, a little before the hand-off
/// (chaos checker rule 13: up to the time the call waited for the row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recheck_handed_an_expired_lock_reports_its_whole_ttl() {
    let server = PgServer::start();
    let b = backend(&server.url()).await;
    let holder = backend(&server.url()).await;
    holder
        .acquire(&req("k", "holder", ms(300), Duration::ZERO))
        .await
        .unwrap();
    let ttl = 30 * SEC;
    let lease = b.acquire(&req("k", "waiter", ttl, 20 * SEC)).await.unwrap();
    assert_eq!(lease.lasts(), ttl);
    let s = session(&server).await;
    let expires: SystemTime = s
        .query_one(
            "SELECT expires_at FROM tower_lock.locks WHERE key = 'g:k' AND owner = 'waiter'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        expires
            .duration_since(lease.acquired_at)
            .unwrap_or_default()
            >= ttl
    );
}

/// The same through a key held shared: a writer queued behind a reader
/// whose TTL ran out is handed the lock at its re-check, and its lease runs
/// the whole TTL from that hand-off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_handed_a_lock_whose_readers_expired_reports_its_whole_ttl() {
    let server = PgServer::start();
    let b = backend(&server.url()).await;
    let reader = backend(&server.url()).await;
    reader
        .acquire(
            &req("k", "reader", ms(300), Duration::ZERO)
                .with_kind(tower_lock::LockKind::Shared)
                .unwrap(),
        )
        .await
        .unwrap();
    let ttl = 30 * SEC;
    let lease = b.acquire(&req("k", "writer", ttl, 20 * SEC)).await.unwrap();
    assert_eq!(lease.lasts(), ttl);
}

/// A key's last two holds released at the same moment, each release held
/// up behind a row lock (so each read the holds before the other's
/// release committed): the second to run still sees the first's release
/// and drops the key's row with the last hold. Decided on what a release
/// saw before it waited, each would keep the row for the other's hold, and
/// a free key would keep a row (and its kind) until the sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_holds_released_together_leave_no_row() {
    let server = PgServer::start();
    // Two instances: their releases wait in the server side by side, not
    // one behind the other on a shared connection.
    let (a, b) = (backend(&server.url()).await, backend(&server.url()).await);
    let shared = |owner: &str| {
        req("k", owner, 30 * SEC, Duration::ZERO)
            .with_kind(tower_lock::LockKind::Shared)
            .unwrap()
    };
    let first = a.acquire(&shared("first")).await.unwrap();
    let second = b.acquire(&shared("second")).await.unwrap();

    let s = session(&server).await;
    s.batch_execute("BEGIN; SELECT 1 FROM tower_lock.locks WHERE key = 'g:k' FOR UPDATE")
        .await
        .unwrap();
    let releases =
        [(a, "first", first.fence), (b, "second", second.fence)].map(|(backend, owner, fence)| {
            tokio::spawn(async move { backend.release(&key("k"), Holder::new(owner, fence)).await })
        });
    blocked_on_a_row(&server, 2).await;
    s.batch_execute("COMMIT").await.unwrap();
    for release in releases {
        release.await.unwrap().unwrap();
    }

    assert_eq!(
        count(
            &server,
            "SELECT count(*) FROM tower_lock.locks WHERE key = 'g:k'"
        ),
        0,
        "the key's row outlived its last hold"
    );
    assert_eq!(
        count(
            &server,
            "SELECT count(*) FROM tower_lock.locks_holds WHERE key = 'g:k'"
        ),
        0
    );
}

/// A reader holds; a writer queues behind it and gives up (its max wait
/// ends, its entry leaves): the key is no longer marked queued, so its
/// releases and acquires take their fast paths again. The mark stayed, and
/// a key read without a break (its row never goes) took the slow paths for
/// good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_last_waiter_gave_up_is_no_longer_marked_queued() {
    let server = PgServer::start();
    let b = backend(&server.url()).await;
    b.acquire(
        &req("k", "reader", 30 * SEC, Duration::ZERO)
            .with_kind(LockKind::Shared)
            .unwrap(),
    )
    .await
    .unwrap();
    let gave_up = b.acquire(&req("k", "writer", 30 * SEC, ms(200))).await;
    assert!(
        matches!(gave_up, Err(LockError::Timeout { .. })),
        "{gave_up:?}"
    );
    // Its entry goes in the same transaction as the mark.
    queued(&server, "k", 0).await;
    assert_eq!(
        count(
            &server,
            "SELECT count(*) FROM tower_lock.locks WHERE key = 'g:k' AND queued"
        ),
        0,
        "the key is still marked queued with nobody queued"
    );
}

/// An acquire that stalls before its row goes in (a slow trigger stands in
/// for a stalled server process) while another acquisition is granted and
/// force-released: when it goes on, its fence is higher than that one's.
/// Through the acquire statement's fast path, through the function alone
/// (a single-flight's begin), and through a shared hold's (the function's
/// own fast path: the hold goes in under the key's redrawn fence).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_acquire_never_holds_with_an_older_fence() {
    let server = PgServer::start();
    let b = backend(&server.url()).await;
    let other = backend(&server.url()).await;
    audit_grants(&server);
    server.psql(
        "CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           -- (A shared hold's key row names no owner.)
           IF NEW.owner = 'stalled' OR (NEW.owner = '' AND NEW.key = 'g:s') THEN
             PERFORM pg_advisory_xact_lock(42);
           END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER stall BEFORE INSERT ON tower_lock.locks
           FOR EACH ROW EXECUTE FUNCTION stall();",
    );
    let gate = session(&server).await;
    for (name, flight, kind) in [
        ("k", false, LockKind::Exclusive),
        ("f", true, LockKind::Exclusive),
        ("s", false, LockKind::Shared),
    ] {
        gate.batch_execute("SELECT pg_advisory_lock(42)")
            .await
            .unwrap();
        let stalled = tokio::spawn({
            let b = b.clone();
            let r = req(name, "stalled", 30 * SEC, Duration::ZERO)
                .with_kind(kind)
                .unwrap();
            async move {
                if !flight {
                    return b.acquire(&r).await;
                }
                match b.flight_begin(&r).await? {
                    FlightStart::Leader(lease) => Ok(lease),
                    other => panic!("{other:?}"),
                }
            }
        });
        blocked(&server, "advisory", 1).await;
        let first = other
            .acquire(&req(name, "first", 30 * SEC, Duration::ZERO))
            .await
            .unwrap();
        assert!(other.force_release(&key(name)).await.unwrap());
        gate.batch_execute("SELECT pg_advisory_unlock(42)")
            .await
            .unwrap();

        let late = stalled.await.unwrap().unwrap();
        assert!(
            late.fence > first.fence,
            "{name}: granted after fence {}, it holds with fence {}",
            first.fence,
            late.fence
        );
        assert_fences_grow(&grants(&server, name));
    }
}

// ------------------------------------------------- 3. cleanup order

/// 32 tasks acquire one hot key through the crate (which releases what a
/// cancelled acquisition may have taken, and leaves the queue for a
/// dropped waiter), each giving up after 1 to 8 ms. Once they are all
/// done, the lock is free: nobody holds it for a caller that gave up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_give_up_never_keep_the_lock() {
    let server = PgServer::start();
    let b = SharedBackend::new(backend(&server.url()).await);
    let spec = JobSpec::new("hot", 30 * SEC).max_wait(10 * SEC);
    let gave_up = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..32u64)
        .map(|t| {
            let (b, spec, gave_up) = (b.clone(), spec.clone(), gave_up.clone());
            tokio::spawn(async move {
                for i in 0..20u64 {
                    let patience = ms(1 + (t * 5 + i * 3) % 8);
                    match tokio::time::timeout(patience, OwnedLock::acquire(&b, &spec)).await {
                        Ok(Ok(lock)) => lock.release().await.unwrap(),
                        Ok(Err(e)) => panic!("{e:?}"),
                        Err(_) => {
                            gave_up.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    println!(
        "{} of 640 acquisitions gave up",
        gave_up.load(std::sync::atomic::Ordering::Relaxed)
    );
    // Every caller is done: the lock comes free (the crate's cleanups run
    // in the background) long before a 30 s TTL could free it.
    let probe = req("hot", "probe", 30 * SEC, 5 * SEC);
    b.acquire(&probe)
        .await
        .expect("the lock is held for a caller that gave up");
}

/// A cancelled acquire's statement is stuck in the network; calls about
/// the same key are made meanwhile (two status reads, one of them then
/// cancelled too), and the crate's cleanup release follows the cancel.
/// Whatever connections they went out on, and whichever gets through
/// first, the cleanup runs after the acquire: the lock is not left to the
/// caller that gave up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_never_overtakes_the_call_it_cleans_up() {
    let server = PgServer::start();
    let proxy = Proxy::start(server.port()).await;
    let b = backend(&proxy.postgres_url()).await;
    // Which statements ran on the lock table.
    server.psql(
        "CREATE TABLE ran (what text);
         CREATE FUNCTION log_statement() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO ran VALUES (TG_OP); RETURN NULL; END $$;
         CREATE TRIGGER log_statement AFTER INSERT OR DELETE ON tower_lock.locks
           FOR EACH STATEMENT EXECUTE FUNCTION log_statement();",
    );
    let ran = async |server: &PgServer, what: &str| {
        let q = format!("SELECT count(*) FROM ran WHERE what = '{what}'");
        let deadline = Instant::now() + 10 * SEC;
        while count(server, &q) == 0 {
            assert!(Instant::now() < deadline, "no {what} ran");
            tokio::time::sleep(ms(2)).await;
        }
    };
    let shared = SharedBackend::new(b.clone());
    let spec = JobSpec::new("cleanup-order", 30 * SEC);
    proxy.hold_carrying(b"g:cleanup-order");

    let acquire = tokio::spawn({
        let (shared, spec) = (shared.clone(), spec.clone());
        async move { OwnedLock::acquire(&shared, &spec).await.map(drop) }
    });
    proxy.carried(1).await;
    let status = |b: &PostgresBackend| {
        let b = b.clone();
        tokio::spawn(async move { b.status(&key("cleanup-order")).await.map(drop) })
    };
    let first = status(&b);
    proxy.carried(2).await;
    let _second = status(&b);
    proxy.carried(3).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    acquire.abort();
    assert!(acquire.await.unwrap_err().is_cancelled());
    // The cleanup release is sent.
    proxy.carried(4).await;

    // The cleanup goes first, if it went out on a connection of its own
    // (until it has run); then everything, until the acquire has run.
    let (acquired_on, cleanup_on) = (proxy.carrier(0), proxy.carrier(3));
    if cleanup_on != acquired_on {
        proxy.let_go(cleanup_on);
        ran(&server, "DELETE").await;
    }
    proxy.let_go_all();
    ran(&server, "INSERT").await;
    ran(&server, "DELETE").await;

    let probe = req("cleanup-order", "probe", 30 * SEC, 5 * SEC);
    b.acquire(&probe)
        .await
        .expect("the lock is held for the caller that gave up");
}

/// An acquire that timed out on the client may still run on the server:
/// here its commit waits for a synchronous standby that never answers,
/// past the op timeout. The cleanup release that follows (as the crate
/// sends it after a timed-out acquisition) waits for that call on the
/// connection it went out on, instead of running first on a fresh one and
/// finding nothing, and so releases the lock the call then took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_waits_for_the_call_that_timed_out() {
    let server = PgServer::start();
    let b = PostgresBackend::builder()
        .op_timeout(3 * SEC)
        .build(&server.url())
        .unwrap();
    b.migrate().await.unwrap();
    warm_up(&b).await;

    // From now on every commit that wrote waits for a standby.
    server.psql("ALTER SYSTEM SET synchronous_standby_names = 'nobody'");
    server.psql("SELECT pg_reload_conf()");
    while server.psql("SHOW synchronous_standby_names") != "nobody" {
        tokio::time::sleep(ms(5)).await;
    }
    let acquired = b
        .acquire(&req("stalled", "gone", 30 * SEC, Duration::ZERO))
        .await;
    assert!(
        matches!(acquired, Err(LockError::BackendUnavailable(_))),
        "{acquired:?}"
    );
    const SYNC_REP: &str = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'";
    assert_eq!(
        count(&server, SYNC_REP),
        1,
        "the acquire is still committing"
    );

    let cleanup = tokio::spawn({
        let b = b.clone();
        async move { b.release(&key("stalled"), Holder::owner_only("gone")).await }
    });
    // Time for a cleanup that does not wait to run first (it would finish,
    // or be stalled by the standby beside the acquire). One that waits
    // does neither before the standby setting goes.
    let deadline = Instant::now() + SEC;
    while !cleanup.is_finished() && count(&server, SYNC_REP) < 2 && Instant::now() < deadline {
        tokio::time::sleep(ms(5)).await;
    }
    server.psql("ALTER SYSTEM RESET synchronous_standby_names");
    server.psql("SELECT pg_reload_conf()");
    cleanup
        .await
        .unwrap()
        .expect("the cleanup ran before the acquire it cleans up after");

    let probe = req("stalled", "probe", 30 * SEC, Duration::ZERO);
    b.acquire(&probe)
        .await
        .expect("the lock is held for the caller whose acquire timed out");
}

/// An acquire runs on the server, but its connection turns half-open: its
/// reply never comes, nor does the drain's. The cleanup release waits for
/// the drain to give up (the op timeout), then runs on a fresh connection
/// with an op timeout of its own and frees the lock, long before its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_behind_a_half_open_connection_still_runs() {
    let (_server, direct, proxy, b) = behind_a_proxy(2).await;

    proxy.blackhole_open_replies();
    let shared = SharedBackend::new(b.clone());
    let acquired = OwnedLock::acquire(&shared, &JobSpec::new("half-open", 60 * SEC)).await;
    assert!(
        matches!(acquired, Err(LockError::BackendUnavailable(_))),
        "{acquired:?}"
    );
    assert!(
        direct.status(&key("half-open")).await.unwrap().is_some(),
        "the acquire ran on the server"
    );
    direct
        .acquire(&req("half-open", "probe", 30 * SEC, 5 * SEC))
        .await
        .expect("the lock stayed with the caller whose acquire timed out");
}

/// A waiter dropped while the server cannot be reached (its leave lost in
/// the network, the connection cut) leaves the queue once the server is
/// back: its leave is tried again until the entry's deadline. Left behind,
/// the entry is handed the lock by the next release, which then sits with
/// a caller that is gone for the whole TTL, and an outage strands every
/// waiter that gave up during it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiters_leave_is_tried_again_after_an_outage() {
    let (server, direct, proxy, b) = behind_a_proxy(2).await;
    let held = direct
        .acquire(&req("k", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let gone = spawn_acquire(&b, req("k", "gone", 30 * SEC, 60 * SEC));
    queued(&server, "k", 1).await;
    let next = spawn_acquire(&direct, req("k", "next", 30 * SEC, 60 * SEC));
    queued(&server, "k", 2).await;
    let q = "SELECT count(*) FROM tower_lock.locks_waiters WHERE owner = 'gone'";
    assert_eq!(count(&server, q), 1);

    // The outage: what the waiter's process sends waits in the network,
    // then its connections are cut and what waited is lost.
    proxy.hold_commands(true);
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    proxy.held_writes(1).await;
    proxy.sever_all();
    // The outage outlasts the leave's op timeout: the leave fails, and only
    // a leave tried again (on a fresh connection, held too) comes later.
    tokio::time::timeout(10 * SEC, proxy.held_writes(2))
        .await
        .expect("the dropped waiter's leave was never tried again");
    proxy.hold_commands(false);
    let deadline = Instant::now() + 10 * SEC;
    while count(&server, q) != 0 {
        assert!(
            Instant::now() < deadline,
            "the dropped waiter's entry stayed queued"
        );
        tokio::time::sleep(ms(10)).await;
    }
    direct
        .release(&key("k"), Holder::new("holder", held.fence))
        .await
        .unwrap();
    assert_eq!(
        direct.status(&key("k")).await.unwrap().map(|s| s.owner),
        Some("next".to_owned()),
        "the lock went to the waiter that was gone"
    );
    next.await.unwrap().unwrap();
}

/// A drain whose task is dropped with its runtime (a call made on a
/// runtime the app then shuts down) still gives up at its bound: the
/// caller's later calls are not held up by it for the backend's life (each
/// waited twice the op timeout, then failed: a fixed owner token could never
/// again release or take its key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_dropped_with_its_runtime_holds_up_nothing() {
    // One connection: the cleanup below goes to a fresh one, not to another
    // half-open one.
    let (_server, direct, proxy, b) = behind_a_proxy(1).await;

    proxy.blackhole_open_replies();
    let on_its_own = b.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let acquired =
            rt.block_on(on_its_own.acquire(&req("wedge", "worker-1", 60 * SEC, Duration::ZERO)));
        assert!(
            matches!(acquired, Err(LockError::BackendUnavailable(_))),
            "{acquired:?}"
        );
        // The runtime goes here, and the drain's task with it.
    })
    .join()
    .unwrap();
    assert!(
        direct.status(&key("wedge")).await.unwrap().is_some(),
        "the acquire ran on the server"
    );
    b.release(&key("wedge"), Holder::owner_only("worker-1"))
        .await
        .expect("the release was held up by a drain that had ended");
    assert_eq!(direct.status(&key("wedge")).await.unwrap(), None);
}

/// A waiter whose max wait ended leaves, claiming the lock a release
/// handed it meanwhile; the reply is lost and the call sent again (as the
/// backend does after a broken connection). The repeat answers the same
/// claim, for every kind: answering "not held" would leave the lock with a
/// waiter that gave up, and its queue asleep, until its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claiming_leave_sent_twice_answers_the_claim_twice() {
    let server = PgServer::start();
    let _migrated = backend(&server.url()).await;
    let s = session(&server).await;
    for (key, kind, permits) in [
        ("g:x", 0i16, None),
        ("g:s", 1, None),
        ("g:p", 2, Some(1i32)),
    ] {
        let acquire = "SELECT code, fence FROM tower_lock.locks_acquire($1, $2, $3, 30000, $4, 'ch', $5, $6, $7)";
        let holder = s
            .query_one(
                acquire,
                &[&key, &"holder", &1i64, &0i64, &0i64, &kind, &permits],
            )
            .await
            .unwrap();
        assert_eq!(holder.get::<_, i32>(0), 1, "{key}: held");
        let fence: i64 = holder.get(1);
        // A writer queues behind the holder (behind a reader, or the one
        // permit).
        let (w_kind, w_permits) = if kind == 1 {
            (0i16, None)
        } else {
            (kind, permits)
        };
        let queued = s
            .query_one(
                acquire,
                &[
                    &key, &"waiter", &2i64, &10_000i64, &7i64, &w_kind, &w_permits,
                ],
            )
            .await
            .unwrap();
        assert_eq!(queued.get::<_, i32>(0), 0, "{key}: queued");
        s.query_one(
            "SELECT tower_lock.locks_release($1, 'holder', $2)",
            &[&key, &fence],
        )
        .await
        .unwrap();
        let leave = "SELECT code, fence FROM tower_lock.locks_leave($1, 'waiter', 'ch', 7, true)";
        let first = s.query_one(leave, &[&key]).await.unwrap();
        let again = s.query_one(leave, &[&key]).await.unwrap();
        assert_eq!(first.get::<_, i32>(0), 1, "{key}: claimed");
        assert_eq!(
            (again.get::<_, i32>(0), again.get::<_, Option<i64>>(1)),
            (1, first.get::<_, Option<i64>>(1)),
            "{key}: the repeated leave forgot the claim"
        );
    }
}

/// A caller begins a flight while its leader's publish is under way (the
/// result stored, not yet committed, the lock row held): the caller's look
/// for a fresh result cannot see it, and its acquire waits for the row.
/// Once the publish commits, the caller gets that result, not the lock:
/// one handler run per burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flight_begun_during_a_publish_gets_its_result() {
    let server = PgServer::start();
    let _migrated = backend(&server.url()).await;
    let begin = "SELECT code, fence FROM tower_lock.locks_flight_begin('g:f', $1, 1, 30000, 'tl_f', $2, 60000)";
    let leader = session(&server).await;
    let row = leader.query_one(begin, &[&"leader", &1i64]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 1, "the leader takes the lock");
    let fence: i64 = row.get(1);
    leader
        .batch_execute(&format!(
            "BEGIN; SELECT tower_lock.locks_flight_publish('g:f', 'leader', {fence}, '\\x01', 60000, 60000)"
        ))
        .await
        .unwrap();
    let caller = session(&server).await;
    let begun = tokio::spawn(async move {
        caller
            .query_one(begin, &[&"caller", &2i64])
            .await
            .map(|row| row.get::<_, i32>(0))
    });
    blocked_on_a_row(&server, 1).await;
    leader.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        begun.await.unwrap().unwrap(),
        2,
        "the caller led a second run of the burst"
    );
    assert_eq!(
        count(&server, "SELECT count(*) FROM tower_lock.locks"),
        0,
        "no lock left"
    );
}

/// A grant that reaches this backend for a waiter it no longer has (its
/// entry outlived it) goes on to the next waiter at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_to_a_waiter_that_is_gone_goes_to_the_next() {
    let server = PgServer::start();
    let b = backend(&server.url()).await;
    let held = b
        .acquire(&req("k", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let waiter = spawn_acquire(&b, req("k", "waiter", 30 * SEC, 10 * SEC));
    queued(&server, "k", 1).await;
    // An entry of this backend's channel ahead of the waiter, for a ticket
    // no call of it has: the waiter it stood for is gone.
    server.psql(
        "INSERT INTO tower_lock.locks_waiters (key, place, channel, ticket, owner, attempt, ttl_ms, deadline) \
         SELECT key, 0, channel, 999999999, 'gone', 1, 60000, now() + interval '1 min' \
         FROM tower_lock.locks_waiters WHERE key = 'g:k'",
    );
    b.release(&key("k"), Holder::new("holder", held.fence))
        .await
        .unwrap();
    let lease = tokio::time::timeout(10 * SEC, waiter)
        .await
        .expect("the grant to the gone waiter stayed with it")
        .unwrap()
        .unwrap();
    assert!(lease.fence > held.fence);
    assert_eq!(b.status(&key("k")).await.unwrap().unwrap().owner, "waiter");
}

/// A waiter whose grant's notification is held back in the network finds
/// the lock its own by re-checking, and returns. When the notification
/// arrives, its call is gone, so the grant looks abandoned: it must not be
/// passed on, as the lock is in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_its_waiter_claimed_is_never_passed_on() {
    let server = PgServer::start();
    let proxy = Proxy::start(server.port()).await;
    let b = backend(&proxy.postgres_url()).await;
    let held = b
        .acquire(&req("claimed", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let waiter = spawn_acquire(&b, req("claimed", "waiter", 30 * SEC, 10 * SEC));
    queued(&server, "claimed", 1).await;
    proxy.hold_pubsub(true);
    b.release(&key("claimed"), Holder::new("holder", held.fence))
        .await
        .unwrap();
    // Its safety-net re-check finds the lock handed to it.
    let lease = waiter.await.unwrap().unwrap();

    // The late notification sets off a pass-on; the holder's release
    // follows it. Both wait for the key's row, held by another session,
    // the pass-on first (the pass-on was sent first; each is held in the
    // network until the one before it waits for the row, or sent behind
    // it on the same connection): the server runs them in that order.
    // (Let go together, on two connections, the release ran first about
    // one time in four, and a pass-on that came too late hid the bug.)
    let s = session(&server).await;
    s.batch_execute("BEGIN; SELECT 1 FROM tower_lock.locks WHERE key = 'g:claimed' FOR UPDATE")
        .await
        .unwrap();
    proxy.hold_carrying(b"g:claimed");
    proxy.hold_pubsub(false);
    proxy.carried(1).await;
    let release = tokio::spawn({
        let b = b.clone();
        async move {
            b.release(&key("claimed"), Holder::new("waiter", lease.fence))
                .await
        }
    });
    proxy.carried(2).await;
    let (pass_on_on, release_on) = (proxy.carrier(0), proxy.carrier(1));
    proxy.let_go(pass_on_on);
    blocked_on_a_row(&server, 1).await;
    if release_on != pass_on_on {
        proxy.let_go(release_on);
        blocked_on_a_row(&server, 2).await;
    }
    s.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        release.await.unwrap(),
        Ok(()),
        "the waiter's lock was passed on under it"
    );
}

// ---------------------------------------- 4. sweep against a hand-off

/// The sweep deletes a long-dead waiter entry (in a transaction still open)
/// while a release hands the lock over: right after the release, the lock
/// belongs to the live waiter queued behind it, and a newcomer cannot take
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_during_a_release_never_lets_a_newcomer_barge() {
    let server = PgServer::start();
    let b = backend(&server.url()).await;
    let held = b
        .acquire(&req("k", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    // A waiter of a crashed process, dead for two minutes: the sweep's.
    server.psql(
        "INSERT INTO tower_lock.locks_waiters (key, channel, ticket, owner, attempt, ttl_ms, deadline) \
         VALUES ('g:k', 'tower_lock_nobody', 1, 'ghost', 1, 60000, now() - interval '2 min')",
    );
    server.psql("UPDATE tower_lock.locks SET queued = true");
    let waiter = spawn_acquire(&b, req("k", "waiter", 30 * SEC, 10 * SEC));
    queued(&server, "k", 2).await;

    let sweep = session(&server).await;
    sweep
        .batch_execute("BEGIN; SELECT * FROM tower_lock.locks_sweep(0, 1000)")
        .await
        .unwrap();
    let release = tokio::spawn({
        let b = b.clone();
        async move {
            b.release(&key("k"), Holder::new("holder", held.fence))
                .await
        }
    });
    blocked_on_a_row(&server, 1).await;
    sweep.batch_execute("COMMIT").await.unwrap();
    release.await.unwrap().unwrap();

    let st = b.status(&key("k")).await.unwrap();
    assert_eq!(
        st.map(|s| s.owner).as_deref(),
        Some("waiter"),
        "right after the release the lock is the live waiter's"
    );
    assert!(matches!(
        b.acquire(&req("k", "newcomer", 30 * SEC, Duration::ZERO))
            .await,
        Err(LockError::AcquisitionFailed { .. })
    ));
    waiter.await.unwrap().unwrap();
}

/// Two long-dead entries of one key, the one ahead in the queue stored
/// after the other (so the sweep, in physical order, meets them the other
/// way round), while a release hands the key over: the hand-off deletes
/// dead entries in queue order, the sweep in physical order. The sweep
/// skips what another session holds instead of waiting for it, so neither
/// waits for the other in a cycle (PostgreSQL would abort one of them
/// after its deadlock timeout: a failed release, the lock left to its TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_and_a_hand_off_never_deadlock() {
    let server = PgServer::start();
    let b = backend(&server.url()).await;
    let held = b
        .acquire(&req("k", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    for place in [1000, 999] {
        server.psql(&format!(
            "INSERT INTO tower_lock.locks_waiters \
             (key, place, channel, ticket, owner, attempt, ttl_ms, deadline) \
             VALUES ('g:k', {place}, 'tower_lock_nobody', {place}, 'ghost', 1, 60000, \
             now() - interval '2 min')"
        ));
    }
    server.psql("UPDATE tower_lock.locks SET queued = true");
    // Another session holds the entry stored first (queue place 1000).
    let gate = session(&server).await;
    gate.batch_execute(
        "BEGIN; SELECT 1 FROM tower_lock.locks_waiters WHERE place = 1000 FOR UPDATE",
    )
    .await
    .unwrap();
    // The sweep, in a transaction left open: before the fix it waited for
    // that entry here, holding none; now it skips it and holds the other.
    let sweep = tokio::spawn({
        let client = session(&server).await;
        async move {
            let swept = client
                .batch_execute("BEGIN; SELECT * FROM tower_lock.locks_sweep(0, 1000)")
                .await;
            (client, swept)
        }
    });
    let deadline = Instant::now() + 10 * SEC;
    while !sweep.is_finished() && count(&server, BLOCKED_ON_A_ROW) < 1 {
        assert!(
            Instant::now() < deadline,
            "the sweep neither ran nor waited"
        );
        tokio::time::sleep(ms(2)).await;
    }
    let waiting_sweep = i64::from(!sweep.is_finished());
    let release = tokio::spawn({
        let b = b.clone();
        async move {
            b.release(&key("k"), Holder::new("holder", held.fence))
                .await
        }
    });
    // The release's hand-off waits for an entry (the sweep's, or the
    // gate's once it got past the sweep's).
    blocked_on_a_row(&server, 1 + waiting_sweep).await;
    gate.batch_execute("COMMIT").await.unwrap();
    let (client, swept) = sweep.await.unwrap();
    let committed = client.batch_execute("COMMIT").await;
    assert!(
        swept.is_ok() && committed.is_ok(),
        "the sweep failed: {swept:?} {committed:?}"
    );
    release.await.unwrap().expect("the release");
    assert_eq!(b.status(&key("k")).await.unwrap(), None);
}

/// A shared key's row lives at least as long as its latest hold: the row
/// put in with a short hold, a long one taken beside it (its fast path),
/// and the short one run out, a sweep still finds the row live and leaves
/// it, so a writer is refused. Were the row to end with the hold that put
/// it in, the sweep would delete it under the live hold, and the writer's
/// insert of a fresh row would put it beside the reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_leaves_a_shared_key_held_past_the_hold_that_put_its_row_in() {
    let server = PgServer::start();
    let b = backend(&server.url()).await;
    // (The second hold must come while the first is live, to take the
    // fast path: a second of slack for a slow machine.)
    b.acquire(&shared_k("short", SEC)).await.unwrap();
    let long = b.acquire(&shared_k("long", 30 * SEC)).await.unwrap();
    // The short hold runs out by the server's clock.
    let live =
        "SELECT count(*) FROM tower_lock.locks_holds WHERE key = 'g:k' AND expires_at > now()";
    until_count(&server, live, 1, "the short hold run out").await;
    session(&server)
        .await
        .batch_execute("SELECT * FROM tower_lock.locks_sweep(0, 1000)")
        .await
        .unwrap();

    let writer = b
        .acquire(&req("k", "writer", 30 * SEC, Duration::ZERO))
        .await;
    assert!(
        matches!(writer, Err(LockError::AcquisitionFailed { .. })),
        "a writer beside a live reader: {writer:?}"
    );
    let status = b.status(&key("k")).await.unwrap().expect("held");
    assert_eq!(
        status.holders.iter().map(|h| h.fence).collect::<Vec<_>>(),
        vec![long.fence]
    );
}

/// A force release answers whether a live lock was held: for a shared key,
/// a live hold, whatever the key's row says (it may outlive its holds by up
/// to a hold's TTL). Both holds run out, the row still live: nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_release_of_a_shared_key_whose_holds_ran_out_holds_nothing() {
    let server = PgServer::start();
    let b = backend(&server.url()).await;
    // The row goes in with the first hold; the second, longer, taken while
    // the first lives (a second of slack), moves its expiry to twice its
    // TTL: two seconds of a live row after both holds ran out.
    b.acquire(&shared_k("first", SEC)).await.unwrap();
    b.acquire(&shared_k("second", 2 * SEC)).await.unwrap();
    let row_live_holds_gone = "SELECT count(*) FROM tower_lock.locks AS l WHERE l.key = 'g:k' \
         AND l.expires_at > now() AND NOT EXISTS (SELECT 1 FROM tower_lock.locks_holds AS x \
         WHERE x.key = l.key AND x.expires_at > now())";
    until_count(
        &server,
        row_live_holds_gone,
        1,
        "a live row without a live hold",
    )
    .await;
    assert!(
        !b.force_release(&key("k")).await.unwrap(),
        "said held with every hold run out"
    );
    assert_eq!(b.status(&key("k")).await.unwrap(), None);
}

// -------------------------------------------- 5. session settings

/// What each statement on the lock table ran under, recorded by a trigger.
fn record_settings(server: &PgServer) {
    server.psql(
        "CREATE TABLE settings (isolation text, sync text);
         CREATE FUNCTION record_settings() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           INSERT INTO settings VALUES (current_setting('transaction_isolation'),
                                        current_setting('synchronous_commit'));
           RETURN NULL;
         END $$;
         CREATE TRIGGER record_settings AFTER INSERT OR UPDATE OR DELETE ON tower_lock.locks
           FOR EACH STATEMENT EXECUTE FUNCTION record_settings();",
    );
}

fn recorded_settings(server: &PgServer) -> String {
    server.psql("SELECT string_agg(DISTINCT isolation || ' / ' || sync, ', ') FROM settings")
}

/// A database whose defaults are repeatable read and asynchronous commits:
/// the backend's statements run read committed (they rely on it) and
/// synchronously committed (an acknowledged lock and fence survive a
/// crash), on its own pool and on an application's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_run_read_committed_and_synchronous_whatever_the_defaults() {
    let server = PgServer::start();
    backend(&server.url()).await;
    record_settings(&server);
    server.psql("ALTER DATABASE postgres SET default_transaction_isolation = 'repeatable read'");
    server.psql("ALTER DATABASE postgres SET synchronous_commit = off");

    let own = PostgresBackend::from_url(&server.url()).unwrap();
    let lease = own
        .acquire(&req("a", "o", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    own.release(&key("a"), Holder::new("o", lease.fence))
        .await
        .unwrap();
    assert_eq!(recorded_settings(&server), "read committed / on");

    // An application's pool whose connections ask for serializable and
    // local commits.
    let mut config: tokio_postgres::Config = server.url().parse().unwrap();
    config.options("-c default_transaction_isolation=serializable -c synchronous_commit=local");
    let manager = deadpool_postgres::Manager::new(config, NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(4)
        .build()
        .unwrap();
    let app = PostgresBackend::from_pool(pool, &server.url()).unwrap();
    server.psql("TRUNCATE settings");
    let lease = app
        .acquire(&req("b", "o", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    app.release(&key("b"), Holder::new("o", lease.fence))
        .await
        .unwrap();
    assert_eq!(recorded_settings(&server), "read committed / on");

    // A stronger commit level (a synchronous standby's apply) is kept.
    server.psql("ALTER DATABASE postgres SET synchronous_commit = remote_apply");
    server.psql("TRUNCATE settings");
    let strict = PostgresBackend::from_url(&server.url()).unwrap();
    strict
        .acquire(&req("c", "o", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(recorded_settings(&server), "read committed / remote_apply");
}

/// With repeatable read as the database's default, a release that waited
/// for the row while another session changed it failed with a
/// serialization error (40001) and left the lock for its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_concurrent_change_works_under_a_repeatable_read_default() {
    let server = PgServer::start();
    backend(&server.url()).await;
    server.psql("ALTER DATABASE postgres SET default_transaction_isolation = 'repeatable read'");
    let b = PostgresBackend::from_url(&server.url()).unwrap();
    let lease = b
        .acquire(&req("k", "o", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let s = session(&server).await;
    s.batch_execute(
        "BEGIN; UPDATE tower_lock.locks SET expires_at = expires_at + interval '1 s' \
         WHERE key = 'g:k'",
    )
    .await
    .unwrap();
    let release = tokio::spawn({
        let b = b.clone();
        async move { b.release(&key("k"), Holder::new("o", lease.fence)).await }
    });
    blocked_on_a_row(&server, 1).await;
    s.batch_execute("COMMIT").await.unwrap();
    release.await.unwrap().unwrap();
    assert_eq!(b.status(&key("k")).await.unwrap(), None);
}

// ---------------------------------------------- 6. connections cut

/// Every connection of the backend (its operations' and the idle ones in
/// its pool) is cut behind its back, as a PgBouncer or server restart does:
/// no call made afterwards fails, whichever connection it meets first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_after_connections_are_cut_all_succeed() {
    let server = PgServer::start();
    let proxy = Proxy::start(server.port()).await;
    let b = backend(&proxy.postgres_url()).await;
    // Both operation connections in use, and an idle one in the pool.
    let warm: Vec<_> = (0..16)
        .map(|i| spawn_acquire(&b, req(&format!("w{i}"), "o", 30 * SEC, Duration::ZERO)))
        .collect();
    for w in warm {
        w.await.unwrap().unwrap();
    }
    b.migrate().await.unwrap();
    let before = count(
        &server,
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' \
         AND pid <> pg_backend_pid()",
    );
    assert!(before >= 3, "{before} connections");

    proxy.sever_all();
    let deadline = Instant::now() + 10 * SEC;
    while count(
        &server,
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' \
         AND pid <> pg_backend_pid()",
    ) > 0
    {
        assert!(Instant::now() < deadline, "the server kept its sessions");
        tokio::time::sleep(ms(2)).await;
    }

    // Force release first (sent only on a connection that just answered,
    // as it must not run twice), then the rest.
    for i in 0..8 {
        let name = format!("w{i}");
        assert!(
            b.force_release(&key(&name))
                .await
                .unwrap_or_else(|e| panic!("force release {name}: {e:?}"))
        );
    }
    for i in 8..16 {
        let name = format!("w{i}");
        b.extend(&key(&name), Holder::owner_only("o"), 30 * SEC)
            .await
            .unwrap_or_else(|e| panic!("extend {name}: {e:?}"));
        assert_eq!(b.status(&key(&name)).await.unwrap().unwrap().owner, "o");
        b.release(&key(&name), Holder::owner_only("o"))
            .await
            .unwrap_or_else(|e| panic!("release {name}: {e:?}"));
    }
    let lease = b
        .acquire(&req("after", "o", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    assert!(lease.fence > 0);
}

// ------------------------------------- 7. the head's wake-up time (1096)

/// Listen on `channel` from a session of the test's own: every
/// notification's payload, as it arrives.
async fn listen(
    server: &PgServer,
    channel: &str,
) -> (Client, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let (client, mut connection) = tokio_postgres::connect(&server.url(), NoTls).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(msg)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = msg {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {channel}"))
        .await
        .unwrap();
    (client, rx)
}

/// Where `owner`'s waiter of `name` is told things: (channel, ticket).
fn entry_of(server: &PgServer, name: &str, owner: &str) -> (String, i64) {
    let row = server.psql(&format!(
        "SELECT channel || ' ' || ticket FROM tower_lock.locks_waiters \
         WHERE key = 'g:{name}' AND owner = '{owner}'"
    ));
    let (channel, ticket) = row.trim().split_once(' ').unwrap();
    (channel.to_owned(), ticket.parse().unwrap())
}

/// The first `"w <ticket> <µs>"` heard for `ticket`: the µs.
async fn nudged(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>, ticket: i64) -> u64 {
    let prefix = format!("w {ticket} ");
    loop {
        let payload = tokio::time::timeout(10 * SEC, rx.recv())
            .await
            .expect("the head waiter was never told when its lock may be free")
            .unwrap();
        if let Some(us) = payload.strip_prefix(&prefix) {
            return us.parse().unwrap();
        }
    }
}

/// The waiter at the head leaves (its wait ended, or it went away) while
/// the lock is held: the waiter now at the head is told when the lock comes
/// free. It may be sleeping on an older holder's expiry (a hand-off tells
/// only the head of its time, and that head has now left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_head_is_told_when_the_head_leaves() {
    let server = PgServer::start();
    let _migrated = backend(&server.url()).await;
    let s = session(&server).await;
    let acquire = "SELECT code FROM tower_lock.locks_acquire('g:k', $1, $2, 30000, $3, $4, $5)";
    for (owner, attempt, wait, channel, ticket, code) in [
        ("holder", 1i64, 0i64, "tl_h", 0i64, 1i32),
        ("head", 2, 10_000, "tl_head", 1, 0),
        ("next", 3, 10_000, "tl_next", 2, 0),
    ] {
        let row = s
            .query_one(acquire, &[&owner, &attempt, &wait, &channel, &ticket])
            .await
            .unwrap();
        assert_eq!(row.get::<_, i32>(0), code, "{owner}");
    }
    let (_listening, mut rx) = listen(&server, "tl_next").await;
    let left = s
        .query_one(
            "SELECT code FROM tower_lock.locks_leave('g:k', 'head', 'tl_head', 1, false)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(left.get::<_, i32>(0), 0);
    let free_in = nudged(&mut rx, 2).await;
    assert!(
        (20_000_000..=30_000_000).contains(&free_in),
        "told the lock is free in {free_in} µs, not the holder's 30-s TTL"
    );
}

/// Seed 1096 of the fault-schedule checker: a release handed the lock to
/// the waiter at the head, which walked away with it (its process was
/// done); the waiter behind it slept on the old holder's expiry, and got
/// the lock only at its own max wait, 293 ms after the new holder's TTL
/// had run out. A hand-off now tells the waiter that comes to the head how
/// long the new holder holds: right after the release, it has heard the new
/// holder's TTL, and it gets the lock once that runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiter_behind_a_hand_off_hears_how_long_the_new_holder_holds() {
    let server = PgServer::start();
    let b = backend(&server.url()).await;
    let held = b
        .acquire(&req("k", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let first = spawn_acquire(&b, req("k", "first", ms(400), 20 * SEC));
    queued(&server, "k", 1).await;
    let second = spawn_acquire(&b, req("k", "second", 30 * SEC, 20 * SEC));
    queued(&server, "k", 2).await;
    let (channel, ticket) = entry_of(&server, "k", "second");
    let (_session, mut heard) = listen(&server, &channel).await;
    b.release(&key("k"), Holder::new("holder", held.fence))
        .await
        .unwrap();
    let first = first.await.unwrap().unwrap();
    let free_in = nudged(&mut heard, ticket).await;
    assert!(
        free_in > 0 && free_in <= 400_000,
        "told {free_in} µs, the new holder's TTL is 400 ms"
    );
    // The first walks away with the lock: the second gets it at its TTL.
    let second = second.await.unwrap().unwrap();
    assert!(second.fence > first.fence);
    assert_eq!(b.status(&key("k")).await.unwrap().unwrap().owner, "second");
}

/// An extend to a shorter TTL ends the lock sooner than its head waiter
/// last saw: the head is told the new remaining time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_tells_the_head_waiter_how_long_the_holder_now_holds() {
    let server = PgServer::start();
    let b = backend(&server.url()).await;
    let held = b
        .acquire(&req("k", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let waiter = spawn_acquire(&b, req("k", "waiter", 30 * SEC, 20 * SEC));
    queued(&server, "k", 1).await;
    let (channel, ticket) = entry_of(&server, "k", "waiter");
    let (_session, mut heard) = listen(&server, &channel).await;
    b.extend(&key("k"), Holder::new("holder", held.fence), ms(300))
        .await
        .unwrap();
    let free_in = nudged(&mut heard, ticket).await;
    assert!(
        free_in > 0 && free_in <= 300_000,
        "told {free_in} µs, the holder now holds for 300 ms"
    );
    let lease = waiter.await.unwrap().unwrap();
    assert!(lease.fence > held.fence);
}

/// End to end, as the waiter sees it: the holder is released right after
/// the second waiter's re-check (its queue entry rewritten), the first
/// waiter is handed the lock and walks away with it (TTL 100 ms). Nothing
/// but the nudge tells the second that the lock is free 100 ms later: it
/// last saw the old holder's expiry (30 s), and after 4 s of waiting its
/// safety-net re-check comes 1 to 2 s after the last one. So it gets the
/// lock within a few hundred ms with the nudge, and after at least 1 s
/// without (the bound below failed in every run with the waiter ignoring
/// the nudge). The 4 s wait is the condition under test (re-checks that
/// far apart), not a stand-in for a signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_holder_that_walked_away_wakes_at_its_ttl() {
    let server = PgServer::start();
    let b = backend(&server.url()).await;
    let held = b
        .acquire(&req("k", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let first = spawn_acquire(&b, req("k", "first", ms(100), 60 * SEC));
    queued(&server, "k", 1).await;
    let second = spawn_acquire(&b, req("k", "second", 30 * SEC, 60 * SEC));
    queued(&server, "k", 2).await;
    tokio::time::sleep(4 * SEC).await;
    // Each re-check rewrites the entry (its deadline): a new row version.
    let version = || {
        server.psql(
            "SELECT xmin::text FROM tower_lock.locks_waiters \
             WHERE key = 'g:k' AND owner = 'second'",
        )
    };
    let before = version();
    while version() == before {
        tokio::time::sleep(ms(1)).await;
    }
    let released = Instant::now();
    b.release(&key("k"), Holder::new("holder", held.fence))
        .await
        .unwrap();
    let first = first.await.unwrap().unwrap();
    let second = second.await.unwrap().unwrap();
    let took = released.elapsed();
    assert!(second.fence > first.fence);
    assert!(
        took < ms(100) + ms(600),
        "the second waiter got the lock {took:?} after the release, behind a 100 ms holder"
    );
}

/// An extend that waited for the key's row (another transaction held it)
/// until the lock's TTL had passed finds it expired: it answers not found
/// and never revives it. Dated from the statement's start, the expired
/// lock looked live: an exclusive lock came back to life, and a permit
/// did beside the permits others had taken once it ran out (the
/// fault-schedule checker, PostgreSQL seed 1002 with session stops: three
/// holders of two permits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_that_waited_past_the_ttl_never_revives_the_lock() {
    let server = PgServer::start();
    let b = backend(&server.url()).await;
    for (name, kind) in [
        ("x", tower_lock::LockKind::Exclusive),
        ("p", tower_lock::LockKind::Permits(2)),
    ] {
        let r = req(name, "o", ms(300), Duration::ZERO)
            .with_kind(kind)
            .unwrap();
        let lease = b.acquire(&r).await.unwrap();
        let s = session(&server).await;
        s.batch_execute(&format!(
            "BEGIN; SELECT 1 FROM tower_lock.locks WHERE key = 'g:{name}' FOR UPDATE"
        ))
        .await
        .unwrap();
        let extend = tokio::spawn({
            let b = b.clone();
            async move {
                b.extend(&key(name), Holder::new("o", lease.fence), 30 * SEC)
                    .await
            }
        });
        blocked_on_a_row(&server, 1).await;
        // The TTL runs out while the extend waits.
        tokio::time::sleep(ms(400)).await;
        s.batch_execute("COMMIT").await.unwrap();
        let extended = extend.await.unwrap();
        assert!(
            matches!(extended, Err(LockError::NotFound)),
            "{kind}: an extend after the TTL answered {extended:?}"
        );
        assert!(
            b.status(&key(name)).await.unwrap().is_none(),
            "{kind}: revived"
        );
    }
}

/// Two calls of one request (same owner and attempt: a retry sent while the
/// first still waits), shared, queued apart behind a writer: the release
/// hands each its own hold. The second's re-check takes the hold handed to
/// its own ticket. (It took the oldest, the first's, and the hold handed to
/// it was left naming a ticket whose notification nobody would hear once
/// the call returned: idle for a TTL, keeping writers out.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_takes_the_hold_handed_to_its_own_ticket() {
    let server = PgServer::start();
    let _migrated = backend(&server.url()).await;
    let s = session(&server).await;
    let key = "g:twins";
    let acquire = "SELECT code, fence FROM tower_lock.locks_acquire($1, $2, $3, 30000, $4, 'ch', $5, $6, NULL)";
    let holder = s
        .query_one(acquire, &[&key, &"holder", &1i64, &0i64, &0i64, &0i16])
        .await
        .unwrap();
    let fence: i64 = holder.get(1);
    for ticket in [11i64, 12] {
        let queued = s
            .query_one(acquire, &[&key, &"twin", &2i64, &10_000i64, &ticket, &1i16])
            .await
            .unwrap();
        assert_eq!(queued.get::<_, i32>(0), 0, "ticket {ticket}: queued");
    }
    s.query_one(
        "SELECT tower_lock.locks_release($1, 'holder', $2)",
        &[&key, &fence],
    )
    .await
    .unwrap();
    let handed = |ticket: &str| {
        format!(
            "SELECT fence FROM tower_lock.locks_holds WHERE key = $1 AND granted_to = 'ch {ticket}'"
        )
    };
    let second: i64 = s.query_one(&handed("12"), &[&key]).await.unwrap().get(0);
    let retry = s
        .query_one(acquire, &[&key, &"twin", &2i64, &10_000i64, &12i64, &1i16])
        .await
        .unwrap();
    assert_eq!(retry.get::<_, i32>(0), 1);
    assert_eq!(
        retry.get::<_, i64>(1),
        second,
        "the re-check took the hold handed to the other call"
    );
}

/// A waiting call whose own attempt takes the lock (free when it came; one
/// more hold beside readers; free once a holder ran out with only a dead
/// waiter queued), dropped before it reads the reply: its leave gives the
/// lock back. The hold names the call's ticket, as a hand-off to it does;
/// it named nobody, and a custom owner's lock stayed until its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_a_dropped_waiters_own_attempt_took_is_given_back() {
    let server = PgServer::start();
    let _migrated = backend(&server.url()).await;
    let s = session(&server).await;
    let acquire =
        "SELECT code FROM tower_lock.locks_acquire($1, $2, $3, $4, $5, 'ch', $6, $7, NULL)";
    let leave = "SELECT code FROM tower_lock.locks_leave($1, 'waiter', 'ch', $2, false)";
    let held = "SELECT count(*) FROM tower_lock.locks_holds WHERE key = $1 AND owner = 'waiter'";
    for (key, kind, setup) in [
        ("g:free", 0i16, ""),
        ("g:free-shared", 1, ""),
        ("g:beside", 1, "reader"),
        ("g:reclaim", 0, "expired"),
        ("g:after-readers", 0, "reader-expired"),
        ("g:after-readers-shared", 1, "reader-expired"),
    ] {
        match setup {
            "reader" => {
                let r = s
                    .query_one(
                        acquire,
                        &[&key, &"reader", &1i64, &30_000i64, &0i64, &0i64, &1i16],
                    )
                    .await
                    .unwrap();
                assert_eq!(r.get::<_, i32>(0), 1);
            }
            "reader-expired" => {
                // A reader whose hold ran out (its expiry set in the past:
                // the key's row is a shared one, nobody holds it).
                let r = s
                    .query_one(
                        acquire,
                        &[&key, &"reader", &1i64, &30_000i64, &0i64, &0i64, &1i16],
                    )
                    .await
                    .unwrap();
                assert_eq!(r.get::<_, i32>(0), 1);
                run_out(&s, key).await;
            }
            "expired" => {
                // A holder that ran out, a waiter whose max wait ended.
                let r = s
                    .query_one(
                        acquire,
                        &[&key, &"gone", &1i64, &30_000i64, &0i64, &0i64, &0i16],
                    )
                    .await
                    .unwrap();
                assert_eq!(r.get::<_, i32>(0), 1);
                let r = s
                    .query_one(
                        acquire,
                        &[&key, &"late", &2i64, &30_000i64, &10_000i64, &5i64, &0i16],
                    )
                    .await
                    .unwrap();
                assert_eq!(r.get::<_, i32>(0), 0);
                run_out(&s, key).await;
            }
            _ => {}
        }
        let took = s
            .query_one(
                acquire,
                &[
                    &key, &"waiter", &9i64, &30_000i64, &10_000i64, &21i64, &kind,
                ],
            )
            .await
            .unwrap();
        assert_eq!(took.get::<_, i32>(0), 1, "{key}: taken");
        let left = s.query_one(leave, &[&key, &21i64]).await.unwrap();
        assert_eq!(left.get::<_, i32>(0), 2, "{key}: not given back");
        let exclusive: i64 = s
            .query_one(
                "SELECT count(*) FROM tower_lock.locks WHERE key = $1 AND owner = 'waiter'",
                &[&key],
            )
            .await
            .unwrap()
            .get(0);
        let holds: i64 = s.query_one(held, &[&key]).await.unwrap().get(0);
        assert_eq!((exclusive, holds), (0, 0), "{key}: still held");
    }
}

/// Everything of `key` runs out now: its holder, holds and waiters' waits
/// (their times set in the past, as if their TTLs and max waits had ended).
async fn run_out(s: &Client, key: &str) {
    for table in ["locks", "locks_holds"] {
        let q = format!(
            "UPDATE tower_lock.{table} SET expires_at = now() - interval '1 second' WHERE key = $1"
        );
        s.execute(&q, &[&key]).await.unwrap();
    }
    s.execute(
        "UPDATE tower_lock.locks_waiters SET deadline = now() - interval '1 second' WHERE key = $1",
        &[&key],
    )
    .await
    .unwrap();
}

/// A waiting call on a free key takes it at its first attempt (the acquire
/// statement's own fast path), and the reply is lost: the call fails, and
/// its leave gives the lock back. The row named no ticket, so the leave gave
/// nothing back and the lock stayed until its TTL (a custom owner: nothing
/// releases by owner after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_calls_take_whose_reply_was_lost_is_given_back() {
    a_take_whose_reply_was_lost(LockKind::Exclusive).await;
}

/// The same for a shared hold (the acquire function's own fast path puts
/// the key's row and the hold in together; the hold names the ticket).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_calls_shared_take_whose_reply_was_lost_is_given_back() {
    a_take_whose_reply_was_lost(LockKind::Shared).await;
}

async fn a_take_whose_reply_was_lost(kind: LockKind) {
    let (_server, direct, proxy, b) = behind_a_proxy(2).await;
    // A wait first, so that the backend listens (a waiting call's attempts
    // then carry its ticket).
    direct
        .acquire(&req("warm", "holder", 60 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let waited = b.acquire(&req("warm", "w", 60 * SEC, 300 * ms(1))).await;
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    proxy.blackhole_open_replies();
    let taken = b
        .acquire(
            &req("lost", "worker-1", 60 * SEC, 5 * SEC)
                .with_kind(kind)
                .unwrap(),
        )
        .await;
    assert!(
        matches!(taken, Err(LockError::BackendUnavailable(_))),
        "{taken:?}"
    );
    assert!(
        direct.status(&key("lost")).await.unwrap().is_some(),
        "the acquire ran on the server"
    );
    direct
        .acquire(&req("lost", "probe", 30 * SEC, 5 * SEC))
        .await
        .expect("the lock stayed with the call whose reply was lost");
}

/// A waiter gives up as it is handed the lock: its claiming leave lands
/// (the grant marked claimed) but the reply is lost, so the call fails, and
/// the plain leave its failure sends gives the lock back. That leave
/// matched only an unclaimed grant, and the lock stayed until its TTL with
/// a caller that never had it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_reply_was_lost_is_given_back_by_the_leave_after_it() {
    let server = PgServer::start();
    let _migrated = backend(&server.url()).await;
    let s = session(&server).await;
    let acquire = "SELECT code, fence FROM tower_lock.locks_acquire($1, $2, $3, 30000, $4, 'ch', $5, $6, NULL)";
    for (key, kind) in [("g:cx", 0i16), ("g:cs", 1)] {
        let holder = s
            .query_one(acquire, &[&key, &"holder", &1i64, &0i64, &0i64, &0i16])
            .await
            .unwrap();
        let fence: i64 = holder.get(1);
        let queued = s
            .query_one(
                acquire,
                &[&key, &"waiter", &2i64, &10_000i64, &31i64, &kind],
            )
            .await
            .unwrap();
        assert_eq!(queued.get::<_, i32>(0), 0, "{key}: queued");
        s.query_one(
            "SELECT tower_lock.locks_release($1, 'holder', $2)",
            &[&key, &fence],
        )
        .await
        .unwrap();
        let leave = "SELECT code FROM tower_lock.locks_leave($1, 'waiter', 'ch', 31, $2)";
        let claimed = s.query_one(leave, &[&key, &true]).await.unwrap();
        assert_eq!(claimed.get::<_, i32>(0), 1, "{key}: claimed");
        // (That reply lost: the call failed, and its guard leaves.)
        let left = s.query_one(leave, &[&key, &false]).await.unwrap();
        assert_eq!(left.get::<_, i32>(0), 2, "{key}: not given back");
        let held: i64 = s
            .query_one(
                "SELECT (SELECT count(*) FROM tower_lock.locks WHERE key = $1 AND owner = 'waiter') \
                 + (SELECT count(*) FROM tower_lock.locks_holds WHERE key = $1 AND owner = 'waiter')",
                &[&key],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(held, 0, "{key}: still held");
    }
}
