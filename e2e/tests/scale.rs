//! The scale harness's smallest configuration: 50 simulated nodes against
//! the real control plane (e2e/scale/README.md). Without the Kubernetes
//! binaries (CI has none) it says so in one line and passes. Needs root
//! and the nodegate binaries built in the same profile:
//!
//!   cargo build -p nodegate-webhook -p nodegate-agent -p nodegate-roster
//!   KUBE_BIN_DIR=/opt/k8s/bin cargo test -p nodegate-e2e --test scale -- --nocapture

use std::time::Duration;

use clap::Parser;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    cfg: nodegate_e2e::scale::Config,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_nodes_meet_every_goal() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
    if let Some(why) = nodegate_e2e::scale::missing_binaries() {
        println!("scale: skipped: {why}");
        return;
    }
    for bin in ["nodegate-webhook", "nodegate-agent", "nodegate-roster"] {
        if !nodegate_e2e::bin_path(bin).exists() {
            println!("scale: skipped: {bin} not built (cargo build -p {bin})");
            return;
        }
    }
    let mut cli = Cli::parse_from(["scale"]);
    cli.cfg.nodes = 50;
    cli.cfg.storm = Duration::from_secs(10);
    cli.cfg.network_start = Duration::from_secs(5);
    // Longer than one cycle of every watch (kube-runtime's 290 s).
    cli.cfg.steady = Duration::from_secs(300);
    cli.cfg.prune = 5;
    cli.cfg.dir = "/tmp/ngscale-test".into();
    cli.cfg.iface = "ngscale1".into();
    cli.cfg.net = "10.215.1".into();
    let report = nodegate_e2e::scale::run(cli.cfg)
        .await
        .expect("the harness ran");
    assert!(
        report.failures.is_empty(),
        "goals missed: {:#?}",
        report.failures
    );
}
