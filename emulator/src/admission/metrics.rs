//! kube-apiserver's admission counters, served on the emulator's `/metrics`.
//!
//! Follows `k8s.io/apiserver/pkg/admission/metrics/metrics.go`
//! (`ObserveMatchConditionEvalError`, `ObserveMatchConditionExclusion`,
//! `ObserveWebhookFailOpen`, `ObserveWebhook`).

use std::sync::Mutex;

/// kube-apiserver's admission counters that tell a skipped webhook apart
/// (`k8s.io/apiserver/pkg/admission/metrics/metrics.go`), served on the
/// emulator's `/metrics` like the real server's.
#[derive(Debug, Default)]
pub struct AdmissionMetrics {
    /// (metric, webhook name, operation) → count.
    counts: Mutex<std::collections::BTreeMap<(&'static str, String, &'static str), u64>>,
}

/// `matchConditions` that errored (`ObserveMatchConditionEvalError`).
pub const MATCH_CONDITION_ERRORS: &str =
    "apiserver_admission_match_condition_evaluation_errors_total";
/// Webhooks skipped by a false `matchCondition` (`ObserveMatchConditionExclusion`).
pub const MATCH_CONDITION_EXCLUSIONS: &str = "apiserver_admission_match_condition_exclusions_total";
/// Webhook call failures let through by `failurePolicy: Ignore` (`ObserveWebhookFailOpen`).
pub const WEBHOOK_FAIL_OPEN: &str = "apiserver_admission_webhook_fail_open_count";
/// Every webhook call, answered or failed (`ObserveWebhook`'s `webhookRequest`
/// counter; the real one also labels `code` and `rejected`).
pub const WEBHOOK_REQUESTS: &str = "apiserver_admission_webhook_request_total";

impl AdmissionMetrics {
    pub(crate) fn add(&self, metric: &'static str, webhook: &str, operation: &'static str, n: u64) {
        if n == 0 {
            return;
        }
        *self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((metric, webhook.to_string(), operation))
            .or_default() += n;
    }

    /// The count of `metric` for a webhook, summed over operations when `operation` is `None`.
    pub fn get(&self, metric: &str, webhook: &str, operation: Option<&str>) -> u64 {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|((m, w, op), _)| {
                *m == metric && w == webhook && operation.is_none_or(|o| o == *op)
            })
            .map(|(_, n)| n)
            .sum()
    }

    /// Prometheus text, with the real server's label sets: `kind="webhook"`,
    /// `type="admit"` (mutating, `webhook/accessors.go`).
    pub fn render(&self) -> String {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        for metric in [
            MATCH_CONDITION_ERRORS,
            MATCH_CONDITION_EXCLUSIONS,
            WEBHOOK_FAIL_OPEN,
            WEBHOOK_REQUESTS,
        ] {
            out.push_str(&format!("# TYPE {metric} counter\n"));
            for ((m, name, op), n) in counts.iter().filter(|((m, ..), _)| *m == metric) {
                let labels = if *m == WEBHOOK_FAIL_OPEN {
                    format!("name=\"{name}\",type=\"admit\"")
                } else if *m == WEBHOOK_REQUESTS {
                    format!("name=\"{name}\",operation=\"{op}\",type=\"admit\"")
                } else {
                    format!("kind=\"webhook\",name=\"{name}\",operation=\"{op}\",type=\"admit\"")
                };
                out.push_str(&format!("{m}{{{labels}}} {n}\n"));
            }
        }
        out
    }
}
