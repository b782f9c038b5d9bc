//! The readiness gate as a state machine: probe rounds, the agent's own
//! Node as the watch shows it, write results and shutdown in; the taint
//! writes, probe rounds, Events and metrics they lead to out. No I/O: the
//! caller passes the time and runs the actions (`gate_loop`).
//!
//! The gate removes the taint once the probes pass on the node's current
//! boot, and only once per boot; a reboot (new bootID) sends it back to
//! "not ready" until the probes pass again. With `continuous`, probes
//! failing past the failure threshold put the taint back.

use std::sync::Arc;
use std::time::Duration;

use nodegate_shared::node::older_version;
use nodegate_shared::{NodeView, TaintSpec};
use tokio::time::Instant;

use crate::autoscaler::{Autoscaler, findings};
use crate::node_patch::{
    AddReason, Added, EventType, MarkReady, Origin, ReadyOutcome, needs_ready_patch,
};
use crate::readiness::{Readiness, Thresholds, Transition};
use crate::removal::Decision;
use crate::taint_set::TaintSet;

/// Reason of the Warning Event the safety net leaves on the Node.
pub const WEBHOOK_MISSED_REASON: &str = "NodegateWebhookMissed";
/// Reason of the Normal Event the ready patch leaves on the Node.
pub const READY_REASON: &str = "NodegateReady";
/// How long the start-up safety net may retry its write: the webhook's
/// window is open until it lands, but a stuck API server must not keep the
/// probes from starting.
pub const SAFETY_NET_WITHIN: Duration = Duration::from_secs(30);
/// The shortest time a ready patch or continuous re-taint may retry.
const MIN_WRITE_WITHIN: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct GateConfig {
    /// Time between probe rounds once ready.
    pub period: Duration,
    /// Time between probe rounds while not ready: the node is gated.
    pub pending_period: Duration,
    pub timeout: Duration,
    pub thresholds: Thresholds,
    pub continuous: bool,
    /// Re-taint on shutdown (the node may be going down, and must come
    /// back tainted), unless nodegate is being removed.
    pub taint_on_shutdown: bool,
    /// Everything done on shutdown (the removal check, then the re-taint or
    /// the opening of the node) within this long.
    pub shutdown_deadline: Duration,
    /// Cluster Autoscaler's `MaxNodeStartupTime` as the agent assumes it
    /// (`--ca-max-node-startup-time`): CA's taints on a younger gated node
    /// mean the gate is not a startup taint ([`crate::autoscaler`]).
    pub ca_max_node_startup: Duration,
}

/// When the next probe round is due, after an event handled at `now`: one
/// `period` after a round (a probe's wake-up counts), and any other event
/// may only bring it closer, as when a node turns gated and `period`
/// becomes the short one ([`State::period`]).
pub fn next_round(next: Instant, now: Instant, period: Duration, round: bool) -> Instant {
    let after = now + period;
    if round || after < next { after } else { next }
}

/// What happened.
#[derive(Debug, Clone)]
pub enum Event {
    /// The agent starts: before any probe, the safety net.
    Started,
    /// The own Node as the watch delivers it.
    NodeChanged(NodeView),
    /// The own Node's watch failed (it retries by itself).
    WatchFailed(String),
    /// The period elapsed, or a probe's watch saw a change.
    Tick,
    /// One probe round: true when every probe passed.
    Probed(bool),
    /// What [`Action::RemoveTaints`] did.
    ReadyPatched(Result<MarkReady, String>),
    /// What [`Action::AddTaints`] did.
    TaintsAdded {
        reason: AddReason,
        result: Result<Added, String>,
    },
    /// SIGTERM: stop after the returned actions; `decision` says whether
    /// nodegate is being removed ([`crate::removal`]), `within` how long
    /// the write may take.
    Shutdown {
        decision: Decision,
        within: Duration,
    },
    /// What [`Action::OpenNode`] did: the taints removed.
    Opened(Result<Vec<String>, String>),
}

/// What to do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Run every probe once; answer with [`Event::Probed`].
    RunProbes,
    /// The ready patch, unless the node now reports another boot than
    /// `boot`; retried for up to `within`; answer with [`Event::ReadyPatched`].
    RemoveTaints {
        boot: Option<String>,
        within: Duration,
    },
    /// Add the missing taints when `reason` applies to a fresh read;
    /// retried for up to `within`; answer with [`Event::TaintsAdded`].
    AddTaints { reason: AddReason, within: Duration },
    /// Record a core/v1 Event on the Node.
    Emit {
        uid: Option<String>,
        kind: EventType,
        reason: &'static str,
        message: String,
    },
    /// The `ready` gauge.
    SetReady(bool),
    /// One observation of the time to ready, by who put the taint on.
    ObserveTimeToReady { origin: Origin, seconds: f64 },
    /// An autoscaler did not wait for the gate (`gate_undeclared_total`).
    CountGateUndeclared(Autoscaler),
    /// nodegate is being removed: remove every gate the ready patch
    /// removes, add none; retried for up to `within`; answer with
    /// [`Event::Opened`].
    OpenNode { within: Duration },
    /// The shutdown's decision (`shutdown_decisions_total`).
    CountShutdown(Decision),
}

/// The gate's memory between events.
#[derive(Debug)]
pub struct State {
    name: String,
    /// The writer's set: what the ready patch removes, what counts as ours.
    taints: Arc<TaintSet>,
    cfg: GateConfig,
    /// How many probes a round runs (for the ready Event's text).
    probes: usize,
    readiness: Readiness,
    /// The node as last seen; `None` until then, or when a write of ours
    /// made it stale.
    view: Option<NodeView>,
    /// The boot the current verdict belongs to; a new one resets it.
    boot: Option<String>,
    /// Since when the current boot (or re-taint) has been waiting.
    since: Instant,
    /// The boot the last ready Event was sent for, so a repeated patch
    /// that removed nothing stays quiet.
    announced_boot: Option<Option<String>>,
    /// The boot an autoscaler's mark was reported for: once per boot.
    flagged_boot: Option<Option<String>>,
    /// Who put on the taint the next ready patch removes.
    origin: Origin,
    /// The version the last ready patch answered with, and when.
    patched: Option<(String, Instant)>,
}

