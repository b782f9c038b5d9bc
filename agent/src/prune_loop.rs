//! Stale-node pruning's I/O: the node source (roster shards or a watch on
//! every Node), the confirmation GETs, one GET of the own Node at start,
//! the handlers' channel, the snapshot timer and writer, all around the
//! pure [`crate::prune::State`].

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use nodegate_roster::record::NodeRecord;
use nodegate_roster::shard;
use nodegate_roster::view::{Membership, NodeEvents, RosterView};
use nodegate_shared::NodeResource;
use nodegate_shared::signal::stopped;
use tokio::sync::{mpsc, watch};

use crate::confirm::{ConfirmConfig, Confirmer, Field, Lookup};
use crate::deletion::{Deletion, key};
use crate::metrics::{Metrics, ResultLabel};
use crate::prune::{Action, Event, Pruner, State};
use crate::snapshot;

/// Everything the prune loop needs besides the source.
pub struct PruneContext {
    pub state_dir: PathBuf,
    pub snapshot_interval: Duration,
    pub metrics: Metrics,
    /// Set after the first full list (`/readyz`).
    pub listed: Arc<AtomicBool>,
    pub deletions: mpsc::UnboundedSender<Deletion>,
    /// Where deletions are confirmed (GET of the node by name).
    pub nodes: Api<Node>,
    pub confirm: ConfirmConfig,
}

/// Time limit of one confirmation GET.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// One GET of the node's metadata (not the whole Node: a fraction of the
/// bytes), a quorum read, so a node deleted before the source said so is
/// never seen as live.
async fn lookup(nodes: Api<Node>, name: String) -> Lookup {
    match tokio::time::timeout(LOOKUP_TIMEOUT, nodes.get_metadata_opt(&name)).await {
        Ok(Ok(None)) => Lookup::Missing,
        Ok(Ok(Some(m))) => Lookup::Uid(m.metadata.uid.unwrap_or_default()),
        Ok(Err(e)) => Lookup::Failed(e.to_string()),
        Err(_) => Lookup::Failed(format!("no answer within {LOOKUP_TIMEOUT:?}")),
    }
}

/// Attempts at reading the own Node at start, [`OWN_RETRY`] apart.
const OWN_ATTEMPTS: u32 = 6;
const OWN_RETRY: Duration = Duration::from_secs(10);

/// The own Node as the API server has it (one GET at start, again after an
/// error): with the roster, what the own node holds would otherwise be only
/// what a shard says. `None` when it is not there or cannot be read (the
/// source's record of it still counts).
async fn own_node(nodes: Api<Node>, name: String) -> Option<NodeRecord> {
    let api: Api<NodeResource> = Api::all(nodes.into_client());
    for attempt in 1..=OWN_ATTEMPTS {
        let error = match tokio::time::timeout(LOOKUP_TIMEOUT, api.get_opt(&name)).await {
            Ok(Ok(Some(n))) => return NodeRecord::from_view(&n.view).map(NodeRecord::for_roster),
            Ok(Ok(None)) => return None,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {LOOKUP_TIMEOUT:?}"),
        };
        tracing::warn!(node = %name, %error, attempt, "cannot read the own Node; until then its values count as held only as the node source shows them");
        if attempt < OWN_ATTEMPTS {
            tokio::time::sleep(OWN_RETRY).await;
        }
    }
    None
}

/// Where the pruner learns which nodes exist.
pub enum Source {
    /// A watch on every Node: simple, but every status write of every node
    /// reaches every agent. For small clusters.
    Nodes(Api<NodeResource>),
    /// The roster's shard ConfigMaps: a change only when a node joins,
    /// leaves or changes its addresses, CIDRs or providerID.
    Roster { api: Api<ConfigMap>, name: String },
}

/// A membership stream and what it reports along the way.
type Changes = futures::stream::BoxStream<'static, Result<Vec<Membership>, watcher::Error>>;

impl Source {
    /// The source as membership changes, one batch per watch event; the
    /// roster's rejected shards and completeness go to logs and metrics.
    fn changes(self, metrics: Metrics) -> Changes {
        match self {
            Source::Nodes(api) => {
                let mut adapter = NodeEvents::default();
                watcher(api, crate::watch::config())
                    .default_backoff()
                    .map(move |ev| ev.map(|ev| adapter.apply(ev).into_iter().collect()))
                    .boxed()
            }
            Source::Roster { api, name } => {
                let selector = shard::selector(&name);
                let mut view = RosterView::new(name);
                watcher(api, crate::watch::config().labels(&selector))
                    .default_backoff()
                    .map(move |ev| {
                        ev.map(|ev| {
                            let step = view.apply(ev);
                            for (name, e) in &step.rejected {
                                metrics.roster_rejected.inc();
                                tracing::warn!(shard = %name, error = %e, "roster shard rejected: pruning paused until it is valid again");
                            }
                            metrics.roster_shards.set(view.shards() as i64);
                            metrics.roster_complete.set(i64::from(view.is_complete()));
                            if let Some(complete) = step.complete {
                                tracing::info!(complete, shards = view.shards(), "roster completeness changed");
                            }
                            step.changes
                        })
                    })
                    .boxed()
            }
        }
    }
}

