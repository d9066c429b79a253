//! What a lock may carry beyond the lock itself: its metadata (a key beside
//! it, written only when there is some) and the opt-in owner index (a hint
//! in the owner's own hash tag, checked against the locks on every lookup).
//! With neither, an operation is the one script of `ops.rs`, as before.

use deadpool_redis::redis::Value;

use super::RedisBackend;
use super::keys::Keys;
use super::scripts::{array, ceil_ms, int, string_at, uint_at};
use crate::backend::{HeldBy, Holder, Lease, LockStatus, join_all};
use crate::error::LockError;
use crate::key::LockKey;
use crate::metadata::LockMetadata;
use crate::spec::{AcquireRequest, owners_match};

/// An owner index operation (see `owners.lua`).
enum Index<'a> {
    /// One more acquisition of the lock by the owner (granted, or under
    /// way): the index's TTL, and how long it may wait to be granted.
    Add(&'a LockKey, u64, u64),
    /// One fewer: released, or refused.
    Drop(&'a LockKey),
    Keep(u64),
}

impl RedisBackend {
    /// Acquire, with the owner index written in the same round trip (when
    /// on) and the metadata stored right after (when given).
    pub(super) async fn acquire_full(&self, req: &AcquireRequest) -> Result<Lease, LockError> {
        let lease = if self.index_owners {
            // A waiter's lock may be handed over up to its max wait later.
            // (A wait longer than a year is as good as forever, and Redis
            // refuses expiry times past its range.)
            let max_wait = ceil_ms(req.max_wait().min(crate::spec::MAX_TTL));
            let ttl = ceil_ms(req.ttl()).saturating_add(max_wait);
            // Granted by the end of its max wait plus a call's time, by the
            // lock's server clock; a second more for another server's.
            let wait = max_wait
                .saturating_add(ceil_ms(self.op_timeout))
                .saturating_add(1000);
            let (lease, _) = tokio::join!(
                self.acquire_inner(req),
                self.index(req.owner(), Index::Add(req.key(), ttl, wait))
            );
            match lease {
                Ok(lease) => lease,
                // Refused: only what was granted stays indexed. (Unreachable
                // is no answer: the lock may have been taken, and the
                // caller's cleanup release drops the entry if so.)
                Err(e) => {
                    if !matches!(e, LockError::BackendUnavailable(_)) {
                        let _ = self.index(req.owner(), Index::Drop(req.key())).await;
                    }
                    return Err(e);
                }
            }
        } else {
            self.acquire_inner(req).await?
        };
        if let Some(metadata) = req.metadata()
            && let Err(e) = self.store_metadata(req, lease.fence, metadata).await
        {
            // Never a lock without the metadata it was asked with.
            let holder = Holder::new(req.owner(), lease.fence);
            let _ = self.release_full(req.key(), holder).await;
            return Err(e);
        }
        Ok(lease)
    }

    /// Release, then (when on) drop the index entry, only if the release
    /// did release: a stale release of a reused owner token (another
    /// acquisition of the same owner holds the lock now) leaves the entry
    /// of the acquisition that holds. One more round trip, after the lock
    /// is free already.
    pub(super) async fn release_full(
        &self,
        key: &LockKey,
        holder: Holder<'_>,
    ) -> Result<(), LockError> {
        let released = self.release_inner(key, holder).await;
        if self.index_owners && released.is_ok() {
            let _ = self.index(holder.owner(), Index::Drop(key)).await;
        }
        released
    }

    /// Extend, and keep the index alive as long (when on), in one round trip.
    pub(super) async fn extend_full(
        &self,
        key: &LockKey,
        holder: Holder<'_>,
        ttl: std::time::Duration,
    ) -> Result<Lease, LockError> {
        if !self.index_owners {
            return self.extend_inner(key, holder, ttl).await;
        }
        let (extended, _) = tokio::join!(
            self.extend_inner(key, holder, ttl),
            self.index(holder.owner(), Index::Keep(ceil_ms(ttl)))
        );
        extended
    }

    async fn store_metadata(
        &self,
        req: &AcquireRequest,
        fence: u64,
        metadata: &LockMetadata,
    ) -> Result<(), LockError> {
        let mut inv = self.scripts().metadata.prepare_invoke();
        self.keys(&mut inv, req.key(), Keys::LockAndMeta);
        inv.arg(req.owner()).arg(fence).arg(metadata.as_json());
        // 0: the lock is not this acquisition's any more (it ran out); the
        // handle learns that as any lost lock.
        int(
            &self.shared.conn.eval(&inv, self.deadline()).await?,
            "metadata",
        )
        .map(drop)
    }

    async fn index(&self, owner: &str, op: Index<'_>) -> Result<Value, LockError> {
        let mut inv = self.scripts().owners.prepare_invoke();
        inv.key(self.owner_key(owner));
        match op {
            Index::Add(key, ttl, wait) => inv
                .arg("add")
                .arg(key.encoded(usize::MAX))
                .arg(ttl)
                .arg(wait),
            Index::Drop(key) => inv.arg("drop").arg(key.encoded(usize::MAX)),
            Index::Keep(ttl) => inv.arg("keep").arg(ttl),
        };
        if let Index::Drop(_) = op {
            // Not sent twice: a second run (after a lost reply) would
            // take a count of another acquisition under the same owner
            // token and drop the entry of a lock still held. A drop lost
            // instead leaves an entry too many, which a lookup checks and
            // cleans up.
            return self.shared.conn.eval_once(&inv, self.deadline()).await;
        }
        self.shared.conn.eval(&inv, self.deadline()).await
    }

    /// The metadata in a status reply (its 7th element), if any.
    pub(super) fn metadata_at(reply: &[Value]) -> Option<LockMetadata> {
        let text = string_at(reply, 6, "status").ok()?;
        LockMetadata::from_json(&text).ok()
    }

    /// The locks `owner` holds, from its index, each checked against the
    /// lock (entries that no longer hold are dropped from the index).
    pub(super) async fn held_by_inner(
        &self,
        owner: &str,
        limit: usize,
    ) -> Result<Vec<HeldBy>, LockError> {
        if !self.index_owners {
            return Err(LockError::Unsupported(
                "lookups by owner need the owner index (RedisBackend::index_owners)",
            ));
        }
        let mut inv = self.scripts().owners.prepare_invoke();
        inv.key(self.owner_key(owner)).arg("list");
        let fields = array(
            self.shared.conn.eval(&inv, self.deadline()).await?,
            "owners",
        )?;
        // The index server's time when it was listed, then the entries.
        let listed = uint_at(&fields, 0, "owners")?;
        let mut keys = Vec::with_capacity(fields.len());
        let mut stale = Vec::new();
        for i in 1..fields.len() {
            let field = string_at(&fields, i, "owners")?;
            match LockKey::from_encoded(&field) {
                Some(key) => keys.push(key),
                None => stale.push(field),
            }
        }
        // All statuses in one pipelined round trip.
        let statuses = join_all(keys.iter().map(|k| self.status_inner(k)).collect()).await;
        let mut found = Vec::new();
        for (key, status) in keys.into_iter().zip(statuses) {
            match status? {
                // Held shared or under permits: one entry per hold of the
                // owner.
                Some(s) if !s.holders.is_empty() => {
                    let before = found.len();
                    for hold in s.holders.iter().filter(|h| owners_match(&h.owner, owner)) {
                        if let Some(one) = LockStatus::of_holders(s.kind, vec![hold.clone()]) {
                            found.push(HeldBy::new(key.clone(), one));
                        }
                    }
                    if found.len() == before {
                        stale.push(key.encoded(usize::MAX));
                    }
                }
                Some(s) if owners_match(&s.owner, owner) => found.push(HeldBy::new(key, s)),
                _ => stale.push(key.encoded(usize::MAX)),
            }
        }
        if !stale.is_empty() {
            let drops = stale.iter().map(|field| {
                let mut inv = self.scripts().owners.prepare_invoke();
                inv.key(self.owner_key(owner))
                    .arg("del")
                    .arg(field.as_str())
                    .arg(listed);
                inv
            });
            let drops: Vec<_> = drops.collect();
            let _ = join_all(
                drops
                    .iter()
                    .map(|inv| self.shared.conn.eval(inv, self.deadline()))
                    .collect(),
            )
            .await;
        }
        found.sort_by(|a, b| a.key.cmp(&b.key));
        found.truncate(limit);
        Ok(found)
    }
}

/// A status reply with its metadata attached.
pub(super) fn with_metadata(status: LockStatus, reply: &[Value]) -> LockStatus {
    status.with_metadata(RedisBackend::metadata_at(reply))
}
