//! Reading locks (status, lookups by owner) and an operator's force
//! release: each a linearizable read, then a conditioned transaction only
//! when a lock must change hands (a holder whose lease ran out with waiters
//! queued is handed to the oldest, not left looking free).

use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};

use super::EtcdBackend;
use super::conn::bad_reply;
use super::handoff::{Giving, Passed};
use super::keys::{HeldKey, Waiter, index_range};
use super::kinds::held_as;
use super::ops::{after, kvs_at};
use crate::backend::{HeldBy, Hold, LockStatus};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::{LockKind, owners_match};

impl EtcdBackend {
    pub(super) async fn force_release_inner(&self, key: &LockKey) -> Result<bool, LockError> {
        let keys = self.keys(key);
        let end = self.deadline();
        loop {
            let snapshot = self.snapshot(&keys, end).await?;
            if snapshot.holders.is_empty() {
                self.adopt_orphan(&keys, snapshot, end).await?;
                return Ok(false);
            }
            let freed: Vec<Vec<u8>> = snapshot.holders.iter().map(|h| h.key.clone()).collect();
            if let Passed::Done = self.pass_on(&keys, snapshot, Giving::All, &[], end).await? {
                for key in freed {
                    self.shared.expiries.disarm_range(&key, &after(&key));
                }
                return Ok(true);
            }
        }
    }

    pub(super) async fn status_inner(
        &self,
        key: &LockKey,
    ) -> Result<Option<LockStatus>, LockError> {
        const WHAT: &str = "status";
        let keys = self.keys(key);
        let end = self.deadline();
        for _ in 0..3 {
            // Read-only: a linearizable read, no Raft write.
            let txn = Txn::new().and_then([keys.get_holders(), keys.count_queue()]);
            let reply = self.shared.conn.txn(WHAT, txn, end).await?;
            let waiters = match reply.op_responses().get(1) {
                Some(TxnOpResponse::Get(get)) => usize::try_from(get.count()).unwrap_or(0),
                _ => return Err(bad_reply(WHAT)),
            };
            let holders = kvs_at(&reply, 0, WHAT)?
                .iter()
                .map(|kv| HeldKey::from_kv(&keys, kv).ok_or_else(|| bad_reply(WHAT)))
                .collect::<Result<Vec<_>, _>>()?;
            match held_as(&holders) {
                Some(LockKind::Exclusive) => {
                    let h = &holders[0];
                    let v = &h.value;
                    let status = LockStatus::new(
                        h.owner.clone(),
                        h.fence,
                        v.acquired_at(),
                        v.expires_at(),
                        v.remaining(),
                    )
                    .with_waiters(waiters)
                    .with_metadata(v.metadata.clone());
                    return Ok(Some(status));
                }
                Some(kind) => {
                    let holds = holders.iter().map(hold_of).collect();
                    let status = LockStatus::of_holders(kind, holds);
                    return Ok(status.map(|s| s.with_waiters(waiters)));
                }
                None if waiters == 0 => return Ok(None),
                None => {
                    // The holder's lease ran out with waiters queued: the
                    // lock is theirs, not free. Hand it to the oldest.
                    let snapshot = self.snapshot(&keys, end).await?;
                    self.adopt_orphan(&keys, snapshot, end).await?;
                }
            }
        }
        Err(super::conn::timed_out("reading an etcd lock"))
    }

    pub(super) async fn held_by_inner(
        &self,
        owner: &str,
        limit: usize,
    ) -> Result<Vec<HeldBy>, LockError> {
        const WHAT: &str = "lookup by owner";
        if !self.index_owners {
            return Err(LockError::Unsupported(
                "lookups by owner need the owner index (EtcdBackend::index_owners)",
            ));
        }
        let end = self.deadline();
        let (start, stop) = index_range(&self.prefix, owner);
        let txn =
            Txn::new().and_then([TxnOp::get(start, Some(GetOptions::new().with_range(stop)))]);
        let reply = self.shared.conn.txn(WHAT, txn, end).await?;
        let entries = kvs_at(&reply, 0, WHAT)?;
        let mut found = Vec::new();
        let mut stale = Vec::new();
        for kv in entries {
            let lock = std::str::from_utf8(kv.value())
                .ok()
                .and_then(LockKey::from_encoded);
            let status = match &lock {
                Some(lock) => self.status_inner(lock).await?,
                None => None,
            };
            let mine = status.map_or_else(Vec::new, |s| of_owner(s, owner));
            match lock {
                Some(lock) if !mine.is_empty() => {
                    found.extend(mine.into_iter().map(|s| HeldBy::new(lock.clone(), s)));
                }
                // Not held by the owner yet: it may be waiting for it,
                // and the entry must outlive the wait.
                Some(lock) if self.wanted_by(&lock, owner, end).await? => {}
                _ => stale.push(kv),
            }
        }
        for kv in stale {
            // Only if still the entry read (a new acquisition rewrote it).
            let txn = Txn::new()
                .when([etcd_client::Compare::mod_revision(
                    kv.key(),
                    etcd_client::CompareOp::Equal,
                    kv.mod_revision(),
                )])
                .and_then([TxnOp::delete(kv.key(), None)]);
            let _ = self.shared.conn.txn(WHAT, txn, end).await;
        }
        found.sort_by(|a, b| a.key.cmp(&b.key));
        found.truncate(limit);
        Ok(found)
    }
}

impl EtcdBackend {
    /// Whether `owner` holds `lock` or waits for it, read at one revision
    /// (a waiter granted between two reads would be in neither).
    async fn wanted_by(
        &self,
        lock: &LockKey,
        owner: &str,
        end: tokio::time::Instant,
    ) -> Result<bool, LockError> {
        const WHAT: &str = "lookup by owner";
        let keys = self.keys(lock);
        let (start, stop) = keys.queue();
        let queue = TxnOp::get(start, Some(GetOptions::new().with_range(stop)));
        let txn = Txn::new().and_then([keys.get_holders(), queue]);
        let reply = self.shared.conn.txn(WHAT, txn, end).await?;
        let holds = kvs_at(&reply, 0, WHAT)?
            .iter()
            .filter_map(|kv| HeldKey::from_kv(&keys, kv))
            .any(|h| owners_match(&h.owner, owner));
        let waits = kvs_at(&reply, 1, WHAT)?
            .iter()
            .filter_map(Waiter::from_kv)
            .any(|w| !w.value.is_past() && owners_match(&w.value.owner, owner));
        Ok(holds || waits)
    }
}

/// A hold of a group as the status lists it.
fn hold_of(h: &HeldKey) -> Hold {
    let v = &h.value;
    Hold::new(
        h.owner.clone(),
        h.fence,
        v.acquired_at(),
        v.expires_at(),
        v.remaining(),
    )
    .with_metadata(v.metadata.clone())
}

/// `owner`'s holds in `status`, as statuses of their own (one for an
/// exclusive lock it holds).
fn of_owner(status: LockStatus, owner: &str) -> Vec<LockStatus> {
    if status.holders.is_empty() {
        return if owners_match(&status.owner, owner) {
            vec![status]
        } else {
            Vec::new()
        };
    }
    let kind = status.kind;
    status
        .holders
        .into_iter()
        .filter(|h| owners_match(&h.owner, owner))
        .filter_map(|h| LockStatus::of_holders(kind, vec![h]))
        .collect()
}
