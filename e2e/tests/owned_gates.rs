//! A gate owned elsewhere beside nodegate's: the AWS EBS CSI driver's
//! `ebs.csi.aws.com/agent-not-ready:NoExecute`, which its node plugin
//! removes (a strategic merge patch of the whole taint list, with its own
//! ServiceAccount) once it runs. The real webhook with `--owned-taint`, the
//! webhook configuration and the confinement generated for those flags, in
//! the emulator:
//!
//! * a Node create gets both gates; with the first line down, a backup
//!   line's replica adds both too;
//! * the owner's removal stands: neither its own write, nor any later status
//!   write or update of the same boot brings the gate back (no write loop);
//! * a status write with a new bootID brings it back, once, with nodegate's;
//! * the agent's pod-bound token can neither add nor remove it; the
//!   webhook's may add it, but not on the boot the agent recorded as ready;
//! * the admission policy for the same flags admits every create and update
//!   exactly as the webhook does.
//!
//! Emulator only, whatever NODEGATE_E2E_KUBECONFIG says: the install under
//! test is configured here. Needs `target/debug/nodegate-webhook`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use nodegate_e2e::process::shipped_rbac;
use nodegate_e2e::standin::{AgentReadiness, StandInAgent};
use nodegate_e2e::{WebhookOptions, WebhookProcess};
use nodegate_emulator::kubelet::SimKubelet;
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::{DEFAULT_TAINT, READY_BOOT_ID_ANNOTATION};
use nodegate_webhook::{confinement, webhook_config};
use serde_json::{Value, json};

const EBS: &str = "ebs.csi.aws.com/agent-not-ready:NoExecute";
const EBS_KEY: &str = "ebs.csi.aws.com/agent-not-ready";
const OUR_KEY: &str = "nodegate.dev/agent-not-ready";
/// The EBS node plugin's ServiceAccount.
const OWNER: &str = "system:serviceaccount:kube-system:ebs-csi-node-sa";
const OWNER_RBAC: &str = r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ebs-csi-node-role}
rules:
  - apiGroups: [""]
    resources: [nodes]
    verbs: [get, patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ebs-csi-node-binding}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ebs-csi-node-role}
subjects: [{kind: ServiceAccount, name: ebs-csi-node-sa, namespace: kube-system}]
"#;
const AGENT_POLICY: &str = "ValidatingAdmissionPolicy 'nodegate-agent-confinement'";
const WEBHOOK_POLICY: &str = "ValidatingAdmissionPolicy 'nodegate-webhook-confinement'";

fn taints() -> Vec<TaintSpec> {
    vec![DEFAULT_TAINT.parse().unwrap()]
}

fn owned() -> Vec<TaintSpec> {
    vec![EBS.parse().unwrap()]
}

