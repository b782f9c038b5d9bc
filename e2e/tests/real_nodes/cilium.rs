//! Beside Cilium's own operator: a stand-in Cilium DaemonSet with the probes
//! Cilium's chart sets, and the stand-in of cilium-operator's node-taint
//! controller (`e2e/src/cilium_operator`, configured from a `cilium-config`
//! ConfigMap holding Helm's defaults), on the same real nodes as nodegate.
//!
//! nodegate owns `nodegate.dev/agent-not-ready`, the operator owns
//! `node.cilium.io/agent-not-ready`. Each scenario asserts that nodegate's
//! gate is on the node from its first version of a new boot until its agent
//! is ready, that nothing is bound to the node in between, and counts the
//! Node writes of both from the API server's audit log, with a quiet window
//! after the node settled in which neither may write again (no loop).

use k8s_openapi::jiff::Timestamp;
use nodegate_e2e::cilium_operator::decide::has_cilium_is_up_condition;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use nodegate_e2e::real_nodes::harness::{Harness, figure, step, wait};
use nodegate_e2e::real_nodes::live::{agent_pod, live_node, live_pods, node_names, workload};
use nodegate_e2e::real_nodes::objects::{
    NS, boot_gated, boot_id, gated, name_of, node_of, ns_of, pod_ready, taints, uid_of,
};
use nodegate_e2e::real_nodes::record::{
    Recorder, Seen, first_version, uids_bound_to, versions_after,
};
use nodegate_e2e::real_nodes::scenario::{Ctx, crash_to_new_boot};

use crate::cilium_operator::{Operator, Writes, writes};
use crate::strict::{Install, switch};

const CILIUM_KEY: &str = "node.cilium.io/agent-not-ready";

pub(crate) const CILIUM_NS: &str = "kube-system";

/// Crash reboots in a row.
const CRASHES: usize = 10;

/// After a node settled, neither nodegate nor the operator may write it
/// again for this long: a loop between them would.
const QUIET: Duration = Duration::from_secs(8);

fn operator_tainted(n: &Node) -> bool {
    taints(n).iter().any(|(k, _)| k == CILIUM_KEY)
}

fn ready_boot(n: &Node) -> Option<&str> {
    n.metadata
        .annotations
        .as_ref()?
        .get(nodegate_shared::keys::READY_BOOT_ID_ANNOTATION)
        .map(String::as_str)
}

fn is_cilium(p: &Pod) -> bool {
    ns_of(p) == CILIUM_NS
        && p.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.get("k8s-app").map(String::as_str) == Some("cilium"))
}

fn owned_by_daemonset(p: &Pod) -> bool {
    p.metadata
        .owner_references
        .as_ref()
        .is_some_and(|o| o.iter().any(|o| o.kind == "DaemonSet"))
}

/// The network agent of `node` turns healthy: its CNI config is on disk
/// (the agent's file probe), then its health endpoint answers. Returns the
/// moment it answers.
fn healthy(h: &Harness, node: &str) -> Instant {
    let d = h.node_dir(node);
    let conf = d.join("cni-net.d/05-cilium.conflist");
    if !conf.exists() {
        std::fs::copy(d.join("standin.conflist"), &conf).unwrap();
    }
    std::fs::create_dir_all(d.join("run/standin")).unwrap();
    let t = Instant::now();
    std::fs::write(d.join("run/standin/healthz"), "ok").unwrap();
    t
}

/// What one join or reboot looked like.
struct Gating {
    /// Health endpoint up → nodegate's gate gone, ms.
    nodegate_ms: u128,
    /// Health endpoint up → the operator's taint gone (its path: the pod's
    /// probes, then the operator), ms.
    operator_ms: u128,
    writes: Writes,
    versions: usize,
}

