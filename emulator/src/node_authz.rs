//! The Node authorizer for kubelets (`system:node:<name>`), as kube-apiserver
//! runs it in front of RBAC (`--authorization-mode=Node,RBAC`).
//!
//! Upstream: `plugin/pkg/auth/authorizer/node/node_authorizer.go`
//! (`authorizeNode`, `authorizePod`; other types are checked against the
//! static `NodeRules` of `plugin/pkg/auth/authorizer/rbac/bootstrappolicy`).
//! Its "no opinion" falls through to RBAC, where the `system:nodes` group is
//! bound to nothing, so it is a denial.

/// What the authorizer sees of a kubelet's request.
#[derive(Debug, Clone)]
pub struct NodeRequest<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    /// The object's name; for list/watch the `metadata.name` field selector
    /// (`requestinfo.go` sets the name from it).
    pub name: &'a str,
    /// `spec.nodeName=` of a pods list/watch field selector.
    pub pod_node_selector: Option<&'a str>,
    /// For a single pod: the node it is bound to (the authorizer's graph edge).
    pub pod_bound_to: Option<&'a str>,
}

/// `Ok` or the reason (empty when upstream gives none).
pub fn authorize(node: &str, r: &NodeRequest<'_>) -> Result<(), String> {
    let allow = |ok: bool, why: String| if ok { Ok(()) } else { Err(why) };
    match (r.group, r.resource, r.subresource) {
        ("", "nodes", "") => match r.verb {
            // NodeRestriction limits these to the node's own object.
            "create" | "update" | "patch" => Ok(()),
            "get" | "list" | "watch" => match r.name {
                n if n == node => Ok(()),
                "" => Err(format!(
                    "node '{node}' cannot read all nodes, only its own Node object"
                )),
                other => Err(format!(
                    "node '{node}' cannot read '{other}', only its own Node object"
                )),
            },
            _ => Err(String::new()),
        },
        ("", "nodes", "status") => allow(matches!(r.verb, "update" | "patch"), String::new()),
        ("", "pods", "") => match r.verb {
            "get" => allow(
                r.pod_bound_to == Some(node),
                format!("no relationship found between node '{node}' and this object"),
            ),
            "list" | "watch" => allow(
                r.pod_node_selector == Some(node),
                "can only list/watch pods with spec.nodeName field selector".into(),
            ),
            "create" | "delete" => Ok(()),
            _ => Err(String::new()),
        },
        ("", "pods", "status") => allow(matches!(r.verb, "update" | "patch"), String::new()),
        // NodeRules (bootstrappolicy): events and node leases.
        ("", "events", "") | ("events.k8s.io", "events", "") => allow(
            matches!(r.verb, "create" | "update" | "patch"),
            String::new(),
        ),
        ("coordination.k8s.io", "leases", "") => Ok(()),
        _ => Err(String::new()),
    }
}

/// kube-apiserver's Forbidden wording for a denied kubelet request.
pub fn denial(user: &str, r: &NodeRequest<'_>, namespace: &str, why: &str) -> String {
    let res = if r.subresource.is_empty() {
        r.resource.to_string()
    } else {
        format!("{}/{}", r.resource, r.subresource)
    };
    let scope = if namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{namespace}\"")
    };
    let mut msg = format!(
        "User \"{user}\" cannot {} resource \"{res}\" in API group \"{}\" {scope}",
        r.verb, r.group
    );
    if !why.is_empty() {
        msg.push_str(": ");
        msg.push_str(why);
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(verb: &'a str, resource: &'a str, sub: &'a str, name: &'a str) -> NodeRequest<'a> {
        NodeRequest {
            verb,
            group: "",
            resource,
            subresource: sub,
            name,
            pod_node_selector: None,
            pod_bound_to: None,
        }
    }

    #[test]
    fn kubelet_reads_only_its_own_node_and_never_status() {
        assert!(authorize("a", &req("get", "nodes", "", "a")).is_ok());
        assert!(authorize("a", &req("watch", "nodes", "", "a")).is_ok());
        let e = authorize("a", &req("get", "nodes", "", "b")).unwrap_err();
        assert_eq!(e, "node 'a' cannot read 'b', only its own Node object");
        assert!(authorize("a", &req("list", "nodes", "", "")).is_err());
        assert!(authorize("a", &req("get", "nodes", "status", "a")).is_err());
        assert!(authorize("a", &req("patch", "nodes", "status", "a")).is_ok());
        // Writes to other nodes pass here; NodeRestriction refuses them.
        assert!(authorize("a", &req("patch", "nodes", "", "b")).is_ok());
        assert!(authorize("a", &req("delete", "nodes", "", "a")).is_err());
    }

    #[test]
    fn pods_by_binding() {
        let mut r = req("list", "pods", "", "");
        assert!(authorize("a", &r).is_err());
        r.pod_node_selector = Some("a");
        assert!(authorize("a", &r).is_ok());
        let mut g = req("get", "pods", "", "p");
        g.pod_bound_to = Some("b");
        assert!(authorize("a", &g).is_err());
        g.pod_bound_to = Some("a");
        assert!(authorize("a", &g).is_ok());
        assert!(authorize("a", &req("create", "secrets", "", "s")).is_err());
    }
}
