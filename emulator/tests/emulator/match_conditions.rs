//! Webhook matchConditions as CEL: a heartbeat filtered out, the unguarded
//! `request.subResource` that skipped nodegate's webhook on real clusters
//! (and its counters), the guarded form, errors under each failurePolicy.

use kube::api::{Patch, PatchParams, PostParams};
use nodegate_emulator::admission::{MATCH_CONDITION_ERRORS, MATCH_CONDITION_EXCLUSIONS};
use nodegate_emulator::fake_webhook::FakeReply;
use nodegate_emulator::kubelet::SimKubelet;
use nodegate_emulator::users;
use serde_json::{Value, json};

use crate::support::{add_label_patch, api_reason, create_refused, node, nodes, with_fake};

/// The condition nodegate shipped before the real-cluster fix: it reads
/// `request.subResource` unguarded.
const UNGUARDED: &str = "request.subResource != 'status' || object.status.nodeInfo.bootID != oldObject.status.nodeInfo.bootID";

/// The same with the `has()` guard the real API server requires.
const GUARDED: &str = "!has(request.subResource) || request.subResource != 'status' || object.status.nodeInfo.bootID != oldObject.status.nodeInfo.bootID";

fn condition(expr: &str, policy: &str) -> Value {
    json!({"failurePolicy": policy, "matchConditions": [{"name": "boot", "expression": expr}]})
}

#[tokio::test]
async fn match_conditions_are_cel() {
    let (emu, fake) = with_fake(condition(GUARDED, "Fail"), |_| FakeReply::default()).await;
    let kubelet = SimKubelet::new(&emu, "a").await.unwrap();
    kubelet.register().await.unwrap();
    assert_eq!(fake.requests().len(), 1, "create goes through");
    kubelet.heartbeat().await.unwrap();
    assert_eq!(
        fake.requests().len(),
        1,
        "a heartbeat keeps the bootID: filtered out"
    );
    let mut kubelet = kubelet;
    kubelet.reboot().await.unwrap();
    // The reboot: a create (409 after admission) then a status write with a new bootID.
    assert_eq!(fake.requests().len(), 3);
    assert_eq!(
        fake.requests()[2]["review"]["request"]["subResource"],
        "status"
    );
    let m = emu.admission_metrics();
    assert_eq!(m.get(MATCH_CONDITION_ERRORS, "fake.example.com", None), 0);
    assert_eq!(
        m.get(
            MATCH_CONDITION_EXCLUSIONS,
            "fake.example.com",
            Some("UPDATE")
        ),
        1,
        "the heartbeat was excluded"
    );
}

/// The real-cluster bug, reproduced: `request.subResource` is absent on a
/// main-resource write, the condition errors, `failurePolicy: Ignore` skips
/// the webhook silently — and the error is counted where the API server
/// counts it.
#[tokio::test]
async fn unguarded_subresource_skips_the_webhook_on_create_and_is_counted() {
    let (emu, fake) = with_fake(condition(UNGUARDED, "Ignore"), |_| FakeReply {
        patch: Some(add_label_patch("example.com/hooked")),
        ..Default::default()
    })
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    let created = api
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    assert!(fake.requests().is_empty(), "the webhook was never called");
    assert!(
        !created
            .metadata
            .labels
            .unwrap()
            .contains_key("example.com/hooked"),
        "the create went on without the webhook's mutation"
    );
    let m = emu.admission_metrics();
    assert_eq!(
        m.get(MATCH_CONDITION_ERRORS, "fake.example.com", Some("CREATE")),
        1
    );
    assert_eq!(
        m.get(
            MATCH_CONDITION_EXCLUSIONS,
            "fake.example.com",
            Some("CREATE")
        ),
        1
    );
    let ignored = emu.ignored_webhook_failures();
    assert!(
        ignored.len() == 1 && ignored[0].contains("match conditions: boot"),
        "{ignored:?}"
    );
    // A main-resource UPDATE is skipped the same way; a status write is not.
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await
    .unwrap();
    assert!(fake.requests().is_empty());
    assert_eq!(
        m.get(MATCH_CONDITION_ERRORS, "fake.example.com", Some("UPDATE")),
        1
    );
    api.patch_status(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"nodeInfo": {"bootID": "boot-2"}}})),
    )
    .await
    .unwrap();
    assert_eq!(fake.requests().len(), 1, "status write with a new bootID");

    // The same counters on the emulator's /metrics, as on kube-apiserver's.
    let r = emu
        .raw(Some(users::ADMIN), "GET", "/metrics", "", Vec::new())
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert!(
        text.contains(&format!(
            "{MATCH_CONDITION_ERRORS}{{kind=\"webhook\",name=\"fake.example.com\",operation=\"CREATE\",type=\"admit\"}} 1"
        )),
        "{text}"
    );
}

#[tokio::test]
async fn guarded_condition_calls_the_webhook_on_create() {
    let (emu, fake) = with_fake(condition(GUARDED, "Ignore"), |_| FakeReply {
        patch: Some(add_label_patch("example.com/hooked")),
        ..Default::default()
    })
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    let created = api
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    assert_eq!(fake.requests().len(), 1);
    assert_eq!(
        created.metadata.labels.unwrap()["example.com/hooked"],
        "yes"
    );
    assert_eq!(
        emu.admission_metrics()
            .get(MATCH_CONDITION_ERRORS, "fake.example.com", None),
        0
    );
    assert!(emu.ignored_webhook_failures().is_empty());
}

/// `generic/webhook.go` ShouldCallHook: a match-condition error under
/// `failurePolicy: Fail` refuses the request with 403, without calling.
#[tokio::test]
async fn match_condition_error_follows_failure_policy() {
    let (emu, fake) = with_fake(condition(UNGUARDED, "Fail"), |_| FakeReply::default()).await;
    let api = nodes(&emu, users::ADMIN).await;
    let err = create_refused(&api).await;
    let (code, reason, msg) = api_reason(&err);
    assert_eq!((code, reason.as_str()), (403, "Forbidden"), "{msg}");
    assert!(msg.contains("boot: evaluation failed"), "{msg}");
    assert!(fake.requests().is_empty());
    assert_eq!(
        emu.admission_metrics()
            .get(MATCH_CONDITION_ERRORS, "fake.example.com", Some("CREATE")),
        1
    );
}

/// `matcher.go` Match: a false condition skips the webhook even when another
/// condition errors, whatever the failurePolicy.
#[tokio::test]
async fn a_false_condition_wins_over_an_erroring_one() {
    let (emu, fake) = with_fake(
        json!({"failurePolicy": "Fail", "matchConditions": [
            {"name": "bad", "expression": "object.nope.deeper == 'x'"},
            {"name": "never", "expression": "false"}]}),
        |_| FakeReply::default(),
    )
    .await;
    let api = nodes(&emu, users::ADMIN).await;
    api.create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    assert!(fake.requests().is_empty());
    assert_eq!(
        emu.admission_metrics()
            .get(MATCH_CONDITION_ERRORS, "fake.example.com", None),
        1
    );
}