/// Waits until `node` settled (no gate of either, its Cilium pod Ready, the
/// operator's condition set), then observes it for [`QUIET`] and asserts
/// that neither nodegate nor the operator wrote it in that window.
async fn settle(c: &Ctx, node: &str, what: &str) -> Timestamp {
    let Ctx { h, client, .. } = c;
    wait(&format!("{what}: {node} settled"), 90, async || {
        let n = live_node(client, node).await?;
        let pods = live_pods(client).await;
        let cilium_ready = pods.iter().any(|p| {
            is_cilium(p)
                && node_of(p) == Some(node)
                && p.metadata.deletion_timestamp.is_none()
                && pod_ready(p)
        });
        (!gated(&n) && !operator_tainted(&n) && cilium_ready && has_cilium_is_up_condition(&n))
            .then_some(())
    })
    .await;
    let settled = Timestamp::now();
    tokio::time::sleep(QUIET).await;
    let after = writes(h, &[node], settled, Timestamp::now());
    assert_eq!(
        after.total(),
        0,
        "{what}: nodegate and the operator kept writing {node} after it settled: {after:?}"
    );
    settled
}

/// From `before` (the resourceVersion before the node's new boot or join)
/// to `ready_rv` (the agent's ready patch): nodegate's gate on every
/// version, and nothing but DaemonSet pods bound to the node.
fn assert_gated_until_ready(
    rec: &Recorder,
    node: &str,
    first_gated: u64,
    ready_rv: u64,
    bound_before: &BTreeSet<String>,
    what: &str,
) {
    let lost: Vec<u64> = versions_after(rec, node, first_gated - 1)
        .into_iter()
        .filter(|s| s.rv < ready_rv && !gated(&s.obj))
        .map(|s| s.rv)
        .collect();
    assert!(
        lost.is_empty(),
        "{what}: versions of {node} without nodegate's gate before its agent was ready: {lost:?}"
    );
    let bound: Vec<String> = rec
        .pods()
        .into_iter()
        .filter(|s| s.rv > first_gated && s.rv < ready_rv)
        .filter(|s| node_of(&s.obj) == Some(node) && !owned_by_daemonset(&s.obj))
        .filter(|s| !bound_before.contains(uid_of(&s.obj)))
        .map(|s| name_of(&s.obj).to_string())
        .collect();
    assert!(
        bound.is_empty(),
        "{what}: pods bound to {node} while gated: {bound:?}"
    );
}

/// The first version of `node` after `since` in which its agent recorded
/// `boot` as ready and removed nodegate's gate, in one write.
async fn agent_ready_version(rec: &Recorder, node: &str, since: u64, boot: &str) -> Seen<Node> {
    let v = first_version(
        rec,
        node,
        since,
        &format!("{node} without nodegate's gate"),
        60,
        |n| !gated(n),
    )
    .await;
    assert_eq!(
        ready_boot(&v.obj),
        Some(boot),
        "nodegate's gate left {node} in a write other than its agent's ready patch"
    );
    v
}

/// Health up → each path's untaint; then settle and count. Writes are
/// counted from `start_rv`; the agent's ready patch is the first ungated
/// version after `gated_rv` (a node's last versions of the old boot, before
/// a reboot re-gates it, are ungated too).
async fn measure(
    c: &Ctx,
    node: &str,
    what: &str,
    start: Timestamp,
    (start_rv, gated_rv): (u64, u64),
    boot: &str,
) -> (Gating, u64) {
    let Ctx { h, rec, .. } = c;
    let t_health = healthy(h, node);
    let health_rv = rec.last_rv();
    let ready = agent_ready_version(rec, node, gated_rv, boot).await;
    let nodegate_ms = ready.at.saturating_duration_since(t_health).as_millis();
    settle(c, node, what).await;
    let op_free = versions_after(rec, node, health_rv)
        .into_iter()
        .find(|s| !operator_tainted(&s.obj) && !gated(&s.obj))
        .unwrap();
    let operator_ms = op_free.at.saturating_duration_since(t_health).as_millis();
    // The window closes at the end of the quiet period.
    let w = writes(h, &[node], start, Timestamp::now());
    let versions = versions_after(rec, node, start_rv).len();
    figure(&format!("{what}_nodegate_ms"), nodegate_ms);
    figure(&format!("{what}_operator_path_ms"), operator_ms);
    figure(&format!("{what}_writes_nodegate"), w.nodegate);
    figure(&format!("{what}_writes_operator"), w.operator);
    figure(&format!("{what}_writes_refused"), w.refused);
    figure(&format!("{what}_node_versions"), versions);
    (
        Gating {
            nodegate_ms,
            operator_ms,
            writes: w,
            versions,
        },
        ready.rv,
    )
}

