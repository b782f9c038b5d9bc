//! Durations as people type them on a command line: `500ms`, `20s`, `5m`, `1h`.

use std::time::Duration;

/// Parses `<number><unit>` with unit ms, s, m or h (a bare number is seconds).
pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 500ms, 20s, 5m or 1h"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!("{s:?}: a duration must be positive"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse("20"), Ok(Duration::from_secs(20)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("1.5h"), Ok(Duration::from_secs(5400)));
    }

    #[test]
    fn rejects_nonsense() {
        assert!(parse("").is_err());
        assert!(parse("fast").is_err());
        assert!(parse("10d").unwrap_err().contains("unknown unit"));
        assert!(parse("0s").unwrap_err().contains("positive"));
    }
}
