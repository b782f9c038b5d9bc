//! Durations on command lines and in env: `500ms`, `2s`, `1.5s`, `3m`,
//! `1h` or a bare number of seconds, the same for every nodegate binary.

use std::time::Duration;

/// Parses `500ms`, `2s`, `1.5s`, `3m`, `1h`, a bare number of seconds, or
/// Go's compound form (`1h30m`, `15m0s`, `1m0.5s`: how Go prints a
/// `time.Duration`, so a value copied from another project's Go flag, such
/// as Cluster Autoscaler's `--max-node-startup-time`, reads the same here).
pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let invalid = || format!("invalid duration {s:?}: expected e.g. 500ms, 2s, 1m, 1h30m");
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_digit() || c == '.') {
        let n: f64 = s.parse().map_err(|_| invalid())?;
        return Duration::try_from_secs_f64(n).map_err(|e| format!("invalid duration {s:?}: {e}"));
    }
    let mut secs = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let n_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&i| i > 0)
            .ok_or_else(invalid)?;
        let n: f64 = rest[..n_end].parse().map_err(|_| invalid())?;
        rest = &rest[n_end..];
        let u_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..u_end];
        secs += n * match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => {
                return Err(format!(
                    "invalid duration {s:?}: unknown unit {unit:?} (use ms, s, m or h)"
                ));
            }
        };
        rest = &rest[u_end..];
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("3").unwrap(), Duration::from_secs(3));
        assert_eq!(parse("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse("15m0s").unwrap(), Duration::from_secs(900));
        assert_eq!(parse("1m0.5s").unwrap(), Duration::from_millis(60_500));
        assert!(parse("2 days").is_err());
        assert!(parse("15min").is_err());
        assert!(parse("m").is_err());
        assert!(parse("").is_err());
        assert!(parse("99999999999999999999h").is_err());
        assert!(parse("x").is_err());
    }
}
