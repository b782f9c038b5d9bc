//! `nodegate-webhook confinement`: the ValidatingAdmissionPolicies that
//! confine nodegate's own credentials to what their workloads do, generated
//! from the same `--taint` configuration as the webhook.
//!
//! - **Agent** (a token on every node): with a token bound to a pod on node
//!   N (`authentication.kubernetes.io/node-name` with the pod's `pod-name`
//!   and `pod-uid`, Kubernetes ≥ 1.32), it may UPDATE Node N only, changing
//!   nothing but the configured taints (by key and effect) and the
//!   `nodegate.dev/ready-boot-id` annotation. Without both claims (a token
//!   bound to the Node itself, or to nothing) it may change nothing.
//! - **Webhook** (the background re-taint): it may only add configured taints
//!   to a Node; nothing removed, nothing else changed; and only with a token
//!   bound to a Pod of its StatefulSet (`pod-name` `nodegate-webhook-<n>`
//!   with its `pod-uid`). Impersonating the ServiceAccount (which `edit` in
//!   the namespace may) or a token Secret of it carries no pod claim.
//! - **Stand-ins**: both may also add (and the agent remove) every other
//!   shipped `NoSchedule` gate, exact (`nodegate_shared::taint::stand_ins`):
//!   while a switch of key profile rolls out, old agents re-gate at shutdown
//!   and old webhook replicas gate with the old key under the new policy.
//!   A stolen token gains nothing by it: each is a NoSchedule gate like the
//!   configured one, on the node(s) the token could already gate.
//! - **Release**: the agent may also remove, never add, each taint it
//!   releases, matched exactly (key, value and effect): its
//!   `--release-taint`s and every other gate nodegate ships
//!   (`nodegate_shared::taint::release_set`, the agent's own set), so a
//!   switch of key profile or strict mode turned off leaves no stale gate.
//! - **Gates owned elsewhere** (`--owned-taint`): the webhook may add them
//!   (by key and effect), an evicting (`NoExecute`) one only to a node
//!   whose stored boot is not the one its agent recorded as ready, as for
//!   the boot gate. The agent may neither add nor remove them: their owner
//!   does, and none is ever a stand-in or released.
//! - **Strict mode** (`--boot-taint`): the agent may remove the boot gate but
//!   add it only while the node runs another boot than the one its
//!   `nodegate.dev/ready-boot-id` records, and may set that annotation only
//!   to the node's current bootID, never remove it. A stolen agent token can
//!   then not evict its node's workloads on the boot it is on.
//!
//! - **Field ownership**: neither may rewrite `metadata.managedFields`
//!   beyond what the API server's field manager records for its own write
//!   (`ownership.rs`), or a forged entry would let another
//!   manager's next server-side apply delete taints and labels.
//!
//! Each policy is scoped by a matchCondition on the requesting user (the
//! ServiceAccount's name in any namespace, so an install under kustomize's
//! `namespace:` stays confined), so no one else's write is ever evaluated,
//! and `failurePolicy: Fail` can only ever stop the confined workload. The
//! expressions read optional fields behind `has()` (empty fields are absent)
//! and compare whole maps, so a field added to Nodes later is covered
//! without a change here.

mod ownership;

use nodegate_shared::keys::READY_BOOT_ID_ANNOTATION;
use nodegate_shared::taint::release_set;
use nodegate_shared::{Effect, TaintSpec};

use self::ownership::{Touched, ownership_rule, ownership_variables};
use crate::render::cel::string as q;

/// The agent's and webhook's ServiceAccounts. The policies match them in
/// every namespace: the namespace is the installer's choice, and confining
/// a same-named account elsewhere only takes rights away.
pub const AGENT_SA: &str = "nodegate-agent";
pub const WEBHOOK_SA: &str = "nodegate-webhook";
/// The webhook's StatefulSet: its Pods are `<name>-<ordinal>`.
pub const WEBHOOK_STATEFULSET: &str = "nodegate-webhook";
/// The user extras of a ServiceAccount token bound to a pod on a node
/// (k8s.io/apiserver `pkg/authentication/serviceaccount/util.go`). A token
/// bound to a Node carries the node's name but no pod.
pub const NODE_CLAIM: &str = "authentication.kubernetes.io/node-name";
pub const POD_NAME_CLAIM: &str = "authentication.kubernetes.io/pod-name";
pub const POD_UID_CLAIM: &str = "authentication.kubernetes.io/pod-uid";
/// Names of the shipped policies (and their bindings).
pub const AGENT_POLICY: &str = "nodegate-agent-confinement";
pub const WEBHOOK_POLICY: &str = "nodegate-webhook-confinement";

