//! Percent-encoding, one way in and two ways out, on the `percent-encoding`
//! crate (the one axum decodes paths with).

use std::borrow::Cow;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// Every byte but letters, digits, `-._~` (RFC 3986's unreserved) and `:@`,
/// which mean themselves in a path segment and in a query value alike.
const ENCODED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b':')
    .remove(b'@');

/// `s` percent-encoded for a path segment or a query value (see [`ENCODED`]).
pub(crate) fn encode(s: &str) -> String {
    utf8_percent_encode(s, ENCODED).to_string()
}

/// `%XX` decoded as axum decodes path parameters: a `%` without two hex
/// digits after it stays as it is. `None` if the result is not UTF-8.
pub(crate) fn decode_lenient(s: &str) -> Option<Cow<'_, str>> {
    percent_decode_str(s).decode_utf8().ok()
}

/// `%XX` decoded, refusing what a client cannot have meant: a malformed
/// escape or a result that is not UTF-8 is `None` (the admin API answers
/// `400` rather than guess which lock was named; so does a `Lock-Key`
/// header of [`ClientLocks`](crate::ClientLocks)).
pub(crate) fn decode_strict(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let well_formed = bytes.iter().enumerate().all(|(i, &b)| {
        b != b'%'
            || (bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return None;
    }
    decode_lenient(s).map(Cow::into_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_encodes_what_a_query_would_misread() {
        for s in ["account:7", "caf\u{e9} 50%", "a/b?c#d", "/a+b&c=d e"] {
            let enc = encode(s);
            assert!(enc.bytes().all(|b| b.is_ascii_graphic()));
            assert_eq!(decode_strict(&enc).as_deref(), Some(s));
        }
        assert_eq!(encode("account:7"), "account:7");
        assert_eq!(encode("/a+b&c=d e#?%"), "%2Fa%2Bb%26c%3Dd%20e%23%3F%25");
    }

    #[test]
    fn strict_refuses_malformed_escapes_lenient_keeps_them() {
        assert_eq!(decode_strict("%zz"), None);
        assert_eq!(decode_strict("%4"), None);
        assert_eq!(decode_strict("%FF"), None);
        assert_eq!(decode_lenient("%zz%4").as_deref(), Some("%zz%4"));
        assert_eq!(decode_lenient("%41b").as_deref(), Some("Ab"));
        assert_eq!(decode_lenient("%FF"), None);
    }
}
