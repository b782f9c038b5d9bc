//! nodegate as users run it: the README's install, verbatim, on real nodes
//! (real kubelets, containerd, the bridge CNI; `e2e/real-nodes/cluster`),
//! then the scenarios a platform engineer relies on, each asserted from
//! watches of Nodes and Pods.
//!
//! Needs the harness's cluster: `e2e/real-nodes/run` brings it up and runs
//! this with `NODEGATE_REAL_NODES` set to its state directory. CI cannot build
//! the Kubernetes binaries, so the test is ignored there (`--ignored` runs it).
//!
//! Order matters: every step starts from the state the previous one left.
//! Orderings between a Node's and a Pod's versions are read from their
//! resourceVersions, which one etcd numbers from one revision counter.
//! Figures are printed as `FIGURE <name> <value>` lines.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use nodegate_e2e::readme::{install_commands, repo_dir, shell, stdout_if_ok, user_dir};
use serde_json::json;

#[path = "real_nodes/cilium.rs"]
mod cilium;
#[path = "real_nodes/forged.rs"]
mod forged;
#[path = "real_nodes/strict.rs"]
mod strict;

const GATE: &str = "nodegate.dev/agent-not-ready";
const NS: &str = "nodegate";
const WEBHOOK: &str = "nodes.nodegate.dev";

// ---- the harness ----------------------------------------------------------------------------

struct Harness {
    state: PathBuf,
    kubeconfig: PathBuf,
    /// A fresh directory holding the repository's manifests, where the
    /// README's commands run.
    work: tempfile::TempDir,
}

impl Harness {
    fn from_env() -> Harness {
        let state = std::env::var_os("NODEGATE_REAL_NODES").map(PathBuf::from).expect(
            "NODEGATE_REAL_NODES is not set: run e2e/real-nodes/run (it brings up the real nodes)",
        );
        let kubeconfig = state.join("admin.kubeconfig");
        assert!(kubeconfig.exists(), "no cluster in {}", state.display());
        let work = user_dir().unwrap();
        Harness {
            state,
            kubeconfig,
            work,
        }
    }

    fn cluster(&self, args: &[&str]) -> String {
        let out = Command::new(repo_dir().join("e2e/real-nodes/cluster"))
            .args(args)
            .env("NODEGATE_REAL_NODES_DIR", &self.state)
            .output()
            .unwrap();
        ok(&format!("cluster {args:?}"), out)
    }

    /// `bash -c` in the work directory, with the kubeconfig and the
    /// workspace's binaries (nodegate-certs, nodegate-check) on PATH.
    fn sh(&self, command: &str) -> Output {
        shell(self.work.path(), Some(&self.kubeconfig), command).unwrap()
    }

    fn kubectl(&self, args: &str) -> String {
        ok(
            &format!("kubectl {args}"),
            self.sh(&format!("kubectl {args}")),
        )
    }

    async fn client(&self) -> kube::Client {
        kubeconfig_client(&self.kubeconfig).await
    }

    /// The API server's counters for every line of nodegate's admission.
    fn lines(&self) -> Lines {
        let text = self.kubectl("get --raw /metrics");
        Lines {
            fail_open: by_line(&text, "apiserver_admission_webhook_fail_open_count"),
            calls: by_line(&text, "apiserver_admission_webhook_request_total"),
        }
    }

    /// Node patches the API server refused with 422 (a JSON patch whose
    /// `test` failed, or a validation), any writer: the API server's own
    /// request counter has no user.
    fn node_patches_refused(&self) -> u64 {
        let text = self.kubectl("get --raw /metrics");
        text.lines()
            .filter(|l| l.starts_with("apiserver_request_total{"))
            .filter(|l| {
                l.contains("resource=\"nodes\"")
                    && l.contains("verb=\"PATCH\"")
                    && l.contains("code=\"422\"")
                    && l.contains("subresource=\"\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Fail-open calls, every line.
    fn fail_open(&self) -> u64 {
        self.lines().fail_open.values().sum()
    }

    fn node_dir(&self, node: &str) -> PathBuf {
        self.state.join(node)
    }
}

fn ok(what: &str, out: Output) -> String {
    stdout_if_ok(what, out).unwrap()
}

/// `metric`'s samples summed per webhook name, for nodegate's lines only
/// (`nodes.nodegate.dev` and each `replica-<i>.nodes.nodegate.dev`).
fn by_line(text: &str, metric: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for l in text.lines().filter(|l| l.starts_with(metric)) {
        let Some(name) = l
            .split("name=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .filter(|n| *n == WEBHOOK || n.ends_with(&format!(".{WEBHOOK}")))
        else {
            continue;
        };
        let v = l
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        *out.entry(name.to_string()).or_default() += v as u64;
    }
    out
}

/// The API server's per-line counters at one moment.
#[derive(Debug, Clone, Default)]
struct Lines {
    fail_open: BTreeMap<String, u64>,
    calls: BTreeMap<String, u64>,
}

impl Lines {
    fn since(&self, before: &Lines) -> Lines {
        let diff = |now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>| {
            now.iter()
                .map(|(k, v)| (k.clone(), v - then.get(k).copied().unwrap_or(0)))
                .collect()
        };
        Lines {
            fail_open: diff(&self.fail_open, &before.fail_open),
            calls: diff(&self.calls, &before.calls),
        }
    }

    fn backups<'a>(m: &'a BTreeMap<String, u64>) -> impl Iterator<Item = u64> + 'a {
        m.iter()
            .filter(|(k, _)| k.as_str() != WEBHOOK)
            .map(|(_, v)| *v)
    }

    /// Node writes no line answered: the backups are called in order, each
    /// only while the Node still lacks the taint, so those are the calls
    /// entering the backups minus the backup calls that were answered.
    /// (Writes only the first line handles, status writes, are not in it.)
    fn failed_through_every_line(&self) -> u64 {
        let entering = self
            .calls
            .get(&format!("replica-0.{WEBHOOK}"))
            .copied()
            .unwrap_or(0);
        let answered =
            Self::backups(&self.calls).sum::<u64>() - Self::backups(&self.fail_open).sum::<u64>();
        entering - answered
    }
}

async fn kubeconfig_client(path: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn figure(name: &str, value: impl std::fmt::Display) {
    println!("FIGURE {name} {value}");
}

fn step(name: &str) {
    println!("\n== {name}");
}

/// Polls `f` until it returns `Some`, or panics naming `what` at the deadline.
async fn wait<T>(what: &str, secs: u64, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out after {secs}s: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// ---- what the watches saw ---------------------------------------------------------------------

#[derive(Clone)]
struct Seen<T> {
    at: Instant,
    rv: u64,
    obj: T,
    deleted: bool,
}

#[derive(Clone, Default)]
struct Recorder {
    nodes: Arc<Mutex<Vec<Seen<Node>>>>,
    pods: Arc<Mutex<Vec<Seen<Pod>>>>,
}

fn rv_of(meta: &kube::api::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

impl Recorder {
    fn start(client: kube::Client) -> Recorder {
        let r = Recorder::default();
        tokio::spawn(record(Api::<Node>::all(client.clone()), r.nodes.clone()));
        tokio::spawn(record(Api::<Pod>::all(client), r.pods.clone()));
        r
    }

    fn nodes(&self, name: &str) -> Vec<Seen<Node>> {
        self.nodes
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.obj.metadata.name.as_deref() == Some(name))
            .cloned()
            .collect()
    }

    fn pods(&self) -> Vec<Seen<Pod>> {
        self.pods.lock().unwrap().clone()
    }

    fn node_now(&self, name: &str) -> Option<Node> {
        self.nodes(name)
            .into_iter()
            .rev()
            .find(|s| !s.deleted)
            .map(|s| s.obj)
    }
}

async fn record<K>(api: Api<K>, into: Arc<Mutex<Vec<Seen<K>>>>)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while let Some(ev) = stream.next().await {
        let (obj, deleted) = match ev {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => (o, false),
            Ok(watcher::Event::Delete(o)) => (o, true),
            _ => continue,
        };
        let rv = rv_of(obj.meta());
        into.lock().unwrap().push(Seen {
            at: Instant::now(),
            rv,
            obj,
            deleted,
        });
    }
}

fn gated(n: &Node) -> bool {
    taints(n)
        .iter()
        .any(|(k, e)| k == GATE && e == "NoSchedule")
}

/// Not schedulable anyway: the node lifecycle controller's taint for a node
/// that is not Ready (`node.kubernetes.io/unreachable` or `not-ready`,
/// NoSchedule) is still on.
fn held_by_node_lifecycle(n: &Node) -> bool {
    taints(n).iter().any(|(k, e)| {
        (k == "node.kubernetes.io/unreachable" || k == "node.kubernetes.io/not-ready")
            && e == "NoSchedule"
    })
}

fn taints(n: &Node) -> Vec<(String, String)> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.effect))
        .collect()
}

fn taints_json(n: &Node) -> Vec<serde_json::Value> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| serde_json::to_value(t).unwrap())
        .collect()
}

