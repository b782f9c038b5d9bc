//! `manifests/components/check-rbac`: nodegate-check run with that
//! credential alone reports what it reports as a cluster admin, and the
//! credential, tried the way a thief would use it, can do nothing beyond
//! what its header states.
//!
//! Against a fresh emulator (the component's RBAC enforced, its policy
//! stored), or, with `NODEGATE_E2E_KUBECONFIG`, against that cluster: it
//! must have nodegate installed with this component (the test installs
//! nothing cluster-wide; it asks the TokenRequest API for a token of the
//! ServiceAccount `nodegate-check` and uses only that token). On a real
//! cluster the only objects it creates are Nodes named
//! `nodegate-e2e-<run>-…`, deleted when it ends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use nodegate_e2e::cluster::{Cluster, REAL_CLUSTER_ENV};
use nodegate_e2e::process::{WEBHOOK_NAMESPACE, WEBHOOK_PATH_SECRET, shipped_rbac};
use nodegate_e2e::{WebhookOptions, WebhookProcess};
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use nodegate_shared::keys::{DEFAULT_TAINT, EXCLUDE_LABEL};
use serde_json::{Value, json};

const SA: &str = "nodegate-check";
const GROUP: &str = "nodegate:check";
const PROBE_POD: &str = nodegate_check::confinement::PROBE_POD;
const NODE_CLAIM: &str = "authentication.kubernetes.io/node-name";
const POD_NAME_CLAIM: &str = "authentication.kubernetes.io/pod-name";
const POD_UID_CLAIM: &str = "authentication.kubernetes.io/pod-uid";

fn component(file: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../manifests/components/check-rbac")
        .join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn documents(file: &str) -> Vec<Value> {
    nodegate_emulator::server::parse_documents(&component(file)).unwrap()
}

/// An EndpointSlice of `service` with both replicas at `port` on loopback
/// (one process serves every replica here).
fn endpoint_slice(service: &str, port: u16, pods: &[&str]) -> String {
    let endpoints: Vec<Value> = pods
        .iter()
        .map(|p| {
            json!({"addresses": ["127.0.0.1"], "conditions": {"ready": true},
                   "targetRef": {"kind": "Pod", "namespace": WEBHOOK_NAMESPACE, "name": p}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": format!("{service}-slice"), "namespace": WEBHOOK_NAMESPACE,
                        "labels": {"kubernetes.io/service-name": service}},
           "addressType": "IPv4", "endpoints": endpoints,
           "ports": [{"name": "https", "port": port, "protocol": "TCP"}]})
    .to_string()
}

/// A fresh emulator with nodegate installed as the README says, this
/// component's RBAC enforced beside the shipped one and its policy stored;
/// or the real cluster.
async fn cluster() -> Cluster {
    if std::env::var_os(REAL_CLUSTER_ENV).is_some() {
        return Cluster::start().await.unwrap();
    }
    let mut rbac = shipped_rbac().unwrap();
    rbac.push(component("rbac.yaml"));
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(rbac),
        ..Default::default()
    })
    .await
    .unwrap();
    let webhook = WebhookProcess::start(WebhookOptions {
        kubeconfig: Some(emu.kubeconfig(users::WEBHOOK).unwrap()),
        path_token: true,
        ..Default::default()
    })
    .await
    .unwrap();
    webhook.attach(&emu, None).unwrap();
    webhook.install_objects(&emu).unwrap();
    // Through the emulator's validation: its CEL compiles.
    emu.apply(&component("policy.yaml")).unwrap();
    let port = webhook.https_addr().port();
    let (r0, r1) = ("nodegate-webhook-0", "nodegate-webhook-1");
    for (svc, pods) in [
        ("nodegate-webhook", vec![r0, r1]),
        (r0, vec![r0]),
        (r1, vec![r1]),
    ] {
        emu.apply(&endpoint_slice(svc, port, &pods)).unwrap();
    }
    Cluster::Emulated {
        emu,
        webhook: Box::new(webhook),
        scratch: tempfile::tempdir().unwrap(),
    }
}

