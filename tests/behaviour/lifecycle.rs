//! Lock lifecycle beyond one request: watchdog, lost-lock signal, hand-off
//! tokens, keep-after-response headers, admin API.

use std::sync::Arc;
use std::time::Duration;
use tower_lock::backend::Holder;

use axum::body::Body;
use axum::routing::{get, post};
use axum::{Router, extract::Query};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_lock::admin::Admin;
use tower_lock::headers::{LOCK_EXPIRES_AT, LOCK_FENCE, LOCK_KEY, LOCK_OWNER};
use tower_lock::{
    JobSpec, LockError, LockKey, LockLayer, LockSpec, LockToken, Locks, OwnedLock, SharedBackend,
};

use super::harness::Harness;
use super::support::{Probe, assert_comes_free, assert_released, gkey, status_of};

/// Let a spawned call run as far as it can before the test goes on: many
/// polls, and on a real server some time for its round trip (a call held
/// by the mechanism under test never gets further; without it, it lands).
async fn let_it_run(h: &Harness) {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    if !h.is_paused() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Let `d` pass inside a handler (see [`Harness::advance`]).
async fn pass(paused: bool, d: Duration) {
    if paused {
        tokio::time::advance(d).await;
    } else {
        tokio::time::sleep(d).await;
    }
}

/// `POST /run` on `app`: must answer 200; its body.
async fn run(app: Router) -> bytes::Bytes {
    let res = app
        .oneshot(Request::post("/run").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.into_body().collect().await.unwrap().to_bytes()
}

fn spec(key: &str, ttl_ms: u64) -> LockSpec {
    LockSpec::global(key, Duration::from_millis(ttl_ms))
}

fn job(key: &str, ttl_ms: u64) -> JobSpec {
    JobSpec::new(key, Duration::from_millis(ttl_ms))
}

pub async fn watchdog_keeps_a_short_ttl_lock_through_a_long_handler(h: Harness) {
    let backend = h.backend.clone();
    let layer = LockLayer::new(backend.clone(), |_: &Request<Body>| {
        Some(spec("job", 300).watchdog(true))
    });
    let paused = h.is_paused();
    let app = Router::new().route(
        "/run",
        post(move |locks: Locks| {
            async move {
                let lock = locks.first().unwrap();
                // 2 s of work against a 300 ms TTL, checking on the way.
                for _ in 0..20 {
                    pass(paused, Duration::from_millis(100)).await;
                    if lock.is_lost() {
                        return "lost";
                    }
                    let status = locks.status("job").await.unwrap();
                    assert!(status.is_some(), "lock expired under the watchdog");
                }
                "done"
            }
        })
        .layer(layer),
    );
    assert_eq!(run(app).await, "done");
    // Released with the response, and the watchdog does not bring it back.
    let key = LockKey::global("job").unwrap();
    assert_eq!(backend.status(&key).await.unwrap(), None);
    h.advance(Duration::from_millis(400)).await;
    assert_eq!(backend.status(&key).await.unwrap(), None);
}

pub async fn lost_signal_fires_when_force_released_under_a_handler(h: Harness) {
    let backend = h.backend.clone();
    let layer = LockLayer::new(backend.clone(), |_: &Request<Body>| {
        Some(spec("victim", 1_500).watchdog(true))
    });
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<tower_lock::HeldLock>();
    let started_tx = Arc::new(std::sync::Mutex::new(Some(started_tx)));
    let app = Router::new().route(
        "/run",
        post(move |locks: Locks| {
            let started_tx = started_tx.clone();
            async move {
                let lock = locks.first().unwrap();
                if let Some(tx) = started_tx.lock().unwrap().take() {
                    let _ = tx.send(lock.clone());
                }
                tokio::select! {
                    _ = lock.lost() => "lost",
                    _ = tokio::time::sleep(Duration::from_secs(60)) => "finished",
                }
            }
        })
        .layer(layer),
    );
    let call = tokio::spawn(app.oneshot(Request::post("/run").body(Body::empty()).unwrap()));
    let copy = started_rx.await.unwrap();
    // (16.11) A copy kept by a task of its own learns it too.
    let copy_lost = tokio::spawn(async move { copy.lost().await });
    assert!(
        backend
            .force_release(&LockKey::global("victim").unwrap())
            .await
            .unwrap()
    );
    let res = call.await.unwrap().unwrap();
    assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "lost");
    tokio::time::timeout(Duration::from_secs(5), copy_lost)
        .await
        .expect("the copy learnt the lock was lost")
        .unwrap();
}

pub async fn lost_signal_fires_at_ttl_without_watchdog(h: Harness) {
    let lock = OwnedLock::acquire(h.backend.clone(), &job("short", 300))
        .await
        .unwrap();
    assert!(!lock.is_lost());
    let waited = tokio::time::timeout(Duration::from_secs(5), lock.lost()).await;
    assert!(
        waited.is_ok(),
        "lost() must resolve once the TTL has passed"
    );
    assert!(lock.is_lost());
}

/// A renewal that finds the lock gone (force-released by an operator)
/// signals the loss at once, at that renewal, not when the TTL would have
/// run out.
pub async fn a_renewal_that_finds_the_lock_gone_signals_the_loss(h: Harness) {
    let u = h.unit();
    let spec = JobSpec::new("victim", u * 30).watchdog(true);
    let lock = OwnedLock::acquire(h.backend.clone(), &spec).await.unwrap();
    let start = tokio::time::Instant::now();
    h.advance(u).await;
    assert!(
        h.backend
            .force_release(lock.info().lock_key())
            .await
            .unwrap()
    );
    // Renewals fall due every 10 units; the TTL would end at 30.
    for _ in 0..20 {
        if lock.is_lost() {
            break;
        }
        h.advance(u).await;
    }
    assert!(lock.is_lost(), "the renewal at 10 units must notice");
    assert!(start.elapsed() < u * 20, "noticed at {:?}", start.elapsed());
}

/// The lost signal follows extensions, whether a copy of the lock was taken
/// before the extension, after it, or never.
pub async fn lost_signal_follows_extensions(h: Harness) {
    // An owned lock nobody has asked for its signal yet.
    let mut owned = OwnedLock::acquire(h.backend.clone(), &job("ext-owned", 300))
        .await
        .unwrap();
    owned.extend(Duration::from_millis(1_500)).await.unwrap();
    // A request's lock (kept after the response), copied before and after
    // its extension.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let tx = Arc::new(std::sync::Mutex::new(Some(tx)));
    let layer = LockLayer::new(h.backend.clone(), |_: &Request<Body>| {
        Some(spec("ext-req", 300).auto_release(false))
    });
    let app = Router::new().route(
        "/run",
        post(move |locks: Locks| async move {
            let before = locks.first().unwrap();
            let after = locks.extend("ext-req", Duration::from_millis(1_500)).await;
            let _ = tx
                .lock()
                .unwrap()
                .take()
                .unwrap()
                .send((before, after.unwrap()));
        })
        .layer(layer),
    );
    run(app).await;
    let (before, after) = rx.await.unwrap();

    h.advance(Duration::from_millis(600)).await;
    assert!(
        !owned.is_lost(),
        "extended: not lost when the first TTL ends"
    );
    let signal = owned.info().lost_signal().clone();
    assert!(
        !signal.is_lost(),
        "a signal made after the extension knows it"
    );
    assert!(!before.is_lost() && !after.is_lost());
    h.advance(Duration::from_millis(1_100)).await;
    assert!(owned.is_lost() && signal.is_lost());
    assert!(before.is_lost() && after.is_lost());
}

pub async fn watchdog_renews_many_locks_in_one_call_per_tick(h: Harness) {
    let probe = Probe::new(&h.backend);
    let shared = probe.backend();
    // Taken together, as a burst of requests takes them. One after another,
    // 50 acquisitions that are each a consensus write (etcd) can take longer
    // under load than the renewal slack (TTL / 12 = 75 ms of this sub-second
    // TTL), and their renewals then fall due in different ticks.
    let mut taking = tokio::task::JoinSet::new();
    for i in 0..50 {
        let shared = shared.clone();
        taking.spawn(async move {
            OwnedLock::acquire(shared, &job(&format!("many{i}"), 900))
                .await
                .unwrap()
        });
    }
    let mut locks = Vec::new();
    while let Some(lock) = taking.join_next().await {
        let mut lock = lock.unwrap();
        lock.start_watchdog();
        locks.push(lock);
    }
    // About three renewal rounds (every 300 ms).
    for _ in 0..10 {
        h.advance(Duration::from_millis(100)).await;
    }
    let (batches, extended) = probe.batches();
    assert!(extended >= 100, "renewed {extended} locks");
    assert!(
        batches * 10 <= extended,
        "{batches} round trips for {extended} renewals: renewals are not batched"
    );
    for lock in &locks {
        assert!(lock.status().await.unwrap().is_some());
    }
    for lock in locks {
        lock.release().await.unwrap();
    }
}

pub async fn token_hand_off_across_handles(h: Harness) {
    let backend = h.backend.clone();
    let lock = OwnedLock::acquire(backend.clone(), &job("report", 5_000))
        .await
        .unwrap();
    let fence = lock.fence();
    let json = serde_json::to_string(&lock.into_token()).unwrap();
    // Another process: same backend configuration, token from the queue.
    let token: LockToken = serde_json::from_str(&json).unwrap();
    assert_eq!(token.fence(), fence);
    let mut restored = OwnedLock::restore(backend.clone(), &token).await.unwrap();
    assert!(
        restored.fence() > fence,
        "restoring claims: a fence of its own"
    );
    restored.extend(Duration::from_secs(10)).await.unwrap();
    restored.release().await.unwrap();
    // A second release of the same token: the backend cannot tell it apart
    // from a lock that never existed.
    assert_eq!(
        OwnedLock::restore(backend.clone(), &token)
            .await
            .unwrap_err(),
        LockError::NotFound
    );
    assert_eq!(
        backend
            .release(
                &token.lock_key().unwrap(),
                Holder::new(token.owner(), token.fence())
            )
            .await
            .unwrap_err(),
        LockError::NotFound
    );
}

pub async fn stale_tokens_are_refused(h: Harness) {
    let backend = h.backend.clone();
    let lock = OwnedLock::acquire(backend.clone(), &job("stale", 300))
        .await
        .unwrap();
    let token = lock.into_token();
    h.advance(Duration::from_millis(400)).await;
    // Expired: not found.
    assert_eq!(
        OwnedLock::restore(backend.clone(), &token)
            .await
            .unwrap_err(),
        LockError::NotFound
    );
    // Someone else took it: ownership mismatch, for restore and release.
    let other = OwnedLock::acquire(backend.clone(), &job("stale", 5_000))
        .await
        .unwrap();
    assert_eq!(
        OwnedLock::restore(backend.clone(), &token)
            .await
            .unwrap_err(),
        LockError::OwnershipMismatch
    );
    assert_eq!(
        backend
            .release(
                &token.lock_key().unwrap(),
                Holder::new(token.owner(), token.fence())
            )
            .await
            .unwrap_err(),
        LockError::OwnershipMismatch
    );
    other.release().await.unwrap();
}

#[derive(serde::Deserialize)]
struct KeepQuery {
    #[allow(dead_code)]
    keep: Option<bool>,
}

fn kept_app(backend: SharedBackend, allow_force: bool) -> Router {
    let layer = LockLayer::new(backend.clone(), |req: &Request<Body>| {
        let keep = req.uri().query().is_some_and(|q| q.contains("keep=true"));
        Some(spec("account:7", 30_000).auto_release(!keep))
    });
    Router::new()
        .route(
            "/deposit",
            post(|_: Query<KeepQuery>, locks: Locks| async move {
                locks.first().unwrap().fence().to_string()
            })
            .layer(layer),
        )
        .nest(
            "/admin",
            Admin::new(backend).allow_force(allow_force).router(),
        )
        .route("/health", get(|| async { "ok" }))
}

/// One request to `app`: status, headers and JSON body (`Null` if empty).
async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    owner: Option<&str>,
) -> (StatusCode, http::HeaderMap, serde_json::Value) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(owner) = owner {
        req = req.header(LOCK_OWNER, owner);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let (parts, body) = res.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    let json = if bytes.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null)
    };
    (parts.status, parts.headers, json)
}

