//! Background reboot patches ([`Rule::StatusShowsReboot`]), and the
//! re-registration check ([`Rule::NodeCreate`]'s look at the stored Node).
//!
//! A `nodes/status` write cannot carry taints (the API server keeps the
//! stored spec), so when one shows a reboot the webhook queues the node here
//! and a worker patches the main resource: re-read the node, re-check the
//! rule, JSON patch with a `test` guard on the resourceVersion and taints it read, retry with
//! backoff when the node changed meanwhile. The queue is bounded and holds
//! each node at most once; the admission answer never waits for it.
//!
//! Admission runs before the write is stored, so the re-read can still show
//! the node as it was before the reboot: the job then waits (with the same
//! backoff) until the stored bootID is no longer the one the write replaced,
//! instead of concluding that nothing is needed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Error as KubeError};
use nodegate_shared::NodeView;
use nodegate_shared::patch::{Guard, add_taints};
use tokio::sync::{Semaphore, mpsc};

use crate::claims::{Admit, Claims, Verdict};
use crate::metrics::{Background, ClaimResult, Metrics};
#[cfg(doc)]
use crate::rules::Rule;
use crate::rules::{Reason, RebootJob, Reregistration, Rules};

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
    /// One re-registration re-taint per node at most this often ([`Claims`]).
    pub reregistration_min_interval: Duration,
    /// A re-registration's claimed boot must be stored within this, or it
    /// is counted as unconfirmed.
    pub reboot_confirm_timeout: Duration,
}

impl Default for PatcherOptions {
    fn default() -> Self {
        Self {
            queue_capacity: 4096,
            concurrency: 4,
            max_attempts: 6,
            base_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            reregistration_min_interval: Duration::from_secs(30),
            reboot_confirm_timeout: Duration::from_secs(120),
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
    tx: Option<mpsc::Sender<RebootJob>>,
    /// The job waiting for each node, as the worker will run it.
    pending: Arc<Mutex<HashMap<String, RebootJob>>>,
    metrics: Arc<Metrics>,
    /// For the re-registration check, made on the admission path.
    direct: Option<(Api<NodeView>, Arc<Rules>)>,
    /// Re-taints made on a re-registration's claim, until checked.
    claims: Arc<Mutex<Claims>>,
}

/// What one background job did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchOutcome {
    /// This many taints were added.
    Patched(usize),
    /// Node gone, excluded, ready on its current boot, or taints present.
    Unneeded,
    /// A re-registration's claim held back ([`Claims::admit`]).
    RateLimited,
}

impl RebootPatcher {
    /// A patcher without credentials: every request is counted as skipped.
    pub fn disabled(metrics: Arc<Metrics>) -> Self {
        let o = PatcherOptions::default();
        Self {
            tx: None,
            pending: Arc::default(),
            metrics,
            direct: None,
            claims: Arc::new(Mutex::new(Claims::new(
                o.reregistration_min_interval,
                o.reboot_confirm_timeout,
            ))),
        }
    }

