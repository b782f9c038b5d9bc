//! End-to-end, no stale gate after a change of configuration: the agent of
//! any configuration releases (removes with its ready patch, never adds)
//! every gate nodegate ships that it does not hold itself, and the shipped
//! confinement lets its pod-bound token do exactly that and no more. The
//! harness and real-cluster mode: `support`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;

use clap::Parser;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use nodegate_agent::config::Args;
use nodegate_agent::taint_set::TaintSet;
use nodegate_emulator::users;
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::{DEFAULT_TAINT, KARPENTER_PROFILE_TAINT, LEGACY_TAINT};
use nodegate_shared::node::taints_json as taints_of;
use nodegate_shared::taint::shipped_gates;
use serde_json::{Value, json};

use support::nodes::{cluster, node, ready_boot_id, record_versions};
use support::process::Agent;
use support::wait::eventually;

const AGENT_POLICY: &str = "ValidatingAdmissionPolicy 'nodegate-agent-confinement'";
/// Strict mode's boot gate.
const BOOT_GATE: &str = "nodegate.dev/agent-not-ready=true:NoExecute";
/// The taint Cilium's operator keeps under its key (no value): never ours.
const CILIUM_OPERATORS: &str = "node.cilium.io/agent-not-ready:NoSchedule";

fn spec(s: &str) -> TaintSpec {
    s.parse().unwrap()
}

/// The taints of `n` under a key of a gate nodegate ships.
fn shipped_on(n: &Node) -> Vec<Value> {
    let gates = shipped_gates();
    taints_of(n)
        .into_iter()
        .filter(|t| gates.iter().any(|g| t["key"] == g.key()))
        .collect()
}

/// JSON patch of `name` as `client`.
async fn json_patch(client: &kube::Client, name: &str, ops: Value) -> Result<Node, kube::Error> {
    Api::<Node>::all(client.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(ops).unwrap()),
        )
        .await
}

async fn add(client: &kube::Client, name: &str, t: &TaintSpec) -> Result<Node, kube::Error> {
    json_patch(
        client,
        name,
        json!([{"op": "add", "path": "/spec/taints/-", "value": t.to_json()}]),
    )
    .await
}

/// The guarded removal of `t` (exactly) at its index in the stored list.
async fn remove(
    admin: &kube::Client,
    client: &kube::Client,
    name: &str,
    t: &TaintSpec,
) -> Result<Node, kube::Error> {
    let stored = Api::<Node>::all(admin.clone()).get(name).await.unwrap();
    let want = t.to_json();
    let i = taints_of(&stored)
        .iter()
        .position(|x| *x == want)
        .unwrap_or_else(|| panic!("{name} does not carry {t}"));
    json_patch(
        client,
        name,
        json!([{"op": "test", "path": format!("/spec/taints/{i}"), "value": want},
               {"op": "remove", "path": format!("/spec/taints/{i}")}]),
    )
    .await
}

fn assert_refused<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) {
    match r {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 403, "{what}: {}", e.message);
            assert!(
                e.message.contains(AGENT_POLICY)
                    && e.message.contains("may change only the taints"),
                "{what}: {}",
                e.message
            );
        }
        other => panic!("{what}: expected the confinement's 403, got {other:?}"),
    }
}

/// The agent's taint flags of a shipped configuration: the DaemonSet's
/// `--taint`, `--boot-taint` and `--release-taint` args as kustomize builds
/// them with `components` (names under `manifests/components/`).
fn shipped_agent_flags(components: &[&str]) -> Vec<String> {
    let text = nodegate_e2e::manifests::kustomize("manifests", components).unwrap();
    let objects = nodegate_e2e::manifests::by_kind_and_name(&text).unwrap();
    let ds = &objects[&("DaemonSet".to_string(), "nodegate-agent".to_string())];
    ds["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .filter(|a| {
            ["--taint=", "--boot-taint=", "--release-taint="]
                .iter()
                .any(|f| a.starts_with(f))
        })
        .collect()
}

/// What the agent binary makes of `flags`.
fn agent_taints(flags: &[String]) -> TaintSet {
    let mut argv = vec!["nodegate-agent".to_string(), "--node-name=n".into()];
    argv.extend(flags.iter().cloned());
    let args = Args::try_parse_from(argv).unwrap();
    args.validate().unwrap();
    args.taint_set()
}

