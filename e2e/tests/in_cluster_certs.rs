//! The certificates controller (`nodegate-certs controller`) in the
//! emulator, as its ServiceAccount under the shipped RBAC and policy: it
//! makes what an install needs with nothing run on a laptop, takes over an
//! install made the old way with no call failing open, and its token
//! reaches no further than the blast radius written in its RBAC.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodegate_certs::cert_info::parse_pem_certs;
use nodegate_certs::controller::{self, Certificates, Options, Round};
use nodegate_e2e::process::{
    REPLICAS, WEBHOOK_NAMESPACE, manifests_dir, shipped_rbac, shipped_webhook_config,
    statefulset_status,
};
use nodegate_e2e::{WebhookOptions, WebhookProcess};
use nodegate_emulator::kubelet::SimKubelet;
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use serde_json::json;

mod support;

use support::poll::eventually_some;

const CERTS_USER: &str = "system:serviceaccount:nodegate:nodegate-certs";

fn options() -> Options {
    Options {
        namespace: WEBHOOK_NAMESPACE.into(),
        ca_secret: "nodegate-webhook-ca".into(),
        tls_secret: "nodegate-webhook-tls".into(),
        token_secret: "nodegate-webhook-path".into(),
        statefulset: "nodegate-webhook".into(),
        webhook_config: "nodegate".into(),
        certificates: Certificates::Own,
        ca_days: 3650,
        serving_days: 90,
    }
}

fn read(p: &str) -> String {
    std::fs::read_to_string(manifests_dir().join(p)).unwrap()
}

/// An emulator holding the shipped namespace, the certificates
/// controller's policy, the webhook configuration as shipped (no caBundle,
/// no path) and the webhook StatefulSet with every replica ready.
async fn cluster() -> Emulator {
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(shipped_rbac().unwrap()),
        ..Default::default()
    })
    .await
    .unwrap();
    emu.apply(&read("namespace.yaml")).unwrap();
    emu.apply(&read("certs/policy.yaml")).unwrap();
    emu.apply_webhook_config(&shipped_webhook_config().unwrap())
        .unwrap();
    let mut sts = nodegate_emulator::server::parse_documents(&read("webhook/statefulset.yaml"))
        .unwrap()
        .remove(0);
    sts["status"] = statefulset_status(REPLICAS, REPLICAS);
    emu.apply(&sts.to_string()).unwrap();
    emu
}

/// Rounds of the controller, as its ServiceAccount, until everything is in
/// place; the steps it took.
async fn converge(emu: &Emulator, o: &Options) -> Vec<String> {
    let client = emu.client(CERTS_USER).await.unwrap();
    let mut steps = Vec::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match controller::reconcile(&client, o).await.unwrap() {
            Round::Converged => return steps,
            Round::Step(s) => steps.push(s),
        }
        assert!(
            tokio::time::Instant::now() < end,
            "no convergence: {steps:?}"
        );
        assert!(steps.len() < 20, "a step loop: {steps:?}");
    }
}

fn secret_data(s: &Secret, key: &str) -> Vec<u8> {
    s.data.as_ref().unwrap()[key].0.clone()
}

async fn gated(emu: &Emulator, node: &str) -> bool {
    let api: Api<Node> = Api::all(emu.client(users::ADMIN).await.unwrap());
    api.get(node)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == "nodegate.dev/agent-not-ready")
}

