//! Running the real nodegate binaries next to the emulator.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use nodegate_certs::{Ca, ServingRequest};
use nodegate_emulator::Emulator;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// `target/<profile>/<name>`, found from the running executable (a test
/// binary lives in `target/<profile>/deps/`). Check `exists()` before use:
/// [`WebhookProcess::start`] reports a missing binary as an error.
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(name)
}

/// `nodegate-webhook <args>`'s output: a manifest the generators print.
pub fn webhook_output(args: &[String]) -> anyhow::Result<String> {
    let bin = bin_path("nodegate-webhook");
    let out = std::process::Command::new(&bin)
        .args(args)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "nodegate-webhook {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8(out.stdout)?)
}

fn existing_bin(name: &str, package: &str) -> anyhow::Result<PathBuf> {
    let p = bin_path(name);
    if !p.exists() {
        bail!(
            "binary {name} not found at {}: build it first (`cargo build -p {package}`)",
            p.display()
        );
    }
    Ok(p)
}

/// The repository's `manifests/base/` directory, the install every rendering
/// shares (compiled in; override with `NODEGATE_MANIFESTS`).
pub fn manifests_dir() -> PathBuf {
    std::env::var_os("NODEGATE_MANIFESTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/base"))
}

/// The project's MutatingWebhookConfiguration, as shipped (no caBundle).
pub fn shipped_webhook_config() -> anyhow::Result<String> {
    let p = manifests_dir().join("webhook/mutatingwebhookconfiguration.yaml");
    std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
}

/// The install's ValidatingAdmissionPolicies that confine the agent and the
/// webhook, as shipped.
pub fn shipped_confinement() -> anyhow::Result<String> {
    let p = manifests_dir().join("confinement.yaml");
    std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
}

/// The pruning component's policies (only the publisher writes the roster
/// and its Lease; the publisher writes nothing else), followed by the
/// install's Namespace (`namespace.yaml`): the writers' policy applies only
/// in namespaces labelled `app.kubernetes.io/part-of: nodegate`, and the
/// emulator, unlike an API server, accepts writes in a namespace it does
/// not store, so an emulator given the policy alone would guard nothing.
pub fn shipped_roster_policy() -> anyhow::Result<String> {
    let p = manifests_dir().join("../components/pruning/policy.yaml");
    let policy = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    let p = manifests_dir().join("namespace.yaml");
    let namespace =
        std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    Ok(format!("{policy}\n---\n{namespace}"))
}

/// The shards of the suites' own rosters in the emulator: the agent's
/// end-to-end tests run publishers of roster `roster` (`Cluster::name`
/// there) in `nodegate` as the publisher's ServiceAccount, and the shipped
/// writer role names only the shipped roster's shards and Lease.
pub const TEST_ROSTER: &str = "roster";
/// Shards of [`TEST_ROSTER`] granted by [`test_roster_rbac`].
pub const TEST_ROSTER_SHARDS: u32 = 64;

/// RBAC that lets the publisher's ServiceAccount write [`TEST_ROSTER`]
/// (`roster-<i>` for i below [`TEST_ROSTER_SHARDS`], and the Lease
/// `roster`) in `nodegate`, as the shipped role does for `nodegate-roster`.
/// [`crate::cluster::Cluster`] adds it to the emulator's RBAC.
pub fn test_roster_rbac() -> String {
    let shards: Vec<String> = (0..TEST_ROSTER_SHARDS)
        .map(|i| format!("{TEST_ROSTER}-{i}"))
        .collect();
    format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: nodegate-e2e-test-rosters, namespace: {WEBHOOK_NAMESPACE}}}
rules:
  - apiGroups: [""]
    resources: [configmaps]
    verbs: [get, update, delete]
    resourceNames: [{shards}]
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    verbs: [get, update]
    resourceNames: [{TEST_ROSTER}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: nodegate-e2e-test-rosters, namespace: {WEBHOOK_NAMESPACE}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: nodegate-e2e-test-rosters}}
subjects: [{{kind: ServiceAccount, name: nodegate-roster, namespace: {WEBHOOK_NAMESPACE}}}]
"#,
        shards = shards.join(", ")
    )
}

/// The admission-policy overlay's MutatingAdmissionPolicy and binding.
pub fn shipped_policy() -> anyhow::Result<String> {
    let p = manifests_dir().join("../overlays/admission-policy/policy.yaml");
    std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
}

