-- tower-lock PostgreSQL functions: one call (one round trip, one implicit
-- transaction) per operation. `{schema}` and `{table}` as in schema.sql.
-- Times go out as microseconds since the Unix epoch, on the database clock.
--
-- Locking discipline: every function that touches a key's waiters first
-- holds that key's lock row (INSERT .. ON CONFLICT or SELECT .. FOR UPDATE),
-- so a key's queue changes one transaction at a time. The one exception is
-- the sweep, which deletes waiter entries long dead without it: a hand-off
-- that finds the entry it picked gone looks again (see _hand_off).
--
-- Fences: a fence is drawn (nextval) only once the row is locked and the
-- grant decided, never in a value computed before a wait: fences then grow
-- in the order holders get the lock, whatever stalls a statement.
--
-- The functions assume READ COMMITTED (each statement sees what committed
-- before it): the backend sets it on its connections (conn.rs).
--
-- No bitmap scans (`SET enable_bitmapscan = off` on each function): a hot
-- key's holds and queue entries are inserted and deleted all the time, and
-- the planner, seeing small tables, scans their indexes by bitmap, which
-- never marks a dead entry dead in the index (a plain index scan does, the
-- first time it finds the row gone). Every scan then walked every hold and
-- entry deleted since the last VACUUM: lockbench permits4 ran 434, 267 and
-- 217 ops/s in three 5-s runs on one server (962 again after a VACUUM);
-- with plain index scans 884, 913 and 872.

-- STABLE, not IMMUTABLE: extract() from a timestamptz is stable, and a SQL
-- function declared less volatile than its body is never inlined; called
-- instead of inlined, it cost ~25 µs a call (measured: 60 µs of an acquire).
CREATE OR REPLACE FUNCTION "{schema}"."{table}_us"(t timestamptz) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT floor(extract(epoch FROM t) * 1000000)::bigint $$;

-- nudge: tell the live head of `p_key`'s queue (row locked by the caller),
-- unless it is the caller (`p_channel`, `p_ticket`), how long until what
-- now blocks it may end ('w <ticket> <µs>': the exclusive holder's expiry,
-- else the earliest hold's). A waiter sleeps until the expiry its last
-- attempt saw; a hand-off or an extend changes who holds and until when,
-- and a TTL that runs out on the server tells nobody: without this, a head
-- behind a holder that was handed the lock and walked away slept on the
-- old holder's expiry (or its safety-net re-check, up to 2 s) while the
-- lock lay free.
CREATE OR REPLACE FUNCTION "{schema}"."{table}_nudge"(
  p_key text, p_channel text, p_ticket bigint)
RETURNS void
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
DECLARE
  v_clock timestamptz := clock_timestamp();
  v_free timestamptz;
  w record;
BEGIN
  SELECT q.channel, q.ticket INTO w FROM "{schema}"."{table}_waiters" AS q
    WHERE q.key = p_key AND q.deadline > v_clock ORDER BY q.place LIMIT 1;
  IF NOT FOUND OR (w.channel = p_channel AND w.ticket = p_ticket) THEN
    RETURN;
  END IF;
  SELECT CASE WHEN l.kind = 0 THEN l.expires_at
              ELSE (SELECT min(x.expires_at) FROM "{schema}"."{table}_holds" AS x
                    WHERE x.key = p_key AND x.expires_at > v_clock) END
    INTO v_free FROM "{schema}"."{table}" AS l WHERE l.key = p_key;
  PERFORM pg_notify(w.channel, 'w ' || w.ticket || ' ' || greatest(0,
    "{schema}"."{table}_us"(coalesce(v_free, v_clock)) - "{schema}"."{table}_us"(v_clock)));
END
$$;

-- (Schema version 1 before round 3 had a `p_now` argument: replaced.)
DROP FUNCTION IF EXISTS "{schema}"."{table}_hand_off"(text, timestamptz, text, bigint);

-- Hand the key `p_key`, whose row the caller has locked and whose
-- exclusive holder (if any) is gone or expired, to the waiters: the oldest
-- whose max wait has not ended first, then each next one while it fits
-- beside what is held (consecutive shared waiters; permits while there is
-- room), stopping at the first that does not; dead entries are skipped and
-- deleted, expired holds of a shared/permit key deleted first. Each grant
-- is dated when it is made (the clock, not the caller's transaction start:
-- a release that waited for the row would otherwise hand over a lease that
-- began, or even ended, before the grant), and its fence drawn then. Each
-- new holder gets its own TTL from then and is told through its backend's
-- channel ('<ticket> <fence> <granted us> <key>', delivered at commit),
-- unless it is the caller (`p_channel`, `p_ticket`); the waiter then at
-- the head is told how long the new holds last (_nudge). Returns the fence of
-- the caller's grant, else of the first grant (NULL: nobody granted; the
-- caller then removes the row or takes the lock), the grants' time and
-- whether one went to the caller.
CREATE OR REPLACE FUNCTION "{schema}"."{table}_hand_off"(
  p_key text, p_channel text, p_ticket bigint,
  OUT fence bigint, OUT granted_us bigint, OUT to_caller boolean)
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
DECLARE
  v_at timestamptz := clock_timestamp();
  v_kind smallint;
  v_live int := 0;
  v_fence bigint;
  v_expires timestamptz;
  w "{schema}"."{table}_waiters"%ROWTYPE;