fn summary(name: &str, runs: &[Gating]) {
    let mut ng: Vec<u128> = runs.iter().map(|g| g.nodegate_ms).collect();
    let mut op: Vec<u128> = runs.iter().map(|g| g.operator_ms).collect();
    ng.sort_unstable();
    op.sort_unstable();
    let p50 = |v: &[u128]| v[v.len() / 2];
    figure(&format!("{name}_runs"), runs.len());
    figure(&format!("{name}_nodegate_ms_p50"), p50(&ng));
    figure(
        &format!("{name}_nodegate_ms_range"),
        format!("{}-{}", ng[0], ng[ng.len() - 1]),
    );
    figure(&format!("{name}_operator_path_ms_p50"), p50(&op));
    figure(
        &format!("{name}_operator_path_ms_range"),
        format!("{}-{}", op[0], op[op.len() - 1]),
    );
    let w: Vec<u64> = runs.iter().map(|g| g.writes.total()).collect();
    let v: Vec<usize> = runs.iter().map(|g| g.versions).collect();
    figure(&format!("{name}_writes_per_run"), format!("{w:?}"));
    figure(&format!("{name}_versions_per_run"), format!("{v:?}"));
}

pub(crate) async fn cilium(c: &Ctx) {
    let Ctx { h, client, .. } = c;
    step("beside cilium-operator: its stand-in and a Cilium DaemonSet with Cilium's probes");
    let _operator = Operator::start(h);
    // Nodes that run already: healthy, so their Cilium pods turn Ready and
    // the operator sets its condition; nothing to untaint.
    for n in node_names(client).await {
        healthy(h, &n);
    }
    for n in node_names(client).await {
        settle(c, &n, "cilium_install").await;
    }
    let check = h.sh("nodegate-check");
    let report = String::from_utf8_lossy(&check.stdout);
    println!("{report}");
    assert!(
        check.status.success(),
        "nodegate-check failed beside Cilium"
    );
    // The node this module joins, crashes and reboots: from node5 on (a
    // rerun on a kept cluster joins another).
    let node = h.fresh_node(5);
    let mut runs = vec![join(c, &node).await];
    summary("cilium_join", &runs);
    let mut crashes = Vec::new();
    for i in 0..CRASHES {
        crashes.push(reboot(c, &node, &format!("cilium_crash{i}"), Reboot::Crash).await);
    }
    summary("cilium_crash", &crashes);
    let graceful = vec![reboot(c, &node, "cilium_graceful", Reboot::Graceful).await];
    summary("cilium_graceful", &graceful);
    // Strict mode: the operator removes every effect of its own key, and
    // nodegate's boot gate is not under it.
    switch(c, Install::Strict).await;
    let strict = reboot(c, &node, "cilium_strict_crash", Reboot::Strict).await;
    switch(c, Install::Default).await;
    // In strict mode nodegate writes once more: the boot gate follows the
    // stored new boot, a write of its own after the re-registration's.
    assert!(
        strict.writes.nodegate <= 3 && strict.writes.operator <= 4,
        "a strict-mode reboot took more Node writes than each owner's own: {:?}",
        strict.writes
    );
    agent_rollout(c).await;
    cilium_rollout(c).await;
    runs.extend(crashes);
    runs.extend(graceful);
    // nodegate's share is its minimum: the ready patch, and at a reboot the
    // re-registration's re-taint. The operator's: its taint, its removal,
    // and at a join its condition, which it may write twice on its own (the
    // second from a cache that lacks the first; the stand-in alone does it).
    for g in &runs {
        assert!(
            g.writes.nodegate <= 2 && g.writes.operator <= 4,
            "a join or reboot took more Node writes than each owner's own: {:?}",
            g.writes
        );
    }
    runs.push(strict);
    summary("cilium_all", &runs);
}

