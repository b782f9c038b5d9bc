//! The shipped RBAC (webhook, agent, pruning and probe-pod components)
//! loaded into the emulator's authorizer: each identity may do what its
//! workload needs and nothing else.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use serde_json::json;

async fn nodes(emu: &Emulator, user: &str) -> Api<Node> {
    Api::all(emu.client(user).await.unwrap())
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"pool": "a"}},
        "status": {"nodeInfo": {"bootID": "boot-1"}}
    }))
    .unwrap()
}

fn api_reason(e: &kube::Error) -> (u16, String, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason.clone(), s.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn shipped_rbac_is_enforced() {
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(nodegate_e2e::process::shipped_rbac().unwrap()),
        ..Default::default()
    })
    .await
    .unwrap();
    nodes(&emu, users::ADMIN)
        .await
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    // The webhook may get and patch Nodes, nothing else.
    let webhook = nodes(&emu, users::WEBHOOK).await;
    webhook.get("a").await.unwrap();
    webhook
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
        )
        .await
        .unwrap();
    let err = webhook.list(&ListParams::default()).await.unwrap_err();
    let (code, _, msg) = api_reason(&err);
    assert_eq!(code, 403);
    assert!(
        msg.contains("User \"system:serviceaccount:nodegate:nodegate-webhook\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"),
        "{msg}"
    );
    // The agent cannot delete Nodes or write their status.
    let agent = nodes(&emu, users::AGENT).await;
    agent.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        api_reason(
            &agent
                .delete("a", &DeleteParams::default())
                .await
                .unwrap_err()
        )
        .0,
        403
    );
    let err = agent
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_reason(&err).0, 403);
    // An unknown service account can do nothing.
    let nobody = nodes(&emu, "system:serviceaccount:default:nobody").await;
    assert_eq!(api_reason(&nobody.get("a").await.unwrap_err()).0, 403);
}
