//! Single-flight on every backend: `SingleFlight::run` and the HTTP
//! `SingleFlightLayer`. One computation per burst; the result TTL; a failed
//! leader hands over to exactly one waiter; a leader that stops renewing is
//! replaced when its lock runs out; private, failed and oversized responses
//! are not shared; a wait past the max wait is a 429; flights and locks of
//! one name never meet.
//!
//! Bursts are synchronised on state, not time: the leader's computation
//! waits on a gate the test opens once the flight's status shows every
//! other caller queued.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tower::ServiceExt;
use tower_lock::flight::{FlightError, FlightSpec, SingleFlight, SingleFlightLayer};
use tower_lock::{JobSpec, LockError, LockLayer, LockSpec, Locks};

use super::harness::Harness;
use super::support::*;

pub(crate) const LONG: Duration = Duration::from_secs(30);

/// A computation the test controls: counts its runs and waits for the gate.
#[derive(Clone)]
pub(crate) struct Work {
    runs: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
}

impl Default for Work {
    fn default() -> Self {
        Work {
            runs: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }
}

impl Work {
    fn runs(&self) -> usize {
        self.runs.load(SeqCst)
    }

    /// Let `n` computations finish.
    fn open(&self, n: usize) {
        self.gate.add_permits(n);
    }

