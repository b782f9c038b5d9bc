//! The real nodegate-agent, one per simulated node, in this process: each
//! with its own kube client (the agent's service account), state dir and
//! `--probe-file`, which the simulated network agent creates when it is ready.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use futures::future::BoxFuture;
use nodegate_agent::Args;
use nodegate_agent::handler::{DeleteSource, HandlerError, NodeDeleteHandler};
use nodegate_agent::record::NodeRecord;
use nodegate_emulator::Emulator;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::lock::lock;

/// One dispatched deletion, as the agent handed it to its handlers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatched {
    pub name: String,
    pub uid: String,
    pub source: DeleteSource,
}

/// An in-process deletion handler that records every call.
#[derive(Debug, Default)]
pub struct Recorder(Mutex<Vec<Dispatched>>);

impl Recorder {
    pub fn calls(&self) -> Vec<Dispatched> {
        lock(&self.0).clone()
    }
}

impl NodeDeleteHandler for Recorder {
    fn name(&self) -> &str {
        "sim-recorder"
    }

    fn handle<'a>(
        &'a self,
        node: &'a NodeRecord,
        source: DeleteSource,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        lock(&self.0).push(Dispatched {
            name: node.name.clone(),
            uid: node.uid.clone(),
            source,
        });
        Box::pin(async { Ok(()) })
    }
}

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), nodegate_agent::agent::Error>>,
}

/// Every simulated node's agent.
pub struct Fleet {
    dir: tempfile::TempDir,
    pruners: HashSet<String>,
    probe_period: Duration,
    /// `--boot-taint` values (strict mode's boot gate); empty: off.
    boot_taints: Vec<String>,
    clients: Mutex<HashMap<String, kube::Client>>,
    running: Mutex<HashMap<String, Running>>,
    /// One recorder per start of a pruning agent, in start order.
    recorders: Mutex<BTreeMap<String, Vec<Arc<Recorder>>>>,
}

/// The file the simulated network agent (Cilium) writes when it is ready.
const PROBE_FILE: &str = "network-agent-ready";

