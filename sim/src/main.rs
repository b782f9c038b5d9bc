//! `nodegate-sim`: try nodegate locally (`serve`) or watch it work (`run`).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use nodegate_sim::{self as sim, AdmissionMode, RunOptions};

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
    /// Scale-out, reboot wave and agent restart with nodes deleted meanwhile,
    /// with the webhook on and off; the real agent logic runs for every node.
    /// Prints a table; exits 1 if a guarantee broke.
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
        /// Milliseconds from the kubelet's start to nodegate's agent running on the node.
        #[arg(long, env = "NODEGATE_SIM_AGENT_START_DELAY_MS", default_value_t = 150)]
        agent_start_delay_ms: u64,
        /// Agents that also prune (node watcher + snapshot); the others gate only.
        #[arg(long, env = "NODEGATE_SIM_PRUNING_AGENTS", default_value_t = 5)]
        pruning_agents: usize,
        /// Nodes deleted while the pruning agents are down (one of them re-created).
        #[arg(long, env = "NODEGATE_SIM_DELETED_NODES", default_value_t = 3)]
        deleted_nodes: usize,
        /// Who admits Node creates and updates with nodegate on: the webhook
        /// (`manifests/`) or the MutatingAdmissionPolicy
        /// (`manifests/overlays/admission-policy/`, webhook for nodes/status only).
        #[arg(long, env = "NODEGATE_SIM_ADMISSION", value_enum, default_value_t = AdmissionMode::Webhook)]
        admission: AdmissionMode,
        /// Where the logs of the in-process agents and publishers go (every
        /// agent warns when its safety net taints a node: hundreds of lines
        /// that would bury the table). Default: nodegate-sim-run.log in the
        /// temp directory.
        #[arg(long, env = "NODEGATE_SIM_LOG_FILE", conflicts_with = "verbose")]
        log_file: Option<PathBuf>,
        /// Print the logs on stderr instead of writing them to the log file.
        #[arg(long, short)]
        verbose: bool,
        /// Instead: strict mode's boot gate (a NoExecute taint) on and off,
        /// with pods already bound to the rebooting nodes (`--nodes`,
        /// `--reboot-fraction` and the delays apply).
        #[arg(long, env = "NODEGATE_SIM_STRICT")]
        strict: bool,
    },
}

fn log_filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"))
}

/// Logs on stderr: `serve` is interactive and `--verbose` asks for them.
fn log_to_stderr() {
    tracing_subscriber::fmt()
        .with_env_filter(log_filter())
        .with_writer(std::io::stderr)
        .init();
}

/// Logs into `path` (truncated), so the table is the only thing on the terminal.
fn log_to_file(path: &Path) -> anyhow::Result<()> {
    let file = std::fs::File::create(path)
        .with_context(|| format!("creating the log file {}", path.display()))?;
    tracing_subscriber::fmt()
        .with_env_filter(log_filter())
        .with_ansi(false)
        .with_writer(Mutex::new(file))
        .init();
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Serve {
            kubeconfig_out,
            user,
        } => {
            log_to_stderr();
            sim::serve(kubeconfig_out, &user).await
        }
        Cmd::Run {
            nodes,
            pods_per_node,
            reboot_fraction,
            agent_delay_ms,
            agent_start_delay_ms,
            pruning_agents,
            deleted_nodes,
            admission,
            log_file,
            verbose,
            strict,
        } => {
            anyhow::ensure!(nodes > 0, "--nodes must be at least 1");
            anyhow::ensure!(
                (0.0..=1.0).contains(&reboot_fraction),
                "--reboot-fraction must be within 0..=1"
            );
            anyhow::ensure!(
                pruning_agents + deleted_nodes <= nodes,
                "--pruning-agents + --deleted-nodes must not exceed --nodes"
            );
            let opts = RunOptions {
                nodes,
                pods_per_node,
                reboot_fraction,
                agent_delay: Duration::from_millis(agent_delay_ms),
                agent_start_delay: Duration::from_millis(agent_start_delay_ms),
                pruning_agents,
                deleted_nodes,
                admission,
                ..Default::default()
            };
            if verbose {
                log_to_stderr();
            } else {
                let path =
                    log_file.unwrap_or_else(|| std::env::temp_dir().join("nodegate-sim-run.log"));
                log_to_file(&path)?;
                println!("logs: {} (--verbose prints them here)\n", path.display());
            }
            let broken = if strict {
                let reports = sim::run_strict(&opts).await?;
                print!("{}", sim::render_strict_table(&reports));
                sim::broken_strict_guarantees(&reports)
            } else {
                let reports = sim::run(&opts).await?;
                print!("{}", sim::render_table(&reports));
                sim::broken_guarantees(&reports)
            };
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
