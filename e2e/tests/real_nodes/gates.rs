//! Several gates in one install (docs/gates.md), on real kubelets: the
//! README's kustomize install plus a component `nodegate-webhook
//! gates-component` generates from a declaration written here, with three
//! gates and the stand-ins of `e2e/real-nodes/gates/standins.yaml`:
//!
//! - `cni`, nodegate's gate of the whole suite, opened by the base install's
//!   probes of the network agent's stand-in (`cluster ready NODE`);
//! - `csi`, opened by nodegate's agent on the Ready pod of a CSI-like
//!   DaemonSet (a `pod` probe), whose readiness the harness sets per node
//!   (`cluster csi-ready NODE`), so the two turn ready when a step says;
//! - `owned`, owned elsewhere: a DaemonSet pod removes it from its own node
//!   after it starts, as the AWS EBS CSI node plugin does.
//!
//! On the same cluster and the same node, first with the install's one gate
//! and then with these: a join (every Node version's taint set, from the
//! watch; who wrote the node, from the audit log: nodegate's agent once per
//! gate turning ready at its own time, once for gates ready together), a
//! crash reboot (every gate back from the new boot's first version, pods
//! bound while a gate held the node), an agent rollout (both of nodegate's
//! gates back at each old agent's stop and off with the new one's start,
//! the owned gate never), and strict mode with both gates (no pod starts
//! before both are open). Expectations on counts are checked at the end of
//! the group, after every figure is out; what protects workloads is
//! asserted where it is seen.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Node};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use nodegate_e2e::readme::repo_dir;
use nodegate_e2e::real_nodes::admission::Window;
use nodegate_e2e::real_nodes::audit::node_writes;
use nodegate_e2e::real_nodes::harness::{Harness, figure, ok, step, wait};
use nodegate_e2e::real_nodes::live::{
    agent_pod, all_nodegate_ready, live_node, live_pods, node_names, replica_hosts, wait_no_pod,
    workload,
};
use nodegate_e2e::real_nodes::objects::{
    GATE, NS, boot_gated, gated, name_of, node_of, ns_of, pod_ready, taints,
};
use nodegate_e2e::real_nodes::record::{
    Recorder, Seen, first_version, uids_bound_to, versions_after,
};
use nodegate_e2e::real_nodes::scenario::{Crash, Ctx, crash_to_new_boot};

use crate::install::my_nodegate_with;
use crate::strict::assert_nothing_disrupted;
use crate::strict_workloads::{
    LABEL, place, refused_or_evicted, replaced_while_gated, started_again, tolerating_runs_again,
};

/// The second gate nodegate opens: the CSI-like stand-in's.
const CSI: &str = "nodegate.dev/csi-not-ready=true:NoSchedule";
const CSI_KEY: &str = "nodegate.dev/csi-not-ready";
/// The gate owned elsewhere: the owner stand-in removes it.
const OWNED: &str = "example.com/storage-not-ready:NoSchedule";
const OWNED_KEY: &str = "example.com/storage-not-ready";
/// The stand-ins' namespace, as a CSI driver's node plugin runs.
const STANDINS_NS: &str = "kube-system";

const AGENT_USER: &str = "system:serviceaccount:nodegate:nodegate-agent";
const WEBHOOK_USER: &str = "system:serviceaccount:nodegate:nodegate-webhook";
const OWNER_USER: &str = "system:serviceaccount:kube-system:standin-owner";

/// The nodes this group adds start at node20 (other groups take node5 and
/// node9 on).
const FIRST_NODE: u32 = 20;

/// Which install `my-nodegate/` holds.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Install {
    /// The README's install with pruning, as the run has it: one gate.
    Default,
    /// With the `gates-two/` component: cni, csi, owned.
    TwoGates,
    /// With the `gates-strict/` component: the same and strict mode's boot gate.
    TwoGatesStrict,
}

impl Install {
    fn label(self) -> &'static str {
        match self {
            Install::Default => "default",
            Install::TwoGates => "two_gates",
            Install::TwoGatesStrict => "two_gates_strict",
        }
    }

    /// The taints (short names) a new Node gets under this install.
    fn at_create(self) -> BTreeSet<String> {
        let names: &[&str] = match self {
            Install::Default => &["cni"],
            Install::TwoGates => &["cni", "csi", "owned"],
            Install::TwoGatesStrict => &["boot", "cni", "csi", "owned"],
        };
        names.iter().map(|s| s.to_string()).collect()
    }
}

