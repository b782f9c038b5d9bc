//! Readiness probes: their command-line specs and how each kind is checked
//! (HTTP, TCP, file, exec, pod). What a sequence of rounds means is
//! [`crate::readiness`]'s.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::Empty;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::process::Command;
use tokio::sync::Notify;

/// A probe as configured on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeSpec {
    Http(http::Uri),
    Tcp(String),
    File(PathBuf),
    Exec(String),
    Pod { namespace: String, selector: String },
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeSpecError {
    #[error("--probe-http {0:?}: {1}")]
    Http(String, String),
    #[error("--probe-tcp {0:?}: expected HOST:PORT")]
    Tcp(String),
    #[error("--probe-file: empty path")]
    File,
    #[error("--probe-exec: empty command")]
    Exec,
    #[error("--probe-pod {0:?}: expected NAMESPACE/LABEL_SELECTOR")]
    Pod(String),
}

impl ProbeSpec {
    pub fn http(s: &str) -> Result<Self, ProbeSpecError> {
        let uri: http::Uri = s
            .parse()
            .map_err(|e: http::uri::InvalidUri| ProbeSpecError::Http(s.into(), e.to_string()))?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            return Err(ProbeSpecError::Http(
                s.into(),
                "expected an http:// URL with a host".into(),
            ));
        }
        Ok(Self::Http(uri))
    }

    pub fn tcp(s: &str) -> Result<Self, ProbeSpecError> {
        match s.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => Ok(Self::Tcp(s.into())),
            _ => Err(ProbeSpecError::Tcp(s.into())),
        }
    }

    pub fn file(s: &str) -> Result<Self, ProbeSpecError> {
        if s.is_empty() {
            return Err(ProbeSpecError::File);
        }
        Ok(Self::File(s.into()))
    }

    pub fn exec(s: &str) -> Result<Self, ProbeSpecError> {
        if s.trim().is_empty() {
            return Err(ProbeSpecError::Exec);
        }
        Ok(Self::Exec(s.into()))
    }

    pub fn pod(s: &str) -> Result<Self, ProbeSpecError> {
        match s.split_once('/') {
            Some((ns, sel)) if !ns.is_empty() && !sel.trim().is_empty() => Ok(Self::Pod {
                namespace: ns.into(),
                selector: sel.into(),
            }),
            _ => Err(ProbeSpecError::Pod(s.into())),
        }
    }
}

impl ProbeSpec {
    /// The kind, as metrics label it.
    pub fn kind(&self) -> &'static str {
        match self {
            ProbeSpec::Http(_) => "http",
            ProbeSpec::Tcp(_) => "tcp",
            ProbeSpec::File(_) => "file",
            ProbeSpec::Exec(_) => "exec",
            ProbeSpec::Pod { .. } => "pod",
        }
    }
}

/// Each spec's index among the specs of its kind, in order: how metrics
/// name a probe without its URL or command line.
pub fn indexes(specs: &[ProbeSpec]) -> Vec<u32> {
    let mut seen: std::collections::HashMap<&str, u32> = Default::default();
    specs
        .iter()
        .map(|s| {
            let n = seen.entry(s.kind()).or_default();
            *n += 1;
            *n - 1
        })
        .collect()
}

impl fmt::Display for ProbeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeSpec::Http(u) => write!(f, "http:{u}"),
            ProbeSpec::Tcp(a) => write!(f, "tcp:{a}"),
            ProbeSpec::File(p) => write!(f, "file:{}", p.display()),
            ProbeSpec::Exec(c) => write!(f, "exec:{c}"),
            ProbeSpec::Pod {
                namespace,
                selector,
            } => write!(f, "pod:{namespace}/{selector}"),
        }
    }
}

/// A probe ready to run: specs plus the state some kinds need.
pub struct Probe {
    pub spec: ProbeSpec,
    /// Position among the probes of its kind (its metrics label).
    pub index: u32,
    /// The gate it opens (position in `--gates`; 0 without it).
    pub gate: usize,
    /// Position among its gate's probes of its kind: what the held Event
    /// names (`http[0]`), never the URL or command, which may carry what
    /// an Event's readers must not see.
    pub in_gate: u32,
    kind: Kind,
}

enum Kind {
    Http(Box<HttpClient<HttpConnector, Empty<Bytes>>>),
    Tcp,
    /// Keeps the inotify watch alive; `None` while the parent dir is missing.
    File(std::sync::Mutex<Option<RecommendedWatcher>>),
    Exec,
    Pod(Store<Pod>),
}

impl Probe {
    /// Builds a probe. File probes watch their parent directory and pod
    /// probes watch their pods; both call `wake` on changes so the gate
    /// reacts without waiting for the next period.
    pub fn new(spec: ProbeSpec, client: Option<&Client>, node: &str, wake: Arc<Notify>) -> Self {
        let kind = match &spec {
            ProbeSpec::Http(_) => Kind::Http(Box::new(
                HttpClient::builder(TokioExecutor::new()).build(HttpConnector::new()),
            )),
            ProbeSpec::Tcp(_) => Kind::Tcp,
            ProbeSpec::File(path) => Kind::File(std::sync::Mutex::new(watch_parent(path, wake))),
            ProbeSpec::Exec(_) => Kind::Exec,
            ProbeSpec::Pod {
                namespace,
                selector,
            } => Kind::Pod(match client {
                Some(c) => watch_pods(c.clone(), namespace, selector, node, wake),
                None => reflector::store().0,
            }),
        };
        Self {
            spec,
            index: 0,
            gate: 0,
            in_gate: 0,
            kind,
        }
    }

