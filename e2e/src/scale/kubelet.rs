//! One simulated kubelet at scale: the emulator's [`SimKubelet`] (the one
//! model of the kubelet's Node writes, `pkg/kubelet/kubelet_node_status.go`)
//! with its own client certificate (`system:node:<name>`), plus what a
//! kubelet does for hours that the emulator suites never wait for: the
//! Lease renewed every 10 s (`kube-node-lease`) and the status checked
//! every 10 s and written when it changed or every 5 minutes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use nodegate_emulator::kubelet::SimKubelet;
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
    pub client: kube::Client,
    /// The node's kubelet, its boot and readiness set per write; clones
    /// share its memory of condition transitions (Cluster Autoscaler copies
    /// a template only from a node whose conditions have not moved for a
    /// minute).
    pub kubelet: SimKubelet,
    /// The stand-in network agent is ready: the kubelet reports the network
    /// ready and the agent's file probe passes.
    pub network_ready: AtomicBool,
    /// Poked when `network_ready` changes: the kubelet's runtime-status loop
    /// notices a change within its 5 s period; nothing nodegate measures
    /// depends on when.
    pub changed: Notify,
}

impl std::fmt::Debug for NodeShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeShared")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A private address per node (never routed: nothing connects to it).
pub fn node_ip(index: usize) -> String {
    format!("10.216.{}.{}", index / 250, index % 250 + 1)
}

/// Node `index`'s kubelet: its machine as the scale nodes report it.
pub fn sim_kubelet(client: kube::Client, name: &str, index: usize) -> SimKubelet {
    let id = format!("{index:032x}");
    SimKubelet::with_client(client, name)
        .with_label("beta.kubernetes.io/os", "linux")
        .with_label("beta.kubernetes.io/arch", "amd64")
        .with_internal_ip(&node_ip(index))
        .with_capacity(
            json!({"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}),
        )
        .with_node_info("machineID", &id)
        .with_node_info("systemUUID", &id)
        .with_node_info("osImage", "nodegate-scale")
        .with_node_info("containerRuntimeVersion", "containerd://1.6.20")
        .with_node_info("kubeletVersion", "v1.36.2")
        .with_node_info("kubeProxyVersion", "")
}

impl NodeShared {
    /// The kubelet as it is on `boot_id`, reporting the network as it is now.
    fn on_boot(&self, boot_id: &str) -> SimKubelet {
        let mut k = self.kubelet.clone();
        k.set_boot_id(boot_id);
        k.set_ready(self.network_ready.load(Ordering::SeqCst));
        k
    }
}

/// Registration as `registerWithAPIServer` does it ([`SimKubelet::register`]).
/// Retries forever like the kubelet (7 s cap), so a refused create shows as
/// a node that never appears.
pub async fn register(node: &NodeShared, boot_id: &str) {
    let mut backoff = Duration::from_millis(100);
    while let Err(e) = node.on_boot(boot_id).register().await {
        tracing::warn!(node = %node.name, error = %e, "node registration failed; retrying");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(7));
    }
}

/// One status write (`tryUpdateNodeStatus`'s strategic merge patch).
pub async fn write_status(node: &NodeShared, boot_id: &str) -> anyhow::Result<()> {
    node.on_boot(boot_id).heartbeat().await?;
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
