//! Single-flight on etcd (see [`FlightStart`]): the flight's lock is a lock
//! like any other under its `f:` key; its latest result is the key `…/r`,
//! `"<seq> <fresh until ms>\n"` and the result's bytes, on a lease of its
//! own that ends when the result is no longer kept. Callers that wait for
//! the result watch that key (see `flight_wait`): the result's put wakes
//! them with its value, and nothing published after the begin is missed. A begin is one transaction (two when a stale result
//! must be checked again), a publish one transaction, as a release.

use std::time::SystemTime;

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

use super::EtcdBackend;
use super::handoff::{Giving, Passed, Snapshot, delete_range};
use super::keys::{HolderValue, ceil_ms};
use super::ops::{kvs_at, revision};
use super::watch::Note;
use crate::backend::{FlightPublish, FlightResult, FlightStart, FlightWait};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::{AcquireRequest, MAX_TTL};
use crate::time::unix_ms;

fn gone() -> LockError {
    LockError::BackendUnavailable("the flight's wake-up is gone".into())
}

/// A stored result: its seq, until when it answers new callers (ms), its
/// bytes.
fn decode(kv: &KeyValue) -> Option<(u64, u64, &[u8])> {
    let value = kv.value();
    let split = value.iter().position(|&b| b == b'\n')?;
    let head = std::str::from_utf8(&value[..split]).ok()?;
    let (seq, fresh) = head.split_once(' ')?;
    Some((seq.parse().ok()?, fresh.parse().ok()?, &value[split + 1..]))
}

impl EtcdBackend {
    pub(super) async fn flight_begin_inner(
        &self,
        req: &AcquireRequest,
    ) -> Result<FlightStart, LockError> {
        const WHAT: &str = "flight begin";
        let keys = self.keys(req.key());
        let end = self.deadline();
        let lease = self
            .shared
            .leases
            .lease_for(&self.shared, req.ttl(), end)
            .await?;
        // A flight's leader holds its lock exclusive, whatever the request.
        let exclusive = crate::spec::LockKind::Exclusive;
        let holder_key = keys.holder(exclusive, req.owner(), req.attempt());
        let result_key = keys.result();
        // First: no result at all; then: the stale result seen (unchanged).
        let mut no_newer = Compare::version(result_key.clone(), CompareOp::Equal, 0);
        for _ in 0..4 {
            let (now, at) = (SystemTime::now(), Instant::now());
            let value = HolderValue::new(now, req.ttl(), exclusive, req.metadata()).encode();
            let txn = Txn::new()
                .when([no_newer.clone(), keys.free(), keys.nobody_queued()])
                .and_then([TxnOp::put(
                    holder_key.clone(),
                    value.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                )])
                .or_else([
                    keys.get_holders(),
                    keys.get_head(),
                    TxnOp::get(result_key.clone(), None),
                ]);
            let granting = (holder_key.as_slice(), value.as_slice());
            let reply = match self
                .grant_txn(WHAT, req, granting, (now, at), txn, end)
                .await?
            {
                Ok(lease) => return Ok(FlightStart::Leader(lease)),
                Err(reply) => reply,
            };
            let rev = revision(&reply, WHAT)?;
            let stored = kvs_at(&reply, 2, WHAT)?;
            let stored = stored.first();
            let result = stored.and_then(decode);
            if let Some((seq, fresh_ms, bytes)) = result
                && fresh_ms > unix_ms(SystemTime::now())
            {
                return Ok(FlightStart::Fresh(FlightResult {
                    seq,
                    value: bytes.into(),
                }));
            }
            let snapshot = Snapshot::read(&keys, &reply, 0, WHAT)?;
            if !snapshot.holders.is_empty() {
                let seen = result.map_or(0, |(seq, _, _)| seq);
                return self
                    .flight_wait(req.key(), result_key, seen, rev, end)
                    .await;
            }
            if snapshot.head.is_some() {
                self.adopt_orphan(&keys, snapshot, end).await?;
                continue;
            }
            // Free, with a result no longer fresh: lead, if that result is
            // still the newest.
            no_newer = match stored {
                Some(kv) => {
                    Compare::mod_revision(result_key.clone(), CompareOp::Equal, kv.mod_revision())
                }
                None => Compare::version(result_key.clone(), CompareOp::Equal, 0),
            };
        }
        Err(super::conn::timed_out("beginning an etcd flight"))
    }

