//! What runs the webhook and the agent: the webhook's Service (and port),
//! its StatefulSet (available replicas, and the `--taint` and `--boot-taint`
//! flags it runs with; a Deployment of that name when an install from before
//! the per-replica lines has no StatefulSet), and the agent DaemonSet.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Container, Service};
use kube::{Api, Client};
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::DEFAULT_TAINT;

use crate::container_flags::{Flags, container_flag};
use crate::webhook_config::Hook;
use crate::{Args, Report, Status};

/// What runs the webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The install: one Pod (and one line of admission) per replica.
    StatefulSet,
    /// An install from before: one line of admission for all replicas.
    Deployment,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::StatefulSet => "StatefulSet",
            Kind::Deployment => "Deployment",
        }
    }
}

/// The webhook workload as read.
#[derive(Debug, Clone)]
pub struct WebhookWorkload {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    /// `spec.replicas` (the API server's default, 1, when unset).
    pub replicas: i32,
    /// Available replicas (ready for `minReadySeconds`).
    pub available: i32,
    /// The Deployment's `Available` condition; a StatefulSet has none, so
    /// true when a replica is available.
    pub available_condition: bool,
    /// The Pod template's labels, which the per-replica Services select on.
    pub template_labels: BTreeMap<String, String>,
    pub containers: Vec<Container>,
    /// A Deployment of the same name left beside the StatefulSet by an
    /// upgrade (`kubectl apply` does not prune it).
    pub leftover_deployment: bool,
}

impl WebhookWorkload {
    /// `StatefulSet nodegate/nodegate-webhook`.
    pub fn describe(&self) -> String {
        format!("{} {}/{}", self.kind.as_str(), self.namespace, self.name)
    }

    /// Replica `i`'s Pod (and per-replica Service) name; StatefulSets only.
    pub fn pod(&self, i: i32) -> String {
        format!("{}-{i}", self.name)
    }
}

/// The webhook workload, or why there is none.
#[derive(Debug, Clone)]
pub enum Read {
    Found(Box<WebhookWorkload>),
    Missing,
    /// The error, naming the object.
    Unreadable(String),
}

fn from_statefulset(s: StatefulSet, ns: &str, name: &str, leftover: bool) -> WebhookWorkload {
    let spec = s.spec.unwrap_or_default();
    let status = s.status.unwrap_or_default();
    // Ready, not available: the Services' endpoints (what the API server
    // calls) follow readiness, while availability lags by minReadySeconds.
    let available = status
        .ready_replicas
        .or(status.available_replicas)
        .unwrap_or(0);
    let template = spec.template;
    WebhookWorkload {
        kind: Kind::StatefulSet,
        namespace: ns.into(),
        name: name.into(),
        replicas: spec.replicas.unwrap_or(1),
        available,
        available_condition: available > 0,
        template_labels: template.metadata.and_then(|m| m.labels).unwrap_or_default(),
        containers: template.spec.map(|p| p.containers).unwrap_or_default(),
        leftover_deployment: leftover,
    }
}

fn from_deployment(d: Deployment, ns: &str, name: &str) -> WebhookWorkload {
    let spec = d.spec.unwrap_or_default();
    let status = d.status.unwrap_or_default();
    let template = spec.template;
    WebhookWorkload {
        kind: Kind::Deployment,
        namespace: ns.into(),
        name: name.into(),
        replicas: spec.replicas.unwrap_or(1),
        available: status.available_replicas.unwrap_or(0),
        available_condition: status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Available" && c.status == "True"),
        template_labels: template.metadata.and_then(|m| m.labels).unwrap_or_default(),
        containers: template.spec.map(|p| p.containers).unwrap_or_default(),
        leftover_deployment: false,
    }
}

