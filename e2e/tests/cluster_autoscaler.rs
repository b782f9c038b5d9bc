//! Cluster Autoscaler beside nodegate, its smallest configuration: nodegate's
//! key with CA at its defaults and with `--startup-taint`, the gate outlasting
//! Ready (e2e/cluster-autoscaler/README.md). Without the Kubernetes binaries
//! or Cluster Autoscaler (CI has neither) it says so in one line and passes.
//! Needs root and the nodegate binaries built in the same profile:
//!
//!   cargo build -p nodegate-webhook -p nodegate-agent -p nodegate-roster -p nodegate-check
//!   KUBE_BIN_DIR=/opt/k8s CA_BIN=/opt/ca/cluster-autoscaler \
//!     cargo test -p nodegate-e2e --test cluster_autoscaler -- --nocapture

use clap::Parser;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    cfg: nodegate_e2e::cluster_autoscaler::Config,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_that_duplicates_fails_nodegate_check() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
    let missing = nodegate_e2e::cluster_autoscaler::missing_binaries()
        .or_else(nodegate_e2e::cluster_autoscaler::missing_nodegate);
    if let Some(why) = missing {
        println!("cluster-autoscaler: skipped: {why}");
        return;
    }
    let mut cli = Cli::parse_from(["cluster-autoscaler"]);
    cli.cfg.scenarios = vec!["defaults".into(), "declared".into()];
    cli.cfg.orderings = vec!["gate-after-ready".into()];
    cli.cfg.dir = "/tmp/ngca-test".into();
    cli.cfg.iface = "ngca1".into();
    cli.cfg.net = "10.215.3".into();
    let report = nodegate_e2e::cluster_autoscaler::run(cli.cfg)
        .await
        .expect("the harness ran");
    assert!(
        report.failures.is_empty(),
        "goals missed: {:#?}",
        report.failures
    );
}
