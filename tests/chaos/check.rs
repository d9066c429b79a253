//! The offline checker: a run's history against the model.
//!
//! 1. **Mutual exclusion.** Every grant is a lease: from its reply (when the
//!    holder surely knows it holds) to the earliest its TTL can end (counted
//!    from the invocation, or from the hand-off after a wait), moved by each
//!    successful extension (invocation + TTL) and cut short by the holder's
//!    own release, hand-off or publish. A lease is lost by the README's
//!    rules at a force release of its key and at a fault that loses locks (a
//!    server restarted without its data). Two leases of one key with
//!    different fences that overlap are a violation.
//! 2. **Fences.** A grant whose reply came before another grant of the key
//!    was asked for has the smaller fence, and no fence is granted twice
//!    (within an epoch: a restart without data starts fences over, as
//!    documented).
//! 3. **No lost wake-up.** A waiter must not have slept, before it timed
//!    out or before the grant its lease dates from, through a stretch of at
//!    least `wake_bound` in which nobody else could have held the key
//!    (every possible holder's lease ended: its release answered, or its
//!    TTL ran out by the server's clock at the latest), and no faults ran: a
//!    grant that came only at a re-check, at the max wait or with a
//!    newcomer's call was a wake-up lost. A waiter must not be granted the
//!    lock later than its max wait plus the op timeout (and some slack for
//!    this machine).
//! 4. **No lost update.** The fenced store's final value of every key is
//!    the number of writes it accepted (each client writes value + 1 of what
//!    it read under the same fence), unless a write under a fence drawn
//!    before a restart without data landed after it (the server may have
//!    drawn that number again: the README's limit).
//! 5. **The lost signal tells the truth.** A store call made while the
//!    client's handle said its lock was held (or the layer ran the handler)
//!    must fall inside the lease, up to `belief_slack` (the gap between the
//!    check and the call on a loaded machine). A holder cannot see a force
//!    release or a server that lost its data; those are exempt.
//! 6. **A stale call never succeeds.** A release, extension, claim or publish
//!    that named fence F and answered Ok must not have run entirely while
//!    another acquisition of the key (another fence) surely held it: it acted
//!    on somebody else's lock.
//! 7. **First come, first served.** A grant must not go to a caller that
//!    asked after a waiter's queue entry was written while that waiter was
//!    still waiting within its max wait (no barging, no overtaking). The
//!    queue's order is the server's: a waiter's place dates from when its
//!    entry was known written (the backend said so, see `queued.rs`), not
//!    from its call (a request held back in the network, or queued only on
//!    a later attempt, came later). A waiter whose entry was made again
//!    after something that takes a live waiter's entry away (a fault, a
//!    force release, its TTL's worth of time for a hand-off it did not see
//!    to run out) lost its place at a time the history cannot tell, and
//!    claims none before the later entry; made again with none of those
//!    between, the backend dropped it, and its first place stands.
//! 8. **Liveness.** After the faults ended and every client stopped, every
//!    key comes free within its TTL, and no client process hangs.
//!
//! Rules 9 to 11, and how the others read shared holds and permits, are in
//! `check_kinds.rs`; 12 is at its function (`cut_short`), and 13 and 14:
//!
//! 13. **A grant carries its whole TTL.** The README's TTL runs from the
//!     grant: the lease a grant reports (`Lease::lasts`, from the grant to
//!     the expiry the server set, both on its clock) is the TTL asked for.
//!     Shorter, the server set the expiry from a moment before the grant
//!     (a re-check dated from its own start): the holder is told, so no two
//!     holders follow, but it holds for less than it asked.
//! 14. **A call by another owner never acts.** A release or an extension
//!     naming a hold's fence under another owner token answers "not
//!     yours" (`foreign_calls`).

use std::collections::BTreeMap;

use tower_lock::LockKind;

use super::clock::MS;
use super::history::{Fault, History, Kind, Op, Outcome};

#[path = "check_kinds.rs"]
mod kinds;

/// One violation: what kind, and the evidence.
#[derive(Debug, Clone)]
pub struct Violation {
    pub kind: &'static str,
    pub detail: String,
}

/// Limits the checker allows for this machine.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// How soon a waiter must get a lock that came free.
    pub wake_ns: u64,
    /// Slack for a late grant beyond max wait + op timeout.
    pub late_ns: u64,
    /// How long after a lease's end a handle may still have said it held.
    pub belief_ns: u64,
    /// How long a server may still hold the locks of a client process
    /// after it stopped (SIGSTOP): 0 where the server keeps every TTL
    /// itself; etcd's backend keeps TTLs in the holder's process, and a
    /// stopped process's locks go when its lease runs out (the README's
    /// etcd limits). Until then, or until it resumes.
    pub stopped_holder_ns: u64,
    /// How far apart the backend may grant readers at the head of the queue
    /// that one release frees (rule 11): one script or statement on Redis
    /// and PostgreSQL; on etcd one transaction each (each grant's revision
    /// is its fence, so two grants never share one), a Raft commit apart.
    pub together_ns: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            wake_ns: 250 * MS,
            late_ns: 300 * MS,
            belief_ns: 50 * MS,
            stopped_holder_ns: 0,
            together_ns: 10 * MS,
        }
    }
}

#[derive(Debug, Clone)]
struct Lease {
    key: String,
    fence: u64,
    /// The owner token it was granted to, if recorded.
    owner: Option<String>,
    /// The kind of hold (a claim's is its grant's).
    kind: LockKind,
    p: u32,
    id: u64,
    /// When the grant was asked for (the server granted it after this).
    asked: u64,
    /// When the holder learnt it holds.
    sure: u64,
    /// The earliest the lease can end by the rules (the holder may use it
    /// until then).
    end: u64,
    /// Where its TTL from the earliest start ends, before any extension.
    granted_end: u64,
    /// The call that granted it (an acquire, a claim, a flight's start).
    by: Kind,
    /// The latest the server can still hold it (for freeness).
    held_until: u64,
    /// Why `end` is what it is (for reports).
    why: &'static str,
    /// When the holder was told the acquisition is gone (a renewal or an
    /// extension answered not found / not yours).
    told_lost: Option<u64>,
}

fn ms(ns: u64, t0: u64) -> String {
    format!("{:.1}ms", ns.saturating_sub(t0) as f64 / MS as f64)
}

/// Check `h`; the violations found (empty: the run passed).
pub fn check(h: &History, bounds: Bounds) -> Vec<Violation> {
    let mut out = Vec::new();
    let t0 = h.ops.iter().map(|o| o.inv).min().unwrap_or(0);
    let op_timeout = h.op_timeout_ms * MS;
    let mut ops: Vec<&Op> = h.ops.iter().collect();
    ops.sort_by_key(|o| (o.inv, o.p, o.id));

    let leases = leases(&ops, &h.faults);
    exclusion(&leases, &h.faults, t0, &mut out);
    kinds::overlaps(&leases, &h.faults, t0, &mut out);
    kinds::mismatches(&ops, &leases, t0, &mut out);
    fences(&leases, &h.faults, t0, &mut out);
    wakeups(&ops, &leases, h, bounds, t0, op_timeout, &mut out);
    beliefs(&ops, &leases, bounds, t0, &mut out);
    stale_calls(&ops, &leases, t0, &mut out);
    foreign_extends(&ops, t0, &mut out);
    foreign_calls(&ops, &leases, &h.faults, t0, &mut out);
    cut_short(&ops, &leases, &h.faults, bounds, t0, &mut out);
    whole_ttl(&ops, bounds, t0, &mut out);
    fifo(&ops, h, t0, op_timeout, &mut out);
    kinds::together(
        &ops,
        &h.faults,
        t0,
        op_timeout,
        bounds.together_ns,
        &mut out,
    );
    let reused = reused_fences(&ops, &leases, &h.faults);
    for (key, value, writes) in &h.store {
        // Each write under a fence granted again may have lost one update,
        // no more: any other missing update is a violation.
        let excused = reused.get(key.as_str()).copied().unwrap_or(0);
        if value > writes || writes - value > excused {
            out.push(Violation {
                kind: "lost-update",
                detail: format!(
                    "store key {key}: value {value} but {writes} writes accepted \
                     (each writes what it read + 1)"
                ),
            });
        }
    }
    for key in &h.stuck {
        out.push(Violation {
            kind: "liveness",
            detail: format!("{key} still held or queued after the run (TTL + bound)"),
        });
    }
    for op in &ops {
        if let Outcome::Other(code) = &op.outcome
            && op.kind != Kind::Read
            && op.kind != Kind::Write
        {
            out.push(Violation {
                kind: "unexpected-answer",
                detail: format!(
                    "{:?} p{} #{} on {} answered {code}",
                    op.kind, op.p, op.id, op.key
                ),
            });
        }
    }
    out
}

/// How many updates each store key may have lost to a fault that starts
/// fences over (the README's limit of a server restarted without its data:
/// the server may grant a fence again, and the store cannot tell the two
/// holders apart). One per accepted write whose read-modify-write began
/// before the fault ended, under a grant made before it, and that was
/// written after it struck: matched to its read (same process, key, fence
/// and owner token), each read counted once. Two grants of one fence to one
/// owner in one process (a job's owner is the same for every run of its
/// key) cannot be told apart, so any of them may be the write's; but only a
/// read from before the fault can be a stale one's, so a later holder's
/// writes excuse nothing.
fn reused_fences<'a>(ops: &[&'a Op], leases: &[Lease], faults: &[Fault]) -> BTreeMap<&'a str, u64> {
    let index = LeaseIndex::new(leases);
    let resets: Vec<&Fault> = faults.iter().filter(|f| f.resets_fences).collect();
    let mut counts = BTreeMap::new();
    if resets.is_empty() {
        return counts;
    }
    let ok = |o: &&&Op, kind: Kind| o.kind == kind && o.outcome == Outcome::Ok;
    let reads: Vec<&Op> = ops.iter().filter(|o| ok(o, Kind::Read)).copied().collect();
    let mut used = vec![false; reads.len()];
    for w in ops.iter().filter(|o| ok(o, Kind::Write)) {
        let stale = reads.iter().enumerate().position(|(i, r)| {
            !used[i]
                && r.inv < w.inv
                && (r.p, &r.key, r.fence_in, &r.owner) == (w.p, &w.key, w.fence_in, &w.owner)
                && resets.iter().any(|f| {
                    r.inv < f.until
                        && f.at < w.ret
                        && index
                            .candidates(leases, r)
                            .any(|l| leases[l].asked < f.until)
                })
        });
        if let Some(i) = stale {
            used[i] = true;
            *counts.entry(w.key.as_str()).or_default() += 1;
        }
    }
    counts
}