/// The StatefulSet `--statefulset`, else a Deployment of that name.
pub async fn read_webhook(client: &Client, args: &Args) -> Read {
    let (ns, name) = (&args.namespace, args.webhook_workload());
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    match sets.get_opt(name).await {
        Ok(Some(s)) => {
            let leftover = matches!(deployments.get_opt(name).await, Ok(Some(_)));
            Read::Found(Box::new(from_statefulset(s, ns, name, leftover)))
        }
        Ok(None) => match deployments.get_opt(name).await {
            Ok(Some(d)) => Read::Found(Box::new(from_deployment(d, ns, name))),
            Ok(None) => Read::Missing,
            Err(e) => Read::Unreadable(format!("cannot read Deployment {ns}/{name}: {e}")),
        },
        Err(e) => Read::Unreadable(format!("cannot read StatefulSet {ns}/{name}: {e}")),
    }
}

/// What the canary, the lines and the diagnosis need from the workload.
#[derive(Debug, Clone, Default)]
pub struct WebhookInfo {
    /// The workload, when read.
    pub workload: Option<WebhookWorkload>,
    /// Available replicas, when the workload was read (0 when missing).
    pub available: Option<i32>,
    /// The taints the webhook runs with: its `--taint` args or
    /// `NODEGATE_TAINTS` (nodegate's default without either), and strict
    /// mode's `--boot-taint` or `NODEGATE_BOOT_TAINTS` (none without either).
    pub flags: Flags,
}

/// The `--taint` values of a container (`--taint=X`, `--taint X`, or the
/// `NODEGATE_TAINTS` env var, as the webhook's clap reads them).
pub fn container_taints(c: &Container) -> Vec<String> {
    container_flag(c, "--taint", "NODEGATE_TAINTS")
}

pub async fn check_service(client: &Client, hook: &Hook, report: &mut Report) -> bool {
    const CHECK: &str = "webhook service";
    let Some((ns, name, port)) = &hook.service else {
        return true;
    };
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    match api.get_opt(name).await {
        Ok(Some(svc)) => {
            let ports: Vec<i32> = svc
                .spec
                .iter()
                .flat_map(|s| s.ports.iter().flatten())
                .map(|p| p.port)
                .collect();
            if ports.contains(port) {
                report.add(
                    CHECK,
                    Status::Pass,
                    format!("{ns}/{name} serves port {port}"),
                );
                true
            } else {
                report.add(
                    CHECK,
                    Status::Fail,
                    format!("{ns}/{name} has ports {ports:?}, the configuration calls {port}"),
                );
                false
            }
        }
        Ok(None) => {
            report.add(
                CHECK,
                Status::Fail,
                format!("Service {ns}/{name} not found: the API server cannot reach the webhook"),
            );
            false
        }
        Err(e) => {
            report.add(
                CHECK,
                Status::Skip,
                format!("cannot read Service {ns}/{name}: {e}"),
            );
            true
        }
    }
}

