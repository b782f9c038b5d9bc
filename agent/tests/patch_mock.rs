//! The agent's writes on its Node against a mocked API server (tower-test):
//! exact request bodies, and re-reading after a conflict or failed `test`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response};
use k8s_openapi::api::core::v1::Node;
use kube::client::Body;
use kube::{Api, Client};
use nodegate_agent::metrics::Metrics;
use nodegate_agent::node_patch::AddReason;
use nodegate_agent::node_writer::NodeWriter;
use nodegate_agent::taint_set::TaintSet;
use serde_json::{Value, json};
use tokio::time::Instant;
use tower_test::mock::{self, Handle, SendResponse};

type MockHandle = Handle<Request<Body>, Response<Body>>;

const TAINT: &str = "nodegate.dev/agent-not-ready=true:NoSchedule";

fn ours() -> Value {
    json!({"key": "nodegate.dev/agent-not-ready", "value": "true", "effect": "NoSchedule"})
}

fn node(rv: &str, taints: Value, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n1", "uid": "uid-1", "resourceVersion": rv,
                     "creationTimestamp": "2026-01-01T00:00:00Z", "annotations": annotations},
        "spec": {"taints": taints},
        "status": {"nodeInfo": {"bootID": "boot-2"}}
    })
}

fn setup() -> (NodeWriter, MockHandle, Metrics) {
    let (svc, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "default");
    let metrics = Metrics::default();
    let t = NodeWriter {
        api: Api::<Node>::all(client),
        name: "n1".into(),
        taints: Arc::new(TaintSet::new(
            vec![TAINT.parse().unwrap()],
            Vec::new(),
            Vec::new(),
        )),
        metrics: metrics.clone(),
    };
    (t, handle, metrics)
}

fn respond(send: SendResponse<Response<Body>>, code: u16, body: Value) {
    send.send_response(
        Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap(),
    );
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
           "message": "mock", "reason": reason, "code": code})
}

async fn expect_get(h: &mut MockHandle, reply: Value) {
    let (req, send) = h.next_request().await.expect("GET expected");
    assert_eq!(req.method(), Method::GET);
    assert_eq!(req.uri().path(), "/api/v1/nodes/n1");
    respond(send, 200, reply);
}

async fn expect_patch(h: &mut MockHandle) -> (Value, SendResponse<Response<Body>>) {
    let (req, send) = h.next_request().await.expect("PATCH expected");
    assert_eq!(req.method(), Method::PATCH);
    assert_eq!(req.uri().path(), "/api/v1/nodes/n1");
    assert_eq!(
        req.headers().get("content-type").unwrap(),
        "application/json-patch+json"
    );
    let body = req.into_body().collect_bytes().await.unwrap();
    (serde_json::from_slice(&body).unwrap(), send)
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

#[tokio::test]
async fn ready_patch_is_one_exact_json_patch() {
    let (t, mut h, metrics) = setup();
    let other = json!({"key": "example.com/other", "effect": "NoExecute"});
    let server = tokio::spawn(async move {
        let before = node("7", json!([ours(), other.clone()]), json!({"keep": "me"}));
        expect_get(&mut h, before).await;
        let (patch, send) = expect_patch(&mut h).await;
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/spec/taints/0", "value": ours()},
                {"op": "remove", "path": "/spec/taints/0"},
                {"op": "add", "path": "/metadata/annotations/nodegate.dev~1ready-boot-id",
                 "value": "boot-2"}
            ])
        );
        respond(
            send,
            200,
            node(
                "8",
                json!([other]),
                json!({"keep": "me", "nodegate.dev/ready-boot-id": "boot-2"}),
            ),
        );
    });
    let done = t
        .mark_ready(deadline(), Some("boot-2"), None)
        .await
        .unwrap();
    assert_eq!(
        done.latest.taints().len(),
        1,
        "the node as the patch left it"
    );
    let out = done.outcome.expect("patched");
    server.await.unwrap();
    assert_eq!(out.removed, vec![ours()]);
    assert_eq!(out.boot_id.as_deref(), Some("boot-2"));
    assert_eq!(metrics.taint_removals.get(), 1);
}

