//! Fences across a rolling upgrade from per-lock fence counters.
//!
//! Versions before per-slot counters drew every fence of a lock from its own
//! counter, `{E}:fence` (`INCR`). This version draws from the slot's counter
//! and, on first use, moves a lock's old counter into it and deletes it. An
//! old process still running beside a new one would then `INCR` that
//! counter again from 1 (or from whatever it last held), and hand out fences
//! the new processes gave already: one fence, two holders, which a store
//! that accepts `fence <= stored` takes from both.
//!
//! While old versions may run, [`RedisBackend::keep_legacy_fence_counters`]
//! switches to script variants that keep each lock's old counter in step:
//! every fence drawn is above the lock's counter, and is written back to it,
//! so an old process's next `INCR` is above every fence either version gave,
//! and the next new fence above that. The acquire fast path (which never
//! reads the old counter) is off meanwhile, and every lock name keeps a
//! counter, as old versions kept.
//!
//! The upgrade path: deploy the new version with the option on; once no old
//! process runs, turn it off (a rolling restart is fine: processes with it
//! off read and delete the old counters, those with it on rewrite them, and
//! both draw above them). The old counters then go on each lock's next
//! fence.
//!
//! [`RedisBackend::keep_legacy_fence_counters`]: super::RedisBackend::keep_legacy_fence_counters

/// The acquire fast path's test: free, nobody queued, no old counter.
pub(super) const FAST_PATH: &str =
    "if redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[5], KEYS[6]) == 0 then";
/// Where `next_fence` (common.lua) deletes the old counter it moved.
const DROP_OLD: &str = "    redis.call('DEL', KEYS[5])\n  end\n  return f\n";
const KEEP_OLD: &str = "  end\n  -- Kept in step for versions that still draw from it (legacy.rs).\n  redis.call('SET', KEYS[5], string.format('%d', f))\n  return f\n";

/// `script` (helpers spliced in) as it runs while old versions may: no fast
/// path, and every fence drawn written to the lock's old counter too.
pub(super) fn keeping_counters(script: String) -> String {
    script
        .replacen(FAST_PATH, "if false then", 1)
        .replacen(DROP_OLD, KEEP_OLD, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fence_drawn_is_written_back_and_the_fast_path_is_off() {
        let helpers = include_str!("common.lua");
        assert_eq!(helpers.matches(DROP_OLD).count(), 1);
        let kept = keeping_counters(helpers.to_owned());
        assert!(!kept.contains("redis.call('DEL', KEYS[5])"));
        assert!(kept.contains("redis.call('SET', KEYS[5]"));
        let acquire = include_str!("acquire.lua");
        assert_eq!(acquire.matches(FAST_PATH).count(), 1);
        assert!(!keeping_counters(acquire.to_owned()).contains(FAST_PATH));
    }
}
