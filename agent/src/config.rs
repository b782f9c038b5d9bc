//! Command-line flags, each with an environment fallback (a DaemonSet sets
//! env more easily than args).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser};
use nodegate_shared::TaintSpec;
use nodegate_shared::gate_flags::{GateFlags, ReleaseFlags};
use nodegate_shared::gates::{Gates, Probes};

use crate::gate::{GateConfig, GateInfo, HELD_EVENT_AFTER, HELD_EVENT_EVERY};
use crate::probe::{ProbeSpec, ProbeSpecError};
use crate::readiness::Thresholds;
use crate::taint_set::TaintSet;

/// One parser for every nodegate binary's durations.
pub use nodegate_shared::duration::parse as parse_duration;

fn parse_gates(s: &str) -> Result<Gates, String> {
    Gates::parse(s).map_err(|e| e.to_string())
}

/// One gate the agent opens: its taints and the probes that open it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentGate {
    pub name: String,
    pub taints: Vec<TaintSpec>,
    pub probes: Vec<ProbeSpec>,
}

/// A declaration's probes as the agent's specs, in flag order.
fn specs_of(p: &Probes) -> Result<Vec<ProbeSpec>, ProbeSpecError> {
    let mut out = Vec::new();
    for s in &p.http {
        out.push(ProbeSpec::http(s)?);
    }
    for s in &p.tcp {
        out.push(ProbeSpec::tcp(s)?);
    }
    for s in &p.file {
        out.push(ProbeSpec::file(s)?);
    }
    for s in &p.exec {
        out.push(ProbeSpec::exec(s)?);
    }
    for s in &p.pod {
        out.push(ProbeSpec::pod(s)?);
    }
    Ok(out)
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "nodegate-agent",
    version,
    args_override_self = true,
    about = "Removes the nodegate taint from its own Node once the network agent is ready, and prunes state of Nodes deleted while it was down"
)]
pub struct Args {
    /// This node's name (downward API `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,

    // `--taint` and `--boot-taint`, declared once for every binary: the
    // agent removes what the webhook adds, so both must name the same.
    #[command(flatten)]
    pub gate: GateFlags,

    // `--release-taint`: removed with the ready patch, never added. Every
    // other gate nodegate ships is released besides, without a flag
    // (`taint_set`): a switch of key profile or strict mode turned off then
    // leaves no stale gate, and the confinement generator computes the same
    // set from the same shared function, so the policy cannot drift.
    #[command(flatten)]
    pub release: ReleaseFlags,

