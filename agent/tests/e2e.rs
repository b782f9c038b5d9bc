//! End-to-end: the real `nodegate-agent` binary against a fresh emulated API
//! server with the real webhook and the shipped RBAC — or, when
//! `NODEGATE_E2E_KUBECONFIG` names a kubeconfig, a real cluster with nodegate
//! installed (`nodegate_e2e::cluster::Cluster`). The same tests and
//! assertions run in both: every name a test makes is unique to it on a real
//! cluster, and what it asserts about the node set (snapshots, prunes) is
//! about its own nodes, so other nodes and parallel tests never disturb it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use nodegate_agent::snapshot;
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use nodegate_shared::keys::DEFAULT_TAINT;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

const TAINT_KEY: &str = "nodegate.dev/agent-not-ready";
const WAIT: Duration = Duration::from_secs(20);

/// Polls `cond` every 50 ms until it holds; panics with `what` at `WAIT`.
async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if cond().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The real agent binary, its admin address and its output.
struct Agent {
    child: Child,
    admin: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Agent {
    /// Acts as the agent's service account (impersonated on a real cluster).
    async fn start(c: &Cluster, node: &str, state: &Path, extra: &[&str]) -> Agent {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nodegate-agent"));
        cmd.args(["--node-name", node, "--admin-listen", "127.0.0.1:0"])
            .arg("--state-dir")
            .arg(state)
            .args(["--snapshot-interval", "100ms", "--shutdown-deadline", "10s"])
            .args(extra);
        // The DaemonSet pod's credential: a token bound to a pod on `node`.
        let kubeconfig = c.agent_kubeconfig(node).await.unwrap();
        Self::spawn_with(c, cmd, users::AGENT, kubeconfig, state).await
    }

    /// A roster publisher replica: the real `nodegate-roster` binary as the
    /// publisher's service account (the admin on a real cluster), writing
    /// roster `roster` in `nodegate`
    /// with short lease timings so a failover takes about 2 s.
    async fn publisher(c: &Cluster, roster: &str, replica: usize, home: &Path) -> Agent {
        let bin = nodegate_e2e::process::bin_path("nodegate-roster");
        assert!(
            bin.exists(),
            "build it first: cargo build -p nodegate-roster"
        );
        let mut cmd = Command::new(bin);
        cmd.args(["--namespace", "nodegate", "--name", roster])
            .args(["--identity", &format!("{roster}-{replica}")])
            .args(["--shards", &SHARDS.to_string(), "--interval", "50ms"])
            .args(["--lease-duration", "2s", "--renew-deadline", "1500ms"])
            .args(["--retry-period", "250ms", "--admin-listen", "127.0.0.1:0"]);
        Self::spawn(c, cmd, roster_writer(c), home).await
    }

    async fn spawn(c: &Cluster, cmd: Command, user: &str, home: &Path) -> Agent {
        let kubeconfig = c.kubeconfig(user).unwrap();
        Self::spawn_with(c, cmd, user, kubeconfig, home).await
    }

    async fn spawn_with(
        c: &Cluster,
        mut cmd: Command,
        user: &str,
        kubeconfig: std::path::PathBuf,
        home: &Path,
    ) -> Agent {
        if c.is_real() {
            // A real kubeconfig may run an exec credential plugin that needs
            // the caller's environment; only the agent's own settings go.
            for (k, _) in std::env::vars_os() {
                let k = k.to_string_lossy();
                if k.starts_with("NODEGATE_") || k == "NODE_NAME" {
                    cmd.env_remove(&*k);
                }
            }
        } else {
            cmd.env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .env("HOME", home);
        }
        cmd.env("KUBECONFIG", kubeconfig)
            .env(
                "RUST_LOG",
                "info,nodegate_agent=debug,nodegate_roster=debug",
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn the binary");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let echo = std::env::var_os("NODEGATE_TEST_VERBOSE").is_some();
        let out: Vec<Box<dyn tokio::io::AsyncRead + Unpin + Send>> = vec![
            Box::new(child.stdout.take().unwrap()),
            Box::new(child.stderr.take().unwrap()),
        ];
        for pipe in out {
            let (logs, tx, user) = (logs.clone(), tx.clone(), user.to_string());
            tokio::spawn(async move {
                let mut lines = BufReader::new(pipe).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if echo {
                        eprintln!("[{user}] {line}");
                    }
                    if let Some(rest) = line.split("listening admin=").nth(1) {
                        let addr = rest.split_whitespace().next().unwrap_or("");
                        if let Ok(a) = addr.parse::<SocketAddr>() {
                            let _ = tx.send(a);
                        }
                    }
                    logs.lock().unwrap().push(line);
                }
            });
        }
        let admin = tokio::time::timeout(WAIT, rx.recv())
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| {
                panic!(
                    "{user} did not log its admin address: {:?}",
                    logs.lock().unwrap()
                )
            });
        Agent { child, admin, logs }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id().expect("running") as i32)
    }

    fn logged(&self, needle: &str) -> bool {
        self.logs.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let Ok(mut s) = tokio::net::TcpStream::connect(self.admin).await else {
            return (0, String::new());
        };
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        if s.write_all(req.as_bytes()).await.is_err() {
            return (0, String::new());
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        let code = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
        (code, body.unwrap_or_default())
    }

    async fn metric(&self, series: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics").await;
        body.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    async fn ready(&self) -> bool {
        self.get("/readyz").await.0 == 200
    }

    async fn term(&mut self) -> ExitStatus {
        kill(self.pid(), Signal::SIGTERM).unwrap();
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("agent exits after SIGTERM")
            .unwrap()
    }

    async fn kill9(&mut self) {
        kill(self.pid(), Signal::SIGKILL).unwrap();
        self.child.wait().await.unwrap();
    }
}

fn has_taint(n: &Node, key: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key && t.effect == "NoSchedule"))
}

fn our_taint(n: &Node) -> bool {
    has_taint(n, TAINT_KEY)
}

fn ready_boot_id(n: &Node) -> Option<String> {
    n.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("nodegate.dev/ready-boot-id").cloned())
}

fn boot_id(n: &Node) -> String {
    n.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.clone())
        .unwrap_or_default()
}

async fn node(api: &Api<Node>, name: &str) -> Node {
    api.get(name).await.unwrap()
}

/// The test's cluster and the admin's view of its Nodes.
async fn cluster() -> (Cluster, Api<Node>) {
    let c = Cluster::start().await.unwrap();
    let nodes = Api::all(c.client(users::ADMIN).await.unwrap());
    (c, nodes)
}

/// Node Events (they go to `default`, as the kubelet's do).
async fn node_events(c: &Cluster, node: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(c.client(users::ADMIN).await.unwrap(), "default");
    let mut evs = events.list(&ListParams::default()).await.unwrap().items;
    evs.retain(|e| e.involved_object.name.as_deref() == Some(node));
    evs
}

/// The taint goes on with the webhook at create, comes off only after the
/// probe file appears (reacting through inotify: the probe period is an
/// hour), goes back on after a reboot and comes off again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_taints_agent_untaints_after_probe_file_and_after_reboot() {
    let (c, nodes) = cluster().await;
    let node_a = c.node_name("node-a");
    let mut kubelet = c.kubelet(&node_a).await.unwrap();
    let created = kubelet.register().await.unwrap();
    assert!(our_taint(&created), "webhook taints the node at create");

    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("cni").join("05-cilium.conflist");
    std::fs::create_dir_all(probe.parent().unwrap()).unwrap();
    let probe_arg = probe.to_str().unwrap().to_string();
    let mut agent = Agent::start(
        &c,
        &node_a,
        &dir.path().join("state"),
        // One failed round is not-ready: the agent on the old boot must not be
        // ready when the simulated reboot happens (on a real crash it is dead).
        &[
            "--probe-file",
            &probe_arg,
            "--probe-period",
            "1h",
            "--failure-threshold",
            "1",
        ],
    )
    .await;

    // The first round ran and failed: the node must still be tainted.
    // Labelled by kind and index, never by the path.
    let series = r#"nodegate_agent_probe_results_total{kind="file",index="0",result="fail"}"#;
    eventually("a failed probe round", || async {
        agent.metric(series).await.unwrap_or(0.0) >= 1.0
    })
    .await;
    let (_, exposition) = agent.get("/metrics").await;
    assert!(!exposition.contains(&probe_arg), "probe path in metrics");
    let n = node(&nodes, &node_a).await;
    assert!(our_taint(&n), "not untainted before the probe file exists");
    assert_eq!(ready_boot_id(&n), None);

    // An empty file is not ready either; content makes it ready.
    std::fs::write(&probe, b"").unwrap();
    std::fs::write(&probe, br#"{"cniVersion":"0.3.1","name":"cilium"}"#).unwrap();
    eventually("taint removed after the probe file appeared", || async {
        let n = node(&nodes, &node_a).await;
        !our_taint(&n) && ready_boot_id(&n).as_deref() == Some(kubelet.boot_id())
    })
    .await;
    let n = node(&nodes, &node_a).await;
    let others: Vec<_> = n.spec.unwrap().taints.unwrap_or_default();
    assert!(
        others.iter().all(|t| t.key != TAINT_KEY),
        "only our taint removed: {others:?}"
    );
    // Logged and counted once the API server has answered the write, which
    // can be after a reader sees the taint gone.
    eventually("the removal logged and counted", || async {
        agent.logged("node ready: taint removed")
            && agent.metric("nodegate_agent_taint_removals_total").await == Some(1.0)
    })
    .await;
    assert!(agent.logged("since_node_creation_ms"));
    let evs = node_events(&c, &node_a).await;
    assert!(
        evs.iter()
            .any(|e| e.reason.as_deref() == Some("NodegateReady")),
        "a NodegateReady event on the node"
    );
    assert_eq!(
        agent.metric("nodegate_agent_taint_removals_total").await,
        Some(1.0)
    );
    // The webhook put the taint on: no alarm, and time-to-ready says so.
    assert_eq!(
        agent
            .metric("nodegate_agent_time_to_ready_seconds_count{origin=\"webhook\"}")
            .await,
        Some(1.0)
    );
    assert!(
        !evs.iter()
            .any(|e| e.reason.as_deref() == Some("NodegateWebhookMissed")),
        "no webhook-missed alarm when the webhook tainted the node"
    );

    // Reboot: the network agent is not up yet on the new boot. (A crash
    // reboot kills the agent too; this one keeps running, so it is made to
    // see its probe fail first, as it would before a reboot it survives.)
    std::fs::remove_file(&probe).unwrap();
    eventually("the agent sees its probe fail", || async {
        agent.metric("nodegate_agent_ready").await == Some(0.0)
    })
    .await;
    let old_boot = kubelet.boot_id().to_string();
    kubelet.reboot().await.unwrap();
    assert_ne!(kubelet.boot_id(), old_boot);
    eventually("webhook re-taints after the reboot", || async {
        let n = node(&nodes, &node_a).await;
        our_taint(&n) && boot_id(&n) == kubelet.boot_id()
    })
    .await;
    eventually("agent saw the reboot", || async {
        agent.logged("node rebooted; probes must pass again")
    })
    .await;
    let n = node(&nodes, &node_a).await;
    assert!(our_taint(&n), "still tainted while the probe fails");
    assert_eq!(ready_boot_id(&n).as_deref(), Some(old_boot.as_str()));

    std::fs::write(&probe, b"{}").unwrap();
    eventually("taint removed again on the new boot", || async {
        let n = node(&nodes, &node_a).await;
        !our_taint(&n) && ready_boot_id(&n).as_deref() == Some(kubelet.boot_id())
    })
    .await;
    assert_eq!(
        agent.metric("nodegate_agent_taint_removals_total").await,
        Some(2.0)
    );
    assert!(agent.term().await.success());
}

