//! Helpers the emulator suite's scenario files share (`tests/emulator/`):
//! a fresh emulator, Node fixtures, API error parts, polling, and an
//! emulator calling a scripted webhook.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use nodegate_emulator::fake_webhook::{FakeReply, FakeWebhook};
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use serde_json::{Value, json};

pub const NOT_READY: &str = "node.kubernetes.io/not-ready";

pub async fn emulator() -> Emulator {
    Emulator::start(EmulatorOptions::default()).await.unwrap()
}

pub async fn nodes(emu: &Emulator, user: &str) -> Api<Node> {
    Api::all(emu.client(user).await.unwrap())
}

/// A fresh emulator holding node `a`, and the admin's Node API.
pub async fn with_node_a() -> (Emulator, Api<Node>) {
    let emu = emulator().await;
    let api = nodes(&emu, users::ADMIN).await;
    api.create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    (emu, api)
}

pub fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"pool": "a"}},
        "status": {"nodeInfo": {"bootID": "boot-1"}}
    }))
    .unwrap()
}

pub fn taint_keys(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

/// Creates node `a`, expecting the API server to refuse it.
pub async fn create_refused(api: &Api<Node>) -> kube::Error {
    api.create(&PostParams::default(), &node("a"))
        .await
        .expect_err("the API server should refuse this create")
}

pub fn api_reason(e: &kube::Error) -> (u16, String, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason.clone(), s.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

pub async fn poll<T, F, Fut>(what: &str, deadline: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A fresh emulator whose one mutating webhook is a scripted fake, its
/// configuration changed by `overrides`.
pub async fn with_fake(
    overrides: Value,
    handler: impl Fn(&Value) -> FakeReply + Send + Sync + 'static,
) -> (Emulator, FakeWebhook) {
    let fake = FakeWebhook::start("fake", "test", handler).await.unwrap();
    let emu = Emulator::start(EmulatorOptions {
        webhook_configs: vec![fake.config("fake", overrides)],
        service_endpoints: HashMap::from([(fake.service().to_string(), fake.addr())]),
        ..Default::default()
    })
    .await
    .unwrap();
    (emu, fake)
}

pub fn add_label_patch(key: &str) -> Value {
    json!([{"op": "add", "path": format!("/metadata/labels/{}", key.replace('~', "~0").replace('/', "~1")), "value": "yes"}])
}
