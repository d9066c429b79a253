//! Giving a lock back: to nobody when nobody waits, else straight to the
//! oldest waiter when it fits beside the holds left, in one transaction
//! that deletes the holder's key and the waiter's entry and creates the
//! waiter's holder key (on the waiter's own lease). The new key's create
//! revision is the new fence: greater than every revision before it, so
//! than every fence the lock had. Then every following waiter that fits
//! beside the holds (consecutive shared waiters, permits while there is
//! room) is granted the same way, one transaction each.
//!
//! Every such transaction is conditioned on what was read: the holder is
//! still the one being released (by fence, or by the exact value an expiry
//! was armed for), the waiter is still the oldest (its entry unchanged:
//! no older entry can appear, new ones are younger), and no hold was made
//! or written since the read. When any changed, the state is read again
//! and the step retried, within the op timeout.

use etcd_client::{Compare, CompareOp, DeleteOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use tokio::time::Instant;

use super::EtcdBackend;
use super::conn::{bad_reply, timed_out};
use super::keys::{HeldKey, HolderValue, LockKeys, Waiter};
use super::kinds::fits;
use crate::error::LockError;
use crate::spec::LockKind;

/// The holders and the oldest waiter of a lock, as one read saw them.
#[derive(Clone, Debug, Default)]
pub(super) struct Snapshot {
    /// Oldest grant first.
    pub(super) holders: Vec<HeldKey>,
    pub(super) head: Option<Waiter>,
    /// The revision read at.
    pub(super) at: i64,
}

impl Snapshot {
    /// From the two reads (`get_holders`, `get_head`) at `at` in `reply`.
    pub(super) fn read(
        keys: &LockKeys,
        reply: &TxnResponse,
        at: usize,
        what: &str,
    ) -> Result<Self, LockError> {
        let ops = reply.op_responses();
        let (Some(TxnOpResponse::Get(holders)), Some(TxnOpResponse::Get(head))) =
            (ops.get(at), ops.get(at + 1))
        else {
            return Err(bad_reply(what));
        };
        let holders = holders
            .kvs()
            .iter()
            .map(|kv| HeldKey::from_kv(keys, kv).ok_or_else(|| bad_reply(what)))
            .collect::<Result<_, _>>()?;
        let head = match head.kvs().first() {
            None => None,
            Some(kv) => Some(Waiter::from_kv(kv).ok_or_else(|| bad_reply(what))?),
        };
        Ok(Snapshot {
            holders,
            head,
            at: super::ops::revision(reply, what)?,
        })
    }

    /// The first hold `holder` names.
    pub(super) fn find(&self, holder: crate::backend::Holder<'_>) -> Option<&HeldKey> {
        self.holders
            .iter()
            .find(|h| holder.matches(&h.owner, h.fence))
    }

    /// The hold under holder key `key`.
    pub(super) fn hold(&self, key: &[u8]) -> Option<&HeldKey> {
        self.holders.iter().find(|h| h.key == key)
    }
}

/// Which holds a hand-off gives back.
#[derive(Clone, Copy)]
pub(super) enum Giving<'a> {
    /// The holder key under this fence (a release).
    Fence(&'a [u8], u64),
    /// The holder key while it stores this value (an expiry).
    Value(&'a [u8], &'a [u8]),
    /// Every hold read (a force release), if none was made or written since.
    All,
    /// None: waiters at the head of the queue fit beside the holds (an
    /// orphaned queue whose holders' leases ran out, or one left behind),
    /// granted by whoever sees them first.
    Nothing,
}

impl Giving<'_> {
    fn condition(&self, keys: &LockKeys, at: i64) -> Option<Compare> {
        match *self {
            Giving::Fence(key, fence) => Some(super::ops::fence_is(key, fence)),
            Giving::Value(key, value) => Some(Compare::value(key, CompareOp::Equal, value)),
            Giving::All => Some(keys.holds_unchanged_since(at)),
            Giving::Nothing => None,
        }
    }

    /// Whether `h` (as read) is given back.
    fn gives(&self, h: &HeldKey) -> bool {
        match *self {
            Giving::Fence(key, fence) => h.key == key && h.fence == fence,
            Giving::Value(key, value) => h.key == key && h.raw_value == value,
            Giving::All => true,
            Giving::Nothing => false,
        }
    }

    /// Whether what is given back is still held as read.
    fn holds(&self, holders: &[HeldKey]) -> bool {
        match self {
            Giving::All => !holders.is_empty(),
            Giving::Nothing => true,
            _ => holders.iter().any(|h| self.gives(h)),
        }
    }
}

