//! Which requests take part in a flight and which responses are shared,
//! with which headers: what an HTTP cache must respect (RFC 9111) applies
//! to a shared response too, as sharing one is caching it for the length
//! of a flight (and its result TTL).

use http::header::{
    CACHE_CONTROL, CONNECTION, CONTENT_TYPE, HeaderName, HeaderValue, IF_MATCH, IF_MODIFIED_SINCE,
    IF_NONE_MATCH, IF_RANGE, IF_UNMODIFIED_SINCE, PRAGMA, RANGE, SET_COOKIE,
};
use http::response::Parts;
use http::{HeaderMap, StatusCode};

use super::fit::vary;
use crate::layer::headers::LOCK_OWNER;

/// The header that tells a shared response from the leader's.
pub(crate) const SINGLE_FLIGHT: HeaderName = HeaderName::from_static("single-flight");
/// Its value on the response of the request that ran the handler.
pub(crate) const LEADER: HeaderValue = HeaderValue::from_static("leader");
/// Its value on a copy of another request's response.
pub(crate) const SHARED: HeaderValue = HeaderValue::from_static("shared");

/// Request headers that make the answer depend on what the client already
/// has or wants a part of: a `304` or a `206` for it would reach clients
/// that asked for the whole (RFC 9110 §13, §14.2).
const CONDITIONAL: [HeaderName; 6] = [
    IF_MATCH,
    IF_NONE_MATCH,
    IF_MODIFIED_SINCE,
    IF_UNMODIFIED_SINCE,
    IF_RANGE,
    RANGE,
];

/// Hop-by-hop headers (RFC 9110 §7.6.1): about one connection, never copied
/// into another response. `keep-alive` and `proxy-connection` are the
/// common ones a `Connection` header does not always list.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Whether a request stays out of flights: it is conditional or asks for a
/// range, so its answer (`304`, `206`) is for it alone, and another's
/// answer is not what it asked for.
pub(crate) fn stays_out(request: &HeaderMap) -> Option<&'static str> {
    CONDITIONAL
        .iter()
        .any(|name| request.contains_key(name))
        .then_some("a conditional or range request")
}

/// Whether a request refuses a response stored before it came (kept for the
/// flight's result TTL): it says `Cache-Control: no-cache` or `max-age=0`
/// (RFC 9111 §5.2.1), or `Pragma: no-cache` without a `Cache-Control` (as
/// HTTP/1.0 clients say it). It may still join a flight under way: that
/// response is made after it came.
pub(crate) fn refuses_stored(request: &HeaderMap) -> Option<&'static str> {
    if directives(request, CACHE_CONTROL).any(|(name, value)| {
        name.eq_ignore_ascii_case("no-cache")
            || (name.eq_ignore_ascii_case("max-age") && value.trim_matches('"') == "0")
    }) {
        return Some("the request says no-cache or max-age=0");
    }
    let pragma = !request.contains_key(CACHE_CONTROL)
        && directives(request, PRAGMA).any(|(name, _)| name.eq_ignore_ascii_case("no-cache"));
    pragma.then_some("the request says Pragma: no-cache")
}

/// The directives of the (readable) `name` fields of `headers`, as
/// trimmed `(name, value)` pairs (`value` empty when there is none).
pub(crate) fn directives(
    headers: &HeaderMap,
    name: HeaderName,
) -> impl Iterator<Item = (&str, &str)> {
    headers
        .get_all(name)
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|d| {
            let (name, value) = d.split_once('=').unwrap_or((d, ""));
            (name.trim(), value.trim())
        })
}

/// What the leader does with its response, judged by its head.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Shared, if its body ends within the cap and in time.
    Share,
    /// Not shared: the next waiter runs the handler (a failure, or a
    /// response for this client alone).
    Next(&'static str),
    /// Not shared, and no other request's would be: every follower runs the
    /// handler on its own at once (a stream of events).
    Alone(&'static str),
}

/// Whether a response may be shared, by its head.
pub(crate) fn verdict(parts: &Parts) -> Verdict {
    if parts.status.is_server_error() || parts.status.is_client_error() {
        // A failure: the next waiter tries for itself.
        return Verdict::Next("an error status");
    }
    if parts.status.is_informational() {
        return Verdict::Next("an informational status");
    }
    if parts.status == StatusCode::PARTIAL_CONTENT || parts.status == StatusCode::NOT_MODIFIED {
        // An answer to what one client has or asked a part of.
        return Verdict::Next("a 206 or 304 answers one client");
    }
    if let Some(why) = private(&parts.headers) {
        return Verdict::Next(why);
    }
    if vary(&parts.headers).is_none() {
        return Verdict::Next("Vary: * or an unreadable Vary");
    }
    let events = parts.headers.get(CONTENT_TYPE).is_some_and(|v| {
        v.as_bytes()
            .split(|b| *b == b';')
            .next()
            .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"text/event-stream"))
    });
    if events {
        return Verdict::Alone("an event stream is each client's own");
    }
    Verdict::Share
}