/// The kubeconfig of the cluster's admin (the test's own on a real cluster).
fn admin_kubeconfig(cluster: &Cluster, dir: &Path) -> PathBuf {
    match cluster {
        Cluster::Emulated { emu, .. } => {
            let p = dir.join("kubeconfig-admin");
            std::fs::write(&p, emu.kubeconfig_yaml(users::ADMIN)).unwrap();
            p
        }
        Cluster::Real { kubeconfig, .. } => kubeconfig.clone(),
    }
}

/// A kubeconfig holding only a fresh token of the ServiceAccount
/// nodegate-check, as the component's README tells an operator to get it.
async fn check_kubeconfig(cluster: &Cluster, dir: &Path) -> PathBuf {
    let admin = cluster.client(users::ADMIN).await.unwrap();
    let sas: Api<ServiceAccount> = Api::namespaced(admin, WEBHOOK_NAMESPACE);
    let request = TokenRequest {
        spec: k8s_openapi::api::authentication::v1::TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(900),
            bound_object_ref: None,
        },
        ..Default::default()
    };
    let token = sas
        .create_token_request(SA, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| {
            panic!("a token of {WEBHOOK_NAMESPACE}/{SA} (is manifests/components/check-rbac installed?): {e}")
        })
        .status
        .expect("TokenRequest without status")
        .token;
    let mut kc = kube::config::Kubeconfig::read_from(admin_kubeconfig(cluster, dir)).unwrap();
    let context = kc.current_context.clone().unwrap();
    let user = kc
        .contexts
        .iter()
        .find(|c| c.name == context)
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.user.clone())
        .unwrap();
    let entry = kc.auth_infos.iter_mut().find(|a| a.name == user).unwrap();
    // The token only: no client certificate, plugin or impersonation.
    entry.auth_info = Some(kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    });
    let p = dir.join("kubeconfig-nodegate-check");
    std::fs::write(&p, serde_json::to_vec(&kc).unwrap()).unwrap();
    // On a real cluster: the component must be installed, or every line
    // below would fail for that reason alone.
    let check = kube::Client::try_from(client_of(&p).await).unwrap();
    if let Err(e) = Api::<Node>::all(check)
        .list(&ListParams::default().limit(1))
        .await
    {
        panic!(
            "{WEBHOOK_NAMESPACE}/{SA} may not list Nodes ({e}): install manifests/components/check-rbac (rbac.yaml and policy.yaml) first"
        );
    }
    p
}

async fn client_of(kubeconfig: &Path) -> kube::Config {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap()
}

/// Runs the real binary; returns its exit code and stdout.
fn run_check(kubeconfig: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nodegate-check"))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", kubeconfig.parent().unwrap())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!(
        "--- nodegate-check as {}\n{stdout}{}",
        kubeconfig.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), stdout)
}

/// Every report line, in order, with what changes from one run to the next
/// masked: the canary's random name, and the days a certificate has left
/// (a second later, one day less).
fn verdicts(out: &str) -> Vec<String> {
    const CANARY: &str = "nodegate-check-";
    out.lines()
        .filter(|l| {
            ["PASS  ", "FAIL  ", "WARN  ", "SKIP  "]
                .iter()
                .any(|s| l.starts_with(s))
        })
        .map(|l| match l.find(" (in ") {
            Some(i) => {
                let end = l[i..].find(')').map_or(l.len(), |j| i + j + 1);
                format!("{} (in <days>){}", &l[..i], &l[end..])
            }
            None => l.to_string(),
        })
        .map(|l| {
            let l = l.as_str();
            let mut masked = String::new();
            let mut rest = l;
            while let Some(i) = rest.find(CANARY) {
                let (head, tail) = rest.split_at(i + CANARY.len());
                masked.push_str(head);
                let hex = tail.chars().take_while(char::is_ascii_hexdigit).count();
                if hex == 8 {
                    masked.push_str("<random>");
                    rest = &tail[8..];
                } else {
                    rest = tail;
                }
            }
            masked.push_str(rest);
            masked
        })
        .collect()
}

