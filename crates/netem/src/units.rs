//! Parsing of the values given on the command line: durations, rates,
//! queue sizes and percentages.

use std::time::Duration;

use crate::model::QueueLimit;

/// A value that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {input:?}: {hint}")]
pub struct ParseError {
    /// What kind of value was expected.
    pub what: &'static str,
    /// The text given.
    pub input: String,
    /// What would have been accepted.
    pub hint: &'static str,
}

fn err(what: &'static str, input: &str, hint: &'static str) -> ParseError {
    ParseError {
        what,
        input: input.to_string(),
        hint,
    }
}

/// Splits `"12.5ms"` into `(12.5, "ms")`.
fn split_number(s: &str) -> Option<(f64, String)> {
    let s = s.trim();
    let end = s
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.'))
        .map(|(i, _)| i)
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    if num.is_empty() {
        return None;
    }
    let value: f64 = num.parse().ok()?;
    if !value.is_finite() || value < 0.0 {
        return None;
    }
    Some((value, unit.trim().to_ascii_lowercase()))
}

const DURATION_HINT: &str = "a number with a unit: us, ms, s (e.g. 15ms, 1.5s, 250us)";

/// Parses a duration such as `15ms`, `1.5s`, `250us` or `0`.
pub fn parse_duration(s: &str) -> Result<Duration, ParseError> {
    let (v, unit) = split_number(s).ok_or_else(|| err("duration", s, DURATION_HINT))?;
    let secs = match unit.as_str() {
        "ns" => v / 1e9,
        "us" | "µs" => v / 1e6,
        "ms" => v / 1e3,
        "s" | "sec" => v,
        "min" => v * 60.0,
        "" if v == 0.0 => 0.0,
        _ => return Err(err("duration", s, DURATION_HINT)),
    };
    if secs > 1e9 {
        return Err(err("duration", s, "at most a few hours"));
    }
    Ok(Duration::from_secs_f64(secs))
}

const RATE_HINT: &str = "a number with a unit, as tc writes them: bits per second \
     bit, kbit, mbit, gbit, tbit (kibit, mibit, ... for powers of 1024; /s allowed), or bytes \
     per second bps, kbps, mbps, gbps, tbps (also KBps, MB/s); e.g. 159kbit, 100mbit, 2mbps";

const AMBIGUOUS_RATE_HINT: &str = "ambiguous unit: write kbit, mbit, gbit for bits per second \
     or kbps, mbps, gbps (as tc: bytes per second; also KBps, MB/s)";

const MIXED_CASE_BPS_HINT: &str = "ambiguous unit: tc reads kbps/mbps/gbps as BYTES per second, \
     though Kbps/Mbps/Gbps usually mean bits; write mbit for megabits per second or mbps \
     (or MBps) for megabytes per second";

