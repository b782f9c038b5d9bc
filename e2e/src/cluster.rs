//! Where end-to-end tests run: a fresh emulator with the real webhook binary
//! and the shipped MutatingWebhookConfiguration, or — when
//! `NODEGATE_E2E_KUBECONFIG` names a kubeconfig — a real cluster (e.g. kind)
//! with nodegate installed. Users other than the kubeconfig's own are then
//! impersonated (`--as`, or `as:` in a kubeconfig written for a child
//! process), so the kubeconfig's user needs `impersonate` rights.
//!
//! On a real cluster every name a test makes comes from [`Cluster::name`]
//! (`nodegate-e2e-<run>-<base>`, one random run id per test), and what it
//! creates through [`Cluster::node_name`] or [`Cluster::delete_on_drop`] is
//! deleted when the `Cluster` drops — also when the test panics.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context;
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use tokio::process::Command;

use crate::process::{WebhookOptions, WebhookProcess};

/// Env var that switches the end-to-end tests to a real cluster.
pub const REAL_CLUSTER_ENV: &str = "NODEGATE_E2E_KUBECONFIG";

#[derive(Debug)]
pub enum Cluster {
    Emulated {
        emu: Emulator,
        webhook: Box<WebhookProcess>,
        scratch: tempfile::TempDir,
    },
    Real {
        kubeconfig: PathBuf,
        scratch: tempfile::TempDir,
        run: String,
        /// `(resource, namespace, name)` to delete on drop.
        created: Mutex<Vec<(String, String, String)>>,
    },
}

fn groups(user: &str) -> Vec<String> {
    // Impersonation adds system:authenticated itself.
    let mut g = users::groups(user);
    g.retain(|g| g != "system:authenticated");
    g
}

impl Cluster {
    /// A fresh emulator + webhook, or the real cluster from the env var.
    pub async fn start() -> anyhow::Result<Cluster> {
        Self::start_with_rbac(Vec::new()).await
    }

    /// [`Cluster::start`] with `extra_rbac` (YAML of Roles, ClusterRoles and
    /// their bindings) added to the emulator's RBAC, which it takes only at
    /// start. A real cluster ignores it: grant the same through its API.
    pub async fn start_with_rbac(extra_rbac: Vec<String>) -> anyhow::Result<Cluster> {
        let scratch = tempfile::tempdir()?;
        if let Some(kc) = std::env::var_os(REAL_CLUSTER_ENV) {
            return Ok(Cluster::Real {
                kubeconfig: PathBuf::from(kc),
                scratch,
                run: format!("{:06x}", rand::random::<u32>() & 0xff_ffff),
                created: Mutex::new(Vec::new()),
            });
        }
        // The shipped RBAC is enforced, so a manifest that grants too little
        // fails here; the suites' own rosters get their names granted.
        let mut rbac = crate::process::shipped_rbac()?;
        rbac.push(crate::process::test_roster_rbac());
        rbac.extend(extra_rbac);
        let emu = Emulator::start(EmulatorOptions {
            rbac: Some(rbac),
            ..Default::default()
        })
        .await?;
        let webhook = WebhookProcess::start(WebhookOptions {
            kubeconfig: Some(emu.webhook_kubeconfig()?),
            path_token: true,
            ..Default::default()
        })
        .await?;
        webhook.attach(&emu, None)?;
        webhook.install_objects(&emu)?;
        Ok(Cluster::Emulated {
            emu,
            webhook: Box::new(webhook),
            scratch,
        })
    }

    pub fn is_real(&self) -> bool {
        matches!(self, Cluster::Real { .. })
    }

    pub fn emulator(&self) -> Option<&Emulator> {
        match self {
            Cluster::Emulated { emu, .. } => Some(emu),
            Cluster::Real { .. } => None,
        }
    }

    pub fn webhook_ref(&self) -> Option<&WebhookProcess> {
        match self {
            Cluster::Emulated { webhook, .. } => Some(webhook),
            Cluster::Real { .. } => None,
        }
    }

    pub fn webhook(&mut self) -> Option<&mut WebhookProcess> {
        match self {
            Cluster::Emulated { webhook, .. } => Some(webhook),
            Cluster::Real { .. } => None,
        }
    }

