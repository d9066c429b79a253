//! [`LockSpec`]: what a route asks the layer to lock for one request.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use smol_str::SmolStr;

use crate::error::LockError;
use crate::key::{LockKey, Scope};
use crate::metadata::LockMetadata;

mod kind;
mod request;

pub use kind::{LockKind, MAX_PERMITS};
pub use request::AcquireRequest;
use request::RequestExtras;
pub(crate) use request::owners_match;

mod global;
pub use global::JobSpec;

/// The longest TTL accepted (one year): longer ones are almost surely a unit
/// mistake, and keep every backend far from integer overflow.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest owner token accepted, in bytes.
pub const MAX_OWNER_BYTES: usize = 128;

/// What to lock: a key, a TTL and how to wait, scope and release.
///
/// Built with [`LockSpec::new`] and refined with the builder methods. Nothing
/// is validated here: the layer validates when it acquires and answers `400`
/// with `LOCK_INVALID_KEY`/`LOCK_INVALID_TTL`/`LOCK_INVALID_OWNER` for a bad
/// spec, so a key taken from a request can never make the service panic.
///
/// ```
/// use std::time::Duration;
/// use tower_lock::{LockSpec, Scope};
///
/// let spec = LockSpec::new("order:42", Duration::from_secs(30))
///     .max_wait(Duration::from_secs(2))
///     .scope(Scope::Global);
/// assert_eq!(spec.get_key(), "order:42");
/// assert_eq!(spec.get_max_wait(), Duration::from_secs(2));
/// assert!(spec.get_auto_release());
/// ```
///
/// Like every type built with setters in this crate (as
/// `std::process::Command`), a field is set with its name and read with
/// `get_<name>`.
#[derive(Clone)]
pub struct LockSpec {
    key: String,
    ttl: Duration,
    max_wait: Duration,
    scope: Scope,
    auto_release: bool,
    watchdog: Option<bool>,
    kind: LockKind,
    // Boxed, as few specs set any: 8 bytes in every spec instead of ~120,
    // which keeps it under the 128 bytes where moves become `memcpy` calls.
    extras: Option<Box<SpecExtras>>,
}

/// What few specs set.
#[derive(Clone, Default)]
struct SpecExtras {
    owner: Option<String>,
    // Checked when set, reported when the spec is used.
    metadata: Option<Result<LockMetadata, LockError>>,
    min_hold: Option<Duration>,
    // A spec that must be refused as it is used (see `LockSpec::refused`).
    refused: Option<LockError>,
}

impl SpecExtras {
    /// What the request gets of them, or why the spec is refused.
    fn to_request(&self, ttl: Duration) -> Result<Option<Box<RequestExtras>>, LockError> {
        if let Some(error) = &self.refused {
            return Err(error.clone());
        }
        let metadata = match &self.metadata {
            None => None,
            Some(Ok(metadata)) => Some(metadata.clone()),
            Some(Err(e)) => return Err(e.clone()),
        };
        Ok(RequestExtras::boxed(
            metadata,
            self.min_hold.map(|d| d.min(ttl)),
        ))
    }
}

// As derived before the extras were boxed.
impl fmt::Debug for LockSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let extras = self.extras.as_deref();
        f.debug_struct("LockSpec")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("max_wait", &self.max_wait)
            .field("scope", &self.scope)
            // A credential: only whether one was set.
            .field(
                "owner",
                &extras.and_then(|e| e.owner.as_ref()).map(|_| "<redacted>"),
            )
            .field("auto_release", &self.auto_release)
            .field("watchdog", &self.watchdog)
            .field("kind", &self.kind)
            .field("metadata", &extras.and_then(|e| e.metadata.as_ref()))
            .field("min_hold", &extras.and_then(|e| e.min_hold))
            .field("refused", &extras.and_then(|e| e.refused.as_ref()))
            .finish()
    }
}

impl LockSpec {
    /// Lock `key` of the route the request took for at most `ttl`
    /// ([`Scope::Route`]: the same key on two routes is two locks). No
    /// waiting, a random owner token, released after the response.
    ///
    /// Outside a request (a job, [`with_lock`](crate::with_lock),
    /// [`OwnedLock::acquire`](crate::OwnedLock::acquire)) there is no route:
    /// those take a [`JobSpec`], global by its type.
    pub fn new(key: impl Into<String>, ttl: Duration) -> Self {
        Self::with_scope(key.into(), ttl, Scope::Route)
    }

