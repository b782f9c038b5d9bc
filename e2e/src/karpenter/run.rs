//! The thin loop, in virtual time: it jumps from one due moment to the next
//! (an instance step, a pod's requeue, a batch closing), so a 10 s requeue
//! costs nothing. Only Node writes go through the API server — the
//! emulator, with nodegate's real webhook attached: the kubelet's create and
//! Ready status, Karpenter's registration and initialization patches, the
//! node lifecycle controller's condition taints, nodegate's agent's ready
//! patch (and Cilium operator's taint removal). Pods, NodeClaims and
//! NodePools live in memory. Every decision reads the Nodes as listed at
//! that moment; each writer uses its own identity (Karpenter's
//! ServiceAccount with `rbac.yaml`, the node's kubelet, the node
//! controller, the agent's pod-bound token, Cilium operator's
//! ServiceAccount).
//!
//! A reboot wave ([`RebootWave`]) restarts the kubelets of the first
//! NodeClaims on a new bootID: the kubelet's create of its existing Node,
//! which nodegate's webhook answers only after re-adding the gate, then its
//! NotReady status. Nothing in the stand-in writes the gate back; the run
//! fails if the Node stored after the kubelet's start lacks it. Pods bound
//! to a rebooting node stay bound (its gate is `NoSchedule`). More pods can
//! arrive later ([`Arrival`]).
//!
//! At each moment: instance steps due (cloud, kubelet, agent), then the
//! Node-driven controllers until nothing changes (node lifecycle,
//! registration, initialization — they react to Node events at once), then
//! pods arriving, then kube-scheduler, then the pod controller's requeues,
//! then the batch.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Node, Taint, Toleration};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use nodegate_emulator::kubelet::SimKubelet;
use nodegate_emulator::{Emulator, users};
use nodegate_shared::TaintSpec;
use serde_json::{Value, json};

use super::fleet::{Instance, RebootWave, Step, Timings};
use super::kube_scheduler::{self, Candidate};
use super::lifecycle;
use super::node_lifecycle;
use super::nodeclaim::NodeClaim;
use super::nodepool::NodePool;
use super::provisioner::{Batcher, PodController, Timers};
use super::report::{ClaimRecord, Outcome, PassRecord, RebootRecord, WaveRecord};
use super::scheduler::{self, PendingPod};
use super::state::{INITIALIZED_LABEL, StateNode, label, node_taints};
use super::taints;
use super::version::Version;
use crate::cilium_operator::decide::remove_node_taint;
use crate::standin::{AgentReadiness, StandInAgent};

pub const KARPENTER_USER: &str = "system:serviceaccount:kube-system:karpenter";
pub const CILIUM_OPERATOR_USER: &str = "system:serviceaccount:kube-system:cilium-operator";
pub const PROVIDER_ID_PREFIX: &str = "karpenter-standin://";
/// Karpenter's identity and Node access, for `EmulatorOptions::rbac`.
pub const RBAC: &str = include_str!("rbac.yaml");
/// Rounds of Node writes at one moment before the run gives up.
const MAX_ROUNDS: usize = 20;
/// Attempts of a guarded patch that keeps meeting a newer Node.
const ATTEMPTS: usize = 10;

#[derive(Debug, Clone)]
pub struct Options {
    pub nodepools: Vec<NodePool>,
    pub version: Version,
    /// Pending pods, all created at time 0.
    pub pods: usize,
    /// Pods per node.
    pub pod_slots: usize,
    pub timings: Timings,
    pub timers: Timers,
    /// The taints nodegate's webhook adds and its agent removes.
    pub gate: Vec<TaintSpec>,
    /// Cilium operator's taint key, removed (`removeNodeTaint`) when the
    /// network agent is ready, if Cilium runs beside nodegate.
    pub cilium_taint_key: Option<String>,
    /// Virtual time after which the run fails.
    pub horizon: Duration,
    /// Pending pods created later.
    pub arrivals: Vec<Arrival>,
    pub reboot: Option<RebootWave>,
}

/// `pods` more pending pods, created at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub at: Duration,
    pub pods: usize,
}

