//! Pauses between the tries of work that must land though the server cannot
//! be reached now: a dropped waiter's leave (Redis, etcd, PostgreSQL), a lock's expiry
//! and the deletion of a flight's result (etcd). They double, from 50 ms to
//! 1 s, so that an outage is not met with a storm of calls; but an answer
//! the server gives another call of this process after a failure
//! ([`Answers`]) ends a pause (once 50 ms of it have passed). A lock whose
//! TTL ran out while etcd was away then goes to its waiter as soon as the
//! process hears from etcd again (its next call, at the latest its next
//! lease keep-alive), and a dropped waiter's entry leaves the Redis queue
//! (giving back what was handed to it) with the first script call of the
//! process that Redis answers again, not up to a second later. Only
//! answers count: a failed call or an error reply (a server loading its
//! data, a replica refusing writes) never ends a pause.
//!
//! When the server answers some calls but not these (an etcd member of
//! their own gone bad, an alarm that refuses writes), every failure would
//! be followed by another call's answer: a pause cut short is then followed
//! by one that runs out, so the work still backs off (at most two tries per
//! pause).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout_at};

use crate::error::LockError;
use crate::key::LockKey;

/// The first and the largest pause.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// The part of a pause no answer cuts short.
const FLOOR: Duration = Duration::from_millis(50);

/// Whether the server answers: the backend's calls report each answer and
/// each failure; the first answer after a failure is announced to the
/// pauses under way.
pub(crate) struct Answers {
    /// A call failed since the last answer.
    failing: AtomicBool,
    /// Counts the answers that came after a failure.
    back: watch::Sender<u64>,
    /// The first and largest pause of work retried.
    pauses: (Duration, Duration),
}

impl Default for Answers {
    fn default() -> Self {
        Answers {
            failing: AtomicBool::new(false),
            back: watch::Sender::new(0),
            pauses: (RETRY_FIRST, RETRY_MAX),
        }
    }
}

impl Answers {
    /// The server answered a call: if one had failed since the last
    /// answer, say that it is back. (One load on the common path.)
    pub(crate) fn answered(&self) {
        if self.failing.load(Ordering::Relaxed) && self.failing.swap(false, Ordering::AcqRel) {
            self.back.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// A call could not reach the server (or got no answer in time).
    pub(crate) fn failed(&self) {
        self.failing.store(true, Ordering::Release);
    }

    /// Whether a call failed since the last answer.
    #[cfg(test)]
    pub(crate) fn failing(&self) -> bool {
        self.failing.load(Ordering::Acquire)
    }

    /// Other pauses (a test's pause longer than the test).
    #[cfg(test)]
    pub(crate) fn set_pauses(&mut self, first: Duration, max: Duration) {
        self.pauses = (first, max);
    }
}

/// The pauses of one piece of work.
pub(crate) struct Retry {
    back: watch::Receiver<u64>,
    pause: Duration,
    first: Duration,
    max: Duration,
    /// The last pause was cut short by an answer (and the try after it
    /// failed, or there would be no pause now): this one runs out.
    cut: bool,
}

impl Retry {
    /// Made before the first try: answers from then on end a pause.
    pub(crate) fn new(answers: &Answers) -> Self {
        let (first, max) = answers.pauses;
        Retry {
            back: answers.back.subscribe(),
            pause: first,
            first,
            max,
            cut: false,
        }
    }

    /// After a failed try: until the pause is over or the server answered a
    /// call of this process since the try began, whichever comes first
    /// (never under 50 ms; the whole pause after one cut short).
    pub(crate) async fn pause(&mut self) {
        let floor = FLOOR.min(self.pause);
        sleep(floor).await;
        let rest = sleep(self.pause - floor);
        if std::mem::take(&mut self.cut) {
            rest.await;
        } else {
            tokio::select! {
                () = rest => {}
                // (Err: the backend is gone; the pause runs out.)
                Ok(()) = self.back.changed() => self.cut = true,
            }
        }
        self.back.borrow_and_update();
        self.pause = (self.pause * 2).min(self.max);
    }

    /// A try got through: the next failure pauses from the first pause.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn reset(&mut self) {
        self.pause = self.first;
        self.cut = false;
    }
}

/// A dropped waiter's leave, tried until it gets through, fails for a
/// reason other than an unreachable server, or the entry's deadline `until`
/// passes (the server skips the entry from then on: nothing left to do).
/// An entry left behind would be handed the lock by the next release, which
/// then idles for the hand-off's whole TTL. `answers`: the backend's, whose
/// answers to other calls cut a pause short (`None`: pauses run out).
#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) async fn leave_until<T, F>(
    answers: Option<&Answers>,
    key: &LockKey,
    until: Instant,
    mut leave: impl FnMut() -> F,
) where
    F: std::future::Future<Output = Result<T, LockError>>,
{
    let none = Answers::default();
    let mut retry = Retry::new(answers.unwrap_or(&none));
    loop {
        match leave().await {
            Err(LockError::BackendUnavailable(e)) if Instant::now() < until => {
                tracing::debug!(key = %key.digest(), error = %e, "leaving the lock queue failed; retrying");
                if timeout_at(until, retry.pause()).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(key = %key.digest(), error = %e, "leaving the lock queue failed");
                return;
            }
            Ok(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{Instant, sleep};

    use super::{Answers, Retry};

    /// An answer after a failure ends a pause once 50 ms of it have passed;
    /// the pause after one cut short runs out whatever answers come (the
    /// server answering other calls but not these must not turn the
    /// back-off into a try every 50 ms); one not cut short may be cut again.
    #[tokio::test(start_paused = true)]
    async fn answers_cut_pauses_short_but_never_two_in_a_row() {
        let mut answers = Answers::default();
        answers.set_pauses(Duration::from_secs(10), Duration::from_secs(10));
        let answers = answers;
        let mut retry = Retry::new(&answers);
        let timed = async |retry: &mut Retry| {
            let t0 = Instant::now();
            let answer = async {
                sleep(Duration::from_millis(10)).await;
                answers.failed();
                answers.answered();
                std::future::pending::<()>().await
            };
            tokio::select! {
                () = retry.pause() => {}
                () = answer => {}
            }
            t0.elapsed()
        };
        assert_eq!(
            timed(&mut retry).await,
            Duration::from_millis(50),
            "cut short"
        );
        assert_eq!(timed(&mut retry).await, Duration::from_secs(10), "runs out");
        assert_eq!(
            timed(&mut retry).await,
            Duration::from_millis(50),
            "cut short again"
        );
        // An answer with no failure before it says nothing.
        let mut retry = Retry::new(&answers);
        let t0 = Instant::now();
        tokio::select! {
            () = retry.pause() => {}
            () = async {
                sleep(Duration::from_millis(10)).await;
                answers.answered();
                std::future::pending::<()>().await
            } => {}
        }
        assert_eq!(t0.elapsed(), Duration::from_secs(10));
    }
}
