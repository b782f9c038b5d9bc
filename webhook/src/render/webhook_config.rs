//! `nodegate-webhook webhook-config`: the MutatingWebhookConfiguration, with
//! one line of admission per replica behind the first.
//!
//! The API server never retries a failed admission call, and with
//! `failurePolicy: Ignore` a call routed to a replica whose node died (its
//! endpoint still Ready until the node lifecycle controller notices) stores
//! the Node ungated. Later webhooks see earlier ones' patches, so each backup
//! line (one replica behind its own Service) is called only when the Node
//! still lacks a taint the first line would have added: in steady state
//! never; when the first line failed, until one replica answers. A shipped
//! `NoSchedule` gate stands in for a configured one
//! (`nodegate_shared::taint::stand_ins`), so while a switch of key profile
//! rolls out, a Node an old replica gated with the old key does not call
//! the backup lines (whose replica may be the one being replaced).

use nodegate_shared::TaintSpec;
use nodegate_shared::keys::EXCLUDE_LABEL;

use crate::render::cel;
use crate::rules::Rule;

/// The rules the backup lines decide: the answer's own. A reboot seen on a
/// status write ([`Rule::StatusShowsReboot`]) is a background patch that no
/// later line can see.
pub const BACKUP_RULES: [Rule; 2] = [Rule::NodeCreate, Rule::UpdateAfterReboot];

/// The first line's name: the one the API server's metrics and the alerts
/// have always named.
pub const PRIMARY: &str = "nodes.nodegate.dev";
/// The webhook's Service (every replica) and the StatefulSet's name; replica
/// `i` is the Pod and Service `<SERVICE>-<i>`.
pub const SERVICE: &str = "nodegate-webhook";
/// Replicas shipped.
pub const DEFAULT_REPLICAS: u32 = 2;
/// Every line's `timeoutSeconds`.
pub const TIMEOUT_SECONDS: u32 = 2;

/// The name of the backup line of replica `i`.
pub fn backup_name(i: u32) -> String {
    format!("replica-{i}.{PRIMARY}")
}

/// The whole configuration for `replicas` replicas and the webhook's taints.
pub fn render(ordinary: &[TaintSpec], boot: &[TaintSpec], replicas: u32) -> String {
    render_owned(ordinary, boot, &[], replicas)
}

/// [`render`] for a webhook that also adds gates owned elsewhere (`owned`,
/// its `--owned-taint`s). The lines are the same: the backup lines'
/// `still-ungated` condition names nodegate's gates only, since a node whose
/// owner already removed its gate is not ungated, and naming it would make
/// every later write of that node call each backup line. A backup replica
/// that answers a create adds the owned gates as the first line would (the
/// same flags); only the header's command names them.
pub fn render_owned(
    ordinary: &[TaintSpec],
    boot: &[TaintSpec],
    owned: &[TaintSpec],
    replicas: u32,
) -> String {
    let flags = super::taint_flags(ordinary, owned, boot);
    let taints: Vec<TaintSpec> = ordinary.iter().chain(boot).cloned().collect();
    let create_or_update = cel::indent(&flat(&cel::create_or_update_after_reboot()), 10);
    let owned_note = if owned.is_empty() {
        ""
    } else {
        "#\n\
         # The gates owned elsewhere (--owned-taint) are not in the backup lines'\n\
         # still-ungated condition: their owner removes them, and a node without\n\
         # one is not ungated. A backup replica adds them at create like the first.\n"
    };
    let mut out = primary_line(&flags, replicas, &create_or_update, owned_note);
    let backup = BackupConditions {
        not_excluded: cel::indent(&flat(&cel::not_excluded()), 10),
        create_or_update,
        list: stand_in_lists(&taints),
        lacks: cel::indent(&flat(&cel::lacks("t")), 10),
    };
    for i in 0..replicas {
        out.push_str(&backup_line(i, &backup));
    }
    out
}

/// Each configured taint with the shipped gates that stand in for it
/// (`nodegate_shared::taint::stand_ins`), as a CEL list of lists. Another
/// configured taint is no stand-in: each must be there or stood in for.
fn stand_in_lists(taints: &[TaintSpec]) -> String {
    let lists: Vec<String> = taints
        .iter()
        .map(|t| {
            let group: Vec<TaintSpec> = nodegate_shared::taint::stand_ins(t)
                .into_iter()
                .filter(|s| {
                    s == t
                        || !taints
                            .iter()
                            .any(|o| o.key() == s.key() && o.effect() == s.effect())
                })
                .collect();
            cel::taint_list(&group)
        })
        .collect();
    format!("[{}]", lists.join(",\n          "))
}