fn boot_id(n: &Node) -> Option<String> {
    n.status
        .as_ref()?
        .node_info
        .as_ref()
        .map(|i| i.boot_id.clone())
        .filter(|b| !b.is_empty())
}

fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref()?.node_name.as_deref()
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn ns_of(p: &Pod) -> &str {
    p.metadata.namespace.as_deref().unwrap_or_default()
}

fn name_of(p: &Pod) -> &str {
    p.metadata.name.as_deref().unwrap_or_default()
}

// ---- admission as a client sees it ----------------------------------------------------------------

/// Server-side dry-run creates of a canary Node, four a second, each checked
/// for the gate: what a kubelet registering at that moment would have got.
/// Nothing is stored.
#[derive(Clone, Default)]
struct Prober {
    /// Each answered create: how long it took, and whether it came back gated.
    answers: Arc<Mutex<Vec<(Duration, bool)>>>,
}

impl Prober {
    fn start(client: kube::Client) -> Prober {
        let p = Prober::default();
        let answers = p.answers.clone();
        tokio::spawn(async move {
            let api: Api<Node> = Api::all(client);
            let dry = kube::api::PostParams {
                dry_run: true,
                ..Default::default()
            };
            for i in 0u64.. {
                let canary: Node = serde_json::from_value(json!({
                    "metadata": {"name": format!("nodegate-e2e-canary-{i}")}
                }))
                .unwrap();
                let t = Instant::now();
                if let Ok(n) = api.create(&dry, &canary).await {
                    answers.lock().unwrap().push((t.elapsed(), gated(&n)));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        p
    }

    /// How many creates were answered so far (a mark for [`Self::since`]).
    fn mark(&self) -> usize {
        self.answers.lock().unwrap().len()
    }

    /// (creates answered, of which came back without the gate) since `mark`.
    fn since(&self, mark: usize) -> (u64, u64) {
        let a = self.answers.lock().unwrap();
        let after = &a[mark.min(a.len())..];
        (
            after.len() as u64,
            after.iter().filter(|(_, g)| !g).count() as u64,
        )
    }

    /// The slowest answer since `mark`, and the median.
    fn latency_since(&self, mark: usize) -> (Duration, Duration) {
        let a = self.answers.lock().unwrap();
        let mut d: Vec<Duration> = a[mark.min(a.len())..].iter().map(|(d, _)| *d).collect();
        d.sort();
        (
            d.last().copied().unwrap_or_default(),
            d.get(d.len() / 2).copied().unwrap_or_default(),
        )
    }
}

/// Admission during a window: the API server's per-line counters for the
/// webhook, and the canaries answered and ungated.
struct Window {
    lines: Lines,
    mark: usize,
}

/// What a window saw.
struct Admitted {
    /// Fail-open calls, every line.
    fail_open: u64,
    /// Of which the first line's.
    first_line_fail_open: u64,
    /// Node writes no line answered.
    failed_through: u64,
    sent: u64,
    ungated: u64,
}

impl Window {
    fn open(h: &Harness, prober: &Prober) -> Window {
        Window {
            lines: h.lines(),
            mark: prober.mark(),
        }
    }

    /// Prints the window's figures as `<what>_*`.
    fn close(self, h: &Harness, prober: &Prober, what: &str) -> Admitted {
        let d = h.lines().since(&self.lines);
        let (sent, ungated) = prober.since(self.mark);
        let (slowest, median) = prober.latency_since(self.mark);
        let fail_open = d.fail_open.values().sum();
        let first_line_fail_open = d.fail_open.get(WEBHOOK).copied().unwrap_or(0);
        let failed_through = d.failed_through_every_line();
        figure(&format!("{what}_fail_open"), fail_open);
        figure(
            &format!("{what}_fail_open_first_line"),
            first_line_fail_open,
        );
        figure(
            &format!("{what}_calls"),
            d.calls.get(WEBHOOK).copied().unwrap_or(0),
        );
        figure(
            &format!("{what}_backup_calls"),
            Lines::backups(&d.calls).sum::<u64>(),
        );
        figure(&format!("{what}_failed_through_every_line"), failed_through);
        figure(&format!("{what}_canaries"), sent);
        figure(&format!("{what}_canaries_ungated"), ungated);
        figure(&format!("{what}_canary_max_ms"), slowest.as_millis());
        figure(&format!("{what}_canary_median_ms"), median.as_millis());
        Admitted {
            fail_open,
            first_line_fail_open,
            failed_through,
            sent,
            ungated,
        }
    }

    /// As `close`, and asserts that no call of any line failed open.
    fn close_none_open(self, h: &Harness, prober: &Prober, what: &str) {
        let s = self.close(h, prober, what);
        assert_eq!(s.fail_open, 0, "{what}: admission calls failed open");
        assert!(s.sent > 0, "{what}: no canary create was answered");
        assert_eq!(s.ungated, 0, "{what}: canary creates came back ungated");
    }

    /// As `close`, and asserts that every Node write some line answered:
    /// calls may fail open as long as a later line caught them.
    fn close_none_ungated(self, h: &Harness, prober: &Prober, what: &str, min: u64) -> Admitted {
        let s = self.close(h, prober, what);
        assert!(
            s.sent >= min,
            "{what}: {} canaries answered, want {min}",
            s.sent
        );
        assert_eq!(s.ungated, 0, "{what}: canary creates came back ungated");
        assert_eq!(
            s.failed_through, 0,
            "{what}: Node writes failed open through every line"
        );
        s
    }
}

// ---- waits on the live cluster ------------------------------------------------------------------

async fn live_pods(client: &kube::Client) -> Vec<Pod> {
    Api::<Pod>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
}

async fn live_node(client: &kube::Client, name: &str) -> Option<Node> {
    Api::<Node>::all(client.clone())
        .get_opt(name)
        .await
        .unwrap()
}

async fn node_names(client: &kube::Client) -> Vec<String> {
    Api::<Node>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect()
}

/// Every nodegate Pod Running and Ready: an agent on each node, the webhook's
/// replicas (and the roster's, when installed).
async fn all_nodegate_ready(client: &kube::Client, webhooks: usize) {
    wait("every nodegate Pod Ready", 240, async || {
        let nodes = node_names(client).await;
        let pods = live_pods(client).await;
        let ours: Vec<&Pod> = pods
            .iter()
            .filter(|p| ns_of(p) == NS && p.metadata.deletion_timestamp.is_none())
            .collect();
        // A pod of a deleted node keeps its last status, Ready included, and
        // its endpoint, until the pod garbage collector removes it: never
        // count it as serving.
        let serving =
            |p: &&&Pod| pod_ready(p) && node_of(p).is_some_and(|n| nodes.iter().any(|x| x == n));
        let agents: BTreeSet<&str> = ours
            .iter()
            .filter(|p| name_of(p).starts_with("nodegate-agent-"))
            .filter(serving)
            .filter_map(|p| node_of(p))
            .collect();
        let hooks = ours
            .iter()
            .filter(|p| name_of(p).starts_with("nodegate-webhook-"))
            .filter(serving)
            .count();
        let not_serving = ours.iter().filter(|p| !serving(p)).count();
        (agents.len() == nodes.len() && hooks == webhooks && not_serving == 0).then_some(())
    })
    .await;
}

async fn wait_gated(client: &kube::Client, node: &str, want: bool, secs: u64) -> Instant {
    wait(&format!("{node} gated={want}"), secs, async || {
        let n = live_node(client, node).await?;
        (gated(&n) == want).then(Instant::now)
    })
    .await
}

async fn agent_pod(client: &kube::Client, node: &str) -> Pod {
    wait(&format!("a Ready agent Pod on {node}"), 180, async || {
        live_pods(client).await.into_iter().find(|p| {
            ns_of(p) == NS
                && name_of(p).starts_with("nodegate-agent-")
                && node_of(p) == Some(node)
                && p.metadata.deletion_timestamp.is_none()
                && pod_ready(p)
        })
    })
    .await
}

fn workload(name: &str, node: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}, nodegate-e2e: workload}}}}
    spec:
      nodeSelector: {{kubernetes.io/hostname: {node}}}
      terminationGracePeriodSeconds: 1
      containers:
        - name: main
          image: localhost/pause:1
          imagePullPolicy: Never
