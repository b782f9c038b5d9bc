//! Command-line flags (each with an environment fallback) and the validated
//! configuration [`crate::start`] takes.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use nodegate_shared::TaintSpec;
use nodegate_shared::gate_flags::{GateFlags, OwnedFlags};
use nodegate_shared::keys::DEFAULT_TAINT;

use crate::limits::RequestLimits;
use crate::patcher::PatcherOptions;
use crate::render::command::Command;

/// `nodegate-webhook` flags.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "nodegate-webhook", version, about)]
pub struct Args {
    /// HTTPS address serving POST /mutate. An unspecified IP (0.0.0.0, ::)
    /// is replaced by --bind-address when that is set.
    #[arg(long, env = "NODEGATE_LISTEN", default_value = "0.0.0.0:9443")]
    pub listen: SocketAddr,
    /// Plain-HTTP address serving /livez, /readyz and /metrics; an
    /// unspecified IP is replaced by --bind-address as for --listen.
    #[arg(long, env = "NODEGATE_ADMIN_LISTEN", default_value = "0.0.0.0:9090")]
    pub admin_listen: SocketAddr,
    /// The pod's IP (downward API `status.podIP`): listeners given with an
    /// unspecified IP bind this one instead of every address of the host.
    #[arg(long, env = "POD_IP")]
    pub bind_address: Option<IpAddr>,
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
    // `--taint` (nodegate's default without it) and `--boot-taint`.
    #[command(flatten)]
    pub gate: GateFlags,
    // `--owned-taint`: other components' gates, added at create and at a new boot.
    #[command(flatten)]
    pub owned: OwnedFlags,
    /// Fallback re-check of the certificate files, besides change events.
    #[arg(long, env = "NODEGATE_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub tls_reload_interval: Duration,
    /// HTTP/1.1 clients must send a request's headers within this. hyper
    /// also applies it to idle keep-alive connections, so keep it above the
    /// API server's idle-connection timeout (90 s): the client must close an
    /// idle connection first, or a webhook call can race the close and fail.
    #[arg(long, env = "NODEGATE_HEADER_READ_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,
    /// A client must finish the TLS handshake within this.
    #[arg(long, env = "NODEGATE_TLS_HANDSHAKE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub tls_handshake_timeout: Duration,
    /// A request body must arrive in full within this after its headers.
    #[arg(long, env = "NODEGATE_BODY_READ_TIMEOUT", default_value = "3s", value_parser = parse_duration)]
    pub body_read_timeout: Duration,
    /// Deadline of one admission request, headers to answer (waiting for an
    /// in-flight slot included); keep it at or above the webhook
    /// configuration's timeoutSeconds.
    #[arg(long, env = "NODEGATE_REQUEST_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// Largest request body read (`Ki`/`Mi` suffixes accepted); a larger
    /// review is allowed untouched with a 413 status and a warning.
    #[arg(long, env = "NODEGATE_MAX_BODY_BYTES", default_value = "2Mi", value_parser = parse_bytes)]
    pub max_body_bytes: usize,
    /// Request body bytes held at once across all requests; past it a
    /// request is answered 503.
    #[arg(long, env = "NODEGATE_BODY_BUFFER_BYTES", default_value = "32Mi", value_parser = parse_bytes)]
    pub body_buffer_bytes: usize,
    /// Admission requests past their headers at once; more wait.
    #[arg(long, env = "NODEGATE_MAX_INFLIGHT", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_inflight: u32,
    /// Connections open at once on the HTTPS port; more are closed as soon
    /// as accepted (16 more are kept for peers on this host).
    #[arg(long, env = "NODEGATE_MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// HTTP/2 streams open at once per connection.
    #[arg(long, env = "NODEGATE_H2_MAX_CONCURRENT_STREAMS", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    pub h2_max_concurrent_streams: u32,
    /// Connections open at once on the admin port (plus 16 for peers on
    /// this host, such as the kubelet's probes).
    #[arg(long, env = "NODEGATE_ADMIN_MAX_CONNECTIONS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub admin_max_connections: u32,
    /// On SIGTERM, /readyz turns 503 and requests are still served for this
    /// long, so the Service's endpoints drop the pod before it stops accepting
    /// (with failurePolicy Ignore a refused call is a node left untainted).
    #[arg(long, env = "NODEGATE_SHUTDOWN_DELAY", default_value = "5s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,
    /// Then, in-flight requests get this long before connections close.
    #[arg(long, env = "NODEGATE_SHUTDOWN_TIMEOUT", default_value = "20s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,
    /// The secret path token (lowercase hex, 32–63 characters; `nodegate-certs`
    /// writes it as `path-token`). With it, only a review posted to
    /// `/mutate/<token>` — the path the webhook configuration names — may
    /// make the webhook write a stored Node (the re-taint of a re-registering
    /// or rebooted node); any other review is answered, but changes nothing
    /// stored. A file that is missing or unusable turns those writes off.
    /// Unset: every review may, as before.
    #[arg(long, env = "NODEGATE_PATH_TOKEN_FILE")]
    pub path_token_file: Option<PathBuf>,
    /// A re-registering node is re-tainted on its create's claim of a new
    /// boot (before any stored version shows it) at most this often; a
    /// second claim within it waits for the stored new boot, like a status
    /// write.
    #[arg(long, env = "NODEGATE_REREGISTRATION_MIN_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub reregistration_min_interval: Duration,
    /// A re-registration's claimed boot must be stored within this, or the
    /// re-taint is counted as unconfirmed
    /// (`nodegate_webhook_reboot_claims_total{result="unconfirmed"}`).
    #[arg(long, env = "NODEGATE_REBOOT_CONFIRM_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub reboot_confirm_timeout: Duration,
    /// Never use cluster credentials: the patches of a rebooted node's main
    /// resource (a status write cannot carry taints) are skipped and counted.
    #[arg(long, env = "NODEGATE_DISABLE_REBOOT_PATCHES")]
    pub disable_reboot_patches: bool,
    /// Without a command: serve.
    #[command(subcommand)]
    pub command: Option<Command>,
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
    /// `--owned-taint`: added at create and at a new boot only.
    pub owned_taints: Vec<TaintSpec>,
    pub tls_reload_interval: Duration,
    pub header_read_timeout: Duration,
    pub tls_handshake_timeout: Duration,
    pub limits: RequestLimits,
    pub max_connections: usize,
    pub h2_max_concurrent_streams: u32,
    pub admin_max_connections: usize,
    pub shutdown_delay: Duration,
    pub shutdown_timeout: Duration,
    pub kube: KubeMode,
    pub patcher: PatcherOptions,
    /// The path token (`--path-token-file`): which reviews may write a
    /// stored Node; `None` lets every review.
    pub path_token_file: Option<PathBuf>,
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
            owned_taints: Vec::new(),
            tls_reload_interval: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(120),
            tls_handshake_timeout: Duration::from_secs(5),
            limits: RequestLimits::default(),
            max_connections: 1024,
            h2_max_concurrent_streams: 32,
            admin_max_connections: 64,
            shutdown_delay: Duration::ZERO,
            shutdown_timeout: Duration::from_secs(20),
            kube: KubeMode::Disabled,
            patcher: PatcherOptions::default(),
            path_token_file: None,
        }
    }
}

