//! Shared holds and permits (`LockKind`), the same contract on every
//! backend: who may hold together, who waits, in what order the queue is
//! served, fences across kinds, kinds that cannot meet, and each holder's
//! own TTL, release and extension.
//!
//! Asserted as state (the holders right after an event), not as timing.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{Request, StatusCode};
use tokio::task::JoinHandle;
use tower_lock::backend::{AcquireRequest, Holder, Lease};
use tower_lock::{
    JobSpec, LockError, LockKey, LockKind, LockLayer, LockSpec, OwnedLock, SharedBackend,
};

use super::harness::Harness;
use super::support::*;

const LONG: Duration = Duration::from_secs(30);
const PATIENT: Duration = Duration::from_secs(10);

fn kreq(
    key: &LockKey,
    owner: &str,
    kind: LockKind,
    ttl: Duration,
    wait: Duration,
) -> AcquireRequest {
    areq(key, owner, ttl, wait)
        .with_kind(kind)
        .expect("valid kind")
}

fn spawn_acquire(b: &SharedBackend, req: AcquireRequest) -> JoinHandle<Result<Lease, LockError>> {
    let b = b.clone();
    tokio::spawn(async move { b.acquire(&req).await })
}

/// The owners holding `key` now, in grant order (one for an exclusive lock).
async fn holders(h: &Harness, key: &LockKey) -> (LockKind, Vec<String>, usize) {
    match status_of(&h.backend, key).await {
        None => (LockKind::Exclusive, Vec::new(), 0),
        Some(st) if st.holders.is_empty() => (st.kind, vec![st.owner], st.waiters),
        Some(st) => (
            st.kind,
            st.holders.into_iter().map(|h| h.owner).collect(),
            st.waiters,
        ),
    }
}

async fn release(h: &Harness, key: &LockKey, owner: &str) {
    h.backend
        .release(key, Holder::owner_only(owner))
        .await
        .unwrap_or_else(|e| panic!("release {owner}: {e:?}"));
}

/// Readers hold together; a writer is refused while any reader holds, and
/// gets in once the last one leaves. Every acquisition, shared or not, gets
/// a fence above all earlier ones.
pub async fn shared_holds_run_together_and_keep_a_writer_out(h: Harness) {
    let key = gkey("doc");
    let shared = |o| kreq(&key, o, LockKind::Shared, LONG, Duration::ZERO);
    let r1 = h.backend.acquire(&shared("r1")).await.unwrap();
    let r2 = h.backend.acquire(&shared("r2")).await.unwrap();
    assert!(r2.fence > r1.fence);
    assert_eq!(
        holders(&h, &key).await,
        (LockKind::Shared, vec!["r1".into(), "r2".into()], 0)
    );
    let writer = areq(&key, "w", LONG, Duration::ZERO);
    let refused = h.backend.acquire(&writer).await;
    assert!(
        matches!(
            refused,
            Err(LockError::AcquisitionFailed {
                retry_after: Some(_)
            })
        ),
        "a writer beside readers: {refused:?}"
    );
    release(&h, &key, "r1").await;
    assert_eq!(holders(&h, &key).await.1, vec!["r2".to_owned()]);
    assert!(matches!(
        h.backend.acquire(&writer).await,
        Err(LockError::AcquisitionFailed { .. })
    ));
    release(&h, &key, "r2").await;
    let w = h
        .backend
        .acquire(&writer)
        .await
        .expect("free for the writer");
    assert!(w.fence > r2.fence);
    assert_eq!(holders(&h, &key).await.1, vec!["w".to_owned()]);
    // And a reader is kept out by the writer.
    assert!(matches!(
        h.backend.acquire(&shared("r3")).await,
        Err(LockError::AcquisitionFailed { .. })
    ));
    release(&h, &key, "w").await;
    assert_eq!(status_of(&h.backend, &key).await, None);
}