    /// Lock `key` for at most `ttl`, shared by every route and job that
    /// names it ([`Scope::Global`]). No waiting, a random owner token,
    /// released after the response. A job's own lock is a [`JobSpec`] (the
    /// same lock, global by its type).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_lock::{LockSpec, Scope};
    ///
    /// let spec = LockSpec::global("nightly-report", Duration::from_secs(60));
    /// assert_eq!(spec.get_scope(), Scope::Global);
    /// ```
    pub fn global(key: impl Into<String>, ttl: Duration) -> Self {
        Self::with_scope(key.into(), ttl, Scope::Global)
    }

    fn with_scope(key: String, ttl: Duration, scope: Scope) -> Self {
        LockSpec {
            key,
            ttl,
            max_wait: Duration::ZERO,
            scope,
            auto_release: true,
            watchdog: None,
            kind: LockKind::Exclusive,
            extras: None,
        }
    }

    /// The extras, made if needed.
    fn extras_mut(&mut self) -> &mut SpecExtras {
        self.extras.get_or_insert_default()
    }

    /// A spec that fails with `error` where it is used: the layer answers
    /// with `error`'s status and code (a client-directed lock with a bad
    /// header is refused this way, see [`ClientLocks`](crate::ClientLocks)).
    pub(crate) fn refused(error: LockError) -> Self {
        let mut spec = LockSpec::new("-", Duration::from_secs(1));
        spec.extras_mut().refused = Some(error);
        spec
    }

    /// Store a small JSON object with the lock: who took it and why (at most
    /// [`MAX_METADATA_BYTES`](crate::MAX_METADATA_BYTES), an object). Lookups
    /// return it ([`LockStatus`](crate::LockStatus), [`HeldLock::metadata`](crate::HeldLock::metadata),
    /// tokens, the admin API). Anything else is refused where the spec is
    /// used, with [`LockError::InvalidMetadata`] (`400` from the layer).
    ///
    /// ```
    /// use std::time::Duration;
    /// use serde_json::json;
    /// use tower_lock::LockSpec;
    ///
    /// let spec = LockSpec::global("report:2024-03", Duration::from_secs(600))
    ///     .metadata(json!({"by": "cron@host-3", "reason": "monthly billing"}));
    /// assert_eq!(spec.get_metadata().unwrap().to_value()["by"], "cron@host-3");
    /// ```
    ///
    /// The built-in remote backends store metadata with one more write after
    /// the acquisition (Redis, PostgreSQL): a lock without metadata costs
    /// nothing more.
    pub fn metadata(mut self, metadata: serde_json::Value) -> Self {
        self.extras_mut().metadata = Some(LockMetadata::new(metadata));
        self
    }

    /// The metadata, if set and valid.
    pub fn get_metadata(&self) -> Option<&LockMetadata> {
        self.extras.as_ref()?.metadata.as_ref()?.as_ref().ok()
    }