/// The declaration (docs/gates.md): the base install's gate and probes as
/// `cni`, the CSI-like stand-in's readiness as `csi`, the owner stand-in's
/// taint as `owned`; with `strict`, strict mode's boot gate.
fn declaration(strict: bool) -> String {
    let boot = if strict {
        format!("bootTaints: [{GATE}=true:NoExecute]\n")
    } else {
        String::new()
    };
    format!(
        "# tests/real_nodes/gates.rs: two gates nodegate opens and one owned elsewhere.
gates:
  - name: cni
    taint: {GATE}=true:NoSchedule
    probes:
      http: [http://127.0.0.1:9879/healthz]
      file: [/host/etc/cni/net.d/05-cilium.conflist]
  - name: csi
    taint: {CSI}
    probes:
      pod: [{STANDINS_NS}/app=standin-csi]
  - name: owned
    taint: {OWNED}
    owner: {{daemonSet: {STANDINS_NS}/standin-owner}}
{boot}"
    )
}

/// `nodegate-webhook gates-component` (the workspace's binary) on the
/// declaration, in the work directory: `gates-<name>.yaml` and the
/// component `gates-<name>/`.
fn component(h: &Harness, name: &str, strict: bool) {
    let help = h.sh("nodegate-webhook gates-component --help");
    assert!(
        help.status.success(),
        "the workspace's nodegate-webhook has no gates-component (cargo build -p nodegate-webhook): {}",
        String::from_utf8_lossy(&help.stderr)
    );
    let file = format!("gates-{name}.yaml");
    std::fs::write(h.work.path().join(&file), declaration(strict)).unwrap();
    let cmd = format!("nodegate-webhook gates-component --gates {file} --out gates-{name}");
    println!("$ {cmd}");
    ok(&cmd, h.sh(&cmd));
}

// ---- what a Node says -----------------------------------------------------------------

fn has(n: &Node, key: &str, effect: &str) -> bool {
    taints(n).iter().any(|(k, e)| k == key && e == effect)
}

fn csi(n: &Node) -> bool {
    has(n, CSI_KEY, "NoSchedule")
}

fn owned(n: &Node) -> bool {
    has(n, OWNED_KEY, "NoSchedule")
}

/// No gate of any install here (nodegate's two, the owned one, the boot gate).
fn open(n: &Node) -> bool {
    !gated(n) && !csi(n) && !owned(n) && !boot_gated(n)
}

fn ready_boot(n: &Node) -> Option<&str> {
    n.metadata
        .annotations
        .as_ref()?
        .get(nodegate_shared::keys::READY_BOOT_ID_ANNOTATION)
        .map(String::as_str)
}

/// A taint as the figures name it: the gate's name, else the key's last
/// segment (`not-ready`, `unreachable`, `unschedulable`), `:NoExecute` marked.
fn short(key: &str, effect: &str) -> String {
    match (key, effect) {
        (GATE, "NoExecute") => "boot".into(),
        (GATE, _) => "cni".into(),
        (CSI_KEY, _) => "csi".into(),
        (OWNED_KEY, _) => "owned".into(),
        _ => {
            let seg = key.rsplit('/').next().unwrap_or(key);
            if effect == "NoExecute" {
                format!("{seg}:NoExecute")
            } else {
                seg.to_string()
            }
        }
    }
}

fn taint_names(n: &Node) -> BTreeSet<String> {
    taints(n).iter().map(|(k, e)| short(k, e)).collect()
}

/// `cni+csi+not-ready`, `-` for none.
fn taint_set(n: &Node) -> String {
    let names: Vec<String> = taint_names(n).into_iter().collect();
    if names.is_empty() {
        "-".into()
    } else {
        names.join("+")
    }
}

/// The taint sets `node`'s versions in `(since, until]` went through, each
/// once in a row, with the first resourceVersion of each.
fn story(rec: &Recorder, node: &str, since: u64, until: u64) -> Vec<(u64, String)> {
    let mut out: Vec<(u64, String)> = Vec::new();
    for s in versions_after(rec, node, since)
        .into_iter()
        .filter(|s| s.rv <= until)
    {
        let set = taint_set(&s.obj);
        if out.last().map(|(_, t)| t) != Some(&set) {
            out.push((s.rv, set));
        }
    }
    out
}

// ---- who wrote the node ------------------------------------------------------------

/// Node writes (create, update, patch; main resource and status) the API
/// server stored, by writer, and those it refused.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Writers {
    agent: u64,
    webhook: u64,
    owner: u64,
    kubelet: u64,
    /// kube-controller-manager's controllers (node lifecycle, …) and anyone else.
    others: u64,
    /// Writes of anyone but the kubelet the API server refused (a failed
    /// `test`, a conflict).
    refused: u64,
}

impl std::fmt::Display for Writers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "agent={} webhook={} owner={} kubelet={} others={} refused={}",
            self.agent, self.webhook, self.owner, self.kubelet, self.others, self.refused
        )
    }
}

/// Who wrote `node` from `from` on, each write printed.
fn writers(h: &Harness, node: &str, from: Timestamp) -> Writers {
    let mut w = Writers::default();
    for e in node_writes(h, &[node], from, Timestamp::now()) {
        let who = if e.user == AGENT_USER {
            "agent"
        } else if e.user == WEBHOOK_USER {
            "webhook"
        } else if e.user == OWNER_USER {
            "owner"
        } else if e.user.starts_with("system:node:") {
            "kubelet"
        } else {
            "other"
        };
        if who != "kubelet" {
            println!(
                "  {} {who} {} {}{} {}",
                e.at,
                e.pod.as_deref().unwrap_or(&e.user),
                e.verb,
                e.subresource
                    .as_deref()
                    .map(|s| format!("/{s}"))
                    .unwrap_or_default(),
                e.code
            );
        }
        if !e.ok() {
            // The kubelet's re-registration is answered AlreadyExists: no
            // refusal of interest.
            if who != "kubelet" {
                w.refused += 1;
            }
            continue;
        }
        *match who {
            "agent" => &mut w.agent,
            "webhook" => &mut w.webhook,
            "owner" => &mut w.owner,
            "kubelet" => &mut w.kubelet,
            _ => &mut w.others,
        } += 1;
    }
    w
}

/// What one join or reboot cost.
#[derive(Debug, Clone)]
struct Cost {
    writes: Writers,
    /// The node's versions from the join or crash to the open node.
    versions: usize,
    story: String,
}

/// Prints `<what>_*`: the node's versions in `(since, open_rv]` and their
/// taint sets, and who wrote it from `from` on.
fn account(c: &Ctx, node: &str, what: &str, from: Timestamp, since: u64, open_rv: u64) -> Cost {
    let s = story(&c.rec, node, since, open_rv);
    for (rv, set) in &s {
        println!("  {node} rv {rv}: {set}");
    }
    let versions = versions_after(&c.rec, node, since)
        .iter()
        .filter(|v| v.rv <= open_rv)
        .count();
    let story: Vec<&str> = s.iter().map(|(_, t)| t.as_str()).collect();
    let story = story.join(" > ");
    let w = writers(&c.h, node, from);
    figure(&format!("{what}_versions_to_open"), versions);
    figure(&format!("{what}_taint_sets"), &story);
    figure(&format!("{what}_writes_agent"), w.agent);
    figure(&format!("{what}_writes_webhook"), w.webhook);
    figure(&format!("{what}_writes_owner"), w.owner);
    figure(&format!("{what}_writes_kubelet"), w.kubelet);
    figure(&format!("{what}_writes_others"), w.others);
    figure(&format!("{what}_writes_refused"), w.refused);
    Cost {
        writes: w,
        versions,
        story,
    }
}

// ---- expectations checked at the end -------------------------------------------------------

/// Expectations on counts (writes, Events, metrics): each miss is printed
/// when seen, and the group fails at its end, once every figure is out.
#[derive(Default)]
struct Misses(Mutex<Vec<String>>);

impl Misses {
    fn check(&self, held: bool, what: impl Into<String>) {
        if !held {
            let what = what.into();
            println!("EXPECTATION MISSED: {what}");
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(what);
        }
    }

    fn assert_none(&self) {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        figure("gates_expectations_missed", m.len());
        assert!(m.is_empty(), "the gates group missed: {m:#?}");
    }
}

// ---- the cluster ---------------------------------------------------------------------------

/// Pods bound to `node` in a version in `(from, to)` that no DaemonSet owns
/// and that were not bound there before `from` (`before`): what the
/// scheduler put on the node while a gate held it.
fn bound_while_gated(
    rec: &Recorder,
    node: &str,
    from: u64,
    to: u64,
    before: &BTreeSet<String>,
) -> Vec<String> {
    let ds = |s: &Seen<k8s_openapi::api::core::v1::Pod>| {
        s.obj
            .metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| o.iter().any(|o| o.kind == "DaemonSet"))
    };
    let mut out: BTreeSet<String> = BTreeSet::new();
    for s in rec.pods() {
        if s.rv > from
            && s.rv < to
            && node_of(&s.obj) == Some(node)
            && !ds(&s)
            && !before.contains(s.obj.metadata.uid.as_deref().unwrap_or_default())
        {
            out.insert(name_of(&s.obj).to_string());
        }
    }
    out.into_iter().collect()
}

