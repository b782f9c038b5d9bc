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

#[cfg(test)]
mod tests {
    use super::*;

    /// Inside client-go's 5–10 min, and not all the same: agents started
    /// together must not re-watch together.
    #[test]
    fn timeouts_are_five_to_ten_minutes_and_spread() {
        let t: Vec<u32> = (0..64).map(|_| config().timeout.unwrap_or(0)).collect();
        assert!(t.iter().all(|s| (300..600).contains(s)), "{t:?}");
        assert!(t.iter().any(|s| *s != t[0]), "{t:?}");
    }
}