/// The emulator with the shipped RBAC and the owner's, the real webhook
/// with `--owned-taint`, and the configuration and confinement generated
/// for its flags (what `components/gates/cilium-ebs-csi` installs).
async fn cluster() -> (Emulator, WebhookProcess) {
    let mut rbac = shipped_rbac().unwrap();
    rbac.push(OWNER_RBAC.to_string());
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(rbac),
        ..Default::default()
    })
    .await
    .unwrap();
    let webhook = WebhookProcess::start(WebhookOptions {
        kubeconfig: Some(emu.webhook_kubeconfig().unwrap()),
        path_token: true,
        extra_args: vec![
            format!("--owned-taint={EBS}"),
            // No Service endpoints to drain at the end.
            "--shutdown-delay".into(),
            "0s".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    let config =
        webhook_config::render_owned(&taints(), &[], &owned(), webhook_config::DEFAULT_REPLICAS);
    webhook.attach(&emu, Some(&config)).unwrap();
    webhook.install_objects(&emu).unwrap();
    // In place of the shipped one (same names).
    emu.apply(&confinement::render_owned(&taints(), &[], &owned(), &[]))
        .unwrap();
    (emu, webhook)
}

fn keys(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

fn has(n: &Node, key: &str) -> bool {
    keys(n).iter().any(|k| k == key)
}

fn rv(n: &Node) -> String {
    n.metadata.resource_version.clone().unwrap_or_default()
}

/// A counter of the webhook's metrics (0 when not exported yet).
async fn metric(webhook: &WebhookProcess, series: &str) -> f64 {
    let text = webhook.metrics().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Every background patch the webhook queued so far, by how it ended.
async fn background_patches(webhook: &WebhookProcess) -> f64 {
    let mut sum = 0.0;
    for result in ["ok", "unneeded", "failed", "skipped"] {
        sum += metric(
            webhook,
            &format!(r#"nodegate_webhook_background_patches_total{{result="{result}"}}"#),
        )
        .await;
    }
    sum
}

/// Polls `f` until it holds; fails after `deadline`.
async fn eventually(what: &str, deadline: Duration, mut f: impl AsyncFnMut() -> bool) {
    let end = tokio::time::Instant::now() + deadline;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < end,
            "not within {deadline:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `f` holds on every poll for the whole window: a negative property (a
/// write that should never come) has no event to wait for.
async fn throughout(what: &str, window: Duration, mut f: impl AsyncFnMut() -> bool) {
    let end = tokio::time::Instant::now() + window;
    while tokio::time::Instant::now() < end {
        assert!(f().await, "violated: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The owner's removal, as the EBS node plugin writes it: a strategic merge
/// patch of the whole taint list without its key (taints have no merge
/// key, so the list is replaced), with no resourceVersion.
async fn owner_removes(owner: &Api<Node>, name: &str) -> Node {
    let n = owner.get(name).await.unwrap();
    let kept: Vec<Value> = n
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != EBS_KEY)
        .map(|t| serde_json::to_value(t).unwrap())
        .collect();
    owner
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"taints": kept}})),
        )
        .await
        .unwrap()
}

/// A Node's first write carries both gates; with the first line down, a
/// backup replica (the same binary and flags) adds both as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_node_gets_both_gates_from_any_line() {
    let (emu, webhook) = cluster().await;
    let kubelet = SimKubelet::new(&emu, "owned-a").await.unwrap();
    let n = kubelet.register().await.unwrap();
    assert!(has(&n, OUR_KEY) && has(&n, EBS_KEY), "{:?}", keys(&n));
    assert_eq!(keys(&n)[0], OUR_KEY, "nodegate's gate in front");

    emu.remove_service_endpoint(&webhook.service());
    let kubelet = SimKubelet::new(&emu, "owned-b").await.unwrap();
    let n = kubelet.register().await.unwrap();
    assert!(has(&n, OUR_KEY) && has(&n, EBS_KEY), "{:?}", keys(&n));
    let calls = emu.webhook_calls(false);
    assert!(
        calls
            .iter()
            .any(|c| c.webhook == webhook_config::backup_name(0) && c.ok),
        "{calls:?}"
    );
}

/// Threat: the owner removes its gate while nodegate's is still on and the
/// boot is not recorded ready. A webhook that added it back (on the
/// owner's update, rule 2, or on the status writes that follow, rule 3)
/// would undo each removal, and the owner and the webhook would write the
/// Node after each other for as long as the boot is not ready. Then a new
/// boot brings the gate back, once, and its removal stands again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owners_removal_stands_until_a_new_boot_brings_the_gate_back_once() {
    const N: usize = 5;
    let (emu, webhook) = cluster().await;
    let name = "owned-loop";
    let mut kubelet = SimKubelet::new(&emu, name).await.unwrap();
    kubelet.register().await.unwrap();
    let admin: Api<Node> = Api::all(emu.client(users::ADMIN).await.unwrap());
    let owner: Api<Node> = Api::all(emu.client(OWNER).await.unwrap());
    let agent = emu.agent_client(name).await.unwrap();
    // Both open on boot 1: the owner's plugin, then nodegate's agent.
    assert!(!has(&owner_removes(&owner, name).await, EBS_KEY));
    StandInAgent::default()
        .mark_ready(&agent, name)
        .await
        .unwrap();
    assert!(
        keys(&admin.get(name).await.unwrap())
            .iter()
            .all(|k| k != OUR_KEY && k != EBS_KEY)
    );

    // A reboot: nodegate's gate back before the kubelet's create is
    // answered, the owned one from the status write that moved the bootID.
    let added_before = metric(
        &webhook,
        r#"nodegate_webhook_taints_added_total{reason="reboot"}"#,
    )
    .await;
    let jobs_before = background_patches(&webhook).await;
    kubelet.reboot().await.unwrap();
    eventually(
        "both gates back after the reboot",
        Duration::from_secs(5),
        async || {
            let n = admin.get(name).await.unwrap();
            has(&n, OUR_KEY) && has(&n, EBS_KEY)
        },
    )
    .await;
    eventually(
        "the background patch counted",
        Duration::from_secs(5),
        async || background_patches(&webhook).await == jobs_before + 1.0,
    )
    .await;
    assert_eq!(
        metric(
            &webhook,
            r#"nodegate_webhook_taints_added_total{reason="reboot"}"#
        )
        .await,
        added_before + 2.0,
        "each gate added once"
    );

    // The owner removes its gate; nodegate's stays, the boot is not ready.
    let removed = owner_removes(&owner, name).await;
    assert!(
        !has(&removed, EBS_KEY) && has(&removed, OUR_KEY),
        "{:?}",
        keys(&removed)
    );
    let jobs = background_patches(&webhook).await;
    // N status writes of the same boot (each reaches the webhook: the boot
    // is not the one recorded ready) and N updates (each an update after a
    // reboot to the webhook).
    let mut last = rv(&removed);
    for i in 0..N {
        let n = kubelet.heartbeat().await.unwrap();
        assert!(!has(&n, EBS_KEY), "status write {i}");
        let n = admin
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {"example.com/round": i.to_string()}}}),
                ),
            )
            .await
            .unwrap();
        assert!(!has(&n, EBS_KEY), "update {i}");
        last = rv(&n);
    }
    // Nothing writes the Node after the last of those: no re-add, no loop.
    throughout(
        "no write after the last one",
        Duration::from_secs(1),
        async || {
            let n = admin.get(name).await.unwrap();
            rv(&n) == last && !has(&n, EBS_KEY) && has(&n, OUR_KEY)
        },
    )
    .await;
    assert_eq!(
        background_patches(&webhook).await,
        jobs,
        "no background patch queued"
    );

    // The agent gets ready; another reboot brings the owned gate back once.
    StandInAgent::default()
        .mark_ready(&agent, name)
        .await
        .unwrap();
    let jobs = background_patches(&webhook).await;
    kubelet.reboot().await.unwrap();
    eventually(
        "the owned gate back after the second reboot",
        Duration::from_secs(5),
        async || has(&admin.get(name).await.unwrap(), EBS_KEY),
    )
    .await;
    eventually("one background patch", Duration::from_secs(5), async || {
        background_patches(&webhook).await == jobs + 1.0
    })
    .await;
    let n = admin.get(name).await.unwrap();
    assert_eq!(
        keys(&n).iter().filter(|k| *k == EBS_KEY).count(),
        1,
        "{:?}",
        keys(&n)
    );
    assert!(
        emu.ignored_webhook_failures().is_empty(),
        "{:?}",
        emu.ignored_webhook_failures()
    );
}

