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

    let ttl = Duration::from_secs(30);
    let end = Instant::now() + Duration::from_secs(2);
    let grant = backend.shared.leases.lease_for(&backend.shared, ttl, end);
    // Polled once (the grant is sent), then dropped.
    assert!(tokio::time::timeout(Duration::ZERO, grant).await.is_err());

    let req = AcquireRequest::new(LockKey::global("k").unwrap(), "o", ttl, Duration::ZERO).unwrap();
    backend
        .acquire(&req)
        .await
        .expect("the dropped grant kept every call of its TTL waiting");
}
