//! In-process cost of each step of the webhook's hot path, without network
//! or TLS: where a request's CPU goes. Run it under `valgrind --tool=dhat`
//! to count allocations per request.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nodegate_shared::keys::DEFAULT_TAINT;
use nodegate_webhook::admission::Webhook;
use nodegate_webhook::metrics::Metrics;
use nodegate_webhook::patcher::RebootPatcher;
use nodegate_webhook::review;
use nodegate_webhook::rules::Rules;
use serde::de::IgnoredAny;

use crate::fixtures::{Fixture, uid};

/// One measured step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Step {
    /// serde_json skipping the whole body: the floor for any JSON decoder.
    Scan,
    /// `review::decode`: kube's AdmissionReview with the Node as `NodeView`.
    Decode,
    /// `Rules::review` on a decoded request.
    Review,
    /// `review::encode` of the decision.
    Encode,
    /// `Webhook::handle`: decode + review + encode + metrics, as per request.
    Handle,
}

pub const ALL: [Step; 5] = [
    Step::Scan,
    Step::Decode,
    Step::Review,
    Step::Encode,
    Step::Handle,
];

/// Mean time per iteration of `step` on `fixture`.
pub fn measure(step: Step, fixture: &Fixture, iterations: u32) -> anyhow::Result<Duration> {
    let body = fixture.body(&uid(0, 1));
    let metrics = Arc::new(Metrics::new());
    let rules = Arc::new(Rules::new(vec![DEFAULT_TAINT.parse()?])?);
    let hook = Webhook {
        rules: rules.clone(),
        patcher: RebootPatcher::disabled(metrics.clone()),
        metrics,
        authority: Arc::new(nodegate_webhook::caller::TokenFile::load(None)),
    };
    let req = review::decode(&body).map_err(|e| anyhow::anyhow!("{e}"))?;
    let decision = rules.review(&req);
    let iterations = iterations.max(1);
    let start = Instant::now();
    for _ in 0..iterations {
        match step {
            Step::Scan => {
                let _ = black_box(serde_json::from_slice::<IgnoredAny>(black_box(&body)));
            }
            Step::Decode => {
                let _ = black_box(review::decode(black_box(&body)));
            }
            Step::Review => {
                black_box(rules.review(black_box(&req)));
            }
            Step::Encode => {
                black_box(review::encode(
                    black_box(&req.uid),
                    black_box(decision.added.as_ref()),
                ));
            }
            Step::Handle => {
                black_box(hook.handle(black_box(&body)));
            }
        }
    }
    Ok(start.elapsed() / iterations)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn every_step_runs_on_every_fixture() {
        for f in crate::fixtures::workload(crate::fixtures::Workload::Mix) {
            for step in ALL {
                measure(step, &f, 2).unwrap();
            }
        }
    }
}
