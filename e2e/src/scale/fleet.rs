//! The simulated nodes as one process: a kubelet task per node, one shared
//! watch of Pods bound to them (a kubelet watches its own; one watch here
//! costs the API server less and changes nothing nodegate does), the pod
//! lifecycle a kubelet reports, and each node's nodegate-agent started for
//! its DaemonSet Pod with the token the kubelet would request for that Pod.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use nodegate_agent::handler::{DeleteSource, HandlerError, NodeDeleteHandler};
use nodegate_agent::record::NodeRecord;
use serde_json::json;
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::control_plane::{ControlPlane, Proc, write_kubeconfig};
use super::kubelet::{self, NodeShared};
use super::pki::Pki;

/// Deletions each agent's handler ran: (agent's node, deleted node) → count.
pub type PruneCounts = Arc<Mutex<BTreeMap<(String, String), u32>>>;

/// Counts every deletion an in-process agent dispatches: the stand-in of
/// `--on-node-delete` (a command per deletion would fork 50,000 times).
struct Counter {
    node: String,
    counts: PruneCounts,
}

impl NodeDeleteHandler for Counter {
    fn name(&self) -> &str {
        "scale-counter"
    }
    fn handle<'a>(
        &'a self,
        node: &'a NodeRecord,
        _source: DeleteSource,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            if let Ok(mut c) = self.counts.lock() {
                *c.entry((self.node.clone(), node.name.clone())).or_default() += 1;
            }
            Ok(())
        })
    }
}

enum AgentKind {
    Task {
        stop: Option<oneshot::Sender<()>>,
        task: JoinHandle<()>,
    },
    Process(Proc),
}

struct AgentRun {
    pod: String,
    uid: String,
    /// `None` while the container is stopped (or crashed).
    kind: Option<AgentKind>,
    /// The running container's token's `jti` ([`Fleet::cut_off`]).
    jti: Option<String>,
}

struct NodeRun {
    shared: Arc<NodeShared>,
    boot_id: String,
    kubelet: Option<JoinHandle<()>>,
    agent: Option<AgentRun>,
    /// The network agent's DaemonSet Pod is on this node: its container
    /// starts again with every boot.
    network_pod: bool,
    /// Pods whose status this boot already reported (by uid).
    reported: std::collections::HashSet<String>,
    terminating: std::collections::HashSet<String>,
}

/// Times the harness reads back (since the fleet started).
#[derive(Debug, Default, Clone)]
pub struct Times {
    pub registered: HashMap<String, Instant>,
    pub network_ready: HashMap<String, Instant>,
    /// The first start of each node's agent container.
    pub agent_started: HashMap<String, Instant>,
    /// The latest start of each node's agent container (after a reboot).
    pub agent_restarted: HashMap<String, Instant>,
    /// The first start of each node's network agent container.
    pub network_started: HashMap<String, Instant>,
    /// With several gates: when the stand-in of gate `k` (1.., the gates
    /// after the network agent's) turned ready on each node, latest boot.
    pub gate_ready: HashMap<(String, usize), Instant>,
}

impl Times {
    /// When every one of the first `gates` gates' stand-ins was ready on
    /// `name` (the network agent's alone with one gate): "ready" in the
    /// figures.
    pub fn all_ready(&self, name: &str, gates: usize) -> Option<Instant> {
        let mut at = *self.network_ready.get(name)?;
        for k in 1..gates {
            at = at.max(*self.gate_ready.get(&(name.to_string(), k))?);
        }
        Some(at)
    }

    /// When gate `k`'s own stand-in was ready on `name` (gate 0's is the
    /// network agent's).
    pub fn gate_ready_at(&self, name: &str, k: usize) -> Option<Instant> {
        if k == 0 {
            self.network_ready.get(name).copied()
        } else {
            self.gate_ready.get(&(name.to_string(), k)).copied()
        }
    }
}

/// The stand-ins of the gates after the network agent's (`--gates`): each
/// writes its readiness file into the node's probe directory.
#[derive(Debug, Clone, Default)]
struct GateSignals {
    /// The file of gate 1, 2, … by name.
    files: Vec<String>,
    /// Gate `k` turns ready `k` × this after the network agent; zero: every
    /// gate at once, the directory's files appearing together (a rename).
    stagger: Duration,
}

