//! The rule table: every rule the webhook decides ([`Rule`]), over realistic
//! Node JSON decoded as kube does; each patch is applied with json-patch and
//! the result checked, plus a second call to prove [`Rule::Idempotent`].
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kube::core::admission::AdmissionReview;
use nodegate_shared::NodeView;
use nodegate_shared::keys::{DEFAULT_TAINT, EXCLUDE_LABEL, READY_BOOT_ID_ANNOTATION as ANN};
use nodegate_webhook::fixtures::{
    self, CILIUM, KUBELET, NOT_READY, kubelet_node, node_with_not_ready, review, with_annotation,
    with_taints,
};
use nodegate_webhook::rules::{
    Added, Decision, Foreign, Reason, RebootJob, Request, Reregistration, Rule, Rules,
};
use serde_json::{Value, json};

/// (name, user, new object, old object, expected taint keys or None, the
/// rule that decides).
type UpdateCase<'a> = (&'a str, &'a str, Value, Value, Option<Vec<&'a str>>, Rule);

fn rules() -> Rules {
    Rules::new(vec![DEFAULT_TAINT.parse().unwrap()]).unwrap()
}

/// The request as kube decodes the API server's AdmissionReview.
fn request(review: &Value) -> Request {
    serde_json::from_value::<AdmissionReview<NodeView>>(review.clone())
        .unwrap()
        .request
        .unwrap()
}

/// What the API server would do with the decision: the object after
/// applying its JSON patch, and the warnings it passes on.
struct Answer {
    decision: Decision,
    added: Option<(Reason, usize)>,
    warnings: Vec<String>,
    reboot_patch: Option<RebootJob>,
    patched: Option<Value>,
}

fn answer(rules: &Rules, review: &Value) -> Answer {
    let decision = rules.review(&request(review));
    let patched = decision.added.as_ref().map(|a| {
        let mut obj = review["request"]["object"].clone();
        json_patch::patch(&mut obj, &a.patch).expect("patch applies to the object");
        obj
    });
    Answer {
        added: decision.added.as_ref().map(|a| (a.reason, a.taints.len())),
        warnings: decision
            .added
            .as_ref()
            .map(Added::warnings)
            .unwrap_or_default(),
        reboot_patch: decision.reboot_job.clone(),
        patched,
        decision,
    }
}

