//! The webhook's token, stolen: it may add nodegate's taint and change
//! nothing else.

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use nodegate_shared::keys::EXCLUDE_LABEL;
use serde_json::json;

use crate::support::credentials::{bound_token_request, impersonating, token_client};
use crate::support::node_writes::{json_patch, patch};
use crate::support::refusals::{WEBHOOK_POLICY, assert_refused};
use crate::support::taints::{TAINT_KEY, taints};
use crate::support::target_node::node;

/// A node named from `base` whose gate the admin removed, so the webhook
/// has something to add.
async fn ungated_node(c: &Cluster, base: &str) -> String {
    let a = node(c, base).await;
    let admin = c.client(users::ADMIN).await.unwrap();
    json_patch(
        &admin,
        &a,
        json!([{"op": "remove", "path": "/spec/taints/0"}]),
    )
    .await
    .unwrap();
    a
}

#[tokio::test]
async fn the_webhook_token_can_only_add_the_taint() {
    let c = Cluster::start().await.unwrap();
    let a = ungated_node(&c, "conf-w").await;
    let webhook = c.webhook_client().await.unwrap();
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

/// The webhook's power belongs to its Pods. Threat: a namespace editor (the
/// bootstrap `edit` and `admin` roles may impersonate the namespace's
/// ServiceAccounts and read its Secrets) taints any node as
/// `nodegate-webhook`, in strict mode with the evicting gate. Check: the
/// write carries the claims of a token bound to a Pod of the webhook's
/// StatefulSet (`nodegate-webhook-<ordinal>`). Each credential short of that
/// is refused, naming what it lacked.
#[tokio::test]
async fn only_a_pod_of_the_webhook_statefulset_writes_as_the_webhook() {
    let c = Cluster::start().await.unwrap();
    let a = ungated_node(&c, "conf-wpod").await;
    let admin = c.client(users::ADMIN).await.unwrap();
    let add_gate = json!([{"op": "add", "path": "/spec/taints/-",
        "value": {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}}]);
    // What an editor gets by impersonating the ServiceAccount.
    let impersonated = impersonating(&c, users::WEBHOOK, &[]).await;
    // What a token Secret of the ServiceAccount holds: no bound object.
    let unbound = webhook_token(&c, None).await;
    // A Pod of the ServiceAccount outside the StatefulSet's names.
    let pod = c.name("evil");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "nodegate");
    let evil: Pod = serde_json::from_value(json!({
        "metadata": {"name": pod, "namespace": "nodegate"},
        "spec": {"serviceAccountName": "nodegate-webhook",
                 "containers": [{"name": "webhook", "image": "nodegate/nodegate-webhook:e2e"}]},
    }))
    .unwrap();
    let evil = pods.create(&PostParams::default(), &evil).await.unwrap();
    c.delete_on_drop("pods", "nodegate", &pod);
    let other_pod = webhook_token(&c, Some(&evil)).await;
    for (who, client, needle) in [
        ("impersonated", &impersonated, "a token without pod claims"),
        (
            "a token bound to nothing",
            &unbound,
            "a token without pod claims",
        ),
        ("a token of another pod", &other_pod, pod.as_str()),
    ] {
        assert_refused(
            who,
            json_patch(client, &a, add_gate.clone()).await,
            &[
                WEBHOOK_POLICY,
                "only with the token of a pod of its StatefulSet",
                needle,
            ],
        );
    }
    assert!(
        !taints(&c, &a)
            .await
            .iter()
            .any(|t| t.starts_with(TAINT_KEY)),
        "no refused write left the gate"
    );
    // The StatefulSet's own Pod writes.
    let webhook = c.webhook_client().await.unwrap();
    json_patch(&webhook, &a, add_gate).await.unwrap();
    assert!(
        taints(&c, &a)
            .await
            .iter()
            .any(|t| t.starts_with(TAINT_KEY))
    );
}

/// A client with a `nodegate-webhook` token from the TokenRequest API, bound
/// to `pod` (or to nothing).
async fn webhook_token(c: &Cluster, pod: Option<&Pod>) -> kube::Client {
    let admin = c.client(users::ADMIN).await.unwrap();
    let mut request = bound_token_request(
        "Pod",
        pod.and_then(|p| p.metadata.name.clone()),
        pod.and_then(|p| p.metadata.uid.clone()),
    );
    if pod.is_none() {
        request.spec.bound_object_ref = None;
    }
    let token = Api::<ServiceAccount>::namespaced(admin, "nodegate")
        .create_token_request("nodegate-webhook", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    token_client(&c.kubeconfig(users::ADMIN).unwrap(), token).await
}
