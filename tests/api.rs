//! The public API as a new user meets it (issue 26): closures that infer,
//! errors that are responses, the extractor of a request's one lock, the
//! rejection hook on both layers. On the memory backend: what is checked
//! here is the API's shape and answers, not a backend's behaviour.

use std::time::Duration;

use axum::body::Body;
use axum::routing::{get, post};
use axum::{Json, Router};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt};
use tower_lock::flight::{FlightSpec, SingleFlight, SingleFlightLayer};
use tower_lock::{
    HeldLock, JobSpec, LockError, LockKey, LockLayer, LockSpec, Locks, MemoryBackend,
    SharedBackend, default_rejection, path_params,
};

const TTL: Duration = Duration::from_secs(30);

async fn send(app: &Router, method: &str, path: &str) -> (StatusCode, http::HeaderMap, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (parts.status, parts.headers, json)
}

/// Hold `key` (global) so that the next request for it is refused.
async fn hold(backend: &SharedBackend, key: &str) -> tower_lock::OwnedLock {
    tower_lock::OwnedLock::acquire(backend, &JobSpec::new(key, TTL))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_lock_error_answers_as_the_layer_would() {
    async fn handler() -> Result<String, LockError> {
        Err(LockError::AcquisitionFailed {
            retry_after: Some(Duration::from_millis(1500)),
        })
    }
    let app = Router::new().route("/h", post(handler));
    let (status, headers, body) = send(&app, "POST", "/h").await;
    let expected = default_rejection(&LockError::AcquisitionFailed {
        retry_after: Some(Duration::from_millis(1500)),
    });
    assert_eq!(status, expected.status());
    assert_eq!(headers["retry-after"], "2");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(body["error"]["code"], "LOCK_ACQUISITION_FAILED");
}

#[tokio::test]
async fn from_fn_infers_the_request_and_takes_a_bare_spec() {
    let backend = SharedBackend::new(MemoryBackend::new());
    let by_id = LockLayer::from_fn(backend.clone(), |req| {
        let id = path_params(req).get("id")?.to_owned();
        Some(LockSpec::new(format!("order:{id}"), TTL))
    });
    let bare = LockLayer::from_fn(backend.clone(), |_| LockSpec::global("ledger", TTL));
    let app = Router::new()
        .route(
            "/orders/{id}",
            post(|lock: HeldLock| async move { lock.key().to_owned() }),
        )
        .layer(by_id)
        .route(
            "/ledger",
            post(|lock: HeldLock| async move { lock.key().to_owned() }).layer(bare),
        );
    let (status, _, _) = send(&app, "POST", "/orders/7").await;
    assert_eq!(status, StatusCode::OK);
    let _held = hold(&backend, "ledger").await;
    let (status, _, body) = send(&app, "POST", "/ledger").await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "a bare spec is taken"
    );
    assert_eq!(body["error"]["code"], "LOCK_ACQUISITION_FAILED");
}

#[tokio::test]
async fn the_extractors_tell_a_missing_layer_from_a_request_without_locks() {
    let backend = SharedBackend::new(MemoryBackend::new());
    let writes_only = LockLayer::from_fn(backend.clone(), |req| {
        (req.method() == http::Method::POST).then(|| LockSpec::global("doc", TTL))
    });
    let app = Router::new()
        .route(
            "/doc",
            get(|lock: HeldLock| async move { lock.fence().to_string() })
                .post(|lock: HeldLock| async move { lock.fence().to_string() })
                .layer(writes_only),
        )
        .route(
            "/bare",
            get(|locks: Locks| async move { locks.held().len().to_string() }),
        );
    let (status, _, _) = send(&app, "POST", "/doc").await;
    assert_eq!(status, StatusCode::OK, "the one lock is extracted");
    let (status, _, body) = send(&app, "GET", "/doc").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body["error"]["code"], "LOCK_NOT_REQUESTED");
    let (status, _, body) = send(&app, "GET", "/bare").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body["error"]["code"], "LOCK_LAYER_MISSING");
}

