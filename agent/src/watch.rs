//! Watch timeouts as client-go's reflectors choose them (5–10 min, random).
//! kube-runtime re-watches every 290 s unless told otherwise: with one own-Node
//! and one roster watch per agent that alone was ~7 % of a kubelet's requests
//! at 1,000 nodes (e2e/scale, docs/scale.md). Random per agent, so agents
//! started together do not re-watch together.

use kube::runtime::watcher;

/// A watcher config whose calls last 300–599 s.
pub fn config() -> watcher::Config {
    watcher::Config::default().timeout(rand::random_range(300..600))
}
