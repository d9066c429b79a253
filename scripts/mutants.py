#!/usr/bin/env python3
"""Break tower-lock on purpose, one mechanism at a time, and see whether the
test suite notices.

Each mutant below removes or bends one mechanism a guarantee rests on (the
queue check that stops barging, the hand-off at release, the owner check, the
attempt id, the fence...). For each, the script edits the source, runs the
tests, and puts the source back, whatever happens (also on Ctrl-C).

    scripts/mutants.py                 # every mutant (one to a few minutes each)
    scripts/mutants.py queue fence     # only mutants whose name has one of these words
    scripts/mutants.py --list

The tests that caught a family of breakages when it was added run first
(`CATCHERS`); only when they all pass does the whole suite run
(`cargo test --all-features`, about ten minutes here). A mutant is CAUGHT when
some test fails, MISSED when the whole suite passes (a hole in the suite:
write the test that fails), and INVALID when it does not build (fix the
mutant). Exit status 1 if any was missed or invalid.

This is a targeted list, not a search of every operator (cargo-mutants does
that, at hundreds of builds for this crate: hours on a 2-core machine). Add a
mutant whenever a mechanism is added; the README's testing notes quote the
last run.
"""

import os
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# The whole suite, as CI runs it: a mutant is MISSED only when all of it passes.
WHOLE = ("", [])

# Where to look first: the tests that caught each family of breakages when
# it was added, as (targets, name filters) steps run in order until one
# fails. A family is matched by the mutant's name, then by the file it
# edits, first match wins. When every step passes, the whole suite runs:
# the steps only make a catch cheap (a filtered target, not the suite's ten
# minutes), never a miss. "--lib" is the library's unit tests; a filter
# keeps the tests whose name has one of its words ("postgres::" is the
# behaviour suite's PostgreSQL instance).
CATCHERS = [
    ("api26-", [("api retry_after", [])]),
    ("apalis-", [("apalis_example", []), ("behaviour", ["apalis"])]),
    ("kinds-memory", [("behaviour", ["memory::"])]),
    # Renewals: one slow shard or one WAIT for replicas holds back no other.
    ("watchdog-", [("--lib", ["watchdog"]), ("behaviour", ["memory::"]),
                   ("redis_cluster_stall redis_replicas", [])]),
    # Metadata as stored and read back by every backend.
    ("metadata-", [("--lib", ["metadata"]), ("behaviour", ["metadata"])]),
    ("kinds-postgres", [("behaviour", ["postgres::"]), ("kinds_across_processes", ["postgres"])]),
    ("kinds-redis", [("behaviour", ["redis"]), ("redis_kinds kinds_across_processes", [])]),
    ("kinds-etcd", [("behaviour", ["etcd::"])]),
    ("src/backend/postgres/", [("postgres_races postgres_backend", []), ("--lib", ["postgres"]),
                               ("behaviour", ["postgres::"])]),
    ("src/backend/redis/", [("redis_backend redis_replicas redis_cluster_stall", []),
                            ("--lib", ["redis"]), ("behaviour", ["redis"]),
                            ("redis_failover redis_handoff redis_connect", [])]),
    ("src/backend/etcd/", [("etcd_failover", []), ("--lib", ["etcd"]), ("behaviour", ["etcd::"])]),
    ("", [("--lib", []), ("behaviour", ["memory::", "flight_http::"]),
          ("smoke stacking fencing hostile_input", [])]),
]


def steps_for(name, path):
    """The steps to try for one mutant, the whole suite last."""
    if os.environ.get("MUTANTS_TESTS"):
        # MUTANTS_TESTS narrows the run to some test targets ("behaviour
        # postgres_races") and MUTANTS_FILTER to the tests whose name has
        # this text ("kinds_suite::redis"): no whole suite after them.
        filters = os.environ.get("MUTANTS_FILTER", "").split()
        return [(os.environ["MUTANTS_TESTS"], filters)]
    for prefix, steps in CATCHERS:
        if name.startswith(prefix) or (prefix.startswith("src/") and path.startswith(prefix)):
            return steps + [WHOLE]
    return [WHOLE]


def command(step):
    targets, filters = step
    cmd = ["cargo", "test", "--all-features", "--no-fail-fast"]
    for t in targets.split():
        cmd += [t] if t.startswith("--") else ["--test", t]
    return cmd + (["--"] + filters if filters else [])


TIMEOUT_S = 1200

