//! Command-line flags (each with an environment fallback) and the validated
//! configuration [`crate::start`] takes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use nodegate_shared::TaintSpec;
use nodegate_shared::keys::DEFAULT_TAINT;
use nodegate_shared::taint::check_unique;

use crate::patcher::PatcherOptions;

/// `nodegate-webhook` flags.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "nodegate-webhook", version, about)]
pub struct Args {
    /// HTTPS address serving POST /mutate.
    #[arg(long, env = "NODEGATE_LISTEN", default_value = "0.0.0.0:9443")]
    pub listen: SocketAddr,
    /// Plain-HTTP address serving /livez, /readyz and /metrics.
    #[arg(long, env = "NODEGATE_ADMIN_LISTEN", default_value = "0.0.0.0:9090")]
    pub admin_listen: SocketAddr,
    /// Serving certificate (PEM, leaf first); re-read when it changes.
    #[arg(
        long,
        env = "NODEGATE_TLS_CERT",
        default_value = "/etc/nodegate/tls/tls.crt"
    )]
    pub tls_cert: PathBuf,
    /// Private key of the serving certificate (PEM); re-read when it changes.
    #[arg(
        long,
        env = "NODEGATE_TLS_KEY",
        default_value = "/etc/nodegate/tls/tls.key"
    )]
    pub tls_key: PathBuf,
    #[command(flatten)]
    pub taints: TaintArgs,
    /// Fallback re-check of the certificate files, besides change events.
    #[arg(long, env = "NODEGATE_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub tls_reload_interval: Duration,
    /// HTTP/1.1 clients must send a request's headers within this. hyper
    /// also applies it to idle keep-alive connections, so keep it above the
    /// API server's idle-connection timeout (90 s): the client must close an
    /// idle connection first, or a webhook call can race the close and fail.
    #[arg(long, env = "NODEGATE_HEADER_READ_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,
    /// On SIGTERM, /readyz turns 503 and requests are still served for this
    /// long, so the Service's endpoints drop the pod before it stops accepting
    /// (with failurePolicy Ignore a refused call is a node left untainted).
    #[arg(long, env = "NODEGATE_SHUTDOWN_DELAY", default_value = "5s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,
    /// Then, in-flight requests get this long before connections close.
    #[arg(long, env = "NODEGATE_SHUTDOWN_TIMEOUT", default_value = "20s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,
    /// Never use cluster credentials: reboot patches after status writes
    /// (rule 3) are skipped and counted.
    #[arg(long, env = "NODEGATE_DISABLE_REBOOT_PATCHES")]
    pub disable_reboot_patches: bool,
    /// Without a command: serve.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Commands besides serving.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Print the MutatingAdmissionPolicy and binding that do rules 1, 2, 4
    /// and 5 in the API server (Kubernetes ≥ 1.36), for the same taints.
    Policy(PolicyArgs),
    /// Print the ValidatingAdmissionPolicies that confine the agent's and the
    /// webhook's ServiceAccounts (Kubernetes ≥ 1.32), for the same taints.
    Confinement(TaintArgs),
}

/// The taints, shared by serving and `policy` so both read the same flags.
#[derive(Debug, Clone, clap::Args)]
pub struct TaintArgs {
    /// Taint to add, `key[=value]:Effect` (repeatable; comma-separated in the
    /// environment variable).
    #[arg(
        long = "taint",
        env = "NODEGATE_TAINTS",
        value_delimiter = ',',
        default_value = DEFAULT_TAINT
    )]
    pub taints: Vec<TaintSpec>,
}

/// `nodegate-webhook policy` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct PolicyArgs {
    #[command(flatten)]
    pub taints: TaintArgs,
    /// `v1` (Kubernetes ≥ 1.36) or `v1beta1` (1.34–1.35, feature gate on).
    #[arg(long, default_value = "v1")]
    pub api_version: crate::policy::ApiVersion,
}

