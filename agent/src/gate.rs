//! The readiness gate: probe rounds, the threshold verdict and the taint
//! writes it leads to on the agent's own Node.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::{WatchStreamExt, watcher};
use nodegate_shared::NodeView;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::metrics::{Metrics, OriginLabel, ProbeLabels, ProbeName};
use crate::probe::{Probe, Readiness, Thresholds, Transition};
use crate::taint::{
    AddReason, EventType, MarkReady, NodeTaints, Origin, needs_ready_patch, safety_net_applies,
};

/// Reason of the Warning Event the safety net leaves on the Node.
pub const WEBHOOK_MISSED_REASON: &str = "NodegateWebhookMissed";

#[derive(Debug, Clone)]
pub struct GateConfig {
    pub period: Duration,
    pub timeout: Duration,
    pub thresholds: Thresholds,
    pub continuous: bool,
}

pub struct Gate {
    pub taints: NodeTaints,
    pub probes: Vec<Probe>,
    /// Poked by file (inotify) and pod (watch) probes on changes.
    pub wake: Arc<Notify>,
    pub cfg: GateConfig,
    pub metrics: Metrics,
    /// Agent start, for the time-to-ready log line.
    pub started: Instant,
}

impl Gate {
    /// Runs until `shutdown` flips. The shutdown re-taint is the caller's.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let name = self.taints.name.clone();

        // Safety net for webhook outages, before the first probe round.
        let net = self.taints.add_missing(
            AddReason::SafetyNet,
            Instant::now() + Duration::from_secs(30),
            |v| safety_net_applies(v, &self.taints.specs),
        );
        let mut origin = Origin::Webhook;
        tokio::select! {
            r = net => match r {
                Ok(added) if !added.taints.is_empty() => {
                    origin = Origin::SafetyNet;
                    self.webhook_missed(&added.taints, &added.latest).await;
                }
                Ok(_) => {}
                Err(e) => tracing::error!(node = %name, error = %e, "safety-net taint check failed"),
            },
            _ = crate::stopped(&mut shutdown) => return,
        }

        // Own node only: its bootID tells a reboot, its taints what is left to do.
        let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let own = watcher(self.taints.api.clone(), cfg)
            .default_backoff()
            .applied_objects();
        let mut own = std::pin::pin!(own);

        let mut readiness = Readiness::new(self.cfg.thresholds);
        let mut view: Option<NodeView> = None;
        // The boot the current verdict belongs to; a new one resets it.
        let mut boot: Option<String> = None;
        let mut since = self.started;
        let mut announced_boot: Option<Option<String>> = None;
        let mut tick = tokio::time::interval(self.cfg.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

        loop {
            let mut round = false;
            tokio::select! {
                biased;
                _ = crate::stopped(&mut shutdown) => break,
                ev = own.next() => match ev {
                    Some(Ok(node)) => {
                        view = to_view(&node);
                        if self.rebooted(&mut boot, view.as_ref()) {
                            readiness.reset();
                            since = Instant::now();
                            origin = Origin::Webhook;
                            round = true;
                        }
                    }
                    Some(Err(e)) => tracing::warn!(node = %name, error = %e, "own node watch failed, retrying"),
                    None => {}
                },
                _ = tick.tick() => round = true,
                _ = self.wake.notified() => round = true,
            }

            let mut transition = None;
            if round {
                let ok = self.round().await;
                transition = readiness.observe(ok);
                match transition {
                    Some(Transition::Ready) => {
                        self.metrics.ready.set(1);
                        tracing::info!(node = %name, "all probes pass");
                    }
                    Some(Transition::NotReady) => {
                        self.metrics.ready.set(0);
                        tracing::warn!(node = %name, "probes failing past the failure threshold");
                    }
                    None => {}
                }
            }

            if readiness.is_ready() {
                // Without a watch view, read (the ready patch is a no-op when done).
                if view
                    .as_ref()
                    .is_none_or(|v| needs_ready_patch(v, &self.taints.specs))
                {
                    self.mark_ready(
                        &mut view,
                        boot.as_deref(),
                        since,
                        origin,
                        &mut announced_boot,
                    )
                    .await;
                    // The read may show a reboot the watch has not delivered yet.
                    if self.rebooted(&mut boot, view.as_ref()) {
                        readiness.reset();
                        since = Instant::now();
                        origin = Origin::Webhook;
                    }
                }
            } else if self.cfg.continuous && transition == Some(Transition::NotReady) {
                let deadline = Instant::now() + self.cfg.period.max(Duration::from_secs(10));
                if let Err(e) = self
                    .taints
                    .add_missing(AddReason::Continuous, deadline, |_| true)
                    .await
                {
                    tracing::error!(node = %name, error = %e, "cannot re-taint not-ready node");
                }
                origin = Origin::Continuous;
                // A later recovery must write again.
                announced_boot = None;
                view = None;
                since = Instant::now();
            }
        }
    }