/// The install's taint. The test removes it (as an admin) right after the
/// node registers: for the agent that is exactly a node the webhook missed,
/// on an emulator and on a real cluster alike, without stopping anyone's
/// webhook. (The agent may only manage the taints the install's confinement
/// policy names, so it cannot gate on a test-only taint.)
const MISSED_TAINT: &str = "nodegate.dev/agent-not-ready";

/// The webhook missed the node: the safety net taints at start (and says so
/// loudly), the agent untaints when ready, and SIGTERM puts the taint back
/// before the process exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safety_net_and_sigterm_retaint() {
    let (c, nodes) = cluster().await;
    let node_b = c.node_name("node-b");
    let missed = |n: &Node| has_taint(n, MISSED_TAINT);
    let kubelet = c.kubelet(&node_b).await.unwrap();
    let created = kubelet.register().await.unwrap();
    assert!(missed(&created), "the webhook adds it at create");
    // The miss: the taint is gone before the agent starts.
    let at = created
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .and_then(|t| t.iter().position(|t| t.key == MISSED_TAINT))
        .unwrap();
    let ops: json_patch::Patch = serde_json::from_value(serde_json::json!([
        {"op": "test", "path": format!("/spec/taints/{at}/key"), "value": MISSED_TAINT},
        {"op": "remove", "path": format!("/spec/taints/{at}")},
    ]))
    .unwrap();
    let admin: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let missed_node = admin
        .patch(&node_b, &PatchParams::default(), &Patch::<()>::Json(ops))
        .await
        .unwrap();
    assert!(!missed(&missed_node));

    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("ready");
    let probe_arg = probe.to_str().unwrap().to_string();
    let state = dir.path().join("state");
    let args = [
        "--taint",
        DEFAULT_TAINT,
        "--probe-file",
        probe_arg.as_str(),
        "--probe-period",
        "200ms",
    ];
    let mut agent = Agent::start(&c, &node_b, &state, &args).await;
    eventually("safety net adds the taint", || async {
        missed(&node(&nodes, &node_b).await)
    })
    .await;
    eventually("safety-net metric", || async {
        agent
            .metric("nodegate_agent_taint_adds_total{reason=\"safety_net\"}")
            .await
            == Some(1.0)
    })
    .await;
    // The loud signal: a Warning Event on the Node that names the miss.
    let uid = node(&nodes, &node_b).await.metadata.uid;
    eventually("NodegateWebhookMissed warning event", || async {
        node_events(&c, &node_b).await.iter().any(|e| {
            e.reason.as_deref() == Some("NodegateWebhookMissed")
                && e.type_.as_deref() == Some("Warning")
                && e.involved_object.kind.as_deref() == Some("Node")
                && e.involved_object.uid == uid
                && e.message
                    .as_deref()
                    .is_some_and(|m| m.contains(kubelet.boot_id()) && m.contains(MISSED_TAINT))
        })
    })
    .await;

    std::fs::write(&probe, b"ok").unwrap();
    eventually("untainted when ready", || async {
        let n = node(&nodes, &node_b).await;
        !missed(&n) && ready_boot_id(&n).as_deref() == Some(kubelet.boot_id())
    })
    .await;
    // Time-to-ready is labelled by who put the taint on.
    eventually("time to ready, origin safety_net", || async {
        agent
            .metric("nodegate_agent_time_to_ready_seconds_count{origin=\"safety_net\"}")
            .await
            == Some(1.0)
    })
    .await;
    assert_eq!(
        agent
            .metric("nodegate_agent_time_to_ready_seconds_count{origin=\"webhook\"}")
            .await,
        None
    );

    let status = agent.term().await;
    assert!(status.success(), "clean exit: {status:?}");
    // Re-tainted before the process was gone.
    assert!(missed(&node(&nodes, &node_b).await));
    assert!(agent.logged("shutdown re-taint done"));

    // Restart on the same boot: the taint is there (annotation = bootID, so
    // the safety net has nothing to do) and comes off once ready.
    let mut agent = Agent::start(&c, &node_b, &state, &args).await;
    eventually("untainted again after restart", || async {
        !missed(&node(&nodes, &node_b).await)
    })
    .await;
    assert_eq!(
        agent
            .metric("nodegate_agent_taint_adds_total{reason=\"safety_net\"}")
            .await,
        None
    );
    assert!(agent.term().await.success());
    assert!(missed(&node(&nodes, &node_b).await));
}

/// Karpenter labels a gated node initialized when the gate is not among its
/// NodePool's startupTaints (it ignores undeclared taints): the agent's
/// ready patch finds the label on the node it ungates and says so with a
/// Warning Event and a count. A node without the label gets neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_karpenter_initialized_while_gated_gets_a_warning() {
    let (c, nodes) = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("ready");
    std::fs::write(&probe, b"ok").unwrap();
    let probe_arg = probe.to_str().unwrap().to_string();
    let warned = |evs: &[Event]| {
        evs.iter()
            .filter(|e| e.reason.as_deref() == Some("NodegateGateNotDeclared"))
            .count()
    };
    for (base, labelled) in [("karpenter-a", true), ("karpenter-b", false)] {
        let name = c.node_name(base);
        let kubelet = c.kubelet(&name).await.unwrap();
        assert!(our_taint(&kubelet.register().await.unwrap()));
        if labelled {
            // What Karpenter's Initialization.Reconcile writes.
            let label = json!({"metadata": {"labels": {"karpenter.sh/initialized": "true"}}});
            nodes
                .patch(&name, &PatchParams::default(), &Patch::Merge(label))
                .await
                .unwrap();
        }
        let state = dir.path().join(base);
        let mut agent = Agent::start(&c, &name, &state, &["--probe-file", &probe_arg]).await;
        eventually("untainted", || async {
            let n = node(&nodes, &name).await;
            !our_taint(&n) && ready_boot_id(&n).as_deref() == Some(kubelet.boot_id())
        })
        .await;
        let uid = node(&nodes, &name).await.metadata.uid;
        let series = r#"nodegate_agent_gate_undeclared_total{autoscaler="karpenter"}"#;
        if labelled {
            eventually("the warning and its count", || async {
                let evs = node_events(&c, &name).await;
                let named = evs.iter().any(|e| {
                    e.reason.as_deref() == Some("NodegateGateNotDeclared")
                        && e.type_.as_deref() == Some("Warning")
                        && e.involved_object.uid == uid
                        && e.message.as_deref().is_some_and(|m| {
                            m.contains("nodegate.dev/agent-not-ready:NoSchedule")
                                && m.contains("startupTaints")
                        })
                });
                named && agent.metric(series).await == Some(1.0)
            })
            .await;
        } else {
            eventually("the ready Event", || async {
                node_events(&c, &name)
                    .await
                    .iter()
                    .any(|e| e.reason.as_deref() == Some("NodegateReady"))
            })
            .await;
            assert_eq!(agent.metric(series).await, Some(0.0));
        }
        // The agent runs every action a ready patch led to before it exits.
        assert!(agent.term().await.success());
        let evs = node_events(&c, &name).await;
        assert_eq!(warned(&evs), usize::from(labelled), "{name}: {evs:?}");
    }
}

/// A Node's InternalIP: RFC 2544's benchmarking range (198.18.0.0/15), so a
/// CNI on a real cluster never routes real traffic to a fake node.
fn ip(i: usize) -> String {
    format!("198.19.{}.{}", i / 250, i % 250 + 1)
}

/// A fake node's podCIDR, outside every cluster's pod range for the same reason.
fn pod_cidr(i: usize) -> String {
    format!("198.18.{}.{}/28", i / 16, (i % 16) * 16)
}

fn worker(name: &str, i: usize) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"podCIDR": pod_cidr(i), "providerID": format!("kind://docker/kind/{name}")},
        "status": {"addresses": [{"type": "InternalIP", "address": ip(i)},
                                  {"type": "Hostname", "address": name}],
                   "nodeInfo": {"bootID": format!("boot-{name}")}}
    }))
    .unwrap()
}

async fn create(api: &Api<Node>, name: &str, i: usize) -> String {
    api.create(&PostParams::default(), &worker(name, i))
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap()
}

/// The whole snapshot file (name → uid): every node the agent saw.
fn read_snapshot(state: &Path) -> Option<BTreeMap<String, String>> {
    let bytes = std::fs::read(snapshot::path_in(state)).ok()?;
    let nodes = snapshot::decode(&bytes).expect("snapshot is never torn");
    Some(nodes.into_iter().map(|n| (n.name, n.uid)).collect())
}

/// The test's own nodes in the snapshot (a real cluster has others).
fn own_snapshot(state: &Path, own: &BTreeSet<String>) -> Option<BTreeMap<String, String>> {
    let mut snap = read_snapshot(state)?;
    snap.retain(|name, _| own.contains(name));
    Some(snap)
}

/// `sh -c` hook that records each call: one log line and the stdin record.
fn hook(dir: &Path) -> String {
    format!(
        "f=$(mktemp -p {d} rec.XXXXXX) && cat > \"$f\" && echo \"$NODEGATE_NODE_NAME $NODEGATE_DELETE_SOURCE $NODEGATE_NODE_IPS $f\" >> {d}/hook.log",
        d = dir.display()
    )
}