impl Options {
    /// 40 pods, 10 per node, Karpenter as read, nodegate's default taint.
    pub fn new(nodepools: Vec<NodePool>, timings: Timings) -> Self {
        Self {
            nodepools,
            version: Version::READ,
            pods: 40,
            pod_slots: 10,
            timings,
            timers: Timers::default(),
            gate: StandInAgent::default().taints,
            cilium_taint_key: None,
            horizon: Duration::from_secs(600),
            arrivals: Vec::new(),
            reboot: None,
        }
    }

    /// Nodes the pods created at time 0 need.
    pub fn needed(&self) -> usize {
        self.pods.div_ceil(self.pod_slots.max(1))
    }
}

struct Pod {
    name: String,
    tolerations: Vec<Toleration>,
    node: Option<String>,
    bound_at: Option<Duration>,
    /// Created by an [`Arrival`].
    arrived: bool,
}

impl Pod {
    fn new(i: usize, arrived: bool) -> Self {
        Self {
            name: format!("web-{i:03}"),
            tolerations: kube_scheduler::default_tolerations(),
            node: None,
            bound_at: None,
            arrived,
        }
    }
}

struct World<'a> {
    emu: &'a Emulator,
    opts: &'a Options,
    karpenter: Api<Node>,
    node_controller: Api<Node>,
    cilium: Option<Api<Node>>,
    agent: StandInAgent,
    now: Duration,
    /// Index-aligned: claim, its instance, its record.
    claims: Vec<NodeClaim>,
    instances: Vec<Instance>,
    records: Vec<ClaimRecord>,
    kubelets: BTreeMap<String, SimKubelet>,
    nodes: BTreeMap<String, Node>,
    pods: Vec<Pod>,
    /// Arrivals still to come.
    arrivals: Vec<Arrival>,
    reboots: Vec<RebootRecord>,
    pod_controller: PodController,
    batcher: Batcher,
    passes: Vec<PassRecord>,
}

/// Runs the scenario against `emu` until nothing is left to happen.
pub async fn run(emu: &Emulator, opts: &Options) -> anyhow::Result<Outcome> {
    anyhow::ensure!(opts.pod_slots > 0, "a node must hold at least one pod");
    let mut w = World::new(emu, opts).await?;
    while let Some(now) = w.next_moment() {
        anyhow::ensure!(
            now <= opts.horizon,
            "still busy after {:?}: {}",
            opts.horizon,
            w.summary()
        );
        w.now = now;
        w.instance_steps().await?;
        w.node_controllers().await?;
        w.arrive();
        w.schedule_pods();
        w.reconcile_pods();
        if w.batcher.close_if_due(now) {
            w.provision();
        }
    }
    Ok(w.outcome())
}

/// A JSON patch of a Node.
async fn json_patch(api: &Api<Node>, name: &str, patch: Value) -> Result<Node, kube::Error> {
    let p: json_patch::Patch = serde_json::from_value(patch).map_err(kube::Error::SerdeError)?;
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(p))
        .await
}

/// A guarded write met a newer Node (a failed `test`, or a stale lock).
fn stale(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 || s.code == 422)
}

impl<'a> World<'a> {
    async fn new(emu: &'a Emulator, opts: &'a Options) -> anyhow::Result<Self> {
        let cilium = match opts.cilium_taint_key {
            Some(_) => Some(Api::all(emu.client(CILIUM_OPERATOR_USER).await?)),
            None => None,
        };
        let mut pod_controller = PodController::new(opts.timers.requeue);
        let pods: Vec<Pod> = (0..opts.pods).map(|i| Pod::new(i, false)).collect();
        for p in &pods {
            pod_controller.watch(&p.name, Duration::ZERO);
        }
        Ok(Self {
            emu,
            opts,
            karpenter: Api::all(emu.client(KARPENTER_USER).await?),
            node_controller: Api::all(emu.client(users::NODE_CONTROLLER).await?),
            cilium,
            agent: StandInAgent {
                taints: opts.gate.clone(),
            },
            now: Duration::ZERO,
            claims: Vec::new(),
            instances: Vec::new(),
            records: Vec::new(),
            kubelets: BTreeMap::new(),
            nodes: BTreeMap::new(),
            pods,
            arrivals: {
                // Latest first: the next one is popped off the end.
                let mut a = opts.arrivals.clone();
                a.sort_by_key(|x| std::cmp::Reverse(x.at));
                a
            },
            reboots: Vec::new(),
            pod_controller,
            batcher: Batcher::new(&opts.timers),
            passes: Vec::new(),
        })
    }

