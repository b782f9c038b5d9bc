//! The webhook StatefulSet's (or an older install's Deployment's) and the
//! agent DaemonSet's first container, read once for the checks that compare
//! their flags (strict mode, Cilium), and where the agent's Pods may run
//! (the autoscaler checks).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, NodeSelectorTerm, PodSpec, Toleration};
use kube::Client;
use kube::api::Api;

use crate::read::Read;
use crate::workloads::read_webhook;

/// One workload as read.
#[derive(Debug, Clone)]
pub enum Workload {
    /// The read failed: the error, naming the object.
    Unreadable(String),
    /// The object, or its container, is not there.
    Missing,
    Container(Box<Container>),
}

impl Workload {
    pub fn container(&self) -> Option<&Container> {
        match self {
            Workload::Container(c) => Some(c),
            _ => None,
        }
    }
}

/// Where the agent DaemonSet's Pods may run: its Pod template's node
/// selector, required node affinity and tolerations.
#[derive(Debug, Clone, Default)]
pub struct AgentPlacement {
    pub node_selector: BTreeMap<String, String>,
    /// `requiredDuringSchedulingIgnoredDuringExecution` terms (any one).
    pub required_terms: Option<Vec<NodeSelectorTerm>>,
    pub tolerations: Vec<Toleration>,
}

impl AgentPlacement {
    pub fn of(spec: &PodSpec) -> AgentPlacement {
        AgentPlacement {
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            required_terms: spec
                .affinity
                .as_ref()
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|n| {
                    n.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .map(|r| r.node_selector_terms.clone()),
            tolerations: spec.tolerations.clone().unwrap_or_default(),
        }
    }
}

/// Both workloads nodegate runs.
#[derive(Debug, Clone)]
pub struct Installed {
    pub webhook: Workload,
    pub agent: Workload,
    /// `None` when the DaemonSet is missing or unreadable.
    pub agent_placement: Option<AgentPlacement>,
}

fn first_container(spec: Option<PodSpec>) -> Workload {
    match spec.and_then(|p| p.containers.into_iter().next()) {
        Some(c) => Workload::Container(Box::new(c)),
        None => Workload::Missing,
    }
}

/// One GET of each: the webhook's workload `ns/webhook` and the agent's
/// DaemonSet `ns/daemonset`.
pub async fn read(client: &Client, ns: &str, webhook: &str, daemonset: &str) -> Installed {
    let webhook = match read_webhook(client, ns, webhook).await {
        Read::Found(w) => match w.containers.into_iter().next() {
            Some(c) => Workload::Container(Box::new(c)),
            None => Workload::Missing,
        },
        Read::Missing => Workload::Missing,
        Read::Unreadable(e) => Workload::Unreadable(e),
    };
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    let (agent, agent_placement) = match daemonsets.get_opt(daemonset).await {
        Ok(d) => {
            let spec = d.and_then(|d| d.spec?.template.spec);
            let placement = spec.as_ref().map(AgentPlacement::of);
            (first_container(spec), placement)
        }
        Err(e) => (
            Workload::Unreadable(format!("cannot read DaemonSet {ns}/{daemonset}: {e}")),
            None,
        ),
    };
    Installed {
        webhook,
        agent,
        agent_placement,
    }
}
