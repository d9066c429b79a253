//! The checker's rules for shared holds and permits (issue 23), beside the
//! exclusive ones in `check.rs`; every lease carries its kind.
//!
//! 9. **Kinds exclude as documented.** Leases (by the exclusive rule's
//!    lease ends: TTL, extensions, release, hand-off, force release, a fault
//!    that loses locks) overlap in real time only as the kinds allow: an
//!    exclusive lease beside no other lease of its key (two exclusive ones
//!    are rule 1's `two-holders`; with a shared one, `reader-beside-writer`),
//!    shared leases beside each other, at most `n` leases of `Permits(n)` at
//!    once (`over-permits`), and never two families on one key at once
//!    (`kind-mix`: permits beside shared or exclusive, or two `n`s).
//! 10. **Another family is refused at once.** An acquisition of another
//!     family than a lease that surely held the key when it was asked
//!     (granted before, not over yet) and still did when the server
//!     weighed it (it was answered, or known queued, before the lease's end
//!     was asked for) must answer `KindMismatch`: granted, busy or timed
//!     out, it was queued or weighed as a waiter
//!     (`kind-mismatch-not-refused`).
//! 11. **Readers at the head are granted together** (see [`together`]):
//!     `readers-not-together`.
//!
//! The other rules carry over: fences (rule 2) are checked across kinds
//! already (every acquisition of a key, in grant order); a stale call
//! (rule 6) is one that answered Ok while leases surely held the key that
//! its own hold cannot have been beside; first come, first served (rule 7)
//! holds as it is, since the contract lets a newcomer join the holders only
//! when no live waiter is queued and grants from the head of the queue only
//! (waiters granted together at one hand-off are no overtaking: rule 7
//! wants a grant well before the waiter's own); and a lost wake-up (rule 3)
//! is judged by what blocks the waiter's kind (see [`blocked`]).

use std::collections::{BTreeMap, BTreeSet};

use tower_lock::LockKind;

use super::super::clock::MS;
use super::super::history::{Fault, Kind, Op, Outcome};
use super::{Hold, Lease, Violation, last_fault_before, ms};

/// The kind an operation asked for (exclusive when it names none).
pub(super) fn kind_of(op: &Op) -> LockKind {
    op.lock_kind
        .as_deref()
        .and_then(|k| k.parse().ok())
        .unwrap_or(LockKind::Exclusive)
}

/// Claims (restores) do not say their kind, and draw a fence of their own:
/// theirs is the kind of the hold whose fence they named (a grant, or an
/// earlier claim), in the order they were made. `leases` are in the order
/// of `ops`.
pub(super) fn inherit_kinds(leases: &mut [Lease], ops: &[&Op]) {
    let named: BTreeMap<(u32, u64), Option<u64>> = ops
        .iter()
        .filter(|o| o.kind == Kind::Claim)
        .map(|o| ((o.p, o.id), o.fence_in))
        .collect();
    let mut kinds: BTreeMap<(String, u64), LockKind> = BTreeMap::new();
    for l in leases.iter_mut() {
        if let Some(from) = named.get(&(l.p, l.id))
            && let Some(&kind) = from.and_then(|f| kinds.get(&(l.key.clone(), f)))
        {
            l.kind = kind;
        }
        kinds.insert((l.key.clone(), l.fence), l.kind);
    }
}

/// Whether a hold of `a` may be held beside one of `b` (other acquisitions).
fn may_share(a: LockKind, b: LockKind) -> bool {
    match (a, b) {
        (LockKind::Shared, LockKind::Shared) => true,
        (LockKind::Permits(n), LockKind::Permits(m)) => n == m && n > 1,
        _ => false,
    }
}

fn describe(l: &Lease, t0: u64) -> String {
    format!(
        "{} fence {} (p{} #{}) held {}..{} (until {})",
        l.kind,
        l.fence,
        l.p,
        l.id,
        ms(l.sure, t0),
        ms(l.end, t0),
        l.why
    )
}