/// Every hook call so far: (node, source, IPs, record), sorted by node.
fn hook_calls(dir: &Path) -> Vec<(String, String, String, Value)> {
    let Ok(text) = std::fs::read_to_string(dir.join("hook.log")) else {
        return Vec::new();
    };
    let mut v: Vec<_> = text
        .lines()
        .map(|l| {
            let p: Vec<&str> = l.split(' ').collect();
            let rec: Value = serde_json::from_slice(&std::fs::read(p[3]).unwrap()).unwrap();
            (p[0].to_string(), p[1].to_string(), p[2].to_string(), rec)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The hook calls for the test's own nodes.
fn own_hook_calls(dir: &Path, own: &BTreeSet<String>) -> Vec<(String, String, String, Value)> {
    let mut v = hook_calls(dir);
    v.retain(|c| own.contains(&c.0));
    v
}

/// Agent stopped; three nodes deleted (one re-created under its name);
/// agent restarted → the hook ran exactly for those three, from the
/// snapshot, with the stored records; never for live nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_prunes_exactly_the_nodes_deleted_while_down() {
    let (c, nodes) = cluster().await;
    let w: BTreeMap<usize, String> = (1..=6)
        .map(|i| (i, c.node_name(&format!("w{i}"))))
        .collect();
    let own_node = c.node_name("self");
    let own: BTreeSet<String> = w.values().chain([&own_node]).cloned().collect();
    let mut uids = BTreeMap::new();
    for (&i, name) in &w {
        uids.insert(name.clone(), create(&nodes, name, i).await);
    }
    let own_uid = create(&nodes, &own_node, 100).await;
    assert!(!own_uid.is_empty());

    let dir = tempfile::tempdir().unwrap();
    let hooks = dir.path().join("hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    let state = dir.path().join("state");
    let hook_cmd = hook(&hooks);
    let args = [
        "--on-node-delete",
        hook_cmd.as_str(),
        "--prune-source=nodes",
        "--taint-on-shutdown=false",
    ];

    let mut agent = Agent::start(&c, &own_node, &state, &args).await;
    eventually("/readyz after the first list", || agent.ready()).await;
    eventually("snapshot of the six workers", || async {
        own_snapshot(&state, &own).as_ref() == Some(&uids)
    })
    .await;
    assert!(agent.term().await.success());
    assert!(
        own_hook_calls(&hooks, &own).is_empty(),
        "first start: nothing pruned"
    );

    // While the agent is down.
    for i in 2..=4 {
        nodes
            .delete(&w[&i], &DeleteParams::default())
            .await
            .unwrap();
    }
    let new_w4 = create(&nodes, &w[&4], 44).await;
    assert_ne!(new_w4, uids[&w[&4]]);

    let mut agent = Agent::start(&c, &own_node, &state, &args).await;
    let mut want_live = uids.clone();
    want_live.remove(&w[&2]);
    want_live.remove(&w[&3]);
    want_live.insert(w[&4].clone(), new_w4.clone());
    // The rewritten snapshot means the first list was processed in full.
    eventually("snapshot rewritten with the live set", || async {
        own_snapshot(&state, &own).as_ref() == Some(&want_live)
    })
    .await;
    // w4 was re-created under its name: its old incarnation is held.
    eventually("two hook runs, w4 held", || async {
        own_hook_calls(&hooks, &own).len() >= 2
            && agent
                .metric("nodegate_agent_prune_confirmations_total{result=\"conflict_name\"}")
                .await
                .is_some_and(|v| v >= 1.0)
    })
    .await;
    let calls = own_hook_calls(&hooks, &own);
    let got: Vec<(&str, &str, &str, &str)> = calls
        .iter()
        .map(|(n, s, ips, rec)| {
            (
                n.as_str(),
                s.as_str(),
                ips.as_str(),
                rec["uid"].as_str().unwrap(),
            )
        })
        .collect();
    let ips: Vec<String> = (2..=3).map(ip).collect();
    let want: Vec<(&str, &str, &str, &str)> = (2..=3)
        .zip(&ips)
        .map(|(i, ip)| {
            (
                w[&i].as_str(),
                "snapshot",
                ip.as_str(),
                uids[&w[&i]].as_str(),
            )
        })
        .collect();
    assert_eq!(got, want);
    // The full stored record went to the hook.
    assert_eq!(calls[0].3["podCIDRs"], json!([pod_cidr(2)]));
    assert_eq!(
        calls[0].3["providerID"],
        format!("kind://docker/kind/{}", w[&2])
    );
    assert_eq!(calls[0].3["bootID"], format!("boot-{}", w[&2]));
    // The counter counts every snapshot prune the hook ran (on a real
    // cluster that may include other tests' nodes deleted meanwhile).
    eventually(
        "pruned_nodes_total{source=snapshot} = snapshot hook runs",
        || async {
            let runs = hook_calls(&hooks)
                .iter()
                .filter(|c| c.1 == "snapshot")
                .count();
            agent
                .metric("nodegate_agent_pruned_nodes_total{source=\"snapshot\"}")
                .await
                == Some(runs as f64)
        },
    )
    .await;

    // A live deletion is dispatched from the watch.
    nodes
        .delete(&w[&5], &DeleteParams::default())
        .await
        .unwrap();
    eventually("watch deletion hook", || async {
        own_hook_calls(&hooks, &own).len() == 3
    })
    .await;
    let calls = own_hook_calls(&hooks, &own);
    let w5 = calls.iter().find(|c| c.0 == w[&5]).expect("w5 hook");
    assert_eq!((w5.1.as_str(), w5.2.as_str()), ("watch", ip(5).as_str()));
    assert!(
        calls
            .iter()
            .all(|c| ![&w[&1], &w[&4], &w[&6], &own_node].contains(&&c.0)),
        "never for live nodes or the own node: {calls:?}"
    );
    assert!(agent.term().await.success());
}

/// A corrupt snapshot is moved aside and counted; the agent keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_snapshot_is_moved_aside() {
    let (c, nodes) = cluster().await;
    let (w1_name, own_node) = (c.node_name("w1"), c.node_name("self"));
    let own = BTreeSet::from([w1_name.clone(), own_node.clone()]);
    let w1 = create(&nodes, &w1_name, 1).await;
    create(&nodes, &own_node, 100).await;

    let dir = tempfile::tempdir().unwrap();
    let hooks = dir.path().join("hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let garbage = br#"{"version":1,"nodes":[{"name":"gone","uid":"#;
    std::fs::write(snapshot::path_in(&state), garbage).unwrap();

    let hook_cmd = hook(&hooks);
    let mut agent = Agent::start(
        &c,
        &own_node,
        &state,
        &[
            "--on-node-delete",
            hook_cmd.as_str(),
            "--prune-source=nodes",
        ],
    )
    .await;
    eventually("ready", || agent.ready()).await;
    eventually("fresh snapshot", || async {
        own_snapshot(&state, &own) == Some(BTreeMap::from([(w1_name.clone(), w1.clone())]))
    })
    .await;
    let aside: Vec<PathBuf> = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("nodes.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "moved aside once");
    assert_eq!(std::fs::read(&aside[0]).unwrap(), garbage);
    assert!(agent.logged("WARN") && agent.logged("unusable snapshot moved aside"));
    assert_eq!(
        agent.metric("nodegate_agent_snapshot_corrupt_total").await,
        Some(1.0)
    );
    assert!(
        own_hook_calls(&hooks, &own).is_empty(),
        "treated as empty: nothing pruned"
    );
    // Still working: a live deletion is handled.
    nodes
        .delete(&w1_name, &DeleteParams::default())
        .await
        .unwrap();
    eventually("hook after the corrupt start", || async {
        own_hook_calls(&hooks, &own).len() == 1
    })
    .await;
    assert!(agent.term().await.success());
}

fn temp_files(state: &Path) -> usize {
    std::fs::read_dir(state)
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(".nodes.json.tmp-")
                })
                .count()
        })
        .unwrap_or(0)
}

/// kill -9 while snapshots are being written under node churn: the file is
/// always a complete snapshot, never torn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_snapshot_writes_never_tears_the_file() {
    const N: usize = 600;
    let (c, nodes) = cluster().await;
    let names: Vec<String> = (0..N).map(|i| c.node_name(&format!("w{i:03}"))).collect();
    let own: BTreeSet<String> = names.iter().cloned().collect();
    for (i, name) in names.iter().enumerate() {
        create(&nodes, name, i).await;
    }
    let own_node = c.node_name("self");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");

    // Churn: label changes keep the set dirty, so writes never stop.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (nodes, stop, names) = (nodes.clone(), stop.clone(), names.clone());
        tokio::spawn(async move {
            let mut k = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let name = &names[k % N];
                let patch = json!({"metadata": {"labels": {"churn": k.to_string()}}});
                let _ = nodes
                    .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                    .await;
                k += 1;
            }
        })
    };

    let mut mid_write = 0;
    for round in 0..8u32 {
        let mut agent = Agent::start(
            &c,
            &own_node,
            &state,
            &[
                "--snapshot-interval",
                "5ms",
                "--taint-on-shutdown=false",
                "--on-node-delete=true",
                "--prune-source=nodes",
            ],
        )
        .await;
        let series = "nodegate_agent_snapshot_write_duration_seconds_count";
        let want = f64::from(3 + round % 3);
        eventually("snapshot writes under way", || async {
            agent.metric(series).await.unwrap_or(0.0) >= want
        })
        .await;
        // Aim the kill at a write in progress: its temp file exists.
        eventually("a write in progress", || async { temp_files(&state) > 0 }).await;
        agent.kill9().await;
        let snap = own_snapshot(&state, &own).expect("a snapshot exists");
        assert_eq!(snap.len(), N, "round {round}: complete snapshot");
        // A temp file left behind means the kill landed mid-write.
        mid_write += temp_files(&state);
    }
    eprintln!("kills that landed mid-write: {mid_write} of 8");
    assert!(
        mid_write > 0,
        "no kill landed mid-write: the test proved nothing"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    churn.await.unwrap();
    let corrupt = std::fs::read_dir(&state)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains("corrupt")
        })
        .count();
    assert_eq!(corrupt, 0, "no restart ever found a torn snapshot");
}

