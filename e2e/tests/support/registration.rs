//! A node through its whole admission: registered by its kubelet, then
//! marked ready by the agent.

use nodegate_e2e::cluster::Cluster;
use nodegate_e2e::standin::{AgentReadiness, StandInAgent};
use nodegate_emulator::kubelet::SimKubelet;

/// A node registered by its simulated kubelet and marked ready by the agent
/// (taint removed, current bootID recorded); returns the agent's client too.
pub async fn registered_and_ready(c: &Cluster, prefix: &str) -> (String, SimKubelet, kube::Client) {
    let name = c.node_name(prefix);
    let kubelet = c.kubelet(&name).await.unwrap();
    kubelet.register().await.unwrap();
    let agent = c.agent_client(&name).await.unwrap();
    StandInAgent::default()
        .mark_ready(&agent, &name)
        .await
        .unwrap();
    (name, kubelet, agent)
}
