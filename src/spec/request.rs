//! [`AcquireRequest`]: one validated acquisition, as a backend receives it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{LockKind, new_attempt_id, new_owner_token, validate_owner, validate_ttl};
use crate::error::LockError;
use crate::key::LockKey;
use crate::metadata::LockMetadata;

/// One validated acquisition, as a backend receives it.
///
/// The owner token is made *before* anything is sent, so a caller that gives
/// up mid-flight can still release what may have landed.
#[derive(Clone)]
pub struct AcquireRequest {
    key: LockKey,
    owner: Arc<str>,
    ttl: Duration,
    max_wait: Duration,
    // Which attempt this is (see `attempt()`); 0 exactly when the owner
    // token was made for this acquisition alone.
    attempt: u64,
    kind: LockKind,
    // Boxed, as few requests have any: 8 bytes instead of 32, which keeps
    // the request under the 128 bytes where moves become `memcpy` calls.
    extras: Option<Box<RequestExtras>>,
}

/// What few requests have.
#[derive(Clone)]
pub(super) struct RequestExtras {
    metadata: Option<LockMetadata>,
    // Not the backend's business: the handles keep the lock this long at
    // least (see `LockSpec::min_hold`).
    min_hold: Option<Duration>,
}

impl RequestExtras {
    /// `None` when there is nothing to keep (no allocation).
    pub(super) fn boxed(
        metadata: Option<LockMetadata>,
        min_hold: Option<Duration>,
    ) -> Option<Box<Self>> {
        (metadata.is_some() || min_hold.is_some())
            .then(|| Box::new(RequestExtras { metadata, min_hold }))
    }
}

// As derived before the extras were boxed.
impl fmt::Debug for AcquireRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcquireRequest")
            .field("key", &self.key)
            // A credential: kept out of logs.
            .field("owner", &"<redacted>")
            .field("ttl", &self.ttl)
            .field("max_wait", &self.max_wait)
            .field("attempt", &self.attempt)
            .field("kind", &self.kind)
            .field("metadata", &self.metadata())
            .field("min_hold", &self.min_hold())
            .finish()
    }
}

impl AcquireRequest {
    /// A request of parts checked by the caller (a spec's).
    pub(super) fn from_parts(
        key: LockKey,
        owner: Arc<str>,
        (ttl, max_wait): (Duration, Duration),
        attempt: u64,
        extras: Option<Box<RequestExtras>>,
    ) -> Self {
        AcquireRequest {
            key,
            owner,
            ttl,
            max_wait,
            attempt,
            kind: LockKind::Exclusive,
            extras,
        }
    }

    /// Validate owner and TTL. The request is a new attempt (see
    /// [`attempt`](AcquireRequest::attempt)).
    pub fn new(
        key: LockKey,
        owner: impl Into<Arc<str>>,
        ttl: Duration,
        max_wait: Duration,
    ) -> Result<Self, LockError> {
        let owner = owner.into();
        validate_owner(&owner)?;
        validate_ttl(ttl)?;
        Ok(AcquireRequest {
            key,
            owner,
            ttl,
            max_wait,
            attempt: new_attempt_id(),
            kind: LockKind::Exclusive,
            extras: None,
        })
    }

    /// The same request for a hold of `kind` (default exclusive); checked:
    /// [`LockError::InvalidKind`] for zero or too many permits.
    pub fn with_kind(self, kind: LockKind) -> Result<Self, LockError> {
        kind.validate()?;
        Ok(self.with_kind_unchecked(kind))
    }

    /// [`with_kind`](AcquireRequest::with_kind) of a kind already checked.
    pub(crate) fn with_kind_unchecked(mut self, kind: LockKind) -> Self {
        self.kind = kind;
        self
    }

    /// The kind of hold asked for.
    pub fn kind(&self) -> LockKind {
        self.kind
    }

    /// The same request, storing `metadata` with the lock.
    pub fn with_metadata(mut self, metadata: LockMetadata) -> Self {
        let min_hold = self.min_hold();
        self.extras = RequestExtras::boxed(Some(metadata), min_hold);
        self
    }

