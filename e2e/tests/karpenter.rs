//! Karpenter beside nodegate: the Karpenter stand-in
//! (`nodegate_e2e::karpenter`) against the emulator with nodegate's real
//! webhook, a configuration and agent confinement generated for the
//! webhook's taint, and nodegate's agent's ready patch made with its
//! pod-bound token. 40 pending pods need 4 nodes of 10; an instance's
//! Node appears 18 s after its NodeClaim and is Ready 12 s later; the gate
//! opens 25 s after Ready unless a scenario says otherwise.
//!
//! Time is virtual (the loop jumps to the next due moment), so Karpenter's
//! 10 s requeue costs nothing; only the Node writes go through the
//! emulator and the webhook. Each scenario prints
//! `FIGURE karpenter.<scenario>.<name> <value>` lines (`-- --nocapture`).
//!
//! Needs `target/debug/nodegate-webhook` (`cargo build -p nodegate-webhook`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use nodegate_e2e::karpenter::{self, GateOpens, NodePool, Options, Outcome, Timings, Version};
use nodegate_e2e::process::shipped_rbac;
use nodegate_e2e::{WebhookOptions, WebhookProcess};
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use nodegate_shared::TaintSpec;
use nodegate_webhook::{confinement, webhook_config};

const NODEGATE: &str = "nodegate.dev/agent-not-ready=true:NoSchedule";
const NODEGATE_KEY: &str = "nodegate.dev/agent-not-ready";
/// The shipped confinement's released taint (Cilium's old default).
const RELEASED: &str = "node.cilium.io/agent-not-ready=true:NoSchedule";
const CILIUM_KEY: &str = "node.cilium.io/agent-not-ready";
/// A key in Node Readiness Controller's domain.
const READINESS: &str = "readiness.k8s.io/network-agent-not-ready=true:NoSchedule";
const READINESS_KEY: &str = "readiness.k8s.io/network-agent-not-ready";
const NEEDED: usize = 4;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn timings() -> Timings {
    Timings {
        launch: secs(18),
        ready: secs(12),
        gate: GateOpens::AfterReady(secs(25)),
    }
}

/// A NodePool as one would apply it, with `startup` as its startupTaints.
fn nodepool(startup: &str) -> NodePool {
    NodePool::from_yaml(&format!(
        r#"apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: default
spec:
  template:
    metadata:
      labels:
        team: web
    spec:
      nodeClassRef:
        group: karpenter.k8s.aws
        kind: EC2NodeClass
        name: default
      requirements:
        - key: karpenter.sh/capacity-type
          operator: In
          values: ["on-demand"]
      startupTaints: {startup}
      expireAfter: 720h
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 1m
"#
    ))
    .unwrap()
}

/// An emulator with Karpenter's and Cilium operator's RBAC next to
/// nodegate's, and the real webhook adding `gate`.
async fn cluster(gate: &str) -> (Emulator, WebhookProcess) {
    let spec: TaintSpec = gate.parse().unwrap();
    let mut rbac = shipped_rbac().unwrap();
    rbac.push(karpenter::run::RBAC.to_string());
    let operator =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("real-nodes/cilium/operator-rbac.yaml");
    rbac.push(std::fs::read_to_string(operator).unwrap());
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(rbac),
        ..Default::default()
    })
    .await
    .unwrap();
    let webhook = WebhookProcess::start(WebhookOptions {
        taints: vec![gate.to_string()],
        kubeconfig: Some(emu.kubeconfig(users::WEBHOOK).unwrap()),
        // No Service endpoints to drain at the end.
        extra_args: vec!["--shutdown-delay".into(), "0s".into()],
    })
    .await
    .unwrap();
    // What `nodegate-webhook webhook-config` and `confinement` print for
    // this taint (the shipped files for the default one).
    let config = webhook_config::render(
        std::slice::from_ref(&spec),
        &[],
        webhook_config::DEFAULT_REPLICAS,
    );
    webhook.attach(&emu, Some(&config)).unwrap();
    webhook.install_objects(&emu).unwrap();
    emu.apply(&confinement::render(
        &[spec],
        &[],
        &[RELEASED.parse().unwrap()],
    ))
    .unwrap();
    (emu, webhook)
}

/// Runs one scenario and prints its figures.
async fn scenario(
    name: &str,
    gate: &str,
    startup: &str,
    tune: impl FnOnce(&mut Options),
) -> Outcome {
    let (emu, mut webhook) = cluster(gate).await;
    let mut opts = Options::new(vec![nodepool(startup)], timings());
    opts.gate = vec![gate.parse().unwrap()];
    tune(&mut opts);
    assert_eq!(opts.needed(), NEEDED);
    let started = Instant::now();
    // Virtual time bounds the run itself; this bounds the API calls.
    let out = tokio::time::timeout(secs(60), karpenter::run(&emu, &opts))
        .await
        .expect("the run took over 60 s of wall time")
        .unwrap();
    let wall = started.elapsed();
    for line in out.figures(name) {
        println!("{line}");
    }
    println!(
        "karpenter.{name}: ran in {wall:?}; passes: {:#?}",
        out.passes
    );
    // The gate came from the real webhook, at each Node's first write.
    assert!(
        out.claims.iter().all(|c| c.gated_at_create),
        "{:#?}",
        out.claims
    );
    let created = out.claims.len();
    let answered = emu
        .webhook_calls(false)
        .iter()
        .filter(|c| c.webhook == webhook_config::PRIMARY && c.ok)
        .count();
    assert!(
        answered >= created,
        "{answered} webhook answers for {created} Nodes"
    );
    assert!(emu.ignored_webhook_failures().is_empty());
    // Every pod found a node, every node opened and was initialized.
    assert!(out.pods_bound_at.is_some(), "pods left pending");
    assert!(
        out.claims
            .iter()
            .all(|c| c.gate_opened_at.is_some() && c.initialized_at.is_some()),
        "{:#?}",
        out.claims
    );
    let _ = webhook.stop().await;
    emu.shutdown().await;
    out
}

