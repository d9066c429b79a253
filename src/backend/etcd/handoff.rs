//! Giving a lock back: to nobody when nobody waits, else straight to the
//! oldest waiter, in one transaction that deletes the holder's key and the
//! waiter's entry and creates the waiter's holder key (on the waiter's own
//! lease). The new key's create revision is the new fence: greater than
//! every revision before it, so than every fence the lock had.
//!
//! Every such transaction is conditioned on what was read: the holder is
//! still the one being released (by fence, or by the exact value an expiry
//! was armed for) and the waiter is still the oldest (its entry unchanged:
//! no older entry can appear, new ones are younger). When either changed,
//! the state is read again and the step retried, within the op timeout.

use etcd_client::{Compare, CompareOp, DeleteOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use tokio::time::Instant;

use super::EtcdBackend;
use super::conn::{bad_reply, timed_out};
use super::keys::{HeldKey, HolderValue, LockKeys, Waiter};
use crate::error::LockError;

/// The holder and the oldest waiter of a lock, as one read saw them.
#[derive(Debug, Default)]
pub(super) struct Snapshot {
    pub(super) holder: Option<HeldKey>,
    pub(super) head: Option<Waiter>,
}

impl Snapshot {
    /// From the two reads (`get_holder`, `get_head`) at `at` in `reply`.
    pub(super) fn read(
        keys: &LockKeys,
        reply: &TxnResponse,
        at: usize,
        what: &str,
    ) -> Result<Self, LockError> {
        let ops = reply.op_responses();
        let (Some(TxnOpResponse::Get(holder)), Some(TxnOpResponse::Get(head))) =
            (ops.get(at), ops.get(at + 1))
        else {
            return Err(bad_reply(what));
        };
        let holder = match holder.kvs().first() {
            None => None,
            Some(kv) => Some(HeldKey::from_kv(keys, kv).ok_or_else(|| bad_reply(what))?),
        };
        let head = match head.kvs().first() {
            None => None,
            Some(kv) => Some(Waiter::from_kv(kv).ok_or_else(|| bad_reply(what))?),
        };
        Ok(Snapshot { holder, head })
    }
}

/// Which holder a hand-off gives back.
#[derive(Clone, Copy)]
pub(super) enum Giving<'a> {
    /// The holder key under this fence (a release, a force release).
    Fence(&'a [u8], u64),
    /// The holder key while it stores this value (an expiry).
    Value(&'a [u8], &'a [u8]),
    /// Nobody: the holder's lease ran out, waiters are left (an orphaned
    /// queue, handed to its head by whoever sees it first).
    Free,
}

impl Giving<'_> {
    fn condition(&self, keys: &LockKeys) -> Compare {
        match *self {
            Giving::Fence(key, fence) => {
                Compare::create_revision(key, CompareOp::Equal, i64::try_from(fence).unwrap_or(-1))
            }
            Giving::Value(key, value) => Compare::value(key, CompareOp::Equal, value),
            Giving::Free => keys.free(),
        }
    }

    /// Whether `holder` (as read) is still the one given back.
    fn holds(&self, holder: Option<&HeldKey>) -> bool {
        match (*self, holder) {
            (Giving::Fence(key, fence), Some(h)) => h.key == key && h.fence == fence,
            (Giving::Value(key, value), Some(h)) => h.key == key && h.raw_value == value,
            (Giving::Free, None) => true,
            _ => false,
        }
    }

    fn key(&self) -> Option<&[u8]> {
        match *self {
            Giving::Fence(key, _) | Giving::Value(key, _) => Some(key),
            Giving::Free => None,
        }
    }
}

/// How a hand-off ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Passed {
    /// Given back: freed, or handed to a waiter (its fence).
    Done(Option<u64>),
    /// The holder was not (or no longer) the one to give back.
    NotHeld,
}

/// How an expiry ended.
pub(super) enum Expire {
    Done,
    /// The lock no longer stores the value the expiry was armed for.
    Gone,
}