/// The order in which a node's two signals of a ready network agent come:
/// its CNI config file (the agent's file probe) and the kubelet's Ready.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ReadyOrder {
    /// Both at once.
    #[default]
    Together,
    /// The probe passes first and the kubelet reports Ready this much later:
    /// Cilium writes its CNI config only once it is ready, and the kubelet's
    /// runtime-status loop notices it within 5 s.
    ProbeFirst(Duration),
    /// The kubelet reports Ready first and the probe passes this much later:
    /// a CNI that writes its config early, an agent that is not the CNI, a
    /// reboot that finds the old CNI config on disk.
    ReadyFirst(Duration),
}

pub struct Fleet {
    cp_server: String,
    ca_pem: String,
    ca_der: Vec<u8>,
    dir: PathBuf,
    agent_argv: Vec<String>,
    agent_bin: Option<PathBuf>,
    nodes: Mutex<HashMap<String, NodeRun>>,
    pub prunes: PruneCounts,
    pub times: Mutex<Times>,
    /// The stand-in network agent turns ready this long after its container
    /// starts.
    pub network_start: Duration,
    admin: Client,
    pub agent_pid: Mutex<Option<u32>>,
    pub changed: Notify,
    ready_order: Mutex<ReadyOrder>,
    /// Nodes with an order of their own.
    node_ready_order: Mutex<HashMap<String, ReadyOrder>>,
    /// The other gates' stand-ins (none with one gate).
    gate_signals: Mutex<GateSignals>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").finish_non_exhaustive()
    }
}

/// The ConfigMap (in `nodegate`) of the agent tokens whose node crashed:
/// [`CRASH_POLICY`]'s parameter.
pub const CRASHED: &str = "nodegate-scale-crashed";

/// A crashed node writes nothing on the way down. A real agent dies with
/// it; an agent here is a task, and dropping it closes its stop channel,
/// which the agent takes for a SIGTERM: its shutdown re-taint would reach
/// the API server before the node's re-registration, and do the webhook's
/// re-gate for it. So before a crash the harness lists the agent's token
/// (its `jti`, the API server's `credential-id`) in [`CRASHED`], and this
/// policy refuses every write made with it ([`Fleet::cut_off`]). Each
/// agent's next container has a new token.
pub const CRASH_POLICY: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: nodegate-scale-crashed
spec:
  failurePolicy: Fail
  paramKind:
    apiVersion: v1
    kind: ConfigMap
  matchConstraints:
    resourceRules:
      - apiGroups: ["*"]
        apiVersions: ["*"]
        operations: ["CREATE", "UPDATE", "DELETE"]
        resources: ["*"]
  matchConditions:
    - name: nodegate-agent
      expression: request.userInfo.username == 'system:serviceaccount:nodegate:nodegate-agent'
  validations:
    - expression: >-
        !has(request.userInfo.extra)
        || !('authentication.kubernetes.io/credential-id' in request.userInfo.extra)
        || !request.userInfo.extra['authentication.kubernetes.io/credential-id'].exists(c,
             c.startsWith('JTI=') && c.substring(4) in (has(params.data) ? params.data : {}))
      message: the node crashed (scale harness)
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: nodegate-scale-crashed
spec:
  policyName: nodegate-scale-crashed
  validationActions: [Deny]
  paramRef:
    name: nodegate-scale-crashed
    namespace: nodegate
    parameterNotFoundAction: Allow
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: nodegate-scale-crashed
  namespace: nodegate
"#;

/// The `jti` claim of a ServiceAccount token (a JWT).
pub fn token_jti(token: &str) -> Option<String> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims["jti"].as_str().map(str::to_string)
}

/// The network agent's CNI config, the shipped file probe's file.
const CNI_FILE: &str = "05-cilium.conflist";
/// What every stand-in's readiness file holds (a file probe wants it
/// non-empty).
const SIGNAL: &[u8] = b"{\"cniVersion\":\"0.4.0\"}";

pub fn node_name(i: usize) -> String {
    format!("sim-{i:05}")
}

/// The shipped DaemonSet's agent flags, for one simulated node: the same
/// taint, release taint, periods, thresholds and deadlines; per node what a
/// node has once: its state dir, its CNI config file, its admin port.
/// The HTTP probe of 127.0.0.1:9879 is left out: every simulated node shares
/// one network namespace, so it cannot be per node; the file probe (the
/// shipped second probe) stands for both.
///
/// With `--gates` (several gates) the same in the declaration: each gate's
/// HTTP probes left out, each file probe moved into the node's own
/// directory under its file name.
pub fn agent_argv(shipped: &[String], node: &str, node_dir: &Path) -> Vec<String> {
    let mut argv = vec!["nodegate-agent".to_string(), format!("--node-name={node}")];
    for a in shipped {
        if let Some(decl) = a.strip_prefix("--gates=") {
            argv.push(format!("--gates={}", node_gates(decl, node_dir)));
        } else if a.starts_with("--probe-http") {
            continue;
        } else if a.starts_with("--probe-file=") {
            argv.push(format!(
                "--probe-file={}",
                node_dir.join("cni/05-cilium.conflist").display()
            ));
        } else if a.starts_with("--state-dir=") {
            argv.push(format!(
                "--state-dir={}",
                node_dir.join("run/nodegate").display()
            ));
        } else if a.starts_with("--admin-listen=") {
            argv.push("--admin-listen=127.0.0.1:0".into());
        } else {
            argv.push(a.clone());
        }
    }
    argv
}

