//! What happens when a node goes away: handlers behind a trait, dispatched
//! both for deletions seen on the watch and for those synthesized from the
//! snapshot after a restart.
//!
//! Only [`crate::prune::State`] feeds the dispatcher, and only with
//! deletions that passed both checks of [`crate::confirm`]: the API server
//! has no node under the record's name, and nothing the agent knows to be
//! live shares its name, an address, a podCIDR or its providerID
//! ([`crate::confirm::Holders`]). What that does and does not prove is in
//! docs/pruning.md ("What a handler may trust").

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use nodegate_roster::record::NodeRecord;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tokio::sync::mpsc;

pub use crate::deletion::DeleteSource;
use crate::metrics::{HandlerLabels, Metrics, Source};

#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error("could not run command: {0}")]
    Spawn(#[from] std::io::Error),
    #[error("command exited with {0}")]
    Exit(std::process::ExitStatus),
    #[error("command timed out after {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Other(String),
}

/// Cleans up after one deleted node. Must be idempotent: a deletion may be
/// dispatched again after a restart if the snapshot was not yet rewritten.
///
/// May trust: when it runs, the API server had no Node named `node.name` (a
/// quorum read), and no node the agent knows to be live holds that name,
/// any of `node.addresses` (IPs by overlap with live IPs and podCIDRs, DNS
/// names by equality) or `node.pod_cidrs` (by overlap), or
/// `node.provider_id`. May not trust: that the record describes a node that
/// ever existed (with the roster, a shard writer can invent one; its values
/// are then no live node's), nor, with the roster, a live node the agent
/// never saw holding a value (see docs/pruning.md). Treat every field as
/// data, never as code.
pub trait NodeDeleteHandler: Send + Sync {
    fn name(&self) -> &str;
    fn handle<'a>(
        &'a self,
        node: &'a NodeRecord,
        source: DeleteSource,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// `--on-node-delete CMD`: `sh -c CMD` with the record as JSON on stdin.
#[derive(Debug, Clone)]
pub struct CommandHandler {
    pub command: String,
    pub timeout: Duration,
    /// Extra attempts after the first failure.
    pub retries: u32,
}

impl CommandHandler {
    async fn run_once(&self, node: &NodeRecord, source: DeleteSource) -> Result<(), HandlerError> {
        let input = serde_json::to_vec(node).map_err(|e| HandlerError::Other(e.to_string()))?;
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(&self.command)
            .env("NODEGATE_NODE_NAME", &node.name)
            .env("NODEGATE_NODE_IPS", node.ips().join(","))
            .env("NODEGATE_DELETE_SOURCE", source.as_str())
            .stdin(Stdio::piped())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let pid = child.id();
        let run = async {
            if let Some(mut stdin) = child.stdin.take() {
                // A command that ignores stdin may close it early: not an error.
                let _ = stdin.write_all(&input).await;
                let _ = stdin.shutdown().await;
            }
            child.wait().await
        };
        match tokio::time::timeout(self.timeout, run).await {
            Ok(Ok(status)) if status.success() => Ok(()),
            Ok(Ok(status)) => Err(HandlerError::Exit(status)),
            Ok(Err(e)) => Err(HandlerError::Spawn(e)),
            Err(_) => {
                crate::process::kill_group(pid);
                Err(HandlerError::Timeout(self.timeout))
            }
        }
    }
}

impl NodeDeleteHandler for CommandHandler {
    fn name(&self) -> &str {
        "command"
    }

    fn handle<'a>(
        &'a self,
        node: &'a NodeRecord,
        source: DeleteSource,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let mut attempt = 0;
            loop {
                match self.run_once(node, source).await {
                    Ok(()) => return Ok(()),
                    Err(e) if attempt >= self.retries => return Err(e),
                    Err(e) => {
                        attempt += 1;
                        tracing::warn!(node = %node.name, %source, error = %e, attempt, "on-node-delete command failed, retrying");
                        tokio::time::sleep(Duration::from_millis(200) * attempt).await;
                    }
                }
            }
        })
    }
}

/// Runs every handler for every deletion, in order, counting outcomes.
pub struct Dispatcher {
    handlers: Vec<Arc<dyn NodeDeleteHandler>>,
    metrics: Metrics,
}