/// Where the background patcher gets its client.
#[derive(Clone)]
pub enum KubeMode {
    /// In-cluster config or KUBECONFIG; without either, patches are skipped.
    Infer,
    /// No client: patches are skipped.
    Disabled,
    /// A given client (tests).
    Client(kube::Client),
}

impl std::fmt::Debug for KubeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KubeMode::Infer => "Infer",
            KubeMode::Disabled => "Disabled",
            KubeMode::Client(_) => "Client",
        })
    }
}

/// Validated configuration of one webhook instance.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    pub taints: Vec<TaintSpec>,
    pub tls_reload_interval: Duration,
    pub header_read_timeout: Duration,
    pub shutdown_delay: Duration,
    pub shutdown_timeout: Duration,
    pub kube: KubeMode,
    pub patcher: PatcherOptions,
}

impl Config {
    /// Loopback, port 0 for both listeners, default taint, no cluster client,
    /// no shutdown delay: a starting point for tests.
    pub fn local(tls_cert: impl Into<PathBuf>, tls_key: impl Into<PathBuf>) -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self {
            listen: any,
            admin_listen: any,
            tls_cert: tls_cert.into(),
            tls_key: tls_key.into(),
            taints: vec![DEFAULT_TAINT.parse().expect("the default taint is valid")],
            tls_reload_interval: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(120),
            shutdown_delay: Duration::ZERO,
            shutdown_timeout: Duration::from_secs(20),
            kube: KubeMode::Disabled,
            patcher: PatcherOptions::default(),
        }
    }
}

impl TryFrom<Args> for Config {
    type Error = anyhow::Error;

    fn try_from(a: Args) -> Result<Self, Self::Error> {
        if a.taints.taints.is_empty() {
            anyhow::bail!("at least one --taint is required");
        }
        check_unique(&a.taints.taints)?;
        if a.tls_reload_interval.is_zero() {
            anyhow::bail!("--tls-reload-interval must be positive");
        }
        Ok(Self {
            listen: a.listen,
            admin_listen: a.admin_listen,
            tls_cert: a.tls_cert,
            tls_key: a.tls_key,
            taints: a.taints.taints,
            tls_reload_interval: a.tls_reload_interval,
            header_read_timeout: a.header_read_timeout,
            shutdown_delay: a.shutdown_delay,
            shutdown_timeout: a.shutdown_timeout,
            kube: if a.disable_reboot_patches {
                KubeMode::Disabled
            } else {
                KubeMode::Infer
            },
            patcher: PatcherOptions::default(),
        })
    }
}

/// One parser for every nodegate binary's durations.
pub use nodegate_shared::duration::parse as parse_duration;

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn defaults_match_the_issue() {
        let a = Args::try_parse_from(["nodegate-webhook"]).unwrap();
        assert_eq!(a.listen.to_string(), "0.0.0.0:9443");
        assert_eq!(a.admin_listen.to_string(), "0.0.0.0:9090");
        assert_eq!(a.taints.taints.len(), 1);
        assert_eq!(a.taints.taints[0].to_string(), DEFAULT_TAINT);
        let c = Config::try_from(a).unwrap();
        assert!(matches!(c.kube, KubeMode::Infer));
    }

    #[test]
    fn taints_are_validated_and_duplicates_refused() {
        let a = Args::try_parse_from([
            "x",
            "--taint",
            "example.com/a=b:NoSchedule",
            "--taint",
            "example.com/c:NoExecute",
        ])
        .unwrap();
        assert_eq!(Config::try_from(a).unwrap().taints.len(), 2);
        let err = Args::try_parse_from(["x", "--taint", "bad key:NoSchedule"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid taint key"), "{err}");
        let a = Args::try_parse_from([
            "x",
            "--taint",
            "example.com/a=b:NoSchedule",
            "--taint",
            "example.com/a=c:NoSchedule",
        ])
        .unwrap();
        let err = Config::try_from(a).unwrap_err().to_string();
        assert!(err.contains("listed twice"), "{err}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        // The shared parser: hours and fractions too, as for the agent.
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("2 days").is_err());
    }
}
