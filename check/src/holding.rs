//! One line per gate, `gate <name> (<taint>)`: why is this node gated?
//! How many nodes each gate holds, and:
//!
//! - for a gate nodegate's agent opens, which node it has held longest,
//!   since when, and which probe fails there, from the newest
//!   `NodegateGateHeld` Event of each held node (the agent records one once
//!   a gate has held its node 60 s, and again every 10 min while it still
//!   does); a node held longer than `--gate-held-warn-after` warns, naming
//!   up to five;
//! - for a gate owned elsewhere, whether its owner DaemonSet exists,
//!   tolerates the gate, and runs a Pod on every node the gate holds: a
//!   node without one stays gated, since nothing else removes the taint.
//!
//! [`verdict`] decides from what was read; [`check`] only reads: the Nodes
//! (read once for this and the released taints), one list of the Events in
//! `default` (only when a gate nodegate opens holds a node), and per owner
//! one get of its DaemonSet and one list of its Pods (only when its gate
//! holds a node).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ListParams};
use nodegate_shared::TaintSpec;
use nodegate_shared::gates::Gate;

use crate::gates::Declaration;
use crate::karpenter::tolerates;
use crate::read::{NodeTaints, Nodes, Read, list_paged};
use crate::report::{Line, Report, Status};

/// The line when the agent's gates cannot be read at all.
pub const CHECK: &str = "gates";
/// The Event the agent records on a node a gate holds.
pub const HELD_REASON: &str = "NodegateGateHeld";
/// Where the agent records its Events about Nodes.
pub const EVENTS_NAMESPACE: &str = "default";
/// `--gate-held-warn-after`'s default.
pub const DEFAULT_WARN_AFTER: Duration = Duration::from_secs(10 * 60);
/// The agent records a held node again every 10 min: an Event not renewed
/// for longer describes an earlier hold, or an agent that stopped.
const FRESH: Duration = Duration::from_secs(15 * 60);
/// Nodes named in one line, at most.
const LISTED: usize = 5;

/// The line of one gate.
pub fn check_name(g: &Gate) -> String {
    format!("gate {} ({})", g.name, g.taint.0)
}

/// One `NodegateGateHeld` Event, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub node: String,
    pub gate: String,
    /// The gate's taints as the Event writes them (comma-separated).
    pub taint: String,
    /// Since when the gate holds the node, on its current boot.
    pub since: Timestamp,
    /// `<probe> failed: <error>`.
    pub failing: String,
    /// When the agent recorded it.
    pub seen: Timestamp,
}

/// `gate <name> (<taint>) has held this node since <RFC 3339>: <probe>
/// failed: <error>`, as its parts: name, taint, since, what fails.
pub fn parse_message(m: &str) -> Option<(String, String, Timestamp, String)> {
    let rest = m.strip_prefix("gate ")?;
    let (name, rest) = rest.split_once(" (")?;
    let (taint, rest) = rest.split_once(") has held this node since ")?;
    let (since, failing) = rest.split_once(": ")?;
    let since = since.trim().parse::<Timestamp>().ok()?;
    Some((
        name.to_string(),
        taint.to_string(),
        since,
        failing.to_string(),
    ))
}

/// An Event as [`Held`], if it is one the agent wrote.
pub fn held_of(e: &Event) -> Option<Held> {
    if e.reason.as_deref() != Some(HELD_REASON) {
        return None;
    }
    let node = e.involved_object.name.clone()?;
    let (gate, taint, since, failing) = parse_message(e.message.as_deref()?)?;
    let seen = [
        e.last_timestamp.as_ref().map(|t| t.0),
        e.event_time.as_ref().map(|t| t.0),
        e.series
            .as_ref()
            .and_then(|s| s.last_observed_time.as_ref())
            .map(|t| t.0),
        e.first_timestamp.as_ref().map(|t| t.0),
        e.metadata.creation_timestamp.as_ref().map(|t| t.0),
    ]
    .into_iter()
    .flatten()
    .max()?;
    Some(Held {
        node,
        gate,
        taint,
        since,
        failing,
        seen,
    })
}

