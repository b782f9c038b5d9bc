//! Cluster Autoscaler beside nodegate (e2e/cluster-autoscaler/README.md):
//! refuses in one line without the Kubernetes binaries or Cluster
//! Autoscaler, else runs the scenarios and prints FIGURE lines.

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(
    name = "nodegate-ca",
    about = "Cluster Autoscaler beside nodegate: real control plane and CA, simulated nodes"
)]
struct Cli {
    #[command(flatten)]
    cfg: nodegate_e2e::cluster_autoscaler::Config,
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
    let missing = nodegate_e2e::cluster_autoscaler::missing_binaries()
        .or_else(nodegate_e2e::cluster_autoscaler::missing_nodegate);
    if let Some(why) = missing {
        eprintln!("cluster-autoscaler: {why}");
        std::process::exit(1);
    }
    let report = nodegate_e2e::cluster_autoscaler::run(cli.cfg).await?;
    if !report.failures.is_empty() {
        anyhow::bail!(
            "{} goals missed: {:#?}",
            report.failures.len(),
            report.failures
        );
    }
    println!("cluster-autoscaler: every goal met");
    Ok(())
}
