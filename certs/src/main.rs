//! `nodegate-certs`: generate a CA and the webhook's serving certificate, and
//! optionally the patch that puts `caBundle` into the MutatingWebhookConfiguration.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use nodegate_certs::{
    Ca, ServingRequest, ca_bundle_patch, live_path_token, path_token, trust, webhook_services,
    write_atomic, write_files,
};

#[derive(Debug, Parser)]
#[command(version, about, subcommand_negates_reqs = true)]
struct Args {
    /// Without a command: make the certificates (and with
    /// --webhook-config the path token and the caBundle patch) in --out-dir.
    #[command(subcommand)]
    command: Option<Command>,
    /// Name of the webhook's Service.
    #[arg(
        long,
        env = "NODEGATE_CERTS_SERVICE",
        default_value = "nodegate-webhook"
    )]
    service: String,
    /// Namespace of the webhook's Service.
    #[arg(long, env = "NODEGATE_CERTS_NAMESPACE", default_value = "nodegate")]
    namespace: String,
    /// Directory that receives ca.crt, tls.crt and tls.key (created if missing).
    #[arg(long, env = "NODEGATE_CERTS_OUT_DIR", required = true)]
    out_dir: Option<PathBuf>,
    /// Extra IP SAN (repeatable; comma-separated in the env variable), for local use.
    #[arg(long = "ip", env = "NODEGATE_CERTS_IPS", value_delimiter = ',')]
    ips: Vec<IpAddr>,
    /// Validity of the CA and the serving certificate, in days.
    #[arg(long, env = "NODEGATE_CERTS_DAYS", default_value_t = 365)]
    days: u32,
    /// MutatingWebhookConfiguration YAML: also write `ca-bundle-patch.yaml`, the
    /// strategic merge patch that sets its caBundle (for `kubectl patch`), and
    /// serve every Service its webhooks name (one per replica's line).
    #[arg(long, env = "NODEGATE_CERTS_WEBHOOK_CONFIG")]
    webhook_config: Option<PathBuf>,
    /// A CA certificate (PEM) the caBundle keeps trusting besides the new CA,
    /// for a rotation without a fail-open call: the old install's `ca.crt`
    /// (repeatable). Then `ca-bundle-patch.yaml` trusts both, and
    /// `ca-bundle-final-patch.yaml` the new CA alone, for once every
    /// replica serves the new certificate. Only CA certificates the live
    /// caBundle already holds are accepted, so `--webhook-config` must be
    /// the live configuration (`kubectl get mutatingwebhookconfiguration
    /// nodegate -o yaml`); a file with a private key is refused.
    #[arg(
        long = "also-trust",
        env = "NODEGATE_CERTS_ALSO_TRUST",
        value_delimiter = ','
    )]
    also_trust: Vec<PathBuf>,
    /// Leave the webhook lines' paths alone: no `path-token`, so any review
    /// posted to a replica may make it write a stored Node (docs/security.md).
    #[arg(long, env = "NODEGATE_CERTS_NO_PATH_TOKEN")]
    no_path_token: bool,
}

/// The path token's file name inside `--out-dir`: the Secret
/// `nodegate-webhook-path` holds it, the webhook reads it.
const TOKEN_FILE: &str = "path-token";

