//! The MutatingAdmissionPolicy that `nodegate-webhook policy` generates does
//! what the webhook does: every case of the webhook's rule table
//! (`nodegate_webhook::fixtures::rule_table`) goes through the webhook's
//! rules in process and through the policy in the emulator's admission
//! plugin, and the Node after admission is identical. Then the policy in a
//! running emulator: before webhooks, reinvocation, match-condition errors,
//! dry-run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine;
use nodegate_emulator::admission::policy::{self, Outcome};
use nodegate_emulator::admission::{Attributes, Operation};
use nodegate_emulator::resources;
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::DEFAULT_TAINT;
use nodegate_webhook::fixtures::{self, RuleCase};
use nodegate_webhook::policy::{ApiVersion, render};
use nodegate_webhook::review;
use nodegate_webhook::rules::Rules;
use serde_json::{Value, json};

/// The Node after the webhook's decision (its JSON patch applied).
fn through_webhook(taints: &[TaintSpec], c: &RuleCase) -> Value {
    let rules = Rules::new(taints.to_vec()).unwrap();
    let review = fixtures::review(
        "u",
        c.operation,
        None,
        c.user,
        c.object.clone(),
        c.old_object.clone(),
        c.dry_run,
    );
    let body = serde_json::to_vec(&review).unwrap();
    let req = review::decode(&body).unwrap();
    let decision = rules.review(&req);
    let answer: Value =
        serde_json::from_slice(&review::encode(&req.uid, decision.added.as_ref())).unwrap();
    let mut obj = c.object.clone();
    if let Some(p) = answer["response"]["patch"].as_str() {
        let bytes = base64::engine::general_purpose::STANDARD.decode(p).unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        json_patch::patch(&mut obj, &patch).unwrap();
    }
    obj
}

fn documents(text: &str) -> Vec<Value> {
    text.split("\n---\n")
        .map(|d| serde_yaml::from_str(d).unwrap())
        .collect()
}

static EXTRA_NONE: nodegate_emulator::users::Extra = nodegate_emulator::users::Extra::new();

/// The Node after the generated policy, as the emulator's plugin applies it,
/// and again as a reinvocation would (which must change nothing).
fn through_policy(taints: &[TaintSpec], c: &RuleCase) -> Value {
    let docs = documents(&render(taints, &[], ApiVersion::V1));
    let invocations = policy::from_objects(&[&docs[0]], &[&docs[1]]);
    assert_eq!(invocations.len(), 1);
    let inv = &invocations[0];
    let name = c.object["metadata"]["name"].as_str().unwrap_or_default();
    let a = Attributes {
        res: &resources::NODES,
        subresource: "",
        operation: if c.operation == "CREATE" {
            Operation::Create
        } else {
            Operation::Update
        },
        name,
        namespace: "",
        user: c.user,
        extra: &EXTRA_NONE,
        dry_run: c.dry_run,
        options: json!({}),
    };
    let old = c.old_object.clone().unwrap_or(Value::Null);
    let mut obj = c.object.clone();
    let (_, errors) = policy::run(inv, &a, &mut obj, &old);
    assert_eq!(errors, Vec::<String>::new(), "{}: policy errors", c.name);
    let (again, errors) = policy::run(inv, &a, &mut obj.clone(), &old);
    assert!(
        again != Outcome::Mutated && errors.is_empty(),
        "{}: a reinvocation changes nothing: {again:?} {errors:?}",
        c.name
    );
    obj
}

