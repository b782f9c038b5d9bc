//! `nodegate-sim run --strict`: strict mode's boot gate (a NoExecute taint)
//! against pods already bound to rebooting nodes, with the gate and without.
//!
//! Both runs have the real webhook and agents (the gate run with
//! `--boot-taint` on both and the strict-mode confinement), simulated
//! kubelets that admit their bound pods at every start as the kubelet does
//! (the emulator's `pod_admission`), and the emulator's taint-eviction
//! controller. Every node first boots and gets one pod that does not
//! tolerate the gate and one that does; then a reboot wave, then agent
//! restarts on the same boot with one more untolerating pod per node.
//!
//! The kubelet here lists its pods once its re-registration has returned.
//! The webhook adds the gate only once the new boot is stored (after the
//! kubelet's status write: a re-registration's claim alone never brings an
//! evicting taint), so an untolerating pod listed first starts, and the
//! taint-eviction controller deletes it once the gate is stored: each is
//! refused, or started and evicted (`admitted_early`, the cost of that rule);
//! upstream does not order the kubelet's pod listing and its status write
//! (see the emulator's README).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use nodegate_e2e::process::{WebhookOptions, WebhookProcess};
use nodegate_emulator::kubelet::{PodAdmissions, SimKubelet};
use nodegate_emulator::taint_eviction_controller::TaintEvictionController;
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::DEFAULT_TAINT;
use serde_json::json;

use crate::fleet::Fleet;
use crate::lock::lock;
use crate::scenario::{RunOptions, agent_delay};
use crate::strict_report::StrictReport;

/// The label the run writes to order its reads after the observer's.
const MARK: &str = "nodegate-sim/mark";
const NS: &str = "default";
const DEADLINE: Duration = Duration::from_secs(15);

/// Both runs, the gate first.
pub async fn run_strict(o: &RunOptions) -> anyhow::Result<Vec<StrictReport>> {
    Ok(vec![
        strict_scenario(o, true).await?,
        strict_scenario(o, false).await?,
    ])
}

/// The strict-mode install's confinement (it lets the agent add the gate
/// only on a boot not recorded as ready).
fn strict_confinement() -> anyhow::Result<String> {
    let p =
        nodegate_e2e::process::manifests_dir().join("../components/strict-mode/confinement.yaml");
    std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
}

/// One run on a fresh emulator; `strict` turns the boot gate on.
pub async fn strict_scenario(o: &RunOptions, strict: bool) -> anyhow::Result<StrictReport> {
    let started = Instant::now();
    let gate: TaintSpec = o.boot_taint.parse().context("the boot taint")?;
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(nodegate_e2e::process::shipped_rbac()?),
        ..Default::default()
    })
    .await?;
    emu.apply(&if strict {
        strict_confinement()?
    } else {
        nodegate_e2e::process::shipped_confinement()?
    })?;
    let mut extra_args = vec!["--shutdown-delay".to_string(), "0s".to_string()];
    let mut boot_taints = Vec::new();
    if strict {
        extra_args.push(format!("--boot-taint={}", o.boot_taint));
        boot_taints.push(o.boot_taint.clone());
    }
    let mut webhook = WebhookProcess::start(WebhookOptions {
        kubeconfig: Some(emu.webhook_kubeconfig()?),
        extra_args,
        ..Default::default()
    })
    .await?;
    webhook.attach(&emu, o.webhook_config.as_deref())?;
    let names: Vec<String> = (0..o.nodes).map(|i| format!("node-{i:03}")).collect();
    // No pruning agents: this run is about the gate.
    let fleet = Fleet::new(std::iter::empty(), o.probe_period)?.with_boot_taints(boot_taints);
    let result = drive(o, &emu, &fleet, &names, &gate, strict).await;
    let stopped = fleet.stop_all().await;
    let elapsed = started.elapsed();
    let _ = webhook.stop().await;
    emu.shutdown().await;
    let mut report = result?;
    stopped?;
    report.name = if strict {
        "strict mode".into()
    } else {
        "without boot gate".into()
    };
    report.strict = strict;
    report.elapsed = elapsed;
    Ok(report)
}

/// One node version as the admin's watch saw it, in the watch's order.
#[derive(Debug, Clone)]
struct Version {
    node: String,
    boot: String,
    /// The boot gate (NoExecute).
    gated: bool,
    /// nodegate's ordinary taint.
    tainted: bool,
    mark: Option<String>,
}

type Versions = Arc<Mutex<Vec<Version>>>;

fn has(n: &Node, spec: &TaintSpec) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter()
                .any(|t| t.key == spec.key() && t.effect == spec.effect().as_str())
        })
}

async fn observe(client: kube::Client, gate: TaintSpec, versions: Versions) {
    let mut s = watcher(Api::<Node>::all(client), watcher::Config::default()).boxed();
    while let Ok(Some(ev)) = s.try_next().await {
        let (watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = ev else {
            continue;
        };
        let v = Version {
            node: n.metadata.name.clone().unwrap_or_default(),
            boot: n
                .status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .map(|i| i.boot_id.clone())
                .unwrap_or_default(),
            gated: has(&n, &gate),
            tainted: n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| {
                    t.iter()
                        .any(|t| t.key == gate.key() && t.effect == "NoSchedule")
                }),
            mark: n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MARK).cloned()),
        };
        lock(&versions).push(v);
    }
}

