//! [`SharedBackend`]: one backend as layers, jobs and the admin API share it.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use super::LockBackend;
use crate::watchdog::Watchdog;

/// A lock backend shared by layers, jobs and the admin API: type-erased,
/// cheap to clone, and owner of the watchdog that renews the locks taken
/// through it.
///
/// A layer, a [`SingleFlight`](crate::flight::SingleFlight) and the admin
/// API take `impl Into<SharedBackend>`, which any [`LockBackend`] is: made
/// once, they keep it. The calls of a job ([`OwnedLock::acquire`](crate::OwnedLock::acquire),
/// [`with_lock`](crate::with_lock), [`OwnedLock::restore`](crate::OwnedLock::restore))
/// take a `&SharedBackend` ([`AsSharedBackend`]): make one to share one
/// backend between layers, jobs and an admin API, so that one watchdog
/// renews all their locks. It dereferences to the backend, so
/// [`LockBackend`]'s methods can be called on it.
///
/// Renewals of locks taken through one handle and its clones go out
/// together, one call per tick. Handles made separately from clones of one
/// Redis backend renew in separate calls, pipelined on its one connection.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, body::Body, routing::post};
/// use http::Request;
/// use tower_lock::admin::Admin;
/// use tower_lock::{LockLayer, LockSpec, MemoryBackend, SharedBackend};
///
/// let backend = SharedBackend::new(MemoryBackend::new());
/// let locker = |_: &Request<Body>| Some(LockSpec::global("report", Duration::from_secs(30)));
/// let app: Router = Router::new()
///     .route("/report", post(|| async { "done" }).layer(LockLayer::new(backend.clone(), locker)))
///     .nest("/admin", Admin::new(backend).router());
/// # let _ = app;
/// ```
#[derive(Clone)]
pub struct SharedBackend {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Arc<dyn LockBackend>,
    watchdog: Watchdog,
}

impl SharedBackend {
    /// Share `backend`.
    pub fn new(backend: impl LockBackend) -> Self {
        let backend: Arc<dyn LockBackend> = Arc::new(backend);
        SharedBackend {
            inner: Arc::new(Inner {
                watchdog: Watchdog::new(backend.clone()),
                backend,
            }),
        }
    }

    /// The watchdog renewing locks taken through this handle.
    pub(crate) fn watchdog(&self) -> &Watchdog {
        &self.inner.watchdog
    }
}

impl<B: LockBackend> From<B> for SharedBackend {
    fn from(backend: B) -> Self {
        SharedBackend::new(backend)
    }
}

impl From<&SharedBackend> for SharedBackend {
    fn from(backend: &SharedBackend) -> Self {
        backend.clone()
    }
}

/// What the calls of a job take as their backend: a [`SharedBackend`], or
/// a reference to one (`&backend`).
///
/// Not a raw backend: turned into a `SharedBackend` on every call, it would
/// start a watchdog of its own each time, and the renewals of its locks
/// would not go out with the others. Share the backend once instead.
#[diagnostic::on_unimplemented(
    message = "a job takes a `SharedBackend` (or `&SharedBackend`), not `{Self}`",
    label = "not a shared backend",
    note = "share the backend once: `let backend = SharedBackend::new(MemoryBackend::new());`, \
            then pass `&backend` to jobs and `backend.clone()` to layers: one watchdog renews \
            all their locks"
)]
pub trait AsSharedBackend {
    /// The shared backend.
    fn as_shared(&self) -> &SharedBackend;
}

impl AsSharedBackend for SharedBackend {
    fn as_shared(&self) -> &SharedBackend {
        self
    }
}

impl<T: AsSharedBackend + ?Sized> AsSharedBackend for &T {
    fn as_shared(&self) -> &SharedBackend {
        (**self).as_shared()
    }
}

impl Deref for SharedBackend {
    type Target = dyn LockBackend;

    fn deref(&self) -> &Self::Target {
        &*self.inner.backend
    }
}

impl fmt::Debug for SharedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBackend").finish_non_exhaustive()
    }
}
