//! The API server's per-line counters of nodegate's admission, from its
//! `/metrics` text.

use std::collections::BTreeMap;

use crate::metrics::{Scrape, parse};

/// The first line of nodegate's admission (each backup line is
/// `replica-<i>.` this).
pub const WEBHOOK: &str = "nodes.nodegate.dev";

/// `metric`'s samples summed per webhook name, for nodegate's lines only
/// (`nodes.nodegate.dev` and each `replica-<i>.nodes.nodegate.dev`).
fn by_line(scrape: &Scrape, metric: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for s in scrape.0.iter().filter(|s| s.name == metric) {
        let Some(name) = s
            .labels
            .get("name")
            .filter(|n| *n == WEBHOOK || n.ends_with(&format!(".{WEBHOOK}")))
        else {
            continue;
        };
        *out.entry(name.clone()).or_default() += s.value as u64;
    }
    out
}

/// The API server's per-line counters at one moment.
#[derive(Debug, Clone, Default)]
pub struct Lines {
    pub fail_open: BTreeMap<String, u64>,
    pub calls: BTreeMap<String, u64>,
}

impl Lines {
    pub fn from_metrics(text: &str) -> Lines {
        let scrape = parse(text);
        Lines {
            fail_open: by_line(&scrape, "apiserver_admission_webhook_fail_open_count"),
            calls: by_line(&scrape, "apiserver_admission_webhook_request_total"),
        }
    }

    pub fn since(&self, before: &Lines) -> Lines {
        let diff = |now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>| {
            now.iter()
                .map(|(k, v)| (k.clone(), v - then.get(k).copied().unwrap_or(0)))
                .collect()
        };
        Lines {
            fail_open: diff(&self.fail_open, &before.fail_open),
            calls: diff(&self.calls, &before.calls),
        }
    }

    /// The first line's calls.
    pub fn first_line(m: &BTreeMap<String, u64>) -> u64 {
        m.get(WEBHOOK).copied().unwrap_or(0)
    }

    pub fn backups<'a>(m: &'a BTreeMap<String, u64>) -> impl Iterator<Item = u64> + 'a {
        m.iter()
            .filter(|(k, _)| k.as_str() != WEBHOOK)
            .map(|(_, v)| *v)
    }

    /// Node writes no line answered: the backups are called in order, each
    /// only while the Node still lacks the taint, so those are the calls
    /// entering the backups minus the backup calls that were answered.
    /// (Writes only the first line handles, status writes, are not in it.)
    pub fn failed_through_every_line(&self) -> u64 {
        let entering = self
            .calls
            .get(&format!("replica-0.{WEBHOOK}"))
            .copied()
            .unwrap_or(0);
        // Saturating: a configuration replaced mid-window (a key-profile
        // switch) restarts the API server's per-line counters' meaning.
        let answered = Self::backups(&self.calls)
            .sum::<u64>()
            .saturating_sub(Self::backups(&self.fail_open).sum::<u64>());
        entering.saturating_sub(answered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = r#"# HELP apiserver_admission_webhook_request_total x
apiserver_admission_webhook_request_total{code="200",name="nodes.nodegate.dev",operation="CREATE",rejected="false",type="admit"} 7
apiserver_admission_webhook_request_total{code="200",name="nodes.nodegate.dev",operation="UPDATE",rejected="false",type="admit"} 3
apiserver_admission_webhook_request_total{code="0",name="replica-0.nodes.nodegate.dev",operation="CREATE",rejected="false",type="admit"} 2
apiserver_admission_webhook_request_total{code="200",name="replica-1.nodes.nodegate.dev",operation="CREATE",rejected="false",type="admit"} 1
apiserver_admission_webhook_request_total{code="200",name="other.example.com",operation="CREATE",rejected="false",type="admit"} 9
apiserver_admission_webhook_fail_open_count{name="nodes.nodegate.dev",type="admit"} 2
apiserver_admission_webhook_fail_open_count{name="replica-0.nodes.nodegate.dev",type="admit"} 1
"#;

    #[test]
    fn counts_are_summed_per_line_of_nodegate_only() {
        let l = Lines::from_metrics(METRICS);
        assert_eq!(Lines::first_line(&l.calls), 10);
        assert_eq!(l.calls.len(), 3, "{:?}", l.calls);
        assert_eq!(Lines::backups(&l.calls).sum::<u64>(), 3);
        // Two entered the backups; one of the three backup calls failed open.
        assert_eq!(l.failed_through_every_line(), 0);
        let none = Lines::from_metrics("");
        assert_eq!(l.since(&none).fail_open, l.fail_open);
    }
}
