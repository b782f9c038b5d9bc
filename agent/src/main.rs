use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Handlers first: a SIGTERM (kubelet, drain, upgrade) while starting
    // must still re-taint and save the snapshot, not kill the process.
    let shutdown = nodegate_shared::signal::shutdown();
    let args = nodegate_agent::Args::parse();
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    nodegate_agent::run(args, shutdown).await?;
    Ok(())
}