/// A Node for the probe and the attacks, tainted by the webhook as any new
/// Node is; on a real cluster deleted at the end.
async fn fixture_node(cluster: &Cluster) -> String {
    let name = cluster.node_name("check-rbac");
    let admin = cluster.client(users::ADMIN).await.unwrap();
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"nodeInfo": {"bootID": "boot-1"}},
    }))
    .unwrap();
    Api::<Node>::all(admin)
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    name
}

/// The same verdict for every line as the cluster admin's, and none of
/// them held back by a missing permission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_reports_the_same_with_its_own_credential_as_with_an_admin() {
    let cluster = cluster().await;
    let _node = fixture_node(&cluster).await;
    let dir = tempfile::tempdir().unwrap();
    let (admin_code, admin) = run_check(&admin_kubeconfig(&cluster, dir.path()));
    let (code, scoped) = run_check(&check_kubeconfig(&cluster, dir.path()).await);
    assert_eq!(verdicts(&scoped), verdicts(&admin));
    assert!(verdicts(&scoped).len() > 20, "{scoped}");
    assert_eq!(code, admin_code);
    for l in scoped.lines() {
        let lower = l.to_lowercase();
        assert!(
            !lower.contains("forbidden")
                && !lower.contains("cannot impersonate")
                && !lower.contains(" 403")
                && !lower.contains("may not create services/proxy"),
            "a permission is missing: {l}"
        );
    }
    if !cluster.is_real() {
        // Here every line can pass: the ones that need a permission of
        // their own, each checked.
        assert_eq!(code, 0, "{scoped}");
        for check in [
            "webhook configuration",
            "serving certificate",
            "served cert nodes.nodegate.dev nodegate-webhook-0",
            "served cert nodes.nodegate.dev nodegate-webhook-1",
            "served cert replica-0.nodes.nodegate.dev nodegate-webhook-0",
            "served cert replica-1.nodes.nodegate.dev nodegate-webhook-1",
            "webhook lines",
            "canary dry-run create",
            "line nodes.nodegate.dev",
            "line replica-0.nodes.nodegate.dev",
            "line replica-1.nodes.nodegate.dev",
            "api server counters",
            "credential confinement",
            "confinement dry-run",
            "confinement namespace",
            "forged reviews",
            "cilium operator",
            "released taints",
            "karpenter",
            "cluster autoscaler",
        ] {
            assert!(
                scoped
                    .lines()
                    .any(|l| l.starts_with(&format!("PASS  {check} "))),
                "no `PASS  {check}` line:\n{scoped}"
            );
        }
    }
}

fn assert_forbidden<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) -> String {
    match r {
        Err(kube::Error::Api(e)) if e.code == 403 => e.message,
        other => panic!("{what}: want 403, got {other:?}"),
    }
}

/// A raw request with the check's credential: its HTTP status.
async fn status_of(client: &kube::Client, method: http::Method, path: &str) -> u16 {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(kube::client::Body::from(b"{}".to_vec()))
        .unwrap();
    client.send(req).await.unwrap().status().as_u16()
}

/// A client of the check's credential impersonating `user` (with `groups`
/// and `extra`, if any).
fn impersonating(
    cfg: &kube::Config,
    user: &str,
    groups: &[&str],
    extra: &[(&str, &str)],
) -> kube::Client {
    let mut cfg = cfg.clone();
    cfg.auth_info.impersonate = Some(user.to_string());
    cfg.auth_info.impersonate_groups =
        (!groups.is_empty()).then(|| groups.iter().map(ToString::to_string).collect());
    cfg.auth_info.impersonate_user_extra = (!extra.is_empty()).then(|| {
        extra
            .iter()
            .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
            .collect()
    });
    kube::Client::try_from(cfg).unwrap()
}

