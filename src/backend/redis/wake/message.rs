//! What comes through a backend's pub/sub channel (see `mod.rs`): grants
//! to waiters, how long the head waiter's lock is held for, and flight
//! results, parsed strictly: anything else is ignored.

use std::time::Duration;

/// The lock was handed to a waiter.
#[derive(Debug, Clone, Copy)]
pub(in crate::backend::redis) struct Grant {
    pub(in crate::backend::redis) fence: u64,
    pub(in crate::backend::redis) acquired_ms: u64,
}

/// What a waiter hears while it waits.
#[derive(Debug, Clone, Copy)]
pub(in crate::backend::redis) enum Wake {
    /// The lock was handed to it.
    Granted(Grant),
    /// It is at the head of the queue now, and what blocks it ends in this
    /// long (the scripts' `nudge`).
    FreeIn(Duration),
}

/// `"<id> <ms>"` (after the `"w "`): how long until the lock waiter `id`
/// waits for may be free.
pub(super) fn parse_free_in(news: &[u8]) -> Option<(u64, Duration)> {
    let (id, ms) = std::str::from_utf8(news).ok()?.split_once(' ')?;
    let ms: u64 = ms.parse().ok()?;
    Some((id.parse().ok()?, Duration::from_millis(ms)))
}

/// `"<id> <fence> <acquired ms>"`.
pub(super) fn parse_grant(payload: &[u8]) -> Option<(u64, Grant)> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut parts = text.split(' ');
    let id = parts.next()?.parse().ok()?;
    let fence = parts.next()?.parse().ok()?;
    let acquired_ms = parts.next()?.parse().ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some((id, Grant { fence, acquired_ms }))
}

/// `"<seq> <id>[,<id>…]\n<value>"` (after the `"f "`).
pub(super) fn parse_flight(news: &[u8]) -> Option<(u64, impl Iterator<Item = u64> + '_, &[u8])> {
    let line = news.iter().position(|&b| b == b'\n')?;
    let (head, value) = (std::str::from_utf8(&news[..line]).ok()?, &news[line + 1..]);
    let (seq, ids) = head.split_once(' ')?;
    let seq = seq.parse().ok()?;
    Some((seq, ids.split(',').filter_map(|id| id.parse().ok()), value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flight_news_parses() {
        let (seq, ids, value) = parse_flight(b"9 3,4\n{\"a\":\n1}").unwrap();
        assert_eq!(seq, 9);
        assert_eq!(ids.collect::<Vec<_>>(), [3, 4]);
        assert_eq!(value, b"{\"a\":\n1}");
        assert!(parse_flight(b"9 3").is_none());
        assert!(parse_flight(b"x 3\n").is_none());
    }

    #[test]
    fn nudges_parse_strictly() {
        assert_eq!(
            parse_free_in(b"7 150"),
            Some((7, Duration::from_millis(150)))
        );
        assert!(parse_free_in(b"7").is_none());
        assert!(parse_free_in(b"7 -1").is_none());
        assert!(parse_free_in(b"7 1 2").is_none());
        assert!(parse_free_in(&[0xff, b' ', b'1']).is_none());
    }

    #[test]
    fn grants_parse_strictly() {
        let (id, g) = parse_grant(b"7 42 1700000000123").unwrap();
        assert_eq!((id, g.fence, g.acquired_ms), (7, 42, 1_700_000_000_123));
        assert!(parse_grant(b"7 42").is_none());
        assert!(parse_grant(b"7 42 1 x").is_none());
        assert!(parse_grant(b"a 42 1").is_none());
        assert!(parse_grant(&[0xff, b' ']).is_none());
    }
}
