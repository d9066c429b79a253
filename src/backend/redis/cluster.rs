//! Redis Cluster: where the backend's cluster connections come from.
//!
//! Operations run on one redis-rs `ClusterConnection` (see `conn.rs`), which
//! routes each script by the hash slot of its first key: every key of a
//! lock, its slot's fence counter and its wake-up channel share that slot,
//! so each operation is one script on one shard. Wake-ups use a second
//! `ClusterConnection` speaking RESP3, for sharded pub/sub (see `wake.rs`).
//!
//! The cluster client's own retries (`MOVED`, `ASK`, `TRYAGAIN` while a slot
//! migrates, `CLUSTERDOWN` during a failover, reconnects) are made short
//! (a few milliseconds apart, at most 100 ms) so that they fit inside the
//! backend's op timeout, which bounds every call: when it runs out, the
//! caller's request is dropped and redis-rs retries it no more. Repeating a
//! script is safe (see `Pinned::eval`).

use std::time::Duration;

use deadpool_redis::redis::cluster::{ClusterClient, ClusterClientBuilder};
use deadpool_redis::redis::cluster_async::ClusterConnection;
use deadpool_redis::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use deadpool_redis::redis::{ConnectionInfo, ProtocolVersion, PushInfo, Value, cmd};
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::{Instant, timeout_at};

use super::error::{config_error, redis_error, timed_out};
use super::server::{check_version, warn_about_policy};
use crate::error::LockError;

/// The oldest Redis a cluster backend runs on: sharded pub/sub
/// (`SSUBSCRIBE`/`SPUBLISH`) came with 7.0.
pub(super) const MIN_CLUSTER_MAJOR: u32 = 7;

/// The cluster client's retries: many, and short, since the op timeout
/// bounds them anyway.
const RETRIES: u32 = 32;
const MIN_RETRY_WAIT_MS: u64 = 2;
const MAX_RETRY_WAIT_MS: u64 = 100;

/// The nodes a cluster backend starts from (any of them: the client learns
/// the rest with `CLUSTER SLOTS`).
#[derive(Clone)]
pub(super) struct Nodes {
    nodes: Vec<ConnectionInfo>,
}

impl Nodes {
    pub(super) fn new(nodes: Vec<ConnectionInfo>) -> Result<Self, LockError> {
        if nodes.is_empty() {
            return Err(config_error(&"a Redis Cluster needs at least one node"));
        }
        let nodes = Nodes { nodes };
        // Catches what the builder refuses (mixed TLS, ...) now.
        nodes.builder().build().map_err(|e| config_error(&e))?;
        Ok(nodes)
    }

    fn builder(&self) -> ClusterClientBuilder {
        ClusterClientBuilder::new(self.nodes.clone())
            .retries(RETRIES)
            .min_retry_wait(MIN_RETRY_WAIT_MS)
            .max_retry_wait(MAX_RETRY_WAIT_MS)
            .retry_wait_formula(2, 2)
            // Our op timeout bounds every call; after a timeout another
            // connection is made in the background (see
            // `Pinned::timed_out`).
            .response_timeout(Duration::from_secs(3600))
    }

    fn build(builder: ClusterClientBuilder) -> Result<ClusterClient, LockError> {
        builder.build().map_err(|e| config_error(&e))
    }

    /// A connection for operations, to a cluster of Redis 7 or newer.
    pub(super) async fn connect(&self, end: Instant) -> Result<ClusterConnection, LockError> {
        let client = Self::build(self.builder())?;
        let mut conn = match timeout_at(end, client.get_async_connection()).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(redis_error(&e)),
            Err(_) => return Err(timed_out("connecting to the Redis Cluster")),
        };
        let mut info = cmd("INFO");
        info.arg("server");
        match timeout_at(end, conn.route_command(info, random_primary())).await {
            Ok(Ok(Value::BulkString(bytes))) => {
                check_version(&String::from_utf8_lossy(&bytes), MIN_CLUSTER_MAJOR)?;
            }
            Ok(Ok(Value::VerbatimString { text, .. })) => {
                check_version(&text, MIN_CLUSTER_MAJOR)?;
            }
            // INFO not allowed (ACL): nothing to judge by.
            Ok(_) => {}
            Err(_) => return Err(timed_out("waiting for Redis to answer")),
        }
        Ok(conn)
    }

    /// Warn (once per backend) about an eviction policy that can drop locks,
    /// as a random primary reports it.
    pub(super) async fn check_policy(&self, conn: &ClusterConnection, end: Instant) {
        let mut get = cmd("CONFIG");
        get.arg("GET").arg("maxmemory-policy");
        let mut conn = conn.clone();
        if let Ok(reply) = timeout_at(end, conn.route_command(get, random_primary())).await {
            warn_about_policy(reply.and_then(|v| {
                deadpool_redis::redis::from_redis_value::<Vec<String>>(v).map_err(Into::into)
            }));
        }
    }

    /// A RESP3 connection whose pushes (sharded messages, unsubscriptions
    /// by the server, disconnections) go to `pushes`.
    pub(super) async fn pubsub(
        &self,
        pushes: UnboundedSender<PushInfo>,
        end: Instant,
    ) -> Result<ClusterConnection, LockError> {
        let client = Self::build(
            self.builder()
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(pushes),
        )?;
        match timeout_at(end, client.get_async_connection()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(redis_error(&e)),
            Err(_) => Err(timed_out("connecting to the Redis Cluster for pub/sub")),
        }
    }
}

fn random_primary() -> RoutingInfo {
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary)
}