"
    )
}

/// Waits up to `secs` for the first version of `node` after `since` for
/// which `pred` holds.
async fn first_version(
    r: &Recorder,
    node: &str,
    since: u64,
    what: &str,
    secs: u64,
    pred: impl Fn(&Node) -> bool,
) -> Seen<Node> {
    wait(what, secs, async || {
        versions_after(r, node, since)
            .into_iter()
            .find(|s| pred(&s.obj))
    })
    .await
}

/// Waits until no Pod named `prefix…` is left.
async fn wait_no_pod(client: &kube::Client, prefix: &str) {
    wait(&format!("no {prefix}* Pod left"), 120, async || {
        (!live_pods(client)
            .await
            .iter()
            .any(|p| name_of(p).starts_with(prefix)))
        .then_some(())
    })
    .await;
}

/// Versions of `node` after `since` (by resourceVersion), in order.
fn versions_after(r: &Recorder, node: &str, since: u64) -> Vec<Seen<Node>> {
    let mut v: Vec<_> = r.nodes(node).into_iter().filter(|s| s.rv > since).collect();
    v.sort_by_key(|s| s.rv);
    v
}

/// The first pod version bound to `node` with resourceVersion in `(from, to)`,
/// other than nodegate's own pods: a workload bound while the node was gated.
fn bound_between(
    r: &Recorder,
    node: &str,
    from: u64,
    to: u64,
    bound_before: &BTreeSet<String>,
) -> Vec<String> {
    let mut out = BTreeSet::new();
    for s in r.pods() {
        if s.rv > from
            && s.rv < to
            && node_of(&s.obj) == Some(node)
            && ns_of(&s.obj) != NS
            && !bound_before.contains(&s.obj.metadata.uid.clone().unwrap_or_default())
        {
            out.insert(name_of(&s.obj).to_string());
        }
    }
    out.into_iter().collect()
}

fn uids_bound_to(r: &Recorder, node: &str, until: u64) -> BTreeSet<String> {
    r.pods()
        .into_iter()
        .filter(|s| s.rv <= until && node_of(&s.obj) == Some(node))
        .filter_map(|s| s.obj.metadata.uid)
        .collect()
}

/// The last resourceVersion the watches saw (an upper bound for "now").
fn last_rv(r: &Recorder) -> u64 {
    fn max<T>(seen: &Mutex<Vec<Seen<T>>>) -> u64 {
        seen.lock().unwrap().iter().map(|s| s.rv).max().unwrap_or(0)
    }
    max(&r.nodes).max(max(&r.pods))
}

/// The intervals during which `node` was gated, from its versions.
fn gated_windows(r: &Recorder, node: &str, since: Instant) -> Vec<Duration> {
    let mut v = r.nodes(node);
    v.sort_by_key(|s| s.rv);
    let mut out = Vec::new();
    let mut start: Option<Instant> = None;
    for s in v.into_iter().filter(|s| s.at >= since) {
        match (gated(&s.obj), start) {
            (true, None) => start = Some(s.at),
            (false, Some(t)) => {
                out.push(s.at - t);
                start = None;
            }
            _ => {}
        }
    }
    out
}

// ---- the scenarios ------------------------------------------------------------------------------

