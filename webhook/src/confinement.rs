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
//!   to a Node; nothing removed, nothing else changed.
//! - **Strict mode** (`--boot-taint`): the agent may remove the boot gate but
//!   add it only while the node runs another boot than the one its
//!   `nodegate.dev/ready-boot-id` records, and may set that annotation only
//!   to the node's current bootID, never remove it. A stolen agent token can
//!   then not evict its node's workloads on the boot it is on.
//!
//! - **Field ownership**: neither may rewrite `metadata.managedFields`
//!   beyond what the API server's field manager records for its own write
//!   ([`ownership_variables`]), or a forged entry would let another
//!   manager's next server-side apply delete taints and labels.
//!
//! Each policy is scoped by a matchCondition on the requesting user (the
//! ServiceAccount's name in any namespace, so an install under kustomize's
//! `namespace:` stays confined), so no one else's write is ever evaluated,
//! and `failurePolicy: Fail` can only ever stop the confined workload. The
//! expressions read optional fields behind `has()` (empty fields are absent)
//! and compare whole maps, so a field added to Nodes later is covered
//! without a change here.

use std::collections::{BTreeMap, BTreeSet};

use nodegate_shared::TaintSpec;
use nodegate_shared::keys::READY_BOOT_ID_ANNOTATION;

/// The agent's and webhook's ServiceAccounts. The policies match them in
/// every namespace: the namespace is the installer's choice, and confining
/// a same-named account elsewhere only takes rights away.
pub const AGENT_SA: &str = "nodegate-agent";
pub const WEBHOOK_SA: &str = "nodegate-webhook";
/// The user extras of a ServiceAccount token bound to a pod on a node
/// (k8s.io/apiserver `pkg/authentication/serviceaccount/util.go`). A token
/// bound to a Node carries the node's name but no pod.
pub const NODE_CLAIM: &str = "authentication.kubernetes.io/node-name";
pub const POD_NAME_CLAIM: &str = "authentication.kubernetes.io/pod-name";
pub const POD_UID_CLAIM: &str = "authentication.kubernetes.io/pod-uid";
/// Names of the shipped policies (and their bindings).
pub const AGENT_POLICY: &str = "nodegate-agent-confinement";
pub const WEBHOOK_POLICY: &str = "nodegate-webhook-confinement";