/// Every grant's lease, with what the history says of its end.
fn leases(ops: &[&Op], faults: &[Fault]) -> Vec<Lease> {
    let mut leases: Vec<Lease> = Vec::new();
    for op in ops {
        let granted = matches!(op.kind, Kind::Acquire | Kind::FlightBegin | Kind::Claim)
            && op.outcome == Outcome::Ok;
        if granted && let (Some(fence), Some(start)) = (op.fence, op.start) {
            let ttl = op.lease_ms * MS;
            leases.push(Lease {
                key: op.key.clone(),
                fence,
                owner: op.owner.clone(),
                kind: kinds::kind_of(op),
                p: op.p,
                id: op.id,
                asked: op.inv,
                sure: op.ret,
                end: start + ttl,
                granted_end: start + ttl,
                by: op.kind,
                held_until: op.ret + ttl,
                why: "its TTL",
                told_lost: None,
            });
        }
    }
    kinds::inherit_kinds(&mut leases, ops);
    // First what the TTL allows (extensions move it), then where the holder
    // gave the lock up: a release or a hand-off ends its use of the lock
    // whatever a renewal in flight beside it does (two calls in flight are
    // applied in an order the history cannot tell).
    let index = LeaseIndex::new(&leases);
    let mut given_up: Vec<Option<(u64, &'static str)>> = vec![None; leases.len()];
    let mut released: Vec<Option<u64>> = vec![None; leases.len()];
    for op in ops {
        let Some(i) = index.find(&leases, op) else {
            continue;
        };
        let lease = &mut leases[i];
        let give_up = |at: u64, why: &'static str, slot: &mut Option<(u64, &'static str)>| {
            if slot.is_none_or(|(t, _)| at < t) {
                *slot = Some((at, why));
            }
        };
        match (op.kind, &op.outcome) {
            (Kind::Extend, Outcome::Ok) => {
                lease.end = op.inv + op.ttl_ms * MS;
                lease.held_until = lease.held_until.max(op.ret + op.ttl_ms * MS);
                lease.why = "an extension's TTL";
            }
            (Kind::Extend, Outcome::Cancelled | Outcome::Unavailable) => {
                // It may have landed (an extension replaces the TTL, so it
                // can shorten it) or not.
                lease.end = lease.end.min(op.inv + op.ttl_ms * MS);
                lease.held_until = lease.held_until.max(op.ret + op.ttl_ms * MS);
            }
            (Kind::Extend, Outcome::NotFound | Outcome::Mismatch) => {
                lease.told_lost = Some(lease.told_lost.map_or(op.ret, |t| t.min(op.ret)));
            }
            (Kind::Release | Kind::FlightPublish, outcome) => {
                give_up(op.inv, "its release", &mut given_up[i]);
                if *outcome == Outcome::Ok || *outcome == Outcome::NotFound {
                    released[i] = Some(released[i].map_or(op.ret, |t| t.min(op.ret)));
                }
            }
            (Kind::Handoff, _) => give_up(op.inv, "its hand-off", &mut given_up[i]),
            _ => {}
        }
    }
    for (i, lease) in leases.iter_mut().enumerate() {
        if let Some((at, why)) = given_up[i]
            && at < lease.end
        {
            lease.end = at;
            lease.why = why;
        }
        if let Some(at) = released[i] {
            lease.held_until = lease.held_until.min(at);
        }
    }
    // Lost by the rules: force releases, faults that lose locks.
    for op in ops.iter().filter(|o| o.kind == Kind::ForceRelease) {
        for lease in leases.iter_mut().filter(|l| l.key == op.key) {
            if lease.asked < op.ret && op.inv < lease.end {
                lease.end = op.inv;
                lease.why = "a force release";
            }
        }
    }
    for f in faults.iter().filter(|f| f.loses_locks) {
        let lost_by = f.lost_by.unwrap_or(f.until);
        for lease in &mut leases {
            if lease.asked < lost_by && f.at < lease.end {
                lease.end = f.at;
                lease.why = "a fault that loses locks";
            }
        }
    }
    // After a fault that starts fences over, an acquisition from before it
    // and one granted after it can share owner and fence (a custom owner
    // several clients use): a release or an extend of the old one that
    // reached the server acted on the new one, the README's limit of a
    // server restarted without its data. The new lease may end there; one
    // that its holder's own call ended may have ended there too, if that
    // call was still unanswered when the old one's call went out (the
    // server may have run the old one's first).
    let resets: Vec<&Fault> = faults.iter().filter(|f| f.resets_fences).collect();
    let ended_by_own_call_after = |l: &Lease, t: u64| {
        ops.iter().any(|c| {
            c.p == l.p
                && c.key == l.key
                && c.fence_in == Some(l.fence)
                && c.inv == l.end
                && c.ret > t
        })
    };
    if !resets.is_empty() {
        let index = LeaseIndex::new(&leases);
        let mut cut: Vec<(usize, u64)> = Vec::new();
        for op in ops
            .iter()
            .filter(|o| matches!(o.kind, Kind::Release | Kind::Extend) && o.outcome == Outcome::Ok)
        {
            let Some(own) = index.find(&leases, op) else {
                continue;
            };
            for (i, l) in leases.iter().enumerate() {
                let reused = i != own
                    && l.key == op.key
                    && Some(l.fence) == op.fence_in
                    && l.owner.is_some()
                    && l.owner == leases[own].owner
                    && resets
                        .iter()
                        .any(|f| leases[own].asked < f.until && f.at < l.sure);
                if reused
                    && l.asked < op.ret
                    && (op.inv < l.end || ended_by_own_call_after(l, op.inv))
                {
                    cut.push((i, op.inv));
                }
            }
        }
        for (i, at) in cut {
            if at < leases[i].end {
                leases[i].end = at;
            }
            leases[i].why = REUSED_FENCE;
        }
    }
    leases
}

/// Why a lease ended at a call of an acquisition from before a fault that
/// started fences over, under the same owner and fence.
const REUSED_FENCE: &str = "a call under its owner and fence from before a restart without data";

/// Which lease a call after the grant is about: the same key and fence,
/// made by the holder's own process (a release, an extension, the
/// watchdog's renewals, a hand-off, its store calls), granted before the
/// call: the latest such. The process tells apart two grants of one fence,
/// which a server restarted without its data makes possible.
struct LeaseIndex(BTreeMap<(String, u64, u32), Vec<usize>>);

impl LeaseIndex {
    fn new(leases: &[Lease]) -> Self {
        let mut map: BTreeMap<(String, u64, u32), Vec<usize>> = BTreeMap::new();
        for (i, l) in leases.iter().enumerate() {
            map.entry((l.key.clone(), l.fence, l.p))
                .or_default()
                .push(i);
        }
        LeaseIndex(map)
    }

    fn find(&self, leases: &[Lease], op: &Op) -> Option<usize> {
        self.candidates(leases, op).max_by_key(|&i| leases[i].sure)
    }

    /// Every lease `op` may be about (see [`LeaseIndex::find`], the latest).
    fn candidates<'a>(
        &'a self,
        leases: &'a [Lease],
        op: &'a Op,
    ) -> impl Iterator<Item = usize> + 'a {
        op.fence_in
            .and_then(|fence| self.0.get(&(op.key.clone(), fence, op.p)))
            .into_iter()
            .flatten()
            .copied()
            .filter(move |&i| leases[i].sure <= op.inv)
            .filter(move |&i| match (&leases[i].owner, &op.owner) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            })
    }
}

fn last_fault_before(faults: &[Fault], t: u64, t0: u64) -> String {
    faults
        .iter()
        .filter(|f| f.at <= t)
        .max_by_key(|f| f.at)
        .map_or("none".to_owned(), |f| {
            format!("{} at {}", f.what, ms(f.at, t0))
        })
}

fn exclusion(leases: &[Lease], faults: &[Fault], t0: u64, out: &mut Vec<Violation>) {
    let mut by_key: BTreeMap<&str, Vec<&Lease>> = BTreeMap::new();
    for l in leases.iter().filter(|l| l.end > l.sure) {
        by_key.entry(&l.key).or_default().push(l);
    }
    for (key, mut ls) in by_key {
        ls.sort_by_key(|l| l.sure);
        for (i, a) in ls.iter().enumerate() {
            for b in &ls[i + 1..] {
                if b.sure >= a.end {
                    break;
                }
                // Pairs with a shared hold or a permit: rule 9.
                let exclusive = a.kind == LockKind::Exclusive && b.kind == LockKind::Exclusive;
                if a.fence != b.fence && exclusive {
                    out.push(Violation {
                        kind: "two-holders",
                        detail: format!(
                            "{key}: fence {} (p{} #{}) held {}..{} (until {}) overlaps fence {} \
                             (p{} #{}) held from {}; last fault before: {}",
                            a.fence,
                            a.p,
                            a.id,
                            ms(a.sure, t0),
                            ms(a.end, t0),
                            a.why,
                            b.fence,
                            b.p,
                            b.id,
                            ms(b.sure, t0),
                            last_fault_before(faults, b.sure, t0)
                        ),
                    });
                }
            }
        }
    }
}

fn fences(leases: &[Lease], faults: &[Fault], t0: u64, out: &mut Vec<Violation>) {
    let resets: Vec<&Fault> = faults.iter().filter(|f| f.resets_fences).collect();
    let reset_between = |a: u64, b: u64| resets.iter().any(|f| f.at < b && f.until > a);
    let mut by_key: BTreeMap<&str, Vec<&Lease>> = BTreeMap::new();
    for l in leases {
        by_key.entry(&l.key).or_default().push(l);
    }
    for (key, mut ls) in by_key {
        ls.sort_by_key(|l| l.sure);
        for (i, a) in ls.iter().enumerate() {
            for b in &ls[i + 1..] {
                let ordered = a.sure < b.asked || granted_after(a, b);
                let clash = a.fence == b.fence || (ordered && a.fence > b.fence);
                if clash && !reset_between(a.asked.min(b.asked), b.sure) {
                    out.push(Violation {
                        kind: "fence-order",
                        detail: format!(
                            "{key}: fence {} granted at {} (p{} #{}), then fence {} asked at {} \
                             granted at {} (p{} #{}); last fault before: {}",
                            a.fence,
                            ms(a.sure, t0),
                            a.p,
                            a.id,
                            b.fence,
                            ms(b.asked, t0),
                            ms(b.sure, t0),
                            b.p,
                            b.id,
                            last_fault_before(faults, b.sure, t0)
                        ),
                    });
                }
            }
        }
    }
}

/// Whether `b`, answered after `a` but asked before `a` was answered, can
/// only have been granted after `a` was: two exclusive holds, `a` live when
/// its holder learnt of it, and `b`'s lease, from the earliest it can have
/// started, still running then. Had `b` been granted by then, both would
/// have held at that moment. (A statement that drew its fence, then stalled
/// before it wrote its row, while another took and gave back the key, is
/// the way this shows.)
fn granted_after(a: &Lease, b: &Lease) -> bool {
    a.kind == LockKind::Exclusive
        && b.kind == LockKind::Exclusive
        && a.sure < b.sure
        && a.end > a.sure
        && b.granted_end.min(b.end) > a.sure
}

