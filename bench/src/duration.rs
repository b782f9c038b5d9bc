//! Durations as people type them on a command line: `500ms`, `20s`, `5m`,
//! `1h` — nodegate's one parser, plus what a benchmark needs on top: a
//! phase or period of zero would make an interval that never advances.

use std::time::Duration;

/// [`nodegate_shared::duration::parse`], refusing zero.
pub fn parse(s: &str) -> Result<Duration, String> {
    let d = nodegate_shared::duration::parse(s)?;
    if d.is_zero() {
        return Err(format!("{s:?}: a duration must be positive"));
    }
    Ok(d)
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
