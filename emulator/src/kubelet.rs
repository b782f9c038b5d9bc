//! A simulated kubelet that writes its Node exactly the way kubelet does
//! (`pkg/kubelet/kubelet_node_status.go`): every start POSTs a create; on
//! AlreadyExists it GETs the node and writes `nodes/status` with a strategic
//! merge patch. Heartbeats are status patches too. Pods bound to the node
//! go through the kubelet's admission ([`crate::pod_admission`], after
//! `pkg/kubelet/kubelet.go` `HandlePodAdditions` and `rejectPod`).
//!
//! The one simulated kubelet: the emulator suites drive it call by call,
//! and the scale harness (`e2e/src/scale/kubelet.rs`) runs 1,000 of them
//! against a real API server, adding the Lease and the status loop.
//! Simplified on purpose: on AlreadyExists the kubelet's patch through
//! `nodes/status` reconciles its labels (`tryRegisterWithAPIServer`) and
//! its first status update follows (`syncNodeStatus`); here one patch
//! carries both, so a reboot's new boot ID arrives with the registration.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::pod_admission::{self, Admission};
use crate::tolerations::COMPARISON_OPERATORS_DEFAULT;
use crate::users;
use crate::util;

/// One node's kubelet.
#[derive(Clone)]
pub struct SimKubelet {
    name: String,
    boot_id: String,
    labels: Value,
    register_taints: Vec<Value>,
    ready: bool,
    internal_ip: Option<String>,
    capacity: Value,
    node_info: Value,
    /// Each condition's status last reported and when it last changed:
    /// the kubelet keeps `lastTransitionTime` while a status stays the same
    /// (`ReadyCondition` and its siblings in
    /// `pkg/kubelet/nodestatus/setters.go`). Shared by clones, as one
    /// kubelet's memory is.
    transitions: Arc<Mutex<HashMap<&'static str, (bool, String)>>>,
    client: kube::Client,
}

impl std::fmt::Debug for SimKubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimKubelet")
            .field("name", &self.name)
            .field("boot_id", &self.boot_id)
            .finish_non_exhaustive()
    }
}

fn new_boot_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

impl SimKubelet {
    /// A kubelet for node `name` authenticated as `system:node:<name>`.
    pub async fn new(emu: &crate::server::Emulator, name: &str) -> anyhow::Result<Self> {
        Ok(Self::with_client(
            emu.client(&users::node(name)).await?,
            name,
        ))
    }

    /// A kubelet using a given client (e.g. a real cluster's node credentials).
    pub fn with_client(client: kube::Client, name: &str) -> Self {
        Self {
            name: name.to_string(),
            boot_id: new_boot_id(),
            labels: json!({
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            }),
            register_taints: Vec::new(),
            ready: true,
            internal_ip: None,
            capacity: json!({"cpu": "4", "memory": "16Gi", "pods": "110"}),
            node_info: json!({
                "machineID": "0123456789abcdef0123456789abcdef",
                "systemUUID": "00000000-0000-0000-0000-000000000000",
                "kernelVersion": "6.1.0",
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://1.7.0",
                "kubeletVersion": "v1.32.0",
                "kubeProxyVersion": "v1.32.0",
                "operatingSystem": "linux",
                "architecture": "amd64"
            }),
            transitions: Arc::default(),
            client,
        }
    }

    /// `--register-with-taints`: only effective at first creation.
    pub fn register_with_taints(mut self, taints: Vec<Value>) -> Self {
        self.register_taints = taints;
        self
    }

    /// Extra labels the kubelet sets on its node (e.g. the exclude label).
    pub fn with_label(mut self, key: &str, value: &str) -> Self {
        self.labels[key] = json!(value);
        self
    }

    /// `--node-ip`: reported as the node's InternalIP address.
    pub fn with_internal_ip(mut self, ip: &str) -> Self {
        self.internal_ip = Some(ip.to_string());
        self
    }

    /// The machine's capacity, also reported as allocatable.
    pub fn with_capacity(mut self, capacity: Value) -> Self {
        self.capacity = capacity;
        self
    }

    /// One field of `status.nodeInfo` (machine ID, versions); the boot ID is
    /// the boot's.
    pub fn with_node_info(mut self, field: &str, value: &str) -> Self {
        self.node_info[field] = json!(value);
        self
    }

    /// What the `Ready` condition reports from now on (a freshly started
    /// kubelet reports NotReady until its runtime checks pass).
    pub fn set_ready(&mut self, ready: bool) {
        self.ready = ready;
    }