/// Parses a rate such as `159kbit`, `100mbit`, `1.5Mbit/s` (bits per
/// second) or `2mbps`, `2MBps`, `2MB/s` (bytes per second, as tc reads
/// `mbps`) into bits per second. Prefixes are decimal (k = 1000); `ki`,
/// `mi`, `gi`, `ti` are powers of 1024. A bare number, a lone prefix
/// (`5m`, `5kb`) and `Kbps`/`Mbps`/`Gbps` (tc: bytes, common usage: bits)
/// are refused as ambiguous. Zero is rejected.
pub fn parse_rate(s: &str) -> Result<u64, ParseError> {
    let t = s.trim();
    let end = t
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.'))
        .map(|(i, _)| i)
        .unwrap_or(t.len());
    let (v, _) = split_number(t).ok_or_else(|| err("rate", s, RATE_HINT))?;
    let unit = t[end..].trim();
    let lower = unit.to_ascii_lowercase();
    // (multiplier prefix, rest of the unit)
    let prefix = |u: &str| -> (f64, String) {
        let l = u.to_ascii_lowercase();
        for (p, m) in [
            ("ki", 1024.0),
            ("mi", 1024.0 * 1024.0),
            ("gi", 1024.0 * 1024.0 * 1024.0),
            ("ti", 1024.0 * 1024.0 * 1024.0 * 1024.0),
            ("k", 1e3),
            ("m", 1e6),
            ("g", 1e9),
            ("t", 1e12),
        ] {
            if let Some(rest) = l.strip_prefix(p) {
                if rest.is_empty() || rest.starts_with('b') {
                    return (m, u[p.len()..].to_string());
                }
            }
        }
        (1.0, u.to_string())
    };
    let (mult, rest) = prefix(unit);
    let rest_lower = rest.to_ascii_lowercase();
    let bits_per_unit = match rest_lower.as_str() {
        "bit" | "bit/s" | "bits" | "bits/s" => 1.0,
        // tc: `bps` is bytes per second, in any case.
        // `Mbps` (capital prefix, small b) is where the two readings meet.
        "bps" if rest.contains('B') || unit == lower || unit == unit.to_ascii_uppercase() => 8.0,
        "bps" => return Err(err("rate", s, MIXED_CASE_BPS_HINT)),
        "b/s" if rest == "B/s" => 8.0,
        "" | "b" | "b/s" => return Err(err("rate", s, AMBIGUOUS_RATE_HINT)),
        _ => return Err(err("rate", s, RATE_HINT)),
    };
    let bps = v * mult * bits_per_unit;
    if !(1.0..=1e12).contains(&bps) {
        return Err(err("rate", s, "between 1 bit/s and 1000 Gbit/s"));
    }
    Ok(bps.round() as u64)
}

const QUEUE_HINT: &str = "a size (b, kb, kib, mb, mib) or a time (us, ms, s), e.g. 64kb or 50ms";

/// Parses a queue limit: bytes (`64kb`, `1mib`, `1500b`) or time (`50ms`).
pub fn parse_queue(s: &str) -> Result<QueueLimit, ParseError> {
    let t = s.trim().to_ascii_lowercase();
    if t == "unlimited" || t == "none" {
        return Ok(QueueLimit::Unlimited);
    }
    let (v, unit) = split_number(&t).ok_or_else(|| err("queue", s, QUEUE_HINT))?;
    let bytes = match unit.as_str() {
        "b" | "byte" | "bytes" => Some(v),
        "kb" => Some(v * 1e3),
        "kib" => Some(v * 1024.0),
        "mb" => Some(v * 1e6),
        "mib" => Some(v * 1024.0 * 1024.0),
        _ => None,
    };
    let limit = match bytes {
        Some(b) if (1.0..=1e12).contains(&b) => QueueLimit::Bytes(b.round() as u64),
        Some(_) => return Err(err("queue", s, "between 1 byte and 1 TB")),
        None => {
            let d = parse_duration(&t).map_err(|_| err("queue", s, QUEUE_HINT))?;
            if d.is_zero() {
                return Err(err("queue", s, "above zero"));
            }
            QueueLimit::Time(d)
        }
    };
    Ok(limit)
}

const PERCENT_HINT: &str = "a percentage between 0 and 100, e.g. 1, 0.5%, 25%";

/// Parses a percentage (`1`, `0.5%`) into a probability in `[0, 1]`.
pub fn parse_percent(s: &str) -> Result<f64, ParseError> {
    let t = s.trim().trim_end_matches('%');
    let v: f64 = t.parse().map_err(|_| err("percentage", s, PERCENT_HINT))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(err("percentage", s, PERCENT_HINT));
    }
    Ok(v / 100.0)
}

/// Formats a rate for humans (`159 kbit/s`, `100 Mbit/s`).
pub fn format_rate(bps: u64) -> String {
    let b = bps as f64;
    if b >= 1e9 {
        format!("{} Gbit/s", trim(b / 1e9))
    } else if b >= 1e6 {
        format!("{} Mbit/s", trim(b / 1e6))
    } else if b >= 1e3 {
        format!("{} kbit/s", trim(b / 1e3))
    } else {
        format!("{bps} bit/s")
    }
}