/// A Deployment of two pause pods pinned to `node`.
fn pin(c: &Ctx, name: &str, node: &str) {
    c.h.kubectl(&format!(
        "apply -f - <<'EOF'\n{}EOF",
        workload(name, node, 2)
    ));
}

/// The pods of `name` (a Deployment of [`pin`]) not bound to any node.
async fn unbound(c: &Ctx, name: &str) -> usize {
    live_pods(&c.client)
        .await
        .iter()
        .filter(|p| name_of(p).starts_with(&format!("{name}-")))
        .filter(|p| p.metadata.deletion_timestamp.is_none() && node_of(p).is_none())
        .count()
}

/// Waits until both pods of `name` are Pending, unbound (the scheduler has
/// tried them).
async fn pending(c: &Ctx, name: &str) {
    wait(&format!("{name}'s pods Pending"), 60, async || {
        (unbound(c, name).await == 2).then_some(())
    })
    .await;
}

/// Waits until both pods of `name` run on `node`.
async fn running(c: &Ctx, name: &str, node: &str) {
    wait(
        &format!("{name}'s pods Running on {node}"),
        120,
        async || {
            let n = live_pods(&c.client)
                .await
                .iter()
                .filter(|p| name_of(p).starts_with(&format!("{name}-")))
                .filter(|p| node_of(p) == Some(node) && pod_ready(p))
                .count();
            (n == 2).then_some(())
        },
    )
    .await;
}

/// The CSI-like stand-in's pod on `node`, Ready or not.
async fn csi_pod_ready(c: &Ctx, node: &str) -> bool {
    live_pods(&c.client).await.iter().any(|p| {
        ns_of(p) == STANDINS_NS
            && name_of(p).starts_with("standin-csi-")
            && node_of(p) == Some(node)
            && p.metadata.deletion_timestamp.is_none()
            && pod_ready(p)
    })
}

/// `node` reports Ready and the node lifecycle controller's `not-ready`
/// taint is gone: only the gates hold it.
async fn kubelet_ready(c: &Ctx, node: &str) {
    wait(
        &format!("{node} Ready, not-ready lifted"),
        120,
        async || {
            let n = live_node(&c.client, node).await?;
            let ready = n
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|k| k.type_ == "Ready" && k.status == "True");
            let held = taint_names(&n)
                .iter()
                .any(|t| t.starts_with("not-ready") || t.starts_with("unreachable"));
            (ready && !held).then_some(())
        },
    )
    .await;
}

/// The Events on `node` (namespace default) by reason.
async fn node_events(c: &Ctx, node: &str) -> BTreeMap<String, Vec<String>> {
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind=Node,involvedObject.name={node}"
    ));
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in events.list(&lp).await.expect("list Events").items {
        out.entry(e.reason.unwrap_or_default())
            .or_default()
            .push(e.message.unwrap_or_default());
    }
    out
}

/// `nodegate_agent_gate_open{gate="<gate>"}` on `node`'s agent (its admin
/// port on the node's address).
async fn gate_open_metric(c: &Ctx, node: &str, gate: &str) -> Option<f64> {
    let n = live_node(&c.client, node).await?;
    let ip = n
        .status?
        .addresses?
        .into_iter()
        .find(|a| a.type_ == "InternalIP")?
        .address;
    let out =
        c.h.sh(&format!("curl -fsS --max-time 5 http://{ip}:9091/metrics"));
    let series = format!("nodegate_agent_gate_open{{gate=\"{gate}\"}} ");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
}

/// Closes `window` over a crash of `node`: no call fails open, unless a
/// webhook replica ran on the node (the rollouts of the switches place them
/// anywhere), where the first line's calls to it may, as long as a backup
/// line answered each; no canary comes back ungated either way.
async fn close_crash_window(c: &Ctx, window: Window, node: &str, what: &str) {
    let hosts = replica_hosts(&c.client).await;
    let hosted = hosts.iter().any(|(n, _)| n == node);
    figure(&format!("{what}_node_hosted_a_webhook_replica"), hosted);
    if hosted {
        window.close_none_ungated(&c.h, &c.prober, what, 1);
    } else {
        window.close_none_open(&c.h, &c.prober, what);
    }
}

/// How long a gate whose stand-in turned ready may take to come off on its
/// own (it takes well under a second when it does).
const ALONE: Duration = Duration::from_secs(30);

/// One gate's stand-in made ready (`cluster <ready> NODE`) while another
/// gate still holds the node: the first version since `since` without
/// that gate, stored after the command, within [`ALONE`]
/// (`<what>_<gate>_ready_to_off_ms`). `None` when none came: the agent's
/// writes in that time are printed (`<what>_<gate>_alone_agent_writes`) and
/// a miss recorded; the caller opens the other gate, which brings both off.
async fn gate_off_alone(
    c: &Ctx,
    node: &str,
    since: u64,
    gate: &str,
    ready: &str,
    what: &str,
    misses: &Misses,
) -> Option<Seen<Node>> {
    let from = Timestamp::now();
    let ready_rv = c.rec.last_rv();
    let t = Instant::now();
    c.h.cluster(&[ready, node]);
    let off = |n: &Node| !taint_names(n).contains(gate);
    let v = tokio::time::timeout(
        ALONE,
        first_version(&c.rec, node, since, &format!("{gate} off"), 600, off),
    )
    .await;
    let Ok(v) = v else {
        let writes: Vec<u16> = node_writes(&c.h, &[node], from, Timestamp::now())
            .into_iter()
            .filter(|e| e.user == AGENT_USER)
            .map(|e| e.code)
            .collect();
        let stored = writes.iter().filter(|c| (200..300).contains(*c)).count();
        figure(&format!("{what}_{gate}_off_alone"), false);
        figure(&format!("{what}_{gate}_alone_agent_writes"), writes.len());
        figure(&format!("{what}_{gate}_alone_agent_writes_stored"), stored);
        let n = live_node(&c.client, node).await;
        misses.check(
            false,
            format!(
                "{what}: {gate} (its stand-in ready first) never came off alone in {ALONE:?}: the agent wrote {} patches ({stored} stored), and every stored version kept {gate}; the node now: {}",
                writes.len(),
                n.as_ref().map(taint_set).unwrap_or_default()
            ),
        );
        return None;
    };
    figure(&format!("{what}_{gate}_off_alone"), true);
    misses.check(
        v.rv > ready_rv,
        format!(
            "{what}: {gate} off (rv {}) before its stand-in was ready (rv {ready_rv})",
            v.rv
        ),
    );
    figure(
        &format!("{what}_{gate}_ready_to_off_ms"),
        v.at.saturating_duration_since(t).as_millis(),
    );
    Some(v)
}

