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
//! - [`installed`]: the webhook's and the agent's container, read once for
//!   the two checks below;
//! - [`strict_mode`]: strict mode's boot gate is off, or on and the same in
//!   the webhook, the agent and the policies generated for them;
//! - [`cilium`]: Cilium's operator and nodegate own different taint keys (or
//!   the operator leaves taints alone).

pub mod admission_policy;
pub mod canary;
pub mod cilium;
pub mod confinement;
pub mod container_flags;
pub mod installed;
pub mod report;
pub mod serving;
pub mod strict_mode;
pub mod webhook_config;
pub mod workloads;

use clap::Parser;
use kube::Client;
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::DEFAULT_TAINT;
use nodegate_shared::taint::check_taints;

use container_flags::Flags;
pub use report::{Report, Status};

/// Checks an installation of nodegate with the current kubeconfig; exits 1
/// if any check fails.
#[derive(Debug, Clone, Parser)]
#[command(name = "nodegate-check", version, about)]
pub struct Args {
    /// Taints the webhook must add (repeatable, `key[=value]:Effect`).
    /// Given this or `--boot-taint`, the canary expects what a webhook with
    /// these two flags adds (nodegate's default taint without `--taint`);
    /// with neither, what the webhook Deployment's flags add.
    #[arg(long = "taint", env = "NODEGATE_TAINTS", value_delimiter = ',')]
    pub taints: Vec<TaintSpec>,
    /// Strict mode's boot gate the webhook must add too (repeatable,
    /// `key[=value]:NoExecute`); see `--taint` for when the Deployment's is used.
    #[arg(
        long = "boot-taint",
        env = "NODEGATE_BOOT_TAINTS",
        value_delimiter = ','
    )]
    pub boot_taints: Vec<TaintSpec>,
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
    /// Namespace of Cilium's ConfigMap and agent pods (`k8s-app=cilium`).
    #[arg(
        long,
        env = "NODEGATE_CHECK_CILIUM_NAMESPACE",
        default_value = "kube-system"
    )]
    pub cilium_namespace: String,
    /// The ConfigMap Cilium's operator reads its options from: with the
    /// flags of the webhook and the agent, it tells whether the operator
    /// and nodegate manage taints with the same key.
    #[arg(
        long,
        env = "NODEGATE_CHECK_CILIUM_CONFIG",
        default_value = "cilium-config"
    )]
    pub cilium_config: String,
}

/// What the canary must come back with: nodegate-check's own flags as one
/// set, as the webhook reads them, else the webhook Deployment's. Mixing the
/// two would expect a configuration nothing runs. `None`: flags no webhook
/// runs with, so nothing to compare the canary with.
fn expected(args: &Args, deploy: &workloads::DeploymentInfo, report: &mut Report) -> Option<Flags> {
    if args.taints.is_empty() && args.boot_taints.is_empty() {
        return Some(deploy.flags.clone());
    }
    let mut taints = args.taints.clone();
    if taints.is_empty() {
        taints.extend(DEFAULT_TAINT.parse::<TaintSpec>().ok());
    }
    let want = Flags {
        taints,
        boot: args.boot_taints.clone(),
        release: Vec::new(),
    };
    if let Err(e) = check_taints(&want.taints, &want.boot) {
        report.add(
            "configured taints",
            Status::Fail,
            format!(
                "nodegate-check's --taint/--boot-taint: {e} (nodegate-webhook refuses them too)"
            ),
        );
        return None;
    }
    Some(want)
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
    let canary = match expected(args, &deploy, report) {
        Some(want) => canary::check(&client, &want, policy.is_none(), report).await,
        None => {
            report.add(
                canary::CHECK,
                Status::Skip,
                "nothing to expect of it: nodegate-check's taint flags are invalid (see above)",
            );
            canary::Outcome::Error
        }
    };
    if canary == canary::Outcome::Missing {
        // Say why, from what the other checks found.
        let mut why = Vec::new();
        if policy == Some(false) {
            why.push(
                "the admission policy is unbound or its conditions do not apply (see above)".into(),
            );
        } else if policy.is_some() {
            why.push("the admission policy applied but did not add it: was it generated with the --taint and --boot-taint flags checked here?".into());
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
            why.push("the webhook was called but did not add it: does the running webhook have the --taint and --boot-taint flags checked here (pods not restarted since the Deployment changed)?".into());
        }
        report.add("diagnosis", Status::Fail, why.join("; "));
    }
    webhook_config::check_apiserver_metrics(&client, args, report).await;
    confinement::check(&client, config, args, report).await;
    let installed = installed::read(&client, args).await;
    strict_mode::check(&client, args, &installed, report).await;
    cilium::check(&client, args, &installed, report).await;
}
