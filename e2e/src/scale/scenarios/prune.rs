//! Scenario 5, pruning with the roster: `k` nodes deleted while every
//! agent is down; each agent prunes each exactly once when back, and none a
//! node that still exists.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use tokio::time::Instant;

use super::{Ctx, Report, all_ungated};
use crate::scale::control_plane::wait_ok;
use crate::scale::fleet::node_name;

pub async fn prune(c: &Ctx<'_>, r: &mut Report, k: usize, dir: &Path) -> anyhow::Result<()> {
    println!("\n== pruning: {k} nodes deleted while the agents are down");
    let names = c.fleet.names();
    let gone: Vec<String> = names.iter().rev().step_by(3).take(k).cloned().collect();
    delete_while_down(c, &gone).await?;
    let published = wait_unlisted(c, &gone).await;
    let t0 = Instant::now();
    c.fleet.start_agents().await;
    let agents: Vec<String> = names
        .iter()
        .filter(|n| !gone.contains(n))
        .cloned()
        .collect();
    let expected = (agents.len() - 1) * k; // node 0's process counts in its own file
    let pruned_file = dir.join("nodes").join(node_name(0)).join("pruned.txt");
    let budget = Duration::from_secs_f64(60.0 + (agents.len() * k) as f64 / 200.0 * 1.5);
    let done = wait_ok("every agent's prunes", budget, || async {
        let file_lines = std::fs::read_to_string(&pruned_file)
            .map(|s| s.lines().count())
            .unwrap_or(0);
        (total_runs(c) >= expected && file_lines >= k).then_some(())
    })
    .await;
    let took = t0.elapsed();
    // A moment for duplicates to show: the handler count must stay put.
    let counts = c.fleet.prunes.lock().map(|p| p.clone()).unwrap_or_default();
    let (wrong, extra) = pairs_off(&counts, &agents, &gone);
    let file = std::fs::read_to_string(&pruned_file).unwrap_or_default();
    let process_ok = each_once(&file, &gone);
    r.figure("prune_deleted", k);
    r.figure("prune_agents", agents.len());
    r.figure("prune_handler_runs", total_runs(c) + file.lines().count());
    r.figure("prune_expected_runs", expected + k);
    r.figure("prune_pairs_not_exactly_once", wrong);
    r.figure("prune_runs_for_live_nodes", extra);
    r.figure("prune_agent_process_exactly_once", process_ok);
    r.figure("prune_s", format!("{:.1}", took.as_secs_f64()));
    r.goal(published.is_ok() && done.is_ok() && wrong == 0 && extra == 0 && process_ok,
        format!("prune: each agent pruned each deleted node exactly once ({wrong} pairs off, {extra} extra, process {process_ok}, {done:?})"));
    // Every agent back: nothing left gated by the shutdown re-taint.
    let ungated = wait_ok(
        "every node ungated after the agents' restart",
        Duration::from_secs(120),
        || async { all_ungated(&c.rec, &agents).then_some(()) },
    )
    .await;
    r.goal(
        ungated.is_ok(),
        format!("prune: nodes ungated again ({ungated:?})"),
    );
    Ok(())
}

/// Every agent stopped, the handler counts cleared, then `gone` powered
/// off and deleted.
async fn delete_while_down(c: &Ctx<'_>, gone: &[String]) -> anyhow::Result<()> {
    // Agents' first snapshots are written within --snapshot-interval (1 s)
    // of their roster view; they have been up for minutes here.
    c.fleet.stop_agents().await;
    if let Ok(mut p) = c.fleet.prunes.lock() {
        p.clear();
    }
    let nodes: Api<Node> = Api::all(c.admin.clone());
    for g in gone {
        c.fleet.power_off(g)?;
        nodes
            .delete(g, &DeleteParams::default())
            .await
            .with_context(|| format!("deleting {g}"))?;
    }
    Ok(())
}

/// Until the roster no longer lists `gone` (and still lists node 0).
async fn wait_unlisted(c: &Ctx<'_>, gone: &[String]) -> anyhow::Result<()> {
    let cms: Api<ConfigMap> = Api::namespaced(c.admin.clone(), "nodegate");
    wait_ok(
        "the roster without the deleted nodes",
        Duration::from_secs(120),
        || async {
            let list = cms
                .list(&ListParams::default().labels("nodegate.dev/roster"))
                .await
                .ok()?;
            // Names are fixed width: one never contains another.
            let text: String = list
                .items
                .iter()
                .filter_map(|cm| cm.data.as_ref()?.get("roster.json").cloned())
                .collect();
            (!list.items.is_empty()
                && text.contains(&node_name(0))
                && gone.iter().all(|g| !text.contains(g.as_str())))
            .then_some(())
        },
    )
    .await
}

/// The in-process agents' handler runs so far.
fn total_runs(c: &Ctx<'_>) -> usize {
    c.fleet
        .prunes
        .lock()
        .map(|p| p.values().map(|v| *v as usize).sum())
        .unwrap_or(0)
}

/// (agent, deleted node) pairs of the in-process agents (not node 0's
/// process) not run exactly once, and runs for nodes that were not deleted.
fn pairs_off(
    counts: &BTreeMap<(String, String), u32>,
    agents: &[String],
    gone: &[String],
) -> (usize, usize) {
    let gone_set: HashSet<&String> = gone.iter().collect();
    let mut wrong = 0;
    for a in agents.iter().filter(|a| **a != node_name(0)) {
        for g in gone {
            if counts.get(&(a.clone(), g.clone())).copied().unwrap_or(0) != 1 {
                wrong += 1;
            }
        }
    }
    let extra = counts.keys().filter(|(_, g)| !gone_set.contains(g)).count();
    (wrong, extra)
}

/// Node 0's agent process wrote each deleted node once, and nothing else.
fn each_once(file: &str, gone: &[String]) -> bool {
    let mut file_lines: Vec<&str> = file.lines().collect();
    file_lines.sort();
    let mut want: Vec<&str> = gone.iter().map(String::as_str).collect();
    want.sort();
    file_lines == want
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn pairs_off_counts_missing_duplicate_and_live_runs() {
        let agents = s(&[&node_name(0), &node_name(1), &node_name(2)]);
        let gone = s(&[&node_name(8), &node_name(9)]);
        let mut counts = BTreeMap::new();
        for a in [node_name(1), node_name(2)] {
            for g in &gone {
                counts.insert((a.clone(), g.clone()), 1);
            }
        }
        assert_eq!(pairs_off(&counts, &agents, &gone), (0, 0));
        counts.insert((node_name(1), node_name(8)), 2);
        counts.remove(&(node_name(2), node_name(9)));
        counts.insert((node_name(2), node_name(0)), 1);
        assert_eq!(pairs_off(&counts, &agents, &gone), (2, 1));
    }

    #[test]
    fn the_process_wrote_each_deleted_node_once() {
        let gone = s(&["b", "a"]);
        assert!(each_once("a\nb\n", &gone));
        assert!(!each_once("a\nb\nb\n", &gone));
        assert!(!each_once("a\n", &gone));
    }
}
