//! The AdmissionReview an attacker posts to a webhook replica: what the API
//! server would send for a kubelet's Node create or status write, claiming a
//! new boot of a node that is ready. Shared by the emulator suite and the
//! real-node scenarios, so both forge the same request.

use serde_json::{Value, json};

/// A review of `node` (a stored Node as JSON) claiming boot `boot`: its
/// kubelet's create (a re-registration), or with `status_write` its
/// `nodes/status` update.
pub fn review(node: &Value, boot: &str, status_write: bool) -> Value {
    let name = node["metadata"]["name"].as_str().unwrap_or_default();
    let mut forged = node.clone();
    forged["status"]["nodeInfo"]["bootID"] = json!(boot);
    let mut request = json!({
        "uid": format!("forged-{boot}-{status_write}"),
        "kind": {"group": "", "version": "v1", "kind": "Node"},
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "requestKind": {"group": "", "version": "v1", "kind": "Node"},
        "requestResource": {"group": "", "version": "v1", "resource": "nodes"},
        "name": name,
        "operation": if status_write { "UPDATE" } else { "CREATE" },
        "userInfo": {"username": format!("system:node:{name}"), "groups": ["system:nodes", "system:authenticated"]},
        "object": forged,
        "oldObject": if status_write { node.clone() } else { Value::Null },
        "dryRun": false,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": if status_write { "UpdateOptions" } else { "CreateOptions" }},
    });
    if status_write {
        request["subResource"] = json!("status");
        request["requestSubResource"] = json!("status");
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// What a user who may create Nodes sends to make a stored Node look
/// rebooted: a copy of `node` (a stored Node as JSON) with boot ID `boot`,
/// without the fields the API server sets, ready to create (the API server
/// answers AlreadyExists, after mutating admission has run).
pub fn copy_with_boot(node: &Value, boot: &str) -> Value {
    let mut copy = node.clone();
    copy["status"]["nodeInfo"]["bootID"] = json!(boot);
    if let Some(meta) = copy["metadata"].as_object_mut() {
        for field in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
        ] {
            meta.remove(field);
        }
    }
    copy
}

/// The paths a forger tries: the one the shipped configuration names
/// before the token patch, the root, and a guessed token.
pub const PATHS: [&str; 3] = [
    "/mutate",
    "/",
    "/mutate/00000000000000000000000000000000000000000000000a",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forged_create_claims_the_new_boot_as_the_nodes_kubelet() {
        let node = json!({"metadata": {"name": "n1"}, "status": {"nodeInfo": {"bootID": "b1"}}});
        let r = review(&node, "forged", false);
        assert_eq!(r["request"]["operation"], "CREATE");
        assert_eq!(r["request"]["userInfo"]["username"], "system:node:n1");
        assert_eq!(
            r["request"]["object"]["status"]["nodeInfo"]["bootID"],
            "forged"
        );
        assert!(r["request"]["oldObject"].is_null());
        let stored = json!({"metadata": {"name": "n1", "uid": "u", "resourceVersion": "7"},
                            "status": {"nodeInfo": {"bootID": "b1"}}});
        let copy = copy_with_boot(&stored, "b2");
        assert_eq!(
            copy,
            json!({"metadata": {"name": "n1"}, "status": {"nodeInfo": {"bootID": "b2"}}})
        );
        let s = review(&node, "forged", true);
        assert_eq!(s["request"]["subResource"], "status");
        assert_eq!(
            s["request"]["oldObject"]["status"]["nodeInfo"]["bootID"],
            "b1"
        );
    }
}