/// Rule 9: overlapping leases of kinds that may not meet, and more than
/// `n` permits at once. The most leases at once come at some lease's
/// start: each lease is weighed against those live when it began.
pub(super) fn overlaps(leases: &[Lease], faults: &[Fault], t0: u64, out: &mut Vec<Violation>) {
    let mut by_key: BTreeMap<&str, Vec<&Lease>> = BTreeMap::new();
    for l in leases.iter().filter(|l| l.end > l.sure) {
        by_key.entry(&l.key).or_default().push(l);
    }
    for (key, mut ls) in by_key {
        if ls.iter().all(|l| l.kind == LockKind::Exclusive) {
            continue;
        }
        ls.sort_by_key(|l| l.sure);
        for (i, b) in ls.iter().enumerate() {
            // Live at b's start, other acquisitions (a restore's lease is
            // its grant's acquisition: the same fence), one per fence.
            let mut live: BTreeMap<u64, &Lease> = BTreeMap::new();
            for a in &ls[..i] {
                if a.end > b.sure && a.fence != b.fence {
                    live.entry(a.fence).or_insert(a);
                }
            }
            let last = last_fault_before(faults, b.sure, t0);
            for a in live.values() {
                let (x, y) = (a.kind, b.kind);
                if x == LockKind::Exclusive && y == LockKind::Exclusive {
                    continue; // rule 1's
                }
                let kind = if !x.same_family(y) {
                    "kind-mix"
                } else if !may_share(x, y) && matches!(x, LockKind::Permits(_)) {
                    "over-permits"
                } else if !may_share(x, y) {
                    "reader-beside-writer"
                } else {
                    continue;
                };
                if kind != "over-permits" {
                    out.push(Violation {
                        kind,
                        detail: format!(
                            "{key}: {} overlaps {} from {}; last fault before: {last}",
                            describe(a, t0),
                            describe(b, t0),
                            ms(b.sure, t0)
                        ),
                    });
                }
            }
            if let LockKind::Permits(n) = b.kind {
                let same: Vec<&&Lease> = live.values().filter(|a| a.kind == b.kind).collect();
                if same.len() + 1 > n as usize {
                    out.push(Violation {
                        kind: "over-permits",
                        detail: format!(
                            "{key}: {} leases of permits={n} at once at {}: {} and {}; last \
                             fault before: {last}",
                            same.len() + 1,
                            ms(b.sure, t0),
                            same.iter()
                                .map(|a| describe(a, t0))
                                .collect::<Vec<_>>()
                                .join(", "),
                            describe(b, t0)
                        ),
                    });
                }
            }
        }
    }
}

/// Rule 10: a request of another family than a live lease, not refused.
pub(super) fn mismatches(ops: &[&Op], leases: &[Lease], t0: u64, out: &mut Vec<Violation>) {
    let mut by_key: BTreeMap<&str, Vec<&Lease>> = BTreeMap::new();
    for l in leases.iter().filter(|l| l.end > l.sure) {
        by_key.entry(&l.key).or_default().push(l);
    }
    for op in ops.iter().filter(|o| o.kind == Kind::Acquire) {
        let answered = matches!(op.outcome, Outcome::Ok | Outcome::Busy | Outcome::Timeout);
        let Some(ls) = by_key.get(op.key.as_str()).filter(|_| answered) else {
            continue;
        };
        let asked = kind_of(op);
        // Weighed beside the lease: answered, or known queued, before its
        // end was even asked for (a call answered later may have reached
        // the server after that end).
        let weighed = |end: u64| op.ret <= end || op.queued.iter().any(|&q| q <= end);
        let Some(other) = ls.iter().find(|l| {
            l.sure <= op.inv && op.inv < l.end && weighed(l.end) && !l.kind.same_family(asked)
        }) else {
            continue;
        };
        out.push(Violation {
            kind: "kind-mismatch-not-refused",
            detail: format!(
                "{}: p{} #{} asked {asked} at {} and answered {:?} at {}, while {} held the key",
                op.key,
                op.p,
                op.id,
                ms(op.inv, t0),
                op.outcome,
                ms(op.ret, t0),
                describe(other, t0)
            ),
        });
    }
}

