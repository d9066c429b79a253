//! A backend that records every call made through it (by the layer, the
//! handles, the watchdog, single-flight) into the process's [`Log`], then
//! passes it on. A call dropped before it answered is recorded as
//! cancelled: what it did on the server is unknown.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tower_lock::backend::{
    AcquireRequest, BoxFuture, ExtendRequest, FlightPublish, FlightResult, FlightStart, HeldBy,
    Holder, Lease,
};
use tower_lock::{LockBackend, LockError, LockKey, LockKind, LockStatus};

use tracing::Instrument;

use super::clock::now_ns;
use super::history::{Kind, Log, Op, Outcome};
use super::queued;

pub struct Recorder<B> {
    pub inner: B,
    pub log: Log,
}

/// Pushes its op when dropped: completed (filled in) or cancelled.
struct Pending {
    log: Log,
    op: Option<Op>,
}

impl Pending {
    fn new(log: &Log, op: Op) -> Self {
        log.begin(&op);
        Pending {
            log: log.clone(),
            op: Some(op),
        }
    }

    fn op(&mut self) -> &mut Op {
        self.op.as_mut().expect("pending op")
    }

    fn done(mut self, outcome: Outcome) {
        let mut op = self.op.take().expect("pending op");
        op.ret = now_ns();
        op.outcome = outcome;
        op.queued = queued::take(op.id);
        self.log.push(op);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(mut op) = self.op.take() {
            op.ret = now_ns();
            op.outcome = Outcome::Cancelled;
            op.queued = queued::take(op.id);
            self.log.push(op);
        }
    }
}

/// The span `queued.rs` notes an acquire's queue entries under.
fn op_span(op: &Op) -> tracing::Span {
    tracing::debug_span!(target: "chaos_op", "chaos_op", op = op.id)
}

pub fn outcome(e: &LockError) -> Outcome {
    match e {
        LockError::AcquisitionFailed { .. } => Outcome::Busy,
        LockError::Timeout { .. } => Outcome::Timeout,
        LockError::NotFound => Outcome::NotFound,
        LockError::OwnershipMismatch => Outcome::Mismatch,
        LockError::BackendUnavailable(_) => Outcome::Unavailable,
        LockError::KindMismatch => Outcome::KindMismatch,
        e => Outcome::Other(e.code().to_owned()),
    }
}

fn key_of(key: &LockKey) -> String {
    key.encoded(usize::MAX)
}

/// Fill in a grant: its fence and when its TTL started at the earliest the
/// client can know (the crate's own rule: the invocation without a wait;
/// after a wait, the hand-off the lease dates, kept between invocation and
/// reply).
fn granted(op: &mut Op, lease: &Lease, waited: bool) {
    let ret = now_ns();
    op.fence = Some(lease.fence);
    // What the handle believes, as the layer does: the TTL, or less where
    // the backend says the lease ends sooner.
    op.lease_ms = lease.lasts().as_millis() as u64;
    op.start = Some(if waited {
        let age = SystemTime::now()
            .duration_since(lease.acquired_at)
            .unwrap_or_default()
            .as_nanos() as u64;
        ret.saturating_sub(age).clamp(op.inv, ret)
    } else {
        op.inv
    });
}

fn holder_op(log: &Log, kind: Kind, key: &LockKey, holder: Holder<'_>) -> Op {
    let mut op = log.start(kind, key_of(key));
    op.owner = Some(holder.owner().to_owned());
    op.fence_in = holder
        .fence()
        .or_else(|| owned_fence(&op.key, holder.owner()));
    op
}

/// The fence granted in this process to each (key, owner token): a call
/// naming an owner alone is recorded as naming that acquisition. Clients
/// make such calls only with an owner token of one acquisition (their
/// own, not a shared custom owner), so the entry is exact for them.
static OWNED: Mutex<BTreeMap<(String, String), u64>> = Mutex::new(BTreeMap::new());

fn note_owned(key: &LockKey, owner: &str, fence: u64) {
    let mut owned = OWNED.lock().unwrap_or_else(|e| e.into_inner());
    owned.insert((key_of(key), owner.to_owned()), fence);
}

fn owned_fence(key: &str, owner: &str) -> Option<u64> {
    let owned = OWNED.lock().unwrap_or_else(|e| e.into_inner());
    owned.get(&(key.to_owned(), owner.to_owned())).copied()
}

impl<B: LockBackend> Recorder<B> {
    fn acquire_op(&self, kind: Kind, req: &AcquireRequest) -> Op {
        let mut op = self.log.start(kind, key_of(req.key()));
        op.owner = Some(req.owner().to_owned());
        op.ttl_ms = req.ttl().as_millis() as u64;
        op.wait_ms = req.max_wait().as_millis() as u64;
        op.lock_kind = (req.kind() != LockKind::Exclusive).then(|| req.kind().to_string());
        op
    }
}