/// A Pod of an owner DaemonSet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerPod {
    pub node: String,
    pub ready: bool,
}

/// A Pod as [`OwnerPod`]: scheduled, and not finished.
pub fn owner_pod(p: &Pod) -> Option<OwnerPod> {
    let node = p.spec.as_ref()?.node_name.clone()?;
    let status = p.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    Some(OwnerPod { node, ready })
}

/// An owner DaemonSet as read.
#[derive(Debug, Clone, Default)]
pub struct Owner {
    /// Its Pod template's tolerations.
    pub tolerations: Vec<Toleration>,
    /// Its Pods; `None` when not listed (its gates hold no node).
    pub pods: Option<Result<Vec<OwnerPod>, String>>,
}

/// What [`verdict`] decides on.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub gates: &'a [Gate],
    pub nodes: &'a Result<Nodes, String>,
    /// The `NodegateGateHeld` Events; empty when not listed (no gate the
    /// agent opens holds a node).
    pub held: Result<Vec<Held>, String>,
    /// Each owner DaemonSet (`namespace/name`) as read.
    pub owners: BTreeMap<String, Read<Owner>>,
    pub now: Timestamp,
    pub warn_after: Duration,
}

/// The nodes carrying `g`'s taint (key and effect).
fn carrying<'a>(g: &Gate, nodes: &'a Nodes) -> Vec<&'a NodeTaints> {
    nodes
        .tainted
        .iter()
        .filter(|n| n.taints.iter().any(|t| g.taint.0.matches(t)))
        .collect()
}

/// Whether a gate nodegate opens holds a node: the Events are listed only
/// then.
pub fn any_held_by_agent(gates: &[Gate], nodes: &Nodes) -> bool {
    gates
        .iter()
        .filter(|g| g.owner.is_none())
        .any(|g| !carrying(g, nodes).is_empty())
}

/// The owners whose gates hold a node: their Pods are listed only then.
pub fn owners_holding(gates: &[Gate], nodes: &Nodes) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for g in gates {
        if let Some(o) = &g.owner
            && !carrying(g, nodes).is_empty()
            && !out.contains(&o.daemon_set)
        {
            out.push(o.daemon_set.clone());
        }
    }
    out
}

fn ago(now: Timestamp, t: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(t)).unwrap_or(Duration::ZERO)
}

fn shown(d: Duration) -> String {
    let m = d.as_secs() / 60;
    match m {
        0 => format!("{} s", d.as_secs()),
        1..120 => format!("{m} min"),
        120..2880 => format!("{} h {} min", m / 60, m % 60),
        _ => format!("{} d {} h", m / 1440, m % 1440 / 60),
    }
}

/// Up to [`LISTED`] of `items`, and how many more.
fn capped(items: &[String], sep: &str) -> String {
    let mut out = items
        .iter()
        .take(LISTED)
        .cloned()
        .collect::<Vec<_>>()
        .join(sep);
    if items.len() > LISTED {
        out.push_str(&format!("{sep}and {} more", items.len() - LISTED));
    }
    out
}