/// Every line at one indentation: a folded scalar then folds each break
/// into a space, which every YAML parser (kustomize's included) agrees on;
/// more-indented lines keep breaks that parsers have rendered differently.
fn flat(e: &str) -> String {
    e.lines().map(str::trim).collect::<Vec<_>>().join("\n")
}

/// The header and the first line: every replica, every write its
/// conditions let through.
fn primary_line(flags: &str, replicas: u32, create_or_update: &str, owned_note: &str) -> String {
    let (create, update) = (Rule::NodeCreate.number(), Rule::UpdateAfterReboot.number());
    let excluded = Rule::Excluded.number();
    format!(
        r#"# Generated by `nodegate-webhook webhook-config {flags} --replicas {replicas}`;
# do not edit: regenerate with the webhook's --taint and --boot-taint flags
# (a test compares this file with the output). caBundle is filled in by
# `nodegate-certs --webhook-config <this file>` and `kubectl patch`.
#
# The first line goes to every replica through the `{SERVICE}` Service;
# each later line to one replica through its own Service, and only when the
# Node under review still lacks a taint the first line would have added. The
# API server never retries a failed call: a Node write is stored ungated only
# if every line failed. Each call runs once (reinvocationPolicy Never): a
# line that failed open would otherwise be called again after a later line's
# patch, one more timeout on a dead replica.
{owned_note}apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: nodegate
  labels:
    app.kubernetes.io/name: nodegate-webhook
    app.kubernetes.io/part-of: nodegate
webhooks:
  - name: {PRIMARY}
    admissionReviewVersions: ["v1"]
    clientConfig:
      service:
        name: {SERVICE}
        namespace: nodegate
        port: 443
    rules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["nodes"]
        scope: Cluster
      # A status write cannot carry the taint, but it is where a reboot shows
      # (a new bootID); the webhook then patches the main resource itself.
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["UPDATE"]
        resources: ["nodes/status"]
        scope: Cluster
    # An outage must never block node registration: the kubelet retries a
    # failed create forever and never reports status.
    failurePolicy: Ignore
    sideEffects: NoneOnDryRun
    # The webhook answers in milliseconds; a dead replica costs a whole
    # timeout per line that reaches it (at most two with two replicas).
    timeoutSeconds: {TIMEOUT_SECONDS}
    matchPolicy: Equivalent
    reinvocationPolicy: Never
    # Rule {excluded}. NodeRestriction refuses node-restriction.kubernetes.io/ labels
    # from kubelets, so only an admin can exclude a node, never the node.
    objectSelector:
      matchExpressions:
        - key: {EXCLUDE_LABEL}
          operator: NotIn
          values: ["true"]
    matchConditions:
      # Heartbeats (status writes that keep the bootID) are most Node writes
      # in a cluster; only status writes that can mean a reboot get through.
      #
      # Every optional field is read behind has(): the API server binds
      # `request` as the AdmissionRequest converted to unstructured JSON
      # (k8s.io/apiserver admission/plugin/cel CreateAdmissionRequest +
      # DefaultUnstructuredConverter), so an omitempty field that is empty is
      # ABSENT, not ''. On a main-resource write (every Node CREATE, rules {create}
      # and {update}) `request.subResource` does not exist: reading it unguarded is an
      # evaluation error, and with failurePolicy Ignore the API server then
      # skips the webhook silently. `nodegate-check` proves this on a cluster.
      - name: not-a-heartbeat
        expression: >-
          !has(request.subResource) || request.subResource != 'status' ||
          (has(object.status) && has(object.status.nodeInfo) && has(object.status.nodeInfo.bootID) &&
          object.status.nodeInfo.bootID != '' &&
          ((has(oldObject.status) && has(oldObject.status.nodeInfo) && has(oldObject.status.nodeInfo.bootID) &&
          oldObject.status.nodeInfo.bootID != '' &&
          oldObject.status.nodeInfo.bootID != object.status.nodeInfo.bootID) ||
          (has(object.metadata.annotations) &&
          'nodegate.dev/ready-boot-id' in object.metadata.annotations &&
          object.metadata.annotations['nodegate.dev/ready-boot-id'] != object.status.nodeInfo.bootID)))
      # An update of the main resource matters only after a reboot (rule {update},
      # the same expression as the later lines'): the agent's ready patch,
      # the controllers' taint and annotation writes and an admin's labels
      # never reach the webhook, and the API server makes no call for them.
      # Status writes are left to the condition above.
      - name: create-or-update-after-reboot
        expression: >-
          (has(request.subResource) && request.subResource == 'status')
          || {create_or_update}
"#
    )
}

/// The CEL of a backup line's conditions, the same for every replica.
struct BackupConditions {
    not_excluded: String,
    create_or_update: String,
    /// Each configured taint with its stand-ins, as a CEL list of lists.
    list: String,
    /// `t` is not on the Node.
    lacks: String,
}