    fn next_moment(&self) -> Option<Duration> {
        self.instances
            .iter()
            .filter_map(|i| i.next(&self.opts.timings).map(|(at, _)| at))
            .chain(self.pod_controller.next_at())
            .chain(self.batcher.closes_at())
            .chain(self.arrivals.last().map(|a| a.at))
            .min()
    }

    fn summary(&self) -> String {
        let pending = self.pods.iter().filter(|p| p.node.is_none()).count();
        let waiting: Vec<&str> = self
            .claims
            .iter()
            .filter(|c| !c.initialized)
            .map(|c| c.name.as_str())
            .collect();
        format!(
            "{} NodeClaims, {pending} pods pending, not initialized: {waiting:?}",
            self.claims.len()
        )
    }

    fn is_gate(&self, t: &Taint) -> bool {
        let t = json!({"key": t.key, "effect": t.effect});
        self.opts.gate.iter().any(|g| g.matches(&t))
    }

    // The cloud provider, the kubelets and the agents.

    async fn instance_steps(&mut self) -> anyhow::Result<()> {
        for i in 0..self.instances.len() {
            while let Some((_, step)) = self.instances[i]
                .next(&self.opts.timings)
                .filter(|(at, _)| *at <= self.now)
            {
                let name = self.instances[i].name.clone();
                // After a reboot, Ready and the gate are the new boot's.
                let reboot = self.instances[i]
                    .rebooted()
                    .then(|| self.reboots.iter().position(|r| r.node == name))
                    .flatten();
                match step {
                    Step::CreateNode => {
                        let pid = self.claims[i].provider_id.clone();
                        let node = self.create_node(&name, &pid).await?;
                        self.records[i].gated_at_create =
                            node_taints(&node).iter().any(|t| self.is_gate(t));
                    }
                    Step::PostReady => {
                        let k = self.kubelets.get_mut(&name).context("no kubelet")?;
                        k.set_ready(true);
                        k.heartbeat()
                            .await
                            .with_context(|| format!("kubelet of {name}: Ready"))?;
                        match reboot {
                            Some(r) => self.reboots[r].ready_at = Some(self.now),
                            None => self.records[i].ready_at = Some(self.now),
                        }
                    }
                    Step::OpenGate => {
                        self.open_gate(&name).await?;
                        match reboot {
                            Some(r) => self.reboots[r].gate_opened_at = Some(self.now),
                            None => self.records[i].gate_opened_at = Some(self.now),
                        }
                    }
                    Step::Reboot => self.reboot(&name).await?,
                }
                self.instances[i].record(step, self.now);
            }
        }
        Ok(())
    }