    fn scratch(&self) -> &Path {
        match self {
            Cluster::Emulated { scratch, .. } | Cluster::Real { scratch, .. } => scratch.path(),
        }
    }

    /// A name unique to this test on a real cluster (shared with other
    /// tests and users); `base` itself on a fresh emulator.
    pub fn name(&self, base: &str) -> String {
        match self {
            Cluster::Real { run, .. } => format!("nodegate-e2e-{run}-{base}"),
            Cluster::Emulated { .. } => base.to_string(),
        }
    }

    /// [`Cluster::name`] for a Node the test creates; on a real cluster it
    /// is deleted when the `Cluster` drops.
    pub fn node_name(&self, base: &str) -> String {
        let name = self.name(base);
        self.delete_on_drop("nodes", "", &name);
        name
    }

    /// On a real cluster, delete this object when the `Cluster` drops.
    pub fn delete_on_drop(&self, resource: &str, namespace: &str, name: &str) {
        if let Cluster::Real { created, .. } = self
            && let Ok(mut c) = created.lock()
        {
            c.push((resource.into(), namespace.into(), name.into()));
        }
    }

    /// A simulated kubelet for `name`, authenticated as `system:node:<name>`.
    pub async fn kubelet(
        &self,
        name: &str,
    ) -> anyhow::Result<nodegate_emulator::kubelet::SimKubelet> {
        Ok(nodegate_emulator::kubelet::SimKubelet::with_client(
            self.client(&users::node(name)).await?,
            name,
        ))
    }

    /// A kubeconfig file that acts as `user`, for a child process (e.g. the
    /// real agent binary). On a real cluster: the given kubeconfig with the
    /// current context's user impersonating `user` (`as`, `as-groups`).
    pub fn kubeconfig(&self, user: &str) -> anyhow::Result<PathBuf> {
        match self {
            Cluster::Emulated { emu, .. } => emu.kubeconfig(user),
            Cluster::Real {
                kubeconfig,
                scratch,
                ..
            } => {
                // read_from makes file references absolute, so the copy works anywhere.
                let mut kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
                if user != users::ADMIN {
                    let info = current_auth_info(&mut kc)?;
                    info.impersonate = Some(user.to_string());
                    info.impersonate_groups = Some(groups(user));
                }
                let file = scratch
                    .path()
                    .join(format!("kubeconfig-{}", user.replace(':', "_")));
                write_private(&file, &kc)?;
                Ok(file)
            }
        }
    }

