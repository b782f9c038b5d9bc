//! nodegate installed as it ships, minus what needs a container runtime:
//! the shipped namespace, ServiceAccounts, RBAC, confinement policies,
//! Services, MutatingWebhookConfiguration (caBundle patched in), the
//! agent's DaemonSet and the pruning component's RBAC and policy, applied
//! with kubectl; the webhook's two replicas and the roster's two replicas
//! run as host processes with their ServiceAccounts' tokens and the shipped
//! flags. The three webhook Services lose their selectors (no webhook Pods
//! exist to select) and get their endpoints by hand: the first line both
//! replicas, each backup line one.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

use super::control_plane::{ControlPlane, Proc, free_port, write_kubeconfig};
use super::pki::Pki;
use crate::process::{bin_path, manifests_dir};

/// Files of the shipped install applied here (not the webhook's
/// StatefulSet and PDB, nor the roster's Deployment: those run as processes).
const SHIPPED: [&str; 11] = [
    "namespace.yaml",
    "webhook/serviceaccount.yaml",
    "webhook/rbac.yaml",
    "webhook/service.yaml",
    "agent/serviceaccount.yaml",
    "agent/rbac.yaml",
    "agent/daemonset.yaml",
    "confinement.yaml",
    "../components/pruning/serviceaccount.yaml",
    "../components/pruning/rbac.yaml",
    "../components/pruning/policy.yaml",
];

/// Counts nodegate's own requests apart: the API server's request counter
/// has no user label, but API Priority and Fairness counts per FlowSchema.
/// The same priority level nodegate's requests get without it
/// (`service-accounts` → `workload-low`).
const ACCOUNTING: &str = r#"
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata:
  name: nodegate-scale-accounting
spec:
  matchingPrecedence: 8000
  priorityLevelConfiguration:
    name: workload-low
  distinguisherMethod:
    type: ByUser
  rules:
    - subjects:
        - kind: ServiceAccount
          serviceAccount:
            namespace: nodegate
            name: "*"
      resourceRules:
        - verbs: ["*"]
          apiGroups: ["*"]
          resources: ["*"]
          clusterScope: true
          namespaces: ["*"]
      nonResourceRules:
        - verbs: ["*"]
          nonResourceURLs: ["*"]
"#;

/// The network agent nodegate waits for, as Cilium's chart installs it: a
/// DaemonSet in kube-system that tolerates every taint, at the node-critical
/// priority, on the host network. Its Pods are created by the same
/// DaemonSet controller, under the same client limit, as the nodegate
/// agent's; the simulated kubelets start them and turn the node's network
/// ready `--network-start` later.
pub const NETWORK_AGENT: &str = "network-agent";
const NETWORK_AGENT_DS: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: network-agent
  namespace: kube-system
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: network-agent
  updateStrategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 2
  template:
    metadata:
      labels:
        app.kubernetes.io/name: network-agent
    spec:
      hostNetwork: true
      priorityClassName: system-node-critical
      tolerations:
        - operator: Exists
      containers:
        - name: agent
          image: quay.io/cilium/cilium:stand-in
"#;

