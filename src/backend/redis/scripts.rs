//! The Lua scripts (one round trip per operation) and their replies.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::Value;

use super::error::bad_reply;
use super::invoke::Script;
use crate::error::LockError;

/// Every script, hashed once per process. A call sends `EVALSHA`, and `EVAL`
/// on `NOSCRIPT` (see `invoke.rs`), so a `SCRIPT FLUSH` or a restarted server
/// costs one extra round trip on the next call, not a failure.
pub(super) struct Scripts {
    pub(super) acquire: Script,
    /// Acquire of a shared hold or a permit (see [`of_kinds`]).
    pub(super) acquire_kind: Script,
    pub(super) release: Script,
    pub(super) extend: Script,
    pub(super) claim: Script,
    pub(super) force_release: Script,
    pub(super) status: Script,
    pub(super) leave: Script,
    pub(super) metadata: Script,
    pub(super) owners: Script,
    pub(super) flight_begin: Script,
    pub(super) flight_publish: Script,
    pub(super) flight_result: Script,
}

/// Shared helpers for the slow paths (see `common.lua`).
const HELPERS: &str = include_str!("common.lua");
/// Where a script wants the helpers: after its fast path, so the fast path
/// never pays for creating their closures.
const HELPERS_MARK: &str = "-- @helpers\n";

/// Where acquire.lua sets the kind it takes.
const KIND_LINE: &str = "local kind = ''\n";

/// Where acquire.lua's fast path (a fresh key: no holder, no holds, nobody
/// queued) takes the lock; the variant for other kinds adds its hold there
/// instead ([`KINDS_FAST_PATH`]).
const KINDS_FAST_MARK: &str = "  -- @kinds-fast-path\n";

/// The fast path of a shared hold or a permit on a fresh key: the first
/// hold, with no helper closures created, no pruning (there is nothing to
/// prune), no retry lookup (a retry's hold would be there) and no hand-off
/// (nobody is queued): seven calls where the slow path makes fourteen. The
/// hold as `add_hold` (common.lua) writes it; the reply as the slow path's.
const KINDS_FAST_PATH: &str = "  do
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local grant, attempt, owner = string.match(ARGV[2], '^%d+ (%S+) (%S+) (.+)$')
    local f = string.format('%d', redis.call('INCR', KEYS[2]))
    local expiry = string.format('%d', now + tonumber(ARGV[1]))
    redis.call('HSET', KEYS[6], 'k', ARGV[6],
      f, string.format('%s %d %s %s %s', expiry, now, attempt, grant, owner),
      'a' .. attempt .. ' ' .. owner, f)
    redis.call('ZADD', KEYS[7], expiry, f)
    redis.call('PEXPIRE', KEYS[6], 2 * ARGV[1])
    redis.call('PEXPIRE', KEYS[7], 2 * ARGV[1])
    return {1, f, now, now}
  end
";

/// acquire.lua for shared holds and permits: the kind comes from ARGV[6],
/// and the fast path adds a hold of it ([`KINDS_FAST_PATH`]). A variant
/// rather than an argument, so that the exclusive acquire (and a flight's
/// begin, which embeds it with other arguments) stays as it was, at the same
/// cost.
fn of_kinds(acquire: &str) -> String {
    acquire
        .replacen(KINDS_FAST_MARK, KINDS_FAST_PATH, 1)
        .replacen(KIND_LINE, "local kind = ARGV[6]\n", 1)
}

/// A script's source with the helpers spliced in at its marker (if any);
/// `legacy`: the variant that keeps per-lock fence counters in step (see
/// `legacy.rs`).
fn source(script: &str, legacy: bool) -> String {
    let spliced = script.replacen(HELPERS_MARK, HELPERS, 1);
    if legacy {
        super::legacy::keeping_counters(spliced)
    } else {
        spliced
    }
}

impl Scripts {
    fn new(legacy: bool) -> Self {
        let src = |script: &str| source(script, legacy);
        Scripts {
            acquire: Script::new(&src(include_str!("acquire.lua"))),
            acquire_kind: Script::new(&src(&of_kinds(include_str!("acquire.lua")))),
            release: Script::new(&src(include_str!("release.lua"))),
            extend: Script::new(&src(include_str!("extend.lua"))),
            claim: Script::new(&src(include_str!("claim.lua"))),
            force_release: Script::new(&src(include_str!("force_release.lua"))),
            status: Script::new(&src(include_str!("status.lua"))),
            leave: Script::new(&src(include_str!("leave.lua"))),
            metadata: Script::new(include_str!("meta.lua")),
            owners: Script::new(include_str!("owners.lua")),
            // A flight's begin is acquire's script inside a function (its
            // fast path included), after a look for a fresh result.
            flight_begin: Script::new(&src(&include_str!("flight_begin.lua").replacen(
                "-- @acquire\n",
                include_str!("acquire.lua"),
                1,
            ))),
            flight_publish: Script::new(&src(include_str!("flight_publish.lua"))),
            // KEYS = a flight's result.
            flight_result: Script::new("return redis.call('HMGET', KEYS[1], 'seq', 'value')"),
        }
    }
}

/// The scripts.
pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts::new(false));
/// The scripts while versions with per-lock fence counters may still run
/// ([`RedisBackend::keep_legacy_fence_counters`](super::RedisBackend::keep_legacy_fence_counters)).
pub(super) static LEGACY_SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts::new(true));

/// The elements of an array reply.
pub(super) fn array(value: Value, what: &str) -> Result<Vec<Value>, LockError> {
    match value {
        Value::Array(items) | Value::Set(items) => Ok(items),
        _ => Err(bad_reply(what)),
    }
}

