//! The admission decision: which Node writes get which taints, and why.
//!
//! Pure and synchronous: no I/O, so it is table-tested directly and runs on
//! the runtime threads without blocking them. It reads kube's
//! `AdmissionRequest` with the Node as the workspace's [`NodeView`], and owns
//! everything a decision carries: the taints to add and why, the patch that
//! adds them (shaped by `nodegate_shared::patch::add_taints`, the same builder
//! the agent and the background patcher use), and the follow-up jobs.
//! Nothing here knows about bytes, HTTP or metrics.

use json_patch::Patch;
use kube::core::admission::{AdmissionRequest, Operation};
use nodegate_shared::keys::NODE_USER_PREFIX;
use nodegate_shared::node::{boot_id_changed, rebooted_since_ready};
use nodegate_shared::patch::{Guard, add_taints};
use nodegate_shared::taint::check_unique;
use nodegate_shared::{NodeView, TaintError, TaintSpec};

/// An admission request for a Node, as kube decodes it.
pub type Request = AdmissionRequest<NodeView>;

/// Why taints were added; also the `reason` label of the taints metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A new Node: its network agent cannot be ready yet.
    Create,
    /// A write after the node rebooted since its agent was last ready.
    Reboot,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Create => "create",
            Reason::Reboot => "reboot",
        }
    }

    /// The end of the warning the requester sees for each added taint.
    fn explanation(self) -> &'static str {
        match self {
            Reason::Create => "new node, its network agent is not ready yet",
            Reason::Reboot => "node rebooted since its network agent was last ready",
        }
    }
}

/// Taints added by the answer: which, why, and the JSON patch adding them to
/// the object under review.
#[derive(Debug, Clone, PartialEq)]
pub struct Added {
    pub reason: Reason,
    pub taints: Vec<TaintSpec>,
    pub patch: Patch,
}

impl Added {
    /// One warning per added taint, shown to the client that made the write.
    pub fn warnings(&self) -> Vec<String> {
        let why = self.reason.explanation();
        self.taints
            .iter()
            .map(|t| format!("nodegate: added taint {t}: {why}"))
            .collect()
    }
}

/// A node whose status write showed a reboot: its main resource needs the
/// taints, patched in the background (a status write cannot carry them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebootJob {
    pub node: String,
    /// When the write changes the bootID: the one it replaces (empty when
    /// there was none). Until the stored node moves off it, the write that
    /// triggered the job is not stored yet.
    pub previous_boot: Option<String>,
}

/// A kubelet's create of a Node that may already exist: its name and the boot
/// ID the create carries (`initialNode` fills the status before the create).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reregistration {
    pub node: String,
    pub boot_id: String,
}

/// The outcome of one review. The answer is always allowed: nodegate only
/// adds taints, and never blocks a write.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Taints the answer adds, with its patch.
    pub added: Option<Added>,
    /// A status write after a reboot: this node needs a background patch of
    /// its main resource. `None` on dry-run.
    pub reboot_job: Option<RebootJob>,
    /// A Node create (not dry-run): if the name already exists this is a
    /// kubelet re-registering, and the stored node may need its taints back
    /// before the create is answered (the kubelet's status write follows the
    /// answer).
    pub reregistration: Option<Reregistration>,
    /// One short phrase for the log line.
    pub why: &'static str,
}

impl Decision {
    fn allow(why: &'static str) -> Self {
        Decision {
            added: None,
            reboot_job: None,
            reregistration: None,
            why,
        }
    }
}

/// The configured taints and the decisions made with them.
#[derive(Debug, Clone)]
pub struct Rules {
    taints: Vec<TaintSpec>,
}

/// `system:node:<name>`: the kubelet of that node.
fn is_node_itself(username: Option<&str>, node: Option<&str>) -> bool {
    match (
        username.and_then(|u| u.strip_prefix(NODE_USER_PREFIX)),
        node,
    ) {
        (Some(user_node), Some(node)) => user_node == node,
        _ => false,
    }
}

impl Rules {
    /// Refuses duplicates (same key and effect): the API server would reject
    /// a Node carrying both.
    pub fn new(taints: Vec<TaintSpec>) -> Result<Self, TaintError> {
        check_unique(&taints)?;
        Ok(Self { taints })
    }

    pub fn taints(&self) -> &[TaintSpec] {
        &self.taints
    }

