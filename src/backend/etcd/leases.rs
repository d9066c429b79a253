//! The leases keys are written under: one per backend (and its clones) and
//! TTL bucket, granted on first use and kept alive every 500 ms while the
//! backend lives.
//!
//! A lease is what frees a lock whose holder's process died or stopped: etcd
//! deletes every key of a lease its owner stopped renewing. A lease grant is
//! a Raft write like the lock itself, so one per acquisition would double the
//! cost of a lock; a lock's own TTL is kept by the holder's process instead
//! (see `expiry.rs`), and the lease only has to outlive it. So a key with TTL
//! `t` goes on the lease of the smallest bucket of at least `t` + 1 s (whole
//! seconds: etcd counts leases in seconds), and that lease is used only while
//! its known expiry (the last keep-alive sent, plus its TTL) lies at least
//! `t` ahead: if this process stops, its locks are freed one bucket TTL after
//! its last keep-alive, never before their own expiry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, sleep, timeout, timeout_at};

use super::Shared;
use super::conn::{etcd_error, lease_not_found, timed_out};
use crate::error::LockError;

/// How often a lease is kept alive.
const KEEP_ALIVE_EVERY: Duration = Duration::from_millis(500);
/// How far a lease's known expiry must lie beyond a key's own for it to be
/// used (covers the time to send the write).
const MARGIN: Duration = Duration::from_millis(200);

/// The backend's leases, by bucket TTL (seconds).
#[derive(Default)]
pub(super) struct Leases {
    buckets: Mutex<HashMap<u64, Arc<Bucket>>>,
}

#[derive(Default)]
struct Bucket {
    state: Mutex<State>,
    changed: Notify,
}

#[derive(Default)]
struct State {
    /// The lease in use, `None` before the first grant and after it died.
    lease: Option<Live>,
    /// A grant is under way (others wait for it).
    granting: bool,
    /// The keep-alive task runs.
    keeping: bool,
}

#[derive(Clone, Copy)]
struct Live {
    id: i64,
    ttl: Duration,
    /// The last keep-alive (or the grant) sent that etcd confirmed, plus
    /// the lease's TTL: etcd keeps the lease at least until then.
    known_until: Instant,
}

/// The bucket TTL for a key that must live `ttl`: the smallest of 2, 3, 4,
/// 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, … seconds of at least `ttl` + 1 s,
/// so that a process uses few leases whatever TTLs it asks for.
pub(super) fn bucket_secs(ttl: Duration) -> u64 {
    const STEPS: [u64; 10] = [10, 12, 15, 20, 25, 30, 40, 50, 60, 80];
    let need = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0) + 1;
    let mut scale = 1u64;
    loop {
        for step in STEPS {
            let secs = step.saturating_mul(scale) / 10;
            if secs >= need.max(2) {
                return secs;
            }
        }
        if scale > u64::MAX / 100 {
            return need;
        }
        scale *= 10;
    }
}

impl Leases {
    fn bucket(&self, secs: u64) -> Arc<Bucket> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets.entry(secs).or_default().clone()
    }

    /// The lease the key of a lock with TTL `ttl` goes on: one etcd keeps
    /// at least `ttl` from now. Granted on first use (one round trip);
    /// [`LockError::BackendUnavailable`] when etcd cannot confirm one
    /// before `end`.
    pub(super) async fn lease_for(
        &self,
        shared: &Arc<Shared>,
        ttl: Duration,
        end: Instant,
    ) -> Result<i64, LockError> {
        let secs = bucket_secs(ttl);
        let bucket = self.bucket(secs);
        loop {
            let changed = bucket.changed.notified();
            let grant = {
                let mut state = bucket.state.lock().unwrap_or_else(|e| e.into_inner());
                match state.lease {
                    Some(live) if live.known_until >= Instant::now() + ttl + MARGIN => {
                        return Ok(live.id);
                    }
                    None if !state.granting => {
                        state.granting = true;
                        true
                    }
                    // A keep-alive (or another caller's grant) is due.
                    _ => false,
                }
            };
            if grant {
                // Should this call be dropped mid-grant, the next one grants.
                let mut abandoned = Abandoned(Some(&bucket));
                let granted = grant_lease(shared, secs, end).await;
                abandoned.0 = None;
                let mut state = bucket.state.lock().unwrap_or_else(|e| e.into_inner());
                state.granting = false;
                if let Ok(live) = granted {
                    state.lease = Some(live);
                    if !state.keeping {
                        state.keeping = true;
                        tokio::spawn(keep_alive(Arc::downgrade(shared), bucket.clone()));
                    }
                }
                drop(state);
                bucket.changed.notify_waiters();
                let id = granted?.id;
                return Ok(id);
            }
            if timeout_at(end, changed).await.is_err() {
                return Err(timed_out("waiting for an etcd lease keep-alive"));
            }
        }
    }

    /// Until when etcd keeps lease `id` at least, if it is one of ours and
    /// alive.
    pub(super) fn known_until(&self, id: i64) -> Option<Instant> {
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets.values().find_map(|b| {
            let state = b.state.lock().unwrap_or_else(|e| e.into_inner());
            state.lease.filter(|l| l.id == id).map(|l| l.known_until)
        })
    }
}