impl EtcdBackend {
    /// Give back the lock `from` holds (`snapshot`: the state read last),
    /// to its oldest live waiter if there is one. `extra` runs in the same
    /// transaction (a flight's result).
    pub(super) async fn pass_on(
        &self,
        keys: &LockKeys,
        mut snapshot: Snapshot,
        from: Giving<'_>,
        extra: &[TxnOp],
        end: Instant,
    ) -> Result<Passed, LockError> {
        const WHAT: &str = "hand-off";
        loop {
            if Instant::now() >= end {
                return Err(timed_out("handing an etcd lock over"));
            }
            if !from.holds(snapshot.holder.as_ref()) {
                return Ok(Passed::NotHeld);
            }
            let mut ops: Vec<TxnOp> = extra.to_vec();
            if let Some(holder) = &snapshot.holder {
                ops.push(TxnOp::delete(holder.key.clone(), None));
                // (The index entry is the new holder's too when it is the
                // same owner.)
                let same_owner = snapshot
                    .head
                    .as_ref()
                    .is_some_and(|w| w.value.owner == holder.owner);
                if !same_owner {
                    ops.push(TxnOp::delete(keys.index(&holder.owner), None));
                }
            }
            let reread = [keys.get_holder(), keys.get_head()];
            let Some(head) = snapshot.head.take() else {
                let txn = Txn::new()
                    .when([from.condition(keys), keys.nobody_queued()])
                    .and_then(ops)
                    .or_else(reread);
                let reply = self.shared.conn.txn(WHAT, txn, end).await?;
                if reply.succeeded() {
                    return Ok(Passed::Done(None));
                }
                snapshot = Snapshot::read(keys, &reply, 0, WHAT)?;
                continue;
            };
            let new_key = keys.holder(&head.value.owner, head.value.attempt);
            if from.key() == Some(new_key.as_slice()) || head.value.is_past() {
                // The same acquisition queued behind itself (a retry whose
                // reply was lost), or a waiter whose max wait is over: not
                // a waiter to hand to.
                self.drop_waiter(keys, &head, end).await?;
                snapshot = self.snapshot(keys, end).await?;
                continue;
            }
            let value = HolderValue::new(
                std::time::SystemTime::now(),
                std::time::Duration::from_millis(head.value.ttl_ms),
                head.value.kind,
                head.value.metadata.as_ref(),
            );
            ops.push(TxnOp::delete(head.key.clone(), None));
            ops.push(TxnOp::put(
                new_key,
                value.encode(),
                Some(etcd_client::PutOptions::new().with_lease(head.lease)),
            ));
            let txn = Txn::new()
                .when([
                    from.condition(keys),
                    Compare::mod_revision(head.key.clone(), CompareOp::Equal, head.mod_revision),
                ])
                .and_then(ops)
                .or_else(reread);
            match self.shared.conn.txn_with_lease(WHAT, txn, end).await? {
                Ok(reply) if reply.succeeded() => {
                    let fence = reply
                        .header()
                        .and_then(|h| u64::try_from(h.revision()).ok())
                        .ok_or_else(|| bad_reply(WHAT))?;
                    return Ok(Passed::Done(Some(fence)));
                }
                Ok(reply) => snapshot = Snapshot::read(keys, &reply, 0, WHAT)?,
                Err(_gone) => {
                    // The waiter's lease ran out (its process died): etcd
                    // is about to delete its entry; do it now.
                    self.drop_waiter(keys, &head, end).await?;
                    snapshot = self.snapshot(keys, end).await?;
                }
            }
        }
    }

    /// Delete a waiter's entry if it is still the one read.
    async fn drop_waiter(
        &self,
        keys: &LockKeys,
        waiter: &Waiter,
        end: Instant,
    ) -> Result<(), LockError> {
        let _ = keys;
        let txn = Txn::new()
            .when([Compare::mod_revision(
                waiter.key.clone(),
                CompareOp::Equal,
                waiter.mod_revision,
            )])
            .and_then([TxnOp::delete(waiter.key.clone(), None)]);
        self.shared.conn.txn("dropping a waiter", txn, end).await?;
        Ok(())
    }

    /// Read the holder and the oldest waiter (linearizable).
    pub(super) async fn snapshot(
        &self,
        keys: &LockKeys,
        end: Instant,
    ) -> Result<Snapshot, LockError> {
        let txn = Txn::new().and_then([keys.get_holder(), keys.get_head()]);
        let reply = self.shared.conn.txn("reading a lock", txn, end).await?;
        Snapshot::read(keys, &reply, 0, "reading a lock")
    }

    /// An orphaned queue (no holder, waiters left): hand it to its head.
    /// What a newcomer, a status and a waiter do when they see one.
    pub(super) async fn adopt_orphan(
        &self,
        keys: &LockKeys,
        snapshot: Snapshot,
        end: Instant,
    ) -> Result<(), LockError> {
        if snapshot.holder.is_none() && snapshot.head.is_some() {
            self.pass_on(keys, snapshot, Giving::Free, &[], end).await?;
        }
        Ok(())
    }

    /// An expiry armed for `value` of `holder_key`: release it if it still
    /// stores that value.
    pub(super) async fn expire(
        &self,
        keys: &LockKeys,
        holder_key: &[u8],
        value: &[u8],
        end: Instant,
    ) -> Result<Expire, LockError> {
        const WHAT: &str = "expiry";
        let owner = keys
            .parse_holder(holder_key)
            .map(|(o, _)| o.to_owned())
            .ok_or_else(|| bad_reply(WHAT))?;
        let txn = Txn::new()
            .when([
                Compare::value(holder_key, CompareOp::Equal, value),
                keys.nobody_queued(),
            ])
            .and_then([
                TxnOp::delete(holder_key, None),
                TxnOp::delete(keys.index(&owner), None),
            ])
            .or_else([keys.get_holder(), keys.get_head()]);
        let reply = self.shared.conn.txn(WHAT, txn, end).await?;
        if reply.succeeded() {
            return Ok(Expire::Done);
        }
        let snapshot = Snapshot::read(keys, &reply, 0, WHAT)?;
        match self
            .pass_on(keys, snapshot, Giving::Value(holder_key, value), &[], end)
            .await?
        {
            Passed::Done(_) => Ok(Expire::Done),
            Passed::NotHeld => Ok(Expire::Gone),
        }
    }
}

/// Delete `[start, end)`.
pub(super) fn delete_range(start: Vec<u8>, end: Vec<u8>) -> TxnOp {
    TxnOp::delete(start, Some(DeleteOptions::new().with_range(end)))
}