// ---- the group -------------------------------------------------------------------------

pub(crate) async fn gates(c: &Ctx) {
    let misses = Misses::default();
    step("gates: the components from two declarations, the stand-ins");
    component(&c.h, "two", false);
    component(&c.h, "strict", true);
    // A run that failed may have left its nodes and its install.
    remove_leftovers(c).await;
    let agent_args = c.h.kubectl(&format!(
        "-n {NS} get ds nodegate-agent -o jsonpath={{.spec.template.spec.containers[0].args}}"
    ));
    if agent_args.contains("--gates=") {
        switch(c, Install::Default, &Misses::default()).await;
    }
    standins(c).await;

    // One gate: the install as the run has it.
    let node = c.h.fresh_node(FIRST_NODE);
    let one_join = join_apart(c, &node, Install::Default, &misses).await;
    let one_crash = crash(c, &node, Install::Default, "gates_1gate_crash", &misses).await;

    // Two gates and one owned elsewhere.
    switch(c, Install::TwoGates, &misses).await;
    let apart = c.h.fresh_node(FIRST_NODE);
    let two_join = join_apart(c, &apart, Install::TwoGates, &misses).await;
    let together = c.h.fresh_node(FIRST_NODE);
    let two_together = join_together(c, &together, &misses).await;
    let two_crash = crash(c, &node, Install::TwoGates, "gates_2gates_crash", &misses).await;
    agent_rollout(c, &misses).await;

    // Strict mode with both gates.
    switch(c, Install::TwoGatesStrict, &misses).await;
    strict_crash(c, &node, &misses).await;

    // Writes per join and per reboot as the gates grow.
    step("gates: writes per join and per reboot, one gate against two");
    for (what, cost) in [
        ("gates_writes_per_join_1gate", &one_join),
        ("gates_writes_per_join_2gates_apart", &two_join),
        ("gates_writes_per_join_2gates_together", &two_together),
        ("gates_writes_per_reboot_1gate", &one_crash),
        ("gates_writes_per_reboot_2gates", &two_crash),
    ] {
        figure(what, cost.writes);
        figure(&format!("{what}_versions"), cost.versions);
        println!("  {what}: {}", cost.story);
    }
    misses.check(
        two_crash.writes.webhook <= one_crash.writes.webhook.max(1),
        format!(
            "the webhook's writes per reboot grew with the gates: {} with one, {} with two",
            one_crash.writes.webhook, two_crash.writes.webhook
        ),
    );

    // Back to the install the run had.
    switch(c, Install::Default, &misses).await;
    cleanup(c).await;
    misses.assert_none();
}

/// The stand-ins' image into every node, their DaemonSets, and every node
/// that runs made CSI-ready (their stand-in's pod Ready), as a cluster
/// whose CSI driver runs.
async fn standins(c: &Ctx) {
    let Ctx { h, client, .. } = c;
    h.cluster(&["standins"]);
    let yaml = repo_dir().join("e2e/real-nodes/gates/standins.yaml");
    h.kubectl(&format!("apply -f {}", yaml.display()));
    let nodes = node_names(client).await;
    for n in &nodes {
        h.cluster(&["csi-ready", n]);
    }
    wait(
        "a Ready stand-in pod of each on every node",
        180,
        async || {
            let pods = live_pods(client).await;
            let on = |prefix: &str, n: &str| {
                pods.iter().any(|p| {
                    name_of(p).starts_with(prefix) && node_of(p) == Some(n) && pod_ready(p)
                })
            };
            nodes
                .iter()
                .all(|n| on("standin-csi-", n) && on("standin-owner-", n))
                .then_some(())
        },
    )
    .await;
}

/// Switches the install to `to` as users upgrade (`kubectl apply -k` of
/// their kustomization, the README's base with pruning and the component),
/// and waits until it is in effect: both rollouts done, a canary Node comes
/// back with exactly the gates of `to`, every node open. Nothing is
/// evicted, no node carries the boot gate (same boot), and no admission
/// call fails open meanwhile.
async fn switch(c: &Ctx, to: Install, misses: &Misses) {
    let Ctx {
        h,
        client,
        rec,
        prober,
        ..
    } = c;
    let what = format!("gates_switch_to_{}", to.label());
    step(&format!("gates: switch the install to {to:?}"));
    let before = rec.last_rv();
    let from = Timestamp::now();
    let t0 = Instant::now();
    let window = Window::open(h, prober);
    let mut components = vec!["../manifests/components/pruning".to_string()];
    match to {
        Install::Default => {}
        Install::TwoGates => components.push("../gates-two".into()),
        Install::TwoGatesStrict => components.push("../gates-strict".into()),
    }
    my_nodegate_with(h, "../manifests", &components);
    h.kubectl("apply -k my-nodegate/");
    for w in ["daemonset/nodegate-agent", "statefulset/nodegate-webhook"] {
        h.kubectl(&format!("-n {NS} rollout status {w} --timeout=300s"));
    }
    all_nodegate_ready(client, 2).await;
    let want = to.at_create();
    wait(
        &format!("a canary Node created with {want:?}"),
        120,
        async || (canary(h)? == want).then_some(()),
    )
    .await;
    // The agents opened what their predecessors re-gated at their stop.
    let nodes = node_names(client).await;
    for n in &nodes {
        wait(&format!("{n}: nodegate's gate off"), 120, async || {
            let node = live_node(client, n).await?;
            (!gated(&node) && (to == Install::Default || !csi(&node))).then_some(())
        })
        .await;
    }
    if to == Install::Default {
        // The old agents re-gated `csi` at their stop; the new ones do not
        // know it, so nothing opens it: removed by hand, as an admin would.
        let mut stranded = Vec::new();
        for n in &nodes {
            if live_node(client, n).await.is_some_and(|node| csi(&node)) {
                h.kubectl(&format!("taint node {n} {CSI_KEY}:NoSchedule-"));
                stranded.push(n.clone());
            }
        }
        figure(&format!("{what}_csi_gate_left_on_nodes"), stranded.len());
        println!("  csi gate left by the old agents, removed by hand: {stranded:?}");
        // What the component added beside the base (kubectl apply prunes nothing).
        h.kubectl(&format!(
            "-n {STANDINS_NS} delete role,rolebinding nodegate-agent-probe-pod --ignore-not-found"
        ));
    }
    for n in &nodes {
        wait(&format!("{n} open"), 120, async || {
            live_node(client, n).await.filter(open).map(|_| ())
        })
        .await;
    }
    figure(&format!("{what}_ms"), t0.elapsed().as_millis());
    // Each old agent re-gates its node at its stop, unless the new
    // confinement, applied in the same `kubectl apply`, refuses a gate the
    // new install does not have: then its node goes without a gate until the
    // new agent runs.
    let regated = nodes
        .iter()
        .filter(|n| versions_after(rec, n, before).iter().any(|s| gated(&s.obj)))
        .count();
    let refused: Vec<String> = node_writes(
        h,
        &nodes.iter().map(String::as_str).collect::<Vec<_>>(),
        from,
        Timestamp::now(),
    )
    .into_iter()
    .filter(|e| e.user == AGENT_USER && !e.ok())
    .map(|e| format!("{} {}", e.node, e.code))
    .collect();
    figure(&format!("{what}_nodes"), nodes.len());
    figure(&format!("{what}_nodes_regated_by_old_agents"), regated);
    figure(&format!("{what}_agent_writes_refused"), refused.len());
    println!("  agent writes refused: {refused:?}");
    let a = window.close(h, prober, &what);
    // A line's call may fail open while the replicas roll (the figures
    // count them); no Node write may go through every line ungated.
    misses.check(
        a.ungated == 0 && a.failed_through == 0,
        format!(
            "{what}: {} canaries ungated, {} writes failed open through every line",
            a.ungated, a.failed_through
        ),
    );
    assert_nothing_disrupted(rec, before, &what);
    let agent_args = h.kubectl(&format!(
        "-n {NS} get ds nodegate-agent -o jsonpath={{.spec.template.spec.containers[0].args}}"
    ));
    assert_eq!(
        agent_args.contains("--gates="),
        to != Install::Default,
        "{to:?}: agent args {agent_args}"
    );
    let check = h.sh("nodegate-check");
    println!("{}", String::from_utf8_lossy(&check.stdout));
    figure(&format!("{what}_check_passed"), check.status.success());
    misses.check(
        check.status.success(),
        format!("{what}: nodegate-check failed"),
    );
}

