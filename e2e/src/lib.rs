//! nodegate end to end: the harness the suites in `tests/` (and the agent's
//! and nodegate-check's end-to-end tests, and `nodegate-sim`) share. It runs
//! the real binaries next to the emulator (`process`), picks a fresh emulator
//! or a real cluster (`cluster`), and plays the agent's write at an exact
//! moment (`standin`), forges the reviews an attacker would post (`forged_review`); `readme` reads the README's install commands, `manifests` builds the
//! shipped kustomizations; `metrics` reads Prometheus text (the API server's
//! and nodegate's); `karpenter` stands in for Karpenter's provisioner and NodeClaim
//! lifecycle. Test code: nothing shipped depends on it.

pub mod cilium_operator;
pub mod cluster;
pub mod cluster_autoscaler;
pub mod control_plane_flags;
pub mod forged_review;
pub mod karpenter;
pub mod manifests;
pub mod metrics;
pub mod observe;
pub mod process;
pub mod readme;
pub mod real_nodes;
pub mod scale;
pub mod standin;

pub use process::{LoggedChild, WebhookOptions, WebhookProcess, bin_path};
