//! `nodegate-check` on the lines of admission: the first line and a backup
//! line per replica, each replica called directly through the API server's
//! service proxy, where the replicas run, and what each serves when dialled
//! directly — as shipped, and broken the ways real installs break.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use nodegate_e2e::process::deployment_status;
use nodegate_e2e::{WebhookOptions, WebhookProcess};
use nodegate_emulator::fake_webhook::{FakeReply, FakeWebhook};
use nodegate_emulator::users;
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::DEFAULT_TAINT;

use support::endpoints::{endpoint_slice, endpoint_slices};
use support::install::{installed, installed_full, shipped_config};
use support::{check, failed, line};

fn webhook_pod(replica: usize, node: &str) -> String {
    let name = format!("nodegate-webhook-{replica}");
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "nodegate", "labels": {
            "app.kubernetes.io/name": "nodegate-webhook",
            "app.kubernetes.io/part-of": "nodegate",
            "statefulset.kubernetes.io/pod-name": name,
        }},
        "spec": {"nodeName": node, "containers": [{"name": "webhook", "image": "nodegate/nodegate-webhook"}]},
    })
    .to_string()
}

/// The install as shipped: the first line and one backup line per replica,
/// each replica answering directly through the API server's service proxy;
/// replica placement once Pods are visible (none in the emulator at first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_of_the_install_answers() {
    let (emu, _webhook, home) = installed(None).await;
    let kubeconfig = home.path().join("kubeconfig");
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        line(&out, "PASS", "webhook statefulset")
            .contains("nodegate/nodegate-webhook: 2/2 available")
    );
    let lines = line(&out, "PASS", "webhook lines");
    assert!(
        lines.contains("first line nodes.nodegate.dev → nodegate/nodegate-webhook, then replica-0.nodes.nodegate.dev → nodegate/nodegate-webhook-0 (Pod nodegate-webhook-0), replica-1.nodes.nodegate.dev → nodegate/nodegate-webhook-1 (Pod nodegate-webhook-1)")
            && lines.contains("failurePolicy Ignore and reinvocationPolicy Never on every line"),
        "{lines}"
    );
    for (l, svc) in [
        ("nodes.nodegate.dev", "nodegate-webhook"),
        ("replica-0.nodes.nodegate.dev", "nodegate-webhook-0"),
        ("replica-1.nodes.nodegate.dev", "nodegate-webhook-1"),
    ] {
        let got = line(&out, "PASS", &format!("line {l} "));
        assert!(
            got.contains(&format!("nodegate/{svc}:443/mutate through the API server's service proxy allowed a Node CREATE with a patch adding [\"{DEFAULT_TAINT}\"]")),
            "{got}"
        );
    }
    assert!(
        line(&out, "PASS", "serving certificate").contains(
            "for nodegate-webhook.nodegate.svc, nodegate-webhook-0.nodegate.svc, nodegate-webhook-1.nodegate.svc"
        )
    );
    assert!(line(&out, "SKIP", "replica placement").contains("no scheduled Pod"));
    assert!(line(&out, "PASS", "api server counters").contains(
        "for nodes.nodegate.dev, replica-0.nodes.nodegate.dev, replica-1.nodes.nodegate.dev"
    ));

    emu.apply(&webhook_pod(0, "n1")).unwrap();
    emu.apply(&webhook_pod(1, "n2")).unwrap();
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "PASS", "replica placement").contains(
        "replica-0.nodes.nodegate.dev → nodegate-webhook-0 on n1, replica-1.nodes.nodegate.dev → nodegate-webhook-1 on n2"
    ));
    emu.apply(&webhook_pod(1, "n1")).unwrap();
    let (code, out) = check(&kubeconfig, &[]);
    assert_eq!(code, 0, "{out}");
    let l = line(&out, "WARN", "replica placement");
    assert!(
        l.contains("replica-0.nodes.nodegate.dev and replica-1.nodes.nodegate.dev run on node n1")
            && l.contains("one node failure takes those lines at once"),
        "{l}"
    );
}

