//! Cluster Autoscaler beside nodegate (e2e/cluster-autoscaler/README.md):
//! the real control plane and nodegate as it ships (the scale harness's,
//! [`crate::scale`]), the real Cluster Autoscaler with its KWOK cloud
//! provider (1.29 and later; run on 1.31.5), and simulated kubelets plus real agents for the Nodes it
//! creates. It counts the nodes CA creates against the nodes the pending
//! pods need, for each CA configuration and each order of the gate and
//! Ready, and holds the count against nodegate-check's `cluster autoscaler`
//! line for the same configuration.
//!
//! What the scenarios exercise in CA (`cluster-autoscaler/` of
//! kubernetes/autoscaler at `cluster-autoscaler-release-1.31`):
//!
//! - `core/static_autoscaler.go` `obtainNodeLists` →
//!   `utils/taints/taints.go` `FilterOutNodesWithStartupTaints`: a Ready
//!   node with a startup taint (`--startup-taint`, or a key under
//!   `startup-taint.cluster-autoscaler.kubernetes.io/`) becomes an unready
//!   copy; any other taint leaves it Ready;
//! - `clusterstate/clusterstate.go` `updateReadinessStats`: an unready node
//!   younger than `MaxNodeStartupTime` (15 min, a constant in 1.31) is
//!   NotStarted and so upcoming, an older one Unready; a Ready node whose
//!   taint the pods do not tolerate is neither, the pods stay unschedulable
//!   and the next loop scales up again (the duplicates counted here);
//! - `IsClusterHealthy`: more than `--ok-total-unready-count` (3) and more
//!   than `--max-total-unready-percentage` (45 %) of nodes Unready, and the
//!   loop stops (`ClusterUnhealthy`), read from the `cluster-autoscaler-status`
//!   ConfigMap CA writes every loop;
//! - `processors/nodeinfosprovider/mixed_nodeinfos_processor.go`: a node
//!   group's template is copied from its first Ready node that has been
//!   Ready for a minute (`isNodeGoodTemplateCandidate`), taints included
//!   except startup and status ones (`utils.SanitizeNode`), and cached;
//! - `cloudprovider/kwok`: `IncreaseSize` creates each Node from the
//!   template ConfigMap through the API server (so nodegate's webhook taints
//!   it at create), `Refresh` sizes groups from the Nodes, and `Cleanup`
//!   deletes them all when CA gets SIGTERM.
//!
//! Modules: [`profile`] (the taint key profiles and their installs),
//! [`autoscaler`] (CA's process, its ConfigMaps, the Deployment object
//! nodegate-check reads, its status), [`nodes`] (adopting the Nodes CA
//! creates into the simulated fleet, and what each went through),
//! [`check`] (nodegate-check's line), [`scenarios`].

pub mod autoscaler;
pub mod check;
pub mod nodes;
pub mod profile;
pub mod scenarios;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

pub use crate::scale::Report;

/// One run's shape.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// Scenarios, in this order: defaults (CA at its defaults), declared
    /// (CA with `--startup-taint` for the key, as nodegate-check asks),
    /// profiles (the managed-CA and Karpenter-known keys), template (a
    /// template captured from a gated node), reboot-wave (CA's cluster
    /// health with the taint declared).
    #[arg(
        long,
        env = "NODEGATE_CA_SCENARIOS",
        value_delimiter = ',',
        default_value = "defaults,declared,profiles,template,reboot-wave"
    )]
    pub scenarios: Vec<String>,
    /// Orders of the gate and Ready on the nodes of a scale-up:
    /// `gate-first` (Cilium writes its CNI config once ready, so the kubelet
    /// turns Ready after the gate opens) and `gate-after-ready` (a CNI that
    /// writes its config early, an agent that is not the CNI: the gate
    /// outlasts Ready by `--gate-after-ready`).
    #[arg(
        long,
        env = "NODEGATE_CA_ORDERINGS",
        value_delimiter = ',',
        default_value = "gate-first,gate-after-ready"
    )]
    pub orderings: Vec<String>,
    /// How long the gate outlasts Ready in `gate-after-ready` (and after a
    /// reboot in the reboot wave).
    #[arg(long, env = "NODEGATE_CA_GATE_AFTER_READY", default_value = "25s", value_parser = nodegate_shared::duration::parse)]
    pub gate_after_ready: Duration,
    /// In `gate-first`, the kubelet reports Ready this long after the probe
    /// passes (its runtime-status loop notices the CNI config within 5 s).
    #[arg(long, env = "NODEGATE_CA_READY_AFTER_GATE", default_value = "3s", value_parser = nodegate_shared::duration::parse)]
    pub ready_after_gate: Duration,
    /// The stand-in network agent turns ready this long after its container
    /// starts.
    #[arg(long, env = "NODEGATE_CA_NETWORK_START", default_value = "5s", value_parser = nodegate_shared::duration::parse)]
    pub network_start: Duration,
    /// Nodes the pending pods of one scale-up need (4 pods a node).
    #[arg(long, env = "NODEGATE_CA_SCALE_UP", default_value_t = 4)]
    pub scale_up: usize,
    /// template: how long the gate outlasts Ready on the group's rebooted
    /// node (which kept its CNI config, so it stays Ready), while pods wait.
    #[arg(long, env = "NODEGATE_CA_TEMPLATE_GATE", default_value = "40s", value_parser = nodegate_shared::duration::parse)]
    pub template_gate: Duration,
    /// reboot-wave: nodes besides the first, all created at the start.
    #[arg(long, env = "NODEGATE_CA_WAVE_NODES", default_value_t = 8)]
    pub wave_nodes: usize,
    /// reboot-wave: how many of them reboot at once (5 of 9 nodes: more
    /// than 3 and more than 45 %).
    #[arg(long, env = "NODEGATE_CA_WAVE_REBOOT", default_value_t = 5)]
    pub wave_reboot: usize,
    /// reboot-wave: the wave starts once its nodes are this old. CA 1.31
    /// counts an unready node younger than 15 min as starting, not Unready
    /// (`MaxNodeStartupTime`, not a flag), so a younger wave never makes the
    /// cluster unhealthy; less measures that case.
    #[arg(long, env = "NODEGATE_CA_WAVE_NODE_AGE", default_value = "16m", value_parser = nodegate_shared::duration::parse)]
    pub wave_node_age: Duration,
    /// State directory (one subdirectory per cluster, removed first).
    #[arg(long, env = "NODEGATE_CA_DIR", default_value = "/tmp/ngca")]
    pub dir: PathBuf,
    /// The dummy interface the cluster's private addresses live on.
    #[arg(long, env = "NODEGATE_CA_IFACE", default_value = "ngca0")]
    pub iface: String,
    /// Its /24 (the API server on .1, the webhook's replicas on .2 and .3).
    #[arg(long, env = "NODEGATE_CA_NET", default_value = "10.215.2")]
    pub net: String,
    /// CA's release (`1.31.5`), overriding what the binary logs at start
    /// (`Cluster Autoscaler <x.y.z>`). It picks the declaration flag
    /// (`--startup-taint` from 1.29.0, `--ignore-taint` before) and the
    /// Deployment object's image tag, which nodegate-check reads.
    #[arg(long, env = "NODEGATE_CA_CA_VERSION")]
    pub ca_version: Option<autoscaler::CaVersion>,
}

