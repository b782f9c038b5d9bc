//! What a scenario measured, the table `nodegate-sim run` prints, and the
//! guarantees it checks. Pure: no I/O, so the table and the verdicts are
//! plain functions of the numbers.

use std::time::Duration;

/// How long a rebooted node may look schedulable after the API server saw its
/// new bootID: the webhook's background patch is bounded to 1 s.
pub(crate) const REBOOT_WINDOW: Duration = Duration::from_secs(1);

/// What one scenario measured.
#[derive(Debug, Clone, Default)]
pub struct ScenarioReport {
    pub name: String,
    pub webhook: bool,
    pub nodes: usize,
    pub reboots: usize,
    /// Nodes whose create response already carried nodegate's taint.
    pub tainted_at_create: usize,
    /// Rebooted nodes on which the taint was seen again after the reboot.
    pub tainted_at_reboot: usize,
    pub pods_bound: usize,
    /// Pods bound to a node whose agent was not ready, outside the reboot window.
    pub violations: usize,
    /// Pods bound to a rebooting node before its taint could land: while the
    /// machine was down, or up to 1 s after the new bootID was written.
    pub reboot_window_binds: usize,
    /// Longest time from the kubelet's new-bootID status write to the taint being seen.
    pub max_reboot_taint_lag: Option<Duration>,
    /// Reboots whose first stored version with the new bootID had no taint,
    /// and the longest such window (as a watch saw it). 0 with the webhook:
    /// it re-taints when the kubelet re-registers, before its status write.
    pub reboots_stored_untainted: usize,
    pub max_untainted_new_boot_window: Option<Duration>,
    pub p50_reboot_taint_lag: Option<Duration>,
    pub webhook_calls: usize,
    pub webhook_p50: Option<Duration>,
    pub webhook_p99: Option<Duration>,
    /// The webhook's own count of taints added (its /metrics), by reason:
    /// (create, reboot). Reboot taints are added by its background patches.
    pub webhook_reported: Option<(u64, u64)>,
    /// Nodes created without nodegate's taint that the agent's start-up
    /// safety net tainted (webhook off).
    pub safety_net_taints: usize,
    /// nodegate's taint removed while the node's network agent was not ready.
    pub early_untaints: usize,
    /// From the probe file appearing to the taint gone (seen by a watch).
    pub p50_untaint_lag: Option<Duration>,
    pub max_untaint_lag: Option<Duration>,
    /// Nodes without nodegate's taint at the end, of all nodes.
    pub untainted_at_end: (usize, usize),
    pub prune: PruneReport,
    pub elapsed: Duration,
}

/// The agent restart with nodes deleted meanwhile.
#[derive(Debug, Clone, Default)]
pub struct PruneReport {
    /// Pruning agents stopped and restarted.
    pub agents: usize,
    /// Nodes deleted while they were down (one of them re-created).
    pub deleted: usize,
    /// Of those, re-created under their name: their old incarnation is held
    /// (a handler never gets a live node's name), not handled.
    pub held: usize,
    /// Fewest deleted nodes any restarted agent's handler got exactly once,
    /// with the old uid and source `snapshot`.
    pub exact_min: usize,
    /// Dispatched deletions of nodes that were not deleted (live ones, a
    /// held one, or any before the restart).
    pub false_prunes: usize,
    /// Deleted nodes back in an agent's snapshot or in the API.
    pub resurrected: usize,
}

fn ms(d: Option<Duration>) -> String {
    d.map(|d| format!("{:.1} ms", d.as_secs_f64() * 1000.0))
        .unwrap_or_else(|| "-".into())
}

/// Renders one cell of a table row.
/// How a table shows one report's cell of a row.
pub(crate) type Column<R> = Box<dyn Fn(&R) -> String>;

