//! What a new connection checks on its server: a version the scripts run
//! on, and an eviction policy that cannot drop locks.

use deadpool_redis::redis::RedisError;

use crate::error::LockError;

/// Warn when the `CONFIG GET maxmemory-policy` reply names a policy that
/// can evict locks.
pub(super) fn warn_about_policy(reply: Result<Vec<String>, RedisError>) {
    match reply {
        Ok(reply) => {
            if let Some(risk) = reply.get(1).and_then(|p| eviction_risk(p)) {
                tracing::warn!(
                    policy = %reply[1],
                    "Redis may evict tower-lock's keys: {risk}. Run the lock Redis with \
                     `maxmemory-policy noeviction`"
                );
            }
        }
        // CONFIG renamed or not allowed (managed Redis): cannot tell.
        Err(e) => tracing::debug!(error = %e, "could not read maxmemory-policy"),
    }
}

/// The oldest Redis the scripts run on: they read `TIME` before writing,
/// which needs effects replication, the default from 5.0 on (earlier
/// servers refuse such scripts).
pub(super) const MIN_REDIS_MAJOR: u32 = 5;

/// `Err` for a server older than `min_major` ([`MIN_REDIS_MAJOR`] for one
/// server), from `INFO server`. A server that does not say its version is
/// given the benefit of the doubt.
pub(super) fn check_version(info: &str, min_major: u32) -> Result<(), LockError> {
    let version = info
        .lines()
        .find_map(|line| line.trim().strip_prefix("redis_version:"));
    let major = version.and_then(|v| v.split('.').next()?.parse::<u32>().ok());
    match (version, major) {
        (Some(version), Some(major)) if major < min_major => Err(LockError::BackendUnavailable(
            format!("Redis {version} is too old: tower-lock needs Redis {min_major}.0 or newer")
                .into(),
        )),
        _ => Ok(()),
    }
}

/// What an eviction policy can do to locks; `None` for `noeviction`.
pub(super) fn eviction_risk(policy: &str) -> Option<&'static str> {
    if policy.starts_with("allkeys-") {
        Some("it may evict fence counters (fences then repeat) and live locks (two holders)")
    } else if policy.starts_with("volatile-") {
        Some("it may evict live locks, which have a TTL (two holders)")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_older_than_five_are_refused() {
        let info = |v: &str| format!("# Server\r\nredis_version:{v}\r\nredis_mode:standalone\r\n");
        assert!(check_version(&info("7.0.15"), 5).is_ok());
        assert!(check_version(&info("5.0.0"), 5).is_ok());
        let old = check_version(&info("4.0.9"), 5).unwrap_err();
        assert!(old.to_string().contains("4.0.9"), "{old}");
        assert!(check_version("no version here", 5).is_ok());
        // Sharded pub/sub, for a cluster.
        assert!(check_version(&info("6.2.14"), 7).is_err());
    }

    #[test]
    fn only_noeviction_is_safe() {
        assert_eq!(eviction_risk("noeviction"), None);
        assert!(eviction_risk("allkeys-lru").unwrap().contains("fence"));
        assert!(
            eviction_risk("volatile-ttl")
                .unwrap()
                .contains("live locks")
        );
    }
}