    /// Every gate, with the probes that open each and the gates owned
    /// elsewhere (which the agent never adds or removes): the declaration
    /// `nodegate-webhook gates-component` reads, as one line of JSON
    /// (docs/gates.md). Instead of --taint, --boot-taint and --probe-*.
    #[arg(
        long,
        env = "NODEGATE_GATES",
        value_parser = parse_gates,
        conflicts_with_all = ["taints", "boot_taints", "probe_http", "probe_tcp", "probe_file", "probe_exec", "probe_pod"]
    )]
    pub gates: Option<Gates>,

    /// HTTP GET that must answer 2xx; repeatable.
    #[arg(long, env = "NODEGATE_PROBE_HTTP", value_delimiter = ',')]
    pub probe_http: Vec<String>,

    /// HOST:PORT that must accept a TCP connection; repeatable.
    #[arg(long, env = "NODEGATE_PROBE_TCP", value_delimiter = ',')]
    pub probe_tcp: Vec<String>,

    /// File that must exist and be non-empty (watched with inotify); repeatable.
    #[arg(long, env = "NODEGATE_PROBE_FILE", value_delimiter = ',')]
    pub probe_file: Vec<String>,

    /// Shell command (`sh -c`) that must exit 0 within the probe timeout; repeatable.
    #[arg(long, env = "NODEGATE_PROBE_EXEC")]
    pub probe_exec: Vec<String>,

    /// NAMESPACE/LABEL_SELECTOR: a pod with these labels on this node must be Ready; repeatable.
    #[arg(long, env = "NODEGATE_PROBE_POD")]
    pub probe_pod: Vec<String>,

    /// Time between probe rounds once ready.
    #[arg(long, env = "NODEGATE_PROBE_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub probe_period: Duration,

    /// Time between probe rounds while not ready: the node is gated, so
    /// every round saved here is time the node cannot take pods. Probes of
    /// localhost are cheap; an exec probe forks this often.
    #[arg(long, env = "NODEGATE_PENDING_PROBE_PERIOD", default_value = "20ms", value_parser = parse_duration)]
    pub pending_probe_period: Duration,

    /// Time limit of one probe.
    #[arg(long, env = "NODEGATE_PROBE_TIMEOUT", default_value = "1s", value_parser = parse_duration)]
    pub probe_timeout: Duration,

    /// Consecutive passing rounds before the node counts as ready.
    #[arg(long, env = "NODEGATE_SUCCESS_THRESHOLD", default_value_t = 1)]
    pub success_threshold: u32,

    /// Consecutive failing rounds before a ready node counts as not ready.
    #[arg(long, env = "NODEGATE_FAILURE_THRESHOLD", default_value_t = 3)]
    pub failure_threshold: u32,

    /// Put the taint back on SIGTERM (`--taint-on-shutdown=false` to disable).
    #[arg(long, env = "NODEGATE_TAINT_ON_SHUTDOWN", default_value_t = true, action = ArgAction::Set)]
    pub taint_on_shutdown: bool,

    /// Everything done on SIGTERM (re-taint, last snapshot) must finish within this.
    #[arg(long, env = "NODEGATE_SHUTDOWN_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_deadline: Duration,

    /// The agent's own DaemonSet, in --pod-namespace. On SIGTERM the agent
    /// reads it and its Namespace: if either is gone or being deleted (or
    /// the DaemonSet's read is forbidden), nodegate is being removed and
    /// the agent removes its gates from the node instead of re-tainting
    /// it. Unset or empty (`--daemonset=`): no check, SIGTERM always
    /// re-taints.
    #[arg(long, env = "NODEGATE_DAEMONSET")]
    pub daemonset: Option<String>,

    /// The pod's namespace (downward API `metadata.namespace`): where
    /// --daemonset is. Without it there is no check.
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,

    /// Cluster Autoscaler's --max-node-startup-time (1.35+; a constant 15 min
    /// before): CA's soft taints on a gated node count as a sign that the
    /// gate is not declared only on nodes younger than this.
    ///
    /// CA may override it per node group, which the agent cannot see: set
    /// the shortest group's window, or declared gates on that group's older
    /// nodes are reported as undeclared. `0s` turns the Cluster Autoscaler
    /// signal off.
    #[arg(long, env = "NODEGATE_CA_MAX_NODE_STARTUP_TIME", default_value = "15m", value_parser = parse_duration)]
    pub ca_max_node_startup_time: Duration,

    /// Keep probing after ready: re-taint after the failure threshold, untaint when ready again.
    #[arg(long, env = "NODEGATE_CONTINUOUS")]
    pub continuous: bool,

    /// Directory of `nodes.json` (keep it on a hostPath under /var/run).
    #[arg(long, env = "NODEGATE_STATE_DIR", default_value = "/var/run/nodegate")]
    pub state_dir: PathBuf,

    /// At most one snapshot write per interval, however many events arrive.
    #[arg(long, env = "NODEGATE_SNAPSHOT_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub snapshot_interval: Duration,

    /// Command (`sh -c`) run for each deleted node: record JSON on stdin,
    /// NODEGATE_NODE_NAME, NODEGATE_NODE_IPS, NODEGATE_DELETE_SOURCE in env.
    /// Pruning (and its snapshot) runs only when a handler is configured.
    #[arg(long, env = "NODEGATE_ON_NODE_DELETE")]
    pub on_node_delete: Option<String>,

    /// Time limit of one run of the deletion command.
    #[arg(long, env = "NODEGATE_ON_NODE_DELETE_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub on_node_delete_timeout: Duration,

    /// Extra attempts of the deletion command after a failure.
    #[arg(long, env = "NODEGATE_ON_NODE_DELETE_RETRIES", default_value_t = 3)]
    pub on_node_delete_retries: u32,

    /// Confirmation GETs per second for the whole cluster: every agent
    /// confirms every deletion with one GET of the node before its handler
    /// runs, spread over `nodes / qps` seconds and paced at `qps / nodes`
    /// per agent (one agent per node), so the API server sees about this
    /// many per second at any cluster size.
    #[arg(long, env = "NODEGATE_PRUNE_CONFIRM_QPS", default_value_t = 200.0)]
    pub prune_confirm_qps: f64,

    /// A change that deletes more nodes than this at once is a mass
    /// deletion: held, counted and confirmed one node at a time.
    #[arg(long, env = "NODEGATE_PRUNE_HOLD_COUNT", default_value_t = 50)]
    pub prune_hold_count: usize,

    /// ... as is one that deletes more than this share of the known nodes
    /// (from 5 nodes on).
    #[arg(long, env = "NODEGATE_PRUNE_HOLD_SHARE", default_value_t = 0.2)]
    pub prune_hold_share: f64,

    /// Where pruning learns which nodes exist: `roster` (the publisher's
    /// shard ConfigMaps; changes only on join, leave or address change) or
    /// `nodes` (a watch on every Node; for small clusters).
    #[arg(long, env = "NODEGATE_PRUNE_SOURCE", value_enum, default_value_t = PruneSource::Roster)]
    pub prune_source: PruneSource,

    /// Namespace of the roster's shard ConfigMaps (the install's namespace).
    #[arg(long, env = "NODEGATE_ROSTER_NAMESPACE", default_value = "nodegate")]
    pub roster_namespace: String,

    /// The roster's name (the publisher's `--name`).
    #[arg(long, env = "NODEGATE_ROSTER_NAME", default_value = nodegate_roster::shard::DEFAULT_NAME)]
    pub roster_name: String,

    /// Admin HTTP address: /livez, /readyz, /metrics. An unspecified IP
    /// (0.0.0.0, ::) is replaced by --bind-address when that is set.
    #[arg(long, env = "NODEGATE_ADMIN_LISTEN", default_value = "0.0.0.0:9091")]
    pub admin_listen: SocketAddr,

    /// Connections open at once on the admin port (plus 16 for peers on
    /// this host, such as the kubelet's probes); every pod of the node can
    /// reach it, and one more connection is closed as soon as accepted.
    #[arg(long, env = "NODEGATE_ADMIN_MAX_CONNECTIONS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub admin_max_connections: u32,

    /// The pod's IP (downward API `status.podIP`; the node's IP on the host
    /// network): an --admin-listen with an unspecified IP binds this one,
    /// not every address of the host.
    #[arg(long, env = "POD_IP")]
    pub bind_address: Option<std::net::IpAddr>,
}

