//! The pruning fan-out benchmark: what N nodes' status writes and a churn
//! of joins and deletes cost A pruning agents, with `--prune-source=nodes`
//! (every agent watches every Node) against `roster` (agents watch the
//! publisher's shards). Bytes and events are counted where the emulator's
//! watches hand them to the agents' connections.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use futures::{StreamExt, future::BoxFuture};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use nodegate_agent::handler::{DeleteSource, HandlerError, NodeDeleteHandler};
use nodegate_agent::record::NodeRecord;
use nodegate_emulator::resources::{CONFIGMAPS, NODES};
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use tokio::process::{Child, Command};

use crate::procfs;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "nodegate-fanout",
    about = "Pruning fan-out: Node watch vs node roster"
)]
pub struct Opts {
    /// Simulated nodes.
    #[arg(long, default_value_t = 1000)]
    pub nodes: usize,
    /// Pruning agents in this process (one more runs as a process for its RSS).
    #[arg(long, default_value_t = 20)]
    pub agents: usize,
    /// Every node writes its status once per this period (kubelet's
    /// nodeStatusReportFrequency is 5 min).
    #[arg(long, default_value = "300s", value_parser = crate::duration::parse)]
    pub status_period: Duration,
    /// One node deleted and one joined per this period, in the churn phase.
    #[arg(long, default_value = "5s", value_parser = crate::duration::parse)]
    pub churn_period: Duration,
    /// Length of each phase: heartbeats only, then heartbeats and churn.
    #[arg(long, default_value = "30s", value_parser = crate::duration::parse)]
    pub phase: Duration,
    /// `nodes`, `roster` or `both`.
    #[arg(long, default_value = "both")]
    pub source: String,
    /// The agents' `--prune-confirm-qps`: each agent confirms a deletion
    /// with a GET started within `nodes / qps` s, which the deletion →
    /// handler latency then includes. The agent's default is 200; a large
    /// value measures the roster's propagation alone.
    #[arg(long, default_value_t = 200.0)]
    pub confirm_qps: f64,
}

/// Deletion handler that records when each node's deletion reached it.
#[derive(Debug, Default)]
struct Stamps(Mutex<HashMap<String, Instant>>);

impl NodeDeleteHandler for Stamps {
    fn name(&self) -> &str {
        "bench-stamps"
    }
    fn handle<'a>(
        &'a self,
        node: &'a NodeRecord,
        _source: DeleteSource,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        if let Ok(mut m) = self.0.lock() {
            m.entry(node.name.clone()).or_insert_with(Instant::now);
        }
        Box::pin(async { Ok(()) })
    }
}

/// What one source cost.
#[derive(Debug, Default)]
pub struct Report {
    pub source: String,
    pub nodes: usize,
    pub agents: usize,
    pub heartbeats: u64,
    /// Events and bytes to all agents per second, heartbeats only.
    pub quiet_events_s: f64,
    pub quiet_bytes_s: f64,
    /// The same with churn.
    pub churn_events_s: f64,
    pub churn_bytes_s: f64,
    pub deletions: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub missed: usize,
    pub publisher_cpu_pct: Option<f64>,
    pub publisher_rss_mib: Option<f64>,
    pub agent_rss_mib: f64,
}

fn bin(name: &str) -> anyhow::Result<PathBuf> {
    let p = nodegate_e2e::process::bin_path(name);
    anyhow::ensure!(
        p.exists(),
        "{} missing: cargo build --release --workspace",
        p.display()
    );
    Ok(p)
}

fn spawn(path: &Path, kubeconfig: &Path, args: &[String]) -> anyhow::Result<Child> {
    Command::new(path)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("spawning {}", path.display()))
}