    /// The boot this kubelet runs on (a harness that names its boots).
    pub fn set_boot_id(&mut self, boot_id: &str) {
        self.boot_id = boot_id.to_string();
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    pub fn api(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// When condition `ty` last changed: now if it changes with this report.
    fn transition(&self, ty: &'static str, status: bool, now: &str) -> String {
        let mut since = self.transitions.lock().unwrap_or_else(|e| e.into_inner());
        match since.get(ty) {
            Some((s, at)) if *s == status => at.clone(),
            _ => {
                since.insert(ty, (status, now.to_string()));
                now.to_string()
            }
        }
    }

    /// The status this kubelet reports now.
    pub fn status(&self) -> Value {
        let now = util::now_rfc3339();
        let cond = |t: &'static str, s: &str, reason: &str| {
            let since = self.transition(t, s == "True", &now);
            json!({"type": t, "status": s, "reason": reason, "message": reason,
                   "lastHeartbeatTime": now, "lastTransitionTime": since})
        };
        let mut addresses = Vec::new();
        if let Some(ip) = &self.internal_ip {
            addresses.push(json!({"type": "InternalIP", "address": ip}));
        }
        addresses.push(json!({"type": "Hostname", "address": self.name}));
        let mut node_info = self.node_info.clone();
        node_info["bootID"] = json!(self.boot_id);
        json!({
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID"),
                if self.ready {
                    cond("Ready", "True", "KubeletReady")
                } else {
                    cond("Ready", "False", "KubeletNotReady")
                },
            ],
            "addresses": addresses,
            "capacity": self.capacity,
            "allocatable": self.capacity,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": node_info,
        })
    }

