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

use std::time::SystemTime;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::locks::HeldLock;

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
    put(&LOCK_KEY, percent_encode(lock.key()));
    if let Some(route) = lock.lock_key().route_pattern() {
        put(&LOCK_ROUTE, percent_encode(route));
    }
    put(&LOCK_OWNER, lock.owner().to_owned());
    put(&LOCK_FENCE, lock.fence().to_string());
    put(&LOCK_EXPIRES_AT, rfc3339(lock.expires_at()));
}

/// Percent-encode every byte but the unreserved characters, `:` and `@`:
/// the result means the same in a URL path segment and in a query value.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b':' | b'@') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decode `%XX` escapes; `None` for a malformed escape or invalid UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// RFC 3339 in UTC with milliseconds, e.g. `2026-11-21T23:48:58.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let ms = crate::locks::unix_ms(t);
    let (secs, millis) = (ms / 1000, ms % 1000);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}.{millis:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_rfc3339() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_391_338_123);
        assert_eq!(rfc3339(t), "2026-11-22T23:48:58.123Z");
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn percent_round_trip() {
        for s in ["account:7", "caf\u{e9} 50%", "a/b?c#d"] {
            let enc = percent_encode(s);
            assert!(enc.bytes().all(|b| b.is_ascii_graphic()));
            assert_eq!(percent_decode(&enc).as_deref(), Some(s));
        }
        assert_eq!(percent_encode("account:7"), "account:7");
        // Nothing that means something else in a query value stays.
        assert_eq!(
            percent_encode("/a+b&c=d e#?%"),
            "%2Fa%2Bb%26c%3Dd%20e%23%3F%25"
        );
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
    }
}
