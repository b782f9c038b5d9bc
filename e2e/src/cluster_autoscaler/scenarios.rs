//! The scenarios, each case on a clean slate: CA started for the case
//! (fresh caches and node group sizes) and stopped after it (its KWOK
//! provider deletes every Node it made), on a control plane per key
//! profile. A case counts the Nodes CA creates for pending pods that need
//! `--scale-up` nodes, prints `FIGURE ca.<case>.<name> <value>` lines and
//! holds the duplicates against nodegate-check's line for the same
//! configuration: a configuration that duplicates must FAIL it, and one that
//! PASSes it must make none.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Node, Pod, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::autoscaler::{
    self, Autoscaler, CaVersion, GROUP, GROUP_LABEL, NODE_CPU_MILLI, Statuses,
};
use super::nodes::{self, Nodes};
use super::profile::{self, Profile};
use super::{Config, Report, check};
use crate::scale::control_plane::{ControlPlane, Net, wait_ok};
use crate::scale::fleet::{Fleet, ReadyOrder, node_name};
use crate::scale::install::{self, Install, kubectl};
use crate::scale::pki::Pki;

/// Every scenario, in the order they run.
pub const SCENARIOS: [&str; 5] = [
    "defaults",
    "declared",
    "profiles",
    "template",
    "reboot-wave",
];

/// Pods of the pending workload per node: each asks a little under a
/// quarter of a node's CPU, so four fit beside the DaemonSets' Pods and a
/// fifth does not.
const PODS_PER_NODE: usize = 4;
const WORKLOAD: &str = "ca-workload";
const BASE: &str = "ca-base";
/// Long enough for CA to notice (≤ 10 s), create, the nodes to register and
/// turn ready, and every gate to open, whatever the order.
const BIND_DEADLINE: Duration = Duration::from_secs(360);

/// The order of the gate and Ready on a scale-up's nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    GateFirst,
    GateAfterReady,
}

impl Ordering {
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "gate-first" => Ok(Self::GateFirst),
            "gate-after-ready" => Ok(Self::GateAfterReady),
            other => anyhow::bail!("unknown ordering {other} (gate-first, gate-after-ready)"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::GateFirst => "gate-first",
            Self::GateAfterReady => "gate-after-ready",
        }
    }

    fn ready_order(self, cfg: &Config) -> ReadyOrder {
        match self {
            Self::GateFirst => ReadyOrder::ProbeFirst(cfg.ready_after_gate),
            Self::GateAfterReady => ReadyOrder::ReadyFirst(cfg.gate_after_ready),
        }
    }
}

/// CA's configuration for the profile's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CaConfig {
    /// No flag about taints.
    Defaults,
    /// `--startup-taint=<key>` as nodegate-check asks (`--ignore-taint`
    /// before CA 1.29.0: [`autoscaler::declare_flag`]).
    Declared,
}

impl CaConfig {
    fn name(self) -> &'static str {
        match self {
            Self::Defaults => "defaults",
            Self::Declared => "declared",
        }
    }
}

/// Runs every selected scenario: the default key's cluster, then one per
/// other key profile.
pub async fn run_all(cfg: &Config, ca: CaVersion, r: &mut Report) -> anyhow::Result<()> {
    let sel = |s: &str| cfg.scenarios.iter().any(|x| x == s);
    let orderings: Vec<Ordering> = cfg
        .orderings
        .iter()
        .map(|o| Ordering::parse(o))
        .collect::<Result<_, _>>()?;
    if ["defaults", "declared", "template", "reboot-wave"]
        .iter()
        .any(|s| sel(s))
    {
        let wave = if sel("reboot-wave") {
            cfg.wave_nodes
        } else {
            0
        };
        let mut c = Cluster::start(cfg, ca, profile::DEFAULT, wave, r).await?;
        let outcome = async {
            for (scenario, conf) in [
                ("defaults", CaConfig::Defaults),
                ("declared", CaConfig::Declared),
            ] {
                if sel(scenario) {
                    for o in &orderings {
                        c.scale_up(r, &format!("{scenario}.{}", o.name()), conf, *o)
                            .await?;
                    }
                }
            }
            if sel("template") {
                for conf in [CaConfig::Defaults, CaConfig::Declared] {
                    c.template(r, &format!("template.{}", conf.name()), conf)
                        .await?;
                }
            }
            if sel("reboot-wave") {
                for conf in [CaConfig::Declared, CaConfig::Defaults] {
                    c.wave(r, &format!("reboot-wave.{}", conf.name()), conf)
                        .await?;
                }
            }
            anyhow::Ok(())
        }
        .await;
        c.stop().await;
        outcome?;
    }
    if sel("profiles") {
        for p in [profile::MANAGED_CA, profile::KARPENTER] {
            let mut c = Cluster::start(cfg, ca, p, 0, r).await?;
            let outcome = async {
                let confs: &[CaConfig] = if p.startup_by_prefix() {
                    // The key is a startup taint already: no flag to add.
                    &[CaConfig::Defaults]
                } else {
                    &[CaConfig::Defaults, CaConfig::Declared]
                };
                for conf in confs {
                    for o in &orderings {
                        let label = format!("profiles.{}.{}.{}", p.name, conf.name(), o.name());
                        c.scale_up(r, &label, *conf, *o).await?;
                    }
                }
                anyhow::Ok(())
            }
            .await;
            c.stop().await;
            outcome?;
        }
    }
    Ok(())
}

