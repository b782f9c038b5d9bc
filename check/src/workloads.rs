//! What runs the webhook and the agent: the webhook's Service (and port),
//! its Deployment (available replicas, and the `--taint` and `--boot-taint`
//! flags it runs with), and the agent DaemonSet.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Container, Service};
use kube::{Api, Client};
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::DEFAULT_TAINT;

use crate::strict_mode::Flags;
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

/// The values of a repeatable, comma-delimited flag as clap reads them:
/// `flag=X` or `flag X` in the args (commas split values), else the `env`
/// variable's literal value when no arg gives one.
pub fn container_flag(c: &Container, flag: &str, env: &str) -> Vec<String> {
    let args: Vec<&str> = c
        .args
        .iter()
        .flatten()
        .chain(c.command.iter().flatten())
        .map(String::as_str)
        .collect();
    let split = |v: &str| -> Vec<String> {
        v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    };
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            out.extend(split(v));
        } else if *a == flag
            && let Some(v) = it.next()
        {
            out.extend(split(v));
        }
    }
    if out.is_empty()
        && let Some(v) = c
            .env
            .iter()
            .flatten()
            .find(|e| e.name == env)
            .and_then(|e| e.value.clone())
    {
        out.extend(split(&v));
    }
    out
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
        flags: Flags { taints, boot },
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

    /// Args win over the env var, commas split values as clap's
    /// value_delimiter does, and `--taint` is not `--taint-x`.
    #[test]
    fn flags_follow_clap() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "w",
            "args": ["--boot-taint=a.io/x:NoExecute,b.io/y:NoExecute", "--boot-taints=c.io/z:NoExecute"],
            "env": [{"name": "NODEGATE_BOOT_TAINTS", "value": "d.io/w:NoExecute"}]
        }))
        .unwrap();
        assert_eq!(
            container_flag(&c, "--boot-taint", "NODEGATE_BOOT_TAINTS"),
            vec!["a.io/x:NoExecute", "b.io/y:NoExecute"]
        );
        assert_eq!(container_taints(&c), Vec::<String>::new());
    }
}