/// The declaration `decl` (one line of JSON) for one simulated node; left
/// as it is if it does not parse (the agent then says why).
fn node_gates(decl: &str, node_dir: &Path) -> String {
    let Ok(mut gates) = nodegate_shared::gates::Gates::parse(decl) else {
        return decl.to_string();
    };
    for g in &mut gates.gates {
        g.probes.http.clear();
        for f in &mut g.probes.file {
            let name = Path::new(f.as_str())
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            *f = node_dir.join("cni").join(name).display().to_string();
        }
    }
    gates.to_flag()
}

impl Fleet {
    pub fn new(
        cp: &ControlPlane,
        pki: &Pki,
        admin: Client,
        shipped_agent_args: Vec<String>,
        agent_bin: Option<PathBuf>,
        network_start: Duration,
    ) -> Self {
        Self {
            cp_server: cp.server.clone(),
            ca_pem: cp.ca_pem.clone(),
            ca_der: pki.ca_der(),
            dir: cp.dir.join("nodes"),
            agent_argv: shipped_agent_args,
            agent_bin,
            nodes: Mutex::new(HashMap::new()),
            prunes: Arc::default(),
            times: Mutex::default(),
            network_start,
            admin,
            agent_pid: Mutex::new(None),
            changed: Notify::new(),
            ready_order: Mutex::default(),
            node_ready_order: Mutex::default(),
            gate_signals: Mutex::default(),
        }
    }

    /// Several gates: the stand-ins of gates 1, 2, … write `files` (by name,
    /// into the node's probe directory), gate `k` at `k` × `stagger` after
    /// the network agent is ready.
    pub fn set_gate_signals(&self, files: Vec<String>, stagger: Duration) {
        *self.gate_signals.lock().unwrap_or_else(|e| e.into_inner()) =
            GateSignals { files, stagger };
    }

    /// The other gates' stagger from now on (zero: all at once).
    pub fn set_gate_stagger(&self, stagger: Duration) {
        self.gate_signals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stagger = stagger;
    }

