#!/usr/bin/env python3
"""Prove the fault-schedule checker on broken code: apply each breakage of
scripts/mutants.py that concerns mutual exclusion, fencing or waking, run the
checker's long run on the backend it breaks until a schedule reports a
violation (or CHAOS_SCHEDULES schedules pass), restore the source, and
report which schedule found it and after how long.

    scripts/check.sh --mutants                  # every mutant below
    scripts/check.sh --mutants fence claim      # names containing a word
    CHAOS_SCHEDULES=100 scripts/check.sh --mutants

Each schedule runs 8 s here (CHAOS_RUN_MS overrides), against the long
run's 2.5 s: more rounds of the relay workload per schedule.

A checker that finds nothing on broken code proves nothing: a mutant that
is MISSED here is a hole in the checker (or a mechanism it cannot see, said
in the table).
"""

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mutants import MUTANTS, ROOT  # noqa: E402

# (mutant or mutants applied together, backend to run it on). What each
# breaks is in its name. The layer's two guards against running a handler on
# a lock that ran out (waits bounded by the locks already held, and the check
# before the handler) each cover for the other: applied alone, neither shows
# outside the behavioural tests that pin each; they are broken together here.
CHECKED = [
    ("memory-expired-lock-free-for-newcomer", "memory"),
    ("memory-release-ignores-owner", "memory"),
    ("memory-release-ignores-fence", "memory"),
    ("memory-extend-ignores-fence", "memory"),
    ("memory-retry-by-owner-only", "memory"),
    ("memory-claim-keeps-the-fence", "memory"),
    ("memory-hand-off-keeps-old-fence", "memory"),
    ("memory-release-without-hand-off", "memory"),
    ("restore-reads-instead-of-claiming", "memory"),
    ("renewals-name-the-owner-only", "memory"),
    ("watchdog-ignores-lost-renewal", "memory"),
    (("layer-waits-outlast-held-locks", "layer-no-check-before-handler"), "memory"),
    ("redis-acquire-fast-path-ignores-queue", "redis"),
    ("redis-release-ignores-owner", "redis"),
    ("redis-release-ignores-fence", "redis"),
    ("redis-extend-ignores-owner", "redis"),
    ("redis-extend-ignores-fence", "redis"),
    ("redis-retry-by-owner-only", "redis"),
    ("redis-claim-keeps-the-fence", "redis"),
    ("redis-fence-not-incremented-on-hand-off", "redis"),
    ("redis-release-without-hand-off", "redis"),
    ("redis-hand-off-to-dead-waiters", "redis"),
    ("redis-first-waiter-queues-after-subscribing", "redis"),
    ("postgres-take-over-ignores-queue", "postgres"),
    ("postgres-fence-drawn-before-the-insert", "postgres"),
    ("postgres-retry-refreshed-from-transaction-start", "postgres"),
    # A grant's reply that dates its TTL from the call's start (rule 13).
    ("postgres-retry-reply-dated-from-transaction-start", "postgres"),
    ("postgres-hand-off-reply-dated-from-transaction-start", "postgres"),
    ("postgres-release-ignores-owner", "postgres"),
    ("postgres-release-ignores-fence", "postgres"),
    ("postgres-extend-ignores-fence", "postgres"),
    ("postgres-retry-by-owner-only", "postgres"),
    ("postgres-claim-keeps-the-fence", "postgres"),
    ("postgres-fence-reused-on-hand-off", "postgres"),
    ("postgres-release-without-hand-off", "postgres"),
    ("postgres-hand-off-to-dead-waiters", "postgres"),
    # The hand-off's nudge to the waiter that comes to the head (seed 1096).
    ("postgres-hand-off-nudges-nobody", "postgres"),
    ("postgres-waiter-ignores-the-nudge", "postgres"),
    ("redis-hand-off-nudges-nobody", "redis"),
    ("redis-waiter-ignores-the-nudge", "redis"),
    ("etcd-acquire-barges-past-the-queue", "etcd"),
    ("etcd-release-without-hand-off", "etcd"),
    ("etcd-hand-off-to-a-waiter-past-its-deadline", "etcd"),
    ("etcd-look-takes-a-read-behind-its-wake", "etcd"),
    ("etcd-look-always-serializable", "etcd"),
    # Shared holds and permits (issue 23): the kinds workload's keys.
    ("kinds-memory-permits-over-n", "memory"),
    ("kinds-memory-writer-beside-readers", "memory"),
    ("kinds-memory-newcomer-barges-past-the-queue", "memory"),
    ("kinds-memory-hand-off-grants-one-reader", "memory"),
    ("kinds-memory-mismatch-queues", "memory"),
    ("kinds-memory-ran-out-holds-kept", "memory"),
    ("kinds-redis-permits-over-n", "redis"),
    ("kinds-redis-writer-beside-readers", "redis"),
    # The fast paths of a fresh key's first hold and of a release with
    # nobody queued (2026-11-29, night).
    ("kinds-redis-fast-hold-not-indexed", "redis"),
    ("kinds-redis-fast-hold-without-expiry", "redis"),
    ("kinds-redis-fast-release-ignores-owner", "redis"),
    ("kinds-redis-fast-release-beside-waiters", "redis"),
    ("kinds-redis-fast-release-drops-every-hold", "redis"),
    ("kinds-redis-fast-release-of-a-ran-out-hold", "redis"),
    ("kinds-postgres-permits-over-n", "postgres"),
    # The owner check of a hold's release (rule 14, the meddling calls).
    ("kinds-postgres-hold-release-ignores-owner", "postgres"),
    ("kinds-postgres-writer-beside-readers", "postgres"),
    ("kinds-etcd-permits-over-n", "etcd"),
    ("kinds-etcd-shared-beside-a-writer", "etcd"),
]


