//! The webhook StatefulSet's (or an older install's Deployment's) and the
//! agent DaemonSet's first container, read once for the checks that compare
//! their flags (strict mode, Cilium).

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use kube::Client;
use kube::api::Api;

use crate::Args;
use crate::workloads::{Read, read_webhook};

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

/// Both workloads nodegate runs.
#[derive(Debug, Clone)]
pub struct Installed {
    pub webhook: Workload,
    pub agent: Workload,
}

fn first_container(spec: Option<PodSpec>) -> Workload {
    match spec.and_then(|p| p.containers.into_iter().next()) {
        Some(c) => Workload::Container(Box::new(c)),
        None => Workload::Missing,
    }
}

/// One GET of each.
pub async fn read(client: &Client, args: &Args) -> Installed {
    let ns = &args.namespace;
    let webhook = match read_webhook(client, args).await {
        Read::Found(w) => match w.containers.into_iter().next() {
            Some(c) => Workload::Container(Box::new(c)),
            None => Workload::Missing,
        },
        Read::Missing => Workload::Missing,
        Read::Unreadable(e) => Workload::Unreadable(e),
    };
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    let agent = match daemonsets.get_opt(&args.daemonset).await {
        Ok(d) => first_container(d.and_then(|d| d.spec?.template.spec)),
        Err(e) => Workload::Unreadable(format!(
            "cannot read DaemonSet {ns}/{}: {e}",
            args.daemonset
        )),
    };
    Installed { webhook, agent }
}
