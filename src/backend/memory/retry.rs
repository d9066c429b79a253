//! A retry of the same request (same owner token, attempt and kind): the
//! acquisition it names, and a hold such a retry took over.

use tokio::time::Instant;

use super::table::Entry;
use crate::spec::{AcquireRequest, LockKind, owners_match};

impl Entry {
    /// Whether `req` is the exclusive holder's own attempt (a retry): same
    /// owner token, same attempt, exclusive. Another request naming the
    /// same owner is not the holder, nor one of another kind.
    pub(super) fn held_by(&self, req: &AcquireRequest) -> bool {
        self.attempt == req.attempt()
            && req.kind() == LockKind::Exclusive
            && owners_match(&self.owner, req.owner())
    }

    /// Whether `req`'s own acquisition holds the lock, live: a retry of it
    /// is answered at once (see `group_retry` and the exclusive retry).
    pub(super) fn holds_for(&self, req: &AcquireRequest, now: Instant) -> bool {
        match self.group() {
            Some(g) => {
                g.kind == req.kind()
                    && g.holds.iter().any(|h| {
                        h.expires > now
                            && h.attempt == req.attempt()
                            && owners_match(&h.owner, req.owner())
                    })
            }
            None => self.expires > now && self.held_by(req),
        }
    }

    /// Whether a retry of its request took over the hold under `fence`
    /// (exclusive, or one of the group): a hand-off to a call of that
    /// request that then went away without reading it is not that call's
    /// to give back.
    pub(super) fn retaken(&self, fence: u64) -> bool {
        match self.group() {
            Some(g) => g.holds.iter().any(|h| h.fence == fence && h.retaken),
            None => self.extra.as_ref().is_some_and(|x| x.retaken == fence),
        }
    }
}