/// A handler's second lock with the key of one it holds is refused at once
/// (one key names one lock of a request), also when the two spell the key
/// in different Unicode forms that name the same lock (`café` composed
/// and decomposed): it must not queue behind its own lock until its max
/// wait ends.
#[tokio::test(start_paused = true)]
async fn a_second_lock_on_the_same_key_in_another_unicode_form_is_refused() {
    let backend = SharedBackend::new(MemoryBackend::new());
    let layer = LockLayer::from_fn(backend, |_| LockSpec::global("caf\u{e9}", TTL));
    let app = Router::new().route(
        "/twice",
        post(|locks: Locks| async move {
            let started = tokio::time::Instant::now();
            let spec = LockSpec::global("cafe\u{301}", TTL).max_wait(Duration::from_secs(30));
            let code = match locks.acquire(spec).await {
                Ok(_) => "acquired",
                Err(e) => e.code(),
            };
            format!("{code} after {:?}", started.elapsed())
        })
        .layer(layer),
    );
    let reply = app
        .oneshot(Request::post("/twice").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let body = reply.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "LOCK_INVALID_KEY after 0ns");
}

/// Two locks on one key taken at once by one request (a handler joining
/// two calls, while another process holds the key for a second): the
/// second is refused at once, as it is one after the other; it must not
/// queue behind the first for its whole max wait.
#[tokio::test(start_paused = true)]
async fn two_locks_on_one_key_taken_at_once_are_one_too_many() {
    let backend = SharedBackend::new(MemoryBackend::new());
    let other = tower_lock::OwnedLock::acquire(&backend, &JobSpec::new("inner", TTL))
        .await
        .unwrap();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        other.release().await.unwrap();
    });
    let layer = LockLayer::from_fn(backend, |_| LockSpec::global("outer", TTL));
    let app = Router::new().route(
        "/both",
        post(|locks: Locks| async move {
            let started = tokio::time::Instant::now();
            let spec = || LockSpec::global("inner", TTL).max_wait(Duration::from_secs(30));
            let (a, b) = tokio::join!(locks.acquire(spec()), locks.acquire(spec()));
            let code = |r: Result<HeldLock, LockError>| r.map_or_else(|e| e.code(), |_| "ok");
            format!("{} {} after {:?}", code(a), code(b), started.elapsed())
        })
        .layer(layer),
    );
    let reply = app
        .oneshot(Request::post("/both").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let body = reply.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "ok LOCK_INVALID_KEY after 1s");
}

#[tokio::test]
async fn the_rejection_hook_shapes_both_layers_answers() {
    let backend = SharedBackend::new(MemoryBackend::new());
    let busy = |e: &LockError| (StatusCode::CONFLICT, Json(json!({"busy": e.code()})));
    let lock =
        LockLayer::from_fn(backend.clone(), |_| LockSpec::global("ledger", TTL)).rejection(busy);
    // A flight whose key is invalid is refused before it runs.
    let flight =
        SingleFlightLayer::from_fn(SingleFlight::new(backend.clone()), |_| FlightSpec::new(""))
            .rejection(busy);
    let app = Router::new()
        .route("/lock", post(|| async { "locked" }).layer(lock))
        .route("/flight", get(|| async { "flown" }).layer(flight));
    let _held = hold(&backend, "ledger").await;
    let (status, _, body) = send(&app, "POST", "/lock").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body, json!({"busy": "LOCK_ACQUISITION_FAILED"}));
    let (status, _, body) = send(&app, "GET", "/flight").await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "single-flight honours the hook"
    );
    assert_eq!(body, json!({"busy": "LOCK_INVALID_KEY"}));
}

#[tokio::test]
async fn flight_outside_lock_in_one_service_builder() {
    let backend = SharedBackend::new(MemoryBackend::new());
    let flight = SingleFlightLayer::from_fn(SingleFlight::new(backend.clone()), |_| {
        Some(FlightSpec::new("report"))
    });
    let lock = LockLayer::from_fn(backend.clone(), |_| LockSpec::global("ledger", TTL));
    let app = Router::new().route(
        "/report",
        get(|lock: HeldLock| async move { format!("fence {}", lock.fence()) })
            .layer(ServiceBuilder::new().layer(flight).layer(lock)),
    );
    let (status, headers, _) = send(&app, "GET", "/report").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["single-flight"], "leader");
    let key = LockKey::global("ledger").unwrap();
    assert_eq!(backend.status(&key).await.unwrap(), None, "released");
}