/// The direct call goes through the API server's service proxy, whose URL
/// the API server's audit log records: it posts to `/mutate`, never to the
/// line's `/mutate/<token>`. Replica 1's Service leads to a stand-in that
/// records what was proxied to it and answers as the webhook does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_direct_call_never_sends_the_path_token() {
    let (emu, webhook, home) = installed(None).await;
    let token = webhook.path_token().unwrap().to_string();
    let gate: TaintSpec = DEFAULT_TAINT.parse().unwrap();
    let add = serde_json::json!([{"op": "add", "path": "/spec/taints/-", "value": gate.to_json()}]);
    let standin = FakeWebhook::start("nodegate-webhook-1", "nodegate", move |_| FakeReply {
        patch: Some(add.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
    emu.set_service_endpoint(standin.service(), standin.addr());
    let (_, out) = check(&home.path().join("kubeconfig"), &[]);
    let got = line(&out, "PASS", "line replica-1.nodes.nodegate.dev ");
    assert!(!got.contains(&token), "{got}");
    assert!(!out.contains(&token), "the report shows the token:\n{out}");
    // The check's own reviews, not the API server's admission calls.
    let proxied: Vec<String> = standin
        .requests()
        .iter()
        .filter(|r| {
            r["review"]["request"]["uid"]
                .as_str()
                .is_some_and(|u| u.starts_with("nodegate-check-"))
        })
        .map(|r| r["uri"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(proxied.len(), 1, "{proxied:?}");
    for uri in &proxied {
        assert!(!uri.contains(&token), "{uri}");
        assert!(uri.starts_with("/mutate?timeout="), "{uri}");
    }
    // The real replica answered the other lines there, and its count of
    // reviews that asked for a write without the token stays at 0.
    line(&out, "PASS", "line replica-0.nodes.nodegate.dev ");
    let metrics = webhook.metrics().await.unwrap();
    let refused: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("nodegate_webhook_unauthenticated_side_effects_total"))
        .collect();
    assert!(!refused.is_empty(), "{metrics}");
    assert!(refused.iter().all(|l| l.ends_with(" 0")), "{refused:?}");
}

/// A configuration with the first line only, beside the StatefulSet: every
/// replica lacks its backup line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_without_backup_lines() {
    let mut cfg = shipped_config();
    cfg["webhooks"].as_array_mut().unwrap().truncate(1);
    let (_emu, _webhook, home) = installed(Some(serde_yaml::to_string(&cfg).unwrap())).await;
    let (code, out) = check(&home.path().join("kubeconfig"), &[]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "FAIL", "webhook lines");
    assert!(
        l.contains("no backup line for replica nodegate-webhook-0, nodegate-webhook-1 of StatefulSet nodegate/nodegate-webhook")
            && l.contains("nodegate-webhook webhook-config --replicas 2"),
        "{l}"
    );
    line(&out, "PASS", "line nodes.nodegate.dev");
    assert!(!out.contains("line replica-"), "{out}");
    line(&out, "PASS", "canary dry-run create");
}

/// An install from before the StatefulSet: a Deployment and one line of
/// admission. It works, with the risk the backup lines remove: a warning.
/// `--deployment`, the flag's former name, still names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warns_on_an_install_from_before_the_statefulset() {
    use k8s_openapi::api::apps::v1::StatefulSet;
    let mut cfg = shipped_config();
    cfg["webhooks"].as_array_mut().unwrap().truncate(1);
    let (emu, _webhook, home) = installed(Some(serde_yaml::to_string(&cfg).unwrap())).await;
    let admin = emu.client(users::ADMIN).await.unwrap();
    let sets: kube::Api<StatefulSet> = kube::Api::namespaced(admin, "nodegate");
    let mut deploy = serde_json::to_value(sets.get("nodegate-webhook").await.unwrap()).unwrap();
    sets.delete("nodegate-webhook", &Default::default())
        .await
        .unwrap();
    // The older manifest: the same Pod template in a Deployment.
    deploy["kind"] = serde_json::json!("Deployment");
    deploy["metadata"] = serde_json::json!({"name": "nodegate-webhook", "namespace": "nodegate"});
    let spec = deploy["spec"].as_object_mut().unwrap();
    for k in [
        "serviceName",
        "podManagementPolicy",
        "updateStrategy",
        "persistentVolumeClaimRetentionPolicy",
        "revisionHistoryLimit",
    ] {
        spec.remove(k);
    }
    deploy["status"] = deployment_status(2, 2);
    emu.apply(&deploy.to_string()).unwrap();
    let kubeconfig = home.path().join("kubeconfig");
    for args in [&[][..], &["--deployment", "nodegate-webhook"][..]] {
        let (code, out) = check(&kubeconfig, args);
        assert_eq!(code, 0, "{out}");
        assert!(
            line(&out, "PASS", "webhook deployment")
                .contains("nodegate/nodegate-webhook: 2/2 available")
        );
        let l = line(&out, "WARN", "webhook lines");
        assert!(
            l.contains("Deployment nodegate/nodegate-webhook (an install from before the per-replica lines): one line of admission")
                && l.contains("docs/webhook.md"),
            "{l}"
        );
        line(&out, "PASS", "strict mode");
    }
    let (code, out) = check(&kubeconfig, &["--statefulset", "other"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        line(&out, "FAIL", "webhook statefulset")
            .contains("StatefulSet nodegate/other not found (nor a Deployment of that name)")
    );
    let l = line(&out, "WARN", "webhook lines");
    assert!(
        l.contains("the configuration has the first line only"),
        "{l}"
    );
}

/// A backup line whose Service has no endpoint (its replica gone): that
/// line's direct call fails and names it; the others still answer, and the
/// canary passes through the first line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_the_line_of_a_service_without_endpoint() {
    let (emu, _webhook, home) = installed(None).await;
    emu.remove_service_endpoint("nodegate-webhook-1.nodegate.svc");
    let (code, out) = check(&home.path().join("kubeconfig"), &[]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "FAIL", "line replica-1.nodes.nodegate.dev");
    assert!(
        l.contains("POST to nodegate/nodegate-webhook-1:443/mutate through the API server's service proxy answered HTTP 503: no endpoints available for service \"nodegate-webhook-1\": this line fails open"),
        "{l}"
    );
    line(&out, "PASS", "line nodes.nodegate.dev");
    line(&out, "PASS", "line replica-0.nodes.nodegate.dev");
    line(&out, "PASS", "canary dry-run create");
    assert_eq!(failed(&out).len(), 1, "only that line fails: {out}");
}

/// `reinvocationPolicy: IfNeeded` on a backup line: named, and failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_a_line_that_is_reinvoked() {
    let mut cfg = shipped_config();
    cfg["webhooks"][2]["reinvocationPolicy"] = serde_json::json!("IfNeeded");
    let (_emu, _webhook, home) = installed(Some(serde_yaml::to_string(&cfg).unwrap())).await;
    let (code, out) = check(&home.path().join("kubeconfig"), &[]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "FAIL", "webhook lines");
    assert!(
        l.contains("replica-1.nodes.nodegate.dev has reinvocationPolicy IfNeeded: a line that failed open is called again after a later line's patch, so a dead replica costs a second timeout; set Never"),
        "{l}"
    );
    assert!(!l.contains("replica-0.nodes.nodegate.dev has"), "{l}");
}