/// `object`'s taints, `[]` when it has none.
const NEW_TAINTS: &str = "(has(object.spec) && has(object.spec.taints) ? object.spec.taints : [])";
/// The node's boot, `''` when none: a main-resource write keeps the stored
/// status, so `oldObject`'s is the one the node runs.
const STORED_BOOT_ID: &str = "(has(oldObject.status) && has(oldObject.status.nodeInfo) \
                   && has(oldObject.status.nodeInfo.bootID) ? oldObject.status.nodeInfo.bootID : '')";
/// `oldObject`'s taints, `[]` when it has none.
const OLD_TAINTS: &str =
    "(has(oldObject.spec) && has(oldObject.spec.taints) ? oldObject.spec.taints : [])";

/// CEL: one of `clause(spec)` holds, `false` for no spec.
fn any_of(specs: &[TaintSpec], clause: impl Fn(&TaintSpec) -> String) -> String {
    if specs.is_empty() {
        return "false".into();
    }
    let alternatives: Vec<String> = specs.iter().map(clause).collect();
    format!("({})", alternatives.join(" || "))
}

/// CEL: `t` is one of the configured taints (same key and effect).
fn managed(taints: &[TaintSpec], t: &str) -> String {
    any_of(taints, |s| {
        format!(
            "({t}.key == {} && {t}.effect == {})",
            q(s.key()),
            q(s.effect().as_str())
        )
    })
}

/// CEL: `t` is one of the released taints, exactly (key, value, effect):
/// the agent may remove it, never add it.
fn released(release: &[TaintSpec], t: &str) -> String {
    any_of(release, |s| {
        format!(
            "({t}.key == {} && (has({t}.value) ? {t}.value : '') == {} && {t}.effect == {})",
            q(s.key()),
            q(s.value().unwrap_or("")),
            q(s.effect().as_str())
        )
    })
}

/// `key:Effect, …` for messages.
fn shown(taints: &[TaintSpec]) -> String {
    let names: Vec<String> = taints
        .iter()
        .map(|t| format!("{}:{}", t.key(), t.effect().as_str()))
        .collect();
    names.join(", ")
}

/// `key=value:Effect, …` for messages about exact matches.
fn shown_exact(taints: &[TaintSpec]) -> String {
    let names: Vec<String> = taints.iter().map(ToString::to_string).collect();
    names.join(", ")
}

/// CEL: a field of `object`/`oldObject` that may be absent, as a value
/// (`{}`/`[]` when absent).
fn or_empty(parent: &str, field: &str, empty: &str) -> String {
    format!("(has({parent}.{field}) ? {parent}.{field} : {empty})")
}

/// CEL: the request's user is the ServiceAccount `sa` of any namespace
/// (`system:serviceaccount:<namespace>:<sa>`; namespaces hold no `:`).
pub fn is_service_account(sa: &str) -> String {
    format!(
        "has(request.userInfo.username) && request.userInfo.username.startsWith('system:serviceaccount:')\n        && request.userInfo.username.endsWith({})",
        q(&format!(":{sa}"))
    )
}

/// The start of a policy that matches only ServiceAccount `sa`'s Node writes.
fn policy_head(name: &str, app: &str, sa: &str) -> String {
    format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {name}
  labels:
    app.kubernetes.io/name: {app}
    app.kubernetes.io/part-of: nodegate
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["*"]
        operations: ["CREATE", "UPDATE", "DELETE"]
        resources: ["nodes", "nodes/status"]
  matchConditions:
    - name: {app}
      expression: >-
        {user}
"#,
        user = is_service_account(sa)
    )
}

fn binding(name: &str) -> String {
    format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {name}
  labels:
    app.kubernetes.io/name: nodegate
    app.kubernetes.io/part-of: nodegate
spec:
  policyName: {name}
  validationActions: [Deny]
"#
    )
}

/// CEL: the write adds one of the boot taints `boot` (by key and effect),
/// the one change both strict-mode rules hold to the node's boot.
fn adds_boot_gate(boot: &[TaintSpec]) -> String {
    let is_boot = managed(boot, "t");
    format!(
        "{NEW_TAINTS}.exists(t, {is_boot} && !{OLD_TAINTS}.exists(o, o.key == t.key && o.effect == t.effect))"
    )
}

/// The agent's strict-mode validations: the boot gate `boot` is added only
/// on a boot the node has not recorded as ready, and the recorded bootID
/// only ever moves to the current one. Empty without boot taints, so the
/// default install's policy is unchanged.
fn boot_gate_rules(boot: &[TaintSpec]) -> String {
    if boot.is_empty() {
        return String::new();
    }
    let ready = q(READY_BOOT_ID_ANNOTATION);
    let new_ann = or_empty("object.metadata", "annotations", "{}");
    let old_ann = or_empty("oldObject.metadata", "annotations", "{}");
    let boot_id = STORED_BOOT_ID;
    let adds_gate = adds_boot_gate(boot);
    let gate = shown(boot);
    format!(
        r#"    - expression: >-
        request.operation != 'UPDATE'
        || !{adds_gate}
        || ({ready} in {old_ann} && {old_ann}[{ready}] != {boot_id})
      messageExpression: >-
        variables.who + " may add the boot gate {gate} to node '" + request.name
        + "' only on a boot other than the one it recorded as ready ({READY_BOOT_ID_ANNOTATION})"
      reason: Forbidden
    - expression: >-
        request.operation != 'UPDATE'
        || (!({ready} in {old_ann}) || {ready} in {new_ann})
           && (!({ready} in {new_ann}) || ({ready} in {old_ann} && {old_ann}[{ready}] == {new_ann}[{ready}])
               || {new_ann}[{ready}] == {boot_id})
      messageExpression: >-
        variables.who + " may set the annotation {READY_BOOT_ID_ANNOTATION} of node '" + request.name
        + "' only to the node's current bootID, and not remove it"
      reason: Forbidden
"#
    )
}

