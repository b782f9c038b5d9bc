//! `nodegate-certs`: generate a CA and the webhook's serving certificate, and
//! optionally print the MutatingWebhookConfiguration with `caBundle` filled in.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use nodegate_certs::{Ca, ServingRequest, inject_ca_bundle, write_files};

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
    /// MutatingWebhookConfiguration YAML to print to stdout with caBundle set.
    #[arg(long, env = "NODEGATE_CERTS_WEBHOOK_CONFIG")]
    webhook_config: Option<PathBuf>,
}

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
    let filled = match (&config, &args.webhook_config) {
        (Some(config), Some(path)) => Some(
            inject_ca_bundle(config, ca.cert_pem())
                .with_context(|| format!("filling caBundle in {}", path.display()))?,
        ),
        _ => None,
    };
    write_files(&args.out_dir, ca.cert_pem(), &serving)?;
    if let Some(out) = filled {
        print!("{out}");
    }
    eprintln!(
        "wrote {}/{{ca.crt,tls.crt,tls.key}}",
        args.out_dir.display()
    );
    Ok(())
}
