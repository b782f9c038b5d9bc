//! One simulated kubelet: the API calls a kubelet makes for its Node, with
//! its own client certificate (`system:node:<name>`), in the kubelet's order
//! (`pkg/kubelet/kubelet_node_status.go`): at every start a Node create
//! carrying the boot ID; on AlreadyExists a GET and a status patch, then the
//! first status update (which carries a new boot ID after a reboot); then
//! the Lease renewed every 10 s (`kube-node-lease`) and the status checked
//! every 10 s and written when it changed or every 5 minutes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::Notify;
use tokio::time::Instant;

/// `nodeStatusUpdateFrequency` and the Lease's renew interval.
pub const STATUS_UPDATE: Duration = Duration::from_secs(10);
/// `nodeStatusReportFrequency`: unchanged status is still written this often.
pub const STATUS_REPORT: Duration = Duration::from_secs(300);

/// What the rest of the harness shares with a simulated kubelet.
pub struct NodeShared {
    pub name: String,
    pub index: usize,
    pub client: Client,
    /// The stand-in network agent is ready: the kubelet reports the network
    /// ready and the agent's file probe passes.
    pub network_ready: AtomicBool,
    /// Poked when `network_ready` changes: the kubelet's runtime-status loop
    /// notices a change within its 5 s period; nothing nodegate measures
    /// depends on when.
    pub changed: Notify,
    /// Each condition's status last reported and when it last changed: the
    /// kubelet keeps `lastTransitionTime` while a status stays the same
    /// (Cluster Autoscaler copies a template only from a node whose
    /// conditions have not moved for a minute), across its own restarts too,
    /// as it reads them from the Node.
    pub transitions: std::sync::Mutex<std::collections::HashMap<&'static str, (bool, String)>>,
}

impl std::fmt::Debug for NodeShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeShared")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn now() -> String {
    Timestamp::now().to_string()
}

/// When condition `ty` last changed, now if it changes with this report.
fn transition(node: &NodeShared, ty: &'static str, status: bool, now: &str) -> String {
    let mut since = node.transitions.lock().unwrap_or_else(|e| e.into_inner());
    match since.get(ty) {
        Some((s, at)) if *s == status => at.clone(),
        _ => {
            since.insert(ty, (status, now.to_string()));
            now.to_string()
        }
    }
}

fn conditions(node: &NodeShared, ready: bool) -> serde_json::Value {
    let t = now();
    let cond = |ty: &'static str, status: &str, reason: &str| {
        let at = transition(node, ty, status == "True", &t);
        json!({"type": ty, "status": status, "reason": reason, "message": reason,
               "lastHeartbeatTime": t, "lastTransitionTime": at})
    };
    json!([
        cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        cond("PIDPressure", "False", "KubeletHasSufficientPID"),
        if ready {
            cond("Ready", "True", "KubeletReady")
        } else {
            cond("Ready", "False", "KubeletNotReady")
        },
    ])
}

fn status(node: &NodeShared, boot_id: &str, ready: bool) -> serde_json::Value {
    let resources =
        json!({"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"});
    json!({
        "capacity": resources,
        "allocatable": resources,
        "conditions": conditions(node, ready),
        "addresses": [
            {"type": "InternalIP", "address": node_ip(node.index)},
            {"type": "Hostname", "address": node.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "machineID": format!("{:032x}", node.index),
            "systemUUID": format!("{:032x}", node.index),
            "bootID": boot_id,
            "kernelVersion": "6.1.0", "osImage": "nodegate-scale", "containerRuntimeVersion": "containerd://1.6.20",
            "kubeletVersion": "v1.36.2", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
        },
    })
}

/// A private address per node (never routed: nothing connects to it).
pub fn node_ip(index: usize) -> String {
    format!("10.216.{}.{}", index / 250, index % 250 + 1)
}

/// The kubelet's first object (`initialNode`).
fn initial(node: &NodeShared, boot_id: &str, ready: bool) -> anyhow::Result<Node> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        // The kubelet's `initialNode` annotates the attach/detach mode
        // (`--enable-controller-attach-detach`, on by default).
        "metadata": {"name": node.name,
            "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            "labels": {
            "kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"}},
        "spec": {},
        "status": status(node, boot_id, ready),
    }))?)
}