    /// The metadata to store with the lock, if any (see
    /// [`LockSpec::metadata`](crate::LockSpec::metadata)). A backend stores it with the lock and
    /// returns it in [`LockStatus::metadata`](crate::LockStatus) for this
    /// acquisition (and only this one: a later holder has its own).
    pub fn metadata(&self) -> Option<&LockMetadata> {
        self.extras.as_ref()?.metadata.as_ref()
    }

    /// The minimum hold of the lock (see [`LockSpec::min_hold`]).
    pub(crate) fn min_hold(&self) -> Option<Duration> {
        self.extras.as_ref()?.min_hold
    }

    /// Which acquisition attempt this is.
    ///
    /// A backend keeps it with the lock and treats an acquire as a retry of
    /// the holder's own (same lease, same fence, TTL refreshed) only when
    /// the owner token, the attempt **and** the kind match: clones of one request
    /// are one attempt, so a call retried after a lost reply is recognised,
    /// while a second request that merely names the same owner token finds
    /// the lock busy. Two requests holding one lock with one fence would
    /// defeat both mutual exclusion and fencing.
    ///
    /// `0` when the owner token was generated for this request (it then
    /// names the attempt by itself); a random non-zero number otherwise.
    pub fn attempt(&self) -> u64 {
        self.attempt
    }

    /// A request under an owner token generated for it alone (so it can be
    /// released after a lost reply, see [`has_fresh_owner`]).
    ///
    /// [`has_fresh_owner`]: AcquireRequest::has_fresh_owner
    pub(crate) fn fresh(
        key: LockKey,
        ttl: Duration,
        max_wait: Duration,
    ) -> Result<Self, LockError> {
        validate_ttl(ttl)?;
        Ok(AcquireRequest {
            key,
            owner: new_owner_token(),
            ttl,
            max_wait,
            attempt: 0,
            kind: LockKind::Exclusive,
            extras: None,
        })
    }

    /// The same attempt, waiting at most `max_wait`.
    pub(crate) fn with_max_wait(&self, max_wait: Duration) -> Self {
        AcquireRequest {
            max_wait,
            ..self.clone()
        }
    }

    /// Whether the owner token was generated for this acquisition alone.
    ///
    /// Nothing else can hold a lock under such a token, so releasing with it
    /// after a failed or dropped call cannot free anyone's lock.
    pub(crate) fn has_fresh_owner(&self) -> bool {
        self.attempt == 0
    }

    /// The key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The owner token.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The owner token, shared.
    pub(crate) fn owner_arc(&self) -> &Arc<str> {
        &self.owner
    }

    /// The TTL (validated: 1 ms to one year).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How long to wait for a busy lock.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }
}

/// Whether two owner tokens are the same, in time that does not depend on
/// where they differ: an owner token is the credential to release a lock,
/// and an early-exit comparison would let a client that can time releases
/// (through the admin API) guess a token byte by byte. Only the length, which
/// is not secret (generated tokens all have 36 bytes), ends it early.
pub(crate) fn owners_match(a: &str, b: &str) -> bool {
    use subtle::{Choice, ConstantTimeEq};
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    // Eight bytes per `ct_eq` (each behind subtle's barriers, which keep the
    // compiler from adding an early exit): a generated token is five
    // comparisons, not the 36 of a byte-wise `ct_eq`.
    let (mut wa, mut wb) = (a.chunks_exact(8), b.chunks_exact(8));
    let mut same = Choice::from(1);
    for (x, y) in (&mut wa).zip(&mut wb) {
        let word = |w: &[u8]| u64::from_ne_bytes(w.try_into().unwrap_or([0; 8]));
        same &= word(x).ct_eq(&word(y));
    }
    same &= wa.remainder().ct_eq(wb.remainder());
    bool::from(same)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_match_exactly() {
        assert!(owners_match("worker-1", "worker-1"));
        assert!(!owners_match("worker-1", "worker-2"));
        assert!(!owners_match("worker-1", "worker-12"));
        assert!(!owners_match("", "x"));
        assert!(owners_match("", ""));
        // Every position of a word and of the tail counts.
        let token = "0123456789abcdef0123456789abcdef0123";
        for i in 0..token.len() {
            let mut other = token.as_bytes().to_vec();
            other[i] ^= 1;
            assert!(
                !owners_match(token, std::str::from_utf8(&other).unwrap()),
                "{i}"
            );
        }
        assert!(owners_match(token, token));
    }
}
