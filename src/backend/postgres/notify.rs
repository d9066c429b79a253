//! What comes through a backend's `LISTEN` channel (see `listen.rs`):
//! grants to waiters, how long the head waiter's lock is held for, and
//! flight news, as `NOTIFY` payloads (text of at most 8000 bytes), parsed
//! strictly: anything else is ignored.

use std::time::Duration;

/// The lock was handed to a waiter.
#[derive(Debug, Clone, Copy)]
pub(super) struct Grant {
    pub(super) fence: u64,
    pub(super) acquired_us: i64,
}

/// What a waiter hears while it waits.
#[derive(Debug, Clone, Copy)]
pub(super) enum Wake {
    /// The lock was handed to it.
    Granted(Grant),
    /// It is at the head of the queue now, and what blocks it ends in this
    /// long (the server's `_nudge`).
    FreeIn(Duration),
}

/// What a watcher hears of a published result: its `seq`, and its value
/// when it was small enough to travel in the notification.
pub(super) struct FlightNews {
    pub(super) seq: u64,
    pub(super) value: Option<Vec<u8>>,
}

/// `"<ticket> <fence> <acquired µs> <stored key>"` (the key, which may hold
/// spaces, is absent from an older version's notifications).
pub(super) fn parse_grant(payload: &str) -> Option<(i64, Grant, Option<&str>)> {
    let mut parts = payload.splitn(4, ' ');
    let ticket = parts.next()?.parse().ok()?;
    let fence = parts.next()?.parse().ok()?;
    let acquired_us = parts.next()?.parse().ok()?;
    let key = parts.next().filter(|k| !k.is_empty());
    Some((ticket, Grant { fence, acquired_us }, key))
}

/// `"<ticket> <µs>"` (after the `"w "`): how long until the lock the
/// waiter of `ticket` waits for may be free.
pub(super) fn parse_free_in(news: &str) -> Option<(i64, Duration)> {
    let (ticket, us) = news.split_once(' ')?;
    let us: u64 = us.parse().ok()?;
    Some((ticket.parse().ok()?, Duration::from_micros(us)))
}

/// `"<ticket> <seq>[ <value in hex>]"` (after the `"f "`).
pub(super) fn parse_flight(news: &str) -> Option<(i64, FlightNews)> {
    let mut parts = news.split(' ');
    let ticket = parts.next()?.parse().ok()?;
    let seq = parts.next()?.parse().ok()?;
    let value = match parts.next() {
        Some(hex) => Some(from_hex(hex)?),
        None => None,
    };
    if parts.next().is_some() {
        return None;
    }
    Some((ticket, FlightNews { seq, value }))
}

/// Bytes from lowercase or uppercase hex (PostgreSQL's `encode(.., 'hex')`).
fn from_hex(hex: &str) -> Option<Vec<u8>> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let hex = hex.as_bytes();
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    hex.chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flight_news_parses_strictly() {
        let (t, n) = parse_flight("7 42").unwrap();
        assert_eq!((t, n.seq, n.value), (7, 42, None));
        let (_, n) = parse_flight("7 42 7b7dFF").unwrap();
        assert_eq!(n.value.unwrap(), b"{}\xff");
        let (_, n) = parse_flight("7 42 ").unwrap();
        assert_eq!(n.value.unwrap(), b"");
        assert!(parse_flight("7 42 abc").is_none());
        assert!(parse_flight("7 42 zz").is_none());
        assert!(parse_flight("7").is_none());
        assert!(parse_flight("7 42 00 x").is_none());
    }

    #[test]
    fn nudges_parse_strictly() {
        assert_eq!(
            parse_free_in("7 1500"),
            Some((7, Duration::from_micros(1500)))
        );
        assert!(parse_free_in("7").is_none());
        assert!(parse_free_in("7 -1").is_none());
        assert!(parse_free_in("7 1 2").is_none());
        assert!(parse_free_in("x 1").is_none());
    }

    #[test]
    fn grants_parse_strictly() {
        let (t, g, key) = parse_grant("7 42 1700000000123456 g:a b").unwrap();
        assert_eq!((t, g.fence, g.acquired_us), (7, 42, 1_700_000_000_123_456));
        assert_eq!(key, Some("g:a b"));
        let (_, _, key) = parse_grant("7 42 1").unwrap();
        assert_eq!(key, None);
        assert!(parse_grant("7 42").is_none());
        assert!(parse_grant("7 42 x k").is_none());
        assert!(parse_grant("a 42 1").is_none());
        assert!(parse_grant("7 -1 1").is_none());
    }
}
