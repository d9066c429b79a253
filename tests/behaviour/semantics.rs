//! The backend contract: TTL expiry, extension, ownership, fencing tokens.

use std::time::Duration;
use tower_lock::backend::Holder;

use axum::Router;
use axum::body::Body;
use http::{Request, StatusCode};
use tower_lock::{JobSpec, LockError, LockKind, LockLayer, LockSpec, OwnedLock};

use super::harness::Harness;
use super::support::*;

/// (14) A holder that never releases: the lock is free for the next acquirer
/// once its TTL has passed, with no cleanup call, and status says so.
pub async fn ttl_expiry_frees_without_cleanup(h: Harness) {
    let key = gkey("k");
    let ttl = h.units(3);
    let held = h
        .backend
        .acquire(&areq(&key, "holder", ttl, Duration::ZERO))
        .await
        .unwrap();
    let ctl = Ctl::default();
    let app: Router = app(&h.backend, Cfg::global(Duration::from_secs(30)), &ctl);

    h.advance(h.units(2)).await;
    let status = status_of(&h.backend, &key).await;
    let refused = h
        .backend
        .acquire(&areq(&key, "next", ttl, Duration::ZERO))
        .await;
    let rejection = send(&app, post_req("/r/k")).await;
    // What was asked before the TTL ended is judged by it; on a real server
    // a machine stalled past the TTL (builds beside the tests) leaves
    // nothing to judge here, and the expiry below is still checked.
    let mut runs = 0;
    if h.is_paused() || std::time::SystemTime::now() < held.expires_at {
        assert_eq!(status.expect("still held").owner, "holder");
        let retry_after = refused
            .unwrap_err()
            .retry_after()
            .expect("holder's remaining TTL");
        assert!(retry_after <= h.unit(), "{retry_after:?}");
        rejection.assert_rejection(429, "LOCK_ACQUISITION_FAILED");
    } else {
        eprintln!("the TTL ended before the checks of a held lock answered: not judged");
        if let Ok(lease) = refused {
            let next = Holder::new("next", lease.fence);
            h.backend.release(&key, next).await.unwrap();
        }
        runs += usize::from(rejection.status == StatusCode::OK);
    }

    h.advance(h.units(3) / 2).await;
    assert_eq!(status_of(&h.backend, &key).await, None, "expired");
    assert_eq!(send(&app, post_req("/r/k")).await.status, StatusCode::OK);
    let next = h
        .backend
        .acquire(&areq(&key, "next", ttl, Duration::ZERO))
        .await
        .expect("free after the TTL");
    assert!(next.fence > held.fence);
    assert_eq!(ctl.runs(), runs + 1);
}

/// (15a) `extend` replaces the remaining TTL: acquired for 10, extended by 10
/// at 8, still held at 17, free after 18.
pub async fn two_extends_at_once_still_end_at_a_ttl(h: Harness) {
    // Two extensions of one lock sent together (the watchdog's and one by
    // hand, say): whichever lands last, the lock ends at its TTL. (etcd
    // keeps TTLs with a timer per write, and each extension that landed
    // disarmed the other's: nothing was left to end the lock.)
    let key = gkey("k");
    let lease = h
        .backend
        .acquire(&areq(&key, "holder", h.units(2), Duration::ZERO))
        .await
        .unwrap();
    let holder = Holder::new("holder", lease.fence);
    let (a, b) = tokio::join!(
        h.backend.extend(&key, holder, h.units(3)),
        h.backend
            .extend(&key, holder, h.units(3) - Duration::from_millis(1)),
    );
    a.unwrap();
    b.unwrap();
    h.advance(h.units(5)).await;
    assert_eq!(
        status_of(&h.backend, &key).await,
        None,
        "the lock outlived both extensions"
    );
}