/// Whether an Event is about gate `g`: by one of its taints' key and
/// effect, else by name.
fn is_of(g: &Gate, h: &Held) -> bool {
    let taints: Result<Vec<TaintSpec>, _> = h.taint.split(',').map(str::parse).collect();
    match taints {
        Ok(t) => t
            .iter()
            .any(|t| t.key() == g.taint.0.key() && t.effect() == g.taint.0.effect()),
        Err(_) => h.gate == g.name,
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The line of a gate nodegate's agent opens.
fn opened(g: &Gate, nodes: &Nodes, i: &Inputs) -> (Status, String) {
    let held = carrying(g, nodes);
    let head = format!("holds {} of {} nodes", held.len(), nodes.total);
    if held.is_empty() {
        return (Status::Pass, head);
    }
    let events = match &i.held {
        Ok(e) => e,
        Err(e) => {
            return (
                Status::Warn,
                format!(
                    "{head}; cannot read Events in {EVENTS_NAMESPACE} ({e}): which probe holds them is not known; let nodegate-check list events there"
                ),
            );
        }
    };
    // The newest Event of this gate per node.
    let mut newest: HashMap<&str, &Held> = HashMap::new();
    for h in events.iter().filter(|h| is_of(g, h)) {
        let e = newest.entry(h.node.as_str()).or_insert(h);
        if h.seen > e.seen {
            *e = h;
        }
    }
    let mut reported: Vec<&Held> = Vec::new();
    let mut unreported: Vec<String> = Vec::new();
    for n in &held {
        match newest.get(n.name.as_str()) {
            Some(h) if ago(i.now, h.seen) <= FRESH => reported.push(h),
            _ => unreported.push(n.name.clone()),
        }
    }
    reported.sort_by(|a, b| (a.since, &a.node).cmp(&(b.since, &b.node)));
    let one = |h: &Held| {
        format!(
            "{} since {} ({}): {}",
            h.node,
            h.since,
            shown(ago(i.now, h.since)),
            h.failing
        )
    };
    let overdue: Vec<String> = reported
        .iter()
        .filter(|h| ago(i.now, h.since) >= i.warn_after)
        .map(|h| one(h))
        .collect();
    let mut parts = vec![head];
    if !overdue.is_empty() {
        parts.push(format!(
            "{} held longer than {}: {}",
            plural(overdue.len(), "node", "nodes"),
            shown(i.warn_after),
            capped(&overdue, "; ")
        ));
    } else if let Some(h) = reported.first() {
        parts.push(format!("oldest {}", one(h)));
    }
    if !unreported.is_empty() {
        parts.push(format!(
            "{} without a {HELD_REASON} Event in the last {} (held under 60 s, or no agent reports from there: see agent daemonset): {}",
            plural(unreported.len(), "node", "nodes"),
            shown(FRESH),
            capped(&unreported, ", ")
        ));
    }
    let status = if overdue.is_empty() {
        Status::Pass
    } else {
        Status::Warn
    };
    (status, parts.join("; "))
}

/// The line of a gate owned by the DaemonSet `at`.
fn owned(g: &Gate, at: &str, nodes: &Nodes, i: &Inputs) -> (Status, String) {
    let held = carrying(g, nodes);
    let taint = &g.taint.0;
    let now = format!("{} of {} nodes carry it now", held.len(), nodes.total);
    let owner = match i.owners.get(at) {
        Some(Read::Found(o)) => o,
        Some(Read::Unreadable(e)) => {
            return (
                Status::Warn,
                format!(
                    "cannot read DaemonSet {at}, its owner ({e}): cannot tell whether anything removes {taint} ({now})"
                ),
            );
        }
        Some(Read::Missing) | None => {
            return (
                Status::Warn,
                format!(
                    "its owner, DaemonSet {at}, does not exist: nodes will stay gated: nothing removes {taint} ({now})"
                ),
            );
        }
    };
    let k8s_taint = Taint {
        key: taint.key().to_string(),
        value: taint.value().map(str::to_string),
        effect: taint.effect().as_str().to_string(),
        time_added: None,
    };
    let untolerated = (!owner.tolerations.iter().any(|t| tolerates(t, &k8s_taint))).then(|| {
        format!(
            "its Pods do not tolerate {taint}, so none is scheduled on a new node the gate holds, and nothing removes it there: add the toleration to DaemonSet {at}"
        )
    });
    let head = format!("holds {} of {} nodes", held.len(), nodes.total);
    let with_note = |status: Status, detail: String| match &untolerated {
        Some(n) => (Status::Warn, format!("{detail}; {n}")),
        None => (status, detail),
    };
    if held.is_empty() {
        return with_note(Status::Pass, format!("{head}; owned by DaemonSet {at}"));
    }
    let pods = match &owner.pods {
        Some(Ok(p)) => p,
        Some(Err(e)) => {
            return (
                Status::Warn,
                format!(
                    "{head}; cannot read the Pods of DaemonSet {at}, its owner ({e}): cannot tell whether it runs on them"
                ),
            );
        }
        None => {
            return (
                Status::Warn,
                format!("{head}; the Pods of DaemonSet {at}, its owner, were not read"),
            );
        }
    };
    // Per node: whether any of the owner's Pods there is Ready.
    let mut on: HashMap<&str, bool> = HashMap::new();
    for p in pods {
        *on.entry(p.node.as_str()).or_default() |= p.ready;
    }
    let mut without = Vec::new();
    let mut not_ready = Vec::new();
    for n in &held {
        match on.get(n.name.as_str()) {
            None => without.push(n.name.clone()),
            Some(false) => not_ready.push(n.name.clone()),
            Some(true) => {}
        }
    }
    if !without.is_empty() {
        let who = match without.len() {
            1 => "1 node has".to_string(),
            n => format!("{n} nodes have"),
        };
        return with_note(
            Status::Warn,
            format!(
                "{head}; {who} no Pod of DaemonSet {at}, its owner, and will stay gated: {}",
                capped(&without, ", ")
            ),
        );
    }
    let mut detail = format!("{head}, each with a Pod of DaemonSet {at}, its owner");
    if !not_ready.is_empty() {
        detail.push_str(&format!(
            " ({} not Ready yet: {})",
            not_ready.len(),
            capped(&not_ready, ", ")
        ));
    }
    with_note(Status::Pass, detail)
}

/// One line per gate, in the declaration's order.
pub fn verdict(i: &Inputs) -> Vec<Line> {
    i.gates
        .iter()
        .map(|g| {
            let (status, detail) = match i.nodes {
                Err(e) => (
                    Status::Warn,
                    format!("cannot read Nodes ({e}): cannot tell which nodes it holds"),
                ),
                Ok(nodes) => match &g.owner {
                    None => opened(g, nodes, i),
                    Some(o) => owned(g, &o.daemon_set, nodes, i),
                },
            };
            Line::new(check_name(g), status, detail)
        })
        .collect()
}

/// A label selector as a list's `labelSelector` query.
pub fn selector_query(s: &LabelSelector) -> String {
    let mut parts: Vec<String> = s
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in s.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            _ => format!("!{}", e.key),
        });
    }
    parts.join(",")
}