/// The agent's gate on `node` gone, as a merge patch of its taints.
async fn without_gate(admin: &kube::Client, node: &str) -> Value {
    let n = Api::<Node>::all(admin.clone()).get(node).await.unwrap();
    let gate: nodegate_shared::TaintSpec = DEFAULT_TAINT.parse().unwrap();
    let taints: Vec<Value> = n
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| serde_json::to_value(t).unwrap())
        .collect();
    assert!(
        gate.is_in(&taints),
        "the webhook tainted {node}: {taints:?}"
    );
    let kept: Vec<&Value> = taints
        .iter()
        .filter(|t| !gate.is_in(&[(*t).clone()]))
        .collect();
    json!({"spec": {"taints": kept}})
}

/// What a thief holding the check's token tries, and what it gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_check_credential_can_do_no_more_than_its_header_says() {
    let cluster = cluster().await;
    let node = fixture_node(&cluster).await;
    let admin = cluster.client(users::ADMIN).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = client_of(&check_kubeconfig(&cluster, dir.path()).await).await;
    let check = kube::Client::try_from(cfg.clone()).unwrap();
    let nodes = Api::<Node>::all(check.clone());

    // Nodes: no write but a dry-run.
    let m = assert_forbidden(
        "label a Node",
        nodes
            .patch(
                &node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {EXCLUDE_LABEL: "true"}}})),
            )
            .await,
    );
    assert!(m.contains("patch"), "{m}");
    assert_forbidden(
        "delete a Node",
        nodes.delete(&node, &DeleteParams::default()).await,
    );
    let fake = cluster.node_name("check-rbac-fake");
    let fake_node: Node = serde_json::from_value(json!({"metadata": {"name": fake}})).unwrap();
    let m = assert_forbidden(
        "register a Node",
        nodes.create(&PostParams::default(), &fake_node).await,
    );
    assert!(
        m.contains("ValidatingAdmissionPolicy 'nodegate-check-dry-run-only'")
            && m.contains("may only make dry-run requests, not CREATE nodes"),
        "{m}"
    );
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    nodes.create(&dry, &fake_node).await.unwrap();
    assert!(
        Api::<Node>::all(admin.clone())
            .get_opt(&fake)
            .await
            .unwrap()
            .is_none()
    );

    // Secrets: the two it names, nothing else.
    let secrets = Api::<Secret>::namespaced(check.clone(), WEBHOOK_NAMESPACE);
    secrets.get(WEBHOOK_PATH_SECRET).await.unwrap();
    for other in ["nodegate-check-other", "nodegate-webhook-token"] {
        assert_forbidden(&format!("get Secret {other}"), secrets.get(other).await);
    }
    assert_forbidden(
        "list Secrets in nodegate",
        secrets.list(&ListParams::default()).await,
    );
    assert_forbidden(
        "list Secrets everywhere",
        Api::<Secret>::all(check.clone())
            .list(&ListParams::default())
            .await,
    );
    assert_forbidden(
        "get another ConfigMap in kube-system",
        Api::<ConfigMap>::namespaced(check.clone(), "kube-system")
            .get("coredns")
            .await,
    );

    // The service proxy: the webhook's Services on https:443, POST only.
    for id in [
        "https:nodegate-webhook-other:443",
        "http:nodegate-webhook:443",
        "nodegate-webhook:443",
        "nodegate-webhook",
        "https:nodegate-webhook:9443",
    ] {
        let path = format!("/api/v1/namespaces/{WEBHOOK_NAMESPACE}/services/{id}/proxy/");
        assert_eq!(
            status_of(&check, http::Method::POST, &path).await,
            403,
            "POST {path}"
        );
    }
    for (method, path) in [
        (
            http::Method::POST,
            "/api/v1/namespaces/kube-system/services/https:kube-dns:443/proxy/",
        ),
        (
            http::Method::GET,
            "/api/v1/namespaces/nodegate/services/https:nodegate-webhook:443/proxy/",
        ),
    ] {
        assert_eq!(
            status_of(&check, method.clone(), path).await,
            403,
            "{method} {path}"
        );
    }

    // Impersonation: the agent's account with the probe's pod claims only.
    let agent = format!("system:serviceaccount:{WEBHOOK_NAMESPACE}:nodegate-agent");
    let probe = [
        (NODE_CLAIM, node.as_str()),
        (POD_NAME_CLAIM, PROBE_POD),
        (POD_UID_CLAIM, PROBE_POD),
    ];
    let cases: Vec<(&str, kube::Client)> = vec![
        ("an admin user", impersonating(&cfg, "admin", &[], &[])),
        (
            "system:masters",
            impersonating(&cfg, "nodegate-check-thief", &["system:masters"], &[]),
        ),
        (
            "the agent in system:masters",
            impersonating(&cfg, &agent, &["system:masters"], &probe),
        ),
        (
            "the webhook's account",
            impersonating(
                &cfg,
                &format!("system:serviceaccount:{WEBHOOK_NAMESPACE}:nodegate-webhook"),
                &[],
                &[],
            ),
        ),
        (
            "the roster publisher's account",
            impersonating(
                &cfg,
                &format!("system:serviceaccount:{WEBHOOK_NAMESPACE}:nodegate-roster"),
                &[],
                &[],
            ),
        ),
        (
            "the agent of another namespace",
            impersonating(
                &cfg,
                "system:serviceaccount:kube-system:nodegate-agent",
                &[],
                &probe,
            ),
        ),
        (
            "the agent with another pod's claims",
            impersonating(
                &cfg,
                &agent,
                &[],
                &[
                    (NODE_CLAIM, node.as_str()),
                    (POD_NAME_CLAIM, "nodegate-agent-x"),
                    (POD_UID_CLAIM, PROBE_POD),
                ],
            ),
        ),
        (
            "the agent with a node-uid claim",
            impersonating(
                &cfg,
                &agent,
                &[],
                &[
                    (NODE_CLAIM, node.as_str()),
                    ("authentication.kubernetes.io/node-uid", "x"),
                ],
            ),
        ),
    ];
    for (who, client) in cases {
        assert_forbidden(
            &format!("impersonate {who}"),
            Api::<Node>::all(client)
                .list(&ListParams::default().limit(1))
                .await,
        );
    }
    // No token of another account either.
    assert_forbidden(
        "mint a token of the agent's account",
        Api::<ServiceAccount>::namespaced(check.clone(), WEBHOOK_NAMESPACE)
            .create_token_request(
                "nodegate-agent",
                &PostParams::default(),
                &TokenRequest::default(),
            )
            .await,
    );

    // What it can do, as its header says: the agent's power over any node
    // whose name it gives, confined by the agent's policy. Dry-run here.
    let as_agent = Api::<Node>::all(impersonating(&cfg, &agent, &[], &probe));
    let pp = PatchParams {
        dry_run: true,
        field_manager: Some("nodegate-e2e".into()),
        ..Default::default()
    };
    let lift = without_gate(&admin, &node).await;
    as_agent
        .patch(&node, &pp, &Patch::Merge(&lift))
        .await
        .expect("the agent's power over the named node: lift its gate");
    let m = assert_forbidden(
        "label the node as the agent",
        as_agent
            .patch(
                &node,
                &pp,
                &Patch::Merge(json!({"metadata": {"labels": {EXCLUDE_LABEL: "true"}}})),
            )
            .await,
    );
    assert!(m.contains("nodegate-agent-confinement"), "{m}");
}

