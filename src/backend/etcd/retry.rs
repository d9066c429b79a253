//! Pauses between the tries of work that must land though etcd cannot be
//! reached now: a lock's expiry, a dropped waiter's leave, the deletion of
//! a flight's result. They double, from 50 ms to 1 s, so that an outage is
//! not met with a storm of calls; but the first answer etcd gives any call
//! of this process after a failure ([`Conn::back`]) ends a pause (once
//! 50 ms of it have passed). A lock whose TTL ran out while etcd was away
//! then goes to its waiter as soon as etcd is back, not up to a second
//! later. (The 50 ms keep a try that fails while other calls succeed, a
//! member of its own gone bad, from looping.)

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
    max: Duration,
}

impl Retry {
    /// Made before the first try: answers from then on end a pause.
    pub(super) fn new(conn: &Conn) -> Self {
        let (first, max) = conn.pauses();
        Retry {
            back: conn.back(),
            pause: first,
            max,
        }
    }

    /// After a failed try: until the pause is over or etcd answered a call
    /// of this process since the try began, whichever comes first (never
    /// under 50 ms).
    pub(super) async fn pause(&mut self) {
        let floor = FLOOR.min(self.pause);
        sleep(floor).await;
        tokio::select! {
            () = sleep(self.pause - floor) => {}
            // (Err: the connection is gone; the pause runs out.)
            Ok(()) = self.back.changed() => {}
        }
        self.back.borrow_and_update();
        self.pause = (self.pause * 2).min(self.max);
    }

    /// A try got through: the next failure pauses from the first pause.
    pub(super) fn reset(&mut self, conn: &Conn) {
        self.pause = conn.pauses().0;
    }
}

#[cfg(test)]
#[path = "retry_test.rs"]
mod retry_test;
