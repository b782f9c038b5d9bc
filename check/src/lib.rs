//! `nodegate-check`: after an install (and in CI against `nodegate-sim
//! serve`), prove with the current kubeconfig that the API server really
//! calls nodegate's webhook on a Node create and gets the taint back.
//!
//! The decisive check is a server-side dry-run create of a canary Node: it
//! goes through the real admission chain (matchConditions, caBundle, the
//! webhook) and stores nothing. The other checks explain a failure: a
//! matchCondition that errors on a CREATE, a caBundle that does not verify
//! the serving certificate, a Service or StatefulSet that is not there, a
//! line of admission whose replica does not answer.
//!
//! - [`admission_policy`]: the MutatingAdmissionPolicy, when installed (then
//!   the webhook needs only its `nodes/status` rule and the canary comes back
//!   without a warning: policies cannot return one);
//! - [`webhook_config`]: the MutatingWebhookConfiguration and its conditions;
//! - [`serving`]: each line's caBundle against the serving certificate;
//! - [`served_certs`]: each line's caBundle against what each of its
//!   replicas serves, dialled directly (the service proxy verifies nothing);
//! - [`canary`]: the dry-run create;
//! - [`lines`]: the first line and one backup line per replica, each
//!   replica called directly through the API server's service proxy;
//! - [`workloads`]: Service, webhook StatefulSet, agent DaemonSet, taints;
//! - [`confinement`]: the agent's and webhook's credentials are confined (a
//!   dry-run of a forbidden change as the agent is refused);
//! - [`installed`]: the webhook's and the agent's container, read once for
//!   the two checks below;
//! - [`strict_mode`]: strict mode's boot gate is off, or on and the same in
//!   the webhook, the agent and the policies generated for them;
//! - [`path_token`]: only the API server's reviews may make the webhook
//!   write a Node (its lines call `/mutate/<token>`);
//! - [`cilium`]: Cilium's operator and nodegate own different taint keys (or
//!   the operator leaves taints alone);
//! - [`released`]: which nodes still carry a taint the agent releases (a
//!   change of key), whether any is stale, and when the flag can go;
//! - [`karpenter`], [`cluster_autoscaler`]: the autoscalers wait for
//!   nodegate's gates ([`gates`]) instead of launching duplicate nodes.

pub mod admission_policy;
pub mod canary;
pub mod cilium;
pub mod cluster_autoscaler;
pub mod confinement;
pub mod container_flags;
pub mod gates;
pub mod installed;
pub mod karpenter;
pub mod lines;
pub mod namespace;
pub mod path_token;
pub mod released;
pub mod report;
pub mod served_certs;
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
    /// with neither, what the webhook StatefulSet's flags add.
    #[arg(long = "taint", env = "NODEGATE_TAINTS", value_delimiter = ',')]
    pub taints: Vec<TaintSpec>,
    /// Strict mode's boot gate the webhook must add too (repeatable,
    /// `key[=value]:NoExecute`); see `--taint` for when the StatefulSet's is used.
    #[arg(
        long = "boot-taint",
        env = "NODEGATE_BOOT_TAINTS",
        value_delimiter = ','
    )]
    pub boot_taints: Vec<TaintSpec>,
    /// Namespace of the webhook's Services, StatefulSet, Secret and the agent DaemonSet.
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
    /// Name of the first line's webhook entry in it (the backup lines are
    /// the entries after it).
    #[arg(
        long,
        env = "NODEGATE_CHECK_WEBHOOK",
        default_value = "nodes.nodegate.dev"
    )]
    pub webhook: String,
    /// The webhook StatefulSet [default: nodegate-webhook]; replica `i` is
    /// the Pod `<name>-<i>`. Without one, a Deployment of that name (an
    /// install from before the per-replica lines) is read instead.
    #[arg(long, env = "NODEGATE_CHECK_STATEFULSET")]
    pub statefulset: Option<String>,
    /// The former name of `--statefulset`, still read when it is not given.
    #[arg(long, env = "NODEGATE_CHECK_DEPLOYMENT", hide = true)]
    pub deployment: Option<String>,
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
    /// after `kubectl -n nodegate port-forward sts/nodegate-webhook 9443`).
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
    /// Karpenter's release (e.g. 1.13.0), when its controller's image tag
    /// does not tell it: from 1.13.0 it knows keys under `readiness.k8s.io/`.
    #[arg(long, env = "NODEGATE_CHECK_KARPENTER_VERSION")]
    pub karpenter_version: Option<String>,
    /// Cluster Autoscaler's status ConfigMap (`namespace/name`): present
    /// without a CA Deployment, it means a managed CA, whose flags cannot
    /// be set.
    #[arg(
        long,
        env = "NODEGATE_CHECK_CLUSTER_AUTOSCALER_STATUS",
        default_value = "kube-system/cluster-autoscaler-status"
    )]
    pub cluster_autoscaler_status: String,
    #[command(flatten)]
    pub served_certs: served_certs::Args,
}