/// Formats a duration for humans (`16.16 ms`, `1 s`).
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{} s", trim(s))
    } else if s >= 1e-3 || s == 0.0 {
        format!("{} ms", trim(s * 1e3))
    } else {
        format!("{} us", trim(s * 1e6))
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15ms").unwrap(), Duration::from_millis(15));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration(" 2 s ").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        for bad in [
            "",
            "ms",
            "15",
            "-1ms",
            "1e3ms",
            "10 parsecs",
            "nanms",
            "1.2.3s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_duration("99999999999999999999s").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("159kbit").unwrap(), 159_000);
        assert_eq!(parse_rate("100Mbit/s").unwrap(), 100_000_000);
        assert_eq!(parse_rate("100mbit/s").unwrap(), 100_000_000);
        assert_eq!(parse_rate("1.5gbit").unwrap(), 1_500_000_000);
        assert_eq!(parse_rate("800bit").unwrap(), 800);
        assert_eq!(parse_rate("2kibit").unwrap(), 2048);
        assert_eq!(parse_rate("1mibit").unwrap(), 1 << 20);
        for bad in [
            "0kbit",
            "fast",
            "0.1bit",
            "1e20gbit",
            "10 parsecs",
            "5mbit/h",
        ] {
            let e = parse_rate(bad).unwrap_err();
            assert!(!e.hint.starts_with("ambiguous"), "{bad}: {e}");
        }
    }

    /// As tc: `bps`, `kbps`, `mbps` are bytes per second.
    #[test]
    fn rates_in_bytes_per_second_as_tc() {
        assert_eq!(parse_rate("5mbps").unwrap(), 40_000_000);
        assert_eq!(parse_rate("25kbps").unwrap(), 200_000);
        assert_eq!(parse_rate("1gbps").unwrap(), 8_000_000_000);
        assert_eq!(parse_rate("100bps").unwrap(), 800);
        assert_eq!(parse_rate("5MBps").unwrap(), 40_000_000);
        assert_eq!(parse_rate("5MB/s").unwrap(), 40_000_000);
        assert_eq!(parse_rate("2kB/s").unwrap(), 16_000);
        assert_eq!(parse_rate("1kibps").unwrap(), 8192);
    }

    /// Units that could be bits or bytes are refused, saying why.
    #[test]
    fn ambiguous_rates_are_refused() {
        for bad in ["10", "5m", "5k", "5g", "5b", "64kb", "5mb", "5Mb/s"] {
            let e = parse_rate(bad).unwrap_err();
            assert!(e.hint.starts_with("ambiguous"), "{bad}: {e}");
            assert!(e.to_string().contains("mbit"), "{bad}: {e}");
        }
        for bad in ["5Mbps", "25Kbps", "1Gbps"] {
            let e = parse_rate(bad).unwrap_err();
            assert!(e.to_string().contains("BYTES"), "{bad}: {e}");
        }
    }

    #[test]
    fn queues() {
        assert_eq!(parse_queue("64kb").unwrap(), QueueLimit::Bytes(64_000));
        assert_eq!(parse_queue("1mib").unwrap(), QueueLimit::Bytes(1 << 20));
        assert_eq!(
            parse_queue("50ms").unwrap(),
            QueueLimit::Time(Duration::from_millis(50))
        );
        assert_eq!(parse_queue("unlimited").unwrap(), QueueLimit::Unlimited);
        for bad in ["0b", "0ms", "lots", "12"] {
            assert!(parse_queue(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn percents() {
        assert_eq!(parse_percent("1").unwrap(), 0.01);
        assert_eq!(parse_percent("25%").unwrap(), 0.25);
        for bad in ["101", "-1", "x", "nan"] {
            assert!(parse_percent(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn formatting() {
        assert_eq!(format_rate(159_000), "159 kbit/s");
        assert_eq!(format_rate(100_000_000), "100 Mbit/s");
        assert_eq!(format_rate(16_900_000), "16.9 Mbit/s");
        assert_eq!(format_duration(Duration::from_micros(16_160)), "16.16 ms");
        assert_eq!(format_duration(Duration::from_secs(2)), "2 s");
        assert_eq!(format_duration(Duration::ZERO), "0 ms");
    }
}