/// Follows `source` until `shutdown` flips, confirming every deletion
/// before it goes to the handlers, writing the snapshot at most once per
/// interval while dirty, and once more at the end. `handled` carries the
/// [`key`]s of deletions the handlers are done with.
pub async fn run(
    source: Source,
    pruner: Pruner,
    ctx: PruneContext,
    mut handled: mpsc::UnboundedReceiver<String>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut stream = source.changes(ctx.metrics.clone());
    let mut tick = tokio::time::interval(ctx.snapshot_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let confirmer = Confirmer::new(ctx.confirm, rand::random(), Instant::now());
    let mut state = State::new(pruner, confirmer);
    let mut in_flight: Option<BoxFuture<'static, (String, Lookup)>> = None;
    let mut own: Option<BoxFuture<'static, Option<NodeRecord>>> = Some(Box::pin(own_node(
        ctx.nodes.clone(),
        state.own().to_string(),
    )));
    // Born at 0: a first conflict is an increase alerts can see.
    for f in Field::ALL {
        let _ = ctx
            .metrics
            .prune_confirmations
            .get_or_create(&ResultLabel { result: f.result() });
    }
    let mut conflicted = 0;
    loop {
        let due = state.next_due();
        let wake = tokio::time::Instant::from_std(
            due.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600)),
        );
        let event = tokio::select! {
            ev = stream.next() => match ev {
                Some(Ok(changes)) => Event::Changed(changes),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "watch failed, retrying");
                    continue;
                }
                None => break,
            },
            (key, result) = async {
                match in_flight.as_mut() {
                    Some(f) => f.await,
                    None => std::future::pending().await,
                }
            }, if in_flight.is_some() => {
                in_flight = None;
                Event::Looked { key, result }
            }
            r = async {
                match own.as_mut() {
                    Some(f) => f.await,
                    None => std::future::pending().await,
                }
            }, if own.is_some() => {
                own = None;
                match r {
                    Some(r) => Event::OwnNode(r),
                    None => continue,
                }
            }
            _ = tokio::time::sleep_until(wake), if due.is_some() => Event::Due,
            Some(k) = handled.recv() => Event::Handled(k),
            _ = tick.tick() => Event::Tick,
            _ = stopped(&mut shutdown) => break,
        };
        for action in state.on(event, Instant::now()) {
            match action {
                Action::Lookup(r) => {
                    let nodes = ctx.nodes.clone();
                    in_flight = Some(Box::pin(async move {
                        let k = key(&r);
                        let result = lookup(nodes, r.name).await;
                        (k, result)
                    }));
                }
                Action::Dispatch(d) => {
                    let _ = ctx.deletions.send(d);
                }
                Action::WriteSnapshot => write_snapshot(&state, &ctx).await,
                Action::Listed => ctx.listed.store(true, Ordering::SeqCst),
                Action::CountHold => {
                    ctx.metrics.prune_holds.inc();
                }
                Action::CountConfirmation(result) => {
                    ctx.metrics
                        .prune_confirmations
                        .get_or_create(&ResultLabel { result })
                        .inc();
                }
                Action::CountRefused(n) => {
                    ctx.metrics.prune_refused.inc_by(n);
                }
            }
        }
        ctx.metrics.nodes_known.set(state.len() as i64);
        ctx.metrics.prune_pending.set(state.pending() as i64);
        ctx.metrics.prune_held.set(state.held() as i64);
        if state.conflicted() != conflicted {
            conflicted = state.conflicted();
            tracing::info!(
                held = conflicted,
                "deletions held for a conflict with a live node"
            );
        }
    }
    for action in state.on(Event::Stop, Instant::now()) {
        if action == Action::WriteSnapshot {
            write_snapshot(&state, &ctx).await;
        }
    }
}

/// Encodes and writes the live set; failures are logged and counted (the
/// next tick retries, as the state stays in memory).
async fn write_snapshot(state: &State, ctx: &PruneContext) {
    let start = Instant::now();
    let bytes = match snapshot::encode(state.records()) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode snapshot");
            return;
        }
    };
    let len = bytes.len();
    let dir = ctx.state_dir.clone();
    let res = tokio::task::spawn_blocking(move || snapshot::write_atomic(&dir, &bytes)).await;
    match res {
        Ok(Ok(())) => {
            ctx.metrics
                .snapshot_write_seconds
                .observe(start.elapsed().as_secs_f64());
            ctx.metrics
                .snapshot_nodes
                .set((state.len() + state.unhandled()) as i64);
            ctx.metrics.snapshot_bytes.set(len as i64);
            tracing::debug!(
                nodes = state.len(),
                unhandled = state.unhandled(),
                bytes = len,
                "snapshot written"
            );
        }
        Ok(Err(e)) => {
            ctx.metrics.snapshot_write_failures.inc();
            tracing::error!(error = %e, dir = %ctx.state_dir.display(), "cannot write snapshot");
        }
        Err(e) => {
            ctx.metrics.snapshot_write_failures.inc();
            tracing::error!(error = %e, "snapshot writer task failed");
        }
    }
}
