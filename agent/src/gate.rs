//! The readiness gate as a state machine: probe rounds, the agent's own
//! Node as the watch shows it, write results and shutdown in; the taint
//! writes, probe rounds, Events and metrics they lead to out. No I/O: the
//! caller passes the time and runs the actions (`gate_loop`).
//!
//! The gate removes the taint once the probes pass on the node's current
//! boot, and only once per boot; a reboot (new bootID) sends it back to
//! "not ready" until the probes pass again. With `continuous`, probes
//! failing past the failure threshold put the taint back.
//!
//! With several gates (`--gates`), each has its own probes and thresholds'
//! count and opens on its own: a gate whose probes pass while others still
//! hold the node loses its taints in a patch of its own; the last one's
//! patch is the ready patch (boot gate, released taints, bootID). Gates
//! that pass in the same round open in one patch.

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
/// Reason of the Normal Event a gate opened before the last one leaves.
pub const GATE_OPEN_REASON: &str = "NodegateGateOpen";
/// Reason of the Event that says which gate holds the node, since when and
/// which probe fails (`nodegate-check` reads the newest per node).
pub const GATE_HELD_REASON: &str = "NodegateGateHeld";
/// A gate closed this long on a boot gets its held Event: under it, a
/// normal start (an agent's image pull and start-up) stays quiet.
pub const HELD_EVENT_AFTER: Duration = Duration::from_secs(60);
/// ... and another while it still holds the node this much later (core
/// Events expire after the API server's `--event-ttl`, one hour by default).
pub const HELD_EVENT_EVERY: Duration = Duration::from_secs(600);
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
    /// [`HELD_EVENT_AFTER`] and [`HELD_EVENT_EVERY`].
    pub held_event_after: Duration,
    pub held_event_every: Duration,
}

/// One gate as the state machine knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateInfo {
    /// Its name (`default` for the one gate of `--taint`).
    pub name: String,
    /// How many probes open it.
    pub probes: usize,
}

/// One gate's part of a probe round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateResult {
    pub ok: bool,
    /// The first failing probe and why (`http[0] http://… failed: …`).
    pub failure: Option<String>,
}

impl GateResult {
    pub fn passed() -> Self {
        Self {
            ok: true,
            failure: None,
        }
    }

    pub fn failed(why: impl Into<String>) -> Self {
        Self {
            ok: false,
            failure: Some(why.into()),
        }
    }
}

