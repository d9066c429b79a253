//! Which requests take part in a flight and which responses are shared,
//! with which headers: what an HTTP cache must respect (RFC 9111) applies
//! to a shared response too, as sharing one is caching it for the length
//! of a flight (and its result TTL).

use std::time::Duration;

use http::header::{
    AUTHORIZATION, CACHE_CONTROL, CONNECTION, CONTENT_TYPE, COOKIE, HeaderName, HeaderValue,
    IF_MATCH, IF_MODIFIED_SINCE, IF_NONE_MATCH, IF_RANGE, IF_UNMODIFIED_SINCE, PRAGMA,
    PROXY_AUTHORIZATION, RANGE, SET_COOKIE, VARY,
};
use http::response::Parts;
use http::{HeaderMap, StatusCode};
use sha2::{Digest, Sha256};

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
fn directives(headers: &HeaderMap, name: HeaderName) -> impl Iterator<Item = (&str, &str)> {
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

/// Request headers that carry a client's credentials: kept with a shared
/// response only as a digest, never as they are (the result lives in the
/// backend, beside every other process's).
const CREDENTIALS: [HeaderName; 3] = [AUTHORIZATION, PROXY_AUTHORIZATION, COOKIE];

/// The request headers a response is shared by: those its `Vary` names, and
/// `Authorization` unless the response says it may answer other clients'
/// authorized requests as it is ([`answers_any_authorized`]): a request
/// with other credentials than the leader's (or with none where it had
/// some, or some where it had none) runs the handler on its own, so one
/// client's answer never reaches another client because the flight's key
/// left the caller out. `None` for `Vary: *`.
pub(crate) fn keyed_by(response: &HeaderMap) -> Option<Vec<HeaderName>> {
    let mut names = vary(response)?;
    if !names.contains(&AUTHORIZATION) && crossing_lifetime(response).is_none() {
        names.push(AUTHORIZATION);
    }
    Some(names)
}

/// How long `Cache-Control` lets a cache reuse the response for requests
/// with other credentials without asking the origin first (RFC 9111 §3.5:
/// `public`, `must-revalidate` or `s-maxage` allow the reuse, each subject
/// to its own rules, and the layer never revalidates): `s-maxage` when
/// above zero, else `max-age` when above zero with `public` or
/// `must-revalidate` (`s-maxage` overrides `max-age` for shared caches);
/// `None` with a `no-cache` (with or without field names), which asks for
/// validation on every reuse, or without a lifetime. A directive given
/// twice counts by its smallest value; one that does not parse counts as
/// zero; an `Expires` is not read. The layer keeps such a response no
/// longer than this (its result TTL capped by it), so it never answers
/// another client's request stale.
pub(crate) fn crossing_lifetime(response: &HeaderMap) -> Option<Duration> {
    let seconds = |value: &str| value.trim_matches('"').parse::<u64>().unwrap_or(0);
    let least = |old: Option<u64>, new: u64| Some(old.map_or(new, |o| o.min(new)));
    let (mut allowed, mut max_age, mut s_maxage) = (false, None, None);
    for (d, value) in directives(response, CACHE_CONTROL) {
        if d.eq_ignore_ascii_case("no-cache") {
            return None;
        } else if d.eq_ignore_ascii_case("public") || d.eq_ignore_ascii_case("must-revalidate") {
            allowed = true;
        } else if d.eq_ignore_ascii_case("max-age") {
            max_age = least(max_age, seconds(value));
        } else if d.eq_ignore_ascii_case("s-maxage") {
            s_maxage = least(s_maxage, seconds(value));
        }
    }
    let lifetime = match s_maxage {
        Some(s) => s,
        None if allowed => max_age.unwrap_or(0),
        None => 0,
    };
    (lifetime > 0).then(|| Duration::from_secs(lifetime))
}

/// The field lines of `request` named by `names` ([`keyed_by`]), as kept
/// with a shared response: as they are, but a credential header's lines as
/// one SHA-256 digest of them all.
pub(crate) fn varied(names: &[HeaderName], request: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    let mut kept = Vec::new();
    for name in names {
        let mut lines = request.get_all(name).iter().peekable();
        if lines.peek().is_none() {
            continue;
        }
        if CREDENTIALS.contains(name) {
            let mut digest = Sha256::new();
            for line in lines {
                // Each line's length first: no two lists of lines hash alike.
                digest.update((line.len() as u64).to_be_bytes());
                digest.update(line.as_bytes());
            }
            let value = format!("sha256:{}", crate::key::hex(&digest.finalize()));
            kept.push((
                name.clone(),
                HeaderValue::from_str(&value).expect("hex is a valid header value"),
            ));
        } else {
            kept.extend(lines.map(|v| (name.clone(), v.clone())));
        }
    }
    kept
}

/// Whether a shared response fits `request`: for every header it is shared
/// by ([`keyed_by`]: its `Vary`, and the credentials), `request` has the
/// same field lines as the leader's request had (`leader`, as [`varied`]
/// kept them), none included (RFC 9111 §4.1).
pub(crate) fn fits(response: &HeaderMap, leader: &HeaderMap, request: &HeaderMap) -> bool {
    let Some(names) = keyed_by(response) else {
        return false;
    };
    let mine = varied(&names, request);
    names.iter().all(|name| {
        leader
            .get_all(name)
            .iter()
            .eq(mine.iter().filter(|(n, _)| n == name).map(|(_, v)| v))
    })
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
    fn a_varied_response_fits_only_requests_with_the_same_field_lines() {
        let res = map(&[("vary", "Accept-Encoding"), ("vary", "accept-language")]);
        let leader = map(&[("accept-encoding", "gzip"), ("x-other", "1")]);
        let names = keyed_by(&res).unwrap();
        assert_eq!(
            names,
            ["accept-encoding", "accept-language", "authorization"]
        );
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

    /// What `fly` keeps of the leader's request, as a follower reads it.
    fn kept(response: &HeaderMap, leader: &HeaderMap) -> HeaderMap {
        varied(&keyed_by(response).unwrap(), leader)
            .into_iter()
            .collect()
    }

    #[test]
    fn a_response_crosses_credentials_for_its_lifetime() {
        let life = |cc: &str| crossing_lifetime(&map(&[("cache-control", cc)]));
        let secs = |n: u64| Some(Duration::from_secs(n));
        assert_eq!(life("public, max-age=5"), secs(5));
        assert_eq!(life("must-revalidate, max-age=60"), secs(60));
        assert_eq!(life("max-age=60, s-maxage=10"), secs(10));
        assert_eq!(life("max-age=0, s-maxage=10"), secs(10));
        assert_eq!(life("public, max-age=9, max-age=3"), secs(3));
        assert_eq!(life("public, max-age=\"7\""), secs(7));
        for none in [
            "max-age=60",
            "public",
            "public, s-maxage=0, max-age=5",
            "no-cache, s-maxage=9",
        ] {
            assert_eq!(life(none), None, "{none}");
        }
    }

    #[test]
    fn a_response_reaches_only_requests_with_the_leaders_credentials() {
        let res = map(&[("content-type", "text/plain")]);
        let a = map(&[("authorization", "Bearer a")]);
        let b = map(&[("authorization", "Bearer b")]);
        let none = map(&[]);
        let leader = kept(&res, &a);
        assert!(fits(&res, &leader, &a));
        assert!(!fits(&res, &leader, &b), "another client's credentials");
        assert!(!fits(&res, &leader, &none), "no credentials");
        // A leader without credentials: only requests without them.
        let leader = kept(&res, &none);
        assert!(fits(&res, &leader, &none));
        assert!(!fits(&res, &leader, &a));
        // A response that says it may answer anyone's authorized request
        // as it is.
        for cc in [
            "public, max-age=5",
            "s-maxage=10",
            "Must-Revalidate, max-age=60",
            "max-age=0, s-maxage=10",
        ] {
            let res = map(&[("cache-control", cc)]);
            let leader = kept(&res, &a);
            assert!(fits(&res, &leader, &b), "{cc}");
            assert!(fits(&res, &leader, &none), "{cc}");
        }
        // One that allows it only after asking the origin again (which the
        // layer never does), or with no lifetime: the leader's
        // credentials only.
        for cc in [
            "no-cache, must-revalidate",
            "max-age=0, must-revalidate",
            "s-maxage=0",
            "public, no-cache",
            "public, max-age=5, s-maxage=0",
            "public, no-cache=\"set-cookie\", max-age=5",
            "public, max-age=soon",
            "public, max-age=5, max-age=0",
            "must-revalidate",
            "public",
        ] {
            let res = map(&[("cache-control", cc)]);
            let leader = kept(&res, &a);
            assert!(fits(&res, &leader, &a), "{cc}");
            assert!(!fits(&res, &leader, &b), "{cc}");
            assert!(!fits(&res, &leader, &none), "{cc}");
        }
        // Cookies count only when the response varies on them.
        let res = map(&[("vary", "Cookie"), ("cache-control", "public")]);
        let leader = kept(&res, &map(&[("cookie", "s=1")]));
        assert!(fits(&res, &leader, &map(&[("cookie", "s=1")])));
        assert!(!fits(&res, &leader, &map(&[("cookie", "s=2")])));
    }

    #[test]
    fn credentials_are_kept_as_a_digest_never_as_they_are() {
        let res = map(&[("vary", "cookie, proxy-authorization")]);
        let leader = map(&[
            ("authorization", "Bearer secret-a"),
            ("proxy-authorization", "Basic c2VjcmV0"),
            ("cookie", "session=secret-c"),
            ("cookie", "other=1"),
        ]);
        let kept = varied(&keyed_by(&res).unwrap(), &leader);
        assert_eq!(kept.len(), 3, "one digest per credential header");
        for (name, value) in &kept {
            let value = value.to_str().unwrap();
            assert!(
                value.starts_with("sha256:") && value.len() == 7 + 64,
                "{name}: {value}"
            );
            assert!(!value.contains("secret") && !value.contains("c2VjcmV0"));
        }
        // Other lines, or the same lines split otherwise, digest otherwise.
        let split = map(&[
            ("authorization", "Bearer secret-a"),
            ("proxy-authorization", "Basic c2VjcmV0"),
            ("cookie", "session=secret-cother=1"),
        ]);
        assert_ne!(varied(&keyed_by(&res).unwrap(), &split), kept);
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
