//! A dropped waiter's leave, retried through an outage, goes as soon as
//! Redis answers again.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::RedisBackend;
use super::ops::{Attempt, LeaveMode};
use super::redis_server::RedisServer;
use super::scripts::ceil_ms;
use crate::backend::{Holder, LockBackend};
use crate::key::LockKey;
use crate::spec::AcquireRequest;

/// The length of the key's queue in Redis.
fn queued(server: &RedisServer) -> usize {
    let queues = server.cmd(&["KEYS", "*:q"]);
    match queues.lines().next() {
        Some(q) if !q.is_empty() && q != "(nil)" => server.cmd(&["LLEN", q]).parse().unwrap(),
        _ => 0,
    }
}

/// A waiter dropped while Redis is stopped: its leave fails, then pauses
/// for longer than the test runs. Redis resumes and the holder's release
/// (another call of this process) is answered: the leave goes at once,
/// giving back what the release handed to the dropped entry, and a
/// newcomer gets the lock within its 2-s wait. (With the pause slept out,
/// the lock would idle with the dropped entry for its 30-s TTL.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiters_leave_goes_when_redis_answers_again() {
    let server = RedisServer::start();
    let mut backend = RedisBackend::from_url(&server.url())
        .unwrap()
        .op_timeout(Duration::from_secs(2));
    Arc::get_mut(&mut backend.shared)
        .expect("not shared yet")
        .conn
        .set_pauses(Duration::from_secs(120), Duration::from_secs(120));
    let key = LockKey::global("k").unwrap();
    let ttl = Duration::from_secs(30);
    let holder = AcquireRequest::new(key.clone(), "holder", ttl, Duration::ZERO).unwrap();
    let held = backend.acquire(&holder).await.unwrap();
    // Its entry's deadline (the max wait) lies beyond the pause, so the
    // leave keeps trying.
    let waiter = AcquireRequest::new(key.clone(), "waiter", ttl, Duration::from_secs(300)).unwrap();
    let waiting = tokio::spawn({
        let backend = backend.clone();
        async move { backend.acquire(&waiter).await }
    });
    let t0 = Instant::now();
    while queued(&server) != 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the waiter never queued"
        );
        sleep(Duration::from_millis(10)).await;
    }
    server.stop();
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    // The leave's first try fails (no answer within the op timeout, 2 s,
    // long enough for every call after the resume on a loaded machine)...
    let answers = backend.shared.conn.answers();
    let t0 = Instant::now();
    while !answers.failing() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the leave never failed"
        );
        sleep(Duration::from_millis(10)).await;
    }
    server.resume();
    // ...and the entry is still queued: the leave now pauses. (Its first
    // try still lies in the server's socket and runs on resume, but as an
    // EVALSHA of a script this server has not loaded yet: it answers
    // NOSCRIPT and leaves nothing. This backend's first leave, it is.)
    assert_eq!(queued(&server), 1, "the leave landed before Redis stopped");
    // The holder's release is answered (it hands the lock to the dropped
    // entry, still queued)...
    backend
        .release(&key, Holder::new("holder", held.fence))
        .await
        .unwrap();
    // ...which ends the leave's pause: the leave gives the lock back.
    let newcomer =
        AcquireRequest::new(key.clone(), "newcomer", ttl, Duration::from_secs(2)).unwrap();
    let granted = backend.acquire(&newcomer).await;
    assert!(
        granted.is_ok(),
        "the lock stayed with the dropped waiter 2 s after Redis answered again: {granted:?}"
    );
    assert_eq!(queued(&server), 0);
}

