//! Command line of `nodegate-loadgen`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::certdir::RotateStyle;
use crate::client::{Proto, Target};
use crate::compare::{self, CompareConfig};
use crate::fixtures::{self, Workload};
use crate::load::{self, LoadConfig};

#[derive(Debug, Parser)]
#[command(
    name = "nodegate-loadgen",
    about = "Load generator for the nodegate webhook: AdmissionReviews over keep-alive TLS"
)]
pub struct Cli {
    /// Runtime worker threads of the load generator (default: one per core).
    #[arg(long, global = true, env = "NODEGATE_LOADGEN_THREADS")]
    pub threads: Option<usize>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Baseline vs webhook at maximum rate, then the webhook at half its maximum.
    Compare(CompareArgs),
    /// Load one running server.
    Run(RunArgs),
    /// Time each step of the webhook's hot path in-process (no network).
    Micro {
        #[arg(long, value_enum, default_value_t = Workload::Mix)]
        workload: Workload,
        #[arg(long, default_value_t = 20_000)]
        iterations: u32,
        /// Only this step (e.g. under `valgrind --tool=dhat`); default all.
        #[arg(long, value_enum)]
        step: Option<crate::micro::Step>,
    },
    /// Print the AdmissionReview bodies of a workload (one JSON document per line).
    Fixtures {
        #[arg(long, value_enum, default_value_t = Workload::Create)]
        workload: Workload,
    },
}

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// Length of each measured phase.
    #[arg(long, default_value = "20s", value_parser = crate::duration::parse)]
    pub duration: Duration,
    /// Keep-alive connections (one request in flight on each).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub connections: u16,
    #[arg(long, value_enum, default_value_t = Proto::H1)]
    pub proto: Proto,
    #[arg(long, value_enum, default_value_t = Workload::Create)]
    pub workload: Workload,
    /// Unmeasured load before each phase.
    #[arg(long, default_value = "2s", value_parser = crate::duration::parse)]
    pub warmup: Duration,
    /// Per-request timeout (the API server's is the webhook's timeoutSeconds).
    #[arg(long, default_value = "10s", value_parser = crate::duration::parse)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// Alternate baseline and webhook this many times; the best run of each counts.
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// Rotate the webhook's certificate during the half-rate phase.
    #[arg(long)]
    pub rotate_certs: bool,
    #[arg(long, value_enum, default_value_t = RotateStyle::Secret)]
    pub rotate_style: RotateStyle,
    #[arg(long, default_value = "1s", value_parser = crate::duration::parse)]
    pub rotate_every: Duration,
    /// Reopen each connection after this many requests (default 100 when rotating).
    #[arg(long)]
    pub reconnect_after: Option<u64>,
    /// Run the half-rate phase this long, sampling RSS every 5 s, and report growth.
    #[arg(long, value_parser = crate::duration::parse)]
    pub soak: Option<Duration>,
    /// Exit non-zero when a target is missed.
    #[arg(long)]
    pub check: bool,
    /// Webhook binary (default: nodegate-webhook next to this one).
    #[arg(long)]
    pub webhook_bin: Option<PathBuf>,
    /// Baseline binary (default: nodegate-baseline next to this one).
    #[arg(long)]
    pub baseline_bin: Option<PathBuf>,
    /// Extra argument for the webhook (repeatable), e.g. `--webhook-arg=--taint=a=b:NoSchedule`.
    #[arg(long, allow_hyphen_values = true)]
    pub webhook_arg: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// HTTPS address of the server.
    #[arg(long)]
    pub addr: SocketAddr,
    /// CA that signed the server's certificate.
    #[arg(long)]
    pub ca: PathBuf,
    /// Server process id, for its CPU time and memory.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Requests per second, open loop (default: closed loop, as fast as possible).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Stop after this many requests (instead of or before --duration).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Only check transport (the baseline does not echo uids or patch).
    #[arg(long)]
    pub baseline: bool,
}

/// Parses arguments, runs, and maps the outcome to an exit code.
pub fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Some(t) = cli.threads {
        rt.worker_threads(t.max(1));
    }
    let rt = rt.build().context("starting the runtime")?;
    rt.block_on(async move {
        match cli.command {
            Command::Compare(a) => run_compare(a).await,
            Command::Run(a) => run_one(a).await,
            Command::Micro {
                workload,
                iterations,
                step,
            } => {
                let steps = step.map_or(crate::micro::ALL.to_vec(), |s| vec![s]);
                for f in fixtures::workload(workload) {
                    for s in &steps {
                        let t = crate::micro::measure(*s, &f, iterations)?;
                        println!(
                            "{:<18} {:>6} B  {:<7} {:>8.2} µs",
                            f.name,
                            f.len(),
                            format!("{s:?}").to_lowercase(),
                            t.as_secs_f64() * 1e6
                        );
                    }
                }
                Ok(ExitCode::SUCCESS)
            }
            Command::Fixtures { workload } => {
                for (i, f) in fixtures::workload(workload).iter().enumerate() {
                    let body = f.body(&fixtures::uid(0, i as u64));
                    println!("{}", String::from_utf8_lossy(&body));
                    eprintln!("{}: {} bytes", f.name, f.len());
                }
                Ok(ExitCode::SUCCESS)
            }
        }
    })
}

async fn run_compare(a: CompareArgs) -> anyhow::Result<ExitCode> {
    let check = a.check;
    let outcome = compare::run(CompareConfig {
        duration: a.load.duration,
        warmup: a.load.warmup,
        connections: usize::from(a.load.connections),
        proto: a.load.proto,
        workload: a.load.workload,
        rounds: a.rounds,
        rotate: a.rotate_certs.then_some(a.rotate_style),
        rotate_every: a.rotate_every,
        reconnect_after: a.reconnect_after,
        soak: a.soak,
        timeout: a.load.timeout,
        webhook_bin: a.webhook_bin,
        baseline_bin: a.baseline_bin,
        webhook_args: a.webhook_arg,
    })
    .await?;
    Ok(if check && !outcome.all_met() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

async fn run_one(a: RunArgs) -> anyhow::Result<ExitCode> {
    let ca =
        std::fs::read_to_string(&a.ca).with_context(|| format!("reading {}", a.ca.display()))?;
    let target = Target::new(a.addr, &ca, a.load.proto)?;
    let mut cfg = LoadConfig {
        connections: usize::from(a.load.connections),
        rate: None,
        duration: Some(a.load.warmup),
        requests: None,
        fixtures: Arc::new(fixtures::workload(a.load.workload)),
        webhook: !a.baseline,
        reconnect_after: None,
        timeout: a.load.timeout,
        server_pid: a.pid,
        sample_every: Duration::from_secs(1),
    };
    load::run(&target, &cfg).await;
    cfg.rate = a.rate;
    cfg.duration = Some(a.load.duration);
    cfg.requests = a.requests;
    let r = load::run(&target, &cfg).await;
    print!("{}", compare::describe(&format!("{}", a.addr), &r));
    Ok(if r.failures.total() == 0 && r.ok > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
