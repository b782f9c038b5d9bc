//! What the emulator's watches delivered, per resource type: the numbers
//! the fan-out benchmark reports as "sent to watchers" (what a real API
//! server's watch cache would send to the same watchers).
//!
//! No upstream counterpart: a counter for the benchmark.

use std::collections::HashMap;
use std::sync::Mutex;

/// Watch events (ADDED, MODIFIED, DELETED; bookmarks excluded) and bytes
/// (every line, bookmarks included) sent to all watchers of one type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delivered {
    pub events: u64,
    pub bytes: u64,
}

type Key = (&'static str, &'static str);

/// Counters by storage key `(group, plural)` and watching user.
#[derive(Debug, Default)]
pub struct Fanout(Mutex<HashMap<(Key, String), Delivered>>);

impl Fanout {
    pub fn add(&self, key: Key, user: &str, event: bool, bytes: usize) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let d = m.entry((key, user.to_string())).or_default();
        d.events += u64::from(event);
        d.bytes += bytes as u64;
    }

    /// The totals for one type so far, all users or one.
    pub fn get(&self, key: Key, user: Option<&str>) -> Delivered {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.iter()
            .filter(|((k, u), _)| *k == key && user.is_none_or(|w| w == u))
            .fold(Delivered::default(), |a, (_, d)| Delivered {
                events: a.events + d.events,
                bytes: a.bytes + d.bytes,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_events_and_bytes_per_type_and_user() {
        let f = Fanout::default();
        f.add(("", "nodes"), "a", true, 100);
        f.add(("", "nodes"), "a", false, 10);
        f.add(("", "nodes"), "b", true, 1);
        f.add(("", "configmaps"), "a", true, 5);
        let a = f.get(("", "nodes"), Some("a"));
        assert_eq!((a.events, a.bytes), (1, 110));
        let all = f.get(("", "nodes"), None);
        assert_eq!((all.events, all.bytes), (2, 111));
        assert_eq!(f.get(("", "configmaps"), None).events, 1);
        assert_eq!(f.get(("", "pods"), None), Delivered::default());
    }
}