/// A waiting call's own attempt takes the lock (free, nobody queued: the
/// fast path; or the slow path's take), and the call is dropped before it
/// reads the reply: its 'drop' leave gives the lock back. The hold names
/// the call's ticket as its grant; it used to name nobody ('-'), and the
/// leave left it held until its TTL (a custom owner has no other cleanup:
/// a fresh one's owner-only release does not apply).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_a_dropped_waiters_own_attempt_took_is_given_back() {
    use super::ops::{Attempt, LeaveMode, Left};
    use crate::spec::LockKind;
    let server = RedisServer::start();
    let backend = RedisBackend::from_url(&server.url()).unwrap();
    let ttl = Duration::from_secs(30);
    let end = || Instant::now() + Duration::from_secs(5);
    for (name, kind, slow) in [
        ("x", LockKind::Exclusive, false),
        ("s", LockKind::Shared, false),
        // A key with a queue left (an entry past its deadline, never
        // granted): the slow path's take.
        ("q", LockKind::Exclusive, true),
    ] {
        let key = LockKey::global(name).unwrap();
        if slow {
            // A holder that ran out (its key gone, as at its TTL) with a
            // waiter whose max wait ended queued behind it: the key has a
            // queue, and no holder, when the attempt comes.
            let gone = AcquireRequest::new(key.clone(), "gone", ttl, Duration::ZERO).unwrap();
            backend.acquire(&gone).await.unwrap();
            let wait = Duration::from_millis(50);
            let waiter = AcquireRequest::new(key.clone(), "late", ttl, wait).unwrap();
            let id = backend.shared.wake.next_id();
            let queued = backend
                .attempt(&waiter, 30_000, Some((50, id)), end())
                .await;
            assert!(matches!(queued, Ok(Attempt::Busy { .. })), "queued");
            sleep(wait * 2).await;
            assert_eq!(server.cmd(&["DEL", &format!("lock:{{g:{name}}}")]), "1");
        }
        let req = AcquireRequest::new(key.clone(), "custom-owner", ttl, Duration::from_secs(20))
            .unwrap()
            .with_kind(kind)
            .unwrap();
        let id = backend.shared.wake.next_id();
        let taken = backend
            .attempt(&req, 30_000, Some((20_000, id)), end())
            .await;
        assert!(matches!(taken, Ok(Attempt::Acquired(_))), "{name}: taken");
        // The call went away before it read that reply.
        let left = backend
            .leave(&key, "custom-owner", id, LeaveMode::DropNow, ttl, end())
            .await
            .unwrap();
        assert!(
            matches!(left, Left::Dropped),
            "{name}: the hold was not its to give back"
        );
        assert!(
            backend.status(&key).await.unwrap().is_none(),
            "{name}: held by nobody"
        );
    }
}

/// A waiter leaves a key whose holder's TTL ran out (nobody released it,
/// so nobody handed it on): that leave hands the lock to the waiter behind
/// it, in the same script, so the lock names that waiter as soon as the
/// leaver's entry is gone; it stayed free until the waiter's own re-check,
/// up to its safety net's 2 s later. (The lock's key is deleted by hand,
/// as its TTL would: an expiry tells nobody either.) Both waiters are
/// entries their attempts queued, and the leave is the one a dropped call
/// sends, called at the seam: a live waiter's re-check (after subscribing,
/// or its safety net's) could take or hand on the free lock first, which
/// under load a live first waiter did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leave_from_a_key_left_free_hands_it_to_the_next_waiter() {
    let server = RedisServer::start();
    let backend = RedisBackend::from_url(&server.url()).unwrap();
    let key = LockKey::global("k").unwrap();
    let ttl = Duration::from_secs(30);
    let request = |owner: &str, wait: u64| {
        AcquireRequest::new(key.clone(), owner, ttl, Duration::from_secs(wait)).unwrap()
    };
    backend.acquire(&request("holder", 0)).await.unwrap();
    // Two waiters' entries, as their attempts queue them.
    let queue = async |owner: &str| {
        let id = backend.shared.wake.next_id();
        let (req, end) = (request(owner, 300), backend.deadline());
        let attempt = backend
            .attempt(&req, ceil_ms(ttl), Some((300_000, id)), end)
            .await
            .unwrap();
        assert!(matches!(attempt, Attempt::Busy { .. }), "{owner} queues");
        id
    };
    let first = queue("first").await;
    let second = queue("second").await;
    assert_eq!(queued(&server), 2);

    let queue = server.cmd(&["KEYS", "*:q"]);
    let lock = queue
        .lines()
        .next()
        .unwrap()
        .strip_suffix(":q")
        .unwrap()
        .to_owned();
    assert_eq!(server.cmd(&["DEL", &lock]), "1");
    // The first call is dropped: its guard sends this leave.
    let end = backend.deadline();
    backend
        .leave(&key, "first", first, LeaveMode::Drop, Duration::ZERO, end)
        .await
        .unwrap();
    let value = server.cmd(&["GET", &lock]);
    assert!(
        value.ends_with(" second") && value.contains(&format!(" {second}@")),
        "right after the leave, the lock is {value:?}, not handed to the next waiter"
    );
    assert_eq!(queued(&server), 0, "both entries are out of the queue");
}
