//! `replica placement`: the backup lines' replicas on distinct nodes, so one
//! node failure takes at most one line. [`read`] lists the Pods behind each
//! backup line's Service; [`verdict`] compares their nodes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};

use super::Backups;
use crate::report::{Report, Status};

pub const CHECK: &str = "replica placement";

/// A scheduled Pod behind a backup line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub line: String,
    pub pod: String,
    pub node: String,
}

/// The Pods behind every backup line, or the namespace whose Pods could
/// not be listed and the error.
pub type Placement = Result<Vec<Placed>, (String, String)>;

/// The line. Skipped when no Pod is visible (not scheduled, or an API
/// server without kubelets).
pub fn verdict(placement: &Placement) -> (Status, String) {
    let placed = match placement {
        Ok(p) => p,
        Err((ns, e)) => return (Status::Skip, format!("cannot list the Pods in {ns}: {e}")),
    };
    if placed.is_empty() {
        return (
            Status::Skip,
            "no scheduled Pod behind the backup lines' Services: nothing to compare".into(),
        );
    }
    let mut by_node: BTreeMap<&str, Vec<&Placed>> = BTreeMap::new();
    for p in placed {
        by_node.entry(p.node.as_str()).or_default().push(p);
    }
    let shared: Vec<String> = by_node
        .iter()
        .filter_map(|(node, ps)| {
            let mut lines: Vec<&str> = ps.iter().map(|p| p.line.as_str()).collect();
            lines.dedup();
            (lines.len() > 1).then(|| {
                let pods: Vec<&str> = ps.iter().map(|p| p.pod.as_str()).collect();
                format!(
                    "{} run on node {node} (Pods {})",
                    lines.join(" and "),
                    pods.join(", ")
                )
            })
        })
        .collect();
    if shared.is_empty() {
        let shown: Vec<String> = placed
            .iter()
            .map(|p| format!("{} → {} on {}", p.line, p.pod, p.node))
            .collect();
        (
            Status::Pass,
            format!(
                "each backup line's replica on a node of its own: {}",
                shown.join(", ")
            ),
        )
    } else {
        (
            Status::Warn,
            format!(
                "{}: one node failure takes those lines at once; keep the StatefulSet's required pod anti-affinity on kubernetes.io/hostname",
                shared.join("; ")
            ),
        )
    }
}

/// Lists the Pods each backup line's Service selects; stops at the first
/// namespace whose Pods cannot be listed.
pub async fn read(client: &Client, backups: &Backups) -> Placement {
    let mut placed = Vec::new();
    for (line, svc) in &backups.services {
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        let selector = svc
            .spec
            .as_ref()
            .and_then(|s| s.selector.clone())
            .unwrap_or_default();
        if selector.is_empty() {
            // A Service without selector selects no Pod by label.
            continue;
        }
        let labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        match pods
            .list(&ListParams::default().labels(&labels.join(",")))
            .await
        {
            Ok(list) => placed.extend(list.items.into_iter().filter_map(|p| {
                let node = p.spec?.node_name?;
                Some(Placed {
                    line: line.clone(),
                    pod: p.metadata.name.unwrap_or_default(),
                    node,
                })
            })),
            Err(e) => return Err((ns, e.to_string())),
        }
    }
    Ok(placed)
}

/// Reads where the backup lines' replicas run and reports [`verdict`].
pub async fn check(client: &Client, backups: &Backups, report: &mut Report) {
    let (status, detail) = verdict(&read(client, backups).await);
    report.add(CHECK, status, detail);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(line: &str, pod: &str, node: &str) -> Placed {
        Placed {
            line: line.into(),
            pod: pod.into(),
            node: node.into(),
        }
    }

    #[test]
    fn verdicts() {
        let rows = [
            (
                Ok(vec![placed("r0", "w-0", "n1"), placed("r1", "w-1", "n2")]),
                Status::Pass,
                "each backup line's replica on a node of its own: r0 → w-0 on n1, r1 → w-1 on n2",
            ),
            (
                Ok(vec![placed("r0", "w-0", "n1"), placed("r1", "w-1", "n1")]),
                Status::Warn,
                "r0 and r1 run on node n1 (Pods w-0, w-1): one node failure takes those lines at once",
            ),
            // Two Pods of one line on a node (a rollout's surge): no risk.
            (
                Ok(vec![placed("r0", "w-0", "n1"), placed("r0", "w-0b", "n1")]),
                Status::Pass,
                "r0 → w-0 on n1, r0 → w-0b on n1",
            ),
            (
                Ok(Vec::new()),
                Status::Skip,
                "no scheduled Pod behind the backup lines' Services: nothing to compare",
            ),
            (
                Err(("nodegate".into(), "403".into())),
                Status::Skip,
                "cannot list the Pods in nodegate: 403",
            ),
        ];
        for (placement, status, part) in rows {
            let (got, detail) = verdict(&placement);
            assert_eq!(got, status, "{detail}");
            assert!(detail.contains(part), "{detail:?} lacks {part:?}");
        }
    }
}
