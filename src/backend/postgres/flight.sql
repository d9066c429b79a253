-- tower-lock PostgreSQL functions for single-flight (see flight.rs), after
-- functions.sql (they call its _acquire and _hand_off). `{schema}` and
-- `{table}` as in schema.sql.

-- flight begin: a fresh result (code 2: seq, value; nothing taken; also
-- when one committed while the acquire waited for the row), else
-- acquire without queueing: taken (code 1, as acquire) or busy (code 0:
-- remaining_us; the caller joins the flight's watchers, seq = the newest
-- kept result's, or 0).
CREATE OR REPLACE FUNCTION "{schema}"."{table}_flight_begin"(
  p_key text, p_owner text, p_attempt bigint, p_ttl_ms bigint,
  p_channel text, p_ticket bigint, p_keep_ms bigint,
  OUT code int, OUT fence bigint, OUT acquired_us bigint, OUT now_us bigint,
  OUT remaining_us bigint, OUT seq bigint, OUT value bytea)
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
DECLARE
  a record;
BEGIN
  SELECT f.seq, f.value INTO seq, value FROM "{schema}"."{table}_flights" AS f
    WHERE f.key = p_key AND f.fresh_until > now();
  IF FOUND THEN
    code := 2;
    RETURN;
  END IF;
  SELECT * INTO a FROM "{schema}"."{table}_acquire"(
    p_key, p_owner, p_attempt, p_ttl_ms, 0, NULL, NULL) AS x;
  -- A leader's publish may have committed while the acquire waited for its
  -- row (the look above could not see it yet): this statement sees it. A
  -- fresh result then answers this caller, and a lock taken meanwhile goes
  -- back, as if it had never been taken.
  SELECT f.seq, f.value INTO seq, value FROM "{schema}"."{table}_flights" AS f
    WHERE f.key = p_key AND f.fresh_until > now();
  IF FOUND THEN
    IF a.code = 1 THEN
      PERFORM "{schema}"."{table}_release"(p_key, p_owner, a.fence);
    END IF;
    code := 2;
    RETURN;
  END IF;
  code := a.code;
  fence := a.fence;
  acquired_us := a.acquired_us;
  now_us := a.now_us;
  remaining_us := a.remaining_us;
  IF code = 1 THEN
    RETURN;
  END IF;
  INSERT INTO "{schema}"."{table}_flight_watchers" AS w (key, channel, ticket, expires_at)
    VALUES (p_key, p_channel, p_ticket, now() + p_keep_ms * interval '1 millisecond')
    ON CONFLICT DO NOTHING;
  SELECT f.seq INTO seq FROM "{schema}"."{table}_flights" AS f
    WHERE f.key = p_key AND f.keep_until > now();
  seq := coalesce(seq, 0);
END
$$;

-- flight publish: the leader (`p_owner`, holding `p_key` under `p_fence`)
-- shares its result: stored unless a newer one is, every watcher told
-- ('f <ticket> <seq>[ <value in hex, up to 3800 bytes>]' on its channel,
-- delivered at commit), the lock
-- released as a release does (the oldest queued caller gets it and reads
-- the stored result). Kept for `p_keep_ms` only while callers wait for it
-- (flight watchers, or queued for the lock); with nobody waiting it is kept
-- for its result TTL alone, and not stored at all without one. 1 done, 0
-- not held (expired: passed on, not stored), -1 held by another owner or
-- under another fence.
CREATE OR REPLACE FUNCTION "{schema}"."{table}_flight_publish"(
  p_key text, p_owner text, p_fence bigint, p_value bytea,
  p_fresh_ms bigint, p_keep_ms bigint)
RETURNS int
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
DECLARE
  v_now timestamptz := now();
  r "{schema}"."{table}"%ROWTYPE;
  w record;
  h record;
  v_news text;
  v_keep_ms bigint := p_keep_ms;
BEGIN
  SELECT * INTO r FROM "{schema}"."{table}" AS l WHERE l.key = p_key FOR UPDATE;
  IF NOT FOUND THEN
    RETURN 0;
  END IF;
  IF r.expires_at > v_now THEN
    IF r.owner <> p_owner OR r.fence <> p_fence THEN
      RETURN -1;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM "{schema}"."{table}_flight_watchers" AS x
                     WHERE x.key = p_key AND x.expires_at > v_now)
       AND NOT EXISTS (SELECT 1 FROM "{schema}"."{table}_waiters" AS x
                         WHERE x.key = p_key AND x.deadline > v_now) THEN
      v_keep_ms := p_fresh_ms;
    END IF;
    IF v_keep_ms = 0 THEN
      -- Nobody waits for it, and it answers nobody new.
      DELETE FROM "{schema}"."{table}_flights" AS f WHERE f.key = p_key AND f.seq < p_fence;
    END IF;
    INSERT INTO "{schema}"."{table}_flights" AS f (key, seq, value, fresh_until, keep_until)
      SELECT p_key, p_fence, p_value, v_now + p_fresh_ms * interval '1 millisecond',
             v_now + v_keep_ms * interval '1 millisecond'
        WHERE v_keep_ms > 0
      ON CONFLICT (key) DO UPDATE SET
          seq = excluded.seq, value = excluded.value,
          fresh_until = excluded.fresh_until, keep_until = excluded.keep_until
        WHERE f.seq < excluded.seq OR f.keep_until <= v_now;
    IF FOUND THEN
      -- A small result travels in the notification itself (hex: payloads
      -- are text of at most 8000 bytes), so its watchers need no read.
      v_news := ' ' || p_fence;
      IF octet_length(p_value) <= 3800 THEN
        v_news := v_news || ' ' || encode(p_value, 'hex');
      END IF;
      FOR w IN
        DELETE FROM "{schema}"."{table}_flight_watchers" AS x WHERE x.key = p_key
          RETURNING x.channel, x.ticket
      LOOP
        PERFORM pg_notify(w.channel, 'f ' || w.ticket || v_news);
      END LOOP;
    END IF;
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