    /// Decides one admission request. Never denies: nodegate only adds taints.
    pub fn review(&self, req: &Request) -> Decision {
        let allow = Decision::allow;
        // Only core v1 Nodes are ours, whatever the configuration sends.
        if !req.kind.group.is_empty() || req.kind.version != "v1" || req.kind.kind != "Node" {
            return allow("not a v1 Node");
        }
        let Some(node) = req.object.as_ref() else {
            return allow("no object");
        };
        if node.is_excluded() {
            return allow("node excluded by label");
        }
        let sub = req.sub_resource.as_deref().unwrap_or("");
        match (&req.operation, sub) {
            // A new node cannot have a ready agent. A pure mutation of the
            // object under review, so a dry-run gets it too.
            (Operation::Create, "") => {
                let mut d = self.taint(node, Reason::Create, "create");
                if !req.dry_run
                    && let (Some(name), Some(boot)) = (node.name(), node.boot_id())
                {
                    d.reregistration = Some(Reregistration {
                        node: name.to_owned(),
                        boot_id: boot.to_owned(),
                    });
                }
                d
            }
            (Operation::Update, "") => {
                // The kubelet's own update: NodeRestriction refuses a kubelet
                // update that changes taints, and it runs again after a
                // mutation, so patching it would fail the kubelet's write.
                if is_node_itself(req.user_info.username.as_deref(), node.name()) {
                    return allow("update by the node itself");
                }
                // The stored object says whether the node rebooted since its
                // agent was last ready: the update carries the taints back.
                let old_boot = req.old_object.as_ref().and_then(NodeView::boot_id);
                if !rebooted_since_ready(node.ready_boot_id(), old_boot) {
                    return allow("update: no reboot since ready");
                }
                self.taint(node, Reason::Reboot, "update after reboot")
            }
            (Operation::Update, "status") => {
                // A status write keeps the stored spec, so a patch of its
                // taints would be dropped: fix the main resource in the
                // background instead.
                let old = req.old_object.as_ref();
                let old_boot = old.and_then(NodeView::boot_id);
                let new_boot = node.boot_id();
                let rebooted = boot_id_changed(old_boot, new_boot)
                    || rebooted_since_ready(node.ready_boot_id(), new_boot);
                if !rebooted {
                    return allow("status: no reboot");
                }
                // The stored spec is what a status write keeps.
                let stored = old.filter(|o| o.has_spec()).unwrap_or(node);
                if stored.missing(&self.taints).is_empty() {
                    return allow("status: rebooted, taints present");
                }
                if req.dry_run {
                    return allow("status: rebooted, dry-run");
                }
                let mut d = allow("status: rebooted, background patch");
                d.reboot_job = node.name().map(|name| RebootJob {
                    node: name.to_owned(),
                    previous_boot: (old_boot != new_boot)
                        .then(|| old_boot.unwrap_or("").to_owned()),
                });
                d
            }
            _ => allow("operation not handled"),
        }
    }

    /// Adds the configured taints `node` lacks. Taints already there are
    /// left alone, so a second call on the patched object (the API server
    /// may reinvoke webhooks) adds nothing.
    fn taint(&self, node: &NodeView, reason: Reason, why: &'static str) -> Decision {
        let missing = node.missing(&self.taints);
        if missing.is_empty() {
            return Decision::allow("taints already present");
        }
        let patch = add_taints(node, &missing, Guard::None);
        Decision {
            added: Some(Added {
                reason,
                taints: missing.into_iter().cloned().collect(),
                patch,
            }),
            reboot_job: None,
            reregistration: None,
            why,
        }
    }

    /// A kubelet re-registering (its create of an existing Node): the taints
    /// the stored node needs back. The create's boot ID shows a reboot when
    /// the agent recorded another boot as ready, or the stored node runs
    /// another boot; the same boot (a kubelet restart) changes nothing, and an
    /// excluded node stays excluded.
    pub fn reregistration_taints_needed<'a>(
        &'a self,
        stored: &NodeView,
        create_boot: &str,
    ) -> Vec<&'a TaintSpec> {
        if stored.is_excluded() || create_boot.is_empty() {
            return Vec::new();
        }
        let rebooted = rebooted_since_ready(stored.ready_boot_id(), Some(create_boot))
            || boot_id_changed(stored.boot_id(), Some(create_boot));
        if !rebooted || stored.ready_boot_id() == Some(create_boot) {
            return Vec::new();
        }
        stored.missing(&self.taints)
    }

    /// The background re-check after a status write showed a reboot, on a
    /// freshly read node: taints to add, or none when the node is excluded or
    /// its agent already recorded the current boot as ready.
    pub fn reboot_taints_needed<'a>(&'a self, node: &NodeView) -> Vec<&'a TaintSpec> {
        if node.is_excluded() {
            return Vec::new();
        }
        match (node.ready_boot_id(), node.boot_id()) {
            (Some(ready), Some(now)) if ready == now => Vec::new(),
            (_, None) => Vec::new(),
            _ => node.missing(&self.taints),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use kube::core::admission::AdmissionReview;

    use super::*;
    use crate::fixtures::{
        self, CILIUM, KUBELET, NOT_READY, kubelet_node, node_with_not_ready, review,
        with_annotation, with_taints,
    };
    use nodegate_shared::keys::{DEFAULT_TAINT, EXCLUDE_LABEL, READY_BOOT_ID_ANNOTATION as ANN};

    /// (name, user, new object, old object, expected taint keys or None).
    type UpdateCase<'a> = (&'a str, &'a str, Value, Value, Option<Vec<&'a str>>);

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
                )
            })
            .collect();
        for (name, user, new, old, want) in cases {
            let rv = review("u-2", "UPDATE", None, user, new, Some(old), false);
            let a = answer(&r, &rv);
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
            let review =
                fixtures::review("u", "CREATE", None, KUBELET, node.clone(), None, dry_run);
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
}
