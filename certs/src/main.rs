//! `nodegate-certs`: generate a CA and the webhook's serving certificate, and
//! optionally the patch that puts `caBundle` into the MutatingWebhookConfiguration.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use nodegate_certs::{Ca, ServingRequest, ca_bundle_patch, write_atomic, write_files};

#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
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
    #[arg(long, env = "NODEGATE_CERTS_OUT_DIR")]
    out_dir: PathBuf,
    /// Extra IP SAN (repeatable; comma-separated in the env variable), for local use.
    #[arg(long = "ip", env = "NODEGATE_CERTS_IPS", value_delimiter = ',')]
    ips: Vec<IpAddr>,
    /// Validity of the CA and the serving certificate, in days.
    #[arg(long, env = "NODEGATE_CERTS_DAYS", default_value_t = 365)]
    days: u32,
    /// MutatingWebhookConfiguration YAML: also write `ca-bundle-patch.yaml`, the
    /// strategic merge patch that sets its caBundle (for `kubectl patch`).
    #[arg(long, env = "NODEGATE_CERTS_WEBHOOK_CONFIG")]
    webhook_config: Option<PathBuf>,
}

/// The caBundle patch's file name inside `--out-dir`.
const PATCH_FILE: &str = "ca-bundle-patch.yaml";

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Read the config first so a bad path fails before anything is written.
    let config = args
        .webhook_config
        .as_ref()
        .map(|p| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display())))
        .transpose()?;
    let ca = Ca::generate(args.days)?;
    let serving = ca.issue(&ServingRequest {
        service: args.service,
        namespace: args.namespace,
        ips: args.ips,
        days: args.days,
    })?;
    // Inject before writing so a bad config leaves no half-done output.
    let patch = match (&config, &args.webhook_config) {
        (Some(config), Some(path)) => Some(
            ca_bundle_patch(config, ca.cert_pem())
                .with_context(|| format!("making the caBundle patch for {}", path.display()))?,
        ),
        _ => None,
    };
    write_files(&args.out_dir, ca.cert_pem(), &serving)?;
    let mut wrote = "ca.crt,tls.crt,tls.key";
    if let Some(patch) = patch {
        write_atomic(&args.out_dir.join(PATCH_FILE), patch.as_bytes(), 0o644)?;
        wrote = "ca.crt,tls.crt,tls.key,ca-bundle-patch.yaml";
    }
    eprintln!("wrote {}/{{{wrote}}}", args.out_dir.display());
    Ok(())
}
