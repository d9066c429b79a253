//! A lease grant whose call was dropped does not stop later grants.

use std::time::Duration;

use tokio::time::Instant;

use super::super::EtcdBackend;
use super::super::etcd_cluster::EtcdCluster;
use crate::backend::LockBackend;
use crate::key::LockKey;
use crate::spec::{AcquireRequest, new_attempt_id};

/// The first call that needs a lease of its TTL is dropped while it grants
/// one (its client went away): the next call of that TTL grants it instead
/// of waiting for the abandoned grant until its op timeout (and every call
/// after it, for the life of the backend).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_dropped_mid_way_leaves_the_next_call_to_grant() {
    let backend = EtcdBackend::from_endpoints(EtcdCluster::shared().endpoints())
        .unwrap()
        .prefix(format!("lease-{}/", new_attempt_id()))
        .op_timeout(Duration::from_secs(2));
    // Connected, through a lease of another TTL.
    let other = AcquireRequest::new(
        LockKey::global("warm").unwrap(),
        "w",
        Duration::from_secs(100),
        Duration::ZERO,
    )
    .unwrap();
    backend.acquire(&other).await.unwrap();

    // Polled once (the grant is sent), then dropped. Its reply can come
    // within that one poll, when the machine is busy: the poller's thread,
    // descheduled after sending, resumes to find the reply in. Then nothing
    // was abandoned (the lease is granted), and a TTL of another bucket
    // tries again. (Seen twice in twenty runs beside other tests: the one
    // poll answered with a lease.)
    let mut dropped = None;
    for secs in [30, 45, 70, 90, 150] {
        let ttl = Duration::from_secs(secs);
        let end = Instant::now() + Duration::from_secs(2);
        let grant = backend.shared.leases.lease_for(&backend.shared, ttl, end);
        if tokio::time::timeout(Duration::ZERO, grant).await.is_err() {
            dropped = Some(ttl);
            break;
        }
    }
    let ttl = dropped.expect("every grant answered within its one poll");

    let req = AcquireRequest::new(LockKey::global("k").unwrap(), "o", ttl, Duration::ZERO).unwrap();
    backend
        .acquire(&req)
        .await
        .expect("the dropped grant kept every call of its TTL waiting");
}