    /// Hold the lock at least `min_hold` after acquiring it, even if it is
    /// released sooner: a release before then leaves the lock to expire at
    /// acquisition + `min_hold` instead of freeing it (an owner-checked
    /// extension to the time left). For singleton scheduled jobs (ShedLock's
    /// `lockAtLeastFor`): a run that finishes early keeps the lock, so an
    /// instance whose schedule fires a little later does not run the job
    /// again. The TTL stays the most it is held (`lockAtMostFor`), for a
    /// holder that crashed; a `min_hold` longer than the TTL counts as the
    /// TTL.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_lock::LockSpec;
    ///
    /// // Every instance fires at 02:00; whoever wins holds it 5 min at least, 30 at most.
    /// let spec = LockSpec::global("nightly-report", Duration::from_secs(30 * 60))
    ///     .min_hold(Duration::from_secs(5 * 60));
    /// assert_eq!(spec.get_min_hold(), Some(Duration::from_secs(300)));
    /// ```
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.extras_mut().min_hold = Some(min_hold);
        self
    }

    /// The minimum hold, if any.
    pub fn get_min_hold(&self) -> Option<Duration> {
        self.extras.as_ref()?.min_hold
    }

    /// Wait up to `max_wait` for a busy lock (default zero: one attempt).
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// Set the scope (default: [`Scope::Route`] from [`LockSpec::new`],
    /// [`Scope::Global`] from [`LockSpec::global`]).
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// Use this owner token instead of a random one (1 to 128 bytes of
    /// printable ASCII, no spaces).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.extras_mut().owner = Some(owner.into());
        self
    }

    /// Whether to release the lock after the response (default `true`).
    /// A lock kept (`false`) outlives the response only when the response
    /// leaves the layer: its owner token goes out with it (the `lock-owner`
    /// header). If the handler never answers, or its response never leaves
    /// (the client went away, a timeout or a panic caught outside the
    /// layer, a service error), it is released as any other. To hand a lock
    /// to work that outlives a failed request, move it out with
    /// [`Locks::cancel_auto_release`](crate::Locks::cancel_auto_release).
    pub fn auto_release(mut self, auto_release: bool) -> Self {
        self.auto_release = auto_release;
        self
    }

    /// Renew the lock by its TTL every TTL/3 while it is held (default: the
    /// layer's setting, off unless [`LockLayer::watchdog`] turned it on).
    ///
    /// For work whose length is unknown: keep the TTL short (a crashed
    /// holder frees the lock soon) and let the watchdog keep it while the
    /// work runs. Watch [`HeldLock::lost`] to stop work whose lock was lost.
    ///
    /// [`LockLayer::watchdog`]: crate::LockLayer::watchdog
    /// [`HeldLock::lost`]: crate::HeldLock::lost
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = Some(on);
        self
    }

    /// Whether the watchdog was turned on or off for this spec (`None`:
    /// the layer decides).
    pub fn get_watchdog(&self) -> Option<bool> {
        self.watchdog
    }

    /// The raw key as given.
    pub fn get_key(&self) -> &str {
        &self.key
    }

    /// The TTL.
    pub fn get_ttl(&self) -> Duration {
        self.ttl
    }

    /// The max wait.
    pub fn get_max_wait(&self) -> Duration {
        self.max_wait
    }

    /// The scope.
    pub fn get_scope(&self) -> Scope {
        self.scope
    }

    /// The custom owner token, if any.
    pub fn get_owner(&self) -> Option<&str> {
        self.extras.as_ref()?.owner.as_deref()
    }

    /// Whether the lock is released after the response.
    pub fn get_auto_release(&self) -> bool {
        self.auto_release
    }

    /// Validate and turn into a backend request; `route` is the matched route
    /// pattern used for [`Scope::Route`].
    pub(crate) fn to_request(&self, route: &SmolStr) -> Result<AcquireRequest, LockError> {
        let key = match self.scope {
            Scope::Global => LockKey::global(&self.key)?,
            Scope::Route => LockKey::in_route(route, &self.key)?,
        };
        self.request_for(key)
    }

    /// [`to_request`](LockSpec::to_request) with a route not yet shared
    /// (outside a request): copied only for a route-scoped key.
    pub(crate) fn to_request_in(&self, route: &str) -> Result<AcquireRequest, LockError> {
        self.request_for(self.lock_key_in(route)?)
    }

    fn request_for(&self, key: LockKey) -> Result<AcquireRequest, LockError> {
        let extras = match self.extras.as_deref() {
            None => None,
            Some(extras) => extras.to_request(self.ttl)?,
        };
        let custom = self.extras.as_ref().and_then(|e| e.owner.as_ref());
        let owner: Arc<str> = match custom {
            Some(owner) => {
                validate_owner(owner)?;
                Arc::from(owner.as_str())
            }
            None => new_owner_token(),
        };
        validate_ttl(self.ttl)?;
        self.kind.validate()?;
        // A generated owner token names this attempt by itself.
        let attempt = if custom.is_none() {
            0
        } else {
            new_attempt_id()
        };
        Ok(
            AcquireRequest::from_parts(key, owner, (self.ttl, self.max_wait), attempt, extras)
                .with_kind_unchecked(self.kind),
        )
    }

    /// The key of a global spec, validated: what to ask
    /// [`status`](crate::LockBackend::status) or [`owns`](crate::LockBackend::owns)
    /// about. A route-scoped spec names no key outside its route:
    /// [`LockError::InvalidKey`] (make it with [`LockKey::route`]).
    pub fn to_lock_key(&self) -> Result<LockKey, LockError> {
        match self.scope {
            Scope::Global => LockKey::global(&self.key),
            Scope::Route => Err(LockError::InvalidKey(
                "a route-scoped spec names its key only with its route (LockKey::route)",
            )),
        }
    }

    /// The key the spec names (validated), in the namespace of `route`.
    pub(crate) fn lock_key_in(&self, route: &str) -> Result<LockKey, LockError> {
        match self.scope {
            Scope::Global => LockKey::global(&self.key),
            Scope::Route => LockKey::route(route, &self.key),
        }
    }
}

