//! `nodegate-sim run`'s scenario, in process: with nodegate every guarantee
//! holds (with the webhook and with the MutatingAdmissionPolicy), and without
//! it the problem nodegate solves shows.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use nodegate_sim::{self as sim, AdmissionMode, RunOptions};

#[tokio::test]
async fn sim_run_keeps_the_guarantees_and_shows_the_problem_without() {
    let opts = RunOptions {
        nodes: 12,
        // The agent's pod comes up well after the kubelet is Ready, so
        // without the webhook the scheduler has a window to use.
        agent_start_delay: std::time::Duration::from_millis(250),
        ..Default::default()
    };
    let reports = sim::run(&opts).await.unwrap();
    eprintln!("{}", sim::render_table(&reports));
    let (with, without) = (&reports[0], &reports[1]);
    assert!(with.webhook && !without.webhook);
    assert_eq!(with.tainted_at_create, 12);
    assert_eq!(with.tainted_at_reboot, with.reboots);
    assert_eq!(with.violations, 0);
    assert!(with.webhook_calls > 0 && with.webhook_p99.is_some());
    for r in &reports {
        // The real agent removed the taint from every node, never early.
        assert_eq!(r.early_untaints, 0, "{}", r.name);
        assert_eq!(
            r.untainted_at_end,
            (10, 10),
            "{}: 12 - 3 deleted + 1 re-created",
            r.name
        );
        assert!(r.max_untaint_lag.is_some(), "{}", r.name);
        // Restarted pruning agents: exactly the deleted nodes, from the snapshot.
        assert_eq!(r.prune.agents, 5, "{}", r.name);
        assert_eq!(r.prune.deleted, 3, "{}", r.name);
        // The one re-created under its name is held: its old incarnation's
        // handler would get a live node's name.
        assert_eq!(r.prune.held, 1, "{}", r.name);
        assert_eq!(r.prune.exact_min, 2, "{}", r.name);
        assert_eq!(r.prune.false_prunes, 0, "{}", r.name);
        assert_eq!(r.prune.resurrected, 0, "{}", r.name);
    }
    assert!(sim::broken_guarantees(&reports).is_empty());
    // Without the webhook the agent's start-up safety net taints every new
    // node, but only once it runs: pods land on not-ready nodes before.
    assert_eq!(without.tainted_at_create, 0);
    assert_eq!(without.safety_net_taints, 12);
    assert!(
        without.violations > 0,
        "the problem nodegate solves shows without the webhook"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_run_with_the_policy_keeps_every_guarantee() {
    let opts = RunOptions {
        nodes: 12,
        agent_start_delay: std::time::Duration::from_millis(250),
        admission: AdmissionMode::Policy,
        ..Default::default()
    };
    let r = sim::run_scenario(&opts, true).await.unwrap();
    eprintln!("{}", sim::render_table(std::slice::from_ref(&r)));
    assert_eq!(r.name, "with nodegate (policy)");
    // Every node tainted in its create response, by the policy: the webhook
    // (nodes/status only) added none at create.
    assert_eq!(r.tainted_at_create, 12);
    assert_eq!(r.webhook_reported.map(|(create, _)| create), Some(0));
    assert_eq!(r.safety_net_taints, 0);
    // Every reboot re-tainted; no pod on a not-ready node outside the window.
    assert_eq!(r.tainted_at_reboot, r.reboots);
    assert!(r.reboots > 0);
    assert_eq!(r.violations, 0);
    assert_eq!(sim::broken_guarantees(&[r]), Vec::<String>::new());
}

/// Strict mode: no pod already bound to a rebooted node that does not
/// tolerate the boot gate starts before the node's agent is ready (the
/// kubelet refuses it, or the taint-eviction controller deleted it first),
/// and restarting an agent on the same boot gates and evicts nothing;
/// without the gate the same pods start at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_mode_keeps_untolerating_pods_off_rebooted_nodes_until_ready() {
    let opts = RunOptions {
        nodes: 6,
        same_boot_restarts: 2,
        ..Default::default()
    };
    let reports = sim::run_strict(&opts).await.unwrap();
    eprintln!("{}", sim::render_strict_table(&reports));
    let (strict, plain) = (&reports[0], &reports[1]);
    assert!(strict.strict && !plain.strict);
    for r in &reports {
        assert_eq!((r.reboots, r.bound_untolerating), (3, 3), "{}", r.name);
        assert_eq!(r.refused_tolerating, 0, "{}", r.name);
        assert_eq!(r.restarts, 2, "{}", r.name);
        assert_eq!(r.restart_gated_versions, 0, "{}", r.name);
        assert_eq!(r.restart_evictions, 0, "{}", r.name);
    }
    // The gate follows the stored new boot, not the re-registration's
    // claim: the kubelet here lists its pods right after its create, so an
    // untolerating pod may start first; every one is evicted once the gate
    // is stored, refused or not.
    assert!(strict.admitted_early + strict.refused <= 3);
    assert_eq!(strict.evicted_in_wave, 3);
    assert_eq!(strict.reboots_ungated, 0);
    assert_eq!(
        plain.admitted_early, 3,
        "without the gate they start at once"
    );
    assert_eq!((plain.refused, plain.evicted_in_wave), (0, 0));
    assert!(sim::broken_strict_guarantees(&reports).is_empty());
}