/// A deletion whose handler had not finished when the agent was killed is
/// still in the snapshot, so the restarted agent runs it (source snapshot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_interrupted_by_a_crash_is_retried_after_restart() {
    let (c, nodes) = cluster().await;
    let [w1_name, w2_name, w3_name, own_node] = ["w1", "w2", "w3", "self"].map(|b| c.node_name(b));
    let own = BTreeSet::from([
        w1_name.clone(),
        w2_name.clone(),
        w3_name.clone(),
        own_node.clone(),
    ]);
    let w1 = create(&nodes, &w1_name, 1).await;
    let w2 = create(&nodes, &w2_name, 2).await;
    create(&nodes, &own_node, 100).await;

    let dir = tempfile::tempdir().unwrap();
    let hooks = dir.path().join("hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    let state = dir.path().join("state");
    let pid_file = hooks.join("blocked.pid");
    // Blocks on w1 only: on a real cluster other nodes come and go.
    let blocking = format!(
        "[ \"$NODEGATE_NODE_NAME\" != {w1_name} ] || {{ echo $$ > {p}.tmp && mv {p}.tmp {p} && exec sleep 60; }}",
        p = pid_file.display()
    );
    let mut agent = Agent::start(
        &c,
        &own_node,
        &state,
        &[
            "--on-node-delete",
            &blocking,
            "--prune-source=nodes",
            "--on-node-delete-timeout",
            "120s",
        ],
    )
    .await;
    eventually("first snapshot", || async {
        own_snapshot(&state, &own).is_some_and(|s| s.len() == 2)
    })
    .await;

    nodes
        .delete(&w1_name, &DeleteParams::default())
        .await
        .unwrap();
    eventually("hook for w1 started", || async { pid_file.exists() }).await;
    let w3 = create(&nodes, &w3_name, 3).await;
    eventually("snapshot written after the deletion", || async {
        read_snapshot(&state).is_some_and(|s| s.contains_key(&w3_name))
    })
    .await;
    let snap = read_snapshot(&state).unwrap();
    assert_eq!(
        snap.get(&w1_name),
        Some(&w1),
        "unhandled deletion kept: {snap:?}"
    );

    agent.kill9().await;
    let hook_pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _ = kill(Pid::from_raw(hook_pid), Signal::SIGKILL);

    let hook_cmd = hook(&hooks);
    let mut agent = Agent::start(
        &c,
        &own_node,
        &state,
        &[
            "--on-node-delete",
            hook_cmd.as_str(),
            "--prune-source=nodes",
        ],
    )
    .await;
    eventually("w1 handled after restart", || async {
        own_hook_calls(&hooks, &own).len() == 1
    })
    .await;
    let calls = own_hook_calls(&hooks, &own);
    assert_eq!(
        (calls[0].0.as_str(), calls[0].1.as_str()),
        (w1_name.as_str(), "snapshot")
    );
    assert_eq!(calls[0].3["uid"], w1.as_str());
    eventually("w1 leaves the snapshot once handled", || async {
        own_snapshot(&state, &own)
            == Some(BTreeMap::from([
                (w2_name.clone(), w2.clone()),
                (w3_name.clone(), w3.clone()),
            ]))
    })
    .await;
    assert!(agent.term().await.success());
}

/// `--continuous`: the taint goes back after the failure threshold while the
/// network agent is down, and comes off again when it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_mode_retaints_while_down() {
    let (c, nodes) = cluster().await;
    let node_c = c.node_name("node-c");
    let kubelet = c.kubelet(&node_c).await.unwrap();
    kubelet.register().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("ready");
    std::fs::write(&probe, b"ok").unwrap();
    let probe_arg = probe.to_str().unwrap().to_string();
    let args = [
        "--continuous",
        "--probe-file",
        probe_arg.as_str(),
        "--probe-period",
        "100ms",
        "--failure-threshold",
        "2",
    ];
    let mut agent = Agent::start(&c, &node_c, &dir.path().join("state"), &args).await;
    eventually("ready", || async {
        let n = node(&nodes, &node_c).await;
        !our_taint(&n) && ready_boot_id(&n).as_deref() == Some(kubelet.boot_id())
    })
    .await;
    assert!(
        agent.ready().await,
        "no deletion handler: gate only, ready without a node list"
    );

    std::fs::remove_file(&probe).unwrap();
    eventually("re-tainted while down", || async {
        our_taint(&node(&nodes, &node_c).await)
    })
    .await;
    // The agent counts the write once the API server has answered it, which
    // can be after a reader sees the taint.
    eventually("re-taint counted, not ready", || async {
        agent
            .metric("nodegate_agent_taint_adds_total{reason=\"continuous\"}")
            .await
            == Some(1.0)
            && agent.metric("nodegate_agent_ready").await == Some(0.0)
    })
    .await;

    std::fs::write(&probe, b"ok").unwrap();
    eventually("untainted when back", || async {
        !our_taint(&node(&nodes, &node_c).await)
    })
    .await;
    eventually("removal counted", || async {
        agent.metric("nodegate_agent_taint_removals_total").await == Some(2.0)
    })
    .await;
    assert!(!std::fs::exists(dir.path().join("state/nodes.json")).unwrap());
    assert!(agent.term().await.success());
}

