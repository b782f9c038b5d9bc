//! Admission as a client sees it: canary Node creates, four a second, and
//! the API server's per-line counters over a window.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::json;

use super::harness::{Harness, figure};
use super::lines::Lines;
use super::objects::gated_by_a_shipped_gate;

/// Server-side dry-run creates of a canary Node, four a second, each checked
/// for the gate: what a kubelet registering at that moment would have got.
/// Nothing is stored.
#[derive(Clone, Default)]
pub struct Prober {
    /// Each answered create: how long it took, and whether it came back gated.
    answers: Arc<Mutex<Vec<(Duration, bool)>>>,
}

impl Prober {
    pub fn start(client: kube::Client) -> Prober {
        let p = Prober::default();
        let answers = p.answers.clone();
        tokio::spawn(async move {
            let api: Api<Node> = Api::all(client);
            let dry = kube::api::PostParams {
                dry_run: true,
                ..Default::default()
            };
            for i in 0u64.. {
                let canary = serde_json::from_value::<Node>(json!({
                    "metadata": {"name": format!("nodegate-e2e-canary-{i}")}
                }));
                let Ok(canary) = canary else { return };
                let t = Instant::now();
                if let Ok(n) = api.create(&dry, &canary).await {
                    lock(&answers).push((t.elapsed(), gated_by_a_shipped_gate(&n)));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        p
    }

    /// How many creates were answered so far (a mark for [`Self::since`]).
    pub fn mark(&self) -> usize {
        lock(&self.answers).len()
    }

    /// (creates answered, of which came back without the gate) since `mark`.
    pub fn since(&self, mark: usize) -> (u64, u64) {
        let a = lock(&self.answers);
        let after = &a[mark.min(a.len())..];
        (
            after.len() as u64,
            after.iter().filter(|(_, g)| !g).count() as u64,
        )
    }

    /// The slowest answer since `mark`, and the median.
    pub fn latency_since(&self, mark: usize) -> (Duration, Duration) {
        let a = lock(&self.answers);
        let mut d: Vec<Duration> = a[mark.min(a.len())..].iter().map(|(d, _)| *d).collect();
        d.sort();
        (
            d.last().copied().unwrap_or_default(),
            d.get(d.len() / 2).copied().unwrap_or_default(),
        )
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Admission during a window: the API server's per-line counters for the
/// webhook, and the canaries answered and ungated.
pub struct Window {
    lines: Lines,
    mark: usize,
}

/// What a window saw.
pub struct Admitted {
    /// Fail-open calls, every line.
    pub fail_open: u64,
    /// Of which the first line's.
    pub first_line_fail_open: u64,
    /// Node writes no line answered.
    pub failed_through: u64,
    pub sent: u64,
    pub ungated: u64,
}

impl Window {
    pub fn open(h: &Harness, prober: &Prober) -> Window {
        Window {
            lines: h.lines(),
            mark: prober.mark(),
        }
    }

    /// Prints the window's figures as `<what>_*`.
    pub fn close(self, h: &Harness, prober: &Prober, what: &str) -> Admitted {
        let d = h.lines().since(&self.lines);
        let (sent, ungated) = prober.since(self.mark);
        let (slowest, median) = prober.latency_since(self.mark);
        let fail_open = d.fail_open.values().sum();
        let first_line_fail_open = Lines::first_line(&d.fail_open);
        let failed_through = d.failed_through_every_line();
        figure(&format!("{what}_fail_open"), fail_open);
        figure(
            &format!("{what}_fail_open_first_line"),
            first_line_fail_open,
        );
        figure(&format!("{what}_calls"), Lines::first_line(&d.calls));
        figure(
            &format!("{what}_backup_calls"),
            Lines::backups(&d.calls).sum::<u64>(),
        );
        figure(&format!("{what}_failed_through_every_line"), failed_through);
        figure(&format!("{what}_canaries"), sent);
        figure(&format!("{what}_canaries_ungated"), ungated);
        figure(&format!("{what}_canary_max_ms"), slowest.as_millis());
        figure(&format!("{what}_canary_median_ms"), median.as_millis());
        Admitted {
            fail_open,
            first_line_fail_open,
            failed_through,
            sent,
            ungated,
        }
    }

    /// As `close`, and asserts that no call of any line failed open.
    pub fn close_none_open(self, h: &Harness, prober: &Prober, what: &str) {
        let s = self.close(h, prober, what);
        assert_eq!(s.fail_open, 0, "{what}: admission calls failed open");
        assert!(s.sent > 0, "{what}: no canary create was answered");
        assert_eq!(s.ungated, 0, "{what}: canary creates came back ungated");
    }

    /// As `close`, and asserts that every Node write some line answered:
    /// calls may fail open as long as a later line caught them.
    pub fn close_none_ungated(
        self,
        h: &Harness,
        prober: &Prober,
        what: &str,
        min: u64,
    ) -> Admitted {
        let s = self.close(h, prober, what);
        assert!(
            s.sent >= min,
            "{what}: {} canaries answered, want {min}",
            s.sent
        );
        assert_eq!(s.ungated, 0, "{what}: canary creates came back ungated");
        assert_eq!(
            s.failed_through, 0,
            "{what}: Node writes failed open through every line"
        );
        s
    }
}