pub fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    use std::io::Write;
    let mut child = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("KUBECACHEDIR", kubeconfig.with_extension("cache"))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running kubectl")?;
    if let (Some(input), Some(mut si)) = (stdin, child.stdin.take()) {
        si.write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `args` of the first container of a shipped workload.
pub fn shipped_args(file: &str) -> anyhow::Result<Vec<String>> {
    let p = manifests_dir().join(file);
    let doc: serde_json::Value = serde_yaml::from_str(&std::fs::read_to_string(&p)?)?;
    container_args(&doc).with_context(|| format!("no container args in {}", p.display()))
}

/// What an install changes in the shipped files: objects that replace the
/// shipped ones of the same kind and name (a key profile's confinement,
/// webhook configuration, DaemonSet and StatefulSet), e.g. the documents of
/// a kustomization with a component. The webhook's processes take their
/// flags from the replaced StatefulSet, the agents from the DaemonSet.
#[derive(Debug, Clone, Default)]
pub struct Variant {
    pub objects: BTreeMap<(String, String), serde_json::Value>,
}

impl Variant {
    fn get(&self, kind: &str, name: &str) -> Option<&serde_json::Value> {
        self.objects.get(&(kind.to_string(), name.to_string()))
    }

    /// The `args` of the first container of the shipped workload in `file`
    /// (`agent/daemonset.yaml`, `webhook/statefulset.yaml`), from its
    /// replacement when there is one.
    pub fn args(&self, file: &str) -> anyhow::Result<Vec<String>> {
        let p = manifests_dir().join(file);
        let doc: serde_json::Value = serde_yaml::from_str(&std::fs::read_to_string(&p)?)?;
        let (kind, name) = (doc["kind"].as_str(), doc["metadata"]["name"].as_str());
        match kind.zip(name).and_then(|(k, n)| self.get(k, n)) {
            Some(v) => {
                container_args(v).with_context(|| format!("no container args in {kind:?} {name:?}"))
            }
            None => shipped_args(file),
        }
    }

    /// The shipped file `file` with its replaced documents, as one JSON list
    /// for `kubectl apply -f -`; `None` when nothing in it is replaced.
    fn replace_in(&self, file: &Path) -> anyhow::Result<Option<String>> {
        if self.objects.is_empty() {
            return Ok(None);
        }
        let docs = nodegate_emulator::server::parse_documents(&std::fs::read_to_string(file)?)?;
        let mut replaced = false;
        let items: Vec<serde_json::Value> = docs
            .into_iter()
            .map(|d| {
                let (kind, name) = (d["kind"].as_str(), d["metadata"]["name"].as_str());
                match kind.zip(name).and_then(|(k, n)| self.get(k, n)) {
                    Some(v) => {
                        replaced = true;
                        v.clone()
                    }
                    None => d,
                }
            })
            .collect();
        Ok(replaced
            .then(|| json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()))
    }
}

fn container_args(doc: &serde_json::Value) -> Option<Vec<String>> {
    let args = doc["spec"]["template"]["spec"]["containers"][0]["args"].as_array()?;
    Some(
        args.iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect(),
    )
}

/// A token of `sa` in `nodegate` (not bound to a Pod: the webhook's and the
/// roster's policies need no node claim), valid for the run.
pub async fn sa_token(admin: &Client, sa: &str) -> anyhow::Result<String> {
    let api: Api<ServiceAccount> = Api::namespaced(admin.clone(), "nodegate");
    let req: TokenRequest = serde_json::from_value(json!({
        "spec": {"audiences": [], "expirationSeconds": 86400},
    }))?;
    let tr: TokenRequest = api
        .create_subresource("token", sa, &PostParams::default(), &req)
        .await?;
    Ok(tr.status.context("no token")?.token)
}

/// A token of `nodegate-webhook` bound to the Pod `nodegate-webhook-<i>`,
/// as the StatefulSet's replica `i` has: its `pod-name` and `pod-uid`
/// claims are what the webhook's confinement asks of a Node write. No
/// webhook Pod runs here (the replicas are processes), so the Pod is created
/// with a scheduling gate that nothing removes: it is never bound, and
/// exists only for its token to be bound to.
pub async fn webhook_pod_token(admin: &Client, i: usize) -> anyhow::Result<String> {
    let name = format!("nodegate-webhook-{i}");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "nodegate");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "nodegate",
                     "labels": {"app.kubernetes.io/part-of": "nodegate-scale"}},
        "spec": {
            "serviceAccountName": "nodegate-webhook",
            "schedulingGates": [{"name": "nodegate.dev/scale-never"}],
            "containers": [{"name": "webhook", "image": "nodegate/nodegate-webhook"}],
        },
    }))?;
    let pod = match pods.create(&PostParams::default(), &pod).await {
        Ok(p) => p,
        Err(kube::Error::Api(e)) if e.code == 409 => pods.get(&name).await?,
        Err(e) => return Err(e).context("the webhook replica's Pod"),
    };
    let uid = pod.metadata.uid.context("a Pod without uid")?;
    let api: Api<ServiceAccount> = Api::namespaced(admin.clone(), "nodegate");
    let req: TokenRequest = serde_json::from_value(json!({
        "spec": {"audiences": [], "expirationSeconds": 86400,
                 "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}},
    }))?;
    let tr: TokenRequest = api
        .create_subresource("token", "nodegate-webhook", &PostParams::default(), &req)
        .await
        .context("a token bound to the webhook replica's Pod")?;
    Ok(tr.status.context("no token")?.token)
}

#[derive(Debug)]
pub struct Install {
    pub webhooks: Vec<Proc>,
    pub rosters: Vec<Proc>,
    pub webhook_admin: Vec<String>,
}

pub async fn install(cp: &ControlPlane, pki: &Pki, admin: &Client) -> anyhow::Result<Install> {
    install_with(cp, pki, admin, &Variant::default()).await
}

