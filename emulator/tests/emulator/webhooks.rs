//! Mutating webhooks, with a scripted fake: the AdmissionReview sent, patches
//! and warnings, objectSelector, failurePolicy, invalid responses,
//! sideEffects under dryRun, denials, the serving certificate's name,
//! reinvocation, rules on subresources, validation after mutation.

use std::collections::HashMap;
use std::time::Duration;

use kube::api::{Patch, PatchParams, PostParams};
use nodegate_emulator::fake_webhook::{FakeReply, FakeWebhook};
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use serde_json::{Value, json};

use crate::support::{
    NOT_READY, add_label_patch, api_reason, create_refused, node, nodes, with_fake,
};

#[tokio::test]
async fn webhook_review_shape_patch_and_warning() {
    let (emu, fake) = with_fake(json!({}), |req| FakeReply {
        patch: (req["operation"] == "CREATE").then(|| add_label_patch("example.com/hooked")),
        warnings: vec!["added \"hooked\" — ok".into()],
        ..Default::default()
    })
    .await;
    let body = serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a", "labels": {"pool": "x"}}})).unwrap();
    let r = emu
        .raw(
            Some(users::ADMIN),
            "POST",
            "/api/v1/nodes?fieldManager=t&fieldValidation=Strict",
            "application/json",
            body,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 201, "{:?}", r.json());
    assert_eq!(
        r.json().unwrap()["metadata"]["labels"]["example.com/hooked"],
        "yes"
    );
    assert_eq!(r.warnings(), vec!["added \"hooked\" — ok".to_string()]);

    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0]["uri"], "/mutate?timeout=2s");
    let review = &reqs[0]["review"];
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    let req = &review["request"];
    assert!(!req["uid"].as_str().unwrap().is_empty());
    assert_eq!(
        req["kind"],
        json!({"group": "", "version": "v1", "kind": "Node"})
    );
    assert_eq!(
        req["resource"],
        json!({"group": "", "version": "v1", "resource": "nodes"})
    );
    assert_eq!(req["requestKind"], req["kind"]);
    assert!(req.get("subResource").is_none());
    assert_eq!(req["name"], "a");
    assert_eq!(req["operation"], "CREATE");
    assert_eq!(req["userInfo"]["username"], "admin");
    assert!(req["oldObject"].is_null() && req.get("oldObject").is_some());
    assert_eq!(req["dryRun"], false);
    assert_eq!(req["options"]["kind"], "CreateOptions");
    assert_eq!(req["options"]["fieldManager"], "t");
    // TaintNodesByCondition ran before the webhook.
    assert_eq!(req["object"]["spec"]["taints"][0]["key"], NOT_READY);

    // A status write arrives with its subresource and the old object.
    let api = nodes(&emu, users::ADMIN).await;
    api.patch_status(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"nodeInfo": {"bootID": "b"}}})),
    )
    .await
    .unwrap();
    let reqs = fake.requests();
    let req = &reqs.last().unwrap()["review"]["request"];
    assert_eq!(req["subResource"], "status");
    assert_eq!(req["requestSubResource"], "status");
    assert_eq!(req["operation"], "UPDATE");
    assert_eq!(req["options"]["kind"], "UpdateOptions");
    assert_eq!(req["oldObject"]["metadata"]["name"], "a");
}

#[tokio::test]
async fn object_selector_matches_old_or_new() {
    let sel = json!({"objectSelector": {"matchExpressions": [{"key": "skip", "operator": "NotIn", "values": ["true"]}]}});
    let (emu, fake) = with_fake(sel, |_| FakeReply::default()).await;
    let api = nodes(&emu, users::ADMIN).await;
    let mut n = node("a");
    n.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("skip".into(), "true".into());
    api.create(&PostParams::default(), &n).await.unwrap();
    assert!(fake.requests().is_empty());
    // Removing the label: the new object matches, so it is called.
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"skip": null}}})),
    )
    .await
    .unwrap();
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn failure_policy_fail_and_ignore() {
    // Fail: an unreachable service fails the create with 500.
    let (emu, _fake) = with_fake(json!({}), |_| FakeReply::default()).await;
    emu.remove_service_endpoint("fake.test.svc");
    let api = nodes(&emu, users::ADMIN).await;
    let err = create_refused(&api).await;
    let (code, _, msg) = api_reason(&err);
    assert_eq!(code, 500);
    assert!(
        msg.contains("failed calling webhook \"fake.example.com\""),
        "{msg}"
    );

    // Ignore + a webhook slower than timeoutSeconds: the write goes through untouched.
    let (emu, fake) = with_fake(
        json!({"failurePolicy": "Ignore", "timeoutSeconds": 1}),
        |_| FakeReply {
            delay: Duration::from_secs(3),
            patch: Some(add_label_patch("late")),
            ..Default::default()
        },
    )
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    let started = std::time::Instant::now();
    let n = api
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "timeout honoured"
    );
    assert!(!n.metadata.labels.unwrap().contains_key("late"));
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn unappliable_patch_fails_even_with_ignore() {
    let (emu, _fake) = with_fake(json!({"failurePolicy": "Ignore"}), |_| FakeReply {
        patch: Some(json!([{"op": "add", "path": "/spec/nothere/-", "value": 1}])),
        ..Default::default()
    })
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    let err = create_refused(&api).await;
    assert_eq!(api_reason(&err).0, 500);
    assert!(api.get_opt("a").await.unwrap().is_none());
}