/// A writer queued behind readers blocks the readers that come after it
/// (no writer starvation): right after the last early reader leaves, the
/// writer holds, and the late reader is still queued; it gets in when the
/// writer leaves.
pub async fn a_queued_writer_blocks_later_readers(h: Harness) {
    let key = gkey("doc");
    let shared = |o, wait| kreq(&key, o, LockKind::Shared, LONG, wait);
    h.backend
        .acquire(&shared("r1", Duration::ZERO))
        .await
        .unwrap();
    let writer = spawn_acquire(&h.backend, areq(&key, "w", LONG, PATIENT));
    h.until_queued(&key, 1).await;
    let late = spawn_acquire(&h.backend, shared("r2", PATIENT));
    h.until_queued(&key, 2).await;
    assert_eq!(
        holders(&h, &key).await.1,
        vec!["r1".to_owned()],
        "r2 barged past the writer"
    );

    release(&h, &key, "r1").await;
    assert_eq!(
        holders(&h, &key).await,
        (LockKind::Exclusive, vec!["w".into()], 1),
        "handed to the writer at once; the late reader still waits"
    );
    let w = writer
        .await
        .unwrap()
        .expect("the writer was handed the lock");
    release(&h, &key, "w").await;
    assert_eq!(holders(&h, &key).await.1, vec!["r2".to_owned()]);
    assert!(late.await.unwrap().unwrap().fence > w.fence);
    release(&h, &key, "r2").await;
}

/// Consecutive readers at the head of the queue are granted together, up to
/// the next writer; the queue keeps its order across kinds.
pub async fn consecutive_queued_readers_are_granted_together(h: Harness) {
    let key = gkey("doc");
    h.backend
        .acquire(&areq(&key, "w1", LONG, Duration::ZERO))
        .await
        .unwrap();
    let mut queued = Vec::new();
    for (i, (owner, kind)) in [
        ("r1", LockKind::Shared),
        ("r2", LockKind::Shared),
        ("w2", LockKind::Exclusive),
        ("r3", LockKind::Shared),
    ]
    .into_iter()
    .enumerate()
    {
        queued.push(spawn_acquire(
            &h.backend,
            kreq(&key, owner, kind, LONG, PATIENT),
        ));
        h.until_queued(&key, i + 1).await;
    }
    let mut queued = queued.into_iter();
    // Each waiter is told of its grant before its hold is given back, as
    // a real client is: a grant released before its waiter saw it would
    // be gone for that waiter, which then queues again.
    let mut served = move || {
        let waiter = queued.next().expect("a waiter left");
        async move {
            waiter
                .await
                .unwrap()
                .expect("every waiter was served")
                .fence
        }
    };
    release(&h, &key, "w1").await;
    assert_eq!(
        holders(&h, &key).await,
        (LockKind::Shared, vec!["r1".into(), "r2".into()], 2)
    );
    let mut fences = vec![served().await, served().await];
    release(&h, &key, "r1").await;
    assert_eq!(
        holders(&h, &key).await.1,
        vec!["r2".to_owned()],
        "w2 waits for every reader"
    );
    release(&h, &key, "r2").await;
    assert_eq!(
        holders(&h, &key).await,
        (LockKind::Exclusive, vec!["w2".into()], 1)
    );
    fences.push(served().await);
    release(&h, &key, "w2").await;
    assert_eq!(holders(&h, &key).await.1, vec!["r3".to_owned()]);
    fences.push(served().await);
    release(&h, &key, "r3").await;
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences in grant order: {fences:?}"
    );
}

/// `n` permits: `n` holders at once, the next ones queue and are served in
/// order, each as soon as a permit is given back.
pub async fn permits_admit_n_and_serve_the_rest_in_order(h: Harness) {
    let key = gkey("exports");
    let permit = |o, wait| kreq(&key, o, LockKind::Permits(2), LONG, wait);
    let p1 = h
        .backend
        .acquire(&permit("p1", Duration::ZERO))
        .await
        .unwrap();
    let p2 = h
        .backend
        .acquire(&permit("p2", Duration::ZERO))
        .await
        .unwrap();
    assert!(p2.fence > p1.fence);
    let third = h.backend.acquire(&permit("p3", Duration::ZERO)).await;
    assert!(
        matches!(
            third,
            Err(LockError::AcquisitionFailed {
                retry_after: Some(_)
            })
        ),
        "a third permit of two: {third:?}"
    );
    let p3 = spawn_acquire(&h.backend, permit("p3", PATIENT));
    h.until_queued(&key, 1).await;
    let p4 = spawn_acquire(&h.backend, permit("p4", PATIENT));
    h.until_queued(&key, 2).await;
    let st = status_of(&h.backend, &key).await.unwrap();
    assert_eq!(
        (st.kind, st.holders.len(), st.waiters),
        (LockKind::Permits(2), 2, 2)
    );

    release(&h, &key, "p1").await;
    assert_eq!(
        holders(&h, &key).await,
        (LockKind::Permits(2), vec!["p2".into(), "p3".into()], 1),
        "the permit went to the oldest waiter at once"
    );
    release(&h, &key, "p2").await;
    assert_eq!(
        holders(&h, &key).await.1,
        vec!["p3".to_owned(), "p4".to_owned()]
    );
    let (f3, f4) = (
        p3.await.unwrap().unwrap().fence,
        p4.await.unwrap().unwrap().fence,
    );
    assert!(p2.fence < f3 && f3 < f4);
    release(&h, &key, "p3").await;
    release(&h, &key, "p4").await;
    assert_eq!(status_of(&h.backend, &key).await, None);
}

