//! The admission decision: which requests get which taints (issue 2, rules 1–6).
//!
//! Pure and synchronous: no I/O, so it is table-tested directly and runs on
//! the runtime threads without blocking them.

use std::borrow::Cow;

use kube::core::admission::Operation;
use nodegate_shared::keys::NODE_USER_PREFIX;
use nodegate_shared::node::{boot_id_changed, rebooted_since_ready};
use nodegate_shared::taint::check_unique;
use nodegate_shared::{NodeView, TaintError, TaintSpec};

use crate::patcher::RebootJob;
use crate::patches::{Patches, Prepared, Shape};
use crate::wire::{Node, Request};

/// Why taints were added; also the `reason` label of the taints metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A Node create (rule 1).
    Create,
    /// A write after the node rebooted since its agent was last ready (rules 2, 3).
    Reboot,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Create => "create",
            Reason::Reboot => "reboot",
        }
    }
}

/// The outcome of one review. The answer is always allowed; see
/// [`crate::wire::encode_response`].
#[derive(Debug)]
pub struct Decision<'r> {
    /// The patch and warnings when taints are added (usually borrowed from
    /// the answers prepared in [`Rules::new`]).
    pub patch: Option<Cow<'r, Prepared>>,
    /// Taints added by the patch and why.
    pub added: Option<(Reason, usize)>,
    /// A status write after a reboot: this node needs a background patch of
    /// its main resource (rule 3). `None` on dry-run.
    pub reboot_patch: Option<RebootJob>,
    /// A Node create (not dry-run): if the name already exists this is a
    /// kubelet re-registering, and the stored node may need its taints back
    /// before the create is answered (the kubelet's status write follows the
    /// answer).
    pub reregistration: Option<Reregistration>,
    /// One short phrase for the log line.
    pub why: &'static str,
}

impl Decision<'_> {
    fn allow(why: &'static str) -> Self {
        Decision {
            patch: None,
            added: None,
            reboot_patch: None,
            reregistration: None,
            why,
        }
    }
}

/// A kubelet's create of a Node that may already exist: its name and the boot
/// ID the create carries (`initialNode` fills the status before the create).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reregistration {
    pub node: String,
    pub boot_id: String,
}

