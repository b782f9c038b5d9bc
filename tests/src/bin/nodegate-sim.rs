//! `nodegate-sim`: try nodegate locally (`serve`) or watch it work (`run`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use nodegate_tests::sim::{self, RunOptions};
use nodegate_tests::standin::StandInAgent;

#[derive(Parser)]
#[command(name = "nodegate-sim", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Emulated API server + the real webhook; stays up until Ctrl-C.
    Serve {
        /// Where to write the kubeconfig for kubectl.
        #[arg(long, env = "NODEGATE_SIM_KUBECONFIG_OUT")]
        kubeconfig_out: PathBuf,
        /// The user the kubeconfig authenticates as (e.g. system:node:n1).
        #[arg(long, env = "NODEGATE_SIM_USER", default_value = "admin")]
        user: String,
    },
    /// Scale-out and reboot wave with the webhook on and off; prints a table.
    Run {
        /// Nodes in the scale-out.
        #[arg(long, env = "NODEGATE_SIM_NODES", default_value_t = 100)]
        nodes: usize,
        /// Pods pending from the start, per node (as many again arrive during the reboot wave).
        #[arg(long, env = "NODEGATE_SIM_PODS_PER_NODE", default_value_t = 2)]
        pods_per_node: usize,
        /// Share of the nodes rebooted in the wave (0..=1).
        #[arg(long, env = "NODEGATE_SIM_REBOOT_FRACTION", default_value_t = 0.5)]
        reboot_fraction: f64,
        /// Milliseconds from boot to the network agent being ready (plus up to 200 ms).
        #[arg(long, env = "NODEGATE_SIM_AGENT_DELAY_MS", default_value_t = 300)]
        agent_delay_ms: u64,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().cmd {
        Cmd::Serve {
            kubeconfig_out,
            user,
        } => sim::serve(kubeconfig_out, &user).await,
        Cmd::Run {
            nodes,
            pods_per_node,
            reboot_fraction,
            agent_delay_ms,
        } => {
            anyhow::ensure!(nodes > 0, "--nodes must be at least 1");
            anyhow::ensure!(
                (0.0..=1.0).contains(&reboot_fraction),
                "--reboot-fraction must be within 0..=1"
            );
            let opts = RunOptions {
                nodes,
                pods_per_node,
                reboot_fraction,
                agent_delay: Duration::from_millis(agent_delay_ms),
                ..Default::default()
            };
            let reports = sim::run(&opts, Arc::new(StandInAgent::default())).await?;
            print!("{}", sim::render_table(&reports));
            let broken = sim::broken_guarantees(&reports);
            if broken.is_empty() {
                println!("\nall nodegate guarantees held");
                Ok(())
            } else {
                for b in &broken {
                    println!("BROKEN: {b}");
                }
                std::process::exit(1);
            }
        }
    }
}
