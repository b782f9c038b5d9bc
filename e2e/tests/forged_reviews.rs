//! Reviews no API server sent, tried the way an attacker would: a Node
//! CREATE or a `nodes/status` write claiming a new boot of a ready node,
//! posted straight to a replica's port (anyone who reaches the host network)
//! and through the API server's service proxy (anyone with `create
//! services/proxy` in the namespace), at every path the webhook serves but
//! the configured one. Each gets an answer and re-gates nothing, in the
//! default mode and in strict mode (the evicting boot gate); a genuine
//! reboot, which the API server sends to the configured `/mutate/<token>`,
//! is still gated from the first version of its new boot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use nodegate_e2e::cluster::Cluster;
use nodegate_e2e::forged_review::{copy_with_boot, review};
use nodegate_e2e::metrics::parse;
use nodegate_e2e::process::shipped_rbac;
use nodegate_e2e::standin::{AgentReadiness, StandInAgent};
use nodegate_e2e::{WebhookOptions, WebhookProcess};
use nodegate_emulator::kubelet::SimKubelet;
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::DEFAULT_TAINT;
use serde_json::{Value, json};

mod support;

use support::poll::eventually;
use support::registration::registered_and_ready;

const BOOT_GATE: &str = "nodegate.dev/agent-not-ready=true:NoExecute";
const UNAUTHENTICATED: &str = "nodegate_webhook_unauthenticated_side_effects_total";
const REREGISTRATIONS: &str = "nodegate_webhook_reregistration_patches_total";
const FOREIGN: &str = "nodegate_webhook_foreign_side_effects_total";
/// A controller that may create Nodes and nothing else (Cluster API's,
/// virtual-kubelet's, an autoscaler's provider).
const NODE_CREATOR: &str = "system:serviceaccount:capi-system:capi-manager";

/// A ClusterRole with `create nodes` only, bound to `user`.
fn node_creator_rbac(user: &str) -> String {
    let name = user.replace(':', "-");
    format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {name}}}
rules: [{{apiGroups: [""], resources: [nodes], verbs: [create]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {name}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {name}}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: "{user}"}}]
"#
    )
}

/// nodegate's gates on the node (the API server's own not-ready taint,
/// which no node lifecycle controller removes here, left out).
fn taints(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| {
            t.iter()
                .filter(|t| t.key.starts_with("nodegate.dev/"))
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect()
        })
        .unwrap_or_default()
}

/// A client that talks to the webhook replica itself, trusting its CA.
async fn replica_client(webhook: &WebhookProcess) -> kube::Client {
    use base64::Engine;
    let kc: kube::config::Kubeconfig = serde_yaml::from_value(serde_yaml::to_value(json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "r", "cluster": {
            "server": format!("https://{}", webhook.https_addr()),
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(webhook.ca_pem()),
        }}],
        "users": [{"name": "anonymous", "user": {}}],
        "contexts": [{"name": "r", "context": {"cluster": "r", "user": "anonymous"}}],
        "current-context": "r",
    })).unwrap())
    .unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// POSTs `body` to `path` with `client`; the HTTP status and the body.
async fn post(client: &kube::Client, path: &str, body: &Value) -> (u16, String) {
    let req = http::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .unwrap();
    match client.request_text(req).await {
        Ok(text) => (200, text),
        Err(kube::Error::Api(s)) => (s.code, s.message),
        Err(e) => panic!("{path}: {e}"),
    }
}

/// An emulator with the shipped RBAC and confinement, and a webhook serving
/// with a path token (and strict mode's boot gate when `strict`).
async fn install(strict: bool) -> (Emulator, WebhookProcess) {
    install_with(strict, &[]).await
}

