//! nodegate-check's command line: every flag and environment variable, and
//! the names it derives from them. The checks take only the values they
//! need (lib.rs hands them out), so no check depends on this module.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use nodegate_shared::gate_flags::{GateFlags, OwnedFlags};

use crate::served_certs;

/// Checks an installation of nodegate with the current kubeconfig (in a Pod
/// without one, its ServiceAccount); exits 1 if any check fails.
#[derive(Debug, Clone, Parser)]
#[command(name = "nodegate-check", version, about)]
pub struct Args {
    // `--taint`, `--boot-taint` and `--owned-taint`, declared once for every
    // binary. Given any, the canary and every line expect what a webhook with
    // these three flags adds (nodegate's default taint without `--taint`);
    // with none, what the webhook StatefulSet's flags add: the check has no
    // default, and mixing its flags with the StatefulSet's would expect a
    // webhook nothing runs.
    #[command(flatten)]
    pub gate: GateFlags,
    #[command(flatten)]
    pub owned: OwnedFlags,
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
    /// The certificate controller's Deployment; an install without one is
    /// warned that nothing renews its certificate and path token.
    #[arg(
        long,
        env = "NODEGATE_CHECK_CERTS_DEPLOYMENT",
        default_value = "nodegate-certs"
    )]
    pub certs_deployment: String,
    /// Read the webhook's path token from this file (Secret
    /// nodegate-webhook-path's `token` key, mounted) instead of the Secret:
    /// how a Pod of the check (`helm test`) gets it.
    #[arg(long, env = "NODEGATE_CHECK_PATH_TOKEN_FILE")]
    pub path_token_file: Option<PathBuf>,
    /// After an uninstall: list what nodegate left behind (gated Nodes,
    /// admission objects, cluster roles, its workloads and Secrets), each
    /// with the kubectl command that removes it; exits 1 if anything is
    /// left. Run it with a credential that may list them (an admin's).
    #[arg(long, env = "NODEGATE_CHECK_AFTER_UNINSTALL")]
    pub after_uninstall: bool,
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
    /// Cluster Autoscaler's release (e.g. 1.28.2), when its image tag does
    /// not tell it or no CA Deployment runs here (a managed CA): which
    /// flags and taint prefixes it knows depends on it.
    #[arg(long, env = "NODEGATE_CHECK_CLUSTER_AUTOSCALER_VERSION")]
    pub cluster_autoscaler_version: Option<String>,
    /// Cluster Autoscaler's status ConfigMap (`namespace/name`): present
    /// without a CA Deployment, a CA runs that nodegate-check cannot see
    /// (managed, in another cluster, a static Pod) or one left it behind.
    #[arg(
        long,
        env = "NODEGATE_CHECK_CLUSTER_AUTOSCALER_STATUS",
        default_value = "kube-system/cluster-autoscaler-status"
    )]
    pub cluster_autoscaler_status: String,
    /// A node a gate of the agent's has held longer than this (its
    /// `NodegateGateHeld` Event says since when) makes the gate's line warn.
    #[arg(
        long,
        env = "NODEGATE_CHECK_GATE_HELD_WARN_AFTER",
        default_value = "10m",
        value_parser = nodegate_shared::duration::parse
    )]
    pub gate_held_warn_after: Duration,
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::{CommandFactory, Parser};
    use nodegate_shared::keys::DEFAULT_TAINT;

    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("nodegate-check").chain(args.iter().copied()))
    }

    /// Every flag parses beside the others; the defaults name the install.
    #[test]
    fn defaults() {
        Args::command().debug_assert();
        let a = parse(&[]).unwrap();
        assert!(!a.gate.given(), "no taint of its own: the StatefulSet's");
        assert!(a.owned.owned_taints.is_empty());
        assert_eq!(
            (
                a.namespace.as_str(),
                a.webhook_config.as_str(),
                a.webhook.as_str()
            ),
            ("nodegate", "nodegate", "nodes.nodegate.dev")
        );
        assert_eq!(a.webhook_workload(), "nodegate-webhook");
        assert_eq!(a.served_certs.connect_timeout, Duration::from_secs(3));
        assert_eq!(a.certs_deployment, "nodegate-certs");
        assert_eq!((a.path_token_file, a.after_uninstall), (None, false));
        assert_eq!(a.gate_held_warn_after, crate::holding::DEFAULT_WARN_AFTER);
        let a = parse(&["--gate-held-warn-after=30m"]).unwrap();
        assert_eq!(a.gate_held_warn_after, Duration::from_secs(30 * 60));
    }

    /// What a Pod of the check (`helm test`) passes.
    #[test]
    fn in_a_pod() {
        let a = parse(&["--path-token-file=/etc/nodegate/path/token"]).unwrap();
        assert_eq!(
            a.path_token_file.as_deref(),
            Some(std::path::Path::new("/etc/nodegate/path/token"))
        );
        assert!(parse(&["--after-uninstall"]).unwrap().after_uninstall);
    }

    /// The shared taint flags, repeatable and comma-separated.
    #[test]
    fn taint_flags() {
        let gate = "a.dev/x:NoExecute";
        let a = parse(&[
            "--taint",
            DEFAULT_TAINT,
            "--boot-taint",
            &format!("{gate},b.dev/y:NoExecute"),
        ])
        .unwrap();
        assert!(a.gate.given());
        assert_eq!(a.gate.taints, vec![DEFAULT_TAINT.parse().unwrap()]);
        assert_eq!(a.gate.boot_taints.len(), 2);
        assert!(parse(&["--taint", "not a taint"]).is_err());
        let ebs = "ebs.csi.aws.com/agent-not-ready:NoExecute";
        let a = parse(&[
            &format!("--owned-taint={ebs}"),
            "--owned-taint=example.com/x:NoSchedule",
        ])
        .unwrap();
        assert!(!a.gate.given());
        assert_eq!(
            a.owned.owned_taints,
            vec![
                ebs.parse().unwrap(),
                "example.com/x:NoSchedule".parse().unwrap()
            ]
        );
        assert!(parse(&["--owned-taint", "not a taint"]).is_err());
    }

    /// `--statefulset`, else the former `--deployment`.
    #[test]
    fn the_webhook_workload() {
        let a = parse(&["--deployment", "old"]).unwrap();
        assert_eq!(a.webhook_workload(), "old");
        let a = parse(&["--deployment", "old", "--statefulset", "new"]).unwrap();
        assert_eq!(a.webhook_workload(), "new");
    }

    /// The served-certificate flag parses beside the others.
    #[test]
    fn replica_connect_timeout() {
        let a = parse(&["--replica-connect-timeout", "500ms"]).unwrap();
        assert_eq!(a.served_certs.connect_timeout, Duration::from_millis(500));
        assert!(parse(&["--replica-connect-timeout", "x"]).is_err());
    }
}
