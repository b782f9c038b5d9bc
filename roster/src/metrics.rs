//! The publisher's Prometheus metrics (`nodegate_roster_*`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

pub fn result(result: &'static str) -> ResultLabel {
    ResultLabel { result }
}

#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub leader: Gauge,
    pub nodes: Gauge,
    pub node_events: Counter,
    pub writes: Family<ResultLabel, Counter>,
    pub shard_bytes_max: Gauge,
}

impl Metrics {
    pub fn registry(&self) -> Registry {
        let mut r = Registry::with_prefix("nodegate_roster");
        r.register(
            "leader",
            "1 while this replica holds the lease and publishes",
            self.leader.clone(),
        );
        r.register("nodes", "Nodes in this replica's view", self.nodes.clone());
        r.register(
            "node_events",
            "Node watch events (adds, updates, deletes) received",
            self.node_events.clone(),
        );
        r.register(
            "shard_writes",
            "Shard ConfigMap writes by result (ok|conflict|error)",
            self.writes.clone(),
        );
        r.register(
            "shard_bytes_max",
            "Size of the largest shard last published",
            self.shard_bytes_max.clone(),
        );
        // Present from the start, so rate() and alerts see zeros, not gaps.
        for res in ["ok", "conflict", "error"] {
            let _ = self.writes.get_or_create(&result(res));
        }
        r
    }
}