    /// A computation answering `value` (or failing with `fail`) once let go.
    async fn compute(self, value: u64, fail: bool) -> Result<u64, String> {
        self.runs.fetch_add(1, SeqCst);
        self.gate.acquire().await.expect("open").forget();
        if fail {
            Err("failed".to_owned())
        } else {
            Ok(value)
        }
    }
}

pub(crate) fn flights(h: &Harness) -> SingleFlight {
    SingleFlight::new(&h.backend).max_wait(LONG)
}

/// Wait until `key`'s flight has a leader and `n` queued callers.
pub(crate) async fn until_waiting(h: &Harness, flights: &SingleFlight, key: &str, n: usize) {
    for _ in 0..20_000 {
        let status = flights.status(key).await.expect("status");
        if status.is_some_and(|s| s.waiters >= n) {
            return;
        }
        h.tick().await;
    }
    panic!("{n} callers never queued on the flight");
}

/// Wait until `work` has begun `n` runs.
pub(crate) async fn until_runs(h: &Harness, work: &Work, n: usize) {
    for _ in 0..20_000 {
        if work.runs() >= n {
            return;
        }
        h.tick().await;
    }
    panic!("run {n} never began");
}

/// Nothing is left held on `key`'s flight: at once on a backend that
/// releases inline (memory); on a server once the clean-ups of the callers
/// that left its queue (spawned when they went) have run.
async fn assert_flight_free(h: &Harness, flights: &SingleFlight, key: &str) {
    for _ in 0..20_000 {
        if flights.status(key).await.expect("status").is_none() {
            return;
        }
        assert!(
            !h.releases_inline(),
            "{key}: still held after the last caller"
        );
        h.tick().await;
    }
    panic!("{key}: the flight's lock was never let go");
}

type Outcome = Result<u64, FlightError<String>>;

fn spawn_run(
    set: &mut JoinSet<Outcome>,
    flights: &SingleFlight,
    key: &str,
    ttl: Duration,
    work: &Work,
    value: u64,
    fail: bool,
) {
    let (flights, key, work) = (flights.clone(), key.to_owned(), work.clone());
    set.spawn(async move {
        flights
            .run(&key, ttl, move || work.compute(value, fail))
            .await
    });
}

/// A burst of callers: one computes, every other one gets its result.
pub async fn a_burst_computes_once(h: Harness) {
    let flights = flights(&h);
    let work = Work::default();
    let mut set = JoinSet::new();
    for i in 0..12 {
        spawn_run(
            &mut set,
            &flights,
            "report",
            Duration::ZERO,
            &work,
            100 + i,
            false,
        );
    }
    until_waiting(&h, &flights, "report", 11).await;
    assert_eq!(work.runs(), 1, "one leader computes while the others wait");
    work.open(1);
    let mut values = Vec::new();
    while let Some(outcome) = set.join_next().await {
        values.push(outcome.unwrap().expect("every caller gets a value"));
    }
    assert_eq!(work.runs(), 1);
    assert!(values.windows(2).all(|w| w[0] == w[1]), "{values:?}");
    // Nothing is left held.
    assert_flight_free(&h, &flights, "report").await;
}

/// A result too large to travel in a wake-up message (PostgreSQL sends
/// at most 3800 bytes in its notification) is still shared: the waiters
/// read it from the store.
pub async fn a_large_result_is_shared(h: Harness) {
    let flights = flights(&h);
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let mut set = JoinSet::new();
    for i in 0..4 {
        let (caller, runs, gate) = (flights.clone(), runs.clone(), gate.clone());
        set.spawn(async move {
            caller
                .run("large", Duration::ZERO, move || async move {
                    runs.fetch_add(1, SeqCst);
                    gate.acquire().await.expect("open").forget();
                    Ok::<_, String>(format!("{i}:{}", "x".repeat(20_000)))
                })
                .await
        });
        until_waiting(&h, &flights, "large", i).await;
    }
    gate.add_permits(1);
    let mut values = Vec::new();
    while let Some(outcome) = set.join_next().await {
        values.push(outcome.unwrap().expect("a value"));
    }
    assert_eq!(runs.load(SeqCst), 1, "computed once");
    assert_eq!(values[0].len(), 20_002);
    assert!(values.windows(2).all(|w| w[0] == w[1]));
}

/// The same burst with callers on another handle of the store (another
/// process, for a server backend): still one computation.
pub async fn a_burst_across_two_handles_computes_once(h: Harness) {
    let here = flights(&h);
    let there = SingleFlight::new(h.another()).max_wait(LONG);
    let work = Work::default();
    let mut set = JoinSet::new();
    spawn_run(&mut set, &here, "shared", Duration::ZERO, &work, 1, false);
    until_waiting(&h, &here, "shared", 0).await;
    for i in 0..6 {
        let f = if i % 2 == 0 { &there } else { &here };
        spawn_run(&mut set, f, "shared", Duration::ZERO, &work, 2, false);
    }
    until_waiting(&h, &here, "shared", 6).await;
    work.open(1);
    while let Some(outcome) = set.join_next().await {
        assert_eq!(outcome.unwrap().unwrap(), 1);
    }
    assert_eq!(work.runs(), 1);
}

/// With a zero result TTL the result answers only the callers that were
/// waiting; a caller after it computes again.
pub async fn a_zero_result_ttl_answers_only_the_waiting(h: Harness) {
    let flights = flights(&h);
    let work = Work::default();
    work.open(10);
    let first = flights
        .run("zero", Duration::ZERO, || work.clone().compute(1, false))
        .await
        .unwrap();
    let second = flights
        .run("zero", Duration::ZERO, || work.clone().compute(2, false))
        .await
        .unwrap();
    assert_eq!((first, second, work.runs()), (1, 2, 2));
}

/// A result answers new callers for its result TTL, and not after it.
pub async fn the_result_ttl_is_honoured(h: Harness) {
    let flights = flights(&h);
    let work = Work::default();
    work.open(10);
    let ttl = h.units(4);
    let first = flights
        .run("ttl", ttl, || work.clone().compute(1, false))
        .await
        .unwrap();
    h.advance(h.units(1)).await;
    let cached = flights
        .run("ttl", ttl, || work.clone().compute(2, false))
        .await
        .unwrap();
    assert_eq!((first, cached, work.runs()), (1, 1, 1), "within the TTL");
    h.advance(h.units(4)).await;
    let fresh = flights
        .run("ttl", ttl, || work.clone().compute(3, false))
        .await
        .unwrap();
    assert_eq!(
        (fresh, work.runs()),
        (3, 2),
        "after the TTL it is computed again"
    );
}

/// A failed computation is not shared: its caller gets its error, exactly
/// one waiter computes in its place, and the others get that one's result.
pub async fn a_failed_leader_hands_over_to_exactly_one_waiter(h: Harness) {
    let flights = flights(&h);
    let work = Work::default();
    let mut leader = JoinSet::new();
    spawn_run(
        &mut leader,
        &flights,
        "fails",
        Duration::ZERO,
        &work,
        0,
        true,
    );
    until_waiting(&h, &flights, "fails", 0).await;
    let mut waiters = JoinSet::new();
    for i in 0..5 {
        spawn_run(
            &mut waiters,
            &flights,
            "fails",
            Duration::ZERO,
            &work,
            10 + i,
            false,
        );
        // Queued one by one: the queue's order is known.
        until_waiting(&h, &flights, "fails", i as usize + 1).await;
    }
    work.open(1);
    let failed = leader.join_next().await.unwrap().unwrap();
    assert!(matches!(failed, Err(FlightError::Failed(ref e)) if e == "failed"));
    // The oldest waiter took over and computes; the four others wait on it.
    until_runs(&h, &work, 2).await;
    until_waiting(&h, &flights, "fails", 4).await;
    assert_eq!(work.runs(), 2);
    work.open(1);
    let mut values = Vec::new();
    while let Some(outcome) = waiters.join_next().await {
        values.push(outcome.unwrap().expect("a value"));
    }
    assert_eq!(work.runs(), 2, "exactly one waiter computed");
    assert!(values.windows(2).all(|w| w[0] == w[1]), "{values:?}");
    assert_eq!(values[0], 10, "the oldest waiter computed");
}

/// A flight's first step is dropped after it took the flight's lock (the
/// caller went away; the reply was still on its way): the lock is given
/// back, and the next caller leads at once, not after the lock's TTL.
pub async fn a_flight_begin_dropped_after_taking_the_lock_gives_it_back(h: Harness) {
    let probe = Probe::new(&h.backend);
    probe.hang_flight_replies(true, false);
    let hanging = SingleFlight::new(probe.backend()).lock_ttl(Duration::from_secs(60));
    let run = tokio::spawn(async move {
        hanging
            .run("dropped", Duration::ZERO, || async { Ok::<u32, String>(1) })
            .await
    });
    probe.flight_replies_hung(1).await;
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    let next = SingleFlight::new(&h.backend).max_wait(Duration::from_secs(5));
    let value = next
        .run("dropped", Duration::ZERO, || async { Ok::<u32, String>(2) })
        .await
        .expect("the flight's lock stayed with a caller that went away");
    assert_eq!(value, 2);
}

/// A flight's first step takes the flight's lock, but its reply is lost
/// (the backend answers after the op timeout): the caller gets the error,
/// and the lock goes back; the next caller leads at once.
pub async fn a_flight_begin_whose_reply_was_lost_gives_the_lock_back(h: Harness) {
    let probe = Probe::new(&h.backend);
    probe.lose_flight_begins(true);
    let losing = SingleFlight::new(probe.backend()).lock_ttl(Duration::from_secs(60));
    let lost = losing
        .run("lost", Duration::ZERO, || async { Ok::<u32, String>(1) })
        .await;
    assert!(
        matches!(
            lost,
            Err(FlightError::Lock(LockError::BackendUnavailable(_)))
        ),
        "{lost:?}"
    );
    let next = SingleFlight::new(&h.backend).max_wait(Duration::from_secs(5));
    let value = next
        .run("lost", Duration::ZERO, || async { Ok::<u32, String>(2) })
        .await
        .expect("the flight's lock stayed with a caller whose reply was lost");
    assert_eq!(value, 2);
}

/// A waiter is handed the flight's lock by a leader that failed, and goes
/// away while it reads whether a result came meanwhile: the lock is given
/// back, and the next caller leads at once, not after the lock's TTL.
pub async fn a_waiter_dropped_while_it_reads_the_result_gives_the_lock_back(h: Harness) {
    let flights = flights(&h).lock_ttl(Duration::from_secs(60));
    let work = Work::default();
    let mut leader = JoinSet::new();
    spawn_run(
        &mut leader,
        &flights,
        "handed",
        Duration::ZERO,
        &work,
        0,
        true,
    );
    until_waiting(&h, &flights, "handed", 0).await;
    let probe = Probe::new(&h.backend);
    probe.hang_flight_replies(false, true);
    let follower = tokio::spawn({
        let flights = SingleFlight::new(probe.backend()).lock_ttl(Duration::from_secs(60));
        async move {
            flights
                .run("handed", Duration::ZERO, || async { Ok::<u32, String>(1) })
                .await
        }
    });
    until_waiting(&h, &flights, "handed", 1).await;
    work.open(1);
    assert!(leader.join_next().await.unwrap().unwrap().is_err());
    probe.flight_replies_hung(1).await;
    follower.abort();
    assert!(follower.await.unwrap_err().is_cancelled());
    let next = SingleFlight::new(&h.backend).max_wait(Duration::from_secs(5));
    let value = next
        .run("handed", Duration::ZERO, || async { Ok::<u32, String>(2) })
        .await
        .expect("the flight's lock stayed with a waiter that went away");
    assert_eq!(value, 2);
}

/// A leader that stops renewing its lock (a dead process) is replaced when
/// the lock's TTL runs out: a waiter computes.
pub async fn a_dead_leader_is_replaced_when_its_lock_runs_out(h: Harness) {
    let ttl = h.units(2);
    let dying = SingleFlight::new(h.another())
        .lock_ttl(ttl)
        .watchdog(false)
        .max_wait(LONG);
    let flights = flights(&h);
    let work = Work::default();
    // The leader starts computing, then is never polled again: it neither
    // releases nor renews, as a killed process.
    let leader_work = work.clone();
    let mut leader = Box::pin(async move {
        dying
            .run("dies", Duration::ZERO, move || {
                leader_work.compute(1, false)
            })
            .await
    });
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    for _ in 0..20_000 {
        if work.runs() > 0 {
            break;
        }
        if let std::task::Poll::Ready(ended) = leader.as_mut().poll(&mut cx) {
            panic!("the leader ended before it computed: {ended:?}");
        }
        h.tick().await;
    }
    assert_eq!(work.runs(), 1, "the leader never began");
    let mut waiter = JoinSet::new();
    spawn_run(
        &mut waiter,
        &flights,
        "dies",
        Duration::ZERO,
        &work,
        2,
        false,
    );
    // Queued behind the dead leader; on a real server (its clock cannot be
    // paused) the leader's short TTL may already have run out, and the
    // waiter then took the lock at once: either way it computes.
    for _ in 0..20_000 {
        let queued = flights.status("dies").await.expect("status");
        if work.runs() > 1 || queued.is_some_and(|s| s.waiters >= 1) {
            break;
        }
        h.tick().await;
    }
    h.advance(ttl).await;
    // The waiter got the lock when the leader's ran out, and computes.
    until_runs(&h, &work, 2).await;
    // The gate is first come, first served: the dead leader's wait (never
    // polled again) takes the first permit.
    work.open(2);
    assert_eq!(waiter.join_next().await.unwrap().unwrap().unwrap(), 2);
    std::mem::forget(leader);
}

/// Waiting longer than the max wait fails with a timeout (the layer's 429).
pub async fn waiting_past_the_max_wait_times_out(h: Harness) {
    let flights = flights(&h);
    let impatient = flights.clone().max_wait(h.units(1));
    let work = Work::default();
    let mut leader = JoinSet::new();
    spawn_run(
        &mut leader,
        &flights,
        "slow",
        Duration::ZERO,
        &work,
        1,
        false,
    );
    until_waiting(&h, &flights, "slow", 0).await;
    let waited = impatient
        .run("slow", Duration::ZERO, || work.clone().compute(2, false))
        .await;
    assert!(
        matches!(waited, Err(FlightError::Lock(LockError::Timeout { .. }))),
        "{waited:?}"
    );
    assert_eq!(work.runs(), 1);
    work.open(1);
    assert_eq!(leader.join_next().await.unwrap().unwrap().unwrap(), 1);
}

/// A result over the cap goes to its own caller only: the waiters then
/// compute one at a time.
pub async fn an_oversized_result_is_not_shared(h: Harness) {
    let flights = flights(&h).max_result_bytes(4);
    let work = Work::default();
    let mut set = JoinSet::new();
    // 123456 is 6 bytes of JSON: over the cap.
    spawn_run(
        &mut set,
        &flights,
        "big",
        Duration::ZERO,
        &work,
        123_456,
        false,
    );
    until_waiting(&h, &flights, "big", 0).await;
    for _ in 0..3 {
        spawn_run(
            &mut set,
            &flights,
            "big",
            Duration::ZERO,
            &work,
            123_456,
            false,
        );
    }
    until_waiting(&h, &flights, "big", 3).await;
    for n in 1..=4 {
        // One computes at a time: the others still wait.
        assert_eq!(work.runs(), n);
        work.open(1);
        if n < 4 {
            until_waiting(&h, &flights, "big", 3 - n).await;
            until_runs(&h, &work, n + 1).await;
        }
    }
    while let Some(outcome) = set.join_next().await {
        assert_eq!(outcome.unwrap().unwrap(), 123_456);
    }
    assert_eq!(work.runs(), 4);
}

/// A flight and a lock with the same name are different things.
pub async fn a_flight_and_a_lock_of_one_name_never_meet(h: Harness) {
    let lock = tower_lock::OwnedLock::acquire(&h.backend, &JobSpec::new("same-name", LONG))
        .await
        .unwrap();
    let flights = flights(&h).max_wait(Duration::ZERO);
    let work = Work::default();
    work.open(1);
    let value = flights
        .run("same-name", Duration::ZERO, || {
            work.clone().compute(7, false)
        })
        .await
        .expect("not blocked by the lock");
    assert_eq!(value, 7);
    lock.release().await.unwrap();
}

// ---------------------------------------------------------------------------
// The HTTP layer

/// A route `/statement/{id}` behind a `SingleFlightLayer`; its handler
/// counts runs and waits on `ctl` when the request is gated, and answers
/// with headers the request asks for (`x-answer-header`).
fn statement_app(flights: &SingleFlight, ctl: &Ctl, body: &'static str) -> Router {
    let ctl = ctl.clone();
    let handler = get(move |headers: HeaderMap| {
        let ctl = ctl.clone();
        async move {
            ctl.checkpoint(&headers).await;
            let mut res = http::Response::new(Body::from(body));
            if let Some(v) = headers.get("x-answer-header") {
                let (name, value) = v.to_str().unwrap().split_once(": ").unwrap();
                res.headers_mut().insert(
                    http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    value.parse().unwrap(),
                );
            }
            if let Some(status) = headers.get("x-answer-status") {
                *res.status_mut() = status.to_str().unwrap().parse().unwrap();
            }
            res.headers_mut().insert("x-run", ctl.runs().into());
            res
        }
    });
    let layer = SingleFlightLayer::new(flights.clone(), |req: &Request<Body>| {
        let id = tower_lock::path_params(req).get("id")?.to_owned();
        Some(FlightSpec::new(format!("statement:{id}")))
    });
    Router::new().route("/statement/{id}", handler.layer(layer))
}

pub(crate) fn gated_get(uri: &str, extra: &[(&'static str, &str)]) -> Request<Body> {
    let mut req = Request::get(uri).header(GATE, "1");
    for (name, value) in extra {
        req = req.header(*name, *value);
    }
    req.body(Body::empty()).unwrap()
}

pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: bytes::Bytes,
}

pub(crate) fn spawn_call(set: &mut JoinSet<Answer>, app: &Router, req: Request<Body>) {
    let app = app.clone();
    set.spawn(async move {
        let res = app.oneshot(req).await.unwrap();
        let (parts, body) = res.into_parts();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes(),
        }
    });
}

pub(crate) async fn all(mut set: JoinSet<Answer>) -> Vec<Answer> {
    let mut out = Vec::new();
    while let Some(a) = set.join_next().await {
        out.push(a.unwrap());
    }
    out
}

/// Concurrent requests of one flight: the first runs the handler, the
/// others get a copy of its response (status, headers, body), marked.
pub async fn the_layer_shares_one_response(h: Harness) {
    let flights = flights(&h);
    let ctl = Ctl::default();
    let app = statement_app(&flights, &ctl, "statement of account 7");
    let mut set = JoinSet::new();
    for _ in 0..8 {
        spawn_call(
            &mut set,
            &app,
            gated_get("/statement/7", &[("x-answer-status", "203")]),
        );
    }
    until_waiting(&h, &flights, "statement:7", 7).await;
    ctl.open(8);
    let answers = all(set).await;
    assert_eq!(ctl.runs(), 1, "one handler run");
    let leaders = answers
        .iter()
        .filter(|a| a.headers["single-flight"] == "leader")
        .count();
    assert_eq!(leaders, 1);
    for a in &answers {
        assert_eq!(a.status, StatusCode::NON_AUTHORITATIVE_INFORMATION);
        assert_eq!(a.body, "statement of account 7");
        assert_eq!(a.headers["x-run"], "1");
        assert!(["leader", "shared"].contains(&a.headers["single-flight"].to_str().unwrap()));
    }
    // Another account is another flight; a request without a flight key
    // goes through untouched.
    let other = app
        .clone()
        .oneshot(Request::get("/statement/8").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(other.headers()["single-flight"], "leader");
    assert_eq!(ctl.runs(), 2);
}

/// Responses that belong to one client, or that failed, are not shared:
/// each waiting request then runs the handler itself, one at a time.
pub async fn the_layer_never_shares_private_or_failed_responses(h: Harness) {
    for (i, answer) in [
        ("x-answer-header", "set-cookie: session=secret"),
        ("x-answer-header", "cache-control: private, max-age=60"),
        ("x-answer-header", "cache-control: no-store"),
        ("x-answer-status", "500"),
        // An answer to what one client has or asked a part of.
        ("x-answer-status", "304"),
        ("x-answer-status", "206"),
        // Varies on what cannot be known.
        ("x-answer-header", "vary: *"),
    ]
    .into_iter()
    .enumerate()
    {
        let flights = flights(&h);
        let ctl = Ctl::default();
        let app = statement_app(&flights, &ctl, "private");
        let id = format!("/statement/p{i}");
        let mut set = JoinSet::new();
        for _ in 0..3 {
            spawn_call(&mut set, &app, gated_get(&id, &[answer]));
        }
        let key = format!("statement:p{i}");
        until_waiting(&h, &flights, &key, 2).await;
        for n in 1..=3 {
            // A shared answer would leave this run waiting forever.
            tokio::time::timeout(Duration::from_secs(30), ctl.entered())
                .await
                .unwrap_or_else(|_| panic!("{answer:?}: run {n} never began; was it shared?"));
            // One at a time: the others still wait on the flight.
            assert_eq!(ctl.runs(), n, "{answer:?}");
            ctl.open(1);
        }
        let answers = all(set).await;
        assert_eq!(ctl.runs(), 3, "{answer:?}: every request ran the handler");
        for a in &answers {
            assert_eq!(a.headers["single-flight"], "leader", "{answer:?}");
        }
    }
}

/// A body over the cap is not shared, and reaches its own client whole;
/// the followers run the handler on their own.
pub async fn the_layer_never_shares_an_oversized_body(h: Harness) {
    let flights = flights(&h).max_result_bytes(16);
    let ctl = Ctl::default();
    let body = "a body of more than sixteen bytes, streamed on";
    let app = statement_app(&flights, &ctl, body);
    let mut set = JoinSet::new();
    for _ in 0..3 {
        spawn_call(&mut set, &app, gated_get("/statement/big", &[]));
    }
    until_waiting(&h, &flights, "statement:big", 2).await;
    ctl.open(3);
    let answers = all(set).await;
    assert_eq!(ctl.runs(), 3);
    for a in &answers {
        assert_eq!(a.body, body);
    }
    let led = |a: &&Answer| {
        a.headers
            .get("single-flight")
            .is_some_and(|v| v == "leader")
    };
    assert_eq!(answers.iter().filter(led).count(), 1, "one leader");
    // The others ran outside the flight: no single-flight header.
    let outside = |a: &&Answer| !a.headers.contains_key("single-flight");
    assert_eq!(answers.iter().filter(outside).count(), 2);
}

/// A request that waits longer than the max wait gets the layer's 429.
pub async fn the_layer_answers_429_after_the_max_wait(h: Harness) {
    let flights = flights(&h).max_wait(h.units(1));
    let ctl = Ctl::default();
    let app = statement_app(&flights, &ctl, "slow");
    let mut leader = JoinSet::new();
    spawn_call(&mut leader, &app, gated_get("/statement/slow", &[]));
    ctl.entered().await;
    let res = app
        .clone()
        .oneshot(Request::get("/statement/slow").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().contains_key("retry-after"));
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["error"]["code"], "LOCK_TIMEOUT");
    ctl.open(1);
    assert_eq!(all(leader).await[0].status, StatusCode::OK);
}

/// With a `LockLayer` inside on the same route: only the leader takes the
/// lock, the handler's `Locks` extractor sees it, and the others share.
pub async fn the_layer_works_with_a_lock_layer_and_the_extractor(h: Harness) {
    let flights = flights(&h);
    let ctl = Ctl::default();
    let runs = ctl.clone();
    let handler = get(move |headers: HeaderMap, locks: Locks| {
        let ctl = runs.clone();
        async move {
            ctl.checkpoint(&headers).await;
            let lock = locks.first().expect("the route's lock");
            format!("built under fence {}", lock.fence())
        }
    })
    .layer::<_, std::convert::Infallible>(LockLayer::new(h.backend.clone(), |_: &Request<Body>| {
        Some(LockSpec::global("ledger", Duration::from_secs(30)))
    }))
    .layer::<_, std::convert::Infallible>(SingleFlightLayer::new(
        flights.clone(),
        |_: &Request<Body>| Some(FlightSpec::new("ledger-report")),
    ));
    let app = Router::new().route("/report", handler);
    let mut set = JoinSet::new();
    for _ in 0..4 {
        spawn_call(&mut set, &app, gated_get("/report", &[]));
    }
    until_waiting(&h, &flights, "ledger-report", 3).await;
    ctl.open(1);
    let answers = all(set).await;
    assert_eq!(ctl.runs(), 1);
    let body = &answers[0].body;
    assert!(body.starts_with(b"built under fence "));
    assert!(answers.iter().all(|a| a.body == *body));
    assert_released(&h, &gkey("ledger")).await;
}

/// Waiters are woken by the result itself, not handed it through the lock
/// one after another: after the leader publishes, the lock goes to the
/// oldest waiter, which here is frozen (a stopped process) and does
/// nothing with it; every other waiter still gets the result at once.
pub async fn waiters_are_woken_by_the_result_not_by_the_lock(h: Harness) {
    let flights = flights(&h);
    let work = Work::default();
    let mut leader = JoinSet::new();
    spawn_run(
        &mut leader,
        &flights,
        "woken",
        Duration::ZERO,
        &work,
        5,
        false,
    );
    until_waiting(&h, &flights, "woken", 0).await;
    let frozen = FrozenRun::start(&h, "woken", &work, 1).await;
    let mut others = JoinSet::new();
    for _ in 0..4 {
        spawn_run(
            &mut others,
            &flights,
            "woken",
            Duration::ZERO,
            &work,
            6,
            false,
        );
    }
    until_waiting(&h, &flights, "woken", 5).await;
    work.open(1);
    assert_eq!(leader.join_next().await.unwrap().unwrap().unwrap(), 5);
    // The frozen waiter holds the lock now, and still the others finish.
    while let Some(outcome) = others.join_next().await {
        assert_eq!(outcome.unwrap().unwrap(), 5);
    }
    let holder = flights.status("woken").await.unwrap();
    assert!(holder.is_some(), "the lock went to the frozen waiter");
    // Thawed, it reads the result under the lock and lets the lock go.
    assert_eq!(frozen.thaw().await.unwrap(), 5);
    assert_eq!(work.runs(), 1);
    assert_flight_free(&h, &flights, "woken").await;
}

/// A caller of `run` that queues on a flight and is then frozen, as a
/// stopped process: it never acts until thawed.
enum FrozenRun {
    Unpolled(std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send>>),
    Thread {
        thaw: std::sync::mpsc::Sender<()>,
        done: tokio::sync::oneshot::Receiver<Outcome>,
    },
}

impl FrozenRun {
    /// Start it; frozen once the flight `key` shows `queued` waiters.
    async fn start(h: &Harness, key: &str, work: &Work, queued: usize) -> FrozenRun {
        let flights = SingleFlight::new(h.another()).max_wait(LONG);
        let name = key.to_owned();
        let (key, work) = (key.to_owned(), work.clone());
        let run = async move {
            flights
                .run(&key, Duration::ZERO, move || work.compute(0, false))
                .await
        };
        if h.releases_inline() {
            // In memory: polled until it has queued, then not again.
            let mut fut: std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send>> =
                Box::pin(run);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(
                fut.as_mut().poll(&mut cx).is_pending(),
                "the flight is busy"
            );
            until_waiting(h, &self::flights(h), &name, queued).await;
            return FrozenRun::Unpolled(fut);
        }
        // Its own thread and runtime, blocked once it is queued.
        let (queued_tx, queued_rx) = tokio::sync::oneshot::channel::<()>();
        let (thaw_tx, thaw_rx) = std::sync::mpsc::channel::<()>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let task = tokio::spawn(run);
                let _ = queued_rx.await;
                // Blocks the thread, so the caller's task cannot run.
                let _ = thaw_rx.recv();
                let _ = done_tx.send(task.await.expect("frozen caller"));
            });
        });
        until_waiting(h, &self::flights(h), &name, queued).await;
        let _ = queued_tx.send(());
        FrozenRun::Thread {
            thaw: thaw_tx,
            done: done_rx,
        }
    }

    async fn thaw(self) -> Outcome {
        match self {
            FrozenRun::Unpolled(fut) => fut.await,
            FrozenRun::Thread { thaw, done } => {
                let _ = thaw.send(());
                done.await.expect("the frozen caller's thread ended")
            }
        }
    }
}

