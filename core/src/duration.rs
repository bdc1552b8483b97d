//! Go's `time.ParseDuration` syntax, which etcd's duration flags use ("300ms", "1.5h",
//! "1h30m", "0s"): a sequence of decimal numbers, each with a unit (ns, us, µs, ms, s, m, h).

use std::time::Duration;

/// Parses a Go duration. Negative durations are refused: no etcd flag takes one.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("time: invalid duration {text:?}");
    let s = text.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.is_empty() || s.starts_with('-') {
        return Err(bad());
    }
    let mut total_ns: f64 = 0.0;
    let mut rest = s;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("time: missing unit in duration {text:?}"))?;
        if number_end == 0 {
            return Err(bad());
        }
        let number: f64 = rest[..number_end].parse().map_err(|_| bad())?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit_ns = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            unit => return Err(format!("time: unknown unit {unit:?} in duration {text:?}")),
        };
        total_ns += number * unit_ns;
        rest = &rest[unit_end..];
    }
    if !total_ns.is_finite() || total_ns > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(Duration::from_nanos(total_ns.round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_go_parses() {
        let ok = [
            ("0", 0),
            ("0s", 0),
            ("300ms", 300_000_000),
            ("1.5h", 5_400_000_000_000),
            ("1h30m", 5_400_000_000_000),
            ("2s", 2_000_000_000),
            ("10us", 10_000),
            ("1m0.5s", 60_500_000_000),
        ];
        for (text, ns) in ok {
            assert_eq!(
                parse_go_duration(text),
                Ok(Duration::from_nanos(ns)),
                "{text}"
            );
        }
        for bad in ["", "5", "-1s", "1x", "s", "1.2.3s", "h1"] {
            assert!(parse_go_duration(bad).is_err(), "{bad} parsed");
        }
    }
}
