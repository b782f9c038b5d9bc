//! Wires everything together: snapshot first, then the API client, admin
//! port, pruner and gate; on shutdown the re-taint and the last snapshot.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

use crate::config::{Args, ConfigError, PruneSource};
use crate::gate::GateConfig;
use crate::gate_loop::Gate;
use crate::handler;
use crate::handler::{CommandHandler, Dispatcher, NodeDeleteHandler};
use crate::metrics::Metrics;
use crate::node_writer::NodeWriter;
use crate::probe::Probe;
use crate::prune::Pruner;
use crate::prune_loop::{self, PruneContext};
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

/// Runs the agent until `shutdown` resolves, then re-taints (if enabled) and
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
    // Opt-in: without a handler nobody acts on a deletion, so the agent
    // pays for no watch and keeps no snapshot.
    let prune = args.on_node_delete.is_some() || !extra_handlers.is_empty();
    if !prune {
        tracing::info!("no deletion handler configured: readiness gate only, no pruning");
    }

    // Read the snapshot before anything could overwrite it.
    let snapshot_nodes = if prune {
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
        loaded.into_nodes()
    } else {
        Vec::new()
    };

    let (stop_tx, stop_rx) = watch::channel(false);

    let listed = Arc::new(AtomicBool::new(!prune));
    let registry =
        Arc::new(metrics.registry_for(prune && args.prune_source == PruneSource::Roster));
    let admin_addr = args.admin_address();
    if admin_addr.ip().is_unspecified() {
        tracing::warn!(addr = %admin_addr, "--admin-listen binds every address of the host; set POD_IP (--bind-address) to bind only the pod's");
    }
    let listener = nodegate_shared::admin::bind(admin_addr)
        .await
        .map_err(|source| Error::Bind {
            addr: admin_addr,
            source,
        })?;
    let admin_task = tokio::spawn(nodegate_shared::admin::serve(
        listener,
        nodegate_shared::admin::router(
            registry,
            listed.clone(),
            "waiting for the first complete view of the nodes",
        ),
        stop_rx.clone(),
    ));

    let prune_task = if prune {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut handlers = extra_handlers;
        if let Some(cmd) = &args.on_node_delete {
            handlers.push(Arc::new(CommandHandler {
                command: cmd.clone(),
                timeout: args.on_node_delete_timeout,
                retries: args.on_node_delete_retries,
            }));
        }
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        tokio::spawn(handler::Dispatcher::run(
            Dispatcher::new(handlers, metrics.clone()),
            rx,
            done_tx,
        ));
        let ctx = PruneContext {
            state_dir: args.state_dir.clone(),
            snapshot_interval: args.snapshot_interval,
            metrics: metrics.clone(),
            listed,
            deletions: tx,
            nodes: Api::all(client.clone()),
            confirm: args.confirm(),
        };
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
        Some(tokio::spawn(prune_loop::run(
            source,
            Pruner::new(args.node_name.clone(), snapshot_nodes),
            ctx,
            done_rx,
            stop_rx.clone(),
        )))
    } else {
        None
    };

    let writer = NodeWriter {
        api: Api::<Node>::all(client.clone()),
        name: args.node_name.clone(),
        specs: args
            .taints
            .iter()
            .chain(&args.boot_taints)
            .cloned()
            .collect(),
        boot_specs: args.boot_taints.clone(),
        release: args.release_taints.clone(),
        metrics: metrics.clone(),
    };
    let wake = Arc::new(Notify::new());
    let specs = args.probe_specs()?;
    let probes: Vec<Probe> = crate::probe::indexes(&specs)
        .into_iter()
        .zip(specs)
        .map(|(index, s)| {
            let mut p = Probe::new(s, Some(&client), &args.node_name, wake.clone());
            p.index = index;
            p
        })
        .collect();
    if probes.is_empty() {
        tracing::warn!("no probes configured: the node counts as ready at once");
    }
    let gate = Gate {
        writer,
        probes,
        wake,
        cfg: GateConfig {
            period: args.probe_period,
            pending_period: args.pending_probe_period,
            release: args.release_taints.clone(),
            timeout: args.probe_timeout,
            thresholds: args.thresholds(),
            continuous: args.continuous,
            taint_on_shutdown: args.taint_on_shutdown.then_some(args.shutdown_deadline),
        },
        metrics: metrics.clone(),
        started,
    };
    let gate_task = tokio::spawn(gate.run(stop_rx));

    shutdown.await;
    let deadline = Instant::now() + args.shutdown_deadline;
    tracing::info!(deadline = ?args.shutdown_deadline, "shutting down");
    let _ = stop_tx.send(true);
    // The gate re-taints (if enabled) as it stops, while the pruner writes
    // its last snapshot.
    let gate_done = async {
        let _ = gate_task.await;
    };
    let last_snapshot = async {
        if let Some(t) = prune_task {
            let _ = t.await;
        }
    };
    if tokio::time::timeout_at(deadline, futures::future::join(gate_done, last_snapshot))
        .await
        .is_err()
    {
        tracing::error!("shutdown deadline reached before re-taint and snapshot finished");
    }
    let _ = tokio::time::timeout_at(deadline, admin_task).await;
    Ok(())
}
