//! The emulated API server: HTTPS on a loopback port 0, per-user kubeconfigs.
//!
//! No single upstream counterpart: it wires the handlers (`api`), storage,
//! admission and authorization together, as `cmd/kube-apiserver/app/server.go`
//! (`CreateServerChain`) does for the real one.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use serde::Deserialize;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::admission::{Admission, CallRecord};
use crate::api::{self, AppState};
use crate::resources;
use crate::store::Store;
use crate::tls::{self, ServingMaterial};
use crate::users;

/// How to start an emulator.
#[derive(Debug, Clone)]
pub struct EmulatorOptions {
    /// MutatingWebhookConfiguration documents (YAML or JSON; several YAML
    /// documents per string are fine), stored before the server starts.
    pub webhook_configs: Vec<String>,
    /// Where a webhook `service` reference points: `"<svc>.<ns>.svc"` → address.
    pub service_endpoints: HashMap<String, SocketAddr>,
    /// Events kept for watches to resume from; older resourceVersions get 410.
    pub watch_history: usize,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
    /// RBAC documents (ClusterRole/Role + bindings, YAML or JSON). `None`:
    /// every authenticated user may do anything NodeRestriction allows.
    /// Admin, kubelets, the scheduler and the node controller keep their
    /// built-in access either way.
    pub rbac: Option<Vec<String>>,
}

impl Default for EmulatorOptions {
    fn default() -> Self {
        Self {
            webhook_configs: Vec::new(),
            service_endpoints: HashMap::new(),
            watch_history: 10_000,
            bookmark_interval: Duration::from_secs(5),
            rbac: None,
        }
    }
}

/// A running emulated API server. Dropping it stops serving too.
#[derive(Debug)]
pub struct Emulator {
    addr: SocketAddr,
    material: ServingMaterial,
    dir: tempfile::TempDir,
    store: Arc<Store>,
    admission: Arc<Admission>,
    shutdown: watch::Sender<bool>,
    kick: watch::Sender<u64>,
    fanout: Arc<crate::fanout::Fanout>,
    task: Option<JoinHandle<()>>,
}