# (name, file, text to find (exactly once), replacement)
MUTANTS = [
    # Shared holds and permits (issue 23): tests/behaviour/kinds.rs
    # (MUTANTS_TESTS="behaviour" scripts/mutants.py kinds).
    ("kinds-memory-permits-over-n", "src/spec/kind.rs",
     "n == m && holders < n as usize",
     "n == m && holders <= n as usize"),
    ("kinds-memory-writer-beside-readers", "src/spec/kind.rs",
     "(LockKind::Shared, LockKind::Shared) => true,",
     "(_, LockKind::Shared) => true,"),
    ("kinds-memory-newcomer-barges-past-the-queue", "src/backend/memory/group.rs",
     "            && self.live_waiters() == 0",
     "            && true"),
    ("kinds-memory-hand-off-grants-one-reader", "src/backend/memory/queue.rs",
     "        held = Some(w.kind);\n        holders += 1;",
     "        held = Some(w.kind);\n        holders += 1;\n        break;"),
    # The same mechanisms in PostgreSQL's functions (MUTANTS_TESTS="behaviour
    # kinds_across_processes" MUTANTS_FILTER=postgres scripts/mutants.py kinds-postgres).
    ("kinds-postgres-permits-over-n", "src/backend/postgres/functions.sql",
     "      ELSE v_live < p_permits END",
     "      ELSE v_live <= p_permits END"),
    ("kinds-postgres-writer-beside-readers", "src/backend/postgres/functions.sql",
     "      WHEN 0 THEN v_live = 0\n      WHEN 1 THEN v_live = 0 OR r.kind = 1",
     "      WHEN 0 THEN true\n      WHEN 1 THEN v_live = 0 OR r.kind = 1"),
    ("kinds-postgres-newcomer-barges-past-the-queue", "src/backend/postgres/functions.sql",
     "WHERE q.key = p_key AND q.deadline > v_now\n                      AND (p_ticket IS NULL",
     "WHERE false AND q.key = p_key AND q.deadline > v_now\n                      AND (p_ticket IS NULL"),
    ("kinds-postgres-hand-off-grants-one-reader", "src/backend/postgres/functions.sql",
     "    EXIT WHEN w.kind = 0;\n  END LOOP;",
     "    EXIT;\n  END LOOP;"),
    ("kinds-postgres-hold-release-ignores-owner", "src/backend/postgres/functions.sql",
     "      WHERE x.key = p_key AND x.owner = p_owner\n        AND x.fence = coalesce(p_fence,",
     "      WHERE x.key = p_key\n        AND x.fence = coalesce(p_fence,"),
    ("kinds-postgres-expired-holds-kept", "src/backend/postgres/functions.sql",
     "DELETE FROM \"{schema}\".\"{table}_holds\" AS x WHERE x.key = p_key AND x.expires_at <= v_at;",
     "DELETE FROM \"{schema}\".\"{table}_holds\" AS x WHERE false;"),
    # The fast paths of a key held shared or under permits with nobody queued.
    ("kinds-postgres-fast-release-ignores-the-queue", "src/backend/postgres/functions.sql",
     "    IF FOUND AND NOT r.queued THEN",
     "    IF FOUND THEN"),
    ("kinds-postgres-fast-acquire-barges-past-the-queue", "src/backend/postgres/functions.sql",
     "  IF p_kind <> 0 AND r.kind = p_kind AND NOT r.queued AND r.expires_at > v_now",
     "  IF p_kind <> 0 AND r.kind = p_kind AND r.expires_at > v_now"),
    ("kinds-postgres-fast-acquire-ignores-a-retry", "src/backend/postgres/functions.sql",
     "    IF NOT v_mine AND (p_kind = 1 OR v_live < p_permits) THEN",
     "    IF (p_kind = 1 OR v_live < p_permits) THEN"),
    # The same mechanisms in Redis' scripts (MUTANTS_TESTS="behaviour kinds_across_processes"
    # MUTANTS_FILTER=kinds_suite::redis scripts/mutants.py kinds-redis).
    ("kinds-redis-fast-path-ignores-holds", "src/backend/redis/acquire.lua",
     "if redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[5], KEYS[6]) == 0 then",
     "if redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[5]) == 0 then"),
    ("kinds-redis-writer-beside-readers", "src/backend/redis/common.lua",
     "    return kind == held and n < tonumber(string.sub(kind, 2))\n  end\n  return false",
     "    return kind == held and n < tonumber(string.sub(kind, 2))\n  end\n  return true"),
    ("kinds-redis-permits-over-n", "src/backend/redis/common.lua",
     "n < tonumber(string.sub(kind, 2))",
     "n <= tonumber(string.sub(kind, 2))"),
    ("kinds-redis-newcomer-barges-past-the-queue", "src/backend/redis/acquire.lua",
     "    if empty and fits(kind, held, n) then",
     "    if fits(kind, held, n) then"),
    ("kinds-redis-hand-off-grants-one-reader", "src/backend/redis/common.lua",
     "      if kind == '' then\n        break\n      end\n      held, n = kind, n + 1",
     "      break"),
    ("kinds-redis-mismatch-queues", "src/backend/redis/common.lua",
     "    return kind == held\n",
     "    return true\n"),
    ("kinds-redis-ran-out-holds-kept", "src/backend/redis/common.lua",
     "  local gone = redis.call('ZRANGEBYSCORE', expiries, '-inf', string.format('%d', now))",
     "  local gone = {}"),
    ("kinds-redis-hold-release-without-hand-off", "src/backend/redis/release.lua",
     "hand_off(now, nil, n)\nif found then",
     "if found then"),
    ("kinds-redis-release-ignores-the-fence", "src/backend/redis/common.lua",
     "  if f == '' then\n    -- A cleanup without a fence",
     "  if true then\n    -- A cleanup without a fence"),
    # The holds' expiry index (`{E}:he`): each hold's expiry follows its
    # extensions and claims, and a retry finds its hold through its index entry.
    ("kinds-redis-extend-leaves-the-expiry", "src/backend/redis/extend.lua",
     "      redis.call('ZADD', KEYS[4], expiry, field)\n",
     ""),
    ("kinds-redis-claim-drops-the-expiry", "src/backend/redis/claim.lua",
     "    redis.call('ZADD', expiries, expiry, f)\n",
     ""),
    ("kinds-redis-retry-refresh-leaves-the-expiry", "src/backend/redis/acquire.lua",
     "    redis.call('ZADD', expiries, expiry, f)\n",
     ""),
    ("kinds-redis-hold-not-indexed", "src/backend/redis/common.lua",
     "    'a' .. attempt .. ' ' .. owner, f)",
     "    'x', f)"),
    # The fast paths of a fresh key's first hold and of a hold's release
    # with nobody queued (scripts.rs, release.lua).
    ("kinds-redis-fast-hold-not-indexed", "src/backend/redis/scripts.rs",
     "      'a' .. attempt .. ' ' .. owner, f)",
     "      'x', f)"),
    ("kinds-redis-fast-hold-without-expiry", "src/backend/redis/scripts.rs",
     "    redis.call('ZADD', KEYS[7], expiry, f)\n",
     ""),
    ("kinds-redis-fast-release-ignores-owner", "src/backend/redis/release.lua",
     "    if who == ARGV[1]\n",
     "    if true\n"),
    ("kinds-redis-fast-release-beside-waiters", "src/backend/redis/release.lua",
     "if not current and ARGV[2] ~= '' and redis.call('EXISTS', KEYS[3]) == 0 then",
     "if not current and ARGV[2] ~= '' then"),
    ("kinds-redis-fast-release-drops-every-hold", "src/backend/redis/release.lua",
     "      if redis.call('ZCARD', expiries) <= 1 then",
     "      if true then"),
    ("kinds-redis-fast-release-of-a-ran-out-hold", "src/backend/redis/release.lua",
     "      and tonumber(expiry) > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then",
     "      then"),
    ("kinds-memory-mismatch-queues", "src/backend/memory/take.rs",
     "if !req.kind().same_family(entry.kind()) {",
     "if false {"),
    ("kinds-memory-ran-out-holds-kept", "src/backend/memory/group.rs",
     "group.holds.retain(|h| h.expires > now);",
     "group.holds.retain(|_| true);"),
    # The API pass (issue 26): tests/api.rs and tests/retry_after.rs
    # (MUTANTS_TESTS="api retry_after" scripts/mutants.py api26).
    ("api26-postgres-builder-skips-schema-check", "src/backend/postgres/build.rs",
     "check_name(&self.schema, \"schema\")?;",
     "let _ = &self.schema;"),
    ("api26-postgres-builder-skips-table-check", "src/backend/postgres/build.rs",
     "check_name(&self.table, \"table\")?;",
     "let _ = &self.table;"),
    ("api26-job-spec-route-scoped", "src/spec/global.rs",
     "JobSpec(LockSpec::global(key, ttl))",
     "JobSpec(LockSpec::new(key, ttl))"),
    ("api26-job-spec-from-any-scope", "src/spec/global.rs",
     "Scope::Global => Ok(JobSpec(spec)),",
     "_ => Ok(JobSpec(spec)),"),
    ("api26-retry-estimate-not-used", "src/layer/retry.rs",
     "(Some(e), Some(r)) => Some(e.min(r)),",
     "(Some(_), Some(r)) => Some(r),"),
    ("api26-hold-times-not-recorded", "src/lock/release.rs",
     "policy.record(since.elapsed());",
     "let _ = (policy, since);"),
    ("api26-no-lock-named-not-marked", "src/layer/future.rs",
     "let named = NoLockNamed::enter();",
     "let named = ();"),
    ("api26-no-lock-named-leaks-past-the-poll", "src/lock/extract.rs",
     "NO_LOCK_NAMED.set(self.previous);",
     "let _ = self.previous;"),
    ("api26-flight-ignores-rejection-hook", "src/flight/service.rs",
     "reject.reject(error).map(FlightBody::rejection)",
     "{ let _ = reject; crate::default_rejection(error).map(FlightBody::rejection) }"),
    ("api26-redis-config-error-is-unavailable", "src/backend/redis/error.rs",
     'LockError::InvalidConfig(format!("Redis: {e}"))',
     'LockError::BackendUnavailable(format!("Redis: {e}").into())'),
    # Redis scripts
    # A waiter that comes to the head behind a hand-off (chaos seed 1096,
    # the same design as PostgreSQL's): told how long the new holder holds,
    # and it sleeps until then (redis_backend a_waiter_behind_a_holder_that_
    # walked_away_wakes_at_its_ttl, and --lib redis::wake).
    ("redis-hand-off-nudges-nobody", "src/backend/redis/common.lua",
     "  if any then\n    nudge(now, me)\n  end",
     "  if false then\n    nudge(now, me)\n  end"),
    ("redis-waiter-ignores-the-nudge", "src/backend/redis/wait.rs",
     "holder_expires = Instant::now() + free_in + Duration::from_millis(1);",
     "let _ = free_in;"),
    ("redis-acquire-fast-path-ignores-queue", "src/backend/redis/acquire.lua",
     "if redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[5], KEYS[6]) == 0 then",
     "if redis.call('EXISTS', KEYS[1], KEYS[5], KEYS[6]) == 0 then"),
    ("redis-acquire-fast-path-ignores-legacy-fence", "src/backend/redis/acquire.lua",
     "if redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[5], KEYS[6]) == 0 then",
     "if redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[6]) == 0 then"),
    ("redis-legacy-fence-not-migrated", "src/backend/redis/common.lua",
     "  local legacy = redis.call('GET', KEYS[5])",
     "  local legacy = nil"),
    ("redis-fence-counter-per-key", "src/backend/redis/keys.rs",
     "        inv.key(self.counter_key(slot).as_str());",
     "        inv.key(format!(\"{buf}:fence\").as_str());"),
    ("redis-release-without-hand-off", "src/backend/redis/release.lua",
     "  redis.call('DEL', lock)\n  hand_off(nil, nil)\n  return 1",
     "  redis.call('DEL', lock)\n  return 1"),
    ("redis-retry-by-owner-only", "src/backend/redis/acquire.lua",
     "if holder == owner and held_attempt == attempt and kind == '' then",
     "if holder == owner and kind == '' then"),
    ("redis-force-release-repeats", "src/backend/redis/force_release.lua",
     "  if nonce == ARGV[1] then",
     "  if false then"),
    ("redis-hand-off-to-dead-waiters", "src/backend/redis/common.lua",
     "if not deadline or tonumber(deadline) <= now then",
     "if not deadline then"),
    ("redis-release-ignores-owner", "src/backend/redis/release.lua",
     "if string.sub(current, -n) ~= owner or string.byte(current, -n - 1) ~= 32 then",
     "if false then"),
    ("redis-extend-ignores-owner", "src/backend/redis/extend.lua",
     "if holder ~= ARGV[1] or (ARGV[3] ~= '' and f ~= ARGV[3]) then",
     "if (ARGV[3] ~= '' and f ~= ARGV[3]) then"),
    # Round 3: an acquisition is named by its fence, not by its owner.
    ("redis-release-ignores-fence", "src/backend/redis/release.lua",
     "  if f ~= '' and (string.sub(current, 3, #f + 2) ~= f",
     "  if false and (string.sub(current, 3, #f + 2) ~= f"),
    ("redis-extend-ignores-fence", "src/backend/redis/extend.lua",
     "if holder ~= ARGV[1] or (ARGV[3] ~= '' and f ~= ARGV[3]) then",
     "if holder ~= ARGV[1] then"),
    ("redis-claim-keeps-the-fence", "src/backend/redis/claim.lua",
     "\n  f = string.format('%d', next_fence())",
     "\n  f = old"),
    ("redis-fence-not-incremented-on-hand-off", "src/backend/redis/common.lua",
     "  local f = next_fence()\n  redis.call('SET', lock,",
     "  local f = tonumber(redis.call('GET', fence) or '0')\n  redis.call('SET', lock,"),
    ("redis-stale-grant-believed", "src/backend/redis/wait.rs",
     "Some(Wake::Granted(grant)) if entries <= 1 => {",
     "Some(Wake::Granted(grant)) if entries <= 1_000 => {"),
    ("redis-min-replicas-ignores-the-count", "src/backend/redis/replicas.rs",
     "if acked < i64::from(min.replicas) {",
     "if acked < i64::from(min.replicas) && false {"),
    ("redis-first-waiter-queues-after-subscribing", "src/backend/redis/wait.rs",
     "            let queue = Some((\n",
     "            let queue = grant_rx.is_some().then_some((\n"),
    ("redis-failed-waiter-leaves-once", "src/backend/retry.rs",
     "Err(LockError::BackendUnavailable(e)) if Instant::now() < until => {",
     "Err(LockError::BackendUnavailable(e)) if false && Instant::now() < until => {"),
    # PostgreSQL statements and functions
    ("postgres-take-over-ignores-queue", "src/backend/postgres/functions.sql",
     "    IF r.queued THEN\n      h := \"{schema}\".\"{table}_hand_off\"(p_key, p_channel, p_ticket);",
     "    IF false THEN\n      h := \"{schema}\".\"{table}_hand_off\"(p_key, p_channel, p_ticket);"),
    # An extend that waited for the row past the TTL revived the lock (a
    # permit beside the ones others took once it ran out).
    ("postgres-extend-judged-from-statement-start", "src/backend/postgres/functions.sql",
     "  v_now := clock_timestamp();\n  now_us := \"{schema}\".\"{table}_us\"(v_now);\n  IF FOUND AND r.kind = 0 THEN",
     "  IF FOUND AND r.kind = 0 THEN"),
    ("postgres-acquire-scans-by-bitmap", "src/backend/postgres/functions.sql",
     "  p_kind smallint DEFAULT 0, p_permits int DEFAULT NULL,\n  OUT code int, OUT fence bigint, OUT acquired_us bigint, OUT now_us bigint,\n  OUT remaining_us bigint, OUT created boolean)\nLANGUAGE plpgsql SET enable_bitmapscan = off AS $$",
     "  p_kind smallint DEFAULT 0, p_permits int DEFAULT NULL,\n  OUT code int, OUT fence bigint, OUT acquired_us bigint, OUT now_us bigint,\n  OUT remaining_us bigint, OUT created boolean)\nLANGUAGE plpgsql AS $$"),
    ("postgres-retry-refreshed-from-transaction-start", "src/backend/postgres/functions.sql",
     "AS l SET expires_at = clock_timestamp() + v_ttl, granted_to = NULL",
     "AS l SET expires_at = v_now + v_ttl, granted_to = NULL"),
    ("postgres-retry-reply-dated-from-transaction-start", "src/backend/postgres/functions.sql",
     "      RETURNING l.expires_at - v_ttl INTO v_now;\n",
     "      ;\n"),
    ("postgres-hand-off-reply-dated-from-transaction-start", "src/backend/postgres/functions.sql",
     "        -- call's start (it waited for the row).\n        now_us := h.granted_us;\n",
     "\n"),
    ("postgres-release-without-hand-off", "src/backend/postgres/functions.sql",
     '  -- waiter gets it now; with none left, the row goes.\n  h := "{schema}"."{table}_hand_off"(p_key, NULL, NULL);\n  IF h.fence IS NULL THEN',
     '  -- waiter gets it now; with none left, the row goes.\n  h := NULL;\n  IF true THEN'),
    ("postgres-retry-by-owner-only", "src/backend/postgres/functions.sql",
     "IF r.expires_at > v_now AND r.owner = p_owner AND r.attempt = p_attempt THEN",
     "IF r.expires_at > v_now AND r.owner = p_owner THEN"),
    ("postgres-release-ignores-owner", "src/backend/postgres/statements.rs",
     "WHERE l.key = $1::text AND l.owner = $2::text \\",
     "WHERE l.key = $1::text \\"),
    ("postgres-release-ignores-fence", "src/backend/postgres/statements.rs",
     "AND ($3::bigint IS NULL OR l.fence = $3::bigint) \\",
     "AND true \\"),
    ("postgres-extend-ignores-fence", "src/backend/postgres/functions.sql",
     "    IF r.owner = p_owner AND (p_fence IS NULL OR r.fence = p_fence) AND r.expires_at > v_now THEN",
     "    IF r.owner = p_owner AND r.expires_at > v_now THEN"),
    ("postgres-claim-keeps-the-fence", "src/backend/postgres/functions.sql",
     "    v_fence := nextval('\"{schema}\".\"{table}_fence\"');\n    -- The metadata belongs",
     "    v_fence := r.fence;\n    -- The metadata belongs"),
    ("postgres-hand-off-to-dead-waiters", "src/backend/postgres/functions.sql",
     "    CONTINUE WHEN NOT FOUND OR w.deadline <= v_at;",
     "    CONTINUE WHEN NOT FOUND;"),
    ("postgres-fence-reused-on-hand-off", "src/backend/postgres/functions.sql",
     "    v_fence := nextval('\"{schema}\".\"{table}_fence\"');\n    v_expires :=",
     "    v_fence := (SELECT l.fence FROM \"{schema}\".\"{table}\" AS l WHERE l.key = p_key);\n    v_expires :="),
    # Round 3 (issue 21): fences in grant order, cleanup in order, the sweep
    # beside a hand-off, session settings, broken connections.
    ("postgres-fence-drawn-before-the-insert", "src/backend/postgres/statements.rs",
     "RETURNING l.fence, l.fence = pg_sequence_last_value('{fence}') AS newest) \\",
     "RETURNING l.fence, true AS newest) \\"),
    ("postgres-hand-off-dated-by-the-caller", "src/backend/postgres/functions.sql",
     "  v_at timestamptz := clock_timestamp();",
     "  v_at timestamptz := now();"),
    ("postgres-dropped-call-not-pinned", "src/backend/postgres/conn.rs",
     "        if let (false, Some(caller)) = (self.answered, self.caller) {",
     "        if let (false, Some(caller)) = (true, self.caller) {"),
    ("postgres-fence-checked-only-in-the-statement", "src/backend/postgres/functions.sql",
     "      IF fence <> pg_sequence_last_value('\"{schema}\".\"{table}_fence\"') THEN",
     "      IF false THEN"),
    ("postgres-grant-to-a-gone-waiter-dropped", "src/backend/postgres/listen.rs",
     "        if let Some(key) = key {",
     "        if let Some(key) = key.filter(|_| false) {"),
    # A waiter that comes to the head behind a hand-off (chaos seed 1096):
    # told how long the new holder holds, by the server and by the
    # listener; and it sleeps until then (postgres_races, section 7, and
    # --lib postgres::listen).
    ("postgres-hand-off-nudges-nobody", "src/backend/postgres/functions.sql",
     "  IF fence IS NOT NULL THEN\n    PERFORM \"{schema}\".\"{table}_nudge\"(p_key, p_channel, p_ticket);",
     "  IF false THEN\n    PERFORM \"{schema}\".\"{table}_nudge\"(p_key, p_channel, p_ticket);"),
    ("postgres-extend-nudges-nobody", "src/backend/postgres/functions.sql",
     "        WHERE l.key = p_key;\n      IF r.queued THEN\n        -- A shorter TTL",
     "        WHERE l.key = p_key;\n      IF false THEN\n        -- A shorter TTL"),
    ("postgres-nudge-not-delivered", "src/backend/postgres/listen.rs",
     "let _ = tx.send(Wake::FreeIn(free_in));",
     "let _ = (tx, free_in);"),
    ("postgres-waiter-ignores-the-nudge", "src/backend/postgres/wait.rs",
     "holder_expires = Instant::now() + free_in + Duration::from_millis(1);",
     "let _ = free_in;"),
    ("postgres-claimed-grant-passed-on", "src/backend/postgres/functions.sql",
     "AS l SET expires_at = clock_timestamp() + v_ttl, granted_to = NULL",
     "AS l SET expires_at = clock_timestamp() + v_ttl"),
    ("postgres-hand-off-trusts-a-vanished-entry", "src/backend/postgres/functions.sql",
     "    CONTINUE WHEN NOT FOUND OR w.deadline <= v_at;",
     "    IF NOT FOUND THEN\n      fence := NULL;\n      RETURN;\n    END IF;\n    CONTINUE WHEN w.deadline <= v_at;"),
    ("postgres-isolation-left-to-the-database", "src/backend/postgres/conn.rs",
     "SET default_transaction_isolation = 'read committed'; ",
     ""),
    ("postgres-commits-left-to-the-database", "src/backend/postgres/conn.rs",
     "WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END",
     "WHEN 'remote_apply' THEN 'remote_apply' ELSE current_setting('synchronous_commit') END"),
    ("postgres-broken-call-not-sent-again", "src/backend/postgres/conn.rs",
     "if !retried && (which.repeatable() || probing) && Instant::now() < end {",
     "if false && !retried && (which.repeatable() || probing) && Instant::now() < end {"),
    ("postgres-dead-pooled-connection-kept", "src/backend/postgres/conn.rs",
     "                Ok(Err(e)) if broken(&e, &client) => {",
     "                Ok(Err(e)) if broken(&e, &client) && false => {"),
    ("postgres-force-release-on-an-unproven-connection", "src/backend/postgres/conn.rs",
     "                if !which.repeatable() {\n                    // Sent only",
     "                if false {\n                    // Sent only"),
    # Memory backend
    ("memory-expired-lock-free-for-newcomer", "src/backend/memory/take.rs",
     "let handed = ((expired || entry.group().is_some()) && settle(&self.fence, entry, now))",
     "let handed = (false && settle(&self.fence, entry, now))"),
    ("memory-release-without-hand-off", "src/backend/memory/table.rs",
     "                } else {\n                    self.hand_off(entry)\n                };",
     "                } else {\n                    false && self.hand_off(entry)\n                };"),
    ("memory-retry-by-owner-only", "src/backend/memory/retry.rs",
     "        self.attempt == req.attempt()\n",
     "        true\n"),
    ("memory-release-ignores-owner", "src/backend/memory/table.rs",
     "            } else if !holder.matches(&e.owner, e.fence) {\n                Err(Err(LockError::OwnershipMismatch))",
     "            } else if false {\n                Err(Err(LockError::OwnershipMismatch))"),
    ("memory-release-ignores-fence", "src/backend/memory/table.rs",
     "            } else if !holder.matches(&e.owner, e.fence) {\n                Err(Err(LockError::OwnershipMismatch))",
     "            } else if !owners_match(&e.owner, holder.owner()) {\n                Err(Err(LockError::OwnershipMismatch))"),
    ("memory-extend-ignores-fence", "src/backend/memory/table.rs",
     "        if !holder.matches(&entry.owner, entry.fence) {\n            return Err(LockError::OwnershipMismatch);\n        }\n        let before",
     "        if !owners_match(&entry.owner, holder.owner()) {\n            return Err(LockError::OwnershipMismatch);\n        }\n        let before"),
    ("memory-claim-keeps-the-fence", "src/backend/memory/table.rs",
     "            entry.fence = self.next_fence();\n            entry.attempt = attempt;",
     "            entry.attempt = attempt;"),
    ("renewals-name-the-owner-only", "src/backend/lease.rs",
     "        Holder::new(&self.owner, self.fence)",
     "        Holder::owner_only(&self.owner)"),
    ("memory-hand-off-keeps-old-fence", "src/backend/memory/queue.rs",
     "        let fence = next_fence(fence);\n        let lease = Lease::new(fence, wall, wall, w.ttl);",
     "        let fence = entry.fence;\n        let lease = Lease::new(fence, wall, wall, w.ttl);"),
    # Layer
    ("layer-waits-outlast-held-locks", "src/lock/acquire.rs",
     "if let Some(expiry) = locks.earliest_expiry() {",
     "if let Some(expiry) = locks.earliest_expiry().filter(|_| false) {"),
    ("layer-no-check-before-handler", "src/lock/acquire.rs",
     "    if !locks.any_lost() {",
     "    if true || !locks.any_lost() {"),
    ("layer-waits-add-up", "src/lock/acquire.rs",
     "            let mut until = deadline;",
     "            let mut until = now + req.max_wait().min(crate::spec::MAX_TTL);"),
    ("layer-scope-twins-allowed", "src/lock/acquire.rs",
     "                (a.key().key() == b.key().key()).then_some(LockError::InvalidKey(",
     "                (false && a.key().key() == b.key().key()).then_some(LockError::InvalidKey("),
    ("response-guard-drop-does-not-release", "src/lock/release.rs",
     "        if let Some(locks) = self.locks.take() {\n            // Dropping the unfinished release detaches it.",
     "        if let Some(locks) = self.locks.take().filter(|_| false) {\n            // Dropping the unfinished release detaches it."),
    ("finish-dropped-does-not-run-the-rest", "src/lock/release.rs",
     "        let Some(fut) = self.0.take() else {\n            return;\n        };",
     "        let Some(fut) = self.0.take().filter(|_| false) else {\n            return;\n        };"),
    ("restore-reads-instead-of-claiming", "src/lock/owned.rs",
     "        let claimed = backend.claim(&key, holder, new_attempt_id()).await?;",
     "        let _ = new_attempt_id();\n        let claimed = backend.extend(&key, holder, Duration::from_secs(30)).await?;"),
    # Input (issue 21): checked in the form it is used and stored in
    ("client-key-rule-before-nfc", "src/client/mod.rs",
     "        let key = normalise(&decoded)?;",
     "        let key = smol_str::SmolStr::new(&decoded);"),
    ("locks-lookup-before-nfc", "src/lock/registry.rs",
     "    fn lookup(&self, key: &str) -> Result<HeldLock, LockError> {\n        let key = &*nfc(key);",
     "    fn lookup(&self, key: &str) -> Result<HeldLock, LockError> {"),
    ("metadata-depth-unlimited", "src/metadata.rs",
     "    if depth > MAX_METADATA_DEPTH {",
     "    if depth > MAX_METADATA_DEPTH * 8 {"),
    ("metadata-nul-allowed", "src/metadata.rs",
     "    if s.contains('\\0') {",
     "    if false && s.contains('\\0') {"),
    ("metadata-negative-zero-kept", "src/metadata.rs",
     "    if f == 0.0 && f.is_sign_negative() {",
     "    if false {"),
    ("metadata-whole-floats-kept", "src/metadata.rs",
     "    if f.fract() != 0.0 || f.abs() < 1e16 {",
     "    if true {"),
    ("metadata-long-text-not-read-back", "src/metadata.rs",
     "const MAX_STORED_TEXT: usize = MAX_METADATA_BYTES * 64;",
     "const MAX_STORED_TEXT: usize = MAX_METADATA_BYTES * 4;"),
    ("metadata-floats-read-inexactly", "Cargo.toml",
     'serde_json = { version = "1.0.129", features = ["float_roundtrip"] }',
     'serde_json = { version = "1.0.129", features = [] }'),
    # Watchdog
    ("watchdog-first-renewal-from-now", "src/watchdog/mod.rs",
     "            .checked_sub(ttl - ttl / 3)",
     "            .checked_sub(ttl * 0)"),
    ("watchdog-ignores-lost-renewal", "src/watchdog/renew.rs",
     "                e.signal.mark_lost();\n                state.entries.remove(&d.id);\n            }\n            Err(err) => {",
     "                state.entries.remove(&d.id);\n            }\n            Err(err) => {"),
    # Round 3 (issue 27): one slow shard or one WAIT expires no other lock.
    ("watchdog-waits-for-each-round", "src/watchdog/mod.rs",
     "                tokio::spawn(Arc::clone(&self).renew(due));",
     "                Arc::clone(&self).renew(due).await;"),
    ("redis-renewals-wait-for-the-whole-batch", "src/backend/redis/mod.rs",
     "    ) -> Option<Vec<BoxFuture<'a, Result<Lease, LockError>>>> {\n        Some(",
     "    ) -> Option<Vec<BoxFuture<'a, Result<Lease, LockError>>>> {\n        if !batch.is_empty() {\n            return None;\n        }\n        Some("),
    ("redis-cluster-timeout-drops-the-connection", "src/backend/redis/conn.rs",
     "                if self.replacing.swap(true, Ordering::AcqRel) {",
     "                if true {\n                    let _ = nodes;\n                    return self.invalidate(generation);\n                }\n                if self.replacing.swap(true, Ordering::AcqRel) {"),
    ("redis-wait-on-the-shared-connection", "src/backend/redis/dedicated.rs",
     "        let conn = source.open(end).await?;",
     "        let conn = source.get(end).await?.1;"),
    ("redis-noscript-loads-on-every-primary", "src/backend/redis/invoke.rs",
     "                self.cmd(false).query_async(conn).await",
     "                deadpool_redis::redis::cmd(\"SCRIPT\")\n                    .arg(\"LOAD\")\n                    .arg(self.script.code.as_bytes())\n                    .query_async::<Value>(conn)\n                    .await?;\n                self.cmd(true).query_async(conn).await"),
    ("redis-leaders-unconfirmed", "src/backend/redis/mod.rs",
     "                    FlightStart::Leader(lease) => {",
     "                    FlightStart::Leader(lease) if false => {"),
    ("redis-claims-unconfirmed", "src/backend/redis/mod.rs",
     "                self.confirmed(key, holder, claimed.ttl, min).await",
     "                let _ = (holder, min);\n                Ok(claimed)"),
    ("redis-legacy-counter-not-kept", "src/backend/redis/legacy.rs",
     "        .replacen(DROP_OLD, KEEP_OLD, 1)",
     "        .replacen(DROP_OLD, DROP_OLD, 1)"),
    ("redis-legacy-mode-keeps-the-fast-path", "src/backend/redis/legacy.rs",
     "        .replacen(FAST_PATH, \"if false then\", 1)",
     "        .replacen(FAST_PATH, FAST_PATH, 1)"),
    ("redis-refused-acquisition-stays-indexed", "src/backend/redis/extras.rs",
     "                    if !matches!(e, LockError::BackendUnavailable(_)) {",
     "                    if false {"),
    ("redis-index-without-counts", "src/backend/redis/owners.lua",
     "    write(ARGV[2], count + 1, math.max(untl, now_ms() + tonumber(ARGV[4])))",
     "    write(ARGV[2], 1, math.max(untl, now_ms() + tonumber(ARGV[4])))"),
    ("redis-refused-release-drops-the-index", "src/backend/redis/extras.rs",
     "        if self.index_owners && released.is_ok() {",
     "        if self.index_owners {"),
    ("redis-publish-rerun-not-recognised", "src/backend/redis/flight_publish.lua",
     "  if redis.call('HGET', result, 'seq') == seq then",
     "  if false then"),
    ("redis-cleanup-overtakes-its-call", "src/backend/redis/ops.rs",
     "            Some(conn) => self.shared.conn.eval_behind(inv, conn, end).await,",
     "            Some(_) => self.shared.conn.eval(inv, end).await,"),
    # Single-flight over HTTP (issue 21 items 8-13)
    # A response that allows reuse for others' credentials only after the
    # origin revalidates it (no-cache, a zero lifetime), shared across
    # credentials as the bare directive names once let it (response.rs:
    # a_response_reaches_only_requests_with_the_leaders_credentials; the
    # behaviour suite's a_response_reaches_only_the_clients_with_its_credentials
    # was red on the code before both).
    ("flight-credentials-crossed-without-a-lifetime", "src/flight/fit.rs",
     "        None if allowed => max_age.unwrap_or(0),",
     "        None if allowed => max_age.unwrap_or(1).max(1),"),
    ("flight-credentials-crossed-despite-no-cache", "src/flight/fit.rs",
     "        if d.eq_ignore_ascii_case(\"no-cache\") {\n            return None;",
     "        if d.eq_ignore_ascii_case(\"no-cache\") {\n            continue;"),
    # Flight keys normalised as lock keys are: two canonically equivalent
    # paths share one flight, one's answer for the other (behaviour:
    # canonically_equivalent_keys_are_separate_flights).
    ("flight-key-normalised", "src/key.rs",
     "        let mut k = Self::new(checked(key)?, None);",
     "        let mut k = Self::new(normalise(key)?, None);"),
    # Requests refusing a stored result each run the handler on their own
    # (a burst of reloads: a stampede) instead of meeting in a flight of
    # their own (behaviour: a_burst_refusing_the_stored_answer_runs_the_handler_once).
    ("flight-refusing-requests-run-alone", "src/flight/service.rs",
     "            Some(why) if !refreshing => {",
     "            Some(why) if false => {"),
    # A response shared across credentials kept for the whole result TTL,
    # past its own lifetime: served stale to other clients (behaviour:
    # a_response_crosses_credentials_only_while_fresh).
    ("flight-credentials-crossed-while-stale", "src/flight/service.rs",
     "        Some(lifetime) if !names.contains(&http::header::AUTHORIZATION) => result_ttl.min(lifetime),",
     "        Some(lifetime) if false => result_ttl.min(lifetime),"),
    # A request refusing the stored result it found counted as `fresh` as
    # well as by the flight it then joins (metrics:
    # single_flight_outcomes_leader_shared_fresh).
    ("flight-refused-stored-counted-fresh", "src/flight/engine.rs",
     "    if !(refuses_stored && matches!(role, Ok(Role::Shared { stored: true, .. }))) {",
     "    if true {"),
    ("flight-conditional-requests-join", "src/flight/response.rs",
     "        .any(|name| request.contains_key(name))",
     "        .any(|name| request.contains_key(name) && false)"),
    ("flight-304-and-206-shared", "src/flight/response.rs",
     "if parts.status == StatusCode::PARTIAL_CONTENT || parts.status == StatusCode::NOT_MODIFIED {",
     "if false {"),
    ("flight-vary-ignored", "src/flight/service.rs",
     "if fits(response.headers(), &varied, req.headers()) =>",
     "if true =>"),
    ("flight-method-not-in-key", "src/key.rs",
     "        if *method == http::Method::GET {",
     "        if true {"),
    ("flight-head-waits-for-the-body", "src/flight/body.rs",
     "                // Streaming: the head goes now, the rest as it comes.\n                return Poll::Ready(());",
     "                return Poll::Pending;"),
    ("flight-stream-over-cap-one-at-a-time", "src/flight/body.rs",
     "return sharing.take().map(|s| s.alone(\"the body is over the cap\"));",
     "return sharing.take().map(|s| s.next(\"the body is over the cap\"));"),
    ("flight-stream-without-deadline", "src/flight/body.rs",
     ".is_some_and(|s| s.deadline.as_mut().poll(cx).is_ready());",
     ".is_some_and(|s| s.deadline.as_mut().poll(cx).is_ready() && false);"),
    ("flight-hop-by-hop-headers-copied", "src/flight/response.rs",
     "                && !HOP_BY_HOP.contains(&name)",
     "                && true"),
    ("flight-memory-result-kept-without-waiters", "src/backend/memory/flight.rs",
     ".filter(|s| s.fresh_until > now || (waited && s.keep_until > now))",
     ".filter(|s| s.fresh_until > now || s.keep_until > now)"),
    ("flight-redis-result-kept-without-waiters", "src/backend/redis/flight_publish.lua",
     "if redis.call('EXISTS', watchers, queue) == 0 then",
     "if false then"),
    ("flight-postgres-result-kept-without-waiters", "src/backend/postgres/flight.sql",
     "      v_keep_ms := p_fresh_ms;",
     "      v_keep_ms := p_keep_ms;"),
    # etcd (feature `etcd`): caught by the behaviour suite's etcd instance
    # and tests/etcd_failover.rs.
    ("etcd-acquire-barges-past-the-queue", "src/backend/etcd/kinds.rs",
     "        when.push(self.nobody_queued());\n        when\n",
     "        when\n"),
    # A release that hands the lock on forgets only the released hold's own
    # expiry, not that of the new holder when it has the same owner
    # (fault-schedule seed 1172; behaviour
    # a_lock_handed_to_its_holders_owner_still_ends_at_its_ttl).
    ("etcd-release-forgets-the-handed-locks-expiry", "src/backend/etcd/ops.rs",
     "        self.shared.expiries.disarm_value(&h.key, &h.raw_value);\n",
     "        self.shared.expiries.disarm_range(b\"\", &[0xff]);\n"),
    # A waiter answered by a grant to its twin (a retry of the same request,
    # queued beside it) left its own entry queued, to be granted to no call
    # later (wait_test: a_retry_answered_by_its_twins_grant_leaves_the_queue).
    ("etcd-twins-entry-left-queued", "src/backend/etcd/wait.rs",
     "                    if queued {\n                        guard.answered = true;\n                    } else {\n",
     "                    if false {\n                        guard.answered = true;\n                    } else {\n"),
    # One key named twice with other settings took the first one's silently
    # (behaviour: one_key_in_both_scopes_is_refused).
    ("layer-one-key-twice-with-other-settings", "src/lock/acquire.rs",
     "(!alike).then_some(",
     "(!alike && false).then_some("),
    # A call of a request handed the lock and dropped before it read it gave
    # the hold back after a retry of the request had taken it over: two
    # holders (behaviour: a_dropped_call_never_gives_back_the_hold_its_retry_took;
    # etcd's shared retry rewrote its hold and reported another fence).
    ("memory-retry-takes-no-exclusive-hold", "src/backend/memory/take.rs",
     "entry.extra.get_or_insert_default().retaken = entry.fence;",
     "let _ = entry.extra.get_or_insert_default();"),
    ("memory-retry-takes-no-group-hold", "src/backend/memory/group.rs",
     "        hold.retaken = true;\n",
     ""),
    ("redis-retry-leaves-the-grant-to-the-ticket", "src/backend/redis/acquire.lua",
     "    if grant ~= '-' and grant ~= ticket then\n",
     "    if false and grant ~= '-' and grant ~= ticket then\n"),
    ("redis-hold-retry-leaves-the-grant-to-the-ticket", "src/backend/redis/acquire.lua",
     "    if grant ~= ticket then\n      grant = '-'\n",
     "    if false then\n      grant = '-'\n"),
    ("etcd-shared-retry-rewrites-its-hold", "src/backend/etcd/kinds.rs",
     "                when.push(Compare::create_revision(holder, CompareOp::Equal, 0));\n",
     ""),
    # A dropped waiter's leave gave back the hold it read by its fence: a
    # retry of the request that took the hold over after that read lost it
    # (leave_test: a_grant_a_retry_took_after_the_leave_read_it_is_not_passed_on).
    ("etcd-leave-gives-back-by-fence", "src/backend/etcd/leave.rs",
     "Giving::Value(&h.key, &h.raw_value)",
     "Giving::Fence(&h.key, h.fence)"),
    # A rewrite of our holder key taken for a hand-off to our entry
    # (wait_test: a_rewrite_of_our_holder_key_is_not_a_hand_off).
    ("etcd-rewrite-taken-for-a-hand-off", "src/backend/etcd/place.rs",
     "                && kv.create_revision() == kv.mod_revision()\n",
     ""),
    # A lock kept after the response, taken once the handler answered: its
    # owner token reached nobody (behaviour:
    # a_lock_kept_once_the_handler_answered_is_refused).
    ("locks-kept-after-the-head-left", "src/lock/registry.rs",
     "        self.answered && !auto_release\n",
     "        false && self.answered && !auto_release\n"),
    # A response sent without a body (HEAD, 204, 304) kept its locks until
    # its unread body was dropped, released from a task after the client had
    # it (behaviour: a_response_without_a_body_is_released_before_it_is_returned).
    ("layer-bodiless-response-guarded", "src/layer/future.rs",
     "Ok(res) if !res.body().is_end_stream() && !bodiless(res.status()) => {",
     "Ok(res) if !res.body().is_end_stream() && !(false && bodiless(res.status())) => {"),
    # A request of another kind under the same owner and attempt taken for a
    # retry of the hold: a writer beside readers (behaviour:
    # a_clone_of_another_kind_is_not_a_retry_of_the_hold).
    ("memory-retry-of-any-kind", "src/backend/memory/group.rs",
     ".filter(|g| g.kind == req.kind())",
     ""),
    ("memory-exclusive-retry-of-any-kind", "src/backend/memory/retry.rs",
     "            && req.kind() == LockKind::Exclusive\n",
     ""),
    ("redis-retry-of-any-kind", "src/backend/redis/acquire.lua",
     "  if value and redis.call('HGET', holds, 'k') ~= kind then\n",
     "  if false then\n"),
    ("postgres-retry-of-any-kind", "src/backend/postgres/functions.sql",
     "    IF FOUND AND r.kind = p_kind AND r.permits IS NOT DISTINCT FROM p_permits THEN\n",
     "    IF FOUND THEN\n"),
    # A dropped waiter's cleanup gave back a hold written again since its
    # hand-off (a retry's refresh in another process): two holders
    # (leave_test: a_grant_rewritten_since_its_hand_off_is_not_passed_on).
    ("etcd-leave-gives-back-a-rewritten-hold", "src/backend/etcd/leave.rs",
     "        if h.rewritten\n",
     "        if false\n"),
    # A waiting call's own attempt took the lock naming no ticket: dropped
    # before it read the reply, its leave left the lock held until its TTL
    # (redis leave_test: a_lock_a_dropped_waiters_own_attempt_took_is_given_back).
    ("redis-own-take-names-no-ticket", "src/backend/redis/ops.rs",
     "        let sent = acquire_args(&mut inv, req, ttl_ms, ticket.as_deref());\n",
     "        let sent = acquire_args(&mut inv, req, ttl_ms, ticket.as_deref().filter(|_| false));\n"),
    ("redis-own-slow-take-names-no-ticket", "src/backend/redis/acquire.lua",
     "        f = take(owner, attempt, ttl, now, '0', grant_mine)\n",
     "        f = take(owner, attempt, ttl, now, '0', '-')\n"),
    # A retry took the hold handed to its request's other call, leaving its
    # own idle for a TTL (postgres_races:
    # a_retry_takes_the_hold_handed_to_its_own_ticket).
    ("postgres-retry-takes-the-oldest-hold", "src/backend/postgres/functions.sql",
     "      ORDER BY (d.granted_to IS NOT DISTINCT FROM p_channel || ' ' || p_ticket) DESC,\n               (d.granted_to IS NULL) DESC, d.fence DESC\n      LIMIT 1;",
     "      ORDER BY d.fence LIMIT 1;"),
    # A claim of the only shared hold emptied the expiry index (deleted) and
    # made it again without a TTL (redis_kinds:
    # a_claimed_only_hold_keeps_its_index_expiring).
    ("redis-claim-index-made-without-ttl", "src/backend/redis/claim.lua",
     "    redis.call('ZADD', expiries, expiry, f)\n    drop_hold(old, value)\n",
     "    drop_hold(old, value)\n    redis.call('ZADD', expiries, expiry, f)\n"),
    # A hold a waiting call takes directly named no ticket: dropped before it
    # read the reply, its leave left the lock held until its TTL
    # (postgres_races: a_lock_a_dropped_waiters_own_attempt_took_is_given_back).
    ("postgres-own-take-names-no-ticket", "src/backend/postgres/functions.sql",
     "  -- should the call be dropped before it reads this reply.\n  v_grant text := CASE WHEN p_wait_ms > 0",
     "  -- should the call be dropped before it reads this reply.\n  v_grant text := CASE WHEN false"),
    ("postgres-own-statement-take-names-no-ticket", "src/backend/postgres/statements.rs",
     "                       CASE WHEN $5::bigint > 0 AND $7::bigint IS NOT NULL \\\n",
     "                       CASE WHEN false AND $7::bigint IS NOT NULL \\\n"),
    # A claiming leave whose reply was lost: the plain leave after it did not
    # match the claimed grant ('c …'), held until its TTL (postgres_races:
    # a_claim_whose_reply_was_lost_is_given_back_by_the_leave_after_it).
    ("postgres-leave-ignores-its-lost-claim", "src/backend/postgres/functions.sql",
     "          OR r.granted_to = 'c ' || p_channel || ' ' || p_ticket) THEN\n",
     "          OR (p_claim AND r.granted_to = 'c ' || p_channel || ' ' || p_ticket)) THEN\n"),
    ("postgres-hold-leave-ignores-its-lost-claim", "src/backend/postgres/functions.sql",
     "             OR y.granted_to = 'c ' || p_channel || ' ' || p_ticket);\n",
     "             OR (p_claim AND y.granted_to = 'c ' || p_channel || ' ' || p_ticket));\n"),
    ("postgres-own-kind-take-names-no-ticket", "src/backend/postgres/functions.sql",
     "  -- As in _acquire: a hold a waiting call takes names its ticket.\n  v_grant text := CASE WHEN p_wait_ms > 0",
     "  -- As in _acquire: a hold a waiting call takes names its ticket.\n  v_grant text := CASE WHEN false"),
    # A waiting call of a request whose twin was handed the lock waited out
    # its max wait (behaviour: a_waiting_retry_answers_with_its_twins_grant).
    ("memory-twin-waits-out-its-max-wait", "src/backend/memory/queue.rs",
     "        if occupied.get().holds_for(req, now) {\n",
     "        if false && occupied.get().holds_for(req, now) {\n"),
    ("etcd-release-without-hand-off", "src/backend/etcd/ops.rs",
     "            .when([when, keys.nobody_queued()])",
     "            .when([when])"),
    ("etcd-hand-off-to-a-waiter-past-its-deadline", "src/backend/etcd/handoff.rs",
     "if w.value.is_past() || holds_already(",
     "if holds_already("),
    ("etcd-ttl-kept-by-the-lease-only", "src/backend/etcd/expiry.rs",
     "            deadline,\n        ));\n        let mut armed",
     "            deadline + std::time::Duration::from_secs(3600),\n        ));\n        let mut armed"),
    ("etcd-flight-result-kept-without-waiters", "src/backend/etcd/flight.rs",
     "            if publish.result_ttl.is_zero() {\n                let forget",
     "            if false {\n                let forget"),
    ("etcd-flight-result-kept-until-its-lease-ends", "src/backend/etcd/flight.rs",
     "        expiries.arm_delete(self, keys.result(), value.clone(), kept_until);",
     "        let _ = kept_until;"),
    # etcd's shared holds and permits (issue 23; MUTANTS_TESTS=behaviour
    # MUTANTS_FILTER=etcd:: scripts/mutants.py kinds-etcd).
    # A flight's result that came (and went) between a follower's begin and
    # its watch: the gap watch from the begin's revision (the lib's
    # flight_gap_test).
    ("etcd-flight-gap-not-watched", "src/backend/etcd/flight.rs",
     "Note::Created(at) if at > rev && gap.is_none() => {",
     "Note::Created(at) if false && at > rev && gap.is_none() => {"),
    # A cancelled waiter with nothing in flight leaves once, and no task
    # outlives the leave (etcd_failover's cancelled_waiters_leave_no_task_behind).
    ("etcd-cancelled-waiter-sleeps-to-its-deadline", "src/backend/etcd/leave.rs",
     "            if in_flight {\n                leave.late(until).await;",
     "            if true {\n                leave.late(until).await;"),
    # A dropped waiter whose queueing attempt lands after its leave leaves
    # again when it lands (or the lock is handed to it), not only at its
    # deadline; and a timer the dropped call armed for a grant it never made
    # is no sign that this process holds a lock handed to the entry (the
    # lib's etcd leave_test).
    ("etcd-dropped-waiter-leaves-again-only-at-its-deadline", "src/backend/etcd/leave.rs",
     "        while Instant::now() < deadline {\n",
     "        sleep_until(deadline).await;\n        while Instant::now() < deadline {\n"),
    # A dropped call's late leave ended 10 ms after its deadline by its own
    # clock: a releaser whose clock is behind hands the lock to an entry
    # landing after that, held while the process lives (leave_test:
    # a_late_entry_handed_the_lock_by_a_releaser_whose_clock_is_behind_is_left).
    ("etcd-late-leave-ends-at-the-deadline", "src/backend/etcd/leave.rs",
     "            + LATE_MARGIN;",
     "            + Duration::from_millis(10);"),
    ("etcd-leave-passes-on-a-live-retrys-grant", "src/backend/etcd/leave.rs",
     "            || self.shared.waits.has(mine)\n",
     "            || false\n"),
    # A grant to another process's entry (a retry of the same request there)
    # passed on by this process's leave of the dropped first call (leave_test:
    # a_grant_to_a_retrys_entry_in_another_process_is_not_passed_on).
    ("etcd-leave-passes-on-another-processs-grant", "src/backend/etcd/leave.rs",
     "            || self.shared.leases.known_until(h.lease).is_none()\n",
     "            || false\n"),
    # A retry answering with a hold handed through its twin's entry (the
    # request's first call, dropped, in another process) as it was read:
    # that call's leave passes it on (wait_test:
    # a_retry_handed_its_twins_grant_in_another_process_takes_it_over and
    # a_retry_giving_up_on_its_twins_grant_in_another_process_takes_it_over).
    ("etcd-waiter-answers-with-a-twins-grant-as-read", "src/backend/etcd/wait.rs",
     "                if self.must_take_over(h, queued, kv.lease()) {",
     "                if false {"),
    ("etcd-give-up-answers-with-a-twins-grant-as-read", "src/backend/etcd/wait.rs",
     "            if self.must_take_over(h, false, *lease) {",
     "            if false {"),
    # A hold the twin rewrote since its hand-off (its extension) taken over
    # with our shorter TTL: it ends sooner than the twin was told (wait_test:
    # a_retry_leaves_a_hold_its_twin_extended_as_it_is).
    ("etcd-waiter-takes-over-a-rewritten-hold", "src/backend/etcd/wait.rs",
     "        !ours && !h.rewritten",
     "        !ours"),
    ("etcd-leave-trusts-any-timer", "src/backend/etcd/expiry.rs",
     ".is_some_and(|t| t.iter().any(|t| *t.value == *value))",
     ".is_some_and(|t| !t.is_empty() || value.is_empty())"),
    # A release that starts from the state this process's hand-off read
    # (`Handed`): a stale one must be checked again by the hand-off's
    # conditions, and a hold it no longer shows answered as the plain
    # release would (the behaviour suite's a_release_after_*;
    # MUTANTS_TESTS=behaviour MUTANTS_FILTER=a_release_after).
    ("etcd-kept-hand-off-trusts-its-head", "src/backend/etcd/handoff.rs",
     "            when.push(Compare::mod_revision(\n                head.key.clone(),\n                CompareOp::Equal,\n                head.mod_revision,\n            ));\n",
     ""),
    ("etcd-kept-hand-off-release-answers-for-a-lost-hold", "src/backend/etcd/ops.rs",
     "(see `Handed`).\n            let from = Giving::Fence(&h.key, h.fence);\n"
     "            if self.pass_on(&keys, snapshot, from, &[], end).await? == Passed::Done {",
     "(see `Handed`).\n            let from = Giving::Fence(&h.key, h.fence);\n"
     "            if self.pass_on(&keys, snapshot, from, &[], end).await? != Passed::Done || true {"),
    # A waiter's watch, kept across a re-join, delivering the hand-off to
    # the entry it lost (the checker's etcd seed 2012; the lib's wait_test).
    ("etcd-waiter-takes-a-stale-hand-off", "src/backend/etcd/place.rs",
     "                && kv.mod_revision() > place.read_at\n",
     ""),
    ("kinds-etcd-mismatch-not-refused", "src/backend/etcd/take.rs",
     "} else if mismatched(kind, &snapshot.holders) {",
     "} else if false {"),
    ("kinds-etcd-mismatch-queues", "src/backend/etcd/take.rs",
     ".when(keys.no_other_family(kind))",
     ".when(Vec::<etcd_client::Compare>::new())"),
    ("kinds-etcd-permits-over-n", "src/backend/etcd/kinds.rs",
     "Some(held) => kind.fits_beside(held, holders.len()),",
     "Some(held) => kind.fits_beside(held, holders.len().saturating_sub(1)),"),
    ("kinds-etcd-shared-beside-a-writer", "src/backend/etcd/kinds.rs",
     "                when.push(empty(start, end));\n",
     "                let _ = (start, end);\n"),
    ("kinds-etcd-permit-taken-without-the-read", "src/backend/etcd/kinds.rs",
     "when.push(Compare::mod_revision(start, CompareOp::Less, at + 1).with_range(end));",
     "let _ = (start, end, at);"),
    ("kinds-etcd-newcomer-permit-barges-past-the-queue", "src/backend/etcd/take.rs",
     "} else if snapshot.head.is_some() || !fits(kind, &snapshot.holders) {",
     "} else if !fits(kind, &snapshot.holders) {"),
    ("kinds-etcd-hand-off-grants-one-reader", "src/backend/etcd/handoff.rs",
     "                    given = true;\n                    from = Giving::Nothing;\n",
     "                    return Ok(Passed::Done);\n"),
    ("kinds-etcd-force-release-frees-one-hold", "src/backend/etcd/handoff.rs",
     "            Giving::All => true,\n            Giving::Nothing => false,\n        }",
     "            Giving::All => !std::ptr::eq(h, h),\n            Giving::Nothing => false,\n        }"),
    # A permit or shared hold this process wrote, given back in one
    # transaction when nobody waits; permit releases into a queue taking
    # turns from the last grant's state (2026-11-30).
    ("kinds-etcd-known-release-frees-every-hold", "src/backend/etcd/ops.rs",
     "            ops = vec![TxnOp::delete(hold.clone(), None)];",
     "            ops = vec![delete_range(keys.holders().0, keys.holders().1)];"),
    ("kinds-etcd-known-release-ignores-the-queue", "src/backend/etcd/ops.rs",
     "            when = compare;",
     "            when = compare;\n            let txn = Txn::new().when([when]).and_then(ops);\n"
     "            self.shared.conn.txn(WHAT, txn, end).await?;\n            return Ok(());"),
    ("kinds-etcd-turn-hands-on-another-hold", "src/backend/etcd/passing.rs",
     "        let h = last.find(holder)?;",
     "        let _ = holder;\n        let h = last.holders.first()?;"),
    # etcd: grants and queue heads told in this process (near.rs)
    ("etcd-near-grant-untold", "src/backend/etcd/handoff.rs",
     "                        self.shared.near.grant(&head.key, h.clone(), head.lease);",
     "                        let _ = (h, head.lease);"),
    ("etcd-near-head-untold", "src/backend/etcd/handoff.rs",
     "                        self.shared.near.head(&next.key, snapshot.at);",
     "                        let _ = next;"),
    ("etcd-near-left-entry-still-told", "src/backend/etcd/near.rs",
     "        self.map().remove(entry);\n    }",
     "        let _ = entry;\n    }"),
    # etcd and Redis: work retried through an outage goes when the server
    # answers (backend/retry.rs)
    ("etcd-retry-sleeps-out-its-pause", "src/backend/retry.rs",
     "                Ok(()) = self.back.changed() => self.cut = true,",
     "                Ok(()) = std::future::pending::<Result<(), ()>>() => self.cut = true,"),
    ("etcd-retry-cuts-every-pause", "src/backend/retry.rs",
     "        if std::mem::take(&mut self.cut) {",
     "        if std::mem::take(&mut self.cut) && false {"),
    ("etcd-conn-never-says-it-is-back", "src/backend/etcd/conn.rs",
     "        self.answers.answered();",
     "        let _ = &self.answers;"),
    ("redis-conn-never-says-it-is-back", "src/backend/redis/conn.rs",
     "                    self.answers.answered();\n                    return Ok((value, retried));",
     "                    return Ok((value, retried));"),
    ("redis-leave-sleeps-out-its-pause", "src/backend/retry.rs",
     "                if timeout_at(until, retry.pause()).await.is_err() {",
     "                if timeout_at(until, tokio::time::sleep_until(until)).await.is_err() {"),
    # etcd: a release disarms only the expiries of what it deleted
    ("etcd-release-disarms-the-owners-range", "src/backend/etcd/ops.rs",
     "                .disarm_through(&disarm.0, &disarm.1, at);",
     "                .disarm_range(&disarm.0, &disarm.1);"),
    ("etcd-release-disarms-nothing", "src/backend/etcd/ops.rs",
     "                .disarm_through(&disarm.0, &disarm.1, at);",
     "                .disarm_through(&disarm.0, &disarm.1, -1);"),
    ("etcd-near-tells-a-fitting-waiter-to-wait", "src/backend/etcd/handoff.rs",
     "                        && !fits(next.value.kind, snapshot.holders.iter())\n",
     "                        && (true || !fits(next.value.kind, snapshot.holders.iter()))\n"),
    # etcd: a waiter's re-read from any member, at or past what woke it
    ("etcd-look-takes-a-read-behind-its-wake", "src/backend/etcd/wait.rs",
     "            if at_least.take().is_some_and(|r| read_at < r) {",
     "            if at_least.take().is_some_and(|r| read_at < r && false) {"),
    ("etcd-look-always-serializable", "src/backend/etcd/wait.rs",
     "            let serializable = at_least.is_some();",
     "            let serializable = true;"),
    # Redis: a first queueing sent twice still counts as the call's entry
    ("postgres-wait-first-entry-sent-twice-not-counted", "src/backend/postgres/wait.rs",
     "                        entries = entries.max(1);",
     "                        let _ = entries;"),
    ("postgres-sweep-waits-for-held-entries", "src/backend/postgres/functions.sql",
     "        WHERE d.ctid >= v_lo AND d.ctid < v_hi AND d.deadline < v_now - interval '1 minute'\n        FOR UPDATE SKIP LOCKED));",
     "        WHERE d.ctid >= v_lo AND d.ctid < v_hi AND d.deadline < v_now - interval '1 minute'\n        FOR UPDATE));"),
    # Redis: a dropped waiter's leave also goes on the current connection
    ("redis-dropped-leave-only-behind-stalled-attempt", "src/backend/redis/wait.rs",
     "                if backend.shared.trails.of(owner).is_some() {",
     "                if false && backend.shared.trails.of(owner).is_some() {"),
    ("redis-leave-now-goes-behind-too", "src/backend/redis/ops.rs",
     "            LeaveMode::DropNow => self.shared.conn.eval(&inv, end).await?,",
     "            LeaveMode::DropNow => self.cleanup(&inv, owner, end).await?,"),
    # etcd: a lease grant dropped mid-way leaves the next call to grant
    ("etcd-abandoned-grant-blocks-its-bucket", "src/backend/etcd/leases.rs",
     "                let mut abandoned = Abandoned(Some(&bucket));",
     "                let mut abandoned = Abandoned(None::<&Bucket>);"),
    # etcd: an extension disarms only the timers of writes that landed before it
    ("etcd-extend-disarms-unlanded-timers", "src/backend/etcd/expiry.rs",
     "                let goes = t.landed.is_some_and(|l| l < at);",
     "                let goes = t.landed.is_none_or(|l| l < at);"),
    # A restore dropped after its claim gives the lock back
    ("restore-claim-not-given-back", "src/lock/owned.rs",
     "            kept: false,",
     "            kept: true,"),
    # One key names one lock of a request, in any Unicode form
    ("locks-duplicate-key-not-normalised", "src/lock/registry.rs",
     "        let key = nfc(spec.get_key()).into_owned();",
     "        let key = spec.get_key().to_owned();"),
    ("locks-concurrent-same-key-not-reserved", "src/lock/registry.rs",
     "            let taken = state.acquiring.contains(&key);",
     "            let taken = false;"),
    # PostgreSQL: a claiming leave sent twice answers the claim twice
    ("postgres-claiming-leave-forgets-its-claim", "src/backend/postgres/functions.sql",
     "      UPDATE \"{schema}\".\"{table}\" AS l SET granted_to = 'c ' || p_channel || ' ' || p_ticket",
     "      UPDATE \"{schema}\".\"{table}\" AS l SET granted_to = NULL"),
    # PostgreSQL: the head leaving tells the next head
    ("postgres-leave-tells-no-new-head", "src/backend/postgres/functions.sql",
     "  IF v_left THEN\n    PERFORM \"{schema}\".\"{table}_nudge\"(p_key, p_channel, p_ticket);\n  END IF;\nEND",
     "END"),
    # An undecodable path parameter never runs the handler unlocked
    ("layer-undecodable-param-runs-unlocked", "src/layer/service.rs",
     "        if read.undecodable {",
     "        if false && read.undecodable {"),
    # Single-flight: a dropped begin, or a dropped waiter holding the lock, gives it back
    ("flight-dropped-begin-keeps-the-lock", "src/flight/engine.rs",
     "        req: &req,\n        done: false,\n    };",
     "        req: &req,\n        done: true,\n    };"),
    ("flight-dropped-waiter-keeps-the-lock", "src/flight/engine.rs",
     "            release_detached(self.0, smallvec::smallvec![lock]);",
     "            std::mem::forget(lock);"),
    # A garbled stored frame is no frame, never a panic
    ("flight-frame-capacity-panics", "src/flight/frame.rs",
     "    let mut headers = HeaderMap::try_with_capacity(count.min(buf.len() / 8)).ok()?;",
     "    let mut headers = HeaderMap::with_capacity(count.min(buf.len() / 8));"),
    # PostgreSQL single-flight: a result published while the begin waited answers it
    ("postgres-flight-begin-misses-a-publish-it-waited-for", "src/backend/postgres/flight.sql",
     "  IF FOUND THEN\n    IF a.code = 1 THEN",
     "  IF FOUND AND false THEN\n    IF a.code = 1 THEN"),
    # A token's hold never outlasts its lock; an endless wait's index expires
    ("restore-hold-past-the-locks-end", "src/lock/owned.rs",
     "        let hold_until = token.hold_left().map(|left| sent + left.min(claimed.ttl));",
     "        let hold_until = token.hold_left().map(|left| sent + left);"),
    ("redis-index-endless-wait-unbounded", "src/backend/redis/extras.rs",
     "            let max_wait = ceil_ms(req.max_wait().min(crate::spec::MAX_TTL));",
     "            let max_wait = ceil_ms(req.max_wait());"),
    # Owner tokens stay out of Debug output
    ("token-debug-shows-owner", "src/lock/token.rs",
     "            .field(\"owner\", &\"<redacted>\")",
     "            .field(\"owner\", &self.owner)"),
    ("request-debug-shows-owner", "src/spec/request.rs",
     "            .field(\"owner\", &\"<redacted>\")",
     "            .field(\"owner\", &self.owner)"),
    # The admin API decodes the key in its path strictly
    ("admin-path-key-decoded-leniently", "src/admin.rs",
     "    crate::percent::decode_strict(raw).ok_or(LockError::InvalidKey(",
     "    crate::percent::decode_lenient(raw).map(|k| k.into_owned()).ok_or(LockError::InvalidKey("),
    ("status-debug-shows-owner", "src/backend/lease.rs",
     "        f.debug_struct(\"LockStatus\")\n            .field(\"owner\", &\"<redacted>\")",
     "        f.debug_struct(\"LockStatus\")\n            .field(\"owner\", &self.owner)"),
    ("flight-unreachable-begin-not-given-back", "src/flight/engine.rs",
     "    beginning.done = !matches!(started, Err(LockError::BackendUnavailable(_)));",
     "    beginning.done = true;"),
    # A release within the minimum hold waits for a renewal under way
    ("min-hold-release-ignores-renewal-in-flight", "src/lock/release.rs",
     "        Some(signal) => Some(signal.extending().await),",
     "        Some(_) => None::<()>,"),
    ("restore-given-back-ignores-min-hold", "src/lock/owned.rs",
     "            let hold = self.hold_until.map(MinHold::until);",
     "            let hold = self.hold_until.map(MinHold::until).filter(|_| false);"),
    # Owner index: a lookup during a wait keeps the waiter's entry
    ("redis-owner-index-drops-waiting-entry", "src/backend/redis/owners.lua",
     "  if untl >= tonumber(ARGV[3]) then",
     "  if false then"),
    ("etcd-owner-index-drops-waiting-entry", "src/backend/etcd/lookup.rs",
     "                Some(lock) if self.wanted_by(&lock, owner, end).await? => {}",
     "                Some(lock) if false && self.wanted_by(&lock, owner, end).await? => {}"),
    # PostgreSQL: a cleanup waits for the call that timed out before it
    ("postgres-timed-out-connection-not-drained", "src/backend/postgres/conn.rs",
     "                    self.drain(caller, index, generation, live.clone(), op_timeout);",
     "                    let _ = (caller, live.clone());"),
    ("postgres-drain-not-waited-for", "src/backend/postgres/pins.rs",
     "                match pin.and_then(|p| map.draining(p.slot, p.generation, Instant::now())) {",
     "                match pin.and_then(|p| map.draining(p.slot, p.generation, Instant::now())).filter(|_| false) {"),
    ("postgres-drain-pins-dropped-by-next-connection", "src/backend/postgres/pins.rs",
     "                || draining.iter().any(|d| d.covers(p.slot, p.generation, now))",
     "                || false"),
    ("postgres-drain-ends-later-pins", "src/backend/postgres/pins.rs",
     "            .retain(|_, p| (p.slot, p.generation) != (slot, generation) || p.made > since);",
     "            .retain(|_, p| (p.slot, p.generation) != (slot, generation));"),
    ("postgres-cleanup-after-drain-without-own-budget", "src/backend/postgres/conn.rs",
     "                        if waited {",
     "                        if false && waited {"),
    ("postgres-drain-nobody-ends-lasts-forever", "src/backend/postgres/pins.rs",
     "            until: now + bound,",
     "            until: now + bound * 1000,"),
    ("postgres-op-timeout-unbounded", "src/backend/postgres/build.rs",
     "        self.op_timeout = op_timeout.clamp(Duration::from_millis(1), MAX_TTL);",
     "        self.op_timeout = op_timeout.max(Duration::from_millis(1)).max(MAX_TTL.min(Duration::ZERO));"),
    # Redis: a dropped waiter's late attempt takes nothing
    ("redis-late-attempt-ignores-the-mark", "src/backend/redis/acquire.lua",
     "if ARGV[5] and ARGV[5] ~= '' and ARGV[3] ~= '0' and redis.call('ZSCORE'",
     "if false and ARGV[5] and redis.call('ZSCORE'"),
    ("redis-drop-leave-marks-nothing", "src/backend/redis/leave.lua",
     "if ARGV[4] == 'drop' then\n  -- The waiter is gone for good.",
     "if false then\n  -- The waiter is gone for good."),
    ("redis-re-check-sent-twice-counts-no-entry", "src/backend/redis/wait.rs",
     "entries = (entries + u32::from(queued_anew || sent_twice)).max(1);",
     "entries = (entries + u32::from(queued_anew)).max(1);"),
    ("redis-index-drop-sent-twice", "src/backend/redis/extras.rs",
     "        if let Index::Drop(_) = op {",
     "        if let (Index::Drop(_), false) = (op, true) {"),
    # inputs: a route is checked as a key is; `force` read strictly
    ("key-route-unchecked", "src/key.rs",
     "        if has_control(route) {",
     "        if false && has_control(route) {"),
    ("admin-force-read-loosely", "src/admin.rs",
     "        _ => {\n            return error_response(\n                StatusCode::BAD_REQUEST,\n                \"LOCK_INVALID_QUERY\",",
     "        _ if true => false,\n        _ => {\n            return error_response(\n                StatusCode::BAD_REQUEST,\n                \"LOCK_INVALID_QUERY\","),
    ("client-headers-without-key-pass", "src/client/mod.rs",
     "            if lock_headers.iter().any(|name| headers.contains_key(*name)) {",
     "            if false && lock_headers.iter().any(|name| headers.contains_key(*name)) {"),
    ("locks-extend-lands-on-any-lock-of-the-key", "src/lock/registry.rs",
     "                    && s.lock.lease.fence == lock.lease.fence\n                    && s.lock.owner == lock.owner",
     "                    && (true || s.lock.lease.fence == lock.lease.fence)\n                    && (true || s.lock.owner == lock.owner)"),
    ("postgres-dropped-waiters-leave-tried-once", "src/backend/postgres/wait.rs",
     "            leave_until(None, key, until, || async {",
     "            leave_until(None, key, Instant::now(), || async {"),
    ("watchdog-renewal-scheduled-at-round-end", "src/watchdog/renew.rs",
     "                            this.apply(d, sent, result);\n                            // Scheduled at once:",
     "                            this.apply(d, sent, result);\n                            return;\n                            // Scheduled at once:"),
    ("owned-extend-leaves-the-ttl-to-the-backend", "src/lock/held.rs",
     "        crate::spec::validate_ttl(ttl)?;\n        // Never beside a watchdog renewal",
     "        // Never beside a watchdog renewal"),
    ("layer-kept-lock-kept-without-an-answer", "src/lock/release.rs",
     "            answered: false,",
     "            answered: true,"),
    ("layer-one-key-two-kinds-takes-the-first", "src/lock/acquire.rs",
     "                if a.kind() != b.kind() {\n",
     "                if false && a.kind() != b.kind() {\n"),
    ("layer-declared-length-not-the-end", "src/layer/body.rs",
     "    if len == 0 {\n        return false;\n    }\n    *n = n.saturating_sub(len);",
     "    if len == 0 || true {\n        return false;\n    }\n    *n = n.saturating_sub(len);"),
    # A shared key's row left to end with the hold that put it in while a
    # longer one lives: the sweep deletes it, a writer joins the reader
    # (postgres_races: a_sweep_leaves_a_shared_key_held_past_the_hold_that_put_its_row_in).
    ("postgres-kinds-fast-acquire-row-ends-with-its-first-hold", "src/backend/postgres/functions.sql",
     "        WHERE l.key = p_key AND l.expires_at < v_now + v_ttl;",
     "        WHERE l.key = p_key AND l.expires_at < v_now + v_ttl AND false;"),
    # A force release of a shared key answering from its row's expiry, which
    # may outlive its holds: "held" with every hold run out (postgres_races:
    # a_force_release_of_a_shared_key_whose_holds_ran_out_holds_nothing).
    ("postgres-force-release-judged-by-the-row", "src/backend/postgres/functions.sql",
     "    SELECT max(gone.expires_at) INTO r.expires_at FROM gone;",
     "    SELECT max(gone.expires_at) INTO h FROM gone;"),
    # A body sent chunked (a `Transfer-Encoding` header) released at a
    # `Content-Length` it also declares, mid-body (behaviour:
    # a_chunked_body_keeps_its_lock_past_a_declared_length).
    ("layer-chunked-body-released-at-its-declared-length", "src/layer/future.rs",
     "http1 && !headers.contains_key(http::header::TRANSFER_ENCODING)",
     "http1 || !headers.contains_key(http::header::TRANSFER_ENCODING)"),
    # A declared length read before the body's exact size (which hyper
    # frames it by): released a frame late, after the server stopped reading
    # (behaviour: a_body_of_known_size_is_released_at_that_size).
    ("layer-declared-length-before-the-exact-size", "src/layer/future.rs",
     "                                .exact()\n                                .or_else(|| {",
     "                                .exact()\n                                .filter(|_| false)\n                                .or_else(|| {"),
    ("layer-kept-lock-kept-while-the-response-is-unsent", "src/layer/future.rs",
     "                        unsent = Unsent(guard.locks().cloned());",
     "                        unsent = Unsent(guard.locks().cloned().filter(|_| false));"),
    # single-flight: a response reaches only the leader's credentials
    ("flight-shares-across-credentials", "src/flight/fit.rs",
     "    if !names.contains(&AUTHORIZATION) && crossing_lifetime(response).is_none() {",
     "    if false && !names.contains(&AUTHORIZATION) && crossing_lifetime(response).is_none() {"),
    ("flight-keeps-credentials-as-they-are", "src/flight/fit.rs",
     "        if CREDENTIALS.contains(name) {",
     "        if false && CREDENTIALS.contains(name) {"),
    ("flight-public-response-not-for-anyone", "src/flight/fit.rs",
     "if d.eq_ignore_ascii_case(\"public\")",
     "if d.eq_ignore_ascii_case(\"-public\")"),
    ("flight-stored-response-for-no-cache", "src/flight/service.rs",
     "        let refused = stored.then_some(refuses).flatten();",
     "        let refused = (stored && false).then_some(refuses).flatten();"),
    ("flight-no-cache-stays-out-of-flights", "src/flight/service.rs",
     "        let refused = stored.then_some(refuses).flatten();",
     "        let refused = refuses;"),
    # apalis tasks (feature `apalis`)
    ("apalis-task-token-not-read", "src/job/apalis.rs",
     "        self.args.lock_token()",
     "        None"),
    ("apalis-lock-not-in-task-data", "src/job/apalis.rs",
     "        self.inject_data(lock.clone());",
     "        let _ = lock.clone();"),
    ("apalis-lock-not-given-to-args", "src/job/apalis.rs",
     "        self.args.set_lock(lock);",
     "        let _ = lock;"),
    ("apalis-task-error-wrapped", "src/job/apalis.rs",
     "        JobError::Job(e) => e.into(),",
     "        JobError::Job(e) => Box::new(AbortError::new(e)),"),
    ("apalis-spent-token-retried", "src/job/apalis.rs",
     "        JobError::Lock(e) => Box::new(AbortError::new(e)),",
     "        JobError::Lock(e) => Box::new(e),"),
    ("apalis-unreachable-backend-aborted", "src/job/apalis.rs",
     "        JobError::Lock(e @ LockError::BackendUnavailable(_)) => Box::new(e),\n",
     ""),
    # PostgreSQL's fast path for releasing a shared hold or permit
    # (MUTANTS_TESTS="postgres_races behaviour" MUTANTS_FILTER="the_last_holds
    # a_stalled_acquire take_whose_reply postgres::" scripts/mutants.py postgres-kinds-fast).
    # A release deciding on what it saw before it waited for the key's row
    # (one statement): the last two holds released together keep the row.
    ("postgres-kinds-fast-release-in-one-statement", "src/backend/postgres/functions.sql",
     """    DELETE FROM "{schema}"."{table}_holds" AS x USING a
      WHERE x.key = a.key AND x.owner = p_owner AND x.fence = p_fence
      RETURNING x.expires_at INTO r.expires_at;
    IF FOUND THEN
      WITH gone AS (
        DELETE FROM "{schema}"."{table}" AS l
          WHERE l.key = p_key
            AND NOT EXISTS (SELECT 1 FROM "{schema}"."{table}_holds" AS y
                            WHERE y.key = p_key AND y.expires_at > v_now)
          RETURNING l.key)
      DELETE FROM "{schema}"."{table}_holds" AS x USING gone WHERE x.key = gone.key;
""",
     """    , d AS (DELETE FROM "{schema}"."{table}_holds" AS x USING a
      WHERE x.key = a.key AND x.owner = p_owner AND x.fence = p_fence
      RETURNING x.expires_at, x.fence),
      gone AS (
        DELETE FROM "{schema}"."{table}" AS l USING d
          WHERE l.key = p_key
            AND NOT EXISTS (SELECT 1 FROM "{schema}"."{table}_holds" AS y
                            WHERE y.key = p_key AND y.fence <> d.fence AND y.expires_at > v_now)
          RETURNING l.key),
      rest AS (DELETE FROM "{schema}"."{table}_holds" AS x USING gone, d
               WHERE x.key = gone.key AND x.fence <> d.fence)
    SELECT d.expires_at INTO r.expires_at FROM d;
    IF FOUND THEN
"""),
    ("postgres-kinds-fast-release-ignores-the-queue", "src/backend/postgres/functions.sql",
     "        WHERE l.key = p_key AND l.kind <> 0 AND NOT l.queued FOR UPDATE)",
     "        WHERE l.key = p_key AND l.kind <> 0 FOR UPDATE)"),
    ("postgres-kinds-fast-release-ignores-owner", "src/backend/postgres/functions.sql",
     "      WHERE x.key = a.key AND x.owner = p_owner AND x.fence = p_fence",
     "      WHERE x.key = a.key AND x.fence = p_fence"),
    ("postgres-kinds-fast-release-keeps-the-last-row", "src/backend/postgres/functions.sql",
     "            AND NOT EXISTS (SELECT 1 FROM \"{schema}\".\"{table}_holds\" AS y\n                            WHERE y.key = p_key AND y.expires_at > v_now)\n          RETURNING l.key)",
     "            AND false\n          RETURNING l.key)"),
    ("postgres-kinds-fast-release-drops-a-live-row", "src/backend/postgres/functions.sql",
     "            AND NOT EXISTS (SELECT 1 FROM \"{schema}\".\"{table}_holds\" AS y\n                            WHERE y.key = p_key AND y.expires_at > v_now)\n          RETURNING l.key)",
     "          RETURNING l.key)"),
    # The acquire function's own fast path (a shared hold's, a flight's).
    ("postgres-function-fence-drawn-before-the-insert", "src/backend/postgres/functions.sql",
     "    IF FOUND THEN\n      IF fence <> pg_sequence_last_value(",
     "    IF FOUND THEN\n      IF false AND fence <> pg_sequence_last_value("),
    # A waiter leaving a key whose holder ran out handed it to nobody: the
    # waiter behind it waited for its own re-check (redis::leave_test).
    ("redis-leave-leaves-a-free-key-idle", "src/backend/redis/leave.lua",
     "if current then\n  return {0, redis.call('PTTL', lock)}\nend\n-- Shared holds or permits:",
     "if current or redis.call('EXISTS', holds) == 0 then\n  return {0, redis.call('PTTL', lock)}\nend\n-- Shared holds or permits:"),
    # A shared/permit key whose last waiter left kept its queued mark: its
    # releases and acquires took the slow paths for as long as it was held
    # (postgres_races: a_key_whose_last_waiter_gave_up_is_no_longer_marked_queued).
    ("postgres-kinds-settle-keeps-the-queued-mark", "src/backend/postgres/functions.sql",
     "    UPDATE \"{schema}\".\"{table}\" AS l SET expires_at = v_last,\n        queued = EXISTS",
     "    UPDATE \"{schema}\".\"{table}\" AS l SET expires_at = v_last,\n        queued = queued OR EXISTS"),
]


