//! The credential of `manifests/components/check-rbac`: a fresh emulator
//! with nodegate and the component installed, or the real cluster of
//! `NODEGATE_E2E_KUBECONFIG`; a kubeconfig holding only a token of the
//! ServiceAccount `nodegate-check`, and the tools to try it as a thief would.

use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use nodegate_e2e::cluster::{Cluster, REAL_CLUSTER_ENV};
use nodegate_e2e::process::{WEBHOOK_NAMESPACE, shipped_rbac};
use nodegate_e2e::{WebhookOptions, WebhookProcess};
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use nodegate_shared::keys::DEFAULT_TAINT;
use serde_json::{Value, json};

use super::endpoints::endpoint_slices;

pub const SA: &str = "nodegate-check";
pub const GROUP: &str = "nodegate:check";
pub const PROBE_POD: &str = nodegate_check::confinement::PROBE_POD;
pub const NODE_CLAIM: &str = "authentication.kubernetes.io/node-name";
pub const POD_NAME_CLAIM: &str = "authentication.kubernetes.io/pod-name";
pub const POD_UID_CLAIM: &str = "authentication.kubernetes.io/pod-uid";

/// A file of the component.
pub fn component(file: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../manifests/components/check-rbac")
        .join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

pub fn documents(file: &str) -> Vec<Value> {
    nodegate_emulator::server::parse_documents(&component(file)).unwrap()
}

/// A fresh emulator with nodegate installed as the README says, this
/// component's RBAC enforced beside the shipped one and its policy stored;
/// or the real cluster.
pub async fn cluster() -> Cluster {
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
        kubeconfig: Some(emu.webhook_kubeconfig().unwrap()),
        path_token: true,
        ..Default::default()
    })
    .await
    .unwrap();
    webhook.attach(&emu, None).unwrap();
    webhook.install_objects(&emu).unwrap();
    // Through the emulator's validation: its CEL compiles.
    emu.apply(&component("policy.yaml")).unwrap();
    // One process serves both replicas here.
    let port = webhook.https_addr().port();
    endpoint_slices(&emu, port, port);
    Cluster::Emulated {
        emu,
        webhook: Box::new(webhook),
        scratch: tempfile::tempdir().unwrap(),
    }
}

/// The kubeconfig of the cluster's admin (the test's own on a real cluster).
pub fn admin_kubeconfig(cluster: &Cluster, dir: &Path) -> PathBuf {
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
pub async fn check_kubeconfig(cluster: &Cluster, dir: &Path) -> PathBuf {
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

pub async fn client_of(kubeconfig: &Path) -> kube::Config {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap()
}

/// Every report line, in order, with what changes from one run to the next
/// masked: the canary's random name, the days a certificate has left (a
/// second later, one day less), and every other number.
pub fn verdicts(out: &str) -> Vec<String> {
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
            // Counts move between two runs on a live cluster (DaemonSet
            // pods of fixture nodes other suites delete, the API server's
            // counters): compare the words and the verdict, not the numbers.
            let mut out = String::new();
            for c in masked.chars() {
                if c.is_ascii_digit() {
                    if !out.ends_with('#') {
                        out.push('#');
                    }
                } else {
                    out.push(c);
                }
            }
            out
        })
        .collect()
}

/// A Node for the probe and the attacks, tainted by the webhook as any new
/// Node is; on a real cluster deleted at the end.
pub async fn fixture_node(cluster: &Cluster) -> String {
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

pub fn assert_forbidden<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) -> String {
    match r {
        Err(kube::Error::Api(e)) if e.code == 403 => e.message,
        other => panic!("{what}: want 403, got {other:?}"),
    }
}

/// A raw request with the check's credential: its HTTP status.
pub async fn status_of(client: &kube::Client, method: http::Method, path: &str) -> u16 {
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
pub fn impersonating(
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
pub async fn without_gate(admin: &kube::Client, node: &str) -> Value {
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