/// Holders of one process releasing their permits by fence, one after the
/// other, into a queue: each gives back its own permit, not another
/// holder's, and each goes to the oldest waiter. (etcd hands permits on in
/// turns, each from the state the last grant read, which lists every
/// holder: a release that took the wrong one from it gave back the oldest
/// holder's permit instead of its own.)
pub async fn permits_released_into_a_queue_each_give_back_their_own(h: Harness) {
    let key = gkey("uploads");
    let permit = |o, wait| kreq(&key, o, LockKind::Permits(2), LONG, wait);
    let fenced = |o: &'static str, l: &Lease| (o, l.fence);
    let give_back = |(o, fence): (&'static str, u64)| {
        let (b, key) = (h.backend.clone(), key.clone());
        async move {
            b.release(&key, Holder::new(o, fence))
                .await
                .unwrap_or_else(|e| panic!("release {o}: {e:?}"))
        }
    };
    let p1 = h
        .backend
        .acquire(&permit("p1", Duration::ZERO))
        .await
        .unwrap();
    let p2 = h
        .backend
        .acquire(&permit("p2", Duration::ZERO))
        .await
        .unwrap();
    let mut waiting = Vec::new();
    for (i, o) in ["p3", "p4", "p5"].into_iter().enumerate() {
        waiting.push(spawn_acquire(&h.backend, permit(o, PATIENT)));
        h.until_queued(&key, i + 1).await;
    }
    let mut waiting = waiting.into_iter();
    let mut next = async || waiting.next().unwrap().await.unwrap().unwrap();

    give_back(fenced("p2", &p2)).await;
    assert_eq!(
        holders(&h, &key).await,
        (LockKind::Permits(2), vec!["p1".into(), "p3".into()], 2)
    );
    let p3 = next().await;
    give_back(fenced("p3", &p3)).await;
    assert_eq!(
        holders(&h, &key).await,
        (LockKind::Permits(2), vec!["p1".into(), "p4".into()], 1),
        "p3 gave back its own permit, to p4"
    );
    give_back(fenced("p1", &p1)).await;
    assert_eq!(
        holders(&h, &key).await.1,
        vec!["p4".to_owned(), "p5".to_owned()]
    );
    let (p4, p5) = (next().await, next().await);
    assert!(p1.fence < p3.fence && p3.fence < p4.fence && p4.fence < p5.fence);
    give_back(fenced("p5", &p5)).await;
    give_back(fenced("p4", &p4)).await;
    assert_eq!(status_of(&h.backend, &key).await, None);
}

/// A newcomer never takes a free permit while earlier requests queue for
/// one: a permit that ran out goes to the head of the queue.
pub async fn an_expired_permit_goes_to_the_queue_not_to_a_newcomer(h: Harness) {
    let key = gkey("exports");
    let permit = |o, ttl, wait| kreq(&key, o, LockKind::Permits(2), ttl, wait);
    h.backend
        .acquire(&permit("p1", LONG, Duration::ZERO))
        .await
        .unwrap();
    h.backend
        .acquire(&permit("p2", LONG, Duration::ZERO))
        .await
        .unwrap();
    let waiter = h
        .frozen_waiter(permit("waiter", h.units(10), h.units(30)))
        .await;
    // Only now does p2's hold get short: the waiter queued before it ran out.
    h.backend
        .extend(&key, Holder::owner_only("p2"), h.units(1))
        .await
        .unwrap();
    h.advance(h.units(2)).await;
    let newcomer = h
        .backend
        .acquire(&permit("newcomer", h.units(10), Duration::ZERO))
        .await;
    assert!(
        matches!(newcomer, Err(LockError::AcquisitionFailed { .. })),
        "a newcomer barged past the queue: {newcomer:?}"
    );
    assert_eq!(
        holders(&h, &key).await.1,
        vec!["p1".to_owned(), "waiter".to_owned()]
    );
    waiter.thaw().await.expect("the waiter holds a permit");
    release(&h, &key, "waiter").await;
    release(&h, &key, "p1").await;
}

