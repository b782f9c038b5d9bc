//! The webhook's token, stolen: it may add nodegate's taint and change
//! nothing else.

use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use nodegate_shared::keys::EXCLUDE_LABEL;
use serde_json::json;

use crate::support::node_writes::{json_patch, patch};
use crate::support::refusals::{WEBHOOK_POLICY, assert_refused};
use crate::support::taints::{TAINT_KEY, taints};
use crate::support::target_node::node;

#[tokio::test]
async fn the_webhook_token_can_only_add_the_taint() {
    let c = Cluster::start().await.unwrap();
    let a = node(&c, "conf-w").await;
    let webhook = c.client(users::WEBHOOK).await.unwrap();
    // Remove the gate as admin, so the webhook has something to add.
    let admin = c.client(users::ADMIN).await.unwrap();
    json_patch(
        &admin,
        &a,
        json!([{"op": "remove", "path": "/spec/taints/0"}]),
    )
    .await
    .unwrap();
    assert_refused(
        "webhook removes a taint",
        json_patch(
            &webhook,
            &a,
            json!([{"op": "remove", "path": "/spec/taints/0"}]),
        )
        .await,
        &[WEBHOOK_POLICY, "may only add the taints"],
    );
    assert_refused(
        "webhook adds a foreign taint",
        json_patch(
            &webhook,
            &a,
            json!([{"op": "add", "path": "/spec/taints/-",
            "value": {"key": "example.com/evil", "effect": "NoExecute"}}]),
        )
        .await,
        &[WEBHOOK_POLICY, "may only add the taints"],
    );
    assert_refused(
        "webhook labels",
        patch(
            &webhook,
            &a,
            json!({"metadata": {"labels": {EXCLUDE_LABEL: "true"}}}),
        )
        .await,
        &[WEBHOOK_POLICY, "may change nothing but spec.taints"],
    );
    json_patch(
        &webhook,
        &a,
        json!([{"op": "add", "path": "/spec/taints/-",
        "value": {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}}]),
    )
    .await
    .unwrap();
    assert_eq!(
        taints(&c, &a).await,
        [
            "example.com/dedicated:NoSchedule".to_string(),
            format!("{TAINT_KEY}:NoSchedule")
        ]
    );
}