BEGIN
  to_caller := false;
  granted_us := "{schema}"."{table}_us"(v_at);
  SELECT l.kind INTO v_kind FROM "{schema}"."{table}" AS l WHERE l.key = p_key;
  IF v_kind <> 0 THEN
    DELETE FROM "{schema}"."{table}_holds" AS x WHERE x.key = p_key AND x.expires_at <= v_at;
    SELECT count(*) INTO v_live FROM "{schema}"."{table}_holds" AS x WHERE x.key = p_key;
  END IF;
  LOOP
    SELECT * INTO w FROM "{schema}"."{table}_waiters" AS q
      WHERE q.key = p_key ORDER BY q.place LIMIT 1;
    EXIT WHEN NOT FOUND;
    -- A live head that does not fit beside the holds stays first.
    EXIT WHEN w.deadline > v_at AND v_live > 0 AND CASE w.kind
      WHEN 0 THEN true
      WHEN 1 THEN v_kind <> 1
      ELSE v_kind <> 2 OR v_live >= w.permits END;
    DELETE FROM "{schema}"."{table}_waiters" AS d
      WHERE d.key = p_key AND d.place = w.place;
    -- Gone meanwhile: the sweep deleted that (long dead) entry without the
    -- row lock. The next statement sees its deletion: look again, so a
    -- live waiter behind it is never taken for an empty queue.
    CONTINUE WHEN NOT FOUND OR w.deadline <= v_at;
    v_fence := nextval('"{schema}"."{table}_fence"');
    v_expires := v_at + w.ttl_ms * interval '1 millisecond';
    IF w.kind = 0 THEN
      UPDATE "{schema}"."{table}" AS l SET
          owner = w.owner,
          attempt = w.attempt,
          fence = v_fence,
          acquired_at = v_at,
          expires_at = v_expires,
          granted_to = w.channel || ' ' || w.ticket,
          kind = 0,
          permits = NULL,
          queued = EXISTS (SELECT 1 FROM "{schema}"."{table}_waiters" AS q WHERE q.key = p_key)
        WHERE l.key = p_key;
    ELSE
      INSERT INTO "{schema}"."{table}_holds" AS x
          (key, fence, owner, attempt, acquired_at, expires_at, granted_to)
        VALUES (p_key, v_fence, w.owner, w.attempt, v_at, v_expires, w.channel || ' ' || w.ticket);
      UPDATE "{schema}"."{table}" AS l SET
          owner = '', attempt = 0, fence = v_fence, acquired_at = v_at,
          expires_at = CASE WHEN v_live > 0 THEN greatest(l.expires_at, v_expires) ELSE v_expires END,
          granted_to = NULL, kind = w.kind, permits = w.permits,
          queued = EXISTS (SELECT 1 FROM "{schema}"."{table}_waiters" AS q WHERE q.key = p_key)
        WHERE l.key = p_key;
      v_kind := w.kind;
      v_live := v_live + 1;
    END IF;
    IF w.channel = p_channel AND w.ticket = p_ticket THEN
      to_caller := true;
      fence := v_fence;
    ELSE
      IF fence IS NULL THEN
        fence := v_fence;
      END IF;
      PERFORM pg_notify(w.channel, w.ticket || ' ' || v_fence || ' ' || granted_us || ' ' || p_key);
    END IF;
    -- An exclusive grant: nothing fits beside it.
    EXIT WHEN w.kind = 0;
  END LOOP;
  IF fence IS NOT NULL THEN
    PERFORM "{schema}"."{table}_nudge"(p_key, p_channel, p_ticket);
  END IF;
END
$$;

-- settle: after a hold of the shared/permit key `p_key` (row locked) went,
-- or a waiter left, hand the room to the waiters that fit; the row goes
-- with the last hold, else lives as long as the latest hold, and says
-- whether anyone is still queued: a key whose last waiter left (gave up,
-- or was dropped) is no longer marked queued, so its releases and acquires
-- take their fast paths again (a key read by readers without a break
-- keeps its row, and would keep the mark for good).
CREATE OR REPLACE FUNCTION "{schema}"."{table}_settle"(p_key text)
RETURNS void
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
DECLARE
  h record;
  v_last timestamptz;
BEGIN
  h := "{schema}"."{table}_hand_off"(p_key, NULL, NULL);
  IF EXISTS (SELECT 1 FROM "{schema}"."{table}" AS l WHERE l.key = p_key AND l.kind = 0) THEN
    RETURN;  -- handed to an exclusive waiter
  END IF;
  SELECT max(x.expires_at) INTO v_last FROM "{schema}"."{table}_holds" AS x WHERE x.key = p_key;
  IF v_last IS NULL THEN
    DELETE FROM "{schema}"."{table}" AS l WHERE l.key = p_key;
  ELSE
    UPDATE "{schema}"."{table}" AS l SET expires_at = v_last,
        queued = EXISTS (SELECT 1 FROM "{schema}"."{table}_waiters" AS q WHERE q.key = p_key)
      WHERE l.key = p_key;
  END IF;
END
$$;