#[test]
fn errors_say_what_failed_and_keep_the_cause_as_source() {
    use std::error::Error;
    use tower_lock::flight::FlightError;
    use tower_lock::job::JobError;

    let io = || std::io::Error::other("disk on fire");
    let flight: FlightError<std::io::Error> = FlightError::Failed(io());
    assert!(!flight.to_string().contains("disk on fire"), "{flight}");
    assert_eq!(flight.source().unwrap().to_string(), "disk on fire");
    let job: JobError<std::io::Error> = JobError::Job(io());
    assert!(!job.to_string().contains("disk on fire"), "{job}");
    assert_eq!(job.source().unwrap().to_string(), "disk on fire");
}

#[cfg(feature = "redis")]
#[test]
fn a_bad_redis_url_is_a_configuration_error() {
    let err = tower_lock::RedisBackend::from_url("definitely not a url").unwrap_err();
    assert_eq!(err.code(), "LOCK_INVALID_CONFIG", "{err:?}");
    assert!(!err.is_retryable());
}

/// The builder's setters never fail (no `?` mid-chain, C-BUILDER); a bad
/// name is reported by the step that makes the backend.
#[cfg(feature = "postgres")]
#[test]
fn a_bad_schema_name_is_a_configuration_error_when_the_backend_is_built() {
    let url = "postgres://u@127.0.0.1:1/db";
    let builder = tower_lock::PostgresBackend::builder()
        .schema("Robert'); DROP")
        .table("locks")
        .connections(4);
    let err = builder.build(url).unwrap_err();
    assert_eq!(err.code(), "LOCK_INVALID_CONFIG", "{err:?}");
    assert!(!err.is_retryable());
    let bad_table = tower_lock::PostgresBackend::builder()
        .table("job-locks")
        .build(url)
        .unwrap_err();
    assert_eq!(bad_table.code(), "LOCK_INVALID_CONFIG", "{bad_table:?}");
    let good: Result<tower_lock::PostgresBackend, _> = tower_lock::PostgresBackend::builder()
        .schema("app")
        .table("job_locks")
        .op_timeout(std::time::Duration::from_secs(1))
        .build(url);
    assert_eq!(good.unwrap().get_schema(), "app");
}

/// A token's accessors read what its serialised form says, and the form
/// is the one tokens had as public fields (a token queued by an older
/// version restores in a newer one).
#[test]
fn a_token_reads_and_writes_the_same_json() {
    let json = r#"{"key":"export:7","route":"/exports/{id}","owner":"o-1","fence":42,"expires_at_ms":1700000000000,"ttl_ms":60000,"metadata":{"by":"cron"},"hold_until_ms":1700000001000}"#;
    let token: tower_lock::LockToken = serde_json::from_str(json).unwrap();
    assert_eq!(token.key(), "export:7");
    assert_eq!(token.route(), Some("/exports/{id}"));
    assert_eq!(token.owner(), "o-1");
    assert_eq!(token.fence(), 42);
    assert_eq!(token.expires_at_ms(), 1_700_000_000_000);
    assert_eq!(token.ttl_ms(), Some(60_000));
    assert_eq!(token.metadata().unwrap().to_value()["by"], "cron");
    assert_eq!(token.hold_until_ms(), Some(1_700_000_001_000));
    assert_eq!(serde_json::to_string(&token).unwrap(), json);
    let old = r#"{"key":"k","owner":"o","fence":1,"expires_at_ms":5}"#;
    let token: tower_lock::LockToken = serde_json::from_str(old).unwrap();
    assert_eq!((token.route(), token.ttl_ms()), (None, None));
    assert_eq!(serde_json::to_string(&token).unwrap(), old);
}

