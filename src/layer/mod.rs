//! The lock middleware: [`LockLayer`], the service it makes
//! ([`LockService`]), that service's future and response body, and
//! [`LockFn`], a closure as a [`LockRequest`].
//!
//! [`LockLayer`] is also at the crate root; the rest is here for the
//! types of a stack and for tower code that names them.

pub(crate) mod body;
pub(crate) mod future;
pub mod headers;
pub(crate) mod rejection;
pub(crate) mod request;
pub(crate) mod retry;
pub(crate) mod service;

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::response::IntoResponse;
use http::Request;
use tower_layer::Layer;

use crate::backend::SharedBackend;
use crate::error::LockError;
pub use crate::layer::body::LockBody;
pub use crate::layer::future::ResponseFuture;
use crate::layer::rejection::{Rejecter, SharedRejection, default_hook, hook};
use crate::layer::request::LockRequest;
use crate::layer::retry::{RetryAfter, RetryPolicy};
pub use crate::layer::service::LockService;
use crate::lock::registry::Defaults;
use crate::spec::LockSpec;

/// Wraps services with [`LockService`]: per request, asks the
/// [`LockRequest`] `R` what to lock, acquires it (waiting
/// up to the spec's max wait) or answers `429` with `Retry-After`, and
/// releases after the response.
///
/// Works per route (`post(handler).layer(..)`), on a whole axum `Router`
/// (`.layer(..)` or `.route_layer(..)`, which both run after routing and see
/// the matched route) and inside a `tower::ServiceBuilder`. Wrapped around a
/// `Router` from outside, it runs before routing: no route pattern (see
/// [`path_params`](crate::path_params)).
///
/// A closure names the locks with [`LockLayer::from_fn`]; a type that
/// implements [`LockRequest`] (such as [`ClientLocks`](crate::ClientLocks))
/// goes to [`LockLayer::new`].
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::post};
/// use tower_lock::{LockLayer, LockSpec, MemoryBackend, path_params};
///
/// let layer = LockLayer::from_fn(MemoryBackend::new(), |req| {
///     let id = path_params(req).get("id")?.to_owned();
///     Some(LockSpec::new(format!("order:{id}"), Duration::from_secs(30)))
/// });
/// let app: Router = Router::new().route("/orders/{id}", post(|| async { "paid" }).layer(layer));
/// # let _ = app;
/// ```
///
/// # Stacking
///
/// Several layers on one route go in one `tower::ServiceBuilder`,
/// outermost first: axum's `MethodRouter::layer` called twice in a row
/// cannot infer the error type between the two calls (`E0283`, "type
/// annotations needed"), whatever the layers.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::post};
/// use tower::ServiceBuilder;
/// use tower_http::catch_panic::CatchPanicLayer;
/// use tower_lock::{HeldLock, LockLayer, LockSpec, MemoryBackend};
///
/// let lock = LockLayer::from_fn(MemoryBackend::new(), |_| {
///     LockSpec::global("import", Duration::from_secs(60))
/// });
/// async fn import(lock: HeldLock) -> String {
///     format!("imported under fence {}", lock.fence())
/// }
/// let app: Router = Router::new().route(
///     "/import",
///     post(import).layer(ServiceBuilder::new().layer(CatchPanicLayer::new()).layer(lock)),
/// );
/// # let _ = app;
/// ```
///
/// With single-flight on the same route, see
/// [`SingleFlightLayer`](crate::flight::SingleFlightLayer).
pub struct LockLayer<R> {
    pub(crate) backend: SharedBackend,
    pub(crate) locker: Arc<R>,
    pub(crate) rejection: SharedRejection,
    pub(crate) defaults: Defaults,
    // Whether the "not routed" warning was logged (once per layer).
    unrouted_warned: Arc<AtomicBool>,
}

/// A closure as a [`LockRequest`], for the request body type `B`: what
/// [`LockLayer::from_fn`] wraps the closure in.
pub struct LockFn<F, B> {
    f: F,
    // `fn(&B)`: the closure takes requests of `B`, and is `Send + Sync`
    // whatever `B` is.
    body: PhantomData<fn(&B)>,
}

impl<F: Clone, B> Clone for LockFn<F, B> {
    fn clone(&self) -> Self {
        LockFn {
            f: self.f.clone(),
            body: PhantomData,
        }
    }
}

impl<F, B> fmt::Debug for LockFn<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockFn").finish_non_exhaustive()
    }
}

