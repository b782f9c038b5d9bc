//! `nodegate-sim run`: the scenario — scale-out, reboot wave, agent restart
//! with nodes deleted meanwhile — with the webhook on and off, and the
//! simulated cluster around the real agents (kubelets, node lifecycle
//! controller, a naive scheduler, an observer that records ground truth).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use nodegate_e2e::process::{WebhookOptions, WebhookProcess};
use nodegate_emulator::admission::NOT_READY_TAINT_KEY;
use nodegate_emulator::kubelet::SimKubelet;
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use serde_json::{Value, json};

use crate::fleet::{Dispatched, Fleet};
use crate::lock::lock;
use crate::publishers;
use crate::report::{PruneReport, REBOOT_WINDOW, ScenarioReport};

/// Knobs of `nodegate-sim run`.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub nodes: usize,
    pub pods_per_node: usize,
    /// Share of nodes rebooted in the wave.
    pub reboot_fraction: f64,
    /// Time from a kubelet start to its Ready condition.
    pub kubelet_ready_delay: Duration,
    /// Time from a boot to the network agent being ready (plus up to `agent_jitter`).
    pub agent_delay: Duration,
    pub agent_jitter: Duration,
    /// Time from the kubelet's start to nodegate's agent running on the node
    /// (its DaemonSet pod is created only once the Node exists).
    pub agent_start_delay: Duration,
    /// The agent's `--probe-period` (the file probe also reacts through inotify).
    pub probe_period: Duration,
    /// Agents that also prune (node watcher + snapshot); the others run the
    /// gate only, so the emulator's watch fan-out stays small.
    pub pruning_agents: usize,
    /// Nodes deleted while the pruning agents are down (the first re-created).
    pub deleted_nodes: usize,
    /// Concurrent kubelet starts.
    pub concurrency: usize,
    /// The taint the webhook adds (key:Effect form accepted by `--taint`).
    pub taint_key: String,
    /// The configuration given to the emulator in the webhook scenario.
    pub webhook_config: Option<String>,
    /// Who admits Node CREATE and main-resource UPDATE in the nodegate scenario.
    pub admission: AdmissionMode,
    /// Strict mode's boot gate (`--boot-taint`), for `run --strict`.
    pub boot_taint: String,
    /// Agents restarted on the same boot in `run --strict`.
    pub same_boot_restarts: usize,
}

/// How nodegate is installed in the "with nodegate" scenario.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AdmissionMode {
    /// `manifests/`: the webhook for every rule.
    #[default]
    Webhook,
    /// `manifests/overlays/admission-policy/`: the MutatingAdmissionPolicy for
    /// creates and updates, the webhook for re-registrations and reboots seen
    /// on `nodes/status`.
    Policy,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            nodes: 100,
            pods_per_node: 2,
            reboot_fraction: 0.5,
            kubelet_ready_delay: Duration::from_millis(50),
            agent_delay: Duration::from_millis(300),
            agent_jitter: Duration::from_millis(200),
            agent_start_delay: Duration::from_millis(150),
            probe_period: Duration::from_secs(1),
            pruning_agents: 5,
            deleted_nodes: 3,
            concurrency: 16,
            taint_key: "nodegate.dev/agent-not-ready".into(),
            webhook_config: None,
            admission: AdmissionMode::Webhook,
            boot_taint: "nodegate.dev/agent-not-ready=true:NoExecute".into(),
            same_boot_restarts: 3,
        }
    }
}

