//! Feature `metrics`: every counter moves when its mechanism fires, with the
//! backend and route-pattern labels and never a raw key.
//!
//! One recorder for the whole binary (metrics-util's `DebuggingRecorder`,
//! installed globally): tests run in parallel, so each uses route patterns
//! of its own and reads only its own series.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::{Router, body::Body, routing::post};
use http::{Request, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::sync::Notify;
use tower::ServiceExt;
use tower_lock::flight::{FlightSpec, SingleFlight, SingleFlightLayer};
use tower_lock::{
    LockBackend, LockLayer, LockSpec, Locks, MemoryBackend, SharedBackend, path_params,
};

fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        snapshotter
    })
}

/// What was recorded so far, as (name, labels) → value.
type Series = (String, Vec<(String, String)>);

#[derive(Clone, Debug)]
enum Value {
    Counter(u64),
    Histogram(Vec<f64>),
}

/// Every metric recorded so far. A snapshot of the debugging recorder
/// drains it (counters to zero, histograms emptied) and tests run in
/// parallel, so every snapshot is added to one running total, which a
/// reading copies.
struct Reading(Vec<(Series, Value)>);

fn read() -> Reading {
    static TOTAL: OnceLock<Mutex<HashMap<Series, Value>>> = OnceLock::new();
    let mut total = TOTAL.get_or_init(Mutex::default).lock().unwrap();
    for (key, _, _, value) in snapshotter().snapshot().into_vec() {
        let (_, key) = key.into_parts();
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        let entry = total.entry((key.name().to_owned(), labels));
        match value {
            DebugValue::Counter(n) => {
                let v = entry.or_insert(Value::Counter(0));
                let Value::Counter(sum) = v else {
                    panic!("{v:?}")
                };
                *sum += n;
            }
            DebugValue::Histogram(xs) => {
                let v = entry.or_insert(Value::Histogram(Vec::new()));
                let Value::Histogram(all) = v else {
                    panic!("{v:?}")
                };
                all.extend(xs.iter().map(|x| x.into_inner()));
            }
            DebugValue::Gauge(_) => panic!("this crate records no gauge"),
        }
    }
    Reading(
        total
            .iter()
            .map(|(series, v)| (series.clone(), v.clone()))
            .collect(),
    )
}

impl Reading {
    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Value> + 'a {
        self.0.iter().filter_map(move |((n, ls), v)| {
            let all = labels
                .iter()
                .all(|(k, want)| ls.iter().any(|(lk, lv)| lk == k && lv == want));
            (n == name && all).then_some(v)
        })
    }

    /// The sum of the counters `name` whose labels include `labels`.
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.matching(name, labels)
            .map(|v| match v {
                Value::Counter(n) => *n,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum()
    }

    /// The samples of the histograms `name` whose labels include `labels`.
    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.matching(name, labels)
            .flat_map(|v| match v {
                Value::Histogram(xs) => xs.clone(),
                other => panic!("{name} is not a histogram: {other:?}"),
            })
            .collect()
    }

    /// Every label value recorded for `route`, to check none is a raw key.
    fn label_values(&self, route: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|((_, ls), _)| ls.iter().any(|(k, v)| k == "route" && v == route))
            .flat_map(|((_, ls), _)| ls.iter().map(|(_, v)| v.clone()))
            .collect()
    }
}

const ACQ: &str = "tower_lock_acquisitions_total";

/// `/{prefix}/{id}` locking `acct:{id}` (global scope: shared by every
/// prefix) with `max_wait`; its handler holds the lock until `release` is
/// notified (after telling `entered`). The id `bad` makes an invalid spec.
fn holding_app(
    backend: impl Into<SharedBackend>,
    prefix: &str,
    max_wait: Duration,
    held: Arc<Gate>,
) -> Router {
    let layer = LockLayer::new(backend, move |req: &Request<Body>| {
        let id = path_params(req).get("id")?.to_owned();
        if id == "bad" {
            // An empty key: the request is refused with 400 before any backend call.
            return Some(LockSpec::new("", Duration::from_secs(30)));
        }
        Some(LockSpec::global(format!("acct:{id}"), Duration::from_secs(30)).max_wait(max_wait))
    });
    Router::new().route(
        &format!("/{prefix}/{{id}}"),
        post(move |_: Locks| {
            let held = held.clone();
            async move {
                held.entered.notify_one();
                held.release.notified().await;
                "done"
            }
        })
        .layer(layer),
    )
}

#[derive(Default)]
struct Gate {
    entered: Notify,
    release: Notify,
}