/// Several gates: the node's own agent opens one before the last one's
/// patch records the boot. Neither the webhook nor the policy adds it back
/// (that would loop); the agent token of another node, or an admin, gets
/// it added back by both.
#[test]
fn a_gate_the_nodes_own_agent_opens_alone_stays_open_under_both() {
    let taints: Vec<TaintSpec> = vec![
        DEFAULT_TAINT.parse().unwrap(),
        "nodegate.dev/csi-not-ready=true:NoSchedule"
            .parse()
            .unwrap(),
    ];
    let csi = json!({"key": "nodegate.dev/csi-not-ready", "value": "true", "effect": "NoSchedule"});
    let cni = json!({"key": fixtures::CILIUM, "value": "true", "effect": "NoSchedule"});
    let node = |t: Value| {
        fixtures::with_taints(
            fixtures::with_annotation(
                fixtures::kubelet_node("n1", "boot-2", 0),
                nodegate_shared::keys::READY_BOOT_ID_ANNOTATION,
                "boot-1",
            ),
            t,
        )
    };
    let agent = "system:serviceaccount:nodegate:nodegate-agent";
    let docs = documents(&render(&taints, &[], ApiVersion::V1));
    let invocations = policy::from_objects(&[&docs[0]], &[&docs[1]]);
    let rules = Rules::new(taints.clone()).unwrap();
    for (who, user, claim, regated) in [
        ("the node's own agent", agent, Some("n1"), false),
        ("the agent's token of another node", agent, Some("n2"), true),
        ("an admin", fixtures::ADMIN, None, true),
    ] {
        let extra: nodegate_emulator::users::Extra = claim
            .map(|c| {
                [(
                    "authentication.kubernetes.io/node-name".to_string(),
                    vec![c.to_string()],
                )]
                .into()
            })
            .unwrap_or_default();
        let (obj, old) = (
            node(json!([csi.clone()])),
            node(json!([cni.clone(), csi.clone()])),
        );
        let a = Attributes {
            res: &resources::NODES,
            subresource: "",
            operation: Operation::Update,
            name: "n1",
            namespace: "",
            user,
            extra: &extra,
            dry_run: false,
            options: json!({}),
        };
        let mut by_policy = obj.clone();
        let (_, errors) = policy::run(&invocations[0], &a, &mut by_policy, &old);
        assert!(errors.is_empty(), "{who}: {errors:?}");
        let mut review = fixtures::review("u", "UPDATE", None, user, obj.clone(), Some(old), false);
        if let Some(c) = claim {
            review["request"]["userInfo"]["extra"] =
                json!({"authentication.kubernetes.io/node-name": [c]});
        }
        let req = review::decode(&serde_json::to_vec(&review).unwrap()).unwrap();
        let by_webhook = rules.review(&req).added.is_some();
        let back = taint_keys(&by_policy).contains(&fixtures::CILIUM.to_string());
        assert_eq!(back, regated, "{who}: the policy");
        assert_eq!(by_webhook, regated, "{who}: the webhook");
    }
}

