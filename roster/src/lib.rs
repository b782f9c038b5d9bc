//! The node roster: what pruning agents need to know about every Node
//! (name, uid, addresses, podCIDRs, providerID), in a few ConfigMaps that
//! change only when a node joins, leaves or changes those fields.
//!
//! - [`record`]: the slim Node and the record kept per node;
//! - [`shard`]: the ConfigMap format and its completeness rule;
//! - [`view`]: a reader's (agent's) assembly of shards into membership changes;
//! - [`publisher`]: the Node watch and shard writer; [`lease`]: who writes;
//! - [`run`]: the `nodegate-roster` process.

pub mod config;
pub mod lease;
pub mod metrics;
pub mod publisher;
pub mod record;
pub mod shard;
pub mod view;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use tokio::sync::watch;

pub use config::Args;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration")]
    Config(#[from] config::ConfigError),
    #[error("no Kubernetes credentials (in-cluster or KUBECONFIG)")]
    Client(#[from] kube::Error),
    #[error("cannot bind the admin address {addr}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// Runs the publisher until `shutdown` resolves; credentials from the pod's
/// service account or KUBECONFIG.
pub async fn run(args: Args, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    args.validate()?;
    let client = Client::try_default().await?;
    run_with_client(args, client, shutdown).await
}

/// [`run`] with a given client (the simulator runs the publisher in-process).
pub async fn run_with_client(
    args: Args,
    client: Client,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    args.validate()?;
    let metrics = metrics::Metrics::default();
    let ready = Arc::new(AtomicBool::new(false));
    let registry = Arc::new(metrics.registry());
    let listener = nodegate_shared::admin::bind(args.admin_listen)
        .await
        .map_err(|source| Error::Bind {
            addr: args.admin_listen,
            source,
        })?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let admin = tokio::spawn(nodegate_shared::admin::serve(
        listener,
        nodegate_shared::admin::router(
            registry,
            ready.clone(),
            "waiting for the first list of nodes and shards",
        ),
        stop_rx.clone(),
    ));
    let (leader_tx, leader_rx) = watch::channel(false);
    let identity = args.identity();
    tracing::info!(%identity, namespace = %args.namespace, shards = args.shards, "starting roster publisher");
    let election = tokio::spawn(lease::run(
        Api::<Lease>::namespaced(client.clone(), &args.namespace),
        lease::LeaseConfig {
            name: args.name.clone(),
            identity,
            lease_duration: args.lease_duration,
            renew_deadline: args.renew_deadline,
            retry_period: args.retry_period,
        },
        leader_tx,
        stop_rx.clone(),
    ));
    let publisher = publisher::Publisher {
        nodes: Api::all(client.clone()),
        shards: Api::<ConfigMap>::namespaced(client, &args.namespace),
        namespace: args.namespace.clone(),
        name: args.name.clone(),
        count: args.shards,
        interval: args.interval,
        metrics,
        ready,
    };
    let publish = tokio::spawn(publisher.run(leader_rx, stop_rx));
    shutdown.await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    // The publisher stops first (no write after the lease is released).
    let _ = publish.await;
    let _ = election.await;
    let _ = admin.await;
    Ok(())
}
