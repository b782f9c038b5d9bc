//! Durations on command lines and in env: `500ms`, `2s`, `1.5s`, `3m`,
//! `1h` or a bare number of seconds, the same for every nodegate binary.

use std::time::Duration;

/// Parses `500ms`, `2s`, `1.5s`, `3m`, `1h` or a bare number of seconds.
pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 500ms, 2s, 1m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration {s:?}: unknown unit {unit:?} (use ms, s, m or h)"
            ));
        }
    };
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
        assert!(parse("2 days").is_err());
        assert!(parse("x").is_err());
    }
}