/// One control plane with nodegate installed for a key profile, its first
/// nodes, and everything watching it.
struct Cluster<'a> {
    cfg: &'a Config,
    profile: Profile,
    dir: PathBuf,
    cp: ControlPlane,
    pki: Arc<Pki>,
    admin: Client,
    fleet: Arc<Fleet>,
    nodes: Arc<Nodes>,
    statuses: Statuses,
    install: Install,
    tasks: Vec<JoinHandle<()>>,
    ca_bin: PathBuf,
    /// CA's release: its declaration flag and the Deployment's image tag.
    ca: CaVersion,
    /// nodegate-check's line by CA's args (it does not depend on the order).
    checks: HashMap<Vec<String>, String>,
    /// When the wave's nodes were created.
    wave_born: Instant,
    wave: Vec<String>,
}

/// What a case measured of its scale-up.
struct Count {
    needed: usize,
    created: usize,
    duplicates: usize,
}

impl<'a> Cluster<'a> {
    async fn start(
        cfg: &'a Config,
        ca: CaVersion,
        profile: Profile,
        wave: usize,
        r: &mut Report,
    ) -> anyhow::Result<Cluster<'a>> {
        println!(
            "\n== cluster for key profile {} ({})",
            profile.name, profile.taint
        );
        let ca_bin = super::ca_bin().context("no Cluster Autoscaler")?;
        let dir = cfg.dir.join(profile.name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let net = Net {
            iface: cfg.iface.clone(),
            prefix: crate::scale::prefix(&cfg.net)?,
        };
        let pki = Arc::new(Pki::new()?);
        let cp = match ControlPlane::start(&dir, net.clone(), &pki, 100).await {
            Ok(cp) => cp,
            Err(e) => {
                let _ = net.down();
                return Err(e);
            }
        };
        let set = match setup(cfg, profile, &cp, &pki, r).await {
            Ok(s) => s,
            Err(e) => {
                cp.stop().await;
                return Err(e);
            }
        };
        let mut c = Cluster {
            cfg,
            profile,
            dir,
            cp,
            pki,
            admin: set.admin,
            fleet: set.fleet,
            nodes: set.nodes,
            statuses: set.statuses,
            install: set.install,
            tasks: set.tasks,
            ca_bin,
            ca,
            checks: HashMap::new(),
            wave_born: Instant::now(),
            wave: Vec::new(),
        };
        if let Err(e) = c.first_nodes(wave).await {
            c.stop().await;
            return Err(e);
        }
        Ok(c)
    }

    /// Node 0 (the real agent binary) and the wave's nodes, all ungated.
    async fn first_nodes(&mut self, wave: usize) -> anyhow::Result<()> {
        let names: Vec<String> = (0..=wave).map(node_name).collect();
        for (i, n) in names.iter().enumerate() {
            self.fleet.add(&self.pki, i)?;
            self.fleet.boot(n)?;
        }
        self.wave_born = Instant::now();
        self.wave = names[1..].to_vec();
        let nodes = self.nodes.clone();
        wait_ok(
            "the first nodes Ready and ungated",
            Duration::from_secs(120) + self.cfg.network_start,
            || async {
                names
                    .iter()
                    .all(|n| {
                        nodes
                            .get(n)
                            .is_some_and(|l| l.ready_now && !l.gated_now && l.ungated.is_some())
                    })
                    .then_some(())
            },
        )
        .await
    }