/// The webhook's rule for the evicting (`NoExecute`) gates owned elsewhere:
/// like the boot gate, added only to a node whose stored boot is not the one
/// its agent recorded as ready. The webhook adds them only with a stored new
/// boot (the background patch of the status write that moved the bootID),
/// never on a re-registration's claim, so a stolen webhook token cannot
/// evict a node's pods on the boot they run on. Empty without such gates.
fn webhook_owned_eviction_rule(owned: &[TaintSpec]) -> String {
    let evicting: Vec<TaintSpec> = owned
        .iter()
        .filter(|t| t.effect() == Effect::NoExecute)
        .cloned()
        .collect();
    if evicting.is_empty() {
        return String::new();
    }
    let ready = q(READY_BOOT_ID_ANNOTATION);
    let old_ann = or_empty("oldObject.metadata", "annotations", "{}");
    let boot_id = STORED_BOOT_ID;
    let adds_gate = adds_boot_gate(&evicting);
    let gate = shown(&evicting);
    format!(
        r#"    - expression: >-
        request.operation != 'UPDATE'
        || !{adds_gate}
        || !({ready} in {old_ann}) || {old_ann}[{ready}] != {boot_id}
      messageExpression: >-
        "nodegate-webhook may add the evicting gate {gate} (owned elsewhere) to node '" + request.name
        + "' only on a boot other than the one its agent recorded as ready ({READY_BOOT_ID_ANNOTATION})"
      reason: Forbidden
"#
    )
}

/// The webhook's strict-mode validation: it adds the boot gate only to a
/// node whose stored boot is not the one its agent recorded as ready (or
/// that never recorded one). The webhook adds it only after a stored new
/// boot, never on a re-registration's claim, so a stolen webhook token cannot
/// evict a node's pods on the boot they run on. Empty without boot taints.
fn webhook_boot_gate_rule(boot: &[TaintSpec]) -> String {
    if boot.is_empty() {
        return String::new();
    }
    let ready = q(READY_BOOT_ID_ANNOTATION);
    let old_ann = or_empty("oldObject.metadata", "annotations", "{}");
    let boot_id = STORED_BOOT_ID;
    let adds_gate = adds_boot_gate(boot);
    let gate = shown(boot);
    format!(
        r#"    - expression: >-
        request.operation != 'UPDATE'
        || !{adds_gate}
        || !({ready} in {old_ann}) || {old_ann}[{ready}] != {boot_id}
      messageExpression: >-
        "nodegate-webhook may add the boot gate {gate} to node '" + request.name
        + "' only on a boot other than the one its agent recorded as ready ({READY_BOOT_ID_ANNOTATION})"
      reason: Forbidden
"#
    )
}

/// The CEL both policies read about the configured taints.
struct GateTerms {
    /// `t` is a configured taint (same key and effect).
    is_managed: String,
    /// The configured taints, for messages.
    managed_list: String,
    /// The `taintsChanged` variable.
    taints_changed: String,
    /// The spec is unchanged but for its taints (keys added or removed too).
    spec_kept: String,
    /// `t` is a shipped gate that stands in for a configured one (exact),
    /// which either may add while a switch of key profile rolls out.
    is_stand_in: String,
    /// Those, for messages (empty when there are none).
    stand_in_list: String,
    /// `t` is a gate owned elsewhere (same key and effect), which only the
    /// webhook may add; `None` without any.
    is_owned: Option<String>,
    /// Those, for messages (empty when there are none).
    owned_list: String,
}

/// `s` has the key and effect of one of `taints`.
fn among(taints: &[TaintSpec], s: &TaintSpec) -> bool {
    taints
        .iter()
        .any(|t| t.key() == s.key() && t.effect() == s.effect())
}

