//! One admission review, start to end: decode, decide, count, queue the
//! background patch, encode. No HTTP here: the routes in [`crate::app`] call
//! it with a body read within the request limits.

use std::sync::Arc;
use std::time::Instant;

use axum::http::StatusCode;

use crate::caller::TokenFile;
use crate::metrics::{Metrics, Op, Outcome};
use crate::patcher::{Enqueued, RebootPatcher};
use crate::review::{self, BadInput};
use crate::rules::{Reregistration, Rules};

/// Shared by the admission handler.
#[derive(Debug)]
pub struct Webhook {
    pub rules: Arc<Rules>,
    pub patcher: RebootPatcher,
    pub metrics: Arc<Metrics>,
    /// Which reviews may write a stored Node ([`crate::caller`]).
    pub authority: Arc<TokenFile>,
}

/// The answer to one body, and the re-registration check to make before
/// sending it.
#[derive(Debug)]
pub struct Handled {
    pub status: StatusCode,
    pub bytes: Vec<u8>,
    pub reregistration: Option<Reregistration>,
}

impl Webhook {
    /// Answers one body: the response bytes and the HTTP status.
    pub fn handle(&self, body: &[u8]) -> (StatusCode, Vec<u8>) {
        let h = self.handle_review(body, None);
        (h.status, h.bytes)
    }

    /// [`Webhook::handle`], with the re-registration check a Node create asks
    /// for; `presented` is the path's token (`/mutate/<token>`), and without
    /// the right one the review writes nothing stored.
    pub fn handle_review(&self, body: &[u8], presented: Option<&str>) -> Handled {
        let may_act = self.authority.admits(presented);
        let mut reregistration = None;
        let start = Instant::now();
        let (op, outcome, status, bytes) = match review::decode(body) {
            Ok(req) => {
                let op = Op::from(&req.operation);
                let d = self.rules.review(&req);
                // Per-request lines are debug: a burst of thousands of node
                // writes must not turn into blocking stderr writes.
                if let Some(added) = &d.added {
                    let n = added.taints.len();
                    self.metrics.taints_added(added.reason, n);
                    tracing::debug!(
                        uid = %req.uid, node = %req.name, operation = ?req.operation,
                        dry_run = req.dry_run, taints = n, "{}", d.why
                    );
                } else {
                    tracing::debug!(uid = %req.uid, node = %req.name, operation = ?req.operation, "{}", d.why);
                }
                if let Some(which) = d.foreign {
                    self.metrics.foreign(which);
                    tracing::debug!(uid = %req.uid, node = %req.name, user = ?req.user_info.username, ?which, "a reboot claimed by a write that is not the node's kubelet's: no write of the stored node");
                }
                if let Some(job) = d.reboot_job.as_ref().filter(|_| !may_act) {
                    self.metrics.unauthenticated(true);
                    tracing::debug!(uid = %req.uid, node = %job.node, "a status write showing a reboot, not posted to the configured path: no background patch");
                } else if let Some(job) = &d.reboot_job {
                    let node = &job.node;
                    // Info only for a new job: a node without the taint keeps
                    // sending reboot-looking status writes until it is patched.
                    match self.patcher.enqueue(job) {
                        Enqueued::Queued => tracing::info!(uid = %req.uid, %node, "{}", d.why),
                        q => tracing::debug!(uid = %req.uid, %node, queued = ?q, "{}", d.why),
                    }
                }
                reregistration = match d.reregistration {
                    Some(job) if !may_act => {
                        self.metrics.unauthenticated(false);
                        tracing::debug!(uid = %req.uid, node = %job.node, "a Node create not posted to the configured path: no re-registration check");
                        None
                    }
                    other => other,
                };
                let outcome = if d.added.is_some() {
                    Outcome::Patched
                } else {
                    Outcome::Allowed
                };
                (
                    op,
                    outcome,
                    StatusCode::OK,
                    review::encode(&req.uid, d.added.as_ref()),
                )
            }
            Err(BadInput::Answer { uid, reason }) => {
                tracing::warn!(%uid, "{reason}; allowing untouched");
                (
                    Op::Unknown,
                    Outcome::Invalid,
                    StatusCode::OK,
                    review::encode(&uid, None),
                )
            }
            Err(BadInput::Reject(reason)) => {
                tracing::warn!("{reason}; answering 400");
                (
                    Op::Unknown,
                    Outcome::Invalid,
                    StatusCode::BAD_REQUEST,
                    format!("{reason}\n").into_bytes(),
                )
            }
        };
        self.metrics
            .request(op, outcome, start.elapsed().as_secs_f64());
        Handled {
            status,
            bytes,
            reregistration,
        }
    }
}