/// The gates (short names) of a server-side dry-run Node create: what a
/// kubelet registering now gets (the API server's own `not-ready` left out).
fn canary(h: &Harness) -> Option<BTreeSet<String>> {
    let out = h.sh(
        "kubectl create --dry-run=server -o json -f - <<'EOF'\napiVersion: v1\nkind: Node\nmetadata: {name: nodegate-e2e-gates-canary}\nEOF",
    );
    if !out.status.success() {
        return None;
    }
    let n: Node = serde_json::from_slice(&out.stdout).ok()?;
    let gates = Install::TwoGatesStrict.at_create();
    Some(taint_names(&n).intersection(&gates).cloned().collect())
}

/// A node joins; under `install`'s gates, one at a time: `owned` goes as its
/// owner starts, `cni` when the network agent's stand-in is ready, `csi`
/// (two gates) when the CSI-like stand-in is, later. Nothing is bound
/// until the last is off, and with two gates the node is held by `csi`
/// alone in between.
async fn join_apart(c: &Ctx, node: &str, install: Install, misses: &Misses) -> Cost {
    let Ctx { h, rec, client, .. } = c;
    let two = install != Install::Default;
    let what = if two {
        "gates_2gates_join"
    } else {
        "gates_1gate_join"
    };
    step(&format!(
        "{what}: {node} joins, its gates open one at a time"
    ));
    let from = Timestamp::now();
    let before = rec.last_rv();
    let name = format!("gates-{node}");
    pin(c, &name, node);
    h.cluster(&["add-node", node]);
    let first = first_version(rec, node, before, "the first version", 60, |_| true).await;
    println!("  first version: {}", taint_set(&first.obj));
    assert_eq!(
        taint_names(&first.obj)
            .intersection(&install.at_create())
            .count(),
        install.at_create().len(),
        "{node}'s first version lacks a gate: {}",
        taint_set(&first.obj)
    );
    if two {
        let gone = first_version(rec, node, first.rv, "the owner's removal", 120, |n| {
            !owned(n)
        })
        .await;
        figure(
            &format!("{what}_first_version_to_owner_removal_ms"),
            gone.at.saturating_duration_since(first.at).as_millis(),
        );
        assert!(
            gated(&gone.obj) && csi(&gone.obj),
            "the owner's removal took more than its gate: {}",
            taint_set(&gone.obj)
        );
    }
    agent_pod(client, node).await;
    pending(c, &name).await;

    let t_cni = Instant::now();
    h.cluster(&["ready", node]);
    let cni_off = first_version(rec, node, before, "cni off", 120, |n| !gated(n)).await;
    figure(
        &format!("{what}_cni_ready_to_off_ms"),
        cni_off.at.saturating_duration_since(t_cni).as_millis(),
    );
    let open_v = if two {
        assert!(
            csi(&cni_off.obj),
            "cni and csi went together though csi was not ready"
        );
        misses.check(
            ready_boot(&cni_off.obj).is_none(),
            format!("{what}: the ready boot recorded with the first gate"),
        );
        // Only the csi gate holds the node now: the kubelet is Ready, the
        // node lifecycle controller's taint gone, and still nothing binds.
        kubelet_ready(c, node).await;
        pending(c, &name).await;
        assert!(
            csi(&live_node(client, node).await.unwrap()),
            "csi off before its stand-in was ready"
        );
        let t_csi = Instant::now();
        h.cluster(&["csi-ready", node]);
        let v = first_version(rec, node, cni_off.rv, "csi off", 120, |n| !csi(n)).await;
        figure(
            &format!("{what}_csi_ready_to_off_ms"),
            v.at.saturating_duration_since(t_csi).as_millis(),
        );
        v
    } else {
        h.cluster(&["csi-ready", node]);
        cni_off
    };
    assert!(
        open(&open_v.obj),
        "{node} not open: {}",
        taint_set(&open_v.obj)
    );
    misses.check(
        ready_boot(&open_v.obj).is_some(),
        format!("{what}: no ready boot recorded with the last gate"),
    );
    figure(
        &format!("{what}_first_version_to_open_ms"),
        open_v.at.saturating_duration_since(first.at).as_millis(),
    );
    running(c, &name, node).await;
    let early = bound_while_gated(rec, node, before, open_v.rv, &BTreeSet::new());
    figure(&format!("{what}_pods_bound_while_gated"), early.len());
    assert!(
        early.is_empty(),
        "{what}: pods bound to {node} while a gate held it: {early:?}"
    );
    let cost = account(c, node, what, from, before, open_v.rv);
    let gates = if two { 2 } else { 1 };
    misses.check(
        cost.writes.agent == gates,
        format!(
            "{what}: the agent wrote {} times for {gates} gates ready apart",
            cost.writes.agent
        ),
    );
    if two {
        misses.check(
            cost.writes.owner == 1,
            format!("{what}: the owner wrote {} times", cost.writes.owner),
        );
        let events = node_events(c, node).await;
        let opened = events.get("NodegateGateOpen").cloned().unwrap_or_default();
        figure(&format!("{what}_gate_open_events"), opened.len());
        figure(
            &format!("{what}_ready_events"),
            events.get("NodegateReady").map_or(0, Vec::len),
        );
        misses.check(
            opened.len() == 1 && opened[0].contains("cni"),
            format!("{what}: NodegateGateOpen Events {opened:?}"),
        );
        for gate in ["cni", "csi"] {
            let v = gate_open_metric(c, node, gate).await;
            figure(
                &format!("{what}_gate_open_metric_{gate}"),
                v.unwrap_or(-1.0),
            );
            misses.check(
                v == Some(1.0),
                format!("{what}: nodegate_agent_gate_open{{gate={gate}}} = {v:?}"),
            );
        }
    }
    cost
}

