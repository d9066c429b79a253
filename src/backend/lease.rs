//! What the operations answer and take beyond a key: leases, statuses,
//! lookups by owner, renewals.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::Holder;
use crate::key::LockKey;
use crate::metadata::LockMetadata;
use crate::spec::LockKind;

/// What a successful acquisition or extension returns.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// Fencing token: strictly greater than any earlier acquisition of the
    /// same key returned, on this backend (never reset by release or expiry).
    pub fence: u64,
    /// When the lock was acquired (wall clock of the backend; Redis reports
    /// an uncontended acquisition with the caller's clock read just before
    /// the request).
    pub acquired_at: SystemTime,
    /// When the lock expires unless extended (same clock as `acquired_at`;
    /// it never falls after the backend's own expiry).
    pub expires_at: SystemTime,
    /// The TTL granted from the moment of this acquisition/extension.
    pub ttl: Duration,
}

impl Lease {
    /// A lease with the given fence, acquired at `acquired_at`, expiring
    /// `ttl` after `now`.
    pub fn new(fence: u64, acquired_at: SystemTime, now: SystemTime, ttl: Duration) -> Self {
        Lease {
            fence,
            acquired_at,
            expires_at: now + ttl,
            ttl,
        }
    }

    /// How long the lease lasts from its start: its TTL, or less where the
    /// backend says it ends sooner (etcd: a waiter's queue entry went on a
    /// lease etcd may drop before the whole TTL has run). Measured between
    /// `acquired_at` and `expires_at`, both on the backend's clock, so skew
    /// cannot shorten it. A lock handle lasts this long.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use tower_lock::backend::Lease;
    ///
    /// let at = SystemTime::now();
    /// let full = Lease::new(1, at, at, Duration::from_secs(5));
    /// assert_eq!(full.lasts(), Duration::from_secs(5));
    /// let mut cut = full.clone();
    /// cut.expires_at = at + Duration::from_secs(2);
    /// assert_eq!(cut.lasts(), Duration::from_secs(2));
    /// ```
    pub fn lasts(&self) -> Duration {
        self.expires_at
            .duration_since(self.acquired_at)
            .unwrap_or_default()
            .min(self.ttl)
    }
}

/// What a status lookup finds for a held lock.
///
/// A lock held shared or under permits has several holders: the fields
/// `owner` to `ttl_remaining` and `metadata` describe the hold that expires
/// first (the earliest a waiter can hope for), and
/// [`holders`](LockStatus::holders) lists them all.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStatus {
    /// The holder's owner token.
    pub owner: String,
    /// The holder's fencing token.
    pub fence: u64,
    /// When the holder acquired it.
    pub acquired_at: SystemTime,
    /// When it expires unless extended.
    pub expires_at: SystemTime,
    /// Time left before it expires.
    pub ttl_remaining: Duration,
    /// Acquirers queued for the lock. A remote backend may still count a
    /// waiter that gave up or died, until its own max wait ends.
    pub waiters: usize,
    /// The metadata the holder stored with this acquisition
    /// ([`AcquireRequest::metadata`](super::AcquireRequest::metadata)), if any.
    pub metadata: Option<LockMetadata>,
    /// How the lock is held: exclusive, shared or under permits.
    pub kind: LockKind,
    /// Every holder of a lock held shared or under permits, in grant order;
    /// empty for an exclusive lock, whose one holder the fields above
    /// describe.
    pub holders: Vec<Hold>,
}

/// One holder of a lock held shared or under permits
/// ([`LockStatus::holders`]).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Hold {
    /// The holder's owner token.
    pub owner: String,
    /// The fence of this hold.
    pub fence: u64,
    /// When it was granted.
    pub acquired_at: SystemTime,
    /// When it expires unless extended.
    pub expires_at: SystemTime,
    /// Time left before it expires.
    pub ttl_remaining: Duration,
    /// The metadata this acquisition stored, if any.
    pub metadata: Option<LockMetadata>,
}