    /// Starts the worker; it stops when every handle is dropped.
    pub fn spawn(
        client: Client,
        rules: Arc<Rules>,
        metrics: Arc<Metrics>,
        opts: PatcherOptions,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = mpsc::channel::<RebootJob>(opts.queue_capacity.max(1));
        let pending: Arc<Mutex<HashMap<String, RebootJob>>> = Arc::default();
        let api: Api<NodeView> = Api::all(client);
        let claims = Arc::new(Mutex::new(Claims::new(
            opts.reregistration_min_interval,
            opts.reboot_confirm_timeout,
        )));
        let handle = Self {
            tx: Some(tx),
            pending: pending.clone(),
            metrics: metrics.clone(),
            direct: Some((api.clone(), rules.clone())),
            claims: claims.clone(),
        };
        let sweep = check_claims(api.clone(), claims, metrics.clone(), opts);
        let permits = Arc::new(Semaphore::new(opts.concurrency.max(1)));
        let jobs = async move {
            loop {
                // A free slot first, then a node: nodes stay in `pending` (and
                // deduplicated) while they wait for a slot.
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let Some(job) = rx.recv().await else {
                    return;
                };
                // Removed before the work starts: a write that arrives while
                // this job runs queues a fresh one. The waiting entry may
                // have taken a later write's new boot (`enqueue`).
                let job = pending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&job.node)
                    .unwrap_or(job);
                let (api, rules, metrics) = (api.clone(), rules.clone(), metrics.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    let node = &job.node;
                    match patch_node(&api, &rules, &job, &opts).await {
                        Ok(PatchOutcome::Patched(n)) => {
                            metrics.background(Background::Ok);
                            metrics.taints_added(Reason::Reboot, n);
                            tracing::info!(%node, taints = n, "reboot taints added after status write");
                        }
                        Ok(PatchOutcome::Unneeded | PatchOutcome::RateLimited) => {
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
        };
        // The claims' checks end with the job loop, when every handle is gone.
        let worker = tokio::spawn(async move {
            tokio::select! {
                () = jobs => {}
                () = sweep => {}
            }
        });
        (handle, worker)
    }

    /// The re-registration check ([`retaint_reregistered`]), bounded by
    /// `until`; the caller answers the create after it. Failures are logged
    /// and counted: the status write that follows still queues a background patch.
    pub async fn retaint_now(&self, job: &Reregistration, until: tokio::time::Instant) {
        let Some((api, rules)) = &self.direct else {
            self.metrics.reregistration(Background::Skipped);
            return;
        };
        let node = &job.node;
        let checked = retaint_reregistered(api, rules, job, &self.claims, &self.metrics);
        match tokio::time::timeout_at(until, checked).await {
            Ok(Ok(PatchOutcome::RateLimited)) => {
                self.metrics.reregistration(Background::Skipped);
                tracing::warn!(%node, boot = %job.boot_id, "a re-registration claiming a reboot while the node's previous claim is unconfirmed, within --reregistration-min-interval: not re-tainted on its claim (the stored new boot still gates it)");
            }
            Ok(Ok(PatchOutcome::Patched(n))) => {
                self.metrics.reregistration(Background::Ok);
                self.metrics.taints_added(Reason::Reboot, n);
                tracing::info!(%node, boot = %job.boot_id, taints = n, "kubelet re-registered after a reboot: taints added before answering its create");
            }
            Ok(Ok(PatchOutcome::Unneeded)) => self.metrics.reregistration(Background::Unneeded),
            Ok(Err(err)) => {
                self.metrics.reregistration(Background::Failed);
                tracing::warn!(%node, %err, "re-registration re-taint failed; the status write will queue it");
            }
            Err(_) => {
                self.metrics.reregistration(Background::Failed);
                tracing::warn!(%node, "re-registration re-taint timed out; the status write will queue it");
            }
        }
    }

    /// Queues a background reboot patch; never waits.
    pub fn enqueue(&self, job: &RebootJob) -> Enqueued {
        let Some(tx) = &self.tx else {
            self.metrics.background(Background::Skipped);
            return Enqueued::Skipped;
        };
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(waiting) = pending.get_mut(&job.node) {
            // The write that moved the bootID must not be lost behind one
            // that kept it: only its job adds the gates owned elsewhere.
            if job.previous_boot.is_some() {
                waiting.previous_boot.clone_from(&job.previous_boot);
            }
            return Enqueued::AlreadyQueued;
        }
        match tx.try_send(job.clone()) {
            Ok(()) => {
                pending.insert(job.node.clone(), job.clone());
                Enqueued::Queued
            }
            Err(_) => {
                self.metrics.background(Background::Failed);
                tracing::warn!(node = %job.node, "reboot patch queue full; dropping");
                Enqueued::Dropped
            }
        }
    }
}

/// Checks each re-registration claim once its time is up: one GET of the
/// node; a claimed boot the stored node does not report is counted as
/// unconfirmed and logged, for an alert to name.
async fn check_claims(
    api: Api<NodeView>,
    claims: Arc<Mutex<Claims>>,
    metrics: Arc<Metrics>,
    opts: PatcherOptions,
) {
    let every =
        (opts.reboot_confirm_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(15));
    loop {
        tokio::time::sleep(every).await;
        let due = claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .due(std::time::Instant::now());
        for (node, boot) in due {
            let stored = match api.get_opt(&node).await {
                Ok(n) => n.and_then(|n| n.boot_id().map(str::to_owned)),
                Err(err) => {
                    tracing::debug!(%node, %err, "claim check: node not read; next round");
                    continue;
                }
            };
            let verdict = claims
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .settle(&node, &boot, stored.as_deref());
            count_verdict(&metrics, &node, verdict);
        }
    }
}

/// Counts how a claim ended; an unconfirmed one is also a warning.
fn count_verdict(metrics: &Metrics, node: &str, verdict: Option<Verdict>) {
    match verdict {
        Some(Verdict::Confirmed) => metrics.reboot_claim(ClaimResult::Confirmed),
        Some(Verdict::Unconfirmed { stored_boot }) => {
            metrics.reboot_claim(ClaimResult::Unconfirmed);
            tracing::warn!(%node, stored = ?stored_boot, "a re-registration claimed a reboot that the node never reported: the re-taint followed no real reboot (a forged review on the path token?)");
        }
        None => {}
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

/// What one read (and maybe patch) of a job found.
enum Attempt {
    Done(PatchOutcome),
    /// The node still shows the boot the triggering write replaces.
    NotStoredYet,
}

/// A kubelet's create of an existing Node after a reboot: re-taint the stored
/// node before the create is answered. The kubelet sends its status write
/// (the new boot ID) only after that answer, so a patch stored now is in the
/// first stored version with the new boot; left to the background it can
/// lose that race. One GET per Node create (a brand-new node: a 404); a
/// guarded patch only after a reboot. Conflicts are retried at once a few
/// times; the caller bounds the whole by the request's deadline. `claims`
/// may hold the re-taint back while the node's previous claim is
/// unconfirmed ([`Claims::admit`]), and records this one.
pub async fn retaint_reregistered(
    api: &Api<NodeView>,
    rules: &Rules,
    job: &Reregistration,
    claims: &Mutex<Claims>,
    metrics: &Metrics,
) -> Result<PatchOutcome, KubeError> {
    const ATTEMPTS: u32 = 3;
    let name = job.node.as_str();
    let mut attempt = 1;
    loop {
        let Some(node) = api.get_opt(name).await? else {
            return Ok(PatchOutcome::Unneeded);
        };
        let missing = rules.reregistration_taints_needed(&node, &job.boot_id);
        if missing.is_empty() {
            return Ok(PatchOutcome::Unneeded);
        }
        let now = std::time::Instant::now();
        let (admit, verdict) =
            claims
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .admit(name, node.boot_id(), now);
        count_verdict(metrics, name, verdict);
        if admit == Admit::RateLimited {
            metrics.reboot_claim(ClaimResult::RateLimited);
            return Ok(PatchOutcome::RateLimited);
        }
        let patch = add_taints(&node, &missing, Guard::Current);
        match api
            .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
        {
            Ok(_) => {
                claims
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .record(name, &job.boot_id, now);
                return Ok(PatchOutcome::Patched(missing.len()));
            }
            Err(err) if attempt < ATTEMPTS && retryable(&err) => attempt += 1,
            Err(err) => return Err(err),
        }
    }
}

/// Reads of a node whose triggering status write is not stored yet, before
/// the job gives up (the write was refused after admission). A write is
/// stored within milliseconds of its admission, so the reads start fast:
/// strict mode's boot gate waits for it, and pods the kubelet admits
/// meanwhile start before they are evicted.
pub const NOT_STORED_POLLS: u32 = 12;
const NOT_STORED_FIRST: Duration = Duration::from_millis(5);
const NOT_STORED_MAX: Duration = Duration::from_millis(400);

/// One job: read, re-check, guarded patch; retried with exponential backoff,
/// and read again quickly while the write that triggered it is not stored
/// yet.
pub async fn patch_node(
    api: &Api<NodeView>,
    rules: &Rules,
    job: &RebootJob,
    opts: &PatcherOptions,
) -> Result<PatchOutcome, KubeError> {
    let name = job.node.as_str();
    let mut delay = opts.base_backoff;
    let mut attempt = 1;
    let mut not_stored = 0;
    loop {
        let result = async {
            let Some(node) = api.get_opt(name).await? else {
                return Ok(Attempt::Done(PatchOutcome::Unneeded));
            };
            let stored_boot = node.boot_id().unwrap_or("");
            if job.previous_boot.as_deref() == Some(stored_boot) {
                return Ok(Attempt::NotStoredYet);
            }
            // A write that moved the bootID is a new boot: the gates owned
            // elsewhere come back too. Any later write of the boot brings
            // back only nodegate's, or it would undo their owner's removal.
            let missing = if job.previous_boot.is_some() {
                rules.new_boot_taints_needed(&node)
            } else {
                rules.reboot_taints_needed(&node)
            };
            if missing.is_empty() {
                return Ok(Attempt::Done(PatchOutcome::Unneeded));
            }
            let patch = add_taints(&node, &missing, Guard::Current);
            api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .await?;
            Ok(Attempt::Done(PatchOutcome::Patched(missing.len())))
        }
        .await;
        match result {
            Ok(Attempt::Done(outcome)) => return Ok(outcome),
            Ok(Attempt::NotStoredYet) if not_stored >= NOT_STORED_POLLS => {
                // The write never showed up (refused after admission): nothing
                // of ours to fix.
                tracing::debug!(node = %name, "status write never stored; nothing to do");
                return Ok(PatchOutcome::Unneeded);
            }
            Ok(Attempt::NotStoredYet) => {
                tracing::debug!(node = %name, not_stored, "status write not stored yet; reading again");
                tokio::time::sleep((NOT_STORED_FIRST * 2u32.pow(not_stored)).min(NOT_STORED_MAX))
                    .await;
                not_stored += 1;
                continue;
            }
            Err(err) if attempt < opts.max_attempts && retryable(&err) => {
                tracing::debug!(node = %name, attempt, %err, "reboot patch will be retried");
            }
            Err(err) => return Err(err),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(opts.max_backoff);
        attempt += 1;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use http::{Method, Request, Response, StatusCode};
    use http_body_util::BodyExt;
    use kube::client::Body;
    use nodegate_shared::keys::{DEFAULT_TAINT, READY_BOOT_ID_ANNOTATION as ANN};
    use serde_json::{Value, json};
    use tower_test::mock;

    use super::*;
    use crate::fixtures::{kubelet_node, with_annotation, with_taints};

    type Handle = mock::Handle<Request<Body>, Response<Body>>;

    fn rules() -> Arc<Rules> {
        Arc::new(Rules::new(vec![DEFAULT_TAINT.parse().unwrap()]).unwrap())
    }

    /// A job for a status write that did not change the stored bootID.
    fn job(node: &str) -> RebootJob {
        RebootJob {
            node: node.to_owned(),
            previous_boot: None,
        }
    }

    fn fast() -> PatcherOptions {
        PatcherOptions {
            base_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
            ..PatcherOptions::default()
        }
    }

    fn rebooted_node(rv: &str) -> Value {
        let mut n = with_taints(
            with_annotation(kubelet_node("n1", "boot-2", 2), ANN, "boot-1"),
            json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]),
        );
        n["metadata"]["resourceVersion"] = json!(rv);
        n
    }

    fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap()
    }

    fn status(code: u16, reason: &str) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "message": reason, "reason": reason, "code": code})
    }

    async fn expect(
        handle: &mut Handle,
        method: Method,
        path: &str,
    ) -> (Request<Body>, mock::SendResponse<Response<Body>>) {
        let (req, send) = handle.next_request().await.expect("a request");
        assert_eq!(req.method(), method);
        assert_eq!(req.uri().path(), path);
        (req, send)
    }

    async fn body_json(req: Request<Body>) -> Value {
        let bytes = req.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn guarded_json_patch_retried_after_conflict() {
        let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let api: Api<NodeView> = Api::all(Client::new(svc, "default"));
        let server = tokio::spawn(async move {
            let (_, send) = expect(&mut handle, Method::GET, "/api/v1/nodes/n1").await;
            send.send_response(json_response(StatusCode::OK, &rebooted_node("5")));
            let (req, send) = expect(&mut handle, Method::PATCH, "/api/v1/nodes/n1").await;
            assert_eq!(req.headers()["content-type"], "application/json-patch+json");
            assert_eq!(
                body_json(req).await,
                json!([
                    {"op": "test", "path": "/metadata/resourceVersion", "value": "5"},
                    {"op": "test", "path": "/spec/taints",
                     "value": [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]},
                    {"op": "add", "path": "/spec/taints/0",
                     "value": {"key": "nodegate.dev/agent-not-ready", "value": "true", "effect": "NoSchedule"}}
                ])
            );
            // Someone changed the taints meanwhile.
            send.send_response(json_response(
                StatusCode::CONFLICT,
                &status(409, "Conflict"),
            ));
            // The retry re-reads and builds the guard from the new state.
            let (_, send) = expect(&mut handle, Method::GET, "/api/v1/nodes/n1").await;
            let mut changed = rebooted_node("6");
            changed["spec"]["taints"] = json!([]);
            send.send_response(json_response(StatusCode::OK, &changed));
            let (req, send) = expect(&mut handle, Method::PATCH, "/api/v1/nodes/n1").await;
            assert_eq!(
                body_json(req).await,
                json!([
                    {"op": "test", "path": "/metadata/resourceVersion", "value": "6"},
                    {"op": "test", "path": "/spec/taints", "value": []},
                    {"op": "add", "path": "/spec/taints/0",
                     "value": {"key": "nodegate.dev/agent-not-ready", "value": "true", "effect": "NoSchedule"}}
                ])
            );
            send.send_response(json_response(StatusCode::OK, &changed));
        });
        let out = patch_node(&api, &rules(), &job("n1"), &fast())
            .await
            .unwrap();
        assert_eq!(out, PatchOutcome::Patched(1));
        server.await.unwrap();
    }

    #[tokio::test]
    async fn recheck_skips_ready_or_missing_nodes_and_gives_up_on_errors() {
        let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let api: Api<NodeView> = Api::all(Client::new(svc, "default"));
        let server = tokio::spawn(async move {
            // Agent already ready on the current boot: no PATCH.
            let (_, send) = expect(&mut handle, Method::GET, "/api/v1/nodes/n1").await;
            send.send_response(json_response(
                StatusCode::OK,
                &with_annotation(kubelet_node("n1", "boot-2", 0), ANN, "boot-2"),
            ));
            // Node deleted.
            let (_, send) = expect(&mut handle, Method::GET, "/api/v1/nodes/n1").await;
            send.send_response(json_response(
                StatusCode::NOT_FOUND,
                &status(404, "NotFound"),
            ));
            // Forbidden is not retried.
            let (_, send) = expect(&mut handle, Method::GET, "/api/v1/nodes/n1").await;
            send.send_response(json_response(StatusCode::OK, &rebooted_node("5")));
            let (_, send) = expect(&mut handle, Method::PATCH, "/api/v1/nodes/n1").await;
            send.send_response(json_response(
                StatusCode::FORBIDDEN,
                &status(403, "Forbidden"),
            ));
            // Conflicts are retried max_attempts times, then reported.
            for _ in 0..2 {
                let (_, send) = expect(&mut handle, Method::GET, "/api/v1/nodes/n1").await;
                send.send_response(json_response(StatusCode::OK, &rebooted_node("5")));
                let (_, send) = expect(&mut handle, Method::PATCH, "/api/v1/nodes/n1").await;
                send.send_response(json_response(
                    StatusCode::CONFLICT,
                    &status(409, "Conflict"),
                ));
            }
        });
        let r = rules();
        assert_eq!(
            patch_node(&api, &r, &job("n1"), &fast()).await.unwrap(),
            PatchOutcome::Unneeded
        );
        assert_eq!(
            patch_node(&api, &r, &job("n1"), &fast()).await.unwrap(),
            PatchOutcome::Unneeded
        );
        assert!(patch_node(&api, &r, &job("n1"), &fast()).await.is_err());
        let two = PatcherOptions {
            max_attempts: 2,
            ..fast()
        };
        let err = patch_node(&api, &r, &job("n1"), &two).await.unwrap_err();
        assert!(
            matches!(err, KubeError::Api(ref s) if s.code == 409),
            "{err}"
        );
        server.await.unwrap();
    }

    /// Admission comes before the status write is stored: a read that still
    /// shows the boot the write replaces waits and reads again, and a write
    /// that never shows up ends the job without a patch.
    #[tokio::test]
    async fn waits_until_the_status_write_is_stored() {
        let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let api: Api<NodeView> = Api::all(Client::new(svc, "default"));
        let before_reboot = with_annotation(kubelet_node("n1", "boot-1", 0), ANN, "boot-1");
        let server = tokio::spawn(async move {
            // Not stored yet, then stored: one read more, then the patch.
            let (_, send) = expect(&mut handle, Method::GET, "/api/v1/nodes/n1").await;
            send.send_response(json_response(StatusCode::OK, &before_reboot));
            let (_, send) = expect(&mut handle, Method::GET, "/api/v1/nodes/n1").await;
            send.send_response(json_response(StatusCode::OK, &rebooted_node("7")));
            let (req, send) = expect(&mut handle, Method::PATCH, "/api/v1/nodes/n1").await;
            assert_eq!(body_json(req).await[0]["value"], "7");
            send.send_response(json_response(StatusCode::OK, &rebooted_node("8")));
            // Never stored: the first read and NOT_STORED_POLLS more, no PATCH.
            for _ in 0..=NOT_STORED_POLLS {
                let (_, send) = expect(&mut handle, Method::GET, "/api/v1/nodes/n1").await;
                send.send_response(json_response(StatusCode::OK, &before_reboot));
            }
            assert!(
                handle.next_request().await.is_none(),
                "nothing after the reads"
            );
        });
        let r = rules();
        let job = RebootJob {
            node: "n1".into(),
            previous_boot: Some("boot-1".into()),
        };
        assert_eq!(
            patch_node(&api, &r, &job, &fast()).await.unwrap(),
            PatchOutcome::Patched(1)
        );
        assert_eq!(
            patch_node(&api, &r, &job, &fast()).await.unwrap(),
            PatchOutcome::Unneeded
        );
        drop(api);
        server.await.unwrap();
    }

    async fn eventually(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn queue_dedupes_waiting_nodes_and_counts_results() {
        let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let metrics = Arc::new(Metrics::new());
        let opts = PatcherOptions {
            concurrency: 1,
            ..fast()
        };
        let (patcher, _worker) =
            RebootPatcher::spawn(Client::new(svc, "default"), rules(), metrics.clone(), opts);
        assert_eq!(patcher.enqueue(&job("n1")), Enqueued::Queued);
        // n1 is in flight (its GET is waiting for us); n2 waits for the only slot.
        let (_, send_n1) = expect(&mut handle, Method::GET, "/api/v1/nodes/n1").await;
        assert_eq!(patcher.enqueue(&job("n2")), Enqueued::Queued);
        assert_eq!(patcher.enqueue(&job("n2")), Enqueued::AlreadyQueued);
        // A new write for n1 while its job runs queues a fresh job.
        assert_eq!(patcher.enqueue(&job("n1")), Enqueued::Queued);
        send_n1.send_response(json_response(StatusCode::OK, &rebooted_node("5")));
        let (_, send) = expect(&mut handle, Method::PATCH, "/api/v1/nodes/n1").await;
        send.send_response(json_response(StatusCode::OK, &rebooted_node("6")));
        let (_, send) = expect(&mut handle, Method::GET, "/api/v1/nodes/n2").await;
        send.send_response(json_response(
            StatusCode::NOT_FOUND,
            &status(404, "NotFound"),
        ));
        let (_, send) = expect(&mut handle, Method::GET, "/api/v1/nodes/n1").await;
        let mut done = rebooted_node("6");
        done["spec"]["taints"] =
            json!([{"key": "nodegate.dev/agent-not-ready", "effect": "NoSchedule"}]);
        send.send_response(json_response(StatusCode::OK, &done));
        eventually("background metrics", || {
            let text = metrics.encode();
            text.contains(r#"nodegate_webhook_background_patches_total{result="ok"} 1"#)
                && text
                    .contains(r#"nodegate_webhook_background_patches_total{result="unneeded"} 2"#)
                && text.contains(r#"nodegate_webhook_taints_added_total{reason="reboot"} 1"#)
        })
        .await;

        let disabled = RebootPatcher::disabled(metrics.clone());
        assert_eq!(disabled.enqueue(&job("n3")), Enqueued::Skipped);
        assert!(
            metrics
                .encode()
                .contains(r#"nodegate_webhook_background_patches_total{result="skipped"} 1"#)
        );
    }

    fn rules_with_owned() -> Arc<Rules> {
        Arc::new(
            Rules::with_owned(
                vec![DEFAULT_TAINT.parse().unwrap()],
                vec!["ebs.csi.aws.com/agent-not-ready:NoExecute".parse().unwrap()],
            )
            .unwrap(),
        )
    }

    /// A rebooted node whose nodegate gate is on (the re-registration put
    /// it back) and whose owned gate is not.
    fn gated_without_owned(rv: &str) -> Value {
        let mut n = with_taints(
            with_annotation(kubelet_node("n1", "boot-2", 0), ANN, "boot-1"),
            json!([{"key": "nodegate.dev/agent-not-ready", "value": "true", "effect": "NoSchedule"}]),
        );
        n["metadata"]["resourceVersion"] = json!(rv);
        n
    }

    /// The job of the status write that moved the bootID adds the gates
    /// owned elsewhere; the job of a later write of the same boot does not
    /// (their owner may have removed them: re-adding would fight it).
    #[tokio::test]
    async fn only_the_new_boots_job_adds_the_owned_gates() {
        let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let api: Api<NodeView> = Api::all(Client::new(svc, "default"));
        let server = tokio::spawn(async move {
            let (_, send) = expect(&mut handle, Method::GET, "/api/v1/nodes/n1").await;
            send.send_response(json_response(StatusCode::OK, &gated_without_owned("5")));
            let (req, send) = expect(&mut handle, Method::PATCH, "/api/v1/nodes/n1").await;
            let ops = body_json(req).await;
            assert_eq!(
                ops[2],
                json!({"op": "add", "path": "/spec/taints/0",
                       "value": {"key": "ebs.csi.aws.com/agent-not-ready", "effect": "NoExecute"}})
            );
            assert_eq!(ops.as_array().unwrap().len(), 3, "{ops}");
            send.send_response(json_response(StatusCode::OK, &gated_without_owned("6")));
            // A later write's job: a read, and no patch.
            let (_, send) = expect(&mut handle, Method::GET, "/api/v1/nodes/n1").await;
            send.send_response(json_response(StatusCode::OK, &gated_without_owned("7")));
            assert!(handle.next_request().await.is_none(), "no patch");
        });
        let r = rules_with_owned();
        let new_boot = RebootJob {
            node: "n1".into(),
            previous_boot: Some("boot-1".into()),
        };
        assert_eq!(
            patch_node(&api, &r, &new_boot, &fast()).await.unwrap(),
            PatchOutcome::Patched(1)
        );
        assert_eq!(
            patch_node(&api, &r, &job("n1"), &fast()).await.unwrap(),
            PatchOutcome::Unneeded
        );
        drop(api);
        server.await.unwrap();
    }

    /// A job waiting for a slot takes the new boot of a later write for the
    /// same node: the write that moved the bootID is not lost behind one
    /// that kept it, and its owned gates still come back.
    #[tokio::test]
    async fn a_waiting_job_takes_a_later_writes_new_boot() {
        let (svc, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let metrics = Arc::new(Metrics::new());
        let opts = PatcherOptions {
            concurrency: 1,
            ..fast()
        };
        let (patcher, _worker) = RebootPatcher::spawn(
            Client::new(svc, "default"),
            rules_with_owned(),
            metrics,
            opts,
        );
        // n0 holds the only slot; n1 waits behind it, first for a write
        // that kept the boot, then for the one that moved it.
        assert_eq!(patcher.enqueue(&job("n0")), Enqueued::Queued);
        let (_, send_n0) = expect(&mut handle, Method::GET, "/api/v1/nodes/n0").await;
        assert_eq!(patcher.enqueue(&job("n1")), Enqueued::Queued);
        let moved = RebootJob {
            node: "n1".into(),
            previous_boot: Some("boot-1".into()),
        };
        assert_eq!(patcher.enqueue(&moved), Enqueued::AlreadyQueued);
        send_n0.send_response(json_response(
            StatusCode::NOT_FOUND,
            &status(404, "NotFound"),
        ));
        let (_, send) = expect(&mut handle, Method::GET, "/api/v1/nodes/n1").await;
        send.send_response(json_response(StatusCode::OK, &gated_without_owned("5")));
        let (req, send) = expect(&mut handle, Method::PATCH, "/api/v1/nodes/n1").await;
        assert_eq!(
            body_json(req).await[2]["value"]["key"],
            "ebs.csi.aws.com/agent-not-ready"
        );
        send.send_response(json_response(StatusCode::OK, &gated_without_owned("6")));
    }
}
