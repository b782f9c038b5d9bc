//! Rollouts of the agent and of the webhook, the serving certificate
//! rotated to a new CA, and an upgrade as users make it.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use nodegate_e2e::real_nodes::admission::Window;
use nodegate_e2e::real_nodes::harness::{figure, ok, step, wait};
use nodegate_e2e::real_nodes::live::{all_nodegate_ready, live_pods, node_names, wait_gated};
use nodegate_e2e::real_nodes::objects::{NS, name_of, pod_ready};
use nodegate_e2e::real_nodes::record::gated_windows;
use nodegate_e2e::real_nodes::scenario::Ctx;

use crate::install::my_nodegate;

/// Rollouts of the agent and of the webhook.
pub(crate) async fn rollouts(c: &Ctx) {
    let Ctx {
        h,
        client,
        rec,
        prober,
        ..
    } = c;
    step("rollout restart of the agent DaemonSet and the webhook StatefulSet");
    let nodes = node_names(client).await;
    let t0 = Instant::now();
    h.kubectl(&format!("-n {NS} rollout restart daemonset/nodegate-agent"));
    h.kubectl(&format!(
        "-n {NS} rollout status daemonset/nodegate-agent --timeout=300s"
    ));
    for n in &nodes {
        wait_gated(client, n, false, 120).await;
    }
    let windows: Vec<Duration> = nodes
        .iter()
        .flat_map(|n| gated_windows(rec, n, t0))
        .collect();
    figure("agent_rollout_gated_nodes", windows.len());
    figure(
        "agent_rollout_max_gate_ms",
        windows
            .iter()
            .max()
            .copied()
            .unwrap_or_default()
            .as_millis(),
    );
    let window = Window::open(h, prober);
    h.kubectl(&format!(
        "-n {NS} rollout restart statefulset/nodegate-webhook"
    ));
    h.kubectl(&format!(
        "-n {NS} rollout status statefulset/nodegate-webhook --timeout=300s"
    ));
    all_nodegate_ready(client, 2).await;
    window.close_none_open(h, prober, "webhook_rollout");
    for n in &nodes {
        wait_gated(client, n, false, 120).await;
    }
    cert_rotation(c).await;
}

/// The certificates controller replaces the CA while canaries register:
/// with its CA Secret deleted it makes a new CA, keeps the one the
/// replicas serve trusted beside it and writes a leaf of the new one; the
/// replicas reload it; not one call fails open.
async fn cert_rotation(c: &Ctx) {
    let Ctx {
        h, client, prober, ..
    } = c;
    step("a new CA by the certificates controller: caBundle trusts both, then the new leaf");
    let window = Window::open(h, prober);
    let t0 = Instant::now();
    let leaf = "-n nodegate get secret nodegate-webhook-tls -o jsonpath='{.data.tls\\.crt}'";
    let old_leaf = h.kubectl(leaf);
    assert!(!old_leaf.is_empty(), "no serving certificate to replace");
    h.kubectl("-n nodegate delete secret nodegate-webhook-ca");
    wait("a new leaf in the Secret", 120, async || {
        (h.kubectl(leaf) != old_leaf).then_some(())
    })
    .await;
    let trusted = ok(
        "the caBundle's CAs",
        h.sh("kubectl get mutatingwebhookconfiguration nodegate -o jsonpath='{.webhooks[0].clientConfig.caBundle}' \
              | base64 -d | grep -c 'BEGIN CERTIFICATE'"),
    );
    assert_eq!(
        trusted.trim(),
        "2",
        "the old CA stays trusted beside the new one"
    );
    let want = ok(
        "new leaf",
        h.sh("kubectl -n nodegate get secret nodegate-webhook-tls -o jsonpath='{.data.tls\\.crt}' | base64 -d \
              | openssl x509 -noout -fingerprint -sha256"),
    );
    let hosts: Vec<String> = live_pods(client)
        .await
        .iter()
        .filter(|p| name_of(p).starts_with("nodegate-webhook-"))
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    assert_eq!(hosts.len(), 2, "two webhook replicas");
    for ip in &hosts {
        wait(&format!("{ip} serving the new certificate"), 240, async || {
            let got = h.sh(&format!(
                "openssl s_client -connect {ip}:9443 -servername nodegate-webhook.nodegate.svc </dev/null 2>/dev/null \
                 | openssl x509 -noout -fingerprint -sha256"
            ));
            (String::from_utf8_lossy(&got.stdout) == want).then_some(())
        })
        .await;
    }
    figure("cert_rotation_reloaded_ms", t0.elapsed().as_millis());
    let mark = prober.mark();
    wait("canaries under the new leaf", 60, async || {
        (prober.since(mark).0 >= 8).then_some(())
    })
    .await;
    window.close_none_open(h, prober, "cert_rotation");
    let check = h.sh("nodegate-check");
    assert!(
        check.status.success(),
        "nodegate-check after the rotation:\n{}",
        String::from_utf8_lossy(&check.stdout)
    );
}

/// An upgrade as users do it: the install applied again with a component.
pub(crate) async fn upgrade(c: &Ctx) {
    let Ctx {
        h, client, prober, ..
    } = c;
    let nodes = node_names(client).await;
    step("upgrade: the install applied again with the pruning component");
    let bundle = "get mutatingwebhookconfiguration nodegate -o jsonpath={.webhooks[0].clientConfig.caBundle}";
    let ca_before = h.kubectl(bundle);
    my_nodegate(h, "../manifests", &["pruning"]);
    let window = Window::open(h, prober);
    h.kubectl("apply -k my-nodegate/");
    h.kubectl(&format!(
        "-n {NS} rollout status daemonset/nodegate-agent --timeout=300s"
    ));
    assert_eq!(
        h.kubectl(bundle),
        ca_before,
        "the upgrade changed the caBundle"
    );
    wait("the roster Ready on the pod network", 180, async || {
        let pods = live_pods(client).await;
        let ready: Vec<&Pod> = pods
            .iter()
            .filter(|p| name_of(p).starts_with("nodegate-roster-") && pod_ready(p))
            .collect();
        (ready.len() == 2
            && ready.iter().all(|p| {
                let s = p.status.as_ref().unwrap();
                s.pod_ip.is_some() && s.pod_ip != s.host_ip
            }))
        .then_some(())
    })
    .await;
    for n in &nodes {
        wait_gated(client, n, false, 120).await;
    }
    window.close_none_open(h, prober, "upgrade");
    let check = h.sh("nodegate-check");
    println!("{}", String::from_utf8_lossy(&check.stdout));
    assert!(
        check.status.success(),
        "nodegate-check failed after the upgrade"
    );
}