/// `--prune-source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PruneSource {
    Roster,
    Nodes,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Probe(#[from] ProbeSpecError),
    #[error(transparent)]
    Taint(#[from] nodegate_shared::TaintError),
    #[error("--node-name (or NODE_NAME) must not be empty")]
    NodeName,
    #[error("--prune-confirm-qps must be a positive number and --prune-hold-share within 0..=1")]
    Prune,
    #[error("--probe-period and --pending-probe-period must be at least 1ms")]
    Period,
}

impl Args {
    /// `--admin-listen`, its unspecified IP replaced by `--bind-address`.
    ///
    /// On the host network that is the node's IP, which every pod can
    /// reach. It is not moved to 127.0.0.1: the kubelet's httpGet probes of
    /// a host-network pod, and Prometheus, dial the pod's IP. Being
    /// reachable is harmless because the port serves GETs of `/livez`,
    /// `/readyz` and `/metrics` only (any other method or path is refused),
    /// changes nothing, and its metrics hold no secret: probes are labelled
    /// by kind and index, never by URL or command; and connections are
    /// capped (`--admin-max-connections`, with a reserve for this host) and
    /// timed out, so pods cannot starve the kubelet's probes
    /// (`tests/e2e_admin_port.rs`).
    pub fn admin_address(&self) -> SocketAddr {
        match self.bind_address {
            Some(ip) if self.admin_listen.ip().is_unspecified() => {
                SocketAddr::new(ip, self.admin_listen.port())
            }
            _ => self.admin_listen,
        }
    }

    /// The probes of the flags (`--probe-*`), for the one gate of `--taint`.
    fn flag_probes(&self) -> Probes {
        Probes {
            http: self.probe_http.clone(),
            tcp: self.probe_tcp.clone(),
            file: self.probe_file.clone(),
            exec: self.probe_exec.clone(),
            pod: self.probe_pod.clone(),
        }
    }

    /// Validates and returns every configured probe, of every gate.
    pub fn probe_specs(&self) -> Result<Vec<ProbeSpec>, ConfigError> {
        Ok(self
            .agent_gates()?
            .into_iter()
            .flat_map(|g| g.probes)
            .collect())
    }

    /// The gates the agent opens, in order: `--gates`' own (not those owned
    /// elsewhere), else one gate, `default`, of `--taint` and `--probe-*`.
    pub fn agent_gates(&self) -> Result<Vec<AgentGate>, ConfigError> {
        match &self.gates {
            Some(gates) => gates
                .opened()
                .map(|g| {
                    Ok(AgentGate {
                        name: g.name.clone(),
                        taints: vec![g.taint.0.clone()],
                        probes: specs_of(&g.probes)?,
                    })
                })
                .collect(),
            None => Ok(vec![AgentGate {
                name: "default".into(),
                taints: self.gate.ordinary(),
                probes: specs_of(&self.flag_probes())?,
            }]),
        }
    }

    /// The gates as the state machine knows them.
    pub fn gate_infos(&self) -> Result<Vec<GateInfo>, ConfigError> {
        Ok(self
            .agent_gates()?
            .into_iter()
            .map(|g| GateInfo {
                name: g.name,
                probes: g.probes.len(),
            })
            .collect())
    }

    /// `--taint`/`--boot-taint`, or what `--gates` declares, as the flags
    /// would (so the release set and its checks read one shape).
    fn gate_flags(&self) -> GateFlags {
        match &self.gates {
            Some(g) => GateFlags {
                taints: g.taints(),
                boot_taints: g.boot_taints(),
            },
            None => self.gate.clone(),
        }
    }

    /// Checks everything that can be checked before touching the cluster.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.node_name.trim().is_empty() {
            return Err(ConfigError::NodeName);
        }
        let gate = self.gate_flags();
        gate.validate()?;
        self.release.validate(&gate)?;
        self.probe_specs()?;
        // A zero period would run probe rounds back to back.
        if self.probe_period.min(self.pending_probe_period) < Duration::from_millis(1) {
            return Err(ConfigError::Period);
        }
        let qps_ok = self.prune_confirm_qps.is_finite() && self.prune_confirm_qps > 0.0;
        if !qps_ok || !(0.0..=1.0).contains(&self.prune_hold_share) {
            return Err(ConfigError::Prune);
        }
        Ok(())
    }

    /// The taints to manage (the default one without `--taint`), the boot
    /// gate and the released ones: `--release-taint`, then every shipped
    /// gate not managed here (`ReleaseFlags::effective`).
    pub fn taint_set(&self) -> TaintSet {
        let gate = self.gate_flags();
        let gates = match &self.gates {
            Some(g) => g.opened().map(|g| vec![g.taint.0.clone()]).collect(),
            None => vec![gate.ordinary()],
        };
        TaintSet::with_gates(
            gates,
            gate.boot_taints.clone(),
            self.release.effective(&gate),
        )
    }

    /// The gate's timing and modes.
    pub fn gate_config(&self) -> GateConfig {
        GateConfig {
            period: self.probe_period,
            pending_period: self.pending_probe_period,
            timeout: self.probe_timeout,
            thresholds: self.thresholds(),
            continuous: self.continuous,
            taint_on_shutdown: self.taint_on_shutdown,
            shutdown_deadline: self.shutdown_deadline,
            ca_max_node_startup: self.ca_max_node_startup_time,
            held_event_after: HELD_EVENT_AFTER,
            held_event_every: HELD_EVENT_EVERY,
        }
    }

    /// The namespace and DaemonSet the removal check reads: both named, or
    /// no check. A namespace is never guessed (the client's default would
    /// be `default`, where the DaemonSet is not found, and every stop would
    /// read as a removal); whoever runs the shipped args without
    /// `POD_NAMESPACE` (simulated fleets) gets today's shutdown.
    pub fn removal_target(&self) -> Option<(String, String)> {
        let named = |s: &Option<String>| {
            s.as_deref()
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        Some((named(&self.pod_namespace)?, named(&self.daemonset)?))
    }

    pub fn confirm(&self) -> crate::confirm::ConfirmConfig {
        crate::confirm::ConfirmConfig {
            qps: self.prune_confirm_qps,
            hold_count: self.prune_hold_count,
            hold_share: self.prune_hold_share,
        }
    }

    pub fn thresholds(&self) -> Thresholds {
        Thresholds {
            success: self.success_threshold,
            failure: self.failure_threshold,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegate_shared::keys::DEFAULT_TAINT;

    #[test]
    fn defaults_and_repeatable_flags() {
        let a = Args::try_parse_from([
            "nodegate-agent",
            "--node-name",
            "n1",
            "--probe-file",
            "/a",
            "--probe-file",
            "/b",
            "--probe-http",
            "http://127.0.0.1:9879/healthz",
            "--taint-on-shutdown=false",
        ])
        .unwrap();
        let taints = a.taint_set();
        assert_eq!(taints.managed().len(), 1);
        assert_eq!(taints.managed()[0].to_string(), DEFAULT_TAINT);
        assert_eq!(
            taints.release(),
            nodegate_shared::taint::release_set(taints.managed(), &[]),
            "without the flag: the built-in set only"
        );
        assert!(
            !taints
                .release()
                .iter()
                .any(|r| r.to_string() == nodegate_shared::keys::LEGACY_TAINT),
            "Cilium's key is released only on request"
        );
        assert_eq!(a.pending_probe_period, Duration::from_millis(20));
        assert!(!a.taint_on_shutdown);
        assert_eq!(a.prune_source, PruneSource::Roster);
        assert_eq!(a.roster_namespace, "nodegate");
        assert!(
            a.on_node_delete.is_none(),
            "gate-only unless a handler is set"
        );
        assert_eq!(a.probe_specs().unwrap().len(), 3);
        assert_eq!(a.removal_target(), None, "no removal check unless asked");
        assert_eq!(a.state_dir, PathBuf::from("/var/run/nodegate"));
        assert_eq!(a.admin_address(), a.admin_listen, "no POD_IP: as given");
        assert_eq!(a.admin_listen.port(), 9091);
        assert_eq!(a.admin_max_connections, 64);
        assert_eq!(
            (a.prune_confirm_qps, a.prune_hold_count, a.prune_hold_share),
            (200.0, 50, 0.2)
        );
        a.validate().unwrap();
    }

    /// `--ca-max-node-startup-time`: CA's default window unless given, in
    /// any of the agent's duration forms, and handed to the gate.
    #[test]
    fn the_ca_startup_window_is_a_flag() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["nodegate-agent", "--node-name", "n1"];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv).unwrap()
        };
        let a = parse(&[]);
        assert_eq!(a.ca_max_node_startup_time, Duration::from_secs(15 * 60));
        assert_eq!(
            a.ca_max_node_startup_time,
            crate::autoscaler::CA_MAX_NODE_STARTUP
        );
        assert_eq!(
            a.gate_config().ca_max_node_startup,
            crate::autoscaler::CA_MAX_NODE_STARTUP
        );
        let a = parse(&["--ca-max-node-startup-time=5m"]);
        assert_eq!(a.ca_max_node_startup_time, Duration::from_secs(5 * 60));
        assert_eq!(
            a.gate_config().ca_max_node_startup,
            Duration::from_secs(5 * 60)
        );
        a.validate().unwrap();
        let a = parse(&["--ca-max-node-startup-time", "900s"]);
        assert_eq!(a.ca_max_node_startup_time, Duration::from_secs(15 * 60));
        let err =
            Args::try_parse_from(["a", "--node-name", "n", "--ca-max-node-startup-time=15min"])
                .unwrap_err();
        assert!(err.to_string().contains("unknown unit"), "{err}");
    }

    /// On the host network the admin port binds the pod's (the node's) IP,
    /// not every address of the host; an explicit IP stays.
    #[test]
    fn the_admin_port_binds_the_pods_ip() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["nodegate-agent", "--node-name", "n1", "--probe-file", "/a"];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv).unwrap()
        };
        let a = parse(&["--bind-address", "10.0.0.7"]);
        assert_eq!(a.admin_address().to_string(), "10.0.0.7:9091");
        let a = parse(&[
            "--bind-address",
            "10.0.0.7",
            "--admin-listen",
            "127.0.0.1:9999",
        ]);
        assert_eq!(a.admin_address().to_string(), "127.0.0.1:9999");
    }

    /// The removal check runs only with both names; `--daemonset=` last
    /// (after the shipped one) turns it off.
    #[test]
    fn the_removal_check_needs_both_names() {
        let target = |extra: &[&str]| {
            let mut argv = vec!["a", "--node-name", "n"];
            argv.extend_from_slice(extra);
            let a = Args::try_parse_from(argv).unwrap();
            a.validate().unwrap();
            a.removal_target()
        };
        assert_eq!(
            target(&["--daemonset=nodegate-agent", "--pod-namespace=nodegate"]),
            Some(("nodegate".into(), "nodegate-agent".into()))
        );
        for off in [
            &["--daemonset=nodegate-agent"][..],
            &["--pod-namespace=nodegate"],
            &["--daemonset=nodegate-agent", "--pod-namespace= "],
            &[
                "--daemonset=nodegate-agent",
                "--pod-namespace=nodegate",
                "--daemonset=",
            ],
        ] {
            assert_eq!(target(off), None, "{off:?}");
        }
    }

    #[test]
    fn bad_input_is_refused_clearly() {
        let err = Args::try_parse_from(["a", "--node-name", "n", "--taint", "bad"]).unwrap_err();
        assert!(err.to_string().contains("no effect"), "{err}");
        let a = Args::try_parse_from([
            "a",
            "--node-name",
            "n",
            "--taint",
            "a/b:NoSchedule",
            "--taint",
            "a/b=x:NoSchedule",
        ])
        .unwrap();
        assert!(a.validate().unwrap_err().to_string().contains("twice"));
        // Releasing what the agent manages would undo the webhook's gate.
        let a = Args::try_parse_from([
            "a",
            "--node-name",
            "n",
            "--release-taint",
            "nodegate.dev/agent-not-ready=old:NoSchedule",
        ])
        .unwrap();
        assert!(
            a.validate()
                .unwrap_err()
                .to_string()
                .contains("the agent would remove what the webhook adds")
        );
        for flag in ["--probe-period", "--pending-probe-period"] {
            let a = Args::try_parse_from(["a", "--node-name", "n", flag, "0s"]).unwrap();
            assert!(
                a.validate()
                    .unwrap_err()
                    .to_string()
                    .contains("at least 1ms"),
                "{flag}"
            );
        }
        let a = Args::try_parse_from(["a", "--node-name", "n", "--probe-tcp", "nohost"]).unwrap();
        assert!(a.validate().unwrap_err().to_string().contains("HOST:PORT"));
        for bad in [
            ["--prune-confirm-qps", "0"],
            ["--prune-confirm-qps", "NaN"],
            ["--prune-hold-share", "1.5"],
        ] {
            let a = Args::try_parse_from(["a", "--node-name", "n", bad[0], bad[1]]).unwrap();
            assert!(
                a.validate().unwrap_err().to_string().contains("qps"),
                "{bad:?}"
            );
        }
    }

    const GATES: &str = r#"{"gates":[
        {"name":"cni","taint":"nodegate.dev/agent-not-ready=true:NoSchedule","probes":{"http":["http://127.0.0.1:9879/healthz"]}},
        {"name":"csi","taint":"nodegate.dev/csi-not-ready=true:NoSchedule","probes":{"pod":["kube-system/app=csi"],"tcp":["127.0.0.1:9808"]}},
        {"name":"ebs","taint":"ebs.csi.aws.com/agent-not-ready:NoExecute","owner":{"daemonSet":"kube-system/ebs-csi-node"}}]}"#;

    /// `--gates` is the whole declaration: the agent opens its own gates,
    /// each on its probes, and never touches the one owned elsewhere.
    #[test]
    fn gates_declare_each_gate_and_its_probes_and_leave_owned_ones_alone() {
        let a = Args::try_parse_from(["x", "--node-name=n", "--gates", GATES]).unwrap();
        a.validate().unwrap();
        let gates = a.agent_gates().unwrap();
        let names: Vec<&str> = gates.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["cni", "csi"]);
        assert_eq!(gates[1].probes.len(), 2);
        let set = a.taint_set();
        assert_eq!(set.gates().len(), 2);
        assert!(
            !set.managed()
                .iter()
                .any(|t| t.key() == "ebs.csi.aws.com/agent-not-ready"),
            "an owned gate is never the agent's to add or remove"
        );
        assert_eq!(a.probe_specs().unwrap().len(), 3);
        // The flags of one gate are refused beside it.
        for flag in [
            "--taint=a.dev/x:NoSchedule",
            "--probe-tcp=h:1",
            "--boot-taint=a.dev/x:NoExecute",
        ] {
            let err =
                Args::try_parse_from(["x", "--node-name=n", "--gates", GATES, flag]).unwrap_err();
            assert!(
                err.to_string().contains("cannot be used with"),
                "{flag}: {err}"
            );
        }
        let bad = Args::try_parse_from(["x", "--node-name=n", "--gates", r#"{"gates":[]}"#]);
        assert!(
            bad.unwrap_err()
                .to_string()
                .contains("no gate nodegate opens")
        );
        let probe =
            r#"{"gates":[{"name":"a","taint":"a.dev/x:NoSchedule","probes":{"tcp":["nope"]}}]}"#;
        let a = Args::try_parse_from(["x", "--node-name=n", "--gates", probe]).unwrap();
        assert!(a.validate().unwrap_err().to_string().contains("HOST:PORT"));
        // Without it: one gate, `default`, of --taint and --probe-*.
        let one = Args::try_parse_from(["x", "--node-name=n", "--probe-tcp=h:1"]).unwrap();
        let gates = one.agent_gates().unwrap();
        assert_eq!((gates.len(), gates[0].name.as_str()), (1, "default"));
        assert_eq!(gates[0].taints, vec![DEFAULT_TAINT.parse().unwrap()]);
    }
}
