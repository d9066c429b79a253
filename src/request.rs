//! [`LockRequest`]: the per-route hook that says what to lock.

use http::Request;

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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathParams(Vec<(String, String)>);

impl PathParams {
    /// The value of parameter `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// All parameters, in route order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// Read axum's path parameters from a request (see [`PathParams`]).
pub fn path_params<B>(request: &Request<B>) -> PathParams {
    use axum::extract::{FromRequestParts, RawPathParams};
    use std::future::Future;
    use std::task::{Context, Poll};

    // axum keeps the parameters in a private extension; its extractor needs
    // `Parts`, so build a body-less copy carrying the same extensions.
    let (mut parts, ()) = {
        let mut copy = Request::new(());
        *copy.extensions_mut() = request.extensions().clone();
        copy.into_parts()
    };
    let fut = <RawPathParams as FromRequestParts<()>>::from_request_parts(&mut parts, &());
    let mut fut = std::pin::pin!(fut);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(raw)) => PathParams(
            raw.iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        ),
        _ => PathParams::default(),
    }
}
