//! A namespace editor: the intruder of the roster's attacks.

/// A Role with every verb on ConfigMaps and Leases in `ns`, bound to the
/// user `user`: a namespace editor, or any workload holding such rights.
pub fn editor_rbac(user: &str, ns: &str) -> String {
    format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: {user}, namespace: {ns}}}
rules:
  - apiGroups: [""]
    resources: [configmaps]
    verbs: ["*"]
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    verbs: ["*"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {user}, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {user}}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: {user}}}]
"#
    )
}
