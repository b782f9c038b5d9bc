//! Background reboot patches (rule 3).
//!
//! A `nodes/status` write cannot carry taints (the API server keeps the
//! stored spec), so when one shows a reboot the webhook queues the node here
//! and a worker patches the main resource: re-read the node, re-check the
//! rule, JSON patch with a `test` guard on the taints it read, retry with
//! backoff when the node changed meanwhile. The queue is bounded and holds
//! each node at most once; the admission answer never waits for it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Error as KubeError};
use nodegate_shared::patch::{Guard, add_taints};
use tokio::sync::{Semaphore, mpsc};

use crate::metrics::{Background, Metrics};
use crate::rules::{Reason, Rules};
use crate::slim::SlimNode;

/// Tuning of the background patcher.
#[derive(Debug, Clone, Copy)]
pub struct PatcherOptions {
    /// Nodes waiting at most; more are dropped (and counted as failed).
    pub queue_capacity: usize,
    /// Patches in flight at once.
    pub concurrency: usize,
    /// Attempts per node (read + patch) before giving up.
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt up to `max_backoff`.
    pub base_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for PatcherOptions {
    fn default() -> Self {
        Self {
            queue_capacity: 4096,
            concurrency: 4,
            max_attempts: 6,
            base_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// What happened to a node handed to [`RebootPatcher::enqueue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    Queued,
    /// Already waiting; the pending job re-reads the node anyway.
    AlreadyQueued,
    /// No cluster credentials.
    Skipped,
    /// Queue full.
    Dropped,
}

/// Handle used by the admission path to queue nodes.
#[derive(Debug, Clone)]
pub struct RebootPatcher {
    tx: Option<mpsc::Sender<String>>,
    pending: Arc<Mutex<HashSet<String>>>,
    metrics: Arc<Metrics>,
}

/// What one background job did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchOutcome {
    /// This many taints were added.
    Patched(usize),
    /// Node gone, excluded, ready on its current boot, or taints present.
    Unneeded,
}

impl RebootPatcher {
    /// A patcher without credentials: every request is counted as skipped.
    pub fn disabled(metrics: Arc<Metrics>) -> Self {
        Self {
            tx: None,
            pending: Arc::default(),
            metrics,
        }
    }

    /// Starts the worker; it stops when every handle is dropped.
    pub fn spawn(
        client: Client,
        rules: Arc<Rules>,
        metrics: Arc<Metrics>,
        opts: PatcherOptions,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = mpsc::channel::<String>(opts.queue_capacity.max(1));
        let pending: Arc<Mutex<HashSet<String>>> = Arc::default();
        let handle = Self {
            tx: Some(tx),
            pending: pending.clone(),
            metrics: metrics.clone(),
        };
        let api: Api<SlimNode> = Api::all(client);
        let permits = Arc::new(Semaphore::new(opts.concurrency.max(1)));
        let worker = tokio::spawn(async move {
            while let Some(node) = rx.recv().await {
                // Removed before the work starts: a write that arrives while
                // this job runs queues a fresh one.
                pending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&node);
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let (api, rules, metrics) = (api.clone(), rules.clone(), metrics.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    match patch_node(&api, &rules, &node, &opts).await {
                        Ok(PatchOutcome::Patched(n)) => {
                            metrics.background(Background::Ok);
                            metrics.taints_added(Reason::Reboot, n);
                            tracing::info!(%node, taints = n, "reboot taints added after status write");
                        }
                        Ok(PatchOutcome::Unneeded) => {
                            metrics.background(Background::Unneeded);
                            tracing::debug!(%node, "reboot patch no longer needed");
                        }
                        Err(err) => {
                            metrics.background(Background::Failed);
                            tracing::warn!(%node, %err, "reboot patch failed");
                        }
                    }
                });
            }
        });
        (handle, worker)
    }

    /// Queues `node` for a background reboot patch; never waits.
    pub fn enqueue(&self, node: &str) -> Enqueued {
        let Some(tx) = &self.tx else {
            self.metrics.background(Background::Skipped);
            return Enqueued::Skipped;
        };
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if pending.contains(node) {
            return Enqueued::AlreadyQueued;
        }
        match tx.try_send(node.to_owned()) {
            Ok(()) => {
                pending.insert(node.to_owned());
                Enqueued::Queued
            }
            Err(_) => {
                self.metrics.background(Background::Failed);
                tracing::warn!(%node, "reboot patch queue full; dropping");
                Enqueued::Dropped
            }
        }
    }
}

/// Worth another attempt: conflicts, a failed `test` (422), throttling,
/// server errors and transport errors.
fn retryable(err: &KubeError) -> bool {
    match err {
        KubeError::Api(status) => matches!(status.code, 409 | 422 | 429 | 500..=599),
        KubeError::HyperError(_) | KubeError::Service(_) => true,
        _ => false,
    }
}

/// One job: read, re-check, guarded patch; retried with exponential backoff.
pub async fn patch_node(
    api: &Api<SlimNode>,
    rules: &Rules,
    name: &str,
    opts: &PatcherOptions,
) -> Result<PatchOutcome, KubeError> {
    let mut delay = opts.base_backoff;
    let mut attempt = 1;
    loop {
        let result = async {
            let Some(node) = api.get_opt(name).await? else {
                return Ok(PatchOutcome::Unneeded);
            };
            let missing = rules.reboot_taints_needed(&node.view);
            if missing.is_empty() {
                return Ok(PatchOutcome::Unneeded);
            }
            let patch = add_taints(&node.view, &missing, Guard::Current);
            api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .await?;
            Ok(PatchOutcome::Patched(missing.len()))
        }
        .await;
        match result {
            Err(err) if attempt < opts.max_attempts && retryable(&err) => {
                tracing::debug!(node = %name, attempt, %err, "reboot patch will be retried");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(opts.max_backoff);
                attempt += 1;
            }
            other => return other,
        }
    }
}