impl GateTerms {
    fn new(taints: &[TaintSpec], owned: &[TaintSpec]) -> Self {
        let mut stand_ins: Vec<TaintSpec> = Vec::new();
        for s in taints.iter().flat_map(nodegate_shared::taint::stand_ins) {
            // Another component's gate never stands in for nodegate's.
            let configured = among(taints, &s) || among(owned, &s);
            if !configured && !stand_ins.contains(&s) {
                stand_ins.push(s);
            }
        }
        let (new_spec, old_spec) = (
            or_empty("object", "spec", "{}"),
            or_empty("oldObject", "spec", "{}"),
        );
        GateTerms {
            is_managed: managed(taints, "t"),
            managed_list: shown(taints),
            is_owned: (!owned.is_empty()).then(|| managed(owned, "t")),
            owned_list: shown(owned),
            is_stand_in: released(&stand_ins, "t"),
            stand_in_list: shown_exact(&stand_ins),
            taints_changed: format!(
                "    - name: taintsChanged\n      expression: >-\n        request.operation == 'UPDATE' && {NEW_TAINTS} != {OLD_TAINTS}\n"
            ),
            spec_kept: format!(
                "({new_spec}.all(k, k == 'taints' || (k in {old_spec} && {old_spec}[k] == object.spec[k])) \
                 && {old_spec}.all(k, k == 'taints' || k in {new_spec}))"
            ),
        }
    }
}

/// The FieldsV1 path of `spec.taints`.
fn taint_path() -> Vec<String> {
    vec!["f:spec".to_string(), "f:taints".to_string()]
}

/// Both policies and their bindings as one YAML stream: `taints` are the
/// ordinary taints, `boot` strict mode's boot gate (empty when off),
/// `release` the agent's `--release-taint`s. The agent may remove, never
/// add, those and every other gate nodegate ships (matched exactly): the
/// set `release_set` gives the agent too, computed here rather than passed
/// in, so a policy generated for a configuration always allows exactly what
/// that configuration's agent releases.
pub fn render(ordinary: &[TaintSpec], boot: &[TaintSpec], release: &[TaintSpec]) -> String {
    render_owned(ordinary, boot, &[], release)
}

/// [`render`] for a webhook that also adds gates owned elsewhere (`owned`,
/// its `--owned-taint`s): the webhook's token may add them, the agent's may
/// neither add nor remove them (none is released, whatever `release` says).
pub fn render_owned(
    ordinary: &[TaintSpec],
    boot: &[TaintSpec],
    owned: &[TaintSpec],
    release: &[TaintSpec],
) -> String {
    let mut flags = super::taint_flags(ordinary, owned, boot);
    for r in release {
        flags.push_str(&format!(" --release-taint={r}"));
    }
    let taints: Vec<TaintSpec> = ordinary.iter().chain(boot).cloned().collect();
    let mut release = release_set(&taints, release);
    release.retain(|r| !among(owned, r));
    let gate = GateTerms::new(&taints, owned);
    format!(
        r#"# Generated by `nodegate-webhook confinement {flags}`; do not edit:
# regenerate with the webhook's --taint and --boot-taint flags and the agent's
# --release-taint flags (a test compares this file with the output). The agent
# releases every other gate nodegate ships without a flag, and may remove them.
#
# Least privilege for the credentials nodegate puts on every node and in the
# webhook. RBAC cannot limit a DaemonSet's token to its own Node, so these
# policies do: each matches only its own ServiceAccount (matchConditions; by
# name, in any namespace, so kustomize's namespace: keeps them in force), so
# nobody else's write is evaluated and failurePolicy Fail can only stop that
# workload. Neither may rewrite metadata.managedFields beyond what the API
# server records for its write. Needs Kubernetes >= 1.32 for the node claim
# of pod-bound tokens; on older clusters the agent's writes are all refused
# (see the README).
{agent}---
{agent_binding}---
{webhook}---
{webhook_binding}"#,
        agent = agent_policy(&gate, boot, &release),
        agent_binding = binding(AGENT_POLICY),
        webhook = webhook_policy(&gate, boot, owned),
        webhook_binding = binding(WEBHOOK_POLICY),
    )
}

/// The agent's policy: its own Node only, with a pod-bound token, and only
/// the configured taints and the ready annotation.
fn agent_policy(gate: &GateTerms, boot: &[TaintSpec], release: &[TaintSpec]) -> String {
    format!(
        "{head}  variables:\n{variables}  validations:\n{validations}",
        head = policy_head(AGENT_POLICY, "nodegate-agent", AGENT_SA),
        variables = agent_variables(gate),
        validations = agent_validations(gate, boot, release),
    )
}

