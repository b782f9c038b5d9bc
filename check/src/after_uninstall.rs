//! `nodegate-check --after-uninstall`: after `helm uninstall` or the
//! kustomize removal, what nodegate left behind, each with the kubectl
//! command that finishes the removal; exit 1 while anything is left, 0 on a
//! clean cluster.
//!
//! The install's checks' shape: [`list`] only reads, and the verdicts decide
//! on the lists alone:
//!
//! - [`nodes`]: Nodes still carrying a gate, any taint with one of
//!   nodegate's keys (with no agent left to remove it, a NoSchedule gate
//!   keeps pods off the node for good, and strict mode's NoExecute gate
//!   evicts them); the `ready-boot-id` annotation, harmless, as a note;
//! - [`objects`]: nodegate's admission objects, its ClusterRoles and
//!   ClusterRoleBindings, and its workloads and Secrets in its namespace.
//!
//! Nothing is read that the verdicts do not need, and nothing is written:
//! the commands are printed for the admin to run.

pub mod list;
pub mod nodes;
pub mod objects;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use nodegate_shared::TaintSpec;

use crate::report::{Line, Report};
pub use objects::{Kind, Object};

/// The names the install used (the check's flags).
#[derive(Debug, Clone)]
pub struct Names<'a> {
    pub namespace: &'a str,
    /// The MutatingWebhookConfiguration (`--webhook-config`).
    pub webhook_config: &'a str,
    /// The MutatingAdmissionPolicy (`--policy`).
    pub policy: &'a str,
    /// The webhook's StatefulSet (or an older install's Deployment).
    pub webhook_workload: &'a str,
    pub daemonset: &'a str,
    pub certs_deployment: &'a str,
    pub tls_secret: &'a str,
}

/// What was listed: each list, or why it could not be.
#[derive(Debug, Clone)]
pub struct Listed {
    pub nodes: Result<Vec<Node>, String>,
    /// Every kind of [`objects::KINDS`], in that order, with its objects
    /// (those in `Names::namespace` for a namespaced kind).
    pub objects: Vec<(&'static Kind, Result<Vec<Object>, String>)>,
    /// Whether the namespace still exists.
    pub namespace: Result<bool, String>,
}

/// The report's lines for what was listed. `taints`: the gates the install
/// ran with beyond nodegate's profiles (`--taint`, `--boot-taint`).
pub fn verdict(listed: &Listed, names: &Names, taints: &[TaintSpec]) -> Vec<Line> {
    let keys = nodes::gate_keys(taints);
    let mut lines = nodes::verdict(&listed.nodes, &keys);
    lines.extend(objects::verdict(&listed.objects, &listed.namespace, names));
    lines
}

/// Lists what nodegate may have left and reports [`verdict`].
pub async fn check(client: &Client, names: &Names<'_>, taints: &[TaintSpec], report: &mut Report) {
    let listed = list::list(client, names.namespace).await;
    report.extend(verdict(&listed, names, taints));
}