/// The webhook configuration as the admission-policy overlay renders it:
/// Node CREATE only (re-registrations) and the `nodes/status` rule.
pub fn policy_mode_webhook_config() -> anyhow::Result<String> {
    let mut cfg: serde_json::Value = serde_yaml::from_str(&shipped_webhook_config()?)?;
    let rules = cfg["webhooks"][0]["rules"]
        .as_array_mut()
        .context("webhook rules")?;
    anyhow::ensure!(
        rules.first().map(|r| &r["resources"]) == Some(&serde_json::json!(["nodes"])),
        "the shipped webhook's first rule is no longer the main-resource one"
    );
    rules[0]["operations"] = serde_json::json!(["CREATE"]);
    Ok(serde_yaml::to_string(&cfg)?)
}

/// The shipped RBAC documents of the webhook, the agent, the pruning
/// component's roster publisher and the probe-pod component (those present).
pub fn shipped_rbac() -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for part in [
        "webhook",
        "agent",
        "certs",
        "../components/pruning",
        "../components/probe-pod",
    ] {
        let p = manifests_dir().join(part).join("rbac.yaml");
        if p.exists() {
            out.push(
                std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?,
            );
        }
    }
    Ok(out)
}

/// The service the shipped configuration points at.
pub const WEBHOOK_SERVICE: &str = "nodegate-webhook";
pub const WEBHOOK_NAMESPACE: &str = "nodegate";
/// The shipped StatefulSet's replicas, each with a Service and a line of
/// admission of its own; here one process stands behind all of them.
pub const REPLICAS: i64 = 2;
/// The Secret the shipped StatefulSet mounts its serving certificate from.
pub const WEBHOOK_TLS_SECRET: &str = "nodegate-webhook-tls";
/// The Secret holding the path token (`token`), as the README creates it.
pub const WEBHOOK_PATH_SECRET: &str = "nodegate-webhook-path";

/// A Deployment `status` as the deployment controller writes it for
/// `available` of `replicas` pods (`Available` while at least one is).
/// A StatefulSet's status with `ready` of `replicas` Ready and current.
pub fn statefulset_status(replicas: i64, ready: i64) -> serde_json::Value {
    serde_json::json!({
        "observedGeneration": 1, "replicas": replicas, "readyReplicas": ready,
        "availableReplicas": ready, "currentReplicas": replicas, "updatedReplicas": replicas,
        "currentRevision": "nodegate-webhook-1", "updateRevision": "nodegate-webhook-1",
    })
}