/// Runs the real agent with `flags` on `name` until its node is ready,
/// recording every version of the node meanwhile, and returns them.
async fn until_ready(
    c: &nodegate_e2e::cluster::Cluster,
    nodes: &Api<Node>,
    name: &str,
    flags: &[String],
    boot_id: &str,
) -> Vec<Node> {
    let (seen, watch) = record_versions(nodes, name);
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("ready");
    std::fs::write(&probe, b"ok").unwrap();
    let mut argv: Vec<&str> = vec!["--probe-file", probe.to_str().unwrap()];
    argv.extend(flags.iter().map(String::as_str));
    let mut agent = Agent::start(c, name, &dir.path().join("state"), &argv).await;
    eventually(
        &format!("{name} ready, with no gate of nodegate"),
        || async {
            let n = node(nodes, name).await;
            shipped_on(&n).is_empty() && ready_boot_id(&n).as_deref() == Some(boot_id)
        },
    )
    .await;
    // Counted once the API server has answered: one write removed them all.
    eventually("the one ready patch counted", || async {
        agent.metric("nodegate_agent_taint_removals_total").await == Some(1.0)
    })
    .await;
    // The watch has seen the ready version: the wait above read it.
    eventually("the watch saw the ready patch", || async {
        seen.lock()
            .unwrap()
            .iter()
            .any(|n| ready_boot_id(n).is_some())
    })
    .await;
    watch.abort();
    agent.term().await;
    seen.lock().unwrap().clone()
}

/// Every version of a node before its ready patch still carries every taint
/// in `gates`: nothing is released before the agent is ready.
fn gated_until_ready(versions: &[Node], gates: &[TaintSpec]) {
    assert!(!versions.is_empty());
    for n in versions.iter().filter(|n| ready_boot_id(n).is_none()) {
        let on = taints_of(n);
        for g in gates {
            assert!(
                on.contains(&g.to_json()),
                "a version before the ready patch without {g}: {on:?}"
            );
        }
    }
}

/// Back to the default configuration from Karpenter's key profile with
/// strict mode: a node still carrying the profile's taint and the NoExecute
/// boot gate keeps them until its agent, of the default configuration under
/// the shipped confinement and its pod-bound token, is ready; then it
/// carries none of nodegate's taints. The taint an older nodegate added
/// under Cilium's key stays: this configuration does not release it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_agent_releases_a_profiles_gate_and_the_boot_gate() {
    let (c, nodes) = cluster().await;
    let admin = c.client(users::ADMIN).await.unwrap();
    let name = c.node_name("stale-profile");
    let kubelet = c.kubelet(&name).await.unwrap();
    kubelet.register().await.unwrap();
    let stale = [spec(KARPENTER_PROFILE_TAINT), spec(BOOT_GATE)];
    // The taint an older nodegate added under Cilium's key: released only
    // with `release-cilium-key`.
    let cilium = spec(LEGACY_TAINT);
    for t in stale.iter().chain([&cilium]) {
        add(&admin, &name, t).await.unwrap();
    }
    let versions = until_ready(&c, &nodes, &name, &[], kubelet.boot_id()).await;
    gated_until_ready(&versions, &stale);
    let left = taints_of(&node(&nodes, &name).await);
    assert!(
        left.contains(&cilium.to_json()),
        "{cilium} was removed: {left:?}"
    );
}

/// The other way round: a node gated under the default key, with strict
/// mode's boot gates of the default and of the profile's key, and an
/// agent of the Karpenter key profile exactly as shipped
/// (`components/key-profiles/karpenter`, under its confinement). Emulator
/// only: it replaces the installed policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_agent_releases_the_default_gate_and_the_boot_gates() {
    let (c, nodes) = cluster().await;
    let Some(emu) = c.emulator() else {
        eprintln!("skipped on a real cluster: the test replaces the installed confinement");
        return;
    };
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    emu.apply(
        &std::fs::read_to_string(
            repo.join("manifests/components/key-profiles/karpenter/confinement.yaml"),
        )
        .unwrap(),
    )
    .unwrap();
    let admin = c.client(users::ADMIN).await.unwrap();
    let name = c.node_name("stale-default");
    let kubelet = c.kubelet(&name).await.unwrap();
    let registered = kubelet.register().await.unwrap();
    assert!(
        taints_of(&registered).contains(&spec(DEFAULT_TAINT).to_json()),
        "the default install's webhook gated the node"
    );
    let profile_boot = TaintSpec::new(
        spec(KARPENTER_PROFILE_TAINT).key(),
        Some("true"),
        nodegate_shared::Effect::NoExecute,
    )
    .unwrap();
    let stale = [spec(DEFAULT_TAINT), spec(BOOT_GATE), profile_boot];
    for t in &stale[1..] {
        add(&admin, &name, t).await.unwrap();
    }
    let flags = shipped_agent_flags(&["key-profiles/karpenter"]);
    assert!(
        flags.contains(&format!("--taint={KARPENTER_PROFILE_TAINT}")),
        "{flags:?}"
    );
    let versions = until_ready(&c, &nodes, &name, &flags, kubelet.boot_id()).await;
    gated_until_ready(&versions, &stale);
}

