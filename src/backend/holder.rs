//! [`Holder`]: which acquisition a call after acquire means.

use std::fmt;

/// Which acquisition of a lock a release, an extension, a renewal or a claim
/// is about: the owner token **and** the fence the acquisition was granted.
///
/// The owner token alone does not name an acquisition: a custom owner
/// ([`LockSpec::owner`](crate::LockSpec::owner), a `Lock-Owner` header) is
/// shared by every acquisition made under it. A holder that paused past its
/// TTL while another request with the same owner took the lock (fence 2)
/// must not release, extend or renew that lock with its own fence 1: the
/// backend compares both, in the same atomic step as the change, and answers
/// [`LockError::OwnershipMismatch`](crate::LockError::OwnershipMismatch) to
/// the stale one.
///
/// [`Holder::owner_only`] leaves the fence out. It is only right for an owner
/// token made for one acquisition (a generated one): the crate uses it to
/// clean up after an acquisition whose reply never came (the fence was never
/// learnt), and the admin API for an operator who gives no fence.
///
/// ```
/// use tower_lock::backend::Holder;
///
/// let h = Holder::new("nightly-job", 7);
/// assert_eq!((h.owner(), h.fence()), ("nightly-job", Some(7)));
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Holder<'a> {
    owner: &'a str,
    fence: Option<u64>,
}

impl<'a> Holder<'a> {
    /// The acquisition granted to `owner` under `fence`.
    pub fn new(owner: &'a str, fence: u64) -> Self {
        Holder {
            owner,
            fence: Some(fence),
        }
    }

    /// Whatever acquisition `owner` holds: only for an owner token that
    /// names one acquisition by itself (see the type's docs).
    pub fn owner_only(owner: &'a str) -> Self {
        Holder { owner, fence: None }
    }

    /// The owner token.
    pub fn owner(&self) -> &'a str {
        self.owner
    }

    /// The fence of the acquisition; `None` for [`Holder::owner_only`].
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// Whether a lock held by `owner` under `fence` is this acquisition
    /// (owner tokens compared in constant time).
    pub fn matches(&self, owner: &str, fence: u64) -> bool {
        // Both sides are evaluated: the comparison's time must not tell
        // whether the fence matched.
        let same_owner = crate::spec::owners_match(self.owner, owner);
        let same_fence = self.fence.is_none_or(|f| f == fence);
        same_owner & same_fence
    }
}

impl fmt::Debug for Holder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The owner token is a credential: keep it out of logs.
        f.debug_struct("Holder")
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}