/// A spec is the list of one lock: a [`LockRequest`](crate::LockRequest)
/// (and a closure given to [`LockLayer::from_fn`](crate::LockLayer::from_fn))
/// can return a bare `LockSpec` for a route that always locks.
impl IntoIterator for LockSpec {
    type Item = LockSpec;
    type IntoIter = std::iter::Once<LockSpec>;

    fn into_iter(self) -> Self::IntoIter {
        std::iter::once(self)
    }
}

/// A generated owner token: a hyphenated UUID v4 (valid: no need to check).
fn new_owner_token() -> Arc<str> {
    let mut buf = uuid::Uuid::encode_buffer();
    Arc::from(&*uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf))
}

/// A random, non-zero attempt id (see [`AcquireRequest::attempt`]).
pub(crate) fn new_attempt_id() -> u64 {
    let (hi, lo) = uuid::Uuid::new_v4().as_u64_pair();
    (hi ^ lo).max(1)
}

/// Check an owner token: 1 to [`MAX_OWNER_BYTES`] bytes of visible ASCII.
pub(crate) fn validate_owner(owner: &str) -> Result<(), LockError> {
    if owner.is_empty() {
        return Err(LockError::InvalidOwner("the owner token is empty"));
    }
    if owner.len() > MAX_OWNER_BYTES {
        return Err(LockError::InvalidOwner(
            "the owner token is longer than 128 bytes",
        ));
    }
    if !owner.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(LockError::InvalidOwner(
            "the owner token must be printable ASCII without spaces",
        ));
    }
    Ok(())
}

/// Check a TTL: at least 1 ms, at most [`MAX_TTL`]. A backend checks the
/// TTL of [`LockBackend::extend`](crate::backend::LockBackend::extend) with
/// it (acquisitions arrive checked, in an [`AcquireRequest`]).
pub fn validate_ttl(ttl: Duration) -> Result<(), LockError> {
    if ttl < Duration::from_millis(1) {
        return Err(LockError::InvalidTtl("the TTL must be at least 1 ms"));
    }
    if ttl > MAX_TTL {
        return Err(LockError::InvalidTtl("the TTL must be at most one year"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_owner_and_ttl() {
        let key = LockKey::global("k").unwrap();
        let ok = |o: &str, t| AcquireRequest::new(key.clone(), o, t, Duration::ZERO);
        assert!(ok("abc", Duration::from_secs(1)).is_ok());
        assert!(matches!(
            ok("", Duration::from_secs(1)),
            Err(LockError::InvalidOwner(_))
        ));
        assert!(matches!(
            ok("a b", Duration::from_secs(1)),
            Err(LockError::InvalidOwner(_))
        ));
        assert!(matches!(
            ok("abc", Duration::ZERO),
            Err(LockError::InvalidTtl(_))
        ));
        assert!(matches!(
            ok("abc", Duration::from_micros(999)),
            Err(LockError::InvalidTtl(_))
        ));
        assert!(matches!(
            ok("abc", MAX_TTL + Duration::from_secs(1)),
            Err(LockError::InvalidTtl(_))
        ));
    }

    #[test]
    fn generated_owners_differ_and_are_valid() {
        let spec = LockSpec::global("k", Duration::from_secs(1));
        let (a, b) = (
            spec.to_request_in("").unwrap(),
            spec.to_request_in("").unwrap(),
        );
        assert_ne!(a.owner(), b.owner());
        assert!(validate_owner(a.owner()).is_ok());
        assert_eq!(
            (a.attempt(), b.attempt()),
            (0, 0),
            "generated owners name their attempt"
        );
        let custom = LockSpec::new("k", Duration::from_secs(1)).owner("me");
        let (c, d) = (
            custom.to_request_in("").unwrap(),
            custom.to_request_in("").unwrap(),
        );
        assert_ne!(c.attempt(), d.attempt());
        assert_eq!(
            c.clone().attempt(),
            c.attempt(),
            "a clone is the same attempt"
        );
    }
}
