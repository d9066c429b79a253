//! Response headers that describe a lock kept after the response
//! (`auto_release(false)`), so the caller can release it later, e.g. through
//! the admin API's `DELETE /locks/{key}` with the same `lock-owner` header.
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

/// `lock-key`: the user's key, percent-encoded.
pub const LOCK_KEY: HeaderName = HeaderName::from_static("lock-key");
/// `lock-route`: the route pattern of a route-scoped lock, percent-encoded
/// (absent for a global lock).
pub const LOCK_ROUTE: HeaderName = HeaderName::from_static("lock-route");
/// `lock-owner`: the owner token (the credential to release the lock).
pub const LOCK_OWNER: HeaderName = HeaderName::from_static("lock-owner");
/// `lock-fence`: the fencing token, a decimal integer.
pub const LOCK_FENCE: HeaderName = HeaderName::from_static("lock-fence");
/// `lock-expires-at`: the expiry, RFC 3339 in UTC with milliseconds.
pub const LOCK_EXPIRES_AT: HeaderName = HeaderName::from_static("lock-expires-at");

/// Append the headers describing `lock` to `headers`.
pub(crate) fn append(headers: &mut HeaderMap, lock: &HeldLock) {
    let mut put = |name: &HeaderName, value: String| {
        if let Ok(v) = HeaderValue::try_from(value) {
            headers.append(name.clone(), v);
        }
    };
    put(&LOCK_KEY, percent::encode(lock.key()));
    if let Some(route) = lock.lock_key().route_pattern() {
        put(&LOCK_ROUTE, percent::encode(route));
    }
    put(&LOCK_OWNER, lock.owner().to_owned());
    put(&LOCK_FENCE, lock.fence().to_string());
    put(&LOCK_EXPIRES_AT, rfc3339(lock.expires_at()));
}