/// The component grants what the code names: the webhook's Services and
/// their proxy names as the shipped configuration calls them, the probe's
/// fixed pod claims, the policies and Secrets the check reads; and it
/// renders as a kustomize component of the install.
#[test]
fn the_component_names_what_the_check_uses() {
    let docs = documents("rbac.yaml");
    let rules = |kind: &str, ns: Option<&str>| -> Vec<Value> {
        docs.iter()
            .filter(|d| {
                d["kind"] == kind
                    && d["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with(SA))
                    && ns.is_none_or(|ns| d["metadata"]["namespace"] == ns)
            })
            .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    let names = |rules: &[Value], resource: &str| -> Vec<String> {
        rules
            .iter()
            .filter(|r| {
                r["resources"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x == resource))
            })
            .flat_map(|r| r["resourceNames"].as_array().cloned().unwrap_or_default())
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect()
    };
    let ns_rules = rules("Role", Some(WEBHOOK_NAMESPACE));
    let cluster_rules = rules("ClusterRole", None);

    let shipped: Value =
        serde_yaml::from_str(&nodegate_e2e::process::shipped_webhook_config().unwrap()).unwrap();
    let mut services = Vec::new();
    let mut proxies = Vec::new();
    for hook in shipped["webhooks"].as_array().unwrap() {
        let svc = &hook["clientConfig"]["service"];
        let name = svc["name"].as_str().unwrap().to_string();
        let port = svc["port"].as_i64().unwrap_or(443);
        proxies.push(format!("https:{name}:{port}"));
        services.push(name);
    }
    assert_eq!(names(&ns_rules, "services"), services);
    assert_eq!(names(&ns_rules, "services/proxy"), proxies);
    assert_eq!(
        names(&ns_rules, "secrets"),
        [
            nodegate_e2e::process::WEBHOOK_TLS_SECRET,
            nodegate_check::path_token::SECRET
        ]
    );
    assert_eq!(names(&ns_rules, "serviceaccounts"), ["nodegate-agent"]);
    for claim in [POD_NAME_CLAIM, POD_UID_CLAIM] {
        assert_eq!(
            names(&cluster_rules, &format!("userextras/{claim}")),
            [PROBE_POD]
        );
    }
    assert_eq!(
        names(&cluster_rules, "validatingadmissionpolicies"),
        [
            nodegate_webhook::confinement::AGENT_POLICY,
            nodegate_webhook::confinement::WEBHOOK_POLICY
        ]
    );
    assert_eq!(
        names(&cluster_rules, "mutatingwebhookconfigurations"),
        [shipped["metadata"]["name"].as_str().unwrap()]
    );
    // Every binding names the ServiceAccount and the group, and only them.
    for b in docs
        .iter()
        .filter(|d| d["kind"] == "RoleBinding" || d["kind"] == "ClusterRoleBinding")
    {
        let subjects: Vec<(&str, &str)> = b["subjects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["kind"].as_str().unwrap(), s["name"].as_str().unwrap()))
            .collect();
        assert_eq!(subjects, [("ServiceAccount", SA), ("Group", GROUP)], "{b}");
    }
    // The emulator's RBAC reads it (every binding's role exists).
    nodegate_emulator::rbac::Policy::from_documents(&docs).unwrap();

    let rendered = nodegate_e2e::manifests::by_kind_and_name(
        &nodegate_e2e::manifests::kustomize("manifests", &["check-rbac"]).unwrap(),
    )
    .unwrap();
    for key in [
        ("ServiceAccount", SA),
        ("ClusterRole", SA),
        ("ClusterRole", "nodegate-check-impersonate"),
        ("Role", SA),
        ("ValidatingAdmissionPolicy", "nodegate-check-dry-run-only"),
        (
            "ValidatingAdmissionPolicyBinding",
            "nodegate-check-dry-run-only",
        ),
    ] {
        assert!(
            rendered.contains_key(&(key.0.to_string(), key.1.to_string())),
            "{key:?} not rendered"
        );
    }
    let policy = documents("policy.yaml");
    assert_eq!(policy[1]["spec"]["validationActions"], json!(["Deny"]));
}
