//! A stand-in of Karpenter's provisioner and NodeClaim lifecycle, enough
//! to count the NodeClaims it launches while nodegate's taint gates new
//! Nodes. Like the cilium-operator stand-in it follows the upstream source
//! function by function: kubernetes-sigs/karpenter main at v1.14.0+20
//! (`2266468104f3`; the functions below read the same at v1.14.1):
//!
//! - `pkg/controllers/state/statenode.go` `StateNode.Taints`,
//!   `Registered`, `Initialized` → [`state`];
//! - `pkg/scheduling/taints.go` `KnownEphemeralTaints`,
//!   `KnownEphemeralTaintKeyPrefixes` (since v1.13.0), `IsKnownEphemeralTaint`,
//!   `Taints.Tolerates`, `Taints.Merge`; `k8s.io/api` `Taint.MatchTaint` →
//!   [`taints`], with the release as a parameter ([`version`]);
//! - `pkg/controllers/provisioning/scheduling/scheduler.go` `Scheduler.add`
//!   `calculateExistingNodeClaims` and `sortExistingNodes`, `existingnode.go`
//!   `ExistingNode.CanAdd`, `nodeclaim.go` `NodeClaim.CanAdd` →
//!   [`scheduler`];
//! - `pkg/controllers/provisioning/controller.go` `PodController.Reconcile`,
//!   `batcher.go` `Batcher`, `provisioner.go` `Provisioner.Reconcile` →
//!   [`provisioner`];
//! - `pkg/controllers/nodeclaim/lifecycle/registration.go`
//!   `Registration.Reconcile` and `syncNode`, `initialization.go`
//!   `Initialization.Reconcile`, `StartupTaintsRemoved`,
//!   `KnownEphemeralTaintsRemoved` → [`lifecycle`];
//! - `pkg/apis/v1/nodepool.go` → [`nodepool`] (read from a real NodePool's
//!   YAML); `nodeclaim.go` and `nodeclaimtemplate.go` → [`nodeclaim`].
//!
//! Around it: [`fleet`] (when the cloud creates the Node, the kubelet
//! reports Ready and the gate opens — after Ready or before it; and a
//! reboot wave, the kubelet starting again on a new bootID, when nodegate's
//! webhook puts the gate back on a Node Karpenter long since initialized),
//! [`node_lifecycle`] (kube-controller-manager's not-ready taint),
//! [`kube_scheduler`] (binding), [`report`] (figures) and [`run`], the
//! loop in virtual time. Node writes go through the emulator, so nodegate's
//! real webhook taints every Node at its create; the decisions are pure
//! functions.
//!
//! What it leaves out:
//! - resources other than a pod count per node: instance types, offerings
//!   and prices, CPU and memory, daemonset overhead, requirements and
//!   affinity, topology spread, volumes, host ports, DRA, reserved capacity,
//!   `minValues`, preference relaxation;
//! - NodePool limits, static NodePools, capacity buffers; weights only
//!   order the NodePools;
//! - the NodeClaim and NodePool objects (kept in memory: the emulator
//!   serves no Karpenter CRD), launch failures, liveness (a NodeClaim not
//!   registered in 15 min is deleted), registration hooks, owner references;
//! - disruption: the duplicates are never consolidated (they stay empty and
//!   are counted), no drift (adding a startup taint to a NodePool drifts
//!   every node of it), expiry or termination; a rebooted, gated Node stays
//!   a disruption candidate (`StateNode.ValidateNodeDisruptable` looks at
//!   `Initialized()`, not at taints — e2e/README.md has the reading);
//! - initialization's extended-resource and DRA checks;
//! - Nodes Karpenter does not manage (every Node here has a NodeClaim);
//! - pod events other than creation: in a cluster kube-scheduler's
//!   `PodScheduled` updates also trigger the pod controller, so real
//!   clusters run more passes, not fewer; Karpenter's in-memory pod
//!   nominations; the cluster-state sync wait and the one-minute solve
//!   timeout;
//! - reboots: the machine's downtime before its kubelet starts again (no
//!   heartbeats are modelled, so no `Unknown` condition or unreachable
//!   taint), containers restarting, the kubelet re-admitting its pods, and
//!   strict mode's `NoExecute` gate evicting them.

pub mod fleet;
pub mod kube_scheduler;
pub mod lifecycle;
pub mod node_lifecycle;
pub mod nodeclaim;
pub mod nodepool;
pub mod provisioner;
pub mod report;
pub mod run;
pub mod scheduler;
pub mod state;
pub mod taints;
pub mod version;

pub use fleet::{GateOpens, RebootWave, Timings};
pub use nodepool::NodePool;
pub use report::Outcome;
pub use run::{Arrival, Options, run};
pub use version::Version;