/// Labels `nodes` with `mark` and waits until the observer saw every one:
/// from then on it has seen every earlier version of them.
async fn sync_observer(
    api: &Api<Node>,
    versions: &Versions,
    nodes: &[String],
    mark: &str,
) -> anyhow::Result<()> {
    for n in nodes {
        let label = json!({"metadata": {"labels": {MARK: mark}}});
        api.patch(n, &PatchParams::default(), &Patch::Merge(label))
            .await?;
    }
    let end = Instant::now() + DEADLINE;
    loop {
        let seen: BTreeSet<String> = lock(versions)
            .iter()
            .filter(|v| v.mark.as_deref() == Some(mark))
            .map(|v| v.node.clone())
            .collect();
        if nodes.iter().all(|n| seen.contains(n)) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < end,
            "the node watch did not see mark {mark}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What every machine of the run shares.
struct Ctx<'a> {
    o: &'a RunOptions,
    emu: &'a Emulator,
    fleet: &'a Fleet,
    nodes: Api<Node>,
    gate: &'a TaintSpec,
    /// nodegate's ordinary taint.
    taint: TaintSpec,
    strict: bool,
}

/// Polls until `node` carries neither nodegate's taint nor the gate.
async fn wait_ready(c: &Ctx<'_>, node: &str) -> anyhow::Result<()> {
    let end = Instant::now() + DEADLINE;
    loop {
        let n = c.nodes.get(node).await?;
        let tainted = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| {
                t.iter()
                    .any(|t| t.key == c.taint.key() || t.key == c.gate.key())
            });
        if !tainted {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < end, "{node} never became ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One machine coming up (a reboot is a crash first): the kubelet registers,
/// then admits its bound pods; nodegate's agent starts after a delay, the
/// network agent is ready after another; returns the kubelet's admissions,
/// made before the network agent was ready.
async fn boot(
    kubelet: &mut SimKubelet,
    reboot: bool,
    c: &Ctx<'_>,
) -> anyhow::Result<PodAdmissions> {
    let name = kubelet.name().to_string();
    if reboot {
        c.fleet.network_down(&name)?;
        c.fleet.stop(&name).await?;
        kubelet.reboot().await?;
    } else {
        kubelet.register().await?;
    }
    let up = Instant::now();
    let admitted = kubelet.admit_pods().await?;
    tokio::time::sleep_until((up + c.o.agent_start_delay).into()).await;
    c.fleet.start(c.emu, &name).await?;
    tokio::time::sleep_until((up + agent_delay(c.o)).into()).await;
    c.fleet.network_ready(&name)?;
    wait_ready(c, &name).await?;
    Ok(admitted)
}

/// Boots every kubelet, `concurrency` at a time.
async fn boot_all(
    kubelets: Vec<SimKubelet>,
    reboot: bool,
    c: &Ctx<'_>,
) -> anyhow::Result<Vec<(SimKubelet, PodAdmissions)>> {
    futures::stream::iter(kubelets)
        .map(|mut k| async move {
            let a = boot(&mut k, reboot, c).await?;
            Ok((k, a))
        })
        .buffer_unordered(c.o.concurrency.max(1))
        .try_collect()
        .await
}

fn pod(name: &str, node: &str, tolerate: Option<&TaintSpec>) -> anyhow::Result<Pod> {
    let tolerations = match tolerate {
        Some(g) => json!([{"key": g.key(), "operator": "Exists", "effect": g.effect().as_str()}]),
        None => json!([]),
    };
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"nodeName": node, "tolerations": tolerations,
                 "containers": [{"name": "app", "image": "registry.example/app:1"}]}
    }))?)
}

/// Restarts `node`'s agent on the same boot, then puts nodegate's ordinary
/// taint back (as an admin could) and waits until the agent took it off:
/// its start-up pass, the safety net included, ran before that. A restart
/// that adds nothing writes nothing, so there is nothing else to wait for.
async fn restart_agent(c: &Ctx<'_>, node: &str) -> anyhow::Result<()> {
    c.fleet.stop(node).await?;
    c.fleet.start(c.emu, node).await?;
    let n = c.nodes.get(node).await?;
    let mut taints: Vec<serde_json::Value> = n
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?;
    taints.push(c.taint.to_json());
    let patch = json!({"metadata": {"resourceVersion": n.metadata.resource_version},
                       "spec": {"taints": taints}});
    c.nodes
        .patch(node, &PatchParams::default(), &Patch::Strategic(patch))
        .await?;
    wait_ready(c, node).await
}

