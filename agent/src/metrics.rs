//! Prometheus metrics (`nodegate_agent_*`) served on the admin port.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A probe as metrics name it: its kind (`http`, `tcp`, `file`, `exec`,
/// `pod`) and its position among the flags of that kind. Never the URL or
/// command line: those may carry tokens, and the admin port is
/// unauthenticated.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub kind: &'static str,
    pub index: u32,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeName {
    pub kind: &'static str,
    pub index: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    pub reason: String,
}

/// Who put the taint on that a ready patch removed (`time_to_ready_seconds`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OriginLabel {
    pub origin: String,
}

/// A gate by its name (`gate_open`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GateLabel {
    pub gate: String,
}

/// The autoscaler that did not wait for the gate (`gate_undeclared`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AutoscalerLabel {
    pub autoscaler: &'static str,
}

/// The shutdown's decision (`retaint|open`) and why (`removal::Why`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShutdownLabels {
    pub decision: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Source {
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandlerLabels {
    pub handler: String,
}

/// All agent metrics; cheap to clone (every field is an `Arc` inside).
#[derive(Clone)]
pub struct Metrics {
    pub probe_results: Family<ProbeLabels, Counter>,
    pub probe_up: Family<ProbeName, Gauge>,
    pub ready: Gauge,
    pub gate_open: Family<GateLabel, Gauge>,
    pub time_to_ready: Family<OriginLabel, Histogram, fn() -> Histogram>,
    pub taint_adds: Family<Reason, Counter>,
    pub taint_removals: Counter,
    pub gate_undeclared: Family<AutoscalerLabel, Counter>,
    pub shutdown_decisions: Family<ShutdownLabels, Counter>,
    pub pruned_nodes: Family<Source, Counter>,
    pub nodes_known: Gauge,
    pub snapshot_nodes: Gauge,
    pub snapshot_bytes: Gauge,
    pub snapshot_write_seconds: Histogram,
    pub snapshot_write_failures: Counter,
    pub snapshot_corrupt: Counter,
    pub handler_failures: Family<HandlerLabels, Counter>,
    pub roster_complete: Gauge,
    pub roster_rejected: Counter,
    pub roster_shards: Gauge,
    pub prune_confirmations: Family<ResultLabel, Counter>,
    pub prune_refused: Counter,
    pub prune_holds: Counter,
    pub prune_pending: Gauge,
    pub prune_held: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            probe_results: Family::default(),
            probe_up: Family::default(),
            ready: Gauge::default(),
            gate_open: Family::default(),
            time_to_ready: Family::new_with_constructor(time_to_ready_histogram),
            taint_adds: Family::default(),
            taint_removals: Counter::default(),
            gate_undeclared: Family::default(),
            shutdown_decisions: Family::default(),
            pruned_nodes: Family::default(),
            nodes_known: Gauge::default(),
            snapshot_nodes: Gauge::default(),
            snapshot_bytes: Gauge::default(),
            // 100 µs .. ~3 s
            snapshot_write_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            snapshot_write_failures: Counter::default(),
            snapshot_corrupt: Counter::default(),
            handler_failures: Family::default(),
            roster_complete: Gauge::default(),
            roster_rejected: Counter::default(),
            roster_shards: Gauge::default(),
            prune_confirmations: Family::default(),
            prune_refused: Counter::default(),
            prune_holds: Counter::default(),
            prune_pending: Gauge::default(),
            prune_held: Gauge::default(),
        }
    }
}

/// 0.25 s .. ~34 min.
fn time_to_ready_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.25, 2.0, 14))
}

impl Metrics {
    /// A registry with every metric under the `nodegate_agent` prefix.
    pub fn registry(&self) -> Registry {
        self.registry_for(true)
    }

    /// [`Metrics::registry`], the roster's gauges only for an agent that
    /// prunes from the roster: a gate-only agent exporting
    /// `roster_complete 0` would look like a roster that never completes.
    pub fn registry_for(&self, roster: bool) -> Registry {
        let mut r = Registry::with_prefix("nodegate_agent");
        self.register_gate(&mut r);
        self.register_prune(&mut r);
        if roster {
            self.register_roster(&mut r);
        }
        r
    }