/// The agent's variables: who it is (the claims of its token), what its
/// write changed, and the field ownership before and after.
fn agent_variables(gate: &GateTerms) -> String {
    let ready = q(READY_BOOT_ID_ANNOTATION);
    let claim = q(NODE_CLAIM);
    let new_ann = or_empty("object.metadata", "annotations", "{}");
    let old_ann = or_empty("oldObject.metadata", "annotations", "{}");
    let changed = format!(
        "{taints_changed}    - name: readyChanged\n      expression: >-\n        request.operation == 'UPDATE'\n        && ({ready} in {new_ann} ? !({ready} in {old_ann}) || {old_ann}[{ready}] != object.metadata.annotations[{ready}]\n           : {ready} in {old_ann})\n    # The annotations map itself appeared or went away.\n    - name: annotationsChanged\n      expression: >-\n        request.operation == 'UPDATE'\n        && has(object.metadata.annotations) != has(oldObject.metadata.annotations)\n",
        taints_changed = gate.taints_changed,
    );
    let touched = [
        Touched {
            path: taint_path(),
            changed: "taintsChanged",
        },
        Touched {
            path: vec![
                "f:metadata".into(),
                "f:annotations".into(),
                format!("f:{READY_BOOT_ID_ANNOTATION}"),
            ],
            changed: "readyChanged",
        },
        Touched {
            path: vec!["f:metadata".into(), "f:annotations".into(), ".".into()],
            changed: "annotationsChanged",
        },
    ];
    format!(
        r#"    # The node in the token ('' without a node claim).
    - name: nodeClaim
      expression: >-
        has(request.userInfo.extra) && {claim} in request.userInfo.extra
        && size(request.userInfo.extra[{claim}]) == 1
        ? request.userInfo.extra[{claim}][0] : ''
    # The node of the pod the token is bound to: a token bound to the Node
    # itself (or to nothing) carries no pod and gets ''.
    - name: claim
      expression: >-
        variables.nodeClaim != ''
        && {pod_name} in request.userInfo.extra && size(request.userInfo.extra[{pod_name}]) == 1
        && {pod_uid} in request.userInfo.extra && size(request.userInfo.extra[{pod_uid}]) == 1
        ? variables.nodeClaim : ''
    - name: who
      expression: >-
        variables.claim != '' ? "nodegate-agent of node '" + variables.claim + "'"
        : variables.nodeClaim != '' ? "nodegate-agent (token of node '" + variables.nodeClaim + "' without a pod claim)"
        : 'nodegate-agent (token without a node claim)'
{changed}{ownership}"#,
        ownership = ownership_variables(&touched),
        pod_name = q(POD_NAME_CLAIM),
        pod_uid = q(POD_UID_CLAIM),
    )
}

/// The agent's validations: the token's node, an UPDATE of the main
/// resource, and nothing changed but the configured (and released) taints
/// and the ready annotation.
fn agent_validations(gate: &GateTerms, boot: &[TaintSpec], release: &[TaintSpec]) -> String {
    let GateTerms {
        is_managed,
        managed_list,
        spec_kept,
        is_stand_in,
        stand_in_list,
        ..
    } = gate;
    let (new_taints, old_taints) = (NEW_TAINTS, OLD_TAINTS);
    let is_released = released(release, "t");
    // A stand-in is one more taint the agent may change: an agent of the
    // configuration before a switch of key profile still re-gates its node
    // with its own key at shutdown.
    let is_managed = &format!("({is_managed} || {is_stand_in})");
    let boot_rules = boot_gate_rules(boot);
    let ready = q(READY_BOOT_ID_ANNOTATION);
    let new_spec = or_empty("object", "spec", "{}");
    let old_spec = or_empty("oldObject", "spec", "{}");
    let new_labels = or_empty("object.metadata", "labels", "{}");
    let old_labels = or_empty("oldObject.metadata", "labels", "{}");
    let new_ann = or_empty("object.metadata", "annotations", "{}");
    let old_ann = or_empty("oldObject.metadata", "annotations", "{}");
    // Written by the API server on every update (managedFields by its field
    // manager, checked on their own), or checked above.
    let server_meta = "['labels', 'annotations', 'managedFields', 'resourceVersion', 'generation']";
    format!(
        r#"    - expression: variables.claim != ''
      messageExpression: >-
        variables.who + ' may not write node ' + request.name
        + ': use the token of a pod on a node (authentication.kubernetes.io/pod-name and node-name)'
      reason: Forbidden
    - expression: request.operation == 'UPDATE' && !has(request.subResource)
      messageExpression: >-
        variables.who + ' may not ' + request.operation
        + (has(request.subResource) ? ' nodes/' + request.subResource : '') + ' of node ' + request.name
      reason: Forbidden
    - expression: request.name == variables.claim
      messageExpression: "variables.who + \" may not write node '\" + request.name + \"'\""
      reason: Forbidden
    - expression: >-
        request.operation != 'UPDATE'
        || {new_taints}.filter(t, !{is_managed})
           == {old_taints}.filter(t, !{is_managed} && !({is_released} && !{new_taints}.exists(x, x == t)))
      messageExpression: >-
        variables.who + " may change only the taints {managed_list}{stand_in_note}{release_note} of node '" + request.name
        + "', not spec.taints " + ({old_taints}.filter(t, !{is_managed} && !{is_released} && !{new_taints}.exists(x, x == t))
          + {new_taints}.filter(t, !{is_managed} && !{old_taints}.exists(x, x == t)))
          .map(t, string(t.key) + ':' + string(t.effect)).join(', ')
      reason: Forbidden
    - expression: >-
        request.operation != 'UPDATE'
        || {spec_kept}
      messageExpression: >-
        variables.who + " may not change spec." + ({new_spec}.filter(k, k != 'taints'
          && !(k in {old_spec} && {old_spec}[k] == object.spec[k]))
          + {old_spec}.filter(k, k != 'taints' && !(k in {new_spec}))).join(', spec.')
        + " of node '" + request.name + "'"
      reason: Forbidden
    - expression: >-
        request.operation != 'UPDATE' || {new_labels} == {old_labels}
      messageExpression: "variables.who + \" may not change metadata.labels of node '\" + request.name + \"'\""
      reason: Forbidden
    - expression: >-
        request.operation != 'UPDATE'
        || ({new_ann}.all(k, k == {ready} || (k in {old_ann} && {old_ann}[k] == object.metadata.annotations[k]))
            && {old_ann}.all(k, k == {ready} || k in {new_ann}))
      messageExpression: >-
        variables.who + " may change only the annotation {READY_BOOT_ID_ANNOTATION} of node '"
        + request.name + "', not metadata.annotations['" + ({new_ann}.filter(k, k != {ready}
          && !(k in {old_ann} && {old_ann}[k] == object.metadata.annotations[k]))
          + {old_ann}.filter(k, k != {ready} && !(k in {new_ann}))).join("'], metadata.annotations['") + "']"
      reason: Forbidden
{boot_rules}    - expression: >-
        request.operation != 'UPDATE'
        || (object.metadata.all(k, k in {server_meta}
              || (k in oldObject.metadata && oldObject.metadata[k] == object.metadata[k]))
            && oldObject.metadata.all(k, k in {server_meta} || k in object.metadata))
      messageExpression: >-
        variables.who + " may not change metadata." + (object.metadata.filter(k, !(k in {server_meta})
          && !(k in oldObject.metadata && oldObject.metadata[k] == object.metadata[k]))
          + oldObject.metadata.filter(k, !(k in {server_meta}) && !(k in object.metadata))).join(', metadata.')
        + " of node '" + request.name + "'"
      reason: Forbidden
{ownership_rule}"#,
        ownership_rule = ownership_rule("variables.who"),
        stand_in_note = if stand_in_list.is_empty() {
            String::new()
        } else {
            format!(" (or, for a switch of key profile, {stand_in_list})")
        },
        release_note = if release.is_empty() {
            String::new()
        } else {
            format!(" (and remove {})", shown_exact(release))
        },
    )
}