/// [`install`] with `variant`'s objects in place of the shipped ones.
pub async fn install_with(
    cp: &ControlPlane,
    pki: &Pki,
    admin: &Client,
    variant: &Variant,
) -> anyhow::Result<Install> {
    let kc = &cp.admin_kubeconfig;
    apply_shipped(kc, variant)?;
    // Both replicas' addresses on the dummy interface; the API server
    // refuses loopback endpoints.
    let ips: [IpAddr; 2] = [cp.net.ip(2), cp.net.ip(3)];
    let port = free_port(ips[0])?.max(1024);
    let services = webhook_services(ips);
    for (svc, addrs) in &services {
        route_service(kc, svc, addrs, port)?;
    }
    let files = configure_webhook(cp, pki, variant, &services, &ips)?;
    let (webhooks, webhook_admin) = start_webhooks(cp, admin, variant, &ips, port, &files).await?;
    let rosters = start_rosters(cp, admin).await?;
    // The API server answers admission only once both replicas serve.
    for url in &webhook_admin {
        super::control_plane::wait_ok(
            "a webhook replica's /readyz",
            Duration::from_secs(60),
            || {
                let url = format!("{url}/readyz");
                async move { http_ok(&url).await.then_some(()) }
            },
        )
        .await?;
    }
    Ok(Install {
        webhooks,
        rosters,
        webhook_admin,
    })
}

/// The shipped files (or `variant`'s replacements), the accounting
/// FlowSchema and the stand-in network agent's DaemonSet.
fn apply_shipped(kc: &Path, variant: &Variant) -> anyhow::Result<()> {
    let base = manifests_dir();
    for f in SHIPPED {
        let file = base.join(f);
        match variant.replace_in(&file)? {
            Some(list) => kubectl(kc, &["apply", "--server-side", "-f", "-"], Some(&list))?,
            None => kubectl(
                kc,
                &["apply", "--server-side", "-f", &file.display().to_string()],
                None,
            )?,
        };
    }
    kubectl(kc, &["apply", "--server-side", "-f", "-"], Some(ACCOUNTING))?;
    kubectl(
        kc,
        &["apply", "--server-side", "-f", "-"],
        Some(NETWORK_AGENT_DS),
    )?;
    Ok(())
}

/// The three webhook Services and the replicas each routes to: the first
/// line both, each backup line its own.
fn webhook_services(ips: [IpAddr; 2]) -> [(&'static str, Vec<IpAddr>); 3] {
    [
        ("nodegate-webhook", vec![ips[0], ips[1]]),
        ("nodegate-webhook-0", vec![ips[0]]),
        ("nodegate-webhook-1", vec![ips[1]]),
    ]
}

/// `svc` without its selector (no webhook Pods exist to select), and its
/// EndpointSlice and Endpoints to `addrs` by hand.
fn route_service(kc: &Path, svc: &str, addrs: &[IpAddr], port: u16) -> anyhow::Result<()> {
    kubectl(
        kc,
        &[
            "-n",
            "nodegate",
            "patch",
            "service",
            svc,
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/spec/selector"}]"#,
        ],
        None,
    )?;
    for obj in endpoints(svc, addrs, port) {
        kubectl(
            kc,
            &["apply", "--server-side", "-f", "-"],
            Some(&obj.to_string()),
        )?;
    }
    Ok(())
}

/// The EndpointSlice and the Endpoints of `svc` to `addrs` on `port`.
fn endpoints(svc: &str, addrs: &[IpAddr], port: u16) -> [serde_json::Value; 2] {
    let eps = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{svc}-scale"), "namespace": "nodegate",
                     "labels": {"kubernetes.io/service-name": svc,
                                "endpointslice.kubernetes.io/managed-by": "nodegate-scale"}},
        "addressType": "IPv4",
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        "endpoints": addrs.iter().map(|a| json!({"addresses": [a.to_string()], "conditions": {"ready": true}})).collect::<Vec<_>>(),
    });
    let ep = json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": svc, "namespace": "nodegate"},
        "subsets": [{"addresses": addrs.iter().map(|a| json!({"ip": a.to_string()})).collect::<Vec<_>>(),
                     "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
    });
    [eps, ep]
}

/// The files the webhook's replicas serve with.
struct WebhookFiles {
    /// `tls.crt` and `tls.key` (and the CA) from `nodegate_certs::write_files`.
    tls: PathBuf,
    path_token: PathBuf,
}

