//! [`LockRequest`]: the per-route hook that says what to lock.

use http::Request;

use crate::spec::LockSpec;

/// Decides, per request, which locks to take (none, one or several).
///
/// The request gives method, URI, headers and extensions, including axum's
/// [`MatchedPath`](axum::extract::MatchedPath); [`path_params`](crate::path_params) reads the
/// route's path parameters. Return anything iterable over [`LockSpec`]s:
/// `Option<LockSpec>` (the common case), a bare `LockSpec`, a `Vec`, an
/// array.
///
/// Implemented for closures `Fn(&Request<B>) -> impl IntoIterator<Item = LockSpec>`;
/// give a closure to [`LockLayer::from_fn`](crate::LockLayer::from_fn),
/// which infers its argument's type, and a type of your own to
/// [`LockLayer::new`](crate::LockLayer::new).
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
