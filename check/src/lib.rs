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
//! Every check has one shape: a read step (I/O only, returning plain data
//! or the read's error), a pure `verdict` on what it read, and the report
//! lines. In the order they run:
//!
//! - [`admission_policy`]: the MutatingAdmissionPolicy, when installed (then
//!   the webhook needs only its `nodes/status` rule and the canary comes back
//!   without a warning: policies cannot return one);
//! - [`webhook_config`]: the MutatingWebhookConfiguration and its conditions
//!   ([`matching`]: how the API server matches a request);
//! - [`webhook_service`], [`workloads`], [`daemonset`],
//!   [`certs_controller`]: the webhook's Service and StatefulSet, the agent
//!   DaemonSet, the certificate controller (a warning without it);
//! - [`expected`]: the taints the canary and every line must come back with;
//! - [`lines`]: the first line and one backup line per replica, each
//!   replica called directly through the API server's service proxy;
//! - [`serving`]: each line's caBundle against the serving certificate;
//! - [`served_certs`]: each line's caBundle against what each of its
//!   replicas serves, dialled directly (the service proxy verifies nothing);
//! - [`canary`]: the dry-run create, and [`diagnosis`] when it came back
//!   without its taints;
//! - [`apiserver_metrics`]: the API server's counters for every line;
//! - [`confinement`]: the agent's and webhook's credentials are confined (a
//!   dry-run of a forbidden change as the agent is refused), and
//!   [`namespace`]: for the namespace they run in;
//! - [`installed`]: the webhook's and the agent's container, read once for
//!   the checks below;
//! - [`declared`]: the agent's gates (`--gates`, else the one gate of its
//!   taint and probe flags) are the taints the webhook adds;
//! - [`strict_mode`]: strict mode's boot gate is off, or on and the same in
//!   the webhook, the agent and the policies generated for them;
//! - [`path_token`]: only the API server's reviews may make the webhook
//!   write a Node (its lines call `/mutate/<token>`);
//! - [`cilium`]: Cilium's operator and nodegate own different taint keys (or
//!   the operator leaves taints alone);
//! - [`released`]: which nodes still carry a taint the agent releases (a
//!   change of key), whether any is stale, and when the flag can go;
//! - [`holding`]: one line per gate: how many nodes it holds, which node
//!   longest and which probe fails there, and for a gate owned elsewhere
//!   whether its owner runs on every node it holds;
//! - [`karpenter`], [`cluster_autoscaler`]: the autoscalers wait for
//!   nodegate's gates ([`gates`]) instead of launching duplicate nodes;
//! - [`node_readiness`]: no NodeReadinessRule names nodegate's key (the
//!   Node Readiness Controller would add and remove it too).
//!
//! [`after_uninstall`] (`--after-uninstall`) runs instead of all of these:
//! what an uninstall left behind.
//!
//! [`args`] is the command line; only this file reads it, and hands each
//! check the values it needs.

pub mod admission_policy;
pub mod after_uninstall;
pub mod apiserver_metrics;
pub mod args;
pub mod canary;
pub mod certs_controller;
pub mod cilium;
pub mod cluster_autoscaler;
pub mod confinement;
pub mod container_flags;
pub mod daemonset;
pub mod declared;
pub mod diagnosis;
pub mod expected;
pub mod gates;
pub mod holding;
pub mod installed;
pub mod karpenter;
pub mod lines;
pub mod matching;
pub mod namespace;
pub mod node_readiness;
pub mod path_token;
pub mod read;
pub mod released;
pub mod report;
pub mod served_certs;
pub mod serving;
pub mod strict_mode;
pub mod webhook_config;
pub mod webhook_service;
pub mod workloads;

use kube::Client;

pub use args::Args;
pub use report::{Report, Status};

/// Runs every check (with `--after-uninstall`, the leftover checks
/// instead); never panics, never returns early without a line saying why.
///
/// The credential: the kubeconfig (`KUBECONFIG`, else `~/.kube/config`), or
/// without one the Pod's ServiceAccount (in-cluster), as kube's
/// `Config::infer` finds them.
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
    if args.after_uninstall {
        after_uninstall_with_client(args, &client, &mut report).await;
    } else {
        run_with_client(args, client, Some(&config), &mut report).await;
    }
    report
}