/// Without `create` on `services/proxy`, the lines cannot be called
/// directly: a warning per line, not a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warns_when_the_service_proxy_is_forbidden() {
    const CHECKER: &str = "checker";
    let reader = vec![
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "checker"},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]},
                      {"apiGroups": [""], "resources": ["nodes"], "verbs": ["create"]}]})
        .to_string(),
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "checker"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "checker"},
            "subjects": [{"kind": "User", "name": CHECKER}]})
        .to_string(),
    ];
    let (emu, _webhook, home) = installed_full(None, None, &[], reader).await;
    let kubeconfig = home.path().join("kubeconfig-checker");
    std::fs::write(&kubeconfig, emu.kubeconfig_yaml(CHECKER)).unwrap();
    let (_, out) = check(&kubeconfig, &[]);
    for l in [
        "nodes.nodegate.dev",
        "replica-0.nodes.nodegate.dev",
        "replica-1.nodes.nodegate.dev",
    ] {
        let got = line(&out, "WARN", &format!("line {l} "));
        assert!(
            got.contains(
                "not called: nodegate-check may not create services/proxy in namespace nodegate"
            ) && got.contains("User \"checker\" cannot create resource \"services/proxy\""),
            "{got}"
        );
    }
    line(&out, "PASS", "canary dry-run create");
    line(&out, "PASS", "webhook lines");
}