/// Runs in CI: without the Kubernetes binaries the harness refuses in one
/// line naming what is missing, exits non-zero, and makes nothing.
#[test]
fn without_kubernetes_binaries_the_harness_says_so_in_one_line() {
    let empty = tempfile::tempdir().unwrap();
    // A PATH with nothing on it but the shell the script runs in.
    let bin = empty.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink("/bin/bash", bin.join("bash")).unwrap();
    let out = Command::new(repo_dir().join("e2e/real-nodes/cluster"))
        .arg("check")
        .env("KUBE_BIN_DIR", empty.path())
        .env("PATH", &bin)
        .env("NODEGATE_REAL_NODES_DIR", empty.path().join("state"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no kube-apiserver kube-controller-manager kube-scheduler kubelet"),
        "{err}"
    );
    assert!(!empty.path().join("state").exists(), "check made state");
    // The one command parses (it runs nothing in CI).
    let parsed = Command::new("bash")
        .arg("-n")
        .arg(repo_dir().join("e2e/real-nodes/run"))
        .status()
        .unwrap();
    assert!(parsed.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs real nodes: e2e/real-nodes/run"]
async fn nodegate_on_real_nodes() {
    let h = Harness::from_env();
    let client = h.client().await;
    let rec = Recorder::start(client.clone());
    let nodes0 = node_names(&client).await;
    assert!(
        nodes0.len() >= 2,
        "the harness brings up at least two nodes"
    );
    // One group alone (`strict`, `cilium`), on a cluster an earlier run left
    // up with nodegate installed (NODEGATE_REAL_NODES_KEEP=1): a shorter loop
    // while working on it.
    let only = std::env::var("NODEGATE_REAL_NODES_ONLY").ok();
    if only.is_none() {
        install(&h, &client, &nodes0).await;
    }
    let c = Ctx {
        prober: Prober::start(client.clone()),
        h,
        client,
        rec,
        nodes0,
    };
    match only.as_deref() {
        Some("strict") => return strict::strict_mode(&c).await,
        Some("cilium") => return cilium::cilium(&c).await,
        Some("lines") => {
            webhook_host_crash(&c).await;
            webhook_host_down(&c).await;
            return rollouts(&c).await;
        }
        Some("forged") => return forged::forged_reviews(&c, &c.nodes0[1], "default").await,
        Some(other) => {
            panic!("NODEGATE_REAL_NODES_ONLY={other}: strict, cilium, lines or forged")
        }
        None => {}
    }
    join(&c).await;
    forged::forged_reviews(&c, "node3", "default").await;
    crash_reboot(&c).await;
    kubelet_restart(&c).await;
    webhook_drained(&c).await;
    rollouts(&c).await;
    upgrade(&c).await;
    pruning(&c).await;
    webhook_host_crash(&c).await;
    webhook_host_down(&c).await;
    memory_and_nothing_gated(&c).await;
    strict::strict_mode(&c).await;
    cilium::cilium(&c).await;
}

/// What every scenario after the install shares.
struct Ctx {
    h: Harness,
    client: kube::Client,
    /// Every version of every Node and Pod since the start.
    rec: Recorder,
    /// Canary creates from the end of the install on.
    prober: Prober,
    /// The nodes the harness brought up (the others join in the scenarios).
    nodes0: Vec<String>,
}

/// 1. The README's install, verbatim, on nodes whose network agent runs.
async fn install(h: &Harness, client: &kube::Client, nodes0: &[String]) {
    step("install (README, verbatim) and nodegate-check");
    for n in nodes0 {
        h.cluster(&["ready", n]);
    }
    for c in install_commands().unwrap() {
        println!("$ {c}");
        ok(&c, h.sh(&c));
    }
    all_nodegate_ready(client, 2).await;
    for n in nodes0 {
        wait_gated(client, n, false, 120).await;
    }
    let check = h.sh("nodegate-check");
    println!("{}", String::from_utf8_lossy(&check.stdout));
    assert!(
        check.status.success(),
        "nodegate-check failed after the install"
    );
    let lines = h.lines();
    figure(
        "fail_open_during_install",
        lines.fail_open.values().sum::<u64>(),
    );
    // Steady state: every Node write of the install went to the first line.
    figure(
        "first_line_calls_during_install",
        lines.calls.get(WEBHOOK).copied().unwrap_or(0),
    );
    let backup_calls = Lines::backups(&lines.calls).sum::<u64>();
    figure("backup_calls_during_install", backup_calls);
    assert_eq!(
        backup_calls, 0,
        "a backup line was called with both replicas up"
    );
}

/// 2. A node joins after the install; 3. its agent's token, stolen.
async fn join(c: &Ctx) {
    let Ctx {
        h,
        client,
        rec,
        nodes0,
        ..
    } = c;
    step("a node joins: tainted from its first stored version, nothing bound until ready");
    let before_join = last_rv(rec);
    h.cluster(&["add-node", "node3"]);
    let first = wait("node3's first version", 60, async || {
        versions_after(rec, "node3", before_join).into_iter().next()
    })
    .await;
    assert!(
        gated(&first.obj),
        "node3's first stored version lacks the gate: {:?}",
        taints(&first.obj)
    );
    let agent3 = agent_pod(client, "node3").await;
    h.kubectl(&format!(
        "apply -f - <<'EOF'\n{}EOF",
        workload("pinned", "node3", 2)
    ));
    wait(
        "the pinned workload Pending on gated node3",
        60,
        async || {
            let pods = live_pods(client).await;
            let pending: Vec<_> = pods
                .iter()
                .filter(|p| name_of(p).starts_with("pinned-"))
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| {
                            c.iter()
                                .any(|c| c.type_ == "PodScheduled" && c.status == "False")
                        })
                })
                .collect();
            (pending.len() == 2).then_some(())
        },
    )
    .await;
    assert!(gated(&live_node(client, "node3").await.unwrap()));

    // The agent's own kubelet-issued token, stolen from node3.
    step("the agent's kubelet-issued token: its own gate only");
    token_confinement(h, &agent3, "node3", &nodes0[0]).await;

    // From ready to ungated: the agent's ready patch goes out as the node
    // lifecycle controller lifts `not-ready` and the operator its taint. The
    // gate sits in front of both, so the ready patch's `test` holds; and no
    // update there reaches the webhook's first line.
    let (refused, lines) = (h.node_patches_refused(), h.lines());
    let untaint_rv = ready_and_ungated(c, "node3", "join_ready_to_untaint_ms").await;
    figure(
        "join_ready_node_patches_refused",
        h.node_patches_refused() - refused,
    );
    figure(
        "join_ready_first_line_calls",
        h.lines()
            .since(&lines)
            .calls
            .get(WEBHOOK)
            .copied()
            .unwrap_or(0),
    );
    let stored = live_node(client, "node3").await.unwrap();
    println!("node3's taints once ready: {:?}", taints(&stored));
    wait("the pinned workload Running on node3", 120, async || {
        let pods = live_pods(client).await;
        (pods
            .iter()
            .filter(|p| {
                name_of(p).starts_with("pinned-") && node_of(p) == Some("node3") && pod_ready(p)
            })
            .count()
            == 2)
            .then_some(())
    })
    .await;
    let early = bound_between(rec, "node3", before_join, untaint_rv, &BTreeSet::new());
    assert!(
        early.is_empty(),
        "workloads bound to node3 before its agent was ready: {early:?}"
    );
}