/// Parses one or more YAML/JSON documents into JSON values.
pub fn parse_documents(text: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let v = Value::deserialize(doc).context("parsing YAML document")?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

impl Emulator {
    pub async fn start(opts: EmulatorOptions) -> anyhow::Result<Emulator> {
        tls::install_crypto_provider();
        let material = tls::generate_serving()?;
        let server_cfg = tls::server_config(&material)?;
        let store = Arc::new(Store::new(opts.watch_history));
        let admission = Arc::new(Admission::new(
            store.clone(),
            opts.service_endpoints.clone(),
        ));
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("binding emulator port")?;
        let addr = listener.local_addr()?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (kick, kick_rx) = watch::channel(0u64);
        let policy = match &opts.rbac {
            Some(texts) => {
                let mut docs = Vec::new();
                for t in texts {
                    docs.extend(parse_documents(t)?);
                }
                Some(crate::rbac::Policy::from_documents(&docs)?)
            }
            None => None,
        };
        let fanout = Arc::new(crate::fanout::Fanout::default());
        let state = Arc::new(AppState {
            fanout: fanout.clone(),
            store: store.clone(),
            admission: admission.clone(),
            shutdown: shutdown_rx.clone(),
            kick: kick_rx,
            bookmark_interval: opts.bookmark_interval,
            policy,
        });
        let app = axum::Router::new().fallback(api::handle).with_state(state);
        let acceptor = tokio_rustls::TlsAcceptor::from(server_cfg);
        let mut stop = shutdown_rx;
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((tcp, _)) = accepted else { continue };
                        let acceptor = acceptor.clone();
                        let app = app.clone();
                        conns.spawn(async move {
                            let Ok(tls) = acceptor.accept(tcp).await else { return };
                            let svc = TowerToHyperService::new(app);
                            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                                .serve_connection_with_upgrades(TokioIo::new(tls), svc)
                                .await;
                        });
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                    _ = stop.changed() => break,
                }
            }
            conns.abort_all();
        });
        let emu = Emulator {
            addr,
            material,
            dir: tempfile::tempdir().context("creating kubeconfig dir")?,
            store,
            admission,
            shutdown,
            kick,
            fanout,
            task: Some(task),
        };
        for cfg in &opts.webhook_configs {
            emu.apply_webhook_config(cfg)?;
        }
        Ok(emu)
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The CA that signed the server's certificate.
    pub fn ca_pem(&self) -> &str {
        &self.material.ca_pem
    }

    /// What the watches of `res` (all, or `user`'s) were sent so far.
    pub fn watch_fanout(
        &self,
        res: &crate::resources::ResourceDef,
        user: Option<&str>,
    ) -> crate::fanout::Delivered {
        self.fanout.get(res.key(), user)
    }

    /// Direct access to storage, for assertions that must not go through admission.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Drops the watch history: every older resourceVersion now gets 410.
    pub fn compact(&self) {
        self.store.compact();
    }

    /// Ends every open watch stream, as an API server restart does; clients
    /// re-watch from their last resourceVersion.
    pub fn close_watches(&self) {
        self.kick.send_modify(|k| *k += 1);
    }

    /// Writes a token-auth kubeconfig for `user` and returns its path.
    pub fn kubeconfig(&self, user: &str) -> anyhow::Result<PathBuf> {
        let safe: String = user
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = self.dir.path().join(format!("kubeconfig-{safe}"));
        std::fs::write(&path, self.kubeconfig_yaml(user)).context("writing kubeconfig")?;
        Ok(path)
    }

    /// The kubeconfig text for `user`.
    pub fn kubeconfig_yaml(&self, user: &str) -> String {
        self.kubeconfig_yaml_with_token(user, &users::token(user))
    }

    /// A kube client with the credential the agent's pod on `node` holds: a
    /// token of its ServiceAccount carrying the node claim (as the
    /// TokenRequest API issues for a pod bound to `node`).
    pub async fn agent_client(&self, node: &str) -> anyhow::Result<kube::Client> {
        let kc = kube::config::Kubeconfig::from_yaml(
            &self.kubeconfig_yaml_with_token(users::AGENT, &self.agent_token(node)),
        )?;
        let cfg =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await?;
        Ok(kube::Client::try_from(cfg)?)
    }

    /// The agent's pod-bound token for `node`: what a projected token of
    /// the DaemonSet's pod on it carries (`serviceaccount/util.go`
    /// `UserInfo`): the pod's name and uid, the node's name and, when the
    /// Node exists, its uid. The pod (`nodegate/nodegate-agent-<node>`, as
    /// the DaemonSet controller would make it) is stored if missing: a
    /// pod-bound token authenticates only while its pod exists.
    pub fn agent_token(&self, node: &str) -> String {
        let mut extra = self.pod_claims(
            "nodegate-agent",
            &format!("nodegate-agent-{node}"),
            Some(node),
        );
        extra.insert(users::NODE_NAME_EXTRA.into(), vec![node.into()]);
        if let Some(n) = self.store.get(&resources::NODES, "", node)
            && let Some(uid) = n["metadata"]["uid"].as_str()
        {
            extra.insert(users::NODE_UID_EXTRA.into(), vec![uid.into()]);
        }
        users::token_with_extra(users::AGENT, &extra)
    }

    /// The webhook's pod-bound token: the one a projected token of its
    /// StatefulSet's first Pod (`nodegate/nodegate-webhook-0`) carries.
    pub fn webhook_token(&self) -> String {
        let extra = self.pod_claims("nodegate-webhook", "nodegate-webhook-0", None);
        users::token_with_extra(users::WEBHOOK, &extra)
    }

    /// A kubeconfig with [`Emulator::webhook_token`], as the webhook's Pod
    /// has it.
    pub fn webhook_kubeconfig(&self) -> anyhow::Result<PathBuf> {
        let path = self.dir.path().join("kubeconfig-webhook-pod");
        let text = self.kubeconfig_yaml_with_token(users::WEBHOOK, &self.webhook_token());
        std::fs::write(&path, text).context("writing kubeconfig")?;
        Ok(path)
    }

    /// A kube client with [`Emulator::webhook_token`].
    pub async fn webhook_client(&self) -> anyhow::Result<kube::Client> {
        let kc = kube::config::Kubeconfig::from_yaml(
            &self.kubeconfig_yaml_with_token(users::WEBHOOK, &self.webhook_token()),
        )?;
        let cfg =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await?;
        Ok(kube::Client::try_from(cfg)?)
    }

    /// The pod claims of a token bound to Pod `nodegate/<pod_name>` of
    /// ServiceAccount `sa` (on `node`, when given), storing the Pod if missing
    /// as its controller would make it.
    fn pod_claims(&self, sa: &str, pod_name: &str, node: Option<&str>) -> users::Extra {
        let pod = match self.store.get(&resources::PODS, "nodegate", pod_name) {
            Some(p) => (*p).clone(),
            None => {
                let mut pod = serde_json::json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod_name, "namespace": "nodegate",
                                 "labels": {"app.kubernetes.io/name": sa}},
                    "spec": {"serviceAccountName": sa,
                             "tolerations": [{"operator": "Exists"}],
                             "containers": [{"name": sa.trim_start_matches("nodegate-"), "image": format!("nodegate/{sa}")}]},
                });
                if let Some(node) = node {
                    pod["spec"]["nodeName"] = node.into();
                }
                // Another call may have stored it in between: take that one.
                match self
                    .store
                    .create(&resources::PODS, "nodegate", pod.clone(), false)
                {
                    Ok(stored) => stored,
                    Err(_) => self
                        .store
                        .get(&resources::PODS, "nodegate", pod_name)
                        .map(|p| (*p).clone())
                        .unwrap_or(pod),
                }
            }
        };
        let pod_uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let mut extra = users::Extra::new();
        extra.insert(users::POD_NAME_EXTRA.into(), vec![pod_name.into()]);
        extra.insert(users::POD_UID_EXTRA.into(), vec![pod_uid]);
        extra
    }

    fn kubeconfig_yaml_with_token(&self, user: &str, token: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: nodegate-emulator\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: {user:?}\n  user:\n    token: {}\ncontexts:\n- name: nodegate-emulator\n  context:\n    cluster: nodegate-emulator\n    user: {user:?}\ncurrent-context: nodegate-emulator\n",
            self.url(),
            STANDARD.encode(&self.material.ca_pem),
            token,
        )
    }

    /// A kube client authenticated as `user`.
    pub async fn client(&self, user: &str) -> anyhow::Result<kube::Client> {
        let kc = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_yaml(user))?;
        let cfg =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await?;
        Ok(kube::Client::try_from(cfg)?)
    }

    /// Stores MutatingWebhookConfiguration(s) from YAML/JSON (replacing same-named ones).
    pub fn apply_webhook_config(&self, text: &str) -> anyhow::Result<()> {
        for doc in parse_documents(text)? {
            let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
            anyhow::ensure!(
                kind == "MutatingWebhookConfiguration",
                "expected a MutatingWebhookConfiguration, got kind {kind:?}"
            );
            serde_json::from_value::<
                k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration,
            >(doc.clone())
            .context("invalid MutatingWebhookConfiguration")?;
        }
        self.apply(text)
    }

    /// Stores objects of any served type from YAML/JSON straight into
    /// storage (no admission, no authorization: what a cluster already holds),
    /// replacing same-named ones, `status` included. Each object must pass
    /// the type's validation, as everything a cluster holds once did.
    pub fn apply(&self, text: &str) -> anyhow::Result<()> {
        for doc in parse_documents(text)? {
            let field = |k: &str| {
                doc.get(k)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            let (av, kind) = (field("apiVersion"), field("kind"));
            let res = resources::by_kind(&av, &kind)
                .with_context(|| format!("the emulator does not serve {av} {kind}"))?;
            let name = doc
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .with_context(|| format!("{kind} without a name"))?
                .to_string();
            let mut doc = doc;
            let ns = if res.namespaced {
                let ns = doc
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("default")
                    .to_string();
                doc["metadata"]["namespace"] = Value::String(ns.clone());
                ns
            } else {
                String::new()
            };
            // What a cluster holds passed validation when it was written.
            api::validation::validate(res, &doc)
                .map_err(|e| anyhow::anyhow!("{kind} {name}: {}", e.message))?;
            match self.store.get(res, &ns, &name) {
                Some(cur) => {
                    let rv = crate::store::rv_of(&cur).unwrap_or(0);
                    doc["metadata"]["uid"] = cur["metadata"]["uid"].clone();
                    doc["metadata"]["creationTimestamp"] =
                        cur["metadata"]["creationTimestamp"].clone();
                    self.store
                        .update(res, &ns, &name, doc, rv, false)
                        .map_err(|e| anyhow::anyhow!("storing {kind} {name}: {e:?}"))?;
                }
                None => {
                    self.store
                        .create(res, &ns, doc, false)
                        .map_err(|e| anyhow::anyhow!("storing {kind} {name}: {e:?}"))?;
                }
            }
        }
        Ok(())
    }

    /// Points a webhook service name (`"<svc>.<ns>.svc"`) at an address.
    pub fn set_service_endpoint(&self, service: &str, addr: SocketAddr) {
        self.admission.set_endpoint(service, addr);
    }

    /// Removes a service's endpoint: calls to it fail like a service without pods.
    pub fn remove_service_endpoint(&self, service: &str) {
        self.admission.remove_endpoint(service);
    }

    /// Webhook calls made so far; `drain` resets the record.
    pub fn webhook_calls(&self, drain: bool) -> Vec<CallRecord> {
        self.admission.calls(drain)
    }

    /// Webhook failures (errors, timeouts, CEL errors) that
    /// `failurePolicy: Ignore` swallowed: the write went on without the webhook.
    pub fn ignored_webhook_failures(&self) -> Vec<String> {
        self.admission.ignored_failures()
    }

    /// kube-apiserver's admission counters (also served on `/metrics`):
    /// match-condition errors and exclusions, fail-open webhook calls.
    pub fn admission_metrics(&self) -> &crate::admission::AdmissionMetrics {
        self.admission.metrics()
    }

    /// Stops serving and ends every open connection and watch.
    pub async fn shutdown(mut self) {
        self.stop().await;
    }

    async fn stop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
