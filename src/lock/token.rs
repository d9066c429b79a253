//! [`LockToken`]: a held lock as data, to hand it to another process.

use serde::{Deserialize, Serialize};

use super::HeldLock;
use crate::error::LockError;
use crate::key::{LockKey, Scope};
use crate::metadata::LockMetadata;
use crate::spec::LockKind;
use crate::time::unix_ms;

/// A held lock as data, to move it between processes (serde).
///
/// Its fields are read with accessors and made only by
/// [`OwnedLock::into_token`] or by deserialising one: its serialised form
/// (JSON object with `key`, `route`, `owner`, `fence`, `expires_at_ms`,
/// `ttl_ms`, `metadata`, `hold_until_ms`) is the format between processes,
/// and fields may be added to it.
///
/// Made by [`OwnedLock::into_token`], taken back by [`OwnedLock::restore`].
/// The owner token inside is the credential to release the lock: treat the
/// token like a secret.
///
/// A token restores **once** ([`OwnedLock::restore`] claims the lock under a
/// new fence): a job delivered twice by an at-least-once queue gets
/// [`LockError::OwnershipMismatch`] the second time, and
/// [`LockError::NotFound`] once the lock was released or expired (the
/// built-in backends keep no tombstones of released locks). An
/// [`OwnedLock`] itself cannot be released twice, and [`Locks::release`]
/// answers [`LockError::AlreadyReleased`].
///
/// ```
/// use std::time::Duration;
/// use tower_lock::{JobSpec, LockToken, MemoryBackend, OwnedLock, SharedBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = SharedBackend::new(MemoryBackend::new());
/// let spec = JobSpec::new("export:7", Duration::from_secs(60));
/// let lock = OwnedLock::acquire(&backend, &spec).await?;
/// let fence = lock.fence();
///
/// // Into the job queue (the lock stays held)...
/// let job = serde_json::to_string(&lock.into_token())?;
/// // ... and out of it, in a worker of any process on the same backend.
/// let token: LockToken = serde_json::from_str(&job)?;
/// let lock = OwnedLock::restore(&backend, &token).await?;
/// // Restoring claims the lock: a new acquisition, under a greater fence.
/// assert!(lock.fence() > fence);
/// // So a token delivered twice restores once.
/// assert!(OwnedLock::restore(&backend, &token).await.is_err());
/// lock.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// [`OwnedLock`]: crate::OwnedLock
/// [`OwnedLock::into_token`]: crate::OwnedLock::into_token
/// [`OwnedLock::restore`]: crate::OwnedLock::restore
/// [`Locks::release`]: crate::Locks::release
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockToken {
    // The user's key.
    key: String,
    // The route pattern of a route-scoped lock; `None` for global.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    route: Option<String>,
    // The owner token.
    owner: String,
    // The fencing token of the acquisition.
    fence: u64,
    // Expiry when the token was made, in milliseconds since the Unix epoch.
    expires_at_ms: u64,
    // The TTL the lock was taken (or last extended) with, in milliseconds:
    // what a watchdog started after [`OwnedLock::restore`](crate::OwnedLock::restore) renews it by.
    // Absent in tokens from before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ttl_ms: Option<u64>,
    // The metadata stored with the lock ([`LockSpec::metadata`](crate::LockSpec::metadata)).
    // [`OwnedLock::restore`](crate::OwnedLock::restore) returns what the
    // backend holds, not this copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    metadata: Option<LockMetadata>,
    // The end of the lock's minimum hold ([`LockSpec::min_hold`](crate::LockSpec::min_hold)),
    // in milliseconds since the Unix epoch: a restored lock released before
    // then is kept until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hold_until_ms: Option<u64>,
    // The kind of hold (`shared`, `permits=N`), absent for an exclusive lock
    // (and in tokens from before kinds existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mode: Option<String>,
}

// The owner token is a credential: kept out of logs (as `HeldLock` does).
impl std::fmt::Debug for LockToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockToken")
            .field("key", &self.key)
            .field("route", &self.route)
            .field("owner", &"<redacted>")
            .field("fence", &self.fence)
            .field("expires_at_ms", &self.expires_at_ms)
            .field("ttl_ms", &self.ttl_ms)
            .field("metadata", &self.metadata)
            .field("hold_until_ms", &self.hold_until_ms)
            .field("mode", &self.mode)
            .finish()
    }
}

impl LockToken {
    pub(super) fn from_lock(lock: &HeldLock) -> Self {
        LockToken {
            key: lock.key().to_owned(),
            route: lock.key.route_pattern().map(str::to_owned),
            owner: lock.owner().to_owned(),
            fence: lock.fence(),
            expires_at_ms: unix_ms(lock.expires_at()),
            ttl_ms: Some(u64::try_from(lock.ttl().as_millis()).unwrap_or(u64::MAX)),
            metadata: lock.metadata().cloned(),
            hold_until_ms: lock.hold_left().map(|left| {
                unix_ms(std::time::SystemTime::now())
                    .saturating_add(u64::try_from(left.as_millis()).unwrap_or(u64::MAX))
            }),
            mode: (lock.kind() != LockKind::Exclusive).then(|| lock.kind().to_string()),
        }
    }

    /// The kind of hold the token carries (exclusive when it names none,
    /// or one this version cannot read: the backend's claim decides).
    pub fn kind(&self) -> LockKind {
        self.mode
            .as_deref()
            .and_then(|m| m.parse().ok())
            .unwrap_or_default()
    }

    /// The minimum hold left, by the wall clock (see `hold_until_ms`).
    pub(super) fn hold_left(&self) -> Option<std::time::Duration> {
        let until = self.hold_until_ms?;
        let left = until.checked_sub(unix_ms(std::time::SystemTime::now()))?;
        Some(std::time::Duration::from_millis(left))
    }

    /// The user's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The route pattern of a route-scoped lock; `None` for global.
    pub fn route(&self) -> Option<&str> {
        self.route.as_deref()
    }

    /// The owner token: the credential to release the lock.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The fencing token of the acquisition.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Expiry when the token was made, in milliseconds since the Unix epoch.
    pub fn expires_at_ms(&self) -> u64 {
        self.expires_at_ms
    }

    /// The TTL the lock was taken (or last extended) with, in milliseconds:
    /// what a watchdog started after [`OwnedLock::restore`](crate::OwnedLock::restore)
    /// renews it by. `None` in tokens from before it existed.
    pub fn ttl_ms(&self) -> Option<u64> {
        self.ttl_ms
    }

    /// The metadata stored with the lock ([`LockSpec::metadata`](crate::LockSpec::metadata)).
    /// [`OwnedLock::restore`](crate::OwnedLock::restore) returns what the
    /// backend holds, not this copy.
    pub fn metadata(&self) -> Option<&LockMetadata> {
        self.metadata.as_ref()
    }

    /// The end of the lock's minimum hold ([`LockSpec::min_hold`](crate::LockSpec::min_hold)),
    /// in milliseconds since the Unix epoch: a restored lock released before
    /// then is kept until then.
    pub fn hold_until_ms(&self) -> Option<u64> {
        self.hold_until_ms
    }

    /// The validated key this token names.
    pub fn lock_key(&self) -> Result<LockKey, LockError> {
        match &self.route {
            None => LockKey::global(&self.key),
            Some(route) => LockKey::route(route, &self.key),
        }
    }

    /// The scope of the lock.
    pub fn scope(&self) -> Scope {
        if self.route.is_some() {
            Scope::Route
        } else {
            Scope::Global
        }
    }
}