/// How a hand-off ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Passed {
    /// Given back: freed, or handed to waiters.
    Done,
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
    /// Give back what `from` holds (`snapshot`: the state read last), then
    /// grant the oldest live waiter if it fits beside the holds left, and
    /// every following one that fits, one transaction each (each grant's
    /// revision is its fence). `extra` runs in the first transaction (a
    /// flight's result).
    pub(super) async fn pass_on(
        &self,
        keys: &LockKeys,
        mut snapshot: Snapshot,
        from: Giving<'_>,
        extra: &[TxnOp],
        end: Instant,
    ) -> Result<Passed, LockError> {
        const WHAT: &str = "hand-off";
        // Once given back, only grants are left to make.
        let mut from = from;
        let mut given = matches!(from, Giving::Nothing);
        loop {
            if Instant::now() >= end {
                return Err(timed_out("handing an etcd lock over"));
            }
            if !from.holds(&snapshot.holders) {
                return Ok(if given { Passed::Done } else { Passed::NotHeld });
            }
            let (gone, left): (Vec<&HeldKey>, Vec<&HeldKey>) =
                snapshot.holders.iter().partition(|h| from.gives(h));
            let head = snapshot.head.take();
            let queued = head.is_some();
            let head = match head {
                Some(w) if w.value.is_past() || holds_already(&snapshot.holders, &w, keys) => {
                    // A waiter whose max wait is over, or an acquisition
                    // queued behind itself (a retry whose reply was lost):
                    // not a waiter to hand to.
                    self.drop_waiter(keys, &w, end).await?;
                    snapshot = self.snapshot(keys, end).await?;
                    continue;
                }
                Some(w) if fits(w.value.kind, left.iter().copied()) => Some(w),
                _ => None,
            };
            let mut ops: Vec<TxnOp> = if given { Vec::new() } else { extra.to_vec() };
            // Whether an owner index entry goes, decided from the holds read.
            let mut unindexed = false;
            for h in &gone {
                ops.push(TxnOp::delete(h.key.clone(), None));
                // (The index entry stays while the owner holds or is
                // handed another hold of the lock.)
                let kept = left.iter().any(|l| l.owner == h.owner)
                    || head.as_ref().is_some_and(|w| w.value.owner == h.owner);
                if !kept {
                    ops.push(TxnOp::delete(keys.index(&h.owner), None));
                    unindexed |= self.index_owners;
                }
            }
            let mut when: Vec<Compare> = from.condition(keys, snapshot.at).into_iter().collect();
            let reread = [keys.get_holders(), keys.get_head()];
            let Some(head) = head else {
                if given {
                    return Ok(Passed::Done);
                }
                // Nobody to grant: give back (with nobody queued, unless
                // a waiter came: then read again and grant it).
                if !queued {
                    when.push(keys.nobody_queued());
                }
                let txn = Txn::new().when(when).and_then(ops).or_else(reread);
                let reply = self.shared.conn.txn(WHAT, txn, end).await?;
                if reply.succeeded() {
                    if !queued {
                        self.shared.passing.forget(keys);
                    }
                    return Ok(Passed::Done);
                }
                snapshot = Snapshot::read(keys, &reply, 0, WHAT)?;
                continue;
            };
            let value = HolderValue::new(
                std::time::SystemTime::now(),
                std::time::Duration::from_millis(head.value.ttl_ms),
                head.value.kind,
                head.value.metadata.as_ref(),
            );
            ops.push(TxnOp::delete(head.key.clone(), None));
            ops.push(TxnOp::put(
                head.holder_key(keys),
                value.encode(),
                Some(etcd_client::PutOptions::new().with_lease(head.lease)),
            ));
            let read_at = ops.len();
            ops.extend(reread.clone());
            when.push(Compare::mod_revision(
                head.key.clone(),
                CompareOp::Equal,
                head.mod_revision,
            ));
            // No hold came since the read: the head fits beside what is
            // held (holds that went away since only leave more room). Not
            // needed when one permit passes straight to a waiter for a
            // permit of the same `n`: the holds stay as many as they were,
            // whatever came or went since (none of another family can be
            // beside the permit the condition above finds); with several
            // holders releasing at once, each one's grant failed the
            // others' transactions, a Raft commit each (etcd permits4).
            // Unless an owner index entry goes: whether it may was decided
            // from the holds read.
            let swap = !given
                && !unindexed
                && matches!(head.value.kind, LockKind::Permits(_))
                && matches!(&gone[..], [h] if h.kind == head.value.kind);
            // Nor when an exclusive hold goes that was alone: while the
            // condition above finds it held, no other hold can have come
            // beside it (a range compare walks every key of the holders'
            // range that etcd has not compacted yet, on every member, on
            // every hand-off's path).
            let alone = !given
                && !unindexed
                && left.is_empty()
                && matches!(&gone[..], [h] if h.kind == LockKind::Exclusive);
            if !swap && !alone {
                when.push(keys.holds_unchanged_since(snapshot.at));
            }
            let txn = Txn::new().when(when).and_then(ops).or_else(reread);
            match self.shared.conn.txn_with_lease(WHAT, txn, end).await? {
                Ok(reply) if reply.succeeded() => {
                    given = true;
                    from = Giving::Nothing;
                    snapshot = Snapshot::read(keys, &reply, read_at, WHAT)?;
                    if let Some(h) = snapshot.hold(&head.holder_key(keys)) {
                        self.shared.near.grant(&head.key, h.clone(), head.lease);
                    }
                    // The next waiter is told it is the oldest only if it
                    // must wait (it does not fit beside the holds): one that
                    // fits is this loop's next grant, and should that
                    // grant not be made (an error, the deadline), its own
                    // watch on the entry just deleted wakes it to read and
                    // take what it fits beside. Told, it would watch the
                    // holders instead, which need not change.
                    if let Some(next) = &snapshot.head
                        && !fits(next.value.kind, snapshot.holders.iter())
                    {
                        self.shared.near.head(&next.key, snapshot.at);
                    }
                    self.shared.handed.keep(keys, &snapshot);
                    self.shared.passing.keep(keys, &snapshot);
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
        let txn = Txn::new().and_then([keys.get_holders(), keys.get_head()]);
        let reply = self.shared.conn.txn("reading a lock", txn, end).await?;
        Snapshot::read(keys, &reply, 0, "reading a lock")
    }

    /// A queue whose head fits beside the holds (an orphaned queue: no
    /// holder, waiters left; or a waiter left behind): grant it. What a
    /// newcomer, a status and a waiter do when they see one. Whether there
    /// was one.
    pub(super) async fn adopt_orphan(
        &self,
        keys: &LockKeys,
        snapshot: Snapshot,
        end: Instant,
    ) -> Result<bool, LockError> {
        let stranded = snapshot
            .head
            .as_ref()
            .is_some_and(|w| fits(w.value.kind, &snapshot.holders));
        if stranded {
            self.pass_on(keys, snapshot, Giving::Nothing, &[], end)
                .await?;
        }
        Ok(stranded)
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
            .or_else([keys.get_holders(), keys.get_head()]);
        let reply = self.shared.conn.txn(WHAT, txn, end).await?;
        if reply.succeeded() {
            return Ok(Expire::Done);
        }
        let snapshot = Snapshot::read(keys, &reply, 0, WHAT)?;
        match self
            .pass_on(keys, snapshot, Giving::Value(holder_key, value), &[], end)
            .await?
        {
            Passed::Done => Ok(Expire::Done),
            Passed::NotHeld => Ok(Expire::Gone),
        }
    }
}

/// The state each lock's last hand-off in this process left behind (read
/// in the hand-off's own transaction, after its grant), while waiters stay
/// queued behind the new holder: its release starts from it and gives the
/// lock to the next waiter in one transaction, instead of reading first (a
/// failed conditional release) and handing off after (a second Raft
/// commit on the path from hold to hold). A state gone stale (the waiter
/// left, a hold changed) only fails that transaction's conditions, whose
/// failure branch reads the state afresh: no more than the read it saves.
#[derive(Default)]
pub(super) struct Handed(std::sync::Mutex<std::collections::HashMap<Vec<u8>, Snapshot>>);

/// Locks whose last hand-off state is kept; beyond, the map starts over
/// (a state is only a head start: any may go).
pub(super) const HANDED_MAX: usize = 1024;

impl Handed {
    /// Keep `snapshot` (a hand-off's state after its grant) for the next
    /// release of the lock, if it shows one exclusive holder with someone
    /// waiting behind. (Not for shared holds and permits: a hold given back
    /// beside others also decides, from the holds read, whether its owner's
    /// index entry goes, and other holds come and go between.)
    fn keep(&self, keys: &LockKeys, snapshot: &Snapshot) {
        let exclusive = matches!(&snapshot.holders[..], [h] if h.kind == LockKind::Exclusive);
        if snapshot.head.is_none() || !exclusive {
            return;
        }
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= HANDED_MAX {
            map.clear();
        }
        map.insert(keys.holders().0, snapshot.clone());
    }

    /// The kept state of the lock, if it shows `holder`'s exclusive hold
    /// and a waiter behind it (taken: one release uses it).
    pub(super) fn take(
        &self,
        keys: &LockKeys,
        holder: crate::backend::Holder<'_>,
    ) -> Option<(Snapshot, HeldKey)> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = keys.holders().0;
        let h = map.get(&key)?.find(holder)?.clone();
        map.remove(&key).map(|snapshot| (snapshot, h))
    }
}

/// Whether waiter `w`'s acquisition holds already (a retry of it queued).
fn holds_already(holders: &[HeldKey], w: &Waiter, keys: &LockKeys) -> bool {
    let key = w.holder_key(keys);
    holders.iter().any(|h| h.key == key)
}

/// Delete `[start, end)`.
pub(super) fn delete_range(start: Vec<u8>, end: Vec<u8>) -> TxnOp {
    TxnOp::delete(start, Some(DeleteOptions::new().with_range(end)))
}
