//! [`with_lock`]: run a future under a lock, outside any request.

use std::future::Future;

use super::{HeldLock, OwnedLock};
use crate::backend::AsSharedBackend;
use crate::error::LockError;
use crate::spec::JobSpec;

/// Acquire the lock `spec` names (waiting up to its max wait), run `work`
/// with it, release it: when `work` completes, whatever it returns, and also
/// when it panics or this future is dropped (the handle's drop releases, in
/// a task for a remote backend). The guide's `withLock`, Nene's
/// acquire/try/finally.
///
/// `work` gets the [`HeldLock`]: its [`fence`](HeldLock::fence) for fenced
/// writes, [`lost`](HeldLock::lost) to stop when the lock is lost. Returns
/// `work`'s output, or the [`LockError`] that kept the lock from being taken
/// (then `work` never ran). A failed release is traced, not returned: the
/// work is done, and the TTL frees the lock.
///
/// Outside a request there is no route: the spec is a [`JobSpec`], global
/// by its type. `backend` is a [`SharedBackend`](crate::SharedBackend) or a
/// reference to one. The spec's watchdog setting and
/// [minimum hold](JobSpec::min_hold) apply.
///
/// ```
/// use std::time::Duration;
/// use tower_lock::{JobSpec, MemoryBackend, SharedBackend, with_lock};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lock::LockError> {
/// let backend = SharedBackend::new(MemoryBackend::new());
/// let spec = JobSpec::new("report:monthly", Duration::from_secs(30))
///     .max_wait(Duration::from_secs(5));
/// let rows = with_lock(&backend, &spec, |lock| async move {
///     // ... exclusive work, writes fenced by lock.fence() ...
///     42
/// })
/// .await?;
/// assert_eq!(rows, 42);
/// assert!(backend.status(&spec.to_lock_key()?).await?.is_none(), "released");
/// # Ok(())
/// # }
/// ```
pub async fn with_lock<F, Fut>(
    backend: impl AsSharedBackend,
    spec: &JobSpec,
    work: F,
) -> Result<Fut::Output, LockError>
where
    F: FnOnce(HeldLock) -> Fut,
    Fut: Future,
{
    let lock = OwnedLock::acquire(backend, spec).await?;
    // Held across `work`: a panic or a drop releases it through its `Drop`.
    let out = work(lock.info().clone()).await;
    if let Err(e) = lock.release().await {
        tracing::warn!(
            code = e.code(),
            "with_lock: release failed; the TTL frees the lock"
        );
    }
    Ok(out)
}
