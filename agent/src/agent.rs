//! Wires everything together: snapshot first, then the API client, admin
//! port, pruner and gate; on shutdown the re-taint and the last snapshot.
//! [`run_with_handlers`] reads as that list, one step per function.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use nodegate_roster::record::NodeRecord;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::{Args, ConfigError, PruneSource};
use crate::gate_loop::Gate;
use crate::handler::{CommandHandler, Dispatcher, NodeDeleteHandler};
use crate::metrics::Metrics;
use crate::node_writer::NodeWriter;
use crate::probe::{self, Probe, ProbeSpec};
use crate::prune::Pruner;
use crate::prune_loop::{self, PruneContext};
use crate::removal_check::RemovalCheck;
use crate::snapshot::{self, Loaded};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration")]
    Config(#[from] ConfigError),
    #[error("cannot read the snapshot in {dir}")]
    Snapshot { dir: String, source: std::io::Error },
    #[error("no Kubernetes credentials (in-cluster or KUBECONFIG)")]
    Client(#[from] kube::Error),
    #[error("cannot bind the admin address {addr}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// Runs the agent until `shutdown` resolves, then re-taints (if enabled;
/// with `--daemonset`, a removal of nodegate opens the node instead) and
/// writes the last snapshot within `--shutdown-deadline`. Credentials come
/// from the pod's service account or KUBECONFIG.
pub async fn run(args: Args, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    args.validate()?;
    let client = Client::try_default().await?;
    run_with_client(args, client, shutdown).await
}

/// [`run`] with a given client (simulators run many agents in one process).
pub async fn run_with_client(
    args: Args,
    client: Client,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    run_with_handlers(args, client, Vec::new(), shutdown).await
}

/// [`run_with_client`] with in-process deletion handlers next to
/// `--on-node-delete`, so an embedding simulator can see every dispatched
/// deletion and its source without spawning commands.
pub async fn run_with_handlers(
    args: Args,
    client: Client,
    extra_handlers: Vec<Arc<dyn NodeDeleteHandler>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let started = Instant::now();
    args.validate()?;
    let metrics = Metrics::default();
    let handlers = deletion_handlers(&args, extra_handlers);
    // Opt-in: without a handler nobody acts on a deletion, so the agent
    // pays for no watch and keeps no snapshot.
    let prune = !handlers.is_empty();
    if !prune {
        tracing::info!("no deletion handler configured: readiness gate only, no pruning");
    }
    // Read the snapshot before anything could overwrite it.
    let known = if prune {
        load_snapshot(&args, &metrics)?
    } else {
        Vec::new()
    };
    let (stop, stopped) = watch::channel(false);
    // Without pruning there is no node list to wait for.
    let listed = Arc::new(AtomicBool::new(!prune));
    let admin = spawn_admin(&args, &metrics, prune, listed.clone(), stopped.clone()).await?;
    let pruner = prune.then(|| {
        let (ctx, handled) = prune_context(&args, &client, handlers, &metrics, listed);
        spawn_pruner(&args, &client, known, ctx, handled, stopped.clone())
    });
    let gate = tokio::spawn(readiness_gate(&args, &client, &metrics, started)?.run(stopped));
    let jobs = Jobs {
        stop,
        admin,
        pruner,
        gate,
    };
    shutdown.await;
    jobs.stop(args.shutdown_deadline).await;
    Ok(())
}

/// The extra handlers, then `--on-node-delete`'s command if set.
fn deletion_handlers(
    args: &Args,
    mut handlers: Vec<Arc<dyn NodeDeleteHandler>>,
) -> Vec<Arc<dyn NodeDeleteHandler>> {
    if let Some(cmd) = &args.on_node_delete {
        handlers.push(Arc::new(CommandHandler {
            command: cmd.clone(),
            timeout: args.on_node_delete_timeout,
            retries: args.on_node_delete_retries,
        }));
    }
    handlers
}

/// The nodes known at the last stop; a missing or unusable snapshot is an
/// empty one (the latter moved aside and counted).
fn load_snapshot(args: &Args, metrics: &Metrics) -> Result<Vec<NodeRecord>, Error> {
    let loaded = snapshot::load(&args.state_dir).map_err(|source| Error::Snapshot {
        dir: args.state_dir.display().to_string(),
        source,
    })?;
    match &loaded {
        Loaded::Missing => {
            tracing::info!(dir = %args.state_dir.display(), "no snapshot: first start")
        }
        Loaded::Found(n) => tracing::info!(nodes = n.len(), "snapshot loaded"),
        Loaded::MovedAside { to, reason } => {
            metrics.snapshot_corrupt.inc();
            tracing::warn!(moved_to = %to.display(), %reason, "unusable snapshot moved aside; treating as empty");
        }
    }
    Ok(loaded.into_nodes())
}

/// Binds the admin port (health and metrics) and serves it until the stop;
/// why it may be reachable from every pod: [`Args::admin_address`].
async fn spawn_admin(
    args: &Args,
    metrics: &Metrics,
    prune: bool,
    listed: Arc<AtomicBool>,
    stopped: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, Error> {
    let registry =
        Arc::new(metrics.registry_for(prune && args.prune_source == PruneSource::Roster));
    let addr = args.admin_address();
    if addr.ip().is_unspecified() {
        tracing::warn!(%addr, "--admin-listen binds every address of the host; set POD_IP (--bind-address) to bind only the pod's");
    }
    let listener = nodegate_shared::admin::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let opts = nodegate_shared::admin::AdminOptions {
        max_connections: args.admin_max_connections as usize,
        ..Default::default()
    };
    Ok(tokio::spawn(nodegate_shared::admin::serve_with(
        listener,
        nodegate_shared::admin::router(
            registry,
            listed,
            "waiting for the first complete view of the nodes",
        ),
        stopped,
        opts,
    )))
}

/// What the pruning loop works with, and the keys of the deletions handled;
/// starts the dispatcher that runs the handlers for the deletions it sends.
fn prune_context(
    args: &Args,
    client: &Client,
    handlers: Vec<Arc<dyn NodeDeleteHandler>>,
    metrics: &Metrics,
    listed: Arc<AtomicBool>,
) -> (PruneContext, mpsc::UnboundedReceiver<String>) {
    let (deletions, rx) = mpsc::unbounded_channel();
    let (done, handled) = mpsc::unbounded_channel();
    tokio::spawn(Dispatcher::run(
        Dispatcher::new(handlers, metrics.clone()),
        rx,
        done,
    ));
    let ctx = PruneContext {
        state_dir: args.state_dir.clone(),
        snapshot_interval: args.snapshot_interval,
        metrics: metrics.clone(),
        listed,
        deletions,
        nodes: Api::all(client.clone()),
        confirm: args.confirm(),
    };
    (ctx, handled)
}

/// Follows `--prune-source` from the nodes `known` at the last stop.
fn spawn_pruner(
    args: &Args,
    client: &Client,
    known: Vec<NodeRecord>,
    ctx: PruneContext,
    handled: mpsc::UnboundedReceiver<String>,
    stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let source = match args.prune_source {
        PruneSource::Roster => {
            tracing::info!(namespace = %args.roster_namespace, "pruning from the node roster");
            prune_loop::Source::Roster {
                api: Api::namespaced(client.clone(), &args.roster_namespace),
                name: args.roster_name.clone(),
            }
        }
        PruneSource::Nodes => {
            tracing::info!("pruning from a watch on every Node");
            prune_loop::Source::Nodes(Api::all(client.clone()))
        }
    };
    tokio::spawn(prune_loop::run(
        source,
        Pruner::new(args.node_name.clone(), known),
        ctx,
        handled,
        stopped,
    ))
}

/// The readiness gate: the own Node's writer, the probes and the settings;
/// the writer holds the one taint set the gate's rules read too. With
/// `--daemonset`, the removal check its shutdown runs.
fn readiness_gate(
    args: &Args,
    client: &Client,
    metrics: &Metrics,
    started: Instant,
) -> Result<Gate, Error> {
    let writer = NodeWriter {
        api: Api::<Node>::all(client.clone()),
        name: args.node_name.clone(),
        taints: Arc::new(args.taint_set()),
        metrics: metrics.clone(),
    };
    let wake = Arc::new(Notify::new());
    let probes = probes(args, client, &wake)?;
    let removal = args.removal_target().map(|(namespace, daemonset)| {
        tracing::info!(%namespace, %daemonset, "on SIGTERM, a removal of nodegate opens the node instead of re-tainting it");
        RemovalCheck::new(client.clone(), namespace, daemonset, args.shutdown_deadline)
    });
    if removal.is_none()
        && args
            .daemonset
            .as_deref()
            .is_some_and(|d| !d.trim().is_empty())
    {
        tracing::warn!(
            "--daemonset without the pod's namespace (POD_NAMESPACE): no removal check, SIGTERM always re-taints"
        );
    }
    Ok(Gate {
        writer,
        gates: args.gate_infos()?,
        probes,
        wake,
        cfg: args.gate_config(),
        metrics: metrics.clone(),
        started,
        removal,
    })
}

/// Every configured probe, labelled by its index among its kind; file and
/// pod probes poke `wake` on changes.
fn probes(args: &Args, client: &Client, wake: &Arc<Notify>) -> Result<Vec<Probe>, ConfigError> {
    let gates = args.agent_gates()?;
    let specs: Vec<ProbeSpec> = gates.iter().flat_map(|g| g.probes.clone()).collect();
    let gate_of = gates
        .iter()
        .enumerate()
        .flat_map(|(i, g)| probe::indexes(&g.probes).into_iter().map(move |n| (i, n)));
    let probes: Vec<Probe> = probe::indexes(&specs)
        .into_iter()
        .zip(gate_of)
        .zip(specs)
        .map(|((index, (gate, in_gate)), s)| {
            let mut p = Probe::new(s, Some(client), &args.node_name, wake.clone());
            p.index = index;
            p.gate = gate;
            p.in_gate = in_gate;
            p
        })
        .collect();
    for g in gates.iter().filter(|g| g.probes.is_empty()) {
        tracing::warn!(gate = %g.name, "no probes configured: the gate opens at once");
    }
    Ok(probes)
}

/// The running jobs and the signal that stops them.
struct Jobs {
    stop: watch::Sender<bool>,
    admin: JoinHandle<()>,
    pruner: Option<JoinHandle<()>>,
    gate: JoinHandle<()>,
}

impl Jobs {
    /// Signals the stop, then waits for the gate's re-taint (if enabled) and
    /// the pruner's last snapshot, side by side, and the admin port, all
    /// within `within`.
    async fn stop(self, within: Duration) {
        let deadline = Instant::now() + within;
        tracing::info!(deadline = ?within, "shutting down");
        let _ = self.stop.send(true);
        let gate_done = async {
            let _ = self.gate.await;
        };
        let last_snapshot = async {
            if let Some(t) = self.pruner {
                let _ = t.await;
            }
        };
        if tokio::time::timeout_at(deadline, futures::future::join(gate_done, last_snapshot))
            .await
            .is_err()
        {
            tracing::error!("shutdown deadline reached before re-taint and snapshot finished");
        }
        let _ = tokio::time::timeout_at(deadline, self.admin).await;
    }
}