/// An integer, sent either as an integer or as a decimal string.
pub(super) fn int(value: &Value, what: &str) -> Result<i64, LockError> {
    let parsed = match value {
        Value::Int(n) => Some(*n),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok().and_then(|s| s.parse().ok()),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    };
    parsed.ok_or_else(|| bad_reply(what))
}

/// Element `i` of `items` as an integer.
pub(super) fn int_at(items: &[Value], i: usize, what: &str) -> Result<i64, LockError> {
    items
        .get(i)
        .ok_or_else(|| bad_reply(what))
        .and_then(|v| int(v, what))
}

/// Element `i` of `items` as a non-negative integer (fences, timestamps).
pub(super) fn uint_at(items: &[Value], i: usize, what: &str) -> Result<u64, LockError> {
    u64::try_from(int_at(items, i, what)?).map_err(|_| bad_reply(what))
}

/// Element `i` of `items` as a UTF-8 string.
pub(super) fn string_at(items: &[Value], i: usize, what: &str) -> Result<String, LockError> {
    match items.get(i) {
        Some(Value::BulkString(bytes)) => {
            String::from_utf8(bytes.clone()).map_err(|_| bad_reply(what))
        }
        Some(Value::SimpleString(s)) => Ok(s.clone()),
        _ => Err(bad_reply(what)),
    }
}

/// A server timestamp in milliseconds since the Unix epoch, capped at the
/// end of year 9999: a garbled reply must not overflow a platform's
/// `SystemTime` (Windows' ends in year 30828), nor that time plus a TTL.
pub(super) fn server_time(ms: u64) -> SystemTime {
    const YEAR_9999_END_MS: u64 = 253_402_300_799_999;
    UNIX_EPOCH + Duration::from_millis(ms.min(YEAR_9999_END_MS))
}

/// A `PTTL`-style reply as a duration; negative ("no key", "no TTL") is zero.
pub(super) fn remaining(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Whole milliseconds, rounded up (a lock never expires earlier than asked).
pub(super) fn ceil_ms(d: Duration) -> u64 {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_times_are_capped() {
        assert_eq!(
            server_time(1_700_000_000_123),
            UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)
        );
        let capped = server_time(u64::MAX);
        assert_eq!(capped, server_time(253_402_300_799_999));
        // A year's TTL on top still fits.
        let _ = capped + Duration::from_secs(366 * 24 * 3600);
    }

    #[test]
    fn ceil_ms_rounds_up() {
        assert_eq!(ceil_ms(Duration::from_millis(5)), 5);
        assert_eq!(ceil_ms(Duration::from_micros(5_001)), 6);
        assert_eq!(ceil_ms(Duration::from_micros(999)), 1);
        assert_eq!(ceil_ms(Duration::ZERO), 0);
    }

    #[test]
    fn replies_parse_without_panicking() {
        let items = vec![
            Value::Int(1),
            Value::BulkString(b"42".to_vec()),
            Value::BulkString(b"x".to_vec()),
            Value::Nil,
        ];
        assert_eq!(int_at(&items, 0, "t").unwrap(), 1);
        assert_eq!(uint_at(&items, 1, "t").unwrap(), 42);
        assert!(int_at(&items, 2, "t").is_err());
        assert!(int_at(&items, 3, "t").is_err());
        assert!(int_at(&items, 9, "t").is_err());
        assert!(uint_at(&[Value::Int(-1)], 0, "t").is_err());
        assert_eq!(string_at(&items, 2, "t").unwrap(), "x");
        assert!(array(Value::Nil, "t").is_err());
        assert_eq!(remaining(-2), Duration::ZERO);
    }

    #[test]
    fn helpers_are_spliced_where_marked() {
        for (name, script) in [
            ("acquire", include_str!("acquire.lua")),
            ("release", include_str!("release.lua")),
            ("force_release", include_str!("force_release.lua")),
            ("leave", include_str!("leave.lua")),
        ] {
            assert_eq!(script.matches(HELPERS_MARK).count(), 1, "{name}");
            let src = source(script, false);
            assert!(src.contains("local function hand_off"), "{name}");
            assert!(!src.contains(HELPERS_MARK), "{name}");
        }
        for script in [include_str!("extend.lua"), include_str!("status.lua")] {
            assert!(!script.contains(HELPERS_MARK));
        }
    }

    #[test]
    fn the_kinds_variant_reads_the_kind_and_adds_a_hold_on_its_fast_path() {
        let acquire = include_str!("acquire.lua");
        assert_eq!(acquire.matches(KIND_LINE).count(), 1);
        assert_eq!(acquire.matches(super::super::legacy::FAST_PATH).count(), 1);
        assert_eq!(acquire.matches(KINDS_FAST_MARK).count(), 1);
        let kinds = of_kinds(acquire);
        assert!(kinds.contains("local kind = ARGV[6]\n"));
        // Inside the fast path's test, and returning before the exclusive
        // take.
        let test = kinds.find(super::super::legacy::FAST_PATH).unwrap();
        let hold = kinds.find(KINDS_FAST_PATH).unwrap();
        assert!(test < hold && hold < kinds.find("redis.call('PSETEX'").unwrap());
        // Off (with the exclusive one) while old versions may run.
        assert!(!source(&kinds, true).contains(super::super::legacy::FAST_PATH));
    }

    #[test]
    fn scripts_compile_into_distinct_hashes() {
        let s = &*SCRIPTS;
        let hashes = [
            s.acquire.hash(),
            s.acquire_kind.hash(),
            s.release.hash(),
            s.extend.hash(),
            s.force_release.hash(),
            s.status.hash(),
            s.leave.hash(),
        ];
        for (i, a) in hashes.iter().enumerate() {
            for b in &hashes[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
