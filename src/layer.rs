//! [`LockLayer`]: the tower layer.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tower_layer::Layer;

use crate::backend::SharedBackend;
use crate::lock::registry::Defaults;
use crate::rejection::{Rejection, SharedRejection, default_rejection};
use crate::service::LockService;

/// Wraps services with [`LockService`]: per request, asks the
/// [`LockRequest`](crate::LockRequest) `R` what to lock, acquires it (waiting
/// up to the spec's max wait) or answers `429` with `Retry-After`, and
/// releases after the response.
///
/// Works per route (`post(handler).layer(..)`), on a whole axum `Router`
/// (`.layer(..)` or `.route_layer(..)`, which both run after routing and see
/// the matched route) and inside a `tower::ServiceBuilder`. Wrapped around a
/// `Router` from outside, it runs before routing: no route pattern (see
/// [`path_params`](crate::path_params)).
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, body::Body, routing::post};
/// use http::Request;
/// use tower_lock::{LockLayer, LockSpec, MemoryBackend, path_params};
///
/// let layer = LockLayer::new(MemoryBackend::new(), |req: &Request<Body>| {
///     let id = path_params(req).get("id")?.to_owned();
///     Some(LockSpec::new(format!("order:{id}"), Duration::from_secs(30)))
/// });
/// let app: Router = Router::new().route("/orders/{id}", post(|| async { "paid" }).layer(layer));
/// # let _ = app;
/// ```
pub struct LockLayer<R> {
    pub(crate) backend: SharedBackend,
    pub(crate) locker: Arc<R>,
    pub(crate) rejection: SharedRejection,
    pub(crate) defaults: Defaults,
    // Whether the "not routed" warning was logged (once per layer).
    unrouted_warned: Arc<AtomicBool>,
}

impl<R> LockLayer<R> {
    /// A layer taking locks in `backend` (any [`LockBackend`], or a
    /// [`SharedBackend`] several layers, jobs and an admin API share) as
    /// `locker` decides.
    ///
    /// [`LockBackend`]: crate::backend::LockBackend
    pub fn new(backend: impl Into<SharedBackend>, locker: R) -> Self {
        LockLayer {
            backend: backend.into(),
            locker: Arc::new(locker),
            rejection: Arc::new(default_rejection),
            defaults: Defaults::default(),
            unrouted_warned: Arc::default(),
        }
    }

    /// The `LockRequest` read path parameters of a request that was not
    /// routed: they are empty, and a lock keyed by them was probably not
    /// taken. Said once per layer.
    pub(crate) fn warn_unrouted(&self) {
        if !self.unrouted_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "path_params read on a request that axum has not routed (the lock layer \
                 wraps the router from outside, or no route matched): the parameters are \
                 empty, so a lock keyed by them is not taken. Put the layer on the route, \
                 or on the Router with Router::layer or Router::route_layer."
            );
        }
    }

    /// Turn the watchdog on (or off) for specs that do not say: their locks
    /// are renewed by their TTL every TTL/3 while held (see
    /// [`LockSpec::watchdog`](crate::LockSpec::watchdog)). Default off.
    pub fn watchdog(mut self, on: bool) -> Self {
        self.defaults.watchdog = on;
        self
    }

    /// Describe every lock of a locked response in its headers (Forrst's
    /// lock data): `lock-acquired: true`, `lock-key`, `lock-route` (route
    /// scope), `lock-scope` (`function` or `global`), `lock-fence`,
    /// `lock-expires-at`, and `lock-owner` only for a lock kept after the
    /// response (auto-release off), since the owner token is the credential
    /// to release it. Default off: then only kept locks are described (with
    /// their owner), as the client needs those to release them later. See
    /// [`headers`](crate::headers).
    pub fn lock_headers(mut self, on: bool) -> Self {
        self.defaults.lock_headers = on;
        self
    }

    /// Shape the response sent when a lock cannot be taken (default:
    /// [`default_rejection`]).
    pub fn rejection(mut self, rejection: impl Rejection) -> Self {
        self.rejection = Arc::new(rejection);
        self
    }

    /// The backend.
    pub fn get_backend(&self) -> &SharedBackend {
        &self.backend
    }
}

impl<R> Clone for LockLayer<R> {
    fn clone(&self) -> Self {
        LockLayer {
            backend: self.backend.clone(),
            locker: self.locker.clone(),
            rejection: self.rejection.clone(),
            defaults: self.defaults,
            unrouted_warned: self.unrouted_warned.clone(),
        }
    }
}

impl<R> fmt::Debug for LockLayer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer").finish_non_exhaustive()
    }
}

impl<S, R> Layer<S> for LockLayer<R> {
    type Service = LockService<S, R>;

    fn layer(&self, inner: S) -> Self::Service {
        LockService::from_layer(inner, self.clone())
    }
}