/// `--after-uninstall` with a given client: what nodegate left behind.
pub async fn after_uninstall_with_client(args: &Args, client: &Client, report: &mut Report) {
    let names = after_uninstall::Names {
        namespace: &args.namespace,
        webhook_config: &args.webhook_config,
        policy: &args.policy,
        webhook_workload: args.webhook_workload(),
        daemonset: &args.daemonset,
        certs_deployment: &args.certs_deployment,
        tls_secret: &args.tls_secret,
    };
    let taints: Vec<_> = args
        .gate
        .taints
        .iter()
        .chain(&args.gate.boot_taints)
        .cloned()
        .collect();
    after_uninstall::check(client, &names, &taints, report).await;
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
    let c = &client;
    let (ns, workload) = (args.namespace.as_str(), args.webhook_workload());
    let policy = admission_policy::check(c, &args.policy, report).await;
    let wanted = webhook_config::Wanted {
        config: &args.webhook_config,
        webhook: &args.webhook,
        policy_mode: policy.is_some(),
    };
    let hook = webhook_config::check(c, &wanted, report).await;
    let svc_ok = match &hook {
        Some(h) => webhook_service::check(c, h, report).await,
        None => false,
    };
    let webhook = workloads::check_webhook(c, ns, workload, report).await;
    let want = expected::check(&args.gate, &args.owned, &webhook.flags, report);
    let backups = match &hook {
        Some(h) => {
            let w = webhook.workload.as_ref();
            lines::backups::check(c, h, w, want.as_ref(), report).await
        }
        None => lines::Backups::default(),
    };
    let cert_ok = match &hook {
        Some(h) => {
            let address = args.webhook_address.as_deref();
            serving::check(c, &args.tls_secret, address, h, report).await
        }
        None => false,
    };
    if let Some(h) = &hook {
        served_certs::check(c, h, &args.served_certs, report).await;
    }
    daemonset::check(c, ns, &args.daemonset, report).await;
    certs_controller::check(c, ns, &args.certs_deployment, report).await;
    let expected = want.as_ref().map(|want| canary::Expected {
        want,
        want_warning: policy.is_none(),
    });
    let canary = canary::check(c, expected.as_ref(), report).await;
    let answers = match &hook {
        Some(h) => {
            let proxy = without_retries(c, config);
            let answers = lines::answers::check(&proxy, h, want.as_ref(), report).await;
            lines::placement::check(c, &backups, report).await;
            answers
        }
        None => Vec::new(),
    };
    let findings = diagnosis::Findings {
        policy,
        hook: hook.as_ref(),
        cert_ok,
        svc_ok,
        available: webhook.available,
        answers: &answers,
        flags: expected::flag_names(want.as_ref().unwrap_or(&Default::default())),
    };
    diagnosis::check(canary, &findings, report);
    let names: Vec<String> = match &hook {
        Some(h) => h.entries.iter().map(|e| e.name.clone()).collect(),
        None => vec![args.webhook.clone()],
    };
    apiserver_metrics::check(c, &names, report).await;
    confinement::check(c, config, ns, report).await;
    namespace::check(c, ns, report).await;
    let installed = installed::read(c, ns, workload, &args.daemonset).await;
    let declaration = declared::check(&installed, report);
    strict_mode::check(c, &args.policy, &installed, report).await;
    let strict = gates::installed(&installed).is_some_and(|g| g.iter().any(|g| g.boot));
    let token_file = args.path_token_file.as_deref();
    path_token::check(c, ns, token_file, hook.as_ref(), &installed, strict, report).await;
    let cilium = cilium::Where {
        namespace: &args.cilium_namespace,
        config: &args.cilium_config,
    };
    cilium::check(c, &cilium, &installed, report).await;
    // One paginated list of the Nodes for both.
    let nodes = read::nodes(c).await;
    released::check(&installed, &nodes, report);
    let warn_after = args.gate_held_warn_after;
    holding::check(c, declaration.as_ref(), &nodes, warn_after, report).await;
    let karpenter_version = args.karpenter_version.as_deref();
    karpenter::check(c, karpenter_version, &installed, report).await;
    let ca_status = &args.cluster_autoscaler_status;
    let ca_version = args.cluster_autoscaler_version.as_deref();
    cluster_autoscaler::check(c, ca_status, ca_version, &installed, report).await;
    node_readiness::check(c, &installed, report).await;
}