/// Rule 11: readers at the head of the queue are granted together. When a
/// shared hold is granted at `t` (the hand-off its lease dates from), a
/// shared waiter whose queue entry was written before `t` and that still
/// waits well after it, with no exclusive request in flight (one ahead of it
/// in the queue would hold it back) and no fault or force release meanwhile,
/// was left behind: the contract grants every consecutive shared waiter at
/// the head together. Its place is its last entry's (the latest it can be).
/// Permits are not checked this way (which waiters fit depends on how many
/// holds ended at once, which the history does not pin down): their waits
/// are rule 3's.
pub(super) fn together(
    ops: &[&Op],
    faults: &[Fault],
    t0: u64,
    op_timeout: u64,
    slack: u64,
    out: &mut Vec<Violation>,
) {
    let shared = |o: &&&Op| o.kind == Kind::Acquire && kind_of(o) == LockKind::Shared;
    let waiters: Vec<&&Op> = ops
        .iter()
        .filter(shared)
        .filter(|o| o.wait_ms > 0 && !o.queued.is_empty())
        .filter(|o| matches!(o.outcome, Outcome::Ok | Outcome::Timeout))
        .collect();
    // Exclusive requests: a waiter until its answer (a grant is then a
    // lease, which no shared grant can be beside), anything else until its
    // queue entry surely went (an op timeout after its answer).
    let mut writers: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for o in ops.iter().filter(|o| {
        matches!(o.kind, Kind::Acquire | Kind::FlightBegin) && kind_of(o) == LockKind::Exclusive
    }) {
        let until = if o.outcome == Outcome::Ok {
            o.ret
        } else {
            o.ret + op_timeout
        };
        writers.entry(&o.key).or_default().push((o.inv, until));
    }
    let forced: Vec<&&Op> = ops
        .iter()
        .filter(|o| o.kind == Kind::ForceRelease)
        .collect();
    for a in ops
        .iter()
        .filter(shared)
        .filter(|o| o.outcome == Outcome::Ok)
    {
        let Some(t) = a.start else { continue };
        for b in waiters
            .iter()
            .filter(|b| b.key == a.key && (b.p, b.id) != (a.p, a.id))
        {
            let place = b.queued.iter().copied().max().unwrap_or(u64::MAX);
            let waited_until = match b.outcome {
                Outcome::Ok => b.start.unwrap_or(b.ret),
                _ => b.ret,
            }
            .min(b.inv + b.wait_ms * MS);
            if place >= t || waited_until <= t + slack {
                continue;
            }
            let (from, to) = (place, t + slack);
            let writer = writers
                .get(a.key.as_str())
                .into_iter()
                .flatten()
                .any(|&(x, y)| x < to && y > from);
            let fault = faults
                .iter()
                .any(|f| f.at < to && f.until + op_timeout > from);
            let force = forced
                .iter()
                .any(|f| f.key == a.key && f.inv < to && f.ret + op_timeout > from);
            if writer || fault || force {
                continue;
            }
            out.push(Violation {
                kind: "readers-not-together",
                detail: format!(
                    "{}: p{} #{} was granted shared at {}, while p{} #{} (shared, queued by {}, \
                     no writer asking) waited on until {}",
                    a.key,
                    a.p,
                    a.id,
                    ms(t, t0),
                    b.p,
                    b.id,
                    ms(place, t0),
                    ms(waited_until, t0)
                ),
            });
        }
    }
}

/// Rule 6 for kinds: of the leases `others` (other fences) that surely held
/// the key while a call about a hold of kind `own` ran, one that hold
/// cannot have been beside, if any. `None` for `own`: the call's hold is
/// unknown (no grant of its fence recorded); on a key with kinds, not
/// judged.
pub(super) fn beside<'a>(own: Option<LockKind>, others: &[&'a Lease]) -> Option<&'a Lease> {
    let all_exclusive = others.iter().all(|l| l.kind == LockKind::Exclusive);
    let own = match own {
        Some(k) => k,
        None if all_exclusive => LockKind::Exclusive,
        None => return None,
    };
    if let Some(l) = others.iter().find(|l| !may_share(own, l.kind)) {
        return Some(l);
    }
    // `n` other permits held: no room for this one.
    let fences: BTreeSet<u64> = others.iter().map(|l| l.fence).collect();
    match own {
        LockKind::Permits(n) if fences.len() >= n as usize => others.first().copied(),
        _ => None,
    }
}

