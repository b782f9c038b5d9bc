//! What runs the webhook: its StatefulSet (available replicas, and the
//! `--taint` and `--boot-taint` flags it runs with; a Deployment of that name
//! when an install from before the per-replica lines has no StatefulSet).
//!
//! [`read_webhook`] gets it; [`verdict`] judges it into the `webhook
//! statefulset` (or `webhook deployment`) line, a `configured taints` line
//! per invalid flag value, and the [`WebhookInfo`] the canary, the lines and
//! the diagnosis read.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Container;
use kube::{Api, Client};
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::DEFAULT_TAINT;

use crate::container_flags::{Flags, container_flag};
use crate::read::Read;
use crate::report::{Line, Report, Status};

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

/// What the canary, the lines and the diagnosis need from the workload.
#[derive(Debug, Clone, Default)]
pub struct WebhookInfo {
    /// The workload, when read.
    pub workload: Option<WebhookWorkload>,
    /// Available replicas, when the workload was read (0 when missing).
    pub available: Option<i32>,
    /// The taints the webhook runs with: its `--taint` args or
    /// `NODEGATE_TAINTS` (nodegate's default without either), and strict
    /// mode's `--boot-taint` or `NODEGATE_BOOT_TAINTS` (none without either),
    /// and the owned gates' `--owned-taint` or `NODEGATE_OWNED_TAINTS`.
    pub flags: Flags,
}

/// The `--taint` values of a container (`--taint=X`, `--taint X`, or the
/// `NODEGATE_TAINTS` env var, as the webhook's clap reads them).
pub fn container_taints(c: &Container) -> Vec<String> {
    container_flag(c, "--taint", "NODEGATE_TAINTS")
}

fn default_flags() -> Flags {
    Flags {
        taints: DEFAULT_TAINT.parse::<TaintSpec>().into_iter().collect(),
        boot: Vec::new(),
        release: Vec::new(),
        owned: Vec::new(),
    }
}

/// The workload's line: available replicas, and an older install's
/// Deployment left beside the StatefulSet.
fn availability(w: &WebhookWorkload) -> Line {
    let check = match w.kind {
        Kind::StatefulSet => "webhook statefulset",
        Kind::Deployment => "webhook deployment",
    };
    let (ns, name) = (&w.namespace, &w.name);
    let (available, want) = (w.available, w.replicas);
    let what = format!("{ns}/{name}: {available}/{want} available");
    if available == 0 || !w.available_condition {
        Line::new(check, Status::Fail, format!("{what}: the webhook is down"))
    } else if available < want {
        Line::new(
            check,
            Status::Warn,
            format!("{what}: one more failure and the webhook is down"),
        )
    } else if w.leftover_deployment {
        Line::new(
            check,
            Status::Warn,
            format!(
                "{what}; the Deployment {ns}/{name} of an older install is still there: delete it (its Pods take the webhook's host port and anti-affinity from the StatefulSet's)"
            ),
        )
    } else {
        Line::new(check, Status::Pass, what)
    }
}

/// The taint flags the workload's containers run with, and a `configured
/// taints` line for each invalid value (the valid ones are still expected
/// of the canary).
fn running_flags(w: &WebhookWorkload) -> (Flags, Vec<Line>) {
    let kind = w.kind.as_str();
    let mut lines = Vec::new();
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
                Err(e) => lines.push(Line::new(
                    "configured taints",
                    Status::Fail,
                    format!("the {kind}'s {flag} {t:?} is invalid: {e}"),
                )),
            }
        }
        (raw.is_empty(), taints)
    };
    let (unset, mut taints) = read("--taint", "NODEGATE_TAINTS");
    if unset {
        taints = default_flags().taints;
    }
    let (_, boot) = read("--boot-taint", "NODEGATE_BOOT_TAINTS");
    let (_, owned) = read("--owned-taint", "NODEGATE_OWNED_TAINTS");
    let flags = Flags {
        taints,
        boot,
        release: Vec::new(),
        owned,
    };
    (flags, lines)
}

/// The lines for the webhook workload `ns/name` as read, and what the later
/// checks need of it.
pub fn verdict(
    ns: &str,
    name: &str,
    read: &Read<Box<WebhookWorkload>>,
) -> (Vec<Line>, WebhookInfo) {
    const CHECK: &str = "webhook statefulset";
    let w = match read {
        Read::Found(w) => w,
        Read::Missing => {
            let line = Line::new(
                CHECK,
                Status::Fail,
                format!("StatefulSet {ns}/{name} not found (nor a Deployment of that name)"),
            );
            let info = WebhookInfo {
                workload: None,
                available: Some(0),
                flags: default_flags(),
            };
            return (vec![line], info);
        }
        Read::Unreadable(e) => {
            let info = WebhookInfo {
                workload: None,
                available: None,
                flags: default_flags(),
            };
            return (vec![Line::new(CHECK, Status::Skip, e.clone())], info);
        }
    };
    let mut lines = vec![availability(w)];
    let (flags, invalid) = running_flags(w);
    lines.extend(invalid);
    let info = WebhookInfo {
        available: Some(w.available),
        workload: Some(w.as_ref().clone()),
        flags,
    };
    (lines, info)
}

