//! The scale harness: the real control plane from `KUBE_BIN_DIR`,
//! nodegate installed as it ships, and N simulated nodes, each a kubelet's
//! API calls with its own node credential and its own nodegate-agent with a
//! token bound to its agent Pod. See e2e/scale/README.md.
//!
//! - [`gates`]: several gates in one install (`--gates`);
//! - [`control_plane`]: etcd, kube-apiserver, kube-controller-manager,
//!   kube-scheduler as child processes, on a dummy interface's private /24;
//!   [`control_plane_args`]: their command lines, from the flags shared with
//!   the real-nodes harness (`e2e/control-plane/`);
//! - [`pki`]: every certificate, from one in-memory CA;
//! - [`install`]: the shipped manifests, the webhook and roster processes;
//! - [`kubelet`]: one simulated kubelet; [`fleet`]: all of them, their pods
//!   and their agents;
//! - [`observe`]: the Node and Pod watches the goals are checked on;
//! - [`crate::metrics`] (shared with the real-node suite): Prometheus text,
//!   quantiles, RSS and CPU;
//! - [`scenarios`]: storm, steady state, reboot wave, rollout, pruning.

pub mod control_plane;
pub mod control_plane_args;
pub mod fleet;
pub mod gates;
pub mod install;
pub mod kubelet;
pub mod observe;
pub mod pki;
pub mod scenarios;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::metrics;

pub use control_plane::missing_binaries;
pub use scenarios::Report;

/// One run's shape.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// Simulated nodes.
    #[arg(long, env = "NODEGATE_SCALE_NODES", default_value_t = 1000)]
    pub nodes: usize,
    /// The registration storm's length: node i boots at i × this / nodes.
    #[arg(long, env = "NODEGATE_SCALE_STORM", default_value = "60s", value_parser = nodegate_shared::duration::parse)]
    pub storm: Duration,
    /// The stand-in network agent, a DaemonSet Pod as Cilium's is, turns
    /// ready this long after its container starts (on the first boot once
    /// the DaemonSet controller created its Pod; after a reboot once the node
    /// registered again). Shorter than a real Cilium agent's start, so the
    /// nodegate agent's own start has less time to hide in.
    #[arg(long, env = "NODEGATE_SCALE_NETWORK_START", default_value = "5s", value_parser = nodegate_shared::duration::parse)]
    pub network_start: Duration,
    /// Gates in the install: 1 is the shipped one
    /// (`nodegate.dev/agent-not-ready`, opened by the network agent's
    /// probes); 2 adds `nodegate.dev/csi-not-ready`, 3 also
    /// `nodegate.dev/gpu-not-ready`, each opened by its own stand-in's file:
    /// the webhook with a `--taint` each, the agents with `--gates`
    /// (e2e/scale/README.md).
    #[arg(long, env = "NODEGATE_SCALE_GATES", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=gates::MAX as i64))]
    pub gates: u8,
    /// With several gates, gate k's stand-in turns ready k × this after the
    /// network agent (the storm's first boots): a join costs one agent
    /// write per gate.
    #[arg(long, env = "NODEGATE_SCALE_GATE_STAGGER", default_value = "2s", value_parser = nodegate_shared::duration::parse)]
    pub gate_stagger: Duration,
    /// The same after a reboot (the wave): 0, every gate's stand-in ready
    /// at once with the network agent (their files appear together), so
    /// the agent opens them in one patch.
    #[arg(long, env = "NODEGATE_SCALE_WAVE_GATE_STAGGER", default_value = "0s", value_parser = nodegate_shared::duration::parse)]
    pub wave_gate_stagger: Duration,
    /// `--kube-api-qps` and `--kube-api-burst` of kube-controller-manager and
    /// kube-scheduler: 100, as Kubernetes' own scalability jobs run them
    /// (their defaults, 20/30 and 50/100, pace the DaemonSet controller's Pod
    /// creation to 20 a second); 0 keeps the defaults.
    #[arg(long, env = "NODEGATE_SCALE_CONTROLLER_QPS", default_value_t = 100)]
    pub controller_qps: u32,
    /// The steady-state measuring window: longer than one cycle of every
    /// watch (kube-runtime re-watches every 290 s).
    #[arg(long, env = "NODEGATE_SCALE_STEADY", default_value = "300s", value_parser = nodegate_shared::duration::parse)]
    pub steady: Duration,
    /// Every this-many-th node reboots in the wave (10: 10 %).
    #[arg(long, env = "NODEGATE_SCALE_WAVE_EVERY", default_value_t = 10)]
    pub wave_every: usize,
    /// Nodes deleted while the agents are down.
    #[arg(long, env = "NODEGATE_SCALE_PRUNE", default_value_t = 50)]
    pub prune: usize,
    /// Scenarios after the storm, in order: steady, wave, rollout, prune.
    #[arg(
        long,
        env = "NODEGATE_SCALE_SCENARIOS",
        value_delimiter = ',',
        default_value = "steady,wave,rollout,prune"
    )]
    pub scenarios: Vec<String>,
    /// State directory (removed first; unix socket paths stay short).
    #[arg(long, env = "NODEGATE_SCALE_DIR", default_value = "/tmp/ngscale")]
    pub dir: PathBuf,
    /// The dummy interface the cluster's private addresses live on.
    #[arg(long, env = "NODEGATE_SCALE_IFACE", default_value = "ngscale0")]
    pub iface: String,
    /// Its /24 (the API server on .1, the webhook's replicas on .2 and .3).
    #[arg(long, env = "NODEGATE_SCALE_NET", default_value = "10.215.0")]
    pub net: String,
}

