//! The service proxy: `create` on `services/proxy` authorizes (kubelets
//! refused), the Service and its port resolve to the emulator's service
//! endpoints (503 without one), and the request is forwarded over TLS whose
//! certificate nobody verifies.

use nodegate_emulator::fake_webhook::{FakeReply, FakeWebhook};
use nodegate_emulator::{Emulator, EmulatorOptions};
use serde_json::{Value, json};

const PROBER: &str = "prober";

/// `user` may proxy to Services in `nodegate`; everyone else may not.
fn rbac() -> Vec<String> {
    vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "proxy", "namespace": "nodegate"},
               "rules": [{"apiGroups": [""], "resources": ["services/proxy"], "verbs": ["create"]}]})
        .to_string(),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "proxy", "namespace": "nodegate"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "proxy"},
               "subjects": [{"kind": "User", "name": PROBER}]})
        .to_string(),
    ]
}

/// POSTs `body` to `path` as `user`: status and JSON answer.
async fn post(emu: &Emulator, user: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = emu
        .raw(
            Some(user),
            "POST",
            path,
            "application/json",
            serde_json::to_vec(body).unwrap(),
        )
        .await
        .unwrap();
    (r.status, r.json().unwrap_or(Value::Null))
}

/// Refused without `create` on `services/proxy`, 503 while the Service
/// has no endpoint, forwarded (path, body and answer) once it has one,
/// over TLS whose certificate nobody verifies.
#[tokio::test]
async fn authorizes_resolves_and_forwards() {
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(rbac()),
        ..Default::default()
    })
    .await
    .unwrap();
    emu.apply(
        &json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "hook", "namespace": "nodegate"},
                "spec": {"selector": {"app": "hook"},
                         "ports": [{"name": "https", "port": 443, "targetPort": "https"}]}})
        .to_string(),
    )
    .unwrap();
    let fake = FakeWebhook::start("hook", "nodegate", |_| FakeReply {
        warnings: vec!["seen".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let path = "/api/v1/namespaces/nodegate/services/https:hook:443/proxy/mutate";
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                        "request": {"uid": "u-1"}});

    let (code, status) = post(&emu, "someone", path, &review).await;
    assert_eq!(code, 403, "{status}");
    let msg = status["message"].as_str().unwrap();
    assert!(
        msg.contains("services \"https:hook:443\" is forbidden")
            && msg.contains("cannot create resource \"services/proxy\"")
            && msg.contains("in the namespace \"nodegate\""),
        "{msg}"
    );
    let (code, _) = post(&emu, "system:node:n1", path, &review).await;
    assert_eq!(code, 403, "kubelets may not proxy");

    let (code, status) = post(&emu, PROBER, path, &review).await;
    assert_eq!(code, 503, "{status}");
    assert_eq!(status["reason"], "ServiceUnavailable");
    assert_eq!(
        status["message"],
        "no endpoints available for service \"hook\""
    );

    emu.set_service_endpoint("hook.nodegate.svc", fake.addr());
    let (code, answer) = post(&emu, PROBER, path, &review).await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["response"]["uid"], "u-1");
    assert_eq!(answer["response"]["warnings"], json!(["seen"]));
    let seen = fake.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0]["uri"], "/mutate");
    assert_eq!(seen[0]["review"], review);

    // The port by name works too; an undeclared one and an unknown
    // Service do not reach the endpoint.
    let by_name = "/api/v1/namespaces/nodegate/services/https:hook:https/proxy/mutate";
    assert_eq!(post(&emu, PROBER, by_name, &review).await.0, 200);
    let (code, status) = post(
        &emu,
        PROBER,
        "/api/v1/namespaces/nodegate/services/https:hook:8443/proxy/mutate",
        &review,
    )
    .await;
    assert_eq!(code, 503);
    assert_eq!(
        status["message"],
        "no service port 8443 found for service \"hook\""
    );
    let (code, status) = post(
        &emu,
        PROBER,
        "/api/v1/namespaces/nodegate/services/https:other:443/proxy/mutate",
        &review,
    )
    .await;
    assert_eq!(code, 404, "{status}");
    assert_eq!(fake.requests().len(), 2);

    // An endpoint nothing listens on: the dial fails.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    emu.set_service_endpoint("hook.nodegate.svc", dead);
    let (code, status) = post(&emu, PROBER, path, &review).await;
    assert_eq!(code, 503, "{status}");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .starts_with("error trying to reach service: "),
        "{status}"
    );
}
