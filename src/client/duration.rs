//! The durations of `Lock-TTL` and `Lock-Block`.

use std::time::Duration;

/// `30` (seconds), `500ms`, `30s`, `5m`, `1h` (units in any case, leading
/// zeros ignored). A number of more than 18 digits is `None`; any other is
/// a duration, the largest ones saturated (over the server's maximum, and
/// refused as such).
pub(super) fn parse_duration(v: &str) -> Option<Duration> {
    let digits = v.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let number = v[..digits].trim_start_matches('0');
    // At most 18 digits: any such number fits a u64.
    if number.len() > 18 {
        return None;
    }
    let n: u64 = if number.is_empty() {
        0
    } else {
        number.parse().ok()?
    };
    let ms = match v[digits..].to_ascii_lowercase().as_str() {
        "ms" => n,
        "" | "s" => n.saturating_mul(1_000),
        "m" => n.saturating_mul(60_000),
        "h" => n.saturating_mul(3_600_000),
        _ => return None,
    };
    Some(Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        // Any case, leading zeros: the same durations.
        assert_eq!(parse_duration("30S"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("500MS"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(
            parse_duration("0000000000030"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
        // Large is a duration (over a maximum, refused as such); beyond
        // any duration is not one.
        assert_eq!(
            parse_duration("1000000000000ms"),
            Some(Duration::from_millis(1_000_000_000_000))
        );
        for huge in ["9999999999999h", "99999999999999999", "999999999999999999s"] {
            assert!(
                parse_duration(huge).unwrap() > Duration::from_secs(1 << 40),
                "{huge}"
            );
        }
        for bad in ["", "s", "-1", "1.5s", "1d", "10 s", "9999999999999999999"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }
}