/// Polls until the taint-eviction controller deleted every pod of `due`
/// (or the deadline: the report then shows fewer).
async fn wait_evicted(evictor: &TaintEvictionController, due: &BTreeSet<String>) {
    let end = Instant::now() + DEADLINE;
    loop {
        let done: BTreeSet<String> = evictor
            .evictions()
            .into_iter()
            .map(|e| e.pod.name)
            .collect();
        if due.is_subset(&done) || Instant::now() >= end {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The background tasks end with the run, however it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn drive(
    o: &RunOptions,
    emu: &Emulator,
    fleet: &Fleet,
    names: &[String],
    gate: &TaintSpec,
    strict: bool,
) -> anyhow::Result<StrictReport> {
    let admin = emu.client(users::ADMIN).await?;
    let versions = Versions::default();
    let _observer = AbortOnDrop(tokio::spawn(observe(
        admin.clone(),
        gate.clone(),
        versions.clone(),
    )));
    let evictor = TaintEvictionController::start(admin.clone());
    let c = Ctx {
        o,
        emu,
        fleet,
        nodes: Api::all(admin.clone()),
        gate,
        taint: DEFAULT_TAINT.parse().context("the default taint")?,
        strict,
    };
    let result = phases(&c, &admin, names, &versions, &evictor).await;
    evictor.stop().await;
    result
}

async fn phases(
    c: &Ctx<'_>,
    admin: &kube::Client,
    names: &[String],
    versions: &Versions,
    evictor: &TaintEvictionController,
) -> anyhow::Result<StrictReport> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);

    // First boot, then two pods per node, started by its kubelet.
    let mut kubelets = Vec::new();
    for n in names {
        kubelets.push(SimKubelet::new(c.emu, n).await?);
    }
    let mut kubelets: Vec<SimKubelet> = boot_all(kubelets, false, c)
        .await?
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    kubelets.sort_by(|a, b| a.name().cmp(b.name()));
    for k in &kubelets {
        let n = k.name();
        pods.create(&PostParams::default(), &pod(&format!("u-{n}"), n, None)?)
            .await?;
        pods.create(
            &PostParams::default(),
            &pod(&format!("t-{n}"), n, Some(c.gate))?,
        )
        .await?;
        k.sync_pods().await?;
    }

    // The reboot wave.
    let reboots = ((c.o.nodes as f64) * c.o.reboot_fraction).round() as usize;
    let rest = kubelets.split_off(reboots.min(kubelets.len()));
    let wave = boot_all(kubelets, true, c).await?;
    let mut r = StrictReport {
        nodes: c.o.nodes,
        reboots: wave.len(),
        bound_untolerating: wave.len(),
        bound_tolerating: wave.len(),
        ..Default::default()
    };
    for (_, a) in &wave {
        let untolerating = |p: &String| p.starts_with(&format!("{NS}/u-"));
        r.admitted_early += a
            .started
            .iter()
            .chain(&a.kept)
            .filter(|p| untolerating(p))
            .count();
        for (p, _) in &a.rejected {
            if untolerating(p) {
                r.refused += 1;
            } else {
                r.refused_tolerating += 1;
            }
        }
    }
    // With the gate every untolerating pod goes: refused or not, the
    // taint-eviction controller deletes it.
    let due: BTreeSet<String> = if c.strict {
        wave.iter()
            .map(|(k, _)| format!("u-{}", k.name()))
            .collect()
    } else {
        BTreeSet::new()
    };
    wait_evicted(evictor, &due).await;
    r.evicted_in_wave = evictor.evictions().len();
    let rebooted: Vec<String> = wave.iter().map(|(k, _)| k.name().to_string()).collect();
    sync_observer(&c.nodes, versions, &rebooted, "wave").await?;
    let new_boots: HashMap<&str, &str> =
        wave.iter().map(|(k, _)| (k.name(), k.boot_id())).collect();
    r.reboots_ungated = new_boots
        .iter()
        .filter(|(node, boot)| {
            let g = lock(versions);
            let first = g.iter().find(|v| v.node == **node && v.boot == **boot);
            !first.is_some_and(|v| v.tainted)
        })
        .count();

    // Agent restarts on the same boot, each node running one more pod.
    let restarted: Vec<&SimKubelet> = wave
        .iter()
        .map(|(k, _)| k)
        .chain(&rest)
        .take(c.o.same_boot_restarts)
        .collect();
    let restarted_names: Vec<String> = restarted.iter().map(|k| k.name().to_string()).collect();
    for k in &restarted {
        let n = k.name();
        pods.create(&PostParams::default(), &pod(&format!("r-{n}"), n, None)?)
            .await?;
        k.sync_pods().await?;
    }
    sync_observer(&c.nodes, versions, &restarted_names, "restart-start").await?;
    let evicted_before = evictor.evictions().len();
    for n in &restarted_names {
        restart_agent(c, n).await?;
    }
    sync_observer(&c.nodes, versions, &restarted_names, "restart-end").await?;
    r.restarts = restarted_names.len();
    r.restart_gated_versions = lock(versions)
        .iter()
        .skip_while(|v| v.mark.as_deref() != Some("restart-start"))
        .take_while(|v| v.mark.as_deref() != Some("restart-end"))
        .filter(|v| v.gated && restarted_names.contains(&v.node))
        .count();
    r.restart_evictions = evictor.evictions().len() - evicted_before;
    Ok(r)
}