def run_tests(step):
    """Run one step's tests; stop at the first failing test (one is enough
    to catch a mutant, and a filtered target of hundreds of tests otherwise
    runs on for minutes)."""
    started = time.monotonic()
    # In a session of its own, so that stopping it stops the test binaries
    # cargo started too (killing cargo alone left a hung one running, with
    # its servers, for hours).
    proc = subprocess.Popen(command(step), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    timer = threading.Timer(TIMEOUT_S, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    lines, failed = [], None
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("test ") and line.rstrip().endswith(" ... FAILED"):
                failed = line[len("test "):-len(" ... FAILED\n")].strip()
                os.killpg(proc.pid, signal.SIGKILL)
                break
        proc.wait()
    finally:
        timer.cancel()
        # Stopped early (a failure, SIGTERM, Ctrl-C): its tests go too.
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    secs, out = time.monotonic() - started, "".join(lines)
    if failed is not None:
        return "failed", secs, failed
    if proc.returncode == 0:
        return "passed", secs, out
    if "error[E" in out or "could not compile" in out:
        return "no-build", secs, out
    if proc.returncode == -signal.SIGKILL:
        return "timeout", secs, out
    # A test binary that died (a panic outside a test, an abort).
    return "failed", secs, out[-300:].strip().splitlines()[-1] if out.strip() else "no output"


def main(argv):
    # Stopped with SIGTERM too, the source is put back (the `finally` below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if "--list" in argv:
        for name, path, _, _ in MUTANTS:
            print(f"{name:45} {path}")
        return 0
    words = [a for a in argv if not a.startswith("-")]
    chosen = [m for m in MUTANTS if not words or any(w in m[0] for w in words)]
    if not chosen:
        print("no mutant matches", words, file=sys.stderr)
        return 2

    # Each step runs once unmutated first (when a mutant first needs it): a
    # test that fails without any breakage catches nothing.
    passing = set()

    def baseline(step):
        if (step[0], tuple(step[1])) in passing:
            return True
        print(f"baseline: {' '.join(command(step))}", file=sys.stderr)
        status, _, out = run_tests(step)
        if status != "passed":
            print(out[-4000:], file=sys.stderr)
            print(f"the unmutated tests do not pass ({status}): fix that first", file=sys.stderr)
            return False
        passing.add((step[0], tuple(step[1])))
        return True

    results = []
    for name, path, find, replace in chosen:
        full = os.path.join(ROOT, path)
        with open(full, encoding="utf-8") as f:
            original = f.read()
        if original.count(find) != 1:
            results.append((name, "STALE", 0.0, f"text to mutate found {original.count(find)} times"))
            continue
        result = None
        for step in steps_for(name, path):
            if not baseline(step):
                return 2
            print(f"mutant {name}: {' '.join(command(step)[4:]) or 'the whole suite'} ...",
                  file=sys.stderr)
            try:
                with open(full, "w", encoding="utf-8") as f:
                    f.write(original.replace(find, replace))
                status, secs, out = run_tests(step)
            finally:
                with open(full, "w", encoding="utf-8") as f:
                    f.write(original)
            if status == "failed":
                result = (name, "CAUGHT", secs, out)
                break
            if status == "timeout":
                result = (name, "CAUGHT", secs, f"timed out after {TIMEOUT_S} s")
                break
            if status == "no-build":
                result = (name, "INVALID", secs, "does not build")
                break
        results.append(result or (name, "MISSED", secs, "every test passed"))
        print(f"  {results[-1][1]} in {results[-1][2]:.0f} s: {results[-1][3]}", file=sys.stderr)

    print("| mutant | result | caught by |")
    print("|---|---|---|")
    for name, result, secs, detail in results:
        print(f"| `{name}` | {result} | {detail} |")
    caught = sum(1 for r in results if r[1] == "CAUGHT")
    print(f"\n{caught} of {len(results)} mutants caught", file=sys.stderr)
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