    async fn stop(self) {
        for t in &self.tasks {
            t.abort();
        }
        self.fleet.shutdown().await;
        for p in self
            .install
            .webhooks
            .into_iter()
            .chain(self.install.rosters)
        {
            p.stop(Duration::from_secs(5)).await;
        }
        self.cp.stop().await;
    }

    fn kubeconfig(&self) -> PathBuf {
        self.cp.admin_kubeconfig.clone()
    }

    /// CA's args for `conf`, published as its Deployment, and nodegate-check's
    /// line for them (once per configuration).
    async fn configure(
        &mut self,
        r: &mut Report,
        label: &str,
        conf: CaConfig,
    ) -> anyhow::Result<(Vec<String>, String)> {
        let startup: Vec<&str> = match conf {
            CaConfig::Defaults => Vec::new(),
            CaConfig::Declared => vec![self.profile.key()],
        };
        let args = autoscaler::args(&self.kubeconfig(), self.ca, &startup);
        autoscaler::publish(&self.kubeconfig(), self.ca, &args)?;
        let status = match self.checks.get(&args) {
            Some(s) => s.clone(),
            None => {
                let out = self.dir.join(format!("check-{}.txt", conf.name()));
                let (status, detail) = check::run(&self.kubeconfig(), &out).await?;
                println!(
                    "nodegate-check, {label}: {} {status} {detail}",
                    check::CHECK
                );
                self.checks.insert(args.clone(), status.clone());
                status
            }
        };
        r.figure(&format!("ca.{label}.check"), &status);
        Ok((args, status))
    }

    /// Starts CA and waits for the end of its first loop.
    async fn start_ca(&self, label: &str, args: &[String]) -> anyhow::Result<Autoscaler> {
        let t = Instant::now();
        let ca = Autoscaler::start(
            &self.ca_bin,
            &format!("ca-{label}"),
            &self.dir.join("log"),
            &self.kubeconfig(),
            args,
        )?;
        let statuses = self.statuses.clone();
        let first = wait_ok("CA's first loop", Duration::from_secs(120), || async {
            (!autoscaler::since(&statuses, t).is_empty()).then_some(())
        })
        .await;
        if let Err(e) = first {
            ca.stop().await;
            return Err(e);
        }
        Ok(ca)
    }

