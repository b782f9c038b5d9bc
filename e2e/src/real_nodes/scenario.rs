//! What every scenario after the install shares, and the steps several of
//! them take.

use std::time::Instant;

use k8s_openapi::api::core::v1::Node;

use super::admission::Prober;
use super::harness::{Harness, figure};
use super::live::{current_boot, wait_gated};
use super::objects::{boot_id, gated, taints};
use super::record::{Recorder, Seen, first_version};

/// What every scenario after the install shares.
pub struct Ctx {
    pub h: Harness,
    pub client: kube::Client,
    /// Every version of every Node and Pod since the start.
    pub rec: Recorder,
    /// Canary creates from the end of the install on.
    pub prober: Prober,
    /// The nodes the harness brought up (the others join in the scenarios).
    pub nodes0: Vec<String>,
}

/// A crash reboot as the watches saw it.
pub struct Crash {
    pub node: String,
    /// When the crash was ordered.
    pub at: Instant,
    /// The last resourceVersion seen before it.
    pub before: u64,
    pub old_boot: String,
    /// The node's first version on its new boot.
    pub first: Seen<Node>,
}

impl Crash {
    /// The first version of the new boot carries the gate.
    pub fn assert_gated(&self, what: &str) {
        assert!(
            gated(&self.first.obj),
            "{what}: {}'s first version on its new boot lacks the gate: {:?}",
            self.node,
            taints(&self.first.obj)
        );
    }

    /// The first gated version since the crash.
    pub async fn gate_back(&self, c: &Ctx) -> Seen<Node> {
        first_version(
            &c.rec,
            &self.node,
            self.before,
            "the gate back after the crash",
            120,
            gated,
        )
        .await
    }
}

/// Crashes `node` (`cluster crash <node> <extra…>`, the machine's power cut
/// and back on a new boot ID) and waits for the first version of its new
/// boot.
pub async fn crash_to_new_boot(c: &Ctx, node: &str, extra: &[&str]) -> Crash {
    let old_boot = current_boot(&c.client, node).await;
    let before = c.rec.last_rv();
    let at = Instant::now();
    let mut args = vec!["crash", node];
    args.extend_from_slice(extra);
    c.h.cluster(&args);
    let first = first_version(
        &c.rec,
        node,
        before,
        &format!("{node}'s first version on its new boot"),
        120,
        |n| boot_id(n).is_some_and(|b| b != old_boot),
    )
    .await;
    Crash {
        node: node.to_string(),
        at,
        before,
        old_boot,
        first,
    }
}

/// Makes `node`'s stand-in ready, prints how long until its gate was gone
/// as `figure_name`, and returns the resourceVersion of its first version
/// without the gate from then on.
pub async fn ready_and_ungated(c: &Ctx, node: &str, figure_name: &str) -> u64 {
    let ready_rv = c.rec.last_rv();
    let t_ready = Instant::now();
    c.h.cluster(&["ready", node]);
    let t_untaint = wait_gated(&c.client, node, false, 120).await;
    figure(figure_name, (t_untaint - t_ready).as_millis());
    first_version(
        &c.rec,
        node,
        ready_rv,
        &format!("{node}'s ungated version in the watch"),
        30,
        |n| !gated(n),
    )
    .await
    .rv
}