async fn post_status(app: &Router, path: &str) -> StatusCode {
    app.clone()
        .oneshot(Request::post(path).body(Body::empty()).unwrap())
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn acquisitions_count_by_outcome_acquired_busy_timeout_invalid() {
    snapshotter(); // installed before anything records
    let backend = SharedBackend::new(MemoryBackend::new());
    let gate = Arc::new(Gate::default());
    let busy = holding_app(backend.clone(), "m1", Duration::ZERO, gate.clone());
    let waiting = holding_app(
        backend.clone(),
        "m1w",
        Duration::from_millis(30),
        gate.clone(),
    );
    let route = "/m1/{id}";

    // A holder in its handler...
    let holder = tokio::spawn({
        let app = busy.clone();
        async move { post_status(&app, "/m1/7").await }
    });
    gate.entered.notified().await;
    // ...a second request on the same account without waiting: busy (429).
    assert_eq!(
        post_status(&busy, "/m1/7").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // One that waits 30 ms: still held then, timeout (429).
    assert_eq!(
        post_status(&waiting, "/m1w/7").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A spec with an empty key: invalid (400), the backend never asked.
    assert_eq!(post_status(&busy, "/m1/bad").await, StatusCode::BAD_REQUEST);
    gate.release.notify_one();
    assert_eq!(holder.await.unwrap(), StatusCode::OK);

    let r = read();
    let labels = |outcome| {
        [
            ("backend", "memory"),
            ("route", route),
            ("outcome", outcome),
        ]
    };
    assert_eq!(r.counter(ACQ, &labels("acquired")), 1);
    assert_eq!(r.counter(ACQ, &labels("busy")), 1);
    assert_eq!(r.counter(ACQ, &labels("invalid")), 1);
    assert_eq!(
        r.counter(
            ACQ,
            &[
                ("backend", "memory"),
                ("route", "/m1w/{id}"),
                ("outcome", "timeout")
            ]
        ),
        1
    );
    // The wait: one sample per backend answer (none for the invalid spec);
    // the timeout waited its 30 ms.
    assert_eq!(
        r.samples("tower_lock_acquire_wait_seconds", &[("route", route)])
            .len(),
        2
    );
    let timed_out = r.samples(
        "tower_lock_acquire_wait_seconds",
        &[("route", "/m1w/{id}"), ("outcome", "timeout")],
    );
    assert!(
        timed_out.len() == 1 && timed_out[0] >= 0.030,
        "{timed_out:?}"
    );
    // Held while the handler ran, released once: one sample.
    assert_eq!(
        r.samples("tower_lock_held_seconds", &[("route", route)])
            .len(),
        1
    );
    // Labels are the backend's name, the route pattern and the outcome:
    // never the key or the path's id.
    for value in r.label_values(route) {
        assert!(
            !value.contains("acct") && !value.contains("/m1/7"),
            "{value}"
        );
    }
}

#[tokio::test]
async fn watchdog_renewals_lost_locks_and_failed_releases_are_counted() {
    snapshotter(); // installed before anything records
    let backend = SharedBackend::new(MemoryBackend::new());
    let route = "/m2/{id}";
    let layer = LockLayer::new(backend.clone(), |_: &Request<Body>| {
        Some(LockSpec::new("m2", Duration::from_millis(150)).watchdog(true))
    });
    let app = Router::new().route(
        route,
        post(move |locks: Locks| {
            async move {
                let lock = locks.first().unwrap();
                // Renewed every TTL/3 while held: wait until the lock has
                // outlived its first TTL, which only renewals allow.
                tokio::time::sleep(Duration::from_millis(300)).await;
                assert!(!lock.is_lost(), "the watchdog keeps it");
                // Someone takes it away (an operator's force release): the
                // next renewal finds it gone and the lock is lost.
                let backend = locks.backend().clone();
                assert!(backend.force_release(lock.lock_key()).await.unwrap());
                lock.lost().await;
                "lost"
            }
        })
        .layer(layer),
    );
    // The response (and its release) is over when this returns.
    assert_eq!(post_status(&app, "/m2/1").await, StatusCode::OK);

    let r = read();
    let l = [("backend", "memory"), ("route", route)];
    assert!(r.counter("tower_lock_watchdog_renewals_total", &l) >= 2);
    assert_eq!(
        r.counter(
            "tower_lock_watchdog_renewal_failures_total",
            &[("route", route), ("code", "LOCK_NOT_FOUND")]
        ),
        1
    );
    assert_eq!(r.counter("tower_lock_locks_lost_total", &l), 1);
    // The response's release then finds nothing to release.
    assert_eq!(
        r.counter(
            "tower_lock_release_failures_total",
            &[("route", route), ("code", "LOCK_NOT_FOUND")]
        ),
        1
    );
    // No backend error: every answer came.
    assert_eq!(r.counter("tower_lock_backend_errors_total", &l), 0);
}

#[tokio::test]
async fn single_flight_outcomes_leader_shared_fresh() {
    snapshotter(); // installed before anything records
    // Flights have the backend label only; this is the binary's one flight test.
    let flights = SingleFlight::new(MemoryBackend::new());
    let started = Arc::new(Notify::new());
    let finish = Arc::new(Notify::new());
    let leader = tokio::spawn({
        let (flights, started, finish) = (flights.clone(), started.clone(), finish.clone());
        async move {
            flights
                .run("report", Duration::from_secs(60), || async move {
                    started.notify_one();
                    finish.notified().await;
                    Ok::<_, std::io::Error>(42)
                })
                .await
                .unwrap()
        }
    });
    started.notified().await;
    // A caller while the leader computes waits for its result.
    let follower = tokio::spawn({
        let flights = flights.clone();
        async move {
            flights
                .run("report", Duration::from_secs(60), || async {
                    Ok::<_, std::io::Error>(0)
                })
                .await
                .unwrap()
        }
    });
    // It is queued once the flight's status counts it.
    while flights.status("report").await.unwrap().map(|s| s.waiters) != Some(1) {
        tokio::task::yield_now().await;
    }
    finish.notify_one();
    assert_eq!(leader.await.unwrap(), 42);
    assert_eq!(follower.await.unwrap(), 42);
    // Within the result TTL: the stored result.
    let fresh = flights
        .run("report", Duration::from_secs(60), || async {
            Ok::<_, std::io::Error>(0)
        })
        .await
        .unwrap();
    assert_eq!(fresh, 42);

    let r = read();
    let n = |outcome| {
        r.counter(
            "tower_lock_flights_total",
            &[("backend", "memory"), ("outcome", outcome)],
        )
    };
    assert_eq!((n("leader"), n("shared"), n("fresh")), (1, 1, 1));
    // A flight's own lock is not counted as a lock acquisition.
    assert_eq!(r.counter(ACQ, &[("route", "")]), 0);

    // Through the layer: a request that refuses the stored result it finds
    // (`no-cache`) is counted once, by the flight of such requests it
    // leads, not as `fresh` too.
    let layer = SingleFlightLayer::new(flights.clone(), |_: &Request<Body>| {
        Some(FlightSpec::new("page").result_ttl(Duration::from_secs(60)))
    });
    let app = Router::new().route(
        "/page",
        axum::routing::get(|| async { "page" }).layer(layer),
    );
    for cache in ["", "", "no-cache"] {
        let mut req = Request::get("/page");
        if !cache.is_empty() {
            req = req.header("cache-control", cache);
        }
        let res = app
            .clone()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    let r = read();
    let n = |outcome| {
        r.counter(
            "tower_lock_flights_total",
            &[("backend", "memory"), ("outcome", outcome)],
        )
    };
    assert_eq!((n("leader"), n("shared"), n("fresh")), (3, 1, 2));
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn an_unreachable_backend_counts_unavailable_and_a_backend_error() {
    snapshotter(); // installed before anything records
    use common::redis_server::RedisServer;

    let mut redis = RedisServer::start();
    let backend = tower_lock::RedisBackend::from_url(&redis.url())
        .unwrap()
        .op_timeout(Duration::from_millis(500));
    let gate = Arc::new(Gate::default());
    let app = holding_app(backend, "m4", Duration::ZERO, gate.clone());
    let route = "/m4/{id}";

    let first = tokio::spawn({
        let app = app.clone();
        async move { post_status(&app, "/m4/1").await }
    });
    gate.entered.notified().await;
    gate.release.notify_one();
    assert_eq!(first.await.unwrap(), StatusCode::OK);
    redis.kill();
    assert_eq!(
        post_status(&app, "/m4/2").await,
        StatusCode::SERVICE_UNAVAILABLE
    );

    let r = read();
    let labels = |outcome| [("backend", "redis"), ("route", route), ("outcome", outcome)];
    assert_eq!(r.counter(ACQ, &labels("acquired")), 1);
    assert_eq!(r.counter(ACQ, &labels("unavailable")), 1);
    assert_eq!(
        r.counter(
            "tower_lock_backend_errors_total",
            &[("backend", "redis"), ("route", route), ("op", "acquire")]
        ),
        1
    );
}

#[test]
fn backends_name_themselves_for_the_backend_label() {
    assert_eq!(MemoryBackend::new().name(), "memory");
    assert_eq!(SharedBackend::new(MemoryBackend::new()).name(), "memory");
}

/// Acquisitions are labelled with their kind: `exclusive`, `shared`, or
/// `permits` (without the number, so the series stay few).
#[tokio::test]
async fn acquisitions_are_labelled_with_their_kind() {
    snapshotter();
    let backend = SharedBackend::new(MemoryBackend::new());
    let app = Router::new().route(
        "/kinds/{kind}",
        post(|| async { "done" }).layer(LockLayer::from_fn(backend, |req: &Request<Body>| {
            let kind = path_params(req).get("kind")?.parse().ok()?;
            Some(LockSpec::global("kinds", Duration::from_secs(30)).kind(kind))
        })),
    );
    for kind in ["exclusive", "shared", "shared", "permits=3"] {
        let status = post_status(&app, &format!("/kinds/{kind}")).await;
        assert_eq!(status, StatusCode::OK);
    }
    let r = read();
    let count = |kind| {
        r.counter(
            ACQ,
            &[
                ("route", "/kinds/{kind}"),
                ("kind", kind),
                ("outcome", "acquired"),
            ],
        )
    };
    assert_eq!(
        (count("exclusive"), count("shared"), count("permits")),
        (1, 2, 1)
    );
}
