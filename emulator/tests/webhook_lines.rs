//! Several mutating webhook entries, as nodegate's "second line" of admission
//! uses them: a primary entry (Service `nodegate-webhook`) and backup entries
//! (`nodegate-webhook-0`, `-1`) whose matchConditions fire only while the Node
//! still lacks the gate taint. Pins the emulator's dispatch against
//! `k8s.io/apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go`
//! (`Dispatch`), `generic/webhook.go` (`ShouldCallHook`),
//! `configuration/mutating_webhook_manager.go` and `pkg/admission/reinvocation.go`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use nodegate_emulator::admission::{
    MATCH_CONDITION_ERRORS, MATCH_CONDITION_EXCLUSIONS, WEBHOOK_FAIL_OPEN,
};
use nodegate_emulator::fake_webhook::{FakeReply, FakeWebhook, configuration};
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use serde_json::{Value, json};

const GATE: &str = "nodegate.dev/agent-not-ready";
/// The backup entries' condition: only while the Node lacks the gate.
const LACKS_GATE: &str = "!has(object.spec) || !has(object.spec.taints) || !object.spec.taints.exists(t, t.key == 'nodegate.dev/agent-not-ready')";

const PRIMARY: &str = "primary.example.com";
const BACKUP_0: &str = "backup-0.example.com";
const BACKUP_1: &str = "backup-1.example.com";

/// Adds the gate unless the object already carries it (idempotent, as a
/// webhook that may be reinvoked must be).
fn gate_reply(req: &Value) -> FakeReply {
    let gate = json!({"key": GATE, "value": "true", "effect": "NoSchedule"});
    let object = &req["object"];
    let patch = match object.pointer("/spec/taints").and_then(Value::as_array) {
        Some(t) if t.iter().any(|t| t["key"] == GATE) => return FakeReply::default(),
        Some(_) => json!([{"op": "add", "path": "/spec/taints/-", "value": gate}]),
        None if object.get("spec").is_some_and(Value::is_object) => {
            json!([{"op": "add", "path": "/spec/taints", "value": [gate]}])
        }
        None => json!([{"op": "add", "path": "/spec", "value": {"taints": [gate]}}]),
    };
    FakeReply {
        patch: Some(patch),
        ..Default::default()
    }
}

fn label_reply(key: &'static str) -> impl Fn(&Value) -> FakeReply + Send + Sync + 'static {
    move |req| FakeReply {
        patch: req["object"]["metadata"]["labels"].get(key).is_none().then(
            || json!([{"op": "add", "path": format!("/metadata/labels/{key}"), "value": "yes"}]),
        ),
        ..Default::default()
    }
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"pool": "a"}},
        "status": {"nodeInfo": {"bootID": "boot-1"}}
    }))
    .unwrap()
}

fn has_gate(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().filter(|t| t.key == GATE).count() == 1)
}