impl TryFrom<Args> for Config {
    type Error = anyhow::Error;

    fn try_from(a: Args) -> Result<Self, Self::Error> {
        a.gate.validate()?;
        a.owned.validate(&a.gate)?;
        if a.tls_reload_interval.is_zero() {
            anyhow::bail!("--tls-reload-interval must be positive");
        }
        if a.reboot_confirm_timeout.is_zero() {
            anyhow::bail!("--reboot-confirm-timeout must be positive");
        }
        if a.request_timeout.is_zero() || a.body_read_timeout.is_zero() {
            anyhow::bail!("--request-timeout and --body-read-timeout must be positive");
        }
        let bind = |addr: SocketAddr| match a.bind_address {
            Some(ip) if addr.ip().is_unspecified() => SocketAddr::new(ip, addr.port()),
            _ => addr,
        };
        Ok(Self {
            listen: bind(a.listen),
            admin_listen: bind(a.admin_listen),
            tls_cert: a.tls_cert,
            tls_key: a.tls_key,
            taints: a.gate.all(),
            owned_taints: a.owned.owned_taints,
            tls_reload_interval: a.tls_reload_interval,
            header_read_timeout: a.header_read_timeout,
            tls_handshake_timeout: a.tls_handshake_timeout,
            limits: RequestLimits {
                max_body_bytes: a.max_body_bytes,
                body_buffer_bytes: a.body_buffer_bytes,
                max_inflight: a.max_inflight as usize,
                body_read_timeout: a.body_read_timeout,
                request_timeout: a.request_timeout,
            },
            max_connections: a.max_connections as usize,
            h2_max_concurrent_streams: a.h2_max_concurrent_streams,
            admin_max_connections: a.admin_max_connections as usize,
            shutdown_delay: a.shutdown_delay,
            shutdown_timeout: a.shutdown_timeout,
            kube: if a.disable_reboot_patches {
                KubeMode::Disabled
            } else {
                KubeMode::Infer
            },
            patcher: PatcherOptions {
                reregistration_min_interval: a.reregistration_min_interval,
                reboot_confirm_timeout: a.reboot_confirm_timeout,
                ..PatcherOptions::default()
            },
            path_token_file: a.path_token_file,
        })
    }
}

