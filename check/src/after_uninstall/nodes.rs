//! Nodes after an uninstall: a taint with one of nodegate's keys is a gate
//! nothing removes any more; the `ready-boot-id` annotation is read by
//! nothing but nodegate, so it is only a note.
//!
//! One `kubectl taint` per gated node, and one per (key, effect) for every
//! node carrying it: `kubectl taint nodes --all KEY-` fails on every node
//! without the taint (`taint "KEY" not found`, exit 1; kubectl 1.32), so
//! the nodes are named. `kubectl annotate nodes --all KEY-` passes over nodes
//! without the annotation, so the note's command needs no names.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint};
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::{PROFILE_TAINTS, READY_BOOT_ID_ANNOTATION};

use crate::report::{Line, Status};

pub const GATED: &str = "gated nodes";
pub const BOOT_ID: &str = "ready-boot-id";

/// The check of node `name`'s own line.
pub fn node_check(name: &str) -> String {
    format!("gated node {name}")
}

/// nodegate's gate keys: its default and key-profile taints', then those of
/// `taints` (the flags the install ran with), each once, in that order.
pub fn gate_keys(taints: &[TaintSpec]) -> Vec<String> {
    let profiles = PROFILE_TAINTS
        .iter()
        .filter_map(|t| t.parse::<TaintSpec>().ok());
    let mut keys: Vec<String> = Vec::new();
    for t in profiles.chain(taints.iter().cloned()) {
        if !keys.iter().any(|k| k == t.key()) {
            keys.push(t.key().to_string());
        }
    }
    keys
}

/// `key=value:Effect`, as `kubectl describe` shows a taint.
fn shown(t: &Taint) -> String {
    match t.value.as_deref() {
        Some(v) if !v.is_empty() => format!("{}={v}:{}", t.key, t.effect),
        _ => format!("{}:{}", t.key, t.effect),
    }
}

/// What removes exactly this taint (kubectl matches key and effect).
fn removal(t: &Taint) -> String {
    format!("{}:{}-", t.key, t.effect)
}

/// The first few of `names`, for a note that needs no complete list.
fn some(names: &[&str]) -> String {
    const SHOWN: usize = 5;
    match names.len() {
        n if n > SHOWN => format!("{}, and {} more", names[..SHOWN].join(", "), n - SHOWN),
        _ => names.join(", "),
    }
}

