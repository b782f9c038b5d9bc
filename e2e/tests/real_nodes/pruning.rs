//! Pruning: a node deleted while the agents were down is pruned once by
//! each returning agent. Then the run's figures: memory, and no node left
//! gated.

use nodegate_e2e::real_nodes::harness::{figure, step, wait};
use nodegate_e2e::real_nodes::live::{all_nodegate_ready, live_pods, node_names, wait_no_pod};
use nodegate_e2e::real_nodes::objects::{NS, gated, name_of, node_of};
use nodegate_e2e::real_nodes::record::node_now;
use nodegate_e2e::real_nodes::scenario::Ctx;

/// Pruning: a node deleted while the agents were down.
pub(crate) async fn pruning(c: &Ctx) {
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

/// Figures: memory as the nodes' cgroups report it; and no node left gated.
pub(crate) async fn memory_and_nothing_gated(c: &Ctx) {
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
        .filter(|n| node_now(rec, n).is_some_and(|n| gated(&n)))
        .collect();
    assert!(gated_now.is_empty(), "nodes left gated: {gated_now:?}");
}