/// The serving certificate for all three Services, from the cluster CA;
/// the MutatingWebhookConfiguration (or `variant`'s) applied with the CA
/// and a path token, as the README installs it: the lines call
/// /mutate/<token>, and the webhook's --path-token-file holds the token.
fn configure_webhook(
    cp: &ControlPlane,
    pki: &Pki,
    variant: &Variant,
    services: &[(&str, Vec<IpAddr>)],
    ips: &[IpAddr],
) -> anyhow::Result<WebhookFiles> {
    let dns: Vec<String> = services
        .iter()
        .flat_map(|(svc, _)| {
            [
                svc.to_string(),
                format!("{svc}.nodegate"),
                format!("{svc}.nodegate.svc"),
            ]
        })
        .collect();
    let serving = pki.serving(&dns, ips)?;
    let tls = cp.dir.join("webhook-tls");
    nodegate_certs::write_files(
        &tls,
        &cp.ca_pem,
        &nodegate_certs::ServingCert {
            cert_pem: serving.cert_pem.clone(),
            key_pem: serving.key_pem.clone(),
        },
    )?;
    let cfg = match variant.get("MutatingWebhookConfiguration", "nodegate") {
        Some(v) => serde_yaml::to_string(v)?,
        None => crate::process::shipped_webhook_config()?,
    };
    let path_token = nodegate_certs::path_token();
    let token_file = tls.join("path-token");
    std::fs::write(&token_file, &path_token)?;
    let with_ca = crate::process::with_path_token(
        &nodegate_certs::inject_ca_bundle(&cfg, &cp.ca_pem)?,
        &path_token,
    )?;
    kubectl(
        &cp.admin_kubeconfig,
        &["apply", "--server-side", "-f", "-"],
        Some(&with_ca),
    )?;
    Ok(WebhookFiles {
        tls,
        path_token: token_file,
    })
}

/// The webhook's two replicas, one on each of `ips`, as the
/// `nodegate-webhook` ServiceAccount; with their admin URLs.
async fn start_webhooks(
    cp: &ControlPlane,
    admin: &Client,
    variant: &Variant,
    ips: &[IpAddr; 2],
    port: u16,
    files: &WebhookFiles,
) -> anyhow::Result<(Vec<Proc>, Vec<String>)> {
    let log = cp.dir.join("log");
    let webhook_bin = existing("nodegate-webhook")?;
    let mut webhooks = Vec::new();
    let mut webhook_admin = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        // The confinement lets the webhook write a Node only with the token
        // of a Pod of its StatefulSet: each replica's own.
        let token = webhook_pod_token(admin, i).await?;
        let wkc = cp.dir.join(format!("webhook-{i}.kubeconfig"));
        write_kubeconfig(&wkc, &cp.server, &cp.ca_pem, None, Some(&token))?;
        let admin_port = free_port(*ip)?;
        let shipped = variant.args("webhook/statefulset.yaml")?;
        webhooks.push(Proc::spawn(
            &format!("webhook-{i}"),
            &log,
            &webhook_bin,
            &webhook_args(shipped, port, admin_port, files),
            &[
                ("KUBECONFIG", wkc.display().to_string()),
                ("POD_IP", ip.to_string()),
                ("RUST_LOG", "info".into()),
            ],
        )?);
        webhook_admin.push(format!("http://{ip}:{admin_port}"));
    }
    Ok((webhooks, webhook_admin))
}

/// The StatefulSet's flags with this replica's ports and files in place of
/// the Pod's.
fn webhook_args(
    shipped: Vec<String>,
    port: u16,
    admin_port: u16,
    files: &WebhookFiles,
) -> Vec<String> {
    shipped
        .into_iter()
        .map(|a| {
            if a.starts_with("--listen=") {
                format!("--listen=0.0.0.0:{port}")
            } else if a.starts_with("--admin-listen=") {
                format!("--admin-listen=0.0.0.0:{admin_port}")
            } else if a.starts_with("--tls-cert=") {
                format!("--tls-cert={}", files.tls.join("tls.crt").display())
            } else if a.starts_with("--tls-key=") {
                format!("--tls-key={}", files.tls.join("tls.key").display())
            } else if a.starts_with("--path-token-file=") {
                format!("--path-token-file={}", files.path_token.display())
            } else {
                a
            }
        })
        .collect()
}

