use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let shutdown = nodegate_shared::signal::shutdown();
    // One TLS provider for the API client, whatever features other crates
    // of a build turn on.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = nodegate_roster::Args::parse();
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    nodegate_roster::run(args, shutdown).await?;
    Ok(())
}
