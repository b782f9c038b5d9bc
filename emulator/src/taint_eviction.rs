//! The taint-eviction controller's decisions (kube-controller-manager): which
//! pods bound to a node with `NoExecute` taints to delete, and when.
//!
//! Upstream (kubernetes v1.36) `pkg/controller/tainteviction/taint_eviction.go`:
//! `getNoExecuteTaints`, `getMinTolerationTime`, `Controller.processPodOnNode`,
//! `handleNodeUpdate` (a node without NoExecute taints cancels its pods'
//! evictions), `handlePodUpdate` (a deleted pod's eviction is cancelled; a
//! pod on a node not known as tainted is left alone — a deleted node does
//! not cancel what was scheduled); `timed_workers.go` `TimedWorkerQueue`
//! (`AddWork` keeps an existing item, a fired item is removed); tolerations
//! as `v1helper.GetMatchingTolerations` ([`crate::tolerations`]).
//!
//! Upstream is event driven (it re-runs `processPodOnNode` when a node's
//! NoExecute taints or a pod's tolerations/node change); [`plan`] re-runs it
//! for every bound pod at each call. That is the same, because
//! `processPodOnNode` with unchanged inputs changes nothing: an existing
//! eviction created earlier is kept as it is.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Taint, Toleration};

use crate::tolerations::{self, NO_EXECUTE};

/// `namespace/name`, the queue's key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A `TimedWorker`: created at, fires at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    pub created_at: Instant,
    pub fire_at: Instant,
}

/// The `TimedWorkerQueue`'s pending items.
pub type Queue = BTreeMap<PodKey, Scheduled>;

/// How long a pod may stay: `getMinTolerationTime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stay {
    Forever,
    For(Duration),
}

/// `getNoExecuteTaints`.
pub fn no_execute_taints(taints: &[Taint]) -> Vec<Taint> {
    taints
        .iter()
        .filter(|t| t.effect == NO_EXECUTE)
        .cloned()
        .collect()
}

/// `getMinTolerationTime` over the tolerations used: none at all is 0; any
/// `tolerationSeconds <= 0` is 0; otherwise the smallest positive one;
/// forever when none sets it.
pub fn min_toleration_time(used: &[&Toleration]) -> Stay {
    if used.is_empty() {
        return Stay::For(Duration::ZERO);
    }
    let mut min: Option<i64> = None;
    for s in used.iter().filter_map(|t| t.toleration_seconds) {
        if s <= 0 {
            return Stay::For(Duration::ZERO);
        }
        min = Some(min.map_or(s, |m| m.min(s)));
    }
    match min {
        None => Stay::Forever,
        Some(s) => Stay::For(Duration::from_secs(s.unsigned_abs())),
    }
}

/// `processPodOnNode`: the pod's queue item after it, given the node's
/// NoExecute `taints` (non-empty) and the item it had. `None` = no eviction
/// pending. An item firing at `now` is a deletion at once.
pub fn process_pod_on_node(
    taints: &[Taint],
    tolerations: &[Toleration],
    now: Instant,
    pending: Option<Scheduled>,
    comparison_operators: bool,
) -> Option<Scheduled> {
    if taints.is_empty() {
        return None;
    }
    let Some(used) = tolerations::matching_tolerations(taints, tolerations, comparison_operators)
    else {
        // Not all tolerated: cancel whatever was scheduled, delete now.
        return Some(Scheduled {
            created_at: now,
            fire_at: now,
        });
    };
    let Stay::For(min) = min_toleration_time(&used) else {
        return None;
    };
    // Beyond what an Instant can hold: never due, as forever.
    let due = now.checked_add(min)?;
    match pending {
        // `startTime.Add(min).Before(triggerTime)`, i.e. created before now:
        // the existing item stays as it was, fire time included.
        Some(p) if p.created_at < now => Some(p),
        Some(p) => Some(Scheduled {
            created_at: p.created_at,
            fire_at: due,
        }),
        None => Some(Scheduled {
            created_at: now,
            fire_at: due,
        }),
    }
}