    /// The kubelet's first start: a create with the providerID, not Ready,
    /// registering with Karpenter's unregistered taint.
    async fn create_node(&mut self, name: &str, provider_id: &str) -> anyhow::Result<Node> {
        let mut kubelet = SimKubelet::new(self.emu, name)
            .await?
            .register_with_taints(vec![serde_json::to_value(taints::unregistered())?]);
        kubelet.set_ready(false);
        let mut body = kubelet.initial_node();
        body["spec"]["providerID"] = json!(provider_id);
        let node: Node = serde_json::from_value(body)?;
        let created = kubelet
            .api()
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("kubelet of {name}: create"))?;
        self.kubelets.insert(name.to_string(), kubelet);
        Ok(created)
    }

    /// The machine reboots: the kubelet starts on a new bootID, not Ready —
    /// its create of the existing Node (409; nodegate's webhook re-adds the
    /// gate before it answers), then its status write.
    async fn reboot(&mut self, name: &str) -> anyhow::Result<()> {
        let pods = self.bound_counts().get(name).copied().unwrap_or(0);
        let k = self.kubelets.get_mut(name).context("no kubelet")?;
        k.set_ready(false);
        let node = k
            .reboot()
            .await
            .with_context(|| format!("kubelet of {name}: start after reboot"))?;
        let gated = node_taints(&node).iter().any(|t| self.is_gate(t));
        anyhow::ensure!(
            gated,
            "{name} rebooted but its Node has no gate: {:?}",
            node_taints(&node)
        );
        self.reboots.push(RebootRecord {
            node: name.to_string(),
            rebooted_at: self.now,
            pods,
            gated_after_reboot: gated,
            initialized_after_reboot: label(&node, INITIALIZED_LABEL) == Some("true"),
            ready_at: None,
            gate_opened_at: None,
        });
        Ok(())
    }

    /// The network agent is ready: nodegate's agent removes the gate with
    /// its pod-bound token; Cilium's operator removes its own taint.
    async fn open_gate(&self, name: &str) -> anyhow::Result<()> {
        let client = self.emu.agent_client(name).await?;
        self.agent
            .mark_ready(&client, name)
            .await
            .with_context(|| format!("agent of {name}"))?;
        let (Some(api), Some(key)) = (&self.cilium, &self.opts.cilium_taint_key) else {
            return Ok(());
        };
        // The operator reads its Node cache (list/watch is all it may read).
        let by_name = ListParams::default().fields(&format!("metadata.name={name}"));
        for _ in 0..ATTEMPTS {
            let node = api
                .list(&by_name)
                .await?
                .items
                .into_iter()
                .next()
                .with_context(|| format!("node {name} is gone"))?;
            let Some(patch) = remove_node_taint(&node, key) else {
                return Ok(());
            };
            match json_patch(api, name, patch).await {
                Ok(_) => return Ok(()),
                Err(e) if stale(&e) => {}
                Err(e) => return Err(e).context("cilium-operator: remove taint"),
            }
        }
        anyhow::bail!("cilium-operator: node {name} kept changing")
    }

    // Controllers that react to Node events.

    async fn node_controllers(&mut self) -> anyhow::Result<()> {
        for _ in 0..MAX_ROUNDS {
            self.refresh().await?;
            let lifecycle = self.node_lifecycle_pass().await?;
            let registered = self.registration().await?;
            let initialized = self.initialization().await?;
            if !(lifecycle || registered || initialized) {
                return Ok(());
            }
        }
        anyhow::bail!(
            "Node writes at {:?} did not settle in {MAX_ROUNDS} rounds",
            self.now
        )
    }

    /// Karpenter's Node informer.
    async fn refresh(&mut self) -> anyhow::Result<()> {
        let list = self.karpenter.list(&ListParams::default()).await?;
        self.nodes = list
            .items
            .into_iter()
            .filter_map(|n| Some((n.metadata.name.clone()?, n)))
            .collect();
        Ok(())
    }

    /// True if it wrote or must read again.
    async fn node_lifecycle_pass(&mut self) -> anyhow::Result<bool> {
        let patches: Vec<(String, Value)> = self
            .nodes
            .iter()
            .filter_map(|(name, n)| {
                Some((name.clone(), node_lifecycle::no_schedule_tainting_pass(n)?))
            })
            .collect();
        let busy = !patches.is_empty();
        for (name, patch) in patches {
            match json_patch(&self.node_controller, &name, patch).await {
                Ok(n) => {
                    self.nodes.insert(name, n);
                }
                Err(e) if stale(&e) => {}
                Err(e) => return Err(e).context("node lifecycle controller"),
            }
        }
        Ok(busy)
    }

    async fn registration(&mut self) -> anyhow::Result<bool> {
        let mut busy = false;
        for i in 0..self.claims.len() {
            if self.claims[i].registered {
                continue;
            }
            let Some(stored) =
                lifecycle::node_for_claim(&self.claims[i], self.nodes.values()).cloned()
            else {
                continue;
            };
            let name = stored.metadata.name.clone().unwrap_or_default();
            let updated = lifecycle::register(&self.claims[i], &stored);
            if let Some(patch) = lifecycle::registration_patch(&stored, &updated)? {
                busy = true;
                match self
                    .karpenter
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(n) => {
                        self.nodes.insert(name.clone(), n);
                    }
                    // A conflict requeues the NodeClaim.
                    Err(e) if stale(&e) => continue,
                    Err(e) => return Err(e).with_context(|| format!("registering {name}")),
                }
            }
            self.claims[i].registered = true;
            self.claims[i].node_name = Some(name);
            self.records[i].registered_at = Some(self.now);
        }
        Ok(busy)
    }

    async fn initialization(&mut self) -> anyhow::Result<bool> {
        let mut busy = false;
        for i in 0..self.claims.len() {
            let c = &self.claims[i];
            if !c.registered || c.initialized {
                continue;
            }
            let Some((name, node)) = c
                .node_name
                .as_ref()
                .and_then(|n| Some((n.clone(), self.nodes.get(n)?)))
            else {
                continue;
            };
            if lifecycle::initialization(c, node, self.opts.version).is_err() {
                continue;
            }
            let n = self
                .karpenter
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(&lifecycle::initialization_patch()),
                )
                .await
                .with_context(|| format!("initializing {name}"))?;
            self.records[i].initialized_while_gated =
                node_taints(&n).iter().any(|t| self.is_gate(t));
            self.records[i].initialized_at = Some(self.now);
            self.claims[i].initialized = true;
            self.nodes.insert(name, n);
            busy = true;
        }
        Ok(busy)
    }

    // Pods.

    /// Pods created now, each reconciled at once.
    fn arrive(&mut self) {
        while let Some(a) = self.arrivals.last().filter(|a| a.at <= self.now).copied() {
            self.arrivals.pop();
            for _ in 0..a.pods {
                let pod = Pod::new(self.pods.len(), true);
                self.pod_controller.watch(&pod.name, self.now);
                self.pods.push(pod);
            }
        }
    }

    fn bound_counts(&self) -> BTreeMap<&str, usize> {
        let mut out = BTreeMap::new();
        for n in self.pods.iter().filter_map(|p| p.node.as_deref()) {
            *out.entry(n).or_default() += 1;
        }
        out
    }

    /// kube-scheduler: binds what it can on the Nodes as they are now.
    fn schedule_pods(&mut self) {
        let binds = {
            let bound = self.bound_counts();
            let candidates: Vec<Candidate> = self
                .claims
                .iter()
                .filter_map(|c| {
                    let name = c.node_name.as_deref()?;
                    Some(Candidate {
                        node: self.nodes.get(name)?,
                        free: c
                            .pod_slots
                            .saturating_sub(bound.get(name).copied().unwrap_or(0)),
                    })
                })
                .collect();
            let pending: Vec<(&str, &[Toleration])> = self
                .pods
                .iter()
                .filter(|p| p.node.is_none())
                .map(|p| (p.name.as_str(), p.tolerations.as_slice()))
                .collect();
            kube_scheduler::bind(&pending, &candidates)
        };
        for p in &mut self.pods {
            if let Some(n) = binds.get(&p.name) {
                p.node = Some(n.clone());
                p.bound_at = Some(self.now);
            }
        }
    }

    /// Free pod slots on the nodes rebooting behind their gate.
    fn rebooting_room(&self) -> usize {
        let bound = self.bound_counts();
        self.instances
            .iter()
            .zip(&self.claims)
            .filter(|(i, _)| i.reboot.is_some_and(|r| r.in_progress()))
            .map(|(_, c)| {
                let used = c
                    .node_name
                    .as_deref()
                    .and_then(|n| bound.get(n))
                    .copied()
                    .unwrap_or(0);
                c.pod_slots.saturating_sub(used)
            })
            .sum()
    }

    /// The pod controller: each due pod triggers the batcher while pending.
    fn reconcile_pods(&mut self) {
        for pod in self.pod_controller.due(self.now) {
            let provisionable = self.pods.iter().any(|p| p.name == pod && p.node.is_none());
            if provisionable {
                self.batcher.trigger(&pod, self.now);
            }
            self.pod_controller
                .reconciled(&pod, provisionable, self.now);
        }
    }

    /// One scheduling pass; launches the NodeClaims it asks for.
    fn provision(&mut self) {
        let (results, pending) = {
            let bound = self.bound_counts();
            let state: Vec<StateNode> = self
                .claims
                .iter()
                .map(|c| StateNode {
                    claim: c,
                    node: lifecycle::node_for_claim(c, self.nodes.values()),
                    bound_pods: c
                        .node_name
                        .as_deref()
                        .and_then(|n| bound.get(n))
                        .copied()
                        .unwrap_or(0),
                })
                .collect();
            let pending: Vec<PendingPod> = self
                .pods
                .iter()
                .filter(|p| p.node.is_none())
                .map(|p| PendingPod {
                    name: &p.name,
                    tolerations: &p.tolerations,
                })
                .collect();
            let r = scheduler::solve(
                &pending,
                &state,
                &self.opts.nodepools,
                self.opts.pod_slots,
                self.opts.version,
            );
            (r, pending.len())
        };
        let rebooting_room = self.rebooting_room();
        let mut launched = 0;
        for nc in &results.new_node_claims {
            if self.launch(&nc.nodepool, rebooting_room) {
                launched += 1;
            }
        }
        self.passes.push(PassRecord {
            at: self.now,
            pending,
            launched,
            refused_by_taint: results.refused_by_taint,
            rebooting_room,
        });
    }

    fn launch(&mut self, nodepool: &str, rebooting_room: usize) -> bool {
        let Some(np) = self.opts.nodepools.iter().find(|np| np.name() == nodepool) else {
            return false;
        };
        let name = format!("{nodepool}-{:03}", self.claims.len() + 1);
        let pid = format!("{PROVIDER_ID_PREFIX}{name}");
        self.claims.push(NodeClaim::from_nodepool(
            np,
            &name,
            &pid,
            self.opts.pod_slots,
        ));
        let mut instance = Instance::new(&name, self.now);
        instance.reboot = self
            .opts
            .reboot
            .filter(|w| self.instances.len() < w.nodes)
            .map(|w| w.reboot());
        self.instances.push(instance);
        self.records.push(ClaimRecord {
            name,
            launched_at: self.now,
            rebooting_room_at_launch: rebooting_room,
            ..Default::default()
        });
        true
    }

    fn outcome(&self) -> Outcome {
        let bound = self.bound_counts();
        let claims = self
            .records
            .iter()
            .zip(&self.claims)
            .map(|(r, c)| ClaimRecord {
                pods: c
                    .node_name
                    .as_deref()
                    .and_then(|n| bound.get(n))
                    .copied()
                    .unwrap_or(0),
                ..r.clone()
            })
            .collect();
        let last_bound = |pods: &mut dyn Iterator<Item = &Pod>| {
            pods.map(|p| p.bound_at)
                .try_fold(Duration::ZERO, |last, at| Some(last.max(at?)))
        };
        let wave = self.opts.reboot.map(|w| {
            let arrived: Vec<&Pod> = self.pods.iter().filter(|p| p.arrived).collect();
            let mut bound_to = BTreeMap::new();
            for n in arrived.iter().filter_map(|p| p.node.as_deref()) {
                *bound_to.entry(n.to_string()).or_default() += 1;
            }
            WaveRecord {
                at: self
                    .reboots
                    .iter()
                    .map(|r| r.rebooted_at)
                    .min()
                    .unwrap_or(w.at),
                reboots: self.reboots.clone(),
                pods_arrived: arrived.len(),
                pods_bound_at: (!arrived.is_empty())
                    .then(|| last_bound(&mut arrived.iter().copied()))
                    .flatten(),
                bound_to,
            }
        });
        Outcome {
            needed: self.opts.needed(),
            pods: self.pods.len(),
            claims,
            passes: self.passes.clone(),
            pods_bound_at: last_bound(&mut self.pods.iter()),
            wave,
        }
    }
}