    /// A caller's wait for the next result with a seq above `seen`,
    /// published after the revision `rev` (the begin's).
    ///
    /// Watched from when etcd sets the watch up (a watch from a past
    /// revision starts unsynced: etcd delivers its events only on its next
    /// catch-up pass, every 100 ms). When the revision moved between the
    /// begin and then, a second watch from the revision after the begin
    /// covers that gap: a result published (and maybe removed) in it still
    /// reaches the caller, on that pass.
    async fn flight_wait(
        &self,
        key: &LockKey,
        result_key: Vec<u8>,
        seen: u64,
        rev: i64,
        end: Instant,
    ) -> Result<FlightStart, LockError> {
        let mut watch = self
            .shared
            .watches
            .watch(&self.shared, result_key.clone(), None, None, end)
            .await?;
        let _ = key;
        let this = self.clone();
        Ok(FlightStart::Busy(FlightWait {
            seen,
            result: Box::pin(async move {
                let mut gap: Option<super::watch::Watch> = None;
                loop {
                    let note = match gap.as_mut() {
                        None => watch.next().await,
                        Some(gap) => tokio::select! {
                            note = watch.next() => note,
                            note = gap.next() => note,
                        },
                    };
                    match note {
                        Note::Created(at) if at > rev && gap.is_none() => {
                            let end = this.deadline();
                            let shared = &this.shared;
                            let from = Some(rev + 1);
                            let key = result_key.clone();
                            gap = Some(shared.watches.watch(shared, key, None, from, end).await?);
                        }
                        Note::Created(_) => {}
                        Note::Events(events) => {
                            for (put, kv) in &events {
                                if let Some((seq, _, bytes)) = put.then(|| decode(kv)).flatten()
                                    && seq > seen
                                {
                                    return Ok(FlightResult {
                                        seq,
                                        value: bytes.into(),
                                    });
                                }
                            }
                        }
                        Note::Gone => return Err(gone()),
                    }
                }
            }),
        }))
    }

    pub(super) async fn flight_result_inner(
        &self,
        key: &LockKey,
    ) -> Result<Option<FlightResult>, LockError> {
        const WHAT: &str = "flight result";
        let keys = self.keys(key);
        let txn = Txn::new().and_then([TxnOp::get(keys.result(), None)]);
        let reply = self.shared.conn.txn(WHAT, txn, self.deadline()).await?;
        let stored = kvs_at(&reply, 0, WHAT)?;
        Ok(stored
            .first()
            .and_then(decode)
            .map(|(seq, _, bytes)| FlightResult {
                seq,
                value: bytes.into(),
            }))
    }

    pub(super) async fn flight_publish_inner(
        &self,
        key: &LockKey,
        owner: &str,
        publish: &FlightPublish,
    ) -> Result<(), LockError> {
        const WHAT: &str = "flight publish";
        let keys = self.keys(key);
        let end = self.deadline();
        // Kept by this process's timer until `keep` ends, on its lease as
        // the backstop (as a lock's TTL), so that a publish is one
        // transaction, as a release.
        let keep = publish.keep.max(publish.result_ttl).min(MAX_TTL);
        let lease = self
            .shared
            .leases
            .lease_for(&self.shared, keep, end)
            .await?;
        let kept_until = Instant::now() + keep;
        let now_ms = unix_ms(SystemTime::now());
        let fresh_ms = if publish.result_ttl.is_zero() {
            0
        } else {
            now_ms.saturating_add(ceil_ms(publish.result_ttl.min(MAX_TTL)))
        };
        let mut value = format!("{} {fresh_ms}\n", publish.fence).into_bytes();
        value.extend_from_slice(&publish.value);
        let store = TxnOp::put(
            keys.result(),
            value.clone(),
            Some(PutOptions::new().with_lease(lease)),
        );
        // Armed before it is sent (it may land with its reply lost); it
        // deletes only this very result.
        let expiries = &self.shared.expiries;
        expiries.arm_delete(self, keys.result(), value.clone(), kept_until);
        let (start, stop) = keys.owner_holders(owner);
        let txn = Txn::new()
            .when([
                keys.held_by(owner, Some(publish.fence)),
                keys.nobody_queued(),
            ])
            .and_then([store.clone(), delete_range(start.clone(), stop.clone())])
            .or_else([keys.get_holders(), keys.get_head()]);
        let reply = self.shared.conn.txn(WHAT, txn, end).await?;
        if reply.succeeded() {
            self.shared.expiries.disarm_range(&start, &stop);
            // Nobody was queued for the lock: the callers watching for the
            // result got it from the put itself (their watches start before
            // it), so it is kept for its result TTL alone, and not at all
            // without one.
            if publish.result_ttl.is_zero() {
                let forget = Txn::new()
                    .when([Compare::value(keys.result(), CompareOp::Equal, value)])
                    .and_then([TxnOp::delete(keys.result(), None)]);
                self.shared.conn.txn(WHAT, forget, end).await?;
            } else if publish.result_ttl < keep {
                let until = Instant::now() + publish.result_ttl;
                expiries.arm_delete(self, keys.result(), value, until);
            }
            return Ok(());
        }
        let snapshot = Snapshot::read(&keys, &reply, 0, WHAT)?;
        let Some(h) = snapshot.holders.first().cloned() else {
            return Err(LockError::NotFound);
        };
        if !crate::spec::owners_match(&h.owner, owner) || h.fence != publish.fence {
            return Err(LockError::OwnershipMismatch);
        }
        let from = Giving::Fence(&h.key, h.fence);
        let passed = self.pass_on(&keys, snapshot, from, &[store], end).await?;
        self.disarm_released(&h);
        match passed {
            Passed::Done => Ok(()),
            Passed::NotHeld => Err(LockError::NotFound),
        }
    }
}

#[cfg(test)]
#[path = "flight_gap_test.rs"]
mod gap_test;
