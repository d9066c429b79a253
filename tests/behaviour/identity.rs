//! An acquisition is named by its fence, not by its owner token: a reused
//! custom owner's stale acquisition can neither release, extend nor renew a
//! later one, and restoring a token claims the lock (once).

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_lock::admin::Admin;
use tower_lock::backend::Holder;
use tower_lock::headers::{LOCK_FENCE, LOCK_OWNER};
use tower_lock::{JobSpec, LockError, OwnedLock};

use super::harness::Harness;
use super::support::{areq, gkey, status_of};

/// A job's spec under the custom owner token every run of it shares.
fn nightly(ttl: Duration) -> JobSpec {
    JobSpec::new("nightly", ttl).owner("nightly-job")
}

/// Holder A (custom owner) pauses past its TTL; B, with the same owner,
/// takes the lock under a new fence. A's release and extend are refused and
/// leave B's lock as it was: no third caller gets it while B runs.
pub async fn a_stale_acquisition_of_a_reused_owner_touches_nothing(h: Harness) {
    let u = h.unit();
    let mut a = OwnedLock::acquire(h.backend.clone(), &nightly(u * 3))
        .await
        .unwrap();
    h.advance(u * 4).await;
    let b = OwnedLock::acquire(h.another(), &nightly(u * 30))
        .await
        .unwrap();
    assert!(b.fence() > a.fence());

    assert_eq!(
        a.extend(u * 30).await.unwrap_err(),
        LockError::OwnershipMismatch,
        "A's extend must not extend B's lock"
    );
    assert_eq!(a.fence(), a.info().fence(), "A still reports its own fence");
    assert!(a.fence() < b.fence());
    assert_eq!(
        a.release().await.unwrap_err(),
        LockError::OwnershipMismatch,
        "A's release must not free B's lock"
    );

    let key = b.info().lock_key().clone();
    let status = status_of(&h.backend, &key).await.expect("B still holds it");
    assert_eq!(status.fence, b.fence());
    let third = h
        .backend
        .acquire(&areq(&key, "third", u * 10, Duration::ZERO))
        .await;
    assert!(
        matches!(third, Err(LockError::AcquisitionFailed { .. })),
        "{third:?}"
    );
    // The backend calls themselves, as a layer's release after the
    // response makes them.
    let stale = Holder::new("nightly-job", status.fence - 1);
    assert_eq!(
        h.backend.release(&key, stale).await,
        Err(LockError::OwnershipMismatch)
    );
    assert_eq!(
        h.backend.extend(&key, stale, u).await.unwrap_err(),
        LockError::OwnershipMismatch
    );
    b.release().await.unwrap();
}

/// The same stale holder A, with the locks indexed by owner (Redis's
/// `index_owners`): its refused release must leave B's lock findable by
/// owner. The index follows what happened, not what was asked.
pub async fn a_stale_release_of_a_reused_owner_keeps_the_lock_findable(h: Harness) {
    let u = h.unit();
    let indexed = h.indexed();
    let a = OwnedLock::acquire(indexed.clone(), &nightly(u * 3))
        .await
        .unwrap();
    h.advance(u * 4).await;
    let b = OwnedLock::acquire(h.indexed(), &nightly(u * 30))
        .await
        .unwrap();
    assert_eq!(a.release().await.unwrap_err(), LockError::OwnershipMismatch);
    let found = indexed.held_by("nightly-job", 10).await.unwrap();
    assert_eq!(found.len(), 1, "the stale release hid B's lock");
    assert_eq!(found[0].status.fence, b.fence());
    b.release().await.unwrap();
    assert!(indexed.held_by("nightly-job", 10).await.unwrap().is_empty());
}

/// A's watchdog outlives A's lock (force-released while A is paused); B
/// takes the lock with the same owner. A's next renewal must fail, and A's
/// lost signal fire, rather than renew B's lock.
pub async fn a_stale_watchdog_never_renews_a_later_acquisition(h: Harness) {
    let u = h.unit();
    let a = OwnedLock::acquire(h.backend.clone(), &nightly(u * 30).watchdog(true))
        .await
        .unwrap();
    let key = a.info().lock_key().clone();
    assert!(h.backend.force_release(&key).await.unwrap());
    let b = OwnedLock::acquire(h.another(), &nightly(u * 30))
        .await
        .unwrap();
    // Renewals fall due every 10 units.
    for _ in 0..20 {
        if a.is_lost() {
            break;
        }
        h.advance(u).await;
    }
    assert!(a.is_lost(), "A's renewal must find its acquisition gone");
    let status = status_of(&h.backend, &key).await.expect("B holds it");
    assert_eq!(status.fence, b.fence());
    drop(a);
    b.release().await.unwrap();
}