/// `--probe-pod`: only a Ready pod with the labels on this node counts, and
/// the agent reacts to the pod watch (the probe period is an hour).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_probe_follows_the_ready_pod_on_this_node() {
    use k8s_openapi::api::core::v1::Pod;
    // In the namespace the probe-pod component grants (kube-system), with a
    // label only this test uses: on a real cluster a pod labelled like the
    // real network agent's would be adopted by its DaemonSet.
    const NS: &str = "kube-system";
    let (c, nodes) = cluster().await;
    let node_p = c.node_name("node-p");
    let node_q = c.name("node-q");
    let app = c.name("cilium");
    let kubelet = c.kubelet(&node_p).await.unwrap();
    kubelet.register().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(c.client(users::ADMIN).await.unwrap(), NS);
    let pod = |base: &str, node: &str, labels: Value| -> (String, Pod) {
        let name = c.name(base);
        c.delete_on_drop("pods", NS, &name);
        let pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "cilium"}]}
        }))
        .unwrap();
        (name, pod)
    };
    let ready = json!({"status": {"phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}]}});
    let pp = PatchParams::default();
    // Ready, right labels, other node; and ready on this node, other labels.
    for (base, node, labels) in [
        ("cilium-elsewhere", &node_q, json!({"k8s-app": app})),
        ("other-app", &node_p, json!({"k8s-app": "other"})),
    ] {
        let (name, p) = pod(base, node, labels);
        pods.create(&PostParams::default(), &p).await.unwrap();
        pods.patch_status(&name, &pp, &Patch::Merge(ready.clone()))
            .await
            .unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let probe_pod = format!("{NS}/k8s-app={app}");
    let args = ["--probe-pod", probe_pod.as_str(), "--probe-period", "1h"];
    let mut agent = Agent::start(&c, &node_p, &dir.path().join("state"), &args).await;
    let series = r#"nodegate_agent_probe_results_total{kind="pod",index="0",result="fail"}"#;
    eventually("tainted", || async {
        our_taint(&node(&nodes, &node_p).await)
    })
    .await;
    eventually("first round failed", || async {
        agent.metric(series).await.unwrap_or(0.0) >= 1.0
    })
    .await;

    // The right pod, not Ready yet: its watch event runs a failing round.
    let (cilium_p, p) = pod("cilium-p", &node_p, json!({"k8s-app": app}));
    pods.create(&PostParams::default(), &p).await.unwrap();
    eventually("round on the pod event", || async {
        agent.metric(series).await.unwrap_or(0.0) >= 2.0
    })
    .await;
    assert!(our_taint(&node(&nodes, &node_p).await), "pod not Ready yet");

    pods.patch_status(&cilium_p, &pp, &Patch::Merge(ready))
        .await
        .unwrap();
    eventually("untainted once the pod is Ready", || async {
        !our_taint(&node(&nodes, &node_p).await)
    })
    .await;
    assert!(agent.term().await.success());
}

/// A burst of Node events is coalesced: at most one snapshot write per
/// `--snapshot-interval`, not one per event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_node_events_is_coalesced_into_few_writes() {
    const BURST: usize = 200;
    let (c, nodes) = cluster().await;
    let own_node = c.node_name("self");
    create(&nodes, &own_node, 1000).await;
    let names: Vec<String> = (0..BURST)
        .map(|i| c.node_name(&format!("b{i:03}")))
        .collect();
    let own: BTreeSet<String> = names.iter().cloned().collect();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut agent = Agent::start(
        &c,
        &own_node,
        &state,
        &[
            "--snapshot-interval",
            "1s",
            "--on-node-delete=true",
            "--prune-source=nodes",
        ],
    )
    .await;
    let writes = "nodegate_agent_snapshot_write_duration_seconds_count";
    eventually("first snapshot", || async {
        agent.metric(writes).await.unwrap_or(0.0) >= 1.0
    })
    .await;
    let before = agent.metric(writes).await.unwrap();
    let started = std::time::Instant::now();
    for (i, name) in names.iter().enumerate() {
        create(&nodes, name, i).await;
    }
    eventually("all burst nodes in the snapshot", || async {
        own_snapshot(&state, &own).is_some_and(|s| s.len() == BURST)
    })
    .await;
    let extra = agent.metric(writes).await.unwrap() - before;
    // One write per started second of the burst, plus the one in flight.
    let bound = started.elapsed().as_secs_f64().ceil() + 1.0;
    assert!(
        extra >= 1.0 && extra <= bound,
        "{BURST} events cost {extra} writes (bound {bound})"
    );
    // The gauge is the snapshot's size (on a real cluster: other nodes too).
    eventually("snapshot_nodes = nodes in the snapshot file", || async {
        let in_file = read_snapshot(&state).map_or(0, |s| s.len());
        agent.metric("nodegate_agent_snapshot_nodes").await == Some(in_file as f64)
    })
    .await;
    assert!(agent.term().await.success());
}

/// Records every dispatched deletion (an embedding simulator's handler).
#[derive(Default)]
struct Recording(Mutex<Vec<(String, String, nodegate_agent::handler::DeleteSource)>>);

impl nodegate_agent::handler::NodeDeleteHandler for Recording {
    fn name(&self) -> &str {
        "recording"
    }

    fn handle<'a>(
        &'a self,
        node: &'a nodegate_agent::record::NodeRecord,
        source: nodegate_agent::handler::DeleteSource,
    ) -> futures::future::BoxFuture<'a, Result<(), nodegate_agent::handler::HandlerError>> {
        self.0
            .lock()
            .unwrap()
            .push((node.name.clone(), node.uid.clone(), source));
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test]
async fn in_process_handlers_get_the_deletions_missed_while_down() {
    use clap::Parser;
    use nodegate_agent::handler::DeleteSource;
    let (c, nodes) = cluster().await;
    let [own_node, keep_name, gone_name] = ["own", "keep", "gone"].map(|b| c.node_name(b));
    let own = BTreeSet::from([own_node.clone(), keep_name.clone(), gone_name.clone()]);
    create(&nodes, &own_node, 1).await;
    let keep = create(&nodes, &keep_name, 2).await;
    let gone = create(&nodes, &gone_name, 3).await;
    let state = tempfile::tempdir().unwrap();
    let args = || {
        nodegate_agent::Args::try_parse_from([
            "nodegate-agent".as_ref(),
            "--node-name".as_ref(),
            own_node.as_ref(),
            "--state-dir".as_ref(),
            state.path().as_os_str(),
            "--snapshot-interval".as_ref(),
            "100ms".as_ref(),
            "--admin-listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--prune-source=nodes".as_ref(),
        ])
        .unwrap()
    };
    let client = c.agent_client(&own_node).await.unwrap();
    let run = |rec: Arc<Recording>| {
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(nodegate_agent::run_with_handlers(
            args(),
            client.clone(),
            vec![rec as Arc<dyn nodegate_agent::handler::NodeDeleteHandler>],
            async move {
                let _ = rx.await;
            },
        ));
        (stop, task)
    };

    let first = Arc::new(Recording::default());
    let (stop, task) = run(first.clone());
    let want: BTreeMap<String, String> = [
        (keep_name.clone(), keep.clone()),
        (gone_name.clone(), gone.clone()),
    ]
    .into();
    eventually("first snapshot", || async {
        own_snapshot(state.path(), &own).as_ref() == Some(&want)
    })
    .await;
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();

    nodes
        .delete(&gone_name, &DeleteParams::default())
        .await
        .unwrap();
    let second = Arc::new(Recording::default());
    let (stop, task) = run(second.clone());
    let want: BTreeMap<String, String> = [(keep_name.clone(), keep)].into();
    eventually("snapshot without the deleted node", || async {
        own_snapshot(state.path(), &own).as_ref() == Some(&want)
    })
    .await;
    let own_calls = |r: &Recording| {
        let mut v = r.0.lock().unwrap().clone();
        v.retain(|(name, _, _)| own.contains(name));
        v
    };
    assert!(own_calls(&first).is_empty());
    assert_eq!(
        own_calls(&second),
        vec![(gone_name.clone(), gone, DeleteSource::Snapshot)]
    );
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

// ---- Pruning from the node roster (--prune-source=roster, the default) ----

/// Shards of the tests' rosters (few, so each holds several test nodes).
const SHARDS: u32 = 4;

/// The test's own roster, unique per test on a real cluster, deleted after.
fn roster(c: &Cluster) -> String {
    let name = c.name("roster");
    for i in 0..SHARDS {
        c.delete_on_drop("configmaps", "nodegate", &format!("{name}-{i}"));
    }
    c.delete_on_drop("leases", "nodegate", &name);
    name
}

fn shards_api(nodes: &Api<Node>) -> Api<k8s_openapi::api::core::v1::ConfigMap> {
    Api::namespaced(nodes.clone().into_client(), "nodegate")
}

/// The test's own nodes in the roster's current shards (name → uid), or
/// `None` while it is not complete.
async fn roster_members(
    nodes: &Api<Node>,
    roster: &str,
    own: &BTreeSet<String>,
) -> Option<BTreeMap<String, String>> {
    use nodegate_roster::shard;
    let lp = ListParams::default().labels(&shard::selector(roster));
    let cms = shards_api(nodes).list(&lp).await.ok()?;
    let shards: Vec<shard::Shard> = cms
        .items
        .iter()
        .filter_map(|cm| shard::decode(roster, cm).ok())
        .collect();
    let epoch = shards.iter().map(|s| s.epoch).max()?;
    let current: Vec<&shard::Shard> = shards.iter().filter(|s| s.epoch == epoch).collect();
    if current.len() != SHARDS as usize {
        return None;
    }
    Some(
        current
            .iter()
            .flat_map(|s| s.nodes.values())
            .filter(|r| own.contains(&r.name))
            .map(|r| (r.name.clone(), r.uid.clone()))
            .collect(),
    )
}

fn roster_agent_args<'a>(hook_cmd: &'a str, roster: &'a str) -> [&'a str; 5] {
    [
        "--on-node-delete",
        hook_cmd,
        "--roster-name",
        roster,
        "--taint-on-shutdown=false",
    ]
}

/// Agent stopped; three nodes deleted (one re-created under its name) and
/// the roster updated; agent restarted → the hook ran exactly for those
/// three, source `snapshot`, with their old uids and the roster's records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roster_restart_prunes_exactly_the_nodes_deleted_while_down() {
    let (c, nodes) = cluster().await;
    let roster = roster(&c);
    let w: BTreeMap<usize, String> = (1..=5)
        .map(|i| (i, c.node_name(&format!("rw{i}"))))
        .collect();
    let own_node = c.node_name("rself");
    let own: BTreeSet<String> = w.values().chain([&own_node]).cloned().collect();
    let mut uids = BTreeMap::new();
    for (&i, name) in &w {
        uids.insert(name.clone(), create(&nodes, name, i).await);
    }
    create(&nodes, &own_node, 100).await;
    let dir = tempfile::tempdir().unwrap();
    let (hooks, state) = (dir.path().join("hooks"), dir.path().join("state"));
    std::fs::create_dir_all(&hooks).unwrap();
    let hook_cmd = hook(&hooks);
    let mut publisher = Agent::publisher(&c, &roster, 0, dir.path()).await;
    let args = roster_agent_args(&hook_cmd, &roster);

    let mut agent = Agent::start(&c, &own_node, &state, &args).await;
    eventually("snapshot of the five workers from the roster", || async {
        own_snapshot(&state, &own).as_ref() == Some(&uids)
    })
    .await;
    assert_eq!(
        agent.metric("nodegate_agent_roster_complete").await,
        Some(1.0)
    );
    assert!(agent.term().await.success());

    for i in 2..=4 {
        nodes
            .delete(&w[&i], &DeleteParams::default())
            .await
            .unwrap();
    }
    let new_w4 = create(&nodes, &w[&4], 44).await;
    let mut want_live = uids.clone();
    want_live.remove(&w[&2]);
    want_live.remove(&w[&3]);
    want_live.insert(w[&4].clone(), new_w4.clone());
    let mut in_roster = want_live.clone();
    in_roster.insert(own_node.clone(), String::new());
    eventually("the roster shows the deletions", || async {
        roster_members(&nodes, &roster, &own)
            .await
            .is_some_and(|m| m.keys().eq(in_roster.keys()) && m.get(&w[&4]) == Some(&new_w4))
    })
    .await;

    let mut agent = Agent::start(&c, &own_node, &state, &args).await;
    eventually("snapshot rewritten with the live set", || async {
        own_snapshot(&state, &own).as_ref() == Some(&want_live)
    })
    .await;
    // w4 was re-created under its name: its old incarnation is held.
    eventually("two hook runs, w4 held", || async {
        own_hook_calls(&hooks, &own).len() >= 2
            && agent
                .metric("nodegate_agent_prune_confirmations_total{result=\"conflict_name\"}")
                .await
                .is_some_and(|v| v >= 1.0)
    })
    .await;
    let calls = own_hook_calls(&hooks, &own);
    let got: Vec<(&str, &str, &str, &str)> = calls
        .iter()
        .map(|(n, s, ips, rec)| {
            (
                n.as_str(),
                s.as_str(),
                ips.as_str(),
                rec["uid"].as_str().unwrap(),
            )
        })
        .collect();
    let ips: Vec<String> = (2..=3).map(ip).collect();
    let want: Vec<(&str, &str, &str, &str)> = (2..=3)
        .zip(&ips)
        .map(|(i, ip)| {
            (
                w[&i].as_str(),
                "snapshot",
                ip.as_str(),
                uids[&w[&i]].as_str(),
            )
        })
        .collect();
    assert_eq!(got, want);
    // The roster's record: what a handler cleans up by, without labels or boot ID.
    assert_eq!(calls[0].3["podCIDRs"], json!([pod_cidr(2)]));
    assert_eq!(
        calls[0].3["providerID"],
        format!("kind://docker/kind/{}", w[&2])
    );
    assert!(calls[0].3.get("labels").is_none() && calls[0].3.get("bootID").is_none());
    assert!(agent.term().await.success());
    assert!(publisher.term().await.success());
}

/// Two publishers; the leader is SIGKILLed in the middle of a churn of
/// joins and deletes (each node listed in the roster before it leaves, so
/// the agent knew it). The standby takes over after the lease expires; the
/// running agent's hook ran exactly once for every deleted node (its uid),
/// never for a live one, and its snapshot ends equal to the live set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roster_leader_killed_during_churn_loses_nothing() {
    const CHURN: usize = 12;
    let (c, nodes) = cluster().await;
    let roster = roster(&c);
    let dir = tempfile::tempdir().unwrap();
    let mut pubs = [
        Agent::publisher(&c, &roster, 0, dir.path()).await,
        Agent::publisher(&c, &roster, 1, dir.path()).await,
    ];
    let own_node = c.node_name("cself");
    create(&nodes, &own_node, 250).await;
    let mut names: Vec<String> = (0..CHURN * 2)
        .map(|i| c.node_name(&format!("c{i:02}")))
        .collect();
    names.push(own_node.clone());
    let own: BTreeSet<String> = names.iter().cloned().collect();
    let mut live: BTreeMap<String, String> = BTreeMap::new();
    for (i, name) in names.iter().take(4).enumerate() {
        live.insert(name.clone(), create(&nodes, name, 200 + i).await);
    }
    let (hooks, state) = (dir.path().join("hooks"), dir.path().join("state"));
    std::fs::create_dir_all(&hooks).unwrap();
    let hook_cmd = hook(&hooks);
    let mut agent = Agent::start(
        &c,
        &own_node,
        &state,
        &roster_agent_args(&hook_cmd, &roster),
    )
    .await;
    eventually("first snapshot from the roster", || async {
        own_snapshot(&state, &own).as_ref() == Some(&live)
    })
    .await;

    let mut deleted: BTreeSet<(String, String)> = BTreeSet::new();
    let mut killed = None;
    for k in 0..CHURN {
        let joining = &names[4 + k];
        let uid = create(&nodes, joining, 210 + k).await;
        live.insert(joining.clone(), uid.clone());
        // Each node is in the roster before it leaves: the agent knew it, so
        // its deletion must reach the hook (across the failover too).
        eventually("the joining node in the roster", || async {
            roster_members(&nodes, &roster, &own)
                .await
                .is_some_and(|m| m.get(joining) == Some(&uid))
        })
        .await;
        let leaving = names[k].clone();
        let uid = live.remove(&leaving).unwrap();
        nodes
            .delete(&leaving, &DeleteParams::default())
            .await
            .unwrap();
        deleted.insert((leaving, uid));
        if k == CHURN / 2 {
            let mut leader = None;
            for (i, p) in pubs.iter().enumerate() {
                if p.metric("nodegate_roster_leader").await == Some(1.0) {
                    leader = Some(i);
                }
            }
            let i = leader.expect("one publisher leads");
            pubs[i].kill9().await;
            killed = Some(i);
        }
    }
    let standby = 1 - killed.unwrap();
    eventually("the standby leads", || async {
        pubs[standby].metric("nodegate_roster_leader").await == Some(1.0)
    })
    .await;
    eventually("snapshot equals the live set", || async {
        own_snapshot(&state, &own).as_ref() == Some(&live)
    })
    .await;
    eventually("a hook run per deleted node", || async {
        own_hook_calls(&hooks, &own).len() >= deleted.len()
    })
    .await;
    let calls: Vec<(String, String)> = own_hook_calls(&hooks, &own)
        .iter()
        .map(|(n, _, _, rec)| (n.clone(), rec["uid"].as_str().unwrap().to_string()))
        .collect();
    let once: BTreeSet<(String, String)> = calls.iter().cloned().collect();
    assert_eq!(once.len(), calls.len(), "a node pruned twice: {calls:?}");
    assert_eq!(once, deleted, "lost or false prunes");
    assert!(agent.term().await.success());
    assert!(pubs[standby].term().await.success());
}