/// The caBundle patch's file name inside `--out-dir`.
const PATCH_FILE: &str = "ca-bundle-patch.yaml";
/// The mode of every file that holds the path token: `path-token` and the
/// patches, whose lines call `/mutate/<token>`. The patches are written so
/// even without a token (`--no-path-token`): the owner who runs `kubectl
/// patch` is their only reader.
const TOKEN_MODE: u32 = 0o600;
/// With `--also-trust`: the patch that ends the rotation (the new CA alone).
const FINAL_PATCH_FILE: &str = "ca-bundle-final-patch.yaml";

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Replace the path token in the cluster (your kubeconfig's), with no
    /// review of the API server refused its side effect: the Secret holds
    /// both tokens, the webhook StatefulSet rolls, the lines move to the new
    /// token, the old one goes and the StatefulSet rolls again. Run again to
    /// resume an interrupted rotation.
    RotatePathToken {
        /// The install's namespace.
        #[arg(long, env = "NODEGATE_CERTS_NAMESPACE", default_value = "nodegate")]
        namespace: String,
        /// The Secret holding the token (key `token`).
        #[arg(long, default_value = "nodegate-webhook-path")]
        secret: String,
        /// The webhook's StatefulSet.
        #[arg(long, default_value = "nodegate-webhook")]
        statefulset: String,
        /// The MutatingWebhookConfiguration whose lines call the token.
        #[arg(long, default_value = "nodegate")]
        webhook_config: String,
        /// How long each of the two rollouts may take.
        #[arg(long, default_value = "10m", value_parser = nodegate_shared::duration::parse)]
        rollout_timeout: std::time::Duration,
    },
    /// Run in the cluster: keep the CA, the serving certificate, the path
    /// token, every line's caBundle and `/mutate/<token>` path, and renew
    /// them before they expire (docs/install.md).
    Controller(nodegate_certs::cli::ControllerArgs),
    /// Remove nodegate and open every node (the Helm pre-delete hook and the
    /// kustomize removal's Job run this).
    Uninstall(nodegate_certs::cli::UninstallArgs),
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.command {
        Some(Command::Controller(a)) => return nodegate_certs::cli::controller(a),
        Some(Command::Uninstall(a)) => return nodegate_certs::cli::uninstall(a),
        _ => {}
    }
    if let Some(Command::RotatePathToken {
        namespace,
        secret,
        statefulset,
        webhook_config,
        rollout_timeout,
    }) = args.command
    {
        let target = nodegate_certs::rotate::Target {
            namespace,
            secret,
            statefulset,
            webhook_config,
            rollout_timeout,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the runtime")?;
        // One TLS provider for the API client, whatever features other
        // crates of a build turn on.
        let _ = rustls::crypto::ring::default_provider().install_default();
        return rt.block_on(async {
            let client = kube::Client::try_default()
                .await
                .context("a client from your kubeconfig")?;
            nodegate_certs::rotate::rotate(client, &target, path_token(), |line| {
                eprintln!("{line}")
            })
            .await
        });
    }
    let out_dir = args.out_dir.clone().context("--out-dir is required")?;
    // Read the config first so a bad path fails before anything is written.
    let config = args
        .webhook_config
        .as_ref()
        .map(|p| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display())))
        .transpose()?;
    if !args.also_trust.is_empty() && args.webhook_config.is_none() {
        anyhow::bail!(
            "--also-trust only shapes the caBundle patch: give --webhook-config too, the live configuration ({})",
            trust::LIVE_CONFIG_COMMAND
        );
    }
    let also_services = match (&config, &args.webhook_config) {
        (Some(config), Some(path)) => webhook_services(config)
            .with_context(|| format!("reading the Services of {}", path.display()))?,
        _ => Vec::new(),
    };
    let trusted = match (&config, &args.webhook_config) {
        (Some(config), Some(path)) if !args.also_trust.is_empty() => {
            also_trusted(&args.also_trust, config, path)?
        }
        _ => String::new(),
    };
    let ca = Ca::generate(args.days)?;
    let serving = ca.issue(&ServingRequest {
        also_services,
        service: args.service,
        namespace: args.namespace,
        ips: args.ips,
        days: args.days,
    })?;
    // With --webhook-config, every line calls /mutate/<token>. A token
    // already in --out-dir is kept, else the one the given (live)
    // configuration's lines call, so a certificate rotation does not change
    // the path the running replicas accept.
    let token = match (&config, args.no_path_token) {
        (Some(config), false) => Some(match existing_token(&out_dir.join(TOKEN_FILE))? {
            Some(t) => t,
            None => live_path_token(config)
                .context("reading the path token its lines call")?
                .unwrap_or_else(path_token),
        }),
        _ => None,
    };
    // Inject before writing so a bad config leaves no half-done output.
    let bundle = format!("{}{trusted}", ca.cert_pem());
    let patches = match (&config, &args.webhook_config) {
        (Some(config), Some(path)) => {
            let make = |pem: &str| {
                ca_bundle_patch(config, pem, token.as_deref())
                    .with_context(|| format!("making the caBundle patch for {}", path.display()))
            };
            let last = if trusted.is_empty() {
                None
            } else {
                Some(make(ca.cert_pem())?)
            };
            Some((make(&bundle)?, last))
        }
        _ => None,
    };
    write_files(&out_dir, ca.cert_pem(), &serving)?;
    let mut wrote = "ca.crt,tls.crt,tls.key".to_string();
    if let Some(t) = &token {
        write_atomic(&out_dir.join(TOKEN_FILE), t.as_bytes(), TOKEN_MODE)?;
        wrote.push(',');
        wrote.push_str(TOKEN_FILE);
    }
    if let Some((patch, last)) = patches {
        write_atomic(&out_dir.join(PATCH_FILE), patch.as_bytes(), TOKEN_MODE)?;
        wrote.push(',');
        wrote.push_str(PATCH_FILE);
        if let Some(last) = last {
            write_atomic(&out_dir.join(FINAL_PATCH_FILE), last.as_bytes(), TOKEN_MODE)?;
            wrote.push(',');
            wrote.push_str(FINAL_PATCH_FILE);
        }
    }
    eprintln!("wrote {}/{{{wrote}}}", out_dir.display());
    Ok(())
}

/// The PEM the first patch's caBundle adds to the new CA: the certificates
/// of every `--also-trust` file, once each, each a CA the live caBundle
/// holds (nothing else of the files is copied). The files are vetted before
/// the configuration, so a private key is named whatever else is wrong.
fn also_trusted(
    paths: &[PathBuf],
    config: &str,
    config_path: &std::path::Path,
) -> anyhow::Result<String> {
    let refused =
        |p: &PathBuf, why: trust::Refusal| anyhow::anyhow!("--also-trust {}: {why}", p.display());
    let mut files = Vec::new();
    for p in paths {
        let text = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
        files.push((
            p,
            trust::parse_ca_certs(&text).map_err(|why| refused(p, why))?,
        ));
    }
    let live = trust::live_ca_bundle(config)
        .with_context(|| format!("--webhook-config {}", config_path.display()))?;
    let mut kept: Vec<trust::CaCert> = Vec::new();
    for (p, certs) in files {
        trust::keep_trusted(&certs, &live).map_err(|why| refused(p, why))?;
        for c in certs {
            if !kept.contains(&c) {
                kept.push(c);
            }
        }
    }
    Ok(kept.iter().map(trust::CaCert::pem).collect())
}

/// The token a previous run left, if any; one that is not a usable token is
/// an error rather than silently replaced (the running replicas may use it).
fn existing_token(path: &std::path::Path) -> anyhow::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(s) => nodegate_shared::path_token::parse(&s)
            .map(|t| Some(t.to_string()))
            .map_err(|why| {
                anyhow::anyhow!("{}: {why}; remove it to make a new one", path.display())
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow::anyhow!("reading {}: {e}", path.display())),
    }
}