/// A queue delivers a job twice: the first restore claims the lock (under a
/// new fence), the second is refused; after the job, the token finds
/// nothing.
pub async fn a_token_restores_once(h: Harness) {
    let lock = OwnedLock::acquire(
        h.backend.clone(),
        &JobSpec::new("export", Duration::from_secs(30)),
    )
    .await
    .unwrap();
    let token = lock.into_token();

    let job = OwnedLock::restore(h.another(), &token).await.unwrap();
    assert!(job.fence() > token.fence(), "a claim is a new acquisition");
    assert_eq!(
        OwnedLock::restore(h.another(), &token).await.unwrap_err(),
        LockError::OwnershipMismatch,
        "the second delivery must not run beside the first"
    );
    let key = token.lock_key().unwrap();
    assert_eq!(
        status_of(&h.backend, &key).await.unwrap().fence,
        job.fence()
    );
    // The token's own acquisition is gone: its fence releases nothing.
    assert_eq!(
        h.backend
            .release(&key, Holder::new(token.owner(), token.fence()))
            .await,
        Err(LockError::OwnershipMismatch)
    );

    job.release().await.unwrap();
    assert_eq!(
        OwnedLock::restore(h.another(), &token).await.unwrap_err(),
        LockError::NotFound
    );
}

/// A singleton job with a minimum hold finished early: its lock stays until
/// the hold ends, and a redelivered token must not run the job again then.
pub async fn a_finished_job_never_restores_within_its_minimum_hold(h: Harness) {
    let u = h.unit();
    let spec = JobSpec::new("singleton", u * 30).min_hold(u * 10);
    // The two deliveries' processes, connected before the hold starts: on
    // a real server the hold is real time, and opening their connections
    // inside it (a session each, its statements prepared) outlasted it on
    // a loaded machine, so the lock was already gone when looked at.
    let (first, second) = (h.another(), h.another());
    for other in [&first, &second] {
        status_of(other, &gkey("singleton")).await;
    }
    let token = OwnedLock::acquire(h.backend.clone(), &spec)
        .await
        .unwrap()
        .into_token();
    let job = OwnedLock::restore(first, &token).await.unwrap();
    job.release().await.unwrap();
    let key = token.lock_key().unwrap();
    assert!(status_of(&h.backend, &key).await.is_some(), "kept");
    assert_eq!(
        OwnedLock::restore(second, &token).await.unwrap_err(),
        LockError::OwnershipMismatch
    );
    h.advance(u * 11).await;
    assert_eq!(status_of(&h.backend, &key).await, None, "the hold ended");
}

/// A claim repeated after a lost reply (same attempt) answers the same
/// lease; another attempt with the old fence is refused.
pub async fn a_repeated_claim_answers_the_same(h: Harness) {
    let key = gkey("claim");
    let ttl = Duration::from_secs(30);
    let lease = h
        .backend
        .acquire(&areq(&key, "job-owner", ttl, Duration::ZERO))
        .await
        .unwrap();
    let holder = Holder::new("job-owner", lease.fence);
    let first = h.backend.claim(&key, holder, 41).await.unwrap();
    let again = h.backend.claim(&key, holder, 41).await.unwrap();
    assert!(first.fence > lease.fence);
    assert_eq!(again.fence, first.fence, "the same claim, not a second one");
    assert_eq!(
        h.backend.claim(&key, holder, 42).await.unwrap_err(),
        LockError::OwnershipMismatch
    );
    assert_eq!(
        h.backend
            .claim(&key, Holder::new("someone-else", first.fence), 43)
            .await
            .unwrap_err(),
        LockError::OwnershipMismatch
    );
    assert!(first.ttl <= ttl && first.ttl > Duration::from_secs(25));
    h.backend
        .release(&key, Holder::new("job-owner", first.fence))
        .await
        .unwrap();
    assert_eq!(
        h.backend.claim(&key, holder, 44).await.unwrap_err(),
        LockError::NotFound
    );
}

/// The admin API releases only the acquisition a `lock-fence` names.
pub async fn the_admin_release_honours_a_fence(h: Harness) {
    let app: Router = Router::new().nest("/admin", Admin::new(h.backend.clone()).router());
    let key = gkey("report");
    let ttl = Duration::from_secs(30);
    let lease = h
        .backend
        .acquire(&areq(&key, "cron", ttl, Duration::ZERO))
        .await
        .unwrap();
    let delete = |fence: String| {
        let app = app.clone();
        async move {
            let req = Request::delete("/admin/locks/report")
                .header(LOCK_OWNER, "cron")
                .header(LOCK_FENCE, fence)
                .body(Body::empty())
                .unwrap();
            let res = app.oneshot(req).await.unwrap();
            let status = res.status();
            let body = res.into_body().collect().await.unwrap().to_bytes();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            (status, body)
        }
    };
    let (status, body) = delete((lease.fence + 1).to_string()).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["code"], "LOCK_OWNERSHIP_MISMATCH");
    let (status, body) = delete("seven".to_owned()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "LOCK_INVALID_HEADER");
    assert!(status_of(&h.backend, &key).await.is_some());
    let (status, _) = delete(lease.fence.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(status_of(&h.backend, &key).await, None);
}