fn taint_keys(n: &Value) -> Vec<String> {
    n["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t["key"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_policy_admits_every_rule_table_case_exactly_as_the_webhook() {
    let taints: Vec<TaintSpec> = vec![DEFAULT_TAINT.parse().unwrap()];
    let table = fixtures::rule_table();
    assert!(table.len() >= 14, "the whole table");
    for c in &table {
        let webhook = through_webhook(&taints, c);
        let policy = through_policy(&taints, c);
        assert_eq!(policy, webhook, "{}: policy and webhook differ", c.name);
        match &c.taints_after {
            Some(keys) => assert_eq!(taint_keys(&policy), *keys, "{}", c.name),
            None => assert_eq!(policy, c.object, "{}: untouched", c.name),
        }
    }
}

#[test]
fn with_several_taints_both_add_only_the_missing_ones_in_place() {
    let taints: Vec<TaintSpec> = vec![
        DEFAULT_TAINT.parse().unwrap(),
        "example.com/gate:NoExecute".parse().unwrap(),
    ];
    let mut cases = fixtures::rule_table();
    // Two of three present, around another taint: only the third is added, in front.
    let mut some_present = fixtures::rule_table()[0].clone();
    some_present.name = "one of two present";
    some_present.object = fixtures::with_taints(
        fixtures::kubelet_node("n1", "boot-1", 0),
        json!([{"key": "a", "effect": "NoSchedule"},
               {"key": fixtures::CILIUM, "effect": "NoSchedule"},
               {"key": "b", "effect": "NoExecute"}]),
    );
    cases.push(some_present);
    for c in &cases {
        let webhook = through_webhook(&taints, c);
        let policy = through_policy(&taints, c);
        assert_eq!(policy, webhook, "{}: policy and webhook differ", c.name);
    }
    let last = through_policy(&taints, cases.last().unwrap());
    assert_eq!(
        taint_keys(&last),
        ["example.com/gate", "a", fixtures::CILIUM, "b"]
    );
}

// ---- the policy in a running emulator ----

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;
use nodegate_emulator::fake_webhook::{FakeReply, FakeWebhook};
use nodegate_emulator::{Emulator, EmulatorOptions, users};

fn node(name: &str) -> Node {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
        .unwrap()
}

/// A policy `p` (bound by `b`) that records in an annotation whether it saw
/// the label the fake webhook adds.
fn recording_policy(reinvocation: &str, failure: &str, condition: &str) -> String {
    format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {{name: p}}
spec:
  failurePolicy: {failure}
  reinvocationPolicy: {reinvocation}
  matchConstraints:
    resourceRules:
      - {{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["nodes"]}}
  matchConditions:
    - name: c
      expression: "{condition}"
  mutations:
    - patchType: JSONPatch
      jsonPatch:
        expression: >-
          [JSONPatch{{op: 'add', path: '/metadata/annotations', value: {{'policy':
            has(object.metadata.labels) && 'hook' in object.metadata.labels ? 'saw-hook' : 'first'}}}}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {{name: b}}
spec: {{policyName: p}}
"#
    )
}

async fn with_policy_and_hook(policy: &str) -> (Emulator, FakeWebhook) {
    let hook = FakeWebhook::start("hook", "test", |req| FakeReply {
        patch: req["object"]["metadata"]["labels"]
            .get("hook")
            .is_none()
            .then(|| json!([{"op": "add", "path": "/metadata/labels", "value": {"hook": "yes"}}])),
        ..Default::default()
    })
    .await
    .unwrap();
    let emu = Emulator::start(EmulatorOptions {
        webhook_configs: vec![hook.config("hook", json!({"reinvocationPolicy": "Never"}))],
        service_endpoints: HashMap::from([(hook.service().to_string(), hook.addr())]),
        ..Default::default()
    })
    .await
    .unwrap();
    emu.apply(policy).unwrap();
    (emu, hook)
}

#[tokio::test]
async fn policies_run_before_webhooks_and_ifneeded_ones_are_reinvoked() {
    for (reinvocation, want) in [("IfNeeded", "saw-hook"), ("Never", "first")] {
        let (emu, hook) =
            with_policy_and_hook(&recording_policy(reinvocation, "Fail", "true")).await;
        let api: Api<Node> = Api::all(emu.client(users::ADMIN).await.unwrap());
        let n = api
            .create(&PostParams::default(), &node("a"))
            .await
            .unwrap();
        // The webhook saw the policy's mutation: policies come first.
        let seen = hook.requests();
        assert_eq!(
            seen.len(),
            1,
            "{reinvocation}: the webhook (Never) runs once"
        );
        assert_eq!(
            seen[0]["review"]["request"]["object"]["metadata"]["annotations"]["policy"],
            "first"
        );
        // The webhook changed the object after the policy: IfNeeded runs again.
        assert_eq!(
            n.metadata.annotations.unwrap()["policy"],
            want,
            "{reinvocation}"
        );
        assert_eq!(n.metadata.labels.unwrap()["hook"], "yes");
    }
}

#[tokio::test]
async fn a_condition_error_follows_the_policys_failure_policy() {
    let erroring = "object.spec.unknownField == 'x'";
    // Ignore: admitted untouched, silently upstream; the emulator keeps it.
    let (emu, _hook) = with_policy_and_hook(&recording_policy("Never", "Ignore", erroring)).await;
    let api: Api<Node> = Api::all(emu.client(users::ADMIN).await.unwrap());
    let n = api
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    assert!(
        n.metadata
            .annotations
            .is_none_or(|a| !a.contains_key("policy"))
    );
    let ignored = emu.ignored_webhook_failures();
    assert!(
        ignored.iter().any(|e| e.starts_with("policy p: c:")),
        "{ignored:?}"
    );
    // Fail: refused with the API server's wording.
    let (emu, _hook) = with_policy_and_hook(&recording_policy("Never", "Fail", erroring)).await;
    let api: Api<Node> = Api::all(emu.client(users::ADMIN).await.unwrap());
    let err = api
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err}")
    };
    assert_eq!(status.code, 403);
    assert!(
        status
            .message
            .starts_with("policy 'p' with binding 'b' denied request: c:"),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn dry_run_create_gets_nodegates_taint_from_the_policy_and_stores_nothing() {
    let emu = Emulator::start(EmulatorOptions::default()).await.unwrap();
    emu.apply(&render(
        &[DEFAULT_TAINT.parse().unwrap()],
        &[],
        ApiVersion::V1,
    ))
    .unwrap();
    let api: Api<Node> = Api::all(emu.client(users::ADMIN).await.unwrap());
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let n = api.create(&pp, &node("dry")).await.unwrap();
    let keys: Vec<String> = n
        .spec
        .unwrap()
        .taints
        .unwrap()
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert_eq!(keys, [fixtures::CILIUM, "node.kubernetes.io/not-ready"]);
    assert!(
        api.get_opt("dry").await.unwrap().is_none(),
        "nothing stored"
    );
    assert_eq!(emu.ignored_webhook_failures(), Vec::<String>::new());
}

/// The policy the overlay shipped before: its variable built the taints with
/// `Object.spec.taints{…}`, a type that exists only where mutations compile.
fn policy_with_object_literal_in_variable() -> String {
    render(&[DEFAULT_TAINT.parse().unwrap()], &[], ApiVersion::V1).replace(
        "{'key': 'nodegate.dev/agent-not-ready', 'value': 'true', 'effect': 'NoSchedule'}",
        "Object.spec.taints{key: 'nodegate.dev/agent-not-ready', value: 'true', effect: 'NoSchedule'}",
    )
}

fn kubectl_create(emu: &Emulator, text: &str) -> std::process::Output {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), text).unwrap();
    std::process::Command::new("kubectl")
        .env("KUBECONFIG", emu.kubeconfig(users::ADMIN).unwrap())
        .args(["create", "-f"])
        .arg(file.path())
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_using_object_types_in_a_variable_is_refused_at_create_like_the_api_server() {
    let emu = Emulator::start(EmulatorOptions::default()).await.unwrap();
    let old = policy_with_object_literal_in_variable();
    assert_ne!(
        old,
        render(&[DEFAULT_TAINT.parse().unwrap()], &[], ApiVersion::V1)
    );
    let out = kubectl_create(&emu, &old);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    // kubectl's rendering of the API server's 422 for this object.
    assert!(
        stderr.contains(
            "The MutatingAdmissionPolicy \"nodegate\" is invalid: spec.variables[0].expression: Invalid value: \"[Object.spec.taints{key: 'nodegate.dev/agent-not-ready', value: 'true', effect: 'NoSchedule'}].filter("
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "compilation failed: ERROR: <input>:1:20: undeclared reference to 'Object.spec.taints' (in container '')"
        ),
        "{stderr}"
    );
    let (policies, _) = emu.store().list(&resources::MUTATING_POLICIES, None);
    assert!(policies.is_empty(), "nothing stored");
    // Stored objects pass validation too: a cluster could never hold it.
    assert!(emu.apply(&old).is_err());

    // The generated policy: created, and it still taints at create. (A fresh
    // emulator: kubectl created the binding beside the refused policy.)
    let emu = Emulator::start(EmulatorOptions::default()).await.unwrap();
    let out = kubectl_create(
        &emu,
        &render(&[DEFAULT_TAINT.parse().unwrap()], &[], ApiVersion::V1),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let api: Api<Node> = Api::all(emu.client(users::ADMIN).await.unwrap());
    let n = api
        .create(&PostParams::default(), &node("n"))
        .await
        .unwrap();
    let taints = n.spec.unwrap().taints.unwrap();
    assert!(
        taints
            .iter()
            .any(|t| t.key == fixtures::CILIUM && t.value.as_deref() == Some("true"))
    );
}

#[test]
fn the_generated_policy_compiles_in_the_upstream_environments_for_every_taint_shape() {
    use nodegate_emulator::admission::validation;
    for taints in [
        vec![DEFAULT_TAINT.parse::<TaintSpec>().unwrap()],
        vec![
            DEFAULT_TAINT.parse().unwrap(),
            "example.com/gate:NoExecute".parse().unwrap(),
        ],
    ] {
        for v in [ApiVersion::V1, ApiVersion::V1beta1] {
            for doc in documents(&render(&taints, &[], v)) {
                let kind = doc["kind"].as_str().unwrap();
                assert_eq!(
                    validation::validate(kind, &doc),
                    Vec::new(),
                    "{kind} {taints:?}"
                );
            }
        }
    }
}
