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

const RATE_HINT: &str =
    "bits per second with a unit: bit, kbit, mbit, gbit (or bps, kbps, mbps, gbps; /s allowed), e.g. 159kbit, 100mbit";

/// Parses a rate in bits per second such as `159kbit`, `100mbit`,
/// `1.5Mbit/s`, `25Mbps` (all decimal: k = 1000). Zero is rejected.
pub fn parse_rate(s: &str) -> Result<u64, ParseError> {
    let (v, unit) = split_number(s).ok_or_else(|| err("rate", s, RATE_HINT))?;
    let unit = unit.trim_end_matches("/s");
    let mult = match unit {
        "bit" | "bps" | "b" => 1.0,
        "kbit" | "kbps" | "k" => 1e3,
        "mbit" | "mbps" | "m" => 1e6,
        "gbit" | "gbps" | "g" => 1e9,
        _ => return Err(err("rate", s, RATE_HINT)),
    };
    let bps = v * mult;
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
        assert_eq!(parse_rate("25mbps").unwrap(), 25_000_000);
        assert_eq!(parse_rate("1.5gbit").unwrap(), 1_500_000_000);
        assert_eq!(parse_rate("800bit").unwrap(), 800);
        for bad in ["0kbit", "fast", "10", "10kB", "0.1bit", "1e20gbit"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
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