/// The first three octets of `--net`, a private /24.
pub fn prefix(net: &str) -> anyhow::Result<[u8; 3]> {
    let parts: Vec<u8> = net.split('.').map(str::parse).collect::<Result<_, _>>()?;
    let p: [u8; 3] = parts
        .try_into()
        .map_err(|_| anyhow::anyhow!("--net is the first three octets of a /24"))?;
    anyhow::ensure!(
        p[0] == 10 || (p[0] == 192 && p[1] == 168) || (p[0] == 172 && (16..32).contains(&p[1])),
        "--net must be a private range"
    );
    Ok(p)
}

/// Runs the whole harness and tears it down, whatever happened.
pub async fn run(cfg: Config) -> anyhow::Result<Report> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let net = control_plane::Net {
        iface: cfg.iface.clone(),
        prefix: prefix(&cfg.net)?,
    };
    let _ = std::fs::remove_dir_all(&cfg.dir);
    std::fs::create_dir_all(&cfg.dir)?;
    // One inotify instance per file probe: one per gate per agent.
    let inotify = InotifyLimit::raise(cfg.nodes * usize::from(cfg.gates))?;
    let pki = pki::Pki::new()?;
    let cp =
        control_plane::ControlPlane::start(&cfg.dir, net.clone(), &pki, cfg.controller_qps).await;
    let cp = match cp {
        Ok(cp) => cp,
        Err(e) => {
            let _ = net.down();
            return Err(e);
        }
    };
    let result = with_cluster(&cfg, &cp, &pki).await;
    cp.stop().await;
    drop(inotify);
    result
}

const INOTIFY_INSTANCES: &str = "/proc/sys/fs/inotify/max_user_instances";

/// Every agent's file probe holds an inotify instance, and one user may
/// hold 128 by default: 1,000 agents in one process would take every
/// instance root has, and a kubelet or containerd starting meanwhile (the
/// real-nodes harness's) would fail. Raised for the run, put back after.
pub struct InotifyLimit {
    old: Option<u64>,
}

