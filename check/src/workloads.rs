//! What runs the webhook and the agent: the webhook's Service (and port),
//! its Deployment (available replicas, and the `--taint` and `--boot-taint`
//! flags it runs with), and the agent DaemonSet.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Container, Service};
use kube::{Api, Client};
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::DEFAULT_TAINT;

use crate::container_flags::{Flags, container_flag};
use crate::webhook_config::Hook;
use crate::{Args, Report, Status};

/// What the canary and the diagnosis need from the Deployment.
#[derive(Debug, Clone, Default)]
pub struct DeploymentInfo {
    /// Available replicas, when the Deployment was read.
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

pub async fn check_deployment(client: &Client, args: &Args, report: &mut Report) -> DeploymentInfo {
    const CHECK: &str = "webhook deployment";
    let default = || Flags {
        taints: DEFAULT_TAINT.parse::<TaintSpec>().into_iter().collect(),
        boot: Vec::new(),
        release: Vec::new(),
    };
    let api: Api<Deployment> = Api::namespaced(client.clone(), &args.namespace);
    let d = match api.get_opt(&args.deployment).await {
        Ok(Some(d)) => d,
        Ok(None) => {
            report.add(
                CHECK,
                Status::Fail,
                format!(
                    "Deployment {}/{} not found",
                    args.namespace, args.deployment
                ),
            );
            return DeploymentInfo {
                available: Some(0),
                flags: default(),
            };
        }
        Err(e) => {
            report.add(
                CHECK,
                Status::Skip,
                format!(
                    "cannot read Deployment {}/{}: {e}",
                    args.namespace, args.deployment
                ),
            );
            return DeploymentInfo {
                available: None,
                flags: default(),
            };
        }
    };
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let status = d.status.unwrap_or_default();
    let available = status.available_replicas.unwrap_or(0);
    let cond_ok = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Available" && c.status == "True");
    let what = format!(
        "{}/{}: {available}/{want} available",
        args.namespace, args.deployment
    );
    if available == 0 || !cond_ok {
        report.add(CHECK, Status::Fail, format!("{what}: the webhook is down"));
    } else if available < want {
        report.add(
            CHECK,
            Status::Warn,
            format!("{what}: one more failure and the webhook is down"),
        );
    } else {
        report.add(CHECK, Status::Pass, what);
    }
    let containers = d
        .spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers)
        .unwrap_or_default();
    // Each invalid value gets its own line; the valid ones are still
    // expected of the canary.
    let mut read = |flag: &str, env: &str| -> (bool, Vec<TaintSpec>) {
        let raw: Vec<String> = containers
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
                    format!("the Deployment's {flag} {t:?} is invalid: {e}"),
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
    DeploymentInfo {
        available: Some(available),
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
