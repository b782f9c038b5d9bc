//! The scale harness (e2e/scale/README.md): refuses in one line without the
//! Kubernetes binaries, else runs every scenario and prints FIGURE lines.

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(
    name = "nodegate-scale",
    about = "nodegate at scale: real control plane, simulated nodes"
)]
struct Cli {
    #[command(flatten)]
    cfg: nodegate_e2e::scale::Config,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Some(why) = nodegate_e2e::scale::missing_binaries() {
        eprintln!("scale: {why}");
        std::process::exit(1);
    }
    let report = nodegate_e2e::scale::run(cli.cfg).await?;
    if !report.failures.is_empty() {
        anyhow::bail!(
            "{} goals missed: {:#?}",
            report.failures.len(),
            report.failures
        );
    }
    println!("scale: every goal met");
    Ok(())
}