/// The webhook's policy: it may only add configured taints (and gates owned
/// elsewhere) to a Node.
fn webhook_policy(gate: &GateTerms, boot: &[TaintSpec], owned: &[TaintSpec]) -> String {
    let GateTerms {
        is_managed,
        managed_list,
        taints_changed,
        spec_kept,
        is_stand_in,
        stand_in_list,
        is_owned,
        owned_list,
    } = gate;
    // Nothing of the kind without gates owned elsewhere: the shipped files stay as they were.
    let (or_owned, owned_note) = match is_owned {
        Some(o) => (
            format!(" || {o}"),
            format!(" (and the gates owned elsewhere {owned_list})"),
        ),
        None => (String::new(), String::new()),
    };
    let owned_rule = webhook_owned_eviction_rule(owned);
    let (new_taints, old_taints) = (NEW_TAINTS, OLD_TAINTS);
    let touched = [Touched {
        path: taint_path(),
        changed: "taintsChanged",
    }];
    let boot_rule = webhook_boot_gate_rule(boot);
    format!(
        r#"{head}  variables:
    # The pod the token is bound to ('' without both pod claims).
    - name: pod
      expression: >-
        has(request.userInfo.extra)
        && {pod_name} in request.userInfo.extra && size(request.userInfo.extra[{pod_name}]) == 1
        && {pod_uid} in request.userInfo.extra && size(request.userInfo.extra[{pod_uid}]) == 1
        ? request.userInfo.extra[{pod_name}][0] : ''
{taints_changed}{ownership}  validations:
    - expression: variables.pod.matches({pod_pattern})
      messageExpression: >-
        'nodegate-webhook may write nodes only with the token of a pod of its StatefulSet ({statefulset}-<ordinal>), not '
        + (variables.pod == '' ? 'a token without pod claims (impersonation, a token Secret)' : 'of pod ' + variables.pod)
        + ': node ' + request.name
      reason: Forbidden
    - expression: request.operation == 'UPDATE' && !has(request.subResource)
      messageExpression: >-
        'nodegate-webhook may only add taints to a node, not ' + request.operation
        + (has(request.subResource) ? ' nodes/' + request.subResource : '') + ' ' + request.name
      reason: Forbidden
    - expression: >-
        request.operation != 'UPDATE'
        || ({old_taints}.all(o, {new_taints}.exists(t, t == o))
            && {new_taints}.all(t, {old_taints}.exists(o, o == t) || {is_managed} || {is_stand_in}{or_owned}))
      messageExpression: >-
        "nodegate-webhook may only add the taints {managed_list}{owned_note}{stand_in_note} to node '" + request.name + "'"
      reason: Forbidden
    - expression: >-
        request.operation != 'UPDATE'
        || (object.metadata.all(k, k in ['managedFields', 'resourceVersion', 'generation']
              || (k in oldObject.metadata && oldObject.metadata[k] == object.metadata[k]))
            && oldObject.metadata.all(k, k in ['managedFields', 'resourceVersion', 'generation'] || k in object.metadata)
            && {spec_kept})
      messageExpression: >-
        "nodegate-webhook may change nothing but spec.taints of node '" + request.name + "'"
      reason: Forbidden
{boot_rule}{owned_rule}{ownership_rule}"#,
        head = policy_head(WEBHOOK_POLICY, "nodegate-webhook", WEBHOOK_SA),
        pod_name = q(POD_NAME_CLAIM),
        pod_uid = q(POD_UID_CLAIM),
        pod_pattern = q(&format!("^{WEBHOOK_STATEFULSET}-[0-9]+$")),
        statefulset = WEBHOOK_STATEFULSET,
        ownership = ownership_variables(&touched),
        ownership_rule = ownership_rule("'nodegate-webhook'"),
        stand_in_note = if stand_in_list.is_empty() {
            String::new()
        } else {
            format!(" (or, for a switch of key profile, {stand_in_list})")
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegate_shared::keys::{DEFAULT_TAINT, LEGACY_TAINT};

    const GATE: &str = "nodegate.dev/agent-not-ready=true:NoExecute";

    /// The install ships the generator's output for the default taint.
    #[test]
    fn shipped_confinement_is_the_generator_output() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../manifests/base/confinement.yaml"
        );
        let shipped = std::fs::read_to_string(path).unwrap();
        let generated = render(&[DEFAULT_TAINT.parse().unwrap()], &[], &[]);
        assert!(
            shipped == generated,
            "{path} differs from `nodegate-webhook confinement`; regenerate it:\n\
             cargo run -p nodegate-webhook -- confinement > manifests/base/confinement.yaml"
        );
        // The opt-in release of Cilium's key ships its own.
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../manifests/components/release-cilium-key/confinement.yaml"
        );
        let shipped = std::fs::read_to_string(path).unwrap();
        let generated = render(
            &[DEFAULT_TAINT.parse().unwrap()],
            &[],
            &[LEGACY_TAINT.parse().unwrap()],
        );
        assert!(
            shipped == generated,
            "{path} differs from `nodegate-webhook confinement`; regenerate it:\n\
             cargo run -p nodegate-webhook -- confinement --release-taint={LEGACY_TAINT} > {path}"
        );
    }

    #[test]
    fn renders_four_documents_naming_the_taints() {
        let taints: Vec<TaintSpec> = vec![
            DEFAULT_TAINT.parse().unwrap(),
            "example.com/gate:NoExecute".parse().unwrap(),
        ];
        let text = render(&taints, &[], &[]);
        let docs: Vec<serde_json::Value> = text
            .split("\n---\n")
            .map(|d| serde_yaml::from_str(d).unwrap())
            .collect();
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding"
            ]
        );
        assert!(text.contains("(t.key == 'example.com/gate' && t.effect == 'NoExecute')"));
        assert_eq!(docs[1]["spec"]["validationActions"][0], "Deny");
        assert!(
            !text.contains("boot gate"),
            "no strict-mode rule without --boot-taint"
        );
    }

    /// Both policies match their ServiceAccount in any namespace, require
    /// the pod claim of the agent's token and check field ownership.
    #[test]
    fn renders_the_identity_and_ownership_rules() {
        let text = render(&[DEFAULT_TAINT.parse().unwrap()], &[], &[]);
        let docs: Vec<serde_json::Value> = text
            .split("\n---\n")
            .map(|d| serde_yaml::from_str(d).unwrap())
            .collect();
        for (doc, sa) in [(&docs[0], AGENT_SA), (&docs[2], WEBHOOK_SA)] {
            let condition = doc["spec"]["matchConditions"][0]["expression"]
                .as_str()
                .unwrap();
            assert!(
                condition.contains(&format!("endsWith(':{sa}')")),
                "{condition}"
            );
            assert!(!condition.contains("system:serviceaccount:nodegate:"));
            let names: Vec<&str> = doc["spec"]["variables"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v["name"].as_str().unwrap())
                .collect();
            assert!(names.contains(&"mfForged"), "{names:?}");
            assert!(
                doc["spec"]["validations"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v["expression"] == "size(variables.mfForged) == 0")
            );
        }
        let claim = docs[0]["spec"]["variables"][1]["expression"]
            .as_str()
            .unwrap();
        assert!(claim.contains(POD_NAME_CLAIM) && claim.contains(POD_UID_CLAIM));
        // The webhook writes only from a Pod of its StatefulSet.
        let pod = docs[2]["spec"]["variables"][0]["expression"]
            .as_str()
            .unwrap();
        assert!(pod.contains(POD_NAME_CLAIM) && pod.contains(POD_UID_CLAIM));
        assert_eq!(
            docs[2]["spec"]["validations"][0]["expression"],
            "variables.pod.matches('^nodegate-webhook-[0-9]+$')"
        );
        // The agent may touch the ready annotation's ownership, the webhook not.
        assert!(text.matches("f:nodegate.dev/ready-boot-id").count() > 0);
        let webhook_yaml = text.split("\n---\n").nth(2).unwrap();
        assert!(!webhook_yaml.contains("f:annotations"));
    }

    #[test]
    fn strict_mode_adds_the_boot_gate_rules_to_both() {
        let text = render(
            &[DEFAULT_TAINT.parse().unwrap()],
            &[GATE.parse().unwrap()],
            &[],
        );
        let docs: Vec<serde_json::Value> = text
            .split("\n---\n")
            .map(|d| serde_yaml::from_str(d).unwrap())
            .collect();
        let messages = |d: &serde_json::Value| -> String {
            d["spec"]["validations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v["messageExpression"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert!(
            messages(&docs[0])
                .contains("may add the boot gate nodegate.dev/agent-not-ready:NoExecute")
        );
        assert!(messages(&docs[0]).contains("only to the node's current bootID"));
        // The webhook adds it only off the ready boot, and moves no record.
        assert!(
            messages(&docs[2])
                .contains("only on a boot other than the one its agent recorded as ready")
        );
        assert!(!messages(&docs[2]).contains("current bootID"));
        // Both may touch both taints; the webhook only adds.
        assert!(messages(&docs[2]).contains(
            "may only add the taints nodegate.dev/agent-not-ready:NoSchedule, nodegate.dev/agent-not-ready:NoExecute"
        ));
        assert!(text.starts_with(&format!(
            "# Generated by `nodegate-webhook confinement --taint={DEFAULT_TAINT} --boot-taint={GATE}`"
        )));
    }

    /// Gates owned elsewhere: the webhook's token may add them (an evicting
    /// one only off the boot recorded as ready, like the boot gate); the
    /// agent's may neither add nor remove them, so none is among its taints,
    /// its stand-ins or its releases, even when asked to release it.
    #[test]
    fn owned_gates_are_the_webhooks_to_add_and_never_the_agents() {
        let ebs: TaintSpec = "ebs.csi.aws.com/agent-not-ready:NoExecute".parse().unwrap();
        let text = render_owned(
            &[DEFAULT_TAINT.parse().unwrap()],
            &[],
            std::slice::from_ref(&ebs),
            std::slice::from_ref(&ebs),
        );
        let docs: Vec<serde_json::Value> = text
            .split("\n---\n")
            .map(|d| serde_yaml::from_str(d).unwrap())
            .collect();
        let clause = "(t.key == 'ebs.csi.aws.com/agent-not-ready' && t.effect == 'NoExecute')";
        let agent = serde_json::to_string(&docs[0]).unwrap();
        assert!(!agent.contains("ebs.csi.aws.com"), "{agent}");
        let webhook = serde_json::to_string(&docs[2]).unwrap();
        assert!(webhook.contains(clause), "{webhook}");
        assert!(
            webhook.contains(
                "(and the gates owned elsewhere ebs.csi.aws.com/agent-not-ready:NoExecute)"
            )
        );
        assert!(webhook.contains(
            "may add the evicting gate ebs.csi.aws.com/agent-not-ready:NoExecute (owned elsewhere)"
        ));
        assert!(!webhook.contains("boot gate"), "no strict mode asked");
        // A NoSchedule gate owned elsewhere: added freely (a re-registration
        // brings it back on the create's claim), no boot rule.
        let csi: TaintSpec = "example.com/csi-not-ready:NoSchedule".parse().unwrap();
        let text = render_owned(&[DEFAULT_TAINT.parse().unwrap()], &[], &[csi], &[]);
        let webhook = text.split("\n---\n").nth(2).unwrap();
        assert!(
            webhook.contains("(t.key == 'example.com/csi-not-ready' && t.effect == 'NoSchedule')")
        );
        assert!(!webhook.contains("evicting gate"));
        // Without any, the output is render's.
        assert_eq!(
            render_owned(&[DEFAULT_TAINT.parse().unwrap()], &[], &[], &[]),
            render(&[DEFAULT_TAINT.parse().unwrap()], &[], &[])
        );
    }
}