    fn signals(&self) -> GateSignals {
        self.gate_signals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The order of the probe and Ready for network agents that turn ready
    /// from now on.
    pub fn set_ready_order(&self, order: ReadyOrder) {
        *self.ready_order.lock().unwrap_or_else(|e| e.into_inner()) = order;
    }

    /// Node `name`'s own order from now on (`None`: the fleet's again).
    pub fn set_node_ready_order(&self, name: &str, order: Option<ReadyOrder>) {
        let mut m = self
            .node_ready_order
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match order {
            Some(o) => m.insert(name.to_string(), o),
            None => m.remove(name),
        };
    }

    fn client(&self, auth: serde_json::Value) -> anyhow::Result<Client> {
        let mut cfg = kube::Config::new(self.cp_server.parse()?);
        cfg.root_cert = Some(vec![self.ca_der.clone()]);
        cfg.auth_info = serde_json::from_value(auth)?;
        Ok(Client::try_from(cfg)?)
    }

    fn node_dir(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Adds node `i` (its credential, its directories) without booting it.
    pub fn add(&self, pki: &Pki, i: usize) -> anyhow::Result<Arc<NodeShared>> {
        self.add_named(pki, &node_name(i), i)
    }

    /// Adds a node called `name` (one whose Node something else, an
    /// autoscaler, may have created), `i` numbering its address.
    pub fn add_named(&self, pki: &Pki, name: &str, i: usize) -> anyhow::Result<Arc<NodeShared>> {
        let name = name.to_string();
        let pair = pki.client(&format!("system:node:{name}"), &["system:nodes"])?;
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let client = self.client(json!({
            "client-certificate-data": b64(&pair.cert_pem),
            "client-key-data": b64(&pair.key_pem),
        }))?;
        let d = self.node_dir(&name);
        std::fs::create_dir_all(d.join("cni"))?;
        std::fs::create_dir_all(d.join("run/nodegate"))?;
        let shared = Arc::new(NodeShared {
            name: name.clone(),
            index: i,
            kubelet: kubelet::sim_kubelet(client.clone(), &name, i),
            client,
            network_ready: false.into(),
            changed: Notify::new(),
        });
        self.lock().insert(
            name,
            NodeRun {
                shared: shared.clone(),
                boot_id: String::new(),
                kubelet: None,
                agent: None,
                network_pod: false,
                reported: Default::default(),
                terminating: Default::default(),
            },
        );
        Ok(shared)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, NodeRun>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn times(&self) -> std::sync::MutexGuard<'_, Times> {
        self.times.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Boots a node: a new boot ID, its kubelet, and (after a reboot) the
    /// containers of its existing Pods started again: the agent's, and the
    /// network agent's, which turns ready `network_start` later.
    pub fn boot(self: &Arc<Self>, name: &str) -> anyhow::Result<()> {
        let boot_id = uuid::Uuid::new_v4().to_string();
        let (shared, restart, network) = {
            let mut nodes = self.lock();
            let run = nodes.get_mut(name).context("unknown node")?;
            run.boot_id = boot_id.clone();
            run.reported.clear();
            (run.shared.clone(), run.agent.is_some(), run.network_pod)
        };
        let me = self.clone();
        let task = tokio::spawn(async move {
            let registered = Instant::now();
            kubelet::register(&shared, &boot_id).await;
            me.times()
                .registered
                .insert(shared.name.clone(), registered);
            if restart {
                let me2 = me.clone();
                let name = shared.name.clone();
                tokio::spawn(async move { me2.restart_agent(&name).await });
            }
            if network {
                me.start_network(shared.clone(), boot_id.clone());
            }
            kubelet::run_registered(shared, boot_id).await;
        });
        let mut nodes = self.lock();
        if let Some(run) = nodes.get_mut(name) {
            run.kubelet = Some(task);
        }
        Ok(())
    }

    /// The network agent's container started in boot `boot_id`: ready
    /// `network_start` later, unless the node crashed meanwhile.
    fn start_network(self: &Arc<Self>, node: Arc<NodeShared>, boot_id: String) {
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(me.network_start).await;
            if let Err(e) = me.network_ready(&node, &boot_id) {
                tracing::warn!(error = %e, "stand-in not ready");
            }
        });
    }

    /// The stand-in network agent turns ready: the CNI config the agent
    /// probes appears, and the kubelet reports the network ready, in the
    /// fleet's [`ReadyOrder`]. Once per boot, and only in the boot that
    /// started it.
    fn network_ready(
        self: &Arc<Self>,
        node: &Arc<NodeShared>,
        boot_id: &str,
    ) -> anyhow::Result<()> {
        if !self.live(node, boot_id) {
            return Ok(());
        }
        let own = self
            .node_ready_order
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&node.name)
            .copied();
        let order =
            own.unwrap_or_else(|| *self.ready_order.lock().unwrap_or_else(|e| e.into_inner()));
        match order {
            ReadyOrder::Together => {
                if node.network_ready.load(Ordering::SeqCst) && self.probe_file(&node.name).exists()
                {
                    return Ok(());
                }
                self.probe_passes(node, boot_id)?;
                self.kubelet_ready(node);
            }
            ReadyOrder::ProbeFirst(after) => {
                self.probe_passes(node, boot_id)?;
                self.later(node, boot_id, after, false);
            }
            ReadyOrder::ReadyFirst(after) => {
                self.kubelet_ready(node);
                self.later(node, boot_id, after, true);
            }
        }
        Ok(())
    }

    /// `boot_id` is the node's running boot.
    fn live(&self, node: &NodeShared, boot_id: &str) -> bool {
        self.lock()
            .get(&node.name)
            .is_some_and(|r| r.boot_id == boot_id && r.kubelet.is_some())
    }