#[tokio::test]
async fn invalid_response_follows_failure_policy() {
    let (emu, _fake) = with_fake(json!({}), |_| FakeReply {
        raw: Some(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "wrong", "allowed": true}})),
        ..Default::default()
    })
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    let err = create_refused(&api).await;
    let (code, _, msg) = api_reason(&err);
    assert_eq!(code, 500);
    assert!(msg.contains("expected response.uid"), "{msg}");
}

#[tokio::test]
async fn side_effects_decide_dry_run() {
    let (emu, fake) = with_fake(json!({"sideEffects": "Unknown"}), |_| FakeReply::default()).await;
    let api = nodes(&emu, users::ADMIN).await;
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let err = api.create(&dry, &node("a")).await.unwrap_err();
    assert_eq!(api_reason(&err).0, 400);
    assert!(fake.requests().is_empty());

    let (emu, fake) = with_fake(json!({"sideEffects": "NoneOnDryRun"}), |_| {
        FakeReply::default()
    })
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    api.create(&dry, &node("a")).await.unwrap();
    assert_eq!(fake.requests()[0]["review"]["request"]["dryRun"], true);
}

#[tokio::test]
async fn webhook_denial_is_returned() {
    let (emu, _fake) = with_fake(json!({}), |_| FakeReply {
        deny: Some("no thanks".into()),
        ..Default::default()
    })
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    let err = create_refused(&api).await;
    let (code, _, msg) = api_reason(&err);
    assert_eq!(code, 403);
    assert!(msg.contains("denied the request: no thanks"), "{msg}");
}

#[tokio::test]
async fn server_name_is_verified_against_the_certificate() {
    // The fake's certificate is for fake.test.svc; point another service name at it.
    let fake = FakeWebhook::start("fake", "test", |_| FakeReply::default())
        .await
        .unwrap();
    let cfg = fake.config(
        "fake",
        json!({"clientConfig": {"service": {"name": "impostor", "namespace": "test"}}}),
    );
    let emu = Emulator::start(EmulatorOptions {
        webhook_configs: vec![cfg],
        service_endpoints: HashMap::from([("impostor.test.svc".to_string(), fake.addr())]),
        ..Default::default()
    })
    .await
    .unwrap();
    let api = nodes(&emu, users::ADMIN).await;
    let err = create_refused(&api).await;
    assert_eq!(api_reason(&err).0, 500);
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn reinvocation_if_needed_reruns_an_earlier_webhook_once() {
    let first = FakeWebhook::start("first", "test", |_| FakeReply::default())
        .await
        .unwrap();
    let second = FakeWebhook::start("second", "test", |req| FakeReply {
        patch: (req["object"]["metadata"]["labels"].get("second").is_none())
            .then(|| add_label_patch("second")),
        ..Default::default()
    })
    .await
    .unwrap();
    let emu = Emulator::start(EmulatorOptions {
        webhook_configs: vec![
            first.config("a-first", json!({"reinvocationPolicy": "IfNeeded"})),
            second.config("b-second", json!({"reinvocationPolicy": "IfNeeded"})),
        ],
        service_endpoints: HashMap::from([
            (first.service().to_string(), first.addr()),
            (second.service().to_string(), second.addr()),
        ]),
        ..Default::default()
    })
    .await
    .unwrap();
    let api = nodes(&emu, users::ADMIN).await;
    let n = api
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    assert_eq!(n.metadata.labels.unwrap()["second"], "yes");
    // first saw the object before second changed it: called again, once.
    assert_eq!(first.requests().len(), 2);
    assert_eq!(
        first.requests()[1]["review"]["request"]["object"]["metadata"]["labels"]["second"],
        "yes"
    );
    // second made the last change itself: not reinvoked.
    assert_eq!(second.requests().len(), 1);
}

#[tokio::test]
async fn rules_tell_nodes_from_nodes_status() {
    for (resources, status_calls) in [
        (json!(["nodes"]), 0),
        (json!(["nodes/*"]), 1),
        (json!(["nodes", "nodes/status"]), 1),
    ] {
        let rules = json!({"rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": resources.clone()}]});
        let (emu, fake) = with_fake(rules, |_| FakeReply::default()).await;
        let api = nodes(&emu, users::ADMIN).await;
        api.create(&PostParams::default(), &node("a"))
            .await
            .unwrap();
        api.patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeInfo": {"bootID": "b"}}})),
        )
        .await
        .unwrap();
        let subs: Vec<Value> = fake
            .requests()
            .iter()
            .map(|r| r["review"]["request"]["subResource"].clone())
            .collect();
        let on_status = subs.iter().filter(|s| *s == "status").count();
        assert_eq!(on_status, status_calls, "{resources}: {subs:?}");
        // kube-apiserver's matcher: a `*` subresource also matches the main
        // resource (`sub == "*" || sub == request's`), so `nodes/*` sees both.
        let main_calls = subs.iter().filter(|s| s.is_null()).count();
        assert_eq!(main_calls, 1, "{resources}");
    }
}

#[tokio::test]
async fn duplicate_taint_from_a_webhook_fails_validation() {
    let (emu, _fake) = with_fake(json!({}), |_| FakeReply {
        patch: Some(json!([{"op": "add", "path": "/spec/taints/-", "value": {"key": NOT_READY, "effect": "NoSchedule"}}])),
        ..Default::default()
    })
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    let err = create_refused(&api).await;
    let (code, reason, msg) = api_reason(&err);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert!(msg.contains("Duplicate value"), "{msg}");
}
