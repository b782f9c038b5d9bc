//! RBAC authorization from the project's own ClusterRoles/Roles and their
//! bindings, so end-to-end tests catch a manifest that grants too little.
//!
//! Built-in identities keep the access the real cluster's built-in policy
//! gives them: `system:masters` (admin), the scheduler and the node
//! controller. Kubelets never reach RBAC here: the Node authorizer
//! (`node_authz`) decides for them.
//!
//! Follows `plugin/pkg/auth/authorizer/rbac/rbac.go` (`RBACAuthorizer.Authorize`,
//! `RuleAllows`) and `pkg/apis/rbac/v1/evaluation_helpers.go` (`VerbMatches`,
//! `ResourceMatches`, `ResourceNameMatches`).

use serde_json::Value;

use crate::users;

/// A request as the authorizer sees it.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub user: &'a str,
    pub verb: &'a str,
    pub group: &'a str,
    /// `nodes` or `nodes/status`.
    pub resource: String,
    pub namespace: &'a str,
    pub name: Option<&'a str>,
}

#[derive(Debug, Clone)]
struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    names: Vec<String>,
}

#[derive(Debug, Clone)]
struct Grant {
    /// `None`: cluster-wide (ClusterRoleBinding); `Some(ns)`: that namespace only.
    namespace: Option<String>,
    subjects: Vec<(String, String)>,
    rules: Vec<Rule>,
}

/// The loaded policy.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    grants: Vec<Grant>,
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

fn rules_of(role: &Value) -> Vec<Rule> {
    role.get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| Rule {
            groups: strings(r, "apiGroups"),
            resources: strings(r, "resources"),
            verbs: strings(r, "verbs"),
            names: strings(r, "resourceNames"),
        })
        .collect()
}

fn name_of(v: &Value) -> &str {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn ns_of(v: &Value) -> &str {
    v.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default")
}

impl Policy {
    /// From parsed documents: ClusterRoles, Roles and their bindings (others ignored).
    pub fn from_documents(docs: &[Value]) -> anyhow::Result<Policy> {
        let kind = |d: &Value| {
            d.get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let mut grants = Vec::new();
        for b in docs
            .iter()
            .filter(|d| matches!(kind(d).as_str(), "ClusterRoleBinding" | "RoleBinding"))
        {
            let role_kind = b
                .pointer("/roleRef/kind")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let role_name = b
                .pointer("/roleRef/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let binding_ns = (kind(b) == "RoleBinding").then(|| ns_of(b).to_string());
            let role = docs.iter().find(|d| {
                kind(d) == role_kind
                    && name_of(d) == role_name
                    && (role_kind == "ClusterRole" || Some(ns_of(d).to_string()) == binding_ns)
            });
            let role = role.ok_or_else(|| {
                anyhow::anyhow!(
                    "{} {} refers to missing {role_kind} {role_name}",
                    kind(b),
                    name_of(b)
                )
            })?;
            let subjects = b
                .get("subjects")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|s| {
                    let k = s.get("kind").and_then(Value::as_str).unwrap_or_default();
                    let n = s.get("name").and_then(Value::as_str).unwrap_or_default();
                    match k {
                        "ServiceAccount" => (
                            "User".to_string(),
                            format!(
                                "system:serviceaccount:{}:{n}",
                                s.get("namespace")
                                    .and_then(Value::as_str)
                                    .unwrap_or_else(|| ns_of(b))
                            ),
                        ),
                        other => (other.to_string(), n.to_string()),
                    }
                })
                .collect();
            grants.push(Grant {
                namespace: binding_ns,
                subjects,
                rules: rules_of(role),
            });
        }
        Ok(Policy { grants })
    }

    fn builtin(user: &str) -> bool {
        user == users::ADMIN || user == users::SCHEDULER || user == users::NODE_CONTROLLER
    }

    /// `Ok` or the Forbidden reason, as kube-apiserver words it.
    pub fn authorize(&self, r: &Request<'_>) -> Result<(), String> {
        if Self::builtin(r.user) {
            return Ok(());
        }
        let groups: Vec<String> = users::groups(r.user);
        let (res, sub) = r
            .resource
            .split_once('/')
            .unwrap_or((r.resource.as_str(), ""));
        let allowed = self.grants.iter().any(|g| {
            let scope_ok = g.namespace.as_deref().is_none_or(|ns| ns == r.namespace);
            let subject_ok = g.subjects.iter().any(|(k, n)| match k.as_str() {
                "User" => n == r.user,
                "Group" => groups.contains(n),
                _ => false,
            });
            scope_ok
                && subject_ok
                && g.rules.iter().any(|rule| {
                    let any = |l: &[String], v: &str| l.iter().any(|x| x == "*" || x == v);
                    let res_ok = rule.resources.iter().any(|x| {
                        x == "*"
                            || *x == r.resource
                            || (!sub.is_empty() && x.strip_prefix("*/") == Some(sub))
                    });
                    let name_ok = rule.names.is_empty()
                        || r.name.is_some_and(|n| rule.names.iter().any(|x| x == n));
                    any(&rule.groups, r.group)
                        && any(&rule.verbs, r.verb)
                        && res_ok
                        && name_ok
                        && !res.is_empty()
                })
        });
        if allowed {
            return Ok(());
        }
        let scope = if r.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace \"{}\"", r.namespace)
        };
        Err(format!(
            "User \"{}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
            r.user, r.verb, r.resource, r.group
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy() -> Policy {
        Policy::from_documents(&[
            json!({"kind": "ClusterRole", "metadata": {"name": "r"},
                   "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "b"},
                   "roleRef": {"kind": "ClusterRole", "name": "r"},
                   "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}]}),
            json!({"kind": "Role", "metadata": {"name": "ev", "namespace": "default"},
                   "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]}),
            json!({"kind": "RoleBinding", "metadata": {"name": "evb", "namespace": "default"},
                   "roleRef": {"kind": "Role", "name": "ev"},
                   "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}]}),
        ])
        .unwrap()
    }

    fn req<'a>(verb: &'a str, resource: &str, ns: &'a str) -> Request<'a> {
        Request {
            user: "system:serviceaccount:ns:sa",
            verb,
            group: "",
            resource: resource.into(),
            namespace: ns,
            name: Some("x"),
        }
    }

    #[test]
    fn grants_and_denials() {
        let p = policy();
        assert!(p.authorize(&req("patch", "nodes", "")).is_ok());
        assert!(p.authorize(&req("list", "nodes", "")).is_err());
        assert!(p.authorize(&req("patch", "nodes/status", "")).is_err());
        assert!(p.authorize(&req("create", "events", "default")).is_ok());
        let e = p
            .authorize(&req("create", "events", "kube-system"))
            .unwrap_err();
        assert!(e.contains("cannot create resource \"events\" in API group \"\" in the namespace \"kube-system\""), "{e}");
        let admin = Request {
            user: users::ADMIN,
            ..req("delete", "nodes", "")
        };
        assert!(p.authorize(&admin).is_ok());
        assert!(
            Policy::from_documents(&[
                json!({"kind": "ClusterRoleBinding", "metadata": {"name": "b"},
            "roleRef": {"kind": "ClusterRole", "name": "missing"}})
            ])
            .is_err()
        );
    }
}
