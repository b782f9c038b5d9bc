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

const UNAUTHENTICATED: &str = "nodegate_webhook_unauthenticated_side_effects_total";
const REREGISTRATIONS: &str = "nodegate_webhook_reregistration_patches_total";
const PATH_TOKENS: &str = "nodegate_webhook_path_tokens";

/// Waits until the webhook's metric `name` reads `want`.
async fn wait_metric(webhook: &WebhookProcess, name: &str, want: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let m = webhook.metrics().await.unwrap();
        if parse(&m).sum(name, &[]) == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never {want}: {m}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_rotation_under_load_refuses_the_api_server_nothing() {
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
    let load = {
        let (stop, created) = (stop.clone(), created.clone());
        let mut kubelets = Vec::new();
        for i in 0..400 {
            kubelets.push(SimKubelet::new(&emu, &format!("load-{i}")).await.unwrap());
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
    };

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
