//! Gates owned elsewhere (`--owned-taint`): another component, such as the
//! AWS EBS CSI node plugin, removes them. The webhook adds them with its
//! own on a new node and on a new boot, and at no other time: their owner
//! removes them with an ordinary write of the same boot, and a re-add there
//! would undo it, the two writing after each other without end.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kube::core::admission::AdmissionReview;
use nodegate_shared::keys::{DEFAULT_TAINT, EXCLUDE_LABEL, READY_BOOT_ID_ANNOTATION as ANN};
use nodegate_shared::{NodeView, TaintSpec};
use nodegate_webhook::fixtures::{
    ADMIN, CILIUM, CONTROLLER, KUBELET, NOT_READY, kubelet_node, review, with_annotation,
    with_taints,
};
use nodegate_webhook::rules::{Decision, Reason, RebootJob, Request, Rule, Rules};
use serde_json::{Value, json};

/// The EBS driver's taint, NoExecute as its docs recommend.
const EBS: &str = "ebs.csi.aws.com/agent-not-ready";
/// A NoSchedule gate of another component.
const CSI: &str = "example.com/csi-not-ready";
/// The owner's ServiceAccount (its node plugin's token).
const OWNER: &str = "system:serviceaccount:kube-system:ebs-csi-node-sa";

fn rules() -> Rules {
    Rules::with_owned(
        vec![DEFAULT_TAINT.parse().unwrap()],
        vec![
            format!("{EBS}:NoExecute").parse().unwrap(),
            format!("{CSI}=true:NoSchedule").parse().unwrap(),
        ],
    )
    .unwrap()
}

fn ours() -> Value {
    json!({"key": CILIUM, "value": "true", "effect": "NoSchedule"})
}
fn ebs() -> Value {
    json!({"key": EBS, "effect": "NoExecute"})
}
fn csi() -> Value {
    json!({"key": CSI, "value": "true", "effect": "NoSchedule"})
}

fn request(review: &Value) -> Request {
    serde_json::from_value::<AdmissionReview<NodeView>>(review.clone())
        .unwrap()
        .request
        .unwrap()
}

fn decide(r: &Rules, review: &Value) -> (Decision, Option<Value>) {
    let d = r.review(&request(review));
    let patched = d.added.as_ref().map(|a| {
        let mut obj = review["request"]["object"].clone();
        json_patch::patch(&mut obj, &a.patch).unwrap();
        obj
    });
    (d, patched)
}

