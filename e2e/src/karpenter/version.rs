//! The Karpenter release the stand-in behaves as: which taints count as
//! known ephemeral ones changed between releases (`pkg/scheduling/taints.go`):
//! `node.kubernetes.io/not-ready:NoExecute` since v1.7.0, every key under
//! `readiness.k8s.io/` since v1.13.0 (`KnownEphemeralTaintKeyPrefixes`).

use std::fmt;
use std::str::FromStr;

/// `major.minor.patch`; pre-releases are not modelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl Version {
    pub const fn new(major: u64, minor: u64, patch: u64) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// The source the stand-in follows: main at v1.14.0+20.
    pub const READ: Version = Version::new(1, 14, 0);
    /// `KnownEphemeralTaintKeyPrefixes` (`readiness.k8s.io/`) first shipped.
    pub const READINESS_PREFIX: Version = Version::new(1, 13, 0);
    /// `node.kubernetes.io/not-ready:NoExecute` joined `KnownEphemeralTaints`.
    pub const NOT_READY_NO_EXECUTE: Version = Version::new(1, 7, 0);
}

impl Default for Version {
    fn default() -> Self {
        Self::READ
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a Karpenter version (major.minor[.patch], an optional leading v)")]
pub struct ParseError(String);

impl FromStr for Version {
    type Err = ParseError;

    /// `1.13.0`, `v1.13.0` or `1.12` (patch 0).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseError(s.to_string());
        let parts: Vec<&str> = s.strip_prefix('v').unwrap_or(s).split('.').collect();
        if !(2..=3).contains(&parts.len()) {
            return Err(err());
        }
        let num = |p: &str| -> Result<u64, ParseError> {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err());
            }
            p.parse().map_err(|_| err())
        };
        Ok(Version::new(
            num(parts[0])?,
            num(parts[1])?,
            parts.get(2).map_or(Ok(0), |p| num(p))?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_orders() {
        assert_eq!("1.13.0".parse(), Ok(Version::new(1, 13, 0)));
        assert_eq!("v1.12".parse(), Ok(Version::new(1, 12, 0)));
        for bad in ["", "1", "1.x", "1.2.3.4", "1.13.0-rc.1", "v", "1..2"] {
            assert!(bad.parse::<Version>().is_err(), "{bad}");
        }
        assert!(Version::new(1, 12, 9) < Version::READINESS_PREFIX);
        assert!(Version::READ >= Version::READINESS_PREFIX);
        assert_eq!(Version::READINESS_PREFIX.to_string(), "v1.13.0");
    }
}
