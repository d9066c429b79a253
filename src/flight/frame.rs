//! The binary frame a flight of the HTTP layer stores: a response to share,
//! or word that the followers run the handler on their own.
//!
//! `TLF2`, then one byte: `A` (the followers run on their own; nothing
//! follows) or `R` (a response): the status (u16), the response's headers,
//! the leader's request headers its `Vary` names, then the body to the end.
//! Each header list is a count (u32), then per header its name's length
//! (u32), name, value's length (u32), value. Big-endian. No re-encoding of
//! the body.
//!
//! `TLF1` frames (before the request headers were kept) are not read: a
//! response with a `Vary` could not be checked against the follower's
//! request, and HEAD and GET shared one flight then.

use bytes::{Buf, BufMut, Bytes};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

const MAGIC: &[u8; 4] = b"TLF2";
const ALONE: u8 = b'A';
const RESPONSE: u8 = b'R';

/// What a flight's leader shared.
pub(crate) enum Shared {
    /// The leader's response, and the field lines of the leader's request
    /// headers named by its `Vary`.
    Response {
        response: Box<Response<Bytes>>,
        varied: HeaderMap,
    },
    /// Its response is not shared (a stream, or too large): every follower
    /// runs the handler on its own.
    Alone,
}

/// The frame that tells the followers to run on their own.
pub(crate) fn alone() -> Vec<u8> {
    let mut out = Vec::with_capacity(5);
    out.put_slice(MAGIC);
    out.put_u8(ALONE);
    out
}

/// The frame of a response: its status, the `headers` to share, the
/// leader's request field lines `varied`, and `body`.
pub(crate) fn encode(
    status: StatusCode,
    headers: &[(HeaderName, HeaderValue)],
    varied: &[(HeaderName, HeaderValue)],
    body: &[u8],
) -> Vec<u8> {
    let size = |list: &[(HeaderName, HeaderValue)]| {
        4 + list
            .iter()
            .map(|(n, v)| 8 + n.as_str().len() + v.len())
            .sum::<usize>()
    };
    let mut out = Vec::with_capacity(7 + size(headers) + size(varied) + body.len());
    out.put_slice(MAGIC);
    out.put_u8(RESPONSE);
    out.put_u16(status.as_u16());
    for list in [headers, varied] {
        out.put_u32(list.len() as u32);
        for (name, value) in list {
            out.put_u32(name.as_str().len() as u32);
            out.put_slice(name.as_str().as_bytes());
            out.put_u32(value.len() as u32);
            out.put_slice(value.as_bytes());
        }
    }
    out.put_slice(body);
    out
}

/// What a frame holds (the body shares the frame's memory); `None` if it
/// is not one of this version.
pub(crate) fn decode(frame: Bytes) -> Option<Shared> {
    let mut buf = frame;
    if buf.len() < 5 || &buf[..4] != MAGIC {
        return None;
    }
    buf.advance(4);
    match buf.get_u8() {
        ALONE if buf.is_empty() => return Some(Shared::Alone),
        RESPONSE if buf.len() >= 2 => {}
        _ => return None,
    }
    let status = StatusCode::from_u16(buf.get_u16()).ok()?;
    let headers = header_list(&mut buf)?;
    let varied = header_list(&mut buf)?;
    let mut response = Response::new(buf);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    Some(Shared::Response {
        response: Box::new(response),
        varied,
    })
}

/// A counted list of headers.
fn header_list(buf: &mut Bytes) -> Option<HeaderMap> {
    if buf.len() < 4 {
        return None;
    }
    let count = buf.get_u32() as usize;
    // Every header takes at least 8 bytes: a garbled count cannot allocate
    // much, nor more than a map holds (`with_capacity` would panic).
    let mut headers = HeaderMap::try_with_capacity(count.min(buf.len() / 8)).ok()?;
    for _ in 0..count {
        let name = take(buf)?;
        let value = take(buf)?;
        // (`append` panics past the map's maximum size.)
        headers
            .try_append(
                HeaderName::from_bytes(&name).ok()?,
                HeaderValue::from_maybe_shared(value).ok()?,
            )
            .ok()?;
    }
    Some(headers)
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

    fn pairs(list: &[(&'static str, &'static str)]) -> Vec<(HeaderName, HeaderValue)> {
        list.iter()
            .map(|(n, v)| (HeaderName::from_static(n), HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn frames_round_trip() {
        let headers = pairs(&[
            ("content-type", "application/json"),
            ("x-a", "1"),
            ("x-a", "2"),
        ]);
        let varied = pairs(&[("accept-encoding", "gzip")]);
        let frame = encode(StatusCode::CREATED, &headers, &varied, b"{\"ok\":true}");
        let Some(Shared::Response { response, varied }) = decode(Bytes::from(frame)) else {
            panic!("a response frame");
        };
        assert_eq!(response.status(), 201);
        assert_eq!(response.headers()["content-type"], "application/json");
        let a: Vec<_> = response.headers().get_all("x-a").iter().collect();
        assert_eq!(a, ["1", "2"]);
        assert_eq!(varied["accept-encoding"], "gzip");
        assert_eq!(response.body(), &b"{\"ok\":true}"[..]);
        assert!(matches!(decode(Bytes::from(alone())), Some(Shared::Alone)));
    }

    #[test]
    fn a_garbled_header_count_in_a_large_frame_is_no_frame() {
        // A count of 2^32-1 headers before 256 KiB of bytes: room for more
        // headers than a map holds, and none of them whole.
        let mut frame = b"TLF2R\x00\xc8\xff\xff\xff\xff".to_vec();
        frame.extend(std::iter::repeat_n(0xffu8, 256 * 1024));
        assert!(decode(Bytes::from(frame)).is_none());
        // As many distinct headers as said, more than a map holds: refused
        // as a whole, before any is read.
        let count: u32 = 40_000;
        let mut frame = b"TLF2R\x00\xc8".to_vec();
        frame.extend(count.to_be_bytes());
        for i in 0..count {
            let name = format!("h{i}");
            frame.extend((name.len() as u32).to_be_bytes());
            frame.extend(name.as_bytes());
            frame.extend(0u32.to_be_bytes());
        }
        frame.extend(0u32.to_be_bytes());
        assert!(decode(Bytes::from(frame)).is_none());
    }

    #[test]
    fn garbage_and_old_frames_are_not_frames() {
        for bad in [
            &b""[..],
            b"TLF2",
            b"TLF2R\x00",
            b"TLF2A\x00",
            b"TLF2X",
            b"TLF2R\x00\xc8\xff\xff\xff\xff",
            b"TLF2R\x00\xc8\x00\x00\x00\x00",
            b"XXXXR\x00\xc8\x00\x00\x00\x00\x00\x00\x00\x00",
            // Version 1: status, headers, body.
            b"TLF1\x00\xc8\x00\x00\x00\x00",
        ] {
            assert!(decode(Bytes::from_static(bad)).is_none(), "{bad:?}");
        }
        assert!(
            decode(Bytes::from_static(
                b"TLF2R\x00\xc8\x00\x00\x00\x00\x00\x00\x00\x00"
            ))
            .is_some()
        );
    }
}
