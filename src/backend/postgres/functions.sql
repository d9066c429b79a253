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

-- STABLE, not IMMUTABLE: extract() from a timestamptz is stable, and a SQL
-- function declared less volatile than its body is never inlined; called
-- instead of inlined, it cost ~25 µs a call (measured: 60 µs of an acquire).
CREATE OR REPLACE FUNCTION "{schema}"."{table}_us"(t timestamptz) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT floor(extract(epoch FROM t) * 1000000)::bigint $$;

-- (Schema version 1 before round 3 had a `p_now` argument: replaced.)
DROP FUNCTION IF EXISTS "{schema}"."{table}_hand_off"(text, timestamptz, text, bigint);

-- Hand the (free or expired) lock `p_key`, whose row the caller has
-- locked, to the oldest waiter whose max wait has not ended, skipping and
-- deleting dead entries. The grant is dated when it is made (the clock, not
-- the caller's transaction start: a release that waited for the row would
-- otherwise hand over a lease that began, or even ended, before the grant),
-- and its fence drawn then. The new holder gets its own TTL from then and
-- is told through its backend's channel ('<ticket> <fence> <granted us>
-- <key>', delivered at commit), unless it is the caller (`p_channel`,
-- `p_ticket`). Returns the new fence, the grant's time and whether it went
-- to the caller, or a NULL fence when nobody is waiting (the caller then
-- removes the row or takes the lock).
CREATE OR REPLACE FUNCTION "{schema}"."{table}_hand_off"(
  p_key text, p_channel text, p_ticket bigint,
  OUT fence bigint, OUT granted_us bigint, OUT to_caller boolean)
LANGUAGE plpgsql AS $$
DECLARE
  v_at timestamptz := clock_timestamp();
  v_place bigint;
  w "{schema}"."{table}_waiters"%ROWTYPE;
BEGIN
  to_caller := false;
  LOOP
    SELECT q.place INTO v_place FROM "{schema}"."{table}_waiters" AS q
      WHERE q.key = p_key ORDER BY q.place LIMIT 1;
    IF NOT FOUND THEN
      fence := NULL;
      RETURN;
    END IF;
    DELETE FROM "{schema}"."{table}_waiters" AS d
      WHERE d.key = p_key AND d.place = v_place
      RETURNING d.* INTO w;
    -- Gone meanwhile: the sweep deleted that (long dead) entry without the
    -- row lock. The next statement sees its deletion: look again, so a
    -- live waiter behind it is never taken for an empty queue.
    CONTINUE WHEN NOT FOUND;
    IF w.deadline > v_at THEN
      UPDATE "{schema}"."{table}" AS l SET
          owner = w.owner,
          attempt = w.attempt,
          fence = nextval('"{schema}"."{table}_fence"'),
          acquired_at = v_at,
          expires_at = v_at + w.ttl_ms * interval '1 millisecond',
          granted_to = w.channel || ' ' || w.ticket,
          queued = EXISTS (SELECT 1 FROM "{schema}"."{table}_waiters" AS q WHERE q.key = p_key)
        WHERE l.key = p_key
        RETURNING l.fence INTO fence;
      granted_us := "{schema}"."{table}_us"(v_at);
      to_caller := w.channel = p_channel AND w.ticket = p_ticket;
      IF to_caller IS NOT TRUE THEN
        to_caller := false;
        PERFORM pg_notify(w.channel, w.ticket || ' ' || fence || ' ' || granted_us || ' ' || p_key);
      END IF;
      RETURN;
    END IF;
  END LOOP;
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

-- acquire: take `p_key` for `p_owner`/`p_attempt` for `p_ttl_ms`; a waiter
-- (`p_wait_ms` > 0 with a channel and ticket) joins the queue when busy.
-- code 1: acquired (fence, acquired_us, now_us);
-- code 0: busy (remaining_us of the holder; created: this call queued anew).
CREATE OR REPLACE FUNCTION "{schema}"."{table}_acquire"(
  p_key text, p_owner text, p_attempt bigint, p_ttl_ms bigint,
  p_wait_ms bigint, p_channel text, p_ticket bigint,
  OUT code int, OUT fence bigint, OUT acquired_us bigint, OUT now_us bigint,
  OUT remaining_us bigint, OUT created boolean)
LANGUAGE plpgsql AS $$
DECLARE
  v_now timestamptz := now();
  v_ttl interval := p_ttl_ms * interval '1 millisecond';
  v_handed bigint;
  r "{schema}"."{table}"%ROWTYPE;
  h record;