async fn grant_lease(shared: &Arc<Shared>, secs: u64, end: Instant) -> Result<Live, LockError> {
    let sent = Instant::now();
    let ttl = i64::try_from(secs).unwrap_or(i64::MAX);
    let reply = shared
        .conn
        .call("granting an etcd lease", end, |c| async move {
            c.lease_client().grant(ttl, None).await
        })
        .await?;
    // etcd may raise a short TTL to its minimum: count what it granted.
    let ttl = Duration::from_secs(u64::try_from(reply.ttl()).unwrap_or(0));
    if ttl.is_zero() {
        return Err(LockError::BackendUnavailable(
            "etcd granted a lease without TTL".into(),
        ));
    }
    Ok(Live {
        id: reply.id(),
        ttl,
        known_until: sent + ttl,
    })
}

/// Keep the bucket's lease alive every [`KEEP_ALIVE_EVERY`] while the
/// backend lives, over one keep-alive stream (opened again when it breaks).
/// A lease etcd no longer has is dropped from the bucket: the next key
/// gets a new one.
async fn keep_alive(shared: Weak<Shared>, bucket: Arc<Bucket>) {
    let mut stream: Option<(
        i64,
        etcd_client::LeaseKeeper,
        etcd_client::LeaseKeepAliveStream,
    )> = None;
    loop {
        sleep(KEEP_ALIVE_EVERY).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let current = {
            let state = bucket.state.lock().unwrap_or_else(|e| e.into_inner());
            state.lease
        };
        let Some(live) = current else {
            stream = None;
            continue;
        };
        let sent = Instant::now();
        let end = sent + KEEP_ALIVE_EVERY * 2;
        let outcome = match &mut stream {
            Some((id, keeper, replies)) if *id == live.id => refresh(keeper, replies, end).await,
            _ => {
                // Opening the stream sends the first keep-alive and reads
                // its answer.
                let opened = shared
                    .conn
                    .call_lease("keeping an etcd lease alive", end, |c| async move {
                        c.lease_client().keep_alive(live.id).await
                    })
                    .await;
                match opened {
                    Ok(Ok((keeper, replies))) => {
                        stream = Some((live.id, keeper, replies));
                        Refresh::Alive
                    }
                    Ok(Err(_gone)) => Refresh::Gone,
                    Err(_) => Refresh::Failed,
                }
            }
        };
        if matches!(outcome, Refresh::Alive) {
            // (An answer on a stream opened earlier did not go through a
            // call: it counts all the same, see `backend/retry.rs`.)
            shared.conn.answered();
        }
        drop(shared);
        let mut state = bucket.state.lock().unwrap_or_else(|e| e.into_inner());
        match outcome {
            Refresh::Alive => {
                if let Some(l) = state.lease.as_mut().filter(|l| l.id == live.id) {
                    l.known_until = l.known_until.max(sent + l.ttl);
                }
            }
            Refresh::Gone => {
                if state.lease.is_some_and(|l| l.id == live.id) {
                    state.lease = None;
                }
                stream = None;
            }
            Refresh::Failed => stream = None,
        }
        drop(state);
        bucket.changed.notify_waiters();
    }
}

enum Refresh {
    Alive,
    Gone,
    Failed,
}

async fn refresh(
    keeper: &mut etcd_client::LeaseKeeper,
    replies: &mut etcd_client::LeaseKeepAliveStream,
    end: Instant,
) -> Refresh {
    if keeper.keep_alive().await.is_err() {
        return Refresh::Failed;
    }
    match timeout(
        end.saturating_duration_since(Instant::now()),
        replies.message(),
    )
    .await
    {
        Ok(Ok(Some(reply))) if reply.ttl() > 0 => Refresh::Alive,
        Ok(Ok(Some(_))) => Refresh::Gone,
        Ok(Err(e)) if lease_not_found(&e) => Refresh::Gone,
        Ok(Err(e)) => {
            tracing::debug!(error = %etcd_error(&e), "etcd lease keep-alive failed");
            Refresh::Failed
        }
        _ => Refresh::Failed,
    }
}

/// A grant under way: dropped with its bucket still set (its call was
/// cancelled mid-grant), the bucket is no longer `granting` and its waiters
/// wake, so that one of them grants. (Left set, every later call of that
/// TTL would wait for a grant nobody makes.)
struct Abandoned<'a>(Option<&'a Bucket>);

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if let Some(bucket) = self.0 {
            bucket
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .granting = false;
            bucket.changed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_the_ttl_and_a_second() {
        assert_eq!(bucket_secs(Duration::from_millis(1)), 2);
        assert_eq!(bucket_secs(Duration::from_millis(150)), 2);
        assert_eq!(bucket_secs(Duration::from_secs(1)), 2);
        assert_eq!(bucket_secs(Duration::from_millis(1001)), 3);
        assert_eq!(bucket_secs(Duration::from_secs(30)), 40);
        assert_eq!(bucket_secs(Duration::from_secs(9)), 10);
        for ms in [1u64, 999, 1000, 1001, 29_999, 86_400_000, 31_536_000_000] {
            let ttl = Duration::from_millis(ms);
            let secs = bucket_secs(ttl);
            assert!(
                Duration::from_secs(secs) >= ttl + Duration::from_secs(1),
                "{ms}"
            );
            assert!(secs <= ttl.as_secs() * 13 / 10 + 3, "{ms} -> {secs}");
        }
    }
}

#[cfg(test)]
#[path = "lease_test.rs"]
mod lease_test;
