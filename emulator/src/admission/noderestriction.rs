//! NodeRestriction's label rules: which labels a kubelet may set on its own
//! Node. The rest of the plugin (own Node only, no taint changes on update)
//! runs in the admission chain.
//!
//! Follows `plugin/pkg/admission/noderestriction/admission.go`
//! (`admitNode`, `getModifiedLabels`, `getForbiddenLabels`,
//! `isKubernetesLabel`) and `k8s.io/kubelet/pkg/apis/well_known_labels.go`
//! (`IsKubeletLabel`).

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
    LABELS.contains(&key)
        || in_domain(namespace(key), "kubelet.kubernetes.io")
        || in_domain(namespace(key), "node.kubernetes.io")
}

/// `getLabelNamespace`: the prefix before the first `/`, or "".
fn namespace(key: &str) -> &str {
    key.split_once('/').map(|(p, _)| p).unwrap_or("")
}

/// `ns` is `domain` or a subdomain of it.
fn in_domain(ns: &str, domain: &str) -> bool {
    ns == domain
        || ns
            .strip_suffix(domain)
            .is_some_and(|rest| rest.ends_with('.'))
}

/// `getForbiddenLabels` for one modified key, on create and update alike:
/// all of node-restriction.kubernetes.io (so a label there is one only an
/// admin or a controller can set: nodegate's exclude label), and
/// kubernetes.io / k8s.io labels outside the kubelet's own set.
fn is_forbidden_label(key: &str) -> bool {
    let ns = namespace(key);
    if in_domain(ns, "node-restriction.kubernetes.io") {
        return true;
    }
    (in_domain(ns, "kubernetes.io") || in_domain(ns, "k8s.io")) && !is_kubelet_label(key)
}

/// `getModifiedLabels` (keys added, removed or changed; on create, every key,
/// against no labels) filtered by `getForbiddenLabels`, sorted.
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

    const EXCLUDE: &str = "node-restriction.kubernetes.io/nodegate-exclude";

    #[test]
    fn kubelet_label_rules() {
        // (key, forbidden to a kubelet)
        let table: &[(&str, bool)] = &[
            ("kubernetes.io/hostname", false),
            ("node.kubernetes.io/anything", false),
            ("sub.node.kubernetes.io/x", false),
            ("kubelet.kubernetes.io/x", false),
            ("sub.kubelet.kubernetes.io/x", false),
            ("topology.kubernetes.io/zone", false),
            ("example.com/x", false),
            ("plain", false),
            ("nodegate.dev/exclude", false),
            ("node-role.kubernetes.io/control-plane", true),
            ("kubernetes.io/other", true),
            ("example.k8s.io/x", true),
            ("k8s.io/x", true),
            ("notkubernetes.io/x", false),
            (EXCLUDE, true),
            ("node-restriction.kubernetes.io/x", true),
            ("sub.node-restriction.kubernetes.io/x", true),
            // A kubelet domain does not reach into node-restriction's.
            ("node.node-restriction.kubernetes.io/x", true),
        ];
        for (key, forbidden) in table {
            assert_eq!(is_forbidden_label(key), *forbidden, "{key}");
        }
        let old = json!({"metadata": {"labels": {"node-role.kubernetes.io/worker": ""}}});
        let new = json!({"metadata": {"labels": {"node-role.kubernetes.io/worker": "", "a": "b"}}});
        assert!(forbidden_label_changes(&new, &old).is_empty());
        assert_eq!(
            forbidden_label_changes(&json!({}), &old),
            vec!["node-role.kubernetes.io/worker"]
        );
    }

    /// A kubelet cannot opt its node out of nodegate: setting, changing or
    /// removing the exclude label is refused on update, and carrying it is
    /// refused on create (`old` is `Null`), whatever the value. Left as it
    /// is, it is no change, so an admin's label does not block the kubelet's
    /// own writes.
    #[test]
    fn the_exclude_label_is_out_of_a_kubelets_reach() {
        let labels = |l: Value| json!({"metadata": {"labels": l}});
        let none = labels(json!({}));
        let set = labels(json!({EXCLUDE: "true"}));
        let off = labels(json!({EXCLUDE: "false"}));
        let old_label = labels(json!({"nodegate.dev/exclude": "true"}));
        let with_more = labels(json!({EXCLUDE: "true", "example.com/a": "b"}));
        // (what, new object, old object or Null for a create, refused keys)
        let table: Vec<(&str, &Value, Value, Vec<&str>)> = vec![
            ("create carrying it", &set, Value::Null, vec![EXCLUDE]),
            (
                "create carrying it as false",
                &off,
                Value::Null,
                vec![EXCLUDE],
            ),
            ("create with the old label", &old_label, Value::Null, vec![]),
            ("update adding it", &set, none.clone(), vec![EXCLUDE]),
            (
                "update changing its value",
                &off,
                set.clone(),
                vec![EXCLUDE],
            ),
            ("update removing it", &none, set.clone(), vec![EXCLUDE]),
            (
                "update adding the old label",
                &old_label,
                none.clone(),
                vec![],
            ),
            ("update keeping it", &with_more, set.clone(), vec![]),
        ];
        for (what, new, old, want) in table {
            assert_eq!(forbidden_label_changes(new, &old), want, "{what}");
        }
    }
}