/// The held Event's text: which gate, since when, which probe fails.
pub fn held_message(gate: &str, taints: &str, since: &str, failure: &str) -> String {
    format!("gate {gate} ({taints}) has held this node since {since}: {failure}")
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
    /// One probe round: each gate's result, in the gates' order.
    Probed(Vec<GateResult>),
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
    /// The ready patch of the gates `gates` picks (every gate: the ready
    /// patch proper, [`TaintSet::of_gates`]), unless the node now reports
    /// another boot than `boot`; retried for up to `within`; answer with
    /// [`Event::ReadyPatched`].
    RemoveTaints {
        boot: Option<String>,
        within: Duration,
        gates: Vec<bool>,
    },
    /// Add the missing taints of the gates `gates` picks when `reason`
    /// applies to a fresh read; retried for up to `within`; answer with
    /// [`Event::TaintsAdded`].
    AddTaints {
        reason: AddReason,
        within: Duration,
        gates: Vec<bool>,
    },
    /// The held Event of a gate: `since` is `held_for` before now.
    EmitHeld {
        uid: Option<String>,
        gate: String,
        taints: String,
        held_for: Duration,
        failure: String,
    },
    /// The `gate_open` gauge of one gate.
    SetGateOpen { gate: String, open: bool },
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
    /// Each gate's verdict, in the order of `taints.gates()`.
    gates: Vec<GateTrack>,
    /// The gates the last [`Action::RemoveTaints`] asked to open.
    opening: Vec<bool>,
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

/// One gate's verdict, and what its held Event needs.
#[derive(Debug)]
struct GateTrack {
    info: GateInfo,
    readiness: Readiness,
    /// Since when it has been closed: agent start, a reboot, a re-taint.
    since: Instant,
    /// When its held Event was last sent on this closing.
    reported: Option<Instant>,
    /// The last round's failure.
    failure: Option<String>,
}

impl GateTrack {
    fn close(&mut self, now: Instant) {
        self.readiness.reset();
        self.since = now;
        self.reported = None;
    }
}

/// How long after a ready patch the watch's older versions are skipped:
/// past it (a watch that far behind, or versions that went back as after
/// an etcd restore) every version counts again, and a stale one costs a
/// failed `test` and a read, as before.
const STALE_WINDOW: Duration = Duration::from_secs(30);

impl State {
    /// One gate (`default`) of `probes` probes: `taints` holds one gate.
    pub fn new(
        name: impl Into<String>,
        taints: Arc<TaintSet>,
        cfg: GateConfig,
        probes: usize,
        started: Instant,
    ) -> Self {
        let gates = vec![GateInfo {
            name: "default".into(),
            probes,
        }];
        Self::with_gates(name, taints, cfg, gates, started)
    }

    /// `gates`, in the order of `taints.gates()`.
    pub fn with_gates(
        name: impl Into<String>,
        taints: Arc<TaintSet>,
        cfg: GateConfig,
        gates: Vec<GateInfo>,
        started: Instant,
    ) -> Self {
        let gates = gates
            .into_iter()
            .map(|info| GateTrack {
                info,
                readiness: Readiness::new(cfg.thresholds),
                since: started,
                reported: None,
                failure: None,
            })
            .collect();
        Self {
            name: name.into(),
            taints,
            cfg,
            gates,
            opening: Vec::new(),
            view: None,
            boot: None,
            since: started,
            announced_boot: None,
            flagged_boot: None,
            origin: Origin::Webhook,
            patched: None,
        }
    }

    /// Every gate is open.
    pub fn is_ready(&self) -> bool {
        self.gates.iter().all(|g| g.readiness.is_ready())
    }

    /// Which gates are open, in order.
    fn open(&self) -> Vec<bool> {
        self.gates.iter().map(|g| g.readiness.is_ready()).collect()
    }

    fn every_gate(&self) -> Vec<bool> {
        vec![true; self.gates.len()]
    }

    /// Every gate back to closed, from `now`.
    fn close_all(&mut self, now: Instant, out: &mut Vec<Action>) {
        let several = self.gates.len() > 1;
        for g in &mut self.gates {
            if several && g.readiness.is_ready() {
                out.push(Action::SetGateOpen {
                    gate: g.info.name.clone(),
                    open: false,
                });
            }
            g.close(now);
        }
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
                gates: self.every_gate(),
            }),
            Event::NodeChanged(view) => {
                if self.stale(&view, now) {
                    return out;
                }
                self.view = Some(view);
                if self.rebooted(now, &mut out) || self.retainted(now, &mut out) {
                    out.push(Action::RunProbes);
                } else {
                    self.settle(&[], &mut out);
                }
            }
            Event::WatchFailed(e) => {
                tracing::warn!(node = %self.name, error = %e, "own node watch failed, retrying");
                self.settle(&[], &mut out);
            }
            Event::Tick => out.push(Action::RunProbes),
            Event::Probed(results) => {
                let before = self.is_ready();
                let fell = self.observe(&results, now, &mut out);
                let transition = match (before, self.is_ready()) {
                    (false, true) => Some(Transition::Ready),
                    (true, false) => Some(Transition::NotReady),
                    _ => None,
                };
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
                self.held(now, &mut out);
                self.settle(&fell, &mut out);
            }
            Event::ReadyPatched(result) => {
                let opening = std::mem::take(&mut self.opening);
                let some = opening.iter().any(|o| !o);
                match result {
                    Ok(MarkReady {
                        outcome: Some(out_),
                        latest,
                    }) if some => {
                        self.patched = latest.metadata.resource_version.clone().map(|rv| (rv, now));
                        self.view = Some(latest);
                        self.gates_opened(&out_, &opening, now, &mut out);
                    }
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
                    gates: self.every_gate(),
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
    /// needs it (without a view, try: the patch is a no-op when done); the
    /// same for the gates already open while others hold the node; in
    /// continuous mode, re-taint the gates that fell below the failure
    /// threshold (`fell`).
    fn settle(&mut self, fell: &[bool], out: &mut Vec<Action>) {
        let open = self.open();
        if open.iter().any(|o| *o) {
            let set = self.taints.of_gates(&open);
            if self
                .view
                .as_ref()
                .is_none_or(|v| needs_ready_patch(v, &set))
            {
                self.opening = open.clone();
                out.push(Action::RemoveTaints {
                    boot: self.boot.clone(),
                    within: self.write_within(),
                    gates: open,
                });
            }
        }
        if self.cfg.continuous && fell.iter().any(|f| *f) {
            out.push(Action::AddTaints {
                reason: AddReason::Continuous,
                within: self.write_within(),
                gates: fell.to_vec(),
            });
        }
    }

    /// Feeds a round to each gate; returns which fell below the failure
    /// threshold.
    fn observe(
        &mut self,
        results: &[GateResult],
        now: Instant,
        out: &mut Vec<Action>,
    ) -> Vec<bool> {
        let several = self.gates.len() > 1;
        let mut fell = vec![false; self.gates.len()];
        for (i, g) in self.gates.iter_mut().enumerate() {
            let result = results.get(i);
            g.failure = result.and_then(|r| r.failure.clone());
            match g.readiness.observe(result.is_some_and(|r| r.ok)) {
                // One gate's gauge is the `ready` one (the loop sets both).
                Some(Transition::Ready) if several => {
                    tracing::info!(node = %self.name, gate = %g.info.name, "the gate's probes pass");
                    out.push(Action::SetGateOpen {
                        gate: g.info.name.clone(),
                        open: true,
                    });
                }
                Some(Transition::NotReady) => {
                    if several {
                        out.push(Action::SetGateOpen {
                            gate: g.info.name.clone(),
                            open: false,
                        });
                    }
                    g.since = now;
                    g.reported = None;
                    fell[i] = true;
                }
                _ => {}
            }
        }
        fell
    }

    /// The held Event of each gate closed for [`GateConfig::held_event_after`]
    /// whose taint is on the node, again every
    /// [`GateConfig::held_event_every`]: which gate holds the node, since
    /// when, which probe fails.
    fn held(&mut self, now: Instant, out: &mut Vec<Action>) {
        let Some(view) = self.view.as_ref() else {
            return;
        };
        let on = view.taints();
        for (g, taints) in self.gates.iter_mut().zip(self.taints.gates()) {
            let held_for = now.saturating_duration_since(g.since);
            let due = g
                .reported
                .is_none_or(|at| now.saturating_duration_since(at) >= self.cfg.held_event_every);
            if g.readiness.is_ready()
                || !taints.iter().any(|t| t.is_in(on))
                || held_for < self.cfg.held_event_after
                || !due
            {
                continue;
            }
            g.reported = Some(now);
            let failure = g
                .failure
                .clone()
                .unwrap_or_else(|| "its probes have not passed yet".into());
            tracing::warn!(node = %self.name, gate = %g.info.name, held_s = held_for.as_secs(), %failure, "a gate holds the node");
            out.push(Action::EmitHeld {
                uid: view.metadata.uid.clone(),
                gate: g.info.name.clone(),
                taints: shown(taints),
                held_for,
                failure,
            });
        }
    }

    /// A patch opened some gates while others still hold the node: one
    /// Event per gate it opened.
    fn gates_opened(
        &self,
        o: &ReadyOutcome,
        opening: &[bool],
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        let taints = self.taints.gates();
        let still: Vec<&str> = self
            .gates
            .iter()
            .zip(opening)
            .filter(|(_, o)| !**o)
            .map(|(g, _)| g.info.name.as_str())
            .collect();
        for ((g, set), _) in self
            .gates
            .iter()
            .zip(taints)
            .zip(opening)
            .filter(|(_, o)| **o)
        {
            if !set.iter().any(|t| t.is_in(&o.removed)) {
                continue;
            }
            let after = now.saturating_duration_since(g.since).as_secs_f64();
            tracing::info!(node = %self.name, gate = %g.info.name, ?still, "gate open: its taint removed");
            out.push(Action::Emit {
                uid: o.uid.clone(),
                kind: EventType::Normal,
                reason: GATE_OPEN_REASON,
                message: format!(
                    "gate {} ({}) opened: its {} probes pass, {after:.1}s after it closed; still held by {still:?}",
                    g.info.name,
                    shown(set),
                    g.info.probes
                ),
            });
        }
    }

    /// Tracks the node's bootID; on a change from a known one the verdict
    /// belonged to the previous boot: back to not ready, waiting anew.
    fn rebooted(&mut self, now: Instant, out: &mut Vec<Action>) -> bool {
        let Some(current) = self
            .view
            .as_ref()
            .and_then(NodeView::boot_id)
            .map(str::to_owned)
        else {
            return false;
        };
        let current = current.as_str();
        let changed = self.boot.as_deref().is_some_and(|b| b != current);
        if changed {
            tracing::info!(node = %self.name, old_boot = self.boot.as_deref().unwrap_or(""), new_boot = current, "node rebooted; probes must pass again");
            out.push(Action::SetReady(false));
            self.close_all(now, out);
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
        if !(self.is_ready() && ours && recorded && announced) {
            return false;
        }
        tracing::info!(node = %self.name, boot_id = boot.unwrap_or(""), "taint put back on a ready node; probes must pass again");
        out.push(Action::SetReady(false));
        self.close_all(now, out);
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
                self.gates.iter().map(|g| g.info.probes).sum::<usize>(),
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

/// Taints as flags spell them, comma-separated.
fn shown(taints: &[TaintSpec]) -> String {
    let all: Vec<String> = taints.iter().map(ToString::to_string).collect();
    all.join(",")
}

impl Event {
    /// A round of the one gate of `--taint`.
    pub fn probed(ok: bool) -> Event {
        Event::Probed(vec![if ok {
            GateResult::passed()
        } else {
            GateResult::failed("probe failed")
        }])
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
            held_event_after: HELD_EVENT_AFTER,
            held_event_every: HELD_EVENT_EVERY,
        }
    }

    /// An action as a short word, so a table reads like the story it tells.
    fn brief(a: &Action) -> String {
        match a {
            Action::RunProbes => "probe".into(),
            Action::RemoveTaints {
                boot,
                within,
                gates,
            } => {
                format!(
                    "remove@{}/{}s{}",
                    boot.as_deref().unwrap_or("?"),
                    within.as_secs(),
                    mask(gates)
                )
            }
            Action::AddTaints {
                reason,
                within,
                gates,
            } => {
                format!(
                    "add:{}/{}s{}",
                    reason.as_str(),
                    within.as_secs(),
                    mask(gates)
                )
            }
            Action::EmitHeld {
                gate,
                failure,
                held_for,
                ..
            } => {
                format!("held:{gate}:{}s:{failure}", held_for.as_secs())
            }
            Action::SetGateOpen { gate, open } => format!("{gate}={}", u8::from(*open)),
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

    /// A gate mask, shown only when it picks some gates, not all.
    fn mask(gates: &[bool]) -> String {
        if gates.iter().all(|g| *g) {
            return String::new();
        }
        let picked: String = gates.iter().map(|g| if *g { '1' } else { '0' }).collect();
        format!("[{picked}]")
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
        g.on(Event::probed(true), t0);
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
            acts(g.on(Event::probed(true), t0)),
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
        g.on(Event::probed(true), t0);
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
                (Event::probed(true), &["ready=1", "remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:6", "event:Normal:NodegateReady"],
                ),
                (Event::NodeChanged(node("b1", false)), &[]),
                (Event::Tick, &["probe"]),
                (Event::probed(true), &[]),
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
                (Event::probed(true), &["ready=1", "remove@?/10s"]),
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
                (Event::probed(true), &["ready=1", "remove@b1/10s"]),
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
                (Event::probed(true), &["ready=1", "remove@?/10s"]),
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
                (Event::probed(true), &[]),
                (Event::probed(false), &[]),
                (Event::probed(true), &[]),
                (Event::probed(true), &["ready=1", "remove@b1/10s"]),
                (Event::ReadyPatched(Err("conflict".into())), &[]),
                // Any later event retries while the node still needs it.
                (Event::probed(true), &["remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:8", "event:Normal:NodegateReady"],
                ),
                // Not continuous: falling below the threshold only says so.
                (Event::probed(false), &["ready=0"]),
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
                (Event::probed(true), &["ready=1", "remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:3", "event:Normal:NodegateReady"],
                ),
                (Event::NodeChanged(node("b2", true)), &["ready=0", "probe"]),
                (Event::probed(true), &["ready=1", "remove@b2/10s"]),
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
                (Event::probed(true), &["ready=1", "remove@b1/10s"]),
                (unchanged("b2"), &["ready=0"]),
                (Event::Tick, &["probe"]),
                (Event::probed(true), &["ready=1"]),
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
                (Event::probed(true), &["ready=1", "remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:3", "event:Normal:NodegateReady"],
                ),
                (Event::NodeChanged(retainted("b1")), &["ready=0", "probe"]),
                (Event::probed(false), &[]),
                (Event::NodeChanged(node("b2", true)), &["ready=0", "probe"]),
                (Event::probed(true), &["ready=1", "remove@b2/10s"]),
            ],
        );
        run(
            "an admin's re-taint on a healthy node",
            cfg(1, 1, false),
            vec![
                (Event::NodeChanged(node("b1", true)), &[]),
                (Event::probed(true), &["ready=1", "remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:3", "event:Normal:NodegateReady"],
                ),
                (Event::NodeChanged(retainted("b1")), &["ready=0", "probe"]),
                (Event::probed(true), &["ready=1", "remove@b1/10s"]),
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
                (Event::probed(true), &["ready=1", "remove@?/10s"]),
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
                (Event::probed(true), &["ready=1", "remove@b1/10s"]),
                (
                    patched("b1", true),
                    &["ttr:webhook:3", "event:Normal:NodegateReady"],
                ),
                (Event::probed(false), &[]),
                (Event::probed(false), &["ready=0", "add:continuous/10s"]),
                (added(AddReason::Continuous, 1), &[]),
                (Event::probed(false), &[]),
                // Recovered: the node is not re-read first, and the same boot
                // is announced again.
                (Event::probed(true), &["ready=1", "remove@b1/10s"]),
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
                (Event::probed(true), &["ready=1", "remove@?/10s"]),
                (Event::probed(false), &["ready=0", "add:continuous/10s"]),
                (
                    Event::TaintsAdded {
                        reason: AddReason::Continuous,
                        result: Err("timeout".into()),
                    },
                    &[],
                ),
                (Event::probed(true), &["ready=1", "remove@?/10s"]),
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
                (Event::probed(true), &READY),
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
                (Event::probed(true), &READY),
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
                (Event::probed(true), &["ready=1", "remove@?/10s"]),
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
                (Event::probed(true), &["ready=1", "remove@?/10s"]),
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
                (Event::probed(true), &READY),
                (initialized("b1", true, None), &WARNED),
                (
                    Event::NodeChanged(with_labels(node("b2", true), karpenter())),
                    &["ready=0", "probe"],
                ),
                (Event::probed(true), &["ready=1", "remove@b2/10s"]),
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
                (Event::probed(true), &["ready=1", "remove@?/10s"]),
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
                (Event::probed(true), &["ready=1", "remove@?/10s"]),
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
                (Event::probed(true), &["ready=1", "remove@?/10s"]),
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
                (Event::probed(true), &["ready=1", "remove@?/10s"]),
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
                (Event::probed(true), &["ready=1", "remove@?/10s"]),
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
        g.on(Event::probed(true), t0);
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
                (Event::probed(true), &["ready=1", "remove@b1/10s"]),
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
                (Event::probed(false), &[]),
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

    const CSI: &str = "nodegate.dev/csi-not-ready=true:NoSchedule";

    fn taint_json(spec: &str) -> Value {
        let t: TaintSpec = spec.parse().unwrap();
        t.to_json()
    }

    /// A node on `boot` carrying `taints` (specs), not recorded ready.
    fn gated(boot: &str, taints: &[&str]) -> NodeView {
        let taints: Vec<Value> = taints.iter().map(|t| taint_json(t)).collect();
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "uid": "u1", "resourceVersion": "5"},
            "spec": {"taints": taints},
            "status": {"nodeInfo": {"bootID": boot}}
        }))
        .unwrap()
    }

    /// Two gates: `cni` (the default key, 2 probes), `csi` (1 probe).
    fn two_gates(t0: Instant, continuous: bool) -> State {
        let set = TaintSet::with_gates(
            vec![vec![TAINT.parse().unwrap()], vec![CSI.parse().unwrap()]],
            Vec::new(),
            Vec::new(),
        );
        let gates = vec![
            GateInfo {
                name: "cni".into(),
                probes: 2,
            },
            GateInfo {
                name: "csi".into(),
                probes: 1,
            },
        ];
        State::with_gates("n1", Arc::new(set), cfg(1, 1, continuous), gates, t0)
    }

    fn round(cni: bool, csi: bool) -> Event {
        let r = |ok: bool, why: &str| {
            if ok {
                GateResult::passed()
            } else {
                GateResult::failed(why)
            }
        };
        Event::Probed(vec![
            r(cni, "http[0] failed: connection refused"),
            r(
                csi,
                "pod[0] failed: no Ready pod matching the selector on this node",
            ),
        ])
    }

    fn opened(removed: &[&str], latest: NodeView) -> Event {
        Event::ReadyPatched(Ok(MarkReady {
            outcome: Some(ReadyOutcome {
                removed: removed.iter().map(|t| taint_json(t)).collect(),
                boot_id: Some("b1".into()),
                ready_boot_before: None,
                since_creation_ms: Some(5),
                uid: Some("u1".into()),
            }),
            latest,
        }))
    }

    fn briefs(a: Vec<Action>) -> Vec<String> {
        a.iter().map(brief).collect()
    }

    /// Each gate opens on its own probes: the first in a patch of its own
    /// (no bootID recorded, an Event naming it and who still holds the
    /// node), the last in the ready patch.
    #[test]
    fn each_gate_opens_on_its_own_probes_and_the_last_one_records_the_boot() {
        let t0 = Instant::now();
        let mut g = two_gates(t0, false);
        g.on(Event::NodeChanged(gated("b1", &[TAINT, CSI])), t0);
        assert_eq!(briefs(g.on(round(false, false), t0)), Vec::<String>::new());
        assert_eq!(
            briefs(g.on(round(true, false), t0)),
            ["cni=1", "remove@b1/10s[10]"]
        );
        assert!(!g.is_ready());
        let acts = g.on(opened(&[TAINT], gated("b1", &[CSI])), t0);
        assert_eq!(briefs(acts.clone()), ["event:Normal:NodegateGateOpen"]);
        let Action::Emit { message, .. } = &acts[0] else {
            panic!("{acts:?}")
        };
        assert!(
            message.contains("gate cni (nodegate.dev/agent-not-ready=true:NoSchedule) opened")
                && message.contains(r#"still held by ["csi"]"#),
            "{message}"
        );
        // Open gates cost nothing more while the other still holds the node.
        assert_eq!(briefs(g.on(round(true, false), t0)), Vec::<String>::new());
        assert_eq!(
            briefs(g.on(round(true, true), t0)),
            ["csi=1", "ready=1", "remove@b1/10s"]
        );
        assert!(g.is_ready());
    }

    /// Gates ready in the same round open in one write.
    #[test]
    fn gates_ready_together_open_in_one_patch() {
        let t0 = Instant::now();
        let mut g = two_gates(t0, false);
        g.on(Event::NodeChanged(gated("b1", &[TAINT, CSI])), t0);
        assert_eq!(
            briefs(g.on(round(true, true), t0)),
            ["cni=1", "csi=1", "ready=1", "remove@b1/10s"]
        );
    }

    /// A gate that holds the node past a minute says so, naming its
    /// failing probe, then again every ten minutes; an open gate, or one
    /// whose taint is not on the node, never does.
    #[test]
    fn a_gate_holding_the_node_says_which_probe_fails_and_since_when() {
        let t0 = Instant::now();
        let mut g = two_gates(t0, false);
        g.on(Event::NodeChanged(gated("b1", &[TAINT, CSI])), t0);
        g.on(round(true, false), t0);
        g.on(opened(&[TAINT], gated("b1", &[CSI])), t0);
        let s = Duration::from_secs;
        assert_eq!(
            briefs(g.on(round(true, false), t0 + s(59))),
            Vec::<String>::new()
        );
        assert_eq!(
            briefs(g.on(round(true, false), t0 + s(60))),
            ["held:csi:60s:pod[0] failed: no Ready pod matching the selector on this node"]
        );
        assert_eq!(
            briefs(g.on(round(true, false), t0 + s(600))),
            Vec::<String>::new()
        );
        assert_eq!(briefs(g.on(round(true, false), t0 + s(660))).len(), 1);
        assert_eq!(
            held_message("csi", CSI, "2026-11-29T14:00:00Z", "pod[0] failed: x"),
            "gate csi (nodegate.dev/csi-not-ready=true:NoSchedule) has held this node since 2026-11-29T14:00:00Z: pod[0] failed: x"
        );
        // Its taint gone (removed by hand): nothing to say.
        let mut h = two_gates(t0, false);
        h.on(Event::NodeChanged(gated("b1", &[TAINT])), t0);
        let late = briefs(h.on(round(false, false), t0 + s(120)));
        assert_eq!(late, ["held:cni:120s:http[0] failed: connection refused"]);
    }

    /// A reboot closes every gate; in continuous mode only the gate that
    /// fell gets its taint back.
    #[test]
    fn a_reboot_closes_every_gate_and_a_fall_re_taints_only_its_gate() {
        let t0 = Instant::now();
        let mut g = two_gates(t0, true);
        g.on(Event::NodeChanged(gated("b1", &[TAINT, CSI])), t0);
        g.on(round(true, true), t0);
        g.on(patched("b1", true), t0);
        assert_eq!(
            briefs(g.on(round(true, false), t0)),
            ["csi=0", "ready=0", "add:continuous/10s[01]"]
        );
        let mut r = two_gates(t0, false);
        r.on(Event::NodeChanged(gated("b1", &[TAINT, CSI])), t0);
        r.on(round(true, true), t0);
        r.on(patched("b1", true), t0);
        assert_eq!(
            briefs(r.on(Event::NodeChanged(gated("b2", &[TAINT, CSI])), t0)),
            ["ready=0", "cni=0", "csi=0", "probe"]
        );
        assert!(!r.is_ready());
    }
}