/// The ungating write starts from the watched node: no read before the
/// patch. A stale view fails the patch's `test`, and the retry reads.
#[tokio::test]
async fn ready_patch_starts_from_the_watched_node_and_reads_only_when_stale() {
    let (t, mut h, metrics) = setup();
    let seen: nodegate_shared::NodeView =
        serde_json::from_value(node("5", json!([ours()]), json!({"x": "y"}))).unwrap();
    let server = tokio::spawn(async move {
        // Straight to the patch; the view was stale (a taint prepended).
        let (first, send) = expect_patch(&mut h).await;
        respond(send, 422, status(422, "Invalid"));
        let moved = json!([{"key": "a/b", "effect": "NoSchedule"}, ours()]);
        expect_get(&mut h, node("6", moved, json!({"x": "y"}))).await;
        let (second, send) = expect_patch(&mut h).await;
        respond(
            send,
            200,
            node(
                "7",
                json!([{"key": "a/b", "effect": "NoSchedule"}]),
                json!({}),
            ),
        );
        (first, second)
    });
    let out = t
        .mark_ready(deadline(), Some("boot-2"), Some(seen))
        .await
        .unwrap()
        .outcome
        .expect("patched");
    let (first, second) = server.await.unwrap();
    assert_eq!(first[0]["path"], "/spec/taints/0", "from the watched view");
    assert_eq!(second[0]["path"], "/spec/taints/1", "from the fresh read");
    assert_eq!(out.removed, vec![ours()]);
    assert!(out.since_creation_ms.is_some(), "from the patched node");
    assert_eq!(metrics.taint_removals.get(), 1);
}

/// A watched view with nothing left to do proves nothing (the webhook may
/// have re-tainted since): the node is read before the agent gives up.
#[tokio::test]
async fn a_watched_view_without_work_is_checked_by_a_read() {
    let (t, mut h, _) = setup();
    let seen: nodegate_shared::NodeView = serde_json::from_value(node(
        "5",
        json!([]),
        json!({"nodegate.dev/ready-boot-id": "boot-2"}),
    ))
    .unwrap();
    let server = tokio::spawn(async move {
        expect_get(&mut h, node("6", json!([ours()]), json!({"x": "y"}))).await;
        let (patch, send) = expect_patch(&mut h).await;
        respond(send, 200, node("7", json!([]), json!({})));
        patch
    });
    let out = t
        .mark_ready(deadline(), Some("boot-2"), Some(seen))
        .await
        .unwrap()
        .outcome
        .expect("patched after the read");
    assert_eq!(server.await.unwrap()[0]["op"], "test");
    assert_eq!(out.removed, vec![ours()]);
}

