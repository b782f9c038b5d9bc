//! Node writes as the API server's audit log records them
//! (`$NODEGATE_REAL_NODES_DIR/log/audit.log`, whose policy the cluster
//! script writes: every create, update and patch of `nodes` and
//! `nodes/status`, with its user): who wrote a node, how often, and with
//! which answer.

use k8s_openapi::jiff::Timestamp;

use super::harness::Harness;

/// The extra a pod-bound ServiceAccount token carries: the pod it is bound to.
const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";

/// One Node write, as the audit log's `ResponseComplete` event has it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeWrite {
    /// When the API server received it.
    pub at: Timestamp,
    pub node: String,
    pub user: String,
    /// The pod a pod-bound token was bound to (an agent's pod, say).
    pub pod: Option<String>,
    /// `create`, `update` or `patch`.
    pub verb: String,
    /// `status` for a status write.
    pub subresource: Option<String>,
    pub code: u16,
}

impl NodeWrite {
    /// Stored: the API server answered 2xx.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.code)
    }

    /// An update or a patch (not the kubelet's registration).
    pub fn is_change(&self) -> bool {
        matches!(self.verb.as_str(), "update" | "patch")
    }
}

/// Every write of a node in `nodes` received in `[from, to]`, in the log's
/// order.
pub fn node_writes(h: &Harness, nodes: &[&str], from: Timestamp, to: Timestamp) -> Vec<NodeWrite> {
    let log = std::fs::read_to_string(h.state.join("log/audit.log")).unwrap_or_default();
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|e| parse(&e))
        .filter(|w| nodes.contains(&w.node.as_str()) && w.at >= from && w.at <= to)
        .collect()
}

/// A Node write from one audit event, if it is one.
fn parse(e: &serde_json::Value) -> Option<NodeWrite> {
    if e["stage"] != "ResponseComplete" || e["objectRef"]["resource"] != "nodes" {
        return None;
    }
    let verb = e["verb"].as_str()?;
    if !matches!(verb, "create" | "update" | "patch") {
        return None;
    }
    Some(NodeWrite {
        at: e["requestReceivedTimestamp"].as_str()?.parse().ok()?,
        node: e["objectRef"]["name"].as_str()?.to_string(),
        user: e["user"]["username"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        pod: e["user"]["extra"][POD_NAME_EXTRA][0]
            .as_str()
            .map(str::to_string),
        verb: verb.to_string(),
        subresource: e["objectRef"]["subresource"].as_str().map(str::to_string),
        code: e["responseStatus"]["code"]
            .as_u64()
            .and_then(|c| u16::try_from(c).ok())
            .unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_patch_names_its_user_pod_and_answer() {
        let e = serde_json::json!({
            "stage": "ResponseComplete",
            "verb": "patch",
            "requestReceivedTimestamp": "2026-11-29T13:00:00.123456Z",
            "objectRef": {"resource": "nodes", "name": "node5"},
            "user": {
                "username": "system:serviceaccount:nodegate:nodegate-agent",
                "extra": {POD_NAME_EXTRA: ["nodegate-agent-abcde"]}
            },
            "responseStatus": {"code": 200}
        });
        let w = parse(&e).expect("a Node write");
        assert_eq!(w.node, "node5");
        assert_eq!(w.pod.as_deref(), Some("nodegate-agent-abcde"));
        assert!(w.ok() && w.is_change());
        assert_eq!(w.subresource, None);
        let status = serde_json::json!({
            "stage": "ResponseComplete",
            "verb": "patch",
            "requestReceivedTimestamp": "2026-11-29T13:00:00Z",
            "objectRef": {"resource": "nodes", "name": "node5", "subresource": "status"},
            "user": {"username": "system:node:node5"},
            "responseStatus": {"code": 422}
        });
        let s = parse(&status).expect("a status write");
        assert_eq!(s.subresource.as_deref(), Some("status"));
        assert!(!s.ok());
        let other = serde_json::json!({
            "stage": "ResponseComplete",
            "verb": "get",
            "requestReceivedTimestamp": "2026-11-29T13:00:00Z",
            "objectRef": {"resource": "nodes", "name": "node5"},
        });
        assert_eq!(parse(&other), None);
    }
}
