//! A node joins after the install: gated from its first stored version,
//! nothing bound until its agent is ready. Then its agent's token, stolen.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use nodegate_e2e::real_nodes::harness::{Harness, figure, step, wait};
use nodegate_e2e::real_nodes::lines::Lines;
use nodegate_e2e::real_nodes::live::{
    agent_pod, live_node, live_pods, stolen_agent_client, workload,
};
use nodegate_e2e::real_nodes::objects::{
    GATE, gated, name_of, node_of, pod_ready, taints, taints_json,
};
use nodegate_e2e::real_nodes::record::{bound_between, versions_after};
use nodegate_e2e::real_nodes::scenario::{Ctx, ready_and_ungated};
use serde_json::json;

/// A node joins after the install; then its agent's token, stolen.
pub(crate) async fn join(c: &Ctx) {
    let Ctx {
        h,
        client,
        rec,
        nodes0,
        ..
    } = c;
    step("a node joins: tainted from its first stored version, nothing bound until ready");
    let before_join = rec.last_rv();
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
        Lines::first_line(&h.lines().since(&lines).calls),
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