fn refused_by(out: &Outcome, key: &str) -> usize {
    out.passes
        .iter()
        .map(|p| p.refused_by_taint.get(key).copied().unwrap_or(0))
        .sum()
}

/// Initialized only once the gate was gone.
fn initialized_after_gate(out: &Outcome) -> bool {
    out.claims
        .iter()
        .all(|c| !c.initialized_while_gated && c.initialized_at >= c.gate_opened_at)
}

/// (a) The gate is not in startupTaints: from registration it is a taint
/// the pods do not tolerate, so every pass until it opens launches more
/// NodeClaims; initialization ignores it and labels the Nodes at Ready.
#[tokio::test]
async fn a_undeclared_gate_launches_duplicates_and_initializes_while_gated() {
    let out = scenario("a", NODEGATE, "[]", |_| {}).await;
    assert!(out.launched() > NEEDED, "launched {}", out.launched());
    assert!(refused_by(&out, NODEGATE_KEY) > 0);
    assert_eq!(out.initialized_while_gated(), out.launched());
    assert_eq!(out.empty_nodes(), out.duplicates());
}

/// (b) Declared: ignored while the node is not initialized, and
/// initialization waits for it.
#[tokio::test]
async fn b_declared_gate_launches_exactly_what_is_needed() {
    let startup = format!("[{{key: {NODEGATE_KEY}, value: 'true', effect: NoSchedule}}]");
    let out = scenario("b", NODEGATE, &startup, |_| {}).await;
    assert_eq!(out.launched(), NEEDED);
    assert_eq!(refused_by(&out, NODEGATE_KEY), 0);
    assert!(initialized_after_gate(&out), "{:#?}", out.claims);
}

/// (c) Undeclared, but under `readiness.k8s.io/`: a known ephemeral taint
/// from v1.13.0 (ignored until initialized, and waited for), an ordinary
/// one before.
#[tokio::test]
async fn c_readiness_prefix_counts_from_v1_13() {
    let out = scenario("c_v1_13", READINESS, "[]", |o| {
        o.version = Version::READINESS_PREFIX;
    })
    .await;
    assert_eq!(out.launched(), NEEDED);
    assert!(initialized_after_gate(&out), "{:#?}", out.claims);

    let out = scenario("c_v1_12", READINESS, "[]", |o| {
        o.version = Version::new(1, 12, 0);
    })
    .await;
    assert!(out.launched() > NEEDED, "launched {}", out.launched());
    assert!(refused_by(&out, READINESS_KEY) > 0);
    assert!(out.initialized_while_gated() > 0);
}

/// (d) The upgrade trap: the NodePool still declares Cilium's key, as set
/// up for Cilium alone, while nodegate gates with its own.
/// Karpenter adds Cilium's taint at registration and ignores it; nodegate's
/// counts. Cilium's operator removes its taint when the agent is ready, the
/// moment nodegate's agent opens the gate, so initialization waits for both.
#[tokio::test]
async fn d_only_ciliums_key_declared_launches_duplicates() {
    let startup = format!("[{{key: {CILIUM_KEY}, value: 'true', effect: NoExecute}}]");
    let out = scenario("d", NODEGATE, &startup, |o| {
        o.cilium_taint_key = Some(CILIUM_KEY.to_string());
    })
    .await;
    assert!(out.launched() > NEEDED, "launched {}", out.launched());
    assert!(refused_by(&out, NODEGATE_KEY) > 0);
    assert_eq!(refused_by(&out, CILIUM_KEY), 0);
    assert!(initialized_after_gate(&out), "{:#?}", out.claims);
}

/// (e) The gate opens before Ready, undeclared. Karpenter's window is not
/// "until Ready": `StateNode.Taints()` drops the not-ready taint (known
/// ephemeral) but not the gate, from registration on. So the gate counts
/// from registration until it opens (15 s here, longer than the 10 s
/// requeue) and a pass in that window launches duplicates; once it is
/// open, the not-yet-Ready nodes take the pods in Karpenter's view and no
/// more are launched, although kube-scheduler binds only after Ready.
#[tokio::test]
async fn e_gate_opening_before_ready_still_launches_duplicates() {
    let out = scenario("e", NODEGATE, "[]", |o| {
        o.timings.ready = secs(40);
        o.timings.gate = GateOpens::AfterRegistration(secs(15));
    })
    .await;
    assert!(out.launched() > NEEDED, "launched {}", out.launched());
    for c in &out.claims {
        assert!(c.gate_opened_at < c.ready_at, "{c:#?}");
    }
    // Every launch after the first pass was the gate's doing.
    for p in out.passes.iter().skip(1).filter(|p| p.launched > 0) {
        assert!(p.refused_by_taint.contains_key(NODEGATE_KEY), "{p:#?}");
    }
    // Opened before Ready: initialization (at Ready) never saw the gate.
    assert_eq!(out.initialized_while_gated(), 0);
    let first_ready = out.claims[..NEEDED]
        .iter()
        .filter_map(|c| c.ready_at)
        .min()
        .unwrap();
    assert!(out.pods_bound_at.unwrap() >= first_ready);
}