    /// A Deployment of `replicas` pods that only the node group's nodes
    /// take and that do not tolerate the gate.
    async fn workload(&self, name: &str, replicas: usize) -> anyhow::Result<()> {
        // A quarter of the node's CPU less a share of the DaemonSets'.
        let cpu = (NODE_CPU_MILLI / PODS_PER_NODE as u64) - 100;
        let d: Deployment = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {
                         "nodeSelector": {GROUP_LABEL: GROUP},
                         "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "pause", "image": "localhost/pause:1",
                                         "imagePullPolicy": "Never",
                                         "resources": {"requests": {"cpu": format!("{cpu}m"), "memory": "1Gi"}}}]}}},
        }))?;
        Api::<Deployment>::namespaced(self.admin.clone(), "default")
            .create(&PostParams::default(), &d)
            .await?;
        Ok(())
    }

    /// The pods of `app` and how many of them are bound.
    async fn bound(&self, app: &str) -> anyhow::Result<(usize, Vec<String>)> {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), "default");
        let list = pods
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await?;
        let on: Vec<String> = list
            .items
            .iter()
            .filter_map(|p| p.spec.as_ref()?.node_name.clone())
            .collect();
        Ok((list.items.len(), on))
    }

    /// Waits until all `replicas` pods of `app` are bound; when.
    async fn all_bound(&self, app: &str, replicas: usize) -> anyhow::Result<Instant> {
        wait_ok(
            &format!("every pod of {app} bound"),
            BIND_DEADLINE,
            || async {
                match self.bound(app).await {
                    Ok((n, on)) if n == replicas && on.len() == replicas => Some(Instant::now()),
                    _ => None,
                }
            },
        )
        .await
    }

    /// Waits for a CA loop that started after `wall` (so every loop that
    /// could still scale up for the pods has ended).
    async fn loop_after(&self, wall: Timestamp) -> anyhow::Result<()> {
        let statuses = self.statuses.clone();
        wait_ok(
            "a CA loop after the pods were bound",
            Duration::from_secs(90),
            || async {
                autoscaler::all(&statuses)
                    .iter()
                    .any(|s| s.loop_start.is_some_and(|t| t > wall))
                    .then_some(())
            },
        )
        .await
    }

    /// The pods deleted, CA stopped (it deletes its Nodes), and no Node of
    /// the group left, so the next case starts from the first node alone.
    async fn clean(&self, ca: Autoscaler, apps: &[&str]) -> anyhow::Result<()> {
        let deployments: Api<Deployment> = Api::namespaced(self.admin.clone(), "default");
        for a in apps {
            let _ = deployments.delete(a, &DeleteParams::default()).await;
        }
        for a in apps {
            wait_ok(
                &format!("the pods of {a} gone"),
                Duration::from_secs(120),
                || async { matches!(self.bound(a).await, Ok((0, _))).then_some(()) },
            )
            .await?;
        }
        ca.stop().await;
        let api: Api<Node> = Api::all(self.admin.clone());
        let group = ListParams::default().labels(&format!("{GROUP_LABEL}={GROUP}"));
        let gone = wait_ok("CA's Nodes deleted", Duration::from_secs(60), || async {
            api.list(&group)
                .await
                .ok()
                .filter(|l| l.items.is_empty())
                .map(|_| ())
        })
        .await;
        if gone.is_err() {
            // CA was killed before its cleanup: delete what it left.
            tracing::warn!("CA left Nodes behind; deleting them");
            let _ = api
                .delete_collection(&DeleteParams::default(), &group)
                .await;
        }
        let nodes = self.nodes.clone();
        wait_ok(
            "CA's Nodes out of the fleet",
            Duration::from_secs(60),
            || async { nodes.group_alive().is_empty().then_some(()) },
        )
        .await
    }

    /// Counts CA's Nodes since `t0` against `needed`, prints the figures
    /// every case has, and holds them against nodegate-check's line.
    fn count(
        &self,
        r: &mut Report,
        label: &str,
        t0: Instant,
        bound_at: Option<Instant>,
        check: &str,
    ) -> Count {
        let created = self.nodes.group_since(t0);
        let needed = self.cfg.scale_up;
        let c = Count {
            needed,
            created: created.len(),
            duplicates: created.len().saturating_sub(needed),
        };
        let f = |name: &str| format!("ca.{label}.{name}");
        r.figure(&f("needed"), c.needed);
        r.figure(&f("created"), c.created);
        r.figure(&f("duplicates"), c.duplicates);
        if let Some((_, first)) = created.first() {
            r.figure(
                &f("first_node_s"),
                format!("{:.1}", first.first_seen.duration_since(t0).as_secs_f64()),
            );
        }
        match bound_at {
            Some(b) => {
                r.figure(
                    &f("bound_s"),
                    format!("{:.1}", b.duration_since(t0).as_secs_f64()),
                );
                r.figure(
                    &f("created_after_bound"),
                    created.iter().filter(|(_, l)| l.first_seen > b).count(),
                );
            }
            None => r.figure(&f("bound_s"), "timeout"),
        }
        // The order each node actually went through: the gate opening
        // minus Ready (negative: the gate opened first).
        let mut diffs: Vec<f64> = created
            .iter()
            .filter_map(|(_, l)| {
                let (ready, open) = (l.ready?, l.ungated?);
                Some(if open >= ready {
                    open.duration_since(ready).as_secs_f64() * 1000.0
                } else {
                    -(ready.duration_since(open).as_secs_f64() * 1000.0)
                })
            })
            .collect();
        if !diffs.is_empty() {
            let p50 = crate::scale::observe::percentile(&mut diffs, 0.5);
            r.figure(&f("gate_minus_ready_p50_ms"), format!("{p50:.0}"));
        }
        hold(r, label, c.duplicates, check);
        c
    }

    /// A scale-up for pods that need `--scale-up` nodes, under CA `conf`,
    /// with the gate and Ready in order `o` on the new nodes.
    async fn scale_up(
        &mut self,
        r: &mut Report,
        label: &str,
        conf: CaConfig,
        o: Ordering,
    ) -> anyhow::Result<()> {
        println!(
            "\n== {label}: key {}, CA {}, {}",
            self.profile.key(),
            conf.name(),
            o.name()
        );
        self.fleet.set_ready_order(o.ready_order(self.cfg));
        let (args, check) = self.configure(r, label, conf).await?;
        let ca = self.start_ca(label, &args).await?;
        let replicas = self.cfg.scale_up * PODS_PER_NODE;
        let t0 = Instant::now();
        let outcome = async {
            self.workload(WORKLOAD, replicas).await?;
            let bound = self.all_bound(WORKLOAD, replicas).await;
            if let Ok(b) = &bound {
                let wall = Timestamp::now() - b.elapsed();
                self.loop_after(wall).await?;
            }
            anyhow::Ok(bound.ok())
        }
        .await;
        let bound_at = match &outcome {
            Ok(b) => *b,
            Err(_) => None,
        };
        self.count(r, label, t0, bound_at, &check);
        r.goal(
            bound_at.is_some(),
            format!("ca.{label}: every pending pod bound within {BIND_DEADLINE:?}"),
        );
        let cleaned = self.clean(ca, &[WORKLOAD]).await;
        outcome?;
        cleaned
    }

    /// A template captured while gated: the group's one node, Ready for
    /// over a minute (a good template), reboots with its old CNI config on
    /// disk, so it stays Ready while the gate is back for `--template-gate`;
    /// pods that need `--scale-up` nodes arrive meanwhile.
    async fn template(
        &mut self,
        r: &mut Report,
        label: &str,
        conf: CaConfig,
    ) -> anyhow::Result<()> {
        println!(
            "\n== {label}: the group's node rebooted and Ready, gated {:?}, while pods wait",
            self.cfg.template_gate
        );
        self.fleet
            .set_ready_order(Ordering::GateFirst.ready_order(self.cfg));
        let (args, check) = self.configure(r, label, conf).await?;
        let ca = self.start_ca(label, &args).await?;
        let replicas = self.cfg.scale_up * PODS_PER_NODE;
        let mut t0 = Instant::now();
        let wall0 = Timestamp::now();
        let outcome = async {
            // The group's first node, from a scale-up for one node's pods.
            self.workload(BASE, PODS_PER_NODE).await?;
            self.all_bound(BASE, PODS_PER_NODE).await?;
            let (_, on) = self.bound(BASE).await?;
            let base = on.first().context("a pod of the base")?.clone();
            // isNodeGoodTemplateCandidate: Ready for a minute; then one more
            // loop, which copies (and caches) the ungated template.
            let nodes = self.nodes.clone();
            let stable_since = wait_ok(
                "the group's node a good template",
                Duration::from_secs(180),
                || async {
                    let l = nodes.get(&base)?;
                    let at: Timestamp = l.ready_transition?.parse().ok()?;
                    let stable = at + Duration::from_secs(61);
                    (l.ready_now && !l.gated_now && Timestamp::now() > stable).then_some(stable)
                },
            )
            .await?;
            self.loop_after(stable_since).await?;
            // The new nodes keep the gate-first order: what follows is the
            // template's doing alone.
            self.fleet
                .set_node_ready_order(&base, Some(ReadyOrder::ReadyFirst(self.cfg.template_gate)));
            self.fleet.crash_keeping_cni(&base)?;
            self.fleet.boot(&base)?;
            wait_ok(
                "the rebooted node gated and Ready",
                Duration::from_secs(60),
                || async {
                    nodes
                        .get(&base)
                        .is_some_and(|l| l.gated_now && l.ready_now)
                        .then_some(())
                },
            )
            .await?;
            t0 = Instant::now();
            self.workload(WORKLOAD, replicas).await?;
            let bound = self.all_bound(WORKLOAD, replicas).await;
            if let Ok(b) = &bound {
                let wall = Timestamp::now() - b.elapsed();
                self.loop_after(wall).await?;
            }
            if let Some(open) = nodes.get(&base).and_then(|l| l.ungated) {
                r.figure(
                    &format!("ca.{label}.gate_open_s"),
                    format!("{:.1}", open.saturating_duration_since(t0).as_secs_f64()),
                );
            }
            anyhow::Ok(bound.ok())
        }
        .await;
        let bound_at = match &outcome {
            Ok(b) => *b,
            Err(_) => None,
        };
        self.count(r, label, t0, bound_at, &check);
        let (events, by_gate) = self.not_triggered(wall0).await;
        r.figure(&format!("ca.{label}.not_triggered_events"), events);
        r.figure(&format!("ca.{label}.not_triggered_by_gate"), by_gate);
        let cleaned = self.clean(ca, &[WORKLOAD, BASE]).await;
        outcome?;
        cleaned
    }

    /// CA's `NotTriggerScaleUp` events on the workload's pods since `since`:
    /// how many, and how many name the gate's key (the template carried it).
    async fn not_triggered(&self, since: Timestamp) -> (u64, u64) {
        let events: Api<Event> = Api::namespaced(self.admin.clone(), "default");
        let Ok(list) = events
            .list(&ListParams::default().fields("reason=NotTriggerScaleUp"))
            .await
        else {
            return (0, 0);
        };
        let mut all = 0;
        let mut by_gate = 0;
        for e in list.items.iter().filter(|e| {
            e.involved_object
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(WORKLOAD))
                && e.metadata
                    .creation_timestamp
                    .as_ref()
                    .is_some_and(|t| t.0 >= since)
        }) {
            let n = e.count.unwrap_or(1).max(1) as u64;
            all += n;
            if e.message
                .as_deref()
                .is_some_and(|m| m.contains(self.profile.key()))
            {
                by_gate += n;
            }
        }
        (all, by_gate)
    }

    /// A reboot wave: `--wave-reboot` of the nodes, all older than
    /// `--wave-node-age`, reboot at once, the gate outlasting Ready by
    /// `--gate-after-ready`, while pods that need `--scale-up` nodes wait.
    async fn wave(&mut self, r: &mut Report, label: &str, conf: CaConfig) -> anyhow::Result<()> {
        let old_at = self.wave_born + self.cfg.wave_node_age;
        if Instant::now() < old_at {
            println!(
                "\n== {label}: waiting {:.0} s until the wave's nodes are {:?} old",
                old_at.duration_since(Instant::now()).as_secs_f64(),
                self.cfg.wave_node_age
            );
            // The age CA reads from creationTimestamp: nothing else to wait on.
            tokio::time::sleep_until(old_at).await;
        }
        let rebooted: Vec<String> = self
            .wave
            .iter()
            .take(self.cfg.wave_reboot)
            .cloned()
            .collect();
        println!(
            "\n== {label}: {} of {} nodes reboot, gate {:?} after Ready",
            rebooted.len(),
            self.wave.len() + 1,
            self.cfg.gate_after_ready
        );
        self.fleet
            .set_ready_order(Ordering::GateAfterReady.ready_order(self.cfg));
        let (args, check) = self.configure(r, label, conf).await?;
        let ca = self.start_ca(label, &args).await?;
        let statuses = self.statuses.clone();
        let replicas = self.cfg.scale_up * PODS_PER_NODE;
        let t0 = Instant::now();
        let wall0 = Timestamp::now();
        let outcome = async {
            wait_ok(
                "CA sees a healthy cluster",
                Duration::from_secs(60),
                || async {
                    autoscaler::all(&statuses)
                        .last()
                        .filter(|s| s.health == "Healthy" && s.unready == 0)
                        .map(|_| ())
                },
            )
            .await?;
            let t0 = Instant::now();
            for n in &rebooted {
                self.fleet.crash(n)?;
                self.fleet.boot(n)?;
            }
            self.workload(WORKLOAD, replicas).await?;
            let nodes = self.nodes.clone();
            wait_ok("every rebooted node ungated", BIND_DEADLINE, || async {
                rebooted
                    .iter()
                    .all(|n| {
                        nodes.get(n).is_some_and(|l| {
                            l.gated.is_some_and(|g| g >= t0) && l.ungated.is_some() && !l.gated_now
                        })
                    })
                    .then_some(())
            })
            .await?;
            let bound = self.all_bound(WORKLOAD, replicas).await;
            let wall = Timestamp::now();
            self.loop_after(wall).await?;
            anyhow::Ok(bound.ok())
        }
        .await;
        let bound_at = match &outcome {
            Ok(b) => *b,
            Err(_) => None,
        };
        // Every loop from the wave on.
        let loops: Vec<autoscaler::Sample> = autoscaler::since(&self.statuses, t0)
            .into_iter()
            .filter(|s| s.loop_start.is_some_and(|t| t >= wall0))
            .collect();
        let rel = |t: Option<Timestamp>| {
            t.map(|t| {
                format!(
                    "{:.1}",
                    (t.as_millisecond() - wall0.as_millisecond()) as f64 / 1000.0
                )
            })
            .unwrap_or_else(|| "none".into())
        };
        let unhealthy: Vec<&autoscaler::Sample> =
            loops.iter().filter(|s| s.health == "Unhealthy").collect();
        let last_unhealthy = unhealthy.last().and_then(|s| s.loop_start);
        let healthy_again = last_unhealthy.and_then(|u| {
            loops
                .iter()
                .filter_map(|s| s.loop_start.filter(|t| *t > u && s.health == "Healthy"))
                .next()
        });
        let f = |name: &str| format!("ca.{label}.{name}");
        r.figure(&f("nodes"), self.wave.len() + 1);
        r.figure(&f("rebooted"), rebooted.len());
        r.figure(&f("loops"), loops.len());
        r.figure(&f("unhealthy_loops"), unhealthy.len());
        r.figure(
            &f("unhealthy_from_s"),
            rel(unhealthy.first().and_then(|s| s.loop_start)),
        );
        r.figure(&f("healthy_again_s"), rel(healthy_again));
        r.figure(
            &f("max_unready"),
            loops.iter().map(|s| s.unready).max().unwrap_or(0),
        );
        r.figure(
            &f("max_not_started"),
            loops.iter().map(|s| s.not_started).max().unwrap_or(0),
        );
        self.count(r, label, t0, bound_at, &check);
        let cleaned = self.clean(ca, &[WORKLOAD]).await;
        outcome?;
        cleaned
    }
}

