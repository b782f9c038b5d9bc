//! nodegate's writes of Nodes in a scenario, per node, from the API
//! server's audit log (the harness's policy logs nodegate's ServiceAccounts
//! only, at Metadata: who, which Node, the answer's code and both
//! timestamps): how many each node's join or reboot cost, by the agent and
//! by the webhook, and how long the API server took over each agent patch,
//! beside its own latency for every writer's Node patches in the same
//! window.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use k8s_openapi::jiff::Timestamp;

use super::{Report, percentile};

/// What [`crate::scale::fleet::CRASH_POLICY`] answers.
const CRASHED_MESSAGE: &str = "the node crashed (scale harness)";

/// One write of a Node (its main resource) by nodegate.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct NodeWrite {
    /// `nodegate-agent` or `nodegate-webhook`.
    pub user: String,
    pub node: String,
    pub code: u16,
    pub at: Timestamp,
    /// From the request's arrival to its answer, as the API server logs it.
    pub took_ms: f64,
    /// The token's `credential-id` (`JTI=…`).
    pub credential: Option<String>,
    /// Refused because its agent's node had crashed
    /// ([`crate::scale::fleet::CRASH_POLICY`]): a dead agent's write.
    pub crashed: bool,
}

impl NodeWrite {
    fn ok(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

/// nodegate's writes (patch, update) of Nodes received in `[from, to)`, in
/// the log's order. A write refused for any reason with a token the crash
/// policy refused is a dead agent's too (a failed `test` is refused before
/// admission).
pub(super) fn node_writes(path: &Path, from: Timestamp, to: Timestamp) -> Vec<NodeWrite> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let mut writes: Vec<NodeWrite> = text
        .lines()
        .filter_map(|l| parse(l).filter(|w| w.at >= from && w.at < to))
        .collect();
    mark_crashed(&mut writes);
    writes
}

/// Every refused write made with a credential the crash policy refused once.
fn mark_crashed(writes: &mut [NodeWrite]) {
    let dead: HashSet<String> = writes
        .iter()
        .filter(|w| w.crashed)
        .filter_map(|w| w.credential.clone())
        .collect();
    for w in writes.iter_mut() {
        if !w.ok() && w.credential.as_ref().is_some_and(|c| dead.contains(c)) {
            w.crashed = true;
        }
    }
}

/// One audit event, if it is a completed write of a Node by nodegate.
fn parse(line: &str) -> Option<NodeWrite> {
    let ev: serde_json::Value = serde_json::from_str(line).ok()?;
    let verb = ev["verb"].as_str()?;
    if ev["stage"].as_str() != Some("ResponseComplete")
        || !matches!(verb, "patch" | "update")
        || ev["objectRef"]["resource"].as_str() != Some("nodes")
        || ev["objectRef"]["subresource"].as_str().is_some()
    {
        return None;
    }
    let user = ev["user"]["username"]
        .as_str()?
        .strip_prefix("system:serviceaccount:nodegate:")?
        .to_string();
    let at: Timestamp = ev["requestReceivedTimestamp"].as_str()?.parse().ok()?;
    let done: Timestamp = ev["stageTimestamp"].as_str()?.parse().ok()?;
    let crashed = ev["responseStatus"]["message"]
        .as_str()
        .is_some_and(|m| m.contains(CRASHED_MESSAGE));
    Some(NodeWrite {
        user,
        node: ev["objectRef"]["name"].as_str()?.to_string(),
        code: u16::try_from(ev["responseStatus"]["code"].as_u64()?).ok()?,
        at,
        took_ms: (done.as_microsecond() - at.as_microsecond()) as f64 / 1000.0,
        credential: ev["user"]["extra"]["authentication.kubernetes.io/credential-id"][0]
            .as_str()
            .map(str::to_string),
        crashed,
    })
}

/// Per node of a scenario: its writes by each of nodegate's users.
#[derive(Debug, Default)]
pub(super) struct PerNode {
    /// Successful agent writes, each node's count.
    pub agent: BTreeMap<String, usize>,
    pub webhook: BTreeMap<String, usize>,
    /// Agent writes refused (a failed `test`, a conflict) or failed.
    pub agent_refused: usize,
    /// Writes of agents whose node had crashed, refused: the shutdown of an
    /// agent task when the harness drops it ([`crate::scale::fleet::CRASH_POLICY`]).
    pub crashed_refused: usize,
    /// The API server's time for each successful agent write; for the last
    /// per node (the ready patch, the one with the bootID).
    pub agent_ms: Vec<f64>,
    pub ready_ms: Vec<f64>,
}

pub(super) fn per_node(writes: &[NodeWrite], nodes: &[String]) -> PerNode {
    let wanted: HashSet<&str> = nodes.iter().map(String::as_str).collect();
    let mut p = PerNode::default();
    let mut last: BTreeMap<&str, f64> = BTreeMap::new();
    for w in writes.iter().filter(|w| wanted.contains(w.node.as_str())) {
        match (w.user.as_str(), w.ok()) {
            ("nodegate-agent", true) => {
                *p.agent.entry(w.node.clone()).or_default() += 1;
                p.agent_ms.push(w.took_ms);
                last.insert(&w.node, w.took_ms);
            }
            ("nodegate-agent", false) if w.crashed => p.crashed_refused += 1,
            ("nodegate-agent", false) => p.agent_refused += 1,
            ("nodegate-webhook", true) => *p.webhook.entry(w.node.clone()).or_default() += 1,
            _ => {}
        }
    }
    p.ready_ms = last.into_values().collect();
    p
}

/// What the goals need: the most writes one node's agent made.
pub(super) struct WriteOutcome {
    pub agent_max: usize,
}

/// `<prefix>_…` figures of the writes of `nodes` (one join or reboot
/// each) in `[from, to)`; `api` is the API server's own PATCH nodes p50 and
/// p99 (ms) in the same window, every writer's.
pub(super) fn write_figures(
    r: &mut Report,
    prefix: &str,
    audit_log: &Path,
    (from, to): (Timestamp, Timestamp),
    nodes: &[String],
    api: (f64, f64),
) -> WriteOutcome {
    let writes = node_writes(audit_log, from, to);
    let p = per_node(&writes, nodes);
    let n = nodes.len().max(1) as f64;
    let agent: usize = p.agent.values().sum();
    let webhook: usize = p.webhook.values().sum();
    let mut by_count: BTreeMap<usize, usize> = BTreeMap::new();
    for node in nodes {
        *by_count
            .entry(p.agent.get(node).copied().unwrap_or(0))
            .or_default() += 1;
    }
    let by_count: Vec<String> = by_count.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    r.figure(
        &format!("{prefix}_agent_node_writes_per_node"),
        format!("{:.2}", agent as f64 / n),
    );
    // "writes:nodes", e.g. 3:998,2:2.
    r.figure(
        &format!("{prefix}_agent_node_writes_by_count"),
        by_count.join(","),
    );
    let agent_max = p.agent.values().copied().max().unwrap_or(0);
    r.figure(&format!("{prefix}_agent_node_writes_max"), agent_max);
    r.figure(
        &format!("{prefix}_agent_node_writes_refused"),
        p.agent_refused,
    );
    r.figure(
        &format!("{prefix}_crashed_agent_node_writes_refused"),
        p.crashed_refused,
    );
    r.figure(
        &format!("{prefix}_webhook_node_writes_per_node"),
        format!("{:.2}", webhook as f64 / n),
    );
    r.figure(
        &format!("{prefix}_nodegate_node_writes_per_node"),
        format!("{:.2}", (agent + webhook) as f64 / n),
    );
    let (mut all, mut ready) = (p.agent_ms, p.ready_ms);
    for (what, v) in [("agent_patch", &mut all), ("agent_ready_patch", &mut ready)] {
        let (p50, p99) = (percentile(v, 0.5), percentile(v, 0.99));
        r.figure(&format!("{prefix}_{what}_p50_ms"), format!("{p50:.0}"));
        r.figure(&format!("{prefix}_{what}_p99_ms"), format!("{p99:.0}"));
        r.figure(
            &format!("{prefix}_{what}_over_apiserver_p50"),
            format!("{:.2}", p50 / api.0),
        );
        r.figure(
            &format!("{prefix}_{what}_over_apiserver_p99"),
            format!("{:.2}", p99 / api.1),
        );
    }
    WriteOutcome { agent_max }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(user: &str, verb: &str, sub: Option<&str>, node: &str, code: u16, ms: u32) -> String {
        let mut ev = serde_json::json!({
            "stage": "ResponseComplete", "verb": verb,
            "user": {"username": format!("system:serviceaccount:nodegate:{user}"),
                     "extra": {"authentication.kubernetes.io/credential-id": [format!("JTI={node}")]}},
            "objectRef": {"resource": "nodes", "name": node},
            "responseStatus": {"code": code},
            "requestReceivedTimestamp": "2026-01-01T00:00:01.000000Z",
            "stageTimestamp": format!("2026-01-01T00:00:01.{:03}000Z", ms),
        });
        if let Some(s) = sub {
            ev["objectRef"]["subresource"] = s.into();
        }
        ev.to_string()
    }

    #[test]
    fn each_nodes_writes_by_the_agent_and_the_webhook_and_the_last_agent_patch() {
        let lines = [
            event("nodegate-agent", "patch", None, "n1", 200, 10),
            event("nodegate-agent", "patch", None, "n1", 422, 5),
            event("nodegate-agent", "patch", None, "n1", 200, 30),
            event("nodegate-agent", "patch", Some("status"), "n1", 200, 1),
            event("nodegate-agent", "get", None, "n1", 200, 1),
            event("nodegate-webhook", "patch", None, "n2", 200, 7),
            event("nodegate-agent", "patch", None, "n2", 200, 20),
            event("nodegate-agent", "patch", None, "other", 200, 20),
            {
                let mut ev: serde_json::Value =
                    serde_json::from_str(&event("nodegate-agent", "patch", None, "n2", 403, 2))
                        .unwrap();
                ev["responseStatus"]["message"] =
                    format!("denied request: {CRASHED_MESSAGE}").into();
                ev.to_string()
            },
        ];
        let mut lines = lines.to_vec();
        // A failed `test` with the dead token: refused before admission.
        lines.push(event("nodegate-agent", "patch", None, "n2", 422, 3));
        let mut writes: Vec<NodeWrite> = lines.iter().filter_map(|l| parse(l)).collect();
        mark_crashed(&mut writes);
        assert_eq!(
            writes.len(),
            8,
            "gets and status writes are not Node writes"
        );
        let p = per_node(&writes, &["n1".into(), "n2".into()]);
        assert_eq!(p.agent.get("n1"), Some(&2));
        assert_eq!(p.agent.get("n2"), Some(&1));
        assert_eq!(p.webhook.get("n2"), Some(&1));
        assert_eq!((p.agent_refused, p.crashed_refused), (1, 2));
        assert_eq!(p.agent_ms, [10.0, 30.0, 20.0]);
        assert_eq!(p.ready_ms, [30.0, 20.0], "the last of each node, by name");
    }
}
