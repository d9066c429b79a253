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
/// Every API that takes a backend accepts `impl Into<SharedBackend>`, which
/// any [`LockBackend`] is; make one yourself to share one backend between
/// several layers, jobs and an admin API. It dereferences to the backend, so
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
/// let locker = |_: &Request<Body>| Some(LockSpec::new("report", Duration::from_secs(30)).global());
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