/// Each holder has its own TTL: a holder that never gives its permit back
/// frees only that permit, when its own TTL ends.
pub async fn a_crashed_holder_frees_only_its_own_permit_at_its_ttl(h: Harness) {
    let key = gkey("exports");
    let permit = |o, ttl| kreq(&key, o, LockKind::Permits(2), ttl, Duration::ZERO);
    h.backend
        .acquire(&permit("crashed", h.units(2)))
        .await
        .unwrap();
    h.backend
        .acquire(&permit("alive", h.units(30)))
        .await
        .unwrap();
    assert!(h.backend.acquire(&permit("p3", h.units(30))).await.is_err());
    h.advance(h.units(3)).await;
    h.backend
        .acquire(&permit("p3", h.units(30)))
        .await
        .expect("the crashed holder's permit is free");
    assert!(h.backend.acquire(&permit("p4", h.units(30))).await.is_err());
    assert_eq!(
        holders(&h, &key).await.1,
        vec!["alive".to_owned(), "p3".to_owned()]
    );
    release(&h, &key, "alive").await;
    release(&h, &key, "p3").await;
}

/// Each hold keeps its own expiry through what changes it: an extended hold
/// outlives its first TTL while the one beside it goes at its own, and a
/// hold taken over under a new fence (a restored token) still counts, and
/// still ends at its own TTL.
pub async fn each_hold_keeps_its_own_expiry_through_extend_and_claim(h: Harness) {
    let key = gkey("exports");
    let permit = |o, ttl| kreq(&key, o, LockKind::Permits(2), ttl, Duration::ZERO);
    h.backend
        .acquire(&permit("short", h.units(2)))
        .await
        .unwrap();
    let kept = h
        .backend
        .acquire(&permit("kept", h.units(2)))
        .await
        .unwrap();
    h.backend
        .extend(&key, Holder::new("kept", kept.fence), h.units(30))
        .await
        .unwrap();
    h.advance(h.units(3)).await;
    let p3 = h
        .backend
        .acquire(&permit("p3", h.units(4)))
        .await
        .expect("the permit that was not extended ran out");
    assert!(
        h.backend.acquire(&permit("p4", h.units(30))).await.is_err(),
        "the extended permit ran out at its first TTL"
    );
    assert_eq!(
        holders(&h, &key).await.1,
        vec!["kept".to_owned(), "p3".to_owned()]
    );
    let claimed = h
        .backend
        .claim(&key, Holder::new("p3", p3.fence), 7)
        .await
        .expect("claim");
    assert!(claimed.fence > p3.fence, "a claim draws a new fence");
    assert!(
        h.backend.acquire(&permit("p4", h.units(30))).await.is_err(),
        "a permit taken over under a new fence stopped counting"
    );
    h.advance(h.units(5)).await;
    h.backend
        .acquire(&permit("p4", h.units(30)))
        .await
        .expect("the permit taken over ran out at its own TTL");
    assert_eq!(
        holders(&h, &key).await.1,
        vec!["kept".to_owned(), "p4".to_owned()]
    );
    release(&h, &key, "kept").await;
    release(&h, &key, "p4").await;
}

/// A request sent again (the same attempt: its reply was lost) is the same
/// hold, not a second one: same fence, its TTL counted again from the
/// retry, so it outlives its first TTL.
pub async fn a_retried_hold_is_the_same_hold_with_its_ttl_refreshed(h: Harness) {
    let key = gkey("exports");
    let req = kreq(&key, "r", LockKind::Permits(2), h.units(3), Duration::ZERO);
    let first = h.backend.acquire(&req).await.unwrap();
    h.advance(h.units(2)).await;
    let again = h.backend.acquire(&req).await.expect("a retry of a hold");
    assert_eq!(again.fence, first.fence, "a retry is the same hold");
    h.advance(h.units(2)).await;
    let other = kreq(&key, "o", LockKind::Permits(2), h.units(30), Duration::ZERO);
    h.backend.acquire(&other).await.unwrap();
    assert_eq!(
        holders(&h, &key).await.1,
        vec!["r".to_owned(), "o".to_owned()],
        "the retried hold ran out at its first TTL, or counted twice"
    );
    release(&h, &key, "r").await;
    release(&h, &key, "o").await;
}