    /// The Node the kubelet POSTs at start.
    pub fn initial_node(&self) -> Value {
        let mut spec = json!({});
        if !self.register_taints.is_empty() {
            spec["taints"] = json!(self.register_taints);
        }
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": self.labels,
                "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"}
            },
            "spec": spec,
            "status": self.status(),
        })
    }

    /// A kubelet start: create, or on AlreadyExists GET + status patch.
    pub async fn register(&self) -> anyhow::Result<Node> {
        let node: Node = serde_json::from_value(self.initial_node())?;
        match self.api().create(&PostParams::default(), &node).await {
            Ok(n) => Ok(n),
            Err(kube::Error::Api(s)) if s.reason == "AlreadyExists" => {
                let existing = self.api().get(&self.name).await?;
                tracing::debug!(node = %self.name, rv = ?existing.metadata.resource_version, "node exists, updating status");
                self.patch_status(true).await
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn patch_status(&self, reconcile_labels: bool) -> anyhow::Result<Node> {
        let mut patch = json!({
            "status": self.status(),
        });
        patch["status"]["$setElementOrder/conditions"] = json!([
            {"type": "MemoryPressure"}, {"type": "DiskPressure"}, {"type": "PIDPressure"}, {"type": "Ready"}
        ]);
        if reconcile_labels {
            patch["metadata"] = json!({"labels": self.labels});
        }
        Ok(self
            .api()
            .patch_status(
                &self.name,
                &PatchParams::default(),
                &Patch::Strategic(patch),
            )
            .await?)
    }

    /// A node status heartbeat (a status write that keeps the bootID).
    pub async fn heartbeat(&self) -> anyhow::Result<Node> {
        self.patch_status(false).await
    }

    /// The machine reboots (new bootID) and the kubelet starts again.
    pub async fn reboot(&mut self) -> anyhow::Result<Node> {
        self.boot_id = new_boot_id();
        self.register().await
    }

    /// The kubelet process restarts on the same boot.
    pub async fn restart(&self) -> anyhow::Result<Node> {
        self.register().await
    }

    /// The kubelet's start: every pod bound to it goes through admission
    /// (`HandlePodAdditions` with the API source's first list — a restart
    /// re-admits pods already running, a reboot too). Refused pods get
    /// `rejectPod`'s status (phase Failed), admitted ones Running.
    pub async fn admit_pods(&self) -> anyhow::Result<PodAdmissions> {
        self.admit(true).await
    }

    /// Pods bound since: the ones not yet Running go through admission
    /// (`HandlePodAdditions` for pods added later). Returns how many started.
    pub async fn sync_pods(&self) -> anyhow::Result<usize> {
        Ok(self.admit(false).await?.started.len())
    }

    /// The Node as the kubelet's informer holds it: a GET of its own object
    /// (the informer's lag is not modelled); before it exists, the node the
    /// kubelet would register (`getNodeAnyWay` falls back to `initialNode`).
    async fn node_taints(&self) -> anyhow::Result<Vec<Taint>> {
        let node = match self.api().get_opt(&self.name).await? {
            Some(n) => n,
            None => serde_json::from_value(self.initial_node())?,
        };
        Ok(node.spec.and_then(|s| s.taints).unwrap_or_default())
    }

    async fn admit(&self, all: bool) -> anyhow::Result<PodAdmissions> {
        let taints = self.node_taints().await?;
        let pods: Api<Pod> = Api::all(self.client.clone());
        let list = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={}", self.name)))
            .await?;
        let mut done = PodAdmissions::default();
        for p in list.items {
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            if running && !all {
                continue;
            }
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            let name = p.metadata.name.clone().unwrap_or_default();
            let status = match pod_admission::admit(&taints, &p, COMPARISON_OPERATORS_DEFAULT) {
                Admission::Skipped(_) => continue,
                Admission::Admitted if running => {
                    done.kept.push(format!("{ns}/{name}"));
                    continue;
                }
                Admission::Admitted => {
                    done.started.push(format!("{ns}/{name}"));
                    json!({"phase": "Running"})
                }
                Admission::Rejected { reason, message } => {
                    let status = pod_admission::rejected_status(&reason, &message);
                    done.rejected.push((format!("{ns}/{name}"), reason));
                    status
                }
            };
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            let written = api
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await;
            match written {
                // Deleted since the list: the status manager drops the update
                // (`pkg/kubelet/status/status_manager.go` `syncPod`).
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                r => {
                    r?;
                }
            }
        }
        Ok(done)
    }
}

/// What one admission pass of a kubelet did (pods as `namespace/name`):
/// its decisions, also for a pod deleted before its status was written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodAdmissions {
    /// Admitted and marked Running.
    pub started: Vec<String>,
    /// Admitted again while Running (no write).
    pub kept: Vec<String>,
    /// Refused, with the reason written to their status.
    pub rejected: Vec<(String, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubelet() -> SimKubelet {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        SimKubelet::with_client(kube::Client::try_from(config).unwrap(), "n1")
    }

    fn condition<'a>(status: &'a Value, ty: &str) -> &'a Value {
        status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == ty)
            .unwrap()
    }

    #[tokio::test]
    async fn a_condition_keeps_its_transition_time_until_its_status_changes() {
        let mut k = kubelet();
        k.set_ready(false);
        // The kubelet's memory of transitions, seeded as an older report.
        let old = "2020-01-01T00:00:00Z".to_string();
        for ty in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
            k.transitions
                .lock()
                .unwrap()
                .insert(ty, (false, old.clone()));
        }
        k.transitions
            .lock()
            .unwrap()
            .insert("Ready", (false, old.clone()));
        let s = k.status();
        assert_eq!(condition(&s, "Ready")["lastTransitionTime"], old);
        assert_eq!(condition(&s, "DiskPressure")["lastTransitionTime"], old);
        // A clone is the same kubelet: the flip is remembered by both.
        let mut clone = k.clone();
        clone.set_ready(true);
        let flipped = clone.status();
        assert_eq!(condition(&flipped, "Ready")["status"], "True");
        assert_ne!(condition(&flipped, "Ready")["lastTransitionTime"], old);
        assert_eq!(
            condition(&flipped, "DiskPressure")["lastTransitionTime"],
            old
        );
        k.set_ready(true);
        assert_eq!(
            condition(&k.status(), "Ready")["lastTransitionTime"],
            condition(&flipped, "Ready")["lastTransitionTime"]
        );
    }

    #[tokio::test]
    async fn the_machine_is_reported_as_configured() {
        let mut k = kubelet()
            .with_internal_ip("10.216.0.1")
            .with_capacity(json!({"cpu": "8"}))
            .with_node_info("kubeletVersion", "v1.36.2");
        k.set_boot_id("boot-2");
        let s = k.status();
        assert_eq!(
            s["addresses"],
            json!([
                {"type": "InternalIP", "address": "10.216.0.1"},
                {"type": "Hostname", "address": "n1"},
            ])
        );
        assert_eq!(s["capacity"], json!({"cpu": "8"}));
        assert_eq!(s["allocatable"], json!({"cpu": "8"}));
        assert_eq!(s["nodeInfo"]["kubeletVersion"], "v1.36.2");
        assert_eq!(s["nodeInfo"]["bootID"], "boot-2");
        assert_eq!(
            kubelet().status()["addresses"],
            json!([{"type": "Hostname", "address": "n1"}])
        );
        let node: Node = serde_json::from_value(k.initial_node()).unwrap();
        assert_eq!(
            node.status.and_then(|s| s.node_info).map(|i| i.boot_id),
            Some("boot-2".into())
        );
    }
}