/// How long after a ready patch the watch's older versions are skipped:
/// past it (a watch that far behind, or versions that went back as after
/// an etcd restore) every version counts again, and a stale one costs a
/// failed `test` and a read, as before.
const STALE_WINDOW: Duration = Duration::from_secs(30);

impl State {
    pub fn new(
        name: impl Into<String>,
        taints: Arc<TaintSet>,
        cfg: GateConfig,
        probes: usize,
        started: Instant,
    ) -> Self {
        Self {
            name: name.into(),
            taints,
            readiness: Readiness::new(cfg.thresholds),
            cfg,
            probes,
            view: None,
            boot: None,
            since: started,
            announced_boot: None,
            flagged_boot: None,
            origin: Origin::Webhook,
            patched: None,
        }
    }

    pub fn is_ready(&self) -> bool {
        self.readiness.is_ready()
    }

    /// The node as the watch last delivered it, if no write of ours made
    /// it stale since.
    pub fn seen(&self) -> Option<NodeView> {
        self.view.clone()
    }

    /// Time until the next probe round: short while the node waits on its
    /// agent, the configured period once ready.
    pub fn period(&self) -> Duration {
        if self.is_ready() {
            self.cfg.period
        } else {
            self.cfg.pending_period.min(self.cfg.period)
        }
    }

    /// How long a ready patch or continuous re-taint may retry.
    fn write_within(&self) -> Duration {
        self.cfg.period.max(MIN_WRITE_WITHIN)
    }

    /// Feeds one event at `now`; returns what to do.
    pub fn on(&mut self, event: Event, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        match event {
            Event::Started => out.push(Action::AddTaints {
                reason: AddReason::SafetyNet,
                within: SAFETY_NET_WITHIN,
            }),
            Event::NodeChanged(view) => {
                if self.stale(&view, now) {
                    return out;
                }
                self.view = Some(view);
                if self.rebooted(now, &mut out) || self.retainted(now, &mut out) {
                    out.push(Action::RunProbes);
                } else {
                    self.settle(None, &mut out);
                }
            }
            Event::WatchFailed(e) => {
                tracing::warn!(node = %self.name, error = %e, "own node watch failed, retrying");
                self.settle(None, &mut out);
            }
            Event::Tick => out.push(Action::RunProbes),
            Event::Probed(ok) => {
                let transition = self.readiness.observe(ok);
                match transition {
                    Some(Transition::Ready) => {
                        out.push(Action::SetReady(true));
                        tracing::info!(node = %self.name, "all probes pass");
                    }
                    Some(Transition::NotReady) => {
                        out.push(Action::SetReady(false));
                        tracing::warn!(node = %self.name, "probes failing past the failure threshold");
                    }
                    None => {}
                }
                self.settle(transition, &mut out);
            }
            Event::ReadyPatched(result) => {
                match result {
                    Ok(MarkReady {
                        outcome: Some(out_),
                        latest,
                    }) => {
                        // The watch event of this write will refresh it too.
                        self.patched = latest.metadata.resource_version.clone().map(|rv| (rv, now));
                        let undeclared = self.undeclared(&out_, &latest);
                        self.view = Some(latest);
                        self.announce(out_, now, &mut out);
                        out.extend(undeclared);
                    }
                    Ok(MarkReady {
                        outcome: None,
                        latest,
                    }) => self.view = Some(latest),
                    Err(e) => {
                        tracing::error!(node = %self.name, error = %e, "cannot remove taint; will retry")
                    }
                }
                // The read may show a reboot the watch has not delivered yet.
                self.rebooted(now, &mut out);
            }
            Event::TaintsAdded { reason, result } => self.added(reason, result, now, &mut out),
            Event::Shutdown { decision, within } => self.shutdown(decision, within, &mut out),
            Event::Opened(Ok(removed)) => {
                tracing::info!(node = %self.name, ?removed, "node opened on removal");
            }
            Event::Opened(Err(e)) => {
                tracing::warn!(node = %self.name, error = %e, "cannot open the node on removal: its gate stays until an admin removes it");
            }
        }
        out
    }

    /// The re-taint, or on removal the opening of the node; one line says
    /// which and why.
    fn shutdown(&self, decision: Decision, within: Duration, out: &mut Vec<Action>) {
        let (name, why) = (&self.name, decision.why().as_str());
        out.push(Action::CountShutdown(decision));
        match decision {
            Decision::OpenNode(_) => {
                tracing::info!(node = %name, decision = decision.as_str(), reason = why, "shutdown: nodegate is being removed; opening the node instead of re-tainting it");
                out.push(Action::OpenNode { within });
            }
            Decision::ReTaint(_) if self.cfg.taint_on_shutdown => {
                tracing::info!(node = %name, decision = decision.as_str(), reason = why, "shutdown: not a removal; re-tainting the node");
                out.push(Action::AddTaints {
                    reason: AddReason::Shutdown,
                    within,
                });
            }
            Decision::ReTaint(_) => {
                tracing::info!(node = %name, decision = decision.as_str(), reason = why, "shutdown: not a removal; --taint-on-shutdown=false leaves the node as it is");
            }
        }
    }

