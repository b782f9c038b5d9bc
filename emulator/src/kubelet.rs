//! A simulated kubelet that writes its Node exactly the way kubelet does
//! (`pkg/kubelet/kubelet_node_status.go`): every start POSTs a create; on
//! AlreadyExists it GETs the node and writes `nodes/status` with a strategic
//! merge patch. Heartbeats are status patches too. Pods bound to the node
//! go through the kubelet's admission ([`crate::pod_admission`], after
//! `pkg/kubelet/kubelet.go` `HandlePodAdditions` and `rejectPod`).

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

    /// What the `Ready` condition reports from now on (a freshly started
    /// kubelet reports NotReady until its runtime checks pass).
    pub fn set_ready(&mut self, ready: bool) {
        self.ready = ready;
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

    /// The status this kubelet reports now.
    pub fn status(&self) -> Value {
        let now = util::now_rfc3339();
        let cond = |t: &str, s: &str, reason: &str| {
            json!({"type": t, "status": s, "reason": reason, "message": reason,
                   "lastHeartbeatTime": now, "lastTransitionTime": now})
        };
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
            "addresses": [{"type": "Hostname", "address": self.name}],
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "nodeInfo": {
                "bootID": self.boot_id,
                "machineID": "0123456789abcdef0123456789abcdef",
                "systemUUID": "00000000-0000-0000-0000-000000000000",
                "kernelVersion": "6.1.0",
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://1.7.0",
                "kubeletVersion": "v1.32.0",
                "kubeProxyVersion": "v1.32.0",
                "operatingSystem": "linux",
                "architecture": "amd64"
            }
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