impl<B: LockBackend> LockBackend for Recorder<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Lease, LockError>> {
        let mut pending = Pending::new(&self.log, self.acquire_op(Kind::Acquire, req));
        let span = op_span(pending.op());
        Box::pin(async move {
            let result = self.inner.acquire(req).instrument(span).await;
            match &result {
                Ok(lease) => {
                    granted(pending.op(), lease, !req.max_wait().is_zero());
                    note_owned(req.key(), req.owner(), lease.fence);
                    pending.done(Outcome::Ok);
                }
                Err(e) => pending.done(outcome(e)),
            }
            result
        })
    }

    fn try_acquire_now(&self, req: &AcquireRequest) -> Option<Result<Lease, LockError>> {
        let mut pending = Pending::new(&self.log, self.acquire_op(Kind::Acquire, req));
        let result = self.inner.try_acquire_now(req);
        match &result {
            // Not answered here: `acquire` follows, recorded there.
            None => {
                if let Some(op) = pending.op.take() {
                    self.log.forget(&op);
                }
            }
            Some(Ok(lease)) => {
                granted(pending.op(), lease, false);
                note_owned(req.key(), req.owner(), lease.fence);
                pending.done(Outcome::Ok);
            }
            Some(Err(e)) => pending.done(outcome(e)),
        }
        result
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        let pending = Pending::new(&self.log, holder_op(&self.log, Kind::Release, key, holder));
        Box::pin(async move {
            let result = self.inner.release(key, holder).await;
            pending.done(result.as_ref().map_or_else(outcome, |_| Outcome::Ok));
            result
        })
    }

    fn try_release_now(&self, key: &LockKey, holder: Holder<'_>) -> Option<Result<(), LockError>> {
        let mut pending = Pending::new(&self.log, holder_op(&self.log, Kind::Release, key, holder));
        let result = self.inner.try_release_now(key, holder);
        match &result {
            None => {
                if let Some(op) = pending.op.take() {
                    self.log.forget(&op);
                }
            }
            Some(r) => pending.done(r.as_ref().map_or_else(outcome, |_| Outcome::Ok)),
        }
        result
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        let mut op = holder_op(&self.log, Kind::Extend, key, holder);
        op.ttl_ms = ttl.as_millis() as u64;
        let mut pending = Pending::new(&self.log, op);
        Box::pin(async move {
            let result = self.inner.extend(key, holder, ttl).await;
            match &result {
                Ok(lease) => {
                    pending.op().fence = Some(lease.fence);
                    pending.done(Outcome::Ok);
                }
                Err(e) => pending.done(outcome(e)),
            }
            result
        })
    }

    fn extend_many<'a>(
        &'a self,
        batch: &'a [ExtendRequest],
    ) -> BoxFuture<'a, Vec<Result<Lease, LockError>>> {
        let mut pendings: Vec<Pending> = batch
            .iter()
            .map(|r| {
                let mut op = holder_op(&self.log, Kind::Extend, &r.key, r.holder());
                op.ttl_ms = r.ttl.as_millis() as u64;
                Pending::new(&self.log, op)
            })
            .collect();
        Box::pin(async move {
            let results = self.inner.extend_many(batch).await;
            for (mut pending, result) in pendings.drain(..).zip(&results) {
                match result {
                    Ok(lease) => {
                        pending.op().fence = Some(lease.fence);
                        pending.done(Outcome::Ok);
                    }
                    Err(e) => pending.done(outcome(e)),
                }
            }
            results
        })
    }

    fn claim<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
        attempt: u64,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        let mut pending = Pending::new(&self.log, holder_op(&self.log, Kind::Claim, key, holder));
        Box::pin(async move {
            let result = self.inner.claim(key, holder, attempt).await;
            match &result {
                Ok(lease) => {
                    // The claimed lease keeps the lock's expiry: it has
                    // `lease.ttl` left from the server's answer, which came
                    // after the invocation.
                    let op = pending.op();
                    op.fence = Some(lease.fence);
                    op.lease_ms = lease.ttl.as_millis() as u64;
                    op.start = Some(op.inv);
                    pending.done(Outcome::Ok);
                }
                Err(e) => pending.done(outcome(e)),
            }
            result
        })
    }

    fn force_release<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        let pending = Pending::new(&self.log, self.log.start(Kind::ForceRelease, key_of(key)));
        Box::pin(async move {
            let result = self.inner.force_release(key).await;
            pending.done(result.as_ref().map_or_else(outcome, |_| Outcome::Ok));
            result
        })
    }

    fn status<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<LockStatus>, LockError>> {
        self.inner.status(key)
    }

    fn held_by<'a>(
        &'a self,
        owner: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<HeldBy>, LockError>> {
        self.inner.held_by(owner, limit)
    }

    fn flight_begin<'a>(
        &'a self,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<FlightStart, LockError>> {
        let mut pending = Pending::new(&self.log, self.acquire_op(Kind::FlightBegin, req));
        Box::pin(async move {
            let result = self.inner.flight_begin(req).await;
            match &result {
                Ok(FlightStart::Leader(lease)) => {
                    granted(pending.op(), lease, false);
                    pending.done(Outcome::Ok);
                }
                Ok(FlightStart::Fresh(_)) => pending.done(Outcome::Fresh),
                Ok(FlightStart::Busy(_)) => pending.done(Outcome::Following),
                Err(e) => pending.done(outcome(e)),
            }
            result
        })
    }

    fn flight_result<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<FlightResult>, LockError>> {
        self.inner.flight_result(key)
    }

    fn flight_publish<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a str,
        publish: &'a FlightPublish,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        let mut op = self.log.start(Kind::FlightPublish, key_of(key));
        op.fence_in = Some(publish.fence);
        op.owner = Some(owner.to_owned());
        let pending = Pending::new(&self.log, op);
        Box::pin(async move {
            let result = self.inner.flight_publish(key, owner, publish).await;
            pending.done(result.as_ref().map_or_else(outcome, |_| Outcome::Ok));
            result
        })
    }
}