    /// A watched version older than the one the ready patch answered with,
    /// shortly after it: the watch catching up on the writes before ours.
    /// Acting on it would patch a taint list that is gone, fail the `test`
    /// and re-read: a wasted write and read per node at every ready.
    fn stale(&mut self, view: &NodeView, now: Instant) -> bool {
        let Some((rv, at)) = &self.patched else {
            return false;
        };
        let old = older_version(view.metadata.resource_version.as_deref(), Some(rv));
        if !old || now.duration_since(*at) > STALE_WINDOW {
            self.patched = None;
            return false;
        }
        true
    }

    /// After a round or a new view: patch when ready and the node still
    /// needs it (without a view, try: the patch is a no-op when done); on a
    /// fall below the failure threshold in continuous mode, re-taint.
    fn settle(&mut self, transition: Option<Transition>, out: &mut Vec<Action>) {
        if self.readiness.is_ready() {
            if self
                .view
                .as_ref()
                .is_none_or(|v| needs_ready_patch(v, &self.taints))
            {
                out.push(Action::RemoveTaints {
                    boot: self.boot.clone(),
                    within: self.write_within(),
                });
            }
        } else if self.cfg.continuous && transition == Some(Transition::NotReady) {
            out.push(Action::AddTaints {
                reason: AddReason::Continuous,
                within: self.write_within(),
            });
        }
    }

    /// Tracks the node's bootID; on a change from a known one the verdict
    /// belonged to the previous boot: back to not ready, waiting anew.
    fn rebooted(&mut self, now: Instant, out: &mut Vec<Action>) -> bool {
        let Some(current) = self.view.as_ref().and_then(NodeView::boot_id) else {
            return false;
        };
        let changed = self.boot.as_deref().is_some_and(|b| b != current);
        if changed {
            tracing::info!(node = %self.name, old_boot = self.boot.as_deref().unwrap_or(""), new_boot = current, "node rebooted; probes must pass again");
            out.push(Action::SetReady(false));
            self.readiness.reset();
            self.since = now;
            self.origin = Origin::Webhook;
        }
        self.boot = Some(current.to_owned());
        changed
    }

    /// Someone put the taint back on a node this gate made ready on its
    /// current boot: the webhook, when a kubelet re-registers after a reboot
    /// it has not reported yet, or an admin. Removing it at once would undo
    /// the webhook's gate for the coming boot, so the probes must pass
    /// again first. (The gate's own continuous re-taint forgets the
    /// announcement, and a version older than the ready patch lacks the
    /// recorded bootID, so neither counts.)
    fn retainted(&mut self, now: Instant, out: &mut Vec<Action>) -> bool {
        let Some(view) = self.view.as_ref() else {
            return false;
        };
        let boot = view.boot_id();
        let managed = self.taints.managed();
        let ours = view.missing(managed).len() < managed.len();
        let recorded = boot.is_some() && view.ready_boot_id() == boot;
        let announced = self.announced_boot.as_ref().map(Option::as_deref) == Some(boot);
        if !(self.readiness.is_ready() && ours && recorded && announced) {
            return false;
        }
        tracing::info!(node = %self.name, boot_id = boot.unwrap_or(""), "taint put back on a ready node; probes must pass again");
        out.push(Action::SetReady(false));
        self.readiness.reset();
        self.since = now;
        self.origin = Origin::Webhook;
        true
    }

    /// The ready patch went through: tell humans and the metric, once per
    /// boot unless a later patch removed taints again.
    fn announce(&mut self, out_: ReadyOutcome, now: Instant, out: &mut Vec<Action>) {
        if self.announced_boot.as_ref() == Some(&out_.boot_id) && out_.removed.is_empty() {
            return;
        }
        self.announced_boot = Some(out_.boot_id.clone());
        let from_start = now.saturating_duration_since(self.since);
        let origin = if out_.removed.is_empty() {
            Origin::None
        } else {
            self.origin
        };
        out.push(Action::ObserveTimeToReady {
            origin,
            seconds: from_start.as_secs_f64(),
        });
        let taints: Vec<String> = out_
            .removed
            .iter()
            .filter_map(|t| t.get("key").and_then(|k| k.as_str()).map(str::to_owned))
            .collect();
        tracing::info!(
            node = %self.name,
            boot_id = out_.boot_id.as_deref().unwrap_or(""),
            removed = ?taints,
            since_agent_start_ms = from_start.as_millis() as u64,
            since_node_creation_ms = out_.since_creation_ms.unwrap_or(-1),
            origin = origin.as_str(),
            "node ready: taint removed"
        );
        out.push(Action::Emit {
            uid: out_.uid,
            kind: EventType::Normal,
            reason: READY_REASON,
            message: format!(
                "all {} probes pass; removed taints {:?}; ready {:.1}s after agent start",
                self.probes,
                taints,
                from_start.as_secs_f64()
            ),
        });
    }

