//! Reading locks (status, lookups by owner) and an operator's force
//! release: each a linearizable read, then a conditioned transaction only
//! when a lock must change hands (a holder whose lease ran out with waiters
//! queued is handed to the oldest, not left looking free).

use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};

use super::EtcdBackend;
use super::conn::bad_reply;
use super::handoff::{Giving, Passed};
use super::keys::{HeldKey, index_range};
use super::ops::{after, kvs_at};
use crate::backend::{HeldBy, LockStatus};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::owners_match;

impl EtcdBackend {
    pub(super) async fn force_release_inner(&self, key: &LockKey) -> Result<bool, LockError> {
        let keys = self.keys(key);
        let end = self.deadline();
        loop {
            let snapshot = self.snapshot(&keys, end).await?;
            let Some(h) = snapshot.holder.clone() else {
                self.adopt_orphan(&keys, snapshot, end).await?;
                return Ok(false);
            };
            let from = Giving::Fence(&h.key, h.fence);
            if let Passed::Done(_) = self.pass_on(&keys, snapshot, from, &[], end).await? {
                self.shared.expiries.disarm_range(&h.key, &after(&h.key));
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
            let txn = Txn::new().and_then([keys.get_holder(), keys.count_queue()]);
            let reply = self.shared.conn.txn(WHAT, txn, end).await?;
            let waiters = match reply.op_responses().get(1) {
                Some(TxnOpResponse::Get(get)) => usize::try_from(get.count()).unwrap_or(0),
                _ => return Err(bad_reply(WHAT)),
            };
            let holder = match kvs_at(&reply, 0, WHAT)?.first() {
                None => None,
                Some(kv) => Some(HeldKey::from_kv(&keys, kv).ok_or_else(|| bad_reply(WHAT))?),
            };
            match holder {
                Some(h) => {
                    let v = &h.value;
                    let status = LockStatus::new(
                        h.owner,
                        h.fence,
                        v.acquired_at(),
                        v.expires_at(),
                        v.remaining(),
                    )
                    .with_waiters(waiters)
                    .with_metadata(v.metadata.clone());
                    return Ok(Some(status));
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
            match (lock, status) {
                (Some(lock), Some(s)) if owners_match(&s.owner, owner) => {
                    found.push(HeldBy::new(lock, s));
                }
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