/// The `NodegateGateHeld` Events, in one list.
async fn read_held(client: &Client) -> Result<Vec<Held>, String> {
    let api: Api<Event> = Api::namespaced(client.clone(), EVENTS_NAMESPACE);
    let lp =
        ListParams::default().fields(&format!("reason={HELD_REASON},involvedObject.kind=Node"));
    list_paged(&api, lp, |e| held_of(&e))
        .await
        .map_err(|e| e.to_string())
}

/// DaemonSet `at` (`namespace/name`), and its Pods when `pods`.
async fn read_owner(client: &Client, at: &str, pods: bool) -> Read<Owner> {
    let Some((ns, name)) = at.split_once('/') else {
        return Read::Missing;
    };
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    let ds = match Read::of(api.get_opt(name).await) {
        Read::Found(d) => d,
        Read::Missing => return Read::Missing,
        Read::Unreadable(e) => return Read::Unreadable(e),
    };
    let spec = ds.spec.unwrap_or_default();
    let tolerations = spec
        .template
        .spec
        .and_then(|p| p.tolerations)
        .unwrap_or_default();
    let pods = if pods {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let lp = ListParams::default().labels(&selector_query(&spec.selector));
        let listed = list_paged(&api, lp, |p| owner_pod(&p)).await;
        Some(listed.map_err(|e| e.to_string()))
    } else {
        None
    };
    Read::Found(Owner { tolerations, pods })
}