pub async fn extend_replaces_ttl(h: Harness) {
    let key = gkey("k");
    let ten = h.units(10);
    let first = h
        .backend
        .acquire(&areq(&key, "holder", ten, Duration::ZERO))
        .await
        .unwrap();
    // On a real server a machine stalled past a TTL (builds beside the
    // tests) leaves a check that was due before it nothing to judge.
    let before =
        |until: std::time::SystemTime| h.is_paused() || std::time::SystemTime::now() < until;

    h.advance(h.units(8)).await;
    let extended = h
        .backend
        .extend(&key, Holder::owner_only("holder"), ten)
        .await;
    let lease = match extended {
        Ok(lease) => lease,
        Err(LockError::NotFound) if !before(first.expires_at) => {
            eprintln!("the TTL ended before the extend answered: not judged");
            return;
        }
        Err(e) => panic!("extend at 8: {e:?}"),
    };
    assert_eq!(lease.ttl, ten);

    h.advance(h.units(9)).await; // 17
    let status = status_of(&h.backend, &key).await;
    let busy = h
        .backend
        .acquire(&areq(&key, "other", ten, Duration::ZERO))
        .await;
    if !before(lease.expires_at) {
        eprintln!("the extended TTL ended before the checks at 17 answered: not judged");
        return;
    }
    let status = status.expect("held at 17");
    assert_eq!(status.owner, "holder");
    if h.is_paused() {
        assert_eq!(status.ttl_remaining, h.unit());
    }
    assert!(
        matches!(busy, Err(LockError::AcquisitionFailed { .. })),
        "{busy:?}"
    );

    h.advance(h.units(3) / 2).await; // 18.5
    assert_eq!(status_of(&h.backend, &key).await, None, "free after 18");
}

/// (15b) Extending an expired lock fails with `LOCK_NOT_FOUND` and never
/// revives it; extending someone else's lock is `LOCK_OWNERSHIP_MISMATCH`.
pub async fn extend_never_revives_and_checks_owner(h: Harness) {
    let key = gkey("k");
    let ttl = h.units(2);
    h.backend
        .acquire(&areq(&key, "holder", ttl, Duration::ZERO))
        .await
        .unwrap();
    h.advance(h.units(3)).await;

    let err = h
        .backend
        .extend(&key, Holder::owner_only("holder"), ttl)
        .await
        .unwrap_err();
    assert_eq!(err, LockError::NotFound);
    assert_eq!(err.code(), "LOCK_NOT_FOUND");
    assert_eq!(status_of(&h.backend, &key).await, None, "not revived");

    h.backend
        .acquire(&areq(&key, "owner", h.units(10), Duration::ZERO))
        .await
        .unwrap();
    let before = status_of(&h.backend, &key).await.unwrap();
    let err = h
        .backend
        .extend(&key, Holder::owner_only("intruder"), ttl)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "LOCK_OWNERSHIP_MISMATCH");
    let after = status_of(&h.backend, &key).await.unwrap();
    assert_eq!(after.owner, "owner");
    assert_eq!(after.fence, before.fence);
    // Had the intruder's extension landed, 2 units would be left.
    assert!(after.ttl_remaining > h.units(5), "TTL untouched: {after:?}");
    if h.is_paused() {
        assert_eq!(after.ttl_remaining, before.ttl_remaining);
    }

    // The same through an owned handle.
    let spec = JobSpec::new("job", h.units(2));
    let mut job = OwnedLock::acquire(h.backend.clone(), &spec).await.unwrap();
    job.extend(h.units(10)).await.unwrap();
    assert_eq!(job.info().ttl(), h.units(10));
    h.advance(h.units(3)).await;
    assert!(
        job.status().await.unwrap().is_some(),
        "extended past its TTL"
    );
    job.release().await.unwrap();
}

