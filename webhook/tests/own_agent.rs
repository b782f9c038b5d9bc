//! The node's own agent opens its gates one at a time (`--gates`): a gate
//! it removes while another still holds the node is removed before the
//! last gate's patch records the boot, so the update-after-reboot rule
//! would add it back in the same write, and the agent would remove it
//! again, write after write. Only that agent's own update is left alone;
//! anyone else's, or that token's on another node, is still re-gated.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kube::core::admission::AdmissionReview;
use nodegate_shared::NodeView;
use nodegate_shared::keys::READY_BOOT_ID_ANNOTATION as ANN;
use nodegate_webhook::fixtures::{
    ADMIN, CILIUM, kubelet_node, review, with_annotation, with_taints,
};
use nodegate_webhook::rules::{Request, Rule, Rules};
use serde_json::{Value, json};

const CSI: &str = "nodegate.dev/csi-not-ready=true:NoSchedule";
const AGENT: &str = "system:serviceaccount:nodegate:nodegate-agent";

fn rules() -> Rules {
    Rules::new(vec![
        format!("{CILIUM}=true:NoSchedule").parse().unwrap(),
        CSI.parse().unwrap(),
    ])
    .unwrap()
}

fn csi() -> Value {
    json!({"key": "nodegate.dev/csi-not-ready", "value": "true", "effect": "NoSchedule"})
}
fn cni() -> Value {
    json!({"key": CILIUM, "value": "true", "effect": "NoSchedule"})
}

/// `user` (with a node claim, when given) removes the cni gate of n1, which
/// rebooted since its agent was last ready (boot-1 recorded, boot-2 runs).
fn opens_cni(user: &str, claim: Option<&str>) -> Request {
    let node = |taints: Value| {
        with_taints(
            with_annotation(kubelet_node("n1", "boot-2", 0), ANN, "boot-1"),
            taints,
        )
    };
    let mut r = review(
        "u1",
        "UPDATE",
        None,
        user,
        node(json!([csi()])),
        Some(node(json!([cni(), csi()]))),
        false,
    );
    if let Some(c) = claim {
        r["request"]["userInfo"]["extra"] = json!({
            "authentication.kubernetes.io/node-name": [c],
            "authentication.kubernetes.io/pod-name": ["nodegate-agent-x"],
        });
    }
    serde_json::from_value::<AdmissionReview<NodeView>>(r)
        .unwrap()
        .request
        .unwrap()
}

#[test]
fn only_the_nodes_own_agent_may_open_one_gate_before_the_last() {
    let r = rules();
    // (who, node claim, is the cni gate added back)
    let cases = [
        ("the node's own agent", AGENT, Some("n1"), false),
        ("the agent's token of another node", AGENT, Some("n2"), true),
        (
            "the agent's ServiceAccount without a node claim",
            AGENT,
            None,
            true,
        ),
        (
            "another ServiceAccount on that node",
            "system:serviceaccount:nodegate:other",
            Some("n1"),
            true,
        ),
        ("an admin", ADMIN, None, true),
    ];
    for (who, user, claim, regated) in cases {
        let d = r.review(&opens_cni(user, claim));
        let added: Vec<String> = d
            .added
            .iter()
            .flat_map(|a| a.taints.iter().map(|t| t.key().to_owned()))
            .collect();
        assert_eq!(!added.is_empty(), regated, "{who}: {d:?}");
        assert_eq!(d.rule, Rule::UpdateAfterReboot, "{who}");
        if regated {
            assert_eq!(added, [CILIUM], "{who}: only the removed gate comes back");
        }
    }
}