    /// A kubeconfig holding what the agent's DaemonSet pod on `node` holds: a
    /// ServiceAccount token bound to a pod of `nodegate-agent` scheduled on
    /// `node`, so it carries the node claim the confinement policy checks.
    /// The pod is an object only (no kubelet runs it); on a real cluster it
    /// is deleted when the `Cluster` drops, which also ends the token.
    pub async fn agent_kubeconfig(&self, node: &str) -> anyhow::Result<PathBuf> {
        use k8s_openapi::api::core::v1::Pod;
        use kube::api::{Api, PostParams};
        let admin = self.client(users::ADMIN).await?;
        let name = self.name(&format!("agent-{node}"));
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "nodegate",
                         "labels": {"app.kubernetes.io/name": "nodegate-e2e-agent"}},
            "spec": {"serviceAccountName": "nodegate-agent", "nodeName": node,
                     "containers": [{"name": "agent", "image": "nodegate/nodegate-agent:e2e"}]},
        }))?;
        let pods: Api<Pod> = Api::namespaced(admin.clone(), "nodegate");
        // A restarted agent gets a new token for the same pod.
        let pod = match pods.create(&PostParams::default(), &pod).await {
            Err(kube::Error::Api(e)) if e.code == 409 => pods.get(&name).await?,
            other => other?,
        };
        self.delete_on_drop("pods", "nodegate", &name);
        self.pod_token_kubeconfig(
            "nodegate-agent",
            &name,
            pod.metadata.uid.clone(),
            &format!("kubeconfig-agent-{node}"),
        )
        .await
    }

    /// A kubeconfig holding only a token of ServiceAccount `nodegate/<sa>`
    /// bound to Pod `nodegate/<pod>` (`uid`), written to `file` in scratch.
    async fn pod_token_kubeconfig(
        &self,
        sa: &str,
        pod: &str,
        uid: Option<String>,
        file: &str,
    ) -> anyhow::Result<PathBuf> {
        use k8s_openapi::api::authentication::v1::{
            BoundObjectReference, TokenRequest, TokenRequestSpec,
        };
        use k8s_openapi::api::core::v1::ServiceAccount;
        use kube::api::{Api, PostParams};
        let admin = self.client(users::ADMIN).await?;
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: Vec::new(),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.into()),
                    uid,
                }),
                expiration_seconds: Some(3600),
            },
            ..Default::default()
        };
        let sas: Api<ServiceAccount> = Api::namespaced(admin, "nodegate");
        let token = sas
            .create_token_request(sa, &PostParams::default(), &request)
            .await?
            .status
            .context("TokenRequest without status")?
            .token;
        let source = match self {
            Cluster::Emulated { emu, .. } => {
                kube::config::Kubeconfig::from_yaml(&emu.kubeconfig_yaml(users::ADMIN))?
            }
            Cluster::Real { kubeconfig, .. } => kube::config::Kubeconfig::read_from(kubeconfig)?,
        };
        let mut kc = source;
        // Only the token: no client certificate, plugin or impersonation.
        *current_auth_info(&mut kc)? = kube::config::AuthInfo {
            token: Some(token.into()),
            ..Default::default()
        };
        let file = self.scratch().join(file);
        write_private(&file, &kc)?;
        Ok(file)
    }

    /// A kube client with the webhook's own credential: a token bound to its
    /// StatefulSet's first Pod, `nodegate/nodegate-webhook-0` (the emulator
    /// stores one; a real install runs it).
    pub async fn webhook_client(&self) -> anyhow::Result<kube::Client> {
        use k8s_openapi::api::core::v1::Pod;
        use kube::api::Api;
        const POD: &str = "nodegate-webhook-0";
        if let Cluster::Emulated { emu, .. } = self {
            return emu.webhook_client().await;
        }
        let pods: Api<Pod> = Api::namespaced(self.client(users::ADMIN).await?, "nodegate");
        let uid = pods.get(POD).await?.metadata.uid;
        let file = self
            .pod_token_kubeconfig("nodegate-webhook", POD, uid, "kubeconfig-webhook-pod")
            .await?;
        let kc = kube::config::Kubeconfig::read_from(file)?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        Ok(kube::Client::try_from(cfg)?)
    }

    /// A kube client with the agent's pod-bound credential for `node`
    /// ([`Cluster::agent_kubeconfig`]).
    pub async fn agent_client(&self, node: &str) -> anyhow::Result<kube::Client> {
        let kc = kube::config::Kubeconfig::read_from(self.agent_kubeconfig(node).await?)?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        Ok(kube::Client::try_from(cfg)?)
    }

    /// A kube client acting as `user`.
    pub async fn client(&self, user: &str) -> anyhow::Result<kube::Client> {
        match self {
            Cluster::Emulated { emu, .. } => emu.client(user).await,
            Cluster::Real { kubeconfig, .. } => {
                let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
                let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
                if user != users::ADMIN {
                    cfg.auth_info.impersonate = Some(user.to_string());
                    cfg.auth_info.impersonate_groups = Some(groups(user));
                }
                Ok(kube::Client::try_from(cfg)?)
            }
        }
    }

    /// `kubectl` as `user` with a fresh cache and HOME (per test directory).
    pub fn kubectl(&self, user: &str) -> anyhow::Result<Command> {
        let home = self.scratch().join("home");
        std::fs::create_dir_all(&home)?;
        let mut cmd = Command::new("kubectl");
        cmd.env("HOME", &home)
            .env("KUBECACHEDIR", home.join("kube-cache"))
            .env_remove("KUBECTL_EXTERNAL_DIFF");
        match self {
            Cluster::Emulated { emu, .. } => {
                cmd.env("KUBECONFIG", emu.kubeconfig(user).context("kubeconfig")?);
            }
            Cluster::Real { kubeconfig, .. } => {
                cmd.env("KUBECONFIG", kubeconfig);
                if user != users::ADMIN {
                    cmd.arg(format!("--as={user}"));
                    for g in groups(user) {
                        cmd.arg(format!("--as-group={g}"));
                    }
                }
            }
        }
        Ok(cmd)
    }
}