/// Whether the headers say the response belongs to one client.
fn private(headers: &HeaderMap) -> Option<&'static str> {
    if headers.contains_key(SET_COOKIE) {
        return Some("it sets a cookie");
    }
    // A kept lock's owner token is a credential of this request alone.
    if headers.contains_key(LOCK_OWNER) {
        return Some("it carries a lock's owner token");
    }
    if headers
        .get_all(CACHE_CONTROL)
        .iter()
        .any(|v| v.to_str().is_err())
    {
        return Some("an unreadable Cache-Control");
    }
    directives(headers, CACHE_CONTROL)
        .any(|(name, _)| {
            name.eq_ignore_ascii_case("private") || name.eq_ignore_ascii_case("no-store")
        })
        .then_some("Cache-Control says private or no-store")
}

/// The headers of `headers` a copy of the response carries: none about the
/// leader's connection (hop-by-hop, and those its `Connection` lists), none
/// about the leader's locks (`lock-*`, of the request that ran the
/// handler), and not the leader's `single-flight`.
pub(crate) fn shared_headers(headers: &HeaderMap) -> Vec<(&HeaderName, &HeaderValue)> {
    let listed: Vec<&str> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    headers
        .iter()
        .filter(|(name, _)| {
            let name = name.as_str();
            name != SINGLE_FLIGHT.as_str()
                && !name.starts_with("lock-")
                && !HOP_BY_HOP.contains(&name)
                && !listed.iter().any(|l| l.eq_ignore_ascii_case(name))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Response;

    fn parts(status: u16, headers: &[(&str, &str)]) -> Parts {
        let mut res = Response::builder().status(status);
        for (n, v) in headers {
            res = res.header(*n, *v);
        }
        res.body(()).unwrap().into_parts().0
    }

    fn map(headers: &[(&str, &str)]) -> HeaderMap {
        parts(200, headers).headers
    }

    #[test]
    fn private_failed_partial_and_unmodified_responses_are_not_shared() {
        let next = |p: &Parts| matches!(verdict(p), Verdict::Next(_));
        assert_eq!(verdict(&parts(200, &[])), Verdict::Share);
        assert_eq!(verdict(&parts(301, &[])), Verdict::Share);
        assert!(next(&parts(304, &[])));
        assert!(next(&parts(206, &[("content-range", "bytes 0-3/10")])));
        assert!(next(&parts(500, &[])));
        assert!(next(&parts(429, &[])));
        assert!(next(&parts(200, &[("set-cookie", "a=b")])));
        assert!(next(&parts(
            200,
            &[("cache-control", "max-age=5, private")]
        )));
        assert!(next(&parts(200, &[("cache-control", "No-Store")])));
        assert_eq!(
            verdict(&parts(200, &[("cache-control", "public, max-age=5")])),
            Verdict::Share
        );
        assert!(next(&parts(200, &[("lock-owner", "x")])));
        assert!(next(&parts(200, &[("vary", "*")])));
        assert!(next(&parts(200, &[("vary", "accept-encoding, *")])));
        assert_eq!(
            verdict(&parts(200, &[("vary", "Accept-Encoding")])),
            Verdict::Share
        );
        assert!(matches!(
            verdict(&parts(
                200,
                &[("content-type", "Text/Event-Stream; charset=utf-8")]
            )),
            Verdict::Alone(_)
        ));
    }

    #[test]
    fn no_cache_and_max_age_zero_refuse_stored_responses() {
        assert!(refuses_stored(&map(&[])).is_none());
        assert!(refuses_stored(&map(&[("cache-control", "max-age=5")])).is_none());
        assert!(refuses_stored(&map(&[("cache-control", "max-age=05, no-transform")])).is_none());
        for cc in [
            "no-cache",
            "No-Cache",
            "max-age=0",
            "max-stale, max-age=\"0\"",
        ] {
            assert!(
                refuses_stored(&map(&[("cache-control", cc)])).is_some(),
                "{cc}"
            );
        }
        assert!(refuses_stored(&map(&[("pragma", "no-cache")])).is_some());
        // Cache-Control, where there is one, speaks instead of Pragma.
        assert!(
            refuses_stored(&map(&[
                ("pragma", "no-cache"),
                ("cache-control", "max-age=9")
            ]))
            .is_none()
        );
    }

    #[test]
    fn conditional_and_range_requests_stay_out() {
        assert!(stays_out(&map(&[("accept", "*/*")])).is_none());
        for name in [
            "if-none-match",
            "if-modified-since",
            "if-match",
            "if-unmodified-since",
            "if-range",
            "range",
        ] {
            assert!(stays_out(&map(&[(name, "x")])).is_some(), "{name}");
        }
    }

    #[test]
    fn copies_carry_no_connection_or_lock_headers() {
        let headers = map(&[
            ("content-type", "text/plain"),
            ("connection", "close, X-Hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("lock-acquired", "true"),
            ("lock-fence", "7"),
            ("single-flight", "leader"),
            ("x-kept", "yes"),
        ]);
        let kept: Vec<&str> = shared_headers(&headers)
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(kept, ["content-type", "x-kept"]);
    }
}
