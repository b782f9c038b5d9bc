//! The README's install, verbatim, on nodes whose network agent runs (the
//! first scenario), and the user's own kustomization later scenarios apply
//! as upgrades.

use std::time::Instant;

use nodegate_e2e::readme::readme_command;
use nodegate_e2e::real_nodes::harness::{Harness, figure, ok, step, wait};
use nodegate_e2e::real_nodes::lines::Lines;
use nodegate_e2e::real_nodes::live::{all_nodegate_ready, wait_gated};

/// The README's kustomize install, verbatim (one command: the
/// certificates controller makes the rest), on nodes whose network agent
/// runs.
pub(crate) async fn install(h: &Harness, client: &kube::Client, nodes0: &[String]) {
    step("install (README, verbatim: one command) and nodegate-check");
    for n in nodes0 {
        h.cluster(&["ready", n]);
    }
    let c = readme_command("## Install", false).unwrap();
    println!("$ {c}");
    let t0 = Instant::now();
    ok(&c, h.sh(&c));
    all_nodegate_ready(client, 2).await;
    let paths = "get mutatingwebhookconfiguration nodegate -o jsonpath={.webhooks[*].clientConfig.service.path}";
    wait("every line calling /mutate/<token>", 180, async || {
        (h.kubectl(paths).matches("/mutate/").count() == 3).then_some(())
    })
    .await;
    figure("install_to_lines_on_token_ms", t0.elapsed().as_millis());
    for n in nodes0 {
        wait_gated(client, n, false, 120).await;
    }
    let check = h.sh("nodegate-check");
    println!("{}", String::from_utf8_lossy(&check.stdout));
    assert!(
        check.status.success(),
        "nodegate-check failed after the install"
    );
    let lines = h.lines();
    figure(
        "fail_open_during_install",
        lines.fail_open.values().sum::<u64>(),
    );
    // Steady state: every Node write of the install went to the first line.
    figure(
        "first_line_calls_during_install",
        Lines::first_line(&lines.calls),
    );
    let backup_calls = Lines::backups(&lines.calls).sum::<u64>();
    figure("backup_calls_during_install", backup_calls);
    assert_eq!(
        backup_calls, 0,
        "a backup line was called with both replicas up"
    );
}

/// Writes the user's own kustomization, `my-nodegate/`: the install `base`
/// with `components`, and an `--on-node-delete` hook that logs to the node's
/// `/var/run/nodegate/pruned.log`.
pub(crate) fn my_nodegate(h: &Harness, base: &str, components: &[&str]) {
    let components: Vec<String> = components
        .iter()
        .map(|c| format!("../manifests/components/{c}"))
        .collect();
    my_nodegate_with(h, base, &components);
}

/// [`my_nodegate`] with each component's directory given relative to
/// `my-nodegate/` (one the user generated, say, beside the shipped ones).
pub(crate) fn my_nodegate_with(h: &Harness, base: &str, components: &[String]) {
    std::fs::create_dir_all(h.work.path().join("my-nodegate")).unwrap();
    std::fs::write(
        h.work.path().join("my-nodegate/kustomization.yaml"),
        format!(
            "resources: [{base}]
components: [{}]
patches:
  - target: {{kind: DaemonSet, name: nodegate-agent}}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --on-node-delete=echo \"$NODEGATE_NODE_NAME $NODEGATE_DELETE_SOURCE\" >> /var/run/nodegate/pruned.log
",
            components.join(", ")
        ),
    )
    .unwrap();
}
