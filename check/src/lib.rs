//! `nodegate-check`: after an install (and in CI against `nodegate-sim
//! serve`), prove with the current kubeconfig that the API server really
//! calls nodegate's webhook on a Node create and gets the taint back.
//!
//! The decisive check is a server-side dry-run create of a canary Node: it
//! goes through the real admission chain (matchConditions, caBundle, the
//! webhook) and stores nothing. The other checks explain a failure: a
//! matchCondition that errors on a CREATE, a caBundle that does not verify
//! the serving certificate, a Service or Deployment that is not there.
//!
//! - [`admission_policy`]: the MutatingAdmissionPolicy, when installed (then
//!   the webhook needs only its `nodes/status` rule and the canary comes back
//!   without a warning: policies cannot return one);
//! - [`webhook_config`]: the MutatingWebhookConfiguration and its conditions;
//! - [`serving`]: the caBundle against the serving certificate;
//! - [`canary`]: the dry-run create;
//! - [`workloads`]: Service, webhook Deployment, agent DaemonSet, taints;
//! - [`confinement`]: the agent's and webhook's credentials are confined (a
//!   dry-run of a forbidden change as the agent is refused);
//! - [`strict_mode`]: strict mode's boot gate is off, or on and the same in
//!   the webhook, the agent and the policies generated for them.

pub mod admission_policy;
pub mod canary;
pub mod confinement;
pub mod report;
pub mod serving;
pub mod strict_mode;
pub mod webhook_config;
pub mod workloads;

use clap::Parser;
use kube::Client;
use nodegate_shared::TaintSpec;

pub use report::{Report, Status};

/// Checks an installation of nodegate with the current kubeconfig; exits 1
/// if any check fails.
#[derive(Debug, Clone, Parser)]
#[command(name = "nodegate-check", version, about)]
pub struct Args {
    /// Taints the webhook must add (repeatable, `key[=value]:Effect`).
    /// Default: the `--taint` args of the webhook Deployment, else nodegate's default.
    #[arg(long = "taint", env = "NODEGATE_TAINTS", value_delimiter = ',')]
    pub taints: Vec<TaintSpec>,
    /// Namespace of the webhook's Service, Deployment, Secret and the agent DaemonSet.
    #[arg(long, env = "NODEGATE_CHECK_NAMESPACE", default_value = "nodegate")]
    pub namespace: String,
    /// Name of the MutatingWebhookConfiguration.
    #[arg(
        long,
        env = "NODEGATE_CHECK_WEBHOOK_CONFIG",
        default_value = "nodegate"
    )]
    pub webhook_config: String,
    /// Name of the MutatingAdmissionPolicy of the admission-policy install;
    /// when it exists, it must admit Node creates and updates.
    #[arg(long, env = "NODEGATE_CHECK_POLICY", default_value = "nodegate")]
    pub policy: String,
    /// Name of the webhook entry in it.
    #[arg(
        long,
        env = "NODEGATE_CHECK_WEBHOOK",
        default_value = "nodes.nodegate.dev"
    )]
    pub webhook: String,
    /// The webhook Deployment.
    #[arg(
        long,
        env = "NODEGATE_CHECK_DEPLOYMENT",
        default_value = "nodegate-webhook"
    )]
    pub deployment: String,
    /// The agent DaemonSet.
    #[arg(
        long,
        env = "NODEGATE_CHECK_DAEMONSET",
        default_value = "nodegate-agent"
    )]
    pub daemonset: String,
    /// The Secret holding the serving certificate (`tls.crt`).
    #[arg(
        long,
        env = "NODEGATE_CHECK_TLS_SECRET",
        default_value = "nodegate-webhook-tls"
    )]
    pub tls_secret: String,
    /// Also verify the certificate the webhook presents at HOST:PORT (e.g.
    /// after `kubectl -n nodegate port-forward deploy/nodegate-webhook 9443`).
    #[arg(long, env = "NODEGATE_CHECK_WEBHOOK_ADDRESS")]
    pub webhook_address: Option<String>,
}

/// Runs every check; never panics, never returns early without a line
/// saying why.
pub async fn run(args: &Args) -> Report {
    let mut report = Report::default();
    let config = match kube::Config::infer().await {
        Ok(c) => c,
        Err(e) => {
            report.add(
                "cluster access",
                Status::Fail,
                format!("no usable kubeconfig or in-cluster credentials: {e}"),
            );
            return report;
        }
    };
    let client = match Client::try_from(config.clone()) {
        Ok(c) => c,
        Err(e) => {
            report.add("cluster access", Status::Fail, format!("client: {e}"));
            return report;
        }
    };
    run_with_client(args, client, Some(&config), &mut report).await;
    report
}

/// [`run`] with a given client (tests, embedding); `config` (the client's)
/// lets the confinement check impersonate the agent.
pub async fn run_with_client(
    args: &Args,
    client: Client,
    config: Option<&kube::Config>,
    report: &mut Report,
) {
    let policy = admission_policy::check(&client, args, report).await;
    let hook = webhook_config::check(&client, args, policy.is_some(), report).await;
    let svc_ok = match &hook {
        Some(h) => workloads::check_service(&client, h, report).await,
        None => false,
    };
    let cert_ok = match &hook {
        Some(h) => serving::check(&client, args, h, report).await,
        None => false,
    };
    let deploy = workloads::check_deployment(&client, args, report).await;
    workloads::check_daemonset(&client, args, report).await;
    let taints = if args.taints.is_empty() {
        deploy.taints.clone()
    } else {
        args.taints.clone()
    };
    let canary = canary::check(&client, &taints, policy.is_none(), report).await;
    if canary == canary::Outcome::Missing {
        // Say why, from what the other checks found.
        let mut why = Vec::new();
        if policy == Some(false) {
            why.push(
                "the admission policy is unbound or its conditions do not apply (see above)".into(),
            );
        } else if policy.is_some() {
            why.push("the admission policy applied but did not add it: was it generated with the --taint flags checked here?".into());
        } else if let Some(h) = &hook {
            why.extend(h.create_condition_errors.iter().map(|e| {
                format!(
                    "matchCondition {e} on a Node CREATE: with failurePolicy {} the API server {}",
                    h.failure_policy,
                    if h.failure_policy == "Ignore" {
                        "skips the webhook silently"
                    } else {
                        "refuses the create"
                    }
                )
            }));
        } else {
            why.push("the MutatingWebhookConfiguration is missing or unreadable".into());
        }
        if hook.is_some() && !cert_ok {
            why.push(
                "the API server cannot verify the webhook's certificate with the caBundle".into(),
            );
        }
        if hook.is_some() && !svc_ok {
            why.push("the webhook's Service is missing or lacks the port".into());
        }
        if deploy.available == Some(0) {
            why.push("the webhook Deployment has no available replica (webhook down)".into());
        }
        if why.is_empty() && policy.is_none() {
            why.push("the webhook was called but did not add it: are the webhook's --taint flags the ones checked here?".into());
        }
        report.add("diagnosis", Status::Fail, why.join("; "));
    }
    webhook_config::check_apiserver_metrics(&client, args, report).await;
    confinement::check(&client, config, args, report).await;
    strict_mode::check(&client, args, report).await;
}
