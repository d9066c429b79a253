//! The APIs the seed systems' users rely on (issue 14): metadata on locks,
//! minimum hold (singleton scheduled jobs), `with_lock`, `release_all`,
//! lookups by owner, the job layer, client-directed locks.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;
use tower_lock::backend::Holder;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::Request;
use serde_json::json;
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tower_lock::admin::Admin;
use tower_lock::job::{JobError, JobLockLayer, LockedJob};
use tower_lock::{
    ClientLocks, JobSpec, LockError, LockKey, LockLayer, LockMetadata, LockSpec, LockToken, Locks,
    OwnedLock, SharedBackend, with_lock,
};

use super::harness::Harness;
use super::support::{areq, assert_comes_free, gkey, post_req, send, status_of, with_header};

fn spec(key: &str, ttl: Duration) -> LockSpec {
    LockSpec::global(key, ttl)
}

fn job_spec(key: &str, ttl: Duration) -> JobSpec {
    JobSpec::new(key, ttl)
}

fn who() -> serde_json::Value {
    json!({"by": "cron@host-3", "reason": "monthly billing", "n": [1, 2]})
}

// ---------------------------------------------------------------------------
// Metadata

pub async fn metadata_round_trips_through_every_lookup(h: Harness) {
    let key = gkey("billing:report");
    let meta = LockMetadata::new(who()).unwrap();
    let lock = OwnedLock::acquire(
        &h.backend,
        &job_spec("billing:report", Duration::from_secs(30)).metadata(who()),
    )
    .await
    .unwrap();
    assert_eq!(lock.info().metadata(), Some(&meta), "HeldLock");
    let status = status_of(&h.backend, &key).await.expect("held");
    assert_eq!(
        status.metadata.as_ref().map(LockMetadata::to_value),
        Some(who()),
        "status"
    );

    // Admin API: only when asked to show it.
    let admin = |show: bool| {
        Router::new().nest(
            "/admin",
            Admin::new(h.backend.clone()).show_metadata(show).router(),
        )
    };
    let shown = send(&admin(true), get_req("/admin/locks/billing:report")).await;
    assert_eq!(shown.json()["metadata"], who());
    let hidden = send(&admin(false), get_req("/admin/locks/billing:report")).await;
    assert_eq!(hidden.json()["locked"], true);
    assert!(hidden.json().get("metadata").is_none(), "hidden by default");

    // Through a token (serde) and its restore, in another handle.
    let token = lock.into_token();
    assert_eq!(token.metadata(), Some(&meta));
    let wire = serde_json::to_string(&token).unwrap();
    let token: LockToken = serde_json::from_str(&wire).unwrap();
    let restored = OwnedLock::restore(h.indexed(), &token).await.unwrap();
    assert_eq!(
        restored.info().metadata().map(LockMetadata::to_value),
        Some(who()),
        "restore reads the backend's metadata"
    );
    restored.release().await.unwrap();
    assert_eq!(status_of(&h.backend, &key).await, None);

    // A lock without metadata has none.
    let plain = OwnedLock::acquire(&h.backend, &job_spec("plain", Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(
        status_of(&h.backend, &gkey("plain"))
            .await
            .unwrap()
            .metadata,
        None
    );
    plain.release().await.unwrap();
}

fn get_req(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

pub async fn metadata_belongs_to_its_acquisition(h: Harness) {
    let key = gkey("meta:owner");
    let m1 = LockMetadata::new(json!({"by": "first"})).unwrap();
    let m2 = LockMetadata::new(json!({"by": "second"})).unwrap();
    let meta_of = |b: &SharedBackend| {
        let (b, key) = (b.clone(), key.clone());
        async move {
            status_of(&b, &key)
                .await
                .and_then(|s| s.metadata)
                .map(|m| m.to_value())
        }
    };

    // Taken over after expiry by a holder without metadata: none shown.
    let first = areq(&key, "first", h.units(1), Duration::ZERO).with_metadata(m1.clone());
    h.backend.acquire(&first).await.unwrap();
    assert_eq!(meta_of(&h.backend).await, Some(m1.to_value()));
    h.advance(h.units(1) + h.unit() / 2).await;
    let plain = areq(&key, "plain", h.units(10), Duration::ZERO);
    h.backend.acquire(&plain).await.unwrap();
    assert_eq!(meta_of(&h.backend).await, None, "not the expired holder's");
    h.backend
        .release(&key, Holder::owner_only("plain"))
        .await
        .unwrap();

    // Released and taken at once by a holder without metadata: none shown.
    h.backend.acquire(&first).await.unwrap();
    h.backend
        .release(&key, Holder::owner_only("first"))
        .await
        .unwrap();
    h.backend.acquire(&plain).await.unwrap();
    assert_eq!(meta_of(&h.backend).await, None, "not the released holder's");

    // Handed to a waiter: the waiter's own metadata.
    let waiter = areq(&key, "second", h.units(10), h.units(20)).with_metadata(m2.clone());
    let backend = h.backend.clone();
    let waiting = tokio::spawn(async move { backend.acquire(&waiter).await });
    h.until_queued(&key, 1).await;
    h.backend
        .release(&key, Holder::owner_only("plain"))
        .await
        .unwrap();
    waiting.await.unwrap().unwrap();
    assert_eq!(status_of(&h.backend, &key).await.unwrap().owner, "second");
    assert_eq!(meta_of(&h.backend).await, Some(m2.to_value()));
    h.backend
        .release(&key, Holder::owner_only("second"))
        .await
        .unwrap();
}

pub async fn bad_metadata_is_refused_before_anything_is_locked(h: Harness) {
    let big = json!({ "blob": "x".repeat(5000) });
    let layer = LockLayer::new(h.backend.clone(), move |_: &Request<Body>| {
        Some(spec("meta:big", Duration::from_secs(5)).metadata(big.clone()))
    });
    let app = Router::new().route("/run", post(|| async { "ran" }).layer(layer));
    send(&app, post_req("/run"))
        .await
        .assert_rejection(400, "LOCK_INVALID_METADATA");
    let not_object = job_spec("meta:array", Duration::from_secs(5)).metadata(json!([1, 2]));
    assert!(matches!(
        OwnedLock::acquire(&h.backend, &not_object).await,
        Err(LockError::InvalidMetadata(_))
    ));
    assert_eq!(status_of(&h.backend, &gkey("meta:big")).await, None);
    assert_eq!(status_of(&h.backend, &gkey("meta:array")).await, None);
}

// ---------------------------------------------------------------------------
// Minimum hold (singleton scheduled jobs)

pub async fn min_hold_keeps_an_early_release_until_it_ends(h: Harness) {
    let key = gkey("cron:nightly");
    let nightly = job_spec("cron:nightly", h.units(10)).min_hold(h.units(3));

    // The job finishes at once; the lock stays until 3 units have passed.
    let ran = with_lock(&h.backend, &nightly, |_| async { "ran" })
        .await
        .unwrap();
    assert_eq!(ran, "ran");
    let held = status_of(&h.backend, &key)
        .await
        .expect("still held after an early release");
    assert!(held.ttl_remaining <= h.units(3), "{:?}", held.ttl_remaining);
    // Another instance whose schedule fires a little later does not run it.
    let late = with_lock(&h.backend, &nightly, |_| async { "ran twice" }).await;
    assert!(matches!(late, Err(LockError::AcquisitionFailed { .. })));

    h.advance(h.units(3) + h.unit() / 2).await;
    assert_eq!(
        status_of(&h.backend, &key).await,
        None,
        "free after the hold"
    );

    // Released after the hold has passed: freed at once.
    let lock = OwnedLock::acquire(&h.backend, &nightly).await.unwrap();
    h.advance(h.units(3) + h.unit() / 2).await;
    lock.release().await.unwrap();
    assert_eq!(status_of(&h.backend, &key).await, None);

    // The hold travels in a token: released early after a restore, kept.
    let lock = OwnedLock::acquire(&h.backend, &nightly).await.unwrap();
    let token = lock.into_token();
    assert!(token.hold_until_ms().is_some());
    let restored = OwnedLock::restore(&h.backend, &token).await.unwrap();
    restored.release().await.unwrap();
    assert!(
        status_of(&h.backend, &key).await.is_some(),
        "kept after restore"
    );
}

// ---------------------------------------------------------------------------
// with_lock, release_all

pub async fn with_lock_releases_on_ok_err_and_panic(h: Harness) {
    let s = job_spec("with", Duration::from_secs(30));
    let key = gkey("with");

    let fence = with_lock(&h.backend, &s, |lock| async move { lock.fence() })
        .await
        .unwrap();
    assert!(fence > 0);
    assert_comes_free(&h, &key).await;

    let failed: Result<Result<(), &str>, LockError> =
        with_lock(&h.backend, &s, |_| async { Err("the work failed") }).await;
    assert_eq!(failed, Ok(Err("the work failed")));
    assert_comes_free(&h, &key).await;

    let backend = h.backend.clone();
    let s2 = s.clone();
    let panicked = tokio::spawn(async move {
        with_lock(&backend, &s2, |_| async { panic!("the work panicked") }).await
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    assert_comes_free(&h, &key).await;

    // Busy: the work never runs.
    let holder = OwnedLock::acquire(&h.backend, &s).await.unwrap();
    let mut ran = false;
    let busy = with_lock(&h.backend, &s, |_| {
        ran = true;
        async {}
    })
    .await;
    assert!(matches!(busy, Err(LockError::AcquisitionFailed { .. })));
    assert!(!ran);
    holder.release().await.unwrap();
}

pub async fn release_all_frees_every_lock_of_a_request_and_a_job(h: Harness) {
    let layer = LockLayer::new(h.backend.clone(), |_: &Request<Body>| {
        [
            spec("all:a", Duration::from_secs(30)),
            spec("all:b", Duration::from_secs(30)).auto_release(false),
        ]
    });
    let backend = h.backend.clone();
    let app = Router::new().route(
        "/run",
        post(move |locks: Locks| {
            let backend = backend.clone();
            async move {
                let n = locks.release_all().await.unwrap();
                let a = backend.status(&gkey("all:a")).await.unwrap();
                let b = backend.status(&gkey("all:b")).await.unwrap();
                let again = locks.release("all:a").await;
                format!("{n} {} {} {:?}", a.is_none(), b.is_none(), again)
            }
        })
        .layer(layer),
    );
    let reply = send(&app, post_req("/run")).await;
    assert_eq!(reply.text(), "2 true true Err(AlreadyReleased)");

    let mut job = Vec::new();
    for k in ["job:1", "job:2", "job:3"] {
        job.push(
            OwnedLock::acquire(&h.backend, &job_spec(k, Duration::from_secs(30)))
                .await
                .unwrap(),
        );
    }
    OwnedLock::release_all(job).await.unwrap();
    for k in ["job:1", "job:2", "job:3"] {
        assert_eq!(status_of(&h.backend, &gkey(k)).await, None, "{k}");
    }
}

// ---------------------------------------------------------------------------
// Lookups (SyncGuard's getByKey / getById / owns)

pub async fn lookups_by_owner_are_checked_against_the_locks(h: Harness) {
    let b = h.indexed();
    let owner = "worker-7";
    for k in ["look:c", "look:a", "look:b"] {
        let s = job_spec(k, Duration::from_secs(30)).owner(owner);
        let s = if k == "look:a" { s.metadata(who()) } else { s };
        OwnedLock::acquire(&b, &s).await.unwrap().keep();
    }
    let other = OwnedLock::acquire(&b, &job_spec("look:other", Duration::from_secs(30)))
        .await
        .unwrap();
    let keys = |found: &[tower_lock::backend::HeldBy]| {
        found
            .iter()
            .map(|f| f.key.key().to_owned())
            .collect::<Vec<_>>()
    };

    let found = b.held_by(owner, 10).await.unwrap();
    assert_eq!(keys(&found), ["look:a", "look:b", "look:c"]);
    assert!(found.iter().all(|f| f.status.owner == owner));
    assert_eq!(
        found[0].status.metadata.as_ref().map(|m| m.to_value()),
        Some(who())
    );
    assert_eq!(
        keys(&b.held_by(owner, 2).await.unwrap()),
        ["look:a", "look:b"]
    );
    assert_eq!(
        keys(&b.held_by(other.info().owner(), 10).await.unwrap()),
        ["look:other"]
    );
    assert!(b.held_by("nobody", 10).await.unwrap().is_empty());

    assert!(b.owns(&gkey("look:a"), owner).await.unwrap());
    assert!(!b.owns(&gkey("look:a"), "worker-8").await.unwrap());
    assert!(!b.owns(&gkey("look:free"), owner).await.unwrap());

    // Released; force-released behind the owner's back and taken by
    // someone else before any lookup (a stale index entry on Redis): never
    // listed.
    b.release(&gkey("look:b"), Holder::owner_only(owner))
        .await
        .unwrap();
    assert!(b.force_release(&gkey("look:c")).await.unwrap());
    b.acquire(&areq(
        &gkey("look:c"),
        "thief",
        Duration::from_secs(30),
        Duration::ZERO,
    ))
    .await
    .unwrap();
    assert_eq!(keys(&b.held_by(owner, 10).await.unwrap()), ["look:a"]);
    assert_eq!(keys(&b.held_by(owner, 10).await.unwrap()), ["look:a"]);
    assert!(!b.owns(&gkey("look:c"), owner).await.unwrap());
    other.release().await.unwrap();
}

pub async fn a_lookup_while_the_owner_waits_keeps_the_lock_findable(h: Harness) {
    // A lookup made while the owner's acquisition waits finds nothing (the
    // lock is not held by it yet) and must not forget the acquisition: once
    // it is granted, lookups list it (on Redis, the index entry of an
    // acquisition under way is not a stale one).
    let b = h.indexed();
    let owner = "worker-waiting";
    let k = gkey("look:wait");
    let ttl = Duration::from_secs(30);
    let first = b
        .acquire(&areq(&k, "first", ttl, Duration::ZERO))
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let (b, k) = (b.clone(), k.clone());
        async move {
            b.acquire(&areq(&k, owner, ttl, Duration::from_secs(10)))
                .await
        }
    });
    h.until_queued(&k, 1).await;
    assert!(b.held_by(owner, 10).await.unwrap().is_empty());
    assert!(!b.owns(&k, owner).await.unwrap());
    b.release(&k, Holder::new("first", first.fence))
        .await
        .unwrap();
    let lease = waiting.await.unwrap().unwrap();
    let found = b.held_by(owner, 10).await.unwrap();
    assert_eq!(
        found.iter().map(|f| f.key.key()).collect::<Vec<_>>(),
        ["look:wait"],
        "the lookup made while it waited lost the lock"
    );
    assert!(b.owns(&k, owner).await.unwrap());
    b.release(&k, Holder::new(owner, lease.fence))
        .await
        .unwrap();
}

pub async fn lookups_never_list_an_expired_lock(h: Harness) {
    // An expired lock is not held, even while nothing has cleaned it up yet
    // (a row still in PostgreSQL's table, an entry in memory's, an index
    // entry on Redis).
    let b = h.indexed();
    let owner = "worker-9";
    let short = areq(&gkey("exp:short"), owner, h.units(1), Duration::ZERO);
    let long = areq(&gkey("exp:long"), owner, h.units(20), Duration::ZERO);
    b.acquire(&short).await.unwrap();
    b.acquire(&long).await.unwrap();
    h.advance(h.units(1) + h.unit() / 2).await;
    let found = b.held_by(owner, 10).await.unwrap();
    let keys: Vec<_> = found.iter().map(|f| f.key.key().to_owned()).collect();
    assert_eq!(keys, ["exp:long"], "an expired lock is not listed");
    assert!(!b.owns(&gkey("exp:short"), owner).await.unwrap());
    assert!(b.owns(&gkey("exp:long"), owner).await.unwrap());
    b.release(&gkey("exp:long"), Holder::owner_only(owner))
        .await
        .unwrap();
}

pub async fn lookup_errors_never_name_the_owner(h: Harness) {
    // A backend without an index for lookups says so, without the token.
    let secret = "s3cret-owner-token";
    match h.backend.held_by(secret, 10).await {
        Ok(found) => assert!(found.is_empty()),
        Err(e) => {
            assert_eq!(e.code(), "LOCK_UNSUPPORTED");
            assert!(!e.to_string().contains(secret));
        }
    }
    let key = LockKey::global("look:secret-key").unwrap();
    assert!(!format!("{key:?}").contains("secret-key"));
}

pub async fn lookups_jobs_and_client_locks_never_log_keys_or_owners(h: Harness) {
    // Everything logged at any level while a secret key and owner go
    // through lookups, a job whose lock is gone and over-limit lock headers.
    let (logs, _guard) = crate::common::logs::Logs::capture(tracing::Level::TRACE);
    let (key, owner) = ("user:secret-key-4711", "secret-owner-4711");
    let b = h.indexed();
    let lock = OwnedLock::acquire(&b, &job_spec(key, Duration::from_secs(30)).owner(owner))
        .await
        .unwrap();
    assert_eq!(b.held_by(owner, 10).await.unwrap().len(), 1);
    assert!(b.owns(&gkey(key), owner).await.unwrap());
    assert!(!b.owns(&gkey(key), "secret-other-4711").await.unwrap());
    let token = lock.into_token();
    b.release(&gkey(key), Holder::owner_only(owner))
        .await
        .unwrap();

    let worker = ServiceBuilder::new()
        .layer(JobLockLayer::new(b.clone()))
        .service(service_fn(handle));
    let stale = Job {
        token: Some(token),
        lock: None,
        outcome: "ok",
    };
    assert!(matches!(
        worker.oneshot(stale).await,
        Err(JobError::Lock(LockError::NotFound))
    ));

    let (app, runs) = charge_app(&h, ClientLocks::new().max_ttl(Duration::from_secs(1)), true);
    let over = [("lock-key", key), ("lock-ttl", "5s"), ("lock-owner", owner)];
    send(&app, charge(&over))
        .await
        .assert_rejection(400, "LOCK_NOT_ALLOWED");
    assert_eq!(runs.load(SeqCst), 0);

    let text = logs.text();
    assert_eq!(logs.count("job not run"), 1, "logs are captured:\n{text}");
    for secret in ["secret-key-4711", "secret-owner-4711", "secret-other-4711"] {
        assert!(!text.contains(secret), "{secret} logged:\n{text}");
    }
}

// ---------------------------------------------------------------------------
// The job layer (Laravel's releaseOnJobProcessedOrFailed)

struct Job {
    token: Option<LockToken>,
    lock: Option<tower_lock::HeldLock>,
    outcome: &'static str,
}

impl LockedJob for Job {
    fn lock_token(&self) -> Option<&LockToken> {
        self.token.as_ref()
    }
    fn set_lock(&mut self, lock: tower_lock::HeldLock) {
        self.lock = Some(lock);
    }
}

/// A job handler: answers the fence it ran under, or fails, or panics.
async fn handle(job: Job) -> Result<u64, &'static str> {
    let fence = job.lock.as_ref().map_or(0, |l| l.fence());
    match job.outcome {
        "ok" => Ok(fence),
        "err" => Err("the job failed"),
        _ => panic!("the job panicked"),
    }
}

async fn queued(h: &Harness, key: &str) -> LockToken {
    OwnedLock::acquire(&h.backend, &job_spec(key, Duration::from_secs(30)))
        .await
        .unwrap()
        .into_token()
}

pub async fn job_layer_releases_when_the_job_is_processed_fails_or_panics(h: Harness) {
    // The worker is another process, on its own handle.
    let worker = ServiceBuilder::new()
        .layer(JobLockLayer::new(h.indexed()))
        .service(service_fn(handle));
    let job = |token: Option<LockToken>, outcome| Job {
        token,
        lock: None,
        outcome,
    };

    let token = queued(&h, "job:ok").await;
    let fence = token.fence();
    let done = worker.clone().oneshot(job(Some(token), "ok")).await;
    assert!(done.unwrap() > fence, "the job ran with its lock, claimed");
    assert_eq!(status_of(&h.backend, &gkey("job:ok")).await, None);

    let token = queued(&h, "job:err").await;
    let failed = worker.clone().oneshot(job(Some(token), "err")).await;
    assert!(matches!(failed, Err(JobError::Job("the job failed"))));
    assert_eq!(status_of(&h.backend, &gkey("job:err")).await, None);

    let token = queued(&h, "job:panic").await;
    let w = worker.clone();
    let panicked = tokio::spawn(async move { w.oneshot(job(Some(token), "panic")).await }).await;
    assert!(panicked.unwrap_err().is_panic());
    assert_comes_free(&h, &gkey("job:panic")).await;

    // A token whose lock is gone: the job does not run.
    let token = queued(&h, "job:stale").await;
    h.backend
        .release(&gkey("job:stale"), Holder::owner_only(token.owner()))
        .await
        .unwrap();
    let stale = worker.clone().oneshot(job(Some(token), "panic")).await;
    assert!(matches!(stale, Err(JobError::Lock(LockError::NotFound))));

    // No token: the job runs as it is.
    assert_eq!(worker.oneshot(job(None, "ok")).await.unwrap(), 0);
}

pub async fn job_layer_watchdog_keeps_a_long_job_locked(h: Harness) {
    let key = gkey("job:long");
    for watchdog in [true, false] {
        // A TTL of three units, renewed every unit: on a loaded machine a
        // renewal late by a unit or so still lands in time (with a TTL of
        // one unit, a 100 ms stall between renewals read as a loss).
        let token = OwnedLock::acquire(&h.backend, &job_spec("job:long", h.units(3)))
            .await
            .unwrap()
            .into_token();
        let unit = h.unit();
        let long_job = service_fn(move |job: Job| async move {
            let lock = job.lock.expect("set");
            // Four units of work: past the TTL.
            // (On the paused clock, sleeping lets it advance when every
            // task is idle, so the watchdog's renewals run in order.)
            for _ in 0..8 {
                tokio::time::sleep(unit / 2).await;
            }
            Ok::<bool, ()>(lock.is_lost())
        });
        let worker = ServiceBuilder::new()
            .layer(JobLockLayer::new(h.backend.clone()).watchdog(watchdog))
            .service(long_job);
        let job = Job {
            token: Some(token),
            lock: None,
            outcome: "ok",
        };
        let lost = worker.oneshot(job).await.unwrap();
        assert_eq!(lost, !watchdog, "watchdog {watchdog}");
        assert_eq!(status_of(&h.backend, &key).await, None);
    }
}

// ---------------------------------------------------------------------------
// Client-directed locks (Forrst's atomicLock)

fn charge_app(h: &Harness, locks: ClientLocks, lock_headers: bool) -> (Router, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let seen = runs.clone();
    let backend = h.backend.clone();
    let handler = move || {
        let (seen, backend) = (seen.clone(), backend.clone());
        async move {
            seen.fetch_add(1, SeqCst);
            // Who holds the route's lock while the handler runs.
            let held = backend
                .status(&LockKey::route("/charge", "user:1").unwrap())
                .await
                .unwrap();
            held.map_or("free".to_owned(), |s| s.owner)
        }
    };
    let layer = LockLayer::new(h.backend.clone(), locks).lock_headers(lock_headers);
    let app = Router::new().route("/charge", post(handler).layer(layer));
    (app, runs)
}

fn charge(headers: &[(&'static str, &str)]) -> Request<Body> {
    let mut req = post_req("/charge");
    for (name, value) in headers {
        req = with_header(req, name, value.as_bytes());
    }
    req
}

pub async fn client_directed_locks_follow_the_headers_within_limits(h: Harness) {
    let limits = ClientLocks::new()
        .max_ttl(Duration::from_secs(10))
        .max_block(Duration::from_secs(2))
        .allow_keys(|k: &str| k.starts_with("user:"));
    let (app, runs) = charge_app(&h, limits.clone(), true);
    let route_key = LockKey::route("/charge", "user:1").unwrap();

    // No Lock-Key: no lock, no lock headers.
    let plain = send(&app, charge(&[])).await;
    assert_eq!(plain.text(), "free");
    assert!(plain.headers.get("lock-key").is_none());

    // A lock in the route's namespace, described on the response.
    let locked = send(&app, charge(&[("lock-key", "user:1"), ("lock-ttl", "5s")])).await;
    assert_eq!(locked.status, 200);
    assert_ne!(locked.text(), "free", "held while the handler ran");
    let hdr = |r: &super::support::Reply, n: &str| {
        r.headers.get(n).map(|v| v.to_str().unwrap().to_owned())
    };
    assert_eq!(hdr(&locked, "lock-acquired").as_deref(), Some("true"));
    assert_eq!(hdr(&locked, "lock-key").as_deref(), Some("user:1"));
    assert_eq!(hdr(&locked, "lock-scope").as_deref(), Some("function"));
    assert!(hdr(&locked, "lock-fence").is_some() && hdr(&locked, "lock-expires-at").is_some());
    assert_eq!(hdr(&locked, "lock-owner"), None, "owner only when kept");
    super::support::assert_released(&h, &route_key).await;

    // Kept, with the client's own owner token: echoed, still held.
    let kept = send(
        &app,
        charge(&[
            ("lock-key", "user:1"),
            ("lock-ttl", "10"),
            ("lock-owner", "client-42"),
            ("lock-auto-release", "false"),
        ]),
    )
    .await;
    assert_eq!(kept.text(), "client-42");
    assert_eq!(hdr(&kept, "lock-owner").as_deref(), Some("client-42"));
    assert_eq!(
        status_of(&h.backend, &route_key).await.unwrap().owner,
        "client-42"
    );
    // Busy, no block: 429.
    send(&app, charge(&[("lock-key", "user:1"), ("lock-ttl", "5s")]))
        .await
        .assert_rejection(429, "LOCK_ACQUISITION_FAILED");
    h.backend
        .release(&route_key, Holder::owner_only("client-42"))
        .await
        .unwrap();

    // Refused before anything is locked or run.
    let before = runs.load(SeqCst);
    for (headers, code) in [
        (
            &[("lock-key", "user:1"), ("lock-ttl", "1h")][..],
            "LOCK_NOT_ALLOWED",
        ),
        (
            &[
                ("lock-key", "user:1"),
                ("lock-ttl", "5s"),
                ("lock-block", "10s"),
            ][..],
            "LOCK_NOT_ALLOWED",
        ),
        (
            &[("lock-key", "admin:1"), ("lock-ttl", "5s")][..],
            "LOCK_NOT_ALLOWED",
        ),
        (
            &[
                ("lock-key", "user:1"),
                ("lock-ttl", "5s"),
                ("lock-scope", "global"),
            ][..],
            "LOCK_NOT_ALLOWED",
        ),
        (
            &[("lock-key", "user:1"), ("lock-ttl", "soon")][..],
            "LOCK_INVALID_HEADER",
        ),
        (&[("lock-key", "user:1")][..], "LOCK_INVALID_HEADER"),
        (
            &[
                ("lock-key", "user:1"),
                ("lock-ttl", "5s"),
                ("lock-scope", "planet"),
            ][..],
            "LOCK_INVALID_HEADER",
        ),
        (
            &[
                ("lock-key", "user:1"),
                ("lock-ttl", "5s"),
                ("lock-auto-release", "maybe"),
            ][..],
            "LOCK_INVALID_HEADER",
        ),
        (
            &[("lock-key", "user%FF"), ("lock-ttl", "5s")][..],
            "LOCK_INVALID_HEADER",
        ),
        (
            &[
                ("lock-key", "user:1"),
                ("lock-ttl", "5s"),
                ("lock-owner", "a b"),
            ][..],
            "LOCK_INVALID_OWNER",
        ),
    ] {
        let reply = send(&app, charge(headers)).await;
        reply.assert_rejection(400, code);
        assert!(!reply.text().contains("admin:1"), "never echoes the key");
    }
    assert_eq!(runs.load(SeqCst), before, "no handler ran");
    assert_eq!(status_of(&h.backend, &route_key).await, None);

    // Global scope where the server allows it.
    let (global_app, _) = charge_app(&h, limits.allow_global(true), false);
    let global = send(
        &global_app,
        charge(&[
            ("lock-key", "user:1"),
            ("lock-ttl", "5s"),
            ("lock-scope", "global"),
            ("lock-auto-release", "false"),
        ]),
    )
    .await;
    assert_eq!(hdr(&global, "lock-scope").as_deref(), Some("global"));
    let owner = hdr(&global, "lock-owner").expect("kept: owner shown");
    assert_eq!(
        status_of(&h.backend, &gkey("user:1")).await.unwrap().owner,
        owner
    );
    h.backend
        .release(&gkey("user:1"), Holder::owner_only(&owner))
        .await
        .unwrap();

    // Without lock_headers, an auto-release lock is not described.
    let quiet = send(
        &global_app,
        charge(&[("lock-key", "user:1"), ("lock-ttl", "5s")]),
    )
    .await;
    assert_eq!(quiet.status, 200);
    assert!(quiet.headers.get("lock-key").is_none());
}