/// Rule 12: a lease the server ended before its TTL. A release or an
/// extend of an exclusive acquisition answered "not found" or "not yours"
/// while its TTL (from the earliest the grant can have been made, or from
/// the extension that set it last) had not run out is a lease cut short,
/// unless the holder gave it up meanwhile (a release or hand-off in flight
/// or done), a force release or a fault that is not `quiet` (one that loses
/// locks, or breaks connections so that calls are retried) came during it.
/// Only where the server keeps every TTL itself (etcd's backend keeps them
/// in the holder's process: `Bounds::stopped_holder_ns`).
fn cut_short(
    ops: &[&Op],
    leases: &[Lease],
    faults: &[Fault],
    bounds: Bounds,
    t0: u64,
    out: &mut Vec<Violation>,
) {
    /// Slack for the server's clock read against the client's.
    const SLACK: u64 = 5 * MS;
    if bounds.stopped_holder_ns != 0 {
        return;
    }
    let index = LeaseIndex::new(leases);
    let mut calls: Vec<Vec<&Op>> = vec![Vec::new(); leases.len()];
    for op in ops {
        if let Some(i) = index.find(leases, op) {
            calls[i].push(op);
        }
    }
    let refused = |o: &Op| {
        matches!(o.kind, Kind::Release | Kind::Extend)
            && matches!(o.outcome, Outcome::NotFound | Outcome::Mismatch)
    };
    for (lease, calls) in leases.iter().zip(&calls) {
        if lease.by != Kind::Acquire || lease.kind != LockKind::Exclusive {
            continue;
        }
        for op in calls.iter().filter(|o| refused(o)) {
            let other = |c: &&&Op| !std::ptr::eq(**c, *op);
            let given_up = calls.iter().filter(other).any(|c| {
                matches!(c.kind, Kind::Release | Kind::Handoff | Kind::FlightPublish)
                    && c.inv < op.ret
            });
            // The TTL the server can have set last before answering: the
            // latest extension known applied, or the grant; any extension
            // sent after it may have replaced it with a shorter one.
            let last_ok = calls
                .iter()
                .filter(|c| c.kind == Kind::Extend && c.outcome == Outcome::Ok && c.ret < op.inv)
                .max_by_key(|c| c.ret);
            let since = last_ok.map_or(0, |e| e.inv);
            let set = last_ok.map_or(lease.granted_end, |e| e.inv + e.ttl_ms * MS);
            let ttl_end = calls
                .iter()
                .filter(other)
                .filter(|c| c.kind == Kind::Extend && c.inv > since && c.inv < op.ret)
                .map(|e| e.inv + e.ttl_ms * MS)
                .fold(set, u64::min);
            if given_up || op.ret + SLACK >= ttl_end {
                continue;
            }
            let forced = ops.iter().any(|f| {
                f.kind == Kind::ForceRelease
                    && f.key == lease.key
                    && f.inv < op.ret
                    && f.ret > lease.asked
            });
            let fault = faults.iter().any(|f| {
                f.process.is_none()
                    && !f.crash
                    && !f.quiet
                    && f.at < op.ret
                    && f.until > lease.asked
            });
            if forced || fault || lease.why == REUSED_FENCE {
                continue;
            }
            out.push(Violation {
                kind: "lease-cut-short",
                detail: format!(
                    "{}: fence {} (p{} #{}) granted at {}, its TTL running until at least {}, \
                     but its {:?} (#{}) was answered {:?} at {}; last fault before: {}",
                    lease.key,
                    lease.fence,
                    lease.p,
                    lease.id,
                    ms(lease.sure, t0),
                    ms(ttl_end, t0),
                    op.kind,
                    op.id,
                    op.outcome,
                    ms(op.ret, t0),
                    last_fault_before(faults, op.ret, t0)
                ),
            });
        }
    }
}

/// Rule 13: a grant whose reported lease is shorter than the TTL it asked
/// for (1 ms for rounding). Not on etcd, whose waiters' queue entries go on
/// leases etcd may end sooner, which their grants report
/// (`Bounds::stopped_holder_ns`, as rule 12).
fn whole_ttl(ops: &[&Op], bounds: Bounds, t0: u64, out: &mut Vec<Violation>) {
    if bounds.stopped_holder_ns != 0 {
        return;
    }
    for op in ops {
        let grant = matches!(op.kind, Kind::Acquire | Kind::FlightBegin)
            && op.outcome == Outcome::Ok
            && op.start.is_some();
        if grant && op.lease_ms + 1 < op.ttl_ms {
            out.push(Violation {
                kind: "short-lease",
                detail: format!(
                    "{}: fence {} (p{} #{}, asked at {}, granted by {}) reports a lease of \
                     {} ms for a TTL of {} ms",
                    op.key,
                    op.fence.unwrap_or_default(),
                    op.p,
                    op.id,
                    ms(op.inv, t0),
                    ms(op.ret, t0),
                    op.lease_ms,
                    op.ttl_ms
                ),
            });
        }
    }
}

fn beliefs(ops: &[&Op], leases: &[Lease], bounds: Bounds, t0: u64, out: &mut Vec<Violation>) {
    let index = LeaseIndex::new(leases);
    for op in ops
        .iter()
        .filter(|o| matches!(o.kind, Kind::Read | Kind::Write))
    {
        let (Some(checked), Some(fence)) = (op.checked, op.fence_in) else {
            continue;
        };
        let Some(lease) = index.find(leases, op).map(|i| &leases[i]) else {
            continue;
        };
        // A holder cannot see a force release or a server that lost its
        // data, until a renewal or an extension tells it.
        let unseen = matches!(
            lease.why,
            "a force release" | "a fault that loses locks" | REUSED_FENCE
        );
        let told = lease
            .told_lost
            .is_some_and(|t| checked > t + bounds.belief_ns);
        if told || (!unseen && checked > lease.end + bounds.belief_ns) {
            out.push(Violation {
                kind: "held-after-lease",
                detail: format!(
                    "{}: p{} #{} ({:?}) under fence {fence} was told at {} that its lock was                      held; its lease ended at {} ({})",
                    op.key,
                    op.p,
                    op.id,
                    op.kind,
                    ms(checked, t0),
                    ms(lease.end, t0),
                    lease.why
                ),
            });
        }
    }
}

fn stale_calls(ops: &[&Op], leases: &[Lease], t0: u64, out: &mut Vec<Violation>) {
    let mut by_key: BTreeMap<&str, Vec<&Lease>> = BTreeMap::new();
    for l in leases.iter().filter(|l| l.end > l.sure) {
        by_key.entry(&l.key).or_default().push(l);
    }
    for op in ops {
        let acts = matches!(
            op.kind,
            Kind::Release | Kind::Extend | Kind::Claim | Kind::FlightPublish
        );
        let (true, Outcome::Ok, Some(fence)) = (acts, &op.outcome, op.fence_in) else {
            continue;
        };
        let held: Vec<&Lease> = by_key
            .get(op.key.as_str())
            .into_iter()
            .flatten()
            .filter(|m| m.fence != fence && m.sure <= op.inv && op.ret <= m.end)
            .copied()
            .collect();
        // The call's own lease: the latest one under its fence granted
        // before it returned. A restart without data starts fences over,
        // so an earlier epoch may have granted the same number (of
        // another kind) to someone else.
        let own = by_key
            .get(op.key.as_str())
            .into_iter()
            .flatten()
            .filter(|m| m.fence == fence && m.sure <= op.ret)
            .max_by_key(|m| m.sure)
            .map(|m| m.kind);
        let Some(other) = kinds::beside(own, &held) else {
            continue;
        };
        out.push(Violation {
            kind: "stale-call-succeeded",
            detail: format!(
                "{}: {:?} p{} #{} naming fence {fence} answered Ok during {}..{}, while fence {} \
                 (p{} #{}) held the key from {} to {}",
                op.key,
                op.kind,
                op.p,
                op.id,
                ms(op.inv, t0),
                ms(op.ret, t0),
                other.fence,
                other.p,
                other.id,
                ms(other.sure, t0),
                ms(other.end, t0)
            ),
        });
    }
}

/// Rule 14: a call by another owner never acts. A release or an extension
/// that named an acquisition's fence under an owner token that is not that
/// acquisition's (the kinds workload's meddling calls), answered Ok: it
/// acted on someone else's lock. Not once a fault started fences over (an
/// earlier epoch may have granted that fence to that owner).
fn foreign_calls(
    ops: &[&Op],
    leases: &[Lease],
    faults: &[Fault],
    t0: u64,
    out: &mut Vec<Violation>,
) {
    for op in ops {
        let named = matches!(op.kind, Kind::Release | Kind::Extend) && op.outcome == Outcome::Ok;
        let (true, Some(fence), Some(owner)) = (named, op.fence_in, &op.owner) else {
            continue;
        };
        if faults.iter().any(|f| f.resets_fences && f.at < op.ret) {
            continue;
        }
        let lease = leases
            .iter()
            .filter(|l| l.key == op.key && l.fence == fence && l.sure <= op.ret)
            .max_by_key(|l| l.sure);
        let Some(l) = lease else {
            continue;
        };
        if l.owner.as_ref().is_some_and(|o| o != owner) {
            out.push(Violation {
                kind: "foreign-call-succeeded",
                detail: format!(
                    "{}: {:?} p{} #{} under owner {owner} naming fence {fence} (p{} #{}, owner {}) \
                     answered Ok during {}..{}",
                    op.key,
                    op.kind,
                    op.p,
                    op.id,
                    l.p,
                    l.id,
                    l.owner.as_deref().unwrap_or_default(),
                    ms(op.inv, t0),
                    ms(op.ret, t0)
                ),
            });
        }
    }
}

/// An extend answers with the fence of the acquisition it extended: any
/// other than the one it named (by fence, or by an owner token of one
/// acquisition) is someone else's lock extended.
fn foreign_extends(ops: &[&Op], t0: u64, out: &mut Vec<Violation>) {
    for op in ops
        .iter()
        .filter(|o| o.kind == Kind::Extend && o.outcome == Outcome::Ok)
    {
        let (Some(named), Some(got)) = (op.fence_in, op.fence) else {
            continue;
        };
        if named != got {
            out.push(Violation {
                kind: "foreign-extend",
                detail: format!(
                    "{}: extend p{} #{} naming fence {named} during {}..{} extended fence {got}",
                    op.key,
                    op.p,
                    op.id,
                    ms(op.inv, t0),
                    ms(op.ret, t0)
                ),
            });
        }
    }
}