impl Fleet {
    /// `pruners` get a deletion handler, so they prune (roster watch +
    /// snapshot); the rest have none and run the gate only.
    pub fn new(
        pruners: impl IntoIterator<Item = String>,
        probe_period: Duration,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            dir: tempfile::Builder::new()
                .prefix("nodegate-sim-agents")
                .tempdir()?,
            pruners: pruners.into_iter().collect(),
            probe_period,
            boot_taints: Vec::new(),
            clients: Mutex::default(),
            running: Mutex::default(),
            recorders: Mutex::default(),
        })
    }

    /// Every agent runs with `--boot-taint` for each of `taints` (strict mode).
    pub fn with_boot_taints(mut self, taints: Vec<String>) -> Self {
        self.boot_taints = taints;
        self
    }

    pub fn pruners(&self) -> impl Iterator<Item = &String> {
        self.pruners.iter()
    }

    pub fn is_pruner(&self, node: &str) -> bool {
        self.pruners.contains(node)
    }

    /// A directory per node, so each agent's inotify watch sees only its own file.
    fn probe_dir(&self, node: &str) -> PathBuf {
        self.dir.path().join("probe").join(node)
    }

    pub fn state_dir(&self, node: &str) -> PathBuf {
        self.dir.path().join("state").join(node)
    }

    /// The simulated network agent became ready: write the probe file
    /// (non-empty, atomically, as a CNI config would be).
    pub fn network_ready(&self, node: &str) -> anyhow::Result<()> {
        let dir = self.probe_dir(node);
        let tmp = dir.join(".network-agent-ready.tmp");
        std::fs::write(&tmp, b"ready\n").with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, dir.join(PROBE_FILE)).context("renaming the probe file")?;
        Ok(())
    }

    /// The machine went down: the network agent's file is gone until it is back.
    pub fn network_down(&self, node: &str) -> anyhow::Result<()> {
        match std::fs::remove_file(self.probe_dir(node).join(PROBE_FILE)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).context("removing the probe file")
            }
            _ => Ok(()),
        }
    }

    fn args(&self, node: &str) -> anyhow::Result<Args> {
        let probe = self.probe_dir(node).join(PROBE_FILE);
        let mut argv: Vec<OsString> = vec![
            "nodegate-agent".into(),
            "--node-name".into(),
            node.into(),
            "--probe-file".into(),
            probe.into(),
            "--probe-period".into(),
            format!("{}ms", self.probe_period.as_millis()).into(),
            "--state-dir".into(),
            self.state_dir(node).into(),
            "--snapshot-interval".into(),
            "200ms".into(),
            // The simulated machines crash rather than shut down cleanly: a
            // re-taint on stop would hide the webhook's reboot rule (the
            // agent's own e2e tests cover SIGTERM).
            "--taint-on-shutdown=false".into(),
            "--shutdown-deadline".into(),
            "5s".into(),
            "--admin-listen".into(),
            "127.0.0.1:0".into(),
        ];
        argv.extend(
            self.boot_taints
                .iter()
                .map(|t| OsString::from(format!("--boot-taint={t}"))),
        );
        Args::try_parse_from(argv).context("agent arguments")
    }

    /// Starts `node`'s agent (again: same state dir, same client).
    pub async fn start(&self, emu: &Emulator, node: &str) -> anyhow::Result<()> {
        std::fs::create_dir_all(self.probe_dir(node))?;
        std::fs::create_dir_all(self.state_dir(node))?;
        let args = self.args(node)?;
        let existing = lock(&self.clients).get(node).cloned();
        let client = match existing {
            Some(c) => c,
            None => {
                let c = emu.agent_client(node).await?;
                lock(&self.clients).insert(node.to_string(), c.clone());
                c
            }
        };
        let mut handlers: Vec<Arc<dyn NodeDeleteHandler>> = Vec::new();
        if self.is_pruner(node) {
            let r = Arc::new(Recorder::default());
            lock(&self.recorders)
                .entry(node.to_string())
                .or_default()
                .push(r.clone());
            handlers.push(r);
        }
        let (stop, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(nodegate_agent::run_with_handlers(
            args,
            client,
            handlers,
            async move {
                // A dropped sender (the sim ending early) stops the agent too.
                let _ = rx.await;
            },
        ));
        let previous = lock(&self.running).insert(node.to_string(), Running { stop, task });
        anyhow::ensure!(previous.is_none(), "agent of {node} started twice");
        Ok(())
    }

    /// Stops `node`'s agent (the shutdown path: last snapshot written) and
    /// waits for it to finish.
    pub async fn stop(&self, node: &str) -> anyhow::Result<()> {
        let Some(r) = lock(&self.running).remove(node) else {
            return Ok(());
        };
        let _ = r.stop.send(());
        match tokio::time::timeout(Duration::from_secs(15), r.task).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(anyhow::Error::new(e).context(format!("agent of {node}"))),
            Ok(Err(e)) => Err(anyhow::anyhow!("agent of {node} panicked: {e}")),
            Err(_) => Err(anyhow::anyhow!("agent of {node} did not stop within 15 s")),
        }
    }

    /// Stops every running agent, all at once.
    pub async fn stop_all(&self) -> anyhow::Result<()> {
        let names: Vec<String> = lock(&self.running).keys().cloned().collect();
        let results = futures::future::join_all(names.iter().map(|n| self.stop(n))).await;
        results.into_iter().collect()
    }

    /// The recorders of `node`'s pruning agent, one per start.
    pub fn recorders(&self, node: &str) -> Vec<Arc<Recorder>> {
        lock(&self.recorders).get(node).cloned().unwrap_or_default()
    }

    /// The (name → uid) set in `node`'s snapshot; `None` before its first write.
    pub fn snapshot(&self, node: &str) -> anyhow::Result<Option<BTreeMap<String, String>>> {
        read_snapshot(&self.state_dir(node))
    }
}

/// Reads `nodes.json` without `snapshot::load`, which would clean up the
/// running agent's temp files.
fn read_snapshot(dir: &Path) -> anyhow::Result<Option<BTreeMap<String, String>>> {
    let path = nodegate_agent::snapshot::path_in(dir);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let nodes = nodegate_agent::snapshot::decode(&bytes)
        .with_context(|| format!("decoding {}", path.display()))?;
    Ok(Some(nodes.into_iter().map(|n| (n.name, n.uid)).collect()))
}