    /// An autoscaler's mark on the version the ready patch removed the gate
    /// from: it did not wait for the gate (see [`crate::autoscaler`]). Only
    /// on the node's first ready with a gate the webhook put on at
    /// registration: after a reboot Karpenter's label is left from the first
    /// boot (and Karpenter counts every taint on an initialized node, declared
    /// or not), and a taint the safety net added to a node nodegate found
    /// running (an install) may postdate the mark. A mark added after the
    /// untaint is the normal path and is not on that version.
    fn undeclared(&mut self, out_: &ReadyOutcome, latest: &NodeView) -> Vec<Action> {
        let gates: Vec<&TaintSpec> = self
            .taints
            .managed()
            .iter()
            .filter(|s| s.is_in(&out_.removed))
            .collect();
        let first = out_.ready_boot_before.is_none() && self.origin == Origin::Webhook;
        if gates.is_empty() || !first || self.flagged_boot.as_ref() == Some(&out_.boot_id) {
            return Vec::new();
        }
        let age = out_
            .since_creation_ms
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Duration::from_millis);
        let found = findings(latest, age, self.cfg.ca_max_node_startup);
        if found.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for f in found {
            tracing::warn!(node = %self.name, autoscaler = f.autoscaler.as_str(), mark = f.mark, "an autoscaler did not wait for the gate");
            out.push(Action::Emit {
                uid: out_.uid.clone(),
                kind: EventType::Warning,
                reason: f.autoscaler.reason(),
                message: f.message(&gates),
            });
            out.push(Action::CountGateUndeclared(f.autoscaler));
        }
        self.flagged_boot = Some(out_.boot_id.clone());
        out
    }

    fn added(
        &mut self,
        reason: AddReason,
        result: Result<Added, String>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        match reason {
            AddReason::SafetyNet => match result {
                Ok(added) if !added.taints.is_empty() => {
                    self.origin = Origin::SafetyNet;
                    self.webhook_missed(&added.taints, &added.latest, out);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(node = %self.name, error = %e, "safety-net taint check failed")
                }
            },
            AddReason::Continuous => {
                if let Err(e) = result {
                    tracing::error!(node = %self.name, error = %e, "cannot re-taint not-ready node");
                }
                self.origin = Origin::Continuous;
                // A later recovery must write again.
                self.announced_boot = None;
                self.view = None;
                self.since = now;
            }
            AddReason::Shutdown => match result {
                Ok(a) => tracing::info!(added = a.taints.len(), "shutdown re-taint done"),
                Err(e) => tracing::error!(error = %e, "shutdown re-taint failed"),
            },
        }
    }

    /// The loud signal for a silent failure: the webhook (failurePolicy
    /// Ignore) let this node through untainted, so pods may have landed
    /// before the safety net closed the window.
    fn webhook_missed(&self, taints: &[String], node: &NodeView, out: &mut Vec<Action>) {
        let boot = node.boot_id().unwrap_or("unknown");
        tracing::warn!(node = %self.name, boot_id = boot, ?taints, "the webhook did not taint this node; the safety net did");
        out.push(Action::Emit {
            uid: node.metadata.uid.clone(),
            kind: EventType::Warning,
            reason: WEBHOOK_MISSED_REASON,
            message: format!(
                "nodegate's webhook did not taint this node for boot {boot} (webhook down, skipped, or \
                 misconfigured); the agent's safety net added {taints:?}. Pods may have been scheduled \
                 before that. Run nodegate-check."
            ),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const TAINT: &str = "nodegate.dev/agent-not-ready=true:NoSchedule";

    fn ours() -> Value {
        json!({"key": "nodegate.dev/agent-not-ready", "value": "true", "effect": "NoSchedule"})
    }

    /// The node on `boot`, tainted or ready on that boot.
    fn node(boot: &str, tainted: bool) -> NodeView {
        let taints = if tainted { json!([ours()]) } else { json!([]) };
        let annotations = if tainted {
            json!({})
        } else {
            json!({"nodegate.dev/ready-boot-id": boot})
        };
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "uid": "u1", "annotations": annotations},
            "spec": {"taints": taints},
            "status": {"nodeInfo": {"bootID": boot}}
        }))
        .unwrap()
    }

    fn patched(boot: &str, removed: bool) -> Event {
        Event::ReadyPatched(Ok(MarkReady {
            outcome: Some(ReadyOutcome {
                removed: if removed { vec![ours()] } else { vec![] },
                boot_id: Some(boot.into()),
                ready_boot_before: None,
                since_creation_ms: Some(5),
                uid: Some("u1".into()),
            }),
            latest: node(boot, false),
        }))
    }

    fn unchanged(boot: &str) -> Event {
        Event::ReadyPatched(Ok(MarkReady {
            outcome: None,
            latest: node(boot, false),
        }))
    }

    fn added(reason: AddReason, taints: usize) -> Event {
        Event::TaintsAdded {
            reason,
            result: Ok(Added {
                taints: vec![TAINT.to_string(); taints],
                latest: node("b1", taints > 0),
            }),
        }
    }

    /// The default gate alone.
    fn default_gate() -> Arc<TaintSet> {
        Arc::new(TaintSet::new(
            vec![TAINT.parse().unwrap()],
            Vec::new(),
            Vec::new(),
        ))
    }

    fn cfg(success: u32, failure: u32, continuous: bool) -> GateConfig {
        GateConfig {
            period: Duration::from_secs(1),
            pending_period: Duration::from_millis(50),
            timeout: Duration::from_secs(1),
            thresholds: Thresholds { success, failure },
            continuous,
            taint_on_shutdown: true,
            shutdown_deadline: Duration::from_secs(5),
            ca_max_node_startup: crate::autoscaler::CA_MAX_NODE_STARTUP,
        }
    }

    /// An action as a short word, so a table reads like the story it tells.
    fn brief(a: &Action) -> String {
        match a {
            Action::RunProbes => "probe".into(),
            Action::RemoveTaints { boot, within } => {
                format!(
                    "remove@{}/{}s",
                    boot.as_deref().unwrap_or("?"),
                    within.as_secs()
                )
            }
            Action::AddTaints { reason, within } => {
                format!("add:{}/{}s", reason.as_str(), within.as_secs())
            }
            Action::Emit { kind, reason, .. } => format!("event:{kind:?}:{reason}"),
            Action::SetReady(r) => format!("ready={}", u8::from(*r)),
            Action::ObserveTimeToReady { origin, seconds } => {
                format!("ttr:{}:{seconds}", origin.as_str())
            }
            Action::CountGateUndeclared(a) => format!("undeclared:{}", a.as_str()),
            Action::OpenNode { within } => format!("open/{}s", within.as_secs()),
            Action::CountShutdown(d) => format!("shutdown:{}:{}", d.as_str(), d.why().as_str()),
        }
    }

    /// Runs `steps` (event, the actions it must give) through a fresh gate;
    /// each step happens one second after the previous one.
    fn run(name: &str, cfg: GateConfig, steps: Vec<(Event, &[&str])>) {
        let t0 = Instant::now();
        let mut g = State::new("n1", default_gate(), cfg, 2, t0);
        for (i, (event, want)) in steps.into_iter().enumerate() {
            let shown = format!("{event:?}");
            let got: Vec<String> = g
                .on(event, t0 + Duration::from_secs(i as u64 + 1))
                .iter()
                .map(brief)
                .collect();
            assert_eq!(got, *want, "{name}, step {i}: {shown}");
        }
    }

    /// While the node is gated every probe round counts; once ready the
    /// configured period applies, and a reboot makes rounds short again.
    #[test]
    fn rounds_are_short_only_while_the_node_waits() {
        let t0 = Instant::now();
        let mut g = State::new("n1", default_gate(), cfg(1, 1, false), 1, t0);
        assert_eq!(g.period(), Duration::from_millis(50));
        g.on(Event::NodeChanged(node("b1", true)), t0);
        g.on(Event::Probed(true), t0);
        assert_eq!(g.period(), Duration::from_secs(1));
        g.on(Event::NodeChanged(node("b2", true)), t0);
        assert_eq!(g.period(), Duration::from_millis(50));
    }

    #[test]
    fn a_node_event_never_postpones_a_round_and_a_gate_brings_it_closer() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let secs = Duration::from_secs;
        // After a round: one period later.
        assert_eq!(next_round(t0, t0, secs(2), true), t0 + secs(2));
        // A watch event 1 s later leaves the due round where it was.
        assert_eq!(
            next_round(t0 + secs(2), t0 + secs(1), secs(2), false),
            t0 + secs(2)
        );
        // The node turned gated: the short period brings the round closer.
        assert_eq!(
            next_round(t0 + secs(2), t0 + secs(1), ms(20), false),
            t0 + secs(1) + ms(20)
        );
    }

    fn at(mut view: NodeView, rv: &str) -> NodeView {
        view.metadata.resource_version = Some(rv.into());
        view
    }

    /// The ready patch on boot b1 answered with version `rv`.
    fn patched_at(rv: &str) -> Event {
        match patched("b1", true) {
            Event::ReadyPatched(Ok(mut m)) => {
                m.latest = at(m.latest, rv);
                Event::ReadyPatched(Ok(m))
            }
            other => other,
        }
    }

    /// The watch delivers the versions before the ready patch after its
    /// answer: they show the taint the patch removed. Acting on them would
    /// send a patch bound to fail its `test` and a read, per node, at every
    /// ready; a newer version with the taint (an admin's) still counts, and
    /// so does an old one once the window is over.
    #[test]
    fn versions_older_than_the_ready_patch_are_not_acted_on() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut g = State::new("n1", default_gate(), cfg(1, 1, false), 1, t0);
        g.on(Event::NodeChanged(at(node("b1", true), "7")), t0);
        let acts = |a: Vec<Action>| a.iter().map(brief).collect::<Vec<_>>();
        assert_eq!(
            acts(g.on(Event::Probed(true), t0)),
            ["ready=1", "remove@b1/10s"]
        );
        g.on(patched_at("10"), t0 + s(1));
        for rv in ["8", "9"] {
            let got = acts(g.on(Event::NodeChanged(at(node("b1", true), rv)), t0 + s(2)));
            assert!(
                got.is_empty(),
                "version {rv} is older than the patch: {got:?}"
            );
        }
        assert!(
            g.seen()
                .is_some_and(|v| v.metadata.resource_version.as_deref() == Some("10"))
        );
        // The patch's own version, then someone else's newer write.
        assert!(acts(g.on(Event::NodeChanged(at(node("b1", false), "10")), t0 + s(2))).is_empty());
        let retaint = acts(g.on(Event::NodeChanged(at(node("b1", true), "12")), t0 + s(3)));
        assert!(!retaint.is_empty(), "a newer taint is acted on");

        // Past the window an older version counts again (after an etcd
        // restore versions go back): at worst one failed `test` and a read.
        let mut g = State::new("n1", default_gate(), cfg(1, 1, false), 1, t0);
        g.on(Event::NodeChanged(at(node("b1", true), "7")), t0);
        g.on(Event::Probed(true), t0);
        g.on(patched_at("10"), t0);
        let late = acts(g.on(
            Event::NodeChanged(at(node("b1", true), "9")),
            t0 + STALE_WINDOW + s(1),
        ));
        assert!(!late.is_empty(), "past the window the version counts");
    }

    #[test]
    fn webhook_tainted_node_becomes_ready_once() {
        run(
            "ready patch",
            cfg(1, 1, false),
            vec![
                (Event::Started, &["add:safety_net/30s"]),
                (added(AddReason::SafetyNet, 0), &[]),
                (Event::NodeChanged(node("b1", true)), &[]),
                (Event::Tick, &["probe"]),
                (Event::Probed(true), &["ready=1", "remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:6", "event:Normal:NodegateReady"],
                ),
                (Event::NodeChanged(node("b1", false)), &[]),
                (Event::Tick, &["probe"]),
                (Event::Probed(true), &[]),
                (Event::WatchFailed("gone".into()), &[]),
            ],
        );
    }

    #[test]
    fn without_a_view_the_gate_patches_and_a_second_no_op_is_quiet() {
        run(
            "no view yet",
            cfg(1, 1, false),
            vec![
                (Event::Tick, &["probe"]),
                (Event::Probed(true), &["ready=1", "remove@?/10s"]),
                // Someone else removed the taint: only the bootID recorded.
                (
                    patched("b1", false),
                    &["ttr:none:3", "event:Normal:NodegateReady"],
                ),
                (Event::NodeChanged(node("b1", true)), &["remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:5", "event:Normal:NodegateReady"],
                ),
                (Event::NodeChanged(node("b1", true)), &["remove@b1/10s"]),
                (patched("b1", false), &[]),
            ],
        );
    }

    #[test]
    fn safety_net_warns_and_labels_the_time_to_ready() {
        run(
            "safety net",
            cfg(1, 1, false),
            vec![
                (Event::Started, &["add:safety_net/30s"]),
                (
                    added(AddReason::SafetyNet, 1),
                    &["event:Warning:NodegateWebhookMissed"],
                ),
                (Event::NodeChanged(node("b1", true)), &[]),
                (Event::Tick, &["probe"]),
                (Event::Probed(true), &["ready=1", "remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:safety_net:6", "event:Normal:NodegateReady"],
                ),
            ],
        );
        run(
            "safety net failed",
            cfg(1, 1, false),
            vec![
                (
                    Event::TaintsAdded {
                        reason: AddReason::SafetyNet,
                        result: Err("forbidden".into()),
                    },
                    &[],
                ),
                (Event::Tick, &["probe"]),
                (Event::Probed(true), &["ready=1", "remove@?/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:4", "event:Normal:NodegateReady"],
                ),
            ],
        );
    }

    #[test]
    fn success_threshold_and_patch_retries() {
        run(
            "thresholds",
            cfg(2, 1, false),
            vec![
                (Event::NodeChanged(node("b1", true)), &[]),
                (Event::Probed(true), &[]),
                (Event::Probed(false), &[]),
                (Event::Probed(true), &[]),
                (Event::Probed(true), &["ready=1", "remove@b1/10s"]),
                (Event::ReadyPatched(Err("conflict".into())), &[]),
                // Any later event retries while the node still needs it.
                (Event::Probed(true), &["remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:8", "event:Normal:NodegateReady"],
                ),
                // Not continuous: falling below the threshold only says so.
                (Event::Probed(false), &["ready=0"]),
            ],
        );
    }

    #[test]
    fn a_reboot_must_pass_the_probes_again() {
        run(
            "reboot seen on the watch",
            cfg(1, 1, false),
            vec![
                (Event::NodeChanged(node("b1", true)), &[]),
                (Event::Probed(true), &["ready=1", "remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:3", "event:Normal:NodegateReady"],
                ),
                (Event::NodeChanged(node("b2", true)), &["ready=0", "probe"]),
                (Event::Probed(true), &["ready=1", "remove@b2/10s"]),
                // Time to ready counts from the reboot.
                (
                    patched("b2", true),
                    &["ttr:webhook:2", "event:Normal:NodegateReady"],
                ),
            ],
        );
        run(
            "reboot seen by the patch's read",
            cfg(1, 1, false),
            vec![
                (Event::NodeChanged(node("b1", true)), &[]),
                (Event::Probed(true), &["ready=1", "remove@b1/10s"]),
                (unchanged("b2"), &["ready=0"]),
                (Event::Tick, &["probe"]),
                (Event::Probed(true), &["ready=1"]),
                (Event::NodeChanged(node("b2", true)), &["remove@b2/10s"]),
            ],
        );
    }

    /// The node as the webhook leaves it when the kubelet re-registers
    /// before reporting its new boot: recorded ready on `boot`, tainted.
    fn retainted(boot: &str) -> NodeView {
        let mut v = node(boot, false);
        if let Some(spec) = v.spec.as_mut() {
            spec.taints = Some(vec![ours()]);
        }
        v
    }

    #[test]
    fn a_taint_put_back_on_a_ready_node_waits_for_the_probes() {
        run(
            "re-registration before the new boot is reported",
            cfg(1, 3, false),
            vec![
                (Event::NodeChanged(node("b1", true)), &[]),
                (Event::Probed(true), &["ready=1", "remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:3", "event:Normal:NodegateReady"],
                ),
                (Event::NodeChanged(retainted("b1")), &["ready=0", "probe"]),
                (Event::Probed(false), &[]),
                (Event::NodeChanged(node("b2", true)), &["ready=0", "probe"]),
                (Event::Probed(true), &["ready=1", "remove@b2/10s"]),
            ],
        );
        run(
            "an admin's re-taint on a healthy node",
            cfg(1, 1, false),
            vec![
                (Event::NodeChanged(node("b1", true)), &[]),
                (Event::Probed(true), &["ready=1", "remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:3", "event:Normal:NodegateReady"],
                ),
                (Event::NodeChanged(retainted("b1")), &["ready=0", "probe"]),
                (Event::Probed(true), &["ready=1", "remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:2", "event:Normal:NodegateReady"],
                ),
            ],
        );
        run(
            "a version older than the ready patch",
            cfg(1, 1, false),
            vec![
                (Event::Probed(true), &["ready=1", "remove@?/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:2", "event:Normal:NodegateReady"],
                ),
                (Event::NodeChanged(node("b1", true)), &["remove@b1/10s"]),
            ],
        );
    }

    #[test]
    fn continuous_mode_retaints_and_announces_the_recovery() {
        run(
            "continuous",
            cfg(1, 2, true),
            vec![
                (Event::NodeChanged(node("b1", true)), &[]),
                (Event::Probed(true), &["ready=1", "remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:3", "event:Normal:NodegateReady"],
                ),
                (Event::Probed(false), &[]),
                (Event::Probed(false), &["ready=0", "add:continuous/10s"]),
                (added(AddReason::Continuous, 1), &[]),
                (Event::Probed(false), &[]),
                // Recovered: the node is not re-read first, and the same boot
                // is announced again.
                (Event::Probed(true), &["ready=1", "remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:continuous:3", "event:Normal:NodegateReady"],
                ),
            ],
        );
        run(
            "continuous re-taint failed",
            cfg(1, 1, true),
            vec![
                (Event::Probed(true), &["ready=1", "remove@?/10s"]),
                (Event::Probed(false), &["ready=0", "add:continuous/10s"]),
                (
                    Event::TaintsAdded {
                        reason: AddReason::Continuous,
                        result: Err("timeout".into()),
                    },
                    &[],
                ),
                (Event::Probed(true), &["ready=1", "remove@?/10s"]),
            ],
        );
    }

    /// The ready patch's answer on `boot`: the node carries `labels` and
    /// the `taints` other writers left; `before` is the boot it had recorded
    /// as ready, `age` its age at the patch.
    fn answered(
        boot: &str,
        removed: bool,
        before: Option<&str>,
        labels: Value,
        taints: Value,
        age: Duration,
    ) -> Event {
        let mut latest = node(boot, false);
        latest.metadata.labels = serde_json::from_value(labels).unwrap();
        if let Some(spec) = latest.spec.as_mut() {
            spec.taints = Some(serde_json::from_value(taints).unwrap());
        }
        Event::ReadyPatched(Ok(MarkReady {
            outcome: Some(ReadyOutcome {
                removed: if removed { vec![ours()] } else { vec![] },
                boot_id: Some(boot.into()),
                ready_boot_before: before.map(Into::into),
                since_creation_ms: Some(i64::try_from(age.as_millis()).unwrap()),
                uid: Some("u1".into()),
            }),
            latest,
        }))
    }

    fn karpenter() -> Value {
        json!({"karpenter.sh/initialized": "true"})
    }

    /// Karpenter's label on a gated node, answered on boot `boot`.
    fn initialized(boot: &str, removed: bool, before: Option<&str>) -> Event {
        answered(
            boot,
            removed,
            before,
            karpenter(),
            json!([]),
            Duration::from_secs(60),
        )
    }

    fn with_labels(mut v: NodeView, labels: Value) -> NodeView {
        v.metadata.labels = serde_json::from_value(labels).unwrap();
        v
    }

    const READY: [&str; 2] = ["ready=1", "remove@b1/10s"];
    const WARNED: [&str; 4] = [
        "ttr:webhook:3",
        "event:Normal:NodegateReady",
        "event:Warning:NodegateGateNotDeclared",
        "undeclared:karpenter",
    ];

    #[test]
    fn karpenters_label_before_the_untaint_is_reported_once() {
        run(
            "label on the version the gate came off",
            cfg(1, 1, false),
            vec![
                (
                    Event::NodeChanged(with_labels(node("b1", true), karpenter())),
                    &[],
                ),
                (Event::Probed(true), &READY),
                (initialized("b1", true, None), &WARNED),
                // The same boot again, its bootID not recorded (the taint
                // back, the annotation not yet seen): the ready Event
                // repeats, the warning does not.
                (Event::NodeChanged(node("b1", true)), &["remove@b1/10s"]),
                (
                    initialized("b1", true, None),
                    &["ttr:webhook:5", "event:Normal:NodegateReady"],
                ),
            ],
        );
        run(
            "no label: nothing",
            cfg(1, 1, false),
            vec![
                (Event::NodeChanged(node("b1", true)), &[]),
                (Event::Probed(true), &READY),
                (
                    answered(
                        "b1",
                        true,
                        None,
                        json!({"karpenter.sh/nodepool": "default"}),
                        json!([]),
                        Duration::from_secs(60),
                    ),
                    &["ttr:webhook:3", "event:Normal:NodegateReady"],
                ),
                // Karpenter labels the node after the untaint: the normal path.
                (
                    Event::NodeChanged(with_labels(node("b1", false), karpenter())),
                    &[],
                ),
            ],
        );
        run(
            "the patch removed no gate",
            cfg(1, 1, false),
            vec![
                (Event::Probed(true), &["ready=1", "remove@?/10s"]),
                (
                    initialized("b1", false, None),
                    &["ttr:none:2", "event:Normal:NodegateReady"],
                ),
            ],
        );
        run(
            "the safety net's gate, on a node nodegate found running",
            cfg(1, 1, false),
            vec![
                (Event::Started, &["add:safety_net/30s"]),
                (
                    added(AddReason::SafetyNet, 1),
                    &["event:Warning:NodegateWebhookMissed"],
                ),
                (Event::Probed(true), &["ready=1", "remove@?/10s"]),
                (
                    initialized("b1", true, None),
                    &["ttr:safety_net:4", "event:Normal:NodegateReady"],
                ),
            ],
        );
    }

    /// Karpenter's label stays from the first boot: after a reboot it is no
    /// news, whether the agent kept running or started with the new boot.
    #[test]
    fn after_a_reboot_the_label_left_from_the_first_boot_is_quiet() {
        run(
            "agent kept running",
            cfg(1, 1, false),
            vec![
                (Event::NodeChanged(node("b1", true)), &[]),
                (Event::Probed(true), &READY),
                (initialized("b1", true, None), &WARNED),
                (
                    Event::NodeChanged(with_labels(node("b2", true), karpenter())),
                    &["ready=0", "probe"],
                ),
                (Event::Probed(true), &["ready=1", "remove@b2/10s"]),
                (
                    initialized("b2", true, Some("b1")),
                    &["ttr:webhook:2", "event:Normal:NodegateReady"],
                ),
            ],
        );
        run(
            "agent started on the new boot",
            cfg(1, 1, false),
            vec![
                (Event::Probed(true), &["ready=1", "remove@?/10s"]),
                (
                    initialized("b2", true, Some("b1")),
                    &["ttr:webhook:2", "event:Normal:NodegateReady"],
                ),
            ],
        );
    }

    #[test]
    fn cluster_autoscalers_deletion_taints_on_a_young_gated_node_are_reported() {
        let candidate = json!([{"key": "DeletionCandidateOfClusterAutoscaler", "value": "1700000000", "effect": "PreferNoSchedule"}]);
        let at = |age: Duration| answered("b1", true, None, json!({}), candidate.clone(), age);
        run(
            "judged unneeded while gated",
            cfg(1, 1, false),
            vec![
                (Event::Probed(true), &["ready=1", "remove@?/10s"]),
                (
                    at(Duration::from_secs(90)),
                    &[
                        "ttr:webhook:2",
                        "event:Normal:NodegateReady",
                        "event:Warning:NodegateGateNotStartupTaint",
                        "undeclared:cluster-autoscaler",
                    ],
                ),
            ],
        );
        run(
            "past MaxNodeStartupTime a declared startup taint allows it too",
            cfg(1, 1, false),
            vec![
                (Event::Probed(true), &["ready=1", "remove@?/10s"]),
                (
                    at(Duration::from_secs(16 * 60)),
                    &["ttr:webhook:2", "event:Normal:NodegateReady"],
                ),
            ],
        );
        // --ca-max-node-startup-time: a node aged 10 min is inside the
        // default window and past a 5 min one.
        run(
            "inside the default window",
            cfg(1, 1, false),
            vec![
                (Event::Probed(true), &["ready=1", "remove@?/10s"]),
                (
                    at(Duration::from_secs(10 * 60)),
                    &[
                        "ttr:webhook:2",
                        "event:Normal:NodegateReady",
                        "event:Warning:NodegateGateNotStartupTaint",
                        "undeclared:cluster-autoscaler",
                    ],
                ),
            ],
        );
        run(
            "past the window the agent was given",
            GateConfig {
                ca_max_node_startup: Duration::from_secs(5 * 60),
                ..cfg(1, 1, false)
            },
            vec![
                (Event::Probed(true), &["ready=1", "remove@?/10s"]),
                (
                    at(Duration::from_secs(10 * 60)),
                    &["ttr:webhook:2", "event:Normal:NodegateReady"],
                ),
            ],
        );
    }

    /// The Warning names the gate removed and the fix, on the Node's uid.
    #[test]
    fn the_warning_names_the_gate_and_the_fix() {
        let t0 = Instant::now();
        let mut g = State::new("n1", default_gate(), cfg(1, 1, false), 1, t0);
        g.on(Event::Probed(true), t0);
        let acts = g.on(initialized("b1", true, None), t0);
        let warning = acts.iter().find_map(|a| match a {
            Action::Emit {
                uid,
                kind: EventType::Warning,
                reason,
                message,
            } => Some((uid.clone(), *reason, message.clone())),
            _ => None,
        });
        let (uid, reason, message) = warning.expect("a Warning Event");
        assert_eq!(uid.as_deref(), Some("u1"));
        assert_eq!(reason, crate::autoscaler::KARPENTER_REASON);
        assert!(
            message.starts_with(
                "Karpenter marked this node initialized while nodegate's gate \
                 nodegate.dev/agent-not-ready:NoSchedule was on it: declare the taint in the \
                 NodePool's spec.template.spec.startupTaints"
            ),
            "{message}"
        );
    }

    fn shutdown(decision: Decision) -> Event {
        Event::Shutdown {
            decision,
            within: Duration::from_secs(4),
        }
    }

    #[test]
    fn shutdown_retaints_when_configured() {
        use crate::removal::Why;
        for why in [Why::NotChecked, Why::Installed, Why::CheckFailed] {
            let counted = format!("shutdown:retaint:{}", why.as_str());
            run(
                "shutdown",
                cfg(1, 1, false),
                vec![
                    (
                        shutdown(Decision::ReTaint(why)),
                        &[counted.as_str(), "add:shutdown/4s"],
                    ),
                    (added(AddReason::Shutdown, 1), &[]),
                ],
            );
        }
        let mut off = cfg(1, 1, false);
        off.taint_on_shutdown = false;
        run(
            "no shutdown re-taint",
            off,
            vec![(
                shutdown(Decision::ReTaint(crate::removal::Why::Installed)),
                &["shutdown:retaint:installed"],
            )],
        );
    }

    /// On removal the node is opened, whether it was ready or still gated
    /// and whatever `--taint-on-shutdown` says: no agent is left to open
    /// it later. A failed write is only reported.
    #[test]
    fn on_removal_the_node_is_opened_not_retainted() {
        use crate::removal::Why;
        let removed = |why| shutdown(Decision::OpenNode(why));
        run(
            "ready node, DaemonSet gone",
            cfg(1, 1, false),
            vec![
                (Event::NodeChanged(node("b1", true)), &[]),
                (Event::Probed(true), &["ready=1", "remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:3", "event:Normal:NodegateReady"],
                ),
                (
                    removed(Why::DaemonSetNotFound),
                    &["shutdown:open:daemonset_not_found", "open/4s"],
                ),
                (Event::Opened(Ok(Vec::new())), &[]),
            ],
        );
        run(
            "gated node, namespace terminating",
            cfg(1, 1, false),
            vec![
                (Event::NodeChanged(node("b1", true)), &[]),
                (Event::Probed(false), &[]),
                (
                    removed(Why::NamespaceTerminating),
                    &["shutdown:open:namespace_terminating", "open/4s"],
                ),
                (Event::Opened(Err("403 forbidden".into())), &[]),
            ],
        );
        let mut off = cfg(1, 1, false);
        off.taint_on_shutdown = false;
        run(
            "no shutdown re-taint, RBAC gone",
            off,
            vec![(
                removed(Why::DaemonSetForbidden),
                &["shutdown:open:daemonset_forbidden", "open/4s"],
            )],
        );
    }
}