/// Reads what the gate lines need (see the module's header) and reports
/// [`verdict`]; `agent`: the declaration as read, `None` when it could not
/// be (the gates declaration line says why).
pub async fn check(
    client: &Client,
    agent: Option<&Declaration>,
    nodes: &Result<Nodes, String>,
    warn_after: Duration,
    report: &mut Report,
) {
    let Some(d) = agent else {
        report.add(
            CHECK,
            Status::Skip,
            "the agent's gates cannot be read (see gates declaration): cannot tell which nodes they hold",
        );
        return;
    };
    let gates = &d.gates.gates;
    let (held, holding) = match nodes {
        Ok(n) => {
            let held = if any_held_by_agent(gates, n) {
                read_held(client).await
            } else {
                Ok(Vec::new())
            };
            (held, owners_holding(gates, n))
        }
        Err(_) => (Ok(Vec::new()), Vec::new()),
    };
    let mut owners = BTreeMap::new();
    for g in gates {
        if let Some(o) = &g.owner
            && !owners.contains_key(&o.daemon_set)
        {
            let pods = holding.contains(&o.daemon_set);
            let read = read_owner(client, &o.daemon_set, pods).await;
            owners.insert(o.daemon_set.clone(), read);
        }
    }
    report.extend(verdict(&Inputs {
        gates,
        nodes,
        held,
        owners,
        now: Timestamp::now(),
        warn_after,
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::THREE_GATES;
    use nodegate_shared::gates::Gates;
    use serde_json::json;

    const CNI: &str = "nodegate.dev/agent-not-ready=true:NoSchedule";
    const DNS: &str = "example.com/dns-not-ready:NoSchedule";
    const EBS: &str = "ebs.csi.aws.com/agent-not-ready:NoExecute";
    const OWNER: &str = "kube-system/ebs-csi-node";
    const HTTP: &str = "http[0] http://127.0.0.1:9879/healthz failed: connection refused";

    fn now() -> Timestamp {
        "2025-06-01T12:00:00Z".parse().unwrap()
    }

    fn minutes_ago(m: i64) -> Timestamp {
        now() - k8s_openapi::jiff::SignedDuration::from_mins(m)
    }

    fn node(name: &str, taints: &[&str]) -> NodeTaints {
        NodeTaints {
            name: name.into(),
            taints: taints
                .iter()
                .map(|t| t.parse::<TaintSpec>().unwrap().to_json())
                .collect(),
            ..Default::default()
        }
    }

    /// `total` nodes, of which `tainted` carry taints.
    fn nodes(total: usize, tainted: Vec<NodeTaints>) -> Result<Nodes, String> {
        Ok(Nodes { total, tainted })
    }

    fn held(node: &str, gate: &str, taint: &str, since: i64, seen: i64) -> Held {
        Held {
            node: node.into(),
            gate: gate.into(),
            taint: taint.into(),
            since: minutes_ago(since),
            failing: HTTP.into(),
            seen: minutes_ago(seen),
        }
    }

    fn tolerating() -> Vec<Toleration> {
        vec![Toleration {
            key: Some("ebs.csi.aws.com/agent-not-ready".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }]
    }

    fn owner(pods: &[(&str, bool)]) -> Read<Owner> {
        Read::Found(Owner {
            tolerations: tolerating(),
            pods: Some(Ok(pods
                .iter()
                .map(|(n, ready)| OwnerPod {
                    node: n.to_string(),
                    ready: *ready,
                })
                .collect())),
        })
    }

    fn run(
        gates: &Gates,
        nodes: &Result<Nodes, String>,
        held: Result<Vec<Held>, String>,
        owner: Option<Read<Owner>>,
    ) -> Vec<(String, Status, String)> {
        verdict(&Inputs {
            gates: &gates.gates,
            nodes,
            held,
            owners: owner.map(|o| (OWNER.to_string(), o)).into_iter().collect(),
            now: now(),
            warn_after: DEFAULT_WARN_AFTER,
        })
        .into_iter()
        .map(|l| (l.check, l.status, l.detail))
        .collect()
    }

    fn three() -> Gates {
        Gates::parse(THREE_GATES).unwrap()
    }

    /// The three lines of a declaration of two gates the agent opens and
    /// one owned elsewhere: counts, the oldest held node from its newest
    /// Event, a node not reported, an owned gate's node without its owner.
    #[test]
    fn one_line_per_gate() {
        let n = nodes(
            6,
            vec![
                node("n1", &[CNI]),
                node("n2", &[CNI, EBS]),
                node("n3", &[DNS]),
                node("n4", &["example.com/unrelated:NoSchedule"]),
                node("n5", &[EBS]),
            ],
        );
        let events = vec![
            // n1's first Event and its renewal: the newest one counts.
            Held {
                failing: "tcp[0] 127.0.0.1:4240 failed: refused".into(),
                ..held("n1", "cni", CNI, 40, 35)
            },
            held("n1", "cni", CNI, 30, 2),
            // n2's hold of another boot is over; this one began 3 min ago.
            held("n2", "cni", CNI, 3, 1),
            // An Event of a gate the node no longer carries.
            held("n4", "cni", CNI, 50, 1),
        ];
        let got = run(&three(), &n, Ok(events), Some(owner(&[("n2", true)])));
        let since = minutes_ago(30);
        assert_eq!(
            got,
            vec![
                (
                    format!("gate cni ({CNI})"),
                    Status::Warn,
                    format!("holds 2 of 6 nodes; 1 node held longer than 10 min: n1 since {since} (30 min): {HTTP}"),
                ),
                (
                    format!("gate dns ({DNS})"),
                    Status::Pass,
                    "holds 1 of 6 nodes; 1 node without a NodegateGateHeld Event in the last 15 min (held under 60 s, or no agent reports from there: see agent daemonset): n3".into(),
                ),
                (
                    format!("gate ebs-csi ({EBS})"),
                    Status::Warn,
                    format!("holds 2 of 6 nodes; 1 node has no Pod of DaemonSet {OWNER}, its owner, and will stay gated: n5"),
                ),
            ]
        );
    }

    #[test]
    fn gates_nodegate_opens() {
        let cni = || {
            Gates::parse(&format!(
                "gates: [{{name: cni, taint: '{CNI}', probes: {{http: [x]}}}}]"
            ))
            .unwrap()
        };
        let line = |nodes: Result<Nodes, String>, held: Result<Vec<Held>, String>| {
            let mut l = run(&cni(), &nodes, held, None);
            assert_eq!(l.len(), 1);
            let (_, s, d) = l.remove(0);
            (s, d)
        };
        let many = |n: usize| -> Vec<NodeTaints> {
            (0..n).map(|i| node(&format!("n{i}"), &[CNI])).collect()
        };
        // Nothing held: no Event needed.
        assert_eq!(
            line(nodes(3, vec![]), Ok(vec![])),
            (Status::Pass, "holds 0 of 3 nodes".into())
        );
        // Held, none for long: the oldest, and what fails there.
        let (s, d) = line(
            nodes(3, many(2)),
            Ok(vec![
                held("n0", "cni", CNI, 2, 1),
                held("n1", "cni", CNI, 4, 1),
            ]),
        );
        assert_eq!(s, Status::Pass, "{d}");
        assert_eq!(
            d,
            format!(
                "holds 2 of 3 nodes; oldest n1 since {} (4 min): {HTTP}",
                minutes_ago(4)
            )
        );
        // 5,000 nodes: five named, oldest first, and how many more.
        let events: Vec<Held> = (0..5000)
            .map(|i| held(&format!("n{i}"), "cni", CNI, 20 + i as i64 % 7, 1))
            .collect();
        let (s, d) = line(nodes(5000, many(5000)), Ok(events));
        assert_eq!(s, Status::Warn);
        assert!(
            d.starts_with(
                "holds 5000 of 5000 nodes; 5000 nodes held longer than 10 min: n1000 since"
            ) && d.ends_with("; and 4995 more"),
            "{d}"
        );
        assert_eq!(d.matches(" since ").count(), 5, "{d}");
        // An Event not renewed for 15 min describes an earlier hold.
        let (s, d) = line(nodes(3, many(1)), Ok(vec![held("n0", "cni", CNI, 60, 20)]));
        assert_eq!(s, Status::Pass);
        assert!(d.contains("1 node without a NodegateGateHeld Event"), "{d}");
        // Events matched by taint, whatever the gate's name in them.
        let (s, _) = line(nodes(3, many(1)), Ok(vec![held("n0", "other", CNI, 60, 1)]));
        assert_eq!(s, Status::Warn);
        // Unreadable.
        let (s, d) = line(nodes(3, many(1)), Err("events is forbidden".into()));
        assert_eq!(s, Status::Warn);
        assert_eq!(
            d,
            "holds 1 of 3 nodes; cannot read Events in default (events is forbidden): which probe holds them is not known; let nodegate-check list events there"
        );
        let (s, d) = line(Err("nodes is forbidden".into()), Ok(vec![]));
        assert_eq!(s, Status::Warn);
        assert_eq!(
            d,
            "cannot read Nodes (nodes is forbidden): cannot tell which nodes it holds"
        );
    }

    #[test]
    fn gates_owned_elsewhere() {
        let n = || nodes(4, vec![node("n1", &[EBS]), node("n2", &[EBS])]);
        let ebs = |owner: Read<Owner>, n: Result<Nodes, String>| {
            let l = run(&three(), &n, Ok(vec![]), Some(owner));
            let (check, s, d) = l[2].clone();
            assert_eq!(check, format!("gate ebs-csi ({EBS})"));
            (s, d)
        };
        type Row = (Read<Owner>, Result<Nodes, String>, Status, String);
        let rows: Vec<Row> = vec![
            (
                Read::Missing,
                n(),
                Status::Warn,
                format!(
                    "its owner, DaemonSet {OWNER}, does not exist: nodes will stay gated: nothing removes {EBS} (2 of 4 nodes carry it now)"
                ),
            ),
            (
                Read::Unreadable("daemonsets is forbidden".into()),
                n(),
                Status::Warn,
                format!(
                    "cannot read DaemonSet {OWNER}, its owner (daemonsets is forbidden): cannot tell whether anything removes {EBS} (2 of 4 nodes carry it now)"
                ),
            ),
            (
                owner(&[("n1", true), ("n2", false), ("n3", true)]),
                n(),
                Status::Pass,
                format!(
                    "holds 2 of 4 nodes, each with a Pod of DaemonSet {OWNER}, its owner (1 not Ready yet: n2)"
                ),
            ),
            (
                owner(&[]),
                n(),
                Status::Warn,
                format!(
                    "holds 2 of 4 nodes; 2 nodes have no Pod of DaemonSet {OWNER}, its owner, and will stay gated: n1, n2"
                ),
            ),
            (
                Read::Found(Owner {
                    tolerations: tolerating(),
                    pods: None,
                }),
                nodes(4, vec![]),
                Status::Pass,
                format!("holds 0 of 4 nodes; owned by DaemonSet {OWNER}"),
            ),
            (
                Read::Found(Owner {
                    tolerations: Vec::new(),
                    pods: None,
                }),
                nodes(4, vec![]),
                Status::Warn,
                format!(
                    "holds 0 of 4 nodes; owned by DaemonSet {OWNER}; its Pods do not tolerate {EBS}, so none is scheduled on a new node the gate holds, and nothing removes it there: add the toleration to DaemonSet {OWNER}"
                ),
            ),
            (
                Read::Found(Owner {
                    tolerations: tolerating(),
                    pods: Some(Err("pods is forbidden".into())),
                }),
                n(),
                Status::Warn,
                format!(
                    "holds 2 of 4 nodes; cannot read the Pods of DaemonSet {OWNER}, its owner (pods is forbidden): cannot tell whether it runs on them"
                ),
            ),
        ];
        for (owner, nodes, status, detail) in rows {
            assert_eq!(ebs(owner, nodes), (status, detail));
        }
    }

    /// An agent without `--gates`: one gate of its `--taint` (the default)
    /// and probes, whose Events are matched by taint.
    #[test]
    fn the_legacy_single_gate() {
        let c = serde_json::from_value(json!({
            "name": "agent",
            "args": ["--probe-http=http://127.0.0.1:9879/healthz"],
        }))
        .unwrap();
        let d = crate::gates::declaration(&c).unwrap();
        let n = nodes(2, vec![node("n1", &[CNI])]);
        let got = run(
            &d.gates,
            &n,
            Ok(vec![held("n1", "default", CNI, 12, 3)]),
            None,
        );
        assert_eq!(
            got,
            vec![(
                format!("gate default ({CNI})"),
                Status::Warn,
                format!(
                    "holds 1 of 2 nodes; 1 node held longer than 10 min: n1 since {} (12 min): {HTTP}",
                    minutes_ago(12)
                )
            )]
        );
    }

    /// The one gate of several `--taint`s: its Event lists them all, and
    /// each taint's line reads it.
    #[test]
    fn the_legacy_gate_of_two_taints() {
        let c = serde_json::from_value(json!({
            "name": "agent",
            "args": [format!("--taint={CNI},{DNS}"), "--probe-tcp=127.0.0.1:4240"],
        }))
        .unwrap();
        let d = crate::gates::declaration(&c).unwrap();
        let n = nodes(1, vec![node("n1", &[CNI, DNS])]);
        let event = held("n1", "default", &format!("{CNI},{DNS}"), 3, 1);
        let got = run(&d.gates, &n, Ok(vec![event]), None);
        let want = format!(
            "holds 1 of 1 nodes; oldest n1 since {} (3 min): {HTTP}",
            minutes_ago(3)
        );
        assert_eq!(
            got,
            vec![
                (format!("gate default ({CNI})"), Status::Pass, want.clone()),
                (format!("gate default ({DNS})"), Status::Pass, want),
            ]
        );
    }

    #[test]
    fn the_agents_event_is_read_back() {
        let m = format!("gate cni ({CNI}) has held this node since 2025-06-01T11:30:00Z: {HTTP}");
        assert_eq!(
            parse_message(&m),
            Some(("cni".into(), CNI.into(), minutes_ago(30), HTTP.into()))
        );
        for bad in [
            "gate cni opened",
            "gate cni (x) has held this node since yesterday: p failed: e",
            "",
        ] {
            assert_eq!(parse_message(bad), None, "{bad}");
        }
        let event: Event = serde_json::from_value(json!({
            "metadata": {"name": "n1.1", "namespace": "default", "creationTimestamp": "2025-06-01T11:40:00Z"},
            "involvedObject": {"kind": "Node", "name": "n1"},
            "reason": HELD_REASON,
            "message": m,
            "firstTimestamp": "2025-06-01T11:40:00Z",
            "lastTimestamp": "2025-06-01T11:50:00Z",
        }))
        .unwrap();
        assert_eq!(
            held_of(&event),
            Some(Held {
                failing: HTTP.into(),
                ..held("n1", "cni", CNI, 30, 10)
            })
        );
        let mut other = event.clone();
        other.reason = Some("NodegateGateOpen".into());
        assert_eq!(held_of(&other), None);
    }

    #[test]
    fn what_is_listed_and_when() {
        let g = three();
        let n = Nodes {
            total: 3,
            tainted: vec![node("n1", &[EBS])],
        };
        assert!(!any_held_by_agent(&g.gates, &n));
        assert_eq!(owners_holding(&g.gates, &n), vec![OWNER.to_string()]);
        let n = Nodes {
            total: 3,
            tainted: vec![node("n1", &[DNS])],
        };
        assert!(any_held_by_agent(&g.gates, &n));
        assert!(owners_holding(&g.gates, &n).is_empty());

        let s: LabelSelector = serde_json::from_value(json!({
            "matchLabels": {"app": "ebs-csi-node"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "x", "operator": "NotIn", "values": ["c"]},
                {"key": "y", "operator": "Exists"},
                {"key": "z", "operator": "DoesNotExist"},
            ],
        }))
        .unwrap();
        assert_eq!(
            selector_query(&s),
            "app=ebs-csi-node,tier in (a,b),x notin (c),y,!z"
        );

        let pod = |node: Option<&str>, phase: &str, ready: &str| -> Pod {
            serde_json::from_value(json!({
                "spec": {"containers": [], "nodeName": node},
                "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]},
            }))
            .unwrap()
        };
        assert_eq!(
            owner_pod(&pod(Some("n1"), "Running", "True")),
            Some(OwnerPod {
                node: "n1".into(),
                ready: true
            })
        );
        assert_eq!(
            owner_pod(&pod(Some("n1"), "Pending", "False")).map(|p| p.ready),
            Some(false)
        );
        assert_eq!(owner_pod(&pod(Some("n1"), "Failed", "False")), None);
        assert_eq!(owner_pod(&pod(None, "Pending", "False")), None);
    }
}
