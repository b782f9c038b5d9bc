//! The label, annotation and default taint nodegate uses on Nodes.

/// Annotation the agent sets to the bootID it was ready on. A different
/// bootID in `status.nodeInfo.bootID` means the node rebooted since.
pub const READY_BOOT_ID_ANNOTATION: &str = "nodegate.dev/ready-boot-id";

/// A Node labelled `nodegate.dev/exclude=true` is never touched.
pub const EXCLUDE_LABEL: &str = "nodegate.dev/exclude";

/// The taint injected when none is configured: the one Cilium's operator
/// and agent already understand.
pub const DEFAULT_TAINT: &str = "node.cilium.io/agent-not-ready=true:NoSchedule";

/// Prefix of the user name the API server gives a kubelet.
pub const NODE_USER_PREFIX: &str = "system:node:";
