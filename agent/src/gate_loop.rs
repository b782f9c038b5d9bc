//! The readiness gate's I/O: the own Node's watch, the period and probe
//! wake-ups feed [`crate::gate::State`]; its actions run here (probe rounds,
//! writes on the Node, Events, metrics), each answer fed back before the
//! next event is taken.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::StreamExt;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use nodegate_shared::NodeResource;
use nodegate_shared::signal::stopped;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::gate::{
    Action, Event, GateConfig, GateInfo, GateResult, State, held_message, next_round,
};
use crate::metrics::{
    AutoscalerLabel, GateLabel, Metrics, OriginLabel, ProbeLabels, ProbeName, ShutdownLabels,
};
use crate::node_patch::EventType;
use crate::node_writer::NodeWriter;
use crate::probe::Probe;
use crate::removal::{Decision, Why};
use crate::removal_check::RemovalCheck;

pub struct Gate {
    pub writer: NodeWriter,
    /// The gates, in the order of the writer's `taints.gates()`.
    pub gates: Vec<GateInfo>,
    /// Every gate's probes, each knowing its gate ([`Probe::gate`]).
    pub probes: Vec<Probe>,
    /// Poked by file (inotify) and pod (watch) probes on changes.
    pub wake: Arc<Notify>,
    pub cfg: GateConfig,
    pub metrics: Metrics,
    /// Agent start, for the time-to-ready log line.
    pub started: Instant,
    /// With `--daemonset`: tells a removal of nodegate from a stop on SIGTERM.
    pub removal: Option<RemovalCheck>,
}