fn fifo(ops: &[&Op], h: &History, t0: u64, op_timeout: u64, out: &mut Vec<Violation>) {
    let waiters: Vec<&&Op> = ops
        .iter()
        .filter(|o| {
            o.kind == Kind::Acquire
                && o.wait_ms > 0
                && !o.queued.is_empty()
                && matches!(o.outcome, Outcome::Ok | Outcome::Timeout)
        })
        .collect();
    let disturbed = |from: u64, to: u64, procs: [u32; 2]| {
        h.faults.iter().any(|f| {
            let server = f.process.is_none();
            let ours = f.process.is_some_and(|p| procs.contains(&p));
            (server || ours) && f.at < to && f.until + op_timeout > from
        })
    };
    let forced: Vec<&&Op> = ops
        .iter()
        .filter(|o| o.kind == Kind::ForceRelease)
        .collect();
    // A waiter's place dates from its first entry. An entry made again
    // means the earlier one went; by the backends' rules only a fault (the
    // server's, or one that stopped the waiter), a force release taking
    // back a hand-off, or a hand-off it did not see running out (its TTL
    // fits between the two entries) takes a live waiter's entry away. With
    // one of those between two entries, it lost its place at a time the
    // history cannot tell and claims none before the later one; without,
    // the backend dropped a live waiter's entry and its first place stands.
    let place = |w: &Op| -> u64 {
        let mut entries = w.queued.clone();
        entries.sort_unstable();
        let mut place = entries[0];
        for pair in entries.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let lost = disturbed(a, b, [w.p, w.p])
                || forced
                    .iter()
                    .any(|f| f.key == w.key && f.inv < b && a < f.ret)
                || b - a >= w.ttl_ms * MS;
            if lost {
                place = b;
            }
        }
        place
    };
    for n in ops
        .iter()
        .filter(|o| matches!(o.kind, Kind::Acquire | Kind::FlightBegin) && o.outcome == Outcome::Ok)
    {
        for w in waiters
            .iter()
            .filter(|w| w.key == n.key && (w.p, w.id) != (n.p, n.id))
        {
            let queued = place(w);
            // A force release after its last entry may have taken back a
            // hand-off to it that it had not seen yet (its entry went with
            // the hand-off): from then on it holds no place, and, finding
            // its entry gone, it asks again; when the lock is free by then
            // it is granted at once, with no entry to record (etcd seed
            // 3114: queued by 90 ms, handed the lock by a release at ~140,
            // force-released at ~170, a newcomer granted at once at 172,
            // the waiter granted at once at 234 on its next look).
            let last_entry = w.queued.iter().copied().max().unwrap_or(queued);
            let taken_back = forced
                .iter()
                .any(|f| f.key == w.key && f.ret > last_entry && f.inv < n.ret);
            // A waiter granted the lock waited until the hand-off (a grant
            // after its lease ran out, before it woke, is no overtaking).
            let waited_until = match w.outcome {
                Outcome::Ok => w.start.unwrap_or(w.ret),
                _ => w.ret,
            };
            let waiting_until = waited_until.min(w.inv + w.wait_ms * MS);
            if queued < n.inv
                && n.ret + 10 * MS < waiting_until
                && !taken_back
                && !disturbed(queued, n.ret, [w.p, n.p])
            {
                out.push(Violation {
                    kind: "barging",
                    detail: format!(
                        "{}: p{} #{} asked at {} and was granted at {}, while p{} #{} (asked at \
                         {}, queued by {}, waiting until {}) was still waiting",
                        n.key,
                        n.p,
                        n.id,
                        ms(n.inv, t0),
                        ms(n.ret, t0),
                        w.p,
                        w.id,
                        ms(w.inv, t0),
                        ms(queued, t0),
                        ms(waiting_until, t0)
                    ),
                });
            }
        }
    }
}

/// `segments` minus `[lo, hi)`.
fn cut(segments: Vec<(u64, u64)>, lo: u64, hi: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(segments.len() + 1);
    for (a, b) in segments {
        if hi <= a || b <= lo {
            out.push((a, b));
            continue;
        }
        if a < lo {
            out.push((a, lo));
        }
        if hi < b {
            out.push((hi, b));
        }
    }
    out
}

/// The latest the server may hold a grant of process `p` asked at `asked`
/// and held by the rules until `until`, given `p`'s stops: with a
/// `stopped_ns` bound, a stop while it may hold keeps it until the process
/// resumes (and its own expiry runs, within an op timeout) or the bound
/// passes, whichever comes first. A process killed, or one that exited,
/// never resumes. A server fault while it may hold keeps it until the
/// server is back (within an op timeout), for a stop to keep it further.
/// "While it may hold" reaches an op timeout past `until`: the expiry due
/// then is a call of its own, and a stop or a fault before it lands keeps
/// the lock too (etcd, seed 3637: a TTL's end at 1,448 ms, its process
/// stopped at 1,453 ms on a loaded machine, the lock freed when it ran
/// again).
fn stopped_hold(
    faults: &[Fault],
    p: u32,
    asked: u64,
    until: u64,
    stopped_ns: u64,
    op_timeout: u64,
) -> u64 {
    if stopped_ns == 0 {
        return until;
    }
    let mut stops: Vec<&Fault> = faults
        .iter()
        .filter(|f| f.process.is_none_or(|q| q == p))
        .collect();
    stops.sort_by_key(|f| f.at);
    // In time order: a stop that begins while an earlier one keeps the
    // grant (two stops back to back) keeps it further; so does a server
    // fault (its expiry or release could not land until the server was
    // back, and a stop then keeps it from landing at all).
    stops.into_iter().fold(until, |until, f| {
        if f.at >= until + op_timeout || f.resumes() <= asked {
            until
        } else if f.process.is_none() {
            until.max(f.until + op_timeout)
        } else {
            until.max(
                f.resumes()
                    .saturating_add(op_timeout)
                    .min(f.at + stopped_ns),
            )
        }
    })
}

/// A stretch in which a call (process, operation) might have held a key.
type Hold = (u64, u64, (u32, u64));

/// How late a grant may come after a waiter's max wait by the history's
/// clock (the backend counts the wait from a moment after the invocation).
const GRANT_SLACK: u64 = 50 * MS;

/// The first moment from `op`'s invocation up to `by` at which no other
/// acquisition surely held its key (from the reply that told its holder to
/// the earliest end the rules allow): the earliest an exclusive grant to
/// `op` can have come. `None`: the key was surely held all along.
fn first_chance(leases: &[Lease], op: &Op, by: u64) -> Option<u64> {
    let mut held: Vec<(u64, u64)> = leases
        .iter()
        .filter(|l| l.key == op.key && (l.p, l.id) != (op.p, op.id) && l.sure < l.end)
        .map(|l| (l.sure, l.end))
        .collect();
    held.sort_unstable();
    let mut t = op.inv;
    for (a, b) in held {
        if a > t {
            break;
        }
        t = t.max(b);
    }
    (t <= by).then_some(t)
}