/// An emulator with these webhook configurations, each fake's Service
/// pointing at it.
async fn emulator_with(webhook_configs: Vec<String>, fakes: &[&FakeWebhook]) -> Emulator {
    Emulator::start(EmulatorOptions {
        webhook_configs,
        service_endpoints: fakes
            .iter()
            .map(|f| (f.service().to_string(), f.addr()))
            .collect(),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// An address nothing listens on: a port-0 listener, closed again.
async fn refused_addr() -> SocketAddr {
    let l = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    addr
}

#[derive(Clone, Copy, Debug)]
enum Primary {
    Alive,
    /// Its Service resolves, but the port refuses connections.
    Refused,
    /// Its Service has no endpoints.
    NoEndpoints,
}

struct Lines {
    emu: Emulator,
    primary: FakeWebhook,
    backup0: FakeWebhook,
    backup1: FakeWebhook,
}

/// One configuration `nodegate`: the primary entry (all replicas), then a
/// backup entry per replica Service, all failurePolicy Ignore.
async fn lines(primary_overrides: Value, state: Primary) -> Lines {
    let primary = FakeWebhook::start("nodegate-webhook", "nodegate", gate_reply)
        .await
        .unwrap();
    let backup0 = FakeWebhook::start("nodegate-webhook-0", "nodegate", gate_reply)
        .await
        .unwrap();
    let backup1 = FakeWebhook::start("nodegate-webhook-1", "nodegate", gate_reply)
        .await
        .unwrap();
    let mut primary_hook = json!({"failurePolicy": "Ignore"});
    json_patch::merge(&mut primary_hook, &primary_overrides);
    let backup = json!({"failurePolicy": "Ignore",
        "matchConditions": [{"name": "lacks-gate", "expression": LACKS_GATE}]});
    let cfg = configuration(
        "nodegate",
        vec![
            primary.hook("primary", primary_hook),
            backup0.hook("backup-0", backup.clone()),
            backup1.hook("backup-1", backup),
        ],
    );
    let mut endpoints = HashMap::from([
        (backup0.service().to_string(), backup0.addr()),
        (backup1.service().to_string(), backup1.addr()),
    ]);
    match state {
        Primary::Alive => {
            endpoints.insert(primary.service().to_string(), primary.addr());
        }
        Primary::Refused => {
            endpoints.insert(primary.service().to_string(), refused_addr().await);
        }
        Primary::NoEndpoints => {}
    }
    let emu = Emulator::start(EmulatorOptions {
        webhook_configs: vec![cfg],
        service_endpoints: endpoints,
        ..Default::default()
    })
    .await
    .unwrap();
    Lines {
        emu,
        primary,
        backup0,
        backup1,
    }
}

impl Lines {
    /// Creates node `a` as admin and returns it as stored.
    async fn create_node(&self) -> Node {
        let api: Api<Node> = Api::all(self.emu.client(users::ADMIN).await.unwrap());
        api.create(&PostParams::default(), &node("a"))
            .await
            .unwrap();
        api.get("a").await.unwrap()
    }

    fn count(&self, metric: &str, webhook: &str) -> u64 {
        self.emu.admission_metrics().get(metric, webhook, None)
    }

    /// Calls the emulator made to `webhook` (resolved endpoint), and how many failed.
    fn calls(&self, webhook: &str) -> (usize, usize) {
        let calls: Vec<_> = self
            .emu
            .webhook_calls(false)
            .into_iter()
            .filter(|c| c.webhook == webhook)
            .collect();
        (calls.len(), calls.iter().filter(|c| !c.ok).count())
    }
}

/// Primary down, reinvocationPolicy Never: it fails open once, the first
/// backup sees the untainted Node and taints it, the second backup sees that
/// patch and is skipped.
#[tokio::test]
async fn a_dead_primary_fails_open_once_and_the_first_backup_taints() {
    let l = lines(json!({"reinvocationPolicy": "Never"}), Primary::Refused).await;
    let n = l.create_node().await;
    assert!(has_gate(&n), "stored with the gate: {:?}", n.spec);
    assert_eq!(l.count(WEBHOOK_FAIL_OPEN, PRIMARY), 1);
    assert_eq!(l.calls(PRIMARY), (1, 1), "one call, failed");
    assert!(l.primary.requests().is_empty());
    assert_eq!(l.backup0.requests().len(), 1);
    assert!(
        l.backup1.requests().is_empty(),
        "backup-1 saw backup-0's patch"
    );
    // backup-0's change makes the whole chain run again (reinvocation.go);
    // that round evaluates every entry's conditions again, and calls nobody.
    assert_eq!(l.count(MATCH_CONDITION_EXCLUSIONS, BACKUP_1), 2);
    assert_eq!(l.count(MATCH_CONDITION_EXCLUSIONS, BACKUP_0), 1);
    let ignored = l.emu.ignored_webhook_failures();
    assert!(
        ignored.len() == 1 && ignored[0].starts_with(PRIMARY),
        "{ignored:?}"
    );
}

/// Primary down, reinvocationPolicy IfNeeded: a call that failed open still
/// counts as invoked (`AddReinvocableWebhookToPreviouslyInvoked` runs
/// whatever the call's error), so backup-0's patch gets it reinvoked — it
/// fails open twice per create, as measured on a real v1.36 API server. Same
/// for a Service without endpoints (the failure is the call's either way).
#[tokio::test]
async fn a_dead_if_needed_primary_is_reinvoked_and_fails_open_twice() {
    for state in [Primary::Refused, Primary::NoEndpoints] {
        let l = lines(json!({"reinvocationPolicy": "IfNeeded"}), state).await;
        let n = l.create_node().await;
        assert!(
            has_gate(&n),
            "{state:?}: stored with the gate: {:?}",
            n.spec
        );
        assert_eq!(l.count(WEBHOOK_FAIL_OPEN, PRIMARY), 2, "{state:?}");
        let expected_calls = match state {
            Primary::NoEndpoints => (0, 0), // fails before any connection
            _ => (2, 2),
        };
        assert_eq!(l.calls(PRIMARY), expected_calls, "{state:?}");
        assert_eq!(l.emu.ignored_webhook_failures().len(), 2, "{state:?}");
        // backup-0 is reinvocationPolicy Never and made the last change.
        assert_eq!(l.backup0.requests().len(), 1, "{state:?}");
        assert!(l.backup1.requests().is_empty(), "{state:?}");
        // The reinvocation round evaluates every entry's conditions again
        // (ShouldCallHook comes before the reinvocation check): now that the
        // gate is there, both backups are excluded in round 2.
        assert_eq!(
            l.count(MATCH_CONDITION_EXCLUSIONS, BACKUP_0),
            1,
            "{state:?}"
        );
        assert_eq!(
            l.count(MATCH_CONDITION_EXCLUSIONS, BACKUP_1),
            2,
            "{state:?}"
        );
    }
}

/// Everything alive: the primary taints, and the backups' conditions see its
/// patch, so they are never called. The primary (IfNeeded) is not reinvoked
/// by its own change.
#[tokio::test]
async fn with_the_primary_alive_the_backups_are_never_called() {
    let l = lines(json!({"reinvocationPolicy": "IfNeeded"}), Primary::Alive).await;
    let n = l.create_node().await;
    assert!(has_gate(&n), "{:?}", n.spec);
    assert_eq!(l.primary.requests().len(), 1);
    assert!(l.backup0.requests().is_empty());
    assert!(l.backup1.requests().is_empty());
    assert_eq!(l.count(WEBHOOK_FAIL_OPEN, PRIMARY), 0);
    assert!(l.emu.ignored_webhook_failures().is_empty());
    assert_eq!(l.count(MATCH_CONDITION_ERRORS, BACKUP_0), 0);
    // Excluded in round 1 and again in the round the primary's change caused.
    assert_eq!(l.count(MATCH_CONDITION_EXCLUSIONS, BACKUP_0), 2);
    assert_eq!(l.count(MATCH_CONDITION_EXCLUSIONS, BACKUP_1), 2);
}

/// Configurations run by name whatever order they were stored in, and a
/// configuration's entries in list order (not by webhook name): each sees
/// the patches of those before it and none of those after.
#[tokio::test]
async fn configurations_run_by_name_and_entries_in_list_order() {
    let early = FakeWebhook::start("early", "test", label_reply("early"))
        .await
        .unwrap();
    let second = FakeWebhook::start("second", "test", label_reply("second"))
        .await
        .unwrap();
    let late = FakeWebhook::start("late", "test", label_reply("late"))
        .await
        .unwrap();
    let emu = Emulator::start(EmulatorOptions {
        // Stored z first; "aa-second" sorts before "early" by webhook name.
        webhook_configs: vec![
            configuration("z-late", vec![late.hook("late", json!({}))]),
            configuration(
                "a-early",
                vec![
                    early.hook("early", json!({})),
                    second.hook("aa-second", json!({})),
                ],
            ),
        ],
        service_endpoints: HashMap::from([
            (early.service().to_string(), early.addr()),
            (second.service().to_string(), second.addr()),
            (late.service().to_string(), late.addr()),
        ]),
        ..Default::default()
    })
    .await
    .unwrap();
    let api: Api<Node> = Api::all(emu.client(users::ADMIN).await.unwrap());
    let n = api
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    let labels = n.metadata.labels.unwrap();
    for key in ["early", "second", "late"] {
        assert_eq!(labels[key], "yes", "{labels:?}");
    }
    let seen = |fake: &FakeWebhook| {
        let reqs = fake.requests();
        assert_eq!(
            reqs.len(),
            1,
            "each called once (all reinvocationPolicy Never)"
        );
        let labels = &reqs[0]["review"]["request"]["object"]["metadata"]["labels"];
        ["early", "second", "late"]
            .into_iter()
            .filter(|k| labels.get(*k).is_some())
            .collect::<Vec<_>>()
    };
    assert!(seen(&early).is_empty());
    assert_eq!(seen(&second), ["early"]);
    assert_eq!(seen(&late), ["early", "second"]);
}

/// A webhook skipped in the first round by its matchCondition is not called
/// in the reinvocation round, even though its condition now holds
/// (dispatcher.go: "a webhook will not be called for the first time").
#[tokio::test]
async fn a_webhook_skipped_in_round_one_is_never_first_called_in_reinvocation() {
    let first = FakeWebhook::start("first", "test", |_| FakeReply::default())
        .await
        .unwrap();
    let gated = FakeWebhook::start("gated", "test", |_| FakeReply::default())
        .await
        .unwrap();
    let labeller = FakeWebhook::start("labeller", "test", label_reply("later"))
        .await
        .unwrap();
    let if_needed = json!({"reinvocationPolicy": "IfNeeded"});
    let emu = emulator_with(vec![configuration(
            "hooks",
            vec![
                first.hook("first", if_needed.clone()),
                gated.hook(
                    "gated",
                    json!({"reinvocationPolicy": "IfNeeded", "matchConditions": [
                        {"name": "labelled", "expression": "has(object.metadata.labels) && 'later' in object.metadata.labels"}]}),
                ),
                labeller.hook("labeller", json!({})),
            ],
        )], &[&first, &gated, &labeller]).await;
    let api: Api<Node> = Api::all(emu.client(users::ADMIN).await.unwrap());
    let n = api
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    assert_eq!(n.metadata.labels.unwrap()["later"], "yes");
    assert_eq!(first.requests().len(), 2, "the reinvocation round ran");
    assert!(
        gated.requests().is_empty(),
        "never called for the first time"
    );
    assert_eq!(labeller.requests().len(), 1);
    let m = emu.admission_metrics();
    // Excluded in round 1 only: in round 2 the condition held, and the
    // reinvocation check skipped it.
    assert_eq!(
        m.get(MATCH_CONDITION_EXCLUSIONS, "gated.example.com", None),
        1
    );
}

/// Round 2 runs ShouldCallHook for every entry before the reinvocation
/// check: a failurePolicy Fail condition that errors only on the
/// reinvocation round refuses the request, although that webhook (Never)
/// would not be called again.
#[tokio::test]
async fn a_condition_error_in_the_reinvocation_round_follows_failure_policy() {
    let first = FakeWebhook::start("first", "test", |_| FakeReply::default())
        .await
        .unwrap();
    let strict = FakeWebhook::start("strict", "test", |_| FakeReply::default())
        .await
        .unwrap();
    let labeller = FakeWebhook::start("labeller", "test", label_reply("later"))
        .await
        .unwrap();
    let emu = emulator_with(vec![configuration(
            "hooks",
            vec![
                first.hook("first", json!({"reinvocationPolicy": "IfNeeded"})),
                strict.hook(
                    "strict",
                    json!({"failurePolicy": "Fail", "matchConditions": [
                        {"name": "odd", "expression": "!has(object.metadata.labels.later) || object.metadata.labels.later.nope == 1"}]}),
                ),
                labeller.hook("labeller", json!({})),
            ],
        )], &[&first, &strict, &labeller]).await;
    let api: Api<Node> = Api::all(emu.client(users::ADMIN).await.unwrap());
    let err = api
        .create(&PostParams::default(), &node("a"))
        .await
        .expect_err("round 2's condition error refuses the create");
    match &err {
        kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"), "{s:?}"),
        other => panic!("expected an API error, got {other:?}"),
    }
    assert_eq!(first.requests().len(), 2);
    assert_eq!(strict.requests().len(), 1, "called in round 1 only");
    assert_eq!(labeller.requests().len(), 1);
    assert_eq!(
        emu.admission_metrics()
            .get(MATCH_CONDITION_ERRORS, "strict.example.com", None),
        1
    );
    assert!(api.get_opt("a").await.unwrap().is_none());
}

/// `predicates/object/matcher.go` `MatchObjectSelector`: a selector that
/// cannot be used is an InternalError from `ShouldCallHook`, which `Dispatch`
/// returns as is — failurePolicy Ignore does not fail open on it.
#[tokio::test]
async fn an_unusable_object_selector_is_an_internal_error_whatever_the_failure_policy() {
    let fake = FakeWebhook::start("fake", "test", |_| FakeReply::default())
        .await
        .unwrap();
    let emu = Emulator::start(EmulatorOptions {
        webhook_configs: vec![fake.config(
            "fake",
            json!({"failurePolicy": "Ignore", "objectSelector": {"matchExpressions": [
                {"key": "pool", "operator": "Bogus", "values": ["a"]}]}}),
        )],
        service_endpoints: HashMap::from([(fake.service().to_string(), fake.addr())]),
        ..Default::default()
    })
    .await
    .unwrap();
    let api: Api<Node> = Api::all(emu.client(users::ADMIN).await.unwrap());
    let err = api
        .create(&PostParams::default(), &node("a"))
        .await
        .expect_err("an unusable selector fails the create");
    match &err {
        kube::Error::Api(s) => assert_eq!(s.code, 500, "{s:?}"),
        other => panic!("expected an API error, got {other:?}"),
    }
    assert!(fake.requests().is_empty());
    assert_eq!(
        emu.admission_metrics()
            .get(WEBHOOK_FAIL_OPEN, "fake.example.com", None),
        0
    );
    assert!(emu.ignored_webhook_failures().is_empty());
}
