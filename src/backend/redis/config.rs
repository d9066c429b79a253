//! How a [`RedisBackend`] is set up: its builder options and their getters.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::Pool;

use super::RedisBackend;
use super::replicas::MinReplicas;
use super::scripts::{LEGACY_SCRIPTS, SCRIPTS, Scripts};
use crate::spec::MAX_TTL;
// Named in the docs.
#[cfg(doc)]
use crate::{backend::LockBackend, error::LockError};

impl RedisBackend {
    /// Put every key under `prefix` instead of `lock:`.
    ///
    /// Keep it short, and without `{` or `}`: braces in the prefix would
    /// become the cluster hash tag and put every lock in one slot.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Arc::from(prefix.into());
        self
    }

    /// Bound every backend call by `op_timeout` (default 2 s), connecting and
    /// pool checkout included; at least 1 ms, at most a year (longer is as
    /// good as forever). `acquire` with a max wait returns within max wait +
    /// `op_timeout`.
    pub fn op_timeout(mut self, op_timeout: Duration) -> Self {
        self.op_timeout = op_timeout.clamp(Duration::from_millis(1), MAX_TTL);
        self
    }

    /// Confirm every lock taken (acquired, a single-flight's leader, a
    /// token restored by [`LockBackend::claim`]) on `replicas` replicas of
    /// the lock's primary (`WAIT`) before granting it; if they have not
    /// acknowledged it within `timeout`, release the lock and fail with
    /// [`LockError::BackendUnavailable`] (the layer's `503`). Off by default
    /// (`replicas` = 0 turns it off), and then it costs nothing.
    ///
    /// It costs two more round trips per lock taken (the lock is extended
    /// to its TTL, so that the `WAIT` covers a lock handed over by another
    /// process's release too, then `WAIT`), plus the replicas'
    /// acknowledgement. Both run on a connection of their own, taken for
    /// that call alone (`WAIT` blocks the connection it is sent on, and
    /// every other call of the backend must go on meanwhile): up to 64 such
    /// connections are open at once (on a cluster, each a cluster
    /// connection), 8 kept idle for reuse; on one server they come from the
    /// pool, which opens others in their place.
    ///
    /// What it buys: a failover to a replica that acknowledged loses no
    /// lock granted before it, so fewer locks are lost on failover. What it
    /// does not: replication stays asynchronous (a replica that did not
    /// acknowledge may still be promoted, `WAIT` is no consensus), releases
    /// and extensions are not confirmed, and a lock taken and then refused
    /// here may already have been seen by a reader of the replicas. Fencing
    /// stays the real protection (see the README's guarantees).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_lock::backend::redis::RedisBackend;
    ///
    /// let backend = RedisBackend::from_url("redis://10.0.0.5:6379")?
    ///     .min_replicas(1, Duration::from_millis(50));
    /// assert_eq!(backend.get_min_replicas(), Some((1, Duration::from_millis(50))));
    /// # Ok::<(), tower_lock::LockError>(())
    /// ```
    pub fn min_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.min_replicas = (replicas > 0).then_some(MinReplicas {
            replicas,
            timeout: timeout.clamp(Duration::from_millis(1), MAX_TTL),
        });
        self
    }

    /// The replicas every acquisition is confirmed on, and how long that may
    /// take; `None` when off (see [`RedisBackend::min_replicas`]).
    pub fn get_min_replicas(&self) -> Option<(u32, Duration)> {
        self.min_replicas.map(|m| (m.replicas, m.timeout))
    }

    /// Keep an index from owner tokens to their locks, so that
    /// [`LockBackend::held_by`] can answer (default off: it then answers
    /// [`LockError::Unsupported`]).
    ///
    /// The index of an owner is a hash `{prefix}o:{<owner>}` (its own
    /// cluster slot) naming the locks the owner took. It is written beside
    /// acquire and extend in the **same round trip** (pipelined on the one
    /// connection; on a cluster, sent at the same time to the node owning
    /// the owner's slot): no round trip more, but one more command each.
    /// Only what was granted stays indexed: a refused acquisition takes its
    /// entry back (one more round trip, before the refusal is answered),
    /// and a release drops the entry once it has released (one more round
    /// trip, after the lock is free), never on a refused release (a stale
    /// holder of a reused owner token). So it stays off unless lookups are
    /// wanted. It is a hint: every
    /// lookup checks each lock it names (held, by this owner) and drops
    /// entries that no longer hold, so a stale entry (a force release, an
    /// expiry) never gives a wrong answer. A lock whose index entry is
    /// missing (taken while the index was off, or an index write that
    /// failed) is not found by owner; [`LockBackend::owns`] and `status`
    /// always ask the lock itself.
    pub fn index_owners(mut self, on: bool) -> Self {
        self.index_owners = on;
        self
    }

    /// Whether the owner index is kept.
    pub fn get_index_owners(&self) -> bool {
        self.index_owners
    }

    /// The key prefix.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// The bound on one backend call.
    pub fn get_op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// The pool connections come from; `None` on a cluster.
    pub fn get_pool(&self) -> Option<&Pool> {
        self.shared.conn.pool()
    }

    /// Whether this backend is on a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.shared.conn.is_cluster()
    }

    /// Keep the per-lock fence counters of versions before per-slot
    /// counters in step (default off): turn it on while processes of such a
    /// version may still lock the same keys on the same Redis (a rolling
    /// upgrade), so that no fence is handed out twice.
    ///
    /// Every fence drawn is then above the lock's old counter and written
    /// back to it, so an old process's next fence is above every fence this
    /// version gave, and this version's next is above the old process's.
    /// It costs the acquire fast path (each acquisition runs the full
    /// script) and a counter per lock name, as the old versions kept. Once
    /// no old process runs, turn it off: the old counters are then moved
    /// into the slots' counters and deleted as each lock draws its next
    /// fence. See the README's upgrade notes.
    ///
    /// Off while an old version runs, an old process would count a lock's
    /// fences again from 1 (or from where it left off), handing out fences
    /// given already.
    pub fn keep_legacy_fence_counters(mut self, on: bool) -> Self {
        self.keep_legacy_fences = on;
        self
    }

    /// Whether per-lock fence counters are kept in step (see
    /// [`RedisBackend::keep_legacy_fence_counters`]).
    pub fn get_keep_legacy_fence_counters(&self) -> bool {
        self.keep_legacy_fences
    }

    /// The scripts this backend runs.
    pub(super) fn scripts(&self) -> &'static Scripts {
        if self.keep_legacy_fences {
            &LEGACY_SCRIPTS
        } else {
            &SCRIPTS
        }
    }
}