fn wakeups(
    ops: &[&Op],
    leases: &[Lease],
    h: &History,
    bounds: Bounds,
    t0: u64,
    op_timeout: u64,
    out: &mut Vec<Violation>,
) {
    // Who might have held each key, and when: every grant until the server
    // may still have held it, and every acquisition whose answer is
    // unknown until its wait and TTL could have ended; and which call it
    // was, so a waiter's own grant does not count against it.
    let mut holds: BTreeMap<&str, Vec<Hold>> = BTreeMap::new();
    let exits = h.exits.iter().map(|&(p, at)| Fault {
        what: format!("p{p} exited"),
        at,
        until: at,
        process: Some(p),
        loses_locks: false,
        lost_by: None,
        resets_fences: false,
        crash: true,
        quiet: false,
    });
    let stops: Vec<Fault> = h.faults.iter().cloned().chain(exits).collect();
    let stopped = |p: u32, asked: u64, until: u64| {
        stopped_hold(
            &stops,
            p,
            asked,
            until,
            bounds.stopped_holder_ns,
            op_timeout,
        )
    };
    // Which kind each of those calls holds, for a waiter of a kind that may
    // be granted beside some of them.
    let mut kind_of: BTreeMap<(u32, u64), LockKind> = BTreeMap::new();
    for l in leases {
        holds.entry(&l.key).or_default().push((
            l.asked,
            stopped(l.p, l.asked, l.held_until),
            (l.p, l.id),
        ));
        kind_of.insert((l.p, l.id), l.kind);
    }
    let writers = kinds::writers(ops, &h.faults, op_timeout);
    let own_stop = |op: &Op| {
        h.faults
            .iter()
            .any(|f| f.process == Some(op.p) && f.at < op.ret && f.resumes() > op.inv)
    };
    for op in ops {
        let indeterminate = matches!(op.outcome, Outcome::Cancelled | Outcome::Unavailable)
            && matches!(op.kind, Kind::Acquire | Kind::FlightBegin | Kind::Claim);
        // A waiter whose process was stopped while it waited may have been
        // handed the lock before its max wait ran out and seen the grant
        // only after (by then run out, or given back): it answered Timeout
        // but held the key meanwhile, for a TTL at most.
        let stopped_waiter = op.kind == Kind::Acquire
            && op.wait_ms > 0
            && op.outcome == Outcome::Timeout
            && own_stop(op);
        if !(stopped_waiter || indeterminate) {
            continue;
        }
        let deadline = op.inv + op.wait_ms * MS;
        let until = if stopped_waiter {
            deadline + op.ttl_ms * MS + op_timeout
        } else {
            op.ret.max(deadline) + op.ttl_ms * MS + op_timeout
        };
        // When it can have been granted at the earliest: an exclusive
        // waiter only once nobody else surely held the key, and never after
        // its max wait (nor, if cancelled, after its call ended).
        let from = if op.kind == Kind::Acquire
            && op.wait_ms > 0
            && kinds::kind_of(op) == LockKind::Exclusive
        {
            let by = op.ret.max(deadline) + GRANT_SLACK;
            match first_chance(leases, op, by) {
                Some(t) => t,
                None => continue,
            }
        } else {
            op.inv
        };
        holds
            .entry(&op.key)
            .or_default()
            .push((from, stopped(op.p, op.inv, until), (op.p, op.id)));
        kind_of.insert((op.p, op.id), kinds::kind_of(op));
    }
    // Outages the schedule did not make: a call of a running process that
    // the backend answered Unavailable found the server unreachable for the
    // op timeout before that answer (no longer: a waiting acquire's wait is
    // no sign of one), and the hand-off or expiry a wake-up waits for may
    // not have reached it either (etcd seed 1022, beside builds that took
    // both cores: every call of both processes failed for 500 ms before the
    // first fault, likely an election the load set off). A stopped
    // process's call says nothing of the server.
    let outages: Vec<(u64, u64)> = ops
        .iter()
        .filter(|o| o.outcome == Outcome::Unavailable && !own_stop(o))
        .map(|o| (o.ret.saturating_sub(op_timeout).max(o.inv), o.ret))
        .collect();
    // A stretch of at least the bound in `[from, to)` in which nobody but
    // `op` itself could hold its key and no server or network fault ran
    // (those may hold a wake-up back; a stopped client process only delays
    // its own calls).
    let free_stretch = |op: &Op, from: u64, to: u64| -> Option<(u64, u64)> {
        let mut free = vec![(from, to)];
        let others = holds
            .get(op.key.as_str())
            .into_iter()
            .flatten()
            .filter(|h| h.2 != (op.p, op.id));
        let kind = kinds::kind_of(op);
        if kind == LockKind::Exclusive {
            for &(a, b, _) in others {
                free = cut(free, a, b);
            }
        } else {
            let others: Vec<(Hold, LockKind)> = others
                .map(|&h| (h, kind_of.get(&h.2).copied().unwrap_or(LockKind::Exclusive)))
                .collect();
            let ahead: Vec<(u64, u64)> = writers
                .get(op.key.as_str())
                .into_iter()
                .flatten()
                .filter(|w| w.2 != (op.p, op.id))
                .map(|w| (w.0, w.1))
                .collect();
            for (a, b) in kinds::blocked(kind, &others, &ahead) {
                free = cut(free, a, b);
            }
        }
        for f in h.faults.iter().filter(|f| f.process.is_none()) {
            free = cut(free, f.at, f.until + op_timeout);
        }
        for &(a, b) in &outages {
            free = cut(free, a, b);
        }
        free.into_iter().find(|(a, b)| b - a >= bounds.wake_ns)
    };
    for op in ops
        .iter()
        .filter(|o| o.kind == Kind::Acquire && o.wait_ms > 0)
    {
        let deadline = op.inv + op.wait_ms * MS;
        let own_pause = own_stop(op);
        // How the wait ended, and until when it slept.
        let (ended, slept_until) = match &op.outcome {
            Outcome::Ok => {
                let late = op
                    .ret
                    .saturating_sub(deadline + op_timeout + bounds.late_ns);
                if late > 0 && !own_pause {
                    out.push(Violation {
                        kind: "late-grant",
                        detail: format!(
                            "{}: p{} #{} granted at {}, {}ms after its max wait of {}ms ran out",
                            op.key,
                            op.p,
                            op.id,
                            ms(op.ret, t0),
                            (op.ret - deadline) / MS,
                            op.wait_ms
                        ),
                    });
                }
                // Handed the lock past its max wait while its own process
                // stood still: not its own call's doing (a call it had
                // out when stopped lands within the slack), but a release
                // elsewhere that gave the lock to a waiter it should have
                // passed over. Judged by the grant the lease dates from,
                // against the wait counted from its latest queueing (the
                // server's deadline for the entry is no later).
                if let (Some(start), Some(&queued)) = (op.start, op.queued.last()) {
                    let due = queued + op.wait_ms * MS + GRANT_SLACK;
                    // (Well inside the stop: the signals take a moment
                    // to land, and the rig notes the stop's end only after
                    // its SIGCONT, a few ms late under load: a waiter's own
                    // last-moment grant just after it resumed fell there.)
                    let stopped_then = h.faults.iter().any(|f| {
                        f.process == Some(op.p)
                            && f.at + GRANT_SLACK <= start
                            && start + GRANT_SLACK <= f.until
                    });
                    if start > due && stopped_then {
                        out.push(Violation {
                            kind: "late-grant",
                            detail: format!(
                                "{}: p{} #{} was handed the lock at {} while its process \
                                 stood still, {}ms after its max wait of {}ms ran out",
                                op.key,
                                op.p,
                                op.id,
                                ms(start, t0),
                                (start - (queued + op.wait_ms * MS)) / MS,
                                op.wait_ms
                            ),
                        });
                    }
                }
                // Granted: it slept until the grant the lease dates from
                // (the hand-off, or the attempt that found the lock free).
                // A grant that came late, however it came (the waiter's own
                // re-check, its max wait, a newcomer's call that handed the
                // lock on), was a wake-up lost meanwhile.
                ("was granted at", op.start.unwrap_or(op.ret))
            }
            Outcome::Timeout => ("timed out at", op.ret),
            _ => continue,
        };
        if own_pause {
            continue;
        }
        // A wake-up can only be lost once the waiter is queued: a grant by
        // its first attempt (no queue entry) that came late was the call's
        // way to the server (a runtime starved under load, a connection
        // being made), not a sleep through a free lock.
        let from = match (&op.outcome, op.queued.first()) {
            (Outcome::Ok, None) => continue,
            (Outcome::Ok, Some(&queued)) => queued.max(op.inv),
            _ => op.inv,
        };
        let to = slept_until.min(deadline);
        if from >= to {
            continue;
        }
        if let Some((a, b)) = free_stretch(op, from, to) {
            out.push(Violation {
                kind: "lost-wake-up",
                detail: format!(
                    "{}: p{} #{} waited {}..{} and {ended} {}, but nobody could hold the key from \
                     {} to {}; last fault before: {}",
                    op.key,
                    op.p,
                    op.id,
                    ms(op.inv, t0),
                    ms(deadline, t0),
                    ms(slept_until, t0),
                    ms(a, t0),
                    ms(b, t0),
                    last_fault_before(&h.faults, a, t0)
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn grant(p: u32, id: u64, inv: u64, ret: u64, fence: u64, ttl: u64) -> Op {
        let mut o = op(p, id, Kind::Acquire, inv, ret, Outcome::Ok);
        o.fence = Some(fence);
        o.start = Some(inv * MS);
        o.lease_ms = ttl;
        o.ttl_ms = ttl;
        o
    }

    fn release(p: u32, id: u64, inv: u64, ret: u64, fence: u64) -> Op {
        let mut o = op(p, id, Kind::Release, inv, ret, Outcome::Ok);
        o.fence_in = Some(fence);
        o
    }

    /// A restart without data from `at` to `until` (ms): locks lost,
    /// fences start over.
    fn wiped(at: u64, until: u64) -> Fault {
        Fault {
            what: "restart without data".into(),
            at: at * MS,
            until: until * MS,
            process: None,
            loses_locks: true,
            lost_by: None,
            resets_fences: true,
            crash: false,
            quiet: false,
        }
    }

    fn history(ops: Vec<Op>) -> History {
        History {
            ops,
            op_timeout_ms: 100,
            ..History::default()
        }
    }

    fn kinds(h: &History) -> Vec<&'static str> {
        check(h, Bounds::default()).iter().map(|v| v.kind).collect()
    }

    #[test]
    fn a_clean_history_passes() {
        let h = history(vec![
            grant(1, 0, 0, 1, 1, 100),
            release(1, 1, 10, 11, 1),
            grant(2, 0, 5, 12, 2, 100),
            release(2, 1, 20, 21, 2),
        ]);
        assert!(kinds(&h).is_empty(), "{:?}", check(&h, Bounds::default()));
    }

    #[test]
    fn a_grant_shorter_than_its_ttl_is_reported_but_not_on_etcd() {
        let mut short = grant(1, 0, 0, 1, 1, 100);
        short.lease_ms = 90;
        let h = history(vec![short, grant(2, 0, 150, 151, 2, 100)]);
        assert_eq!(kinds(&h), ["short-lease"]);
        let etcd = Bounds {
            stopped_holder_ns: 1_000 * MS,
            ..Bounds::default()
        };
        assert!(check(&h, etcd).is_empty());
        // Rounding to whole ms is no cut.
        let mut rounded = grant(1, 0, 0, 1, 1, 100);
        rounded.lease_ms = 99;
        assert!(kinds(&history(vec![rounded])).is_empty());
    }

    #[test]
    fn overlapping_grants_are_two_holders() {
        let h = history(vec![grant(1, 0, 0, 1, 1, 100), grant(2, 0, 5, 6, 2, 100)]);
        assert_eq!(kinds(&h), ["two-holders"]);
    }

    #[test]
    fn a_grant_after_the_ttl_is_no_overlap() {
        let h = history(vec![
            grant(1, 0, 0, 1, 1, 100),
            grant(2, 0, 50, 101, 2, 100),
        ]);
        assert!(kinds(&h).is_empty());
    }

    #[test]
    fn a_force_release_ends_the_lease() {
        let mut force = op(3, 0, Kind::ForceRelease, 10, 11, Outcome::Ok);
        force.key = "k".into();
        let h = history(vec![
            grant(1, 0, 0, 1, 1, 100),
            force,
            grant(2, 0, 12, 13, 2, 100),
        ]);
        assert!(kinds(&h).is_empty());
    }

    #[test]
    fn falling_and_repeated_fences_are_caught() {
        let h = history(vec![
            grant(1, 0, 0, 1, 5, 10),
            release(1, 1, 2, 3, 5),
            grant(2, 0, 4, 5, 4, 10),
        ]);
        assert_eq!(kinds(&h), ["fence-order"]);
        let h = history(vec![
            grant(1, 0, 0, 1, 5, 10),
            release(1, 1, 2, 3, 5),
            grant(2, 0, 4, 5, 5, 10),
        ]);
        assert_eq!(kinds(&h), ["fence-order"]);
    }

    #[test]
    fn a_lower_fence_answered_after_a_whole_newer_hold_is_out_of_order() {
        // p1 asks first and draws fence 5, stalls; p2 asks, is granted 6,
        // holds and releases, all inside p1's call; then p1 is answered 5.
        let h = history(vec![
            grant(1, 0, 0, 300, 5, 400),
            grant(2, 0, 10, 20, 6, 400),
            release(2, 1, 50, 51, 6),
        ]);
        assert_eq!(kinds(&h), ["fence-order"]);
        // p1's lease, had it been granted at its call, would have run out
        // before p2's grant: p1 may have held and lost it before. Not a
        // violation by this rule (a late reply, judged by the others).
        let h = history(vec![
            grant(1, 0, 0, 300, 5, 15),
            grant(2, 0, 10, 20, 6, 400),
            release(2, 1, 50, 51, 6),
        ]);
        assert!(!kinds(&h).contains(&"fence-order"), "{:?}", kinds(&h));
    }

    #[test]
    fn an_extension_of_unknown_outcome_may_have_shortened_the_lease() {
        // Granted at 0-1 for 100 ms; an extension to 20 ms at 10 is
        // cancelled (its holder killed): had it landed, the lock ended at
        // 30, so a grant to another at 40 is no overlap. One answered with
        // nothing known of it, or one that lengthened, leaves the lease.
        let extend = |outcome: Outcome| {
            let mut e = op(1, 2, Kind::Extend, 10, 11, outcome);
            e.fence_in = Some(5);
            e.ttl_ms = 20;
            e
        };
        let next = || grant(2, 0, 39, 40, 6, 100);
        let h = history(vec![
            grant(1, 0, 0, 1, 5, 100),
            extend(Outcome::Cancelled),
            next(),
        ]);
        assert!(kinds(&h).is_empty(), "{:?}", kinds(&h));
        let h = history(vec![
            grant(1, 0, 0, 1, 5, 100),
            extend(Outcome::Unavailable),
            next(),
        ]);
        assert!(kinds(&h).is_empty(), "{:?}", kinds(&h));
        let h = history(vec![grant(1, 0, 0, 1, 5, 100), next()]);
        assert!(kinds(&h).contains(&"two-holders"), "{:?}", kinds(&h));
    }

    #[test]
    fn a_lease_refused_before_its_ttl_ran_out_was_cut_short() {
        let refused = |at: u64, outcome: Outcome| {
            let mut o = op(1, 1, Kind::Release, at, at + 1, outcome);
            o.fence_in = Some(5);
            o
        };
        // Granted at 0-1 for 100 ms; its release at 50 finds nothing.
        let h = history(vec![
            grant(1, 0, 0, 1, 5, 100),
            refused(50, Outcome::NotFound),
        ]);
        assert_eq!(kinds(&h), ["lease-cut-short"]);
        // After its TTL: expired, as the rules say.
        let h = history(vec![
            grant(1, 0, 0, 1, 5, 100),
            refused(120, Outcome::NotFound),
        ]);
        assert!(kinds(&h).is_empty(), "{:?}", kinds(&h));
        // An extension to 30 ms at 10 (answered): its TTL ends at 40.
        let mut extend = op(1, 2, Kind::Extend, 10, 11, Outcome::Ok);
        extend.fence_in = Some(5);
        extend.ttl_ms = 30;
        let mut late = refused(50, Outcome::NotFound);
        late.id = 3;
        let h = history(vec![grant(1, 0, 0, 1, 5, 100), extend, late]);
        assert!(kinds(&h).is_empty(), "{:?}", kinds(&h));
        // A force release of the key meanwhile, or a fault that loses
        // locks: lost by the rules.
        let force = op(2, 0, Kind::ForceRelease, 20, 21, Outcome::Ok);
        let h = history(vec![
            grant(1, 0, 0, 1, 5, 100),
            force,
            refused(50, Outcome::NotFound),
        ]);
        assert!(kinds(&h).is_empty(), "{:?}", kinds(&h));
        let mut h = history(vec![
            grant(1, 0, 0, 1, 5, 100),
            refused(50, Outcome::NotFound),
        ]);
        h.faults.push(wiped(20, 30));
        assert!(kinds(&h).is_empty(), "{:?}", kinds(&h));
        // A quiet stall does not excuse it.
        let mut stall = wiped(20, 30);
        (stall.loses_locks, stall.resets_fences, stall.quiet) = (false, false, true);
        let mut h = history(vec![
            grant(1, 0, 0, 1, 5, 100),
            refused(50, Outcome::NotFound),
        ]);
        h.faults.push(stall);
        assert_eq!(kinds(&h), ["lease-cut-short"]);
        // Where the holder's process keeps the TTLs (etcd): not judged.
        let h = history(vec![
            grant(1, 0, 0, 1, 5, 100),
            refused(50, Outcome::NotFound),
        ]);
        let etcd = Bounds {
            stopped_holder_ns: 1_000 * MS,
            ..Bounds::default()
        };
        assert!(check(&h, etcd).is_empty());
    }

    #[test]
    fn a_waiter_that_slept_through_a_free_lock_is_a_lost_wake_up() {
        let mut waiter = op(2, 0, Kind::Acquire, 2, 1_002, Outcome::Timeout);
        waiter.wait_ms = 1_000;
        waiter.ttl_ms = 100;
        let h = history(vec![
            grant(1, 0, 0, 1, 1, 5_000),
            release(1, 1, 10, 11, 1),
            waiter,
        ]);
        assert_eq!(kinds(&h), ["lost-wake-up"]);
    }

    /// A holder until its release at 10..11 ms, and a waiter (asked at 2 ms,
    /// max wait 1 s) granted at `granted` ms (the hand-off its lease dates
    /// from), told 2 ms later.
    fn granted_waiter(granted: u64) -> History {
        let mut waiter = grant(2, 0, 2, granted + 2, 2, 300);
        waiter.wait_ms = 1_000;
        waiter.start = Some(granted * MS);
        waiter.queued = vec![3 * MS];
        history(vec![
            grant(1, 0, 0, 1, 1, 5_000),
            release(1, 1, 10, 11, 1),
            waiter,
        ])
    }

    #[test]
    fn a_waiter_granted_long_after_the_lock_came_free_is_a_lost_wake_up() {
        // redis-release-without-hand-off: the release freed the lock and
        // told nobody; the waiter found it free only at its re-check, 500
        // ms later. Its own grant does not count as a holder before it.
        assert_eq!(kinds(&granted_waiter(511)), ["lost-wake-up"]);
        // Handed the lock at the release: woken in time.
        assert!(kinds(&granted_waiter(11)).is_empty());
        // Within the bound (250 ms).
        assert!(kinds(&granted_waiter(200)).is_empty());
        // Never queued (CI, Redis Cluster seed 1 with a build beside it):
        // its first attempt found the lock free and took it 511 ms after
        // the call was made. The way to the server, not a wake-up.
        let mut h = granted_waiter(511);
        h.ops[2].queued.clear();
        assert!(kinds(&h).is_empty());
    }

    #[test]
    fn a_wake_up_held_back_while_the_server_answered_nobody_is_not_lost() {
        // etcd, seed 1022 (builds beside it): every call of both processes
        // answered Unavailable for 500 ms before the first fault, an outage
        // the schedule did not make; the waiter was handed the lock only
        // after it. Here another process's calls each give up after the op
        // timeout (100 ms) from 20 to 480 ms: the free stretches left
        // (11..20, 480..511 ms) are shorter than the bound.
        let mut h = granted_waiter(511);
        for (i, at) in [20, 110, 200, 290, 380].into_iter().enumerate() {
            let mut other = op(
                3,
                i as u64,
                Kind::Extend,
                at,
                at + 100,
                Outcome::Unavailable,
            );
            other.key = "other".into();
            h.ops.push(other);
        }
        assert!(kinds(&h).is_empty(), "{:?}", check(&h, Bounds::default()));
        // A call that failed because its own process stood still says
        // nothing of the server.
        h.faults.push(stop(3, 15, 490));
        assert_eq!(kinds(&h), ["lost-wake-up"]);
        h.faults.clear();
        // Nor does a waiting acquire's wait: only the op timeout before its
        // answer (Redis, a nudge breakage's find at seed 1023, hidden while
        // a waiter's 700 ms wait counted whole).
        h.ops.truncate(3);
        let mut waiter = op(3, 0, Kind::Acquire, 20, 480, Outcome::Unavailable);
        waiter.key = "other".into();
        waiter.wait_ms = 360;
        h.ops.push(waiter);
        assert_eq!(kinds(&h), ["lost-wake-up"]);
    }

    #[test]
    fn a_waiter_handed_the_lock_past_its_max_wait_while_stopped_is_a_late_grant() {
        // etcd-hand-off-to-a-waiter-past-its-deadline: p2's waiter (queued
        // at 3 ms, max wait 1 s) stood still from 500 ms to 1.8 s; the
        // holder's release at 1.5 s handed it the lock anyway. It answered
        // late through its own stop (excused), but the grant was not its
        // doing.
        let mut h = granted_waiter(1_500);
        h.ops[1] = release(1, 1, 1_499, 1_500, 1);
        h.ops[2].ret = 1_802 * MS;
        h.faults.push(stop(2, 500, 1_800));
        assert_eq!(kinds(&h), ["late-grant"]);
        // Handed it within its max wait: fine, however late it answered.
        let mut h = granted_waiter(900);
        h.ops[1] = release(1, 1, 899, 900, 1);
        h.ops[2].ret = 1_802 * MS;
        h.faults.push(stop(2, 500, 1_800));
        assert!(kinds(&h).is_empty(), "{:?}", check(&h, Bounds::default()));
        // Past it, a few ms before the stop's end as the rig noted it (Redis
        // seed 4017, Redis Cluster seeds 4009 and 4022): the process had
        // resumed, and the waiter took the lock itself as it gave up.
        let mut h = granted_waiter(1_790);
        h.ops[1] = release(1, 1, 999, 1_000, 1);
        h.ops[2].ret = 1_802 * MS;
        h.faults.push(stop(2, 500, 1_800));
        assert!(kinds(&h).is_empty(), "{:?}", check(&h, Bounds::default()));
        // Past it, but while its process ran: its own late call, judged by
        // when it answered (within a call in flight: fine).
        let mut h = granted_waiter(1_010);
        h.ops[1] = release(1, 1, 999, 1_000, 1);
        h.ops[2].ret = 1_012 * MS;
        assert!(kinds(&h).is_empty(), "{:?}", check(&h, Bounds::default()));
    }

    fn etcd_bounds() -> Bounds {
        Bounds {
            stopped_holder_ns: 3_500 * MS,
            ..Bounds::default()
        }
    }

    fn stop(p: u32, at: u64, until: u64) -> Fault {
        Fault {
            what: format!("sigstop p{p}"),
            at: at * MS,
            until: until * MS,
            process: Some(p),
            loses_locks: false,
            lost_by: None,
            resets_fences: false,
            crash: false,
            quiet: false,
        }
    }

    /// p1 holds (TTL 100 ms, never released); p2 waits 3 s for it.
    fn held_by_a_process_that_went(waiter: Outcome, ret: u64) -> History {
        let mut w = op(2, 0, Kind::Acquire, 10, ret, waiter);
        w.wait_ms = 3_000;
        w.ttl_ms = 100;
        w.queued = vec![12 * MS];
        if w.outcome == Outcome::Ok {
            w.fence = Some(2);
            w.start = Some((ret - 1) * MS);
            w.lease_ms = 100;
        }
        history(vec![grant(1, 0, 0, 1, 1, 100), w])
    }

    #[test]
    fn a_holder_stopped_twice_in_a_row_keeps_its_lock_through_both() {
        // etcd, seed 1031 (a release build beside it): p2 was stopped at
        // 499 ms for 1,066 ms and again at once for 813 ms. etcd's TTLs run
        // in the holder's process: it held its lock through both stops,
        // and the waiter got it when p2 ran again.
        let mut h = held_by_a_process_that_went(Outcome::Ok, 2_050);
        h.faults = vec![stop(1, 50, 1_000), stop(1, 1_000, 2_000)];
        let found: Vec<_> = check(&h, etcd_bounds()).iter().map(|v| v.kind).collect();
        assert!(found.is_empty(), "{found:?}");
        // One stop alone keeps it until its process runs again (and its
        // expiry lands), not through a later stop that does not touch it.
        h.faults = vec![stop(1, 50, 1_000), stop(1, 1_500, 2_000)];
        let found: Vec<_> = check(&h, etcd_bounds()).iter().map(|v| v.kind).collect();
        assert_eq!(found, ["lost-wake-up"]);
    }

    #[test]
    fn a_process_gone_holding_keeps_its_lock_until_its_lease_runs_out_on_etcd() {
        // etcd, seed 1031: p1 ended its run holding a lock it never let go
        // (its task cut off); etcd kept it until p1's lease ran out, and a
        // waiter timed out. Killed (SIGKILL) or exited, the same.
        let mut h = held_by_a_process_that_went(Outcome::Timeout, 3_010);
        h.exits = vec![(1, 50 * MS)];
        let found: Vec<_> = check(&h, etcd_bounds()).iter().map(|v| v.kind).collect();
        assert!(found.is_empty(), "{found:?}");
        h.exits.clear();
        h.faults = vec![Fault {
            crash: true,
            quiet: false,
            ..stop(1, 50, 50)
        }];
        let found: Vec<_> = check(&h, etcd_bounds()).iter().map(|v| v.kind).collect();
        assert!(found.is_empty(), "{found:?}");
        // Where the server keeps every TTL itself (Redis, PostgreSQL), the
        // lock runs out at its TTL whoever went: the waiter slept through.
        assert_eq!(kinds(&h), ["lost-wake-up"]);
        // And on etcd, until the lease runs out, no longer.
        let mut h = held_by_a_process_that_went(Outcome::Timeout, 3_010);
        h.ops[1].wait_ms = 5_000;
        h.ops[1].ret = 5_010 * MS;
        h.exits = vec![(1, 50 * MS)];
        let found: Vec<_> = check(&h, etcd_bounds()).iter().map(|v| v.kind).collect();
        assert_eq!(found, ["lost-wake-up"]);
    }

    #[test]
    fn a_waiter_that_timed_out_in_a_stopped_process_may_have_held_the_lock() {
        // Redis Cluster, seeds 1017 and 1033 (two long runs and a build on
        // the machine): p2's waiter was handed the lock while p2 was
        // stopped, before its max wait ran out; the grant ran out by its TTL
        // before p2 ran again, and p2 answered Timeout. Meanwhile p3, queued
        // behind it, waited for a lock that looked free.
        let mut gone = op(2, 0, Kind::Acquire, 10, 701, Outcome::Timeout);
        gone.wait_ms = 200;
        gone.ttl_ms = 300;
        gone.queued = vec![12 * MS];
        let mut behind = op(3, 0, Kind::Acquire, 30, 631, Outcome::Timeout);
        behind.wait_ms = 600;
        behind.queued = vec![32 * MS];
        let mut h = history(vec![
            grant(1, 0, 0, 1, 1, 100),
            release(1, 1, 50, 51, 1),
            gone,
            behind,
        ]);
        h.faults = vec![stop(2, 20, 700)];
        assert!(kinds(&h).is_empty(), "{:?}", check(&h, Bounds::default()));
        // Not stopped, its Timeout says it never held: p3 slept through.
        h.faults.clear();
        assert_eq!(kinds(&h), ["lost-wake-up"]);
    }

    /// p1 holds from 0 until its release at `released` (ms); p2, killed at
    /// 100 ms while it waited (max wait 200 ms), leaves its queue entry;
    /// p3, queued behind it, is granted at 1,400 ms.
    fn behind_a_dead_waiter(released: u64) -> History {
        let mut dead = op(2, 0, Kind::Acquire, 10, 100, Outcome::Cancelled);
        dead.wait_ms = 200;
        dead.ttl_ms = 300;
        let mut live = op(3, 0, Kind::Acquire, 20, 1_401, Outcome::Ok);
        live.wait_ms = 2_000;
        live.ttl_ms = 100;
        live.fence = Some(3);
        live.start = Some(1_400 * MS);
        live.lease_ms = 100;
        live.queued = vec![22 * MS];
        let mut h = history(vec![
            grant(1, 0, 0, 1, 1, 5_000),
            release(1, 1, released, released + 1, 1),
            dead,
            live,
        ]);
        h.faults = vec![Fault {
            crash: true,
            quiet: false,
            ..stop(2, 100, 100)
        }];
        h
    }

    #[test]
    fn a_dead_waiter_can_have_been_granted_only_within_its_max_wait() {
        // etcd-hand-off-to-a-waiter-past-its-deadline, with a client killed:
        // the key was surely p1's until 500 ms, after the dead waiter's max
        // wait (210 ms) ran out, so it cannot have been handed the lock; p3
        // slept through a free lock while etcd kept the dead waiter's
        // entry, and its lease, for seconds.
        let found: Vec<_> = check(&behind_a_dead_waiter(500), etcd_bounds())
            .iter()
            .map(|v| v.kind)
            .collect();
        assert_eq!(found, ["lost-wake-up"]);
        // Released within its max wait: it may hold (its lease keeps it).
        let found: Vec<_> = check(&behind_a_dead_waiter(150), etcd_bounds())
            .iter()
            .map(|v| v.kind)
            .collect();
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn a_holder_stopped_while_its_expiry_may_be_on_its_way_keeps_its_lock() {
        // etcd, seed 3637 (a CI run beside it): p1's lock (TTL 464 ms, from
        // its reply at 984 ms) was due to expire at 1,448 ms; p1 was stopped
        // at 1,453 ms, before its expiry landed, for 1,164 ms, and a waiter
        // of p2 timed out meanwhile. Here: TTL 100 ms from 1 ms, the stop
        // from 150 ms (the op timeout is 100 ms) to 2,000 ms.
        let mut h = held_by_a_process_that_went(Outcome::Timeout, 1_500);
        h.ops[1].wait_ms = 1_480;
        h.faults = vec![stop(1, 150, 2_000)];
        let found: Vec<_> = check(&h, etcd_bounds()).iter().map(|v| v.kind).collect();
        assert!(found.is_empty(), "{found:?}");
        // A stop after the expiry has surely landed keeps nothing.
        h.faults = vec![stop(1, 250, 2_000)];
        let found: Vec<_> = check(&h, etcd_bounds()).iter().map(|v| v.kind).collect();
        assert_eq!(found, ["lost-wake-up"]);
    }

    #[test]
    fn an_etcd_holder_cut_off_by_a_server_fault_then_stopped_keeps_its_lock() {
        // etcd, seed 1004: p1's lock ran out by its TTL while the leader was
        // down, so p1's own expiry could not land; then p1 was stopped, and
        // the lock stayed until p1 ran again.
        let mut waiter = op(2, 0, Kind::Acquire, 10, 1_351, Outcome::Ok);
        waiter.wait_ms = 2_000;
        waiter.ttl_ms = 100;
        waiter.fence = Some(2);
        waiter.start = Some(1_350 * MS);
        waiter.lease_ms = 100;
        waiter.queued = vec![12 * MS];
        let mut h = history(vec![grant(1, 0, 0, 1, 1, 100), waiter]);
        h.faults = vec![
            Fault {
                process: None,
                ..stop(0, 50, 300)
            },
            stop(1, 300, 1_300),
        ];
        let found: Vec<_> = check(&h, etcd_bounds()).iter().map(|v| v.kind).collect();
        assert!(found.is_empty(), "{found:?}");
        // Where the server keeps TTLs (Redis, PostgreSQL), it ran out.
        assert_eq!(kinds(&h), ["lost-wake-up"]);
    }

    #[test]
    fn one_process_granted_one_fence_twice_is_told_apart_by_owner() {
        // Redis seed 1053: fences start over after a restart without data,
        // and p2 was granted fence 15 on one key twice. The first
        // acquisition's late release (answered "not yours") was taken for
        // the second's, which the checker then ended there: its write under
        // a lease its renewals kept was reported as made after its lease.
        let owned = |mut o: Op, owner: &str| {
            o.owner = Some(owner.into());
            o
        };
        let mut late = owned(release(2, 2, 1_100, 1_101, 15), "a");
        late.outcome = Outcome::Mismatch;
        let mut renewal = owned(op(2, 3, Kind::Extend, 1_200, 1_201, Outcome::Ok), "b");
        (renewal.fence_in, renewal.fence, renewal.ttl_ms) = (Some(15), Some(15), 500);
        let mut write = owned(op(2, 4, Kind::Write, 1_300, 1_301, Outcome::Ok), "b");
        (write.fence_in, write.checked) = (Some(15), Some(1_300 * MS));
        let ops = vec![
            owned(grant(2, 0, 0, 1, 15, 500), "a"),
            owned(grant(2, 1, 1_000, 1_001, 15, 500), "b"),
            late,
            renewal,
            write,
        ];
        let restart = wiped(600, 650);
        let with_faults = |ops: Vec<Op>| History {
            faults: vec![restart.clone()],
            ..history(ops)
        };
        let h = with_faults(ops.clone());
        assert!(kinds(&h).is_empty(), "{:?}", check(&h, Bounds::default()));
        // Without the owners, the late release ends the second lease.
        let anonymous = ops.into_iter().map(|mut o| {
            o.owner = None;
            o
        });
        let h = with_faults(anonymous.collect());
        assert!(kinds(&h).contains(&"held-after-lease"));
    }

    #[test]
    fn a_release_from_before_a_restart_without_data_may_end_a_new_lease_of_its_fence() {
        // Redis seed 1009 (the relay workload's runs): p2 held fence 10 under
        // a custom owner several clients use; Redis restarted without its
        // data; p1 was granted fence 10 again under that owner; p2's late
        // release of its own fence 10 answered Ok, and freed p1's lock (the
        // server knows owner and fence, and both matched): p2 then got fence
        // 11 while p1 still believed its lease. The README's limit of a
        // restart without data, not two holders.
        let owned = |mut o: Op| {
            o.owner = Some("job-k".into());
            o
        };
        let other = |new: bool| {
            if new {
                vec![
                    owned(grant(2, 1, 0, 1, 10, 5_000)),
                    owned(grant(1, 1, 700, 701, 10, 500)),
                    owned(release(2, 2, 720, 721, 10)),
                    grant(2, 3, 722, 723, 11, 500),
                ]
            } else {
                // The same calls without the restart between: p2's release
                // of fence 10 is then p1's lock released by another holder.
                vec![
                    owned(grant(2, 1, 0, 1, 10, 5_000)),
                    owned(grant(1, 1, 700, 701, 10, 500)),
                ]
            }
        };
        // p1 cannot see it happen: its write, checked held after it, is
        // no violation either (Redis seed 1006).
        let mut write = owned(op(1, 2, Kind::Write, 730, 731, Outcome::Ok));
        (write.fence_in, write.checked) = (Some(10), Some(730 * MS));
        let mut ops = other(true);
        ops.push(write);
        let h = History {
            faults: vec![wiped(600, 650)],
            ..history(ops)
        };
        assert!(kinds(&h).is_empty(), "{:?}", check(&h, Bounds::default()));
        // Without the restart the same fence twice is a violation in itself.
        assert!(!kinds(&history(other(false))).is_empty());
    }

    #[test]
    fn a_release_by_another_owner_that_succeeds_is_caught() {
        let owned = |mut o: Op, owner: &str| {
            o.owner = Some(owner.into());
            o
        };
        let ops = |outcome: Outcome| {
            let mut meddle = owned(release(2, 1, 10, 11, 1), "meddler");
            meddle.outcome = outcome;
            vec![owned(grant(1, 0, 0, 1, 1, 100), "a"), meddle]
        };
        assert_eq!(
            kinds(&history(ops(Outcome::Ok))),
            ["foreign-call-succeeded"]
        );
        assert!(kinds(&history(ops(Outcome::Mismatch))).is_empty());
        // Its own owner may release it (from another process too).
        let mut own = ops(Outcome::Ok);
        own[1].owner = Some("a".into());
        assert!(kinds(&history(own)).is_empty());
    }

    #[test]
    fn a_stale_release_that_overtakes_the_holders_own_is_the_reused_fence() {
        // Redis seed 1006 (2026-11-29, night): after a restart without data
        // p1 was granted fence 12 under a custom owner p2 had held fence 12
        // under before it; p1's release went out first but answered "not
        // yours": p2's late release of its old fence 12, sent 0.3 ms later,
        // reached the server first and freed p1's lock. Rule 12 must read
        // p1's refused release as that limit, not a lease cut short.
        let owned = |mut o: Op| {
            o.owner = Some("job-k".into());
            o
        };
        let mut refused = owned(release(1, 2, 720, 724, 12));
        refused.outcome = Outcome::Mismatch;
        let ops = vec![
            owned(grant(2, 1, 0, 1, 12, 5_000)),
            owned(grant(1, 1, 700, 701, 12, 500)),
            refused,
            owned(release(2, 2, 721, 723, 12)),
        ];
        let h = History {
            faults: vec![wiped(600, 650)],
            ..history(ops.clone())
        };
        assert!(kinds(&h).is_empty(), "{:?}", check(&h, Bounds::default()));
        // The stale release sent after the holder's own was answered: the
        // refusal is p1's lease cut short.
        let mut late = ops;
        late[3] = owned(release(2, 2, 725, 726, 12));
        let h = History {
            faults: vec![wiped(600, 650)],
            ..history(late)
        };
        assert_eq!(kinds(&h), ["lease-cut-short"]);
    }

    #[test]
    fn an_extend_answered_with_another_fence_is_a_violation() {
        // An extend by owner alone, recorded as naming the caller's own
        // fence 1, answered with fence 2: another acquisition's lock.
        let mut extend = op(1, 2, Kind::Extend, 20, 21, Outcome::Ok);
        extend.fence_in = Some(1);
        extend.fence = Some(2);
        extend.ttl_ms = 100;
        let h = history(vec![
            grant(1, 0, 0, 1, 1, 10),
            grant(2, 0, 12, 13, 2, 100),
            extend,
        ]);
        assert!(
            kinds(&h).contains(&"foreign-extend"),
            "{:?}",
            check(&h, Bounds::default())
        );
    }

    #[test]
    fn a_release_ends_the_lease_whatever_a_renewal_beside_it_did() {
        // The watchdog's renewal was invoked after the release and answered
        // Ok (the server ran it first): the holder still stopped at its
        // release.
        let mut renewal = op(1, 2, Kind::Extend, 11, 12, Outcome::Ok);
        renewal.fence_in = Some(1);
        renewal.ttl_ms = 1_000;
        let h = history(vec![
            grant(1, 0, 0, 1, 1, 100),
            release(1, 1, 10, 13, 1),
            renewal,
            grant(2, 0, 14, 15, 2, 100),
        ]);
        assert!(kinds(&h).is_empty(), "{:?}", check(&h, Bounds::default()));
    }

    #[test]
    fn a_release_still_on_its_way_when_the_process_ended_ends_the_lease() {
        // Seed 5061 on Redis: p2's dropped lock was released in the
        // background as its process ended; the history now has that release
        // (cancelled: its answer never came), so p1's grant right after it
        // is no second holder and p1's release no stale call.
        let mut gone = release(2, 1, 8, 9, 5);
        gone.outcome = Outcome::Cancelled;
        let h = history(vec![
            grant(2, 0, 0, 1, 5, 330),
            gone,
            grant(1, 0, 5, 100, 6, 330),
            release(1, 1, 110, 111, 6),
        ]);
        assert!(kinds(&h).is_empty(), "{:?}", check(&h, Bounds::default()));
        // Without it, the lease runs to its TTL: both violations.
        let h = history(vec![
            grant(2, 0, 0, 1, 5, 330),
            grant(1, 0, 5, 100, 6, 330),
            release(1, 1, 110, 111, 6),
        ]);
        assert_eq!(kinds(&h), ["two-holders", "stale-call-succeeded"]);
    }

    #[test]
    fn a_stale_release_that_succeeds_is_caught() {
        let mut force = op(3, 0, Kind::ForceRelease, 10, 11, Outcome::Ok);
        force.key = "k".into();
        let h = history(vec![
            grant(1, 0, 0, 1, 1, 1_000),
            force,
            grant(2, 0, 12, 13, 2, 1_000),
            release(1, 1, 20, 21, 1),
        ]);
        assert_eq!(kinds(&h), ["stale-call-succeeded"]);
    }

    #[test]
    fn a_newcomer_served_before_a_queued_waiter_is_barging() {
        let mut waiter = op(2, 0, Kind::Acquire, 2, 2_000, Outcome::Timeout);
        waiter.wait_ms = 2_000;
        waiter.ttl_ms = 100;
        waiter.queued = vec![3 * MS];
        let h = history(vec![
            grant(1, 0, 0, 1, 1, 300),
            waiter,
            release(1, 1, 280, 281, 1),
            grant(3, 0, 500, 501, 2, 100),
            release(3, 1, 520, 521, 2),
        ]);
        let found = kinds(&h);
        assert!(found.contains(&"barging"), "{found:?}");
    }

    /// A waiter that asks at 2 ms, a holder until 280 ms, a newcomer at
    /// 500 ms served at once.
    fn overtaken(queued: Vec<u64>) -> History {
        let mut waiter = op(2, 0, Kind::Acquire, 2, 2_000, Outcome::Timeout);
        waiter.wait_ms = 2_000;
        waiter.ttl_ms = 100;
        waiter.queued = queued.into_iter().map(|t| t * MS).collect();
        history(vec![
            grant(1, 0, 0, 1, 1, 300),
            waiter,
            release(1, 1, 280, 281, 1),
            grant(3, 0, 500, 501, 2, 100),
            release(3, 1, 520, 521, 2),
        ])
    }

    #[test]
    fn a_waiter_is_first_from_when_its_queue_entry_was_written() {
        // Seeds 5048, 5049, 5053, 5065 on Redis: the waiter asked long
        // before the newcomer, but its entry was written after the
        // newcomer's call (its request held back, or queued on a later
        // attempt): the newcomer came first.
        assert!(!kinds(&overtaken(vec![600])).contains(&"barging"));
        // A waiter the backend never said had queued claims no place.
        assert!(!kinds(&overtaken(vec![])).contains(&"barging"));
        // Queued before the newcomer asked: overtaken.
        assert!(kinds(&overtaken(vec![300])).contains(&"barging"));
    }

    #[test]
    fn a_waiter_that_queued_again_lost_its_first_place() {
        // Its first entry went at a time the history cannot tell (its TTL
        // of 100 ms fits between the entries: a hand-off it did not see
        // could have run out), so it comes from its last entry: after the
        // newcomer's call, no overtaking.
        assert!(!kinds(&overtaken(vec![3, 700])).contains(&"barging"));
        assert!(kinds(&overtaken(vec![3, 400])).contains(&"barging"));
    }

    /// `overtaken` with a waiter whose TTL (1 s) does not fit between its
    /// entries at 3 and 600 ms, and `extra` calls.
    fn overtaken_again(extra: Vec<Op>) -> History {
        let mut h = overtaken(vec![3, 600]);
        h.ops.iter_mut().find(|o| o.p == 2).unwrap().ttl_ms = 1_000;
        h.ops.extend(extra);
        h
    }

    #[test]
    fn a_waiter_queued_again_for_no_cause_keeps_its_first_place() {
        // memory-release-without-hand-off: the release dropped the queue,
        // the newcomer took the lock, the waiter queued again behind it.
        // Nothing a backend loses a live waiter's entry for (a fault, a
        // force release, a hand-off running out unseen) came between its
        // entries: it was first from 3 ms, and was overtaken.
        assert!(kinds(&overtaken_again(vec![])).contains(&"barging"));
        // A force release may take back a hand-off it had not seen yet.
        let mut force = op(3, 2, Kind::ForceRelease, 290, 291, Outcome::Ok);
        force.key = "k".into();
        assert!(!kinds(&overtaken_again(vec![force])).contains(&"barging"));
    }

    #[test]
    fn a_force_release_after_a_waiters_entry_may_have_taken_back_its_hand_off() {
        // The waiter (entry at 3 ms) was handed the lock by the release at
        // 280 ms and had not seen it when a force release took it back;
        // the newcomer at 500 ms found the lock free. Its entry gone with
        // the hand-off, the waiter holds no place: no overtaking.
        let mut force = op(3, 2, Kind::ForceRelease, 290, 291, Outcome::Ok);
        force.key = "k".into();
        let mut h = overtaken(vec![3]);
        h.ops.push(force.clone());
        assert!(!kinds(&h).contains(&"barging"));
        // A force release that began only after the newcomer's grant says
        // nothing of the place the waiter had before it.
        force.inv = 600 * MS;
        force.ret = 601 * MS;
        let mut h = overtaken(vec![3]);
        h.ops.push(force);
        assert!(kinds(&h).contains(&"barging"));
    }

    #[test]
    fn a_waiter_queued_again_after_a_fault_lost_its_first_place() {
        // A fault stopping the waiter's process between its entries (long
        // over by the newcomer's call): its entry may have gone with it.
        let mut h = overtaken_again(vec![]);
        h.faults.push(stop(2, 50, 60));
        assert!(!kinds(&h).contains(&"barging"));
        // The same fault in another process says nothing of the waiter.
        h.faults[0].process = Some(4);
        assert!(kinds(&h).contains(&"barging"));
    }

    #[test]
    fn a_handle_told_its_lock_is_gone_must_stop_believing_it() {
        let mut force = op(3, 0, Kind::ForceRelease, 10, 11, Outcome::Ok);
        force.key = "k".into();
        let mut renewal = op(1, 1, Kind::Extend, 30, 31, Outcome::NotFound);
        renewal.fence_in = Some(1);
        let mut read = op(1, 2, Kind::Read, 200, 201, Outcome::Ok);
        read.fence_in = Some(1);
        read.checked = Some(200 * MS);
        let h = history(vec![grant(1, 0, 0, 1, 1, 1_000), force, renewal, read]);
        assert_eq!(kinds(&h), ["held-after-lease"]);
    }

    #[test]
    fn a_store_that_lost_an_update_is_caught() {
        let mut h = history(vec![]);
        h.store = vec![("k".into(), 3, 4)];
        assert_eq!(kinds(&h), ["lost-update"]);
    }

    #[test]
    fn a_write_under_a_fence_from_before_fences_started_over_may_lose_an_update() {
        // Seed 1008 on Redis: p2 read under fence 2 and stalled; Redis
        // restarted without its data and granted fence 2 again to p1, which
        // read and wrote; p2's write under its old fence 2 was accepted too
        // (not lower than the key's): one update lost, as documented.
        let call = |kind: Kind, p: u32, id: u64, at: u64, fence: u64| {
            let mut o = op(p, id, kind, at, at + 1, Outcome::Ok);
            o.fence_in = Some(fence);
            o
        };
        let reset = wiped(400, 450);
        let mut h = history(vec![
            grant(2, 0, 0, 1, 2, 300),
            call(Kind::Read, 2, 2, 100, 2),
            grant(1, 0, 500, 501, 2, 300),
            call(Kind::Read, 1, 2, 505, 2),
            call(Kind::Write, 1, 1, 510, 2),
            call(Kind::Write, 2, 1, 600, 2),
        ]);
        h.store = vec![("k".into(), 1, 2)];
        h.faults.push(reset);
        assert!(kinds(&h).is_empty(), "{:?}", check(&h, Bounds::default()));
        // The same writes with no restart between: a lost update.
        h.faults.clear();
        assert!(kinds(&h).contains(&"lost-update"));
    }

    #[test]
    fn a_stale_write_is_judged_by_its_own_acquisition_not_a_later_one_under_its_fence() {
        // Seed 1081 on Redis: as above, but both grants of fence 12 went to
        // one process (p1), and the stale write was taken for one under the
        // later grant (made after the restart), so its lost update was not
        // excused. The owner token tells the two apart.
        let owned = |mut o: Op, owner: &str| {
            o.owner = Some(owner.into());
            o
        };
        let call = |kind: Kind, id: u64, at: u64, owner: &str| {
            let mut o = owned(op(1, id, kind, at, at + 1, Outcome::Ok), owner);
            o.fence_in = Some(12);
            o
        };
        let write = |id: u64, at: u64, owner: &str| call(Kind::Write, id, at, owner);
        let mut h = history(vec![
            owned(grant(1, 0, 0, 1, 12, 300), "old"),
            call(Kind::Read, 4, 100, "old"),
            owned(grant(1, 1, 500, 501, 12, 300), "new"),
            call(Kind::Read, 5, 505, "new"),
            write(2, 510, "new"),
            write(3, 600, "old"),
        ]);
        h.store = vec![("k".into(), 1, 2)];
        h.faults.push(wiped(400, 450));
        assert!(
            !kinds(&h).contains(&"lost-update"),
            "{:?}",
            check(&h, Bounds::default())
        );
        // Without owners the stale write may be either grant's: excused
        // (seed 5707 on Redis: a job's owner token is the same for every
        // run of its key, so both grants had it; the stale write was the
        // older grant's, stalled past the restart, and was taken for the
        // later one's).
        for o in &mut h.ops {
            o.owner = None;
        }
        assert!(
            !kinds(&h).contains(&"lost-update"),
            "{:?}",
            check(&h, Bounds::default())
        );
        for o in &mut h.ops {
            o.owner = Some("job-k".into());
        }
        assert!(
            !kinds(&h).contains(&"lost-update"),
            "{:?}",
            check(&h, Bounds::default())
        );
        // One stale write excuses one lost update, not a second one (a
        // later holder's read-modify-write began after the restart).
        h.ops.push(call(Kind::Read, 6, 650, "job-k"));
        h.ops.push(write(7, 700, "job-k"));
        h.store = vec![("k".into(), 1, 3)];
        assert!(kinds(&h).contains(&"lost-update"));
        h.store = vec![("k".into(), 2, 3)];
        assert!(
            !kinds(&h).contains(&"lost-update"),
            "{:?}",
            check(&h, Bounds::default())
        );
        // With no restart between the two grants: a lost update.
        h.faults.clear();
        h.store = vec![("k".into(), 1, 2)];
        h.ops.truncate(h.ops.len() - 2);
        assert!(kinds(&h).contains(&"lost-update"));
    }
}
