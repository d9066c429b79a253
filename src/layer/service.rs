//! [`LockService`]: the middleware service.

use std::fmt;
use std::task::{Context, Poll};

use axum::extract::MatchedPath;
use http::{Request, Response};
use http_body::Body;
use smol_str::SmolStr;
use tower_service::Service;

use crate::backend::SharedBackend;
use crate::layer::LockLayer;
use crate::layer::body::LockBody;
use crate::layer::future::ResponseFuture;
use crate::layer::request::LockRequest;
use crate::lock::acquire::{acquire_all, acquire_now, acquire_one, holding};
use crate::observe::{self, Meter};
use crate::spec::LockSpec;

/// Middleware that locks what a [`LockRequest`] names around each request.
/// See [`LockLayer`].
pub struct LockService<S, R> {
    inner: S,
    layer: LockLayer<R>,
}

impl<S, R> LockService<S, R> {
    /// Wrap `inner`, taking locks in `backend` as `locker` decides.
    pub fn new(inner: S, backend: impl Into<SharedBackend>, locker: R) -> Self {
        Self::from_layer(inner, LockLayer::new(backend, locker))
    }

    pub(crate) fn from_layer(inner: S, layer: LockLayer<R>) -> Self {
        LockService { inner, layer }
    }

    /// A [`LockLayer`] (same as [`LockLayer::new`]).
    pub fn layer(backend: impl Into<SharedBackend>, locker: R) -> LockLayer<R> {
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
        let ((first, rest), read) = crate::path::reading_params(|| {
            let mut specs = self.layer.locker.lock_request(&req).into_iter();
            let first = specs.next();
            // Empty for the common single lock: no allocation. Collected
            // only after a first spec: with none (the common pass-through),
            // the rest is only drained, which inlines to nothing for the
            // usual `Option` or empty `Vec`.
            let rest = if first.is_some() {
                specs.collect::<Vec<LockSpec>>()
            } else {
                specs.for_each(drop);
                Vec::new()
            };
            (first, rest)
        });
        if read.unrouted {
            self.layer.warn_unrouted();
        }
        if read.undecodable {
            // The `LockRequest` read a parameter that does not decode: what
            // it named (nothing, or not every lock it would name) cannot be
            // trusted. Refused, as axum's `Path` refuses it, rather than run
            // with fewer locks.
            let e = crate::LockError::InvalidKey(UNDECODABLE_PARAM);
            return ResponseFuture::rejected(&self.layer.rejection, &e);
        }
        let Some(first) = first else {
            // The extractors, run as the future is polled, then say the
            // layer named no lock, not that it is missing (`future.rs`).
            return ResponseFuture::passthrough(self.inner.call(req));
        };
        let matched = req.extensions().get::<MatchedPath>();
        // Inline up to 23 bytes: most route patterns cost no allocation.
        let route = SmolStr::new(match matched {
            Some(path) => path.as_str(),
            None => req.uri().path(),
        });
        // The route label is the pattern only, never a raw path.
        let meter = Meter::new(&self.layer.backend, matched.map_or("", |p| p.as_str()));
        let backend = self.layer.backend.clone();
        let defaults = self.layer.defaults;
        let acquire = if rest.is_empty() {
            let lock = match first.to_request(&route) {
                Ok(lock) => lock,
                Err(e) => {
                    meter.acquisition(observe::error_outcome(&e), None);
                    return ResponseFuture::rejected(&self.layer.rejection, &e);
                }
            };
            // A backend that can answer at once (in memory) needs no future.
            match acquire_now(&backend, &lock, &meter) {
                Some(Ok(held)) => {
                    let locks = holding(backend, route, defaults, held, &first, meter);
                    // Called now: the service made ready for this request
                    // takes it, and no clone is needed.
                    return ResponseFuture::calling(
                        req,
                        &mut self.inner,
                        locks,
                        &self.layer.rejection,
                    );
                }
                Some(Err(e)) => return ResponseFuture::rejected(&self.layer.rejection, &e),
                None => acquire_one(backend, route, first, lock, defaults, meter),
            }
        } else {
            acquire_all(backend, route, first, rest, defaults, meter)
        };
        // The ready service goes with this request; a clone stays for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::acquiring(acquire, req, inner, self.layer.rejection.clone())
    }
}

const UNDECODABLE_PARAM: &str = "a path parameter is not UTF-8 once percent-decoded";
