//! Pauses between the tries of work that must land though etcd cannot be
//! reached now: a lock's expiry, a dropped waiter's leave, the deletion of
//! a flight's result. They double, from 50 ms to 1 s, so that an outage is
//! not met with a storm of calls; but an answer etcd gives another call of
//! this process after a failure ([`Conn::back`]) ends a pause (once 50 ms of
//! it have passed). A lock whose TTL ran out while etcd was away then goes
//! to its waiter as soon as the process hears from etcd again (its next
//! call, at the latest its next lease keep-alive), not up to a second later.
//!
//! When etcd answers some calls but not these (a member of their own gone
//! bad, an alarm that refuses writes), every failure would be followed by
//! another call's answer: a pause cut short is then followed by one that
//! runs out, so the work still backs off (at most two tries per pause).

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::sleep;

use super::conn::Conn;

/// The first and the largest pause.
pub(super) const RETRY_FIRST: Duration = Duration::from_millis(50);
pub(super) const RETRY_MAX: Duration = Duration::from_secs(1);

/// The part of a pause no answer cuts short.
const FLOOR: Duration = Duration::from_millis(50);

/// The pauses of one piece of work.
pub(super) struct Retry {
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
    pub(super) fn new(conn: &Conn) -> Self {
        let (first, max) = conn.pauses();
        Retry {
            back: conn.back(),
            pause: first,
            first,
            max,
            cut: false,
        }
    }

    /// After a failed try: until the pause is over or etcd answered a call
    /// of this process since the try began, whichever comes first (never
    /// under 50 ms; the whole pause after one cut short).
    pub(super) async fn pause(&mut self) {
        let floor = FLOOR.min(self.pause);
        sleep(floor).await;
        let rest = sleep(self.pause - floor);
        if std::mem::take(&mut self.cut) {
            rest.await;
        } else {
            tokio::select! {
                () = rest => {}
                // (Err: the connection is gone; the pause runs out.)
                Ok(()) = self.back.changed() => self.cut = true,
            }
        }
        self.back.borrow_and_update();
        self.pause = (self.pause * 2).min(self.max);
    }

    /// A try got through: the next failure pauses from the first pause.
    pub(super) fn reset(&mut self) {
        self.pause = self.first;
        self.cut = false;
    }
}

#[cfg(test)]
#[path = "retry_test.rs"]
mod retry_test;