/// [`install`] with more webhook flags.
async fn install_with(strict: bool, extra: &[&str]) -> (Emulator, WebhookProcess) {
    let mut rbac = shipped_rbac().unwrap();
    rbac.push(node_creator_rbac(NODE_CREATOR));
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(rbac),
        ..Default::default()
    })
    .await
    .unwrap();
    let webhook = WebhookProcess::start(WebhookOptions {
        kubeconfig: Some(emu.webhook_kubeconfig().unwrap()),
        path_token: true,
        extra_args: if strict {
            vec![format!("--boot-taint={BOOT_GATE}")]
        } else {
            vec![]
        }
        .into_iter()
        .chain(extra.iter().map(ToString::to_string))
        .collect(),
        ..Default::default()
    })
    .await
    .unwrap();
    let ordinary: Vec<TaintSpec> = vec![DEFAULT_TAINT.parse().unwrap()];
    let boot: Vec<TaintSpec> = if strict {
        vec![BOOT_GATE.parse().unwrap()]
    } else {
        vec![]
    };
    let config = nodegate_webhook::webhook_config::render(
        &ordinary,
        &boot,
        nodegate_webhook::webhook_config::DEFAULT_REPLICAS,
    );
    webhook.attach(&emu, Some(&config)).unwrap();
    webhook.install_objects(&emu).unwrap();
    // The confinement for these taints (strict mode's lets the webhook add the boot gate).
    let release: Vec<TaintSpec> = vec![nodegate_shared::keys::LEGACY_TAINT.parse().unwrap()];
    emu.apply(&nodegate_webhook::confinement::render(
        &ordinary, &boot, &release,
    ))
    .unwrap();
    (emu, webhook)
}

/// Ready on its boot: registered, then the agent's ready patch.
async fn ready_node(emu: &Emulator, name: &str, gates: &[&str]) -> (SimKubelet, Api<Node>) {
    let kubelet = SimKubelet::new(emu, name).await.unwrap();
    let created = kubelet.register().await.unwrap();
    assert_eq!(
        taints(&created).len(),
        gates.len(),
        "{:?}",
        taints(&created)
    );
    // The ready patch's effect is what matters here, not whose it is.
    let standin = StandInAgent {
        taints: gates.iter().map(|g| g.parse().unwrap()).collect(),
    };
    standin
        .mark_ready(&emu.client(users::ADMIN).await.unwrap(), name)
        .await
        .unwrap();
    let api: Api<Node> = Api::all(emu.client(users::ADMIN).await.unwrap());
    assert!(taints(&api.get(name).await.unwrap()).is_empty());
    (kubelet, api)
}