/// A job's spec is global by its type (issue 26, item 4): the lock a job
/// takes with `JobSpec::new` is the one a route's `LockSpec::global` names,
/// so a job and a route exclude each other; a route-scoped spec reaches a
/// job API only through `TryFrom`, which refuses it. (That `LockSpec::new`
/// passed to `OwnedLock::acquire` does not compile is the `compile_fail`
/// doctest of `JobSpec`.)
#[tokio::test]
async fn a_job_spec_takes_the_global_lock_a_route_names() {
    let backend = SharedBackend::new(MemoryBackend::new());
    let job = JobSpec::new("ledger", TTL).owner("nightly");
    let lock = tower_lock::OwnedLock::acquire(&backend, &job)
        .await
        .unwrap();
    let status = backend
        .status(&LockKey::global("ledger").unwrap())
        .await
        .unwrap()
        .expect("held under the bare global key");
    assert_eq!(status.owner, "nightly");
    assert_eq!(
        job.to_lock_key().unwrap(),
        LockKey::global("ledger").unwrap()
    );

    // A route locking the same global key is refused while the job holds it.
    let layer = LockLayer::from_fn(backend.clone(), |_| LockSpec::global("ledger", TTL));
    let app = Router::new().route("/ledger", post(|| async { "written" }).layer(layer));
    let (status, _, body) = send(&app, "POST", "/ledger").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    lock.release().await.unwrap();

    // The conversions: into a layer's spec, and back only when global.
    let spec = LockSpec::from(job);
    assert_eq!(spec.get_scope(), tower_lock::Scope::Global);
    assert!(JobSpec::try_from(spec).is_ok());
    let routed = JobSpec::try_from(LockSpec::new("ledger", TTL)).unwrap_err();
    assert_eq!(routed.code(), "LOCK_INVALID_KEY");
}

/// The layer's "no lock named" reaches extractors that run in a later poll
/// (a middleware between layer and handler that waits first), and nothing
/// of it is left for the next request on the thread.
#[tokio::test]
async fn not_requested_survives_a_pending_middleware_and_does_not_leak() {
    let backend = SharedBackend::new(MemoryBackend::new());
    let none = LockLayer::from_fn(backend, |_| None::<LockSpec>);
    let waits_first = axum::middleware::from_fn(
        |req: Request<Body>, next: axum::middleware::Next| async move {
            tokio::task::yield_now().await;
            next.run(req).await
        },
    );
    let app = Router::new()
        .route(
            "/later",
            get(|lock: HeldLock| async move { lock.fence().to_string() })
                .layer(ServiceBuilder::new().layer(none).layer(waits_first)),
        )
        .route(
            "/bare",
            get(|lock: HeldLock| async move { lock.fence().to_string() }),
        );
    let (status, _, body) = send(&app, "GET", "/later").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body["error"]["code"], "LOCK_NOT_REQUESTED");
    let (_, _, body) = send(&app, "GET", "/bare").await;
    assert_eq!(body["error"]["code"], "LOCK_LAYER_MISSING");
}

/// Owner tokens are credentials (whoever has one can release the lock):
/// `Debug` output (logs, panics, `dbg!`) never shows them.
#[tokio::test]
async fn owner_tokens_stay_out_of_debug_output() {
    let secret = "s3cret-owner-token";
    let spec = LockSpec::global("k", TTL).owner(secret);
    assert!(!format!("{spec:?}").contains(secret), "{spec:?}");
    let backend = SharedBackend::new(MemoryBackend::new());
    let job = JobSpec::new("k", TTL).owner(secret);
    assert!(!format!("{job:?}").contains(secret), "{job:?}");
    let lock = tower_lock::OwnedLock::acquire(&backend, &job)
        .await
        .unwrap();
    assert!(!format!("{lock:?}").contains(secret), "{lock:?}");
    let token = lock.into_token();
    assert!(!format!("{token:?}").contains(secret), "{token:?}");
    let req = tower_lock::backend::AcquireRequest::new(
        LockKey::global("k").unwrap(),
        secret,
        TTL,
        Duration::ZERO,
    )
    .unwrap();
    assert!(!format!("{req:?}").contains(secret), "{req:?}");
    // What a status read answers about a holder (its own, or another's).
    let status = backend
        .status(&LockKey::global("k").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.owner, secret);
    assert!(!format!("{status:?}").contains(secret), "{status:?}");
    let shared = JobSpec::new("s", TTL).owner(secret).shared();
    let held = tower_lock::OwnedLock::acquire(&backend, &shared)
        .await
        .unwrap();
    let status = held.status().await.unwrap().unwrap();
    assert!(
        !format!("{:?}", status.holders).contains(secret),
        "{status:?}"
    );
}