/// A webhook process serving with its own files until told otherwise, the
/// emulator's Services pointed at it (the configuration is the emulator's).
async fn webhook(emu: &Emulator) -> WebhookProcess {
    let w = WebhookProcess::start(WebhookOptions {
        path_token: true,
        extra_args: vec!["--tls-reload-interval=100ms".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    for s in w.services() {
        emu.set_service_endpoint(&s, w.https_addr());
    }
    w
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_makes_what_an_install_needs_and_a_kubelet_is_gated() {
    let emu = cluster().await;
    let w = webhook(&emu).await;
    let o = options();
    let steps = converge(&emu, &o).await;
    assert_eq!(
        steps.len(),
        5,
        "CA, caBundle, leaf, token, paths: {steps:?}"
    );

    let admin = emu.client(users::ADMIN).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), WEBHOOK_NAMESPACE);
    let ca = secrets.get("nodegate-webhook-ca").await.unwrap();
    let tls = secrets.get("nodegate-webhook-tls").await.unwrap();
    let token = secrets.get("nodegate-webhook-path").await.unwrap();
    assert_eq!(tls.type_.as_deref(), Some("kubernetes.io/tls"));
    let ca_cert = &parse_pem_certs(&secret_data(&ca, "ca.crt")).unwrap()[0];
    let leaf = &parse_pem_certs(&secret_data(&tls, "tls.crt")).unwrap()[0];
    assert!(ca_cert.signed(leaf));
    for name in [
        "nodegate-webhook.nodegate.svc",
        "nodegate-webhook-1.nodegate.svc",
    ] {
        assert!(leaf.dns_names.iter().any(|d| d == name), "{name}");
    }
    let token_text = String::from_utf8(secret_data(&token, "token")).unwrap();
    let configs: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    let config = configs.get("nodegate").await.unwrap();
    for w in config.webhooks.as_ref().unwrap() {
        let bundle = parse_pem_certs(&w.client_config.ca_bundle.as_ref().unwrap().0).unwrap();
        assert_eq!(
            bundle.len(),
            1,
            "the new CA alone: no earlier trust to keep"
        );
        assert_eq!(bundle[0].der, ca_cert.der);
        assert_eq!(
            w.client_config.service.as_ref().unwrap().path.as_deref(),
            Some(format!("/mutate/{}", token_text.trim()).as_str())
        );
    }

    // The kubelet puts the Secrets into the replicas' volumes: the API
    // server then verifies the leaf with the caBundle and calls the token.
    w.serve_from(
        &secret_data(&tls, "tls.crt"),
        &secret_data(&tls, "tls.key"),
        Some(token_text.as_bytes()),
    )
    .unwrap();
    let kubelet = SimKubelet::new(&emu, "joined").await.unwrap();
    eventually_some(
        "a new node gated at create",
        Duration::from_secs(10),
        || async {
            let name = format!("probe-{}", rand_suffix());
            let k = SimKubelet::new(&emu, &name).await.unwrap();
            k.register().await.unwrap();
            gated(&emu, &name).await.then_some(())
        },
    )
    .await;
    kubelet.register().await.unwrap();
    assert!(gated(&emu, "joined").await);

    // In place: another round reads and writes nothing.
    let versions = async || {
        let config = configs.get("nodegate").await.unwrap();
        let tls = secrets.get("nodegate-webhook-tls").await.unwrap();
        (
            config.metadata.resource_version,
            tls.metadata.resource_version,
        )
    };
    let before = versions().await;
    assert_eq!(converge(&emu, &o).await, Vec::<String>::new());
    let after = versions().await;
    assert_eq!(before, after, "a converged round wrote something");
}

fn rand_suffix() -> String {
    nodegate_certs::path_token()[..8].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_wait_for_every_replica_before_calling_the_token() {
    let emu = cluster().await;
    let mut sts = nodegate_emulator::server::parse_documents(&read("webhook/statefulset.yaml"))
        .unwrap()
        .remove(0);
    sts["status"] = statefulset_status(REPLICAS, 1);
    emu.apply(&sts.to_string()).unwrap();
    let client = emu.client(CERTS_USER).await.unwrap();
    let o = options();
    let mut last = Round::Converged;
    for _ in 0..6 {
        last = controller::reconcile(&client, &o).await.unwrap();
    }
    let Round::Step(waiting) = last else {
        panic!("converged with a replica not ready");
    };
    assert!(waiting.contains("every replica"), "{waiting}");
    let admin = emu.client(users::ADMIN).await.unwrap();
    let config = Api::<MutatingWebhookConfiguration>::all(admin)
        .get("nodegate")
        .await
        .unwrap();
    for w in config.webhooks.unwrap() {
        assert!(w.client_config.ca_bundle.is_some(), "trust goes in at once");
        assert_eq!(
            w.client_config.service.unwrap().path,
            None,
            "the token waits"
        );
    }
    sts["status"] = statefulset_status(REPLICAS, REPLICAS);
    emu.apply(&sts.to_string()).unwrap();
    assert_eq!(converge(&emu, &o).await.len(), 1, "the paths, once ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taking_over_an_install_made_with_a_laptop_ca_fails_no_call_open() {
    let emu = cluster().await;
    let w = webhook(&emu).await;
    // The old install: the webhook's own CA in the caBundle, its leaf in
    // the Secret, its token in the Secret and the lines.
    w.install_objects(&emu).unwrap();
    w.attach(&emu, None).unwrap();
    let admin = emu.client(users::ADMIN).await.unwrap();
    let configs: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    let paths_before: Vec<_> = configs
        .get("nodegate")
        .await
        .unwrap()
        .webhooks
        .unwrap()
        .into_iter()
        .map(|l| l.client_config.service.unwrap().path)
        .collect();

    let client = emu.client(CERTS_USER).await.unwrap();
    let o = options();
    let mut n = 0;
    let mut register_gated = async || {
        n += 1;
        let name = format!("takeover-{n}");
        SimKubelet::new(&emu, &name)
            .await
            .unwrap()
            .register()
            .await
            .unwrap();
        assert!(
            gated(&emu, &name).await,
            "{name} was stored ungated: a call failed open"
        );
    };
    // Each step, then a kubelet registering against the replicas as they
    // are (still serving the old leaf: the kubelet has not synced yet).
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        register_gated().await;
        if controller::reconcile(&client, &o).await.unwrap() == Round::Converged {
            break;
        }
        assert!(tokio::time::Instant::now() < end);
    }
    register_gated().await;
    let config = configs.get("nodegate").await.unwrap();
    let bundle = parse_pem_certs(
        &config.webhooks.as_ref().unwrap()[0]
            .client_config
            .ca_bundle
            .as_ref()
            .unwrap()
            .0,
    )
    .unwrap();
    assert_eq!(
        bundle.len(),
        2,
        "the new CA and the one the replicas still serve"
    );
    let paths_after: Vec<_> = config
        .webhooks
        .unwrap()
        .into_iter()
        .map(|l| l.client_config.service.unwrap().path)
        .collect();
    assert_eq!(paths_before, paths_after, "the install's token is kept");

    // The kubelet syncs the new leaf: still gated.
    let tls = Api::<Secret>::namespaced(admin, WEBHOOK_NAMESPACE)
        .get("nodegate-webhook-tls")
        .await
        .unwrap();
    w.serve_from(
        &secret_data(&tls, "tls.crt"),
        &secret_data(&tls, "tls.key"),
        None,
    )
    .unwrap();
    for _ in 0..10 {
        register_gated().await;
        tokio::task::yield_now().await;
    }
}

fn forbidden<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what}: expected 403, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controllers_token_reaches_no_further_than_its_blast_radius() {
    let emu = cluster().await;
    converge(&emu, &options()).await;
    let client = emu.client(CERTS_USER).await.unwrap();
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), WEBHOOK_NAMESPACE);
    let patch = |ops: serde_json::Value| {
        Patch::<()>::Json(serde_json::from_value::<json_patch::Patch>(ops).unwrap())
    };
    let pp = PatchParams::default();
    // Inside the radius: a line's caBundle and its path to a token.
    let ca = configs.get("nodegate").await.unwrap().webhooks.unwrap()[0]
        .client_config
        .ca_bundle
        .clone()
        .unwrap();
    configs
        .patch(
            "nodegate",
            &pp,
            &patch(
                json!([{"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": ca}]),
            ),
        )
        .await
        .expect("a caBundle is the controller's to write");
    // Outside: each line of the written radius, tried.
    for (what, op) in [
        (
            "a rule for Pods",
            json!({"op": "add", "path": "/webhooks/0/rules/-", "value": {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}}),
        ),
        (
            "failurePolicy Fail",
            json!({"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Fail"}),
        ),
        (
            "another Service",
            json!({"op": "replace", "path": "/webhooks/0/clientConfig/service/name", "value": "attacker"}),
        ),
        (
            "a path that is no token",
            json!({"op": "replace", "path": "/webhooks/0/clientConfig/service/path", "value": "/steal"}),
        ),
        (
            "a wider objectSelector",
            json!({"op": "replace", "path": "/webhooks/0/objectSelector", "value": {}}),
        ),
        (
            "its matchConditions",
            json!({"op": "remove", "path": "/webhooks/0/matchConditions"}),
        ),
        (
            "one line fewer",
            json!({"op": "remove", "path": "/webhooks/2"}),
        ),
    ] {
        forbidden(
            what,
            configs.patch("nodegate", &pp, &patch(json!([op]))).await,
        );
    }
    forbidden("another webhook configuration", configs.get("other").await);
    let stray = |name: &str, type_: &str| Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        type_: Some(type_.into()),
        ..Default::default()
    };
    forbidden(
        "a Secret of another name",
        secrets
            .create(&PostParams::default(), &stray("stolen", "Opaque"))
            .await,
    );
    forbidden(
        "a token Secret under an allowed name",
        secrets
            .create(
                &PostParams::default(),
                &stray("nodegate-webhook-ca", "kubernetes.io/service-account-token"),
            )
            .await,
    );
    forbidden(
        "reading another Secret",
        secrets.get("nodegate-roster").await,
    );
    forbidden("listing Secrets", secrets.list(&Default::default()).await);
    let nodes: Api<Node> = Api::all(client.clone());
    forbidden("reading a Node", nodes.get("any").await);
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> =
        Api::namespaced(client, WEBHOOK_NAMESPACE);
    forbidden(
        "changing the webhook StatefulSet",
        sets.patch(
            "nodegate-webhook",
            &pp,
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await,
    );
}