    /// Tracks the node's bootID; true when it changed from a known one
    /// (the verdict then belongs to a previous boot).
    fn rebooted(&self, boot: &mut Option<String>, view: Option<&NodeView>) -> bool {
        let Some(now) = view.and_then(NodeView::boot_id) else {
            return false;
        };
        let changed = boot.as_deref().is_some_and(|b| b != now);
        if changed {
            tracing::info!(node = %self.taints.name, old_boot = boot.as_deref().unwrap_or(""), new_boot = now, "node rebooted; probes must pass again");
            self.metrics.ready.set(0);
        }
        *boot = Some(now.to_owned());
        changed
    }

    /// Runs every probe concurrently; true when all pass.
    async fn round(&self) -> bool {
        for p in &self.probes {
            p.rearm(&self.wake);
        }
        let results =
            futures::future::join_all(self.probes.iter().map(|p| p.check(self.cfg.timeout))).await;
        let mut all = true;
        for (p, r) in self.probes.iter().zip(results) {
            let ok = r.is_ok();
            if let Err(e) = &r {
                tracing::debug!(probe = %p.spec, error = %e, "probe failed");
            }
            all &= ok;
            let (kind, index) = (p.spec.kind(), p.index);
            self.metrics
                .probe_results
                .get_or_create(&ProbeLabels {
                    kind,
                    index,
                    result: if ok { "ok" } else { "fail" },
                })
                .inc();
            self.metrics
                .probe_up
                .get_or_create(&ProbeName { kind, index })
                .set(i64::from(ok));
        }
        all
    }

    /// The loud signal for a silent failure: the webhook (failurePolicy
    /// Ignore) let this node through untainted, so pods may have landed
    /// before the safety net closed the window.
    async fn webhook_missed(&self, taints: &[String], node: &NodeView) {
        let boot = node.boot_id().unwrap_or("unknown");
        tracing::warn!(node = %self.taints.name, boot_id = boot, ?taints, "the webhook did not taint this node; the safety net did");
        let msg = format!(
            "nodegate's webhook did not taint this node for boot {boot} (webhook down, skipped, or \
             misconfigured); the agent's safety net added {taints:?}. Pods may have been scheduled \
             before that. Run nodegate-check."
        );
        self.taints
            .event(
                node.metadata.uid.clone(),
                EventType::Warning,
                WEBHOOK_MISSED_REASON,
                msg,
            )
            .await;
    }

    async fn mark_ready(
        &self,
        view: &mut Option<NodeView>,
        boot: Option<&str>,
        since: Instant,
        origin: Origin,
        announced_boot: &mut Option<Option<String>>,
    ) {
        let name = &self.taints.name;
        let deadline = Instant::now() + self.cfg.period.max(Duration::from_secs(10));
        match self.taints.mark_ready(deadline, boot).await {
            Ok(MarkReady {
                outcome: Some(out),
                latest,
            }) => {
                // The watch event of this write will refresh it too.
                *view = Some(latest);
                if announced_boot.as_ref() == Some(&out.boot_id) && out.removed.is_empty() {
                    return;
                }
                *announced_boot = Some(out.boot_id.clone());
                let from_start = since.elapsed();
                let from_creation = out
                    .created
                    .as_ref()
                    .map(|t| Timestamp::now().as_millisecond() - t.0.as_millisecond());
                let origin = if out.removed.is_empty() {
                    Origin::None
                } else {
                    origin
                };
                self.metrics
                    .time_to_ready
                    .get_or_create(&OriginLabel {
                        origin: origin.as_str().into(),
                    })
                    .observe(from_start.as_secs_f64());
                let taints: Vec<String> = out
                    .removed
                    .iter()
                    .filter_map(|t| t.get("key").and_then(|k| k.as_str()).map(str::to_owned))
                    .collect();
                tracing::info!(
                    node = %name,
                    boot_id = out.boot_id.as_deref().unwrap_or(""),
                    removed = ?taints,
                    since_agent_start_ms = from_start.as_millis() as u64,
                    since_node_creation_ms = from_creation.unwrap_or(-1),
                    origin = origin.as_str(),
                    "node ready: taint removed"
                );
                let msg = format!(
                    "all {} probes pass; removed taints {:?}; ready {:.1}s after agent start",
                    self.probes.len(),
                    taints,
                    from_start.as_secs_f64()
                );
                self.taints
                    .event(out.uid, EventType::Normal, "NodegateReady", msg)
                    .await;
            }
            Ok(MarkReady {
                outcome: None,
                latest,
            }) => *view = Some(latest),
            Err(e) => tracing::error!(node = %name, error = %e, "cannot remove taint; will retry"),
        }
    }
}

fn to_view(node: &Node) -> Option<NodeView> {
    serde_json::to_value(node)
        .and_then(serde_json::from_value)
        .ok()
}