    /// The readiness gate's metrics.
    fn register_gate(&self, r: &mut Registry) {
        r.register(
            "probe_results",
            "Probe rounds by probe (kind, index among the flags of that kind) and result (ok|fail)",
            self.probe_results.clone(),
        );
        r.register(
            "probe_up",
            "1 when the probe's (kind, index) last result passed",
            self.probe_up.clone(),
        );
        r.register(
            "ready",
            "1 while the readiness gate considers the node ready",
            self.ready.clone(),
        );
        r.register(
            "gate_open",
            "1 while the gate's probes pass on this boot (one series per gate of --gates; `default` without it)",
            self.gate_open.clone(),
        );
        r.register(
            "time_to_ready_seconds",
            "Seconds from agent start (or reboot seen) to the taint removal, by who put the taint on (webhook|safety_net|continuous|none)",
            self.time_to_ready.clone(),
        );
        r.register(
            "taint_adds",
            "Taint additions by the agent, by reason (safety_net|shutdown|continuous)",
            self.taint_adds.clone(),
        );
        r.register(
            "taint_removals",
            "Successful ready patches that removed the taint",
            self.taint_removals.clone(),
        );
        r.register(
            "gate_undeclared",
            "Ready patches that found an autoscaler's mark on the node it removed the gate from, on the node's first ready: the autoscaler (karpenter|cluster-autoscaler) did not wait for the gate",
            self.gate_undeclared.clone(),
        );
        r.register(
            "shutdown_decisions",
            "SIGTERM decisions: retaint (not a removal of nodegate; the shutdown re-taint unless --taint-on-shutdown=false) or open (nodegate is being removed: its gates removed, none added), by reason (not_checked|installed|check_failed|daemonset_not_found|daemonset_deleting|daemonset_forbidden|namespace_terminating|namespace_not_found)",
            self.shutdown_decisions.clone(),
        );
        // Born at 0, so a first increase is one `increase()` sees.
        for a in crate::autoscaler::Autoscaler::ALL {
            let _ = self.gate_undeclared.get_or_create(&AutoscalerLabel {
                autoscaler: a.as_str(),
            });
        }
    }

    /// Pruning's metrics, whatever its source: the snapshot, the handlers
    /// and the confirmations.
    fn register_prune(&self, r: &mut Registry) {
        r.register(
            "pruned_nodes",
            "Node deletions dispatched to handlers, by source (watch|snapshot)",
            self.pruned_nodes.clone(),
        );
        r.register(
            "nodes_known",
            "Nodes in the pruner's live set (own node excluded)",
            self.nodes_known.clone(),
        );
        r.register(
            "snapshot_nodes",
            "Nodes in the last snapshot written",
            self.snapshot_nodes.clone(),
        );
        r.register(
            "snapshot_bytes",
            "Size of the last snapshot written",
            self.snapshot_bytes.clone(),
        );
        r.register(
            "snapshot_write_duration_seconds",
            "Time to encode and durably write one snapshot",
            self.snapshot_write_seconds.clone(),
        );
        r.register(
            "snapshot_write_failures",
            "Snapshot writes that failed",
            self.snapshot_write_failures.clone(),
        );
        r.register(
            "snapshot_corrupt",
            "Snapshots found corrupt or of unknown version at start and moved aside",
            self.snapshot_corrupt.clone(),
        );
        r.register(
            "handler_failures",
            "Node deletion handler runs that failed after all retries",
            self.handler_failures.clone(),
        );
        r.register(
            "prune_confirmations",
            "Deletion confirmations by result: gone (404 and no live node shares its values: the handler runs), live (same uid: no handler runs), error (asked again later), conflict_name, conflict_address, conflict_pod_cidr, conflict_provider_id (held: a live node holds that name or value, no handler runs)",
            self.prune_confirmations.clone(),
        );
        r.register(
            "prune_refused",
            "Deletions refused because the API server still has the node with that uid (a false node source, e.g. a forged roster shard)",
            self.prune_refused.clone(),
        );
        r.register(
            "prune_holds",
            "Mass deletions held (more than --prune-hold-count nodes, or --prune-hold-share of the known nodes, in one change)",
            self.prune_holds.clone(),
        );
        r.register(
            "prune_pending",
            "Deletions waiting for their confirmation with the API server",
            self.prune_pending.clone(),
        );
        r.register(
            "prune_held",
            "Of those, deletions in held mass deletions",
            self.prune_held.clone(),
        );
        for res in ["gone", "live", "error"] {
            let _ = self
                .prune_confirmations
                .get_or_create(&ResultLabel { result: res });
        }
    }

    /// The roster's gauges (`--prune-source=roster` only).
    fn register_roster(&self, r: &mut Registry) {
        r.register(
            "roster_complete",
            "1 while the roster's shards form a complete set (--prune-source=roster); pruning waits while 0",
            self.roster_complete.clone(),
        );
        r.register(
            "roster_shards",
            "Roster shards held that passed every check (any epoch)",
            self.roster_shards.clone(),
        );
        r.register(
            "roster_shards_rejected",
            "Roster shard versions refused as corrupt, misplaced or of an unknown format",
            self.roster_rejected.clone(),
        );
    }
}
