//! The label, annotation and default taint nodegate uses on Nodes.

/// Annotation the agent sets to the bootID it was ready on. A different
/// bootID in `status.nodeInfo.bootID` means the node rebooted since.
pub const READY_BOOT_ID_ANNOTATION: &str = "nodegate.dev/ready-boot-id";

/// A Node labelled `node-restriction.kubernetes.io/nodegate-exclude=true` is
/// never touched. NodeRestriction refuses labels under this prefix from a
/// kubelet, at create and on update, so a node cannot opt itself out; only
/// an admin (or a controller) can. The former `nodegate.dev/exclude` is not
/// read: any kubelet could set it on its own Node.
pub const EXCLUDE_LABEL: &str = "node-restriction.kubernetes.io/nodegate-exclude";

/// The taint injected when none is configured. nodegate's own key: Cilium's
/// operator removes every taint with its `node.cilium.io/agent-not-ready`
/// key whenever its (possibly stale) cache shows a Ready Cilium pod, and adds
/// it back while the pod is not Ready, so two owners of one key undo each
/// other's writes (docs/cilium.md).
pub const DEFAULT_TAINT: &str = "nodegate.dev/agent-not-ready=true:NoSchedule";

/// The taint nodegate added by default before it had a key of its own: with
/// `components/release-cilium-key` (opt-in: it can be someone else's gate)
/// the agent releases it (exact key, value and effect) so an upgrade leaves
/// none behind.
pub const LEGACY_TAINT: &str = "node.cilium.io/agent-not-ready=true:NoSchedule";

/// Prefix of the user name the API server gives a kubelet.
pub const NODE_USER_PREFIX: &str = "system:node:";

/// The taint of the key profile for a managed Cluster Autoscaler
/// (`components/key-profiles/cluster-autoscaler`): a key under CA's startup
/// prefix, a startup taint without a flag to every CA from 1.29.0
/// (`utils/taints/taints.go`; 1.28 and older know only the ignore prefix).
pub const MANAGED_CA_PROFILE_TAINT: &str =
    "startup-taint.cluster-autoscaler.kubernetes.io/nodegate-agent-not-ready=true:NoSchedule";

/// The taint of the key profile for Karpenter
/// (`components/key-profiles/karpenter`): a key under `readiness.k8s.io/`,
/// which Karpenter counts as ephemeral.
pub const KARPENTER_PROFILE_TAINT: &str =
    "readiness.k8s.io/nodegate-agent-not-ready=true:NoSchedule";

/// Every taint nodegate ships a profile for: the default and the key
/// profiles. Strict mode's boot gate uses the same keys with `NoExecute`.
pub const PROFILE_TAINTS: &[&str] = &[
    DEFAULT_TAINT,
    MANAGED_CA_PROFILE_TAINT,
    KARPENTER_PROFILE_TAINT,
];
