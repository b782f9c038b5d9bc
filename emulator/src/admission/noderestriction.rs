//! NodeRestriction's label rules: which labels a kubelet may set on its own
//! Node. The rest of the plugin (own Node only, no taint changes on update)
//! runs in the admission chain.
//!
//! Follows `plugin/pkg/admission/noderestriction/admission.go`
//! (`getModifiedLabels`, `isKubeletLabel`-based checks) and
//! `k8s.io/kubelet/pkg/apis/well_known_labels.go` (`IsKubeletLabel`).

use serde_json::Value;

/// Labels a kubelet may set on its Node (`IsKubeletLabel`).
fn is_kubelet_label(key: &str) -> bool {
    const LABELS: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "node.kubernetes.io/windows-build",
    ];
    let ns = key.split_once('/').map(|(p, _)| p).unwrap_or("");
    LABELS.contains(&key) || ns == "kubelet.kubernetes.io" || ns == "node.kubernetes.io"
}

/// NodeRestriction's label rule: kubernetes.io / k8s.io labels outside the
/// kubelet's own set (and all of node-restriction.kubernetes.io) are off limits.
fn is_forbidden_label(key: &str) -> bool {
    let ns = key.split_once('/').map(|(p, _)| p).unwrap_or("");
    if ns == "node-restriction.kubernetes.io" || ns.ends_with(".node-restriction.kubernetes.io") {
        return true;
    }
    if is_kubelet_label(key) {
        return false;
    }
    ns == "kubernetes.io"
        || ns.ends_with(".kubernetes.io")
        || ns == "k8s.io"
        || ns.ends_with(".k8s.io")
}

pub(crate) fn forbidden_label_changes(obj: &Value, old: &Value) -> Vec<String> {
    let new = crate::selectors::labels_of(obj);
    let before = crate::selectors::labels_of(old);
    let mut out: Vec<String> = new
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v) && is_forbidden_label(k))
        .map(|(k, _)| k.clone())
        .chain(
            before
                .keys()
                .filter(|k| !new.contains_key(*k) && is_forbidden_label(k))
                .cloned(),
        )
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubelet_label_rules() {
        assert!(!is_forbidden_label("kubernetes.io/hostname"));
        assert!(!is_forbidden_label("node.kubernetes.io/anything"));
        assert!(!is_forbidden_label("nodegate.dev/exclude"));
        assert!(is_forbidden_label("node-role.kubernetes.io/control-plane"));
        assert!(is_forbidden_label("node-restriction.kubernetes.io/x"));
        assert!(is_forbidden_label("example.k8s.io/x"));
        let old = json!({"metadata": {"labels": {"node-role.kubernetes.io/worker": ""}}});
        let new = json!({"metadata": {"labels": {"node-role.kubernetes.io/worker": "", "a": "b"}}});
        assert!(forbidden_label_changes(&new, &old).is_empty());
        assert_eq!(
            forbidden_label_changes(&json!({}), &old),
            vec!["node-role.kubernetes.io/worker"]
        );
    }
}