impl Gate {
    /// Runs until `shutdown` flips, then the shutdown re-taint (if enabled),
    /// or the opening of the node if nodegate is being removed.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut state = State::with_gates(
            self.writer.name.clone(),
            self.writer.taints.clone(),
            self.cfg.clone(),
            self.gates.clone(),
            self.started,
        );
        // Every gate's series from the start, so a gate that never opens
        // shows (and alerts) as 0 rather than missing.
        for g in &self.gates {
            self.metrics
                .gate_open
                .get_or_create(&GateLabel {
                    gate: g.name.clone(),
                })
                .set(0);
        }
        // The safety net for webhook outages, before the first probe round.
        let start = self.act(&mut state, Event::Started);
        let stopped_early = tokio::select! {
            () = start => false,
            _ = stopped(&mut shutdown) => true,
        };
        if !stopped_early {
            self.follow(&mut state, &mut shutdown).await;
        }
        let stop = Instant::now();
        let decision = match &self.removal {
            Some(check) => check.run().await,
            None => Decision::ReTaint(Why::NotChecked),
        };
        let within = self.cfg.shutdown_deadline.saturating_sub(stop.elapsed());
        self.act(&mut state, Event::Shutdown { decision, within })
            .await;
    }

    /// The event loop: own Node updates, the period, probe wake-ups.
    async fn follow(&self, state: &mut State, shutdown: &mut watch::Receiver<bool>) {
        // Own node only: its bootID tells a reboot, its taints what is left to do.
        let name = &self.writer.name;
        let cfg = crate::watch::config().fields(&format!("metadata.name={name}"));
        let own = watcher(Api::<NodeResource>::all(self.writer.client()), cfg)
            .default_backoff()
            .applied_objects();
        let mut own = std::pin::pin!(own);
        let mut next = Instant::now();
        loop {
            let event = tokio::select! {
                biased;
                _ = stopped(shutdown) => return,
                ev = own.next() => match ev {
                    Some(Ok(node)) => Event::NodeChanged(node.view),
                    Some(Err(e)) => Event::WatchFailed(e.to_string()),
                    None => Event::WatchFailed("watch ended".into()),
                },
                () = tokio::time::sleep_until(next) => Event::Tick,
                _ = self.wake.notified() => Event::Tick,
            };
            let round = matches!(event, Event::Tick);
            self.act(state, event).await;
            next = next_round(next, Instant::now(), state.period(), round);
        }
    }

    /// Feeds `event` and runs the actions, feeding each answer back.
    async fn act(&self, state: &mut State, event: Event) {
        let mut queue: VecDeque<Action> = state.on(event, Instant::now()).into();
        while let Some(action) = queue.pop_front() {
            let answer = match action {
                Action::RunProbes => Some(Event::Probed(self.round().await)),
                Action::RemoveTaints {
                    boot,
                    within,
                    gates,
                } => {
                    let set = self.writer.taints.of_gates(&gates);
                    let deadline = Instant::now() + within;
                    Some(Event::ReadyPatched(
                        self.writer
                            .mark_ready_of(&set, deadline, boot.as_deref(), state.seen())
                            .await
                            .map_err(|e| e.to_string()),
                    ))
                }
                Action::AddTaints {
                    reason,
                    within,
                    gates,
                } => {
                    let set = self.writer.taints.of_gates(&gates);
                    Some(Event::TaintsAdded {
                        reason,
                        result: self
                            .writer
                            .add_missing_of(&set, reason, Instant::now() + within)
                            .await
                            .map_err(|e| e.to_string()),
                    })
                }
                Action::EmitHeld {
                    uid,
                    gate,
                    taints,
                    held_for,
                    failure,
                } => {
                    let since = k8s_openapi::jiff::Timestamp::now()
                        .checked_sub(held_for)
                        .map(|t| {
                            t.round(k8s_openapi::jiff::Unit::Second)
                                .unwrap_or(t)
                                .to_string()
                        })
                        .unwrap_or_default();
                    let message = held_message(&gate, &taints, &since, &failure);
                    self.writer
                        .event(
                            uid,
                            EventType::Warning,
                            crate::gate::GATE_HELD_REASON,
                            message,
                        )
                        .await;
                    None
                }
                Action::SetGateOpen { gate, open } => {
                    self.metrics
                        .gate_open
                        .get_or_create(&GateLabel { gate })
                        .set(i64::from(open));
                    None
                }
                Action::Emit {
                    uid,
                    kind,
                    reason,
                    message,
                } => {
                    self.writer.event(uid, kind, reason, message).await;
                    None
                }
                Action::SetReady(ready) => {
                    self.metrics.ready.set(i64::from(ready));
                    if let [only] = self.gates.as_slice() {
                        self.metrics
                            .gate_open
                            .get_or_create(&GateLabel {
                                gate: only.name.clone(),
                            })
                            .set(i64::from(ready));
                    }
                    None
                }
                Action::ObserveTimeToReady { origin, seconds } => {
                    self.metrics
                        .time_to_ready
                        .get_or_create(&OriginLabel {
                            origin: origin.as_str().into(),
                        })
                        .observe(seconds);
                    None
                }
                Action::OpenNode { within } => Some(Event::Opened(
                    self.writer
                        .open(Instant::now() + within)
                        .await
                        .map_err(|e| e.to_string()),
                )),
                Action::CountShutdown(d) => {
                    self.metrics
                        .shutdown_decisions
                        .get_or_create(&ShutdownLabels {
                            decision: d.as_str(),
                            reason: d.why().as_str(),
                        })
                        .inc();
                    None
                }
                Action::CountGateUndeclared(a) => {
                    self.metrics
                        .gate_undeclared
                        .get_or_create(&AutoscalerLabel {
                            autoscaler: a.as_str(),
                        })
                        .inc();
                    None
                }
            };
            if let Some(answer) = answer {
                queue.extend(state.on(answer, Instant::now()));
            }
        }
    }

    /// Runs every probe concurrently; each gate's result, in order: a gate
    /// passes when all of its probes do.
    async fn round(&self) -> Vec<GateResult> {
        for p in &self.probes {
            p.rearm(&self.wake);
        }
        let results =
            futures::future::join_all(self.probes.iter().map(|p| p.check(self.cfg.timeout))).await;
        let mut gates = vec![GateResult::passed(); self.gates.len()];
        for (p, r) in self.probes.iter().zip(results) {
            let ok = r.is_ok();
            if let Err(e) = &r {
                tracing::debug!(probe = %p.spec, gate = p.gate, error = %e, "probe failed");
                if let Some(g) = gates.get_mut(p.gate)
                    && g.ok
                {
                    *g =
                        GateResult::failed(format!("{}[{}] failed: {e}", p.spec.kind(), p.in_gate));
                }
            }
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
        gates
    }
}
