//! Taking a lock: one attempt of an acquirer (free, room beside the holds,
//! a retry of its own acquisition, or busy and queued), without waiting;
//! the wait is in `wait.rs`.

use std::time::SystemTime;

use etcd_client::{GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};
use tokio::time::Instant;

use super::EtcdBackend;
use super::conn::bad_reply;
use super::handoff::{Giving, Snapshot};
use super::keys::{HeldKey, HolderValue, LockKeys, Waiter, WaiterValue, ceil_ms};
use super::kinds::{earliest_end, fits, mismatched};
use super::ops::{Attempt, Queued, fence_is, kvs_at, revision};
use crate::backend::Lease;
use crate::error::LockError;
use crate::spec::AcquireRequest;

impl EtcdBackend {
    /// One acquire attempt; `queue` is the entry id of a waiter, which joins
    /// the queue when the lock is busy (never beside holds of another
    /// family: [`LockError::KindMismatch`]).
    pub(super) async fn attempt(
        &self,
        req: &AcquireRequest,
        keys: &LockKeys,
        queue: Option<u64>,
        wait_until: Option<SystemTime>,
        end: Instant,
    ) -> Result<Attempt, LockError> {
        const WHAT: &str = "acquire";
        let kind = req.kind();
        let lease = self
            .shared
            .leases
            .lease_for(&self.shared, req.ttl(), end)
            .await?;
        let holder_key = keys.holder(kind, req.owner(), req.attempt());
        // For a permit: the revision of a read that saw room, nobody queued.
        let mut room_at = None;
        loop {
            let (now, at) = (SystemTime::now(), Instant::now());
            let value = HolderValue::new(now, req.ttl(), kind, req.metadata()).encode();
            let with_lease = || Some(PutOptions::new().with_lease(lease));
            let mut granted = vec![TxnOp::put(holder_key.clone(), value.clone(), with_lease())];
            let mut busy = vec![keys.get_holders(), keys.get_head()];
            let mut joining = Vec::new();
            if self.index_owners {
                let index = TxnOp::put(
                    keys.index(req.owner()),
                    req.key().encoded(usize::MAX),
                    with_lease(),
                );
                granted.push(index.clone());
                if queue.is_some() {
                    joining.push(index);
                } else {
                    busy.push(index);
                }
            }
            let entry = queue.map(|id| keys.waiter(id));
            let waiter = WaiterValue {
                ttl_ms: ceil_ms(req.ttl()),
                attempt: req.attempt(),
                deadline_ms: crate::time::unix_ms(wait_until.unwrap_or(now)),
                owner: req.owner().to_owned(),
                kind,
                metadata: req.metadata().cloned(),
            };
            if let Some(entry) = &entry {
                joining.push(TxnOp::put(entry.clone(), waiter.encode(), with_lease()));
                let (start, stop) = keys.queue();
                // The newest two entries: this one and the one before it.
                joining.push(TxnOp::get(
                    start,
                    Some(
                        GetOptions::new()
                            .with_range(stop)
                            .with_sort(SortTarget::Create, SortOrder::Descend)
                            .with_limit(2)
                            .with_keys_only(),
                    ),
                ));
                // Queued only beside holds of its own family.
                let join = Txn::new()
                    .when(keys.no_other_family(kind))
                    .and_then(joining);
                busy.push(TxnOp::txn(join));
            }
            let when = keys.grant_when(kind, &holder_key, room_at);
            let txn = Txn::new().when(when).and_then(granted).or_else(busy);
            let granting = (holder_key.as_slice(), value.as_slice());
            let reply = match self
                .grant_txn(WHAT, req, granting, (now, at), txn, end)
                .await?
            {
                Ok(lease) => return Ok(Attempt::Acquired(lease)),
                Err(reply) => reply,
            };
            let rev = revision(&reply, WHAT)?;
            let mut snapshot = Snapshot::read(keys, &reply, 0, WHAT)?;
            let queued = match &entry {
                None => None,
                Some(entry) => match reply.op_responses().last() {
                    Some(TxnOpResponse::Txn(joined)) if joined.succeeded() => {
                        let last = joined.op_responses().len() - 1;
                        let newest = kvs_at(joined, last, WHAT)?;
                        Some(Queued {
                            entry: entry.clone(),
                            revision: rev,
                            before: newest.get(1).map(|kv| kv.key().to_vec()),
                        })
                    }
                    Some(TxnOpResponse::Txn(_)) => None,
                    _ => return Err(bad_reply(WHAT)),
                },
            };
            let retry_after = earliest_end(&snapshot.holders);
            if let Some(h) = snapshot.hold(&holder_key).cloned() {
                // A retry of our own acquisition: same fence, TTL
                // refreshed (and the entry it just made dropped).
                if let Some(lease) = self.refresh(req, &h, lease, queued.as_ref(), end).await? {
                    return Ok(Attempt::Acquired(lease));
                }
            } else if mismatched(kind, &snapshot.holders) {
                // Held by another family: refused, and never queued (the
                // nested compare saw the same holds).
                return Err(LockError::KindMismatch);
            } else if snapshot.head.is_some() || !fits(kind, &snapshot.holders) {
                // Waiters left at the head of the queue that fit beside the
                // holds (an orphaned queue): grant them, then see again (we
                // are a newcomer behind them).
                if !self.adopt_orphan(keys, snapshot, end).await? || queued.is_some() {
                    return Ok(Attempt::Busy {
                        retry_after,
                        queued,
                    });
                }
            } else if let (Some(q), Some(entry)) = (&queued, entry) {
                // Room beside the holds and nobody was queued before us (a
                // permit): we are the head; grant it to ourselves, which
                // the wait sees on its watch.
                snapshot.head = Some(Waiter {
                    key: entry,
                    mod_revision: q.revision,
                    lease,
                    value: waiter,
                });
                self.pass_on(keys, snapshot, Giving::Nothing, &[], end)
                    .await?;
                return Ok(Attempt::Busy {
                    retry_after,
                    queued,
                });
            } else {
                // Room beside the holds, nobody queued (a permit): take it
                // if no hold came since.
                room_at = Some(snapshot.at);
            }
            if Instant::now() >= end {
                return Err(super::conn::timed_out("acquiring an etcd lock"));
            }
        }
    }

