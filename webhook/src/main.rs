//! `nodegate-webhook`: parse flags, print a manifest or set up logging and
//! serve until SIGTERM.

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = nodegate_webhook::Args::parse();
    if let Some(command) = &args.command {
        print!("{}", command.render()?);
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