fn keys(obj: &Value) -> Vec<String> {
    obj["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t["key"].as_str().unwrap().to_owned())
        .collect()
}

fn view(v: Value) -> NodeView {
    serde_json::from_value(v).unwrap()
}

fn shown(taints: Vec<&TaintSpec>) -> Vec<String> {
    taints.iter().map(|t| t.to_string()).collect()
}

/// A new node gets every gate, its own and its owners', dry-run too (a
/// pure mutation of the create): nothing could have opened any yet.
/// nodegate's lands in front of a taint list, so an owner's removal never
/// moves it under the agent's ready patch (which tests it at its index).
/// Each added taint
/// is named in a warning; a second call adds nothing.
#[test]
fn a_create_gets_the_owned_gates_with_nodegates() {
    let r = rules();
    let not_ready = with_taints(
        kubelet_node("n1", "boot-1", 0),
        json!([{"key": NOT_READY, "effect": "NoSchedule"}]),
    );
    let no_taints = kubelet_node("n1", "boot-1", 0);
    let cases: [(&str, &Value, bool, &[&str]); 3] = [
        (
            "kubelet create with not-ready",
            &not_ready,
            false,
            &[CILIUM, CSI, EBS, NOT_READY],
        ),
        (
            "dry-run create",
            &not_ready,
            true,
            &[CILIUM, CSI, EBS, NOT_READY],
        ),
        // Without a taint list the patch adds it whole, in the rules' order
        // (a real create always carries the API server's not-ready).
        (
            "spec without taints",
            &no_taints,
            false,
            &[EBS, CSI, CILIUM],
        ),
    ];
    for (name, obj, dry_run, want) in cases {
        let rv = review("u", "CREATE", None, KUBELET, obj.clone(), None, dry_run);
        let (d, out) = decide(&r, &rv);
        assert_eq!(d.rule, Rule::NodeCreate, "{name}");
        let out = out.unwrap();
        assert_eq!(keys(&out), want, "{name}");
        let added = d.added.unwrap();
        assert_eq!(added.reason, Reason::Create);
        assert_eq!(added.taints.len(), 3, "{name}");
        assert_eq!(added.owned.len(), 2, "{name}");
        let warnings = added.warnings();
        assert_eq!(warnings.len(), 3, "{name}");
        for (key, why) in [
            (EBS, "the component that owns this gate removes it"),
            (CSI, "the component that owns this gate removes it"),
            (CILIUM, "its network agent is not ready yet"),
        ] {
            assert!(
                warnings.iter().any(|w| w.contains(key) && w.contains(why)),
                "{name}: {warnings:?}"
            );
        }
        let mut again = rv.clone();
        again["request"]["object"] = out;
        let (d, out) = decide(&r, &again);
        assert!(out.is_none(), "{name}: second call patched");
        assert_eq!(d.rule, Rule::Idempotent);
    }
    // An excluded node (an admin's create) gets nothing.
    let mut excluded = no_taints;
    excluded["metadata"]["labels"][EXCLUDE_LABEL] = json!("true");
    let (d, out) = decide(
        &r,
        &review("u", "CREATE", None, ADMIN, excluded, None, false),
    );
    assert!(out.is_none());
    assert_eq!(d.rule, Rule::Excluded);
}

/// Threat: the owner removes its gate with an UPDATE of the main resource
/// while the node's boot is not recorded ready (nodegate's gate still on).
/// That is exactly an update after a reboot (rule 2); adding the owned gate
/// back would undo the removal in the same write, and every retry of the
/// owner would be undone again. Rule 2 brings back nodegate's taints only.
#[test]
fn an_update_after_a_reboot_never_adds_an_owned_gate() {
    let r = rules();
    // Rebooted: the agent was last ready on boot-1, the node runs boot-2.
    let stored = |taints: Value| {
        with_taints(
            with_annotation(kubelet_node("n1", "boot-2", 0), ANN, "boot-1"),
            taints,
        )
    };
    // (name, user, new object, stored object, taint keys after or None)
    type Case<'a> = (&'a str, &'a str, Value, Value, Option<&'a [&'a str]>);
    let cases: [Case<'_>; 4] = [
        (
            "the owner removes its gate, nodegate's still on",
            OWNER,
            stored(json!([ours(), csi()])),
            stored(json!([ours(), csi(), ebs()])),
            None,
        ),
        (
            "the owner removes the last owned gate",
            OWNER,
            stored(json!([ours()])),
            stored(json!([ours(), csi()])),
            None,
        ),
        (
            "a controller's update after the reboot, nothing on",
            CONTROLLER,
            stored(json!([])),
            stored(json!([])),
            Some(&[CILIUM]),
        ),
        (
            "an admin's label after the reboot, owned gates removed",
            ADMIN,
            stored(json!([ours()])),
            stored(json!([ours()])),
            None,
        ),
    ];
    for (name, user, new, old, want) in cases {
        let rv = review("u", "UPDATE", None, user, new, Some(old), false);
        let (d, out) = decide(&r, &rv);
        match want {
            None => {
                assert!(out.is_none(), "{name}: {:?}", d.added);
                assert_eq!(d.rule, Rule::Idempotent, "{name}");
            }
            Some(want) => {
                assert_eq!(d.rule, Rule::UpdateAfterReboot, "{name}");
                assert_eq!(keys(&out.unwrap()), want, "{name}");
                assert!(d.added.unwrap().owned.is_empty(), "{name}");
            }
        }
        assert_eq!(d.reboot_job, None, "{name}");
    }
}

/// A status write cannot carry taints; the one that moves the bootID (once
/// per boot) queues the background patch for the owned gates too, also
/// when they are all that is missing. Threat: every later status write of
/// the boot still differs from the ready record (the agent is not ready
/// yet); queuing the owned gates there would re-add them after each
/// removal by their owner, a write loop as long as the boot is not ready.
#[test]
fn status_writes_bring_owned_gates_back_only_when_the_boot_moves() {
    let r = rules();
    let node = |boot: &str, taints: Value| {
        with_taints(
            with_annotation(kubelet_node("n1", boot, 0), ANN, "boot-1"),
            taints,
        )
    };
    type Queued<'a> = Option<Option<&'a str>>;
    let cases: [(&str, Value, Value, bool, Queued<'_>); 6] = [
        (
            "the boot moves, only the owned gates missing",
            node("boot-2", json!([ours()])),
            node("boot-1", json!([ours()])),
            false,
            Some(Some("boot-1")),
        ),
        (
            "the boot moves, every gate on",
            node("boot-2", json!([ours(), csi(), ebs()])),
            node("boot-1", json!([ours(), csi(), ebs()])),
            false,
            None,
        ),
        (
            "the boot moves, dry-run",
            node("boot-2", json!([])),
            node("boot-1", json!([])),
            true,
            None,
        ),
        (
            "a later status write, the owner removed its gates",
            node("boot-2", json!([ours()])),
            node("boot-2", json!([ours()])),
            false,
            None,
        ),
        (
            "a later status write, the owner removed one",
            node("boot-2", json!([ours(), csi()])),
            node("boot-2", json!([ours(), csi()])),
            false,
            None,
        ),
        (
            "a later status write, nodegate's gate missing too",
            node("boot-2", json!([])),
            node("boot-2", json!([])),
            false,
            Some(None),
        ),
    ];
    for (name, new, old, dry_run, queued) in cases {
        let rv = review(
            "u",
            "UPDATE",
            Some("status"),
            KUBELET,
            new,
            Some(old),
            dry_run,
        );
        let (d, out) = decide(&r, &rv);
        assert!(out.is_none(), "{name}: a status write is never patched");
        assert_eq!(d.rule, Rule::StatusShowsReboot, "{name}");
        let want = queued.map(|prev| RebootJob {
            node: "n1".into(),
            previous_boot: prev.map(str::to_owned),
        });
        assert_eq!(d.reboot_job, want, "{name}");
    }
}

/// The job's re-check on the freshly read node: the job of the write that
/// moved the boot adds the owned gates; any other job nodegate's only.
#[test]
fn the_background_recheck_adds_owned_gates_only_for_a_new_boot() {
    let r = rules();
    let rebooted = |taints: Value| {
        view(with_taints(
            with_annotation(kubelet_node("n1", "boot-2", 0), ANN, "boot-1"),
            taints,
        ))
    };
    let nothing = rebooted(json!([]));
    assert_eq!(shown(r.reboot_taints_needed(&nothing)), [DEFAULT_TAINT]);
    assert_eq!(
        shown(r.new_boot_taints_needed(&nothing)),
        [
            format!("{EBS}:NoExecute"),
            format!("{CSI}=true:NoSchedule"),
            DEFAULT_TAINT.to_owned()
        ]
    );
    let owner_removed = rebooted(json!([ours()]));
    assert!(r.reboot_taints_needed(&owner_removed).is_empty());
    assert_eq!(r.new_boot_taints_needed(&owner_removed).len(), 2);
    // Ready on the current boot, or excluded: nothing, new boot or not.
    let ready = view(with_annotation(
        kubelet_node("n1", "boot-2", 0),
        ANN,
        "boot-2",
    ));
    assert!(r.new_boot_taints_needed(&ready).is_empty());
    let mut excluded = with_annotation(kubelet_node("n1", "boot-2", 0), ANN, "boot-1");
    excluded["metadata"]["labels"][EXCLUDE_LABEL] = json!("true");
    assert!(r.new_boot_taints_needed(&view(excluded)).is_empty());
}

/// A kubelet's create of its existing Node claiming a new boot: the stored
/// node gets the owned gates back with nodegate's, but never an evicting
/// (NoExecute) one on a claim no stored version confirms yet (a forged
/// claim must not evict the node's pods); that one follows the stored new
/// boot, from the status write's job. A restart on the same boot: nothing.
#[test]
fn a_reregistration_brings_back_the_owned_gates_but_never_an_evicting_one() {
    let r = rules();
    let stored = view(with_annotation(
        kubelet_node("n1", "boot-1", 0),
        ANN,
        "boot-1",
    ));
    assert_eq!(
        shown(r.reregistration_taints_needed(&stored, "boot-2")),
        [format!("{CSI}=true:NoSchedule"), DEFAULT_TAINT.to_owned()]
    );
    assert!(r.reregistration_taints_needed(&stored, "boot-1").is_empty());
}

/// One key and effect is one taint to the API server: an owned gate may
/// not repeat one of nodegate's.
#[test]
fn an_owned_gate_never_repeats_a_taint() {
    let err = Rules::with_owned(
        vec![DEFAULT_TAINT.parse().unwrap()],
        vec!["nodegate.dev/agent-not-ready:NoSchedule".parse().unwrap()],
    )
    .unwrap_err();
    assert!(err.to_string().contains("listed twice"), "{err}");
    assert!(rules().owned().len() == 2 && rules().taints().len() == 1);
}