    /// Make `h`, handed to another call of `req`'s request (its twin, here
    /// or in another process) through that call's queue entry, this call's:
    /// refreshed on our lease. Rewritten, it is no longer a grant that the
    /// other call's leave gives back (it gives back no hold written since
    /// its hand-off), and on our lease it lasts as long as we live, not as
    /// long as the other process does. `None` when it changed meanwhile
    /// (that leave gave it back first).
    pub(super) async fn take_over(
        &self,
        req: &AcquireRequest,
        h: &HeldKey,
        end: Instant,
    ) -> Result<Option<Lease>, LockError> {
        let lease = self
            .shared
            .leases
            .lease_for(&self.shared, req.ttl(), end)
            .await?;
        self.refresh(req, h, lease, None, end).await
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
        let mut fresh = HolderValue {
            expires_ms: crate::time::unix_ms(now).saturating_add(ceil_ms(req.ttl())),
            ttl_ms: ceil_ms(req.ttl()),
            ..h.value.clone()
        };
        // Every write of a holder key stores a new value (values.rs): a
        // give-back or an expiry conditioned on the value read must fail
        // once the hold was refreshed, even in the millisecond it was made.
        if fresh.encode() == h.raw_value {
            fresh.expires_ms += 1;
        }
        let value = fresh.encode();
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
        expiries.disarm_others(&h.key, &value, revision(&reply, "acquire (retry)")?);
        Ok(Some(Lease::new(
            h.fence,
            h.value.acquired_at(),
            now,
            req.ttl(),
        )))
    }
}