/// While the agent restarts, one shard is rewritten under a new epoch
/// without its nodes, as a rebuild in progress would leave it. The agent
/// sees an incomplete roster and prunes nothing, not even the nodes missing
/// from the rewritten shard; once the publisher has rewritten every shard,
/// exactly the node deleted meanwhile is pruned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roster_partial_view_during_agent_restart_prunes_nothing() {
    use nodegate_roster::shard;
    let (c, nodes) = cluster().await;
    let roster = roster(&c);
    let w: Vec<String> = (0..8).map(|i| c.node_name(&format!("p{i}"))).collect();
    let own_node = c.node_name("pself");
    let own: BTreeSet<String> = w.iter().chain([&own_node]).cloned().collect();
    let mut uids = BTreeMap::new();
    for (i, name) in w.iter().enumerate() {
        uids.insert(name.clone(), create(&nodes, name, 300 + i).await);
    }
    create(&nodes, &own_node, 400).await;
    let dir = tempfile::tempdir().unwrap();
    let (hooks, state) = (dir.path().join("hooks"), dir.path().join("state"));
    std::fs::create_dir_all(&hooks).unwrap();
    let hook_cmd = hook(&hooks);
    let args = roster_agent_args(&hook_cmd, &roster);
    let mut publisher = Agent::publisher(&c, &roster, 0, dir.path()).await;
    let mut agent = Agent::start(&c, &own_node, &state, &args).await;
    eventually("first snapshot", || async {
        own_snapshot(&state, &own).as_ref() == Some(&uids)
    })
    .await;
    assert!(agent.term().await.success());
    assert!(publisher.term().await.success());

    // Deleted while everything is down.
    let gone = w[0].clone();
    nodes.delete(&gone, &DeleteParams::default()).await.unwrap();
    // A shard holding another test node, rewritten empty under a new epoch.
    let api = shards_api(&nodes);
    let victim = w[1..]
        .iter()
        .map(|n| shard::shard_of(n, SHARDS))
        .filter(|&i| i != shard::shard_of(&gone, SHARDS))
        // The highest: the publisher writes it last, the moment a reader
        // would see the epoch complete if the publisher adopted it.
        .max()
        .expect("test nodes in two shards");
    let missing: Vec<String> = w[1..]
        .iter()
        .filter(|n| shard::shard_of(n, SHARDS) == victim)
        .cloned()
        .collect();
    let mut cm = api.get(&shard::name_of(&roster, victim)).await.unwrap();
    let epoch = shard::decode(&roster, &cm).unwrap().epoch;
    cm.data = shard::config_map(
        "nodegate",
        &roster,
        victim,
        shard::encode(epoch + 1, victim, SHARDS, []),
    )
    .data;
    api.replace(
        &shard::name_of(&roster, victim),
        &PostParams::default(),
        &cm,
    )
    .await
    .unwrap();

    let mut agent = Agent::start(&c, &own_node, &state, &args).await;
    eventually("the agent holds every shard", || async {
        agent.metric("nodegate_agent_roster_shards").await == Some(f64::from(SHARDS))
    })
    .await;
    assert_eq!(
        agent.metric("nodegate_agent_roster_complete").await,
        Some(0.0)
    );
    assert!(!agent.ready().await, "not ready before a complete view");
    assert!(
        own_hook_calls(&hooks, &own).is_empty(),
        "nothing pruned from a partial view"
    );
    assert_eq!(
        own_snapshot(&state, &own).as_ref(),
        Some(&uids),
        "snapshot kept as it was"
    );

    let mut publisher = Agent::publisher(&c, &roster, 0, dir.path()).await;
    let mut want = uids.clone();
    want.remove(&gone);
    eventually("snapshot equals the live set", || async {
        own_snapshot(&state, &own).as_ref() == Some(&want)
    })
    .await;
    eventually("one hook run", || async {
        !own_hook_calls(&hooks, &own).is_empty()
    })
    .await;
    let calls = own_hook_calls(&hooks, &own);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        (calls[0].0.as_str(), calls[0].1.as_str()),
        (gone.as_str(), "snapshot")
    );
    assert_eq!(calls[0].3["uid"], uids[&gone].as_str());
    assert!(
        !missing.is_empty()
            && missing
                .iter()
                .all(|m| own_snapshot(&state, &own).unwrap().contains_key(m))
    );
    assert!(agent.term().await.success());
    assert!(publisher.term().await.success());
}

/// Deletion-confirmation GETs the agent made so far (every result).
async fn confirmations(agent: &Agent) -> f64 {
    let mut n = 0.0;
    for r in ["gone", "live", "error"] {
        let series = format!("nodegate_agent_prune_confirmations_total{{result=\"{r}\"}}");
        n += agent.metric(&series).await.unwrap_or(0.0);
    }
    n
}

/// Who writes a test's own roster: the publisher's account on the emulator;
/// on a real cluster the installed RBAC and policies let that account write
/// only the installed roster's names (e2e/tests/roster_writers.rs proves
/// them), so the admin, whom the writers' policy exempts.
fn roster_writer(c: &Cluster) -> &'static str {
    if c.is_real() {
        users::ADMIN
    } else {
        users::ROSTER
    }
}

/// Writes `body` into shard 0 of `roster` as `user`, the way an attacker
/// with ConfigMap write access in the namespace would (again on a conflict
/// with the publisher).
async fn forge_shard(c: &Cluster, user: &str, roster: &str, body: &str) {
    use nodegate_roster::shard;
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(c.client(user).await.unwrap(), "nodegate");
    let name = shard::name_of(roster, 0);
    for _ in 0..10 {
        let mut cm = api.get(&name).await.unwrap();
        cm.data = Some(BTreeMap::from([(
            shard::DATA_KEY.to_string(),
            body.to_string(),
        )]));
        match api.replace(&name, &PostParams::default(), &cm).await {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("{user} cannot write {name}: {e}"),
        }
    }
    panic!("{name}: conflicts on every attempt");
}