    /// The second of the two signals, `after` the first, in the same boot.
    fn later(
        self: &Arc<Self>,
        node: &Arc<NodeShared>,
        boot_id: &str,
        after: Duration,
        probe: bool,
    ) {
        let (me, node, boot_id) = (self.clone(), node.clone(), boot_id.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            if !me.live(&node, &boot_id) {
                return;
            }
            if probe {
                if let Err(e) = me.probe_passes(&node, &boot_id) {
                    tracing::warn!(error = %e, "stand-in probe");
                }
            } else {
                me.kubelet_ready(&node);
            }
        });
    }

    /// The CNI config file the agent's file probe reads appears, and with
    /// several gates the other stand-ins' files: each `k` × the stagger
    /// later, or with no stagger every one at once (the node's probe
    /// directory renamed into place with all of them in it, so that one
    /// probe round of the agent sees all or none).
    fn probe_passes(self: &Arc<Self>, node: &Arc<NodeShared>, boot_id: &str) -> anyhow::Result<()> {
        let sig = self.signals();
        if sig.files.is_empty() {
            return self.write_signal(&node.name, CNI_FILE);
        }
        if sig.stagger.is_zero() {
            let dir = self.probe_dir(&node.name);
            let tmp = self
                .node_dir(&node.name)
                .join(format!(".cni-{}", uuid::Uuid::new_v4().simple()));
            std::fs::create_dir_all(&tmp)?;
            for f in std::iter::once(CNI_FILE).chain(sig.files.iter().map(String::as_str)) {
                std::fs::write(tmp.join(f), SIGNAL)?;
            }
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::rename(&tmp, &dir)?;
            let now = Instant::now();
            let mut t = self.times();
            for k in 1..=sig.files.len() {
                t.gate_ready.insert((node.name.clone(), k), now);
            }
            return Ok(());
        }
        self.write_signal(&node.name, CNI_FILE)?;
        for (i, file) in sig.files.into_iter().enumerate() {
            let k = i + 1;
            let (me, node, boot_id) = (self.clone(), node.clone(), boot_id.to_string());
            let after = sig.stagger * k as u32;
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                if !me.live(&node, &boot_id) {
                    return;
                }
                match me.write_signal(&node.name, &file) {
                    Ok(()) => {
                        me.times()
                            .gate_ready
                            .insert((node.name.clone(), k), Instant::now());
                    }
                    Err(e) => tracing::warn!(error = %e, "gate stand-in not ready"),
                }
            });
        }
        Ok(())
    }

    /// One stand-in's readiness file appears in the node's probe directory.
    fn write_signal(&self, name: &str, file: &str) -> anyhow::Result<()> {
        let dir = self.probe_dir(name);
        std::fs::create_dir_all(&dir)?;
        nodegate_certs::write_atomic(&dir.join(file), SIGNAL, 0o644)?;
        Ok(())
    }

    /// The directory of every stand-in's readiness file on node `name`:
    /// its CNI config directory.
    fn probe_dir(&self, name: &str) -> PathBuf {
        self.node_dir(name).join("cni")
    }

    fn probe_file(&self, name: &str) -> PathBuf {
        self.probe_dir(name).join(CNI_FILE)
    }

    /// The kubelet reports the network ready ("Ready" in every figure).
    fn kubelet_ready(&self, node: &NodeShared) {
        if node.network_ready.swap(true, Ordering::SeqCst) {
            return;
        }
        self.times()
            .network_ready
            .insert(node.name.clone(), Instant::now());
        node.changed.notify_one();
        tracing::debug!(node = %node.name, "network agent ready");
    }

    /// Cuts the running agents of `names` off the API server before they
    /// crash ([`CRASH_POLICY`]): their tokens listed, then long enough for
    /// the API server's policy to read them.
    pub async fn cut_off(&self, names: &[String]) -> anyhow::Result<()> {
        let jtis: serde_json::Map<String, serde_json::Value> = {
            let nodes = self.lock();
            names
                .iter()
                .filter_map(|n| nodes.get(n)?.agent.as_ref()?.jti.clone())
                .map(|j| (j, serde_json::Value::String(String::new())))
                .collect()
        };
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(self.admin.clone(), "nodegate");
        api.patch(
            CRASHED,
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": jtis })),
        )
        .await
        .context("listing the crashing agents' tokens")?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(())
    }

    /// A crash: every process of the node killed (the kubelet, the agent,
    /// the stand-in) with nothing written on the way down (for an agent
    /// task, only once [`Self::cut_off`]: see [`CRASH_POLICY`]), its /var/run
    /// (state dir) emptied; the CNI config goes too, as the health endpoint
    /// the shipped HTTP probe reads would. Then [`Self::boot`].
    pub fn crash(&self, name: &str) -> anyhow::Result<()> {
        self.crash_with(name, false)
    }

    /// A crash after which the node finds its old CNI config on disk: the
    /// kubelet reports Ready as soon as it runs again, while the agent's
    /// probe (the network agent's health) fails until the network agent is
    /// ready again.
    pub fn crash_keeping_cni(&self, name: &str) -> anyhow::Result<()> {
        self.crash_with(name, true)
    }

    fn crash_with(&self, name: &str, keep_cni: bool) -> anyhow::Result<()> {
        let mut nodes = self.lock();
        let run = nodes.get_mut(name).context("unknown node")?;
        if let Some(k) = run.kubelet.take() {
            k.abort();
        }
        if let Some(kind) = run.agent.as_mut().and_then(|a| a.kind.take()) {
            match kind {
                AgentKind::Task { task, .. } => task.abort(),
                // Dropping the child kills it (kill_on_drop).
                AgentKind::Process(p) => drop(p),
            }
        }
        if !keep_cni {
            run.shared.network_ready.store(false, Ordering::SeqCst);
        }
        let d = self.node_dir(name);
        if self.signals().files.is_empty() {
            let _ = std::fs::remove_file(self.probe_file(name));
        } else {
            // Every stand-in's file goes; the directory too, so that they
            // can all come back in one rename.
            let _ = std::fs::remove_dir_all(self.probe_dir(name));
        }
        let _ = std::fs::remove_dir_all(d.join("run"));
        std::fs::create_dir_all(d.join("run/nodegate"))?;
        Ok(())
    }

    /// A node powered off for good (its Node is then deleted by the caller).
    pub fn power_off(&self, name: &str) -> anyhow::Result<()> {
        self.crash(name)?;
        self.lock().remove(name);
        Ok(())
    }

    /// Stops every agent as SIGTERM would (re-taint, last snapshot) and
    /// keeps its Pod: the containers stopped, not the Pods deleted.
    pub async fn stop_agents(&self) {
        let kinds: Vec<AgentKind> = {
            let mut nodes = self.lock();
            nodes
                .values_mut()
                .filter_map(|r| r.agent.as_mut().and_then(|a| a.kind.take()))
                .collect()
        };
        futures::future::join_all(kinds.into_iter().map(stop_kind)).await;
    }

    /// Starts every stopped agent container again (same Pod, new token).
    pub async fn start_agents(self: &Arc<Self>) {
        let names: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, r)| r.agent.as_ref().is_some_and(|a| a.kind.is_none()))
            .map(|(n, _)| n.clone())
            .collect();
        let starts = names.iter().map(|n| self.restart_agent(n));
        futures::stream::iter(starts)
            .buffer_unordered(64)
            .collect::<Vec<()>>()
            .await;
    }

    async fn restart_agent(self: &Arc<Self>, name: &str) {
        let (shared, pod, uid) = {
            let nodes = self.lock();
            let Some(run) = nodes.get(name) else { return };
            let Some(a) = run.agent.as_ref() else { return };
            if a.kind.is_some() {
                return;
            }
            (run.shared.clone(), a.pod.clone(), a.uid.clone())
        };
        // The kubelet retries a container that fails to start; here the
        // TokenRequest can be refused for a moment right after the binding,
        // until the Node authorizer's graph has the Pod on this node.
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.start_agent(&shared, &pod, &uid).await {
                Ok((kind, jti)) => {
                    let unwanted = {
                        let mut nodes = self.lock();
                        match nodes.get_mut(name).and_then(|r| r.agent.as_mut()) {
                            Some(a) if a.uid == uid && a.kind.is_none() => {
                                a.kind = Some(kind);
                                a.jti = jti;
                                None
                            }
                            // The Pod went (or the node crashed) meanwhile.
                            _ => Some(kind),
                        }
                    };
                    if let Some(kind) = unwanted {
                        stop_kind(kind).await;
                    }
                    return;
                }
                Err(e) if Instant::now() < deadline => {
                    tracing::info!(node = %name, error = %e, "agent start failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    tracing::warn!(node = %name, error = %e, "agent start failed; giving up");
                    return;
                }
            }
        }
    }

    /// The agent container of Pod `pod`: the token the kubelet requests for
    /// that Pod (bound to it, so it carries the node claim the confinement
    /// policy checks), then the agent with the shipped flags. Node 0's agent
    /// is the real binary in its own process (its RSS is measured); the
    /// others are tasks here, each with its own client and token.
    async fn start_agent(
        self: &Arc<Self>,
        node: &NodeShared,
        pod: &str,
        uid: &str,
    ) -> anyhow::Result<(AgentKind, Option<String>)> {
        let sa: Api<ServiceAccount> = Api::namespaced(node.client.clone(), "nodegate");
        let req: TokenRequest = serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": [], "expirationSeconds": 3607,
                     "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}},
        }))?;
        let tr: TokenRequest = sa
            .create_subresource("token", "nodegate-agent", &PostParams::default(), &req)
            .await
            .context("TokenRequest as the node")?;
        let token = tr.status.context("TokenRequest without status")?.token;
        let jti = token_jti(&token);
        let argv = agent_argv(&self.agent_argv, &node.name, &self.node_dir(&node.name));
        {
            let mut t = self.times();
            let now = Instant::now();
            t.agent_started.entry(node.name.clone()).or_insert(now);
            t.agent_restarted.insert(node.name.clone(), now);
        }
        if node.index == 0
            && let Some(bin) = &self.agent_bin
        {
            let kc = self.node_dir(&node.name).join("agent.kubeconfig");
            write_kubeconfig(&kc, &self.cp_server, &self.ca_pem, None, Some(&token))?;
            let log = self.node_dir(&node.name);
            let mut args: Vec<String> = argv[1..].to_vec();
            // The real binary's deletion handler: one line per deletion.
            args.push(format!(
                "--on-node-delete=echo \"$NODEGATE_NODE_NAME\" >> {}",
                log.join("pruned.txt").display()
            ));
            let p = Proc::spawn(
                "agent",
                &log,
                bin,
                &args,
                &[
                    ("KUBECONFIG", kc.display().to_string()),
                    ("RUST_LOG", "info".into()),
                ],
            )?;
            *self.agent_pid.lock().unwrap_or_else(|e| e.into_inner()) = p.pid();
            return Ok((AgentKind::Process(p), jti));
        }
        let args = <nodegate_agent::Args as clap::Parser>::try_parse_from(&argv)?;
        let client = self.client(json!({ "token": token }))?;
        let handler: Arc<dyn NodeDeleteHandler> = Arc::new(Counter {
            node: node.name.clone(),
            counts: self.prunes.clone(),
        });
        let (tx, rx) = oneshot::channel::<()>();
        let name = node.name.clone();
        let task = tokio::spawn(async move {
            let stop = async {
                let _ = rx.await;
            };
            if let Err(e) =
                nodegate_agent::run_with_handlers(args, client, vec![handler], stop).await
            {
                tracing::warn!(node = %name, error = %e, "agent stopped with an error");
            }
        });
        Ok((
            AgentKind::Task {
                stop: Some(tx),
                task,
            },
            jti,
        ))
    }

    /// The kubelets' pod work, from one watch of every Pod bound to a node.
    pub async fn follow_pods(self: Arc<Self>) {
        let api: Api<Pod> = Api::all(self.admin.clone());
        let cfg = watcher::Config::default().fields("spec.nodeName!=");
        let stream = watcher(api, cfg).default_backoff().applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(pod) => self.on_pod(pod),
                Err(e) => tracing::warn!(error = %e, "pod watch"),
            }
        }
    }

    /// One Pod as the kubelets' watch delivers it (also for a Pod bound
    /// before its node joined the fleet).
    pub fn on_pod(self: &Arc<Self>, pod: Pod) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return;
        };
        let uid = pod.uid().unwrap_or_default();
        let is_agent = pod.namespace().as_deref() == Some("nodegate")
            && pod
                .labels()
                .get("app.kubernetes.io/name")
                .map(String::as_str)
                == Some("nodegate-agent");
        let is_network = pod.namespace().as_deref() == Some("kube-system")
            && pod
                .labels()
                .get("app.kubernetes.io/name")
                .map(String::as_str)
                == Some(super::install::NETWORK_AGENT);
        let mut nodes = self.lock();
        let Some(run) = nodes.get_mut(&node) else {
            return;
        };
        if run.kubelet.is_none() {
            return;
        }
        let shared = run.shared.clone();
        if pod.metadata.deletion_timestamp.is_some() {
            if !run.terminating.insert(uid.clone()) {
                return;
            }
            // Graceful deletion: stop the container (SIGTERM: the agent's
            // re-taint), then the kubelet's final delete with grace 0.
            let kind = match run.agent.as_ref() {
                Some(a) if a.uid == uid => run.agent.take().and_then(|a| a.kind),
                _ => None,
            };
            drop(nodes);
            tokio::spawn(async move {
                if let Some(k) = kind {
                    stop_kind(k).await;
                }
                let api: Api<Pod> =
                    Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default());
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                if let Err(e) = api.delete(&pod.name_any(), &dp).await {
                    tracing::debug!(error = %e, "final pod delete");
                }
            });
            return;
        }
        if !run.reported.insert(uid.clone()) {
            return;
        }
        let start_agent = is_agent && run.agent.as_ref().is_none_or(|a| a.uid != uid);
        let network_boot = is_network.then(|| {
            run.network_pod = true;
            run.boot_id.clone()
        });
        if start_agent {
            run.agent = Some(AgentRun {
                pod: pod.name_any(),
                uid: uid.clone(),
                kind: None,
                jti: None,
            });
        }
        drop(nodes);
        if let Some(boot_id) = network_boot {
            self.times()
                .network_started
                .entry(node.clone())
                .or_insert_with(Instant::now);
            self.start_network(shared.clone(), boot_id);
        }
        let me = self.clone();
        tokio::spawn(async move {
            if start_agent {
                me.restart_agent(&shared.name).await;
            }
            if let Err(e) = report_running(&shared, &pod).await {
                tracing::debug!(error = %e, "pod status");
            }
            me.changed.notify_waiters();
        });
    }

    /// Every node's kubelet and agent stopped (the harness is done).
    pub async fn shutdown(&self) {
        let runs: Vec<NodeRun> = self.lock().drain().map(|(_, r)| r).collect();
        for mut r in runs {
            if let Some(k) = r.kubelet.take() {
                k.abort();
            }
            if let Some(kind) = r.agent.take().and_then(|a| a.kind) {
                match kind {
                    AgentKind::Task { task, .. } => task.abort(),
                    AgentKind::Process(p) => p.stop(Duration::from_secs(5)).await,
                }
            }
        }
    }

    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lock().keys().cloned().collect();
        v.sort();
        v
    }

    pub fn running_agents(&self) -> usize {
        self.lock()
            .values()
            .filter(|r| r.agent.as_ref().is_some_and(|a| a.kind.is_some()))
            .count()
    }
}

