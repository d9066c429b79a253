//! [`JobSpec`]: what a job locks, global by its type.
//!
//! Outside a request there is no route for a [`Scope::Route`] key to be
//! scoped by. The job APIs ([`OwnedLock::acquire`](crate::OwnedLock::acquire),
//! [`with_lock`](crate::with_lock)) take a `JobSpec`, which is global by
//! construction, so a spec made with [`LockSpec::new`] (route-scoped) passed
//! to them is a type error at compile time, not a `LOCK_INVALID_KEY` at run
//! time. A wrapper rather than a type parameter on `LockSpec`: the layer's
//! hooks keep returning plain `LockSpec`s.

use std::time::Duration;

use super::{LockKind, LockSpec};
use crate::error::LockError;
use crate::key::{LockKey, Scope};

/// What a job locks: a [`LockSpec`] of [`Scope::Global`], the only scope a
/// lock taken outside a request can have. Built with [`JobSpec::new`] and
/// the builder methods a job needs (the same names as [`LockSpec`]'s);
/// read with [`as_lock_spec`](JobSpec::as_lock_spec).
///
/// ```
/// use std::time::Duration;
/// use tower_lock::{JobSpec, MemoryBackend, OwnedLock, Scope, SharedBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lock::LockError> {
/// let backend = SharedBackend::new(MemoryBackend::new());
/// let spec = JobSpec::new("nightly-report", Duration::from_secs(60))
///     .max_wait(Duration::from_secs(5));
/// assert_eq!(spec.as_lock_spec().get_scope(), Scope::Global);
/// let lock = OwnedLock::acquire(&backend, &spec).await?;
/// lock.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// A route-scoped [`LockSpec`] does not compile where a job's lock is
/// taken (take a route's lock with
/// [`OwnedLock::acquire_in_route`](crate::OwnedLock::acquire_in_route)):
///
/// ```compile_fail
/// use std::time::Duration;
/// use tower_lock::{LockSpec, MemoryBackend, OwnedLock, SharedBackend};
///
/// # async fn job() -> Result<(), tower_lock::LockError> {
/// let backend = SharedBackend::new(MemoryBackend::new());
/// let spec = LockSpec::new("nightly-report", Duration::from_secs(60));
/// let lock = OwnedLock::acquire(&backend, &spec).await?; // expected `&JobSpec`
/// # Ok(())
/// # }
/// ```
///
/// A spec whose scope is only known at run time converts with
/// [`TryFrom`]; a `JobSpec` converts into a [`LockSpec`] (for a layer's
/// hook) with [`From`].
#[derive(Clone, Debug)]
pub struct JobSpec(LockSpec);

impl JobSpec {
    /// Lock `key` for at most `ttl`, shared by every job and route that
    /// names it globally. No waiting, a random owner token.
    pub fn new(key: impl Into<String>, ttl: Duration) -> Self {
        JobSpec(LockSpec::global(key, ttl))
    }

    /// Wait up to `max_wait` for a busy lock (default zero: one attempt).
    pub fn max_wait(self, max_wait: Duration) -> Self {
        JobSpec(self.0.max_wait(max_wait))
    }

    /// Use this owner token instead of a random one (see
    /// [`LockSpec::owner`]).
    pub fn owner(self, owner: impl Into<String>) -> Self {
        JobSpec(self.0.owner(owner))
    }

    /// Store a small JSON object with the lock (see
    /// [`LockSpec::metadata`]).
    pub fn metadata(self, metadata: serde_json::Value) -> Self {
        JobSpec(self.0.metadata(metadata))
    }

    /// Hold the lock at least `min_hold` after acquiring it (see
    /// [`LockSpec::min_hold`]).
    pub fn min_hold(self, min_hold: Duration) -> Self {
        JobSpec(self.0.min_hold(min_hold))
    }

    /// Take a shared (read) hold (see [`LockSpec::shared`]).
    pub fn shared(self) -> Self {
        JobSpec(self.0.shared())
    }

    /// Take one of `n` permits of the key (see [`LockSpec::permits`]).
    pub fn permits(self, n: u32) -> Self {
        JobSpec(self.0.permits(n))
    }

    /// Set the kind of hold (see [`LockSpec::kind`]).
    pub fn kind(self, kind: LockKind) -> Self {
        JobSpec(self.0.kind(kind))
    }

    /// Renew the lock by its TTL every TTL/3 while it is held (default off
    /// for a job; see [`LockSpec::watchdog`]).
    pub fn watchdog(self, on: bool) -> Self {
        JobSpec(self.0.watchdog(on))
    }

    /// The spec, to read its settings (`get_key`, `get_ttl`, ...).
    pub fn as_lock_spec(&self) -> &LockSpec {
        &self.0
    }

    /// The key, validated: what to ask
    /// [`status`](crate::LockBackend::status) or [`owns`](crate::LockBackend::owns)
    /// about.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`] for a key that is empty or too long.
    pub fn to_lock_key(&self) -> Result<LockKey, LockError> {
        self.0.to_lock_key()
    }
}

impl AsRef<LockSpec> for JobSpec {
    fn as_ref(&self) -> &LockSpec {
        &self.0
    }
}

/// The same lock for a layer's hook (a route taking a job's lock).
impl From<JobSpec> for LockSpec {
    fn from(spec: JobSpec) -> Self {
        spec.0
    }
}

/// A spec whose scope is decided at run time: global ones convert, a
/// route-scoped one is [`LockError::InvalidKey`] (it has no route here).
impl TryFrom<LockSpec> for JobSpec {
    type Error = LockError;

    fn try_from(spec: LockSpec) -> Result<Self, LockError> {
        match spec.get_scope() {
            Scope::Global => Ok(JobSpec(spec)),
            Scope::Route => Err(LockError::InvalidKey(
                "a route-scoped spec has no route outside a request: make it with \
                 JobSpec::new, or use OwnedLock::acquire_in_route",
            )),
        }
    }
}
