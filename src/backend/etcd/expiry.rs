//! A lock's TTL, kept by the process that holds it.
//!
//! etcd has no clock a transaction can compare with, and its leases count
//! whole seconds and are reaped up to half a second late; the locks' leases
//! are shared and outlive each lock anyway (see `leases.rs`). So every
//! write that makes or keeps a holder key arms a timer in the writing
//! process for the expiry it reported; when it fires, the lock is released
//! as a release would (handed to the oldest waiter) if the key still holds
//! exactly the value that write stored. Any later write of the key (an
//! extension, a claim, a hand-off) stores another value, so a stale timer
//! changes nothing. A release disarms the timers of its key.
//!
//! A timer is armed *before* its write is sent: a write whose reply is lost
//! (or whose caller went away) must still expire on time, since the
//! lease it is on lives as long as this process. A timer keeps the backend
//! alive until it fires, so a lock outlives a dropped handle only until its
//! TTL. If the process dies or stops, its timers die with it, and etcd
//! frees its locks when their lease runs out: never before the expiry
//! reported.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use tokio::task::AbortHandle;
use tokio::time::{Instant, sleep_until};

use super::handoff::Expire;
use super::keys::LockKeys;
use super::{EtcdBackend, Shared};
use crate::backend::retry::Retry;
use crate::error::LockError;
use crate::key::LockKey;

/// The armed timers, by holder key.
#[derive(Default)]
pub(super) struct Expiries {
    armed: Mutex<BTreeMap<Vec<u8>, Vec<Armed>>>,
}

struct Armed {
    value: Arc<[u8]>,
    fence: Option<u64>,
    /// The revision its write landed at, once known.
    landed: Option<i64>,
    deadline: Instant,
    abort: AbortHandle,
}

/// What this process knows of a lock it armed: the value and fence of its
/// latest write, for an extension that then needs no read.
#[derive(Clone)]
pub(super) struct Known {
    pub(super) key: Vec<u8>,
    pub(super) value: Arc<[u8]>,
    pub(super) fence: u64,
}