/// Replica 1 still serves a certificate of an earlier CA (same names, same
/// CA name) while the Secret and every caBundle moved on: the Secret
/// comparison passes, the service proxy answers (it verifies nothing), and
/// only dialling each replica finds it — on every line that reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_the_replica_that_serves_a_certificate_its_line_does_not_trust() {
    let (emu, webhook, home) = installed(None).await;
    let stale = WebhookProcess::start(WebhookOptions {
        path_token: true,
        ..Default::default()
    })
    .await
    .unwrap();
    assert_ne!(stale.ca_pem(), webhook.ca_pem());
    emu.set_service_endpoint("nodegate-webhook-1.nodegate.svc", stale.https_addr());
    endpoint_slices(&emu, webhook.https_addr().port(), stale.https_addr().port());
    let (code, out) = check(&home.path().join("kubeconfig"), &[]);
    assert_eq!(code, 1, "{out}");
    for l in ["nodes.nodegate.dev", "replica-0.nodes.nodegate.dev"] {
        let got = line(
            &out,
            "PASS",
            &format!("served cert {l} nodegate-webhook-0 "),
        );
        assert!(
            got.contains(&format!(
                "127.0.0.1:{} (node node-of-nodegate-webhook-0) serves a chain {l}'s caBundle verifies for",
                webhook.https_addr().port()
            )) && got.contains("CN=nodegate-webhook") && got.contains(", expires "),
            "{got}"
        );
    }
    for l in ["nodes.nodegate.dev", "replica-1.nodes.nodegate.dev"] {
        let got = line(
            &out,
            "FAIL",
            &format!("served cert {l} nodegate-webhook-1 "),
        );
        assert!(
            got.contains(&format!(
                "127.0.0.1:{} (node node-of-nodegate-webhook-1) serves CN=",
                stale.https_addr().port()
            )) && got.contains("not signed by a CA of the line's caBundle")
                && got.contains(&format!(
                    "the API server fails {l}'s calls that reach this replica"
                )),
            "{got}"
        );
    }
    // What the check saw before: the Secret verifies, the proxy answers.
    line(&out, "PASS", "serving certificate");
    line(&out, "PASS", "line replica-1.nodes.nodegate.dev");
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("FAIL  served cert"))
            .count(),
        2,
        "{out}"
    );
}

/// Endpoints the check cannot reach (a closed port here; a firewall or
/// another network in practice) warn, say that only the Secret was
/// compared and where to run the check; a line without ready endpoints is
/// skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warns_when_a_replica_cannot_be_reached_from_here() {
    let (emu, webhook, home) = installed(None).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    endpoint_slices(&emu, webhook.https_addr().port(), port);
    let mut not_ready: serde_json::Value = serde_json::from_str(&endpoint_slice(
        "nodegate-webhook-1-r1",
        "nodegate-webhook-1",
        port,
        &["nodegate-webhook-1"],
    ))
    .unwrap();
    not_ready["endpoints"][0]["conditions"]["ready"] = serde_json::json!(false);
    emu.apply(&not_ready.to_string()).unwrap();
    let (code, out) = check(
        &home.path().join("kubeconfig"),
        &["--replica-connect-timeout", "2s"],
    );
    assert_eq!(code, 0, "{out}");
    let got = line(
        &out,
        "WARN",
        "served cert nodes.nodegate.dev nodegate-webhook-1 ",
    );
    assert!(
        got.contains(&format!("127.0.0.1:{port} (node node-of-nodegate-webhook-1) not reached from here (TCP connect: "))
            && got.contains("only the Secret's certificate was compared with the caBundle (`serving certificate`), not what this replica serves; run nodegate-check where the replicas' node addresses are reachable on port"),
        "{got}"
    );
    line(
        &out,
        "PASS",
        "served cert replica-0.nodes.nodegate.dev nodegate-webhook-0 ",
    );
    let skipped = line(&out, "SKIP", "served cert replica-1.nodes.nodegate.dev ");
    assert!(
        skipped.contains("no ready endpoint behind nodegate-webhook-1.nodegate.svc (1 not ready)"),
        "{skipped}"
    );
}