fn taint_keys(obj: &Value) -> Vec<String> {
    obj["spec"]["taints"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| t["key"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The API server may call again with the mutated object (reinvocation).
fn assert_idempotent(rules: &Rules, review_json: &Value, patched: &Value) {
    let mut again = review_json.clone();
    again["request"]["object"] = patched.clone();
    let a = answer(rules, &again);
    assert!(
        a.patched.is_none(),
        "second call patched again: {:?}",
        a.decision
    );
    assert_eq!(a.decision.rule, Rule::Idempotent);
}

#[test]
fn create_table() {
    let r = rules();
    let large = with_taints(
        kubelet_node("n1", "boot-1", 50),
        json!([{"key": NOT_READY, "effect": "NoSchedule"}]),
    );
    let size = serde_json::to_vec(&review(
        "u",
        "CREATE",
        None,
        KUBELET,
        large.clone(),
        None,
        false,
    ))
    .unwrap()
    .len();
    assert!(
        (20_000..32_000).contains(&size),
        "review is {size} bytes, want about 25 KB"
    );
    for c in fixtures::create_cases() {
        let (name, obj, dry_run, want) = (c.name, c.object, c.dry_run, c.taints_after);
        let rv = review("u-1", "CREATE", None, c.user, obj.clone(), None, dry_run);
        let a = answer(&r, &rv);
        assert_eq!(a.decision.rule, c.rule, "{name}");
        match (&want, &a.patched) {
            (None, None) => {}
            (Some(keys), Some(out)) => {
                assert_eq!(&taint_keys(out), keys, "{name}");
                let added = out["spec"]["taints"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|t| t["key"] == CILIUM)
                    .unwrap();
                assert_eq!(
                    added,
                    &json!({"key": CILIUM, "value": "true", "effect": "NoSchedule"})
                );
                // Nothing but spec.taints changed.
                let mut without = out.clone();
                let mut orig = obj.clone();
                without["spec"].as_object_mut().unwrap().remove("taints");
                if let Some(s) = orig.get_mut("spec") {
                    s.as_object_mut().unwrap().remove("taints");
                } else {
                    orig["spec"] = json!({});
                }
                assert_eq!(without, orig, "{name}: other fields changed");
                assert_eq!(a.warnings.len(), 1, "{name}");
                let w = &a.warnings[0];
                assert!(
                    w.contains(DEFAULT_TAINT) && w.contains("new node"),
                    "{name}: {w}"
                );
                assert_eq!(a.added, Some((Reason::Create, 1)), "{name}");
                assert_idempotent(&r, &rv, out);
            }
            _ => panic!("{name}: expected {want:?}, got {:?}", a.decision),
        }
        assert_eq!(a.reboot_patch, None, "{name}");
    }
}

#[test]
fn several_taints_add_only_the_missing_ones_in_place() {
    let r = Rules::new(vec![
        DEFAULT_TAINT.parse().unwrap(),
        "example.com/gate:NoExecute".parse().unwrap(),
    ])
    .unwrap();
    let obj = with_taints(
        kubelet_node("n1", "boot-1", 0),
        json!([{"key": "a", "effect": "NoSchedule"}, {"key": CILIUM, "effect": "NoSchedule"},
               {"key": "b", "effect": "NoExecute"}]),
    );
    let rv = review("u", "CREATE", None, KUBELET, obj, None, false);
    let a = answer(&r, &rv);
    let out = a.patched.unwrap();
    assert_eq!(taint_keys(&out), ["example.com/gate", "a", CILIUM, "b"]);
    assert_eq!(a.warnings.len(), 1);
    assert!(a.warnings[0].contains("example.com/gate:NoExecute"));
    assert_idempotent(&r, &rv, &out);
}

#[test]
fn update_table() {
    let r = rules();
    let cases: Vec<UpdateCase> = fixtures::update_cases()
        .into_iter()
        .map(|c| {
            (
                c.name,
                c.user,
                c.object,
                c.old_object.unwrap(),
                c.taints_after,
                c.rule,
            )
        })
        .collect();
    for (name, user, new, old, want, rule) in cases {
        let rv = review("u-2", "UPDATE", None, user, new, Some(old), false);
        let a = answer(&r, &rv);
        assert_eq!(a.decision.rule, rule, "{name}");
        match (&want, &a.patched) {
            (None, None) => {}
            (Some(keys), Some(out)) => {
                assert_eq!(&taint_keys(out), keys, "{name}");
                // The controller's own taint entry is kept byte for byte.
                assert_eq!(
                    out["spec"]["taints"][1]["timeAdded"],
                    "2025-01-01T00:01:00Z"
                );
                let w = &a.warnings[0];
                assert!(w.contains("rebooted"), "{name}: {w}");
                assert_eq!(a.added, Some((Reason::Reboot, 1)));
                assert_idempotent(&r, &rv, out);
            }
            _ => panic!("{name}: expected {want:?}, got {:?}", a.decision),
        }
        assert_eq!(a.reboot_patch, None, "{name}");
    }
}

#[test]
fn status_writes_never_patch_and_queue_only_real_reboots() {
    let r = rules();
    let old = with_annotation(kubelet_node("n1", "boot-1", 50), ANN, "boot-1");
    let rebooted = with_annotation(kubelet_node("n1", "boot-2", 50), ANN, "boot-1");
    let heartbeat = old.clone();
    let first_status = kubelet_node("n1", "boot-1", 0);
    let unannotated_old = kubelet_node("n1", "", 0);
    let tainted_old = with_taints(
        old.clone(),
        json!([{"key": CILIUM, "value": "true", "effect": "NoSchedule"}]),
    );
    let tainted_new = with_taints(
        rebooted.clone(),
        json!([{"key": CILIUM, "value": "true", "effect": "NoSchedule"}]),
    );
    let stale_annotation_old = with_annotation(kubelet_node("n1", "boot-2", 0), ANN, "boot-1");
    let stale_annotation_new = stale_annotation_old.clone();
    let unannotated_reboot_old = kubelet_node("n1", "boot-1", 0);
    let unannotated_reboot_new = kubelet_node("n1", "boot-2", 0);
    let mut excluded = rebooted.clone();
    excluded["metadata"]["labels"][EXCLUDE_LABEL] = json!("true");
    // Queued, with the bootID the write replaces (if it replaces one).
    type Queued<'a> = Option<Option<&'a str>>;
    let boot_1 = Some(Some("boot-1"));
    // (name, new, old, dry_run, queued)
    let cases: Vec<(&str, Value, Value, bool, Queued<'_>)> = vec![
        (
            "bootID changed",
            rebooted.clone(),
            old.clone(),
            false,
            boot_1,
        ),
        (
            "bootID changed, dry-run",
            rebooted.clone(),
            old.clone(),
            true,
            None,
        ),
        (
            "heartbeat, bootID unchanged",
            heartbeat,
            old.clone(),
            false,
            None,
        ),
        (
            "first status after registration (old bootID empty)",
            first_status,
            unannotated_old,
            false,
            None,
        ),
        (
            "bootID changed but taint present",
            tainted_new,
            tainted_old,
            false,
            None,
        ),
        (
            "annotation differs from current bootID",
            stale_annotation_new,
            stale_annotation_old,
            false,
            // The write keeps the bootID: nothing to wait for.
            Some(None),
        ),
        (
            "bootID changed, never ready",
            unannotated_reboot_new,
            unannotated_reboot_old,
            false,
            boot_1,
        ),
        ("excluded", excluded, old, false, None),
    ];
    for (name, new, old, dry_run, queued) in cases {
        let rv = review(
            "u-3",
            "UPDATE",
            Some("status"),
            KUBELET,
            new,
            Some(old),
            dry_run,
        );
        let a = answer(&r, &rv);
        assert!(
            a.patched.is_none(),
            "{name}: status write patched: {:?}",
            a.decision
        );
        let rule = if name == "excluded" {
            Rule::Excluded
        } else {
            Rule::StatusShowsReboot
        };
        assert_eq!(a.decision.rule, rule, "{name}");
        let want = queued.map(|prev| RebootJob {
            node: "n1".into(),
            previous_boot: prev.map(str::to_owned),
        });
        assert_eq!(a.reboot_patch, want, "{name}");
    }
}

#[test]
fn other_kinds_operations_and_subresources_are_untouched() {
    let r = rules();
    let node = node_with_not_ready();
    let mut pod = review("u", "CREATE", None, "alice", node.clone(), None, false);
    pod["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
    let delete = review(
        "u",
        "DELETE",
        None,
        "alice",
        node.clone(),
        Some(node.clone()),
        false,
    );
    let connect = review("u", "CONNECT", None, "alice", node.clone(), None, false);
    let proxy = review(
        "u",
        "UPDATE",
        Some("proxy"),
        "alice",
        node.clone(),
        Some(node.clone()),
        false,
    );
    let mut no_object = review("u", "CREATE", None, "alice", node, None, false);
    no_object["request"]["object"] = Value::Null;
    for rv in [pod, delete, connect, proxy, no_object] {
        let a = answer(&r, &rv);
        assert!(a.patched.is_none(), "{:?}", a.decision);
        assert_eq!(a.added, None);
        assert_eq!(a.decision.rule, Rule::Excluded);
    }
}

#[test]
fn background_recheck() {
    let r = rules();
    let view = |v: Value| serde_json::from_value::<NodeView>(v).unwrap();
    let ready_now = with_annotation(kubelet_node("n1", "boot-2", 0), ANN, "boot-2");
    assert!(r.reboot_taints_needed(&view(ready_now)).is_empty());
    let stale = with_annotation(kubelet_node("n1", "boot-2", 0), ANN, "boot-1");
    assert_eq!(r.reboot_taints_needed(&view(stale.clone())).len(), 1);
    assert_eq!(
        r.reboot_taints_needed(&view(kubelet_node("n1", "boot-2", 0)))
            .len(),
        1
    );
    let tainted = with_taints(
        stale.clone(),
        json!([{"key": CILIUM, "effect": "NoSchedule"}]),
    );
    assert!(r.reboot_taints_needed(&view(tainted)).is_empty());
    let mut excluded = stale;
    excluded["metadata"]["labels"][EXCLUDE_LABEL] = json!("true");
    assert!(r.reboot_taints_needed(&view(excluded)).is_empty());
}

/// A kubelet's create of an existing Node: the stored node gets its
/// taints back only after a reboot, never for a restart on the same boot,
/// never when excluded or already tainted.
#[test]
fn reregistration_retaints_only_after_a_reboot() {
    let r = rules();
    let view = |v: Value| -> NodeView { serde_json::from_value(v).unwrap() };
    let ready_on = |boot: &str| with_annotation(kubelet_node("n1", "boot-1", 1), ANN, boot);
    let excluded = {
        let mut n = ready_on("boot-1");
        n["metadata"]["labels"][EXCLUDE_LABEL] = json!("true");
        n
    };
    let tainted = with_taints(
        ready_on("boot-1"),
        json!([{"key": CILIUM, "value": "true", "effect": "NoSchedule"}]),
    );
    let never_ready = kubelet_node("n1", "boot-1", 1);
    let cases: Vec<(&str, Value, &str, usize)> = vec![
        ("reboot after ready", ready_on("boot-1"), "boot-2", 1),
        (
            "kubelet restart, same boot",
            ready_on("boot-1"),
            "boot-1",
            0,
        ),
        ("create without a boot ID", ready_on("boot-1"), "", 0),
        ("excluded node", excluded, "boot-2", 0),
        ("taint still on", tainted, "boot-2", 0),
        ("never ready, stored boot differs", never_ready, "boot-2", 1),
        (
            "agent ready on the create's boot",
            ready_on("boot-2"),
            "boot-2",
            0,
        ),
    ];
    for (name, stored, boot, want) in cases {
        let got = r.reregistration_taints_needed(&view(stored), boot);
        assert_eq!(got.len(), want, "{name}");
    }
}

#[test]
fn only_a_real_create_asks_for_the_reregistration_check() {
    let r = rules();
    let node = kubelet_node("n1", "boot-2", 1);
    for (dry_run, want) in [(false, true), (true, false)] {
        let review = fixtures::review("u", "CREATE", None, KUBELET, node.clone(), None, dry_run);
        let d = r.review(&request(&review));
        assert_eq!(
            d.reregistration,
            want.then(|| Reregistration {
                node: "n1".into(),
                boot_id: "boot-2".into()
            }),
            "dry-run {dry_run}"
        );
    }
}

/// Only the node's own kubelet reports its boots. Threat: anyone who may
/// create Nodes or write `nodes/status` posts a copy of a ready Node with a
/// new boot ID; the create is refused (AlreadyExists) only after mutating
/// admission ran, so a re-taint would stay, and in strict mode evict the
/// node's pods. Check: the user is `system:node:<the node's name>`. The
/// create's own answer still carries the taints (it mutates only the object
/// the caller sends).
#[test]
fn only_the_nodes_own_kubelet_moves_the_webhook_to_write_a_stored_node() {
    let r = rules();
    let create = kubelet_node("n1", "boot-2", 1);
    let old = with_annotation(kubelet_node("n1", "boot-1", 1), ANN, "boot-1");
    let rebooted = with_annotation(kubelet_node("n1", "boot-2", 1), ANN, "boot-1");
    let writers = [
        ("the node's kubelet", KUBELET, None),
        ("another node's kubelet", "system:node:n2", Some(())),
        (
            "a ServiceAccount that may create nodes",
            "system:serviceaccount:capi:manager",
            Some(()),
        ),
        (
            "the check's dry-run-only credential",
            "system:serviceaccount:nodegate:nodegate-check",
            Some(()),
        ),
        ("an admin", fixtures::ADMIN, Some(())),
        (
            "a name that only starts like the node's",
            "system:node:n1x",
            Some(()),
        ),
        ("no user", "", Some(())),
    ];
    for (who, user, refused) in writers {
        let c = r.review(&request(&review(
            "u",
            "CREATE",
            None,
            user,
            create.clone(),
            None,
            false,
        )));
        assert!(c.added.is_some(), "{who}: the create's answer is tainted");
        assert_eq!(
            c.reregistration.is_some(),
            refused.is_none(),
            "{who}: create"
        );
        assert_eq!(
            c.foreign,
            refused.map(|()| Foreign::Reregistration),
            "{who}: create counted"
        );
        let s = r.review(&request(&review(
            "u",
            "UPDATE",
            Some("status"),
            user,
            rebooted.clone(),
            Some(old.clone()),
            false,
        )));
        assert_eq!(s.reboot_job.is_some(), refused.is_none(), "{who}: status");
        assert_eq!(
            s.foreign,
            refused.map(|()| Foreign::Status),
            "{who}: status counted"
        );
    }
}

/// Strict mode: a re-registration's claim of a new boot is not yet stored,
/// so it brings back the ordinary taint only; the evicting boot gate waits
/// for the stored new boot (the background re-check after the kubelet's
/// status write adds it).
#[test]
fn a_reregistration_never_adds_the_evicting_gate() {
    let gate = "nodegate.dev/agent-not-ready=true:NoExecute";
    let r = Rules::new(vec![DEFAULT_TAINT.parse().unwrap(), gate.parse().unwrap()]).unwrap();
    let view = |v: Value| -> NodeView { serde_json::from_value(v).unwrap() };
    let stored = with_annotation(kubelet_node("n1", "boot-1", 1), ANN, "boot-1");
    let shown: Vec<String> = r
        .reregistration_taints_needed(&view(stored), "boot-2")
        .iter()
        .map(|t| t.to_string())
        .collect();
    assert_eq!(shown, [DEFAULT_TAINT]);
    // Once the new boot is stored, the re-check adds both.
    let rebooted = with_annotation(kubelet_node("n1", "boot-2", 1), ANN, "boot-1");
    assert_eq!(r.reboot_taints_needed(&view(rebooted)).len(), 2);
}
