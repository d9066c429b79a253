//! [`LockService`]: the middleware service.

use std::fmt;
use std::task::{Context, Poll};

use axum::extract::MatchedPath;
use http::{Request, Response};
use http_body::Body;
use smol_str::SmolStr;
use tower_service::Service;

use crate::backend::{BoxFuture, LockBackend};
use crate::body::{DetachOnDrop, LockBody};
use crate::error::LockError;
use crate::future::ResponseFuture;
use crate::layer::LockLayer;
use crate::locks::{Locks, acquire_guarded, acquire_now};
use crate::request::LockRequest;
use crate::spec::{AcquireRequest, LockSpec};

/// Middleware that locks what a [`LockRequest`] names around each request.
/// See [`LockLayer`].
pub struct LockService<S, R> {
    inner: S,
    layer: LockLayer<R>,
}

impl<S, R> LockService<S, R> {
    /// Wrap `inner`, taking locks in `backend` as `locker` decides.
    pub fn new(inner: S, backend: impl LockBackend, locker: R) -> Self {
        Self::from_layer(inner, LockLayer::new(backend, locker))
    }

    pub(crate) fn from_layer(inner: S, layer: LockLayer<R>) -> Self {
        LockService { inner, layer }
    }

    /// A [`LockLayer`] (same as [`LockLayer::new`]).
    pub fn layer(backend: impl LockBackend, locker: R) -> LockLayer<R> {
        LockLayer::new(backend, locker)
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwrap the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, R> Clone for LockService<S, R> {
    fn clone(&self) -> Self {
        LockService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, R> fmt::Debug for LockService<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, R, ReqB, ResB> Service<Request<ReqB>> for LockService<S, R>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    R: LockRequest<ReqB>,
    ResB: Body,
{
    type Response = Response<LockBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let ((first, rest), unrouted) = crate::request::reading_unrouted(|| {
            let mut specs = self.layer.locker.lock_request(&req).into_iter();
            // Empty for the common single lock: no allocation.
            (specs.next(), specs.collect::<Vec<LockSpec>>())
        });
        if unrouted {
            self.layer.warn_unrouted();
        }
        let Some(first) = first else {
            return ResponseFuture::passthrough(self.inner.call(req));
        };
        // Inline up to 23 bytes: most route patterns cost no allocation.
        let route = SmolStr::new(match req.extensions().get::<MatchedPath>() {
            Some(path) => path.as_str(),
            None => req.uri().path(),
        });
        let backend = self.layer.backend.clone();
        let watchdog = self.layer.watchdog;
        let acquire = if rest.is_empty() {
            let lock = match first.to_request(&route) {
                Ok(lock) => lock,
                Err(e) => return ResponseFuture::rejected(&self.layer.rejection, &e),
            };
            // A backend that can answer at once (in memory) needs no future.
            match acquire_now(&backend, &lock) {
                Some(Ok(held)) => {
                    let locks = holding(backend, route, watchdog, held, &first);
                    // Called now: the service made ready for this request
                    // takes it, and no clone is needed.
                    return ResponseFuture::calling(req, &mut self.inner, locks);
                }
                Some(Err(e)) => return ResponseFuture::rejected(&self.layer.rejection, &e),
                None => acquire_one(backend, route, first, lock, watchdog),
            }
        } else {
            acquire_all(backend, route, first, rest, watchdog)
        };
        // The ready service goes with this request; a clone stays for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::acquiring(acquire, req, inner, self.layer.rejection.clone())
    }
}

/// Acquire the one lock `req` (made from `spec`), waiting.
fn acquire_one(
    backend: crate::SharedBackend,
    route: SmolStr,
    spec: LockSpec,
    req: AcquireRequest,
    watchdog: bool,
) -> BoxFuture<'static, Result<Locks, LockError>> {
    Box::pin(async move {
        let held = acquire_guarded(&backend, &req).await?;
        let locks = holding(backend, route, watchdog, held, &spec);
        ready_to_run(locks).await
    })
}

/// A request's registry holding its one lock `held`, taken for `spec`.
fn holding(
    backend: crate::SharedBackend,
    route: SmolStr,
    watchdog: bool,
    held: crate::HeldLock,
    spec: &LockSpec,
) -> Locks {
    let locks = Locks::new(backend, route, watchdog);
    // A fresh registry is never closed.
    let _ = locks.register(held, spec.auto_releases(), spec.get_watchdog());
    locks
}

/// Acquire `first` and every spec in `rest`, in one global order (sorted by
/// key) so that two requests locking the same keys cannot deadlock; on any
/// failure give back what was taken.
///
/// The whole acquisition waits at most the largest max wait of the specs,
/// and never longer than a lock it already took has left (unless the
/// watchdog renews that one): a lock must not run out while the request
/// waits for the next.
fn acquire_all(
    backend: crate::SharedBackend,
    route: SmolStr,
    first: LockSpec,
    rest: Vec<LockSpec>,
    watchdog: bool,
) -> BoxFuture<'static, Result<Locks, LockError>> {
    Box::pin(async move {
        let mut reqs = Vec::with_capacity(1 + rest.len());
        for spec in std::iter::once(&first).chain(&rest) {
            reqs.push((spec.to_request(&route)?, spec));
        }
        reqs.sort_by(|a, b| a.0.key().cmp(b.0.key()));
        reqs.dedup_by(|a, b| a.0.key() == b.0.key());
        // Sorted by key then route: one key in both scopes sits side by side.
        if reqs
            .windows(2)
            .any(|w| w[0].0.key().key() == w[1].0.key().key())
        {
            return Err(LockError::InvalidKey(
                "a request cannot lock one key in both route and global scope",
            ));
        }
        let longest = reqs.iter().map(|(r, _)| r.max_wait()).max();
        let start = tokio::time::Instant::now();
        let deadline = start + longest.unwrap_or_default().min(crate::spec::MAX_TTL);
        let locks = Locks::new(backend.clone(), route, watchdog);
        for (req, spec) in &reqs {
            let now = tokio::time::Instant::now();
            let mut until = deadline;
            if let Some(expiry) = locks.earliest_expiry() {
                until = until.min(expiry);
            }
            let req = req.with_max_wait(req.max_wait().min(until.saturating_duration_since(now)));
            match acquire_guarded(&backend, &req).await {
                Ok(lock) => {
                    let _ = locks.register(lock, spec.auto_releases(), spec.get_watchdog());
                }
                Err(e) => {
                    give_back(&locks).await;
                    return Err(e);
                }
            }
        }
        ready_to_run(locks).await
    })
}

/// `locks` if every one is still held with time left, so the handler may
/// run; else they are given back and the request fails with
/// [`LockError::Expired`]. A lock can run out before the handler starts: a
/// hand-off read late, a reply slower than the TTL.
async fn ready_to_run(locks: Locks) -> Result<Locks, LockError> {
    if !locks.any_lost() {
        return Ok(locks);
    }
    tracing::warn!("a lock ran out before the handler could run; the request is refused");
    give_back(&locks).await;
    Err(LockError::Expired)
}

/// Release every lock of a request that will not run. Finished in a task if
/// this request is dropped meanwhile (client gone, outer timeout): the
/// registry is closed, so nothing else would release them.
async fn give_back(locks: &Locks) {
    if let Some(release) = locks.release_all() {
        DetachOnDrop(Some(release)).await;
    }
}
