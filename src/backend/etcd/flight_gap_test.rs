//! A follower whose watch is set up only after the result came and went.
//!
//! Its begin saw the leader holding the lock at revision `rev`; before its
//! watch reached etcd, the leader published a result kept for no time
//! (put and removed again: nobody was queued for the lock). The watch,
//! set up from then on, cannot see that put; the gap watch from `rev + 1`
//! must. Called at the seam (`flight_wait` with the begin's revision), so
//! the interleaving is exact, not a race the test hopes to hit.

use std::sync::Arc;
use std::time::Duration;

use super::super::ops::revision;
use super::*;
use crate::backend::{FlightPublish, FlightStart, LockBackend};
use crate::key::LockKey;
use crate::spec::AcquireRequest;

use super::super::etcd_cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_published_before_the_followers_watch_still_reaches_it() {
    let cluster = etcd_cluster::EtcdCluster::shared();
    let backend = EtcdBackend::from_endpoints(cluster.endpoints())
        .unwrap()
        .prefix(format!("gap-{}/", crate::spec::new_attempt_id()));
    let key = LockKey::global("report").unwrap();
    let ttl = Duration::from_secs(30);
    let req = AcquireRequest::new(key.clone(), "leader", ttl, Duration::ZERO).unwrap();
    let FlightStart::Leader(lease) = backend.flight_begin(&req).await.unwrap() else {
        panic!("the first caller leads");
    };
    // The follower's begin: the leader holds the lock, at this revision.
    let keys = backend.keys(&key);
    let read = etcd_client::Txn::new().and_then([etcd_client::TxnOp::get(keys.result(), None)]);
    let reply = backend
        .shared
        .conn
        .txn("test", read, backend.deadline())
        .await
        .unwrap();
    let rev = revision(&reply, "test").unwrap();
    // Before its watch is set up, the result comes and goes.
    let publish = FlightPublish {
        fence: lease.fence,
        value: Arc::from(&b"42"[..]),
        result_ttl: Duration::ZERO,
        keep: Duration::from_secs(5),
    };
    backend
        .flight_publish(&key, "leader", &publish)
        .await
        .unwrap();
    let FlightStart::Busy(wait) = backend
        .flight_wait(&key, keys.result(), 0, rev, backend.deadline())
        .await
        .unwrap()
    else {
        panic!("a follower waits");
    };
    // (A bound on a failure only: without the gap watch it never comes.)
    let result = tokio::time::timeout(Duration::from_secs(20), wait.result)
        .await
        .expect("the result published before the watch reached the follower")
        .unwrap();
    assert_eq!((result.seq, &*result.value), (lease.fence, &b"42"[..]));
}