-- redraw: the row of `p_key` just went in, in this transaction, with fence
-- `p_drawn`, and another fence was drawn since. A fence drawn before the
-- row went in (in its INSERT's VALUES, before any wait for the key) can be
-- older than one granted meanwhile to a holder whose row was deleted since
-- (a statement that stalled); this one, drawn with the row ours, is newer
-- than every fence granted for the key. (With no other fence drawn since
-- `p_drawn`, none was granted: the sequence, CACHE 1, hands out increasing
-- numbers, and its last_value is the last one handed out.) Returns it.
CREATE OR REPLACE FUNCTION "{schema}"."{table}_redraw"(p_key text, p_drawn bigint)
RETURNS bigint
LANGUAGE sql AS $$
  UPDATE "{schema}"."{table}" AS l SET fence = nextval('"{schema}"."{table}_fence"')
    WHERE l.key = p_key AND l.fence = p_drawn
    RETURNING l.fence
$$;

-- acquire of a shared or permit hold, or of any kind on a key held shared
-- or under permits (called by _acquire with the key's row locked; same
-- answers). In turn: a dead exclusive holder or expired holds give way to
-- the queue (_hand_off grants its head, and what fits after it, perhaps
-- the caller); a retry of a live hold's own attempt refreshes it; a
-- request of another family than the live holders (permits beside shared
-- or exclusive, another n) is code 2, never queued; a request that fits
-- beside the holders, with nobody live queued before it, gets a hold of
-- its own under a fence drawn now; else busy, queued like an exclusive
-- waiter, with the earliest expiry among the holds.
CREATE OR REPLACE FUNCTION "{schema}"."{table}_acquire_kind"(
  p_key text, p_owner text, p_attempt bigint, p_ttl_ms bigint,
  p_wait_ms bigint, p_channel text, p_ticket bigint,
  p_kind smallint, p_permits int,
  OUT code int, OUT fence bigint, OUT acquired_us bigint, OUT now_us bigint,
  OUT remaining_us bigint, OUT created boolean)
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
DECLARE
  -- The caller holds the key's row: its clock now, not the statement's
  -- start (a hold that ran out while the statement waited for the row is
  -- not this caller's to keep).
  v_now timestamptz := clock_timestamp();
  v_ttl interval := p_ttl_ms * interval '1 millisecond';
  v_live int := 0;
  v_first timestamptz;
  v_fits boolean;
  v_fence bigint;
  -- As in _acquire: a hold a waiting call takes names its ticket.
  v_grant text := CASE WHEN p_wait_ms > 0 AND p_ticket IS NOT NULL
                       THEN p_channel || ' ' || p_ticket END;
  r "{schema}"."{table}"%ROWTYPE;
  x "{schema}"."{table}_holds"%ROWTYPE;
  h record;
BEGIN
  now_us := "{schema}"."{table}_us"(v_now);
  created := false;
  SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key;
  IF r.kind <> 0 OR r.expires_at <= v_now THEN
    IF EXISTS (SELECT 1 FROM "{schema}"."{table}_waiters" AS q WHERE q.key = p_key) THEN
      h := "{schema}"."{table}_hand_off"(p_key, p_channel, p_ticket);
      IF h.to_caller THEN
        code := 1;
        fence := h.fence;
        acquired_us := h.granted_us;
        -- Its TTL runs from the hand-off (see _acquire).
        now_us := h.granted_us;
        RETURN;
      END IF;
      SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key;
    ELSIF r.kind <> 0 THEN
      DELETE FROM "{schema}"."{table}_holds" AS d WHERE d.key = p_key AND d.expires_at <= v_now;
    END IF;
  END IF;
  IF r.kind = 0 THEN
    IF r.expires_at > v_now THEN
      v_live := 1;
      v_first := r.expires_at;
    END IF;
  ELSE
    SELECT count(*), min(d.expires_at) INTO v_live, v_first
      FROM "{schema}"."{table}_holds" AS d WHERE d.key = p_key AND d.expires_at > v_now;
    -- (Two calls of one request, queued apart, can each be handed a hold:
    -- a call takes the one handed to its own ticket, else one nobody was
    -- handed, else the newest. Taking another's, it left its own naming a
    -- ticket whose notification it no longer heard: idle for a TTL.)
    SELECT * INTO x FROM "{schema}"."{table}_holds" AS d
      WHERE d.key = p_key AND d.owner = p_owner AND d.attempt = p_attempt AND d.expires_at > v_now
      ORDER BY (d.granted_to IS NOT DISTINCT FROM p_channel || ' ' || p_ticket) DESC,
               (d.granted_to IS NULL) DESC, d.fence DESC
      LIMIT 1;
    -- (Of this kind: a request of another kind under the same owner and
    -- attempt is another acquisition, which taken for this one would
    -- believe it held the lock exclusive beside readers.)
    IF FOUND AND r.kind = p_kind AND r.permits IS NOT DISTINCT FROM p_permits THEN
      -- A retry of this hold's own attempt, or a waiter it was handed to:
      -- same fence, TTL refreshed from the clock, the grant claimed (as in
      -- _acquire).
      UPDATE "{schema}"."{table}_holds" AS d SET expires_at = clock_timestamp() + v_ttl, granted_to = NULL
        WHERE d.key = p_key AND d.fence = x.fence
        RETURNING d.expires_at - v_ttl INTO v_now;
      -- The lease it reports runs from where the TTL stored counts from.
      now_us := "{schema}"."{table}_us"(v_now);
      UPDATE "{schema}"."{table}" AS l SET expires_at = greatest(l.expires_at, clock_timestamp() + v_ttl)
        WHERE l.key = p_key;
      IF p_ticket IS NOT NULL THEN
        DELETE FROM "{schema}"."{table}_waiters" AS w
          WHERE w.channel = p_channel AND w.ticket = p_ticket;
      END IF;
      code := 1;
      fence := x.fence;
      acquired_us := "{schema}"."{table}_us"(x.acquired_at);
      RETURN;
    END IF;
  END IF;
  IF v_live > 0 AND ((p_kind = 2) <> (r.kind = 2) OR (p_kind = 2 AND p_permits <> r.permits)) THEN
    code := 2;
    remaining_us := greatest(0, "{schema}"."{table}_us"(v_first) - now_us);
    RETURN;
  END IF;
  v_fits := CASE p_kind
      WHEN 0 THEN v_live = 0
      WHEN 1 THEN v_live = 0 OR r.kind = 1
      ELSE v_live < p_permits END
    AND NOT EXISTS (SELECT 1 FROM "{schema}"."{table}_waiters" AS q
                    WHERE q.key = p_key AND q.deadline > v_now
                      AND (p_ticket IS NULL OR q.channel <> p_channel OR q.ticket <> p_ticket));
  IF v_fits THEN
    v_fence := nextval('"{schema}"."{table}_fence"');
    fence := v_fence;
    IF p_kind = 0 THEN
      UPDATE "{schema}"."{table}" AS l SET
          owner = p_owner, attempt = p_attempt, fence = v_fence,
          acquired_at = v_now, expires_at = v_now + v_ttl,
          queued = false, granted_to = v_grant, kind = 0, permits = NULL
        WHERE l.key = p_key;
      DELETE FROM "{schema}"."{table}_holds" AS d WHERE d.key = p_key;
    ELSE
      INSERT INTO "{schema}"."{table}_holds"
          (key, fence, owner, attempt, acquired_at, expires_at, granted_to)
        VALUES (p_key, v_fence, p_owner, p_attempt, v_now, v_now + v_ttl, v_grant);
      UPDATE "{schema}"."{table}" AS l SET
          owner = '', attempt = 0, fence = v_fence, acquired_at = v_now,
          expires_at = CASE WHEN v_live > 0 THEN greatest(l.expires_at, v_now + v_ttl)
                       ELSE v_now + v_ttl END,
          granted_to = NULL, kind = p_kind, permits = p_permits
        WHERE l.key = p_key;
    END IF;
    IF p_ticket IS NOT NULL THEN
      DELETE FROM "{schema}"."{table}_waiters" AS w
        WHERE w.channel = p_channel AND w.ticket = p_ticket;
    END IF;
    code := 1;
    acquired_us := now_us;
    RETURN;
  END IF;
  -- Busy.
  IF p_wait_ms > 0 AND p_ticket IS NOT NULL THEN
    INSERT INTO "{schema}"."{table}_waiters" AS w
        (key, channel, ticket, owner, attempt, ttl_ms, deadline, kind, permits)
      VALUES (p_key, p_channel, p_ticket, p_owner, p_attempt, p_ttl_ms,
              v_now + p_wait_ms * interval '1 millisecond', p_kind, p_permits)
      ON CONFLICT (channel, ticket) DO UPDATE SET deadline = excluded.deadline
      RETURNING (w.xmax = 0) INTO created;
    UPDATE "{schema}"."{table}" AS l SET queued = true WHERE l.key = p_key AND NOT l.queued;
  END IF;
  code := 0;
  remaining_us := greatest(0, "{schema}"."{table}_us"(coalesce(v_first, v_now)) - now_us);
END
$$;

-- (Schema version 1 had no kinds: replaced by the one below.)
DROP FUNCTION IF EXISTS "{schema}"."{table}_acquire"(text, text, bigint, bigint, bigint, text, bigint);

-- acquire: take `p_key` for `p_owner`/`p_attempt` for `p_ttl_ms`, as
-- `p_kind` (0 exclusive, 1 shared, 2 permits: one of `p_permits`); a waiter
-- (`p_wait_ms` > 0 with a channel and ticket) joins the queue when busy.
-- code 1: acquired (fence, acquired_us, now_us);
-- code 0: busy (remaining_us of the holder; created: this call queued anew);
-- code 2: the key's live holders are of another family (see _acquire_kind).
CREATE OR REPLACE FUNCTION "{schema}"."{table}_acquire"(
  p_key text, p_owner text, p_attempt bigint, p_ttl_ms bigint,
  p_wait_ms bigint, p_channel text, p_ticket bigint,
  p_kind smallint DEFAULT 0, p_permits int DEFAULT NULL,
  OUT code int, OUT fence bigint, OUT acquired_us bigint, OUT now_us bigint,
  OUT remaining_us bigint, OUT created boolean)
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
DECLARE
  v_now timestamptz := now();
  v_ttl interval := p_ttl_ms * interval '1 millisecond';
  v_handed bigint;
  v_live bigint;
  v_mine boolean;
  v_fence bigint;
  -- A hold a waiting call takes is its ticket's to give back (_leave),
  -- should the call be dropped before it reads this reply.
  v_grant text := CASE WHEN p_wait_ms > 0 AND p_ticket IS NOT NULL
                       THEN p_channel || ' ' || p_ticket END;
  r "{schema}"."{table}"%ROWTYPE;
  h record;
BEGIN
  now_us := "{schema}"."{table}_us"(v_now);
  created := false;
  LOOP
    -- Fast path: free (as the acquire statement's own, see _redraw). A
    -- shared or permit hold puts the key's anchor row in with its hold.
    INSERT INTO "{schema}"."{table}" AS l
        (key, owner, attempt, fence, acquired_at, expires_at, kind, permits, granted_to)
      VALUES (p_key, CASE WHEN p_kind = 0 THEN p_owner ELSE '' END,
              CASE WHEN p_kind = 0 THEN p_attempt ELSE 0 END,
              nextval('"{schema}"."{table}_fence"'),
              v_now, v_now + v_ttl, p_kind, p_permits,
              CASE WHEN p_kind = 0 THEN v_grant END)
      ON CONFLICT (key) DO NOTHING
      RETURNING l.fence INTO fence;
    IF FOUND THEN
      IF fence <> pg_sequence_last_value('"{schema}"."{table}_fence"') THEN
        fence := "{schema}"."{table}_redraw"(p_key, fence);
      END IF;
      IF p_kind <> 0 THEN
        INSERT INTO "{schema}"."{table}_holds"
            (key, fence, owner, attempt, acquired_at, expires_at, granted_to)
          VALUES (p_key, fence, p_owner, p_attempt, v_now, v_now + v_ttl, v_grant);
      END IF;
      code := 1;
      acquired_us := now_us;
      RETURN;
    END IF;
    SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key FOR UPDATE;
    -- Not found: the row was deleted (released) since the insert saw it.
    EXIT WHEN FOUND;
  END LOOP;

  IF p_kind <> 0 AND r.kind = p_kind AND NOT r.queued AND r.expires_at > v_now
     AND r.permits IS NOT DISTINCT FROM p_permits THEN
    -- Fast path: one more hold of the kind the key is held as, with
    -- nobody queued (so nobody to barge past): it fits unless every permit
    -- is taken (full, or a retry of a hold of this attempt: _acquire_kind).
    SELECT count(*) FILTER (WHERE x.expires_at > v_now),
           coalesce(bool_or(x.owner = p_owner AND x.attempt = p_attempt AND x.expires_at > v_now), false)
      INTO v_live, v_mine
      FROM "{schema}"."{table}_holds" AS x WHERE x.key = p_key;
    IF NOT v_mine AND (p_kind = 1 OR v_live < p_permits) THEN
      v_fence := nextval('"{schema}"."{table}_fence"');
      INSERT INTO "{schema}"."{table}_holds"
          (key, fence, owner, attempt, acquired_at, expires_at, granted_to)
        VALUES (p_key, v_fence, p_owner, p_attempt, v_now, v_now + v_ttl, v_grant);
      -- The row lives at least as long as its latest hold (the sweep takes
      -- a row past its expiry for a free key): when it would end sooner,
      -- twice the TTL, so that holds of one TTL coming and going rewrite
      -- it once per TTL, not with every hold (readers64 12 % faster than
      -- updating it every time, BENCHMARKS.md). Its fence and acquired_at
      -- are those of the last grant made on a slow path, not of every hold.
      UPDATE "{schema}"."{table}" AS l SET expires_at = v_now + 2 * v_ttl
        WHERE l.key = p_key AND l.expires_at < v_now + v_ttl;
      code := 1;
      fence := v_fence;
      acquired_us := now_us;
      RETURN;
    END IF;
  END IF;

  IF r.kind <> 0 OR p_kind <> 0 THEN
    SELECT * INTO code, fence, acquired_us, now_us, remaining_us, created
      FROM "{schema}"."{table}_acquire_kind"(p_key, p_owner, p_attempt, p_ttl_ms,
                                             p_wait_ms, p_channel, p_ticket, p_kind, p_permits);
    RETURN;
  END IF;

  IF r.expires_at > v_now AND r.owner = p_owner AND r.attempt = p_attempt THEN
    -- A retry of the holder's own attempt, or a waiter the lock was handed
    -- to: same fence, TTL refreshed. The grant is claimed: a notification
    -- of it that reaches the waiter's backend after this call has
    -- returned must not pass it on (see _pass_on). Refreshed from the
    -- clock, not from this transaction's start: a waiter's re-check that
    -- waited for the row behind the release handing it the lock started
    -- before that grant, and its TTL from then would end before the lease
    -- it reports (dated from the grant) does.
    UPDATE "{schema}"."{table}" AS l SET expires_at = clock_timestamp() + v_ttl, granted_to = NULL
      WHERE l.key = p_key
      RETURNING l.expires_at - v_ttl INTO v_now;
    -- The reply dates the TTL from where the one stored counts from (not
    -- from this call's start, before the grant): the lease it reports,
    -- from the grant, is then the whole TTL, as the server keeps it.
    now_us := "{schema}"."{table}_us"(v_now);
    IF p_ticket IS NOT NULL THEN
      DELETE FROM "{schema}"."{table}_waiters" AS w
        WHERE w.channel = p_channel AND w.ticket = p_ticket;
    END IF;
    code := 1;
    fence := r.fence;
    acquired_us := "{schema}"."{table}_us"(r.acquired_at);
    RETURN;
  END IF;

  IF r.expires_at <= v_now THEN
    -- Expired (the stale reclaim). Waiters queued come first, as after a
    -- release; with none, it is ours, under a fence drawn now.
    IF r.queued THEN
      h := "{schema}"."{table}_hand_off"(p_key, p_channel, p_ticket);
      IF h.to_caller THEN
        code := 1;
        fence := h.fence;
        acquired_us := h.granted_us;
        -- Its TTL runs from the hand-off, which may come well after this
        -- call's start (it waited for the row).
        now_us := h.granted_us;
        RETURN;
      END IF;
      v_handed := h.fence;
    END IF;
    IF v_handed IS NULL THEN
      UPDATE "{schema}"."{table}" AS l SET
          owner = p_owner, attempt = p_attempt,
          fence = nextval('"{schema}"."{table}_fence"'),
          acquired_at = v_now, expires_at = v_now + v_ttl,
          queued = false, granted_to = v_grant
        WHERE l.key = p_key
        RETURNING l.fence INTO fence;
      code := 1;
      acquired_us := now_us;
      RETURN;
    END IF;
    SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key;
  END IF;

  -- Busy (by shared holds if a hand-off above granted some: the earliest
  -- to expire answers).
  IF r.kind <> 0 THEN
    SELECT min(x.expires_at) INTO r.expires_at FROM "{schema}"."{table}_holds" AS x
      WHERE x.key = p_key;
  END IF;
  IF p_wait_ms > 0 AND p_ticket IS NOT NULL THEN
    INSERT INTO "{schema}"."{table}_waiters" AS w
        (key, channel, ticket, owner, attempt, ttl_ms, deadline)
      VALUES (p_key, p_channel, p_ticket, p_owner, p_attempt, p_ttl_ms,
              v_now + p_wait_ms * interval '1 millisecond')
      ON CONFLICT (channel, ticket) DO UPDATE SET deadline = excluded.deadline
      RETURNING (w.xmax = 0) INTO created;
    IF NOT r.queued THEN
      UPDATE "{schema}"."{table}" AS l SET queued = true WHERE l.key = p_key;
    END IF;
  END IF;
  code := 0;
  remaining_us := greatest(0, "{schema}"."{table}_us"(r.expires_at) - now_us);
END
$$;

-- release: 1 released, 0 not held (never taken, released, expired),
-- -1 held by another acquisition (another owner, or `p_owner` under another
-- fence than `p_fence`; a NULL `p_fence` names whatever `p_owner` holds). A
-- lock with waiters goes to the oldest live one.
CREATE OR REPLACE FUNCTION "{schema}"."{table}_release"(
  p_key text, p_owner text, p_fence bigint)
RETURNS int
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
DECLARE
  v_now timestamptz := now();
  r "{schema}"."{table}"%ROWTYPE;
  h record;
BEGIN
  -- (An exclusive lock of ours, live, with nobody queued: the release
  -- statement's own fast path, in front of this function, deleted it;
  -- other callers, as a single-flight's begin, take the general path.)
  -- Fast path: one hold of a shared/permit key, named by its fence, with
  -- nobody queued, so nobody to hand the room to. Two statements: the
  -- first locks the key's row and deletes the hold, under a snapshot taken
  -- before it waited for the row; the second, under a snapshot taken with
  -- the row ours, sees every hold committed meanwhile and every hold
  -- released meanwhile, and drops the row with the last live hold (and
  -- the holds that ran out with it). In one statement, two releases of a
  -- key's last two holds, each behind the other's row lock, would each
  -- still see the other's hold, and leave the row behind with none.
  IF p_fence IS NOT NULL THEN
    WITH a AS (
      SELECT l.key FROM "{schema}"."{table}" AS l
        WHERE l.key = p_key AND l.kind <> 0 AND NOT l.queued FOR UPDATE)
    DELETE FROM "{schema}"."{table}_holds" AS x USING a
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
      RETURN CASE WHEN r.expires_at > v_now THEN 1 ELSE 0 END;
    END IF;
  END IF;
  SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key FOR UPDATE;
  IF NOT FOUND THEN
    RETURN 0;
  END IF;
  IF r.kind <> 0 THEN
    -- One hold of a shared/permit key (a NULL `p_fence`: the owner's oldest).
    DELETE FROM "{schema}"."{table}_holds" AS x
      WHERE x.key = p_key AND x.owner = p_owner
        AND x.fence = coalesce(p_fence, (SELECT min(y.fence) FROM "{schema}"."{table}_holds" AS y
                                         WHERE y.key = p_key AND y.owner = p_owner
                                           AND y.expires_at > v_now))
      RETURNING x.expires_at INTO r.expires_at;
    IF FOUND AND NOT r.queued THEN
      -- Fast path: nobody queued, so nobody to hand the room to. The row
      -- goes with the last live hold, and holds that ran out with it (else
      -- it keeps the latest expiry it had: never earlier than a hold's).
      DELETE FROM "{schema}"."{table}" AS l
        WHERE l.key = p_key
          AND NOT EXISTS (SELECT 1 FROM "{schema}"."{table}_holds" AS x
                          WHERE x.key = p_key AND x.expires_at > v_now);
      IF FOUND THEN
        DELETE FROM "{schema}"."{table}_holds" AS x WHERE x.key = p_key;
      END IF;
      RETURN CASE WHEN r.expires_at > v_now THEN 1 ELSE 0 END;
    END IF;
    IF NOT FOUND THEN
      IF EXISTS (SELECT 1 FROM "{schema}"."{table}_holds" AS x
                 WHERE x.key = p_key AND x.expires_at > v_now) THEN
        RETURN -1;
      END IF;
      r.expires_at := v_now;
    END IF;
    PERFORM "{schema}"."{table}_settle"(p_key);
    IF r.expires_at > v_now THEN
      RETURN 1;
    END IF;
    RETURN 0;
  END IF;
  IF r.expires_at > v_now
     AND (r.owner <> p_owner OR (p_fence IS NOT NULL AND r.fence <> p_fence)) THEN
    RETURN -1;
  END IF;
  -- Ours with waiters queued, or expired (whoever held it): the next live
  -- waiter gets it now; with none left, the row goes.
  h := "{schema}"."{table}_hand_off"(p_key, NULL, NULL);
  IF h.fence IS NULL THEN
    DELETE FROM "{schema}"."{table}" AS l WHERE l.key = p_key;
  END IF;
  IF r.expires_at > v_now THEN
    RETURN 1;
  END IF;
  RETURN 0;
END
$$;

-- extend: code 1 (fence, acquired_us, now_us), 0 not held, -1 another
-- acquisition (as for release; a NULL `p_fence` names whatever `p_owner` holds).
CREATE OR REPLACE FUNCTION "{schema}"."{table}_extend"(
  p_key text, p_owner text, p_fence bigint, p_ttl_ms bigint,
  OUT code int, OUT fence bigint, OUT acquired_us bigint, OUT now_us bigint)
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
DECLARE
  v_now timestamptz := now();
  r "{schema}"."{table}"%ROWTYPE;
BEGIN
  now_us := "{schema}"."{table}_us"(v_now);
  -- (Locked: a shared/permit key's holds change only under its row.)
  SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key FOR UPDATE;
  -- Judged by the clock once the row is ours, not from the statement's
  -- start: a statement that waited for the row (or stalled) past the TTL
  -- must not revive the lock (others counted a hold out once it ran out),
  -- nor date the new TTL from before the wait. (An UPDATE's own condition
  -- is weighed before it waits for a row that was locked but not changed.)
  v_now := clock_timestamp();
  now_us := "{schema}"."{table}_us"(v_now);
  IF FOUND AND r.kind = 0 THEN
    IF r.owner = p_owner AND (p_fence IS NULL OR r.fence = p_fence) AND r.expires_at > v_now THEN
      UPDATE "{schema}"."{table}" AS l SET expires_at = v_now + p_ttl_ms * interval '1 millisecond'
        WHERE l.key = p_key;
      IF r.queued THEN
        -- A shorter TTL ends it sooner than its waiters last saw.
        PERFORM "{schema}"."{table}_nudge"(p_key, NULL, NULL);
      END IF;
      code := 1;
      fence := r.fence;
      acquired_us := "{schema}"."{table}_us"(r.acquired_at);
      RETURN;
    END IF;
    code := CASE WHEN r.expires_at > v_now THEN -1 ELSE 0 END;
    RETURN;
  END IF;
  IF FOUND AND r.kind <> 0 THEN
    -- One hold of a shared/permit key; the row lives as long as its latest
    -- hold.
    UPDATE "{schema}"."{table}_holds" AS x SET expires_at = v_now + p_ttl_ms * interval '1 millisecond'
      WHERE x.key = p_key AND x.owner = p_owner AND x.expires_at > v_now
        AND x.fence = coalesce(p_fence, (SELECT min(y.fence) FROM "{schema}"."{table}_holds" AS y
                                         WHERE y.key = p_key AND y.owner = p_owner
                                           AND y.expires_at > v_now))
      RETURNING x.fence, x.acquired_at INTO fence, r.acquired_at;
    IF FOUND THEN
      UPDATE "{schema}"."{table}" AS l
        SET expires_at = (SELECT max(y.expires_at) FROM "{schema}"."{table}_holds" AS y WHERE y.key = p_key)
        WHERE l.key = p_key;
      IF r.queued THEN
        PERFORM "{schema}"."{table}_nudge"(p_key, NULL, NULL);
      END IF;
      code := 1;
      acquired_us := "{schema}"."{table}_us"(r.acquired_at);
      RETURN;
    END IF;
    code := CASE WHEN EXISTS (SELECT 1 FROM "{schema}"."{table}_holds" AS y
                              WHERE y.key = p_key AND y.expires_at > v_now) THEN -1 ELSE 0 END;
    RETURN;
  END IF;
  IF FOUND AND r.expires_at > v_now THEN
    code := -1;
  ELSE
    code := 0;
  END IF;
END
$$;

-- claim: take over `p_owner`'s acquisition `p_fence` as a new one (a job
-- restoring a token): a fresh fence (drawn with the row locked), `p_attempt`
-- recorded, expiry and metadata kept. code 1 (fence, acquired_us,
-- expires_us, now_us), 0 not held, -1 another acquisition holds it (the
-- token was claimed already, or is stale). A call repeated after a lost
-- reply finds `p_attempt` in place and answers the same.
CREATE OR REPLACE FUNCTION "{schema}"."{table}_claim"(
  p_key text, p_owner text, p_fence bigint, p_attempt bigint,
  OUT code int, OUT fence bigint, OUT acquired_us bigint, OUT expires_us bigint,
  OUT now_us bigint)
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
DECLARE
  v_now timestamptz := now();
  v_fence bigint;
  r "{schema}"."{table}"%ROWTYPE;
  x "{schema}"."{table}_holds"%ROWTYPE;
BEGIN
  now_us := "{schema}"."{table}_us"(v_now);
  SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key FOR UPDATE;
  -- Judged once the row is ours (see _extend).
  v_now := clock_timestamp();
  now_us := "{schema}"."{table}_us"(v_now);
  IF NOT FOUND OR r.expires_at <= v_now THEN
    code := 0;
    RETURN;
  END IF;
  IF r.kind <> 0 THEN
    -- One hold of a shared/permit key: the same, on its row.
    SELECT * INTO x FROM "{schema}"."{table}_holds" AS y
      WHERE y.key = p_key AND y.owner = p_owner AND y.expires_at > v_now
        AND (y.attempt = p_attempt OR y.fence = p_fence)
      ORDER BY y.attempt = p_attempt DESC LIMIT 1;
    IF NOT FOUND THEN
      code := CASE WHEN EXISTS (SELECT 1 FROM "{schema}"."{table}_holds" AS y
                                WHERE y.key = p_key AND y.expires_at > v_now) THEN -1 ELSE 0 END;
      RETURN;
    END IF;
    fence := x.fence;
    IF x.attempt <> p_attempt THEN
      v_fence := nextval('"{schema}"."{table}_fence"');
      UPDATE "{schema}"."{table}_holds" AS y SET
          fence = v_fence, attempt = p_attempt,
          metadata = CASE WHEN (y.metadata->>'fence')::bigint = y.fence
                     THEN jsonb_set(y.metadata, '{fence}', to_jsonb(v_fence))
                     ELSE y.metadata END
        WHERE y.key = p_key AND y.fence = x.fence;
      fence := v_fence;
    END IF;
    code := 1;
    acquired_us := "{schema}"."{table}_us"(x.acquired_at);
    expires_us := "{schema}"."{table}_us"(x.expires_at);
    RETURN;
  END IF;
  IF r.owner <> p_owner OR (r.attempt <> p_attempt AND r.fence <> p_fence) THEN
    code := -1;
    RETURN;
  END IF;
  fence := r.fence;
  IF r.attempt <> p_attempt THEN
    v_fence := nextval('"{schema}"."{table}_fence"');
    -- The metadata belongs to the acquisition: it follows the new fence.
    UPDATE "{schema}"."{table}" AS l SET
        fence = v_fence, attempt = p_attempt,
        metadata = CASE WHEN (l.metadata->>'fence')::bigint = l.fence
                   THEN jsonb_set(l.metadata, '{fence}', to_jsonb(v_fence))
                   ELSE l.metadata END
      WHERE l.key = p_key;
    fence := v_fence;
  END IF;
  code := 1;
  acquired_us := "{schema}"."{table}_us"(r.acquired_at);
  expires_us := "{schema}"."{table}_us"(r.expires_at);
END
$$;

-- force release: whoever holds it. 1 if a live lock was held, else 0. A
-- queued waiter gets the lock next.
CREATE OR REPLACE FUNCTION "{schema}"."{table}_force_release"(p_key text)
RETURNS int
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
DECLARE
  v_now timestamptz := now();
  r "{schema}"."{table}"%ROWTYPE;
  h record;
BEGIN
  SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key FOR UPDATE;
  IF NOT FOUND THEN
    RETURN 0;
  END IF;
  IF r.kind <> 0 THEN
    -- Every hold goes. Held means a live hold: the row's expiry may run
    -- past the latest hold's (see _acquire's fast path).
    WITH gone AS (
      DELETE FROM "{schema}"."{table}_holds" AS x WHERE x.key = p_key RETURNING x.expires_at)
    SELECT max(gone.expires_at) INTO r.expires_at FROM gone;
  END IF;
  h := "{schema}"."{table}_hand_off"(p_key, NULL, NULL);
  IF h.fence IS NULL THEN
    DELETE FROM "{schema}"."{table}" AS l WHERE l.key = p_key;
  END IF;
  IF r.expires_at > v_now THEN
    RETURN 1;
  END IF;
  RETURN 0;
END
$$;

-- leave: a waiter gives up. Leaves the queue; if the lock was handed to
-- this very call meanwhile, `p_claim` keeps it (code 1: fence, acquired_us)
-- and otherwise it goes to the next waiter (code 2). Else code 0 with the
-- holder's remaining_us, and the waiter now at the head is told when the
-- lock comes free (it may have slept on an older holder's expiry). A claim
-- marks the grant `c <channel> <ticket>`: never passed on, and a leave
-- repeated after its reply was lost answers code 1 again (not 0, which
-- would leave the lock with nobody until its TTL).
CREATE OR REPLACE FUNCTION "{schema}"."{table}_leave"(
  p_key text, p_owner text, p_channel text, p_ticket bigint, p_claim boolean,
  OUT code int, OUT fence bigint, OUT acquired_us bigint, OUT remaining_us bigint)
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
DECLARE
  v_now timestamptz := now();
  r "{schema}"."{table}"%ROWTYPE;
  x "{schema}"."{table}_holds"%ROWTYPE;
  h record;
  -- Whether this call took an entry out of the queue.
  v_left boolean;
BEGIN
  remaining_us := 0;
  -- (No lock row leaves every field of r null.)
  SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key FOR UPDATE;
  DELETE FROM "{schema}"."{table}_waiters" AS w
    WHERE w.channel = p_channel AND w.ticket = p_ticket;
  v_left := FOUND;
  IF r.kind <> 0 THEN
    -- A shared/permit key: the hold handed to this call, if any, else what
    -- its leaving lets through (readers queued behind a writer that gave
    -- up join the readers holding).
    -- (Claimed already, 'c …': a claiming leave of this call landed and
    -- its reply was lost. A claim again answers it; a plain leave, which
    -- follows when the call failed, gives it back: the call never had it.)
    SELECT * INTO x FROM "{schema}"."{table}_holds" AS y
      WHERE y.key = p_key AND y.owner = p_owner AND y.expires_at > v_now
        AND (y.granted_to = p_channel || ' ' || p_ticket
             OR y.granted_to = 'c ' || p_channel || ' ' || p_ticket);
    IF FOUND AND p_claim THEN
      UPDATE "{schema}"."{table}_holds" AS y SET granted_to = 'c ' || p_channel || ' ' || p_ticket
        WHERE y.key = p_key AND y.fence = x.fence;
      code := 1;
      fence := x.fence;
      acquired_us := "{schema}"."{table}_us"(x.acquired_at);
      RETURN;
    END IF;
    IF FOUND THEN
      DELETE FROM "{schema}"."{table}_holds" AS y WHERE y.key = p_key AND y.fence = x.fence;
      code := 2;
    ELSE
      code := 0;
    END IF;
    PERFORM "{schema}"."{table}_settle"(p_key);
    IF code = 0 AND v_left THEN
      PERFORM "{schema}"."{table}_nudge"(p_key, p_channel, p_ticket);
    END IF;
    remaining_us := greatest(0, "{schema}"."{table}_us"(coalesce(
      (SELECT min(y.expires_at) FROM "{schema}"."{table}_holds" AS y WHERE y.key = p_key AND y.expires_at > v_now),
      v_now)) - "{schema}"."{table}_us"(v_now));
    RETURN;
  END IF;
  IF r.key IS NOT NULL AND r.expires_at > v_now AND r.owner = p_owner
     AND (r.granted_to = p_channel || ' ' || p_ticket
          OR r.granted_to = 'c ' || p_channel || ' ' || p_ticket) THEN
    IF p_claim THEN
      -- Claimed (as in _acquire): never passed on after this.
      UPDATE "{schema}"."{table}" AS l SET granted_to = 'c ' || p_channel || ' ' || p_ticket
        WHERE l.key = p_key;
      code := 1;
      fence := r.fence;
      acquired_us := "{schema}"."{table}_us"(r.acquired_at);
      RETURN;
    END IF;
    h := "{schema}"."{table}_hand_off"(p_key, NULL, NULL);
    IF h.fence IS NULL THEN
      DELETE FROM "{schema}"."{table}" AS l WHERE l.key = p_key;
    END IF;
    code := 2;
    RETURN;
  END IF;
  code := 0;
  IF r.key IS NOT NULL THEN
    remaining_us := greatest(0, "{schema}"."{table}_us"(r.expires_at) - "{schema}"."{table}_us"(v_now));
  END IF;
  IF v_left THEN
    PERFORM "{schema}"."{table}_nudge"(p_key, p_channel, p_ticket);
  END IF;
END
$$;

-- pass on: the lock was handed to ticket `p_ticket` of channel `p_channel`
-- under `p_fence`, and that waiter is gone (its call was dropped before its
-- leave ran): the next live waiter gets it, or the row goes. 1 passed on, 0
-- nothing to do (that grant is over: released, passed on, taken back, or
-- claimed by its waiter through _acquire or _leave, which clear
-- `granted_to`).
CREATE OR REPLACE FUNCTION "{schema}"."{table}_pass_on"(
  p_key text, p_channel text, p_ticket bigint, p_fence bigint)
RETURNS int
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
DECLARE
  r "{schema}"."{table}"%ROWTYPE;
  h record;
BEGIN
  SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key FOR UPDATE;
  IF FOUND AND r.kind <> 0 THEN
    DELETE FROM "{schema}"."{table}_holds" AS x
      WHERE x.key = p_key AND x.fence = p_fence AND x.granted_to = p_channel || ' ' || p_ticket;
    IF NOT FOUND THEN
      RETURN 0;
    END IF;
    PERFORM "{schema}"."{table}_settle"(p_key);
    RETURN 1;
  END IF;
  IF NOT FOUND OR r.fence <> p_fence
     OR r.granted_to IS DISTINCT FROM p_channel || ' ' || p_ticket THEN
    RETURN 0;
  END IF;
  h := "{schema}"."{table}_hand_off"(p_key, NULL, NULL);
  IF h.fence IS NULL THEN
    DELETE FROM "{schema}"."{table}" AS l WHERE l.key = p_key;
  END IF;
  RETURN 1;
END
$$;

-- sweep: one bounded step over `p_blocks` heap blocks of each table from
-- block `p_from` (a TID range scan: the work is bounded whatever the table
-- size). Expired locks go to their queue's head or are deleted; waiter
-- entries whose max wait ended over a minute ago are deleted, as are
-- flight results no longer kept and flight watchers past their max wait. Returns the
-- block to start the next step from (0 after the end) and the rows removed.
CREATE OR REPLACE FUNCTION "{schema}"."{table}_sweep"(
  p_from bigint, p_blocks bigint, OUT next_block bigint, OUT removed bigint)
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
DECLARE
  v_now timestamptz := now();
  v_lo tid := format('(%s,0)', p_from)::tid;
  v_hi tid := format('(%s,0)', p_from + p_blocks)::tid;
  v_pages bigint;
  k text;
  h record;
  n bigint;
BEGIN
  removed := 0;
  FOR k IN
    SELECT l.key FROM "{schema}"."{table}" AS l
      WHERE l.ctid >= v_lo AND l.ctid < v_hi AND l.expires_at <= v_now
      FOR UPDATE SKIP LOCKED
  LOOP
    h := "{schema}"."{table}_hand_off"(k, NULL, NULL);
    IF h.fence IS NULL THEN
      DELETE FROM "{schema}"."{table}" AS l WHERE l.key = k;
      removed := removed + 1;
    END IF;
  END LOOP;
  -- Entries, results and watchers another session holds (a hand-off
  -- deleting dead entries in queue order, a flight's publish storing its
  -- result and deleting its watchers) are skipped, never waited for (the
  -- next pass takes them): deleting in physical order while that
  -- session deletes in its own order, each waiting for a row the other
  -- holds, was a deadlock (PostgreSQL then aborts one of the two).
  DELETE FROM "{schema}"."{table}_waiters" AS w
    WHERE w.ctid = ANY (ARRAY(
      SELECT d.ctid FROM "{schema}"."{table}_waiters" AS d
        WHERE d.ctid >= v_lo AND d.ctid < v_hi AND d.deadline < v_now - interval '1 minute'
        FOR UPDATE SKIP LOCKED));
  GET DIAGNOSTICS n = ROW_COUNT;
  removed := removed + n;
  DELETE FROM "{schema}"."{table}_flights" AS f
    WHERE f.ctid = ANY (ARRAY(
      SELECT d.ctid FROM "{schema}"."{table}_flights" AS d
        WHERE d.ctid >= v_lo AND d.ctid < v_hi AND d.keep_until <= v_now
        FOR UPDATE SKIP LOCKED));
  GET DIAGNOSTICS n = ROW_COUNT;
  removed := removed + n;
  DELETE FROM "{schema}"."{table}_flight_watchers" AS x
    WHERE x.ctid = ANY (ARRAY(
      SELECT d.ctid FROM "{schema}"."{table}_flight_watchers" AS d
        WHERE d.ctid >= v_lo AND d.ctid < v_hi AND d.expires_at <= v_now
        FOR UPDATE SKIP LOCKED));
  GET DIAGNOSTICS n = ROW_COUNT;
  removed := removed + n;
  v_pages := greatest(
    pg_relation_size('"{schema}"."{table}"'),
    pg_relation_size('"{schema}"."{table}_waiters"'),
    pg_relation_size('"{schema}"."{table}_flights"'),
    pg_relation_size('"{schema}"."{table}_flight_watchers"')) / current_setting('block_size')::bigint;
  next_block := p_from + p_blocks;
  IF next_block >= v_pages THEN
    next_block := 0;
  END IF;
END
$$;