/// A request of another kind under the same owner and attempt (a clone
/// given another kind) is another acquisition, not a retry of the hold:
/// taken for one, a writer believed it held the lock beside readers (and a
/// permit request took a shared hold).
pub async fn a_clone_of_another_kind_is_not_a_retry_of_the_hold(h: Harness) {
    let key = gkey("doc");
    let reader = kreq(&key, "o", LockKind::Shared, LONG, Duration::ZERO);
    h.backend.acquire(&reader).await.unwrap();
    let other = kreq(&key, "r2", LockKind::Shared, LONG, Duration::ZERO);
    h.backend.acquire(&other).await.unwrap();
    let writer = reader.clone().with_kind(LockKind::Exclusive).unwrap();
    let taken = h.backend.acquire(&writer).await;
    assert!(
        matches!(taken, Err(LockError::AcquisitionFailed { .. })),
        "a writer beside readers: {taken:?}"
    );
    let permit = reader.clone().with_kind(LockKind::Permits(2)).unwrap();
    let taken = h.backend.acquire(&permit).await;
    assert!(
        matches!(taken, Err(LockError::KindMismatch)),
        "a permit out of a shared hold: {taken:?}"
    );
    release(&h, &key, "o").await;
    release(&h, &key, "r2").await;
    // The other way round: a reader cloned from a writer's request.
    let writer = kreq(&key, "w", LockKind::Exclusive, LONG, Duration::ZERO);
    h.backend.acquire(&writer).await.unwrap();
    let reader = writer.clone().with_kind(LockKind::Shared).unwrap();
    let taken = h.backend.acquire(&reader).await;
    assert!(
        matches!(taken, Err(LockError::AcquisitionFailed { .. })),
        "a reader beside a writer: {taken:?}"
    );
    release(&h, &key, "w").await;
}

