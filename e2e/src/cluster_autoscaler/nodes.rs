//! Every Node as the admin watches it: what each went through (created,
//! Ready, gated, ungated, deleted), and the Nodes CA's KWOK provider
//! creates adopted into the simulated fleet. A real kubelet on a machine
//! the cloud provider started registers a Node the autoscaler already
//! created: its create gets AlreadyExists, then a GET and a status patch
//! (`kubelet::register` does exactly that), then Ready, heartbeats and
//! its Lease; the DaemonSets' Pods bound to it start its agent and the
//! stand-in network agent.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::autoscaler::GROUP_ANNOTATION;
use crate::scale::fleet::Fleet;
use crate::scale::pki::Pki;

/// One Node's life as watched.
#[derive(Debug, Clone)]
pub struct Life {
    /// Created by CA (its KWOK provider's group annotation).
    pub group: bool,
    pub first_seen: Instant,
    /// First version with `Ready=True` (after `gated`, for a reboot).
    pub ready: Option<Instant>,
    /// Latest version that carried the gate.
    pub gated: Option<Instant>,
    /// First version without the gate after `gated`.
    pub ungated: Option<Instant>,
    /// The gate is on in the latest version.
    pub gated_now: bool,
    /// `Ready=True` in the latest version.
    pub ready_now: bool,
    /// The latest Ready condition's `lastTransitionTime`.
    pub ready_transition: Option<String>,
    pub deleted: Option<Instant>,
}

/// Everything the harness knows of the cluster's Nodes.
#[derive(Debug)]
pub struct Nodes {
    lives: Mutex<HashMap<String, Life>>,
    /// Poked on every change.
    pub changed: Notify,
    gate_key: String,
}

impl Nodes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Life>> {
        self.lives.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of every Node's life.
    pub fn lives(&self) -> HashMap<String, Life> {
        self.lock().clone()
    }

    pub fn get(&self, name: &str) -> Option<Life> {
        self.lock().get(name).cloned()
    }

    /// CA's Nodes that exist now.
    pub fn group_alive(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, l)| l.group && l.deleted.is_none())
            .map(|(n, _)| n.clone())
            .collect();
        v.sort();
        v
    }

    /// CA's Nodes first seen at or after `t`.
    pub fn group_since(&self, t: Instant) -> Vec<(String, Life)> {
        let mut v: Vec<(String, Life)> = self
            .lock()
            .iter()
            .filter(|(_, l)| l.group && l.first_seen >= t)
            .map(|(n, l)| (n.clone(), l.clone()))
            .collect();
        v.sort_by_key(|(_, l)| l.first_seen);
        v
    }

    fn is_gated(&self, node: &Node) -> bool {
        node.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| {
                ts.iter()
                    .any(|t| t.key == self.gate_key && t.effect == "NoSchedule")
            })
    }

    /// Records one version; true when it is a Node of CA's seen first.
    fn apply(&self, node: &Node) -> bool {
        let now = Instant::now();
        let gated = self.is_gated(node);
        let ready_cond = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
        let ready = ready_cond.is_some_and(|c| c.status == "True");
        let group = node.annotations().contains_key(GROUP_ANNOTATION);
        let mut lives = self.lock();
        let fresh = !lives.contains_key(&node.name_any());
        let life = lives.entry(node.name_any()).or_insert_with(|| Life {
            group,
            first_seen: now,
            ready: None,
            gated: None,
            ungated: None,
            gated_now: false,
            ready_now: false,
            ready_transition: None,
            deleted: None,
        });
        if gated {
            if !life.gated_now {
                // A new gate (a new node, or a reboot): its own ready and
                // ungated moments follow.
                life.ungated = None;
                life.ready = None;
            }
            life.gated = Some(now);
        } else if life.gated_now && life.ungated.is_none() {
            life.ungated = Some(now);
        }
        if ready && life.ready.is_none() {
            life.ready = Some(now);
        }
        life.gated_now = gated;
        life.ready_now = ready;
        life.ready_transition = ready_cond
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0.to_string());
        fresh && group
    }

    fn delete(&self, node: &Node) {
        if let Some(l) = self.lock().get_mut(&node.name_any()) {
            l.deleted.get_or_insert_with(Instant::now);
        }
    }
}

/// Watches every Node; adopts CA's new Nodes into `fleet` (a kubelet and
/// agents of their own) and powers off the ones deleted.
pub fn watch(
    admin: Client,
    fleet: Arc<Fleet>,
    pki: Arc<Pki>,
    gate_key: &str,
) -> (Arc<Nodes>, JoinHandle<()>) {
    let nodes = Arc::new(Nodes {
        lives: Mutex::default(),
        changed: Notify::new(),
        gate_key: gate_key.to_string(),
    });
    let rec = nodes.clone();
    // Addresses apart from the fleet's own first nodes.
    let next = Arc::new(AtomicUsize::new(1000));
    let task = tokio::spawn(async move {
        let api: Api<Node> = Api::all(admin.clone());
        let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Event::Apply(n) | Event::InitApply(n)) => {
                    if rec.apply(&n) {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        adopt(&admin, &fleet, &pki, &n.name_any(), i).await;
                    }
                }
                Ok(Event::Delete(n)) => {
                    rec.delete(&n);
                    if n.annotations().contains_key(GROUP_ANNOTATION)
                        && let Err(e) = fleet.power_off(&n.name_any())
                    {
                        tracing::debug!(error = %e, "power off");
                    }
                }
                Ok(Event::Init | Event::InitDone) => {}
                Err(e) => tracing::warn!(error = %e, "node watch"),
            }
            rec.changed.notify_waiters();
        }
    });
    (nodes, task)
}

/// The machine behind a Node CA created boots: its kubelet registers
/// (AlreadyExists), and the DaemonSets' Pods already bound to it start.
async fn adopt(admin: &Client, fleet: &Arc<Fleet>, pki: &Pki, name: &str, i: usize) {
    if let Err(e) = fleet.add_named(pki, name, i).and_then(|_| fleet.boot(name)) {
        tracing::warn!(node = name, error = %e, "adopting a Node of CA's");
        return;
    }
    // The fleet's Pod watch drops Pods bound before the node joined it.
    let pods: Api<Pod> = Api::all(admin.clone());
    match pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={name}")))
        .await
    {
        Ok(list) => {
            for p in list.items {
                fleet.on_pod(p);
            }
        }
        Err(e) => tracing::warn!(node = name, error = %e, "pods of an adopted node"),
    }
}