RUN_MS = "8000"


def run(backend, schedules, name):
    # The find's timeline and history, to tell a find from the checker's
    # error (target/chaos/mutant-<name>.dump and .dump-<seed>.json).
    dump = os.path.join(ROOT, "target", "chaos", f"mutant-{name}.dump")
    os.makedirs(os.path.dirname(dump), exist_ok=True)
    env = dict(os.environ, CHAOS_BACKEND=backend, CHAOS_SCHEDULES=str(schedules),
               CHAOS_STOP_AT_FIRST="1", CHAOS_DUMP=dump)
    # Schedules of 8 s (the long run's are 2.5 s): the relay workload's
    # rounds take one to three seconds each, and a wake-up breakage shows
    # only in some of them (a lead that holds midway, a holder handed the
    # lock that walks away, nobody else calling the key meanwhile).
    env.setdefault("CHAOS_RUN_MS", RUN_MS)
    cmd = ["cargo", "test", "--all-features", "-q", "--test", "chaos", "long_run", "--",
           "--ignored", "--nocapture"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True).stdout
    summary, kinds = None, []
    for line in out.splitlines():
        if line.startswith("CHAOS-SUMMARY "):
            summary = json.loads(line[len("CHAOS-SUMMARY "):])
        elif "VIOLATION" in line:
            kind = line.split(": ")[1] if ": " in line else "?"
            if kind not in kinds:
                kinds.append(kind)
    return summary, kinds


def main(argv):
    words = [a for a in argv if not a.startswith("-")]
    schedules = int(os.environ.get("CHAOS_SCHEDULES", "60"))
    table = {m[0]: m for m in MUTANTS}
    rows = []
    for names, backend in CHECKED:
        names = (names,) if isinstance(names, str) else names
        name = " + ".join(names)
        if words and not any(w in name for w in words):
            continue
        originals = {}
        stale = False
        if any(n not in table for n in names):
            # Renamed or removed in scripts/mutants.py: say so, go on.
            rows.append((name, backend, "UNKNOWN", "-", "-", "-"))
            continue
        for n in names:
            _, path, find, _ = table[n]
            full = os.path.join(ROOT, path)
            if full not in originals:
                with open(full, encoding="utf-8") as f:
                    originals[full] = f.read()
            if originals[full].count(find) != 1:
                stale = True
        if stale:
            rows.append((name, backend, "STALE", "-", "-", "-"))
            continue
        print(f"mutant {name} on {backend} ...", file=sys.stderr)
        started = time.monotonic()
        try:
            mutated = dict(originals)
            for n in names:
                _, path, find, replace = table[n]
                full = os.path.join(ROOT, path)
                mutated[full] = mutated[full].replace(find, replace)
            for full, text in mutated.items():
                with open(full, "w", encoding="utf-8") as f:
                    f.write(text)
            summary, kinds = run(backend, schedules, name.replace(" + ", "+"))
        finally:
            for full, text in originals.items():
                with open(full, "w", encoding="utf-8") as f:
                    f.write(text)
        secs = time.monotonic() - started
        if summary is None:
            rows.append((name, backend, "NO RUN", "-", f"{secs:.0f}", "build or start failed"))
        elif summary["violations"]:
            rows.append((name, backend, "FOUND", str(summary["first_violation_seed"]),
                         f'{summary["first_violation_after_s"]:.0f}', ", ".join(kinds)))
        else:
            rows.append((name, backend, "MISSED", f'{summary["schedules"]} clean',
                         f"{secs:.0f}", "-"))
        print("  " + " | ".join(rows[-1]), file=sys.stderr)
    print("| mutant | backend | result | schedule (seed) | seconds | violations reported |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| `" + row[0] + "` | " + " | ".join(row[1:]) + " |")
    found = sum(1 for r in rows if r[2] == "FOUND")
    print(f"\n{found} of {len(rows)} breakages found", file=sys.stderr)
    return 0 if found == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
