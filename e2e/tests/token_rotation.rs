//! A rotation of the path token while kubelets register: the Secret first
//! holds the new token beside the old, the lines move to the new one once
//! every replica accepts both, then the old one goes. No review the API
//! server sends in between is refused its side effect, and a reboot after
//! each step is gated from the first version of its new boot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use nodegate_e2e::metrics::parse;
use nodegate_e2e::process::{shipped_rbac, shipped_webhook_config, with_path_token};
use nodegate_e2e::standin::{AgentReadiness, StandInAgent};
use nodegate_e2e::{WebhookOptions, WebhookProcess};
use nodegate_emulator::kubelet::SimKubelet;
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use serde_json::json;

mod support;

use support::poll::eventually_some;

const UNAUTHENTICATED: &str = "nodegate_webhook_unauthenticated_side_effects_total";
const REREGISTRATIONS: &str = "nodegate_webhook_reregistration_patches_total";
const PATH_TOKENS: &str = "nodegate_webhook_path_tokens";

/// Waits until the webhook's metric `name` reads `want`.
async fn wait_metric(webhook: &WebhookProcess, name: &str, want: f64) {
    // A plain closure: the StatefulSet stand-in calls this on a spawned task,
    // whose future must be Send.
    eventually_some(
        &format!("{name} reads {want}"),
        Duration::from_secs(20),
        move || async move {
            (parse(&webhook.metrics().await.unwrap()).sum(name, &[]) == want).then_some(())
        },
    )
    .await;
}

/// Every gate nodegate put on `node`.
async fn gated(api: &Api<Node>, node: &str) -> bool {
    let n = api.get(node).await.unwrap();
    n.spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .iter()
        .any(|t| t.key.starts_with("nodegate.dev/"))
}

/// Reboots `kubelet`'s node after its agent marked it ready: the first
/// stored version of the new boot must be gated.
async fn reboot_is_gated(emu: &Emulator, kubelet: &mut SimKubelet, api: &Api<Node>) {
    let admin = emu.client(users::ADMIN).await.unwrap();
    StandInAgent::default()
        .mark_ready(&admin, kubelet.name())
        .await
        .unwrap();
    assert!(!gated(api, kubelet.name()).await);
    kubelet.reboot().await.unwrap();
    assert!(gated(api, kubelet.name()).await, "the reboot was not gated");
}