/// (16) Only the owner releases: another owner gets
/// `LOCK_OWNERSHIP_MISMATCH` and the lock stays; a free key is
/// `LOCK_NOT_FOUND`.
pub async fn release_checks_owner(h: Harness) {
    let key = gkey("k");
    let ttl = Duration::from_secs(30);
    h.backend
        .acquire(&areq(&key, "owner", ttl, Duration::ZERO))
        .await
        .unwrap();

    let err = h
        .backend
        .release(&key, Holder::owner_only("intruder"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "LOCK_OWNERSHIP_MISMATCH");
    assert_eq!(status_of(&h.backend, &key).await.unwrap().owner, "owner");

    let err = h
        .backend
        .release(&gkey("free"), Holder::owner_only("anyone"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "LOCK_NOT_FOUND");

    h.backend
        .release(&key, Holder::owner_only("owner"))
        .await
        .unwrap();
    assert_eq!(status_of(&h.backend, &key).await, None);
    let err = h
        .backend
        .release(&key, Holder::owner_only("owner"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "LOCK_NOT_FOUND", "a released lock is gone");
}

/// (17) Fencing tokens strictly increase per key across release, expiry,
/// force-release and hand-off to a waiter.
pub async fn fencing_tokens_strictly_increase(h: Harness) {
    let probe = Probe::new(&h.backend);
    let backend = probe.backend();
    let key = gkey("k");
    // Only `b` needs a short TTL (it runs out); the others hold long, so
    // that a loaded machine's slow status read never finds them gone.
    let ttl = h.units(2);
    let mut fences = Vec::new();

    let lease = backend
        .acquire(&areq(&key, "a", h.units(30), Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(status_of(&backend, &key).await.unwrap().fence, lease.fence);
    fences.push(lease.fence);
    backend
        .release(&key, Holder::owner_only("a"))
        .await
        .unwrap();

    // After a release.
    let lease = backend
        .acquire(&areq(&key, "b", ttl, Duration::ZERO))
        .await
        .unwrap();
    fences.push(lease.fence);

    // After an expiry.
    h.advance(h.units(3)).await;
    let lease = backend
        .acquire(&areq(&key, "c", h.units(30), Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(status_of(&backend, &key).await.unwrap().fence, lease.fence);
    fences.push(lease.fence);

    // After a force-release.
    assert!(backend.force_release(&key).await.unwrap());
    assert!(!backend.force_release(&key).await.unwrap(), "nothing left");
    let lease = backend
        .acquire(&areq(&key, "d", h.units(10), Duration::ZERO))
        .await
        .unwrap();
    fences.push(lease.fence);

    // Handed to a waiter.
    let waiter = tokio::spawn({
        let backend = backend.clone();
        let req = areq(&key, "e", h.units(30), h.units(60));
        async move { backend.acquire(&req).await }
    });
    probe.acquires_started(5).await;
    backend
        .release(&key, Holder::owner_only("d"))
        .await
        .unwrap();
    let lease = waiter.await.unwrap().expect("handed over");
    assert_eq!(status_of(&backend, &key).await.unwrap().owner, "e");
    fences.push(lease.fence);

    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences must strictly increase: {fences:?}"
    );
}

/// (16.3) A retry of a waiting acquisition (the same request, sent again
/// while the first call still waits) finds the lock handed to the first
/// call's entry and takes that hold, as after a lost reply. The first call,
/// dropped before it read its grant, then gives nothing back: the retry
/// holds the lock until it releases it. (Its cleanup released the hold
/// under the retry and handed it on: two holders, on memory and Redis.)
pub async fn a_dropped_call_never_gives_back_the_hold_its_retry_took(h: Harness) {
    for (name, kind) in [("x", LockKind::Exclusive), ("s", LockKind::Shared)] {
        let key = gkey(name);
        let ttl = Duration::from_secs(30);
        h.backend
            .acquire(&areq(&key, "holder", ttl, Duration::ZERO))
            .await
            .unwrap();
        let req = areq(&key, "client", ttl, Duration::from_secs(20))
            .with_kind(kind)
            .unwrap();
        // The first call queues; its future is then kept but never polled
        // again, so it never reads the grant it is handed.
        let mut first = Box::pin(h.backend.acquire(&req));
        tokio::select! {
            biased;
            r = &mut first => panic!("the lock is held: {r:?}"),
            () = h.until_queued(&key, 1) => {}
        }
        h.backend
            .release(&key, Holder::owner_only("holder"))
            .await
            .unwrap();
        let st = status_of(&h.backend, &key).await.expect("handed over");
        // (An exclusive lock's holder is the status itself.)
        let handed = st
            .holders
            .first()
            .map_or((st.owner, st.fence), |h| (h.owner.clone(), h.fence));
        assert_eq!(handed.0, "client", "{kind}");
        // The retry takes the hold handed to the first call...
        let retry = h.backend.acquire(&req).await.unwrap();
        assert_eq!(retry.fence, handed.1, "{kind}");
        // ...and the first call goes away.
        drop(first);
        // A writer gets nothing while the retry holds the lock (had the
        // first call's cleanup given it back, it would be handed this one).
        let other = h
            .backend
            .acquire(&areq(&key, "other", ttl, Duration::from_secs(2)))
            .await;
        assert!(
            matches!(other, Err(LockError::Timeout { .. })),
            "{kind}: the retry's hold was given away: {other:?}"
        );
        h.backend
            .release(&key, Holder::new("client", retry.fence))
            .await
            .expect("the retry still holds the lock");
        assert_released(&h, &key).await;
    }
}

/// (16.3) Two calls of one request waiting at once (a retry sent while the
/// first still waits): once the lock is handed to one, the other answers
/// with that same hold, well within its max wait, and leaves the queue. (On
/// memory it waited out its whole max wait, a live waiter all along.)
pub async fn a_waiting_retry_answers_with_its_twins_grant(h: Harness) {
    let key = gkey("k");
    let ttl = Duration::from_secs(30);
    h.backend
        .acquire(&areq(&key, "holder", ttl, Duration::ZERO))
        .await
        .unwrap();
    let req = areq(&key, "client", ttl, Duration::from_secs(60));
    let call = |req: &tower_lock::backend::AcquireRequest| {
        let (backend, req) = (h.backend.clone(), req.clone());
        tokio::spawn(async move { backend.acquire(&req).await })
    };
    let first = call(&req);
    h.until_queued(&key, 1).await;
    let second = call(&req);
    h.until_queued(&key, 2).await;
    h.backend
        .release(&key, Holder::owner_only("holder"))
        .await
        .unwrap();
    let a = first.await.unwrap().unwrap();
    let b = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the retry waited on for its max wait")
        .unwrap()
        .unwrap();
    assert_eq!(a.fence, b.fence, "one hold answers both calls");
    h.until_queue_is(&key, 0).await;
    h.backend
        .release(&key, Holder::new("client", a.fence))
        .await
        .unwrap();
    assert_released(&h, &key).await;
}

/// (16.3) One owner token never makes two holders: a retry of the same
/// acquisition (the same request, or a clone of it) gets the same lease,
/// while another request that merely names the same owner finds the lock
/// busy. Through the layer, two concurrent requests whose specs share an
/// owner token never run together.
pub async fn one_owner_token_never_makes_two_holders(h: Harness) {
    let key = gkey("k");
    let ttl = Duration::from_secs(30);
    let first = areq(&key, "client-1", ttl, Duration::ZERO);
    let lease = h.backend.acquire(&first).await.unwrap();
    // The same attempt again, as after a lost reply: the same lease.
    let again = h.backend.acquire(&first.clone()).await.unwrap();
    assert_eq!(again.fence, lease.fence);
    // Another attempt under the same owner token: busy.
    let other = h
        .backend
        .acquire(&areq(&key, "client-1", ttl, Duration::ZERO))
        .await;
    assert!(
        matches!(other, Err(LockError::AcquisitionFailed { .. })),
        "{other:?}"
    );
    assert_eq!(
        status_of(&h.backend, &key).await.unwrap().fence,
        lease.fence
    );
    h.backend
        .release(&key, Holder::owner_only("client-1"))
        .await
        .unwrap();

    let ctl = Ctl::default();
    let shared_owner = LockLayer::new(h.backend.clone(), |_: &Request<Body>| {
        Some(LockSpec::global("shared", Duration::from_secs(30)).owner("client-1"))
    });
    let app = Router::new().route("/r/{key}", gated(&ctl).layer(shared_owner));
    let holder = spawn_send(&app, gated_req("/r/x"));
    ctl.entered().await;
    send(&app, post_req("/r/x"))
        .await
        .assert_rejection(429, "LOCK_ACQUISITION_FAILED");
    assert_eq!(ctl.runs(), 1, "the second request never ran");
    ctl.open(1);
    assert_eq!(holder.await.unwrap().status, StatusCode::OK);
    assert_released(&h, &gkey("shared")).await;
}