pub fn deployment_status(replicas: i64, available: i64) -> serde_json::Value {
    let ok = if available > 0 { "True" } else { "False" };
    serde_json::json!({
        "observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas,
        "readyReplicas": available, "availableReplicas": available,
        "unavailableReplicas": replicas - available,
        "conditions": [{"type": "Available", "status": ok,
                        "reason": if available > 0 { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" }}],
    })
}

/// Options for [`WebhookProcess::start`].
#[derive(Debug, Clone, Default)]
pub struct WebhookOptions {
    /// `--taint` values; empty means the binary's default.
    pub taints: Vec<String>,
    /// KUBECONFIG for the patches of rebooted nodes; `None` disables them.
    pub kubeconfig: Option<PathBuf>,
    pub extra_args: Vec<String>,
    /// Serve with a path token, as the README's install does: only reviews
    /// posted to `/mutate/<token>` may write a stored Node, and [`attach`]
    /// points the configuration's lines there.
    ///
    /// [`attach`]: WebhookProcess::attach
    pub path_token: bool,
}

/// The real `nodegate-webhook` binary with fresh certificates from
/// nodegate-certs, listening on loopback port 0.
#[derive(Debug)]
pub struct WebhookProcess {
    child: LoggedChild,
    https: SocketAddr,
    admin: SocketAddr,
    ca_pem: String,
    path_token: Option<String>,
    _dir: tempfile::TempDir,
}

/// A child process whose output lines are kept (the last 500) and echoed
/// with a prefix when `NODEGATE_TEST_VERBOSE` is set. Killed on drop.
#[derive(Debug)]
pub struct LoggedChild {
    child: Child,
    logs: Arc<Mutex<VecDeque<String>>>,
    lines: tokio::sync::broadcast::Sender<String>,
}

impl LoggedChild {
    /// Spawns `cmd` with stdin closed and stdout/stderr captured.
    pub fn spawn(label: &str, mut cmd: Command) -> anyhow::Result<LoggedChild> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().with_context(|| {
            format!("spawning {}", cmd.as_std().get_program().to_string_lossy())
        })?;
        let logs = Arc::new(Mutex::new(VecDeque::new()));
        let (lines, _) = tokio::sync::broadcast::channel(1024);
        let echo = std::env::var_os("NODEGATE_TEST_VERBOSE").is_some();
        let pipes: [Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>; 2] = [
            child.stderr.take().map(|s| Box::new(s) as _),
            child.stdout.take().map(|s| Box::new(s) as _),
        ];
        for pipe in pipes.into_iter().flatten() {
            let (logs, tx, label) = (logs.clone(), lines.clone(), label.to_string());
            tokio::spawn(async move {
                let mut reader = BufReader::new(pipe).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    if echo {
                        eprintln!("[{label}] {line}");
                    }
                    {
                        let mut l = logs.lock().unwrap_or_else(|p| p.into_inner());
                        l.push_back(line.clone());
                        if l.len() > 500 {
                            l.pop_front();
                        }
                    }
                    let _ = tx.send(line);
                }
            });
        }
        Ok(LoggedChild { child, logs, lines })
    }

    /// Waits for an output line (past or future) that satisfies `pred`.
    pub async fn wait_for_line(
        &mut self,
        deadline: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> anyhow::Result<String> {
        let mut rx = self.lines.subscribe();
        if let Some(l) = self.logs().into_iter().find(|l| pred(l)) {
            return Ok(l);
        }
        let found = tokio::time::timeout(deadline, async {
            loop {
                match rx.recv().await {
                    Ok(l) if pred(&l) => return Some(l),
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
        .await;
        match found {
            Ok(Some(l)) => Ok(l),
            _ => {
                let _ = self.child.start_kill();
                bail!(
                    "expected output line not seen; output:\n{}",
                    self.logs().join("\n")
                )
            }
        }
    }

    /// The last lines printed.
    pub fn logs(&self) -> Vec<String> {
        self.logs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGTERM, then waits up to 10 s for the exit (SIGKILL after).
    pub async fn stop(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        if let Some(pid) = self.child.id() {
            let status = Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .await?;
            if !status.success() {
                bail!("kill -TERM {pid} failed");
            }
        }
        match tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await {
            Ok(r) => Ok(r?),
            Err(_) => {
                self.child.start_kill()?;
                Ok(self.child.wait().await?)
            }
        }
    }

    /// SIGKILL and reap.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }
}

fn parse_listening(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let rest = &line[line.find("listening https=")? + "listening https=".len()..];
    let (https, rest) = rest.split_once(' ')?;
    let admin = rest.strip_prefix("admin=")?.split_whitespace().next()?;
    Some((https.parse().ok()?, admin.parse().ok()?))
}

/// A webhook configuration (YAML) with every line that calls a Service
/// pointed at `/mutate/<token>`, as `nodegate-certs`' patch points it.
pub fn with_path_token(yaml: &str, token: &str) -> anyhow::Result<String> {
    let mut doc: serde_json::Value = serde_yaml::from_str(yaml)?;
    let path = format!("{}{token}", nodegate_shared::path_token::PATH_PREFIX);
    for hook in doc["webhooks"].as_array_mut().into_iter().flatten() {
        if let Some(svc) = hook
            .pointer_mut("/clientConfig/service")
            .and_then(|s| s.as_object_mut())
        {
            svc.insert("path".into(), path.clone().into());
        }
    }
    Ok(serde_yaml::to_string(&doc)?)
}

impl WebhookProcess {
    pub async fn start(opts: WebhookOptions) -> anyhow::Result<WebhookProcess> {
        let bin = existing_bin("nodegate-webhook", "nodegate-webhook")?;
        let dir = tempfile::tempdir()?;
        let ca = Ca::generate(1).context("generating webhook CA")?;
        let cert = ca
            .issue(&ServingRequest {
                also_services: (0..REPLICAS)
                    .map(|i| (format!("{WEBHOOK_SERVICE}-{i}"), WEBHOOK_NAMESPACE.into()))
                    .collect(),
                service: WEBHOOK_SERVICE.into(),
                namespace: WEBHOOK_NAMESPACE.into(),
                ips: vec![std::net::IpAddr::from([127, 0, 0, 1])],
                days: 1,
            })
            .context("issuing webhook serving cert")?;
        nodegate_certs::write_files(dir.path(), ca.cert_pem(), &cert)?;
        let mut cmd = Command::new(&bin);
        cmd.arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--admin-listen")
            .arg("127.0.0.1:0")
            .arg("--tls-cert")
            .arg(dir.path().join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.path().join("tls.key"))
            .arg("--shutdown-timeout")
            .arg("2s");
        for t in &opts.taints {
            cmd.arg("--taint").arg(t);
        }
        let path_token = opts.path_token.then(nodegate_certs::path_token);
        if let Some(t) = &path_token {
            let file = dir.path().join("path-token");
            std::fs::write(&file, t)?;
            cmd.arg("--path-token-file").arg(file);
        }
        cmd.args(&opts.extra_args);
        // Nothing from the caller's environment may point it at a real cluster.
        cmd.env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("NODEGATE_TAINTS")
            .env_remove("NODEGATE_BOOT_TAINTS")
            .env_remove("NODEGATE_OWNED_TAINTS")
            .env("HOME", dir.path())
            .env(
                "RUST_LOG",
                std::env::var("NODEGATE_WEBHOOK_LOG").unwrap_or_else(|_| "info".into()),
            );
        match &opts.kubeconfig {
            Some(kc) => {
                cmd.env("KUBECONFIG", kc);
            }
            None => {
                cmd.arg("--disable-reboot-patches");
            }
        }
        let mut child = LoggedChild::spawn("webhook", cmd)?;
        let line = child
            .wait_for_line(Duration::from_secs(30), |l| parse_listening(l).is_some())
            .await?;
        let (https, admin) = parse_listening(&line).context("listening line")?;
        Ok(WebhookProcess {
            child,
            https,
            admin,
            ca_pem: ca.cert_pem().to_string(),
            path_token,
            _dir: dir,
        })
    }

    /// The path token it serves with, if any.
    pub fn path_token(&self) -> Option<&str> {
        self.path_token.as_deref()
    }

    /// Its `--path-token-file` (mounted from the Secret in a real install),
    /// when it serves with a path token: a rotation rewrites it.
    pub fn path_token_file(&self) -> Option<PathBuf> {
        self.path_token
            .as_ref()
            .map(|_| self._dir.path().join("path-token"))
    }

    /// Replaces the files it serves from, as a kubelet syncing its Secret
    /// volumes does: the serving certificate and key, and the path token.
    pub fn serve_from(
        &self,
        tls_crt: &[u8],
        tls_key: &[u8],
        token: Option<&[u8]>,
    ) -> anyhow::Result<()> {
        let dir = self._dir.path();
        // The key first: a reload between the two writes then pairs the
        // old certificate with the new key and fails, keeping the old pair.
        std::fs::write(dir.join("tls.key.new"), tls_key)?;
        std::fs::write(dir.join("tls.crt.new"), tls_crt)?;
        std::fs::rename(dir.join("tls.key.new"), dir.join("tls.key"))?;
        std::fs::rename(dir.join("tls.crt.new"), dir.join("tls.crt"))?;
        if let Some(t) = token {
            std::fs::write(dir.join("path-token"), t)?;
        }
        Ok(())
    }

    /// `"nodegate-webhook.nodegate.svc"`, the name the API server verifies.
    pub fn service(&self) -> String {
        format!("{WEBHOOK_SERVICE}.{WEBHOOK_NAMESPACE}.svc")
    }

    pub fn https_addr(&self) -> SocketAddr {
        self.https
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Every Service of the shipped configuration: the first line's and
    /// each replica's own, all served by this one process.
    pub fn services(&self) -> Vec<String> {
        std::iter::once(self.service())
            .chain((0..REPLICAS).map(|i| format!("{WEBHOOK_SERVICE}-{i}.{WEBHOOK_NAMESPACE}.svc")))
            .collect()
    }

    /// For [`nodegate_emulator::EmulatorOptions::service_endpoints`].
    pub fn service_endpoints(&self) -> HashMap<String, SocketAddr> {
        self.services()
            .into_iter()
            .map(|s| (s, self.https))
            .collect()
    }

    /// `yaml` with this process's CA as `caBundle` and, with a path token,
    /// every line's path set as `nodegate-certs`' patch sets it.
    pub fn webhook_config(&self, yaml: &str) -> anyhow::Result<String> {
        let injected = nodegate_certs::inject_ca_bundle(yaml, &self.ca_pem)?;
        match &self.path_token {
            Some(token) => with_path_token(&injected, token),
            None => Ok(injected),
        }
    }

    /// Points `emu` at this webhook: the service endpoint and the shipped
    /// (or given) configuration with the caBundle filled in.
    pub fn attach(&self, emu: &Emulator, config_yaml: Option<&str>) -> anyhow::Result<()> {
        let shipped;
        let yaml = match config_yaml {
            Some(y) => y,
            None => {
                shipped = shipped_webhook_config()?;
                &shipped
            }
        };
        for s in self.services() {
            emu.set_service_endpoint(&s, self.https);
        }
        emu.apply_webhook_config(&self.webhook_config(yaml)?)
    }

    /// Stores what `kubectl apply -k manifests/` and the install steps leave
    /// in a cluster around this webhook, so `kubectl` and `nodegate-check`
    /// see an installed system: the shipped Namespace, Services, StatefulSet and
    /// agent DaemonSet, and the serving Secret holding this process's
    /// certificate. Statuses describe what runs here: both webhook replicas
    /// Ready ([`statefulset_status`]; one process serves every line), and the agent DaemonSet scheduled on
    /// no node (no kubelet in the emulator runs pods).
    pub fn install_objects(&self, emu: &Emulator) -> anyhow::Result<()> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let dir = manifests_dir();
        let read = |p: &str| {
            std::fs::read_to_string(dir.join(p))
                .with_context(|| format!("reading manifests/base/{p}"))
        };
        emu.apply(&read("namespace.yaml")?)?;
        emu.apply(&shipped_confinement()?)?;
        emu.apply(&read("webhook/service.yaml")?)?;
        let secret = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": WEBHOOK_TLS_SECRET, "namespace": WEBHOOK_NAMESPACE},
            "data": {
                "tls.crt": b64.encode(std::fs::read(self._dir.path().join("tls.crt"))?),
                "tls.key": b64.encode(std::fs::read(self._dir.path().join("tls.key"))?),
            },
        });
        emu.apply(&secret.to_string())?;
        if let Some(token) = &self.path_token {
            let secret = serde_json::json!({
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": WEBHOOK_PATH_SECRET, "namespace": WEBHOOK_NAMESPACE},
                "data": {"token": b64.encode(token)},
            });
            emu.apply(&secret.to_string())?;
        }
        let mut sts =
            nodegate_emulator::server::parse_documents(&read("webhook/statefulset.yaml")?)?
                .into_iter()
                .next()
                .context("empty statefulset.yaml")?;
        sts["status"] = statefulset_status(REPLICAS, REPLICAS);
        emu.apply(&sts.to_string())?;
        let mut ds = nodegate_emulator::server::parse_documents(&read("agent/daemonset.yaml")?)?
            .into_iter()
            .next()
            .context("empty daemonset.yaml")?;
        ds["status"] = serde_json::json!({
            "desiredNumberScheduled": 0, "currentNumberScheduled": 0, "numberReady": 0,
            "numberAvailable": 0, "numberMisscheduled": 0, "updatedNumberScheduled": 0,
        });
        emu.apply(&ds.to_string())?;
        Ok(())
    }

    /// The last lines the process printed.
    pub fn logs(&self) -> Vec<String> {
        self.child.logs()
    }

    /// Fetches the admin port's `/metrics` text.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(self.admin).await?;
        s.write_all(
            format!(
                "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                self.admin
            )
            .as_bytes(),
        )
        .await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or(out))
    }

    /// SIGTERM (graceful drain), then waits for the exit.
    pub async fn stop(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        self.child.stop().await
    }

    /// SIGKILL: an abrupt outage.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_listening_line() {
        let l = "2026-01-01T00:00:00Z  INFO nodegate_webhook: listening https=127.0.0.1:4431 admin=127.0.0.1:9091";
        let (h, a) = parse_listening(l).unwrap();
        assert_eq!(h.port(), 4431);
        assert_eq!(a.port(), 9091);
        assert!(parse_listening("listening https=nope admin=x").is_none());
    }
}