BEGIN
  now_us := "{schema}"."{table}_us"(v_now);
  created := false;
  LOOP
    -- Fast path: free (as the acquire statement's own, see _redraw).
    INSERT INTO "{schema}"."{table}" AS l
        (key, owner, attempt, fence, acquired_at, expires_at)
      VALUES (p_key, p_owner, p_attempt, nextval('"{schema}"."{table}_fence"'),
              v_now, v_now + v_ttl)
      ON CONFLICT (key) DO NOTHING
      RETURNING l.fence INTO fence;
    IF FOUND THEN
      IF fence <> pg_sequence_last_value('"{schema}"."{table}_fence"') THEN
        fence := "{schema}"."{table}_redraw"(p_key, fence);
      END IF;
      code := 1;
      acquired_us := now_us;
      RETURN;
    END IF;
    SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key FOR UPDATE;
    -- Not found: the row was deleted (released) since the insert saw it.
    EXIT WHEN FOUND;
  END LOOP;

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
      WHERE l.key = p_key;
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
        RETURN;
      END IF;
      v_handed := h.fence;
    END IF;
    IF v_handed IS NULL THEN
      UPDATE "{schema}"."{table}" AS l SET
          owner = p_owner, attempt = p_attempt,
          fence = nextval('"{schema}"."{table}_fence"'),
          acquired_at = v_now, expires_at = v_now + v_ttl,
          queued = false, granted_to = NULL
        WHERE l.key = p_key
        RETURNING l.fence INTO fence;
      code := 1;
      acquired_us := now_us;
      RETURN;
    END IF;
    SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key;
  END IF;

  -- Busy.
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
LANGUAGE plpgsql AS $$
DECLARE
  v_now timestamptz := now();
  r "{schema}"."{table}"%ROWTYPE;
  h record;
BEGIN
  -- Fast path: ours, live, nobody queued.
  DELETE FROM "{schema}"."{table}" AS l
    WHERE l.key = p_key AND l.owner = p_owner AND (p_fence IS NULL OR l.fence = p_fence)
      AND l.expires_at > v_now AND NOT l.queued;
  IF FOUND THEN
    RETURN 1;
  END IF;
  SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key FOR UPDATE;
  IF NOT FOUND THEN
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
LANGUAGE plpgsql AS $$
DECLARE
  v_now timestamptz := now();
  r "{schema}"."{table}"%ROWTYPE;
BEGIN
  now_us := "{schema}"."{table}_us"(v_now);
  UPDATE "{schema}"."{table}" AS l SET expires_at = v_now + p_ttl_ms * interval '1 millisecond'
    WHERE l.key = p_key AND l.owner = p_owner AND (p_fence IS NULL OR l.fence = p_fence)
      AND l.expires_at > v_now
    RETURNING l.* INTO r;
  IF FOUND THEN
    code := 1;
    fence := r.fence;
    acquired_us := "{schema}"."{table}_us"(r.acquired_at);
    RETURN;
  END IF;
  SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key;
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
LANGUAGE plpgsql AS $$
DECLARE
  v_now timestamptz := now();
  v_fence bigint;
  r "{schema}"."{table}"%ROWTYPE;
BEGIN
  now_us := "{schema}"."{table}_us"(v_now);
  SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key FOR UPDATE;
  IF NOT FOUND OR r.expires_at <= v_now THEN
    code := 0;
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
LANGUAGE plpgsql AS $$
DECLARE
  v_now timestamptz := now();
  r "{schema}"."{table}"%ROWTYPE;
  h record;
BEGIN
  SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key FOR UPDATE;
  IF NOT FOUND THEN
    RETURN 0;
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
-- holder's remaining_us.
CREATE OR REPLACE FUNCTION "{schema}"."{table}_leave"(
  p_key text, p_owner text, p_channel text, p_ticket bigint, p_claim boolean,
  OUT code int, OUT fence bigint, OUT acquired_us bigint, OUT remaining_us bigint)
LANGUAGE plpgsql AS $$
DECLARE
  v_now timestamptz := now();
  r "{schema}"."{table}"%ROWTYPE;
  h record;
BEGIN
  remaining_us := 0;
  -- (No lock row leaves every field of r null.)
  SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key FOR UPDATE;
  DELETE FROM "{schema}"."{table}_waiters" AS w
    WHERE w.channel = p_channel AND w.ticket = p_ticket;
  IF r.key IS NOT NULL AND r.expires_at > v_now AND r.owner = p_owner
     AND r.granted_to = p_channel || ' ' || p_ticket THEN
    IF p_claim THEN
      -- Claimed (as in _acquire): never passed on after this.
      UPDATE "{schema}"."{table}" AS l SET granted_to = NULL WHERE l.key = p_key;
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
LANGUAGE plpgsql AS $$
DECLARE
  r "{schema}"."{table}"%ROWTYPE;
  h record;
BEGIN
  SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key FOR UPDATE;
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
LANGUAGE plpgsql AS $$
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
  DELETE FROM "{schema}"."{table}_waiters" AS w
    WHERE w.ctid >= v_lo AND w.ctid < v_hi AND w.deadline < v_now - interval '1 minute';
  GET DIAGNOSTICS n = ROW_COUNT;
  removed := removed + n;
  DELETE FROM "{schema}"."{table}_flights" AS f
    WHERE f.ctid >= v_lo AND f.ctid < v_hi AND f.keep_until <= v_now;
  GET DIAGNOSTICS n = ROW_COUNT;
  removed := removed + n;
  DELETE FROM "{schema}"."{table}_flight_watchers" AS x
    WHERE x.ctid >= v_lo AND x.ctid < v_hi AND x.expires_at <= v_now;
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
