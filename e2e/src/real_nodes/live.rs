//! Reads and waits on the live cluster (GETs and LISTs as the admin, not
//! the watches' record).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;

use super::harness::{Harness, figure, kubeconfig_client, ok, wait};
use super::objects::{NS, boot_id, gated, name_of, node_of, ns_of, phase, pod_ready};

pub async fn live_pods(client: &kube::Client) -> Vec<Pod> {
    Api::<Pod>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("list pods")
        .items
}

pub async fn live_node(client: &kube::Client, name: &str) -> Option<Node> {
    Api::<Node>::all(client.clone())
        .get_opt(name)
        .await
        .expect("get the node")
}

/// The boot ID `node` reports now.
pub async fn current_boot(client: &kube::Client, node: &str) -> String {
    live_node(client, node)
        .await
        .as_ref()
        .and_then(boot_id)
        .unwrap_or_else(|| panic!("{node} reports no boot ID"))
}

pub async fn node_names(client: &kube::Client) -> Vec<String> {
    Api::<Node>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("list nodes")
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect()
}

/// Every nodegate Pod Running and Ready: an agent on each node, the webhook's
/// replicas (and the roster's, when installed).
pub async fn all_nodegate_ready(client: &kube::Client, webhooks: usize) {
    wait("every nodegate Pod Ready", 240, async || {
        let nodes = node_names(client).await;
        let pods = live_pods(client).await;
        let ours: Vec<&Pod> = pods
            .iter()
            .filter(|p| ns_of(p) == NS && p.metadata.deletion_timestamp.is_none())
            .collect();
        // A pod of a deleted node keeps its last status, Ready included, and
        // its endpoint, until the pod garbage collector removes it: never
        // count it as serving.
        let serving =
            |p: &&&Pod| pod_ready(p) && node_of(p).is_some_and(|n| nodes.iter().any(|x| x == n));
        let agents: BTreeSet<&str> = ours
            .iter()
            .filter(|p| name_of(p).starts_with("nodegate-agent-"))
            .filter(serving)
            .filter_map(|p| node_of(p))
            .collect();
        let hooks = ours
            .iter()
            .filter(|p| name_of(p).starts_with("nodegate-webhook-"))
            .filter(serving)
            .count();
        // A finished Pod (`helm test`'s) serves nothing and is no failure.
        let not_serving = ours
            .iter()
            .filter(|p| !serving(p) && !matches!(phase(p), "Succeeded"))
            .count();
        (agents.len() == nodes.len() && hooks == webhooks && not_serving == 0).then_some(())
    })
    .await;
}

/// Waits until `node`'s gate is `want` (GETs); the moment it was.
pub async fn wait_gated(client: &kube::Client, node: &str, want: bool, secs: u64) -> Instant {
    wait(&format!("{node} gated={want}"), secs, async || {
        let n = live_node(client, node).await?;
        (gated(&n) == want).then(Instant::now)
    })
    .await
}

/// The Ready agent Pod on `node`.
pub async fn agent_pod(client: &kube::Client, node: &str) -> Pod {
    wait(&format!("a Ready agent Pod on {node}"), 180, async || {
        live_pods(client).await.into_iter().find(|p| {
            ns_of(p) == NS
                && name_of(p).starts_with("nodegate-agent-")
                && node_of(p) == Some(node)
                && p.metadata.deletion_timestamp.is_none()
                && pod_ready(p)
        })
    })
    .await
}

/// A Deployment of `replicas` pause pods pinned to `node`.
pub fn workload(name: &str, node: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}, nodegate-e2e: workload}}}}
    spec:
      nodeSelector: {{kubernetes.io/hostname: {node}}}
      terminationGracePeriodSeconds: 1
      containers:
        - name: main
          image: localhost/pause:1
          imagePullPolicy: Never
"
    )
}

/// Waits until no Pod named `prefix…` is left.
pub async fn wait_no_pod(client: &kube::Client, prefix: &str) {
    wait(&format!("no {prefix}* Pod left"), 120, async || {
        (!live_pods(client)
            .await
            .iter()
            .any(|p| name_of(p).starts_with(prefix)))
        .then_some(())
    })
    .await;
}

/// Container restarts of each pod on `node`, by pod name.
pub async fn restart_counts(client: &kube::Client, node: &str) -> BTreeMap<String, i32> {
    live_pods(client)
        .await
        .into_iter()
        .filter(|p| node_of(p) == Some(node))
        .map(|p| {
            let n: i32 = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map(|c| c.iter().map(|c| c.restart_count).sum())
                .unwrap_or(0);
            (name_of(&p).to_string(), n)
        })
        .collect()
}

/// Waits for `count` renewals of `node`'s Lease (every 10 s): its kubelet is
/// back and has re-registered and reported.
pub async fn lease_renewals(h: &Harness, node: &str, count: usize) {
    let read = || {
        h.kubectl(&format!(
            "-n kube-node-lease get lease {node} -o jsonpath={{.spec.renewTime}}"
        ))
    };
    let mut seen = BTreeSet::from([read()]);
    wait(
        &format!("{count} renewals of {node}'s Lease"),
        120,
        async || {
            seen.insert(read());
            (seen.len() > count).then_some(())
        },
    )
    .await;
}

/// The Ready webhook replicas: (node, pod IP).
pub async fn replica_hosts(client: &kube::Client) -> Vec<(String, String)> {
    wait("both webhook replicas Ready", 240, async || {
        let hosts: Vec<(String, String)> = live_pods(client)
            .await
            .into_iter()
            .filter(|p| {
                ns_of(p) == NS && name_of(p).starts_with("nodegate-webhook-") && pod_ready(p)
            })
            .filter_map(|p| Some((node_of(&p)?.to_string(), p.status?.pod_ip?)))
            .collect();
        (hosts.len() == 2).then_some(hosts)
    })
    .await
}

/// The node of the replica the API server's open connection for the first
/// line goes to (without per-request load balancing it keeps one connection
/// and sends every call there until it breaks): killing that one is the
/// worst case. Else the first replica's.
pub async fn connected_replica_host(h: &Harness, client: &kube::Client) -> String {
    let hosts = replica_hosts(client).await;
    let peers = ok(
        "ss",
        h.sh("ss -Htn state established '( dport = :9443 )' | awk '{print $4}'"),
    );
    let connected = hosts
        .iter()
        .find(|(_, ip)| peers.lines().any(|p| p.starts_with(&format!("{ip}:"))));
    figure("webhook_host_is_the_connected_replica", connected.is_some());
    connected.unwrap_or(&hosts[0]).0.clone()
}

/// A client with the token the kubelet projected into the agent's Pod,
/// read from inside the container (the projected volume is a tmpfs in the
/// node's own mount namespace), as a thief on that node would use it.
pub async fn stolen_agent_client(h: &Harness, agent: &Pod) -> kube::Client {
    let token = h.kubectl(&format!(
        "-n {NS} exec {} -c agent -- sh -c 'read -r t < /var/run/secrets/kubernetes.io/serviceaccount/token; echo \"$t\"'",
        name_of(agent)
    ));
    let token = token.trim();
    assert!(token.starts_with("ey"), "not a JWT: {token:.20}");
    kubeconfig_client(&h.token_kubeconfig(&h.work.path().join("stolen.kubeconfig"), token)).await
}