/// A result TTL or max wait of `Duration::MAX` ("forever") is clamped as
/// any other long duration: the result is stored and answers the next
/// caller, nothing panics.
pub async fn durations_without_end_saturate(h: Harness) {
    let flights = flights(&h).max_wait(Duration::MAX);
    let work = Work::default();
    work.open(10);
    let first = flights
        .run("forever", Duration::MAX, || work.clone().compute(1, false))
        .await
        .unwrap();
    let cached = flights
        .run("forever", Duration::MAX, || work.clone().compute(2, false))
        .await
        .unwrap();
    assert_eq!((first, cached, work.runs()), (1, 1, 1));
}

/// The result stored for the flight `key`, fresh or only kept.
async fn stored(h: &Harness, key: &str) -> Option<Vec<u8>> {
    let key = tower_lock::LockKey::from_encoded(&format!("f:{key}")).expect("a flight key");
    let result = h.backend.flight_result(&key).await.expect("flight result");
    result.map(|r| r.value.to_vec())
}

/// A result nobody waits for is not kept beyond its result TTL: with a
/// zero TTL it is not stored at all (per-user keys would otherwise pile up
/// results for the whole max wait).
pub async fn a_result_nobody_waits_for_is_not_kept(h: Harness) {
    let flights = flights(&h);
    let work = Work::default();
    work.open(1);
    let value = flights
        .run("alone", Duration::ZERO, || work.clone().compute(1, false))
        .await
        .unwrap();
    assert_eq!(value, 1);
    assert_eq!(stored(&h, "alone").await, None, "nobody waited for it");
}

