//! The real Cluster Autoscaler as a child process with its KWOK cloud
//! provider (`KWOK_PROVIDER_MODE=local`): one node group, `ca-e2e`, whose
//! Nodes CA creates from a template in the `kwok-provider-templates`
//! ConfigMap; the Deployment object that says how it runs (for
//! nodegate-check); and the status CA writes every loop.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::scale::control_plane::Proc;
use crate::scale::install::kubectl;

/// CA's namespace (its `--namespace`, the KWOK provider's `POD_NAMESPACE`).
pub const NAMESPACE: &str = "kube-system";
/// The label the KWOK provider groups Nodes by (`fromNodeLabelKey`).
pub const GROUP_LABEL: &str = "nodegate.dev/ca-e2e-group";
/// The node group.
pub const GROUP: &str = "ca-e2e";
/// The annotation the KWOK provider marks its Nodes' group with.
pub const GROUP_ANNOTATION: &str = "cluster-autoscaler.kwok.nodegroup/name";
/// The node group's maximum size: bounds what duplicates can cost here.
pub const MAX_GROUP_SIZE: usize = 24;
/// The status CA writes at the end of every loop.
pub const STATUS_CONFIGMAP: &str = "cluster-autoscaler-status";
/// The image of the Deployment object (nothing pulls it: replicas 0).
pub const IMAGE: &str = "registry.k8s.io/autoscaling/cluster-autoscaler:v1.31.5";
/// The Deployment nodegate-check reads.
pub const DEPLOYMENT: &str = "cluster-autoscaler";
/// What every Node of the group has, as the simulated kubelet reports it.
pub const NODE_CPU_MILLI: u64 = 8000;

/// The KWOK provider's configuration: templates from the ConfigMap, groups
/// by [`GROUP_LABEL`], no taint of its own (`skipTaint`), so the only taints
/// on its Nodes are the API server's and nodegate's.
const KWOK_CONFIG: &str = r#"apiVersion: v1alpha1
readNodesFrom: configmap
nodegroups:
  fromNodeLabelKey: "nodegate.dev/ca-e2e-group"
nodes:
  skipTaint: true
configmap:
  name: kwok-provider-templates
"#;

/// The group's template: the simulated kubelet's capacity; no hostname
/// label (a template carries none); `Ready=False` as a kubelet registering,
/// until the kubelet of the Node reports.
fn template() -> String {
    let resources =
        json!({"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"});
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": GROUP,
            "annotations": {
                "cluster-autoscaler.kwok.nodegroup/max-count": MAX_GROUP_SIZE.to_string(),
            },
            "labels": {
                GROUP_LABEL: GROUP,
                "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
            },
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                            "message": "registering"}],
        },
    });
    json!({"apiVersion": "v1", "kind": "List", "items": [node]}).to_string()
}

/// Both ConfigMaps the KWOK provider reads at start.
pub fn configure(kubeconfig: &Path) -> anyhow::Result<()> {
    let cms = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "kwok-provider-config", "namespace": NAMESPACE},
         "data": {"config": KWOK_CONFIG}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "kwok-provider-templates", "namespace": NAMESPACE},
         "data": {"templates": template()}},
    ]});
    kubectl(
        kubeconfig,
        &["apply", "--server-side", "-f", "-"],
        Some(&cms.to_string()),
    )?;
    Ok(())
}

/// CA's flags: the KWOK provider, the defaults the scenarios depend on
/// spelt out, and `--startup-taint` for each of `startup_taints`.
/// Leader election is off (one replica, and a restart must not wait for
/// the old lease); the metrics port is any free one.
pub fn args(kubeconfig: &Path, startup_taints: &[&str]) -> Vec<String> {
    let mut a = vec![
        "--cloud-provider=kwok".to_string(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--namespace={NAMESPACE}"),
        "--scan-interval=10s".into(),
        "--max-node-provision-time=15m".into(),
        "--leader-elect=false".into(),
        "--address=127.0.0.1:0".into(),
        "--v=4".into(),
    ];
    a.extend(
        startup_taints
            .iter()
            .map(|k| format!("--startup-taint={k}")),
    );
    a
}

/// The Deployment that says how CA runs: replicas 0 (the process here is
/// what runs), the upstream image and command, and the same args as the
/// process, so nodegate-check reads what actually runs.
pub fn publish(kubeconfig: &Path, args: &[String]) -> anyhow::Result<()> {
    let labels = json!({"app.kubernetes.io/name": DEPLOYMENT});
    let d = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{
                    "name": DEPLOYMENT, "image": IMAGE,
                    "command": ["./cluster-autoscaler"], "args": args,
                    "env": [{"name": "POD_NAMESPACE", "value": NAMESPACE},
                            {"name": "KWOK_PROVIDER_MODE", "value": "local"}],
                }]},
            },
        },
    });
    kubectl(
        kubeconfig,
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(&d.to_string()),
    )?;
    Ok(())
}

/// The running CA.
#[derive(Debug)]
pub struct Autoscaler {
    proc: Proc,
}