async fn forged_reviews_change_nothing(strict: bool) {
    let (emu, webhook) = install(strict).await;
    let gates: Vec<&str> = if strict {
        vec![DEFAULT_TAINT, BOOT_GATE]
    } else {
        vec![DEFAULT_TAINT]
    };
    let (mut kubelet, api) = ready_node(&emu, "victim", &gates).await;
    let stored = serde_json::to_value(api.get("victim").await.unwrap()).unwrap();
    let token = webhook.path_token().unwrap().to_string();

    let replica = replica_client(&webhook).await;
    let admin = emu.client(users::ADMIN).await.unwrap();
    let proxy = "/api/v1/namespaces/nodegate/services/https:nodegate-webhook:443/proxy";
    let wrong = format!("/mutate/{}x", &token[..token.len() - 1]);
    let mut sent = 0;
    for (client, prefix, via) in [
        (&replica, "", "the replica's port"),
        (&admin, proxy, "the service proxy"),
    ] {
        for path in ["/mutate", "/", wrong.as_str()] {
            for status_write in [false, true] {
                let body = review(&stored, &format!("forged-{sent}"), status_write);
                let (code, answer) = post(client, &format!("{prefix}{path}"), &body).await;
                assert_eq!(code, 200, "{via} {path}: {answer}");
                let answer: Value = serde_json::from_str(&answer).unwrap();
                assert_eq!(
                    answer["response"]["allowed"], true,
                    "{via} {path}: answered, as any review is"
                );
                sent += 1;
                // The re-registration re-taint runs before the answer.
                let now = api.get("victim").await.unwrap();
                assert!(
                    taints(&now).is_empty(),
                    "{via} {path} (status write: {status_write}) re-gated the node: {:?}",
                    taints(&now)
                );
            }
        }
    }
    // Every forged side effect was refused and counted, none was queued.
    let m = webhook.metrics().await.unwrap();
    let scrape = parse(&m);
    for rule in ["reregistration", "status"] {
        assert_eq!(
            scrape.sum(UNAUTHENTICATED, &[("rule", rule)]),
            f64::from(sent / 2),
            "{rule}: {m}"
        );
    }
    assert_eq!(scrape.sum(REREGISTRATIONS, &[("result", "ok")]), 0.0);

    // A real reboot: the API server calls the configured path, and the first
    // stored version with the new boot carries the ordinary gate; strict
    // mode's evicting gate follows once that version is stored.
    kubelet.reboot().await.unwrap();
    let after = api.get("victim").await.unwrap();
    assert_eq!(
        after
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.clone()),
        Some(kubelet.boot_id().to_string())
    );
    let mut want: Vec<String> = gates
        .iter()
        .map(|g| {
            let t: TaintSpec = g.parse().unwrap();
            format!("{}:{}", t.key(), t.effect())
        })
        .collect();
    want.sort();
    assert!(
        taints(&after).contains(&format!(
            "{}:NoSchedule",
            DEFAULT_TAINT.split('=').next().unwrap()
        )),
        "a genuine reboot is gated from its first version: {:?}",
        taints(&after)
    );
    eventually(
        "every gate once the new boot is stored",
        Duration::from_secs(10),
        async || {
            let mut got = taints(&api.get("victim").await.unwrap());
            got.sort();
            got == want
        },
    )
    .await;
    let m = webhook.metrics().await.unwrap();
    assert_eq!(
        parse(&m).sum(REREGISTRATIONS, &[("result", "ok")]),
        1.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_reviews_regate_nothing() {
    forged_reviews_change_nothing(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_strict_mode_forged_reviews_evict_nothing() {
    forged_reviews_change_nothing(true).await;
}

/// Through the service proxy, as `nodegate-check` and an attacker with
/// `services/proxy` reach it: on the emulator and on a real cluster
/// (NODEGATE_E2E_KUBECONFIG) with nodegate installed as the README says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_create_through_the_service_proxy_regates_nothing() {
    let c = Cluster::start().await.unwrap();
    let (name, _kubelet, _agent) = registered_and_ready(&c, "proxied").await;
    let admin = c.client(users::ADMIN).await.unwrap();
    let api: Api<Node> = Api::all(admin.clone());
    let stored = serde_json::to_value(api.get(&name).await.unwrap()).unwrap();
    for path in ["/mutate", "/"] {
        let proxied =
            format!("/api/v1/namespaces/nodegate/services/https:nodegate-webhook:443/proxy{path}");
        let (code, answer) = post(&admin, &proxied, &review(&stored, "forged", false)).await;
        assert_eq!(code, 200, "{path}: {answer}");
        assert!(
            taints(&api.get(&name).await.unwrap()).is_empty(),
            "{path}: re-gated"
        );
    }
    // The node stays ungated for as long as a background patch would take.
    let end = tokio::time::Instant::now() + Duration::from_secs(2);
    while tokio::time::Instant::now() < end {
        assert!(taints(&api.get(&name).await.unwrap()).is_empty());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Anyone who may create Nodes posts a copy of a ready node with a new boot
/// ID, as the node's kubelet re-registering after a reboot would. The API
/// server runs mutating admission before the store answers AlreadyExists, so
/// a re-taint would stay (in strict mode with the evicting gate). Only the
/// node's own kubelet may move the webhook to write: the node keeps every
/// version it had, and the refusal is counted.
async fn a_node_creators_create_changes_nothing(strict: bool) {
    let (emu, webhook) = install(strict).await;
    let gates: Vec<&str> = if strict {
        vec![DEFAULT_TAINT, BOOT_GATE]
    } else {
        vec![DEFAULT_TAINT]
    };
    let (_kubelet, api) = ready_node(&emu, "victim", &gates).await;
    let before = api.get("victim").await.unwrap();
    let copy = copy_with_boot(
        &serde_json::to_value(&before).unwrap(),
        "ffffffff-0000-4000-8000-000000000001",
    );
    let creator: Api<Node> = Api::all(emu.client(NODE_CREATOR).await.unwrap());
    let copy: Node = serde_json::from_value(copy).unwrap();
    match creator.create(&Default::default(), &copy).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 409, "{}", e.message),
        other => panic!("the copy's create: {other:?}"),
    }
    let after = api.get("victim").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version,
        "no new version of the node: {:?}",
        taints(&after)
    );
    let m = webhook.metrics().await.unwrap();
    let scrape = parse(&m);
    assert_eq!(
        scrape.sum(FOREIGN, &[("rule", "reregistration")]),
        1.0,
        "{m}"
    );
    assert_eq!(scrape.sum(REREGISTRATIONS, &[("result", "ok")]), 0.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_creators_create_regates_nothing() {
    a_node_creators_create_changes_nothing(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_strict_mode_a_node_creators_create_evicts_nothing() {
    a_node_creators_create_changes_nothing(true).await;
}

/// The same create by a user whose only right is `create nodes`, on the
/// emulator and on a real cluster (NODEGATE_E2E_KUBECONFIG) with nodegate
/// installed as the README says: AlreadyExists, and no new version of the
/// node, in whichever mode the install runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_creator_regates_nothing_on_either_cluster() {
    let user = "nodegate-e2e-node-creator";
    let rbac = node_creator_rbac(user);
    let c = Cluster::start_with_rbac(vec![rbac.clone()]).await.unwrap();
    if c.is_real() {
        let mut apply = c.kubectl(users::ADMIN).unwrap();
        apply
            .args(["apply", "-f", "-"])
            .stdin(std::process::Stdio::piped());
        let mut child = apply.spawn().unwrap();
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(rbac.as_bytes()).await.unwrap();
        drop(stdin);
        assert!(child.wait().await.unwrap().success());
        c.delete_on_drop("clusterroles", "", user);
        c.delete_on_drop("clusterrolebindings", "", user);
    }
    let (name, _kubelet, _agent) = registered_and_ready(&c, "creator").await;
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let before = api.get(&name).await.unwrap();
    let copy = copy_with_boot(
        &serde_json::to_value(&before).unwrap(),
        "ffffffff-0000-4000-8000-000000000002",
    );
    let creator: Api<Node> = Api::all(c.client(user).await.unwrap());
    let copy: Node = serde_json::from_value(copy).unwrap();
    // RBAC in a real cluster may take a moment to reach the authorizer's cache.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match creator.create(&Default::default(), &copy).await {
            Err(kube::Error::Api(e)) if e.code == 409 => break,
            Err(kube::Error::Api(e)) if e.code == 403 && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("the copy's create: {other:?}"),
        }
    }
    let after = api.get(&name).await.unwrap();
    assert!(taints(&after).is_empty(), "re-gated: {:?}", taints(&after));
    // A real cluster's controllers may write the node meanwhile; here
    // nothing else does.
    if !c.is_real() {
        assert_eq!(
            after.metadata.resource_version,
            before.metadata.resource_version
        );
    }
}

const CLAIMS: &str = "nodegate_webhook_reboot_claims_total";

/// Waits until the webhook's `name{labels}` sum reads at least `want`.
async fn wait_count(webhook: &WebhookProcess, name: &str, labels: &[(&str, &str)], want: f64) {
    eventually(
        &format!("{name}{labels:?} reaches {want}"),
        Duration::from_secs(20),
        async || parse(&webhook.metrics().await.unwrap()).sum(name, labels) >= want,
    )
    .await;
}

/// The path token leaked: a forger posts the kubelet's re-registration of a
/// ready node with a new boot ID to `/mutate/<token>`, as the API server
/// would. It re-gates the node with the ordinary taint only, never with
/// strict mode's evicting gate (no stored version shows the claimed boot);
/// the claim is counted as unconfirmed once its time is up, and holds the
/// next claim back for the interval, so once the agent has lifted the gate
/// a second forgery re-gates nothing. A genuine reboot meanwhile is still
/// gated, from the stored new boot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaked_token_regates_once_per_interval_evicts_nothing_and_is_counted() {
    let (emu, webhook) = install_with(
        true,
        &[
            "--reregistration-min-interval=60s",
            "--reboot-confirm-timeout=1s",
        ],
    )
    .await;
    let gates = [DEFAULT_TAINT, BOOT_GATE];
    let (mut kubelet, api) = ready_node(&emu, "victim", &gates).await;
    let stored = serde_json::to_value(api.get("victim").await.unwrap()).unwrap();
    let path = format!("/mutate/{}", webhook.path_token().unwrap());
    let replica = replica_client(&webhook).await;
    let standin = StandInAgent {
        taints: gates.iter().map(|g| g.parse().unwrap()).collect(),
    };
    let admin = emu.client(users::ADMIN).await.unwrap();

    let (code, answer) = post(&replica, &path, &review(&stored, "leaked-1", false)).await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(
        taints(&api.get("victim").await.unwrap()),
        ["nodegate.dev/agent-not-ready:NoSchedule"],
        "the ordinary taint only, never the evicting gate"
    );
    wait_count(&webhook, CLAIMS, &[("result", "unconfirmed")], 1.0).await;
    // The agent lifts it; the forger tries again within the interval.
    standin.mark_ready(&admin, "victim").await.unwrap();
    let lifted = taints(&api.get("victim").await.unwrap());
    assert!(lifted.is_empty(), "the agent lifted it: {lifted:?}");
    let (code, answer) = post(&replica, &path, &review(&stored, "leaked-2", false)).await;
    assert_eq!(code, 200, "{answer}");
    let now = taints(&api.get("victim").await.unwrap());
    assert!(
        now.is_empty(),
        "re-gated again: {now:?}\n{}",
        webhook.metrics().await.unwrap()
    );
    wait_count(&webhook, CLAIMS, &[("result", "rate_limited")], 1.0).await;

    // A genuine reboot within the interval: its claim is held back too, and
    // the stored new boot gates it (both gates, from the status write).
    kubelet.reboot().await.unwrap();
    eventually(
        "both gates on the rebooted node",
        Duration::from_secs(10),
        async || taints(&api.get("victim").await.unwrap()).len() == 2,
    )
    .await;
    let m = webhook.metrics().await.unwrap();
    let scrape = parse(&m);
    assert_eq!(scrape.sum(CLAIMS, &[("result", "unconfirmed")]), 1.0, "{m}");
    assert_eq!(
        scrape.sum(CLAIMS, &[("result", "rate_limited")]),
        2.0,
        "{m}"
    );
    assert_eq!(scrape.sum(REREGISTRATIONS, &[("result", "ok")]), 1.0, "{m}");
}

/// A genuine reboot's claim is confirmed by the stored node and holds no
/// later reboot back, however soon it comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn genuine_reboots_are_confirmed_and_never_held_back() {
    let (emu, webhook) = install_with(false, &["--reregistration-min-interval=1h"]).await;
    let (mut kubelet, api) = ready_node(&emu, "rebooted", &[DEFAULT_TAINT]).await;
    let admin = emu.client(users::ADMIN).await.unwrap();
    for round in 1..=3 {
        StandInAgent::default()
            .mark_ready(&admin, "rebooted")
            .await
            .unwrap();
        kubelet.reboot().await.unwrap();
        assert_eq!(
            taints(&api.get("rebooted").await.unwrap()).len(),
            1,
            "reboot {round}: gated from its first version"
        );
    }
    let m = webhook.metrics().await.unwrap();
    let scrape = parse(&m);
    assert_eq!(scrape.sum(REREGISTRATIONS, &[("result", "ok")]), 3.0, "{m}");
    assert_eq!(scrape.sum(CLAIMS, &[("result", "confirmed")]), 2.0, "{m}");
    assert_eq!(
        scrape.sum(CLAIMS, &[("result", "rate_limited")]),
        0.0,
        "{m}"
    );
}