/// The roster's two replicas with the Deployment's flags (leader election
/// on its Lease), as the `nodegate-roster` ServiceAccount.
async fn start_rosters(cp: &ControlPlane, admin: &Client) -> anyhow::Result<Vec<Proc>> {
    let log = cp.dir.join("log");
    let token = sa_token(admin, "nodegate-roster").await?;
    let rkc = cp.dir.join("roster.kubeconfig");
    write_kubeconfig(&rkc, &cp.server, &cp.ca_pem, None, Some(&token))?;
    let roster_bin = existing("nodegate-roster")?;
    let mut rosters = Vec::new();
    for i in 0..2 {
        let args = roster_args(shipped_args("../components/pruning/deployment.yaml")?);
        rosters.push(Proc::spawn(
            &format!("roster-{i}"),
            &log,
            &roster_bin,
            &args,
            &[
                ("KUBECONFIG", rkc.display().to_string()),
                ("POD_NAME", format!("nodegate-roster-{i}")),
                ("POD_NAMESPACE", "nodegate".into()),
                ("RUST_LOG", "info".into()),
            ],
        )?);
    }
    Ok(rosters)
}

/// The Deployment's flags with the admin port on loopback, any free one:
/// two replicas share the host.
fn roster_args(shipped: Vec<String>) -> Vec<String> {
    shipped
        .into_iter()
        .map(|a| {
            if a.starts_with("--admin-listen=") {
                "--admin-listen=127.0.0.1:0".into()
            } else {
                a
            }
        })
        .collect()
}

fn existing(name: &str) -> anyhow::Result<PathBuf> {
    let p = bin_path(name);
    if !p.exists() {
        bail!(
            "{} not found: build it first (`cargo build -p {name}` in the same profile)",
            p.display()
        );
    }
    Ok(p)
}

/// GET over plain HTTP (the admin ports): true on a 2xx.
pub async fn http_ok(url: &str) -> bool {
    http_get(url).await.is_some()
}

pub async fn http_get(url: &str) -> Option<String> {
    let out = tokio::process::Command::new("curl")
        .args(["-fsS", "--max-time", "5", url])
        .output()
        .await
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_webhook_runs_with_the_statefulsets_flags_and_this_runs_ports_and_files() {
        let shipped = shipped_args("webhook/statefulset.yaml").unwrap();
        let files = WebhookFiles {
            tls: "/s/webhook-tls".into(),
            path_token: "/s/webhook-tls/path-token".into(),
        };
        let args = webhook_args(shipped.clone(), 9000, 9001, &files);
        let replaced = [
            "--listen=0.0.0.0:9000",
            "--admin-listen=0.0.0.0:9001",
            "--tls-cert=/s/webhook-tls/tls.crt",
            "--tls-key=/s/webhook-tls/tls.key",
            "--path-token-file=/s/webhook-tls/path-token",
        ];
        assert_eq!(args.len(), shipped.len());
        for want in replaced {
            assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
        }
        let kept: Vec<_> = args
            .iter()
            .filter(|a| !replaced.contains(&a.as_str()))
            .collect();
        let flag = |a: &str| a.split('=').next().unwrap_or_default().to_string();
        for a in kept {
            assert!(shipped.contains(a), "{a} is the StatefulSet's");
            assert!(!replaced.iter().any(|r| flag(r) == flag(a)), "{a}");
        }
    }

    #[test]
    fn the_roster_keeps_its_deployments_flags_but_the_admin_port() {
        let shipped = shipped_args("../components/pruning/deployment.yaml").unwrap();
        let args = roster_args(shipped.clone());
        assert_eq!(args.len(), shipped.len());
        for (a, s) in args.iter().zip(&shipped) {
            if s.starts_with("--admin-listen=") {
                assert_eq!(a, "--admin-listen=127.0.0.1:0");
            } else {
                assert_eq!(a, s);
            }
        }
        assert!(args.iter().any(|a| a == "--admin-listen=127.0.0.1:0"));
    }

    #[test]
    fn each_backup_line_routes_to_its_own_replica() {
        let ips: [IpAddr; 2] = ["10.0.0.2".parse().unwrap(), "10.0.0.3".parse().unwrap()];
        let [(first, both), (b0, one), (b1, other)] = webhook_services(ips);
        assert_eq!((first, both), ("nodegate-webhook", ips.to_vec()));
        assert_eq!((b0, one), ("nodegate-webhook-0", vec![ips[0]]));
        assert_eq!((b1, other), ("nodegate-webhook-1", vec![ips[1]]));
        let [slice, eps] = endpoints("nodegate-webhook", &ips, 9000);
        assert_eq!(
            slice["metadata"]["labels"]["kubernetes.io/service-name"],
            "nodegate-webhook"
        );
        assert_eq!(slice["endpoints"].as_array().map(Vec::len), Some(2));
        assert_eq!(eps["subsets"][0]["ports"][0]["port"], 9000);
    }
}
