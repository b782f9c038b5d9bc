//! `Rule::StatusShowsReboot` end to end: a `nodes/status` write that shows a
//! reboot is answered without a patch, and the webhook then patches the main
//! resource through the (mocked) API server with a guarded JSON patch.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use nodegate_certs::Ca;
use nodegate_shared::keys::READY_BOOT_ID_ANNOTATION as ANN;
use nodegate_webhook::fixtures::{kubelet_node, review, with_annotation};
use nodegate_webhook::{Config, KubeMode, start};
use serde_json::{Value, json};
use tokio::sync::oneshot;

#[tokio::test]
async fn status_write_after_reboot_patches_the_main_resource_in_the_background() {
    let (svc, mut api) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ca = Ca::generate(1).unwrap();
    let secret = SecretDir::new(&ca.issue(&serving_request()).unwrap(), ca);
    let mut config = Config::local(secret.cert_path(), secret.key_path());
    config.kube = KubeMode::Client(kube::Client::new(svc, "default"));
    let (stop, rx) = oneshot::channel::<()>();
    let running = start(config, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();

    // The kubelet's first status write after a reboot: bootID boot-1 → boot-2,
    // the agent was last ready on boot-1.
    let old = with_annotation(kubelet_node("n1", "boot-1", 50), ANN, "boot-1");
    let new = with_annotation(kubelet_node("n1", "boot-2", 50), ANN, "boot-1");
    let rv = review(
        "u-status",
        "UPDATE",
        Some("status"),
        "system:node:n1",
        new.clone(),
        Some(old),
        false,
    );
    let cfg = client_config(secret.ca.cert_pem(), &[b"http/1.1"]);
    let mut c = H1::open(running.https_addr, &cfg).await.unwrap();
    let (status, body) = c
        .post("/mutate", serde_json::to_vec(&rv).unwrap())
        .await
        .unwrap();
    assert_eq!(status, 200);
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["response"]["uid"], "u-status");
    assert_eq!(answer["response"]["allowed"], true);
    assert!(
        answer["response"].get("patch").is_none(),
        "status writes are never patched"
    );

    // The background job: read, then a guarded patch of the main resource.
    let (req, send) = tokio::time::timeout(Duration::from_secs(10), api.next_request())
        .await
        .expect("background GET")
        .unwrap();
    assert_eq!(
        (req.method(), req.uri().path()),
        (&Method::GET, "/api/v1/nodes/n1")
    );
    let mut stored = new;
    stored["metadata"]["resourceVersion"] = json!("42");
    send.send_response(
        Response::builder()
            .status(StatusCode::OK)
            .body(Body::from(serde_json::to_vec(&stored).unwrap()))
            .unwrap(),
    );
    let (req, send) = tokio::time::timeout(Duration::from_secs(10), api.next_request())
        .await
        .expect("background PATCH")
        .unwrap();
    assert_eq!(
        (req.method(), req.uri().path()),
        (&Method::PATCH, "/api/v1/nodes/n1")
    );
    let patch: Value =
        serde_json::from_slice(&req.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        patch,
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
            {"op": "add", "path": "/spec/taints",
             "value": [{"key": "nodegate.dev/agent-not-ready", "value": "true", "effect": "NoSchedule"}]}
        ])
    );
    send.send_response(
        Response::builder()
            .status(StatusCode::OK)
            .body(Body::from(serde_json::to_vec(&stored).unwrap()))
            .unwrap(),
    );
    eventually("background patch counted", 10, || async {
        let (_, text) = get(running.admin_addr, "/metrics").await.unwrap();
        text.contains(r#"nodegate_webhook_background_patches_total{result="ok"} 1"#)
            && text.contains(r#"nodegate_webhook_taints_added_total{reason="reboot"} 1"#)
    })
    .await;
    stop.send(()).unwrap();
    running.wait().await.unwrap();
}
