//! What a backend stores and answers for single-flight (see
//! [`SingleFlight`](crate::flight::SingleFlight)): a flight's lock, its latest
//! result, and a wake-up for the callers that wait for it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{BoxFuture, Lease};
use crate::error::LockError;

/// A result stored by a flight's leader.
#[derive(Clone, PartialEq, Eq)]
pub struct FlightResult {
    /// The fence of the lock it was computed under: results of one key are
    /// ordered by it (a later leader holds a larger fence).
    pub seq: u64,
    /// The encoded result.
    pub value: Arc<[u8]>,
}

impl fmt::Debug for FlightResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlightResult")
            .field("seq", &self.seq)
            .field("bytes", &self.value.len())
            .finish()
    }
}

/// How a flight starts for one caller: [`LockBackend::flight_begin`].
///
/// [`LockBackend::flight_begin`]: super::LockBackend::flight_begin
pub enum FlightStart {
    /// A result that still answers new callers (its result TTL has not
    /// passed): use it, nothing was taken.
    Fresh(FlightResult),
    /// Nobody computes: the caller now holds the flight's lock (the lease)
    /// and computes.
    Leader(Lease),
    /// Someone computes: the caller waits for that one's result (or for
    /// the lock, should that one fail).
    Busy(FlightWait),
}

impl fmt::Debug for FlightStart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlightStart::Fresh(r) => f.debug_tuple("Fresh").field(r).finish(),
            FlightStart::Leader(l) => f.debug_tuple("Leader").field(l).finish(),
            FlightStart::Busy(w) => f.debug_tuple("Busy").field(w).finish(),
        }
    }
}

/// A caller's wait for a flight's next result: what
/// [`FlightStart::Busy`] carries.
pub struct FlightWait {
    /// The `seq` of the newest result stored when the caller came (0 for
    /// none): a result with a larger one was computed after it came.
    pub seen: u64,
    /// Resolves with the first result published under the key with a `seq`
    /// larger than [`seen`](FlightWait::seen). An `Err` means that wake-up
    /// can no longer come (e.g. the connection it was coming on died): the
    /// caller then waits on the flight's lock alone, and reads the result
    /// once it holds the lock. Dropping it stops the wait.
    pub result: BoxFuture<'static, Result<FlightResult, LockError>>,
}

impl fmt::Debug for FlightWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlightWait")
            .field("seen", &self.seen)
            .finish_non_exhaustive()
    }
}

/// A leader's result, for [`LockBackend::flight_publish`].
///
/// [`LockBackend::flight_publish`]: super::LockBackend::flight_publish
#[derive(Clone)]
pub struct FlightPublish {
    /// The fence of the leader's lease: the result's `seq`.
    pub fence: u64,
    /// The encoded result.
    pub value: Arc<[u8]>,
    /// How long the result answers new callers ([`FlightStart::Fresh`]);
    /// zero: only the callers already waiting get it.
    pub result_ttl: Duration,
    /// How long it is kept at all, for callers that were waiting when it
    /// came and read it once they hold the lock (at least `result_ttl`). A
    /// backend keeps it that long only when callers wait for it (they watch
    /// for the result or are queued for the lock); with nobody waiting it is
    /// kept for `result_ttl` alone, and not stored at all when that is zero.
    pub keep: Duration,
}

impl fmt::Debug for FlightPublish {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlightPublish")
            .field("fence", &self.fence)
            .field("bytes", &self.value.len())
            .field("result_ttl", &self.result_ttl)
            .field("keep", &self.keep)
            .finish()
    }
}