/// The configured taints with everything per-request work can reuse.
#[derive(Debug, Clone)]
pub struct Rules {
    taints: Vec<TaintSpec>,
    /// Patches, warnings and answers, serialized once.
    patches: Patches,
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
        let patches = Patches::new(&taints);
        Ok(Self { taints, patches })
    }

    pub fn taints(&self) -> &[TaintSpec] {
        &self.taints
    }

    /// Decides one admission request. Never denies: nodegate only adds taints.
    pub fn review(&self, req: &Request<'_>) -> Decision<'_> {
        let allow = Decision::allow;
        // Rule 4: other kinds are not ours.
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
            // Rule 1: a pure mutation, so dry-run gets it too.
            (Operation::Create, "") => {
                let mut d = self.patch(node, Reason::Create, "create");
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
                // Rule 2: NodeRestriction refuses a kubelet update that changes
                // taints, and it runs again after a mutation.
                if is_node_itself(req.user_info.username.as_deref(), node.name()) {
                    return allow("update by the node itself");
                }
                let old_boot = req.old_object.as_ref().and_then(Node::boot_id);
                if !rebooted_since_ready(node.ready_boot_id(), old_boot) {
                    return allow("update: no reboot since ready");
                }
                self.patch(node, Reason::Reboot, "update after reboot")
            }
            (Operation::Update, "status") => {
                // Rule 3: spec changes are dropped on a status write, so never
                // patch here; fix the main resource in the background instead.
                let old = req.old_object.as_ref();
                let old_boot = old.and_then(Node::boot_id);
                let new_boot = node.boot_id();
                let rebooted = boot_id_changed(old_boot, new_boot)
                    || rebooted_since_ready(node.ready_boot_id(), new_boot);
                if !rebooted {
                    return allow("status: no reboot");
                }
                // The stored spec is what a status write keeps.
                let stored = old.filter(|o| o.has_spec()).unwrap_or(node);
                if self.taints.iter().all(|t| stored.has_taint(t)) {
                    return allow("status: rebooted, taints present");
                }
                if req.dry_run {
                    return allow("status: rebooted, dry-run");
                }
                let mut d = allow("status: rebooted, background patch");
                d.reboot_patch = node.name().map(|name| RebootJob {
                    node: name.to_owned(),
                    previous_boot: (old_boot != new_boot)
                        .then(|| old_boot.unwrap_or("").to_owned()),
                });
                d
            }
            _ => allow("operation not handled"),
        }
    }

    fn patch(&self, node: &Node<'_>, reason: Reason, why: &'static str) -> Decision<'_> {
        let missing = |i: usize| !node.has_taint(&self.taints[i]);
        if !(0..self.taints.len()).any(missing) {
            return Decision::allow("taints already present");
        }
        let patch = self.patches.get(reason, Shape::of(node), missing);
        Decision {
            added: Some((reason, patch.added())),
            patch: Some(patch),
            reboot_patch: None,
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

    /// The background re-check (rule 3) on a freshly read node: taints to add,
    /// or none when the node is excluded or its agent already recorded the
    /// current boot as ready.
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
    use base64::Engine;
    use serde_json::{Value, json};

    use kube::core::admission::AdmissionReview;
    use nodegate_shared::patch::{Guard, add_taints};

    use super::*;
    use crate::fixtures::{
        self, CILIUM, KUBELET, NOT_READY, kubelet_node, node_with_not_ready, review,
        with_annotation, with_taints,
    };
    use crate::slim::SlimNode;
    use crate::wire;
    use nodegate_shared::keys::{DEFAULT_TAINT, EXCLUDE_LABEL, READY_BOOT_ID_ANNOTATION as ANN};

    /// (name, user, new object, old object, expected taint keys or None).
    type UpdateCase<'a> = (&'a str, &'a str, Value, Value, Option<Vec<&'a str>>);

    fn rules() -> Rules {
        Rules::new(vec![DEFAULT_TAINT.parse().unwrap()]).unwrap()
    }

    /// What the API server would see: the wire answer, and the object after
    /// applying the (base64) patch with json-patch.
    struct Answer {
        wire: Value,
        added: Option<(Reason, usize)>,
        reboot_patch: Option<RebootJob>,
        patched: Option<Value>,
    }

    /// The decision as nodegate made it with kube's decoder: the request as
    /// `AdmissionReview<SlimNode>` (the contract), the node as the shared
    /// `NodeView`, the patch from the shared `add_taints`. Returns the patch
    /// bytes, warnings, added taints and background patch.
    type Reference = (
        Option<Vec<u8>>,
        Option<Vec<String>>,
        Option<(Reason, usize)>,
        Option<RebootJob>,
    );

    fn reference(rules: &Rules, body: &[u8]) -> Reference {
        let review: AdmissionReview<SlimNode> = serde_json::from_slice(body).unwrap();
        let req = review.request.unwrap();
        let none = (None, None, None, None);
        if !req.kind.group.is_empty() || req.kind.version != "v1" || req.kind.kind != "Node" {
            return none;
        }
        let Some(node) = req.object.as_ref().map(|o| &o.view) else {
            return none;
        };
        if node.is_excluded() {
            return none;
        }
        let patch = |reason: Reason| {
            let missing = node.missing(rules.taints());
            if missing.is_empty() {
                return (None, None, None, None);
            }
            let why = match reason {
                Reason::Create => "new node, its network agent is not ready yet",
                Reason::Reboot => "node rebooted since its network agent was last ready",
            };
            let warnings = missing
                .iter()
                .map(|t| format!("nodegate: added taint {t}: {why}"))
                .collect();
            let bytes = serde_json::to_vec(&add_taints(node, &missing, Guard::None)).unwrap();
            (
                Some(bytes),
                Some(warnings),
                Some((reason, missing.len())),
                None,
            )
        };
        match (&req.operation, req.sub_resource.as_deref().unwrap_or("")) {
            (Operation::Create, "") => patch(Reason::Create),
            (Operation::Update, "") => {
                if is_node_itself(req.user_info.username.as_deref(), node.name()) {
                    return none;
                }
                let old_boot = req.old_object.as_ref().and_then(|o| o.view.boot_id());
                if !rebooted_since_ready(node.ready_boot_id(), old_boot) {
                    return none;
                }
                patch(Reason::Reboot)
            }
            (Operation::Update, "status") => {
                let old = req.old_object.as_ref().map(|o| &o.view);
                let new_boot = node.boot_id();
                let rebooted = boot_id_changed(old.and_then(NodeView::boot_id), new_boot)
                    || rebooted_since_ready(node.ready_boot_id(), new_boot);
                let stored = old.filter(|o| o.has_spec()).unwrap_or(node);
                if rebooted && !stored.missing(rules.taints()).is_empty() && !req.dry_run {
                    let old_boot = old.and_then(NodeView::boot_id);
                    let job = node.name().map(|name| RebootJob {
                        node: name.to_owned(),
                        previous_boot: (old_boot != new_boot)
                            .then(|| old_boot.unwrap_or("").to_owned()),
                    });
                    return (None, None, None, job);
                }
                none
            }
            _ => none,
        }
    }

    fn answer(rules: &Rules, review: &Value) -> Answer {
        let body = serde_json::to_vec(review).unwrap();
        let req = wire::decode_request(&body).unwrap();
        let decision = rules.review(&req);
        let bytes = wire::encode_response(&req.uid, decision.patch.as_deref());
        let wire: Value = serde_json::from_slice(&bytes).unwrap();
        // Same decision as with kube's decoder and the shared patch builder.
        let (patch, warnings, added, reboot_patch) = reference(rules, &body);
        assert_eq!(decision.patch.as_ref().map(|p| p.patch().to_vec()), patch);
        assert_eq!(
            wire["response"]
                .get("warnings")
                .map(|w| serde_json::from_value::<Vec<String>>(w.clone()).unwrap()),
            warnings
        );
        assert_eq!(decision.added, added);
        assert_eq!(decision.reboot_patch, reboot_patch);
        assert_eq!(wire["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(wire["kind"], "AdmissionReview");
        assert_eq!(wire["response"]["uid"], review["request"]["uid"]);
        assert_eq!(wire["response"]["allowed"], true);
        let patched = wire["response"].get("patch").map(|p| {
            assert_eq!(wire["response"]["patchType"], "JSONPatch");
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(p.as_str().expect("patch is a base64 string"))
                .unwrap();
            let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
            let mut obj = review["request"]["object"].clone();
            json_patch::patch(&mut obj, &patch).expect("patch applies to the object");
            obj
        });
        if patched.is_none() {
            assert!(wire["response"].get("patchType").is_none());
            assert!(wire["response"].get("warnings").is_none());
        }
        Answer {
            wire,
            added: decision.added,
            reboot_patch: decision.reboot_patch,
            patched,
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

    /// Rule 5: the API server may call again with the mutated object.
    fn assert_idempotent(rules: &Rules, review_json: &Value, patched: &Value) {
        let mut again = review_json.clone();
        again["request"]["object"] = patched.clone();
        let a = answer(rules, &again);
        assert!(a.patched.is_none(), "second call patched again: {}", a.wire);
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
        let cases: Vec<(&str, Value, bool, Option<Vec<&str>>)> = fixtures::create_cases()
            .into_iter()
            .map(|c| (c.name, c.object, c.dry_run, c.taints_after))
            .collect();
        for (name, obj, dry_run, want) in cases {
            let rv = review("u-1", "CREATE", None, KUBELET, obj.clone(), None, dry_run);
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
                    let warnings = a.wire["response"]["warnings"].as_array().unwrap();
                    assert_eq!(warnings.len(), 1, "{name}");
                    let w = warnings[0].as_str().unwrap();
                    assert!(
                        w.contains(DEFAULT_TAINT) && w.contains("new node"),
                        "{name}: {w}"
                    );
                    assert_eq!(a.added, Some((Reason::Create, 1)), "{name}");
                    assert_idempotent(&r, &rv, out);
                }
                _ => panic!("{name}: expected {want:?}, got {}", a.wire),
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
        assert_eq!(taint_keys(&out), ["a", CILIUM, "b", "example.com/gate"]);
        let warnings = a.wire["response"]["warnings"].as_array().unwrap();
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0]
                .as_str()
                .unwrap()
                .contains("example.com/gate:NoExecute")
        );
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
                        out["spec"]["taints"][0]["timeAdded"],
                        "2025-01-01T00:01:00Z"
                    );
                    let w = a.wire["response"]["warnings"][0].as_str().unwrap();
                    assert!(w.contains("rebooted"), "{name}: {w}");
                    assert_eq!(a.added, Some((Reason::Reboot, 1)));
                    assert_idempotent(&r, &rv, out);
                }
                _ => panic!("{name}: expected {want:?}, got {}", a.wire),
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
                "{name}: status write patched: {}",
                a.wire
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
            assert!(a.patched.is_none(), "{}", a.wire);
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
            let body = serde_json::to_vec(&review).unwrap();
            let req = wire::decode_request(&body).unwrap();
            let d = r.review(&req);
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
