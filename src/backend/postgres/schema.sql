-- tower-lock PostgreSQL schema (version 2). `{schema}` and `{table}` are
-- replaced by the backend's names (defaults: tower_lock, locks).
-- Idempotent: every statement can run again on an existing schema.

CREATE SCHEMA IF NOT EXISTS "{schema}";

-- Every fencing token of every key comes from this one sequence, so fences
-- strictly increase per key across release, expiry, server restarts and
-- every instance, without keeping anything per key once its lock is gone.
CREATE SEQUENCE IF NOT EXISTS "{schema}"."{table}_fence" AS bigint;

-- One row per held (or expired, not yet taken over or swept) lock. For a
-- key held shared or under permits (kind 1 or 2) the row is the key's
-- anchor: every function locks it first, as for an exclusive lock, while
-- the holds themselves are rows of {table}_holds; its owner is then '' (no
-- owner token is empty), its fence that of a grant to it (not every hold's:
-- each hold has its own) and its expires_at no earlier than the latest
-- hold's (up to twice a hold's TTL later: see _acquire's fast path).
CREATE TABLE IF NOT EXISTS "{schema}"."{table}" (
  key          text        PRIMARY KEY,  -- LockKey::encoded(): scope, route, key
  owner        text        NOT NULL,     -- the holder's owner token
  attempt      bigint      NOT NULL,     -- the holder's AcquireRequest::attempt()
  fence        bigint      NOT NULL,     -- from {table}_fence
  acquired_at  timestamptz NOT NULL,     -- database clock
  expires_at   timestamptz NOT NULL,     -- database clock
  queued       boolean     NOT NULL DEFAULT false, -- someone queued behind the holder
  granted_to   text,                     -- '<channel> <ticket>' of the waiter it was handed to
  metadata     jsonb                     -- {"fence": f, "data": {..}}: metadata of acquisition f
);

-- Schema version 2: the kinds of lock (LockKind). 0 exclusive, 1 shared,
-- 2 permits (with `permits` = n). Version-1 rows are exclusive.
ALTER TABLE "{schema}"."{table}" ADD COLUMN IF NOT EXISTS kind smallint NOT NULL DEFAULT 0;
ALTER TABLE "{schema}"."{table}" ADD COLUMN IF NOT EXISTS permits int;

-- One row per hold of a key held shared or under permits: each its own
-- acquisition (owner, attempt, fence, TTL, metadata). Changed only by a
-- function holding the key's anchor row.
CREATE TABLE IF NOT EXISTS "{schema}"."{table}_holds" (
  key          text        NOT NULL,
  fence        bigint      NOT NULL,
  owner        text        NOT NULL,
  attempt      bigint      NOT NULL,
  acquired_at  timestamptz NOT NULL,
  expires_at   timestamptz NOT NULL,
  granted_to   text,                     -- as in the locks table
  metadata     jsonb,                    -- as in the locks table
  PRIMARY KEY (key, fence)
);

-- No index on owner: lookups by owner (LockBackend::held_by) scan the
-- table, which holds only held locks and rows not swept yet. An index would
-- be written on every acquisition (the owner changes each time); an app
-- with many held locks that looks them up by owner often can add one:
--   CREATE INDEX ON "{schema}"."{table}" (owner);

-- Queue order of waiters.
CREATE SEQUENCE IF NOT EXISTS "{schema}"."{table}_queue" AS bigint;

-- One row per queued acquire call (a ticket), oldest first per key.
CREATE TABLE IF NOT EXISTS "{schema}"."{table}_waiters" (
  key       text        NOT NULL,
  place     bigint      NOT NULL DEFAULT nextval('"{schema}"."{table}_queue"'),
  channel   text        NOT NULL,  -- the waiter's backend's LISTEN channel
  ticket    bigint      NOT NULL,  -- the acquire call, unique within its channel
  owner     text        NOT NULL,
  attempt   bigint      NOT NULL,
  ttl_ms    bigint      NOT NULL,  -- the TTL it asked for, counted from a hand-off
  deadline  timestamptz NOT NULL,  -- its max wait ends: skipped after that
  PRIMARY KEY (key, place),
  UNIQUE (channel, ticket)
);
ALTER TABLE "{schema}"."{table}_waiters" ADD COLUMN IF NOT EXISTS kind smallint NOT NULL DEFAULT 0;
ALTER TABLE "{schema}"."{table}_waiters" ADD COLUMN IF NOT EXISTS permits int;

-- Single-flight (SingleFlight, SingleFlightLayer): the latest result of
-- each flight, while kept. The flight's lock is a row of the locks table
-- under the flight's key ('f:<name>').
CREATE TABLE IF NOT EXISTS "{schema}"."{table}_flights" (
  key          text        PRIMARY KEY,  -- the flight's LockKey::encoded()
  seq          bigint      NOT NULL,     -- the fence it was computed under
  value        bytea       NOT NULL,     -- the encoded result
  fresh_until  timestamptz NOT NULL,     -- answers new callers until then
  keep_until   timestamptz NOT NULL      -- kept for callers already waiting until then
);

-- Callers waiting for a flight's result, told through their backend's
-- channel ('f <ticket> <seq>') when it is published.
CREATE TABLE IF NOT EXISTS "{schema}"."{table}_flight_watchers" (
  key         text        NOT NULL,
  channel     text        NOT NULL,
  ticket      bigint      NOT NULL,
  expires_at  timestamptz NOT NULL,    -- their max wait ends: swept after that
  PRIMARY KEY (key, channel, ticket)
);

COMMENT ON TABLE "{schema}"."{table}" IS 'tower-lock locks, schema version 2';
