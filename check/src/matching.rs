//! How the API server decides whether a Node write reaches a webhook or an
//! admission policy: its rules (`covers`) and its matchConditions, evaluated
//! with `request` bound the way the API server binds it (absent `omitempty`
//! fields are errors, not `''`).

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, RuleWithOperations};
use nodegate_shared::match_conditions::{RequestAttributes, Verdict, match_all, request_variable};
use serde_json::{Value, json};

/// Does any rule send `operation` on `nodes[/sub]` to the webhook?
/// Follows `k8s.io/apiserver/pkg/admission/plugin/webhook/predicates/rules`
/// `Matcher` (`*`, `*/*`, `nodes/*`, `*/status`).
pub fn covers(rules: &[RuleWithOperations], operation: &str, sub: &str) -> bool {
    let has = |l: &Option<Vec<String>>, v: &str| {
        l.as_ref()
            .is_some_and(|l| l.iter().any(|x| x == "*" || x == v))
    };
    rules.iter().any(|r| {
        has(&r.operations, operation)
            && has(&r.api_groups, "")
            && has(&r.api_versions, "v1")
            && r.resources
                .as_deref()
                .unwrap_or_default()
                .iter()
                .any(|res| {
                    let (res, rsub) = res.split_once('/').unwrap_or((res.as_str(), ""));
                    let res_ok = res == "*" || res == "nodes";
                    let sub_ok = if sub.is_empty() {
                        rsub.is_empty()
                    } else {
                        rsub == "*" || rsub == sub
                    };
                    res_ok && sub_ok
                })
            && !matches!(r.scope.as_deref(), Some("Namespaced"))
    })
}

/// A Node as its kubelet registers it, on boot `boot`.
pub fn node(name: &str, boot: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
           "status": {"nodeInfo": {"bootID": boot}}})
}

/// The conditions' verdict for one request shape, sent by the node's kubelet.
pub fn evaluate(hook: &MutatingWebhook, op: &str, sub: &str, obj: &Value, old: &Value) -> Verdict {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let user = format!("{}{name}", nodegate_shared::keys::NODE_USER_PREFIX);
    evaluate_as(&conditions(hook), op, sub, &user, obj, old)
}

/// A webhook entry's matchConditions as (name, expression) pairs.
pub fn conditions(hook: &MutatingWebhook) -> Vec<(&str, &str)> {
    hook.match_conditions
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|c| (c.name.as_str(), c.expression.as_str()))
        .collect()
}

/// `matchConditions` (name, expression) for one request shape sent by `user`,
/// with `request` bound as the API server binds it.
pub fn evaluate_as(
    conditions: &[(&str, &str)],
    op: &str,
    sub: &str,
    user: &str,
    obj: &Value,
    old: &Value,
) -> Verdict {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let groups: Vec<String> = if user.starts_with(nodegate_shared::keys::NODE_USER_PREFIX) {
        vec!["system:nodes".into(), "system:authenticated".into()]
    } else {
        vec!["system:authenticated".into()]
    };
    let options = if op == "CREATE" {
        "CreateOptions"
    } else {
        "UpdateOptions"
    };
    let request = request_variable(&RequestAttributes {
        group: "",
        version: "v1",
        kind: "Node",
        resource: "nodes",
        subresource: sub,
        name,
        namespace: "",
        operation: op,
        username: user,
        groups: &groups,
        extra: &Default::default(),
        dry_run: false,
        options: json!({"kind": options, "apiVersion": "meta.k8s.io/v1"}),
    });
    match_all(conditions.iter().copied(), obj, old, &request).0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(ops: &[&str], res: &[&str]) -> RuleWithOperations {
        RuleWithOperations {
            api_groups: Some(vec![String::new()]),
            api_versions: Some(vec!["v1".into()]),
            operations: Some(ops.iter().map(|s| s.to_string()).collect()),
            resources: Some(res.iter().map(|s| s.to_string()).collect()),
            scope: Some("Cluster".into()),
        }
    }

    #[test]
    fn rule_coverage_follows_the_matcher() {
        let shipped = [
            rule(&["CREATE", "UPDATE"], &["nodes"]),
            rule(&["UPDATE"], &["nodes/status"]),
        ];
        assert!(covers(&shipped, "CREATE", ""));
        assert!(covers(&shipped, "UPDATE", "status"));
        assert!(
            !covers(&[rule(&["UPDATE"], &["nodes"])], "UPDATE", "status"),
            "nodes ≠ nodes/status"
        );
        assert!(covers(&[rule(&["*"], &["nodes/*"])], "UPDATE", "status"));
        assert!(!covers(&[rule(&["*"], &["nodes/*"])], "CREATE", ""));
        assert!(covers(&[rule(&["CREATE"], &["*"])], "CREATE", ""));
        assert!(!covers(&[rule(&["UPDATE"], &["nodes"])], "CREATE", ""));
    }
}
