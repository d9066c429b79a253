//! Lock headers: on responses, they describe a lock kept after the response
//! (`auto_release(false)`), so the caller can release it later, e.g. through
//! the admin API's `DELETE /locks/{key}` with the same `lock-owner` header;
//! with [`LockLayer::lock_headers`](crate::LockLayer::lock_headers) on, every
//! lock of a locked response (Forrst's lock data), the owner only for kept
//! ones. On requests, a client asks for a lock with them when the route
//! uses [`ClientLocks`](crate::ClientLocks).
//!
//! Keys and routes are percent-encoded: every byte but RFC 3986's unreserved
//! characters (`A`–`Z`, `a`–`z`, `0`–`9`, `-`, `.`, `_`, `~`) and `:` and `@`,
//! which mean themselves both in a path segment and in a query value. So a
//! value can be echoed as it is into the admin API's path
//! (`/locks/{lock-key}`) or query (`?route={lock-route}`): `+`, `&`, `=`,
//! `/`, `%` and the rest are escaped.

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::lock::HeldLock;
use crate::percent;
use crate::time::rfc3339;

/// `lock-key`: the user's key, percent-encoded (request and response).
pub const LOCK_KEY: HeaderName = HeaderName::from_static("lock-key");
/// `lock-route`: the route pattern of a route-scoped lock, percent-encoded
/// (absent for a global lock).
pub const LOCK_ROUTE: HeaderName = HeaderName::from_static("lock-route");
/// `lock-owner`: the owner token (the credential to release the lock;
/// request and response).
pub const LOCK_OWNER: HeaderName = HeaderName::from_static("lock-owner");
/// `lock-fence`: the fencing token, a decimal integer.
pub const LOCK_FENCE: HeaderName = HeaderName::from_static("lock-fence");
/// `lock-expires-at`: the expiry, RFC 3339 in UTC with milliseconds.
pub const LOCK_EXPIRES_AT: HeaderName = HeaderName::from_static("lock-expires-at");

/// `lock-scope`: `function` (the route's namespace, Forrst's name for it)
/// or `global` (request and response).
pub const LOCK_SCOPE: HeaderName = HeaderName::from_static("lock-scope");
/// `lock-acquired`: `true` on a response whose request holds the lock.
pub const LOCK_ACQUIRED: HeaderName = HeaderName::from_static("lock-acquired");
/// `lock-ttl`: the TTL a client asks for (request, [`ClientLocks`](crate::ClientLocks)):
/// whole seconds, or a number with a unit `ms`, `s`, `m` or `h` (`500ms`, `30s`).
pub const LOCK_TTL: HeaderName = HeaderName::from_static("lock-ttl");
/// `lock-block`: how long the client will wait for a busy lock (request,
/// [`ClientLocks`](crate::ClientLocks)); same format as `lock-ttl`; default no wait.
pub const LOCK_BLOCK: HeaderName = HeaderName::from_static("lock-block");
/// `lock-auto-release`: `true` (default) or `false`, to keep the lock after
/// the response (request, [`ClientLocks`](crate::ClientLocks)).
pub const LOCK_AUTO_RELEASE: HeaderName = HeaderName::from_static("lock-auto-release");
/// `lock-mode`: `exclusive` (default), `shared` or `permits=N`: the kind of
/// hold a client asks for (request, [`ClientLocks`](crate::ClientLocks);
/// see [`LockKind`](crate::LockKind)).
pub const LOCK_MODE: HeaderName = HeaderName::from_static("lock-mode");

/// Append the headers describing `lock` to `headers`; the owner token only
/// for a lock `kept` after the response.
pub(crate) fn append(headers: &mut HeaderMap, lock: &HeldLock, kept: bool) {
    let mut put = |name: &HeaderName, value: String| {
        if let Ok(v) = HeaderValue::try_from(value) {
            headers.append(name.clone(), v);
        }
    };
    put(&LOCK_ACQUIRED, "true".to_owned());
    put(&LOCK_KEY, percent::encode(lock.key()));
    match lock.lock_key().route_pattern() {
        Some(route) => {
            put(&LOCK_ROUTE, percent::encode(route));
            put(&LOCK_SCOPE, "function".to_owned());
        }
        None => put(&LOCK_SCOPE, "global".to_owned()),
    }
    if kept {
        put(&LOCK_OWNER, lock.owner().to_owned());
    }
    put(&LOCK_FENCE, lock.fence().to_string());
    put(&LOCK_EXPIRES_AT, rfc3339(lock.expires_at()));
}