/// The agent's token on every node: it opens nodegate's gate only. Threat:
/// a stolen agent token lifts the owner's gate (pods needing volumes land
/// before the CSI plugin runs) or puts it on (evicting every pod that does
/// not tolerate it). Both 403 from the confinement; its own gate it still
/// opens beside the owned one. The webhook's token may add the owned gate,
/// but, as an evicting one, not on the boot the agent recorded as ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_webhook_adds_the_owned_gate_and_the_agent_never_touches_it() {
    let (emu, _webhook) = cluster().await;
    let name = "owned-confined";
    let kubelet = SimKubelet::new(&emu, name).await.unwrap();
    let n = kubelet.register().await.unwrap();
    let agent = emu.agent_client(name).await.unwrap();
    let agent_api: Api<Node> = Api::all(agent.clone());
    let at = keys(&n).iter().position(|k| k == EBS_KEY).unwrap();
    let refused = |r: Result<Node, kube::Error>, what: &str, needles: &[&str]| match r {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 403, "{what}: {}", e.message);
            for needle in needles {
                assert!(e.message.contains(needle), "{what}: {}", e.message);
            }
        }
        other => panic!("{what}: expected 403, got {other:?}"),
    };
    let json = |ops: Value| -> Patch<()> { Patch::Json(serde_json::from_value(ops).unwrap()) };
    refused(
        agent_api
            .patch(
                name,
                &PatchParams::default(),
                &json(json!([{"op": "remove", "path": format!("/spec/taints/{at}")}])),
            )
            .await,
        "the agent removes the owned gate",
        &[
            AGENT_POLICY,
            "may change only the taints nodegate.dev/agent-not-ready:NoSchedule",
            EBS_KEY,
        ],
    );
    // nodegate's own gate it opens, the owned one stays.
    StandInAgent::default()
        .mark_ready(&agent, name)
        .await
        .unwrap();
    let admin: Api<Node> = Api::all(emu.client(users::ADMIN).await.unwrap());
    let n = admin.get(name).await.unwrap();
    assert!(has(&n, EBS_KEY) && !has(&n, OUR_KEY), "{:?}", keys(&n));
    // Without the owned gate (the owner removed it), the agent cannot put it on.
    let owner: Api<Node> = Api::all(emu.client(OWNER).await.unwrap());
    owner_removes(&owner, name).await;
    let add = json(json!([{"op": "add", "path": "/spec/taints/-",
                           "value": {"key": EBS_KEY, "effect": "NoExecute"}}]));
    refused(
        agent_api.patch(name, &PatchParams::default(), &add).await,
        "the agent adds the owned gate",
        &[AGENT_POLICY, EBS_KEY],
    );
    // The webhook's token: not on the boot recorded as ready…
    let hook: Api<Node> = Api::all(emu.webhook_client().await.unwrap());
    refused(
        hook.patch(name, &PatchParams::default(), &add).await,
        "the webhook adds the evicting owned gate on the ready boot",
        &[
            WEBHOOK_POLICY,
            "may add the evicting gate ebs.csi.aws.com/agent-not-ready:NoExecute (owned elsewhere)",
        ],
    );
    // …but once the stored boot is another than the one recorded ready.
    admin
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeInfo": {"bootID": "another-boot"}}})),
        )
        .await
        .unwrap();
    let n = hook
        .patch(name, &PatchParams::default(), &add)
        .await
        .unwrap();
    assert!(has(&n, EBS_KEY));
    assert_eq!(
        n.metadata.annotations.unwrap()[READY_BOOT_ID_ANNOTATION],
        kubelet.boot_id()
    );
}

