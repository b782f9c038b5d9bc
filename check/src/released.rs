//! The taints the agent releases (`--release-taint`: removed with its ready
//! patch when they match exactly, never added) after a change of key: a key
//! profile, or an upgrade from the releases that gated with Cilium's key.
//! Which nodes still carry one, whether any of them is stale (its agent was
//! ready on the boot it runs, so nothing will remove it), and when the flag
//! can go.
//!
//! [`verdict`] decides from what was read; [`check`] reads nothing itself:
//! the Nodes come from the one paginated list the gate lines share.

use nodegate_shared::TaintSpec;

use crate::container_flags::flags;
use crate::installed::Installed;
use crate::read::{NodeTaints, Nodes};
use crate::report::{Report, Status};

pub const CHECK: &str = "released taints";

/// One Node as this check reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub name: String,
    /// Released taints it carries, exactly (key, value, effect).
    pub carries: Vec<String>,
    /// Its agent recorded the boot it runs as ready: no ready patch is due.
    pub ready_on_this_boot: bool,
}

/// What [`verdict`] decides on.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The agent's `--release-taint`s; `None` when unreadable.
    pub release: Option<Vec<TaintSpec>>,
    /// The Nodes that carry at least one of them, or why they were not read.
    pub nodes: Result<Vec<Seen>, String>,
}

fn names(nodes: &[&Seen]) -> String {
    let mut shown: Vec<&str> = nodes.iter().take(5).map(|n| n.name.as_str()).collect();
    if nodes.len() > 5 {
        shown.push("…");
    }
    shown.join(", ")
}

pub fn verdict(i: &Inputs) -> (Status, String) {
    let Some(release) = &i.release else {
        return (
            Status::Skip,
            "the agent DaemonSet's flags could not be read (see above)".into(),
        );
    };
    if release.is_empty() {
        return (Status::Pass, "the agent releases no taint".into());
    }
    let nodes = match &i.nodes {
        Ok(n) => n,
        Err(e) => {
            return (
                Status::Skip,
                format!("cannot list Nodes ({e}): cannot tell which still carry a released taint"),
            );
        }
    };
    let mut lines = Vec::new();
    let mut warn = false;
    for r in release {
        let spec = r.to_string();
        let carrying: Vec<&Seen> = nodes.iter().filter(|n| n.carries.contains(&spec)).collect();
        let stale: Vec<&Seen> = carrying
            .iter()
            .copied()
            .filter(|n| n.ready_on_this_boot)
            .collect();
        if carrying.is_empty() {
            lines.push(format!(
                "no node carries {spec} any more: --release-taint={spec} can go from the agent (and the confinement generated with it)"
            ));
        } else if stale.is_empty() {
            lines.push(format!(
                "{} node(s) still carry {spec} ({}): each agent removes it with its next ready patch",
                carrying.len(),
                names(&carrying)
            ));
        } else {
            warn = true;
            lines.push(format!(
                "{} node(s) carry {spec} although their agent was ready on the boot they run ({}): nothing will remove it before their next reboot; remove it by hand (kubectl taint nodes NODE {spec}-) or restart their agents",
                stale.len(),
                names(&stale)
            ));
        }
    }
    (
        if warn { Status::Warn } else { Status::Pass },
        lines.join("; "),
    )
}

/// The released taints a Node carries, and whether its agent was ready on
/// the boot it runs.
pub fn seen(node: &NodeTaints, release: &[TaintSpec]) -> Seen {
    let carries = release
        .iter()
        .filter(|r| node.taints.iter().any(|t| r.matches_exactly(t)))
        .map(ToString::to_string)
        .collect();
    let boot = node.boot_id.as_deref();
    Seen {
        name: node.name.clone(),
        carries,
        ready_on_this_boot: boot.is_some() && boot == node.ready_boot_id.as_deref(),
    }
}

/// Reports [`verdict`] on the agent's release flags and the Nodes as read.
pub fn check(installed: &Installed, nodes: &Result<Nodes, String>, report: &mut Report) {
    let release = installed
        .agent
        .container()
        .and_then(|c| flags(c).ok())
        .map(|f| f.release);
    let nodes = match nodes {
        Ok(n) => Ok(n
            .tainted
            .iter()
            .map(|n| seen(n, release.as_deref().unwrap_or_default()))
            .filter(|s| !s.carries.is_empty())
            .collect()),
        Err(e) => Err(e.clone()),
    };
    let (status, detail) = verdict(&Inputs { release, nodes });
    report.add(CHECK, status, detail);
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use nodegate_shared::keys::{DEFAULT_TAINT, LEGACY_TAINT, READY_BOOT_ID_ANNOTATION};

    fn node(name: &str, taints: &[&str], boot: &str, ready_boot: Option<&str>) -> Node {
        let taints: Vec<serde_json::Value> = taints
            .iter()
            .map(|t| t.parse::<TaintSpec>().unwrap().to_json())
            .collect();
        let mut ann = serde_json::Map::new();
        if let Some(r) = ready_boot {
            ann.insert(READY_BOOT_ID_ANNOTATION.into(), r.into());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": ann},
            "spec": {"taints": taints},
            "status": {"nodeInfo": {"bootID": boot, "machineID": "", "systemUUID": "", "kernelVersion": "",
                "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "", "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": "amd64"}},
        }))
        .unwrap()
    }

    #[test]
    fn who_still_carries_a_released_taint() {
        let release: Vec<TaintSpec> = vec![LEGACY_TAINT.parse().unwrap()];
        // Cilium's operator's own taint (empty value) is not the released one.
        let operators = "node.cilium.io/agent-not-ready:NoSchedule";
        let nodes = [
            node("gated", &[LEGACY_TAINT, DEFAULT_TAINT], "b1", None),
            node("stale", &[LEGACY_TAINT], "b2", Some("b2")),
            node("clean", &[DEFAULT_TAINT], "b3", None),
            node("operators", &[operators], "b4", Some("b4")),
        ];
        let seen: Vec<Seen> = nodes
            .iter()
            .map(|n| seen(&NodeTaints::of(n), &release))
            .filter(|s| !s.carries.is_empty())
            .collect();
        assert_eq!(
            seen.iter()
                .map(|s| (s.name.as_str(), s.ready_on_this_boot))
                .collect::<Vec<_>>(),
            [("gated", false), ("stale", true)]
        );
        let run = |nodes: Vec<Seen>| {
            verdict(&Inputs {
                release: Some(release.clone()),
                nodes: Ok(nodes),
            })
        };
        let (s, d) = run(seen.clone());
        assert_eq!(s, Status::Warn, "{d}");
        assert!(
            d.contains("(stale)") && d.contains("kubectl taint nodes NODE"),
            "{d}"
        );
        let (s, d) = run(vec![seen[0].clone()]);
        assert_eq!(s, Status::Pass);
        assert!(
            d.contains("1 node(s) still carry") && d.contains("next ready patch"),
            "{d}"
        );
        let (s, d) = run(Vec::new());
        assert_eq!(s, Status::Pass);
        assert!(
            d.contains(&format!("--release-taint={LEGACY_TAINT} can go")),
            "{d}"
        );
        let none = verdict(&Inputs {
            release: Some(Vec::new()),
            nodes: Ok(Vec::new()),
        });
        assert_eq!(
            none,
            (Status::Pass, "the agent releases no taint".to_string())
        );
        let unreadable = verdict(&Inputs {
            release: Some(release.clone()),
            nodes: Err("403".into()),
        });
        assert_eq!(unreadable.0, Status::Skip);
    }
}