/// The table `nodegate-sim run` prints.
pub fn render_table(reports: &[ScenarioReport]) -> String {
    let rows: Vec<(&str, Column<ScenarioReport>)> = vec![
        ("nodes", Box::new(|r| r.nodes.to_string())),
        (
            "nodegate-agents (real logic) / pruning",
            Box::new(|r| format!("{} / {}", r.nodes, r.prune.agents)),
        ),
        ("rebooted nodes", Box::new(|r| r.reboots.to_string())),
        (
            "taint added at create",
            Box::new(|r| r.tainted_at_create.to_string()),
        ),
        (
            "taint added later by the agent's safety net",
            Box::new(|r| r.safety_net_taints.to_string()),
        ),
        (
            "taint back after reboot",
            Box::new(|r| r.tainted_at_reboot.to_string()),
        ),
        (
            "rebooted nodes stored untainted on the new boot",
            Box::new(|r| {
                format!(
                    "{} ({} max)",
                    r.reboots_stored_untainted,
                    ms(r.max_untainted_new_boot_window)
                )
            }),
        ),
        (
            "status write→taint lag p50",
            Box::new(|r| ms(r.p50_reboot_taint_lag)),
        ),
        (
            "status write→taint lag max",
            Box::new(|r| ms(r.max_reboot_taint_lag)),
        ),
        (
            "probe file→taint removed p50",
            Box::new(|r| ms(r.p50_untaint_lag)),
        ),
        (
            "probe file→taint removed max",
            Box::new(|r| ms(r.max_untaint_lag)),
        ),
        (
            "taint removed before the network agent was ready",
            Box::new(|r| r.early_untaints.to_string()),
        ),
        ("pods bound", Box::new(|r| r.pods_bound.to_string())),
        (
            "pods on a node whose agent was not ready",
            Box::new(|r| r.violations.to_string()),
        ),
        (
            "pods bound in a reboot window, before its taint",
            Box::new(|r| r.reboot_window_binds.to_string()),
        ),
        ("webhook calls", Box::new(|r| r.webhook_calls.to_string())),
        (
            "webhook metrics: taints create/reboot",
            Box::new(|r| {
                r.webhook_reported
                    .map(|(c, b)| format!("{c}/{b}"))
                    .unwrap_or_else(|| "-".into())
            }),
        ),
        ("webhook latency p50", Box::new(|r| ms(r.webhook_p50))),
        ("webhook latency p99", Box::new(|r| ms(r.webhook_p99))),
        (
            "stale nodes pruned after agent restart",
            Box::new(|r| {
                format!(
                    "{}/{} per agent, {} held",
                    r.prune.exact_min,
                    r.prune.deleted - r.prune.held,
                    r.prune.held
                )
            }),
        ),
        (
            "false prunes (live or not deleted)",
            Box::new(|r| r.prune.false_prunes.to_string()),
        ),
        (
            "deleted nodes resurrected",
            Box::new(|r| r.prune.resurrected.to_string()),
        ),
        (
            "nodes untainted at the end",
            Box::new(|r| format!("{}/{}", r.untainted_at_end.0, r.untainted_at_end.1)),
        ),
        (
            "scenario time",
            Box::new(|r| format!("{:.1} s", r.elapsed.as_secs_f64())),
        ),
    ];
    table(
        &reports.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        reports,
        &rows,
    )
}

/// A table with one column per report, headed by `names`, and one line per
/// row: its label, then each report's cell.
pub(crate) fn table<R>(names: &[&str], reports: &[R], rows: &[(&str, Column<R>)]) -> String {
    let w0 = rows
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = format!("{:w0$}", "");
    for name in names {
        out.push_str(&format!(" | {name:>18}"));
    }
    out.push('\n');
    out.push_str(&"-".repeat(w0 + reports.len() * 21));
    out.push('\n');
    for (label, f) in rows {
        let pad = w0 - label.chars().count();
        out.push_str(label);
        out.push_str(&" ".repeat(pad));
        for r in reports {
            out.push_str(&format!(" | {:>18}", f(r)));
        }
        out.push('\n');
    }
    out
}

/// What nodegate promises: the agent's in every scenario, the webhook's in
/// the one that has it.
pub fn broken_guarantees(reports: &[ScenarioReport]) -> Vec<String> {
    let mut broken = Vec::new();
    for r in reports {
        let n = &r.name;
        if r.early_untaints > 0 {
            broken.push(format!(
                "{n}: the agent removed the taint {} times before the network agent was ready",
                r.early_untaints
            ));
        }
        if r.untainted_at_end.0 != r.untainted_at_end.1 {
            broken.push(format!(
                "{n}: only {}/{} nodes were untainted at the end",
                r.untainted_at_end.0, r.untainted_at_end.1
            ));
        }
        let p = &r.prune;
        if p.agents > 0 && p.exact_min != p.deleted - p.held {
            broken.push(format!(
                "{n}: a restarted agent pruned only {}/{} nodes deleted while it was down exactly once",
                p.exact_min,
                p.deleted - p.held
            ));
        }
        if p.false_prunes > 0 {
            broken.push(format!(
                "{n}: {} deletions dispatched for nodes that were not deleted",
                p.false_prunes
            ));
        }
        if p.resurrected > 0 {
            broken.push(format!("{n}: {} deleted nodes resurrected", p.resurrected));
        }
    }
    for r in reports.iter().filter(|r| r.webhook) {
        // Reboot-window binds are counted apart: there, the taint lands by a
        // background patch after the kubelet's status write, when the
        // re-registration check could not run.
        let outside_window = r.violations;
        if outside_window > 0 {
            broken.push(format!(
                "{outside_window} pods landed on nodes whose agent was not ready"
            ));
        }
        if r.tainted_at_create != r.nodes {
            broken.push(format!(
                "only {}/{} new nodes were tainted at create",
                r.tainted_at_create, r.nodes
            ));
        }
        if r.tainted_at_reboot != r.reboots {
            broken.push(format!(
                "only {}/{} rebooted nodes got the taint back",
                r.tainted_at_reboot, r.reboots
            ));
        }
        if r.reboots_stored_untainted > 0 {
            broken.push(format!(
                "{} rebooted nodes were stored with their new bootID and without the taint (window up to {})",
                r.reboots_stored_untainted,
                ms(r.max_untainted_new_boot_window)
            ));
        }
        if r.max_reboot_taint_lag.is_some_and(|l| l > REBOOT_WINDOW) {
            broken.push(format!(
                "a reboot taint took {} (> 1 s)",
                ms(r.max_reboot_taint_lag)
            ));
        }
    }
    broken
}
