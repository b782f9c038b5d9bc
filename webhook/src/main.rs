//! `nodegate-webhook`: parse flags, set up logging, serve until SIGTERM.

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = nodegate_webhook::Args::parse();
    if let Some(nodegate_webhook::config::Command::Policy(p)) = &args.command {
        p.taints.validate()?;
        print!(
            "{}",
            nodegate_webhook::policy::render(
                &p.taints.taints,
                &p.taints.boot_taints,
                p.api_version
            )
        );
        return Ok(());
    }
    if let Some(nodegate_webhook::config::Command::Confinement(t)) = &args.command {
        t.validate()?;
        print!(
            "{}",
            nodegate_webhook::confinement::render(
                &t.taints.taints,
                &t.taints.boot_taints,
                &t.release_taints
            )
        );
        return Ok(());
    }
    if let Some(nodegate_webhook::config::Command::WebhookConfig(w)) = &args.command {
        w.taints.validate()?;
        print!(
            "{}",
            nodegate_webhook::webhook_config::render(
                &w.taints.taints,
                &w.taints.boot_taints,
                w.replicas
            )
        );
        return Ok(());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    // Handlers first, so a SIGTERM during startup already means "drain".
    let shutdown = nodegate_shared::signal::shutdown();
    nodegate_webhook::run(args, shutdown).await
}