/// Writes a kubeconfig with credentials inside: owner-only, like
/// ~/.kube/config.
fn write_private(file: &Path, kc: &kube::config::Kubeconfig) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(file)?;
    std::io::Write::write_all(&mut f, &serde_json::to_vec(kc)?)?;
    Ok(())
}

/// The credentials of the kubeconfig's current context.
fn current_auth_info(
    kc: &mut kube::config::Kubeconfig,
) -> anyhow::Result<&mut kube::config::AuthInfo> {
    let context = kc.current_context.clone().context("no current-context")?;
    let auth = kc
        .contexts
        .iter()
        .find(|c| c.name == context)
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.user.clone())
        .context("current context has no user")?;
    let entry = kc
        .auth_infos
        .iter_mut()
        .find(|a| a.name == auth)
        .context("the context's user is not in the kubeconfig")?;
    Ok(entry.auth_info.get_or_insert_with(Default::default))
}

impl Drop for Cluster {
    /// Deletes what the test created on a real cluster. Synchronous (on its
    /// own thread and runtime), so it also runs while a failed test unwinds;
    /// concurrent, because kubectl's client-side rate limit (5/s) would take
    /// two minutes for the 600 nodes of the biggest test.
    fn drop(&mut self) {
        let Cluster::Real {
            kubeconfig,
            created,
            ..
        } = self
        else {
            return;
        };
        let created = std::mem::take(created.get_mut().unwrap_or_else(|e| e.into_inner()));
        if created.is_empty() {
            return;
        }
        let kubeconfig = kubeconfig.clone();
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(delete_all(&kubeconfig, created))
        });
        match cleanup.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("cleanup on the real cluster: {e:#}"),
            Err(_) => eprintln!("cleanup on the real cluster panicked"),
        }
    }
}

/// Deletes `(resource, namespace, name)` objects, 32 at a time; pods
/// without grace (bound to fake nodes, no kubelet would ever confirm).
async fn delete_all(
    kubeconfig: &Path,
    objects: Vec<(String, String, String)>,
) -> anyhow::Result<()> {
    use futures::StreamExt;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::{Api, DeleteParams};

    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    let client = kube::Client::try_from(cfg)?;
    let failures: Vec<String> = futures::stream::iter(objects)
        .map(|(resource, ns, name)| {
            let client = client.clone();
            async move {
                let result = match resource.as_str() {
                    "nodes" => Api::<Node>::all(client)
                        .delete(&name, &DeleteParams::default())
                        .await
                        .map(|_| ()),
                    "pods" => Api::<Pod>::namespaced(client, &ns)
                        .delete(&name, &DeleteParams::default().grace_period(0))
                        .await
                        .map(|_| ()),
                    "configmaps" => Api::<ConfigMap>::namespaced(client, &ns)
                        .delete(&name, &DeleteParams::default())
                        .await
                        .map(|_| ()),
                    "leases" => Api::<Lease>::namespaced(client, &ns)
                        .delete(&name, &DeleteParams::default())
                        .await
                        .map(|_| ()),
                    "roles" => Api::<Role>::namespaced(client, &ns)
                        .delete(&name, &DeleteParams::default())
                        .await
                        .map(|_| ()),
                    "rolebindings" => Api::<RoleBinding>::namespaced(client, &ns)
                        .delete(&name, &DeleteParams::default())
                        .await
                        .map(|_| ()),
                    other => return Some(format!("{other}/{name}: no cleanup for this kind")),
                };
                match result {
                    Ok(()) => None,
                    Err(kube::Error::Api(e)) if e.code == 404 => None,
                    Err(e) => Some(format!("{resource}/{name}: {e}")),
                }
            }
        })
        .buffer_unordered(32)
        .filter_map(|f| async move { f })
        .collect()
        .await;
    anyhow::ensure!(failures.is_empty(), "not deleted: {failures:?}");
    Ok(())
}