/// Ground truth of one simulated machine.
#[derive(Debug, Default)]
struct Truth {
    /// The node's network agent (Cilium) is ready on the current boot.
    agent_ready: bool,
    /// When the network agent wrote its probe file on this boot.
    network_ready_at: Option<Instant>,
    /// The next sighting without the taint closes the file→untaint lag.
    untaint_due: bool,
    /// Created without nodegate's taint (webhook off).
    untainted_at_create: bool,
    /// Then tainted by the agent's start-up safety net.
    safety_net_seen: bool,
    /// nodegate's taint on the last sighting.
    tainted: Option<bool>,
    /// Boots on which the network agent was ready: a removal of the taint
    /// is judged by the bootID of the object it shows up on, so a watch
    /// event delivered after the next crash is not blamed on the new boot.
    ready_boots: HashSet<String>,
    reboot_started: Option<Instant>,
    /// When the kubelet's status write with the new bootID returned: from
    /// here on the API server knows, and the taint is due within 1 s.
    boot_written: Option<Instant>,
    /// When the taint was seen after the reboot (closes the window).
    retainted: Option<Instant>,
    /// The bootID of the last version seen.
    last_boot: Option<String>,
    /// Since when versions with a new bootID are stored without the taint.
    new_boot_untainted_since: Option<Instant>,
}

type Truths = Arc<Mutex<HashMap<String, Truth>>>;

fn taints(n: &Node) -> Vec<k8s_openapi::api::core::v1::Taint> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

fn is_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(idx.min(sorted.len() - 1)).copied()
}

