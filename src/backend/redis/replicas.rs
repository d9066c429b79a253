//! `min_replicas`: a lock taken is confirmed by `WAIT` on the primary.
//!
//! `WAIT n t` answers once the replicas have acknowledged every write made
//! on the connection it is sent on (up to the last one), or after `t` ms
//! with how many had. The lock may have been written by another connection
//! (a release handing it to this waiter), so the lock is first extended to
//! its own TTL (a write of our own, after the hand-off in the primary's
//! replication stream), then `WAIT` follows on that very connection: the
//! replicas that acknowledge it have the lock. Both go on a connection of
//! their own (`dedicated.rs`), never on the operations' one, which `WAIT`
//! would block for every other call; on a cluster, to the primary owning
//! the lock's slot.

use std::time::Duration;

use deadpool_redis::redis::{Value, cmd};
use tokio::time::{Instant, timeout_at};

use super::RedisBackend;
use super::conn::{Conn, is_connection_error};
use super::error::{redis_error, timed_out};
use super::ops::{extend_invocation, extended};
use super::scripts::{ceil_ms, int};
use crate::backend::{Holder, Lease};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::AcquireRequest;

/// What [`RedisBackend::min_replicas`] asks for.
#[derive(Clone, Copy, Debug)]
pub(super) struct MinReplicas {
    pub(super) replicas: u32,
    pub(super) timeout: Duration,
}

impl RedisBackend {
    /// Acquire, then confirm on `n` replicas; if they do not confirm in
    /// time, release and fail as unavailable.
    pub(super) async fn acquire_replicated(
        &self,
        req: &AcquireRequest,
        min: MinReplicas,
    ) -> Result<Lease, LockError> {
        let taken = self.acquire_full(req).await?;
        let holder = Holder::new(req.owner(), taken.fence);
        self.confirmed(req.key(), holder, req.ttl(), min).await
    }

    /// `holder`'s lock, just taken (acquired, a flight's lead, claimed),
    /// confirmed on the replicas for `ttl`; if it cannot be, given back and
    /// failed as unavailable: the same rule for every way a lock is taken.
    pub(super) async fn confirmed(
        &self,
        key: &LockKey,
        holder: Holder<'_>,
        ttl: Duration,
        min: MinReplicas,
    ) -> Result<Lease, LockError> {
        match self.confirm(key, holder, ttl, min).await {
            Ok(lease) => Ok(lease),
            Err(e) => {
                // Not held as asked: give it back (or leave it to its TTL if
                // Redis is away too).
                if let Err(release) = self.release_full(key, holder).await {
                    tracing::debug!(error = %release, "releasing an unreplicated lock failed");
                }
                Err(e)
            }
        }
    }

    async fn confirm(
        &self,
        key: &LockKey,
        holder: Holder<'_>,
        ttl: Duration,
        min: MinReplicas,
    ) -> Result<Lease, LockError> {
        let start = Instant::now();
        let end = start + self.op_timeout + min.timeout;
        let slot = self.slot(key);
        let inv = extend_invocation(self, key, holder, ttl);
        // On a connection of its own: `WAIT` blocks the connection it is
        // sent on (see `dedicated.rs`).
        let mut reused = true;
        let (mut lent, reply) = loop {
            let mut lent = self.shared.dedicated.lend(&self.shared.conn, end).await?;
            match timeout_at(end, inv.invoke(&mut lent.conn)).await {
                Ok(Ok(reply)) => break (lent, reply),
                // An idle connection that broke meanwhile: once more on a
                // new one (the extension is safe to repeat).
                Ok(Err(e)) if reused && is_connection_error(&e) => reused = false,
                Ok(Err(e)) => return Err(redis_error(&e)),
                Err(_) => return Err(timed_out("waiting for Redis to answer")),
            }
        };
        // Gone already (a force release): not held as asked.
        let lease = extended(reply, ttl).map_err(|e| match e {
            LockError::BackendUnavailable(_) => e,
            _ => LockError::BackendUnavailable(
                "the lock was gone before the replicas could confirm it".into(),
            ),
        })?;
        // WAIT 0 would block for good: at least 1 ms.
        let wait_ms = ceil_ms(
            min.timeout
                .saturating_sub(start.elapsed())
                .max(Duration::from_millis(1)),
        );
        let acked = wait_on(&mut lent.conn, slot, min.replicas, wait_ms, end).await?;
        lent.give_back();
        if acked < i64::from(min.replicas) {
            return Err(LockError::BackendUnavailable(
                format!(
                    "the lock reached {acked} of {} replicas within {:?}",
                    min.replicas, min.timeout
                )
                .into(),
            ));
        }
        Ok(lease)
    }
}

/// `WAIT replicas wait_ms` on `conn` (on a cluster, on the primary owning
/// `slot`); the number of replicas that acknowledged.
async fn wait_on(
    conn: &mut Conn,
    slot: u16,
    replicas: u32,
    wait_ms: u64,
    end: Instant,
) -> Result<i64, LockError> {
    let mut wait = cmd("WAIT");
    wait.arg(replicas).arg(wait_ms);
    let reply: Result<Value, _> = match conn {
        Conn::Single(c) => timeout_at(end, wait.query_async(c)).await,
        #[cfg(feature = "redis-cluster")]
        Conn::Cluster(c) => {
            use deadpool_redis::redis::cluster_routing::{
                Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
            };
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                slot,
                SlotAddr::Master,
            )));
            timeout_at(end, c.route_command(wait, route)).await
        }
    }
    .map_err(|_| timed_out("waiting for the replicas"))?;
    #[cfg(not(feature = "redis-cluster"))]
    let _ = slot;
    int(&reply.map_err(|e| redis_error(&e))?, "WAIT")
}