    /// One check, bounded by `timeout`. `Err` says why it failed.
    pub async fn check(&self, timeout: Duration) -> Result<(), String> {
        match tokio::time::timeout(timeout, self.check_inner(timeout)).await {
            Ok(r) => r,
            Err(_) => Err(format!("timed out after {timeout:?}")),
        }
    }

    async fn check_inner(&self, timeout: Duration) -> Result<(), String> {
        match (&self.spec, &self.kind) {
            (ProbeSpec::Http(uri), Kind::Http(client)) => {
                let resp = client.get(uri.clone()).await.map_err(|e| e.to_string())?;
                if resp.status().is_success() {
                    Ok(())
                } else {
                    Err(format!("HTTP status {}", resp.status()))
                }
            }
            (ProbeSpec::Tcp(addr), Kind::Tcp) => tokio::net::TcpStream::connect(addr.as_str())
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            (ProbeSpec::File(path), Kind::File(_)) => match tokio::fs::metadata(path).await {
                Ok(m) if m.len() > 0 => Ok(()),
                Ok(_) => Err("file is empty".into()),
                Err(e) => Err(e.to_string()),
            },
            (ProbeSpec::Exec(cmd), Kind::Exec) => run_exec(cmd, timeout).await,
            (ProbeSpec::Pod { .. }, Kind::Pod(store)) => {
                // Until the watch's first list, an empty store says nothing:
                // wait for it (within the probe's timeout) rather than fail a
                // round, which would open this node's other gates a write
                // apart from this one.
                store
                    .wait_until_ready()
                    .await
                    .map_err(|_| "the pod watch stopped".to_string())?;
                if store.state().iter().any(|p| pod_ready(p)) {
                    Ok(())
                } else {
                    Err("no Ready pod matching the selector on this node".into())
                }
            }
            _ => Err("probe kind mismatch".into()),
        }
    }

    /// Re-arms a file probe's watch (its parent dir may have appeared).
    pub fn rearm(&self, wake: &Arc<Notify>) {
        if let (ProbeSpec::File(path), Kind::File(w)) = (&self.spec, &self.kind)
            && let Ok(mut guard) = w.lock()
            && guard.is_none()
        {
            *guard = watch_parent(path, wake.clone());
        }
    }
}

/// Watches `path`'s directory (the file itself may not exist yet, and may be
/// replaced by rename) and wakes the gate on any event for that name.
fn watch_parent(path: &Path, wake: Arc<Notify>) -> Option<RecommendedWatcher> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let name = path.file_name().map(|n| n.to_os_string());
    let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if let Ok(ev) = res
            && ev
                .paths
                .iter()
                .any(|p| name.is_none() || p.file_name() == name.as_deref())
        {
            wake.notify_one();
        }
    });
    let mut watcher = match watcher {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "inotify unavailable; file probe falls back to polling");
            return None;
        }
    };
    match watcher.watch(&dir, RecursiveMode::NonRecursive) {
        Ok(()) => Some(watcher),
        Err(e) => {
            tracing::debug!(dir = %dir.display(), error = %e, "cannot watch probe file directory yet");
            None
        }
    }
}

/// Runs `sh -c cmd`; exit 0 passes. On timeout the whole process group is
/// killed so a hung probe never piles up.
async fn run_exec(cmd: &str, timeout: Duration) -> Result<(), String> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run: {e}"))?;
    let pid = child.id();
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(s)) if s.success() => Ok(()),
        Ok(Ok(s)) => Err(format!("exited with {s}")),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => {
            crate::process::kill_group(pid);
            let _ = child.wait().await;
            Err(format!("timed out after {timeout:?}; killed"))
        }
    }
}

fn watch_pods(
    client: Client,
    namespace: &str,
    selector: &str,
    node: &str,
    wake: Arc<Notify>,
) -> Store<Pod> {
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let cfg = watcher::Config::default()
        .labels(selector)
        .fields(&format!("spec.nodeName={node}"));
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, cfg))
        .default_backoff()
        .applied_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(_) => wake.notify_one(),
                Err(e) => tracing::warn!(error = %e, "pod probe watch failed, retrying"),
            }
        }
    });
    reader
}