async fn wait_for(
    what: &str,
    limit: Duration,
    mut cond: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let end = Instant::now() + limit;
    while !cond() {
        anyhow::ensure!(Instant::now() < end, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn pct(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// Runs one source end to end on a fresh emulator.
pub async fn run(o: &Opts, source: &str) -> anyhow::Result<Report> {
    let emu = Emulator::start(EmulatorOptions::default()).await?;
    let admin = emu.client(users::ADMIN).await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let names: Vec<String> = (0..o.nodes).map(|i| format!("node-{i:05}")).collect();
    futures::stream::iter(names.iter().enumerate())
        .map(|(i, n)| {
            let nodes = nodes.clone();
            async move {
                let node: Node = serde_json::from_value(crate::fixtures::cluster_node(n, i))?;
                nodes.create(&PostParams::default(), &node).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<()>>>()?;
    emu.apply(
        "{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{\"name\":\"nodegate\"}}",
    )?;

    let mut publisher = None;
    if source == "roster" {
        let kc = emu.kubeconfig(users::ROSTER)?;
        publisher = Some(spawn(
            &bin("nodegate-roster")?,
            &kc,
            &[
                "--namespace",
                "nodegate",
                "--admin-listen",
                "127.0.0.1:0",
                "--identity",
                "bench",
            ]
            .map(String::from),
        )?);
    }
    let dir = tempfile::tempdir()?;
    let mut agents = Vec::new();
    let mut stamps = Vec::new();
    for (i, own) in names.iter().take(o.agents).enumerate() {
        let state = dir.path().join(format!("a{i}"));
        let args = nodegate_agent::Args::try_parse_from([
            "nodegate-agent".to_string(),
            format!("--node-name={own}"),
            format!("--state-dir={}", state.display()),
            format!("--prune-source={source}"),
            format!("--prune-confirm-qps={}", o.confirm_qps),
            "--snapshot-interval=1s".into(),
            "--taint-on-shutdown=false".into(),
            "--admin-listen=127.0.0.1:0".into(),
        ])?;
        let s = Arc::new(Stamps::default());
        stamps.push(s.clone());
        let client = emu.client(users::AGENT).await?;
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(nodegate_agent::run_with_handlers(
            args,
            client,
            vec![s as Arc<dyn NodeDeleteHandler>],
            async move {
                let _ = rx.await;
            },
        ));
        agents.push((stop, task, state));
    }
    let proc_state = dir.path().join("process-agent");
    let proc_agent = spawn(
        &bin("nodegate-agent")?,
        &emu.kubeconfig(users::AGENT)?,
        &[
            format!("--node-name={}", names[o.agents]),
            format!("--state-dir={}", proc_state.display()),
            format!("--prune-source={source}"),
            format!("--prune-confirm-qps={}", o.confirm_qps),
            "--on-node-delete=true".into(),
            "--taint-on-shutdown=false".into(),
            "--admin-listen=127.0.0.1:0".into(),
        ],
    )?;
    let states: Vec<PathBuf> = agents
        .iter()
        .map(|a| a.2.clone())
        .chain([proc_state])
        .collect();
    wait_for(
        "every agent's first snapshot",
        Duration::from_secs(600),
        || states.iter().all(|s| s.join("nodes.json").exists()),
    )
    .await?;

    let all_agents = o.agents + 1;
    let delivered = || {
        let n = emu.watch_fanout(&NODES, Some(users::AGENT));
        let c = emu.watch_fanout(&CONFIGMAPS, Some(users::AGENT));
        (n.events + c.events, n.bytes + c.bytes)
    };
    // Settle: watches (re)started after their list replay what they missed;
    // measure only once nothing has arrived for 2 s.
    let mut last = delivered();
    let mut quiet_for = 0;
    let settle_end = Instant::now() + Duration::from_secs(20);
    while quiet_for < 4 && Instant::now() < settle_end {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = delivered();
        quiet_for = if now.0 == last.0 { quiet_for + 1 } else { 0 };
        last = now;
    }
    let pub_pid = publisher.as_ref().and_then(Child::id);
    let pub_cpu0 = pub_pid.and_then(|p| procfs::usage(p).ok());

    // Phase 1: heartbeats only. Phase 2: heartbeats and churn.
    let heartbeat_every = o.status_period.div_f64(o.nodes as f64);
    let mut heartbeats = 0u64;
    let mut next_victim = o.nodes - 1;
    let mut deleted: Vec<(String, Instant)> = Vec::new();
    let mut rates = Vec::new();
    for churn in [false, true] {
        let (e0, b0) = delivered();
        let start = Instant::now();
        let mut beat = tokio::time::interval(heartbeat_every);
        let mut churn_tick = tokio::time::interval(o.churn_period);
        churn_tick.tick().await;
        let mut k = 0usize;
        while start.elapsed() < o.phase {
            tokio::select! {
                _ = beat.tick() => {
                    // Non-agent nodes: the gates' own-node watches are not pruning's cost.
                    let first = o.agents + 1;
                    let span = (o.nodes - deleted.len()).saturating_sub(first).max(1);
                    let n = &names[first + (heartbeats as usize) % span];
                    let patch = serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "True",
                        "reason": "KubeletReady", "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": format!("2026-11-23T10:{:02}:{:02}Z", (heartbeats / 60) % 60, heartbeats % 60)}]}});
                    let nodes = nodes.clone();
                    let n = n.clone();
                    tokio::spawn(async move {
                        let _ = nodes.patch_status(&n, &PatchParams::default(), &Patch::Merge(patch)).await;
                    });
                    heartbeats += 1;
                }
                _ = churn_tick.tick(), if churn => {
                    let victim = names[next_victim].clone();
                    next_victim -= 1;
                    let at = Instant::now();
                    nodes.delete(&victim, &DeleteParams::default()).await?;
                    deleted.push((victim, at));
                    let joiner = format!("join-{k:05}");
                    let node: Node = serde_json::from_value(crate::fixtures::cluster_node(&joiner, o.nodes + k))?;
                    nodes.create(&PostParams::default(), &node).await?;
                    k += 1;
                }
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let (e1, b1) = delivered();
        rates.push(((e1 - e0) as f64 / secs, (b1 - b0) as f64 / secs));
    }
    let window = pub_cpu0.map(|_| 2.0 * o.phase.as_secs_f64());
    let pub_cpu1 = pub_pid.and_then(|p| procfs::usage(p).ok());

    // Every deletion must reach every in-process agent, after its
    // confirmation (spread over nodes / qps seconds).
    let spread = Duration::try_from_secs_f64(o.nodes as f64 / o.confirm_qps).unwrap_or_default();
    let _ = wait_for(
        "deletions handled everywhere",
        Duration::from_secs(30) + spread,
        || {
            stamps.iter().all(|s| {
                s.0.lock()
                    .map(|m| deleted.iter().all(|(n, _)| m.contains_key(n)))
                    .unwrap_or(false)
            })
        },
    )
    .await;
    let mut lat = Vec::new();
    let mut missed = 0;
    for s in &stamps {
        let m = s.0.lock().map(|m| m.clone()).unwrap_or_default();
        for (n, at) in &deleted {
            match m.get(n) {
                Some(t) => lat.push(t.saturating_duration_since(*at)),
                None => missed += 1,
            }
        }
    }
    lat.sort();
    let mem = |c: &Option<Child>| {
        c.as_ref()
            .and_then(Child::id)
            .and_then(|p| procfs::memory(p).ok())
            .map(|m| procfs::mib(m.peak))
    };
    let report = Report {
        source: source.to_string(),
        nodes: o.nodes,
        agents: all_agents,
        heartbeats,
        quiet_events_s: rates[0].0,
        quiet_bytes_s: rates[0].1,
        churn_events_s: rates[1].0,
        churn_bytes_s: rates[1].1,
        deletions: deleted.len(),
        p50: pct(&lat, 0.50),
        p99: pct(&lat, 0.99),
        max: lat.last().copied().unwrap_or_default(),
        missed,
        publisher_cpu_pct: match (pub_cpu0, pub_cpu1, window) {
            (Some(a), Some(b), Some(w)) => Some(100.0 * b.since(&a).cpu().as_secs_f64() / w),
            _ => None,
        },
        publisher_rss_mib: mem(&publisher),
        agent_rss_mib: mem(&Some(proc_agent)).unwrap_or_default(),
    };
    for (stop, task, _) in agents {
        let _ = stop.send(());
        let _ = task.await;
    }
    emu.shutdown().await;
    Ok(report)
}

/// The report as the README's table rows.
pub fn print(reports: &[Report]) {
    println!(
        "| source | nodes | agents | heartbeats | agent events/s (quiet) | bytes/s to agents (quiet) | per agent | events/s (churn) | bytes/s (churn) | deletion→handler p50 / p99 / max | missed | publisher CPU / RSS | agent RSS |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in reports {
        println!(
            "| {} | {} | {} | {} | {:.1} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} / {:.0} / {:.0} ms | {} | {} | {:.1} MiB |",
            r.source,
            r.nodes,
            r.agents,
            r.heartbeats,
            r.quiet_events_s,
            r.quiet_bytes_s,
            r.quiet_bytes_s / r.agents as f64,
            r.churn_events_s,
            r.churn_bytes_s,
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3,
            r.max.as_secs_f64() * 1e3,
            r.missed,
            match (r.publisher_cpu_pct, r.publisher_rss_mib) {
                (Some(c), Some(m)) => format!("{c:.1} % / {m:.1} MiB"),
                _ => "—".to_string(),
            },
            r.agent_rss_mib,
        );
    }
}
