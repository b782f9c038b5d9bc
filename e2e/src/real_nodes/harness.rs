//! The cluster the harness script brought up, as the scenarios drive it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::metrics::parse;
use crate::readme::{repo_dir, shell, stdout_if_ok, user_dir};

use super::lines::Lines;

pub struct Harness {
    /// `e2e/real-nodes/cluster`'s state directory.
    pub state: PathBuf,
    pub kubeconfig: PathBuf,
    /// A fresh directory holding the repository's manifests, where the
    /// README's commands run.
    pub work: tempfile::TempDir,
}

impl Harness {
    pub fn from_env() -> Harness {
        let state = std::env::var_os("NODEGATE_REAL_NODES").map(PathBuf::from).expect(
            "NODEGATE_REAL_NODES is not set: run e2e/real-nodes/run (it brings up the real nodes)",
        );
        let kubeconfig = state.join("admin.kubeconfig");
        assert!(kubeconfig.exists(), "no cluster in {}", state.display());
        let work = user_dir().expect("a work directory holding the manifests");
        Harness {
            state,
            kubeconfig,
            work,
        }
    }

    /// `e2e/real-nodes/cluster <args>` on this cluster; its stdout.
    pub fn cluster(&self, args: &[&str]) -> String {
        let out = Command::new(repo_dir().join("e2e/real-nodes/cluster"))
            .args(args)
            .env("NODEGATE_REAL_NODES_DIR", &self.state)
            .output()
            .expect("run e2e/real-nodes/cluster");
        ok(&format!("cluster {args:?}"), out)
    }

    /// `bash -c` in the work directory, with the kubeconfig and the
    /// workspace's binaries (nodegate-certs, nodegate-check) on PATH.
    pub fn sh(&self, command: &str) -> Output {
        shell(self.work.path(), Some(&self.kubeconfig), command).expect("run bash")
    }

    pub fn kubectl(&self, args: &str) -> String {
        ok(
            &format!("kubectl {args}"),
            self.sh(&format!("kubectl {args}")),
        )
    }

    pub async fn config(&self) -> kube::Config {
        kubeconfig_config(&self.kubeconfig).await
    }

    /// A kubeconfig at `path` for this cluster that authenticates with
    /// `token` alone, as whoever holds a ServiceAccount's token uses it.
    pub fn token_kubeconfig(&self, path: &Path, token: &str) -> PathBuf {
        let server = self.kubectl("config view --minify -o jsonpath={.clusters[0].cluster.server}");
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{server}\", certificate-authority: \"{}\"}}}}]\nusers: [{{name: u, user: {{token: \"{token}\"}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u}}}}]\ncurrent-context: c\n",
                self.state.join("pki/ca.crt").display()
            ),
        )
        .expect("write a token kubeconfig");
        path.to_path_buf()
    }

    pub async fn client(&self) -> kube::Client {
        kubeconfig_client(&self.kubeconfig).await
    }

    /// The API server's counters for every line of nodegate's admission.
    pub fn lines(&self) -> Lines {
        Lines::from_metrics(&self.kubectl("get --raw /metrics"))
    }

    /// Node patches the API server refused with 422 (a JSON patch whose
    /// `test` failed, or a validation), any writer: the API server's own
    /// request counter has no user.
    pub fn node_patches_refused(&self) -> u64 {
        parse(&self.kubectl("get --raw /metrics")).sum(
            "apiserver_request_total",
            &[
                ("resource", "nodes"),
                ("verb", "PATCH"),
                ("code", "422"),
                ("subresource", ""),
            ],
        ) as u64
    }

    /// Fail-open calls, every line.
    pub fn fail_open(&self) -> u64 {
        self.lines().fail_open.values().sum()
    }

    pub fn node_dir(&self, node: &str) -> PathBuf {
        self.state.join(node)
    }

    /// The first `nodeN`, N from `from` on, that this cluster never made
    /// (a rerun on a kept cluster takes the next one). Each scenario group
    /// starts from a range of its own.
    pub fn fresh_node(&self, from: u32) -> String {
        let made = std::fs::read_to_string(self.state.join("nodes")).unwrap_or_default();
        (from..)
            .map(|i| format!("node{i}"))
            .find(|n| !made.lines().any(|l| l.trim() == n) && !self.node_dir(n).exists())
            .expect("a node name")
    }
}

/// `out`'s stdout, or a panic naming `what` with its stderr.
pub fn ok(what: &str, out: Output) -> String {
    stdout_if_ok(what, out).unwrap_or_else(|e| panic!("{e:#}"))
}

pub async fn kubeconfig_config(path: &Path) -> kube::Config {
    let kc = kube::config::Kubeconfig::read_from(path).expect("read the kubeconfig");
    kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("a config from the kubeconfig")
}

pub async fn kubeconfig_client(path: &Path) -> kube::Client {
    kube::Client::try_from(kubeconfig_config(path).await).expect("a client")
}

/// A figure for docs/measurements.md: `FIGURE <name> <value>`.
pub fn figure(name: &str, value: impl std::fmt::Display) {
    println!("FIGURE {name} {value}");
}

pub fn step(name: &str) {
    println!("\n== {name}");
}

/// Polls `f` until it returns `Some`, or panics naming `what` at the deadline.
pub async fn wait<T>(what: &str, secs: u64, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out after {secs}s: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
