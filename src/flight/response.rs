//! Which requests take part in a flight and which responses are shared,
//! with which headers: what an HTTP cache must respect (RFC 9111) applies
//! to a shared response too, as sharing one is caching it for the length
//! of a flight (and its result TTL).

use http::header::{
    CACHE_CONTROL, CONNECTION, CONTENT_TYPE, HeaderName, HeaderValue, IF_MATCH, IF_MODIFIED_SINCE,
    IF_NONE_MATCH, IF_RANGE, IF_UNMODIFIED_SINCE, RANGE, SET_COOKIE, VARY,
};
use http::response::Parts;
use http::{HeaderMap, StatusCode};

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
    for value in headers.get_all(CACHE_CONTROL) {
        let Ok(value) = value.to_str() else {
            return Some("an unreadable Cache-Control");
        };
        for directive in value.split(',') {
            let name = directive.split('=').next().unwrap_or("").trim();
            if name.eq_ignore_ascii_case("private") || name.eq_ignore_ascii_case("no-store") {
                return Some("Cache-Control says private or no-store");
            }
        }
    }
    None
}

/// The request headers a response's `Vary` names (lower case, as
/// `HeaderName`s are); `None` for `Vary: *` or a name that is not one.
pub(crate) fn vary(headers: &HeaderMap) -> Option<Vec<HeaderName>> {
    let mut names = Vec::new();
    for value in headers.get_all(VARY) {
        for name in value.to_str().ok()?.split(',') {
            let name = name.trim();
            if name.is_empty() {
                continue;
            }
            if name == "*" {
                return None;
            }
            names.push(HeaderName::from_bytes(name.as_bytes()).ok()?);
        }
    }
    Some(names)
}

/// The field lines of `request` named by `names`: what the leader's
/// request had for its response's `Vary`.
pub(crate) fn varied<'a>(
    names: &'a [HeaderName],
    request: &'a HeaderMap,
) -> Vec<(&'a HeaderName, &'a HeaderValue)> {
    names
        .iter()
        .flat_map(|name| request.get_all(name).iter().map(move |v| (name, v)))
        .collect()
}

/// Whether a shared response fits `request`: for every header its `Vary`
/// names, `request` has the same field lines as the leader's request had
/// (`leader`), none included (RFC 9111 §4.1).
pub(crate) fn fits(response: &HeaderMap, leader: &HeaderMap, request: &HeaderMap) -> bool {
    let Some(names) = vary(response) else {
        return false;
    };
    names
        .iter()
        .all(|name| leader.get_all(name).iter().eq(request.get_all(name).iter()))
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
    fn a_varied_response_fits_only_requests_with_the_same_field_lines() {
        let res = map(&[("vary", "Accept-Encoding"), ("vary", "accept-language")]);
        let leader = map(&[("accept-encoding", "gzip"), ("x-other", "1")]);
        let names = vary(&res).unwrap();
        assert_eq!(names, ["accept-encoding", "accept-language"]);
        let kept: Vec<_> = varied(&names, &leader);
        assert_eq!(kept.len(), 1);
        assert!(fits(&res, &leader, &map(&[("accept-encoding", "gzip")])));
        assert!(!fits(&res, &leader, &map(&[])));
        assert!(!fits(&res, &leader, &map(&[("accept-encoding", "br")])));
        assert!(!fits(
            &res,
            &leader,
            &map(&[("accept-encoding", "gzip"), ("accept-language", "fr")])
        ));
        // Without a Vary, every request fits; with `*`, none.
        assert!(fits(&map(&[]), &leader, &map(&[])));
        assert!(!fits(&map(&[("vary", "*")]), &leader, &leader));
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