/// Replica `i`'s own line, called only while the Node still lacks a taint.
fn backup_line(i: u32, c: &BackupConditions) -> String {
    let name = backup_name(i);
    let rules = Rule::numbers(&BACKUP_RULES);
    let (create, status) = (Rule::NodeCreate.number(), Rule::StatusShowsReboot.number());
    let BackupConditions {
        not_excluded,
        create_or_update,
        list,
        lacks,
    } = c;
    format!(
        r#"  # Replica {i} alone, for a Node write the lines before left ungated.
  - name: {name}
    admissionReviewVersions: ["v1"]
    clientConfig:
      service:
        name: {SERVICE}-{i}
        namespace: nodegate
        port: 443
    # Rules {rules} only. A reboot seen on a status write (rule {status}) is a
    # background patch that no later line can see; the kubelet's create at
    # start (rule {create}, re-tainted before the answer) comes first and is covered.
    rules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["nodes"]
        scope: Cluster
    failurePolicy: Ignore
    sideEffects: NoneOnDryRun
    timeoutSeconds: {TIMEOUT_SECONDS}
    matchPolicy: Equivalent
    reinvocationPolicy: Never
    objectSelector:
      matchExpressions:
        - key: {EXCLUDE_LABEL}
          operator: NotIn
          values: ["true"]
    matchConditions:
      - name: not-excluded
        expression: >-
          {not_excluded}
      - name: create-or-update-after-reboot
        expression: >-
          {create_or_update}
      # What makes this line silent while an earlier one answers: the Node
      # already carries every configured taint (by key and effect), or a
      # shipped NoSchedule gate in its place (an old replica's, while a
      # switch of key profile rolls out: the node is gated either way).
      - name: still-ungated
        expression: >-
          {list}.exists(g, g.all(t,
          {lacks}))
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegate_shared::keys::DEFAULT_TAINT;

    /// The base ships the generator's output for the default taint; strict
    /// mode's component the one with its boot gate.
    #[test]
    fn shipped_configurations_are_the_generator_output() {
        let base = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../manifests/base/webhook/mutatingwebhookconfiguration.yaml"
        );
        let strict = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../manifests/components/strict-mode/webhook-config.yaml"
        );
        let taint: TaintSpec = DEFAULT_TAINT.parse().unwrap();
        let gate: TaintSpec = "nodegate.dev/agent-not-ready=true:NoExecute"
            .parse()
            .unwrap();
        for (path, boot, cmd) in [
            (
                base,
                vec![],
                "webhook-config > manifests/base/webhook/mutatingwebhookconfiguration.yaml",
            ),
            (
                strict,
                vec![gate],
                "webhook-config --boot-taint=nodegate.dev/agent-not-ready=true:NoExecute > manifests/components/strict-mode/webhook-config.yaml",
            ),
        ] {
            let shipped = std::fs::read_to_string(path).unwrap();
            let generated = render(std::slice::from_ref(&taint), &boot, DEFAULT_REPLICAS);
            assert!(
                shipped == generated,
                "{path} differs from the generator; regenerate it:\n\
                 cargo run -p nodegate-webhook -- {cmd}"
            );
        }
    }

    #[test]
    fn one_backup_line_per_replica_each_on_its_own_service() {
        let taints = vec![DEFAULT_TAINT.parse().unwrap()];
        let text = render(&taints, &[], 3);
        let doc: serde_json::Value = serde_yaml::from_str(&text).unwrap();
        let hooks = doc["webhooks"].as_array().unwrap();
        let names: Vec<&str> = hooks.iter().map(|h| h["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                PRIMARY,
                "replica-0.nodes.nodegate.dev",
                "replica-1.nodes.nodegate.dev",
                "replica-2.nodes.nodegate.dev"
            ]
        );
        let services: Vec<&str> = hooks
            .iter()
            .map(|h| h["clientConfig"]["service"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            services,
            [
                SERVICE,
                "nodegate-webhook-0",
                "nodegate-webhook-1",
                "nodegate-webhook-2"
            ]
        );
        for h in hooks {
            assert_eq!(h["failurePolicy"], "Ignore");
            assert_eq!(h["reinvocationPolicy"], "Never");
            assert_eq!(h["timeoutSeconds"], TIMEOUT_SECONDS);
        }
        for h in &hooks[1..] {
            // No status rule, and the still-ungated condition naming the taint.
            assert_eq!(h["rules"].as_array().unwrap().len(), 1);
            let conds = serde_json::to_string(&h["matchConditions"]).unwrap();
            assert!(conds.contains("still-ungated"));
            assert!(conds.contains("'nodegate.dev/agent-not-ready'"));
        }
    }

    /// The backup lines' `still-ungated` condition, evaluated as the API
    /// server does: silent when the Node carries the configured gate or a
    /// shipped NoSchedule gate in its place (an old replica's during a
    /// switch of key profile); called when a gate has none, and a boot gate
    /// (NoExecute) has no stand-in.
    #[test]
    fn a_shipped_gate_stands_in_for_the_configured_one() {
        use nodegate_shared::keys::{KARPENTER_PROFILE_TAINT, MANAGED_CA_PROFILE_TAINT};
        use nodegate_shared::match_conditions::eval_condition;
        let spec = |s: &str| s.parse::<TaintSpec>().unwrap();
        let still_ungated = |ordinary: &[TaintSpec], boot: &[TaintSpec]| -> String {
            let text = render(ordinary, boot, 1);
            let v: serde_json::Value = serde_yaml::from_str(&text).unwrap();
            let conds = v["webhooks"][1]["matchConditions"].as_array().unwrap();
            let c = conds.iter().find(|c| c["name"] == "still-ungated").unwrap();
            c["expression"].as_str().unwrap().to_string()
        };
        let node = |taints: &[&str]| {
            let taints: Vec<serde_json::Value> = taints
                .iter()
                .map(|t| {
                    let t = spec(t);
                    serde_json::json!({"key": t.key(), "value": t.value().unwrap_or(""), "effect": t.effect().as_str()})
                })
                .collect();
            if taints.is_empty() {
                serde_json::json!({"metadata": {"name": "n"}})
            } else {
                serde_json::json!({"metadata": {"name": "n"}, "spec": {"taints": taints}})
            }
        };
        let calls = |expr: &str, taints: &[&str]| {
            eval_condition(
                expr,
                &node(taints),
                &serde_json::Value::Null,
                &serde_json::json!({}),
            )
            .unwrap()
        };
        let karpenter = still_ungated(&[spec(KARPENTER_PROFILE_TAINT)], &[]);
        assert!(calls(&karpenter, &[]), "an ungated node calls the backups");
        assert!(!calls(&karpenter, &[KARPENTER_PROFILE_TAINT]));
        assert!(
            !calls(&karpenter, &[DEFAULT_TAINT]),
            "the old key stands in"
        );
        assert!(!calls(&karpenter, &[MANAGED_CA_PROFILE_TAINT]));
        assert!(calls(&karpenter, &["example.com/other=true:NoSchedule"]));
        assert!(
            calls(
                &karpenter,
                &["readiness.k8s.io/nodegate-agent-not-ready=true:NoExecute"]
            ),
            "another effect is no stand-in"
        );
        let boot = "nodegate.dev/agent-not-ready=true:NoExecute";
        let strict = still_ungated(&[spec(DEFAULT_TAINT)], &[spec(boot)]);
        assert!(calls(&strict, &[DEFAULT_TAINT]), "the boot gate is missing");
        assert!(
            calls(
                &strict,
                &[
                    KARPENTER_PROFILE_TAINT,
                    "readiness.k8s.io/nodegate-agent-not-ready=true:NoExecute"
                ]
            ),
            "a boot gate has no stand-in"
        );
        assert!(!calls(&strict, &[KARPENTER_PROFILE_TAINT, boot]));
        // Two configured NoSchedule gates: neither stands in for the other.
        let custom = "example.com/csi-not-ready=true:NoSchedule";
        let two = still_ungated(&[spec(DEFAULT_TAINT), spec(custom)], &[]);
        assert!(calls(&two, &[DEFAULT_TAINT]), "the second gate is missing");
        assert!(calls(&two, &[custom]), "the first gate is missing");
        assert!(!calls(&two, &[KARPENTER_PROFILE_TAINT, custom]));
        assert!(!calls(&two, &[DEFAULT_TAINT, custom]));
    }

    /// Gates owned elsewhere change no line: the backup lines' condition
    /// names nodegate's gates only (a node whose owner removed its gate is
    /// not ungated, and would otherwise call every backup line on each
    /// later write). Only the header names them.
    #[test]
    fn owned_gates_change_no_line() {
        let taints = vec![DEFAULT_TAINT.parse().unwrap()];
        let owned = vec!["ebs.csi.aws.com/agent-not-ready:NoExecute".parse().unwrap()];
        let plain: serde_json::Value = serde_yaml::from_str(&render(&taints, &[], 2)).unwrap();
        let text = render_owned(&taints, &[], &owned, 2);
        let with: serde_json::Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(plain, with);
        assert!(text.starts_with(&format!(
            "# Generated by `nodegate-webhook webhook-config --taint={DEFAULT_TAINT} \
             --owned-taint=ebs.csi.aws.com/agent-not-ready:NoExecute --replicas 2`"
        )));
        assert!(text.contains("not in the backup lines'"));
        assert_eq!(render_owned(&taints, &[], &[], 2), render(&taints, &[], 2));
    }
}