/// A node joins whose agent starts late (its image held back, as a slow
/// pull): both of its stand-ins are ready first, so the agent's first round
/// finds both gates passing and removes them in one write.
async fn join_together(c: &Ctx, node: &str, misses: &Misses) -> Cost {
    let Ctx { h, rec, client, .. } = c;
    let what = "gates_2gates_join_together";
    step(&format!(
        "{what}: {node} joins, both stand-ins ready before its agent runs"
    ));
    let from = Timestamp::now();
    let before = rec.last_rv();
    h.cluster(&["add-node", node, "--hold-image", "nodegate-agent"]);
    let first = first_version(rec, node, before, "the first version", 60, |_| true).await;
    println!("  first version: {}", taint_set(&first.obj));
    assert!(
        gated(&first.obj) && csi(&first.obj) && owned(&first.obj),
        "{node}'s first version lacks a gate: {}",
        taint_set(&first.obj)
    );
    first_version(rec, node, first.rv, "the owner's removal", 120, |n| {
        !owned(n)
    })
    .await;
    h.cluster(&["ready", node]);
    h.cluster(&["csi-ready", node]);
    kubelet_ready(c, node).await;
    wait("the CSI-like stand-in Ready", 60, async || {
        csi_pod_ready(c, node).await.then_some(())
    })
    .await;
    let n = live_node(client, node).await.unwrap();
    assert!(
        gated(&n) && csi(&n),
        "{node} opened without its agent: {}",
        taint_set(&n)
    );
    // The image arrives; the pod that could not pull it is replaced at once
    // rather than after the kubelet's pull back-off.
    h.cluster(&["release-image", node]);
    let t_agent = Instant::now();
    for p in live_pods(client).await {
        if ns_of(&p) == NS
            && name_of(&p).starts_with("nodegate-agent-")
            && node_of(&p) == Some(node)
        {
            h.kubectl(&format!("-n {NS} delete pod {} --wait=false", name_of(&p)));
        }
    }
    let v = first_version(rec, node, first.rv, "a gate off", 180, |n| {
        !gated(n) || !csi(n)
    })
    .await;
    figure(
        &format!("{what}_agent_start_to_open_ms"),
        v.at.saturating_duration_since(t_agent).as_millis(),
    );
    misses.check(
        open(&v.obj),
        format!(
            "{what}: gates ready together came off apart: {}",
            taint_set(&v.obj)
        ),
    );
    let open_v = first_version(rec, node, first.rv, "open", 60, open).await;
    let early = bound_while_gated(rec, node, before, open_v.rv, &BTreeSet::new());
    figure(&format!("{what}_pods_bound_while_gated"), early.len());
    assert!(early.is_empty(), "{what}: bound while gated: {early:?}");
    let cost = account(c, node, what, from, before, open_v.rv);
    misses.check(
        cost.writes.agent == 1,
        format!(
            "{what}: the agent wrote {} times for two gates ready together",
            cost.writes.agent
        ),
    );
    let events = node_events(c, node).await;
    figure(
        &format!("{what}_gate_open_events"),
        events.get("NodegateGateOpen").map_or(0, Vec::len),
    );
    cost
}

/// A crash reboot of `node` under `install`, its stand-ins not ready on the
/// new boot: every gate back from the new boot's first version (or the
/// version after it the webhook's background patch wrote: printed), the
/// owner's gate removed again by its new process, nodegate's gates one at a
/// time (`csi` first this time); no pod bound while any gate held the node,
/// no canary ungated, no call failing open.
async fn crash(c: &Ctx, node: &str, install: Install, what: &str, misses: &Misses) -> Cost {
    let Ctx {
        h,
        rec,
        client,
        prober,
        ..
    } = c;
    let two = install != Install::Default;
    step(&format!("{what}: a crash reboot of {node}"));
    wait(&format!("{node} open"), 60, async || {
        live_node(client, node).await.filter(open).map(|_| ())
    })
    .await;
    let from = Timestamp::now();
    let window = Window::open(h, prober);
    let crash = crash_to_new_boot(c, node, &[]).await;
    let bound_before = uids_bound_to(rec, node, crash.before);
    gates_back(c, &crash, install, what, misses).await;
    if two {
        let back = first_version(rec, node, crash.before, "the owned gate back", 60, owned).await;
        let gone = first_version(rec, node, back.rv, "the owner's removal", 120, |n| {
            !owned(n)
        })
        .await;
        figure(
            &format!("{what}_crash_to_owner_removal_ms"),
            gone.at.saturating_duration_since(crash.at).as_millis(),
        );
    }
    // New work pinned to the node while it is held: it must wait.
    let late = format!("gates-late-{node}-{}", if two { 2 } else { 1 });
    pin(c, &late, node);
    kubelet_ready(c, node).await;
    pending(c, &late).await;
    // csi first: the stand-in's pod said Ready on the last boot, so its
    // gate must stay until the pod is Ready on this one; then cni.
    let mut alone = true;
    if two {
        match gate_off_alone(c, node, crash.first.rv, "csi", "csi-ready", what, misses).await {
            Some(v) => {
                assert!(gated(&v.obj), "cni went with csi though it was not ready");
            }
            None => alone = false,
        }
        pending(c, &late).await;
    } else {
        h.cluster(&["csi-ready", node]);
    }
    let from_last = Timestamp::now();
    let t_cni = Instant::now();
    h.cluster(&["ready", node]);
    let open_v = first_version(rec, node, crash.first.rv, "open", 120, open).await;
    figure(
        &format!("{what}_cni_ready_to_open_ms"),
        open_v.at.saturating_duration_since(t_cni).as_millis(),
    );
    assert!(
        open(&open_v.obj),
        "{node} not open: {}",
        taint_set(&open_v.obj)
    );
    figure(
        &format!("{what}_crash_to_open_ms"),
        open_v.at.saturating_duration_since(crash.at).as_millis(),
    );
    running(c, &late, node).await;
    c.h.kubectl(&format!("-n default delete deployment {late} --wait=false"));
    let early = bound_while_gated(rec, node, crash.before, open_v.rv, &bound_before);
    figure(&format!("{what}_pods_bound_while_gated"), early.len());
    assert!(
        early.is_empty(),
        "{what}: pods bound to {node} while a gate held it: {early:?}"
    );
    close_crash_window(c, window, node, what).await;
    let cost = account(c, node, what, from, crash.before, open_v.rv);
    let gates = if two { 2 } else { 1 };
    // With a gate that never came off alone, its writes are that miss's.
    let last = writers(h, node, from_last);
    figure(&format!("{what}_agent_writes_from_last_ready"), last.agent);
    misses.check(
        !alone || cost.writes.agent == gates,
        format!(
            "{what}: the agent wrote {} times for {gates} gates ready apart",
            cost.writes.agent
        ),
    );
    if two {
        misses.check(
            cost.writes.owner == 1,
            format!("{what}: the owner wrote {} times", cost.writes.owner),
        );
    }
    wait_no_pod(client, &format!("{late}-")).await;
    cost
}

