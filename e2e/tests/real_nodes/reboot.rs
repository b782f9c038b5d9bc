//! A crash reboot of a worker, its network agent not ready on the new
//! boot; and a kubelet restart on the same boot, which changes nothing.

use nodegate_e2e::real_nodes::admission::Window;
use nodegate_e2e::real_nodes::harness::{figure, step, wait};
use nodegate_e2e::real_nodes::live::{lease_renewals, live_node, restart_counts};
use nodegate_e2e::real_nodes::objects::gated;
use nodegate_e2e::real_nodes::record::{bound_between, uids_bound_to, versions_after};
use nodegate_e2e::real_nodes::scenario::{Ctx, crash_to_new_boot, ready_and_ungated};

/// A crash reboot of node3, its network agent not ready on the new boot.
pub(crate) async fn crash_reboot(c: &Ctx) {
    let Ctx {
        h,
        client,
        rec,
        prober,
        ..
    } = c;
    step("crash reboot: gated before anything new is bound; ungated when ready");
    let restarts_before = restart_counts(client, "node3").await;
    let window = Window::open(h, prober);
    let crash = crash_to_new_boot(c, "node3", &[]).await;
    crash.assert_gated("a worker's crash reboot");
    let bound_before = uids_bound_to(rec, "node3", crash.before);
    let gate_back = crash.gate_back(c).await;
    figure("reboot_to_taint_ms", (gate_back.at - crash.at).as_millis());
    // Wait until the kubelet has done what it does before the agent is ready:
    // the CNI config of the last boot is on disk, so it restarts its pods.
    let restarted = wait(
        "node3's kubelet restarting its bound pods",
        120,
        async || {
            let now = restart_counts(client, "node3").await;
            let restarted: Vec<String> = now
                .iter()
                .filter(|(p, n)| {
                    !p.starts_with("nodegate-")
                        && **n > restarts_before.get(*p).copied().unwrap_or(0)
                })
                .map(|(p, _)| p.clone())
                .collect();
            (restarted.len() >= 2).then_some(restarted)
        },
    )
    .await;
    figure("pods_restarted_before_agent_ready", restarted.len());
    println!("restarted by the kubelet before node3's agent was ready: {restarted:?}");
    assert!(
        gated(&live_node(client, "node3").await.unwrap()),
        "node3 ungated before its agent was ready"
    );
    let untaint_rv = ready_and_ungated(c, "node3", "reboot_ready_to_untaint_ms").await;
    let early = bound_between(rec, "node3", crash.before, untaint_rv, &bound_before);
    assert!(
        early.is_empty(),
        "new workloads bound to node3 before its agent was ready: {early:?}"
    );
    // node3 is a worker: no webhook replica ran there.
    window.close_none_open(h, prober, "worker_crash");
}

/// A kubelet restart on the same boot changes nothing.
pub(crate) async fn kubelet_restart(c: &Ctx) {
    let Ctx { h, client, rec, .. } = c;
    step("kubelet restart on the same boot: nothing changes");
    let before = rec.last_rv();
    let restarts_before = restart_counts(client, "node3").await;
    h.cluster(&["kubelet-restart", "node3"]);
    lease_renewals(h, "node3", 2).await;
    let gated_after = versions_after(rec, "node3", before)
        .into_iter()
        .filter(|s| gated(&s.obj))
        .count();
    assert_eq!(
        gated_after, 0,
        "a kubelet restart on the same boot gated node3"
    );
    assert_eq!(
        restart_counts(client, "node3").await,
        restarts_before,
        "a kubelet restart restarted pods"
    );
}