/// One parser for every nodegate binary's durations.
pub use nodegate_shared::duration::parse as parse_duration;

/// Bytes: a plain number, or with a `Ki` / `Mi` suffix.
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let (num, unit) = match s.strip_suffix("Mi") {
        Some(n) => (n, 1024 * 1024),
        None => match s.strip_suffix("Ki") {
            Some(n) => (n, 1024),
            None => (s, 1),
        },
    };
    num.trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{s:?}: expected a positive byte count such as 65536, 64Ki or 2Mi"))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn defaults_match_the_issue() {
        let a = Args::try_parse_from(["nodegate-webhook"]).unwrap();
        assert_eq!(a.listen.to_string(), "0.0.0.0:9443");
        assert_eq!(a.admin_listen.to_string(), "0.0.0.0:9090");
        let c = Config::try_from(a).unwrap();
        let shown: Vec<String> = c.taints.iter().map(ToString::to_string).collect();
        assert_eq!(shown, [DEFAULT_TAINT]);
        assert!(matches!(c.kube, KubeMode::Infer));
        assert_eq!(c.limits.max_body_bytes, 2 * 1024 * 1024);
        assert_eq!(c.limits.body_buffer_bytes, 32 * 1024 * 1024);
        assert_eq!(c.max_connections, 1024);
    }

    #[test]
    fn bind_address_replaces_only_unspecified_ips() {
        let a = Args::try_parse_from([
            "x",
            "--bind-address",
            "10.1.2.3",
            "--admin-listen",
            "127.0.0.1:9444",
        ])
        .unwrap();
        let c = Config::try_from(a).unwrap();
        assert_eq!(c.listen.to_string(), "10.1.2.3:9443");
        assert_eq!(c.admin_listen.to_string(), "127.0.0.1:9444");
        let a = Args::try_parse_from(["x", "--bind-address", "fd00::7", "--listen", "[::]:9443"])
            .unwrap();
        assert_eq!(
            Config::try_from(a).unwrap().listen.to_string(),
            "[fd00::7]:9443"
        );
    }

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes("64Ki"), Ok(65536));
        assert_eq!(parse_bytes("2Mi"), Ok(2 * 1024 * 1024));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("2MB").is_err());
        assert!(parse_bytes("-1").is_err());
    }

    #[test]
    fn boot_taints_join_the_taints_and_must_be_noexecute() {
        let a = Args::try_parse_from([
            "x",
            "--boot-taint",
            "nodegate.dev/agent-not-ready=true:NoExecute",
        ])
        .unwrap();
        let shown: Vec<String> = Config::try_from(a)
            .unwrap()
            .taints
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            shown,
            [DEFAULT_TAINT, "nodegate.dev/agent-not-ready=true:NoExecute"]
        );
        let a = Args::try_parse_from(["x", "--boot-taint", DEFAULT_TAINT]).unwrap();
        let err = Config::try_from(a).unwrap_err().to_string();
        assert!(err.contains("must have effect NoExecute"), "{err}");
        let a = Args::try_parse_from([
            "x",
            "--taint",
            "a/b:NoExecute",
            "--boot-taint",
            "a/b:NoExecute",
        ])
        .unwrap();
        let err = Config::try_from(a).unwrap_err().to_string();
        assert!(err.contains("listed twice"), "{err}");
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

    /// `--owned-taint` (and `NODEGATE_OWNED_TAINTS`, comma-separated) is
    /// kept apart from the taints, and refused where it repeats one of them.
    #[test]
    fn owned_taints_are_their_own_list_and_never_repeat_a_taint() {
        let ebs = "ebs.csi.aws.com/agent-not-ready:NoExecute";
        let a = Args::try_parse_from(["x", "--owned-taint", ebs]).unwrap();
        let c = Config::try_from(a).unwrap();
        let shown: Vec<String> = c.owned_taints.iter().map(ToString::to_string).collect();
        assert_eq!(shown, [ebs]);
        assert_eq!(c.taints.len(), 1, "the default taint alone");
        let a = Args::try_parse_from([
            "x",
            "--taint=example.com/x:NoSchedule",
            "--owned-taint",
            "example.com/x=y:NoSchedule",
        ])
        .unwrap();
        let err = Config::try_from(a).unwrap_err().to_string();
        assert!(err.contains("listed twice"), "{err}");
        let a = Args::try_parse_from(["x", "--owned-taint", DEFAULT_TAINT]).unwrap();
        let err = Config::try_from(a).unwrap_err().to_string();
        assert!(err.contains("a gate nodegate ships"), "{err}");
    }
}
