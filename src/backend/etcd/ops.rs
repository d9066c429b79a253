//! The operations: each one conditioned transaction on the common path
//! (acquire, release), a read and a transaction otherwise, never a write
//! decided by the client from a read that the transaction does not check.

use std::time::{Duration, SystemTime};

use etcd_client::{
    GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use tokio::time::Instant;

use super::EtcdBackend;
use super::conn::bad_reply;
use super::handoff::{Giving, Passed, Snapshot, delete_range};
use super::keys::{HeldKey, HolderValue, LockKeys, WaiterValue, ceil_ms};
use crate::backend::{Holder, Lease};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::{AcquireRequest, owners_match, validate_ttl};

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
    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + self.op_timeout
    }

    pub(super) fn keys(&self, key: &LockKey) -> LockKeys {
        LockKeys::new(&self.prefix, key)
    }

    /// One acquire attempt; `queue` is the entry id of a waiter, which joins
    /// the queue when the lock is busy.
    pub(super) async fn attempt(
        &self,
        req: &AcquireRequest,
        keys: &LockKeys,
        queue: Option<u64>,
        wait_until: Option<SystemTime>,
        end: Instant,
    ) -> Result<Attempt, LockError> {
        const WHAT: &str = "acquire";
        let lease = self
            .shared
            .leases
            .lease_for(&self.shared, req.ttl(), end)
            .await?;
        let holder_key = keys.holder(req.owner(), req.attempt());
        loop {
            let (now, at) = (SystemTime::now(), Instant::now());
            let value = HolderValue::new(now, req.ttl(), req.kind(), req.metadata()).encode();
            let with_lease = || Some(PutOptions::new().with_lease(lease));
            let mut granted = vec![TxnOp::put(holder_key.clone(), value.clone(), with_lease())];
            let mut busy = vec![keys.get_holder(), keys.get_head()];
            if self.index_owners {
                let index = TxnOp::put(
                    keys.index(req.owner()),
                    req.key().encoded(usize::MAX),
                    with_lease(),
                );
                granted.push(index.clone());
                busy.push(index);
            }
            let entry = queue.map(|id| keys.waiter(id));
            if let Some(entry) = &entry {
                let waiter = WaiterValue {
                    ttl_ms: ceil_ms(req.ttl()),
                    attempt: req.attempt(),
                    deadline_ms: crate::time::unix_ms(wait_until.unwrap_or(now)),
                    owner: req.owner().to_owned(),
                    kind: req.kind(),
                    metadata: req.metadata().cloned(),
                };
                busy.push(TxnOp::put(entry.clone(), waiter.encode(), with_lease()));
                let (start, stop) = keys.queue();
                // The newest two entries: this one and the one before it.
                busy.push(TxnOp::get(
                    start,
                    Some(
                        GetOptions::new()
                            .with_range(stop)
                            .with_sort(SortTarget::Create, SortOrder::Descend)
                            .with_limit(2)
                            .with_keys_only(),
                    ),
                ));
            }
            let txn = Txn::new()
                .when([keys.free(), keys.nobody_queued()])
                .and_then(granted)
                .or_else(busy);
            // Armed before it is sent: if it lands and the reply is lost,
            // it must still expire on time.
            let expiries = &self.shared.expiries;
            let deadline = at + req.ttl();
            expiries.arm(
                self,
                req.key(),
                holder_key.clone(),
                value.clone(),
                None,
                deadline,
            );
            let reply = self.shared.conn.txn(WHAT, txn, end).await?;
            let rev = revision(&reply, WHAT)?;
            if reply.succeeded() {
                let fence = u64::try_from(rev).map_err(|_| bad_reply(WHAT))?;
                expiries.landed(&holder_key, &value, fence);
                return Ok(Attempt::Acquired(Lease::new(fence, now, now, req.ttl())));
            }
            expiries.disarm_value(&holder_key, &value);
            let snapshot = Snapshot::read(keys, &reply, 0, WHAT)?;
            let queued = match &entry {
                None => None,
                Some(entry) => {
                    let newest = kvs_at(&reply, reply.op_responses().len() - 1, WHAT)?;
                    Some(Queued {
                        entry: entry.clone(),
                        revision: rev,
                        before: newest.get(1).map(|kv| kv.key().to_vec()),
                    })
                }
            };
            match snapshot.holder {
                Some(h) if h.key == holder_key => {
                    // A retry of our own acquisition: same fence, TTL
                    // refreshed (and the entry it just made dropped).
                    if let Some(lease) = self.refresh(req, &h, lease, queued.as_ref(), end).await? {
                        return Ok(Attempt::Acquired(lease));
                    }
                }
                Some(h) => {
                    return Ok(Attempt::Busy {
                        retry_after: h.value.remaining(),
                        queued,
                    });
                }
                None => {
                    // Waiters left without a holder: hand to the oldest,
                    // then see again (we are a newcomer behind them).
                    self.adopt_orphan(keys, snapshot, end).await?;
                    if let Some(queued) = queued {
                        return Ok(Attempt::Busy {
                            retry_after: Duration::ZERO,
                            queued: Some(queued),
                        });
                    }
                }
            }
            if Instant::now() >= end {
                return Err(super::conn::timed_out("acquiring an etcd lock"));
            }
        }
    }

    /// Refresh the TTL of our own acquisition `h`; `None` when it changed
    /// meanwhile.
    async fn refresh(
        &self,
        req: &AcquireRequest,
        h: &HeldKey,
        lease: i64,
        queued: Option<&Queued>,
        end: Instant,
    ) -> Result<Option<Lease>, LockError> {
        let (now, at) = (SystemTime::now(), Instant::now());
        let value = HolderValue {
            expires_ms: crate::time::unix_ms(now).saturating_add(ceil_ms(req.ttl())),
            ttl_ms: ceil_ms(req.ttl()),
            ..h.value.clone()
        }
        .encode();
        let mut ops = vec![TxnOp::put(
            h.key.clone(),
            value.clone(),
            Some(PutOptions::new().with_lease(lease)),
        )];
        if let Some(q) = queued {
            ops.push(TxnOp::delete(q.entry.clone(), None));
        }
        let txn = Txn::new().when([fence_is(&h.key, h.fence)]).and_then(ops);
        let expiries = &self.shared.expiries;
        expiries.arm(
            self,
            req.key(),
            h.key.clone(),
            value.clone(),
            Some(h.fence),
            at + req.ttl(),
        );
        let reply = self.shared.conn.txn("acquire (retry)", txn, end).await?;
        if !reply.succeeded() {
            expiries.disarm_value(&h.key, &value);
            return Ok(None);
        }
        expiries.disarm_others(&h.key, &value);
        Ok(Some(Lease::new(
            h.fence,
            h.value.acquired_at(),
            now,
            req.ttl(),
        )))
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
        let mut ops = vec![delete_range(start.clone(), stop.clone())];
        if self.index_owners {
            ops.push(TxnOp::delete(keys.index(holder.owner()), None));
        }
        let txn = Txn::new()
            .when([
                keys.held_by(holder.owner(), holder.fence()),
                keys.nobody_queued(),
            ])
            .and_then(ops)
            .or_else([keys.get_holder(), keys.get_head()]);
        let reply = self.shared.conn.txn(WHAT, txn, end).await?;
        if reply.succeeded() {
            self.shared.expiries.disarm_range(&start, &stop);
            return Ok(());
        }
        let snapshot = Snapshot::read(&keys, &reply, 0, WHAT)?;
        let Some(h) = snapshot.holder.clone() else {
            self.shared.expiries.disarm_range(&start, &stop);
            return Err(LockError::NotFound);
        };
        if !holder.matches(&h.owner, h.fence) {
            return Err(LockError::OwnershipMismatch);
        }
        let outcome = self
            .pass_on(&keys, snapshot, Giving::Fence(&h.key, h.fence), &[], end)
            .await?;
        self.shared.expiries.disarm_range(&start, &stop);
        match outcome {
            Passed::Done(_) => Ok(()),
            // Released or expired meanwhile.
            Passed::NotHeld => Err(LockError::NotFound),
        }
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
        let (start, stop) = keys.owner_holders(holder.owner());
        // What this process wrote last needs no read; else read it.
        let mut known = self
            .shared
            .expiries
            .known(&start, &stop, holder.fence())
            .and_then(|k| Some((k.key, k.fence, HolderValue::decode(&k.value)?)));
        let lease = self.shared.leases.lease_for(&self.shared, ttl, end).await?;
        for _ in 0..2 {
            let (holder_key, fence, old) = match known.take() {
                Some(k) => k,
                None => {
                    let h = self.snapshot(&keys, end).await?.holder;
                    match h {
                        None => return Err(LockError::NotFound),
                        Some(h) if !holder.matches(&h.owner, h.fence) => {
                            return Err(LockError::OwnershipMismatch);
                        }
                        Some(h) => (h.key, h.fence, h.value),
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
                expiries.disarm_others(&holder_key, &value);
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
        let Some(h) = self.snapshot(&keys, end).await?.holder else {
            return Err(LockError::NotFound);
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
        let new_key = keys.holder(holder.owner(), attempt);
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
            .or_else([keys.get_holder()]);
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