/// CA's release: `--ca-version` when given, else what the binary logs. A
/// FIGURE line records it, a log line where it came from and how a taint
/// is declared to it.
pub async fn ca_version(cfg: &Config, r: &mut Report) -> anyhow::Result<autoscaler::CaVersion> {
    let bin = ca_bin().context("no Cluster Autoscaler")?;
    let found = autoscaler::binary_version(&bin).await;
    let (v, source) = match (cfg.ca_version, found) {
        (Some(v), Ok(b)) if v == b => (v, format!("--ca-version, as {} logs", bin.display())),
        (Some(v), Ok(b)) => (v, format!("--ca-version; {} logs {b}", bin.display())),
        (Some(v), Err(e)) => (v, format!("--ca-version; {e:#}")),
        (None, Ok(b)) => (b, format!("logged by {}", bin.display())),
        (None, Err(e)) => return Err(e),
    };
    println!(
        "Cluster Autoscaler {v} ({source}): declares with --{}, image {}",
        autoscaler::declare_flag(v),
        autoscaler::image(v)
    );
    if v < autoscaler::KWOK_SINCE {
        println!(
            "note: CA {v} predates its KWOK provider ({}), which the harness runs it with",
            autoscaler::KWOK_SINCE
        );
    }
    r.figure("ca.version", v);
    Ok(v)
}

/// `$CA_BIN`, else `cluster-autoscaler` on PATH.
pub fn ca_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CA_BIN") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    crate::scale::control_plane::on_path("cluster-autoscaler")
}

/// `None` when everything is there, else the one-line reason to refuse.
pub fn missing_binaries() -> Option<String> {
    if let Some(why) = crate::scale::missing_binaries() {
        return Some(why);
    }
    if ca_bin().is_none() {
        return Some(match std::env::var_os("CA_BIN") {
            Some(p) => format!(
                "no Cluster Autoscaler at $CA_BIN ({}): a binary with the KWOK provider, 1.29 or later (see e2e/cluster-autoscaler/README.md)",
                PathBuf::from(p).display()
            ),
            None => "no Cluster Autoscaler: set $CA_BIN or put cluster-autoscaler (1.29 or later, KWOK provider) on PATH (see e2e/cluster-autoscaler/README.md)".into(),
        });
    }
    None
}

/// The nodegate binaries the harness runs, built in its own profile.
pub fn missing_nodegate() -> Option<String> {
    for (bin, package) in [
        ("nodegate-webhook", "nodegate-webhook"),
        ("nodegate-agent", "nodegate-agent"),
        ("nodegate-roster", "nodegate-roster"),
        ("nodegate-check", "nodegate-check"),
    ] {
        if !crate::process::bin_path(bin).exists() {
            return Some(format!("{bin} not built (cargo build -p {package})"));
        }
    }
    None
}

/// Runs every selected scenario, each cluster torn down whatever happened.
pub async fn run(cfg: Config) -> anyhow::Result<Report> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    for s in &cfg.scenarios {
        anyhow::ensure!(
            scenarios::SCENARIOS.contains(&s.as_str()),
            "unknown scenario {s} (known: {})",
            scenarios::SCENARIOS.join(",")
        );
    }
    for o in &cfg.orderings {
        scenarios::Ordering::parse(o)?;
    }
    let _ = std::fs::remove_dir_all(&cfg.dir);
    std::fs::create_dir_all(&cfg.dir)?;
    // Each agent's file probe holds an inotify instance.
    let _inotify =
        crate::scale::InotifyLimit::raise(cfg.wave_nodes + autoscaler::MAX_GROUP_SIZE + 1)?;
    let mut report = Report::default();
    let version = ca_version(&cfg, &mut report).await?;
    let started = tokio::time::Instant::now();
    let outcome = scenarios::run_all(&cfg, version, &mut report).await;
    report.figure(
        "ca.wall_s",
        format!("{:.0}", started.elapsed().as_secs_f64()),
    );
    outcome?;
    Ok(report)
}