/// Where each gate of `install` came back after `crash`: the first version
/// since the crash carrying it, against the new boot's first version
/// (`<what>_<gate>_back`: `before_new_boot_version`, the webhook's answer to
/// the kubelet's re-registration, stored before the kubelet's status write
/// of the new boot; `on_new_boot_version`; or `after_new_boot_version+N`,
/// N versions later, the background patch of that status write).
async fn gates_back(c: &Ctx, crash: &Crash, install: Install, what: &str, misses: &Misses) {
    let first = &crash.first;
    println!(
        "  the new boot's first version (rv {}): {}",
        first.rv,
        taint_set(&first.obj)
    );
    for gate in install.at_create() {
        let carries = |n: &Node| taint_names(n).contains(&gate);
        let v = first_version(
            &c.rec,
            &crash.node,
            crash.before,
            &format!("{gate} back"),
            120,
            &carries,
        )
        .await;
        let after = versions_after(&c.rec, &crash.node, first.rv)
            .iter()
            .filter(|s| s.rv <= v.rv)
            .count();
        let place = match v.rv.cmp(&first.rv) {
            std::cmp::Ordering::Less => "before_new_boot_version".to_string(),
            std::cmp::Ordering::Equal => "on_new_boot_version".to_string(),
            std::cmp::Ordering::Greater => format!("after_new_boot_version+{after}"),
        };
        figure(&format!("{what}_{gate}_back"), &place);
        figure(
            &format!("{what}_{gate}_back_ms"),
            v.at.saturating_duration_since(crash.at).as_millis(),
        );
    }
    // Strict mode's boot gate follows the stored new boot by design (the
    // re-registration's boot is only a claim): not asked of the first version.
    let on_first = install
        .at_create()
        .into_iter()
        .filter(|g| g != "boot")
        .all(|g| taint_names(&first.obj).contains(&g));
    figure(&format!("{what}_gates_on_first_new_boot_version"), on_first);
    misses.check(
        on_first,
        format!(
            "{what}: the new boot's first version lacks a gate: {}",
            taint_set(&first.obj)
        ),
    );
}

/// `kubectl rollout restart` of the agent DaemonSet: each old agent puts
/// both of nodegate's gates back at its stop, its successor removes both
/// (ready together: one write), the owned gate is never re-added, so no
/// owner has to remove it again (the EBS plugin, 10 minutes after its start,
/// would not), and nothing is bound meanwhile.
async fn agent_rollout(c: &Ctx, misses: &Misses) {
    let Ctx {
        h,
        client,
        rec,
        prober,
        ..
    } = c;
    let what = "gates_agent_rollout";
    step(&format!(
        "{what}: both gates back at each old agent's stop, off with the new one"
    ));
    let nodes = node_names(client).await;
    for n in &nodes {
        wait(&format!("{n} open"), 120, async || {
            live_node(client, n).await.filter(open).map(|_| ())
        })
        .await;
    }
    let from = Timestamp::now();
    let before = rec.last_rv();
    let t0 = Instant::now();
    let window = Window::open(h, prober);
    h.kubectl(&format!("-n {NS} rollout restart daemonset/nodegate-agent"));
    h.kubectl(&format!(
        "-n {NS} rollout status daemonset/nodegate-agent --timeout=300s"
    ));
    for n in &nodes {
        wait(&format!("{n} open"), 120, async || {
            live_node(client, n).await.filter(open).map(|_| ())
        })
        .await;
    }
    figure(&format!("{what}_ms"), t0.elapsed().as_millis());
    let (mut both, mut one, mut owned_back, mut bound) = (0, 0, 0, Vec::new());
    let mut per_node = Vec::new();
    let mut max_gated = std::time::Duration::ZERO;
    for n in &nodes {
        let versions = versions_after(rec, n, before);
        if versions.iter().any(|s| gated(&s.obj) && csi(&s.obj)) {
            both += 1;
        }
        if versions.iter().any(|s| gated(&s.obj) != csi(&s.obj)) {
            one += 1;
        }
        if versions.iter().any(|s| owned(&s.obj)) {
            owned_back += 1;
        }
        if let Some(from_v) = versions.iter().find(|s| gated(&s.obj) || csi(&s.obj)) {
            let to = versions
                .iter()
                .find(|s| s.rv > from_v.rv && open(&s.obj))
                .map_or(u64::MAX, |s| s.rv);
            let bound_before = uids_bound_to(rec, n, from_v.rv);
            bound.extend(bound_while_gated(rec, n, from_v.rv, to, &bound_before));
            if let Some(t) = versions.iter().find(|s| s.rv == to) {
                max_gated = max_gated.max(t.at.saturating_duration_since(from_v.at));
            }
        }
        // Each agent write, by the pod whose token made it.
        let writes: Vec<String> = node_writes(h, &[n.as_str()], from, Timestamp::now())
            .into_iter()
            .filter(|e| e.user == AGENT_USER && e.ok())
            .map(|e| e.pod.unwrap_or_default())
            .collect();
        let pods: BTreeSet<&String> = writes.iter().collect();
        misses.check(
            writes.len() == 2 && pods.len() == 2,
            format!("{what}: {n}: agent writes by pod {writes:?} (want the old pod's re-gate, then the new one's opening)"),
        );
        per_node.push(writes.len());
        let w = writers(h, n, from);
        misses.check(w.owner == 0 && w.webhook == 0, format!("{what}: {n}: {w}"));
    }
    figure(&format!("{what}_nodes"), nodes.len());
    figure(&format!("{what}_nodes_regated_with_both"), both);
    figure(&format!("{what}_nodes_with_a_version_of_one_gate"), one);
    figure(&format!("{what}_nodes_owned_gate_readded"), owned_back);
    figure(
        &format!("{what}_agent_writes_per_node"),
        format!("{per_node:?}"),
    );
    figure(&format!("{what}_max_gated_ms"), max_gated.as_millis());
    figure(&format!("{what}_pods_bound_while_gated"), bound.len());
    assert_eq!(
        owned_back, 0,
        "{what}: the rollout put the owned gate back: nothing would remove it"
    );
    assert!(bound.is_empty(), "{what}: bound while gated: {bound:?}");
    misses.check(
        both == nodes.len(),
        format!(
            "{what}: {both} of {} nodes re-gated with both gates",
            nodes.len()
        ),
    );
    window.close_none_open(h, prober, what);
}

