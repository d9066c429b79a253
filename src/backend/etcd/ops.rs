//! The operations: each one conditioned transaction on the common path
//! (acquire, release), a read and a transaction otherwise, never a write
//! decided by the client from a read that the transaction does not check.

use std::time::{Duration, SystemTime};

use etcd_client::{
    Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use tokio::time::Instant;

use super::EtcdBackend;
use super::conn::bad_reply;
use super::handoff::{Giving, Passed, Snapshot, delete_range};
use super::keys::{HeldKey, HolderValue, LockKeys, ceil_ms};
use crate::backend::{Holder, Lease};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::{LockKind, owners_match, validate_ttl};

pub(super) enum Attempt {
    Acquired(Lease),
    Busy {
        /// The holder's remaining TTL.
        retry_after: Duration,
        /// The queue entry this attempt made, when it queued.
        queued: Option<Queued>,
    },
}

/// A waiter's queue entry, as its attempt made it.
pub(super) struct Queued {
    pub(super) entry: Vec<u8>,
    /// The revision that created it (its place in the queue).
    pub(super) revision: i64,
    /// The entry just before it, `None` when it is the oldest.
    pub(super) before: Option<Vec<u8>>,
}

/// The revision a transaction made (or read at).
pub(super) fn revision(reply: &TxnResponse, what: &str) -> Result<i64, LockError> {
    reply
        .header()
        .map(|h| h.revision())
        .ok_or_else(|| bad_reply(what))
}

/// The key-values of read `at` of a transaction's reply.
pub(super) fn kvs_at(
    reply: &TxnResponse,
    at: usize,
    what: &str,
) -> Result<Vec<KeyValue>, LockError> {
    match reply.op_responses().into_iter().nth(at) {
        Some(TxnOpResponse::Get(mut get)) => Ok(get.take_kvs()),
        _ => Err(bad_reply(what)),
    }
}

impl EtcdBackend {
    /// Send `txn`, whose success puts `value` under `holder_key` (a grant to
    /// `req`, dated `now`/`at`), with the expiry armed before it is sent (if
    /// it lands and the reply is lost, it must still expire on time):
    /// on success the lease (its fence the reply's revision, the expiry
    /// told so), else the reply, the expiry disarmed.
    pub(super) async fn grant_txn(
        &self,
        what: &'static str,
        req: &crate::spec::AcquireRequest,
        (holder_key, value): (&[u8], &[u8]),
        (now, at): (SystemTime, Instant),
        txn: Txn,
        end: Instant,
    ) -> Result<Result<Lease, TxnResponse>, LockError> {
        let expiries = &self.shared.expiries;
        let deadline = at + req.ttl();
        let (key, val) = (holder_key.to_vec(), value.to_vec());
        expiries.arm(self, req.key(), key, val, None, deadline);
        let reply = self.shared.conn.txn(what, txn, end).await?;
        let rev = revision(&reply, what)?;
        if reply.succeeded() {
            let fence = u64::try_from(rev).map_err(|_| bad_reply(what))?;
            expiries.landed(holder_key, value, fence);
            return Ok(Ok(Lease::new(fence, now, now, req.ttl())));
        }
        expiries.disarm_value(holder_key, value);
        Ok(Err(reply))
    }
}

impl EtcdBackend {
    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + self.op_timeout
    }

    pub(super) fn keys(&self, key: &LockKey) -> LockKeys {
        LockKeys::new(&self.prefix, key)
    }

    pub(super) async fn release_inner(
        &self,
        key: &LockKey,
        holder: Holder<'_>,
    ) -> Result<(), LockError> {
        const WHAT: &str = "release";
        let keys = self.keys(key);
        let end = self.deadline();
        let (start, stop) = keys.owner_holders(holder.owner());
        if let Some((snapshot, h)) = self.shared.handed.take(&keys, holder) {
            // Handed the lock by this process with waiters behind: hand it
            // on from the state that hand-off read (see `Handed`).
            let from = Giving::Fence(&h.key, h.fence);
            if self.pass_on(&keys, snapshot, from, &[], end).await? == Passed::Done {
                self.disarm_released(&h);
                return Ok(());
            }
            // Not held as that state said: the release below says why.
        }
        let mut ops = vec![delete_range(start.clone(), stop.clone())];
        let mut when = keys.held_by(holder.owner(), holder.fence());
        let mut disarm = (start, stop);
        let known = self.known_hold(&keys, holder);
        // A permit of a lock with a queue seen lately: this process's turn
        // to hand it on, from the state the last grant read (see
        // `Passing`).
        let permit = matches!(known, Some((_, LockKind::Permits(_), _)));
        let mut turn = None;
        if permit {
            turn = self.shared.passing.turn(&keys, false, end).await?;
            if let Some((snapshot, h)) = self.shared.passing.last(&keys, holder, 0) {
                let from = Giving::Fence(&h.key, h.fence);
                if self.pass_on(&keys, snapshot, from, &[], end).await? == Passed::Done {
                    self.disarm_released(&h);
                    return Ok(());
                }
            }
        }
        if let Some((hold, _, compare)) = known {
            // A shared hold or permit this process wrote: its key is known,
            // so nobody queued, one transaction gives it back (the
            // condition above only sees exclusive holder keys, and the
            // release needed a second, read-first one).
            ops = vec![TxnOp::delete(hold.clone(), None)];
            when = compare;
            disarm = (hold.clone(), after(&hold));
        }
        if self.index_owners {
            ops.push(TxnOp::delete(keys.index(holder.owner()), None));
        }
        let txn = Txn::new()
            .when([when, keys.nobody_queued()])
            .and_then(ops)
            .or_else([keys.get_holders(), keys.get_head()]);
        let reply = self.shared.conn.txn(WHAT, txn, end).await?;
        // Only the timers of what this release deleted (or found gone) go:
        // an acquisition of the same owner token under way meanwhile armed
        // one of its own in the range, and keeps it.
        let at = revision(&reply, WHAT)?;
        if reply.succeeded() {
            self.shared
                .expiries
                .disarm_through(&disarm.0, &disarm.1, at);
            return Ok(());
        }
        let (start, stop) = disarm;
        let mut snapshot = Snapshot::read(&keys, &reply, 0, WHAT)?;
        if permit && snapshot.head.is_some() {
            if turn.is_none() {
                turn = self.shared.passing.turn(&keys, true, end).await?;
            }
            if let Some((last, _)) = self.shared.passing.last(&keys, holder, snapshot.at) {
                // A grant made while this release waited for its turn.
                snapshot = last;
            }
        }
        let Some(h) = snapshot.find(holder).cloned() else {
            if snapshot.holders.is_empty() {
                self.shared.expiries.disarm_through(&start, &stop, at);
                return Err(LockError::NotFound);
            }
            return Err(LockError::OwnershipMismatch);
        };
        let outcome = self
            .pass_on(&keys, snapshot, Giving::Fence(&h.key, h.fence), &[], end)
            .await?;
        // (The next permit release's turn.)
        drop(turn);
        self.disarm_released(&h);
        match outcome {
            Passed::Done => Ok(()),
            // Released or expired meanwhile.
            Passed::NotHeld => Err(LockError::NotFound),
        }
    }

    /// The holder key and kind of `holder`'s shared hold or permit if this
    /// process wrote it (its expiry is armed here), and the condition that
    /// it is still held: under its fence, and with the owner index on, the
    /// owner's only hold of the lock (else the release must read whether
    /// the index entry stays).
    fn known_hold(
        &self,
        keys: &LockKeys,
        holder: Holder<'_>,
    ) -> Option<(Vec<u8>, LockKind, Compare)> {
        let fence = holder.fence()?;
        // Only the holds of shared and permits groups: they sort before
        // exclusive holder keys (kinds.rs), which an exclusive release's
        // own condition covers.
        let start = keys.holders().0;
        let stop = keys.kind_range(LockKind::Exclusive).0;
        let of_owner = |k: &[u8]| {
            keys.parse_hold(k)
                .is_some_and(|(_, o, _)| o == holder.owner())
        };
        let known = self
            .shared
            .expiries
            .known(&start, &stop, Some(fence), of_owner)?;
        let (kind, _, _) = keys.parse_hold(&known.key)?;
        let compare = if self.index_owners {
            let (start, stop) = keys.owner_holds(kind, holder.owner());
            let fence = i64::try_from(fence).ok()?;
            Compare::create_revision(start, CompareOp::Equal, fence).with_range(stop)
        } else {
            fence_is(&known.key, fence)
        };
        Some((known.key, kind, compare))
    }

    /// Forget the expiry of hold `h`, given back and handed on: the timers
    /// of its very value only. The lock may have gone to a waiter of the
    /// same owner (a custom owner shared by two requests), whose new holder
    /// key lies in the owner's range and whose timer this process armed
    /// just now; forgetting the owner's whole range lost that timer, and the
    /// handed lock lived as long as this process (fault-schedule seed
    /// 1172). Timers of values no longer stored change nothing when they
    /// fire.
    pub(super) fn disarm_released(&self, h: &HeldKey) {
        self.shared.expiries.disarm_value(&h.key, &h.raw_value);
    }

    pub(super) async fn extend_inner(
        &self,
        key: &LockKey,
        holder: Holder<'_>,
        ttl: Duration,
    ) -> Result<Lease, LockError> {
        const WHAT: &str = "extend";
        validate_ttl(ttl)?;
        let keys = self.keys(key);
        let end = self.deadline();
        let (start, stop) = keys.holders();
        let of_owner = |k: &[u8]| {
            keys.parse_holder(k)
                .is_some_and(|(o, _)| o == holder.owner())
        };
        // What this process wrote last needs no read; else read it.
        let mut known = self
            .shared
            .expiries
            .known(&start, &stop, holder.fence(), of_owner)
            .and_then(|k| Some((k.key, k.fence, HolderValue::decode(&k.value)?)));
        let lease = self.shared.leases.lease_for(&self.shared, ttl, end).await?;
        for _ in 0..2 {
            let (holder_key, fence, old) = match known.take() {
                Some(k) => k,
                None => {
                    let snapshot = self.snapshot(&keys, end).await?;
                    match snapshot.find(holder) {
                        Some(h) => (h.key.clone(), h.fence, h.value.clone()),
                        None if snapshot.holders.is_empty() => return Err(LockError::NotFound),
                        None => return Err(LockError::OwnershipMismatch),
                    }
                }
            };
            let (now, at) = (SystemTime::now(), Instant::now());
            let value = HolderValue {
                expires_ms: crate::time::unix_ms(now).saturating_add(ceil_ms(ttl)),
                ttl_ms: ceil_ms(ttl),
                ..old.clone()
            }
            .encode();
            let txn = Txn::new()
                .when([fence_is(&holder_key, fence)])
                .and_then([TxnOp::put(
                    holder_key.clone(),
                    value.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            let expiries = &self.shared.expiries;
            expiries.arm(
                self,
                key,
                holder_key.clone(),
                value.clone(),
                Some(fence),
                at + ttl,
            );
            let reply = self.shared.conn.txn(WHAT, txn, end).await?;
            if reply.succeeded() {
                expiries.disarm_others(&holder_key, &value, revision(&reply, WHAT)?);
                return Ok(Lease::new(fence, old.acquired_at(), now, ttl));
            }
            expiries.disarm_value(&holder_key, &value);
            // Not what this process wrote last (claimed, released,
            // expired): read the lock.
        }
        Err(LockError::NotFound)
    }

    pub(super) async fn claim_inner(
        &self,
        key: &LockKey,
        holder: Holder<'_>,
        attempt: u64,
    ) -> Result<Lease, LockError> {
        const WHAT: &str = "claim";
        let Some(fence) = holder.fence() else {
            return Err(LockError::OwnershipMismatch);
        };
        let keys = self.keys(key);
        let end = self.deadline();
        let snapshot = self.snapshot(&keys, end).await?;
        // Claimed already by this very call, or the hold it names.
        let again = snapshot
            .holders
            .iter()
            .find(|h| owners_match(&h.owner, holder.owner()) && h.attempt == attempt);
        let Some(h) = again.or_else(|| snapshot.find(holder)).cloned() else {
            if snapshot.holders.is_empty() {
                return Err(LockError::NotFound);
            }
            return Err(LockError::OwnershipMismatch);
        };
        let expiries = &self.shared.expiries;
        let lease_of = |h: &HeldKey, fence: u64| Lease {
            fence,
            acquired_at: h.value.acquired_at(),
            expires_at: h.value.expires_at(),
            ttl: h.value.remaining(),
        };
        let deadline = Instant::now() + h.value.remaining();
        if owners_match(&h.owner, holder.owner()) && h.attempt == attempt {
            // Claimed already by this very call (a repeat after a lost
            // reply): the same answer.
            expiries.arm(
                self,
                key,
                h.key.clone(),
                h.raw_value.clone(),
                Some(h.fence),
                deadline,
            );
            return Ok(lease_of(&h, h.fence));
        }
        if !holder.matches(&h.owner, h.fence) || h.fence != fence {
            return Err(LockError::OwnershipMismatch);
        }
        let remaining = h.value.remaining().max(Duration::from_millis(1));
        let lease = self
            .shared
            .leases
            .lease_for(&self.shared, remaining, end)
            .await?;
        let new_key = keys.holder(h.kind, holder.owner(), attempt);
        let txn = Txn::new()
            .when([fence_is(&h.key, h.fence)])
            .and_then([
                TxnOp::delete(h.key.clone(), None),
                TxnOp::put(
                    new_key.clone(),
                    h.raw_value.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                ),
            ])
            .or_else([keys.get_holders()]);
        expiries.arm(
            self,
            key,
            new_key.clone(),
            h.raw_value.clone(),
            None,
            deadline,
        );
        let reply = self.shared.conn.txn(WHAT, txn, end).await?;
        if !reply.succeeded() {
            expiries.disarm_value(&new_key, &h.raw_value);
            return match kvs_at(&reply, 0, WHAT)?.first() {
                None => Err(LockError::NotFound),
                Some(_) => Err(LockError::OwnershipMismatch),
            };
        }
        let fence = u64::try_from(revision(&reply, WHAT)?).map_err(|_| bad_reply(WHAT))?;
        expiries.landed(&new_key, &h.raw_value, fence);
        Ok(lease_of(&h, fence))
    }
}

/// `key` exists under `fence` (its create revision).
pub(super) fn fence_is(key: &[u8], fence: u64) -> etcd_client::Compare {
    etcd_client::Compare::create_revision(
        key,
        etcd_client::CompareOp::Equal,
        i64::try_from(fence).unwrap_or(-1),
    )
}

/// The smallest key after `key` (the end of the range `[key]`).
pub(super) fn after(key: &[u8]) -> Vec<u8> {
    let mut k = key.to_vec();
    k.push(0);
    k
}

#[cfg(test)]
#[path = "release_test.rs"]
mod release_test;