impl Dispatcher {
    pub fn new(handlers: Vec<Arc<dyn NodeDeleteHandler>>, metrics: Metrics) -> Self {
        Self { handlers, metrics }
    }

    /// Dispatches one deletion to all handlers; failures are logged and
    /// counted, never returned: one bad handler must not stop pruning.
    pub async fn dispatch(&self, node: &NodeRecord, source: DeleteSource) {
        self.metrics
            .pruned_nodes
            .get_or_create(&Source {
                source: source.as_str().into(),
            })
            .inc();
        tracing::info!(node = %node.name, uid = %node.uid, %source, "node deleted");
        for h in &self.handlers {
            if let Err(e) = h.handle(node, source).await {
                self.metrics
                    .handler_failures
                    .get_or_create(&HandlerLabels {
                        handler: h.name().into(),
                    })
                    .inc();
                tracing::error!(node = %node.name, %source, handler = h.name(), error = %e, "node deletion handler failed");
            }
        }
    }

    /// Drains deletions from `rx` until every sender is gone, reporting the
    /// [`crate::deletion::key`] (name and uid) of each finished one on
    /// `done` (the pruner then drops it from the snapshot).
    pub async fn run(
        self,
        mut rx: mpsc::UnboundedReceiver<(NodeRecord, DeleteSource)>,
        done: mpsc::UnboundedSender<String>,
    ) {
        while let Some((node, source)) = rx.recv().await {
            self.dispatch(&node, source).await;
            let _ = done.send(crate::deletion::key(&node));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegate_roster::record::NodeAddress;

    fn rec() -> NodeRecord {
        NodeRecord {
            name: "n1".into(),
            uid: "u1".into(),
            addresses: vec![
                NodeAddress {
                    kind: "InternalIP".into(),
                    address: "10.0.0.1".into(),
                },
                NodeAddress {
                    kind: "Hostname".into(),
                    address: "n1".into(),
                },
                NodeAddress {
                    kind: "InternalIP".into(),
                    address: "fd00::1".into(),
                },
            ],
            pod_cidrs: vec![],
            provider_id: None,
            boot_id: None,
            labels: Default::default(),
        }
    }

    #[tokio::test]
    async fn command_gets_record_and_environment() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let h = CommandHandler {
            command: format!(
                "cat > {0}.json; echo \"$NODEGATE_NODE_NAME $NODEGATE_NODE_IPS $NODEGATE_DELETE_SOURCE\" > {0}",
                out.display()
            ),
            timeout: Duration::from_secs(10),
            retries: 0,
        };
        h.handle(&rec(), DeleteSource::Snapshot).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "n1 10.0.0.1,fd00::1 snapshot\n"
        );
        let json: NodeRecord =
            serde_json::from_slice(&std::fs::read(out.with_extension("json")).unwrap()).unwrap();
        assert_eq!(json, rec());
    }

    #[tokio::test]
    async fn retries_then_reports_failure_and_counts_it() {
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("count");
        let h = CommandHandler {
            command: format!("echo x >> {}; exit 3", count.display()),
            timeout: Duration::from_secs(10),
            retries: 2,
        };
        let err = h.handle(&rec(), DeleteSource::Watch).await.unwrap_err();
        assert!(matches!(err, HandlerError::Exit(_)), "{err}");
        assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 3);

        let metrics = Metrics::default();
        let d = Dispatcher::new(vec![Arc::new(h)], metrics.clone());
        d.dispatch(&rec(), DeleteSource::Watch).await;
        let failures = metrics
            .handler_failures
            .get_or_create(&HandlerLabels {
                handler: "command".into(),
            })
            .get();
        assert_eq!(failures, 1);
    }

    #[tokio::test]
    async fn timeout_kills_the_command() {
        let h = CommandHandler {
            command: "sleep 30".into(),
            timeout: Duration::from_millis(200),
            retries: 0,
        };
        let start = std::time::Instant::now();
        let err = h.handle(&rec(), DeleteSource::Watch).await.unwrap_err();
        assert!(matches!(err, HandlerError::Timeout(_)), "{err}");
        assert!(start.elapsed() < Duration::from_secs(10));
    }
}
