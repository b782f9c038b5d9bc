//! Command-line flags of `nodegate-roster`, each with an env fallback.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use nodegate_shared::duration::parse as parse_duration;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "nodegate-roster",
    version,
    args_override_self = true,
    about = "Publishes the set of Nodes as compact, sharded ConfigMaps so pruning agents need not watch every Node"
)]
pub struct Args {
    /// Namespace of the shard ConfigMaps and the Lease (the agents read it).
    #[arg(long, env = "POD_NAMESPACE", default_value = "nodegate")]
    pub namespace: String,

    /// This replica's identity in the Lease (downward API `metadata.name`).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// Number of shards. A node's record lives in shard `fnv1a64(name) % N`;
    /// keep each under 256 KiB (~700 nodes per shard). Changing it starts a
    /// new epoch: agents prune nothing until every shard is rewritten. At
    /// most 1024: readers refuse shards of larger rosters.
    #[arg(long, env = "NODEGATE_ROSTER_SHARDS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::shard::MAX_SHARDS)))]
    pub shards: u32,

    /// At most one round of shard writes per interval (coalesces bursts).
    #[arg(long, env = "NODEGATE_ROSTER_INTERVAL", default_value = "200ms", value_parser = parse_duration)]
    pub interval: Duration,

    /// The roster's name: its shards are `<name>-<i>` labelled
    /// `nodegate.dev/roster=<name>`, and the replicas elect a leader on the
    /// coordination.k8s.io Lease `<name>`. The pruning component's RBAC and
    /// policies allow the default only; another name needs its own.
    #[arg(long, env = "NODEGATE_ROSTER_NAME", default_value = crate::shard::DEFAULT_NAME)]
    pub name: String,

    /// How long a standby waits after the leader's last renewal it saw.
    #[arg(long, env = "NODEGATE_ROSTER_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,

    /// The leader stops writing when it has not renewed for this long.
    #[arg(long, env = "NODEGATE_ROSTER_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub renew_deadline: Duration,

    /// Time between lease attempts (renewals while leading).
    #[arg(long, env = "NODEGATE_ROSTER_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub retry_period: Duration,

    /// Admin HTTP address: /livez, /readyz, /metrics.
    #[arg(long, env = "NODEGATE_ADMIN_LISTEN", default_value = "0.0.0.0:9092")]
    pub admin_listen: SocketAddr,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error(
        "--renew-deadline ({renew:?}) must be shorter than --lease-duration ({lease:?}), and --retry-period ({retry:?}) shorter than both: otherwise a standby can take over while the old leader still writes"
    )]
    Timing {
        lease: Duration,
        renew: Duration,
        retry: Duration,
    },
    #[error("--namespace must not be empty")]
    Namespace,
    #[error(
        "--name {0:?} must be a DNS-1123 label of at most 50 characters (shards append -<index>)"
    )]
    Name(String),
}

impl Args {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.namespace.trim().is_empty() {
            return Err(ConfigError::Namespace);
        }
        if !is_roster_name(&self.name) {
            return Err(ConfigError::Name(self.name.clone()));
        }
        if self.renew_deadline >= self.lease_duration || self.retry_period >= self.renew_deadline {
            return Err(ConfigError::Timing {
                lease: self.lease_duration,
                renew: self.renew_deadline,
                retry: self.retry_period,
            });
        }
        Ok(())
    }

    /// `--identity`, or the host name and process id.
    pub fn identity(&self) -> String {
        self.identity
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
                format!("{}-{}", host.trim(), std::process::id())
            })
    }
}

/// A valid roster name: its shard names `<name>-<i>` are DNS-1123 labels
/// and it is a valid label value.
pub fn is_roster_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 50
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_client_go_s_and_valid() {
        let a = Args::try_parse_from(["nodegate-roster"]).unwrap();
        assert_eq!(a.namespace, "nodegate");
        assert_eq!(a.shards, 64);
        assert_eq!(a.lease_duration, Duration::from_secs(15));
        assert_eq!(a.renew_deadline, Duration::from_secs(10));
        assert_eq!(a.retry_period, Duration::from_secs(2));
        assert_eq!(a.admin_listen.port(), 9092);
        a.validate().unwrap();
        assert!(!a.identity().is_empty());
    }

    #[test]
    fn unsafe_timings_and_bad_shards_are_refused() {
        let a = Args::try_parse_from(["r", "--lease-duration", "5s", "--renew-deadline", "5s"])
            .unwrap();
        assert!(
            a.validate()
                .unwrap_err()
                .to_string()
                .contains("shorter than")
        );
        assert!(Args::try_parse_from(["r", "--shards", "0"]).is_err());
        assert!(Args::try_parse_from(["r", "--shards", "1025"]).is_err());
        assert!(Args::try_parse_from(["r", "--shards", "1024"]).is_ok());
        assert!(Args::try_parse_from(["r", "--interval", "soon"]).is_err());
        let a = Args::try_parse_from(["r", "--name", "Roster_1"]).unwrap();
        assert!(a.validate().unwrap_err().to_string().contains("DNS-1123"));
    }
}