impl Expiries {
    /// Arm a timer: at `deadline`, release `holder_key` of `lock` if it
    /// still stores `value`. `fence` is its fence when known (`None` for a
    /// write whose reply was lost).
    pub(super) fn arm(
        &self,
        backend: &EtcdBackend,
        lock: &LockKey,
        holder_key: Vec<u8>,
        value: Vec<u8>,
        fence: Option<u64>,
        deadline: Instant,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Nowhere to run it: the lease frees the lock.
            return;
        };
        let value: Arc<[u8]> = value.into();
        let task = runtime.spawn(fire(
            backend.shared.clone(),
            backend.prefix.clone(),
            backend.op_timeout,
            lock.clone(),
            holder_key.clone(),
            value.clone(),
            deadline,
        ));
        let mut armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        armed.entry(holder_key).or_default().push(Armed {
            value,
            fence,
            landed: None,
            deadline,
            abort: task.abort_handle(),
        });
    }

    /// The write `value` of `key` landed under `fence` (a grant: it made
    /// the key, at revision `fence`).
    pub(super) fn landed(&self, key: &[u8], value: &[u8], fence: u64) {
        let mut armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        for t in armed.get_mut(key).into_iter().flatten() {
            if *t.value == *value {
                t.fence = Some(fence);
                t.landed = i64::try_from(fence).ok();
            }
        }
    }

    /// The write `value` of `key` did not land: its timer goes.
    pub(super) fn disarm_value(&self, key: &[u8], value: &[u8]) {
        let mut armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(timers) = armed.get_mut(key) {
            timers.retain(|t| {
                let stays = *t.value != *value;
                if !stays {
                    t.abort.abort();
                }
                stays
            });
            if timers.is_empty() {
                armed.remove(key);
            }
        }
    }

    /// Disarm every timer of the holder keys in `[start, end)` (one
    /// owner's keys of a lock, or one key).
    pub(super) fn disarm_range(&self, start: &[u8], end: &[u8]) {
        self.disarm_in(start, end, |_| true);
    }

    /// Disarm the timers of the holder keys in `[start, end)` whose write
    /// landed at or before revision `at`: those a deletion of the range at
    /// `at` removed. A timer of a write not known to have landed (`None`:
    /// an acquisition of the same owner under way, or one whose reply was
    /// lost) or that landed after `at` stays: it is not this deletion's (a
    /// stale one, when it fires, finds its key gone and deletes nothing).
    pub(super) fn disarm_through(&self, start: &[u8], end: &[u8], at: i64) {
        self.disarm_in(start, end, |t| {
            t.fence
                .is_some_and(|f| i64::try_from(f).is_ok_and(|f| f <= at))
        });
    }

    /// Disarm the timers of the holder keys in `[start, end)` that `which`
    /// picks.
    fn disarm_in(&self, start: &[u8], end: &[u8], which: impl Fn(&Armed) -> bool) {
        let mut armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        let keys: Vec<Vec<u8>> = armed
            .range(start.to_vec()..end.to_vec())
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            let Some(timers) = armed.get_mut(&key) else {
                continue;
            };
            timers.retain(|t| {
                let goes = which(t);
                if goes {
                    t.abort.abort();
                }
                !goes
            });
            if timers.is_empty() {
                armed.remove(&key);
            }
        }
    }

    /// The write `keep` of `key` (an extension, a refresh) landed at
    /// revision `at`: the timers of writes that landed before it go. One
    /// not known to have landed stays: it may land later still (two
    /// extensions at once, or one whose reply was lost and that lands
    /// after this), and then its value is the one stored; if it never
    /// lands, it finds another value when it fires and changes nothing.
    pub(super) fn disarm_others(&self, key: &[u8], keep: &[u8], at: i64) {
        let mut armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(timers) = armed.get_mut(key) {
            timers.retain_mut(|t| {
                if *t.value == *keep {
                    t.landed = Some(at);
                    return true;
                }
                let goes = t.landed.is_some_and(|l| l < at);
                if goes {
                    t.abort.abort();
                }
                !goes
            });
        }
    }

    /// The latest write this process made of one of `owner`'s holder keys
    /// in `[start, end)` (those `mine` accepts) under `fence` (any fence
    /// when `None`).
    pub(super) fn known(
        &self,
        start: &[u8],
        end: &[u8],
        fence: Option<u64>,
        mine: impl Fn(&[u8]) -> bool,
    ) -> Option<Known> {
        let armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        armed
            .range(start.to_vec()..end.to_vec())
            .filter(|(key, _)| mine(key))
            .find_map(|(key, timers)| {
                let latest = timers
                    .iter()
                    .filter(|t| t.fence.is_some() && fence.is_none_or(|f| t.fence == Some(f)))
                    .max_by_key(|t| t.deadline)?;
                Some(Known {
                    key: key.clone(),
                    value: latest.value.clone(),
                    fence: latest.fence?,
                })
            })
    }

    fn forget(&self, key: &[u8], value: &[u8]) {
        let mut armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(timers) = armed.get_mut(key) {
            timers.retain(|t| *t.value != *value);
            if timers.is_empty() {
                armed.remove(key);
            }
        }
    }

    /// Whether a timer is armed for `key` storing `value`: this process
    /// wrote that very hold (an acquisition it knows it holds).
    pub(super) fn tracks(&self, key: &[u8], value: &[u8]) -> bool {
        let armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        armed
            .get(key)
            .is_some_and(|t| t.iter().any(|t| *t.value == *value))
    }

    /// At `deadline`, delete `key` if it still stores `value` (a flight's
    /// result, no longer kept). Not tracked: nothing disarms it.
    pub(super) fn arm_delete(
        &self,
        backend: &EtcdBackend,
        key: Vec<u8>,
        value: Vec<u8>,
        deadline: Instant,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = backend.clone();
        runtime.spawn(async move {
            sleep_until(deadline).await;
            let mut retry = Retry::new(backend.shared.conn.answers());
            loop {
                let txn = Txn::new()
                    .when([Compare::value(key.clone(), CompareOp::Equal, value.clone())])
                    .and_then([TxnOp::delete(key.clone(), None)]);
                match backend
                    .shared
                    .conn
                    .txn("forgetting a flight result", txn, backend.deadline())
                    .await
                {
                    Err(LockError::BackendUnavailable(_)) => retry.pause().await,
                    _ => return,
                }
            }
        });
    }
}

/// The timer: wait, then release the lock if it is still the write's;
/// tried again while etcd cannot be reached (the lease keeps the lock
/// meanwhile, and freeing it late is safe), at once when the process
/// hears from etcd again (`backend/retry.rs`).
async fn fire(
    shared: Arc<Shared>,
    prefix: Arc<str>,
    op_timeout: Duration,
    lock: LockKey,
    holder_key: Vec<u8>,
    value: Arc<[u8]>,
    deadline: Instant,
) {
    sleep_until(deadline).await;
    let mut retry = Retry::new(shared.conn.answers());
    loop {
        let backend = EtcdBackend {
            shared: shared.clone(),
            prefix: prefix.clone(),
            op_timeout,
            index_owners: false,
        };
        let keys = LockKeys::new(&backend.prefix, &lock);
        let outcome = backend
            .expire(&keys, &holder_key, &value, backend.deadline())
            .await;
        match outcome {
            Err(LockError::BackendUnavailable(e)) => {
                tracing::debug!(key = %lock.digest(), error = %e, "expiring an etcd lock failed; retrying");
                retry.pause().await;
            }
            Ok(Expire::Done | Expire::Gone) | Err(_) => {
                backend.shared.expiries.forget(&holder_key, &value);
                return;
            }
        }
    }
}
