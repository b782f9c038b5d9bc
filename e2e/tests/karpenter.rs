//! Karpenter beside nodegate: the Karpenter stand-in
//! (`nodegate_e2e::karpenter`) against the emulator with nodegate's real
//! webhook, a configuration and agent confinement generated for the
//! webhook's taint, and nodegate's agent's ready patch made with its
//! pod-bound token. 40 pending pods need 4 nodes of 10; an instance's
//! Node appears 18 s after its NodeClaim and is Ready 12 s later; the gate
//! opens 25 s after Ready unless a scenario says otherwise.
//!
//! Scenarios (f)–(h) start from that fleet at rest and reboot part of it:
//! see [`reboot_wave`].
//!
//! Time is virtual (the loop jumps to the next due moment), so Karpenter's
//! 10 s requeue costs nothing; only the Node writes go through the
//! emulator and the webhook. Each scenario prints
//! `FIGURE karpenter.<scenario>.<name> <value>` lines (`-- --nocapture`).
//!
//! Needs `target/debug/nodegate-webhook` (`cargo build -p nodegate-webhook`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use nodegate_e2e::karpenter::{
    self, Arrival, GateOpens, NodePool, Options, Outcome, RebootWave, Timings, Version,
};
use nodegate_e2e::process::shipped_rbac;
use nodegate_e2e::{WebhookOptions, WebhookProcess};
use nodegate_emulator::{Emulator, EmulatorOptions};
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
const NOT_READY_KEY: &str = "node.kubernetes.io/not-ready";

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
    NodePool::from_yaml(&nodepool_yaml(startup)).unwrap()
}

/// What `nodegate-check` says of that NodePool beside nodegate's shipped
/// agent DaemonSet gating with `gate`, for Karpenter `version`.
fn check_says(startup: &str, gate: &str, version: Version) -> nodegate_check::Status {
    use nodegate_check::gates::{Gate, Version as Release};
    use nodegate_check::installed::AgentPlacement;
    use nodegate_check::karpenter::{Inputs, Pool, Pools, verdict};
    let doc: serde_json::Value = serde_yaml::from_str(&nodepool_yaml(startup)).unwrap();
    let pool = Pool::from_spec("default", &doc["spec"]).unwrap();
    let ds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/base/agent/daemonset.yaml");
    let ds: k8s_openapi::api::apps::v1::DaemonSet =
        serde_yaml::from_str(&std::fs::read_to_string(ds).unwrap()).unwrap();
    let spec = ds.spec.unwrap().template.spec.unwrap();
    let lines = verdict(&Inputs {
        pools: Pools::Listed(vec![Ok(pool)]),
        version: Release::Known((version.major, version.minor, version.patch)),
        gates: Some(vec![Gate {
            taint: gate.parse().unwrap(),
            boot: false,
            name: None,
            owner: None,
        }]),
        agent: Some(AgentPlacement::of(&spec)),
    });
    assert_eq!(lines.len(), 1, "{lines:?}");
    println!("nodegate-check: {}", lines[0].2);
    lines[0].1
}

