//! Responses as a flight shares them: which may be shared, and the binary
//! frame they are stored in.
//!
//! Frame: `TLF1`, the status (u16), the number of headers (u32), each
//! header as its name's length (u32), name, value's length (u32), value,
//! then the body to the end. Big-endian. No re-encoding of the body.

use bytes::{Buf, BufMut, Bytes};
use http::header::{CACHE_CONTROL, HeaderName, HeaderValue, SET_COOKIE};
use http::response::Parts;
use http::{HeaderMap, Response, StatusCode};

use crate::headers::LOCK_OWNER;

const MAGIC: &[u8; 4] = b"TLF1";

/// The header that tells a shared response from the leader's.
pub(crate) const SINGLE_FLIGHT: HeaderName = HeaderName::from_static("single-flight");
/// Its value on the response of the request that ran the handler.
pub(crate) const LEADER: HeaderValue = HeaderValue::from_static("leader");
/// Its value on a copy of another request's response.
pub(crate) const SHARED: HeaderValue = HeaderValue::from_static("shared");

/// Why a response is not shared, if it is not.
pub(crate) fn unshareable(parts: &Parts) -> Option<&'static str> {
    if parts.status.is_server_error() || parts.status.is_client_error() {
        // A failure: the next waiter tries for itself.
        return Some("an error status");
    }
    if parts.status.is_informational() {
        return Some("an informational status");
    }
    private(&parts.headers)
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

/// The frame of a response whose body is `body`.
pub(crate) fn encode(parts: &Parts, body: &[u8]) -> Vec<u8> {
    let headers: Vec<(&HeaderName, &HeaderValue)> = parts
        .headers
        .iter()
        .filter(|(name, _)| **name != SINGLE_FLIGHT)
        .collect();
    let size = 10
        + headers
            .iter()
            .map(|(n, v)| 8 + n.as_str().len() + v.len())
            .sum::<usize>()
        + body.len();
    let mut out = Vec::with_capacity(size);
    out.put_slice(MAGIC);
    out.put_u16(parts.status.as_u16());
    out.put_u32(headers.len() as u32);
    for (name, value) in headers {
        out.put_u32(name.as_str().len() as u32);
        out.put_slice(name.as_str().as_bytes());
        out.put_u32(value.len() as u32);
        out.put_slice(value.as_bytes());
    }
    out.put_slice(body);
    out
}

/// A response from its frame (the body shares the frame's memory). `None`
/// if the frame is not one.
pub(crate) fn decode(frame: Bytes) -> Option<Response<Bytes>> {
    let mut buf = frame;
    if buf.len() < 10 || &buf[..4] != MAGIC {
        return None;
    }
    buf.advance(4);
    let status = StatusCode::from_u16(buf.get_u16()).ok()?;
    let count = buf.get_u32() as usize;
    // Every header takes at least 8 bytes: a garbled count cannot allocate.
    let mut headers = HeaderMap::with_capacity(count.min(buf.len() / 8));
    for _ in 0..count {
        let name = take(&mut buf)?;
        let value = take(&mut buf)?;
        headers.append(
            HeaderName::from_bytes(&name).ok()?,
            HeaderValue::from_maybe_shared(value).ok()?,
        );
    }
    let mut res = Response::new(buf);
    *res.status_mut() = status;
    *res.headers_mut() = headers;
    Some(res)
}

/// A length-prefixed piece.
fn take(buf: &mut Bytes) -> Option<Bytes> {
    if buf.len() < 4 {
        return None;
    }
    let len = buf.get_u32() as usize;
    (buf.len() >= len).then(|| buf.split_to(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(status: u16, headers: &[(&str, &str)]) -> Parts {
        let mut res = Response::builder().status(status);
        for (n, v) in headers {
            res = res.header(*n, *v);
        }
        res.body(()).unwrap().into_parts().0
    }

    #[test]
    fn frames_round_trip() {
        let p = parts(
            201,
            &[
                ("content-type", "application/json"),
                ("x-a", "1"),
                ("x-a", "2"),
                ("single-flight", "leader"),
            ],
        );
        let res = decode(Bytes::from(encode(&p, b"{\"ok\":true}"))).unwrap();
        assert_eq!(res.status(), 201);
        assert_eq!(res.headers()["content-type"], "application/json");
        let a: Vec<_> = res.headers().get_all("x-a").iter().collect();
        assert_eq!(a, ["1", "2"]);
        assert!(!res.headers().contains_key("single-flight"));
        assert_eq!(res.body(), &b"{\"ok\":true}"[..]);
    }

    #[test]
    fn garbage_is_not_a_frame() {
        assert!(decode(Bytes::from_static(b"")).is_none());
        assert!(decode(Bytes::from_static(b"TLF1\x00")).is_none());
        assert!(decode(Bytes::from_static(b"TLF1\x00\xc8\xff\xff\xff\xff")).is_none());
        assert!(decode(Bytes::from_static(b"XXXX\x00\xc8\x00\x00\x00\x00")).is_none());
    }

    #[test]
    fn private_and_failed_responses_are_not_shared() {
        assert!(unshareable(&parts(200, &[])).is_none());
        assert!(unshareable(&parts(304, &[])).is_none());
        assert!(unshareable(&parts(500, &[])).is_some());
        assert!(unshareable(&parts(429, &[])).is_some());
        assert!(unshareable(&parts(200, &[("set-cookie", "a=b")])).is_some());
        assert!(unshareable(&parts(200, &[("cache-control", "max-age=5, private")])).is_some());
        assert!(unshareable(&parts(200, &[("cache-control", "No-Store")])).is_some());
        assert!(unshareable(&parts(200, &[("cache-control", "public, max-age=5")])).is_none());
        assert!(unshareable(&parts(200, &[("lock-owner", "x")])).is_some());
    }
}