pub async fn keep_after_response_then_release_through_admin(h: Harness) {
    let app = kept_app(h.backend.clone(), false);
    let (status, headers, _) = call(&app, "POST", "/deposit?keep=true", None).await;
    assert_eq!(status, StatusCode::OK);
    let owner = headers[&LOCK_OWNER].to_str().unwrap().to_owned();
    assert_eq!(headers[&LOCK_KEY], "account:7");
    let fence: u64 = headers[&LOCK_FENCE].to_str().unwrap().parse().unwrap();
    assert!(headers[&LOCK_EXPIRES_AT].to_str().unwrap().ends_with('Z'));

    // Still held after the response.
    let (status, _, _) = call(&app, "POST", "/deposit", None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);

    let (status, _, held) = call(&app, "GET", "/admin/locks/account:7", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(held["key"], "account:7");
    assert_eq!(held["locked"], true);
    assert_eq!(held["fence"], fence);
    assert!(held["ttl_remaining_ms"].as_u64().unwrap() <= 30_000);
    assert!(held["acquired_at"].is_string() && held["expires_at"].is_string());
    assert!(held.get("owner").is_none(), "owner shown without opt-in");

    // Wrong owner: 409; no owner: 400; force while disabled: 403.
    let (status, _, wrong) = call(
        &app,
        "DELETE",
        "/admin/locks/account:7",
        Some("someone-else"),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(wrong["error"]["code"], "LOCK_OWNERSHIP_MISMATCH");
    let (status, _, none) = call(&app, "DELETE", "/admin/locks/account:7", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(none["error"]["code"], "LOCK_INVALID_OWNER");
    let (status, _, forced) = call(&app, "DELETE", "/admin/locks/account:7?force=true", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(forced["error"]["code"], "LOCK_FORCE_DISABLED");

    // The echoed owner header releases it; a second release finds nothing.
    let (status, _, released) = call(&app, "DELETE", "/admin/locks/account:7", Some(&owner)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(released["released"], true);
    let (status, _, again) = call(&app, "DELETE", "/admin/locks/account:7", Some(&owner)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(again["error"]["code"], "LOCK_NOT_FOUND");
    let (_, _, free) = call(&app, "GET", "/admin/locks/account%3A7", None).await;
    assert_eq!(
        free,
        serde_json::json!({"key": "account:7", "locked": false})
    );
}

pub async fn admin_force_release_and_bad_keys(h: Harness) {
    let app = kept_app(h.backend.clone(), true);
    let (status, _, _) = call(&app, "POST", "/deposit?keep=true", None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, forced) = call(&app, "DELETE", "/admin/locks/account:7?force=true", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(forced["forced"], true);
    let (status, _, missing) =
        call(&app, "DELETE", "/admin/locks/account:7?force=true", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(missing["error"]["code"], "LOCK_NOT_FOUND");

    let long = format!("/admin/locks/{}", "k".repeat(600));
    let (status, _, bad) = call(&app, "GET", &long, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(bad["error"]["code"], "LOCK_INVALID_KEY");
    let (status, _, ctrl) = call(&app, "GET", "/admin/locks/a%0Ab", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(ctrl["error"]["code"], "LOCK_INVALID_KEY");
    // A key with a slash, encoded or not.
    let (_, _, slash) = call(&app, "GET", "/admin/locks/a/b", None).await;
    assert_eq!(slash["key"], "a/b");
    let (_, _, encoded) = call(&app, "GET", "/admin/locks/a%2Fb", None).await;
    assert_eq!(encoded["key"], "a/b");

    // (16.5) A `route` that does not decode is a 400, never "no route",
    // which would name (and release) the global lock of the same key.
    let (status, _, _) = call(&app, "POST", "/deposit?keep=true", None).await;
    assert_eq!(status, StatusCode::OK);
    for (method, path) in [
        ("GET", "/admin/locks/account:7?route=%ZZ"),
        ("DELETE", "/admin/locks/account:7?route=%E9&force=true"),
        ("DELETE", "/admin/locks/account:7?route=%4"),
        // And a key in the path that does not decode: the same JSON 400,
        // never axum's plain-text one, nor a key taken as written.
        ("GET", "/admin/locks/%FF"),
        ("DELETE", "/admin/locks/account%ZZ?force=true"),
        // A route no router has: a control character (PostgreSQL refused
        // its NUL with a 503).
        ("GET", "/admin/locks/account:7?route=%00"),
        ("DELETE", "/admin/locks/account:7?route=%0A&force=true"),
    ] {
        let (status, _, bad) = call(&app, method, path, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path}");
        assert_eq!(bad["error"]["code"], "LOCK_INVALID_KEY", "{method} {path}");
    }
    // A `force` that is neither true nor false is refused, never taken for
    // a release checked against an owner ("no owner").
    for force in ["yes", "%", "%FF", "truee"] {
        let path = format!("/admin/locks/account:7?force={force}");
        let (status, _, bad) = call(&app, "DELETE", &path, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(bad["error"]["code"], "LOCK_INVALID_QUERY", "{path}");
    }
    let key = LockKey::global("account:7").unwrap();
    assert!(
        h.backend.status(&key).await.unwrap().is_some(),
        "the global lock is untouched"
    );
    assert!(h.backend.force_release(&key).await.unwrap());
}

/// (16.4) A token restores only the acquisition it was made from: with a
/// reused custom owner, a token of an earlier acquisition is stale
/// (`LOCK_OWNERSHIP_MISMATCH`), never the newer lock. The restored handle
/// keeps the lock's original TTL, so a watchdog started after `restore`
/// renews by it, not by the few moments left (and in time, although less
/// than a third of the TTL is left).
pub async fn a_token_restores_only_its_own_acquisition(h: Harness) {
    let backend = h.backend.clone();
    let u = h.unit();
    let job = |ttl| JobSpec::new("job", ttl).owner("worker-1");
    let first = OwnedLock::acquire(backend.clone(), &job(u * 10))
        .await
        .unwrap();
    let old = first.into_token();
    OwnedLock::restore(backend.clone(), &old)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let second = OwnedLock::acquire(backend.clone(), &job(u * 10))
        .await
        .unwrap();
    assert!(second.fence() > old.fence());
    assert_eq!(
        OwnedLock::restore(backend.clone(), &old).await.unwrap_err(),
        LockError::OwnershipMismatch,
        "a stale token must not take over the newer acquisition"
    );

    h.advance(u * 8).await;
    let token = second.into_token();
    assert_eq!(token.ttl_ms(), Some((u * 10).as_millis() as u64));
    let mut restored = OwnedLock::restore(backend.clone(), &token).await.unwrap();
    assert_eq!(restored.info().ttl(), u * 10, "the original TTL");
    restored.start_watchdog();
    for _ in 0..4 {
        h.advance(u).await;
    }
    let left = restored
        .status()
        .await
        .unwrap()
        .expect("kept")
        .ttl_remaining;
    assert!(left > u * 5, "renewed by the whole TTL: {left:?} left");
    restored.release().await.unwrap();

    // A token from before tokens carried the TTL still restores.
    let third = OwnedLock::acquire(backend.clone(), &job(u * 10))
        .await
        .unwrap();
    let mut json = serde_json::to_value(third.into_token()).unwrap();
    json.as_object_mut().unwrap().remove("ttl_ms");
    let legacy: LockToken = serde_json::from_value(json).unwrap();
    let restored = OwnedLock::restore(backend.clone(), &legacy).await.unwrap();
    assert!(restored.info().ttl() <= u * 10);
    restored.release().await.unwrap();
}

/// (16.6) A watchdog renewal and an `extend` by hand of the same lock: the
/// renewal is held back on its way to the backend while the holder extends
/// to a long TTL. Whatever order they land in, the lock's local expiry must
/// be what the backend keeps: the holder must never believe it holds a lock
/// the backend has let go.
pub async fn a_renewal_and_an_extend_never_disagree_with_the_backend(h: Harness) {
    let probe = Probe::new(&h.backend);
    let u = h.unit();
    let spec = JobSpec::new("job", u * 3).watchdog(true);
    let mut lock = OwnedLock::acquire(probe.backend(), &spec).await.unwrap();
    probe.hold_renewals();
    // The renewal (by 3 units) falls due after one unit.
    h.advance(u * 3 / 2).await;
    probe.renewals_held(1).await;
    let extend = tokio::spawn(async move {
        lock.extend(u * 30).await.unwrap();
        lock
    });
    // Let the extension run as far as it can (to the backend, if nothing
    // stops it) before the renewal lands.
    let_it_run(&h).await;
    probe.let_renewals_go();
    probe.renewals_done(1).await;
    let lock = extend.await.unwrap();
    h.advance(u * 5).await;
    let held = lock.status().await.unwrap().is_some();
    assert!(
        held && !lock.is_lost(),
        "backend holds it: {held}; holder thinks it lost: {}",
        lock.is_lost()
    );
    lock.release().await.unwrap();
}

/// A restore whose caller goes away after its claim landed (while it reads
/// the lock's metadata) gives the claimed lock back: the token is spent
/// and nobody holds a handle, so it would otherwise stay taken for its TTL.
pub async fn a_restore_dropped_after_its_claim_gives_the_lock_back(h: Harness) {
    // (Far longer than the probe's 5-s wait.)
    restore_dropped_after_its_claim(&h, JobSpec::new("job", Duration::from_secs(60))).await;
    assert_comes_free(&h, &gkey("job")).await;
}

/// A token's minimum hold is a wall-clock time: from a host whose clock
/// runs ahead, or edited, it may lie past the lock's own end. Restored and
/// released, the lock still ends no later than it would have: the release
/// never lengthens it.
pub async fn a_tokens_hold_never_outlasts_its_lock(h: Harness) {
    let u = h.unit();
    let token = OwnedLock::acquire(h.backend.clone(), &JobSpec::new("job", u * 4))
        .await
        .unwrap()
        .into_token();
    let mut json = serde_json::to_value(&token).unwrap();
    let in_an_hour = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 3_600_000;
    json["hold_until_ms"] = serde_json::json!(in_an_hour);
    let token: LockToken = serde_json::from_value(json).unwrap();
    let restored = OwnedLock::restore(h.backend.clone(), &token).await.unwrap();
    restored.release().await.unwrap();
    h.advance(u * 6).await;
    assert_eq!(
        status_of(&h.backend, &gkey("job")).await,
        None,
        "the release lengthened the lock to the token's hold"
    );
}

/// A release within the minimum hold shortens the lock to end with the
/// hold. A watchdog renewal already on its way (by the whole TTL) must not
/// undo that by landing after it: the release waits for it, as an extend
/// by hand does.
pub async fn a_renewal_in_flight_never_outlives_a_release_within_the_min_hold(h: Harness) {
    renewal_in_flight_beside_min_hold(h, |lock| {
        Box::pin(async move { lock.release().await.unwrap() })
    })
    .await;
}

/// The same when the handle is dropped (as a response's end releases its
/// locks), not released by hand.
pub async fn a_renewal_in_flight_never_outlives_a_dropped_handle_within_the_min_hold(h: Harness) {
    renewal_in_flight_beside_min_hold(h, |lock| Box::pin(async move { drop(lock) })).await;
}

async fn renewal_in_flight_beside_min_hold(
    h: Harness,
    give_back: impl FnOnce(OwnedLock) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
) {
    let probe = Probe::new(&h.backend);
    let u = h.unit();
    let spec = JobSpec::new("job", u * 30).min_hold(u * 12).watchdog(true);
    let lock = OwnedLock::acquire(probe.backend(), &spec).await.unwrap();
    probe.hold_renewals();
    // The renewal (by 30 units) falls due after 10.
    h.advance(u * 11).await;
    probe.renewals_held(1).await;
    let release = tokio::spawn(give_back(lock));
    // Let the release run as far as it can (to the backend, if nothing
    // stops it) before the renewal lands.
    let_it_run(&h).await;
    probe.let_renewals_go();
    probe.renewals_done(1).await;
    release.await.unwrap();
    // The hold ended at 12 units.
    h.advance(u * 3).await;
    assert_eq!(
        status_of(&h.backend, &gkey("job")).await,
        None,
        "the renewal landed after the release and kept the lock for its whole TTL"
    );
}

/// A lock of `spec` turned into a token, restored through a probe that
/// holds the restore's status read (after its claim landed), and the
/// restore dropped there.
async fn restore_dropped_after_its_claim(h: &Harness, spec: JobSpec) {
    let probe = Probe::new(&h.backend);
    let token = OwnedLock::acquire(h.backend.clone(), &spec)
        .await
        .unwrap()
        .into_token();
    probe.hold_statuses();
    let restoring = tokio::spawn({
        let backend = probe.backend();
        async move { OwnedLock::restore(backend, &token).await.map(drop) }
    });
    probe.statuses_held(1).await;
    restoring.abort();
    assert!(restoring.await.unwrap_err().is_cancelled());
    probe.let_statuses_go();
}

/// A restore dropped after its claim, within the token's minimum hold,
/// gives the lock back as a release would then: kept until the hold ends,
/// not freed for another node to run the job again.
pub async fn a_restore_dropped_within_the_min_hold_keeps_the_hold(h: Harness) {
    let u = h.unit();
    restore_dropped_after_its_claim(&h, JobSpec::new("job", u * 60).min_hold(u * 20)).await;
    // Given back: shortened to the hold's end (20 units), still held.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = status_of(&h.backend, &gkey("job"))
            .await
            .expect("the lock was freed within its minimum hold");
        if status.ttl_remaining <= u * 20 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never given back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// An extension whose reply comes after the request released its lock and
/// took the key again names the acquisition it extended: the newer lock
/// keeps its own fence (fenced writes with the older one are refused) and
/// is released with the response (a release under the older fence was
/// refused, and the key stayed held by nobody until its TTL).
pub async fn a_late_extension_never_lands_on_a_newer_acquisition(h: Harness) {
    let probe = Probe::new(&h.backend);
    let backend = probe.backend();
    let layer = LockLayer::new(backend.clone(), |_: &Request<Body>| {
        Some(spec("ext-again", 30_000))
    });
    let (tx, rx) = tokio::sync::oneshot::channel();
    let tx = Arc::new(std::sync::Mutex::new(Some(tx)));
    let app = Router::new().route(
        "/run",
        post(move |locks: Locks| {
            let (tx, probe) = (tx.clone(), probe.clone());
            async move {
                let first = locks.first().unwrap().fence();
                probe.hold_extend_replies();
                let extending = tokio::spawn({
                    let locks = locks.clone();
                    async move { locks.extend("ext-again", Duration::from_secs(20)).await }
                });
                probe.extend_replies_held(1).await;
                locks.release("ext-again").await.unwrap();
                let again = locks.acquire(spec("ext-again", 30_000)).await.unwrap();
                probe.let_extend_replies_go();
                let late = extending.await.unwrap();
                let now = locks.get("ext-again").unwrap().fence();
                let _ = tx.lock().unwrap().take().unwrap().send((
                    first,
                    again.fence(),
                    now,
                    late.map(|l| l.fence()),
                ));
            }
        })
        .layer(layer),
    );
    run(app).await;
    let (first, again, now, late) = rx.await.unwrap();
    assert!(again > first);
    assert_eq!(
        now, again,
        "the late extension replaced the newer lock's fence"
    );
    assert_eq!(late, Err(LockError::AlreadyReleased));
    assert_eq!(
        status_of(&h.backend, &gkey("ext-again")).await,
        None,
        "the newer lock was not released with the response"
    );
}

/// A TTL beyond any lock's (a year) is refused before the backend is asked,
/// by an owned handle and by a request's `Locks`: a backend that does not
/// check it answered, and the handle's `Instant` arithmetic panicked.
pub async fn an_extension_beyond_a_year_is_refused_whatever_the_backend(h: Harness) {
    let probe = Probe::new(&h.backend);
    let backend = probe.backend();
    probe.extend_blindly();
    let mut owned = OwnedLock::acquire(backend.clone(), &job("ext-max", 30_000))
        .await
        .unwrap();
    assert!(matches!(
        owned.extend(Duration::MAX).await,
        Err(LockError::InvalidTtl(_))
    ));
    owned.release().await.unwrap();
    let layer = LockLayer::new(backend.clone(), |_: &Request<Body>| {
        Some(spec("ext-max", 30_000))
    });
    let app = Router::new().route(
        "/run",
        post(|locks: Locks| async move {
            format!(
                "{:?}",
                locks.extend("ext-max", Duration::MAX).await.map(|_| ())
            )
        })
        .layer(layer),
    );
    let body = run(app).await;
    assert!(
        String::from_utf8_lossy(&body).contains("InvalidTtl"),
        "{body:?}"
    );
    assert_released(&h, &gkey("ext-max")).await;
}

/// (16.14) Once the response has released a request's locks, calls on its
/// `Locks` say so (`LOCK_ALREADY_RELEASED`), as the error table promises
/// ("`Locks` used after the response released its locks").
pub async fn calls_after_the_response_say_already_released(h: Harness) {
    let (tx, rx) = tokio::sync::oneshot::channel::<Locks>();
    let tx = Arc::new(std::sync::Mutex::new(Some(tx)));
    let layer = LockLayer::new(h.backend.clone(), |_: &Request<Body>| {
        Some(spec("k", 30_000))
    });
    let app = Router::new().route(
        "/run",
        post(move |locks: Locks| {
            let tx = tx.clone();
            async move {
                let _ = tx.lock().unwrap().take().unwrap().send(locks);
                "done"
            }
        })
        .layer(layer),
    );
    assert_eq!(run(app).await, "done");
    let locks = rx.await.unwrap();
    assert_eq!(locks.release("k").await, Err(LockError::AlreadyReleased));
    assert_eq!(
        locks.extend("k", Duration::from_secs(1)).await.unwrap_err(),
        LockError::AlreadyReleased
    );
    assert_eq!(
        locks.status("k").await.unwrap_err(),
        LockError::AlreadyReleased
    );
    assert_eq!(
        locks.release("never").await,
        Err(LockError::AlreadyReleased)
    );
    assert_eq!(
        locks.acquire(spec("more", 1_000)).await.unwrap_err(),
        LockError::AlreadyReleased
    );
}