impl<F, B: 'static> LockRequest<B> for LockFn<F, B>
where
    F: LockRequest<B>,
{
    type Specs = F::Specs;

    fn lock_request(&self, request: &Request<B>) -> Self::Specs {
        self.f.lock_request(request)
    }
}

impl<F, B> LockLayer<LockFn<F, B>> {
    /// A layer taking locks in `backend` as the closure `f` names them per
    /// request: `None` (or an empty list) for none, a [`LockSpec`], `Some`
    /// spec, or several (a `Vec`, an array). Its argument is the request
    /// (`&Request<B>`), inferred: no annotation needed, and a mistake in
    /// the closure is reported on the closure.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, routing::post};
    /// use http::Method;
    /// use tower_lock::{LockLayer, LockSpec, MemoryBackend};
    ///
    /// // Every write to the ledger, one at a time; reads go through.
    /// let ledger = LockLayer::from_fn(MemoryBackend::new(), |req| {
    ///     (req.method() != Method::GET).then(|| LockSpec::global("ledger", Duration::from_secs(10)))
    /// });
    /// let app: Router = Router::new().route("/ledger", post(|| async { "written" }).layer(ledger));
    /// # let _ = app;
    /// ```
    pub fn from_fn<I>(backend: impl Into<SharedBackend>, f: F) -> Self
    where
        F: Fn(&Request<B>) -> I + Send + Sync + 'static,
        I: IntoIterator<Item = LockSpec>,
    {
        LockLayer::new(
            backend,
            LockFn {
                f,
                body: PhantomData,
            },
        )
    }
}

impl<R> LockLayer<R> {
    /// A layer taking locks in `backend` (any [`LockBackend`], or a
    /// [`SharedBackend`] several layers, jobs and an admin API share) as
    /// the [`LockRequest`] `locker` decides. For a closure, use
    /// [`from_fn`](LockLayer::from_fn): its argument's type is inferred.
    ///
    /// [`LockBackend`]: crate::backend::LockBackend
    pub fn new(backend: impl Into<SharedBackend>, locker: R) -> Self {
        LockLayer {
            backend: backend.into(),
            locker: Arc::new(locker),
            rejection: Rejecter::new(
                default_hook(),
                Some(Arc::new(RetryPolicy::new(RetryAfter::default()))),
            ),
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
    /// [`headers`].
    pub fn lock_headers(mut self, on: bool) -> Self {
        self.defaults.lock_headers = on;
        self
    }

    /// Shape the response sent when a lock cannot be taken: any
    /// [`IntoResponse`] (default: [`default_rejection`], which is also what
    /// a [`LockError`] answers as a response).
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Json, Router, routing::post};
    /// use serde_json::json;
    /// use tower_lock::{LockLayer, LockSpec, MemoryBackend};
    ///
    /// let layer = LockLayer::from_fn(MemoryBackend::new(), |_| {
    ///     LockSpec::global("import", Duration::from_secs(60))
    /// })
    /// .rejection(|e| (e.status(), Json(json!({"busy": e.code()}))));
    /// let app: Router = Router::new().route("/import", post(|| async { "imported" }).layer(layer));
    /// # let _ = app;
    /// ```
    ///
    /// [`default_rejection`]: crate::default_rejection
    pub fn rejection<F, T>(mut self, rejection: F) -> Self
    where
        F: Fn(&LockError) -> T + Send + Sync + 'static,
        T: IntoResponse,
    {
        self.rejection = Rejecter::new(hook(rejection), self.rejection.retry().cloned());
        self
    }

    /// How `Retry-After` is set on a `429` for a busy lock: an estimate
    /// from the route's recent hold times (the default), the holder's
    /// remaining TTL, or a fixed wait. See [`RetryAfter`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, routing::post};
    /// use tower_lock::{LockLayer, LockSpec, MemoryBackend, RetryAfter};
    ///
    /// let layer = LockLayer::from_fn(MemoryBackend::new(), |_| {
    ///     LockSpec::global("import", Duration::from_secs(60))
    /// })
    /// .retry_after(RetryAfter::Fixed(Duration::from_secs(5)));
    /// let app: Router = Router::new().route("/import", post(|| async { "imported" }).layer(layer));
    /// # let _ = app;
    /// ```
    pub fn retry_after(mut self, policy: RetryAfter) -> Self {
        let hook = self.rejection.hook().clone();
        self.rejection = Rejecter::new(hook, Some(Arc::new(RetryPolicy::new(policy))));
        self
    }

    /// The backend.
    pub fn backend(&self) -> &SharedBackend {
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