/// Roster poisoning, as an attacker runs it: with the publisher down, shard
/// 0 is overwritten with the one-shard empty roster — with the u64::MAX
/// epoch, then with an epoch a publisher could have written (a complete,
/// empty roster) — by the roster's own service account and by a namespace
/// editor (the agent cannot tell writers apart; the emulator has no `edit`
/// role, so the admin makes the editor's request). No handler runs for a
/// live node; the mass deletion is held and refused after a GET. The
/// publisher restarted recovers from the forged epochs, and a later real
/// deletion is pruned exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roster_poisoned_shard_prunes_no_live_node() {
    let (c, nodes) = cluster().await;
    let roster = roster(&c);
    let w: Vec<String> = (0..8).map(|i| c.node_name(&format!("x{i}"))).collect();
    let own_node = c.node_name("xself");
    let own: BTreeSet<String> = w.iter().chain([&own_node]).cloned().collect();
    let mut uids = BTreeMap::new();
    for (i, name) in w.iter().enumerate() {
        uids.insert(name.clone(), create(&nodes, name, 500 + i).await);
    }
    create(&nodes, &own_node, 600).await;
    let dir = tempfile::tempdir().unwrap();
    let (hooks, state) = (dir.path().join("hooks"), dir.path().join("state"));
    std::fs::create_dir_all(&hooks).unwrap();
    let hook_cmd = hook(&hooks);
    let mut publisher = Agent::publisher(&c, &roster, 0, dir.path()).await;
    let mut agent = Agent::start(
        &c,
        &own_node,
        &state,
        &roster_agent_args(&hook_cmd, &roster),
    )
    .await;
    eventually("first snapshot from the roster", || async {
        own_snapshot(&state, &own).as_ref() == Some(&uids)
    })
    .await;
    // The publisher down: nobody repairs the shard while the attack runs.
    assert!(publisher.term().await.success());

    let metric = |name: &'static str| {
        let agent = &agent;
        async move { agent.metric(name).await.unwrap_or(0.0) }
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for (k, attacker) in [roster_writer(&c), users::ADMIN].into_iter().enumerate() {
        let rejected = metric("nodegate_agent_roster_shards_rejected_total").await;
        forge_shard(
            &c,
            attacker,
            &roster,
            r#"{"version":1,"epoch":18446744073709551615,"shard":0,"shards":1,"nodes":[]}"#,
        )
        .await;
        // Both metrics: one event updates them one after the other.
        eventually("the forged epoch rejected: roster incomplete", || async {
            metric("nodegate_agent_roster_shards_rejected_total").await > rejected
                && metric("nodegate_agent_roster_complete").await == 0.0
        })
        .await;

        let (holds, refused) = (
            metric("nodegate_agent_prune_holds_total").await,
            metric("nodegate_agent_prune_refused_total").await,
        );
        let gets = confirmations(&agent).await;
        let epoch = now + 60 + k as u64;
        forge_shard(
            &c,
            attacker,
            &roster,
            &format!(r#"{{"version":1,"epoch":{epoch},"shard":0,"shards":1,"nodes":[]}}"#),
        )
        .await;
        eventually("the empty roster held and refused", || async {
            metric("nodegate_agent_prune_holds_total").await > holds
                && metric("nodegate_agent_prune_refused_total").await > refused
                && metric("nodegate_agent_prune_pending").await == 0.0
        })
        .await;
        assert!(metric("nodegate_agent_prune_confirmations_total{result=\"live\"}").await >= 1.0);
        if !c.is_real() {
            // Alone on the emulator: every node but its own refused, after
            // a single GET.
            assert_eq!(
                confirmations(&agent).await - gets,
                1.0,
                "GETs for the forgery"
            );
            assert_eq!(
                metric("nodegate_agent_prune_refused_total").await - refused,
                w.len() as f64
            );
        }
        assert!(
            own_hook_calls(&hooks, &own).is_empty(),
            "{attacker}: a handler ran for a live node: {:?}",
            own_hook_calls(&hooks, &own)
        );
        // The refused nodes are live again in the snapshot.
        eventually("snapshot still holds every live node", || async {
            own_snapshot(&state, &own).as_ref() == Some(&uids)
        })
        .await;
    }

    // The publisher comes back and replaces the forged epoch with its own.
    let mut publisher = Agent::publisher(&c, &roster, 0, dir.path()).await;
    eventually("the roster complete again", || async {
        metric("nodegate_agent_roster_complete").await == 1.0
            && roster_members(&nodes, &roster, &own)
                .await
                .is_some_and(|m| m.len() == own.len())
    })
    .await;
    assert!(publisher.logged("leading: publishing the roster"));
    // With the publisher leading, a forged shard is repaired at once.
    let rejected = metric("nodegate_agent_roster_shards_rejected_total").await;
    forge_shard(
        &c,
        roster_writer(&c),
        &roster,
        r#"{"version":1,"epoch":18446744073709551615,"shard":0,"shards":1,"nodes":[]}"#,
    )
    .await;
    eventually("the forged shard seen, then rewritten", || async {
        metric("nodegate_agent_roster_shards_rejected_total").await > rejected
            && metric("nodegate_agent_roster_complete").await == 1.0
    })
    .await;

    // A real deletion afterwards: pruned exactly once.
    let gets = confirmations(&agent).await;
    let gone = w[3].clone();
    nodes.delete(&gone, &DeleteParams::default()).await.unwrap();
    eventually("the deleted node's hook", || async {
        !own_hook_calls(&hooks, &own).is_empty()
    })
    .await;
    let mut want = uids.clone();
    want.remove(&gone);
    eventually("snapshot equals the live set", || async {
        own_snapshot(&state, &own).as_ref() == Some(&want)
    })
    .await;
    let calls = own_hook_calls(&hooks, &own);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        (calls[0].0.as_str(), calls[0].1.as_str()),
        (gone.as_str(), "watch")
    );
    assert_eq!(calls[0].3["uid"], uids[&gone].as_str());
    assert!(metric("nodegate_agent_prune_confirmations_total{result=\"gone\"}").await >= 1.0);
    if !c.is_real() {
        assert_eq!(
            confirmations(&agent).await - gets,
            1.0,
            "one GET per deletion"
        );
    }
    assert!(agent.term().await.success());
    assert!(publisher.term().await.success());
}

/// Beside cilium-operator's node-taint controller with Cilium's Helm
/// defaults (its stand-in, `nodegate_e2e::cilium_operator`): each owns its
/// own taint key, neither removes the other's, and once the node settled
/// neither writes it again (the loop of a shared key is gone). Emulator
/// only: a real cluster runs its own Cilium, or none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beside_cilium_operator_each_owns_its_key_and_nothing_loops() {
    use k8s_openapi::api::core::v1::Pod;
    use nodegate_e2e::cilium_operator::decide::{Action, has_cilium_is_up_condition};
    use nodegate_e2e::cilium_operator::{Controller, OperatorConfig, Options};
    const CILIUM_KEY: &str = "node.cilium.io/agent-not-ready";
    let (c, nodes) = cluster().await;
    if c.is_real() {
        println!(
            "skipped on a real cluster: e2e/real-nodes runs the operator's stand-in beside Cilium's DaemonSet"
        );
        return;
    }
    let admin = c.client(users::ADMIN).await.unwrap();
    let node_a = c.node_name("cilium-a");
    let kubelet = c.kubelet(&node_a).await.unwrap();
    assert!(our_taint(&kubelet.register().await.unwrap()));
    // Cilium's agent pod on the node, scheduled, not Ready.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "kube-system");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "cilium-a", "namespace": "kube-system", "labels": {"k8s-app": "cilium"}},
        "spec": {"nodeName": node_a, "containers": [{"name": "cilium-agent", "image": "cilium"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let mut opts = Options::new(OperatorConfig::helm_defaults(), "kube-system");
    opts.print = false;
    let operator = Controller::start(admin.clone(), opts);
    eventually(
        "the operator's own taint while Cilium is not Ready",
        || async { has_taint(&node(&nodes, &node_a).await, CILIUM_KEY) },
    )
    .await;

    // Cilium's node-local signs of life: nodegate's agent ungates its key only.
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("05-cilium.conflist");
    std::fs::write(&probe, b"{}").unwrap();
    let mut agent = Agent::start(
        &c,
        &node_a,
        &dir.path().join("state"),
        &["--probe-file", probe.to_str().unwrap()],
    )
    .await;
    eventually("nodegate's gate removed", || async {
        !our_taint(&node(&nodes, &node_a).await)
    })
    .await;
    assert!(
        has_taint(&node(&nodes, &node_a).await, CILIUM_KEY),
        "the agent removed the operator's taint"
    );

    // The kubelet reports the Cilium pod Ready: the operator ungates its key.
    pods.patch_status(
        "cilium-a",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "conditions": [
            {"type": "ContainersReady", "status": "True"}, {"type": "Ready", "status": "True"}]}})),
    )
    .await
    .unwrap();
    // Settled: both taints gone, the operator's condition set, and its
    // removal recorded (the record follows the API server's answer).
    let removed = || {
        operator
            .writes()
            .iter()
            .any(|w| w.action == Action::RemoveTaint && w.error.is_none())
    };
    eventually(
        "the operator's taint removed and its condition set",
        || async {
            let n = node(&nodes, &node_a).await;
            !has_taint(&n, CILIUM_KEY)
                && !our_taint(&n)
                && has_cilium_is_up_condition(&n)
                && removed()
        },
    )
    .await;
    // A quiet window, measured: a loop between the two would write taints
    // within it. (The operator may write its condition a second time from
    // a stale cache, on its own; that is no loop.)
    let taint_writes = || {
        operator
            .writes()
            .iter()
            .filter(|w| w.action != Action::SetCondition && w.error.is_none())
            .count()
    };
    let before = taint_writes();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        taint_writes(),
        before,
        "the operator kept writing taints: {:?}",
        operator.writes()
    );
    assert_eq!(
        before,
        2,
        "its taint and its removal: {:?}",
        operator.writes()
    );
    assert_eq!(
        agent.metric("nodegate_agent_taint_removals_total").await,
        Some(1.0),
        "the agent removed a taint more than once"
    );
    assert!(
        operator.writes().iter().all(|w| w.node == node_a),
        "{:?}",
        operator.writes()
    );
    operator.stop().await;
    assert!(agent.term().await.success());
}

/// An upgrade from a nodegate that used Cilium's key: a node the old
/// webhook gated carries `node.cilium.io/agent-not-ready=true:NoSchedule`;
/// the new agent's ready patch removes it with its own (exactly, under the
/// confinement), and no taint of either is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_ciliums_key_leaves_no_stale_taint() {
    use nodegate_shared::keys::LEGACY_TAINT;
    let (c, nodes) = cluster().await;
    // The release is opt-in (components/release-cilium-key) and so is its
    // confinement: a real cluster runs the default install.
    let Some(emu) = c.emulator() else {
        eprintln!("skipped on a real cluster: needs components/release-cilium-key installed");
        return;
    };
    emu.apply(include_str!(
        "../../manifests/components/release-cilium-key/confinement.yaml"
    ))
    .unwrap();
    let node_a = c.node_name("upgrade-a");
    let kubelet = c.kubelet(&node_a).await.unwrap();
    kubelet.register().await.unwrap();
    let legacy =
        json!({"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoSchedule"});
    nodes
        .patch(
            &node_a,
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(
                    json!([{"op": "add", "path": "/spec/taints/-", "value": legacy}]),
                )
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("05-cilium.conflist");
    std::fs::write(&probe, b"{}").unwrap();
    let release = format!("--release-taint={LEGACY_TAINT}");
    let mut agent = Agent::start(
        &c,
        &node_a,
        &dir.path().join("state"),
        &["--probe-file", probe.to_str().unwrap(), &release],
    )
    .await;
    eventually("both taints gone in the ready patch", || async {
        let n = node(&nodes, &node_a).await;
        !our_taint(&n) && !has_taint(&n, "node.cilium.io/agent-not-ready")
    })
    .await;
    // Counted once the API server has answered, which can be after the
    // node is read without the taints.
    eventually("the one ready patch counted", || async {
        agent.metric("nodegate_agent_taint_removals_total").await == Some(1.0)
    })
    .await;
    assert!(agent.term().await.success());
}