/// The webhook workload's line (`webhook statefulset`, or `webhook
/// deployment` for an install from before) and the flags it runs with.
pub async fn check_webhook(client: &Client, args: &Args, report: &mut Report) -> WebhookInfo {
    let default = || Flags {
        taints: DEFAULT_TAINT.parse::<TaintSpec>().into_iter().collect(),
        boot: Vec::new(),
        release: Vec::new(),
    };
    let (ns, name) = (&args.namespace, args.webhook_workload());
    let w = match read_webhook(client, args).await {
        Read::Found(w) => *w,
        Read::Missing => {
            report.add(
                "webhook statefulset",
                Status::Fail,
                format!("StatefulSet {ns}/{name} not found (nor a Deployment of that name)"),
            );
            return WebhookInfo {
                workload: None,
                available: Some(0),
                flags: default(),
            };
        }
        Read::Unreadable(e) => {
            report.add("webhook statefulset", Status::Skip, e);
            return WebhookInfo {
                workload: None,
                available: None,
                flags: default(),
            };
        }
    };
    let check = match w.kind {
        Kind::StatefulSet => "webhook statefulset",
        Kind::Deployment => "webhook deployment",
    };
    let (available, want) = (w.available, w.replicas);
    let what = format!("{ns}/{name}: {available}/{want} available");
    if available == 0 || !w.available_condition {
        report.add(check, Status::Fail, format!("{what}: the webhook is down"));
    } else if available < want {
        report.add(
            check,
            Status::Warn,
            format!("{what}: one more failure and the webhook is down"),
        );
    } else if w.leftover_deployment {
        report.add(
            check,
            Status::Warn,
            format!("{what}; the Deployment {ns}/{name} of an older install is still there: delete it (its Pods take the webhook's host port and anti-affinity from the StatefulSet's)"),
        );
    } else {
        report.add(check, Status::Pass, what);
    }
    // Each invalid value gets its own line; the valid ones are still
    // expected of the canary.
    let kind = w.kind.as_str();
    let mut read = |flag: &str, env: &str| -> (bool, Vec<TaintSpec>) {
        let raw: Vec<String> = w
            .containers
            .iter()
            .flat_map(|c| container_flag(c, flag, env))
            .collect();
        let mut taints = Vec::new();
        for t in &raw {
            match t.parse::<TaintSpec>() {
                Ok(t) => taints.push(t),
                Err(e) => report.add(
                    "configured taints",
                    Status::Fail,
                    format!("the {kind}'s {flag} {t:?} is invalid: {e}"),
                ),
            }
        }
        (raw.is_empty(), taints)
    };
    let (unset, mut taints) = read("--taint", "NODEGATE_TAINTS");
    if unset {
        taints = default().taints;
    }
    let (_, boot) = read("--boot-taint", "NODEGATE_BOOT_TAINTS");
    WebhookInfo {
        available: Some(available),
        workload: Some(w),
        flags: Flags {
            taints,
            boot,
            release: Vec::new(),
        },
    }
}

pub async fn check_daemonset(client: &Client, args: &Args, report: &mut Report) {
    const CHECK: &str = "agent daemonset";
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), &args.namespace);
    let ds = match api.get_opt(&args.daemonset).await {
        Ok(Some(d)) => d,
        Ok(None) => {
            report.add(CHECK, Status::Fail, format!("DaemonSet {}/{} not found: nothing removes the taint, nodes stay unschedulable", args.namespace, args.daemonset));
            return;
        }
        Err(e) => {
            report.add(
                CHECK,
                Status::Skip,
                format!(
                    "cannot read DaemonSet {}/{}: {e}",
                    args.namespace, args.daemonset
                ),
            );
            return;
        }
    };
    let s = ds.status.unwrap_or_default();
    let (desired, available) = (s.desired_number_scheduled, s.number_available.unwrap_or(0));
    let what = format!(
        "{}/{}: {available}/{desired} available",
        args.namespace, args.daemonset
    );
    if desired == 0 {
        report.add(CHECK, Status::Warn, format!("{what}: scheduled on no node"));
    } else if available < desired {
        report.add(
            CHECK,
            Status::Warn,
            format!("{what}: nodes without a ready agent keep the taint (check tolerations and the agent's logs)"),
        );
    } else {
        report.add(CHECK, Status::Pass, what);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_from_args_or_env() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "w", "args": ["--listen=0.0.0.0:9443", "--taint=a.io/x=true:NoSchedule", "--taint", "b.io/y:NoExecute"]
        }))
        .unwrap();
        assert_eq!(
            container_taints(&c),
            vec!["a.io/x=true:NoSchedule", "b.io/y:NoExecute"]
        );
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "w", "env": [{"name": "NODEGATE_TAINTS", "value": "a.io/x:NoSchedule, b.io/y:NoSchedule"}]
        }))
        .unwrap();
        assert_eq!(
            container_taints(&c),
            vec!["a.io/x:NoSchedule", "b.io/y:NoSchedule"]
        );
    }
}
