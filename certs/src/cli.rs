//! The in-cluster subcommands' flags, and the runtime around them (the
//! `nodegate-certs` binary stays a thin dispatcher).

use std::time::Duration;

use anyhow::Context;
use nodegate_shared::duration;
use tracing_subscriber::EnvFilter;

use crate::controller::{self, Certificates};
use crate::uninstall;

/// `nodegate-certs controller`.
#[derive(Debug, clap::Args)]
pub struct ControllerArgs {
    /// The install's namespace (the Pod's own, from the downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "nodegate")]
    pub namespace: String,
    /// The Secret holding the CA's certificate and key; no Pod mounts it.
    #[arg(
        long,
        env = "NODEGATE_CERTS_CA_SECRET",
        default_value = "nodegate-webhook-ca"
    )]
    pub ca_secret: String,
    /// The Secret the webhook's replicas serve from (`tls.crt`, `tls.key`).
    #[arg(
        long,
        env = "NODEGATE_CERTS_TLS_SECRET",
        default_value = "nodegate-webhook-tls"
    )]
    pub tls_secret: String,
    /// The Secret holding the path token (key `token`).
    #[arg(
        long,
        env = "NODEGATE_CERTS_TOKEN_SECRET",
        default_value = "nodegate-webhook-path"
    )]
    pub token_secret: String,
    /// The webhook's StatefulSet: the lines call the token once all its
    /// replicas are ready.
    #[arg(
        long,
        env = "NODEGATE_CERTS_STATEFULSET",
        default_value = "nodegate-webhook"
    )]
    pub statefulset: String,
    /// The MutatingWebhookConfiguration whose lines it keeps.
    #[arg(
        long,
        env = "NODEGATE_CERTS_WEBHOOK_CONFIG",
        default_value = "nodegate"
    )]
    pub webhook_config: String,
    /// `own`: this controller's CA. `external`: cert-manager's (only the
    /// token and the paths are kept here).
    #[arg(
        long,
        env = "NODEGATE_CERTS_CERTIFICATES",
        value_enum,
        default_value = "own"
    )]
    pub certificates: Certificates,
    /// The CA's validity; it is replaced with a third of it left.
    #[arg(long, env = "NODEGATE_CERTS_CA_DAYS", default_value_t = 3650)]
    pub ca_days: u32,
    /// The serving certificate's validity; renewed with a third of it left.
    #[arg(long, env = "NODEGATE_CERTS_SERVING_DAYS", default_value_t = 90)]
    pub serving_days: u32,
    /// How often everything is read again once in place.
    #[arg(long, env = "NODEGATE_CERTS_RESYNC", default_value = "1m", value_parser = duration::parse)]
    pub resync: Duration,
    /// How long after a failed round the next one starts.
    #[arg(long, env = "NODEGATE_CERTS_RETRY", default_value = "5s", value_parser = duration::parse)]
    pub retry: Duration,
}

/// `nodegate-certs uninstall`.
#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    /// The install's namespace (the Pod's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "nodegate")]
    pub namespace: String,
    /// A taint key nodegate may have put on nodes (repeatable); by default
    /// every key nodegate ships: the default and the key profiles'.
    #[arg(long = "gate-key", env = "NODEGATE_GATE_KEYS", value_delimiter = ',')]
    pub gate_keys: Vec<String>,
    #[arg(long, default_value = "nodegate-agent")]
    pub agent_daemonset: String,
    #[arg(long, default_value = "app.kubernetes.io/name=nodegate-agent")]
    pub agent_selector: String,
    #[arg(long, default_value = "nodegate")]
    pub webhook_config: String,
    /// The removal's own ClusterRole and ClusterRoleBinding.
    #[arg(long, default_value = "nodegate-uninstall")]
    pub own_name: String,
    /// How long the agents' Pods may take to stop.
    #[arg(long, default_value = "60s", value_parser = duration::parse)]
    pub agents_timeout: Duration,
    /// The certificates controller's Deployment (deleted before its Secrets).
    #[arg(long, default_value = "nodegate-certs")]
    pub certs_deployment: String,
    /// A Secret the controller made (repeatable): the CA, the serving
    /// certificate and the path token, which neither Helm nor kustomize
    /// deletes.
    #[arg(
        long = "secret",
        value_delimiter = ',',
        default_value = "nodegate-webhook-ca,nodegate-webhook-tls,nodegate-webhook-path"
    )]
    pub secrets: Vec<String>,
    /// `helm test`'s Pod.
    #[arg(long, default_value = "nodegate-check")]
    pub test_pod: String,
}

/// The keys of every taint nodegate ships.
pub fn shipped_gate_keys() -> Vec<String> {
    let mut keys: Vec<String> = nodegate_shared::keys::PROFILE_TAINTS
        .iter()
        .map(|t| t.split(['=', ':']).next().unwrap_or(t).to_owned())
        .collect();
    keys.dedup();
    keys
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    // One TLS provider for the API client, whatever features other crates
    // of a build turn on.
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

pub fn controller(a: ControllerArgs) -> anyhow::Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        let shutdown = nodegate_shared::signal::shutdown();
        let client = kube::Client::try_default().await.context("an API client")?;
        let o = controller::Options {
            namespace: a.namespace,
            ca_secret: a.ca_secret,
            tls_secret: a.tls_secret,
            token_secret: a.token_secret,
            statefulset: a.statefulset,
            webhook_config: a.webhook_config,
            certificates: a.certificates,
            ca_days: a.ca_days,
            serving_days: a.serving_days,
        };
        tracing::info!(namespace = %o.namespace, certificates = ?o.certificates, "keeping the webhook's certificates, token and lines");
        controller::run(client, o, a.resync, a.retry, shutdown).await;
        Ok(())
    })
}

pub fn uninstall(a: UninstallArgs) -> anyhow::Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        let client = kube::Client::try_default().await.context("an API client")?;
        let o = uninstall::Options {
            namespace: a.namespace,
            gate_keys: if a.gate_keys.is_empty() { shipped_gate_keys() } else { a.gate_keys },
            agent_daemonset: a.agent_daemonset,
            agent_selector: a.agent_selector,
            webhook_config: a.webhook_config,
            own_name: a.own_name,
            agents_timeout: a.agents_timeout,
            certs_deployment: a.certs_deployment,
            secrets: a.secrets,
            test_pod: a.test_pod,
        };
        let left = uninstall::run(client, &o).await?;
        for l in &left {
            let (what, finish) = l.report();
            tracing::warn!(finish = %finish, "{what}");
        }
        if left.iter().any(uninstall::plan::Leftover::is_failure) {
            anyhow::bail!(
                "the removal left {} thing(s) behind; each line above names the command that finishes it",
                left.iter().filter(|l| l.is_failure()).count()
            );
        }
        tracing::info!("nodegate is removed: no node carries a gate, no admission object is left");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_removal_knows_every_shipped_key() {
        assert_eq!(
            super::shipped_gate_keys(),
            [
                "nodegate.dev/agent-not-ready",
                "startup-taint.cluster-autoscaler.kubernetes.io/nodegate-agent-not-ready",
                "readiness.k8s.io/nodegate-agent-not-ready"
            ]
        );
    }
}