/// The node lifecycle controller's taint handling, as a loop.
async fn node_lifecycle(client: kube::Client) {
    let api: Api<Node> = Api::all(client);
    loop {
        if let Ok(list) = api.list(&ListParams::default()).await {
            for n in list.items {
                let t = taints(&n);
                let has = t
                    .iter()
                    .any(|t| t.key == NOT_READY_TAINT_KEY && t.effect == "NoSchedule");
                let ready = is_ready(&n);
                let want: Option<Vec<Value>> = match (ready, has) {
                    (true, true) => Some(
                        t.iter()
                            .filter(|t| !(t.key == NOT_READY_TAINT_KEY && t.effect == "NoSchedule"))
                            .map(|t| serde_json::to_value(t).unwrap_or_default())
                            .collect(),
                    ),
                    (false, false) => {
                        let mut v: Vec<Value> = t
                            .iter()
                            .map(|t| serde_json::to_value(t).unwrap_or_default())
                            .collect();
                        v.push(json!({"key": NOT_READY_TAINT_KEY, "effect": "NoSchedule"}));
                        Some(v)
                    }
                    _ => None,
                };
                if let (Some(want), Some(name)) = (want, n.metadata.name.as_deref()) {
                    let patch = json!({"metadata": {"resourceVersion": n.metadata.resource_version},
                                       "spec": {"taints": want}});
                    // A conflict is retried on the next pass, like the real controller.
                    let _ = api
                        .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
                        .await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the node watch saw of nodegate's taint.
#[derive(Debug, Default)]
struct Seen {
    reboot_retaints: usize,
    early_untaints: usize,
    untaint_lags: Vec<Duration>,
    /// Reboots whose first stored version with the new bootID lacked the
    /// taint, and how long (as watched) until a version had it.
    new_boot_untainted: usize,
    new_boot_windows: Vec<Duration>,
}

/// Watches nodes: closes a rebooting node's window when its taint shows,
/// and checks every removal of the taint against the ground truth.
async fn observer(client: kube::Client, truths: Truths, taint_key: String, seen: Arc<Mutex<Seen>>) {
    let api: Api<Node> = Api::all(client);
    let mut s = watcher(api, watcher::Config::default()).boxed();
    while let Ok(Some(ev)) = s.try_next().await {
        let (watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = ev else {
            continue;
        };
        let Some(name) = n.metadata.name.clone() else {
            continue;
        };
        let has = taints(&n).iter().any(|t| t.key == taint_key);
        let now = Instant::now();
        let mut g = lock(&truths);
        let Some(t) = g.get_mut(&name) else {
            continue;
        };
        let mut s = lock(&seen);
        let boot = n
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.as_str())
            .unwrap_or_default()
            .to_string();
        // The first stored version with a new bootID: tainted already, or the
        // window a scheduler could bind into opens here.
        if !boot.is_empty() {
            if t.last_boot.as_deref().is_some_and(|b| b != boot) && !has {
                s.new_boot_untainted += 1;
                t.new_boot_untainted_since = Some(now);
            }
            t.last_boot = Some(boot);
        }
        if has && let Some(since) = t.new_boot_untainted_since.take() {
            s.new_boot_windows
                .push(now.saturating_duration_since(since));
        }
        if has {
            if t.reboot_started.is_some() && t.retainted.is_none() {
                t.retainted = Some(now);
                s.reboot_retaints += 1;
            }
            if t.untainted_at_create && t.reboot_started.is_none() {
                t.safety_net_seen = true;
            }
        } else {
            let boot = n
                .status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .map(|i| i.boot_id.as_str())
                .unwrap_or_default();
            if t.tainted == Some(true) && !t.ready_boots.contains(boot) {
                s.early_untaints += 1;
                tracing::warn!(node = %name, "nodegate's taint removed before the network agent was ready");
            }
            if t.untaint_due {
                t.untaint_due = false;
                if let Some(at) = t.network_ready_at {
                    s.untaint_lags.push(now.saturating_duration_since(at));
                }
            }
        }
        t.tainted = Some(has);
    }
}

#[derive(Debug, Default)]
struct BindStats {
    bound: usize,
    violations: usize,
    window: usize,
}

/// Binds pending pods to any node without a NoSchedule/NoExecute taint.
async fn scheduler(client: kube::Client, truths: Truths, stats: Arc<Mutex<BindStats>>) {
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    loop {
        // Decisions are made on this snapshot; a taint that lands after it
        // was taken cannot stop them (true of any scheduler's cache).
        let snapshot_at = Instant::now();
        let (Ok(nl), Ok(pl)) = (
            nodes.list(&ListParams::default()).await,
            pods.list(&ListParams::default().fields("spec.nodeName="))
                .await,
        ) else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let candidates: Vec<String> = nl
            .items
            .iter()
            .filter(|n| {
                !taints(n)
                    .iter()
                    .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
            })
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        if !candidates.is_empty() {
            // A few binds per snapshot: a real scheduler's cache is never
            // more than milliseconds behind, and neither should this one be.
            for p in pl.items.into_iter().take(4) {
                let node = &candidates[rand::random_range(0..candidates.len())];
                let ns = p.metadata.namespace.clone().unwrap_or_default();
                let name = p.metadata.name.clone().unwrap_or_default();
                let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
                let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                                     "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
                let bound: Result<Value, _> = api
                    .create_subresource("binding", &name, &PostParams::default(), &binding)
                    .await;
                if bound.is_err() {
                    continue;
                }
                let now = Instant::now();
                let g = lock(&truths);
                let mut s = lock(&stats);
                s.bound += 1;
                if let Some(t) = g.get(node)
                    && !t.agent_ready
                {
                    // From the machine going down until the taint shows, at
                    // most 1 s after the API server learnt of the new boot.
                    let in_window = t.reboot_started.is_some() && {
                        let due = t.boot_written.map(|w| w + REBOOT_WINDOW);
                        match (t.retainted, due) {
                            (Some(seen), Some(due)) => snapshot_at <= seen.min(due),
                            (None, Some(due)) => snapshot_at <= due,
                            (_, None) => true,
                        }
                    };
                    if in_window {
                        s.window += 1;
                    } else {
                        s.violations += 1;
                        tracing::warn!(
                            node = %node,
                            since_reboot = ?t.reboot_started.map(|r| now - r),
                            since_boot_written = ?t.boot_written.map(|r| now - r),
                            since_retainted = ?t.retainted.map(|r| now - r),
                            "pod bound to a node whose agent is not ready"
                        );
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn create_pods(client: &kube::Client, prefix: &str, n: usize) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..n {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("{prefix}-{i}"), "namespace": "default"},
            "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]}
        }))?;
        api.create(&PostParams::default(), &p).await?;
    }
    Ok(())
}

pub(crate) fn agent_delay(o: &RunOptions) -> Duration {
    let jitter = o.agent_jitter.as_millis() as u64;
    o.agent_delay
        + Duration::from_millis(if jitter == 0 {
            0
        } else {
            rand::random_range(0..jitter)
        })
}

/// What every machine of a scenario shares.
struct Ctx<'a> {
    o: &'a RunOptions,
    emu: &'a Emulator,
    fleet: &'a Fleet,
    truths: &'a Truths,
}

/// One machine coming up: kubelet start, Ready after a delay, nodegate's
/// agent after another, the network agent (its probe file) after a third.
/// A reboot is a crash: the network agent and nodegate's agent go down with
/// the machine and start again after the kubelet.
async fn boot(
    mut kubelet: SimKubelet,
    reboot: bool,
    c: &Ctx<'_>,
) -> anyhow::Result<(SimKubelet, bool)> {
    let name = kubelet.name().to_string();
    kubelet.set_ready(false);
    if reboot {
        if let Some(t) = lock(c.truths).get_mut(&name) {
            // The machine goes down now: its agent is not ready until it says so.
            t.agent_ready = false;
            t.untaint_due = false;
            t.reboot_started = Some(Instant::now());
        }
        c.fleet.network_down(&name)?;
        c.fleet.stop(&name).await?;
    }
    let created = if reboot {
        kubelet.reboot().await?
    } else {
        kubelet.register().await?
    };
    let up = Instant::now();
    let tainted = taints(&created).iter().any(|t| t.key == c.o.taint_key);
    if let Some(t) = lock(c.truths).get_mut(&name) {
        if reboot {
            t.boot_written = Some(up);
        } else {
            t.untainted_at_create = !tainted;
        }
    }
    let network_at = up + agent_delay(c.o);
    tokio::time::sleep(c.o.kubelet_ready_delay).await;
    kubelet.set_ready(true);
    kubelet.heartbeat().await?;
    tokio::time::sleep_until((up + c.o.agent_start_delay).into()).await;
    c.fleet.start(c.emu, &name).await?;
    tokio::time::sleep_until(network_at.into()).await;
    // The network agent is ready now; the file tells nodegate's agent.
    if let Some(t) = lock(c.truths).get_mut(&name) {
        t.agent_ready = true;
        t.ready_boots.insert(kubelet.boot_id().to_string());
        t.network_ready_at = Some(Instant::now());
        t.untaint_due = true;
    }
    c.fleet.network_ready(&name)?;
    Ok((kubelet, tainted))
}

/// Name → uid of every Node.
async fn live_uids(nodes: &Api<Node>) -> anyhow::Result<BTreeMap<String, String>> {
    Ok(nodes
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| Some((n.metadata.name?, n.metadata.uid?)))
        .collect())
}

/// Polls `node`'s snapshot until it holds exactly `live` without its own
/// node (or the deadline passes); returns the last one read.
async fn wait_snapshot(
    fleet: &Fleet,
    node: &str,
    live: &BTreeMap<String, String>,
    deadline: Duration,
) -> anyhow::Result<Option<BTreeMap<String, String>>> {
    let mut want = live.clone();
    want.remove(node);
    let end = Instant::now() + deadline;
    loop {
        let snap = fleet.snapshot(node)?;
        if snap.as_ref() == Some(&want) || Instant::now() >= end {
            return Ok(snap);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The agent restart with nodes deleted meanwhile: the pruning agents stop
/// (their last snapshot is written), `deleted_nodes` other nodes are deleted
/// and the first of them re-created under its name (new uid), the agents
/// restart on the same state dirs, and their handlers must run exactly for
/// the deleted nodes (old uids, source `snapshot`), never for a live one,
/// nor with a live node's name: the re-created node's old incarnation is
/// held, not handled.
async fn prune_phase(
    c: &Ctx<'_>,
    admin: &kube::Client,
    names: &[String],
) -> anyhow::Result<PruneReport> {
    let nodes: Api<Node> = Api::all(admin.clone());
    let mut pruners: Vec<String> = c.fleet.pruners().cloned().collect();
    pruners.sort();
    let live = live_uids(&nodes).await?;
    for p in &pruners {
        let snap = wait_snapshot(c.fleet, p, &live, Duration::from_secs(15)).await?;
        anyhow::ensure!(
            snap.is_some_and(|s| s.len() + 1 == live.len()),
            "the snapshot of {p}'s agent never held all {} other nodes",
            live.len() - 1
        );
    }
    let stops = futures::future::join_all(pruners.iter().map(|p| c.fleet.stop(p))).await;
    stops.into_iter().collect::<anyhow::Result<Vec<()>>>()?;

    let victims: Vec<String> = names
        .iter()
        .rev()
        .filter(|n| !c.fleet.is_pruner(n))
        .take(c.o.deleted_nodes)
        .cloned()
        .collect();
    let mut deleted = BTreeSet::new();
    for v in &victims {
        // Decommissioned: the machine (and its agents) first, then the Node.
        c.fleet.network_down(v)?;
        c.fleet.stop(v).await?;
        lock(c.truths).remove(v);
        let uid = live.get(v).cloned().unwrap_or_default();
        nodes.delete(v, &DeleteParams::default()).await?;
        deleted.insert((v.clone(), uid));
    }
    if let Some(again) = victims.first() {
        // Reinstalled under the same name: a new Node object, a new uid.
        lock(c.truths).insert(again.clone(), Truth::default());
        boot(SimKubelet::new(c.emu, again).await?, false, c).await?;
    }
    for p in &pruners {
        c.fleet.start(c.emu, p).await?;
    }
    let live_now = live_uids(&nodes).await?;
    // A handler never gets a name a live Node holds.
    let held: BTreeSet<(String, String)> = deleted
        .iter()
        .filter(|(n, _)| live_now.contains_key(n))
        .cloned()
        .collect();
    let to_prune: BTreeSet<(String, String)> = deleted.difference(&held).cloned().collect();

    let mut report = PruneReport {
        agents: pruners.len(),
        deleted: deleted.len(),
        held: held.len(),
        exact_min: if pruners.is_empty() { 0 } else { usize::MAX },
        ..Default::default()
    };
    for p in &pruners {
        judge_pruner(c, p, &live_now, &to_prune, &mut report).await?;
    }
    report.resurrected += deleted
        .iter()
        .filter(|(n, u)| live_now.get(n) == Some(u))
        .count();
    Ok(report)
}

/// Adds to `report` what the restarted agent of `p` did: whether its
/// handler got each node of `to_prune` exactly once from the snapshot, the
/// deletions it dispatched for nodes not deleted (before the restart too),
/// and the deleted nodes back in its snapshot.
async fn judge_pruner(
    c: &Ctx<'_>,
    p: &str,
    live_now: &BTreeMap<String, String>,
    to_prune: &BTreeSet<(String, String)>,
    report: &mut PruneReport,
) -> anyhow::Result<()> {
    use nodegate_agent::handler::DeleteSource;
    // A deleted node leaves the snapshot only once its handlers ran.
    let snap = wait_snapshot(c.fleet, p, live_now, Duration::from_secs(15)).await?;
    let recorders = c.fleet.recorders(p);
    let Some((last, earlier)) = recorders.split_last() else {
        anyhow::bail!("no recorder for {p}'s agent");
    };
    // Nothing was deleted while the earlier runs were up.
    report.false_prunes += earlier.iter().map(|r| r.calls().len()).sum::<usize>();
    let calls = last.calls();
    let exact = to_prune
        .iter()
        .filter(|(n, u)| {
            let mine: Vec<&Dispatched> = calls
                .iter()
                .filter(|d| &d.name == n && &d.uid == u)
                .collect();
            mine.len() == 1 && mine[0].source == DeleteSource::Snapshot
        })
        .count();
    report.exact_min = report.exact_min.min(exact);
    let false_here: Vec<&Dispatched> = calls
        .iter()
        .filter(|d| !to_prune.contains(&(d.name.clone(), d.uid.clone())))
        .collect();
    if !false_here.is_empty() {
        tracing::warn!(agent = %p, calls = ?false_here, "deletion handler ran for a node that was not deleted");
    }
    report.false_prunes += false_here.len();
    report.resurrected += snap
        .unwrap_or_default()
        .iter()
        .filter(|(n, u)| live_now.get(*n) != Some(*u))
        .count();
    Ok(())
}

/// Polls until every node is free of nodegate's taint (or the deadline);
/// returns (untainted, all).
async fn wait_untainted(
    nodes: &Api<Node>,
    taint_key: &str,
    deadline: Duration,
) -> anyhow::Result<(usize, usize)> {
    let end = Instant::now() + deadline;
    loop {
        let list = nodes.list(&ListParams::default()).await?.items;
        let free = list
            .iter()
            .filter(|n| !taints(n).iter().any(|t| t.key == taint_key))
            .count();
        if free == list.len() || Instant::now() >= end {
            return Ok((free, list.len()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_all_bound(client: &kube::Client, deadline: Duration) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::all(client.clone());
    let end = Instant::now() + deadline;
    loop {
        let pending = pods
            .list(&ListParams::default().fields("spec.nodeName="))
            .await?
            .items
            .len();
        if pending == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < end,
            "{pending} pods still pending after {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs one scenario against a fresh emulator.
pub async fn run_scenario(o: &RunOptions, with_webhook: bool) -> anyhow::Result<ScenarioReport> {
    anyhow::ensure!(
        o.pruning_agents + o.deleted_nodes <= o.nodes,
        "{} pruning agents and {} deleted nodes need at least as many nodes",
        o.pruning_agents,
        o.deleted_nodes
    );
    let started = Instant::now();
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(nodegate_e2e::process::shipped_rbac()?),
        ..Default::default()
    })
    .await?;
    // The install confines the agents to their own Node.
    emu.apply(&nodegate_e2e::process::shipped_confinement()?)?;
    let mut webhook = None;
    if with_webhook {
        let w = WebhookProcess::start(WebhookOptions {
            kubeconfig: Some(emu.webhook_kubeconfig()?),
            // No Service endpoints to drain at the end of a run.
            extra_args: vec!["--shutdown-delay".into(), "0s".into()],
            ..Default::default()
        })
        .await?;
        match o.admission {
            AdmissionMode::Webhook => w.attach(&emu, o.webhook_config.as_deref())?,
            AdmissionMode::Policy => {
                emu.apply(&nodegate_e2e::process::shipped_policy()?)?;
                w.attach(
                    &emu,
                    Some(&nodegate_e2e::process::policy_mode_webhook_config()?),
                )?;
            }
        }
        webhook = Some(w);
    }
    let names: Vec<String> = (0..o.nodes).map(|i| format!("node-{i:03}")).collect();
    let fleet = Fleet::new(names.iter().take(o.pruning_agents).cloned(), o.probe_period)?;
    // What the pruning component runs: the pruning agents read its roster.
    let publishers = publishers::Publishers::start(&emu).await?;
    let result = drive(o, &emu, &fleet, &names, webhook.as_ref()).await;
    // Every agent stops before its API server does, also after a failure.
    let stopped = fleet.stop_all().await;
    let published = publishers.stop().await;
    // Without the webhook's graceful stop (it keeps serving for a drain period).
    let elapsed = started.elapsed();
    if let Some(mut w) = webhook {
        let _ = w.stop().await;
    }
    emu.shutdown().await;
    let mut report = result?;
    stopped?;
    published?;
    report.name = if with_webhook {
        match o.admission {
            AdmissionMode::Webhook => "with nodegate".into(),
            AdmissionMode::Policy => "with nodegate (policy)".into(),
        }
    } else {
        "without webhook".into()
    };
    report.webhook = with_webhook;
    report.elapsed = elapsed;
    Ok(report)
}

/// What the background tasks record while the phases run.
#[derive(Default)]
struct Records {
    truths: Truths,
    stats: Arc<Mutex<BindStats>>,
    seen: Arc<Mutex<Seen>>,
}

/// What the phases counted, for the report.
struct Phases {
    reboots: usize,
    tainted_at_create: usize,
    safety_net_taints: usize,
    prune: PruneReport,
    untainted_at_end: (usize, usize),
}

/// Aborts the background tasks when dropped, so they end with the run
/// however it ends.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// The simulated cluster around the agents: the node lifecycle controller,
/// the observer and the scheduler.
async fn start_background(
    o: &RunOptions,
    emu: &Emulator,
    admin: &kube::Client,
    r: &Records,
) -> anyhow::Result<AbortOnDrop> {
    let tasks = vec![
        tokio::spawn(node_lifecycle(emu.client(users::NODE_CONTROLLER).await?)),
        tokio::spawn(observer(
            admin.clone(),
            r.truths.clone(),
            o.taint_key.clone(),
            r.seen.clone(),
        )),
        tokio::spawn(scheduler(
            emu.client(users::SCHEDULER).await?,
            r.truths.clone(),
            r.stats.clone(),
        )),
    ];
    Ok(AbortOnDrop(tasks))
}

/// Scale-out: the pods pending from the start, then every node boots;
/// returns the kubelets and how many nodes were tainted at create.
async fn scale_out(
    c: &Ctx<'_>,
    admin: &kube::Client,
    names: &[String],
) -> anyhow::Result<(Vec<SimKubelet>, usize)> {
    create_pods(admin, "scale-out", c.o.nodes * c.o.pods_per_node).await?;
    let mut kubelets = Vec::new();
    for name in names {
        lock(c.truths).insert(name.clone(), Truth::default());
        kubelets.push(SimKubelet::new(c.emu, name).await?);
    }
    let results: Vec<anyhow::Result<(SimKubelet, bool)>> = futures::stream::iter(kubelets)
        .map(|k| async move { boot(k, false, c).await })
        .buffer_unordered(c.o.concurrency.max(1))
        .collect()
        .await;
    let mut kubelets = Vec::new();
    let mut tainted_at_create = 0;
    for r in results {
        let (k, tainted) = r?;
        tainted_at_create += usize::from(tainted);
        kubelets.push(k);
    }
    wait_all_bound(admin, Duration::from_secs(20))
        .await
        .context("after scale-out")?;
    wait_safety_net(c.truths, Duration::from_secs(20)).await;
    Ok((kubelets, tainted_at_create))
}

/// Waits until the start-up safety net of every agent whose node was
/// untainted at create has tainted it: without the webhook the pods bind
/// before it runs, and a reboot that began first would hide it. At the
/// deadline the wave starts anyway and the report shows the count.
async fn wait_safety_net(truths: &Truths, deadline: Duration) {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        let waiting = lock(truths)
            .values()
            .any(|t| t.untainted_at_create && !t.safety_net_seen);
        if !waiting {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reboot wave, with new work arriving meanwhile: the first nodes by name
/// reboot; returns how many.
async fn reboot_wave(
    c: &Ctx<'_>,
    admin: &kube::Client,
    mut kubelets: Vec<SimKubelet>,
) -> anyhow::Result<usize> {
    let reboots = ((c.o.nodes as f64) * c.o.reboot_fraction).round() as usize;
    kubelets.sort_by(|a, b| a.name().cmp(b.name()));
    let rebooting: Vec<SimKubelet> = kubelets.into_iter().take(reboots).collect();
    let wave_pods = create_pods(admin, "wave", c.o.nodes);
    let wave = futures::stream::iter(rebooting)
        .map(|k| async move { boot(k, true, c).await })
        .buffer_unordered(c.o.concurrency.max(1))
        .collect::<Vec<_>>();
    let (pods_res, wave_res) = tokio::join!(wave_pods, wave);
    pods_res?;
    for r in wave_res {
        r?;
    }
    wait_all_bound(admin, Duration::from_secs(20))
        .await
        .context("after the reboot wave")?;
    Ok(reboots)
}

/// Scale-out, reboot wave and agent restart on a started emulator.
async fn drive(
    o: &RunOptions,
    emu: &Emulator,
    fleet: &Fleet,
    names: &[String],
    webhook: Option<&WebhookProcess>,
) -> anyhow::Result<ScenarioReport> {
    let records = Records::default();
    let admin = emu.client(users::ADMIN).await?;
    let _tasks = start_background(o, emu, &admin, &records).await?;
    let c = Ctx {
        o,
        emu,
        fleet,
        truths: &records.truths,
    };
    let (kubelets, tainted_at_create) = scale_out(&c, &admin, names).await?;
    let reboots = reboot_wave(&c, &admin, kubelets).await?;
    // Counted only now: a safety-net taint may land after the scale-out's
    // pods are bound (they need not wait for it without the webhook).
    let safety_net_taints = lock(&records.truths)
        .values()
        .filter(|t| t.safety_net_seen)
        .count();

    // Agent restart with nodes deleted meanwhile.
    let prune = prune_phase(&c, &admin, names).await?;
    let untainted_at_end = wait_untainted(
        &Api::all(admin.clone()),
        &o.taint_key,
        Duration::from_secs(10),
    )
    .await?;
    let phases = Phases {
        reboots,
        tainted_at_create,
        safety_net_taints,
        prune,
        untainted_at_end,
    };
    report(o, emu, &records, webhook, phases).await
}

/// The scenario's report: what the phases counted, the background tasks'
/// records, the emulator's webhook calls and the webhook's own metrics.
async fn report(
    o: &RunOptions,
    emu: &Emulator,
    records: &Records,
    webhook: Option<&WebhookProcess>,
    phases: Phases,
) -> anyhow::Result<ScenarioReport> {
    let mut lags: Vec<Duration> = lock(&records.truths)
        .values()
        .filter_map(|t| Some(t.retainted?.saturating_duration_since(t.boot_written?)))
        .collect();
    lags.sort();
    let mut lat: Vec<Duration> = emu
        .webhook_calls(false)
        .into_iter()
        .map(|c| c.duration)
        .collect();
    lat.sort();
    let (bound, violations, window) = {
        let s = lock(&records.stats);
        (s.bound, s.violations, s.window)
    };
    let (reboot_retaints, early_untaints, mut untaint_lags) = {
        let s = lock(&records.seen);
        (s.reboot_retaints, s.early_untaints, s.untaint_lags.clone())
    };
    let (reboots_stored_untainted, max_untainted_new_boot_window) = {
        let s = lock(&records.seen);
        (
            s.new_boot_untainted,
            s.new_boot_windows.iter().max().copied(),
        )
    };
    untaint_lags.sort();
    let webhook_reported = match webhook {
        Some(w) => w
            .metrics()
            .await
            .ok()
            .map(|m| (taints_metric(&m, "create"), taints_metric(&m, "reboot"))),
        None => None,
    };
    Ok(ScenarioReport {
        nodes: o.nodes,
        reboots: phases.reboots,
        tainted_at_create: phases.tainted_at_create,
        tainted_at_reboot: reboot_retaints,
        pods_bound: bound,
        violations,
        reboot_window_binds: window,
        max_reboot_taint_lag: lags.last().copied(),
        reboots_stored_untainted,
        max_untainted_new_boot_window,
        p50_reboot_taint_lag: percentile(&lags, 0.5),
        webhook_calls: lat.len(),
        webhook_p50: percentile(&lat, 0.50),
        webhook_p99: percentile(&lat, 0.99),
        webhook_reported,
        safety_net_taints: phases.safety_net_taints,
        early_untaints,
        p50_untaint_lag: percentile(&untaint_lags, 0.5),
        max_untaint_lag: untaint_lags.last().copied(),
        untainted_at_end: phases.untainted_at_end,
        prune: phases.prune,
        ..Default::default()
    })
}

/// Both scenarios, webhook first.
pub async fn run(o: &RunOptions) -> anyhow::Result<Vec<ScenarioReport>> {
    Ok(vec![
        run_scenario(o, true).await?,
        run_scenario(o, false).await?,
    ])
}

/// `nodegate_webhook_taints_added_total{reason="..."}` from a metrics text.
fn taints_metric(text: &str, reason: &str) -> u64 {
    let prefix = format!("nodegate_webhook_taints_added_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0)
}