/// An emulator with the shipped RBAC and a webhook serving with a path token
/// it reads again every 100 ms.
async fn installed() -> (Emulator, WebhookProcess) {
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(shipped_rbac().unwrap()),
        ..Default::default()
    })
    .await
    .unwrap();
    let webhook = WebhookProcess::start(WebhookOptions {
        kubeconfig: Some(emu.webhook_kubeconfig().unwrap()),
        path_token: true,
        extra_args: vec!["--tls-reload-interval=100ms".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    webhook.attach(&emu, None).unwrap();
    (emu, webhook)
}

/// 400 kubelets registering until `stop`, each create asking for the
/// re-registration check (which only a review on an accepted path may
/// make); `created` counts them.
async fn registering(
    emu: &Emulator,
    stop: Arc<AtomicBool>,
    created: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    let mut kubelets = Vec::new();
    for i in 0..400 {
        kubelets.push(SimKubelet::new(emu, &format!("load-{i}")).await.unwrap());
    }
    tokio::spawn(async move {
        for k in kubelets {
            if stop.load(Ordering::Acquire) {
                break;
            }
            k.register().await.unwrap();
            created.fetch_add(1, Ordering::AcqRel);
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_rotation_under_load_refuses_the_api_server_nothing() {
    let (emu, webhook) = installed().await;
    let old = webhook.path_token().unwrap().to_string();
    let new = nodegate_certs::path_token();
    let file = webhook.path_token_file().unwrap();
    let api: Api<Node> = Api::all(emu.client(users::ADMIN).await.unwrap());
    let mut kubelet = SimKubelet::new(&emu, "rotated").await.unwrap();
    kubelet.register().await.unwrap();

    // Kubelets register all along: each create asks for the re-registration
    // check, which only a review on an accepted path may make.
    let stop = Arc::new(AtomicBool::new(false));
    let created = Arc::new(AtomicUsize::new(0));
    let load = registering(&emu, stop.clone(), created.clone()).await;

    // 1. The Secret holds both; every replica reads it.
    std::fs::write(&file, format!("{new}\n{old}\n")).unwrap();
    wait_metric(&webhook, PATH_TOKENS, 2.0).await;
    reboot_is_gated(&emu, &mut kubelet, &api).await;
    // 2. The lines call the new token.
    let config =
        nodegate_certs::inject_ca_bundle(&shipped_webhook_config().unwrap(), webhook.ca_pem())
            .unwrap();
    emu.apply_webhook_config(&with_path_token(&config, &new).unwrap())
        .unwrap();
    reboot_is_gated(&emu, &mut kubelet, &api).await;
    // 3. The old token goes.
    std::fs::write(&file, format!("{new}\n")).unwrap();
    wait_metric(&webhook, PATH_TOKENS, 1.0).await;
    reboot_is_gated(&emu, &mut kubelet, &api).await;

    stop.store(true, Ordering::Release);
    load.await.unwrap();
    let m = webhook.metrics().await.unwrap();
    let scrape = parse(&m);
    assert!(created.load(Ordering::Acquire) > 0, "no load ran");
    assert_eq!(
        scrape.sum(UNAUTHENTICATED, &[]),
        0.0,
        "refused during the rotation: {m}"
    );
    assert_eq!(scrape.sum(REREGISTRATIONS, &[("result", "ok")]), 3.0, "{m}");
    assert!(
        !webhook
            .logs()
            .iter()
            .any(|l| l.contains(&old) || l.contains(&new)),
        "a token in the webhook's log"
    );
}

/// `nodegate-certs rotate-path-token` against an installed cluster while
/// kubelets register: the Secret, the StatefulSet's two rollouts and the
/// lines move in order, no review of the API server is refused its side
/// effect, the command never prints a token, and a reboot afterwards is
/// gated from its first version. A stand-in plays the kubelet and the
/// StatefulSet controller: on each rollout it hands the webhook the
/// Secret's content (as a Pod's start fills its Secret volume), waits until
/// the webhook read it, then reports the rollout done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rotation_command_refuses_the_api_server_nothing() {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Patch, PatchParams};

    let (emu, webhook) = installed().await;
    let webhook = Arc::new(webhook);
    webhook.install_objects(&emu).unwrap();
    let old = webhook.path_token().unwrap().to_string();
    let admin = emu.client(users::ADMIN).await.unwrap();
    let api: Api<Node> = Api::all(admin.clone());
    let mut kubelet = SimKubelet::new(&emu, "rotated").await.unwrap();
    kubelet.register().await.unwrap();

    // The kubelet and the StatefulSet controller, for the webhook's Pods.
    let stop = Arc::new(AtomicBool::new(false));
    let rollouts = Arc::new(AtomicUsize::new(0));
    let controller = {
        let (stop, rollouts, webhook, admin) = (
            stop.clone(),
            rollouts.clone(),
            webhook.clone(),
            admin.clone(),
        );
        let file = webhook.path_token_file().unwrap();
        tokio::spawn(async move {
            let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), "nodegate");
            let secrets: Api<Secret> = Api::namespaced(admin, "nodegate");
            let mut seen: Option<String> = None;
            while !stop.load(Ordering::Acquire) {
                let sts = sets.get("nodegate-webhook").await.unwrap();
                let at = sts
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.metadata.as_ref())
                    .and_then(|m| m.annotations.as_ref())
                    .and_then(|a| a.get("nodegate.dev/path-token-rotated-at"))
                    .cloned();
                if at.is_some() && at != seen {
                    seen = at;
                    let secret = secrets.get("nodegate-webhook-path").await.unwrap();
                    let raw = secret.data.unwrap()["token"].0.clone();
                    let lines = String::from_utf8(raw.clone())
                        .unwrap()
                        .lines()
                        .filter(|l| !l.is_empty())
                        .count();
                    std::fs::write(&file, raw).unwrap();
                    wait_metric(&webhook, PATH_TOKENS, lines as f64).await;
                    let n = rollouts.fetch_add(1, Ordering::AcqRel) + 2;
                    let revision = format!("nodegate-webhook-{n}");
                    let status = json!({"status": {"currentRevision": revision, "updateRevision": revision,
                        "updatedReplicas": 2, "readyReplicas": 2, "observedGeneration": 1}});
                    sets.patch_status(
                        "nodegate-webhook",
                        &PatchParams::default(),
                        &Patch::Merge(&status),
                    )
                    .await
                    .unwrap();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    // Kubelets register all along.
    let created = Arc::new(AtomicUsize::new(0));
    let load = registering(&emu, stop.clone(), created.clone()).await;

    let out = tokio::process::Command::new(nodegate_e2e::process::bin_path("nodegate-certs"))
        .arg("rotate-path-token")
        .env("KUBECONFIG", emu.kubeconfig(users::ADMIN).unwrap())
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    assert!(said.contains("4/4"), "{said}");
    stop.store(true, Ordering::Release);
    load.await.unwrap();
    controller.await.unwrap();
    assert_eq!(rollouts.load(Ordering::Acquire), 2, "two rollouts");

    // The lines call one new token, the Secret and the webhook hold it alone.
    let config: MutatingWebhookConfiguration =
        Api::all(admin.clone()).get("nodegate").await.unwrap();
    let paths: Vec<String> = config
        .webhooks
        .unwrap_or_default()
        .iter()
        .filter_map(|w| w.client_config.service.as_ref()?.path.clone())
        .collect();
    assert!(!paths.is_empty());
    let new = paths[0].strip_prefix("/mutate/").unwrap().to_string();
    assert_ne!(new, old);
    assert!(
        paths.iter().all(|p| *p == format!("/mutate/{new}")),
        "{paths:?}"
    );
    let secret: Secret = Api::namespaced(admin.clone(), "nodegate")
        .get("nodegate-webhook-path")
        .await
        .unwrap();
    assert_eq!(
        secret.data.unwrap()["token"].0,
        format!("{new}\n").into_bytes()
    );
    wait_metric(&webhook, PATH_TOKENS, 1.0).await;
    assert!(
        !said.contains(&old) && !said.contains(&new),
        "a token on stderr: {said}"
    );

    let m = webhook.metrics().await.unwrap();
    assert_eq!(
        parse(&m).sum(UNAUTHENTICATED, &[]),
        0.0,
        "refused during the rotation: {m}"
    );
    reboot_is_gated(&emu, &mut kubelet, &api).await;
    let m = webhook.metrics().await.unwrap();
    assert_eq!(
        parse(&m).sum(REREGISTRATIONS, &[("result", "ok")]),
        1.0,
        "{m}"
    );
}