/// What every other shipped gate's release does not open: the agent's
/// pod-bound token under the default install may not remove Cilium's key
/// (the taint an older nodegate added, without `release-cilium-key`, nor the
/// operator's), and may not add a released boot gate (NoExecute evicts),
/// though it may remove it. Another profile's NoSchedule gate it may add
/// too: it stands in for its own during a switch of key profile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_token_may_not_lift_ciliums_key_nor_add_a_released_boot_gate() {
    let (c, nodes) = cluster().await;
    let admin = c.client(users::ADMIN).await.unwrap();
    let name = c.node_name("stale-limits");
    let kubelet = c.kubelet(&name).await.unwrap();
    kubelet.register().await.unwrap();
    let agent = c.agent_client(&name).await.unwrap();
    for t in [LEGACY_TAINT, CILIUM_OPERATORS] {
        let t = spec(t);
        add(&admin, &name, &t).await.unwrap();
        assert_refused(
            &format!("the agent removes {t}"),
            remove(&admin, &agent, &name, &t).await,
        );
        // One key and effect at a time: the next one is the same taint's.
        remove(&admin, &admin, &name, &t).await.unwrap();
    }
    for t in [KARPENTER_PROFILE_TAINT, BOOT_GATE] {
        let t = spec(t);
        if t.to_string() == BOOT_GATE {
            assert_refused(&format!("the agent adds {t}"), add(&agent, &name, &t).await);
            add(&admin, &name, &t).await.unwrap();
        } else {
            add(&agent, &name, &t)
                .await
                .unwrap_or_else(|e| panic!("the agent adds the stand-in {t}: {e}"));
        }
        remove(&admin, &agent, &name, &t)
            .await
            .unwrap_or_else(|e| panic!("the agent releases {t}: {e}"));
        assert!(!taints_of(&node(&nodes, &name).await).contains(&t.to_json()));
    }
}

/// For each configuration nodegate ships, its agent (the DaemonSet's flags
/// as kustomize builds them) and its confinement (as shipped) agree: the
/// pod-bound token may remove a candidate taint exactly when the agent's
/// ready patch removes it, and may add none it only releases. Candidates:
/// every gate nodegate ships, in both effects, and Cilium's two taints.
/// Emulator only: it replaces the installed policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shipped_agent_and_its_confinement_agree() {
    let (c, _nodes) = cluster().await;
    let Some(emu) = c.emulator() else {
        eprintln!("skipped on a real cluster: the test replaces the installed confinement");
        return;
    };
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests");
    let configurations: [(&str, &[&str], &str); 5] = [
        ("default", &[], "base"),
        (
            "cluster-autoscaler",
            &["key-profiles/cluster-autoscaler"],
            "components/key-profiles/cluster-autoscaler",
        ),
        (
            "karpenter",
            &["key-profiles/karpenter"],
            "components/key-profiles/karpenter",
        ),
        ("strict-mode", &["strict-mode"], "components/strict-mode"),
        (
            "release-cilium-key",
            &["release-cilium-key"],
            "components/release-cilium-key",
        ),
    ];
    let mut candidates = shipped_gates();
    candidates.extend([spec(LEGACY_TAINT), spec(CILIUM_OPERATORS)]);
    let admin = c.client(users::ADMIN).await.unwrap();
    let name = c.node_name("agree");
    let kubelet = c.kubelet(&name).await.unwrap();
    kubelet.register().await.unwrap();
    let agent = c.agent_client(&name).await.unwrap();
    // The registration's gate: every candidate is added and removed alone.
    remove(&admin, &admin, &name, &spec(DEFAULT_TAINT))
        .await
        .unwrap();
    for (config, components, dir) in configurations {
        emu.apply(&std::fs::read_to_string(repo.join(dir).join("confinement.yaml")).unwrap())
            .unwrap();
        let set = agent_taints(&shipped_agent_flags(components));
        let mut released = Vec::new();
        for t in &candidates {
            let managed = set.managed().iter().any(|m| m.matches(&t.to_json()));
            // Another shipped NoSchedule gate stands in for a configured one.
            let stand_in = !managed
                && set
                    .managed()
                    .iter()
                    .any(|m| nodegate_shared::taint::stand_ins(m).contains(t));
            if stand_in {
                add(&agent, &name, t)
                    .await
                    .unwrap_or_else(|e| panic!("{config}: the agent adds the stand-in {t}: {e}"));
            } else {
                if !managed {
                    assert_refused(
                        &format!("{config}: the agent adds {t}, which it does not manage"),
                        add(&agent, &name, t).await,
                    );
                }
                add(&admin, &name, t).await.unwrap();
            }
            let allowed = remove(&admin, &agent, &name, t).await.is_ok();
            assert_eq!(
                allowed,
                set.removes(&t.to_json()),
                "{config}: the confinement {} the removal of {t}",
                if allowed { "allowed" } else { "refused" }
            );
            if !allowed {
                remove(&admin, &admin, &name, t).await.unwrap();
            } else if !managed {
                released.push(t.to_string());
            }
        }
        // Every shipped gate is the configuration's own or released.
        for g in shipped_gates() {
            let own = set.managed().contains(&g);
            assert!(
                own || released.contains(&g.to_string()),
                "{config}: {g} is neither held nor released"
            );
        }
        assert_eq!(
            released.contains(&LEGACY_TAINT.to_string()),
            config == "release-cilium-key",
            "{config}: Cilium's key is released only with its component"
        );
    }
}
