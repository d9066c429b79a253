//! [`RetryAfter`]: what a layer's `429` tells a client about when to come
//! back, and the recent hold times its estimate is drawn from.

use std::sync::Mutex;
use std::time::Duration;

use crate::error::LockError;

/// How a [`LockLayer`](crate::LockLayer) sets `Retry-After` on a `429`
/// for a busy lock (see [`LockLayer::retry_after`](crate::LockLayer::retry_after)).
///
/// The holder's remaining TTL is a bound on the wait, not the wait: a
/// handler that runs 50 ms under a 30 s TTL frees the lock in milliseconds
/// (the response releases it), and `Retry-After: 30` sends its clients
/// away 600 times longer than needed. The estimate answers with how long
/// the route's requests have held the lock lately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RetryAfter {
    /// How long the route's recent requests held the lock (the 90th
    /// percentile of the last 64), at most the holder's remaining TTL; the
    /// remaining TTL until the route has a hold time on record. The default.
    #[default]
    Estimate,
    /// The holder's remaining TTL: when the lock is free at the latest,
    /// should its holder never release it.
    RemainingTtl,
    /// Always this long.
    Fixed(Duration),
}

/// Hold times kept for the estimate.
const WINDOW: usize = 64;

/// The policy of one layer, with the hold times of its requests.
#[derive(Debug, Default)]
pub(crate) struct RetryPolicy {
    pub(crate) kind: RetryAfter,
    holds: Mutex<Holds>,
}

#[derive(Debug, Default)]
struct Holds {
    // Milliseconds, a ring of the last `WINDOW`.
    ms: Vec<u32>,
    next: usize,
}

impl RetryPolicy {
    pub(crate) fn new(kind: RetryAfter) -> Self {
        RetryPolicy {
            kind,
            holds: Mutex::default(),
        }
    }

    /// Whether hold times are worth recording.
    pub(crate) fn records(&self) -> bool {
        self.kind == RetryAfter::Estimate
    }

    /// A request of the layer held its locks `held`.
    pub(crate) fn record(&self, held: Duration) {
        let ms = u32::try_from(held.as_millis()).unwrap_or(u32::MAX);
        let mut holds = self.holds.lock().unwrap_or_else(|e| e.into_inner());
        if holds.ms.len() < WINDOW {
            holds.ms.push(ms);
        } else {
            let i = holds.next;
            holds.ms[i] = ms;
        }
        holds.next = (holds.next + 1) % WINDOW;
    }

    /// The 90th percentile of the recorded hold times.
    fn estimate(&self) -> Option<Duration> {
        let mut ms = self
            .holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ms
            .clone();
        if ms.is_empty() {
            return None;
        }
        ms.sort_unstable();
        let i = (ms.len() * 9).div_ceil(10).saturating_sub(1);
        Some(Duration::from_millis(u64::from(ms[i])))
    }

    /// `error` with the wait this policy tells the client.
    pub(crate) fn apply(&self, error: &LockError) -> Option<LockError> {
        let remaining = match error {
            LockError::AcquisitionFailed { retry_after }
            | LockError::Timeout { retry_after, .. } => *retry_after,
            _ => return None,
        };
        let told = match self.kind {
            RetryAfter::RemainingTtl => return None,
            RetryAfter::Fixed(d) => Some(d),
            RetryAfter::Estimate => match (self.estimate(), remaining) {
                (Some(e), Some(r)) => Some(e.min(r)),
                (Some(e), None) => Some(e),
                (None, r) => r,
            },
        };
        Some(match error {
            LockError::AcquisitionFailed { .. } => {
                LockError::AcquisitionFailed { retry_after: told }
            }
            LockError::Timeout { waited, .. } => LockError::Timeout {
                waited: *waited,
                retry_after: told,
            },
            other => other.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(remaining: u64) -> LockError {
        LockError::AcquisitionFailed {
            retry_after: Some(Duration::from_secs(remaining)),
        }
    }

    #[test]
    fn the_estimate_is_a_recent_percentile_capped_by_the_ttl() {
        let p = RetryPolicy::new(RetryAfter::Estimate);
        assert_eq!(p.apply(&busy(30)), Some(busy(30)), "nothing on record yet");
        for ms in 1..=100 {
            p.record(Duration::from_millis(ms * 10));
        }
        // The last 64: 370 ms to 1000 ms; the 90th percentile of them.
        let told = p.apply(&busy(30)).unwrap().retry_after().unwrap();
        assert_eq!(told, Duration::from_millis(940));
        let capped = p.apply(&busy(0)).unwrap().retry_after().unwrap();
        assert_eq!(capped, Duration::ZERO, "never past the holder's TTL");
    }

    #[test]
    fn fixed_and_remaining_ttl() {
        let fixed = RetryPolicy::new(RetryAfter::Fixed(Duration::from_secs(2)));
        assert_eq!(fixed.apply(&busy(30)), Some(busy(2)));
        let ttl = RetryPolicy::new(RetryAfter::RemainingTtl);
        ttl.record(Duration::from_millis(5));
        assert_eq!(ttl.apply(&busy(30)), None);
        assert_eq!(fixed.apply(&LockError::NotFound), None, "only a busy lock");
    }
}
