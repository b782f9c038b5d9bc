//! The scenarios and their figures (`FIGURE name value` lines). Each
//! returns the goals it missed as failures rather than panicking, so one
//! run reports every figure. One file a scenario; here the report, the
//! context they share and the helpers more than one uses.

mod audit;
mod latency;
mod prune;
mod rollout;
mod steady;
mod storm;
mod wave;
mod writes;

pub use prune::prune;
pub use rollout::rollout;
pub use steady::steady;
pub use storm::storm;
pub use wave::wave;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::time::Instant;

use super::fleet::{Fleet, Times};
use super::observe::{Shared, percentile};
use super::pki::Pki;
use crate::metrics;

/// Figures and missed goals of a run.
#[derive(Debug, Default)]
pub struct Report {
    pub figures: Vec<(String, String)>,
    pub failures: Vec<String>,
}

impl Report {
    pub fn figure(&mut self, name: &str, value: impl std::fmt::Display) {
        let v = value.to_string();
        println!("FIGURE {name} {v}");
        self.figures.push((name.into(), v));
    }
    pub fn goal(&mut self, ok: bool, what: String) {
        if ok {
            println!("GOAL met: {what}");
        } else {
            println!("GOAL MISSED: {what}");
            self.failures.push(what);
        }
    }
}

pub struct Ctx<'a> {
    pub admin: Client,
    pub fleet: Arc<Fleet>,
    pub rec: Shared,
    pub pki: &'a Pki,
    pub webhook_admin: Vec<String>,
    pub audit_log: std::path::PathBuf,
    pub pids: BTreeMap<String, u32>,
    /// Gates in the install (`--gates`).
    pub gates: usize,
    /// The other gates' stand-ins: gate k ready k × this after the network
    /// agent in the storm, and in the wave.
    pub gate_stagger: Duration,
    pub wave_gate_stagger: Duration,
}

/// The first `n` gates, one bit each ([`super::observe::NodeState::gates`]).
fn all_gates(n: usize) -> u8 {
    ((1u16 << n) - 1) as u8
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

const P50_P99: &[(&str, f64)] = &[("p50", 0.5), ("p99", 0.99)];
const P50_P99_MAX: &[(&str, f64)] = &[("p50", 0.5), ("p99", 0.99), ("max", 1.0)];

/// `<name>_<label>_ms` for each quantile of `v` (milliseconds).
fn ms_quantiles(r: &mut Report, name: &str, v: &mut [f64], qs: &[(&str, f64)]) {
    for (label, q) in qs {
        r.figure(
            &format!("{name}_{label}_ms"),
            format!("{:.0}", percentile(v, *q)),
        );
    }
}

/// Registration → `started` (a container's start) for each of `nodes`.
fn after_registration(
    times: &Times,
    started: &HashMap<String, Instant>,
    nodes: &[String],
) -> Vec<f64> {
    nodes
        .iter()
        .filter_map(|n| {
            Some(ms(started
                .get(n)?
                .saturating_duration_since(*times.registered.get(n)?)))
        })
        .collect()
}

/// Nodes of `nodes` whose agent container (`started`) ran only after their
/// network agent was ready.
fn started_after_ready(
    times: &Times,
    started: &HashMap<String, Instant>,
    nodes: &[String],
) -> usize {
    nodes
        .iter()
        .filter(|n| matches!((started.get(*n), times.network_ready.get(*n)), (Some(a), Some(rd)) if a > rd))
        .count()
}

/// Every node in `names` has a version and its latest one is ungated.
fn all_ungated(rec: &Shared, names: &[String]) -> bool {
    let r = rec.lock();
    names.iter().all(|n| {
        r.nodes
            .get(n)
            .and_then(|v| v.last())
            .is_some_and(|v| !v.obj.gated)
    })
}

/// A Deployment of `replicas` pause pods, optionally pinned to `nodes`.
async fn deployment(
    admin: &Client,
    name: &str,
    replicas: usize,
    nodes: Option<&[String]>,
) -> anyhow::Result<()> {
    let mut spec = json!({
        "containers": [{"name": "pause", "image": "localhost/pause:1", "imagePullPolicy": "Never",
                        "resources": {"requests": {"cpu": "10m", "memory": "8Mi"}}}],
        "terminationGracePeriodSeconds": 0,
    });
    if let Some(nodes) = nodes {
        spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}]}}});
    }
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": spec}},
    }))?;
    Api::<Deployment>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &d)
        .await?;
    Ok(())
}

/// Pods of Deployment `app` bound to a node (as the watch saw them).
async fn bound_pods(admin: &Client, app: &str) -> anyhow::Result<usize> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let list = pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?;
    Ok(list
        .items
        .iter()
        .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
        .count())
}

/// CPU seconds so far of each process in `pids`.
fn cpu(pids: &BTreeMap<String, u32>) -> BTreeMap<String, f64> {
    pids.iter()
        .filter_map(|(n, p)| metrics::cpu_seconds(*p).map(|c| (n.clone(), c)))
        .collect()
}

fn cpu_figures(
    r: &mut Report,
    prefix: &str,
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    secs: f64,
) {
    let mut top = (String::new(), 0.0);
    for (n, a) in after {
        let b = before.get(n).copied().unwrap_or(0.0);
        let cores = (a - b) / secs;
        r.figure(&format!("{prefix}_cpu_cores_{n}"), format!("{cores:.2}"));
        if cores > top.1 {
            top = (n.clone(), cores);
        }
    }
    r.figure(&format!("{prefix}_busiest"), &top.0);
}
