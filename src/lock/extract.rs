//! The extractors of a request's locks: [`Locks`] (all of them) and
//! [`HeldLock`] (the one a route takes), and why they reject.

use std::cell::Cell;
use std::fmt;

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::request::Parts;

use super::{HeldLock, Locks};

thread_local! {
    /// Whether the future being polled on this thread is a service's behind
    /// a layer that named no lock for its request.
    static NO_LOCK_NAMED: Cell<bool> = const { Cell::new(false) };
}

/// Held by the layer while it polls the future of the service behind it for
/// a request its [`LockRequest`](crate::LockRequest) named no lock for: the
/// extractors, which run inside that poll, then say so
/// (`LOCK_NOT_REQUESTED`), not that the layer is missing.
///
/// A flag of the thread for the length of a poll rather than a marker in
/// the request's extensions: inserting one more extension (after axum's
/// own) grows the request's extension map, which cost every request the
/// layer lets through untouched about 500 instructions (4 % of it); setting
/// and restoring the flag costs a few. What it cannot see: a handler run on
/// another task than the layer's (a `tower::buffer::Buffer` between them)
/// is told `LOCK_LAYER_MISSING` instead; either answer is a `500` for a
/// handler that should extract `Option<..>`.
pub(crate) struct NoLockNamed {
    /// The flag before this one (a layer behind a layer), put back on drop,
    /// also when the call panics.
    previous: bool,
}

impl NoLockNamed {
    /// Set the flag until the returned guard is dropped.
    pub(crate) fn enter() -> Self {
        NoLockNamed {
            previous: NO_LOCK_NAMED.replace(true),
        }
    }
}

impl Drop for NoLockNamed {
    fn drop(&mut self) {
        NO_LOCK_NAMED.set(self.previous);
    }
}

/// Rejection of the [`Locks`] and [`HeldLock`] extractors when the request
/// carries no locks: `500` with a JSON body, one code per cause. A handler
/// whose route locks only some requests extracts `Option<Locks>` or
/// `Option<HeldLock>` instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingLocks {
    /// No [`LockLayer`](crate::LockLayer) runs in front of the handler
    /// (`LOCK_LAYER_MISSING`).
    LayerMissing,
    /// The layer ran, and its [`LockRequest`](crate::LockRequest) named no
    /// lock for this request (`LOCK_NOT_REQUESTED`).
    NotRequested,
}

impl MissingLocks {
    /// The stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            MissingLocks::LayerMissing => "LOCK_LAYER_MISSING",
            MissingLocks::NotRequested => "LOCK_NOT_REQUESTED",
        }
    }

    fn current() -> Self {
        if NO_LOCK_NAMED.get() {
            MissingLocks::NotRequested
        } else {
            MissingLocks::LayerMissing
        }
    }
}

impl IntoResponse for MissingLocks {
    fn into_response(self) -> Response {
        crate::layer::rejection::json_error(
            http::StatusCode::INTERNAL_SERVER_ERROR,
            self.code(),
            &self.to_string(),
        )
        .map(axum::body::Body::from)
    }
}

impl fmt::Display for MissingLocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MissingLocks::LayerMissing => {
                "no locks for this request: no LockLayer runs in front of this handler \
                 (extract Option<Locks> or Option<HeldLock> where that is expected)"
            }
            MissingLocks::NotRequested => {
                "no locks for this request: its LockLayer named no lock for it (extract \
                 Option<Locks> or Option<HeldLock> where that is expected)"
            }
        })
    }
}

impl std::error::Error for MissingLocks {}

impl<S: Send + Sync> FromRequestParts<S> for Locks {
    type Rejection = MissingLocks;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        match parts.extensions.get::<Locks>() {
            Some(locks) => Ok(locks.clone()),
            None => Err(MissingLocks::current()),
        }
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for Locks {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Locks>().cloned())
    }
}

/// The lock the layer took for the request (the first, when it took
/// several): for the common route that takes one lock.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::post};
/// use tower_lock::{HeldLock, LockLayer, LockSpec, MemoryBackend, path_params};
///
/// async fn pay(lock: HeldLock) -> String {
///     format!("paid under fence {}", lock.fence())
/// }
/// let orders = LockLayer::from_fn(MemoryBackend::new(), |req| {
///     let id = path_params(req).get("id")?.to_owned();
///     Some(LockSpec::new(format!("order:{id}"), Duration::from_secs(30)))
/// });
/// let app: Router = Router::new().route("/orders/{id}/pay", post(pay).layer(orders));
/// # let _ = app;
/// ```
impl<S: Send + Sync> FromRequestParts<S> for HeldLock {
    type Rejection = MissingLocks;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Locks>()
            .and_then(Locks::first)
            .ok_or_else(MissingLocks::current)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for HeldLock {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Locks>().and_then(Locks::first))
    }
}
