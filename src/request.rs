//! [`LockRequest`]: the per-route hook that says what to lock.

use std::fmt;
use std::sync::Arc;

use axum::extract::RawPathParams;
use http::Request;
use http::request::Parts;

use crate::spec::LockSpec;

/// Decides, per request, which locks to take (none, one or several).
///
/// The request gives method, URI, headers and extensions, including axum's
/// [`MatchedPath`](axum::extract::MatchedPath); [`path_params`] reads the
/// route's path parameters. Return anything iterable over [`LockSpec`]s:
/// `Option<LockSpec>` (the common case), a `Vec`, an array.
///
/// Implemented for closures `Fn(&Request<B>) -> impl IntoIterator<Item = LockSpec>`.
///
/// ```
/// use std::time::Duration;
/// use axum::body::Body;
/// use http::{Method, Request};
/// use tower_lock::{LockRequest, LockSpec, path_params};
///
/// /// Lock the order on writes; reads go through untouched.
/// #[derive(Clone)]
/// struct Orders;
///
/// impl LockRequest<Body> for Orders {
///     type Specs = Option<LockSpec>;
///
///     fn lock_request(&self, req: &Request<Body>) -> Option<LockSpec> {
///         if req.method() == Method::GET {
///             return None;
///         }
///         let id = path_params(req).get("id")?.to_owned();
///         Some(LockSpec::new(format!("order:{id}"), Duration::from_secs(30)))
///     }
/// }
/// ```
pub trait LockRequest<B>: Send + Sync + 'static {
    /// What [`lock_request`](LockRequest::lock_request) returns.
    type Specs: IntoIterator<Item = LockSpec>;

    /// The locks to take for `request`; empty for none.
    fn lock_request(&self, request: &Request<B>) -> Self::Specs;
}

impl<B, F, I> LockRequest<B> for F
where
    F: Fn(&Request<B>) -> I + Send + Sync + 'static,
    I: IntoIterator<Item = LockSpec>,
{
    type Specs = I;

    fn lock_request(&self, request: &Request<B>) -> I {
        self(request)
    }
}

/// The matched route's path parameters (`/orders/{id}` → `id`), decoded.
///
/// Empty when the request was not routed by axum (e.g. a layer on the whole
/// `Router` with `.layer`, which runs before routing: use `.route_layer` or a
/// per-route layer to see parameters).
#[derive(Clone, Default)]
pub struct PathParams(Option<Arc<RawPathParams>>);

impl PathParams {
    /// The value of parameter `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
    }

    /// All parameters, in route order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().flat_map(|raw| raw.iter())
    }
}

impl fmt::Debug for PathParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PathParams")
            .field(&self.iter().collect::<Vec<_>>())
            .finish()
    }
}

impl PartialEq for PathParams {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for PathParams {}

/// The parameters [`LockService`](crate::LockService) read from the request
/// it owns, for [`path_params`] while its [`LockRequest`] runs.
#[derive(Clone)]
pub(crate) struct CachedPathParams(PathParams);

impl CachedPathParams {
    /// Read the parameters of `request` into its extensions.
    pub(crate) fn insert<B>(request: Request<B>) -> Request<B> {
        let (mut parts, body) = request.into_parts();
        let params = from_parts(&mut parts);
        parts.extensions.insert(CachedPathParams(params));
        Request::from_parts(parts, body)
    }

    /// Take them out again, so the inner service sees the request as sent.
    pub(crate) fn remove<B>(request: &mut Request<B>) {
        request.extensions_mut().remove::<CachedPathParams>();
    }
}

/// Read axum's path parameters from a request (see [`PathParams`]).
pub fn path_params<B>(request: &Request<B>) -> PathParams {
    if let Some(CachedPathParams(params)) = request.extensions().get() {
        return params.clone();
    }
    // axum keeps the parameters in a private extension; its extractor needs
    // `Parts`, so build a body-less copy carrying the same extensions.
    let (mut parts, ()) = {
        let mut copy = Request::new(());
        *copy.extensions_mut() = request.extensions().clone();
        copy.into_parts()
    };
    from_parts(&mut parts)
}

fn from_parts(parts: &mut Parts) -> PathParams {
    use axum::extract::FromRequestParts;
    use std::future::Future;
    use std::task::{Context, Poll};

    let fut = <RawPathParams as FromRequestParts<()>>::from_request_parts(parts, &());
    let mut fut = std::pin::pin!(fut);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(raw)) => PathParams(Some(Arc::new(raw))),
        _ => PathParams::default(),
    }
}