/// With a result TTL and nobody waiting, the result lives for its TTL, not
/// for the (longer) max wait.
pub async fn a_result_nobody_waits_for_lives_for_its_ttl_alone(h: Harness) {
    let flights = flights(&h);
    let work = Work::default();
    work.open(1);
    flights
        .run("brief", h.units(2), || work.clone().compute(1, false))
        .await
        .unwrap();
    assert_eq!(stored(&h, "brief").await.as_deref(), Some(&b"1"[..]));
    h.advance(h.units(3)).await;
    assert_eq!(stored(&h, "brief").await, None, "past its result TTL");
}

/// A result kept for the callers that queued for it is forgotten when it
/// is no longer kept (the max wait): it is not left in the store for as
/// long as the process lives.
pub async fn a_result_kept_for_waiters_is_forgotten_when_no_longer_kept(h: Harness) {
    let flights = flights(&h).max_wait(h.units(2));
    let work = Work::default();
    let mut set = JoinSet::new();
    spawn_run(&mut set, &flights, "kept", Duration::ZERO, &work, 7, false);
    until_runs(&h, &work, 1).await;
    spawn_run(&mut set, &flights, "kept", Duration::ZERO, &work, 0, false);
    until_waiting(&h, &flights, "kept", 1).await;
    work.open(1);
    while let Some(outcome) = set.join_next().await {
        assert_eq!(outcome.unwrap().unwrap(), 7);
    }
    // Gone once the max wait has passed (a backend may forget it sooner,
    // once every waiter has it); on a server the forgetting may be a
    // timer's write, so it is looked for a unit at a time (never gone:
    // the test fails after 40 units).
    h.advance(h.units(2)).await;
    for _ in 0..40 {
        if stored(&h, "kept").await.is_none() {
            return;
        }
        h.advance(h.unit()).await;
    }
    panic!("the kept result was never forgotten");
}

/// A result kept for the callers that waited for it never answers a
/// later flight's callers once it is no longer kept.
pub async fn a_later_flight_never_gets_an_earlier_result(h: Harness) {
    let flights = flights(&h).max_wait(h.units(2));
    let work = Work::default();
    for (round, value) in [(0usize, 1u64), (1, 2)] {
        let mut set = JoinSet::new();
        spawn_run(
            &mut set,
            &flights,
            "rounds",
            Duration::ZERO,
            &work,
            value,
            false,
        );
        until_runs(&h, &work, round + 1).await;
        spawn_run(
            &mut set,
            &flights,
            "rounds",
            Duration::ZERO,
            &work,
            0,
            false,
        );
        until_waiting(&h, &flights, "rounds", 1).await;
        work.open(1);
        while let Some(outcome) = set.join_next().await {
            assert_eq!(outcome.unwrap().unwrap(), value, "round {round}");
        }
        // The first round's result is no longer kept.
        h.advance(h.units(3)).await;
    }
    assert_eq!(work.runs(), 2);
}