impl InotifyLimit {
    pub fn raise(nodes: usize) -> anyhow::Result<Self> {
        let old: u64 = std::fs::read_to_string(INOTIFY_INSTANCES)?.trim().parse()?;
        let want = old + 2 * nodes as u64 + 64;
        if old >= want {
            return Ok(Self { old: None });
        }
        std::fs::write(INOTIFY_INSTANCES, want.to_string())?;
        Ok(Self { old: Some(old) })
    }
}

impl Drop for InotifyLimit {
    fn drop(&mut self) {
        if let Some(old) = self.old {
            let _ = std::fs::write(INOTIFY_INSTANCES, old.to_string());
        }
    }
}

async fn with_cluster(
    cfg: &Config,
    cp: &control_plane::ControlPlane,
    pki: &pki::Pki,
) -> anyhow::Result<Report> {
    let admin = cp.admin_client().await?;
    // The default ServiceAccount appears once the controller-manager runs.
    let sa: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
        kube::Api::namespaced(admin.clone(), "default");
    control_plane::wait_ok(
        "kube-controller-manager",
        Duration::from_secs(90),
        || async { sa.get_opt("default").await.ok().flatten() },
    )
    .await?;
    let gates = usize::from(cfg.gates);
    let variant = if gates > 1 {
        gates::variant(gates)?
    } else {
        install::Variant::default()
    };
    let inst = install::install_with(cp, pki, &admin, &variant).await?;
    install::kubectl(
        &cp.admin_kubeconfig,
        &["apply", "--server-side", "-f", "-"],
        Some(fleet::CRASH_POLICY),
    )?;
    let mut pids = BTreeMap::new();
    for name in [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ] {
        if let Some(p) = cp.pid(name) {
            pids.insert(name.to_string(), p);
        }
    }
    for p in inst.webhooks.iter().chain(&inst.rosters) {
        if let Some(pid) = p.pid() {
            pids.insert(p.name.clone(), pid);
        }
    }
    pids.insert("simulator".into(), std::process::id());
    let agent_bin = crate::process::bin_path("nodegate-agent");
    let fleet = Arc::new(fleet::Fleet::new(
        cp,
        pki,
        admin.clone(),
        variant.args("agent/daemonset.yaml")?,
        agent_bin.exists().then_some(agent_bin),
        cfg.network_start,
    ));
    fleet.set_gate_signals(gates::extra_files(gates), cfg.gate_stagger);
    tokio::spawn(fleet.clone().follow_pods());
    let rec = observe::start(cp.admin_config().await?)?;
    let ctx = scenarios::Ctx {
        admin: admin.clone(),
        fleet: fleet.clone(),
        rec,
        pki,
        webhook_admin: inst.webhook_admin.clone(),
        audit_log: cfg.dir.join("log/audit.log"),
        pids,
        gates,
        gate_stagger: cfg.gate_stagger,
        wave_gate_stagger: cfg.wave_gate_stagger,
    };
    let mut report = Report::default();
    let n = cfg.nodes;
    let outcome = async {
        scenarios::storm(&ctx, &mut report, n, cfg.storm).await?;
        for s in &cfg.scenarios {
            match s.as_str() {
                "steady" => scenarios::steady(&ctx, &mut report, n, cfg.steady).await?,
                "wave" => scenarios::wave(&ctx, &mut report, n, cfg.wave_every).await?,
                "rollout" => scenarios::rollout(&ctx, &mut report, &cp.admin_kubeconfig).await?,
                "prune" => scenarios::prune(&ctx, &mut report, cfg.prune, &cfg.dir).await?,
                other => anyhow::bail!("unknown scenario {other}"),
            }
        }
        anyhow::Ok(())
    }
    .await;
    if let Some(pid) = ctx.pids.get("simulator")
        && let Some(b) = metrics::rss(*pid)
    {
        report.figure(
            "rss_mib_simulator_total",
            format!("{:.1}", b as f64 / 1048576.0),
        );
    }
    fleet.shutdown().await;
    for p in inst.webhooks.into_iter().chain(inst.rosters) {
        p.stop(Duration::from_secs(5)).await;
    }
    outcome?;
    Ok(report)
}