#[tokio::test]
async fn ready_patch_rereads_after_conflict_and_failed_test() {
    let (t, mut h, metrics) = setup();
    let server = tokio::spawn(async move {
        // 1st attempt: 409 Conflict.
        expect_get(&mut h, node("1", json!([ours()]), json!({}))).await;
        let (first, send) = expect_patch(&mut h).await;
        respond(send, 409, status(409, "Conflict"));
        // 2nd attempt: someone prepended a taint; our `test` fails (422).
        let moved = json!([{"key": "a/b", "effect": "NoSchedule"}, ours()]);
        expect_get(&mut h, node("2", moved.clone(), json!({"x": "y"}))).await;
        let (second, send) = expect_patch(&mut h).await;
        respond(send, 422, status(422, "Invalid"));
        // 3rd attempt on the same read succeeds.
        expect_get(&mut h, node("3", moved, json!({"x": "y"}))).await;
        let (third, send) = expect_patch(&mut h).await;
        respond(
            send,
            200,
            node(
                "4",
                json!([{"key": "a/b", "effect": "NoSchedule"}]),
                json!({}),
            ),
        );
        (first, second, third)
    });
    t.mark_ready(deadline(), Some("boot-2"), None)
        .await
        .unwrap()
        .outcome
        .expect("patched");
    let (first, second, third) = server.await.unwrap();
    // No annotations at all: the map is added, guarded by resourceVersion.
    assert_eq!(
        first,
        json!([
            {"op": "test", "path": "/spec/taints/0", "value": ours()},
            {"op": "remove", "path": "/spec/taints/0"},
            {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
            {"op": "add", "path": "/metadata/annotations",
             "value": {"nodegate.dev/ready-boot-id": "boot-2"}}
        ])
    );
    // After the re-read the entry is at index 1, the other taint untouched.
    let want = json!([
        {"op": "test", "path": "/spec/taints/1", "value": ours()},
        {"op": "remove", "path": "/spec/taints/1"},
        {"op": "add", "path": "/metadata/annotations/nodegate.dev~1ready-boot-id",
         "value": "boot-2"}
    ]);
    assert_eq!(second, want);
    assert_eq!(third, want);
    assert_eq!(metrics.taint_removals.get(), 1);
}

#[tokio::test]
async fn nothing_to_do_means_no_patch() {
    let (t, mut h, metrics) = setup();
    let server = tokio::spawn(async move {
        expect_get(
            &mut h,
            node(
                "5",
                json!([]),
                json!({"nodegate.dev/ready-boot-id": "boot-2"}),
            ),
        )
        .await;
        // The client is dropped after the GET: no further request may come.
        assert!(h.next_request().await.is_none());
    });
    let done = t
        .mark_ready(deadline(), Some("boot-2"), None)
        .await
        .unwrap();
    assert!(done.outcome.is_none());
    assert_eq!(done.latest.ready_boot_id(), Some("boot-2"));
    drop(t);
    server.await.unwrap();
    assert_eq!(metrics.taint_removals.get(), 0);
}

#[tokio::test]
async fn shutdown_retaint_goes_first_with_guard_and_retries() {
    let (t, mut h, metrics) = setup();
    let other = json!({"key": "example.com/other", "effect": "NoExecute"});
    let server = tokio::spawn(async move {
        expect_get(&mut h, node("1", json!([other.clone()]), json!({}))).await;
        let (first, send) = expect_patch(&mut h).await;
        respond(send, 422, status(422, "Invalid"));
        expect_get(&mut h, node("2", json!([]), json!({}))).await;
        let (second, send) = expect_patch(&mut h).await;
        respond(send, 200, node("3", json!([ours()]), json!({})));
        (first, second, other)
    });
    let added = t
        .add_missing(AddReason::Shutdown, deadline())
        .await
        .unwrap();
    let (first, second, other) = server.await.unwrap();
    assert_eq!(
        added.taints,
        vec!["nodegate.dev/agent-not-ready=true:NoSchedule".to_string()]
    );
    assert_eq!(added.latest.metadata.resource_version.as_deref(), Some("3"));
    assert_eq!(
        first,
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
            {"op": "test", "path": "/spec/taints", "value": [other]},
            {"op": "add", "path": "/spec/taints/0", "value": ours()}
        ])
    );
    assert_eq!(
        second,
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "2"},
            {"op": "test", "path": "/spec/taints", "value": []},
            {"op": "add", "path": "/spec/taints/0", "value": ours()}
        ])
    );
    let text = {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &metrics.registry()).unwrap();
        s
    };
    assert!(
        text.contains("nodegate_agent_taint_adds_total{reason=\"shutdown\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn no_patch_when_the_node_rebooted_since_the_probes_passed() {
    let (t, mut h, _) = setup();
    let server = tokio::spawn(async move {
        expect_get(&mut h, node("5", json!([ours()]), json!({}))).await;
        assert!(h.next_request().await.is_none(), "no PATCH");
    });
    let done = t
        .mark_ready(deadline(), Some("boot-1"), None)
        .await
        .unwrap();
    assert!(done.outcome.is_none());
    assert_eq!(
        done.latest.boot_id(),
        Some("boot-2"),
        "the caller sees the reboot"
    );
    drop(t);
    server.await.unwrap();
}

#[tokio::test]
async fn forbidden_is_not_retried() {
    let (t, mut h, _) = setup();
    let server = tokio::spawn(async move {
        let (_, send) = h.next_request().await.expect("GET");
        respond(send, 403, status(403, "Forbidden"));
    });
    let err = t
        .mark_ready(deadline(), Some("boot-2"), None)
        .await
        .unwrap_err();
    server.await.unwrap();
    assert!(err.to_string().contains("mock"), "{err}");
}