/// A pod is Ready when its `Ready` condition is `True` (what the kubelet
/// reports after its readiness probes pass).
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_parsing_errors_are_clear() {
        assert!(ProbeSpec::http("http://127.0.0.1:9879/healthz").is_ok());
        assert!(
            ProbeSpec::http("https://x/")
                .unwrap_err()
                .to_string()
                .contains("http://")
        );
        assert!(ProbeSpec::tcp("127.0.0.1:80").is_ok());
        assert!(ProbeSpec::tcp("[::1]:80").is_ok());
        assert!(ProbeSpec::tcp("host").is_err());
        assert!(ProbeSpec::exec("  ").is_err());
        assert_eq!(
            ProbeSpec::pod("kube-system/k8s-app=cilium").unwrap(),
            ProbeSpec::Pod {
                namespace: "kube-system".into(),
                selector: "k8s-app=cilium".into()
            }
        );
        assert!(ProbeSpec::pod("k8s-app=cilium").is_err());
    }

    #[test]
    fn metrics_name_probes_by_kind_and_index_only() {
        let specs = vec![
            ProbeSpec::http("http://u:secret@127.0.0.1:1/x?token=t").unwrap(),
            ProbeSpec::File("/a".into()),
            ProbeSpec::Exec("curl -H 'Authorization: Bearer t' x".into()),
            ProbeSpec::File("/b".into()),
        ];
        assert_eq!(indexes(&specs), vec![0, 0, 0, 1]);
        let kinds: Vec<&str> = specs.iter().map(ProbeSpec::kind).collect();
        assert_eq!(kinds, ["http", "file", "exec", "file"]);
        // What the admin port shows after a round.
        let m = crate::metrics::Metrics::default();
        for (s, i) in specs.iter().zip(indexes(&specs)) {
            m.probe_up
                .get_or_create(&crate::metrics::ProbeName {
                    kind: s.kind(),
                    index: i,
                })
                .set(1);
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &m.registry()).unwrap();
        assert!(
            text.contains(r#"nodegate_agent_probe_up{kind="file",index="1"} 1"#),
            "{text}"
        );
        for secret in ["secret", "token", "Bearer", "/a", "curl"] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
    }

    fn probe(spec: ProbeSpec) -> Probe {
        Probe::new(spec, None, "n", Arc::new(Notify::new()))
    }

    #[tokio::test]
    async fn file_probe_needs_non_empty_file_and_wakes_on_creation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ready");
        let wake = Arc::new(Notify::new());
        let p = Probe::new(ProbeSpec::File(path.clone()), None, "n", wake.clone());
        assert!(p.check(Duration::from_secs(1)).await.is_err());
        std::fs::write(&path, b"").unwrap();
        // The watch fires on the creation, without any polling.
        tokio::time::timeout(Duration::from_secs(5), wake.notified())
            .await
            .expect("inotify wake-up");
        assert_eq!(
            p.check(Duration::from_secs(1)).await.unwrap_err(),
            "file is empty"
        );
        std::fs::write(&path, b"ok").unwrap();
        assert!(p.check(Duration::from_secs(1)).await.is_ok());
    }

    #[tokio::test]
    async fn tcp_probe_connects() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let p = probe(ProbeSpec::Tcp(addr.to_string()));
        assert!(p.check(Duration::from_secs(2)).await.is_ok());
        drop(l);
        assert!(p.check(Duration::from_secs(2)).await.is_err());
    }

    #[tokio::test]
    async fn http_probe_wants_2xx() {
        use axum::{Router, http::StatusCode, routing::get};
        let app = Router::new()
            .route("/ok", get(|| async { "ok" }))
            .route("/bad", get(|| async { StatusCode::SERVICE_UNAVAILABLE }));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await });
        let ok = probe(ProbeSpec::http(&format!("http://{addr}/ok")).unwrap());
        assert!(ok.check(Duration::from_secs(2)).await.is_ok());
        let bad = probe(ProbeSpec::http(&format!("http://{addr}/bad")).unwrap());
        let err = bad.check(Duration::from_secs(2)).await.unwrap_err();
        assert!(err.contains("503"), "{err}");
    }

    #[tokio::test]
    async fn exec_probe_exit_code_and_timeout_kill() {
        assert!(
            probe(ProbeSpec::Exec("true".into()))
                .check(Duration::from_secs(2))
                .await
                .is_ok()
        );
        assert!(
            probe(ProbeSpec::Exec("exit 1".into()))
                .check(Duration::from_secs(2))
                .await
                .is_err()
        );
        // The probe's shell starts a grandchild; a timeout must kill both.
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let cmd = format!(
            "sleep 30 & echo $! > {0}.tmp && mv {0}.tmp {0}; wait",
            pidfile.display()
        );
        let err = run_exec(&cmd, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(err.contains("killed"), "{err}");
        let pid = std::fs::read_to_string(&pidfile).unwrap();
        let stat = format!("/proc/{}/stat", pid.trim());
        // Gone, or a zombie waiting to be reaped: either way not running.
        let dead = || {
            std::fs::read_to_string(&stat)
                .map(|s| {
                    s.rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z')
                })
                .unwrap_or(true)
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !dead() {
            assert!(
                std::time::Instant::now() < deadline,
                "grandchild of the timed-out probe still runs"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[test]
    fn pod_readiness_from_condition() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        assert!(pod_ready(&pod));
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}
        }))
        .unwrap();
        assert!(!pod_ready(&pod));
    }
}