/// Strict mode with both gates: every kind of workload on `node`, then a
/// crash reboot. The boot gate evicts or refuses every untolerating pod,
/// none starts before both gates are open, and the boot gate goes with the
/// last of them (`cni` first here, then `csi`).
async fn strict_crash(c: &Ctx, node: &str, misses: &Misses) {
    let what = "gates_strict";
    step(&format!(
        "{what}: every kind of workload on {node}, a crash reboot"
    ));
    let placed = place(c, node).await;
    let from = Timestamp::now();
    let window = Window::open(&c.h, &c.prober);
    let crash = crash_to_new_boot(c, node, &[]).await;
    gates_back(c, &crash, Install::TwoGatesStrict, what, misses).await;
    let gate = first_version(&c.rec, node, crash.before, "the boot gate", 120, boot_gated).await;
    figure(
        &format!("{what}_boot_gate_before_new_boot_status"),
        gate.rv <= crash.first.rv,
    );
    refused_or_evicted(c, node, what, crash.before, &placed, true).await;
    tolerating_runs_again(c, node, what, &crash, &placed).await;
    replaced_while_gated(c, node, what, &crash).await;
    let started = started_again(&c.rec, crash.before, &placed, false);
    figure(&format!("{what}_started_before_ready"), started.len());
    println!("  started again before both gates were open: {started:?}");
    assert!(
        started.is_empty(),
        "{what}: untolerating pods started before both gates were open: {started:?}"
    );
    let alone = gate_off_alone(c, node, gate.rv, "cni", "ready", what, misses).await;
    if let Some(cni_off) = &alone {
        assert!(csi(&cni_off.obj), "csi went with cni though not ready");
        misses.check(
            boot_gated(&cni_off.obj),
            format!(
                "{what}: the boot gate went with the first gate: {}",
                taint_set(&cni_off.obj)
            ),
        );
    }
    // Still held by csi and the boot gate: nothing untolerating started.
    let started = started_again(&c.rec, crash.before, &placed, false);
    assert!(
        started.is_empty(),
        "{what}: started with csi still closed: {started:?}"
    );
    let from_last = Timestamp::now();
    let ready_rv = c.rec.last_rv();
    c.h.cluster(&["csi-ready", node]);
    let open_v = first_version(&c.rec, node, gate.rv, "csi off", 120, |n| !csi(n)).await;
    misses.check(
        open_v.rv > ready_rv,
        format!(
            "{what}: csi off (rv {}) before its stand-in was ready (rv {ready_rv})",
            open_v.rv
        ),
    );
    misses.check(
        !boot_gated(&open_v.obj),
        format!(
            "{what}: the boot gate outlived the last gate: {}",
            taint_set(&open_v.obj)
        ),
    );
    let open_v = first_version(&c.rec, node, gate.rv, "open", 60, open).await;
    figure(
        &format!("{what}_crash_to_open_ms"),
        open_v.at.saturating_duration_since(crash.at).as_millis(),
    );
    wait(
        "the strict DaemonSet's pod Ready on the node again",
        180,
        async || {
            live_pods(&c.client).await.into_iter().find(|p| {
                name_of(p).starts_with("strict-ds-") && node_of(p) == Some(node) && pod_ready(p)
            })
        },
    )
    .await;
    close_crash_window(c, window, node, what).await;
    let cost = account(c, node, what, from, crash.before, open_v.rv);
    let last = writers(&c.h, node, from_last);
    figure(&format!("{what}_agent_writes_from_last_ready"), last.agent);
    misses.check(
        alone.is_none() || cost.writes.agent == 2,
        format!("{what}: the agent wrote {} times", cost.writes.agent),
    );
    c.h.kubectl(&format!(
        "delete deploy,sts,job,ds,pod -l {LABEL} --wait=true --timeout=120s"
    ));
}

/// The stand-ins, the pinned workloads and this group's nodes go (each
/// drained, stopped and its Node deleted), so the groups after it find the
/// cluster as they expect it.
async fn cleanup(c: &Ctx) {
    let Ctx { h, client, .. } = c;
    step("gates: the stand-ins and this group's nodes go");
    remove_leftovers(c).await;
    let yaml = repo_dir().join("e2e/real-nodes/gates/standins.yaml");
    h.kubectl(&format!(
        "delete -f {} --ignore-not-found --wait=false",
        yaml.display()
    ));
    wait_no_pod(client, "standin-").await;
    all_nodegate_ready(client, 2).await;
}

/// This group's nodes (`node20` on) and pinned Deployments (`gates-…`)
/// still in the cluster: removed (those of a run that failed, at the start
/// of the next).
async fn remove_leftovers(c: &Ctx) {
    let Ctx { h, client, .. } = c;
    ok(
        "delete the pinned Deployments",
        h.sh("kubectl -n default get deployments -o name | { grep '^deployment.apps/gates-' || true; } \
              | xargs -r kubectl -n default delete --wait=false"),
    );
    let nodes: Vec<String> = node_names(client)
        .await
        .into_iter()
        .filter(|n| {
            n.strip_prefix("node")
                .and_then(|i| i.parse::<u32>().ok())
                .is_some_and(|i| i >= FIRST_NODE)
        })
        .collect();
    for n in &nodes {
        // A webhook replica or the roster may run there (the switches'
        // rollouts place them anywhere): moved first, as an admin drains a
        // node before removing it.
        h.kubectl(&format!(
            "drain {n} --ignore-daemonsets --delete-emptydir-data --force --timeout=240s"
        ));
        h.cluster(&["stop", n]);
        h.kubectl(&format!("delete node {n} --ignore-not-found"));
    }
    wait("no pod left on the group's nodes", 180, async || {
        (!live_pods(client)
            .await
            .iter()
            .any(|p| node_of(p).is_some_and(|n| nodes.iter().any(|x| x == n))))
        .then_some(())
    })
    .await;
    wait_no_pod(client, "gates-").await;
}