/// Moving to another key profile (here `key-profiles/karpenter`) leaves no
/// node ungated and no stale taint: a node gated under the default key before
/// the switch keeps a gate until its agent, now managing the profile's key and
/// releasing the default one, is ready, and then carries neither; a node
/// created after the switch gets only the profile's key. Every version of the
/// old node before its ready patch carries a gate. Emulator only: it rewrites
/// the install.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_key_profiles_leaves_no_node_ungated_and_no_stale_taint() {
    use futures::StreamExt;
    use kube::runtime::watcher;
    const NEW: &str = "readiness.k8s.io/nodegate-agent-not-ready=true:NoSchedule";
    const NEW_KEY: &str = "readiness.k8s.io/nodegate-agent-not-ready";
    const PROFILE: &str = "manifests/components/key-profiles/karpenter";
    let (c, nodes) = cluster().await;
    let Some(emu) = c.emulator() else {
        eprintln!("skipped on a real cluster: the test rewrites the install");
        return;
    };
    let old = c.node_name("gated-before");
    let kubelet_old = c.kubelet(&old).await.unwrap();
    assert!(our_taint(&kubelet_old.register().await.unwrap()));

    // Every version of the old node, from here on.
    let seen = Arc::new(Mutex::new(Vec::<Node>::new()));
    let versions = seen.clone();
    let watch = tokio::spawn(
        watcher::watch_object(nodes.clone(), &old).for_each(move |e| {
            if let Ok(Some(n)) = e {
                versions.lock().unwrap().push(n);
            }
            async {}
        }),
    );

    // The profile's webhook, lines and confinement replace the default ones.
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |f: &str| std::fs::read_to_string(repo.join(PROFILE).join(f)).unwrap();
    let webhook = nodegate_e2e::WebhookProcess::start(nodegate_e2e::WebhookOptions {
        taints: vec![NEW.into()],
        kubeconfig: Some(emu.kubeconfig(users::WEBHOOK).unwrap()),
        ..Default::default()
    })
    .await
    .unwrap();
    webhook
        .attach(emu, Some(&read("webhook-config.yaml")))
        .unwrap();
    emu.apply(&read("confinement.yaml")).unwrap();

    let new = c.node_name("created-after");
    let kubelet_new = c.kubelet(&new).await.unwrap();
    let created = kubelet_new.register().await.unwrap();
    assert!(has_taint(&created, NEW_KEY), "the profile's gate at create");
    assert!(!our_taint(&created), "no default gate after the switch");

    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("ready");
    std::fs::write(&probe, b"ok").unwrap();
    let probe = probe.to_str().unwrap().to_string();
    let flags = [
        "--taint",
        NEW,
        "--release-taint",
        DEFAULT_TAINT,
        "--release-taint",
        "node.cilium.io/agent-not-ready=true:NoSchedule",
        "--probe-file",
        &probe,
    ];
    let mut agents = Vec::new();
    for (name, kubelet) in [(&old, &kubelet_old), (&new, &kubelet_new)] {
        agents.push(Agent::start(&c, name, &dir.path().join(name), &flags).await);
        eventually(&format!("{name} ready, with neither key"), || async {
            let n = node(&nodes, name).await;
            !our_taint(&n)
                && !has_taint(&n, NEW_KEY)
                && ready_boot_id(&n).as_deref() == Some(kubelet.boot_id())
        })
        .await;
    }
    watch.abort();
    let versions = seen.lock().unwrap().clone();
    assert!(!versions.is_empty());
    for n in versions.iter().filter(|n| ready_boot_id(n).is_none()) {
        assert!(
            our_taint(n) || has_taint(n, NEW_KEY),
            "a version of {old} before its ready patch without a gate: {:?}",
            n.spec.as_ref().and_then(|s| s.taints.clone())
        );
    }
    for mut a in agents {
        a.term().await;
    }
    for name in [&old, &new] {
        let n = node(&nodes, name).await;
        assert!(
            !our_taint(&n),
            "{name}: the released default taint came back"
        );
    }
}

/// The first name `base-<k>` (as the cluster spells it) whose roster shard
/// is 0, the shard `forge_shard` writes.
fn name_in_shard0(c: &Cluster, base: &str) -> String {
    (0..)
        .map(|k| c.name(&format!("{base}-{k}")))
        .find(|n| nodegate_roster::shard::shard_of(n, SHARDS) == 0)
        .unwrap()
}

/// A roster writer (the roster's own token, the publisher down) adds to
/// shard 0, beside its real records: (a) a ghost — a name the API server
/// never had — carrying a live node's InternalIP, (b) a ghost carrying a
/// live node's podCIDR, (c) a live node's record with a swapped uid. The
/// publisher comes back and repairs the shard, which takes them out again:
/// each is confirmed (404 for the ghosts, the node under its real uid for
/// (c)) and held, counted and logged, and the hook never runs with any of
/// those names, IPs or podCIDRs. A real deletion afterwards runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roster_records_carrying_live_values_never_reach_the_handler() {
    use nodegate_roster::record::{NodeAddress, NodeRecord};
    use nodegate_roster::shard;
    let (c, nodes) = cluster().await;
    let roster = roster(&c);
    let w: Vec<String> = (0..4).map(|i| c.node_name(&format!("lv{i}"))).collect();
    let victim = name_in_shard0(&c, "lvictim");
    c.delete_on_drop("nodes", "", &victim);
    let own_node = c.node_name("lvself");
    let mut uids = BTreeMap::new();
    for (i, name) in w.iter().enumerate() {
        uids.insert(name.clone(), create(&nodes, name, 700 + i).await);
    }
    uids.insert(victim.clone(), create(&nodes, &victim, 710).await);
    create(&nodes, &own_node, 720).await;
    let (ghost_ip, ghost_cidr) = (
        name_in_shard0(&c, "ghost-ip"),
        name_in_shard0(&c, "ghost-cidr"),
    );
    let own: BTreeSet<String> = uids
        .keys()
        .chain([&own_node, &ghost_ip, &ghost_cidr])
        .cloned()
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let (hooks, state) = (dir.path().join("hooks"), dir.path().join("state"));
    std::fs::create_dir_all(&hooks).unwrap();
    let hook_cmd = hook(&hooks);
    let mut publisher = Agent::publisher(&c, &roster, 0, dir.path()).await;
    let mut agent = Agent::start(
        &c,
        &own_node,
        &state,
        &roster_agent_args(&hook_cmd, &roster),
    )
    .await;
    eventually("first snapshot from the roster", || async {
        own_snapshot(&state, &own).as_ref() == Some(&uids)
    })
    .await;
    assert!(publisher.term().await.success());
    let metric = |name: &'static str| {
        let agent = &agent;
        async move { agent.metric(name).await.unwrap_or(0.0) }
    };
    const ADDRESS: &str = "nodegate_agent_prune_confirmations_total{result=\"conflict_address\"}";
    const CIDR: &str = "nodegate_agent_prune_confirmations_total{result=\"conflict_pod_cidr\"}";
    const NAME: &str = "nodegate_agent_prune_confirmations_total{result=\"conflict_name\"}";
    const REFUSED: &str = "nodegate_agent_prune_refused_total";
    for series in [ADDRESS, CIDR, NAME] {
        assert_eq!(agent.metric(series).await, Some(0.0), "{series} born at 0");
    }

    // The forgery: shard 0 as it is, plus the three records.
    let api = shards_api(&nodes);
    let cm = api.get(&shard::name_of(&roster, 0)).await.unwrap();
    let s0 = shard::decode(&roster, &cm).unwrap();
    let record = |name: &str, uid: &str, ip: String, cidr: String| NodeRecord {
        name: name.into(),
        uid: uid.into(),
        addresses: vec![NodeAddress {
            kind: "InternalIP".into(),
            address: ip,
        }],
        pod_cidrs: vec![cidr],
        provider_id: None,
        boot_id: None,
        labels: Default::default(),
    };
    let mut forged: Vec<NodeRecord> = s0.nodes.values().cloned().collect();
    // (a) w0's InternalIP; (b) w1's podCIDR.
    forged.push(record(
        &ghost_ip,
        "0a0a0a0a-0000-4000-8000-00000000000a",
        ip(700),
        pod_cidr(790),
    ));
    forged.push(record(
        &ghost_cidr,
        "0b0b0b0b-0000-4000-8000-00000000000b",
        ip(791),
        pod_cidr(701),
    ));
    // (c) the victim's own record, another uid.
    let real = forged
        .iter_mut()
        .find(|r| r.name == victim)
        .expect("the victim is in shard 0");
    real.uid = "0c0c0c0c-0000-4000-8000-00000000000c".into();
    let refused = metric(REFUSED).await;
    forge_shard(
        &c,
        roster_writer(&c),
        &roster,
        &shard::encode(s0.epoch, 0, s0.count, &forged),
    )
    .await;
    // The forged uid makes the real one look deleted: refused (live).
    eventually("the forged shard taken in", || async {
        metric(REFUSED).await > refused
            && own_snapshot(&state, &own)
                .is_some_and(|s| s.contains_key(&ghost_ip) && s.contains_key(&ghost_cidr))
    })
    .await;

    // The publisher repairs the shard: the three records leave.
    let mut publisher = Agent::publisher(&c, &roster, 0, dir.path()).await;
    // Out of the snapshot once handled or held (a handler that ran would
    // have run by then), and nothing left to confirm.
    eventually("the three deletions concluded", || async {
        own_snapshot(&state, &own).as_ref() == Some(&uids)
            && metric("nodegate_agent_prune_pending").await == 0.0
    })
    .await;
    // Nothing ran, for these records or with their values.
    let calls = hook_calls(&hooks);
    assert!(
        own_hook_calls(&hooks, &own).is_empty(),
        "a handler ran: {calls:?}"
    );
    for (_, _, ips, rec) in &calls {
        assert!(!ips.split(',').any(|i| i == ip(700)), "{calls:?}");
        assert!(rec["podCIDRs"] != json!([pod_cidr(701)]), "{calls:?}");
    }
    // Held, counted and logged.
    eventually("the three held and counted", || async {
        metric(ADDRESS).await >= 1.0 && metric(CIDR).await >= 1.0 && metric(NAME).await >= 1.0
    })
    .await;
    for (n, field) in [
        (&ghost_ip, "address"),
        (&ghost_cidr, "podCIDR"),
        (&victim, "name"),
    ] {
        let node = format!("node={n} ");
        let field = format!("field=\"{field}\"");
        assert!(
            agent
                .logs
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains("deletion held, no handler runs")
                    && l.contains(&node)
                    && l.contains(&field)),
            "the refusal of {n} ({field}) is logged"
        );
    }
    if !c.is_real() {
        assert_eq!(
            (
                metric(ADDRESS).await,
                metric(CIDR).await,
                metric(NAME).await
            ),
            (1.0, 1.0, 1.0)
        );
    }

    // A real deletion afterwards: handled, once.
    let gone = w[2].clone();
    nodes.delete(&gone, &DeleteParams::default()).await.unwrap();
    eventually("the deleted node's hook", || async {
        !own_hook_calls(&hooks, &own).is_empty()
    })
    .await;
    let calls = own_hook_calls(&hooks, &own);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        (
            calls[0].0.as_str(),
            calls[0].1.as_str(),
            calls[0].2.as_str()
        ),
        (gone.as_str(), "watch", ip(702).as_str())
    );
    assert_eq!(calls[0].3["uid"], uids[&gone].as_str());
    assert!(agent.term().await.success());
    assert!(publisher.term().await.success());
}
