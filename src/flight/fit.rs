//! Which requests a shared response fits (RFC 9111 §4.1 and §3.5): the
//! request headers its `Vary` names, and the caller's credentials unless
//! the response may answer anyone's request as it is (then for no longer
//! than its lifetime); credentials kept with it only as a digest.

use std::time::Duration;

use http::HeaderMap;
use http::header::{
    AUTHORIZATION, CACHE_CONTROL, COOKIE, HeaderName, HeaderValue, PROXY_AUTHORIZATION, VARY,
};
use sha2::{Digest, Sha256};

use super::response::directives;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn map(headers: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (n, v) in headers {
            map.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
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
}