/// The lines for the Nodes as listed, `keys` being nodegate's gate keys.
pub fn verdict(nodes: &Result<Vec<Node>, String>, keys: &[String]) -> Vec<Line> {
    let nodes = match nodes {
        Ok(n) => n,
        Err(e) => {
            return vec![Line::new(
                GATED,
                Status::Fail,
                format!(
                    "cannot list Nodes ({e}): whether any still carries a gate is unknown; run with a credential that may list them"
                ),
            )];
        }
    };
    let mut sorted: Vec<&Node> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut lines = Vec::new();
    // (key, effect) → the nodes carrying it, for the all-at-once commands.
    let mut groups: BTreeMap<(String, String), Vec<&str>> = BTreeMap::new();
    let mut annotated: Vec<&str> = Vec::new();
    for node in sorted {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let annotations = node.metadata.annotations.as_ref();
        if annotations.is_some_and(|a| a.contains_key(READY_BOOT_ID_ANNOTATION)) {
            annotated.push(name);
        }
        let gates: Vec<&Taint> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .filter(|t| keys.contains(&t.key))
            .collect();
        if gates.is_empty() {
            continue;
        }
        for t in &gates {
            let group = (t.key.clone(), t.effect.clone());
            groups.entry(group).or_default().push(name);
        }
        let carries: Vec<String> = gates.iter().map(|t| shown(t)).collect();
        let remove: Vec<String> = gates.iter().map(|t| removal(t)).collect();
        let evicts = if gates.iter().any(|t| t.effect == "NoExecute") {
            ", which evicts its pods"
        } else {
            ""
        };
        lines.push(Line::new(
            node_check(name),
            Status::Fail,
            format!(
                "carries {}{evicts}, and no agent is left to remove it: kubectl taint node {name} {}",
                carries.join(", "),
                remove.join(" ")
            ),
        ));
    }
    let gated = lines.len();
    if gated == 0 {
        lines.push(Line::new(
            GATED,
            Status::Pass,
            format!(
                "none of {} Nodes carries a taint with nodegate's keys ({})",
                nodes.len(),
                keys.join(", ")
            ),
        ));
    } else {
        let all: Vec<String> = groups
            .iter()
            .map(|((key, effect), names)| {
                format!("kubectl taint nodes {} {key}:{effect}-", names.join(" "))
            })
            .collect();
        lines.push(Line::new(
            GATED,
            Status::Fail,
            format!(
                "{gated} of {} Nodes still carry nodegate's gates; all at once: {}",
                nodes.len(),
                all.join(" && ")
            ),
        ));
    }
    if !annotated.is_empty() {
        lines.push(Line::new(
            BOOT_ID,
            Status::Info,
            format!(
                "{} Nodes carry the annotation {READY_BOOT_ID_ANNOTATION} ({}): harmless, nothing but nodegate reads it; to drop it: kubectl annotate nodes --all {READY_BOOT_ID_ANNOTATION}-",
                annotated.len(),
                some(&annotated)
            ),
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use nodegate_shared::keys::{DEFAULT_TAINT, KARPENTER_PROFILE_TAINT, MANAGED_CA_PROFILE_TAINT};
    use serde_json::json;

    use super::*;

    const KEY: &str = "nodegate.dev/agent-not-ready";
    const CA_KEY: &str = "startup-taint.cluster-autoscaler.kubernetes.io/nodegate-agent-not-ready";
    const KARPENTER_KEY: &str = "readiness.k8s.io/nodegate-agent-not-ready";

    /// A Node with `taints` (`key[=value]:Effect`) and, if `annotated`, the
    /// ready-boot-id annotation.
    fn node(name: &str, taints: &[&str], annotated: bool) -> Node {
        let taints: Vec<serde_json::Value> = taints
            .iter()
            .map(|t| {
                let (kv, effect) = t.rsplit_once(':').unwrap();
                let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
                json!({"key": key, "value": value, "effect": effect})
            })
            .collect();
        let annotations = if annotated {
            json!({READY_BOOT_ID_ANNOTATION: "boot-1"})
        } else {
            json!({})
        };
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"taints": taints},
        }))
        .unwrap()
    }

    #[test]
    fn the_keys_are_the_profiles_and_the_flags() {
        for t in [
            DEFAULT_TAINT,
            MANAGED_CA_PROFILE_TAINT,
            KARPENTER_PROFILE_TAINT,
        ] {
            assert!(t.parse::<TaintSpec>().is_ok(), "{t}");
        }
        assert_eq!(gate_keys(&[]), vec![KEY, CA_KEY, KARPENTER_KEY]);
        let flags = [
            "a.dev/gate:NoSchedule".parse().unwrap(),
            format!("{KEY}:NoExecute").parse().unwrap(),
        ];
        assert_eq!(
            gate_keys(&flags),
            vec![KEY, CA_KEY, KARPENTER_KEY, "a.dev/gate"]
        );
    }

    /// Each row: the Nodes, then (check, status, parts of the detail) of
    /// every line, in order.
    #[test]
    fn verdicts() {
        type Row = (
            Result<Vec<Node>, String>,
            Vec<(String, Status, Vec<String>)>,
        );
        let line = |check: &str, status, parts: &[&str]| {
            (
                check.to_string(),
                status,
                parts.iter().map(ToString::to_string).collect::<Vec<_>>(),
            )
        };
        let gate = format!("{KEY}=true:NoSchedule");
        let strict = format!("{KEY}=true:NoExecute");
        let ca = format!("{CA_KEY}=true:NoSchedule");
        let karpenter = format!("{KARPENTER_KEY}=true:NoSchedule");
        let rows: Vec<Row> = vec![
            (
                Ok(vec![
                    node("a", &["node.kubernetes.io/not-ready:NoSchedule"], false),
                    node("b", &[], false),
                ]),
                vec![line(
                    GATED,
                    Status::Pass,
                    &[
                        "none of 2 Nodes carries a taint with nodegate's keys",
                        CA_KEY,
                    ],
                )],
            ),
            (
                Ok(vec![
                    node("w2", &[&gate, "other.io/x:NoSchedule", &strict], true),
                    node("w1", &[&gate], false),
                    node("clean", &[], true),
                ]),
                vec![
                    line(
                        "gated node w1",
                        Status::Fail,
                        &[&format!(
                            "carries {gate}, and no agent is left to remove it: kubectl taint node w1 {KEY}:NoSchedule-"
                        )],
                    ),
                    line(
                        "gated node w2",
                        Status::Fail,
                        &[&format!(
                            "carries {gate}, {strict}, which evicts its pods, and no agent is left to remove it: kubectl taint node w2 {KEY}:NoSchedule- {KEY}:NoExecute-"
                        )],
                    ),
                    line(
                        GATED,
                        Status::Fail,
                        &[&format!(
                            "2 of 3 Nodes still carry nodegate's gates; all at once: kubectl taint nodes w2 {KEY}:NoExecute- && kubectl taint nodes w1 w2 {KEY}:NoSchedule-"
                        )],
                    ),
                    line(
                        BOOT_ID,
                        Status::Info,
                        &[&format!(
                            "2 Nodes carry the annotation {READY_BOOT_ID_ANNOTATION} (clean, w2): harmless, nothing but nodegate reads it; to drop it: kubectl annotate nodes --all {READY_BOOT_ID_ANNOTATION}-"
                        )],
                    ),
                ],
            ),
            (
                Ok(vec![
                    node("p", &[&ca], false),
                    node("q", &[&karpenter], false),
                ]),
                vec![
                    line(
                        "gated node p",
                        Status::Fail,
                        &[&format!("kubectl taint node p {CA_KEY}:NoSchedule-")],
                    ),
                    line(
                        "gated node q",
                        Status::Fail,
                        &[&format!("kubectl taint node q {KARPENTER_KEY}:NoSchedule-")],
                    ),
                    line(GATED, Status::Fail, &["2 of 2 Nodes"]),
                ],
            ),
            (
                Ok(vec![node("annotated", &[], true)]),
                vec![
                    line(GATED, Status::Pass, &["none of 1 Nodes"]),
                    line(BOOT_ID, Status::Info, &["(annotated)"]),
                ],
            ),
            (
                Err("403 forbidden".into()),
                vec![line(
                    GATED,
                    Status::Fail,
                    &["cannot list Nodes (403 forbidden)"],
                )],
            ),
        ];
        let keys = gate_keys(&[]);
        for (nodes, want) in rows {
            let lines = verdict(&nodes, &keys);
            assert_eq!(lines.len(), want.len(), "{lines:#?}");
            for (got, (check, status, parts)) in lines.iter().zip(&want) {
                assert_eq!((&got.check, got.status), (check, *status), "{}", got.detail);
                for part in parts {
                    assert!(
                        got.detail.contains(part.as_str()),
                        "{:?} lacks {part:?}",
                        got.detail
                    );
                }
            }
        }
    }

    #[test]
    fn a_note_names_a_few() {
        assert_eq!(some(&["a", "b"]), "a, b");
        let many = ["a", "b", "c", "d", "e", "f", "g"];
        assert_eq!(some(&many), "a, b, c, d, e, and 2 more");
    }

    /// A gate of the install's own `--taint` counts too.
    #[test]
    fn a_flag_gate() {
        let nodes = Ok(vec![node("n", &["a.dev/gate:NoSchedule"], false)]);
        let keys = gate_keys(&["a.dev/gate:NoSchedule".parse().unwrap()]);
        let lines = verdict(&nodes, &keys);
        assert_eq!(lines[0].check, "gated node n");
        assert!(
            lines[0]
                .detail
                .ends_with("kubectl taint node n a.dev/gate:NoSchedule-")
        );
    }
}