/// 4. A crash reboot of node3, its network agent not ready on the new boot.
async fn crash_reboot(c: &Ctx) {
    let Ctx {
        h,
        client,
        rec,
        prober,
        ..
    } = c;
    step("crash reboot: gated before anything new is bound; ungated when ready");
    let old_boot = boot_id(&live_node(client, "node3").await.unwrap()).unwrap();
    let before_crash = last_rv(rec);
    let bound_before = uids_bound_to(rec, "node3", before_crash);
    let restarts_before = restart_counts(client, "node3").await;
    let window = Window::open(h, prober);
    let t_crash = Instant::now();
    h.cluster(&["crash", "node3"]);
    let new_boot_first = first_version(
        rec,
        "node3",
        before_crash,
        "node3's first version on the new boot",
        120,
        |n| boot_id(n).is_some_and(|b| b != old_boot),
    )
    .await;
    assert!(
        gated(&new_boot_first.obj),
        "node3's first version on the new boot is not gated: {:?}",
        taints(&new_boot_first.obj)
    );
    let gate_back = versions_after(rec, "node3", before_crash)
        .into_iter()
        .find(|s| gated(&s.obj))
        .unwrap();
    figure("reboot_to_taint_ms", (gate_back.at - t_crash).as_millis());
    // Wait until the kubelet has done what it does before the agent is ready:
    // the CNI config of the last boot is on disk, so it restarts its pods.
    let restarted = wait(
        "node3's kubelet restarting its bound pods",
        120,
        async || {
            let now = restart_counts(client, "node3").await;
            let restarted: Vec<String> = now
                .iter()
                .filter(|(p, n)| {
                    !p.starts_with("nodegate-")
                        && **n > restarts_before.get(*p).copied().unwrap_or(0)
                })
                .map(|(p, _)| p.clone())
                .collect();
            (restarted.len() >= 2).then_some(restarted)
        },
    )
    .await;
    figure("pods_restarted_before_agent_ready", restarted.len());
    println!("restarted by the kubelet before node3's agent was ready: {restarted:?}");
    assert!(
        gated(&live_node(client, "node3").await.unwrap()),
        "node3 ungated before its agent was ready"
    );
    let untaint_rv = ready_and_ungated(c, "node3", "reboot_ready_to_untaint_ms").await;
    let early = bound_between(rec, "node3", before_crash, untaint_rv, &bound_before);
    assert!(
        early.is_empty(),
        "new workloads bound to node3 before its agent was ready: {early:?}"
    );
    // node3 is a worker: no webhook replica ran there.
    window.close_none_open(h, prober, "worker_crash");
}

/// 5. A kubelet restart on the same boot changes nothing.
async fn kubelet_restart(c: &Ctx) {
    let Ctx { h, client, rec, .. } = c;
    step("kubelet restart on the same boot: nothing changes");
    let before = last_rv(rec);
    let restarts_before = restart_counts(client, "node3").await;
    h.cluster(&["kubelet-restart", "node3"]);
    lease_renewals(h, "node3", 2).await;
    let gated_after = versions_after(rec, "node3", before)
        .into_iter()
        .filter(|s| gated(&s.obj))
        .count();
    assert_eq!(
        gated_after, 0,
        "a kubelet restart on the same boot gated node3"
    );
    assert_eq!(
        restart_counts(client, "node3").await,
        restarts_before,
        "a kubelet restart restarted pods"
    );
}

/// 6. The webhook's Pods deleted and every node cordoned.
async fn webhook_drained(c: &Ctx) {
    let Ctx { h, client, rec, .. } = c;
    // Every node cordoned, so the replacements stay Pending: nodes still
    // register, the agent's safety net gates them, the webhook comes back.
    step("webhook Pods deleted, nodes drained: a new node registers, the safety net, the Event");
    let cordoned = node_names(client).await;
    h.kubectl(&format!("cordon {}", cordoned.join(" ")));
    h.kubectl(&format!(
        "-n {NS} delete pod -l app.kubernetes.io/name=nodegate-webhook --wait=false"
    ));
    wait("no webhook Pod running", 120, async || {
        (!live_pods(client).await.iter().any(|p| {
            name_of(p).starts_with("nodegate-webhook-")
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Pending")
        }))
        .then_some(())
    })
    .await;
    let fail_open_before = h.fail_open();
    let before = last_rv(rec);
    h.cluster(&["add-node", "node4"]);
    let first = wait("node4's first version", 60, async || {
        versions_after(rec, "node4", before).into_iter().next()
    })
    .await;
    assert!(!gated(&first.obj), "node4 was gated without a webhook?");
    assert!(
        h.fail_open() > fail_open_before,
        "the registration did not fail open"
    );
    wait_gated(client, "node4", true, 120).await;
    wait(
        "the NodegateWebhookMissed Event for node4",
        60,
        async || {
            let ev =
                h.kubectl("get events -A --field-selector reason=NodegateWebhookMissed -o json");
            ev.contains("node4").then_some(())
        },
    )
    .await;
    h.kubectl(&format!("uncordon {}", cordoned.join(" ")));
    h.cluster(&["ready", "node4"]);
    all_nodegate_ready(client, 2).await;
    wait_gated(client, "node4", false, 120).await;
}

/// 7. Rollouts of the agent and of the webhook.
async fn rollouts(c: &Ctx) {
    let Ctx {
        h,
        client,
        rec,
        prober,
        ..
    } = c;
    step("rollout restart of the agent DaemonSet and the webhook StatefulSet");
    let nodes = node_names(client).await;
    let t0 = Instant::now();
    h.kubectl(&format!("-n {NS} rollout restart daemonset/nodegate-agent"));
    h.kubectl(&format!(
        "-n {NS} rollout status daemonset/nodegate-agent --timeout=300s"
    ));
    for n in &nodes {
        wait_gated(client, n, false, 120).await;
    }
    let windows: Vec<Duration> = nodes
        .iter()
        .flat_map(|n| gated_windows(rec, n, t0))
        .collect();
    figure("agent_rollout_gated_nodes", windows.len());
    figure(
        "agent_rollout_max_gate_ms",
        windows
            .iter()
            .max()
            .copied()
            .unwrap_or_default()
            .as_millis(),
    );
    let window = Window::open(h, prober);
    h.kubectl(&format!(
        "-n {NS} rollout restart statefulset/nodegate-webhook"
    ));
    h.kubectl(&format!(
        "-n {NS} rollout status statefulset/nodegate-webhook --timeout=300s"
    ));
    all_nodegate_ready(client, 2).await;
    window.close_none_open(h, prober, "webhook_rollout");
    for n in &nodes {
        wait_gated(client, n, false, 120).await;
    }
    cert_rotation(c).await;
}

