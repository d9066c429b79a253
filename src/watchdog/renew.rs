//! One round of renewals: sent together, each result applied to its lock
//! as it comes.
//!
//! A backend spread over several servers (a Redis Cluster) answers each
//! renewal on its own ([`LockBackend::extend_each`]): a lock whose shard is
//! stalled then holds back nobody else's renewal, and waits for its own
//! answer no longer than the lock lives. Other backends answer the round
//! with one [`LockBackend::extend_many`] call, applied when it returns.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

use super::Dog;
use crate::backend::{ExtendRequest, Lease, LockBackend, join_all};
use crate::error::LockError;

/// A lock due for renewal, its extension gate held until its result is in.
pub(super) struct Due {
    pub(super) id: u64,
    pub(super) gate: OwnedMutexGuard<()>,
    /// The lock's expiry (as the holder sees it) when the round started.
    pub(super) expiry: Instant,
    pub(super) req: ExtendRequest,
}

impl Dog {
    /// Renew `due`, then wake the loop to schedule what comes next.
    pub(super) async fn renew(self: Arc<Self>, due: Vec<Due>) {
        let sent = Instant::now();
        let batch: Vec<ExtendRequest> = due.iter().map(|d| d.req.clone()).collect();
        match self.backend.extend_each(&batch) {
            Some(each) => {
                let this = &self;
                join_all(
                    each.into_iter()
                        .zip(due)
                        .map(|(extend, d)| async move {
                            // Not beyond the lock's life: once it has run
                            // out unrenewed it is lost, answer or not.
                            let result = tokio::time::timeout_at(d.expiry, extend)
                                .await
                                .unwrap_or_else(|_| {
                                    Err(LockError::BackendUnavailable(
                                        "no answer to the renewal before the lock ran out".into(),
                                    ))
                                });
                            this.apply(d, sent, result);
                            // Scheduled at once: the loop sleeps while every
                            // lock is renewing, and another lock's renewal in
                            // this round may wait up to the op timeout (a
                            // stalled shard), longer than a short TTL.
                            this.wake.notify_one();
                        })
                        .collect(),
                )
                .await;
            }
            None => {
                let results = self.backend.extend_many(&batch).await;
                let mut results = results.into_iter();
                for d in due {
                    let result = results
                        .next()
                        .unwrap_or(Err(LockError::BackendUnavailable("no result".into())));
                    self.apply(d, sent, result);
                }
            }
        }
        self.wake.notify_one();
    }

    /// Record one renewal's outcome (sent at `sent`), then let the holder's
    /// own extensions through again (the gate goes with `d`).
    fn apply(&self, d: Due, sent: Instant, result: Result<Lease, LockError>) {
        let mut state = self.state();
        let Some(e) = state.entries.get_mut(&d.id) else {
            return; // released meanwhile: the result means nothing
        };
        e.renewing = false;
        match result {
            Ok(_) => {
                e.meter.renewed();
                // What the backend was told, which `e.ttl` still is: a
                // change by hand waits for the gate.
                let ttl = d.req.ttl;
                e.due = sent + ttl / 3;
                e.signal.set_expiry(sent + ttl);
            }
            Err(err @ (LockError::NotFound | LockError::OwnershipMismatch)) => {
                e.meter.renewal_failed(&err);
                e.meter.lost();
                tracing::warn!(key = %e.key.digest(), "lock lost: renewal found it gone");
                e.signal.mark_lost();
                state.entries.remove(&d.id);
            }
            Err(err) => {
                e.meter.renewal_failed(&err);
                if e.signal.is_lost() {
                    e.meter.lost();
                    tracing::warn!(key = %e.key.digest(), "lock lost: TTL passed without renewal");
                    e.signal.mark_lost();
                    state.entries.remove(&d.id);
                } else {
                    tracing::debug!(key = %e.key.digest(), code = err.code(), "renewal failed; retrying");
                    e.due = Instant::now() + (e.ttl / 10).max(Duration::from_millis(5));
                }
            }
        }
        drop(state);
        drop(d.gate);
    }
}