/// The kubelet's status for a started Pod: Running, every container ready.
async fn report_running(node: &NodeShared, pod: &Pod) -> Result<(), kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let containers: Vec<serde_json::Value> = pod
        .spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .map(|c| {
                    json!({"name": c.name, "ready": true, "started": true, "restartCount": 0,
                       "image": c.image.clone().unwrap_or_default(), "imageID": "",
                       "containerID": format!("containerd://{}", uuid::Uuid::new_v4().simple()),
                       "state": {"running": {"startedAt": now}}})
                })
                .collect()
        })
        .unwrap_or_default();
    let cond = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    let status = json!({"status": {
        "phase": "Running", "startTime": now, "hostIP": kubelet::node_ip(node.index),
        "podIP": kubelet::node_ip(node.index),
        "conditions": [cond("PodReadyToStartContainers"), cond("Initialized"), cond("Ready"), cond("ContainersReady"), cond("PodScheduled")],
        "containerStatuses": containers,
    }});
    let api: Api<Pod> = Api::namespaced(node.client.clone(), &pod.namespace().unwrap_or_default());
    api.patch_status(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Strategic(status),
    )
    .await?;
    Ok(())
}

/// SIGTERM to one agent: its re-taint and last snapshot, within the
/// shipped 15 s deadline (and a margin).
async fn stop_kind(kind: AgentKind) {
    match kind {
        AgentKind::Task { mut stop, task } => {
            if let Some(s) = stop.take() {
                let _ = s.send(());
            }
            let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
        }
        AgentKind::Process(p) => p.stop(Duration::from_secs(20)).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tokens_jti_is_its_payloads() {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let token = format!(
            "{}.{}.sig",
            b64(r#"{"alg":"RS256"}"#),
            b64(r#"{"jti":"0f1e","sub":"system:serviceaccount:nodegate:nodegate-agent"}"#)
        );
        assert_eq!(token_jti(&token).as_deref(), Some("0f1e"));
        assert_eq!(token_jti("not-a-jwt"), None);
    }

    /// Each simulated node's agent gets the DaemonSet's flags with its own
    /// files: with `--gates`, every gate's file probe in the node's
    /// directory and no HTTP probe (one network namespace for all nodes).
    #[test]
    fn each_nodes_agent_probes_its_own_files_for_every_gate() {
        let variant = crate::scale::gates::variant_args_for_test();
        let argv = agent_argv(&variant, "sim-00001", Path::new("/s/nodes/sim-00001"));
        let gates = argv
            .iter()
            .find_map(|a| a.strip_prefix("--gates="))
            .expect("--gates");
        let gates = nodegate_shared::gates::Gates::parse(gates).unwrap();
        let files: Vec<&str> = gates
            .gates
            .iter()
            .flat_map(|g| g.probes.file.iter().map(String::as_str))
            .collect();
        assert_eq!(
            files,
            [
                "/s/nodes/sim-00001/cni/05-cilium.conflist",
                "/s/nodes/sim-00001/cni/csi.ready",
                "/s/nodes/sim-00001/cni/gpu.ready",
            ]
        );
        assert!(gates.gates.iter().all(|g| g.probes.http.is_empty()));
        assert!(argv.iter().any(|a| a == "--node-name=sim-00001"));
        assert!(!argv.iter().any(|a| a.starts_with("--taint=")));
    }
}