/// 7b. The serving certificate rotated to a new CA the way docs/install.md
/// says, while canaries register: not one call fails open.
async fn cert_rotation(c: &Ctx) {
    let Ctx {
        h, client, prober, ..
    } = c;
    step("certificate rotation to a new CA: caBundle trusts both, Secret, caBundle trusts the new");
    let window = Window::open(h, prober);
    let t0 = Instant::now();
    ok(
        "rotation, first half",
        // Trusting the CA the cluster trusts now, whatever made it.
        h.sh("kubectl get mutatingwebhookconfiguration nodegate \
                -o jsonpath='{.webhooks[0].clientConfig.caBundle}' | base64 -d > ./trusted-ca.crt
              kubectl get mutatingwebhookconfiguration nodegate -o yaml > ./ng-live.yaml
              mkdir -p ./ng-certs-2 && cp ./ng-certs/path-token ./ng-certs-2/
              nodegate-certs --service nodegate-webhook --namespace nodegate --out-dir ./ng-certs-2 \
                --webhook-config ./ng-live.yaml --also-trust ./trusted-ca.crt
              kubectl patch mutatingwebhookconfiguration nodegate --patch-file ./ng-certs-2/ca-bundle-patch.yaml
              kubectl -n nodegate create secret tls nodegate-webhook-tls --cert ./ng-certs-2/tls.crt \
                --key ./ng-certs-2/tls.key --dry-run=client -o yaml | kubectl apply -f -"),
    );
    // Each replica serves the new leaf once the kubelet has synced the
    // Secret's volume and the webhook reloaded it.
    let want = ok(
        "new leaf",
        h.sh("openssl x509 -in ./ng-certs-2/tls.crt -noout -fingerprint -sha256"),
    );
    let hosts: Vec<String> = live_pods(client)
        .await
        .iter()
        .filter(|p| name_of(p).starts_with("nodegate-webhook-"))
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    assert_eq!(hosts.len(), 2, "two webhook replicas");
    for ip in &hosts {
        wait(&format!("{ip} serving the new certificate"), 240, async || {
            let got = h.sh(&format!(
                "openssl s_client -connect {ip}:9443 -servername nodegate-webhook.nodegate.svc </dev/null 2>/dev/null \
                 | openssl x509 -noout -fingerprint -sha256"
            ));
            (String::from_utf8_lossy(&got.stdout) == want).then_some(())
        })
        .await;
    }
    figure("cert_rotation_reloaded_ms", t0.elapsed().as_millis());
    h.kubectl("patch mutatingwebhookconfiguration nodegate --patch-file ./ng-certs-2/ca-bundle-final-patch.yaml");
    // A few canaries under the new CA alone.
    let mark = prober.mark();
    wait("canaries under the new CA alone", 60, async || {
        (prober.since(mark).0 >= 8).then_some(())
    })
    .await;
    window.close_none_open(h, prober, "cert_rotation");
    let check = h.sh("nodegate-check");
    assert!(
        check.status.success(),
        "nodegate-check after the rotation:\n{}",
        String::from_utf8_lossy(&check.stdout)
    );
}

/// 8. An upgrade as users do it: the install applied again with a component.
async fn upgrade(c: &Ctx) {
    let Ctx {
        h, client, prober, ..
    } = c;
    let nodes = node_names(client).await;
    step("upgrade: the install applied again with the pruning component");
    let bundle = "get mutatingwebhookconfiguration nodegate -o jsonpath={.webhooks[0].clientConfig.caBundle}";
    let ca_before = h.kubectl(bundle);
    my_nodegate(h, "../manifests", &["pruning"]);
    let window = Window::open(h, prober);
    h.kubectl("apply -k my-nodegate/");
    h.kubectl(&format!(
        "-n {NS} rollout status daemonset/nodegate-agent --timeout=300s"
    ));
    assert_eq!(
        h.kubectl(bundle),
        ca_before,
        "the upgrade changed the caBundle"
    );
    wait("the roster Ready on the pod network", 180, async || {
        let pods = live_pods(client).await;
        let ready: Vec<&Pod> = pods
            .iter()
            .filter(|p| name_of(p).starts_with("nodegate-roster-") && pod_ready(p))
            .collect();
        (ready.len() == 2
            && ready.iter().all(|p| {
                let s = p.status.as_ref().unwrap();
                s.pod_ip.is_some() && s.pod_ip != s.host_ip
            }))
        .then_some(())
    })
    .await;
    for n in &nodes {
        wait_gated(client, n, false, 120).await;
    }
    window.close_none_open(h, prober, "upgrade");
    let check = h.sh("nodegate-check");
    println!("{}", String::from_utf8_lossy(&check.stdout));
    assert!(
        check.status.success(),
        "nodegate-check failed after the upgrade"
    );
}

/// Writes the user's own kustomization, `my-nodegate/`: the install `base`
/// with `components`, and an `--on-node-delete` hook that logs to the node's
/// `/var/run/nodegate/pruned.log`.
fn my_nodegate(h: &Harness, base: &str, components: &[&str]) {
    let components: Vec<String> = components
        .iter()
        .map(|c| format!("../manifests/components/{c}"))
        .collect();
    std::fs::create_dir_all(h.work.path().join("my-nodegate")).unwrap();
    std::fs::write(
        h.work.path().join("my-nodegate/kustomization.yaml"),
        format!(
            "resources: [{base}]
components: [{}]
patches:
  - target: {{kind: DaemonSet, name: nodegate-agent}}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --on-node-delete=echo \"$NODEGATE_NODE_NAME $NODEGATE_DELETE_SOURCE\" >> /var/run/nodegate/pruned.log
",
            components.join(", ")
        ),
    )
    .unwrap();
}

/// 9. Pruning: a node deleted while the agents were down.
async fn pruning(c: &Ctx) {
    let Ctx { h, client, .. } = c;
    step("pruning: node4 deleted while the agents were down, pruned once by each");
    wait("roster shards listing node4", 120, async || {
        h.kubectl(&format!(
            "-n {NS} get configmaps -l nodegate.dev/roster -o json"
        ))
        .contains("node4")
        .then_some(())
    })
    .await;
    h.kubectl(&format!(
        "-n {NS} patch daemonset nodegate-agent --type merge -p '{{\"spec\":{{\"template\":{{\"spec\":{{\"nodeSelector\":{{\"nodegate.dev/e2e-agents\":\"down\"}}}}}}}}}}'"
    ));
    wait_no_pod(client, "nodegate-agent-").await;
    h.cluster(&["stop", "node4"]);
    h.kubectl("delete node node4");
    wait("roster shards without node4", 120, async || {
        (!h.kubectl(&format!(
            "-n {NS} get configmaps -l nodegate.dev/roster -o json"
        ))
        .contains("node4"))
        .then_some(())
    })
    .await;
    h.kubectl(&format!(
        "-n {NS} patch daemonset nodegate-agent --type json -p '[{{\"op\":\"remove\",\"path\":\"/spec/template/spec/nodeSelector\"}}]'"
    ));
    h.kubectl(&format!(
        "-n {NS} rollout status daemonset/nodegate-agent --timeout=300s"
    ));
    let survivors = node_names(client).await;
    let pruned = |n: &str| {
        std::fs::read_to_string(h.node_dir(n).join("run/nodegate/pruned.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("node4 "))
            .count()
    };
    wait("node4 pruned by every returning agent", 120, async || {
        survivors.iter().all(|n| pruned(n) >= 1).then_some(())
    })
    .await;
    all_nodegate_ready(client, 2).await;
    for n in &survivors {
        assert_eq!(pruned(n), 1, "{n} pruned node4 {} times", pruned(n));
    }
    figure("pruned_once_by_agents", survivors.len());
}

/// The Ready webhook replicas: (node, pod IP).
async fn replica_hosts(client: &kube::Client) -> Vec<(String, String)> {
    wait("both webhook replicas Ready", 240, async || {
        let hosts: Vec<(String, String)> = live_pods(client)
            .await
            .into_iter()
            .filter(|p| {
                ns_of(p) == NS && name_of(p).starts_with("nodegate-webhook-") && pod_ready(p)
            })
            .filter_map(|p| Some((node_of(&p)?.to_string(), p.status?.pod_ip?)))
            .collect();
        (hosts.len() == 2).then_some(hosts)
    })
    .await
}

/// The node of the replica the API server's open connection for the first
/// line goes to (without per-request load balancing it keeps one connection
/// and sends every call there until it breaks): killing that one is the
/// worst case. Else the first replica's.
async fn connected_replica_host(h: &Harness, client: &kube::Client) -> String {
    let hosts = replica_hosts(client).await;
    let peers = ok(
        "ss",
        h.sh("ss -Htn state established '( dport = :9443 )' | awk '{print $4}'"),
    );
    let connected = hosts
        .iter()
        .find(|(_, ip)| peers.lines().any(|p| p.starts_with(&format!("{ip}:"))));
    figure("webhook_host_is_the_connected_replica", connected.is_some());
    connected.unwrap_or(&hosts[0]).0.clone()
}

/// Scenario 10: nodes that host a webhook replica crash, one after the other, each
/// time while canaries register, each time the replica the API server is
/// connected to: the backup lines catch every call the dead replica fails.
async fn webhook_host_crash(c: &Ctx) {
    let Ctx {
        h,
        client,
        rec,
        prober,
        ..
    } = c;
    let runs: usize = std::env::var("NODEGATE_REAL_NODES_CRASH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut first_line_failed = 0;
    for run in 0..runs {
        step(&format!(
            "a webhook replica's node crashes ({}/{runs}): no Node left ungated",
            run + 1
        ));
        let host = connected_replica_host(h, client).await;
        let old_boot = boot_id(&live_node(client, &host).await.unwrap()).unwrap();
        let before = last_rv(rec);
        let window = Window::open(h, prober);
        let mark = prober.mark();
        h.cluster(&["crash", &host]);
        let first = first_version(
            rec,
            &host,
            before,
            "the crashed node's first version on its new boot",
            120,
            |n| boot_id(n).is_some_and(|b| b != old_boot),
        )
        .await;
        assert!(
            gated(&first.obj),
            "run {run}: {host}'s first version on its new boot was not gated"
        );
        wait_gated(client, &host, true, 120).await;
        h.cluster(&["ready", &host]);
        all_nodegate_ready(client, 2).await;
        wait_gated(client, &host, false, 120).await;
        wait("20 canaries in the run", 60, async || {
            (prober.since(mark).0 >= 20).then_some(())
        })
        .await;
        let what = format!("webhook_host_crash_{run}");
        first_line_failed += window
            .close_none_ungated(h, prober, &what, 20)
            .first_line_fail_open;
    }
    figure("webhook_host_crash_runs", runs);
    figure(
        "webhook_host_crash_first_line_fail_open_total",
        first_line_failed,
    );
}

/// Scenario 11: a replica's node powered off and unreachable (no RST: calls time
/// out) for 60 s, past the node lifecycle controller's grace period, then
/// booted again: no Node left ungated, its own re-registration gated.
async fn webhook_host_down(c: &Ctx) {
    let Ctx {
        h,
        client,
        rec,
        prober,
        ..
    } = c;
    step("a webhook replica's node down for 60 s, unreachable: no Node left ungated");
    let host = connected_replica_host(h, client).await;
    let old_boot = boot_id(&live_node(client, &host).await.unwrap()).unwrap();
    let window = Window::open(h, prober);
    let t0 = Instant::now();
    // Unreachable first: the killed processes' FINs never arrive, as when
    // the power goes.
    h.cluster(&["unreachable", &host, "on"]);
    h.cluster(&["stop", &host]);
    // Down for 60 s: a deadline to reach, not a synchronisation.
    let not_ready = wait(&format!("{host} NotReady"), 120, async || {
        let n = live_node(client, &host).await?;
        let ready = n
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (ready.status != "True").then(|| t0.elapsed())
    })
    .await;
    figure(
        "webhook_host_down_not_ready_after_ms",
        not_ready.as_millis(),
    );
    tokio::time::sleep_until((t0 + Duration::from_secs(60)).into()).await;
    let before = last_rv(rec);
    h.cluster(&["crash", &host]); // boots it: a new boot ID, reachable again
    let first = first_version(
        rec,
        &host,
        before,
        "the node's first version on its new boot",
        120,
        |n| boot_id(n).is_some_and(|b| b != old_boot),
    )
    .await;
    figure(
        "webhook_host_down_first_new_boot_version_gated",
        gated(&first.obj),
    );
    // Back after the grace period, the kubelet's fast status update
    // (`fastNodeStatusUpdate`, pkg/kubelet/kubelet_node_status.go: the stored
    // Node is not Ready) may precede its create: then the first version of
    // the new boot is a status write, which no admission can taint. It still
    // carries the node lifecycle controller's unreachable/not-ready taint, and
    // the webhook's `Rule::StatusShowsReboot` must put the gate on before that taint goes.
    let gate_at = wait_gated(client, &host, true, 120).await;
    let new_boot: Vec<Seen<Node>> = versions_after(rec, &host, before)
        .into_iter()
        .filter(|s| boot_id(&s.obj).is_some_and(|b| b != old_boot) && s.at <= gate_at)
        .collect();
    let open: Vec<u64> = new_boot
        .iter()
        .take_while(|s| !gated(&s.obj))
        .filter(|s| !held_by_node_lifecycle(&s.obj))
        .map(|s| s.rv)
        .collect();
    figure(
        "webhook_host_down_new_boot_versions_before_gate",
        new_boot.iter().take_while(|s| !gated(&s.obj)).count(),
    );
    assert!(
        open.is_empty(),
        "{host} schedulable on its new boot without the gate: versions {open:?}"
    );
    h.cluster(&["ready", &host]);
    all_nodegate_ready(client, 2).await;
    wait_gated(client, &host, false, 120).await;
    window.close_none_ungated(h, prober, "webhook_host_down", 20);
}

/// Figures: memory as the nodes' cgroups report it; and no node left gated.
async fn memory_and_nothing_gated(c: &Ctx) {
    let Ctx { h, client, rec, .. } = c;
    step("memory");
    // Over the whole run so far: which line answered how many calls.
    let lines = h.lines();
    for (name, calls) in &lines.calls {
        figure(&format!("run_calls_{name}"), calls);
    }
    for (name, n) in &lines.fail_open {
        figure(&format!("run_fail_open_{name}"), n);
    }
    figure(
        "run_failed_through_every_line",
        lines.failed_through_every_line(),
    );
    for n in node_names(client).await {
        let agent = h.cluster(&["memory", &n, "nodegate-agent-"]);
        figure(&format!("agent_memory_{n}"), agent.trim());
    }
    for p in live_pods(client).await {
        if name_of(&p).starts_with("nodegate-webhook-") {
            let n = node_of(&p).unwrap().to_string();
            let m = h.cluster(&["memory", &n, "nodegate-webhook-"]);
            figure(&format!("webhook_memory_{n}"), m.trim());
        }
    }
    let gated_now: Vec<String> = node_names(client)
        .await
        .into_iter()
        .filter(|n| rec.node_now(n).is_some_and(|n| gated(&n)))
        .collect();
    assert!(gated_now.is_empty(), "nodes left gated: {gated_now:?}");
}

/// Makes `node`'s stand-in ready, prints how long until its gate was gone
/// as `figure_name`, and returns the resourceVersion of its first version
/// without the gate from then on.
async fn ready_and_ungated(c: &Ctx, node: &str, figure_name: &str) -> u64 {
    let Ctx { h, client, rec, .. } = c;
    let ready_rv = last_rv(rec);
    let t_ready = Instant::now();
    h.cluster(&["ready", node]);
    let t_untaint = wait_gated(client, node, false, 120).await;
    figure(figure_name, (t_untaint - t_ready).as_millis());
    first_version(
        rec,
        node,
        ready_rv,
        &format!("{node}'s ungated version in the watch"),
        30,
        |n| !gated(n),
    )
    .await
    .rv
}

/// A client with the token the kubelet projected into the agent's Pod,
/// read from inside the container (the projected volume is a tmpfs in the
/// node's own mount namespace), as a thief on that node would use it.
async fn stolen_agent_client(h: &Harness, agent: &Pod) -> kube::Client {
    let token = h.kubectl(&format!(
        "-n {NS} exec {} -c agent -- sh -c 'read -r t < /var/run/secrets/kubernetes.io/serviceaccount/token; echo \"$t\"'",
        name_of(agent)
    ));
    let token = token.trim();
    assert!(token.starts_with("ey"), "not a JWT: {token:.20}");
    let kc = h.work.path().join("stolen.kubeconfig");
    let server = h.kubectl("config view --minify -o jsonpath={.clusters[0].cluster.server}");
    std::fs::write(
        &kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{server}\", certificate-authority: \"{}\"}}}}]\nusers: [{{name: u, user: {{token: \"{token}\"}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u}}}}]\ncurrent-context: c\n",
            h.state.join("pki/ca.crt").display()
        ),
    )
    .unwrap();
    kubeconfig_client(&kc).await
}

/// The token the kubelet projected into the agent's Pod on `node`, used as a
/// thief would: its own gate (dry-run, so the live gate stays), refused on
/// another node and on its own node's labels.
async fn token_confinement(h: &Harness, agent: &Pod, node: &str, other: &str) {
    let thief = stolen_agent_client(h, agent).await;
    let nodes: Api<Node> = Api::all(thief);
    let dry = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let own = nodes.get(node).await.unwrap();
    let idx = taints(&own)
        .iter()
        .position(|(k, _)| k == GATE)
        .expect("the node is gated");
    let remove: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": format!("/spec/taints/{idx}/key"), "value": GATE},
        {"op": "remove", "path": format!("/spec/taints/{idx}")},
    ]))
    .unwrap();
    let out = nodes
        .patch(node, &dry, &Patch::<()>::Json(remove))
        .await
        .expect("the agent's token removes its own node's gate");
    assert!(!gated(&out), "the dry-run removal kept the gate");
    let refused = |r: Result<Node, kube::Error>, what: &str| match r {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 403, "{what}: {}", e.message);
            println!("refused as expected: {what}: {}", e.message);
        }
        other => panic!("{what}: not refused: {other:?}"),
    };
    // The other node's whole taint list, with the gate added (it may have
    // no `taints` field to add into).
    let mut others = taints_json(&nodes.get(other).await.unwrap());
    others.push(json!({"key": GATE, "value": "true", "effect": "NoSchedule"}));
    refused(
        nodes
            .patch(
                other,
                &dry,
                &Patch::Merge(json!({"spec": {"taints": others}})),
            )
            .await,
        "the agent's token taints another node",
    );
    refused(
        nodes
            .patch(
                node,
                &dry,
                &Patch::Merge(
                    json!({"metadata": {"labels": {nodegate_shared::keys::EXCLUDE_LABEL: "true"}}}),
                ),
            )
            .await,
        "the agent's token labels its own node",
    );
}

async fn restart_counts(client: &kube::Client, node: &str) -> BTreeMap<String, i32> {
    live_pods(client)
        .await
        .into_iter()
        .filter(|p| node_of(p) == Some(node))
        .map(|p| {
            let n: i32 = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map(|c| c.iter().map(|c| c.restart_count).sum())
                .unwrap_or(0);
            (name_of(&p).to_string(), n)
        })
        .collect()
}

/// Waits for `count` renewals of `node`'s Lease (every 10 s): its kubelet is
/// back and has re-registered and reported.
async fn lease_renewals(h: &Harness, node: &str, count: usize) {
    let read = || {
        h.kubectl(&format!(
            "-n kube-node-lease get lease {node} -o jsonpath={{.spec.renewTime}}"
        ))
    };
    let mut seen = BTreeSet::from([read()]);
    wait(
        &format!("{count} renewals of {node}'s Lease"),
        120,
        async || {
            seen.insert(read());
            (seen.len() > count).then_some(())
        },
    )
    .await;
}