/// A pod as the controller's informer holds it.
#[derive(Debug, Clone)]
pub struct BoundPod {
    pub key: PodKey,
    /// `spec.nodeName`; empty for a pending pod.
    pub node: String,
    pub tolerations: Vec<Toleration>,
}

/// What to do now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Pods whose item fired: delete them (their items are gone from `queue`).
    pub delete: Vec<PodKey>,
    /// The items still pending.
    pub queue: Queue,
    /// When the earliest pending item fires.
    pub next_due: Option<Instant>,
}

/// One pass over the informers' state: `nodes` maps every known node to its
/// taints (all of them; only NoExecute ones count).
pub fn plan(
    nodes: &BTreeMap<String, Vec<Taint>>,
    pods: &[BoundPod],
    queue: &Queue,
    now: Instant,
    comparison_operators: bool,
) -> Plan {
    let mut next = Queue::new();
    for pod in pods.iter().filter(|p| !p.node.is_empty()) {
        let pending = queue.get(&pod.key).copied();
        let item = match nodes.get(&pod.node) {
            // Deleted or unknown node: nothing scheduled is cancelled.
            None => pending,
            Some(taints) => process_pod_on_node(
                &no_execute_taints(taints),
                &pod.tolerations,
                now,
                pending,
                comparison_operators,
            ),
        };
        if let Some(item) = item {
            next.insert(pod.key.clone(), item);
        }
    }
    // Items of pods no longer listed were cancelled (`handlePodUpdate`, NotFound).
    let (due, pending): (Queue, Queue) = next.into_iter().partition(|(_, s)| s.fire_at <= now);
    Plan {
        delete: due.into_keys().collect(),
        next_due: pending.values().map(|s| s.fire_at).min(),
        queue: pending,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: Some("true".into()),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn tol(key: &str, seconds: Option<i64>) -> Toleration {
        serde_json::from_value(
            json!({"key": key, "operator": "Exists", "effect": "NoExecute",
                                      "tolerationSeconds": seconds}),
        )
        .unwrap()
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn min_toleration_time_follows_get_min_toleration_time() {
        let t = |s: Option<i64>| tol("k", s);
        // (tolerationSeconds of the used tolerations, stay)
        let table: Vec<(Vec<Option<i64>>, Stay)> = vec![
            (vec![], Stay::For(Duration::ZERO)),
            (vec![None], Stay::Forever),
            (vec![None, None], Stay::Forever),
            (vec![Some(300)], Stay::For(secs(300))),
            (vec![None, Some(300), Some(60)], Stay::For(secs(60))),
            (vec![Some(300), Some(0)], Stay::For(Duration::ZERO)),
            (vec![Some(-5), Some(300)], Stay::For(Duration::ZERO)),
        ];
        for (seconds, want) in table {
            let tols: Vec<Toleration> = seconds.iter().map(|s| t(*s)).collect();
            let used: Vec<&Toleration> = tols.iter().collect();
            assert_eq!(min_toleration_time(&used), want, "{seconds:?}");
        }
    }

    #[test]
    fn process_pod_on_node_deletes_schedules_or_keeps() {
        let now = Instant::now();
        let gate = [taint("gate", NO_EXECUTE)];
        let earlier = Scheduled {
            created_at: now - secs(10),
            fire_at: now + secs(290),
        };
        // (tolerations, pending item, item after)
        let at_once = Some(Scheduled {
            created_at: now,
            fire_at: now,
        });
        let table: Vec<(Vec<Toleration>, Option<Scheduled>, Option<Scheduled>)> = vec![
            (vec![], None, at_once),
            (vec![tol("other", None)], None, at_once),
            // Not tolerated any more: the pending item is replaced by a deletion now.
            (vec![], Some(earlier), at_once),
            (vec![tol("gate", None)], None, None),
            (vec![tol("gate", None)], Some(earlier), None),
            (vec![tol("gate", Some(0))], None, at_once),
            (vec![tol("gate", Some(-1))], None, at_once),
            (
                vec![tol("gate", Some(30))],
                None,
                Some(Scheduled {
                    created_at: now,
                    fire_at: now + secs(30),
                }),
            ),
            // Created earlier: kept as it is, even with a shorter toleration now.
            (vec![tol("gate", Some(5))], Some(earlier), Some(earlier)),
        ];
        for (tols, pending, want) in table {
            assert_eq!(
                process_pod_on_node(&gate, &tols, now, pending, false),
                want,
                "{tols:?} {pending:?}"
            );
        }
        assert_eq!(
            process_pod_on_node(&[], &[], now, Some(earlier), false),
            None
        );
    }

    fn bound(name: &str, node: &str, tolerations: Vec<Toleration>) -> BoundPod {
        BoundPod {
            key: PodKey {
                namespace: "default".into(),
                name: name.into(),
            },
            node: node.into(),
            tolerations,
        }
    }

    #[test]
    fn plan_deletes_untolerating_pods_at_once_and_times_the_rest() {
        let now = Instant::now();
        let nodes: BTreeMap<String, Vec<Taint>> = [
            (
                "gated".to_string(),
                vec![taint("nodegate", "NoSchedule"), taint("gate", NO_EXECUTE)],
            ),
            (
                "scheduling-only".to_string(),
                vec![taint("nodegate", "NoSchedule")],
            ),
        ]
        .into();
        let pods = vec![
            bound("plain", "gated", vec![]),
            bound("forever", "gated", vec![tol("gate", None)]),
            bound("for-60s", "gated", vec![tol("gate", Some(60))]),
            bound("for-5s", "gated", vec![tol("", Some(5))]),
            bound("elsewhere", "scheduling-only", vec![]),
            bound("pending", "", vec![]),
            bound("on-a-deleted-node", "gone", vec![]),
        ];
        let p = plan(&nodes, &pods, &Queue::new(), now, false);
        let names = |keys: &[PodKey]| keys.iter().map(|k| k.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&p.delete), ["plain"]);
        assert_eq!(
            names(&p.queue.keys().cloned().collect::<Vec<_>>()),
            ["for-5s", "for-60s"]
        );
        assert_eq!(p.next_due, Some(now + secs(5)));

        // 5 s later the 5 s one fires; nothing else changed.
        let later = now + secs(5);
        let pods: Vec<BoundPod> = pods.into_iter().filter(|p| p.key.name != "plain").collect();
        let p2 = plan(&nodes, &pods, &p.queue, later, false);
        assert_eq!(names(&p2.delete), ["for-5s"]);
        assert_eq!(p2.next_due, Some(now + secs(60)));

        // The gate goes: every pending eviction on the node is cancelled.
        let lifted: BTreeMap<String, Vec<Taint>> =
            [("gated".to_string(), vec![taint("nodegate", "NoSchedule")])].into();
        let p3 = plan(&lifted, &pods, &p2.queue, later, false);
        assert_eq!(p3, Plan::default());
    }

    #[test]
    fn a_deleted_node_keeps_and_a_deleted_pod_cancels_its_eviction() {
        let now = Instant::now();
        let item = Scheduled {
            created_at: now,
            fire_at: now + secs(60),
        };
        let key = |n: &str| PodKey {
            namespace: "default".into(),
            name: n.into(),
        };
        let queue: Queue = [(key("a"), item), (key("b"), item)].into();
        // Node "n" is gone; pod "b" is gone.
        let p = plan(
            &BTreeMap::new(),
            &[bound("a", "n", vec![])],
            &queue,
            now + secs(1),
            false,
        );
        assert_eq!(p.queue, Queue::from([(key("a"), item)]));
        assert!(p.delete.is_empty());
        // It still fires on time.
        let p = plan(
            &BTreeMap::new(),
            &[bound("a", "n", vec![])],
            &p.queue,
            now + secs(60),
            false,
        );
        assert_eq!(p.delete, [key("a")]);
    }
}