/// Release, extend and restore name one hold among several (owner and
/// fence); a stale fence is refused; an extension changes only its hold.
pub async fn each_hold_is_released_and_extended_on_its_own(h: Harness) {
    let key = gkey("doc");
    let shared = |o| kreq(&key, o, LockKind::Shared, LONG, Duration::ZERO);
    let a = h.backend.acquire(&shared("a")).await.unwrap();
    let b = h.backend.acquire(&shared("b")).await.unwrap();
    assert_eq!(
        h.backend.release(&key, Holder::new("a", b.fence)).await,
        Err(LockError::OwnershipMismatch),
        "a's owner with b's fence names no hold"
    );
    assert_eq!(
        h.backend
            .extend(&key, Holder::new("c", a.fence), LONG)
            .await,
        Err(LockError::OwnershipMismatch)
    );
    let extended = h
        .backend
        .extend(&key, Holder::new("b", b.fence), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(extended.fence, b.fence);
    let st = status_of(&h.backend, &key).await.unwrap();
    let left = |o: &str| {
        st.holders
            .iter()
            .find(|h| h.owner == o)
            .unwrap()
            .ttl_remaining
    };
    assert!(left("b") > LONG && left("a") <= LONG, "{st:?}");
    // The status's own fields describe the hold that ends first.
    assert_eq!(st.owner, "a");
    h.backend
        .release(&key, Holder::new("a", a.fence))
        .await
        .unwrap();
    assert_eq!(
        h.backend.release(&key, Holder::new("a", a.fence)).await,
        Err(LockError::OwnershipMismatch),
        "a released twice while b holds"
    );
    h.backend
        .release(&key, Holder::new("b", b.fence))
        .await
        .unwrap();
    assert_eq!(
        h.backend.release(&key, Holder::new("b", b.fence)).await,
        Err(LockError::NotFound)
    );
}

/// Kinds of another family are refused at once with `KindMismatch`, even
/// with a max wait, and never queue.
pub async fn kinds_that_cannot_meet_are_refused_and_never_queue(h: Harness) {
    let key = gkey("k");
    let get = |o, kind| kreq(&key, o, kind, LONG, PATIENT);
    h.backend
        .acquire(&get("p1", LockKind::Permits(2)))
        .await
        .unwrap();
    // Refused at once and never queued, not even for a moment (a queued
    // entry left to a clean-up after the refusal shows only to a status
    // read that comes before it: asked after each of several refusals).
    for _ in 0..4 {
        for kind in [LockKind::Permits(3), LockKind::Exclusive, LockKind::Shared] {
            assert_eq!(
                h.backend.acquire(&get("x", kind)).await,
                Err(LockError::KindMismatch),
                "{kind} beside permits=2"
            );
            let waiters = status_of(&h.backend, &key).await.unwrap().waiters;
            assert_eq!(waiters, 0, "{kind} refused, yet queued");
        }
    }
    release(&h, &key, "p1").await;
    h.backend
        .acquire(&get("r", LockKind::Shared))
        .await
        .unwrap();
    assert_eq!(
        h.backend.acquire(&get("x", LockKind::Permits(1))).await,
        Err(LockError::KindMismatch)
    );
    assert_eq!(status_of(&h.backend, &key).await.unwrap().waiters, 0);
    release(&h, &key, "r").await;
    h.backend
        .acquire(&get("w", LockKind::Exclusive))
        .await
        .unwrap();
    assert_eq!(
        h.backend.acquire(&get("x", LockKind::Permits(4))).await,
        Err(LockError::KindMismatch)
    );
    release(&h, &key, "w").await;
    // Free again, the key takes any kind.
    h.backend
        .acquire(&get("p", LockKind::Permits(3)))
        .await
        .unwrap();
    release(&h, &key, "p").await;
}

/// Through the layer: readers run together, a writer's request is `429`
/// while they hold, permits admit `n`, and a kind that cannot meet the
/// holders is `409 LOCK_KIND_MISMATCH`; bad permits are `400`.
pub async fn the_layer_takes_shared_holds_and_permits(h: Harness) {
    let ctl = Ctl::default();
    let kind_of = |req: &Request<Body>| -> Option<LockKind> {
        req.headers().get("x-kind")?.to_str().ok()?.parse().ok()
    };
    let hook = move |req: &Request<Body>| {
        let kind = kind_of(req).unwrap_or_default();
        Some(LockSpec::global("res", LONG).kind(kind))
    };
    let app = Router::new().route(
        "/r",
        gated(&ctl).layer(LockLayer::from_fn(h.backend.clone(), hook)),
    );
    let with_kind = |kind: &str, gate: bool| {
        let req = if gate {
            gated_req("/r")
        } else {
            post_req("/r")
        };
        with_header(req, "x-kind", kind.as_bytes())
    };
    let r1 = spawn_send(&app, with_kind("shared", true));
    let r2 = spawn_send(&app, with_kind("shared", true));
    ctl.entered().await;
    ctl.entered().await;
    let writer = send(&app, with_kind("exclusive", false)).await;
    writer.assert_rejection(429, "LOCK_ACQUISITION_FAILED");
    assert!(writer.retry_after().is_some());
    send(&app, with_kind("permits=2", false))
        .await
        .assert_rejection(409, "LOCK_KIND_MISMATCH");
    assert_eq!(ctl.runs(), 2, "refused requests never reach the handler");
    ctl.open(2);
    assert_eq!(r1.await.unwrap().status, StatusCode::OK);
    assert_eq!(r2.await.unwrap().status, StatusCode::OK);
    assert_comes_free(&h, &gkey("res")).await;

    let ctl = Ctl::default();
    let permits = move |_: &Request<Body>| LockSpec::global("exports", LONG).permits(2);
    let app = Router::new().route(
        "/e",
        gated(&ctl).layer(LockLayer::from_fn(h.backend.clone(), permits)),
    );
    let e1 = spawn_send(&app, gated_req("/e"));
    let e2 = spawn_send(&app, gated_req("/e"));
    ctl.entered().await;
    ctl.entered().await;
    send(&app, post_req("/e"))
        .await
        .assert_rejection(429, "LOCK_ACQUISITION_FAILED");
    ctl.open(2);
    assert_eq!(e1.await.unwrap().status, StatusCode::OK);
    assert_eq!(e2.await.unwrap().status, StatusCode::OK);
    assert_comes_free(&h, &gkey("exports")).await;

    let none = move |_: &Request<Body>| LockSpec::global("exports", LONG).permits(0);
    let app = Router::new().route(
        "/z",
        axum::routing::post(|| async { "ran" }).layer(LockLayer::from_fn(h.backend.clone(), none)),
    );
    send(&app, post_req("/z"))
        .await
        .assert_rejection(400, "LOCK_INVALID_KIND");
}

/// A shared hold and a permit go to a job as tokens and come back with
/// their kind; the restored hold is the same acquisition under a new fence,
/// and releasing it frees only that hold.
pub async fn shared_holds_and_permits_travel_by_token(h: Harness) {
    let ttl = Duration::from_secs(30);
    for (key, spec) in [
        ("doc", JobSpec::new("doc", ttl).shared()),
        ("exports", JobSpec::new("exports", ttl).permits(2)),
    ] {
        let kind = spec.as_lock_spec().get_kind();
        let stays = OwnedLock::acquire(&h.backend, &spec).await.unwrap();
        let handed = OwnedLock::acquire(&h.backend, &spec).await.unwrap();
        assert_eq!(handed.info().kind(), kind);
        let token = handed.into_token();
        let other = h.another();
        let restored = OwnedLock::restore(&other, &token).await.expect("restore");
        assert_eq!(restored.info().kind(), kind);
        assert!(
            restored.fence() > token.fence(),
            "a restore is a claim: a new fence"
        );
        assert_eq!(holders(&h, &gkey(key)).await.1.len(), 2);
        restored.release().await.unwrap();
        let (_, left, _) = holders(&h, &gkey(key)).await;
        assert_eq!(
            left,
            vec![stays.info().owner().to_owned()],
            "only the restored hold left"
        );
        stays.release().await.unwrap();
    }
}

/// Every backend says which kinds it holds (`supports`), and one that does
/// not hold a kind refuses it with `Unsupported`, taking nothing (never an
/// exclusive lock in its place).
pub async fn a_kind_the_backend_does_not_hold_is_refused_and_takes_nothing(h: Harness) {
    let key = gkey("k");
    assert!(h.backend.supports(LockKind::Exclusive));
    for kind in [LockKind::Shared, LockKind::Permits(2)] {
        let got = h
            .backend
            .acquire(&kreq(&key, "x", kind, LONG, Duration::ZERO))
            .await;
        if h.backend.supports(kind) {
            got.unwrap_or_else(|e| panic!("{kind} is supported: {e:?}"));
            release(&h, &key, "x").await;
        } else {
            assert!(
                matches!(got, Err(LockError::Unsupported(_))),
                "{kind}: {got:?}"
            );
            assert_eq!(
                status_of(&h.backend, &key).await,
                None,
                "{kind} took a lock"
            );
        }
    }
}

/// A force release frees every hold of the key at once and hands the key to
/// the queue, as the release of each hold would.
pub async fn a_force_release_frees_every_hold_and_hands_off(h: Harness) {
    let key = gkey("doc");
    for owner in ["r1", "r2"] {
        h.backend
            .acquire(&kreq(&key, owner, LockKind::Shared, LONG, Duration::ZERO))
            .await
            .unwrap();
    }
    let writer = spawn_acquire(&h.backend, areq(&key, "w", LONG, PATIENT));
    h.until_queued(&key, 1).await;
    assert!(h.backend.force_release(&key).await.unwrap());
    assert_eq!(
        holders(&h, &key).await,
        (LockKind::Exclusive, vec!["w".into()], 0),
        "both readers gone, the writer handed the lock"
    );
    writer
        .await
        .unwrap()
        .expect("the writer was handed the lock");
    release(&h, &key, "w").await;
    assert!(!h.backend.force_release(&key).await.unwrap());
}

/// Acquirers racing for the permits of a free key: exactly `n` get one and
/// the others are refused, whatever the interleaving.
pub async fn racing_acquirers_never_take_more_than_n_permits(h: Harness) {
    let key = gkey("exports");
    let tries: Vec<_> = (0..16)
        .map(|i| {
            let owner = format!("p{i}");
            let req = kreq(&key, &owner, LockKind::Permits(3), LONG, Duration::ZERO);
            (owner, spawn_acquire(&h.backend, req))
        })
        .collect();
    let mut got = Vec::new();
    for (owner, t) in tries {
        match t.await.unwrap() {
            Ok(_) => got.push(owner),
            Err(LockError::AcquisitionFailed { .. }) => {}
            Err(e) => panic!("{owner}: {e:?}"),
        }
    }
    assert_eq!(got.len(), 3, "permits granted: {got:?}");
    let (kind, mut held, _) = holders(&h, &key).await;
    held.sort();
    got.sort();
    assert_eq!((kind, held), (LockKind::Permits(3), got.clone()));
    for owner in &got {
        release(&h, &key, owner).await;
    }
}