/// The admission policy generated for the same flags admits every Node
/// create and update exactly as the webhook's rules do: the owned gate at
/// CREATE (dry-run too), never on an update after a reboot, the owner's
/// removal included.
#[test]
fn the_policy_adds_the_owned_gate_exactly_where_the_webhook_does() {
    use base64::Engine;
    use nodegate_emulator::admission::policy::{self, Outcome};
    use nodegate_emulator::admission::{Attributes, Operation};
    use nodegate_emulator::resources;
    use nodegate_webhook::fixtures::{self, kubelet_node, with_annotation, with_taints};
    use nodegate_webhook::policy::{ApiVersion, render_owned};
    use nodegate_webhook::review;
    use nodegate_webhook::rules::{Rule, Rules};
    static NO_EXTRA: nodegate_emulator::users::Extra = nodegate_emulator::users::Extra::new();
    let rules = Rules::with_owned(taints(), owned()).unwrap();
    let docs: Vec<Value> = render_owned(&taints(), &[], &owned(), ApiVersion::V1)
        .split("\n---\n")
        .map(|d| serde_yaml::from_str(d).unwrap())
        .collect();
    let invocations = policy::from_objects(&[&docs[0]], &[&docs[1]]);
    let mut cases = fixtures::rule_table();
    // The owner's removal after a reboot, nodegate's gate still on.
    let ours = json!({"key": OUR_KEY, "value": "true", "effect": "NoSchedule"});
    let stored = |t: Value| {
        with_taints(
            with_annotation(
                kubelet_node("n1", "boot-2", 0),
                READY_BOOT_ID_ANNOTATION,
                "boot-1",
            ),
            t,
        )
    };
    let mut removal = fixtures::update_cases()[0].clone();
    removal.name = "the owner removes its gate after a reboot";
    removal.user = OWNER;
    removal.object = stored(json!([ours]));
    removal.old_object = Some(stored(
        json!([ours, {"key": EBS_KEY, "effect": "NoExecute"}]),
    ));
    cases.push(removal);
    for c in &cases {
        let rv = fixtures::review(
            "u",
            c.operation,
            None,
            c.user,
            c.object.clone(),
            c.old_object.clone(),
            c.dry_run,
        );
        let req = review::decode(&serde_json::to_vec(&rv).unwrap()).unwrap();
        let d = rules.review(&req);
        let answer: Value =
            serde_json::from_slice(&review::encode(&req.uid, d.added.as_ref())).unwrap();
        let mut by_webhook = c.object.clone();
        if let Some(p) = answer["response"]["patch"].as_str() {
            let bytes = base64::engine::general_purpose::STANDARD.decode(p).unwrap();
            let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
            json_patch::patch(&mut by_webhook, &patch).unwrap();
        }
        let a = Attributes {
            res: &resources::NODES,
            subresource: "",
            operation: if c.operation == "CREATE" {
                Operation::Create
            } else {
                Operation::Update
            },
            name: c.object["metadata"]["name"].as_str().unwrap_or_default(),
            namespace: "",
            user: c.user,
            extra: &NO_EXTRA,
            dry_run: c.dry_run,
            options: json!({}),
        };
        let old = c.old_object.clone().unwrap_or(Value::Null);
        let mut by_policy = c.object.clone();
        let (_, errors) = policy::run(&invocations[0], &a, &mut by_policy, &old);
        assert!(errors.is_empty(), "{}: {errors:?}", c.name);
        let (again, _) = policy::run(&invocations[0], &a, &mut by_policy.clone(), &old);
        assert!(
            again != Outcome::Mutated,
            "{}: a reinvocation changes nothing",
            c.name
        );
        assert_eq!(
            by_policy, by_webhook,
            "{}: policy and webhook differ",
            c.name
        );
        let owned_added =
            by_webhook.to_string().contains(EBS_KEY) && !c.object.to_string().contains(EBS_KEY);
        assert_eq!(
            owned_added,
            c.operation == "CREATE" && c.rule != Rule::Excluded,
            "{}: the owned gate at CREATE only",
            c.name
        );
    }
}
