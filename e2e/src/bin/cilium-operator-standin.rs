//! cilium-operator-standin: the stand-in of cilium-operator's node-taint
//! controller (`nodegate_e2e::cilium_operator`). It reads the
//! `cilium-config` ConfigMap once at start, as the operator reads its
//! mounted copy, and runs until SIGTERM or SIGINT. Every write is one
//! `WRITE …` line on stdout; the rest goes to stderr.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use nodegate_e2e::cilium_operator::{Controller, Options, source};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Debug, Parser)]
#[command(about = "Stand-in of cilium-operator's node-taint controller")]
struct Args {
    /// Kubeconfig to use (in-cluster config or the default kubeconfig without it).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Namespace of the operator's ConfigMap (and, unless the config says
    /// otherwise, of the Cilium pods).
    #[arg(long, default_value = "kube-system")]
    config_namespace: String,
    /// Name of the operator's ConfigMap.
    #[arg(long, default_value = "cilium-config")]
    config_name: String,
}

async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    let cfg = match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .with_context(|| format!("reading {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(cfg)?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = client(args.kubeconfig.as_ref()).await?;
    let (config, found) =
        source::read_config(client.clone(), &args.config_namespace, &args.config_name).await?;
    if !found {
        eprintln!(
            "ConfigMap {}/{} not found: using the operator's own flag defaults",
            args.config_namespace, args.config_name
        );
    }
    let pod_namespace = config.resolve_pod_namespace(&args.config_namespace);
    eprintln!(
        "remove-cilium-node-taints={} set-cilium-node-taints={} set-cilium-is-up-condition={} \
         agent-not-ready-taint-key={} cilium pods: {pod_namespace} {:?} workers={}",
        config.remove_node_taints,
        config.set_node_taints,
        config.set_cilium_is_up_condition,
        config.taint_key,
        config.pod_labels,
        config.workers,
    );
    if !config.controller_enabled() {
        eprintln!(
            "neither remove-cilium-node-taints nor set-cilium-is-up-condition: the controller does not run (as upstream)"
        );
    }
    let controller = Controller::start(client, Options::new(config, pod_namespace));

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    let counts = controller.counts();
    controller.stop().await;
    eprintln!("stopped; writes: {counts:?}");
    Ok(())
}
