//! The relay workload: tasks of their own on one exclusive key of its own,
//! in rounds shaped after the hand-off's wake-up paths. In each round one
//! task takes the key with a long TTL, and the others queue behind it one
//! after another, most with short TTLs; the lead lets go at once, midway or
//! just before its TTL runs out, and most short holders walk away once
//! handed the lock: its TTL frees it on the server, which tells nobody, so
//! the waiter behind must have been told, at the hand-off, how long the new
//! hold lasts (the "nudge"). Between rounds the tasks stay away from the key
//! (no call of theirs hands an expired lock on), so a waiter left asleep on
//! an earlier holder's longer TTL shows in the history as a free key and a
//! waiter granted late: a lost wake-up. Holds that end just before their TTL
//! put a waiter's own re-check (due when that TTL runs out) beside the
//! release that hands it the lock, and make the holder that got it call near
//! the end of its lease, where a lease the server cut short shows (rule 12).
//! Some waiters give up early (a waiter past its max wait is no one to hand
//! the lock to). Each client process runs most of its rounds on a key of
//! its own: any call on the key hands an expired lock on, so another
//! process's calls would hide the waiter that slept through it, as the
//! other workloads' calls do on theirs. A third of the rounds go to a key
//! the processes share, the same rounds in every process, where one's
//! waiter can be stopped (a paused process) past its max wait while
//! another's holder lets go. Half the rounds go through shared holds or
//! permits (`kinds_of`): the same wake-up paths, through a hold's release.

use std::time::Duration;

use tower_lock::{JobSpec, LockKind, OwnedLock};

use super::Task;
use crate::clock::{MS, now_ns};
use crate::rng::Rng;

/// The longest TTL a relay holder takes (ms); the liveness check allows it.
pub const LONGEST_TTL_MS: u64 = 1_600;

/// Rounds until `end` (the run's end, on the monotonic clock), each led by
/// a task drawn from `rng`, the others queueing behind it in turn.
pub(super) async fn relay(mut tasks: Vec<Task>, mut rng: Rng, end: u64) {
    let mut round = 0;
    while now_ns() < end {
        let lead = rng.range(0, tasks.len() as u64 - 1) as usize;
        let cfg = &tasks[0].cfg;
        let key = match &cfg.relay_shared {
            Some(shared) if together(shared, round) => shared.clone(),
            _ => cfg.relay.clone().expect("the relay key"),
        };
        let (lead_kind, follower_kind) = kinds_of(&key, round);
        round += 1;
        // The followers come a few ms apart, in the order of the tasks.
        let mut at = 0;
        let mut turns = Vec::new();
        for (i, mut task) in tasks.drain(..).enumerate() {
            let key = key.clone();
            let (delay, kind) = if i == lead {
                (0, lead_kind)
            } else {
                at += rng.range(3, 30);
                (at, follower_kind)
            };
            turns.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(delay)).await;
                task.relay_turn(&key, i == lead, kind, end).await;
                task
            }));
        }
        for turn in turns {
            tasks.push(turn.await.expect("a relay turn"));
        }
        let away = rng.range(100, 800);
        let left = end.saturating_sub(now_ns()) / MS;
        tokio::time::sleep(Duration::from_millis(away.min(left))).await;
    }
}

/// The kinds of round `round` on `key` (the lead's, the followers'), the
/// same in every process (drawn from the key's name and the round): half
/// the rounds exclusive throughout; a quarter led by a shared hold with
/// exclusive followers (a hold's release hands the key to a writer); a
/// quarter of `Permits(1)` throughout (holds handed to holds). One family
/// per round: between rounds the key comes free, so the next round may
/// take another (a hold left by a walk-away that outlives the gap refuses
/// the other family at once, which ends those turns).
fn kinds_of(key: &str, round: u64) -> (LockKind, LockKind) {
    match fnv(key, round.wrapping_add(0x6b69_6e64)) % 4 {
        2 => (LockKind::Shared, LockKind::Exclusive),
        3 => (LockKind::Permits(1), LockKind::Permits(1)),
        _ => (LockKind::Exclusive, LockKind::Exclusive),
    }
}

/// FNV-1a of `name` and `round`.
fn fnv(name: &str, round: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes().chain(round.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Whether round `round` of every process goes to the shared key `shared`:
/// a third of the rounds, drawn from the key's name (the seed's) so that
/// the processes agree. Their first rounds start together, so in those the
/// processes' tasks queue on the key at once: one process's waiter can be
/// stopped past its max wait while the other's holder lets go.
fn together(shared: &str, round: u64) -> bool {
    fnv(shared, round).is_multiple_of(3)
}

impl Task {
    /// One turn on `key`: the round's lead (a long TTL) or a
    /// follower queued behind it; nothing that waits past `end`.
    async fn relay_turn(&mut self, key: &str, lead: bool, kind: LockKind, end: u64) {
        let left = end.saturating_sub(now_ns()) / MS;
        let long = lead || self.rng.chance(20);
        let ttl = if long {
            self.rng.range(1_000, LONGEST_TTL_MS)
        } else {
            self.rng.range(60, 150)
        };
        let wait = if !lead && self.rng.chance(20) {
            self.rng.range(100, 400)
        } else {
            self.rng.range(1_500, 2_500)
        }
        .min(left);
        let spec = JobSpec::new(key, Duration::from_millis(ttl))
            .max_wait(Duration::from_millis(wait))
            .kind(kind);
        let Ok(lock) = OwnedLock::acquire(self.backend.clone(), &spec).await else {
            return;
        };
        let choice = self.rng.range(0, 2);
        let near_the_end = choice == 1;
        let hold = match choice {
            // Midway: a waiter queued since its start sleeps by then in long
            // stretches, on this holder's expiry, until a nudge tells it
            // better.
            0 if long => ttl * self.rng.range(50, 80) / 100,
            // Just before the TTL runs out.
            1 => {
                let margin = if long {
                    self.rng.range(0, 10)
                } else {
                    self.rng.range(6, 50)
                };
                ttl.saturating_sub(margin)
            }
            _ => self.rng.range(0, 20),
        };
        self.critical(&lock, Duration::from_millis(hold)).await;
        // A hold that ends just before its TTL gives the lock back: the
        // release near the TTL's end is what shows a lease the server cut
        // short (rule 12); walking away then would free it a few ms later.
        if long || near_the_end || self.rng.chance(40) {
            let _ = lock.release().await;
        } else {
            // Walk away: its short TTL frees it.
            let _ = lock.keep();
        }
    }
}