#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error("node {0}: {1}")]
    Api(String, #[source] kube::Error),
    #[error("node {0}: {1}")]
    Build(String, #[source] anyhow::Error),
}

/// Registration as `registerWithAPIServer` does it: create, and on
/// AlreadyExists a GET and a status patch. Retries forever like the kubelet
/// (7 s cap), so a refused create shows as a node that never appears.
pub async fn register(node: &NodeShared, boot_id: &str) -> Result<(), KubeletError> {
    let api: Api<Node> = Api::all(node.client.clone());
    let ready = node.network_ready.load(Ordering::SeqCst);
    let obj =
        initial(node, boot_id, ready).map_err(|e| KubeletError::Build(node.name.clone(), e))?;
    let mut backoff = Duration::from_millis(100);
    loop {
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // tryRegisterWithAPIServer: reconcile labels and annotations,
                // then patch through nodes/status.
                let _existing = api
                    .get(&node.name)
                    .await
                    .map_err(|e| KubeletError::Api(node.name.clone(), e))?;
                api.patch_status(
                    &node.name,
                    &PatchParams::default(),
                    &Patch::Strategic(json!({})),
                )
                .await
                .map_err(|e| KubeletError::Api(node.name.clone(), e))?;
                return Ok(());
            }
            Err(e) => {
                tracing::warn!(node = %node.name, error = %e, "node create failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(7));
            }
        }
    }
}

/// One status write (`tryUpdateNodeStatus`'s strategic merge patch).
pub async fn write_status(node: &NodeShared, boot_id: &str) -> Result<(), KubeletError> {
    let api: Api<Node> = Api::all(node.client.clone());
    let ready = node.network_ready.load(Ordering::SeqCst);
    api.patch_status(
        &node.name,
        &PatchParams::default(),
        &Patch::Strategic(json!({"status": status(node, boot_id, ready)})),
    )
    .await
    .map_err(|e| KubeletError::Api(node.name.clone(), e))?;
    Ok(())
}

/// The kubelet of one boot after [`register`], until the task is aborted
/// (a crash).
pub async fn run_registered(node: Arc<NodeShared>, boot_id: String) {
    // syncNodeStatus right after registration: the first status update.
    let mut last_ready = node.network_ready.load(Ordering::SeqCst);
    let mut last_report = Instant::now();
    if let Err(e) = write_status(&node, &boot_id).await {
        tracing::warn!(error = %e, "status update failed");
    }
    let leases: Api<Lease> = Api::namespaced(node.client.clone(), "kube-node-lease");
    let mut lease: Option<Lease> = None;
    // Spread the 10 s loops of all nodes like independent kubelets would be.
    let mut next_lease = Instant::now();
    let mut next_status = Instant::now() + STATUS_UPDATE;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next_lease) => {
                lease = renew(&node, &leases, lease.take()).await;
                next_lease += STATUS_UPDATE;
            }
            () = tokio::time::sleep_until(next_status) => {
                let ready = node.network_ready.load(Ordering::SeqCst);
                if ready != last_ready || last_report.elapsed() >= STATUS_REPORT {
                    match write_status(&node, &boot_id).await {
                        Ok(()) => {
                            last_ready = ready;
                            last_report = Instant::now();
                        }
                        Err(e) => tracing::warn!(error = %e, "status update failed"),
                    }
                }
                next_status += STATUS_UPDATE;
            }
            () = node.changed.notified() => {
                // The runtime's network turned ready: the next status tick
                // writes it; bring that tick forward as the kubelet's
                // fast status update does.
                next_status = Instant::now();
            }
        }
    }
}

/// The node lease controller: create once, then update with the last
/// object (one request per renewal); on any error re-read next time.
async fn renew(node: &NodeShared, api: &Api<Lease>, last: Option<Lease>) -> Option<Lease> {
    let renew_time = MicroTime(Timestamp::now());
    let result = match last {
        Some(mut l) => {
            if let Some(spec) = l.spec.as_mut() {
                spec.renew_time = Some(renew_time);
            }
            api.replace(&node.name, &PostParams::default(), &l).await
        }
        None => {
            let fresh: Result<Lease, serde_json::Error> = serde_json::from_value(json!({
                "metadata": {"name": node.name, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": node.name, "leaseDurationSeconds": 40},
            }));
            let Ok(mut fresh) = fresh else { return None };
            if let Some(spec) = fresh.spec.as_mut() {
                spec.renew_time = Some(renew_time);
            }
            match api.create(&PostParams::default(), &fresh).await {
                Err(kube::Error::Api(s)) if s.code == 409 => match api.get(&node.name).await {
                    Ok(mut l) => {
                        if let Some(spec) = l.spec.as_mut() {
                            spec.renew_time = Some(MicroTime(Timestamp::now()));
                        }
                        api.replace(&node.name, &PostParams::default(), &l).await
                    }
                    Err(e) => Err(e),
                },
                r => r,
            }
        }
    };
    match result {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::debug!(node = %node.name, error = %e, "lease renewal failed");
            None
        }
    }
}
