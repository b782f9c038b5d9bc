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

use crate::gate::{Action, Event, GateConfig, State, next_round};
use crate::metrics::{
    AutoscalerLabel, Metrics, OriginLabel, ProbeLabels, ProbeName, ShutdownLabels,
};
use crate::node_writer::NodeWriter;
use crate::probe::Probe;
use crate::removal::{Decision, Why};
use crate::removal_check::RemovalCheck;

pub struct Gate {
    pub writer: NodeWriter,
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
        let mut state = State::new(
            self.writer.name.clone(),
            self.writer.taints.clone(),
            self.cfg.clone(),
            self.probes.len(),
            self.started,
        );
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
                Action::RemoveTaints { boot, within } => Some(Event::ReadyPatched(
                    self.writer
                        .mark_ready(Instant::now() + within, boot.as_deref(), state.seen())
                        .await
                        .map_err(|e| e.to_string()),
                )),
                Action::AddTaints { reason, within } => Some(Event::TaintsAdded {
                    reason,
                    result: self
                        .writer
                        .add_missing(reason, Instant::now() + within)
                        .await
                        .map_err(|e| e.to_string()),
                }),
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
}