impl Autoscaler {
    /// Starts `bin` with `args` as the admin (`kubeconfig`); its log is
    /// `<log_dir>/<name>.log`.
    pub fn start(
        bin: &Path,
        name: &str,
        log_dir: &Path,
        kubeconfig: &Path,
        args: &[String],
    ) -> anyhow::Result<Self> {
        let proc = Proc::spawn(
            name,
            log_dir,
            bin,
            args,
            &[
                ("KUBECONFIG", kubeconfig.display().to_string()),
                ("KWOK_PROVIDER_MODE", "local".into()),
                ("POD_NAMESPACE", NAMESPACE.into()),
            ],
        )?;
        Ok(Self { proc })
    }

    /// SIGTERM: CA deletes every Node its KWOK provider made, then exits.
    pub async fn stop(self) {
        self.proc.stop(Duration::from_secs(60)).await;
    }
}

/// One status CA wrote.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When the harness saw it.
    pub seen: Instant,
    /// The start of the loop that wrote it (CA's `time`).
    pub loop_start: Option<Timestamp>,
    /// `Healthy` or `Unhealthy`.
    pub health: String,
    pub ready: u64,
    pub unready: u64,
    pub not_started: u64,
    pub registered: u64,
    /// The cluster-wide scale-up condition (`InProgress`, `NoActivity`…).
    pub scale_up: String,
}

/// Every status CA wrote, as watched.
pub type Statuses = Arc<Mutex<Vec<Sample>>>;

/// CA's `time`: `2023-11-24 04:28:19.546750398 +0000 UTC` (Go's
/// `2006-01-02 15:04:05.999999999 -0700 MST`).
pub fn parse_time(s: &str) -> Option<Timestamp> {
    let mut it = s.split_whitespace();
    let (date, time, off) = (it.next()?, it.next()?, it.next()?);
    if off.len() != 5 {
        return None;
    }
    let off = format!("{}:{}", &off[..3], &off[3..]);
    format!("{date}T{time}{off}").parse().ok()
}

fn sample(cm: &ConfigMap) -> Option<Sample> {
    let text = cm.data.as_ref()?.get("status")?;
    let v: Value = serde_yaml::from_str(text).ok()?;
    let health = &v["clusterWide"]["health"];
    let reg = &health["nodeCounts"]["registered"];
    let n = |x: &Value| x.as_u64().unwrap_or(0);
    Some(Sample {
        seen: Instant::now(),
        loop_start: v["time"].as_str().and_then(parse_time),
        health: health["status"].as_str().unwrap_or_default().to_string(),
        ready: n(&reg["ready"]),
        unready: n(&reg["unready"]["total"]),
        not_started: n(&reg["notStarted"]),
        registered: n(&reg["total"]),
        scale_up: v["clusterWide"]["scaleUp"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    })
}

/// Watches CA's status ConfigMap until the process ends.
pub fn watch_status(admin: Client) -> (Statuses, JoinHandle<()>) {
    let out: Statuses = Arc::default();
    let rec = out.clone();
    let task = tokio::spawn(async move {
        let api: Api<ConfigMap> = Api::namespaced(admin, NAMESPACE);
        let cfg = watcher::Config::default().fields(&format!("metadata.name={STATUS_CONFIGMAP}"));
        let stream = watcher(api, cfg).default_backoff().applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(cm) => {
                    if let Some(s) = sample(&cm) {
                        rec.lock().unwrap_or_else(|e| e.into_inner()).push(s);
                    }
                }
                Err(e) => tracing::debug!(error = %e, "status watch"),
            }
        }
    });
    (out, task)
}

/// Every status seen.
pub fn all(statuses: &Statuses) -> Vec<Sample> {
    statuses.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The statuses seen since `since`.
pub fn since(statuses: &Statuses, since: Instant) -> Vec<Sample> {
    statuses
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|s| s.seen >= since)
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_time() {
        let t = parse_time("2023-11-24 04:28:19.546750398 +0000 UTC").expect("parses");
        assert_eq!(t.to_string(), "2023-11-24T04:28:19.546750398Z");
        assert!(parse_time("garbage").is_none());
    }

    #[test]
    fn status_sample() {
        let cm: ConfigMap = serde_json::from_value(json!({"data": {"status":
            "time: \"2023-11-24 04:28:19.546750398 +0000 UTC\"\nclusterWide:\n  health:\n    status: \"Unhealthy\"\n    nodeCounts:\n      registered:\n        total: 10\n        ready: 4\n        notStarted: 3\n        unready:\n          total: 2\n  scaleUp:\n    status: \"NoActivity\"\n"}}))
        .expect("a ConfigMap");
        let s = sample(&cm).expect("a sample");
        assert_eq!(s.health, "Unhealthy");
        assert_eq!(
            (s.ready, s.unready, s.not_started, s.registered),
            (4, 2, 3, 10)
        );
        assert_eq!(s.scale_up, "NoActivity");
        assert!(s.loop_start.is_some());
    }
}