/// A node joins: gated by nodegate from its first version; the operator
/// taints it with its own key while its Cilium pod is not Ready.
async fn join(c: &Ctx, node: &str) -> Gating {
    let Ctx { h, client, rec, .. } = c;
    step("cilium: a node joins");
    let start = Timestamp::now();
    let before = rec.last_rv();
    h.kubectl(&format!(
        "apply -f - <<'EOF'\n{}EOF",
        workload("cilium-pinned", node, 2)
    ));
    h.cluster(&["add-node", node]);
    let first = first_version(rec, node, before, "the first version", 60, |_| true).await;
    assert!(
        gated(&first.obj),
        "{node}'s first version lacks nodegate's gate: {:?}",
        taints(&first.obj)
    );
    agent_pod(client, node).await;
    // The operator sees the Cilium pod scheduled, not Ready: its own taint.
    first_version(
        rec,
        node,
        before,
        "the operator's taint",
        60,
        operator_tainted,
    )
    .await;
    let boot = wait("the bootID", 60, async || {
        boot_id(&live_node(client, node).await?)
    })
    .await;
    let (g, ready_rv) = measure(c, node, "cilium_join", start, (before, before), &boot).await;
    assert_gated_until_ready(rec, node, first.rv, ready_rv, &BTreeSet::new(), "join");
    g
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Reboot {
    Crash,
    /// The agent's shutdown re-taint first, as on a node whose shutdown
    /// stops its pods before the machine goes down.
    Graceful,
    /// A crash in strict mode: the boot gate must hold too.
    Strict,
}

/// A reboot of `node`.
async fn reboot(c: &Ctx, node: &str, what: &str, kind: Reboot) -> Gating {
    let Ctx { h, client, rec, .. } = c;
    step(&format!("cilium: {what}"));
    let start = Timestamp::now();
    let before = rec.last_rv();
    let bound_before = uids_bound_to(rec, node, before);
    if kind == Reboot::Graceful {
        // The machine stops its pods: the network agent goes down with them.
        h.cluster(&["unready", node]);
        let agent = agent_pod(client, node).await;
        h.kubectl(&format!(
            "-n {NS} delete pod {} --wait=false",
            name_of(&agent)
        ));
        first_version(
            rec,
            node,
            before,
            "the agent's shutdown re-taint",
            30,
            gated,
        )
        .await;
    }
    let crash = crash_to_new_boot(c, node, &[]).await;
    crash.assert_gated(what);
    let new_boot = crash.first;
    let boot = boot_id(&new_boot.obj).unwrap();
    let first_gated = versions_after(rec, node, before)
        .into_iter()
        .find(|s| gated(&s.obj))
        .unwrap();
    // The agent runs again on the new boot before its network agent is up.
    wait(&format!("{what}: agent restarted"), 120, async || {
        let p = rec
            .pods()
            .into_iter()
            .filter(|s| s.rv > new_boot.rv && node_of(&s.obj) == Some(node))
            .find(|s| name_of(&s.obj).starts_with("nodegate-agent-") && pod_ready(&s.obj));
        p.map(|_| ())
    })
    .await;
    // Strict mode's boot gate follows the stored new boot (never the
    // re-registration's claim): the version after the first of the new boot
    // or soon after, before the agent is ready.
    let boot_gate = if kind == Reboot::Strict {
        let g = first_version(rec, node, new_boot.rv - 1, "the boot gate", 30, boot_gated).await;
        figure(
            &format!("{what}_new_boot_to_boot_gate_ms"),
            g.at.saturating_duration_since(new_boot.at).as_millis(),
        );
        g.rv
    } else {
        new_boot.rv
    };
    let (g, ready_rv) = measure(c, node, what, start, (before, first_gated.rv), &boot).await;
    assert_gated_until_ready(rec, node, first_gated.rv, ready_rv, &bound_before, what);
    if kind == Reboot::Strict {
        assert!(
            boot_gate < ready_rv,
            "{what}: the boot gate came after the agent was ready"
        );
        let lost: Vec<u64> = versions_after(rec, node, boot_gate - 1)
            .into_iter()
            .filter(|s| s.rv < ready_rv && !boot_gated(&s.obj))
            .map(|s| s.rv)
            .collect();
        assert!(
            lost.is_empty(),
            "{what}: the boot gate was lost in {lost:?}"
        );
    }
    g
}

/// After a rollout: every node settled (and quiet), then the writes of
/// nodegate and the operator on them since `start`, printed as
/// `<what>_nodes` and `<what>_writes_*`.
async fn settled_writes(c: &Ctx, what: &str, nodes: &[String], start: Timestamp) -> Writes {
    for n in nodes {
        settle(c, n, what).await;
    }
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let w = writes(&c.h, &names, start, Timestamp::now());
    figure(&format!("{what}_nodes"), nodes.len());
    figure(&format!("{what}_writes_nodegate"), w.nodegate);
    figure(&format!("{what}_writes_operator"), w.operator);
    w
}

/// nodegate's agents roll: each re-taints on shutdown and untaints when its
/// successor is ready; the operator has nothing to do.
async fn agent_rollout(c: &Ctx) {
    let Ctx { h, client, rec, .. } = c;
    step("cilium: nodegate's agent DaemonSet rolls");
    let nodes = node_names(client).await;
    let start = Timestamp::now();
    let before = rec.last_rv();
    h.kubectl(&format!("-n {NS} rollout restart daemonset/nodegate-agent"));
    h.kubectl(&format!(
        "-n {NS} rollout status daemonset/nodegate-agent --timeout=300s"
    ));
    let w = settled_writes(c, "cilium_agent_rollout", &nodes, start).await;
    assert_eq!(
        w.operator, 0,
        "the operator wrote during nodegate's rollout"
    );
    assert!(
        w.nodegate <= 2 * nodes.len() as u64,
        "more than a re-taint and an untaint per node: {w:?}"
    );
    // Each shutdown re-taint lasts until the successor's ready patch, and
    // nothing is bound to the node in between.
    for n in &nodes {
        let versions = versions_after(rec, n, before);
        let Some(from) = versions.iter().find(|s| gated(&s.obj)) else {
            continue;
        };
        let to = versions
            .iter()
            .find(|s| s.rv > from.rv && !gated(&s.obj))
            .map_or(u64::MAX, |s| s.rv);
        let bound = uids_bound_to(rec, n, before);
        assert_gated_until_ready(rec, n, from.rv, to, &bound, "agent rollout");
    }
}

/// Cilium's DaemonSet rolls (maxUnavailable 2, as the chart sets): each old
/// pod's health endpoint goes down as it stops (its preStop), the new one's
/// comes up when it runs. The operator taints each node meanwhile and
/// removes its taint when the new pod is Ready; nodegate's agent, not
/// continuous, leaves that taint alone.
async fn cilium_rollout(c: &Ctx) {
    let Ctx { h, client, rec, .. } = c;
    step("cilium: the Cilium DaemonSet rolls");
    let nodes = node_names(client).await;
    let start = Timestamp::now();
    let before = rec.last_rv();
    let old: BTreeSet<String> = live_pods(client)
        .await
        .iter()
        .filter(|p| is_cilium(p))
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    h.kubectl(&format!("-n {CILIUM_NS} rollout restart daemonset/cilium"));
    // The new pod of each node runs: its agent turns healthy.
    let mut up: BTreeSet<String> = BTreeSet::new();
    wait(
        "every new Cilium pod running and healthy",
        300,
        async || {
            for p in live_pods(client).await {
                let running = p
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                    });
                let fresh = !old.contains(uid_of(&p));
                if let Some(n) = node_of(&p).filter(|_| is_cilium(&p) && fresh && running)
                    && up.insert(n.to_string())
                {
                    healthy(h, n);
                }
            }
            (up.len() == nodes.len()).then_some(())
        },
    )
    .await;
    h.kubectl(&format!(
        "-n {CILIUM_NS} rollout status daemonset/cilium --timeout=300s"
    ));
    let w = settled_writes(c, "cilium_rollout", &nodes, start).await;
    let versions: usize = nodes
        .iter()
        .map(|n| versions_after(rec, n, before).len())
        .sum();
    figure("cilium_rollout_node_versions", versions);
    assert_eq!(
        w.nodegate, 0,
        "nodegate wrote during Cilium's rollout: {w:?}"
    );
    assert!(
        w.operator <= 2 * nodes.len() as u64,
        "more than a taint and an untaint per node by the operator: {w:?}"
    );
    for n in &nodes {
        assert!(
            versions_after(rec, n, before)
                .iter()
                .all(|s| !gated(&s.obj)),
            "{n} got nodegate's gate during Cilium's rollout"
        );
    }
}