impl Hold {
    /// A hold of `owner` under `fence`.
    pub fn new(
        owner: String,
        fence: u64,
        acquired_at: SystemTime,
        expires_at: SystemTime,
        ttl_remaining: Duration,
    ) -> Self {
        Hold {
            owner,
            fence,
            acquired_at,
            expires_at,
            ttl_remaining,
            metadata: None,
        }
    }

    /// The same hold with its `metadata`.
    pub fn with_metadata(mut self, metadata: Option<LockMetadata>) -> Self {
        self.metadata = metadata;
        self
    }
}

impl LockStatus {
    /// Build a status.
    pub fn new(
        owner: String,
        fence: u64,
        acquired_at: SystemTime,
        expires_at: SystemTime,
        ttl_remaining: Duration,
    ) -> Self {
        LockStatus {
            owner,
            fence,
            acquired_at,
            expires_at,
            ttl_remaining,
            waiters: 0,
            metadata: None,
            kind: LockKind::Exclusive,
            holders: Vec::new(),
        }
    }

    /// The status of a lock held as `kind` by `holders` (at least one; the
    /// one that expires first fills the fields of the status). `None` if
    /// `holders` is empty.
    pub fn of_holders(kind: LockKind, mut holders: Vec<Hold>) -> Option<Self> {
        holders.sort_by_key(|h| h.fence);
        let first = holders.iter().min_by_key(|h| h.expires_at)?;
        let mut status = LockStatus::new(
            first.owner.clone(),
            first.fence,
            first.acquired_at,
            first.expires_at,
            first.ttl_remaining,
        )
        .with_metadata(first.metadata.clone());
        status.kind = kind;
        if kind != LockKind::Exclusive {
            status.holders = holders;
        }
        Some(status)
    }

    /// The same status with the holder's `metadata`.
    pub fn with_metadata(mut self, metadata: Option<LockMetadata>) -> Self {
        self.metadata = metadata;
        self
    }

    /// The same status with `waiters` acquirers queued.
    pub fn with_waiters(mut self, waiters: usize) -> Self {
        self.waiters = waiters;
        self
    }
}

/// One lock an owner token holds, as [`LockBackend::held_by`](super::LockBackend::held_by) finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldBy {
    /// The lock's key (with its scope).
    pub key: LockKey,
    /// Who holds it (the owner asked about) and until when.
    pub status: LockStatus,
}

impl HeldBy {
    /// `key` held as `status` says.
    pub fn new(key: LockKey, status: LockStatus) -> Self {
        HeldBy { key, status }
    }
}

/// One extension in a [`LockBackend::extend_many`](super::LockBackend::extend_many) batch.
#[derive(Clone)]
pub struct ExtendRequest {
    /// The lock's key.
    pub key: LockKey,
    /// The holder's owner token.
    pub owner: Arc<str>,
    /// The fence of the acquisition to renew.
    pub fence: u64,
    /// The new remaining TTL.
    pub ttl: Duration,
}

impl ExtendRequest {
    /// The acquisition to renew.
    pub fn holder(&self) -> Holder<'_> {
        Holder::new(&self.owner, self.fence)
    }
}

// Owner tokens are credentials: `Debug` (logs, panics) leaves them out, as
// `HeldLock`'s does. The fields are public for whoever needs them.
impl fmt::Debug for LockStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockStatus")
            .field("owner", &"<redacted>")
            .field("fence", &self.fence)
            .field("acquired_at", &self.acquired_at)
            .field("expires_at", &self.expires_at)
            .field("ttl_remaining", &self.ttl_remaining)
            .field("waiters", &self.waiters)
            .field("metadata", &self.metadata)
            .field("kind", &self.kind)
            .field("holders", &self.holders)
            .finish()
    }
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold")
            .field("owner", &"<redacted>")
            .field("fence", &self.fence)
            .field("acquired_at", &self.acquired_at)
            .field("expires_at", &self.expires_at)
            .field("ttl_remaining", &self.ttl_remaining)
            .field("metadata", &self.metadata)
            .finish()
    }
}

impl fmt::Debug for ExtendRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtendRequest")
            .field("key", &self.key)
            .field("owner", &"<redacted>")
            .field("fence", &self.fence)
            .field("ttl", &self.ttl)
            .finish()
    }
}