fn nodepool_yaml(startup: &str) -> String {
    format!(
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
    )
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
        kubeconfig: Some(emu.webhook_kubeconfig().unwrap()),
        // No Service endpoints to drain at the end.
        extra_args: vec!["--shutdown-delay".into(), "0s".into()],
        ..Default::default()
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
    let check = check_says(startup, gate, opts.version);
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
    // After a reboot the gate came back from the webhook, while it answered
    // the kubelet's create of its existing Node.
    if let Some(wave) = &out.wave {
        let metrics = webhook.metrics().await.unwrap();
        let n = wave.reboots.len();
        for line in [
            format!(r#"nodegate_webhook_taints_added_total{{reason="reboot"}} {n}"#),
            format!(r#"nodegate_webhook_reregistration_patches_total{{result="ok"}} {n}"#),
        ] {
            assert!(metrics.contains(&line), "{line} not in {metrics}");
        }
    }
    // Every pod found a node, every node opened and was initialized.
    assert!(out.pods_bound_at.is_some(), "pods left pending");
    assert!(
        out.claims
            .iter()
            .all(|c| c.gate_opened_at.is_some() && c.initialized_at.is_some()),
        "{:#?}",
        out.claims
    );
    // A scale-up that duplicates is one nodegate-check fails, and one it
    // passes makes none (a reboot wave's duplicate is a limit no
    // configuration removes: docs/autoscalers.md).
    if out.wave.is_none() {
        println!("FIGURE karpenter.{name}.check {check:?}");
        if out.duplicates() > 0 {
            assert_eq!(check, nodegate_check::Status::Fail, "{name}");
        }
        if check == nodegate_check::Status::Pass {
            assert_eq!(out.duplicates(), 0, "{name}");
        }
    }
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

/// Pods on the fleet before the wave: 8 on each of the 4 nodes (the
/// scheduler spreads them as the gates open together), 2 slots free on each.
const RESTING_PODS: usize = 32;
const ROOM_PER_NODE: usize = 2;
/// Nodes rebooting in the wave, of the 4.
const REBOOTING: usize = 2;

fn wave() -> RebootWave {
    RebootWave {
        at: secs(120),
        nodes: REBOOTING,
        ready: secs(12),
        gate: secs(25),
    }
}

/// When the pods arrive.
#[derive(Debug, Clone, Copy)]
enum Arrive {
    /// 5 s after the reboot: the nodes are NotReady (and gated).
    WhileNotReady,
    /// 5 s after Ready: only the gate keeps them out.
    AfterReady,
}

/// A reboot wave on a fleet at rest: 32 pods on 4 initialized nodes of 10,
/// then 2 of them reboot at 120 s — the kubelet starts on a new bootID,
/// NotReady, and nodegate's webhook re-adds the gate while answering its
/// create; Ready 12 s later; the gate open `window` after Ready. 8 pods
/// arrive during the wave, as many as the fleet has free slots: 4 fit the
/// nodes that did not reboot, 4 only the rebooting ones.
async fn reboot_wave(
    name: &str,
    gate: &str,
    startup: &str,
    version: Version,
    window: Duration,
    arrive: Arrive,
) -> Outcome {
    let w = RebootWave {
        gate: window,
        ..wave()
    };
    let at = match arrive {
        Arrive::WhileNotReady => w.at + secs(5),
        Arrive::AfterReady => w.at + w.ready + secs(5),
    };
    let out = scenario(name, gate, startup, |o| {
        o.version = version;
        o.pods = RESTING_PODS;
        o.reboot = Some(w);
        o.arrivals = vec![Arrival {
            at,
            pods: NEEDED * ROOM_PER_NODE,
        }];
    })
    .await;
    let wave = out.wave.as_ref().unwrap();
    println!("karpenter.{name}: wave {wave:#?}");
    // The fleet was at rest: 4 NodeClaims, every node initialized and open
    // long before the wave (and 8 pods on each, below).
    let resting: Vec<_> = out.claims.iter().filter(|c| c.launched_at < w.at).collect();
    assert_eq!(resting.len(), NEEDED);
    assert!(
        resting
            .iter()
            .all(|c| c.initialized_at < Some(w.at) && c.gate_opened_at < Some(w.at)),
        "{resting:#?}"
    );
    // The gate came back from the webhook alone, on Nodes that stay
    // initialized: the label is never taken off, and initialization does not
    // run again once its condition is set.
    assert_eq!(wave.reboots.len(), REBOOTING);
    for r in &wave.reboots {
        assert_eq!(r.rebooted_at, w.at, "{r:#?}");
        assert_eq!(r.pods, RESTING_PODS / NEEDED, "{r:#?}");
        assert!(r.gated_after_reboot && r.initialized_after_reboot, "{r:#?}");
        assert_eq!(r.gate_opened_at, Some(w.gates_open_at()), "{r:#?}");
    }
    assert_eq!(wave.pods_arrived, NEEDED * ROOM_PER_NODE);
    // Every NodeClaim of the wave was launched while the rebooting nodes had
    // room for the pods, and it ends empty: the pods bind to the rebooted
    // nodes when their gate opens, before the new node's does.
    let launched = out.wave_launched();
    assert_eq!(out.wave_duplicates(), launched.len());
    assert!(
        launched
            .iter()
            .all(|c| c.pods == 0 && c.rebooting_room_at_launch == REBOOTING * ROOM_PER_NODE),
        "{launched:#?}"
    );
    let rebooted: usize = wave
        .reboots
        .iter()
        .map(|r| wave.bound_to.get(&r.node).copied().unwrap_or(0))
        .sum();
    assert_eq!(rebooted, REBOOTING * ROOM_PER_NODE, "{:#?}", wave.bound_to);
    out
}

/// The taint keys that turned pods away from nodes with room in the passes
/// of the wave that launched NodeClaims.
fn wave_refusals(out: &Outcome) -> BTreeSet<String> {
    let at = out.wave.as_ref().unwrap().at;
    out.passes
        .iter()
        .filter(|p| p.at >= at && p.launched > 0)
        .flat_map(|p| p.refused_by_taint.keys().cloned())
        .collect()
}

/// (f) Declared in startupTaints, the gate counts again after a reboot:
/// `StateNode.Taints()` drops startup taints only while the Node is not
/// initialized, and it still is (karpenter#896). A pass in the gate window
/// launches a NodeClaim for pods that fit the rebooted nodes; it ends empty.
#[tokio::test]
async fn f_declared_gate_counts_again_after_a_reboot() {
    let startup = format!("[{{key: {NODEGATE_KEY}, value: 'true', effect: NoSchedule}}]");
    let out = reboot_wave(
        "f",
        NODEGATE,
        &startup,
        Version::READ,
        wave().gate,
        Arrive::AfterReady,
    )
    .await;
    assert_eq!(out.wave_launched().len(), 1);
    // After Ready the not-ready taint is gone: the gate alone refused them.
    assert_eq!(
        wave_refusals(&out),
        BTreeSet::from([NODEGATE_KEY.to_string()])
    );
    assert_eq!(out.wave_gated(), Some(wave().ready + wave().gate));

    // Arriving while NotReady: the not-ready taint counts as well.
    let out = reboot_wave(
        "f_not_ready",
        NODEGATE,
        &startup,
        Version::READ,
        wave().gate,
        Arrive::WhileNotReady,
    )
    .await;
    assert_eq!(out.wave_launched().len(), 1);
    assert_eq!(
        wave_refusals(&out),
        BTreeSet::from([NODEGATE_KEY.to_string(), NOT_READY_KEY.to_string()])
    );
}

/// (g) Under `readiness.k8s.io/` on v1.13.0: a known ephemeral taint, so the
/// first boot launches only what is needed — but ephemeral taints too are
/// dropped only until the Node is initialized, so after a reboot it counts
/// as the declared one does.
#[tokio::test]
async fn g_readiness_prefix_counts_again_after_a_reboot() {
    let out = reboot_wave(
        "g",
        READINESS,
        "[]",
        Version::READINESS_PREFIX,
        wave().gate,
        Arrive::AfterReady,
    )
    .await;
    assert_eq!(out.wave_launched().len(), 1);
    assert_eq!(
        wave_refusals(&out),
        BTreeSet::from([READINESS_KEY.to_string()])
    );
}

/// (h) The same waves with no gate window (the agent ready at Ready): pods
/// arriving after Ready bind at once and nothing is launched; pods arriving
/// while NotReady still launch one, the not-ready taint counting on an
/// initialized Node. nodegate's gate stretches that window from 12 s to 37 s.
#[tokio::test]
async fn h_reboot_wave_without_a_gate_window() {
    let startup = format!("[{{key: {NODEGATE_KEY}, value: 'true', effect: NoSchedule}}]");
    let out = reboot_wave(
        "h",
        NODEGATE,
        &startup,
        Version::READ,
        Duration::ZERO,
        Arrive::AfterReady,
    )
    .await;
    assert_eq!(out.wave_launched().len(), 0);
    let wave = out.wave.as_ref().unwrap();
    assert_eq!(wave.pods_bound_at, Some(wave.at + secs(12 + 5)));

    let out = reboot_wave(
        "h_not_ready",
        NODEGATE,
        &startup,
        Version::READ,
        Duration::ZERO,
        Arrive::WhileNotReady,
    )
    .await;
    assert_eq!(out.wave_launched().len(), 1);
    // The gate is still on until Ready too, but the not-ready taint alone
    // would have refused them.
    assert!(wave_refusals(&out).contains(NOT_READY_KEY));
}