/// The StatefulSet `ns/name`, else a Deployment of that name; an error
/// names the object it was reading.
pub async fn read_webhook(client: &Client, ns: &str, name: &str) -> Read<Box<WebhookWorkload>> {
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

/// Reads the webhook workload `ns/name` and reports [`verdict`].
pub async fn check_webhook(
    client: &Client,
    ns: &str,
    name: &str,
    report: &mut Report,
) -> WebhookInfo {
    let (lines, info) = verdict(ns, name, &read_webhook(client, ns, name).await);
    report.extend(lines);
    info
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    fn sts(available: i32, args: &[&str]) -> Read<Box<WebhookWorkload>> {
        Read::Found(Box::new(WebhookWorkload {
            kind: Kind::StatefulSet,
            namespace: "nodegate".into(),
            name: "nodegate-webhook".into(),
            replicas: 2,
            available,
            available_condition: available > 0,
            template_labels: BTreeMap::new(),
            containers: vec![serde_json::from_value(json!({"name": "w", "args": args})).unwrap()],
            leftover_deployment: false,
        }))
    }

    fn edited(
        read: Read<Box<WebhookWorkload>>,
        edit: impl FnOnce(&mut WebhookWorkload),
    ) -> Read<Box<WebhookWorkload>> {
        read.map(|mut w| {
            edit(&mut w);
            w
        })
    }

    /// Each row: the read, then (check, status, detail) of every line, and
    /// the available replicas and taint flags handed on.
    #[test]
    fn verdicts() {
        type Row<'a> = (
            Read<Box<WebhookWorkload>>,
            Vec<(&'a str, Status, &'a str)>,
            Option<i32>,
            Flags,
        );
        let default = Flags::of(&[DEFAULT_TAINT], &[]);
        let sts_line = "webhook statefulset";
        let rows: Vec<Row> = vec![
            (
                sts(2, &[]),
                vec![(
                    sts_line,
                    Status::Pass,
                    "nodegate/nodegate-webhook: 2/2 available",
                )],
                Some(2),
                default.clone(),
            ),
            (
                sts(1, &[]),
                vec![(
                    sts_line,
                    Status::Warn,
                    "nodegate/nodegate-webhook: 1/2 available: one more failure and the webhook is down",
                )],
                Some(1),
                default.clone(),
            ),
            (
                sts(0, &[]),
                vec![(
                    sts_line,
                    Status::Fail,
                    "nodegate/nodegate-webhook: 0/2 available: the webhook is down",
                )],
                Some(0),
                default.clone(),
            ),
            (
                edited(sts(2, &[]), |w| w.leftover_deployment = true),
                vec![(
                    sts_line,
                    Status::Warn,
                    "nodegate/nodegate-webhook: 2/2 available; the Deployment nodegate/nodegate-webhook of an older install is still there: delete it (its Pods take the webhook's host port and anti-affinity from the StatefulSet's)",
                )],
                Some(2),
                default.clone(),
            ),
            (
                edited(sts(2, &[]), |w| {
                    w.kind = Kind::Deployment;
                    w.available_condition = false;
                }),
                vec![(
                    "webhook deployment",
                    Status::Fail,
                    "nodegate/nodegate-webhook: 2/2 available: the webhook is down",
                )],
                Some(2),
                default.clone(),
            ),
            (
                sts(
                    2,
                    &[
                        "--taint=a.io/x:NoSchedule",
                        "--taint=bad",
                        "--boot-taint=a.io/x:NoExecute",
                    ],
                ),
                vec![
                    (sts_line, Status::Pass, "2/2 available"),
                    (
                        "configured taints",
                        Status::Fail,
                        "the StatefulSet's --taint \"bad\" is invalid: ",
                    ),
                ],
                Some(2),
                Flags::of(&["a.io/x:NoSchedule"], &["a.io/x:NoExecute"]),
            ),
            (
                Read::Missing,
                vec![(
                    sts_line,
                    Status::Fail,
                    "StatefulSet nodegate/nodegate-webhook not found (nor a Deployment of that name)",
                )],
                Some(0),
                default.clone(),
            ),
            (
                Read::Unreadable("cannot read StatefulSet nodegate/nodegate-webhook: 403".into()),
                vec![(
                    sts_line,
                    Status::Skip,
                    "cannot read StatefulSet nodegate/nodegate-webhook: 403",
                )],
                None,
                default,
            ),
        ];
        for (read, want, available, flags) in rows {
            let (lines, info) = verdict("nodegate", "nodegate-webhook", &read);
            assert_eq!(lines.len(), want.len(), "{lines:?}");
            for (got, (check, status, part)) in lines.iter().zip(&want) {
                assert_eq!(
                    (got.check.as_str(), got.status),
                    (*check, *status),
                    "{}",
                    got.detail
                );
                assert!(got.detail.contains(part), "{:?} lacks {part:?}", got.detail);
            }
            assert_eq!((info.available, info.flags), (available, flags), "{want:?}");
        }
    }
}
