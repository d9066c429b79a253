//! A release or an extension disarms only the expiries of the writes it
//! supersedes.

use std::time::Duration;

use tokio::time::Instant;

use super::super::EtcdBackend;
use super::super::etcd_cluster::EtcdCluster;
use crate::backend::{Holder, LockBackend};
use crate::key::LockKey;
use crate::spec::{AcquireRequest, LockKind, new_attempt_id};

/// An owner token used twice at once (a job's id, say): its first
/// acquisition is released while its second is under way, the second's
/// expiry armed (as `grant_txn` arms it, before the grant is sent) but not
/// yet landed. The release must leave that expiry armed: it was not the
/// release's to disarm, and without it a grant that lands after the
/// release would never expire while this process keeps its lease alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_keeps_the_expiry_of_the_same_owners_acquisition_under_way() {
    let backend = EtcdBackend::from_endpoints(EtcdCluster::shared().endpoints())
        .unwrap()
        .prefix(format!("release-{}/", new_attempt_id()));
    let key = LockKey::global("k").unwrap();
    let ttl = Duration::from_secs(30);
    let first = AcquireRequest::new(key.clone(), "job-7", ttl, Duration::ZERO).unwrap();
    let lease = backend.acquire(&first).await.unwrap();
    // The second acquisition's timer, armed and not landed.
    let keys = backend.keys(&key);
    let second = keys.holder(LockKind::Exclusive, "job-7", new_attempt_id());
    let (start, end) = keys.owner_holders("job-7");
    assert!(start <= second && second < end, "in the owner's range");
    let value = b"the second acquisition's value".to_vec();
    backend.shared.expiries.arm(
        &backend,
        &key,
        second.clone(),
        value.clone(),
        None,
        Instant::now() + ttl,
    );
    backend
        .release(&key, Holder::new("job-7", lease.fence))
        .await
        .unwrap();
    assert!(
        backend.shared.expiries.tracks(&second, &value),
        "the release disarmed another acquisition's expiry"
    );
    // What it did delete goes: the first acquisition's timer.
    assert!(
        backend
            .shared
            .expiries
            .known(&start, &end, Some(lease.fence), |_| true)
            .is_none(),
        "the released acquisition's expiry is still armed"
    );
}

/// Two extensions of one hold under way at once: the first to land must
/// leave the other's expiry armed (it may land after it, and then its
/// value is the one stored); the second disarms the first's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_keeps_the_expiry_of_another_under_way() {
    let backend = EtcdBackend::from_endpoints(EtcdCluster::shared().endpoints())
        .unwrap()
        .prefix(format!("extend-{}/", new_attempt_id()));
    let key = LockKey::global("k").unwrap();
    let keys = backend.keys(&key);
    let holder = keys.holder(LockKind::Exclusive, "job-8", new_attempt_id());
    let deadline = Instant::now() + Duration::from_secs(30);
    let (a, b) = (b"extension a".to_vec(), b"extension b".to_vec());
    let expiries = &backend.shared.expiries;
    for value in [&a, &b] {
        expiries.arm(
            &backend,
            &key,
            holder.clone(),
            value.clone(),
            Some(7),
            deadline,
        );
    }
    expiries.disarm_others(&holder, &a, 100);
    assert!(expiries.tracks(&holder, &a));
    assert!(
        expiries.tracks(&holder, &b),
        "the first extension to land disarmed one not yet landed"
    );
    expiries.disarm_others(&holder, &b, 101);
    assert!(expiries.tracks(&holder, &b));
    assert!(
        !expiries.tracks(&holder, &a),
        "an extension that landed before the last one is still armed"
    );
}
