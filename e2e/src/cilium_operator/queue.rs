//! A rate-limited work queue of node names with client-go's semantics
//! (`k8s.io/client-go/util/workqueue`, `Typed` queue + `RateLimitingQueue`):
//! a key is queued at most once; a key added while a worker holds it is
//! handed out again after `done`, never to two workers at once;
//! `add_rate_limited` re-adds after a per-key exponential delay
//! (`NewTypedItemExponentialFailureRateLimiter`) that `forget` resets.
//! cilium-operator's node queue uses 1 s to 120 s
//! (`operator/watchers/node_taint_cell.go`, `registerNodeTaintSync`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<String>,
    dirty: HashSet<String>,
    processing: HashSet<String>,
    failures: HashMap<String, u32>,
    shut_down: bool,
}

#[derive(Debug)]
pub struct WorkQueue {
    state: Mutex<State>,
    ready: Notify,
    base_delay: Duration,
    max_delay: Duration,
}

impl WorkQueue {
    pub fn new(base_delay: Duration, max_delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::default(),
            ready: Notify::new(),
            base_delay,
            max_delay,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `Add`.
    pub fn add(&self, key: &str) {
        let mut s = self.state();
        if s.shut_down || s.dirty.contains(key) {
            return;
        }
        s.dirty.insert(key.to_string());
        if s.processing.contains(key) {
            return;
        }
        s.queue.push_back(key.to_string());
        drop(s);
        self.ready.notify_one();
    }

    /// `Get`: waits for a key; `None` once shut down.
    pub async fn get(&self) -> Option<String> {
        loop {
            let notified = self.ready.notified();
            {
                let mut s = self.state();
                if s.shut_down {
                    return None;
                }
                if let Some(k) = s.queue.pop_front() {
                    s.dirty.remove(&k);
                    s.processing.insert(k.clone());
                    if !s.queue.is_empty() {
                        // Another waiting worker may take the next key.
                        self.ready.notify_one();
                    }
                    return Some(k);
                }
            }
            notified.await;
        }
    }

    /// `Done`: a key added meanwhile is queued again.
    pub fn done(&self, key: &str) {
        let mut s = self.state();
        s.processing.remove(key);
        if s.dirty.contains(key) && !s.shut_down {
            s.queue.push_back(key.to_string());
            drop(s);
            self.ready.notify_one();
        }
    }

    /// `Forget`: resets the key's failure count.
    pub fn forget(&self, key: &str) {
        self.state().failures.remove(key);
    }

    /// `NumRequeues`.
    pub fn num_requeues(&self, key: &str) -> u32 {
        self.state().failures.get(key).copied().unwrap_or(0)
    }

    /// The delay `AddRateLimited` waits for `key` now (`When`), counting the failure.
    fn when(&self, key: &str) -> Duration {
        let mut s = self.state();
        let n = s.failures.entry(key.to_string()).or_insert(0);
        let exp = (*n).min(30);
        *n += 1;
        self.base_delay
            .saturating_mul(1u32 << exp)
            .min(self.max_delay)
    }

    /// `AddRateLimited`.
    pub fn add_rate_limited(self: &Arc<Self>, key: &str) -> Duration {
        let delay = self.when(key);
        let q = self.clone();
        let key = key.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            q.add(&key);
        });
        delay
    }

    /// `ShutDown`: every `get` returns `None`.
    pub fn shut_down(&self) {
        self.state().shut_down = true;
        self.ready.notify_waiters();
    }

    /// Keys waiting (not those being processed).
    pub fn len(&self) -> usize {
        self.state().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dedups_and_requeues_dirty_keys_after_done() {
        let q = WorkQueue::new(Duration::from_millis(1), Duration::from_millis(4));
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.len(), 2);
        let a = q.get().await.unwrap();
        assert_eq!(a, "a");
        // Added while being processed: not handed out until done.
        q.add("a");
        assert_eq!(q.get().await.unwrap(), "b");
        assert!(q.is_empty());
        q.done("a");
        assert_eq!(q.get().await.unwrap(), "a");
        q.done("a");
        q.done("b");
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn rate_limited_delays_grow_and_forget_resets() {
        let q = WorkQueue::new(Duration::from_millis(1), Duration::from_millis(4));
        let d: Vec<_> = (0..4).map(|_| q.add_rate_limited("n")).collect();
        assert_eq!(
            d,
            [1, 2, 4, 4].map(Duration::from_millis).to_vec(),
            "exponential, capped"
        );
        assert_eq!(q.num_requeues("n"), 4);
        assert_eq!(q.get().await.unwrap(), "n");
        q.forget("n");
        assert_eq!(q.num_requeues("n"), 0);
        q.shut_down();
        assert!(q.get().await.is_none());
    }
}