/// Rule 3 for kinds: when a waiter of `kind` could not have been granted,
/// given the stretches others might have held the key (`holds`, with their
/// kinds, the waiter's own left out) and the exclusive requests of others
/// that may have been queued ahead of it (`writers`: a shared waiter queues
/// behind them, as the contract says, even beside shared holders). An
/// exclusive waiter is blocked by any hold (rule 3 as it was).
pub(super) fn blocked(
    kind: LockKind,
    holds: &[(Hold, LockKind)],
    writers: &[(u64, u64)],
) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut same: Vec<(u64, u64)> = Vec::new();
    for &((a, b, _), k) in holds {
        if may_share(kind, k) {
            same.push((a, b));
        } else {
            out.push((a, b));
        }
    }
    match kind {
        LockKind::Shared => out.extend_from_slice(writers),
        LockKind::Permits(n) => {
            // Where `n` or more permits may be held at once.
            let mut events: Vec<(u64, i64)> =
                same.iter().flat_map(|&(a, b)| [(a, 1), (b, -1)]).collect();
            events.sort_unstable();
            let mut count = 0i64;
            let mut from = None;
            for (t, d) in events {
                count += d;
                match from {
                    None if count >= i64::from(n) => from = Some(t),
                    Some(f) if count < i64::from(n) => {
                        out.push((f, t));
                        from = None;
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
    out
}

/// The exclusive requests on each key (invocation to answer, plus an op
/// timeout for a queue entry to go), for [`blocked`]. A request of a
/// process killed while it waited never leaves: its queue entry stays on
/// the server until its max wait ends (Redis Cluster with failover, seed
/// 1069: a reader queued behind such a writer and timed out, which is the
/// contract, not a lost wake-up).
pub(super) fn writers<'a>(
    ops: &[&'a Op],
    faults: &[Fault],
    op_timeout: u64,
) -> BTreeMap<&'a str, Vec<Hold>> {
    let mut out: BTreeMap<&str, Vec<Hold>> = BTreeMap::new();
    for op in ops.iter().filter(|o| {
        matches!(o.kind, Kind::Acquire | Kind::FlightBegin) && kind_of(o) == LockKind::Exclusive
    }) {
        let killed = faults
            .iter()
            .any(|f| f.crash && f.process == Some(op.p) && op.inv < f.at && f.at <= op.ret);
        let mut end = op.ret;
        if killed {
            end = end.max(op.inv + op.wait_ms * MS);
        }
        out.entry(&op.key)
            .or_default()
            .push((op.inv, end + op_timeout, (op.p, op.id)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::super::clock::MS;
    use super::super::super::history::{Fault, History, Kind, Op, Outcome};
    use super::super::{Bounds, check};

    fn op(p: u32, id: u64, kind: Kind, inv: u64, ret: u64, outcome: Outcome) -> Op {
        Op {
            p,
            id,
            kind,
            key: "k".into(),
            lock_kind: None,
            fence_in: None,
            owner: None,
            ttl_ms: 0,
            wait_ms: 0,
            inv: inv * MS,
            ret: ret * MS,
            outcome,
            fence: None,
            start: None,
            lease_ms: 0,
            value: 0,
            checked: None,
            queued: Vec::new(),
        }
    }

    /// A grant of `kind` (`None`: exclusive) asked at `inv`, told at `ret`.
    fn grant(p: u32, inv: u64, ret: u64, fence: u64, ttl: u64, kind: Option<&str>) -> Op {
        let mut o = op(p, 0, Kind::Acquire, inv, ret, Outcome::Ok);
        o.lock_kind = kind.map(str::to_owned);
        o.fence = Some(fence);
        o.start = Some(inv * MS);
        o.lease_ms = ttl;
        o.ttl_ms = ttl;
        o
    }

    fn release(p: u32, inv: u64, ret: u64, fence: u64) -> Op {
        let mut o = op(p, 1, Kind::Release, inv, ret, Outcome::Ok);
        o.fence_in = Some(fence);
        o
    }

    fn kinds(ops: Vec<Op>) -> Vec<&'static str> {
        let h = History {
            ops,
            op_timeout_ms: 100,
            ..History::default()
        };
        check(&h, Bounds::default())
            .iter()
            .map(|v| v.kind)
            .collect()
    }

    const SHARED: Option<&str> = Some("shared");
    const P2: Option<&str> = Some("permits=2");

    #[test]
    fn readers_together_pass_and_a_writer_beside_a_reader_is_caught() {
        // Two shared holds at once, then a writer after both released.
        assert!(
            kinds(vec![
                grant(1, 0, 1, 1, 100, SHARED),
                grant(2, 2, 3, 2, 100, SHARED),
                release(1, 10, 11, 1),
                release(2, 12, 13, 2),
                grant(3, 14, 15, 3, 100, None),
            ])
            .is_empty()
        );
        // kinds-memory-writer-beside-readers: a writer granted while a
        // reader holds.
        assert_eq!(
            kinds(vec![
                grant(1, 0, 1, 1, 100, SHARED),
                grant(3, 5, 6, 2, 100, None),
            ]),
            ["reader-beside-writer"]
        );
        // And a reader granted beside a writer.
        assert_eq!(
            kinds(vec![
                grant(3, 0, 1, 1, 100, None),
                grant(1, 5, 6, 2, 100, SHARED),
            ]),
            ["reader-beside-writer"]
        );
    }

    #[test]
    fn n_permits_pass_and_one_more_is_caught() {
        // Two of two permits at once, a third after one ended by its TTL.
        assert!(
            kinds(vec![
                grant(1, 0, 1, 1, 100, P2),
                grant(2, 2, 3, 2, 300, P2),
                grant(3, 101, 102, 3, 300, P2),
            ])
            .is_empty()
        );
        // kinds-memory-permits-over-n: the third while both still hold.
        assert_eq!(
            kinds(vec![
                grant(1, 0, 1, 1, 100, P2),
                grant(2, 2, 3, 2, 300, P2),
                grant(3, 50, 51, 3, 300, P2),
            ]),
            ["over-permits"]
        );
        // A force release ends both leases: a third after it fits.
        let mut force = op(9, 0, Kind::ForceRelease, 40, 41, Outcome::Ok);
        force.key = "k".into();
        assert!(
            kinds(vec![
                grant(1, 0, 1, 1, 100, P2),
                grant(2, 2, 3, 2, 300, P2),
                force,
                grant(3, 50, 51, 3, 300, P2),
            ])
            .is_empty()
        );
    }

    #[test]
    fn a_restored_hold_keeps_its_kind() {
        // A reader hands its hold off; another process claims it (a fence
        // of its own) while a second reader holds: still a shared hold.
        let mut handoff = op(1, 1, Kind::Handoff, 5, 5, Outcome::Ok);
        handoff.fence_in = Some(1);
        let mut claim = op(3, 0, Kind::Claim, 10, 11, Outcome::Ok);
        claim.fence_in = Some(1);
        claim.fence = Some(3);
        claim.start = Some(10 * MS);
        claim.lease_ms = 100;
        let ops = |reader: Option<&str>| {
            vec![
                grant(1, 0, 1, 1, 100, reader),
                grant(2, 2, 3, 2, 100, SHARED),
                handoff.clone(),
                claim.clone(),
            ]
        };
        assert!(kinds(ops(SHARED)).is_empty());
        // A writer's hold, claimed beside the reader: caught.
        assert!(kinds(ops(None)).contains(&"reader-beside-writer"));
    }

    /// A writer holds 0..100 ms; readers queue at 3 and 4 ms; the first is
    /// handed the lock at its release, the second at `second` ms; `writer`:
    /// another writer waits from 2 to 300 ms (ahead of the second reader).
    fn readers_after_a_writer(second: u64, writer: bool) -> Vec<&'static str> {
        let reader = |p: u32, inv: u64, at: u64, fence: u64| {
            let mut r = grant(p, inv, at + 1, fence, 300, SHARED);
            r.wait_ms = 1_000;
            r.start = Some(at * MS);
            r.queued = vec![(inv + 1) * MS];
            r
        };
        let mut ops = vec![
            grant(1, 0, 1, 1, 1_000, None),
            release(1, 100, 101, 1),
            reader(2, 2, 100, 2),
            release(2, 140, 141, 2),
            reader(3, 3, second, 3),
            release(3, second + 10, second + 11, 3),
        ];
        if writer {
            let mut w = op(4, 0, Kind::Acquire, 2, 300, Outcome::Timeout);
            w.wait_ms = 298;
            w.ttl_ms = 100;
            ops.push(w);
        }
        kinds(ops)
    }

    #[test]
    fn readers_at_the_head_are_granted_together() {
        // kinds-memory-hand-off-grants-one-reader: the second reader got
        // the lock only when the first left.
        assert_eq!(readers_after_a_writer(140, false), ["readers-not-together"]);
        // Both at the writer's release: fine.
        assert!(readers_after_a_writer(100, false).is_empty());
        // A writer asking meanwhile may have been queued between them.
        assert!(readers_after_a_writer(140, true).is_empty());
    }

    #[test]
    fn readers_granted_a_commit_apart_are_together_on_etcd() {
        // etcd, seed 1038 (a long run beside another and two builds): one
        // release granted the readers at the head one transaction each,
        // the second 15 ms after the first.
        assert_eq!(readers_after_a_writer(115, false), ["readers-not-together"]);
        let bounds = Bounds {
            together_ns: 100 * MS,
            ..Bounds::default()
        };
        let mut ops = vec![grant(1, 0, 1, 1, 1_000, None), release(1, 100, 101, 1)];
        for (p, inv, at, fence) in [(2, 2, 100, 2), (3, 3, 115, 3)] {
            let mut r = grant(p, inv, at + 1, fence, 300, SHARED);
            r.wait_ms = 1_000;
            r.start = Some(at * MS);
            r.queued = vec![(inv + 1) * MS];
            ops.push(r);
        }
        let h = History {
            ops,
            op_timeout_ms: 100,
            ..History::default()
        };
        let found: Vec<_> = check(&h, bounds).iter().map(|v| v.kind).collect();
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn two_families_at_once_are_caught() {
        assert_eq!(
            kinds(vec![
                grant(1, 0, 1, 1, 100, P2),
                grant(2, 5, 6, 2, 100, Some("permits=3")),
            ]),
            // Granted beside the other family: it was not refused either.
            ["kind-mix", "kind-mismatch-not-refused"]
        );
    }

    #[test]
    fn fences_rise_across_kinds() {
        // A writer after a reader must get a greater fence.
        assert_eq!(
            kinds(vec![
                grant(1, 0, 1, 5, 100, SHARED),
                release(1, 2, 3, 5),
                grant(2, 4, 5, 4, 100, None),
            ]),
            ["fence-order"]
        );
        // Two readers at once never share a fence either.
        assert_eq!(
            kinds(vec![
                grant(1, 0, 1, 5, 100, SHARED),
                grant(2, 2, 3, 5, 100, SHARED),
            ]),
            ["fence-order"]
        );
    }

    #[test]
    fn a_request_of_another_family_must_be_refused_at_once() {
        // kinds-memory-mismatch-queues: permits asked while shared holds
        // are held, queued and granted after them.
        let mut mixed = grant(2, 5, 120, 2, 100, P2);
        mixed.wait_ms = 1_000;
        mixed.start = Some(110 * MS);
        mixed.queued = vec![6 * MS];
        let found = kinds(vec![
            grant(1, 0, 1, 1, 100, SHARED),
            release(1, 110, 111, 1),
            mixed,
        ]);
        assert_eq!(found, ["kind-mismatch-not-refused"]);
        // Refused: as documented.
        let refused = op(2, 0, Kind::Acquire, 5, 6, Outcome::KindMismatch);
        assert!(kinds(vec![grant(1, 0, 1, 1, 100, SHARED), refused]).is_empty());
    }

    /// Seed 2 on Redis Cluster (CI, a build beside it): permits asked at 51
    /// ms while a shared hold held, answered Ok at 55; the hold's release
    /// was asked at 53. The request may have reached the server after the
    /// release: nothing says it was weighed beside the hold. It was if it
    /// was queued before the release was asked, or answered before it.
    #[test]
    fn a_request_that_may_have_come_after_the_release_is_not_a_mismatch() {
        let ops = |queued: Option<u64>, outcome: Outcome, ret: u64| {
            let mut permit = grant(2, 51, ret, 2, 100, P2);
            permit.wait_ms = 1_000;
            permit.start = Some(54 * MS);
            if outcome != Outcome::Ok {
                permit.fence = None;
            }
            permit.outcome = outcome;
            permit.queued = queued.map(|q| vec![q * MS]).unwrap_or_default();
            vec![
                grant(1, 0, 1, 1, 100, SHARED),
                release(1, 53, 54, 1),
                permit,
            ]
        };
        assert!(kinds(ops(None, Outcome::Ok, 55)).is_empty());
        // Queued while the hold held: weighed beside it.
        assert_eq!(
            kinds(ops(Some(52), Outcome::Ok, 55)),
            ["kind-mismatch-not-refused"]
        );
        // Answered busy before the release was even asked.
        assert_eq!(
            kinds(ops(None, Outcome::Busy, 52)),
            ["kind-mismatch-not-refused"]
        );
    }

    /// Redis restarted without its data from 100 to 150 ms (its process
    /// dead by `lost_by`): locks lost, fences start over.
    fn wiped(lost_by: Option<u64>) -> Fault {
        Fault {
            what: "restart without data".into(),
            at: 100 * MS,
            until: 150 * MS,
            process: None,
            loses_locks: true,
            lost_by,
            resets_fences: true,
            crash: false,
            quiet: false,
        }
    }

    /// The violations in `ops` around [`wiped`], with an extend of fence 1
    /// by process `p` at `at` ms, answered Ok.
    fn after_a_wipe(
        lost_by: Option<u64>,
        mut ops: Vec<Op>,
        (p, at): (u32, u64),
    ) -> Vec<&'static str> {
        let mut extend = op(p, 7, Kind::Extend, at, at + 1, Outcome::Ok);
        extend.fence_in = Some(1);
        extend.fence = Some(1);
        ops.push(extend);
        let h = History {
            ops,
            faults: vec![wiped(lost_by)],
            op_timeout_ms: 100,
            ..History::default()
        };
        check(&h, Bounds::default())
            .iter()
            .map(|v| v.kind)
            .collect()
    }

    /// Seed 1009 on Redis: a writer held fence 1, Redis restarted without
    /// its data (fences start over), then two readers got fences 1 and 2.
    /// Reader 1's extend names the new fence 1, a shared hold beside reader
    /// 2: no stale call (the old epoch's fence 1 was a writer's).
    #[test]
    fn a_fence_reused_after_a_restart_without_data_is_the_new_epochs() {
        let found = after_a_wipe(
            None,
            vec![
                grant(3, 0, 1, 1, 1_000, None),
                grant(1, 160, 161, 1, 1_000, SHARED),
                grant(2, 200, 201, 2, 1_000, SHARED),
            ],
            (1, 220),
        );
        assert!(found.is_empty(), "{found:?}");
    }

    /// Seed 2 on Redis (the short pass, once the relay workload came): a
    /// reader held fence 1 and let go; Redis was killed at 100 ms and came
    /// back without its data by 150. A permit asked at 120 ms, while it was
    /// down, got the new epoch's fence 1; another permit got fence 2; the
    /// first permit's holder then extended fence 1. That grant came after
    /// the loss, so the fault did not end it, and the extend is the
    /// permit's (beside another permit), not the old reader's.
    #[test]
    fn a_grant_asked_after_the_server_went_down_is_not_lost_by_that_fault() {
        let found = after_a_wipe(
            Some(101 * MS),
            vec![
                grant(1, 0, 1, 1, 1_000, SHARED),
                release(1, 10, 11, 1),
                grant(2, 120, 160, 1, 1_000, P2),
                grant(3, 161, 162, 2, 1_000, P2),
            ],
            (2, 170),
        );
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn a_release_beside_other_readers_is_no_stale_call() {
        // Reader 1 releases while reader 2 holds: both may hold.
        assert!(
            kinds(vec![
                grant(1, 0, 1, 1, 1_000, SHARED),
                grant(2, 2, 3, 2, 1_000, SHARED),
                release(1, 10, 11, 1),
            ])
            .is_empty()
        );
        // Reader 1's release answered Ok while a writer surely held: stale.
        let mut force = op(9, 0, Kind::ForceRelease, 4, 5, Outcome::Ok);
        force.key = "k".into();
        assert_eq!(
            kinds(vec![
                grant(1, 0, 1, 1, 1_000, SHARED),
                force,
                grant(2, 6, 7, 2, 1_000, None),
                release(1, 10, 11, 1),
            ]),
            ["stale-call-succeeded"]
        );
    }

    /// A shared waiter asking at 2 ms (max wait 2 s), granted at `granted`
    /// ms, beside a reader that holds from 0 to 1 s; `writer`: an exclusive
    /// request waiting from 1 to 900 ms, ahead of it.
    fn reader_waits(granted: u64, writer: bool) -> Vec<&'static str> {
        let mut waiter = grant(2, 2, granted + 1, 3, 300, SHARED);
        waiter.wait_ms = 2_000;
        waiter.start = Some(granted * MS);
        waiter.queued = vec![3 * MS];
        let mut ops = vec![
            grant(1, 0, 1, 1, 1_000, SHARED),
            release(1, 1_000, 1_001, 1),
            waiter,
        ];
        if writer {
            let mut w = op(3, 0, Kind::Acquire, 1, 900, Outcome::Timeout);
            w.wait_ms = 899;
            w.ttl_ms = 100;
            ops.push(w);
        }
        kinds(ops)
    }

    #[test]
    fn a_writer_of_a_killed_process_holds_later_readers_back_until_its_max_wait() {
        // Seed 1069 (Redis Cluster with failover): a reader holds from 0 to
        // 1 s; a writer asks at 1 ms (max wait 1.5 s) and its process is
        // killed at 100 ms, its call cancelled there; a reader asking at
        // 200 ms queues behind the writer's entry, which the server keeps,
        // and times out at 900 ms.
        let reader = |killed: bool| {
            let mut w = op(3, 0, Kind::Acquire, 1, 100, Outcome::Cancelled);
            w.wait_ms = 1_500;
            w.ttl_ms = 100;
            let mut r = op(2, 0, Kind::Acquire, 200, 900, Outcome::Timeout);
            r.lock_kind = SHARED.map(str::to_owned);
            r.wait_ms = 700;
            r.ttl_ms = 100;
            r.queued = vec![201 * MS];
            let h = History {
                ops: vec![
                    grant(1, 0, 1, 1, 1_000, SHARED),
                    release(1, 1_000, 1_001, 1),
                    w,
                    r,
                ],
                faults: vec![Fault {
                    what: "sigkill p3".into(),
                    at: 100 * MS,
                    until: 100 * MS,
                    process: Some(3),
                    loses_locks: false,
                    lost_by: None,
                    resets_fences: false,
                    crash: killed,
                    quiet: false,
                }],
                op_timeout_ms: 100,
                ..History::default()
            };
            check(&h, Bounds::default())
                .iter()
                .map(|v| v.kind)
                .collect::<Vec<_>>()
        };
        assert!(reader(true).is_empty(), "{:?}", reader(true));
        // Paused, not killed: the writer's call ended (cancelled) at 100 ms
        // and its process left the queue; the reader had nothing ahead.
        assert_eq!(reader(false), ["lost-wake-up"]);
    }

    #[test]
    fn a_reader_kept_waiting_beside_readers_is_a_lost_wake_up() {
        // kinds-memory-hand-off-grants-one-reader: nothing but a reader
        // held, no writer asked, and the reader waited until the holder
        // left.
        assert_eq!(reader_waits(1_001, false), ["lost-wake-up"]);
        // Granted at once beside the reader: fine.
        assert!(reader_waits(3, false).is_empty());
        // Behind a writer that waited ahead of it: it had to wait.
        assert!(reader_waits(1_001, true).is_empty());
    }

    /// A permit waiter (of 2) asking at 2 ms, granted at `granted` ms; one
    /// permit held from 0 to 1 s, and `full`: another from 1 ms to 1 s.
    fn permit_waits(granted: u64, full: bool) -> Vec<&'static str> {
        let mut waiter = grant(3, 2, granted + 1, 3, 300, P2);
        waiter.wait_ms = 2_000;
        waiter.start = Some(granted * MS);
        waiter.queued = vec![3 * MS];
        let mut ops = vec![
            grant(1, 0, 1, 1, 1_000, P2),
            release(1, 1_000, 1_001, 1),
            waiter,
        ];
        if full {
            ops.push(grant(2, 1, 2, 2, 1_000, P2));
            ops.push(release(2, 1_000, 1_001, 2));
        }
        kinds(ops)
    }

    #[test]
    fn a_permit_kept_waiting_while_one_was_free_is_a_lost_wake_up() {
        assert_eq!(permit_waits(1_001, false), ["lost-wake-up"]);
        assert!(permit_waits(1_001, true).is_empty());
    }

    #[test]
    fn a_reader_that_barges_past_a_queued_writer_is_caught() {
        // kinds-memory-newcomer-barges-past-the-queue: readers hold, a
        // writer queues at 3 ms, a reader asking at 50 ms is granted at
        // once (beside the readers) while the writer still waits.
        let mut writer = op(3, 0, Kind::Acquire, 2, 2_000, Outcome::Timeout);
        writer.wait_ms = 2_000;
        writer.ttl_ms = 100;
        writer.queued = vec![3 * MS];
        let barging = |late: bool| {
            let at = if late { 50 } else { 1 };
            kinds(vec![
                grant(1, 0, 1, 1, 1_000, SHARED),
                writer.clone(),
                grant(2, at, at + 1, 2, 100, SHARED),
                release(2, at + 10, at + 11, 2),
                release(1, 990, 991, 1),
            ])
        };
        assert!(barging(true).contains(&"barging"), "{:?}", barging(true));
        // Asked before the writer queued: granted beside the reader, fine.
        assert!(!barging(false).contains(&"barging"));
    }
}