/// What a cluster needs besides its control plane and first nodes.
struct Setup {
    admin: Client,
    fleet: Arc<Fleet>,
    nodes: Arc<Nodes>,
    statuses: Statuses,
    install: Install,
    tasks: Vec<JoinHandle<()>>,
}

async fn setup(
    cfg: &Config,
    profile: Profile,
    cp: &ControlPlane,
    pki: &Arc<Pki>,
    r: &mut Report,
) -> anyhow::Result<Setup> {
    let admin = cp.admin_client().await?;
    // The default ServiceAccount appears once the controller-manager runs.
    let sa: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    wait_ok(
        "kube-controller-manager",
        Duration::from_secs(90),
        || async { sa.get_opt("default").await.ok().flatten() },
    )
    .await?;
    let (variant, source) = profile.variant()?;
    r.figure(&format!("ca.install.{}", profile.name), source);
    let install = install::install_with(cp, pki, &admin, &variant).await?;
    // The webhook's StatefulSet as the profile ships it, scaled to 0: its
    // replicas are processes here, and nodegate-check reads their flags
    // from it.
    let sts = match variant
        .objects
        .get(&("StatefulSet".to_string(), "nodegate-webhook".to_string()))
    {
        Some(v) => v.clone(),
        None => serde_yaml::from_str(&std::fs::read_to_string(
            crate::process::manifests_dir().join("webhook/statefulset.yaml"),
        )?)?,
    };
    let mut sts = sts;
    sts["spec"]["replicas"] = json!(0);
    kubectl(
        &cp.admin_kubeconfig,
        &["apply", "--server-side", "-f", "-"],
        Some(&sts.to_string()),
    )?;
    autoscaler::configure(&cp.admin_kubeconfig)?;
    let agent_bin = crate::process::bin_path("nodegate-agent");
    let fleet = Arc::new(Fleet::new(
        cp,
        pki,
        admin.clone(),
        variant.args("agent/daemonset.yaml")?,
        agent_bin.exists().then_some(agent_bin),
        cfg.network_start,
    ));
    let mut tasks = vec![tokio::spawn(fleet.clone().follow_pods())];
    let (nodes, watch) = nodes::watch(admin.clone(), fleet.clone(), pki.clone(), profile.key());
    tasks.push(watch);
    let (statuses, watch) = autoscaler::watch_status(admin.clone());
    tasks.push(watch);
    Ok(Setup {
        admin,
        fleet,
        nodes,
        statuses,
        install,
        tasks,
    })
}

/// A configuration that duplicates must fail nodegate-check's line; one
/// that passes it must make no duplicates.
fn hold(r: &mut Report, label: &str, duplicates: usize, check: &str) {
    if check == "absent" {
        println!(
            "GOAL unverified: ca.{label}: nodegate-check has no '{}' line",
            check::CHECK
        );
        return;
    }
    if duplicates > 0 {
        r.goal(
            check == "FAIL",
            format!(
                "ca.{label}: {duplicates} duplicate nodes, and nodegate-check's '{}' line fails it (it is {check})",
                check::CHECK
            ),
        );
    }
    if check == "PASS" {
        r.goal(
            duplicates == 0,
            format!(
                "ca.{label}: nodegate-check passes it, and CA made no duplicate node ({duplicates})"
            ),
        );
    }
}