impl Args {
    /// The webhook's StatefulSet (or older Deployment): `--statefulset`,
    /// else `--deployment`, else `nodegate-webhook`.
    pub fn webhook_workload(&self) -> &str {
        self.statefulset
            .as_deref()
            .or(self.deployment.as_deref())
            .unwrap_or("nodegate-webhook")
    }
}

/// What the canary and every line must come back with: nodegate-check's own
/// flags as one set, as the webhook reads them, else the webhook
/// StatefulSet's. Mixing the two would expect a configuration nothing runs.
/// `None`: flags no webhook runs with, so nothing to compare the canary with.
fn expected(args: &Args, webhook: &workloads::WebhookInfo, report: &mut Report) -> Option<Flags> {
    if args.taints.is_empty() && args.boot_taints.is_empty() {
        return Some(webhook.flags.clone());
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

/// A client for the service proxy: kube retries a 503 with backoff for
/// minutes, and a 503 ("no endpoints available", "error trying to reach
/// service") is what a line's check must report at once.
fn without_retries(client: &Client, config: Option<&kube::Config>) -> Client {
    config
        .and_then(|c| {
            let mut c = c.clone();
            c.default_retry = false;
            Client::try_from(c).ok()
        })
        .unwrap_or_else(|| client.clone())
}

/// [`run`] with a given client (tests, embedding); `config` (the client's)
/// lets the confinement check impersonate the agent and the line checks
/// skip kube's retries.
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
    let webhook = workloads::check_webhook(&client, args, report).await;
    let want = expected(args, &webhook, report);
    let backups = match &hook {
        Some(h) => lines::check(&client, h, webhook.workload.as_ref(), want.as_ref(), report).await,
        None => lines::Backups::default(),
    };
    let cert_ok = match &hook {
        Some(h) => serving::check(&client, args, h, report).await,
        None => false,
    };
    if let Some(h) = &hook {
        served_certs::check(&client, h, &args.served_certs, report).await;
    }
    workloads::check_daemonset(&client, args, report).await;
    let canary = match &want {
        Some(want) => canary::check(&client, want, policy.is_none(), report).await,
        None => {
            report.add(
                canary::CHECK,
                Status::Skip,
                "nothing to expect of it: nodegate-check's taint flags are invalid (see above)",
            );
            canary::Outcome::Error
        }
    };
    let answers = match &hook {
        Some(h) => {
            let proxy = without_retries(&client, config);
            let answers = lines::check_answers(&proxy, h, want.as_ref(), report).await;
            lines::check_placement(&client, &backups, report).await;
            answers
        }
        None => Vec::new(),
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
        if webhook.available == Some(0) {
            why.push("the webhook StatefulSet has no available replica (webhook down)".into());
        }
        let has = |a: lines::Answer| answers.contains(&a);
        let reached = has(lines::Answer::Tainted) || has(lines::Answer::Untainted);
        if has(lines::Answer::Unreachable) && !reached {
            why.push("no line's replica answered a direct call (see the line checks)".into());
        } else if has(lines::Answer::Tainted) && policy.is_none() && why.is_empty() {
            why.push("the replicas answer a direct call with the taints, but the create through admission came back without them: the rules, match conditions or caBundle keep the API server from calling them".into());
        }
        if why.is_empty() && policy.is_none() {
            why.push("the webhook was called but did not add it: does the running webhook have the --taint and --boot-taint flags checked here (pods not restarted since the StatefulSet changed)?".into());
        }
        report.add("diagnosis", Status::Fail, why.join("; "));
    }
    let names: Vec<String> = match &hook {
        Some(h) => h.entries.iter().map(|e| e.name.clone()).collect(),
        None => vec![args.webhook.clone()],
    };
    webhook_config::check_apiserver_metrics(&client, &names, report).await;
    confinement::check(&client, config, args, report).await;
    namespace::check(&client, args, report).await;
    let installed = installed::read(&client, args).await;
    strict_mode::check(&client, args, &installed, report).await;
    let strict = gates::installed(&installed).is_some_and(|g| g.iter().any(|g| g.boot));
    path_token::check(&client, args, hook.as_ref(), &installed, strict, report).await;
    cilium::check(&client, args, &installed, report).await;
    released::check(&client, &installed, report).await;
    karpenter::check(&client, args, &installed, report).await;
    cluster_autoscaler::check(&client, args, &installed, report).await;
}