/// A CEL single-quoted string literal.
fn q(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

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

/// The agent's strict-mode validations: the boot gate `boot` is added only
/// on a boot the node has not recorded as ready, and the recorded bootID
/// only ever moves to the current one. Empty without boot taints, so the
/// default install's policy is unchanged.
fn boot_gate_rules(boot: &[TaintSpec]) -> String {
    if boot.is_empty() {
        return String::new();
    }
    let ready = q(READY_BOOT_ID_ANNOTATION);
    let new_taints = "(has(object.spec) && has(object.spec.taints) ? object.spec.taints : [])";
    let old_taints =
        "(has(oldObject.spec) && has(oldObject.spec.taints) ? oldObject.spec.taints : [])";
    let new_ann = or_empty("object.metadata", "annotations", "{}");
    let old_ann = or_empty("oldObject.metadata", "annotations", "{}");
    // A main-resource write keeps the stored status: this is the node's boot.
    let boot_id = "(has(oldObject.status) && has(oldObject.status.nodeInfo) \
                   && has(oldObject.status.nodeInfo.bootID) ? oldObject.status.nodeInfo.bootID : '')";
    let is_boot = managed(boot, "t");
    let gate = shown(boot);
    format!(
        r#"    - expression: >-
        request.operation != 'UPDATE'
        || !{new_taints}.exists(t, {is_boot} && !{old_taints}.exists(o, o.key == t.key && o.effect == t.effect))
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

/// The manager the API server merges the oldest update entries into once an
/// object has more than `DefaultMaxUpdateManagers` of them (apimachinery
/// `pkg/util/managedfields/internal/capmanagers.go`, `fieldmanager.go`).
const BUCKET_MANAGER: &str = "ancient-changes";
const MAX_UPDATE_MANAGERS: usize = 10;
/// Key levels of a FieldsV1 map the bucket check follows: labels,
/// annotations, taints and every spec field are within them (a Node's
/// deepest path, `f:status.f:conditions.k:{…}.f:reason`, has four). Deeper
/// keys are not compared: each level is a nested comprehension, and CEL
/// parsers recurse per level.
const FIELDS_DEPTH: usize = 3;

/// A field whose ownership a confined write may change: its FieldsV1 path,
/// and the CEL variable that is true when this write changed the field.
struct Touched {
    path: Vec<String>,
    changed: &'static str,
}

/// Every FieldsV1 map on the way to a touched field (by its path from the
/// root), with its keys that are touched or lead to one.
fn prefixes(touched: &[Touched]) -> BTreeMap<Vec<String>, BTreeSet<String>> {
    let mut out: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    for t in touched {
        for (i, key) in t.path.iter().enumerate() {
            out.entry(t.path[..i].to_vec())
                .or_default()
                .insert(key.clone());
        }
    }
    out
}

fn quoted_list<'a>(keys: impl IntoIterator<Item = &'a String>) -> String {
    let keys: Vec<String> = keys.into_iter().map(|k| q(k)).collect();
    format!("[{}]", keys.join(", "))
}

/// CEL: the value at `path` of map `f` (which must have it).
fn get(f: &str, path: &[String]) -> String {
    let mut m = f.to_string();
    for key in path {
        m = format!("{m}[{}]", q(key));
    }
    m
}

/// CEL: map `f` has `path` (for a FieldsV1 map: owns the field, or some of
/// its children).
fn has_path(f: &str, path: &[String]) -> String {
    let parts: Vec<String> = (0..path.len())
        .map(|i| format!("{} in {}", q(&path[i]), get(f, &path[..i])))
        .collect();
    if parts.is_empty() {
        return "true".into();
    }
    format!("({})", parts.join(" && "))
}

/// CEL: but for the touched fields, FieldsV1 map `y` owns what `x` owns,
/// with the same subtrees. The expressions stay shallow: a CEL parser's
/// recursion grows with nesting, not with length.
fn kept_in(x: &str, y: &str, touched: &[Touched]) -> String {
    let checks: Vec<String> = prefixes(touched)
        .iter()
        .map(|(p, keys)| {
            let (gx, gy) = (get(x, p), get(y, p));
            let all = format!(
                "{gx}.all(k, k in {keys} || {hy} && k in {gy} && {gy}[k] == {gx}[k])",
                keys = quoted_list(keys),
                hy = has_path(y, p),
            );
            if p.is_empty() {
                all
            } else {
                format!("(!{} || {all})", has_path(x, p))
            }
        })
        .collect();
    checks.join("\n          && ")
}

/// CEL: FieldsV1 map `x` owns nothing but (parts of) touched fields.
fn only_touched(x: &str, touched: &[Touched]) -> String {
    let checks: Vec<String> = prefixes(touched)
        .iter()
        .map(|(p, keys)| {
            let all = format!("{}.all(k, k in {})", get(x, p), quoted_list(keys));
            if p.is_empty() {
                all
            } else {
                format!("(!{} || {all})", has_path(x, p))
            }
        })
        .collect();
    checks.join(" && ")
}

/// CEL: every path of `n` keys that FieldsV1 map `o` owns, `b` owns too,
/// but the touched fields this write changed. A key whose value is `{}`
/// owns its path, and so does `.` among a path's keys; at
/// [`FIELDS_DEPTH`] a key in `b` suffices.
fn covered_at(o: &str, b: &str, n: usize, touched: &[Touched]) -> String {
    let k = |i: usize| format!("k{i}");
    let at = |m: &str, upto: usize| -> String {
        (1..=upto).fold(m.to_string(), |acc, i| format!("{acc}[{}]", k(i)))
    };
    let present: Vec<String> = (1..=n)
        .map(|i| format!("{} in {}", k(i), at(b, i - 1)))
        .collect();
    let (vo, vb) = (at(o, n), at(b, n));
    let present = present.join(" && ");
    // A key with children only leads to the paths below (the next level);
    // at the last level its presence stands for them.
    let owned = if n == FIELDS_DEPTH {
        present
    } else {
        format!("size({vo}) > 0 || {present} && (size({vb}) == 0 || '.' in {vb})")
    };
    let mut alternatives: Vec<String> = touched
        .iter()
        .filter(|t| t.path.len() == n)
        .map(|t| {
            let at_path: Vec<String> = t
                .path
                .iter()
                .enumerate()
                .map(|(i, key)| format!("{} == {}", k(i + 1), q(key)))
                .collect();
            format!("{} && variables.{}", at_path.join(" && "), t.changed)
        })
        .collect();
    alternatives.push(owned);
    let mut cel = format!(
        "{}.all({}, {})",
        at(o, n - 1),
        k(n),
        alternatives.join(" || ")
    );
    // Only the maps with keys below lead to level n.
    for i in (1..n).rev() {
        cel = format!(
            "{}.all({}, size({}) == 0 || {cel})",
            at(o, i - 1),
            k(i),
            at(o, i)
        );
    }
    cel
}

/// CEL: entry `e` is an apply entry.
fn is_apply(e: &str) -> String {
    format!("(has({e}.operation) && {e}.operation == 'Apply')")
}

/// CEL: entries `e` and `o` are the same manager's (manager, operation,
/// apiVersion, subresource and fieldsType; not the time or the fields).
fn same_manager(e: &str, o: &str) -> String {
    let fixed = "['time', 'fieldsV1']";
    format!(
        "{e}.all(f, f in {fixed} || f in {o} && {o}[f] == {e}[f]) \
         && {o}.all(f, f in {fixed} || f in {e})"
    )
}

/// CEL: entry `e` is the bucket of merged update entries.
fn is_bucket(e: &str) -> String {
    format!(
        "(has({e}.manager) && {e}.manager == {} && has({e}.operation) && {e}.operation == 'Update' \
         && !has({e}.subresource))",
        q(BUCKET_MANAGER)
    )
}

/// The variables behind [`ownership_rule`]: what the API server's field
/// manager (apimachinery `managedfields/internal`, structured-merge-diff
/// `merge/update.go` `Updater.update`) can make of `metadata.managedFields`
/// on a write that changes only `touched`:
///
/// - the writer's update entry gains the touched fields it changed and
///   loses those it removed (`Updater.Update`), with a new time;
/// - every other entry loses the touched fields the write changed (the
///   conflicts are forced away), and an entry left empty is dropped;
/// - past 10 update entries the oldest are merged into `ancient-changes`
///   (`capUpdateManagers`), which then owns all they owned;
/// - nothing else: apply entries never gain a field on an update, and no
///   entry changes outside the touched fields.
///
/// A caller may send its own managedFields (`decodeLiveOrNew` takes them
/// over the stored ones), so anything else is a forgery: an apply entry
/// that owns `spec.taints` alone makes that manager's next server-side
/// apply delete every taint, and an entry dropped or narrowed lets an
/// applier's omission prune a field others still hold.
fn ownership_variables(touched: &[Touched]) -> String {
    // `fieldsV1`, `apiVersion` unguarded: the API server writes them in
    // every entry, and a forged entry without them errors, which
    // failurePolicy Fail refuses.
    let (fe, fo, fb) = ("e.fieldsV1", "o.fieldsV1", "variables.mfBucketFields");
    let same = same_manager("e", "o");
    let not_bucket = format!("!(variables.mfCapped && {})", is_bucket("e"));
    let name = |e: &str| {
        format!(
            "string(has({e}.manager) ? {e}.manager : '') + ' (' + string(has({e}.operation) ? {e}.operation : '') + ')'"
        )
    };
    let per_field = |f: &dyn Fn(&Touched) -> String| -> String {
        let checks: Vec<String> = touched.iter().map(f).collect();
        checks.join("\n          && ")
    };
    // An entry that existed: ownership of a touched field moves only when
    // the write changed it, and never to an apply entry.
    let moved = per_field(&|t| {
        let (of, og) = (has_path(fe, &t.path), has_path(fo, &t.path));
        format!(
            "({of} == {og} || variables.{c} && !({apply} && {of}))",
            c = t.changed,
            apply = is_apply("e")
        )
    });
    // A new entry: only changed touched fields, and no apply entry.
    let gained = per_field(&|t| {
        format!(
            "(!{} || variables.{} && !{})",
            has_path(fe, &t.path),
            t.changed,
            is_apply("e")
        )
    });
    // A dropped entry: only touched fields, each changed by this write.
    let lost = per_field(&|t| format!("(!{} || variables.{})", has_path(fo, &t.path), t.changed));
    let covered: Vec<String> = (1..=FIELDS_DEPTH)
        .map(|n| covered_at(fo, fb, n, touched))
        .collect();
    let list = |obj: &str| {
        format!(
            "request.operation == 'UPDATE' && has({obj}.metadata.managedFields) ? {obj}.metadata.managedFields : []"
        )
    };
    // Several variables, each of them shallow: CEL parsers recurse per
    // level of nesting.
    format!(
        r#"    # Field ownership before and after the write (CREATE and DELETE have none to compare).
    - name: mfNew
      expression: >-
        {new}
    - name: mfOld
      expression: >-
        {old}
    # The API server has merged the oldest update entries into the bucket.
    - name: mfCapped
      expression: >-
        size(variables.mfNew.filter(e, !{apply_e})) == {MAX_UPDATE_MANAGERS}
    # New entries owning more than the touched fields this write changed.
    - name: mfGained
      expression: >-
        variables.mfNew.filter(e, {not_bucket} && !variables.mfOld.exists(o, {same})
          && !({only_e}
          && {gained}))
        .map(e, {name_e})
    # Entries whose ownership changed outside the touched fields.
    - name: mfReshaped
      expression: >-
        variables.mfNew.filter(e, {not_bucket} && variables.mfOld.exists(o, {same}
          && !({kept_eo}
          && {kept_oe})))
        .map(e, {name_e})
    # Entries whose ownership of a touched field moved without a change of it.
    - name: mfMoved
      expression: >-
        variables.mfNew.filter(e, {not_bucket} && variables.mfOld.exists(o, {same}
          && !({moved})))
        .map(e, {name_e})
    # Entries gone that owned more than the touched fields this write changed.
    - name: mfDropped
      expression: >-
        variables.mfOld.filter(o, !variables.mfNew.exists(e, {same})
          && !({only_o}
          && {lost}))
    # The bucket, when the API server has just filled it (one per apiVersion; Nodes have one).
    - name: mfBucket
      expression: >-
        variables.mfCapped ? variables.mfNew.filter(b, {bucket_b}) : []
    - name: mfBucketFields
      expression: >-
        size(variables.mfBucket) == 1 ? variables.mfBucket[0].fieldsV1 : {{}}
    # Of the dropped entries, the ones the bucket did not take in (update entries only).
    - name: mfUncovered
      expression: >-
        variables.mfDropped.filter(o, {apply_o} || size(variables.mfBucket) != 1
          || variables.mfBucket[0].apiVersion != o.apiVersion
          || !({covered}))
        .map(o, {name_o})
    # The entries the field manager could not have left so after this write.
    - name: mfForged
      expression: >-
        variables.mfGained + variables.mfReshaped + variables.mfMoved + variables.mfUncovered
"#,
        new = list("object"),
        old = list("oldObject"),
        apply_e = is_apply("e"),
        apply_o = is_apply("o"),
        only_e = only_touched(fe, touched),
        only_o = only_touched(fo, touched),
        kept_eo = kept_in(fe, fo, touched),
        kept_oe = kept_in(fo, fe, touched),
        bucket_b = is_bucket("b"),
        covered = covered.join("\n          && "),
        name_e = name("e"),
        name_o = name("o"),
    )
}

/// The validation that refuses a forged `metadata.managedFields`;
/// `who` is a CEL string naming the writer.
fn ownership_rule(who: &str) -> String {
    format!(
        r#"    - expression: size(variables.mfForged) == 0
      messageExpression: >-
        {who} + " may not rewrite metadata.managedFields of node '" + request.name
        + "' (entries of " + variables.mfForged.join(', ')
        + "): only the API server records who owns a field"
      reason: Forbidden
"#
    )
}

/// Both policies and their bindings as one YAML stream: `taints` are the
/// ordinary taints, `boot` strict mode's boot gate (empty when off),
/// `release` the taints the agent may remove but never add (an older
/// configuration's, matched exactly).
pub fn render(ordinary: &[TaintSpec], boot: &[TaintSpec], release: &[TaintSpec]) -> String {
    let mut flags = nodegate_shared::taint::as_flags(ordinary, boot);
    for r in release {
        flags.push_str(&format!(" --release-taint={r}"));
    }
    let is_released = released(release, "t");
    let taints: Vec<TaintSpec> = ordinary.iter().chain(boot).cloned().collect();
    let taints = taints.as_slice();
    let boot_rules = boot_gate_rules(boot);
    let ready = q(READY_BOOT_ID_ANNOTATION);
    let claim = q(NODE_CLAIM);
    let is_managed = managed(taints, "t");
    let new_taints = "(has(object.spec) && has(object.spec.taints) ? object.spec.taints : [])";
    let old_taints =
        "(has(oldObject.spec) && has(oldObject.spec.taints) ? oldObject.spec.taints : [])";
    let new_spec = or_empty("object", "spec", "{}");
    let old_spec = or_empty("oldObject", "spec", "{}");
    let new_labels = or_empty("object.metadata", "labels", "{}");
    let old_labels = or_empty("oldObject.metadata", "labels", "{}");
    let new_ann = or_empty("object.metadata", "annotations", "{}");
    let old_ann = or_empty("oldObject.metadata", "annotations", "{}");
    // Written by the API server on every update (managedFields by its field
    // manager, checked on their own), or checked above.
    let server_meta = "['labels', 'annotations', 'managedFields', 'resourceVersion', 'generation']";
    let taints_changed = format!(
        "    - name: taintsChanged\n      expression: >-\n        request.operation == 'UPDATE' && {new_taints} != {old_taints}\n"
    );
    let changed = format!(
        "{taints_changed}    - name: readyChanged\n      expression: >-\n        request.operation == 'UPDATE'\n        && ({ready} in {new_ann} ? !({ready} in {old_ann}) || {old_ann}[{ready}] != object.metadata.annotations[{ready}]\n           : {ready} in {old_ann})\n    # The annotations map itself appeared or went away.\n    - name: annotationsChanged\n      expression: >-\n        request.operation == 'UPDATE'\n        && has(object.metadata.annotations) != has(oldObject.metadata.annotations)\n"
    );
    let taint_path = || vec!["f:spec".to_string(), "f:taints".to_string()];
    let agent_touched = [
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
    let webhook_touched = [Touched {
        path: taint_path(),
        changed: "taintsChanged",
    }];
    let managed_list = shown(taints);
    // The spec is unchanged but for its taints (keys added or removed too).
    let spec_kept = format!(
        "({new_spec}.all(k, k == 'taints' || (k in {old_spec} && {old_spec}[k] == object.spec[k])) \
         && {old_spec}.all(k, k == 'taints' || k in {new_spec}))"
    );
    format!(
        r#"# Generated by `nodegate-webhook confinement {flags}`; do not edit:
# regenerate with the webhook's --taint and --boot-taint flags and the agent's
# --release-taint flags (a test compares this file with the output).
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
{agent_head}  variables:
    # The node in the token ('' without a node claim).
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
{changed}{agent_ownership}  validations:
    - expression: variables.claim != ''
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
        variables.who + " may change only the taints {managed_list}{release_note} of node '" + request.name
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
{agent_ownership_rule}---
{agent_binding}---
{webhook_head}  variables:
{taints_changed}{webhook_ownership}  validations:
    - expression: request.operation == 'UPDATE' && !has(request.subResource)
      messageExpression: >-
        'nodegate-webhook may only add taints to a node, not ' + request.operation
        + (has(request.subResource) ? ' nodes/' + request.subResource : '') + ' ' + request.name
      reason: Forbidden
    - expression: >-
        request.operation != 'UPDATE'
        || ({old_taints}.all(o, {new_taints}.exists(t, t == o))
            && {new_taints}.all(t, {old_taints}.exists(o, o == t) || {is_managed}))
      messageExpression: >-
        "nodegate-webhook may only add the taints {managed_list} to node '" + request.name + "'"
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
{webhook_ownership_rule}---
{webhook_binding}"#,
        flags = flags,
        agent_head = policy_head(AGENT_POLICY, "nodegate-agent", AGENT_SA),
        webhook_head = policy_head(WEBHOOK_POLICY, "nodegate-webhook", WEBHOOK_SA),
        agent_binding = binding(AGENT_POLICY),
        agent_ownership = ownership_variables(&agent_touched),
        agent_ownership_rule = ownership_rule("variables.who"),
        webhook_ownership = ownership_variables(&webhook_touched),
        webhook_ownership_rule = ownership_rule("'nodegate-webhook'"),
        pod_name = q(POD_NAME_CLAIM),
        pod_uid = q(POD_UID_CLAIM),
        release_note = if release.is_empty() {
            String::new()
        } else {
            format!(" (and remove {})", shown_exact(release))
        },
        webhook_binding = binding(WEBHOOK_POLICY),
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
        // The agent may touch the ready annotation's ownership, the webhook not.
        assert!(text.matches("f:nodegate.dev/ready-boot-id").count() > 0);
        let webhook_yaml = text.split("\n---\n").nth(2).unwrap();
        assert!(!webhook_yaml.contains("f:annotations"));
    }

    #[test]
    fn strict_mode_adds_the_boot_gate_rules_to_the_agent_only() {
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
        assert!(!messages(&docs[2]).contains("boot gate"));
        // Both may touch both taints; the webhook only adds.
        assert!(messages(&docs[2]).contains(
            "may only add the taints nodegate.dev/agent-not-ready:NoSchedule, nodegate.dev/agent-not-ready:NoExecute"
        ));
        assert!(text.starts_with(&format!(
            "# Generated by `nodegate-webhook confinement --taint={DEFAULT_TAINT} --boot-taint={GATE}`"
        )));
    }
}
