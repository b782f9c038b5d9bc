//! The API server's own counters for every line of admission (this API
//! server only; needs `get` on the non-resource URL `/metrics`):
//! match-condition errors and fail-open calls are the silent failures, so
//! any count is worth a warning.

use kube::Client;

use crate::report::{Report, Status};

pub const CHECK: &str = "api server counters";

/// `/metrics` as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Metrics {
    Text(String),
    /// The request could not be built.
    Unbuilt(String),
    /// The API server did not answer it.
    Unreadable(String),
}

/// The sum of `metric`'s samples labelled `name="<name>"`.
fn sum(text: &str, metric: &str, name: &str) -> u64 {
    let label = format!("name=\"{name}\"");
    text.lines()
        .filter(|l| {
            l.starts_with(metric) && l[metric.len()..].starts_with('{') && l.contains(&label)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>()
        // Counters: whole and non-negative (an empty f64 sum is -0).
        .max(0.0) as u64
}

/// The line for the lines named `names`.
pub fn verdict(metrics: &Metrics, names: &[String]) -> (Status, String) {
    let text = match metrics {
        Metrics::Text(t) => t,
        Metrics::Unbuilt(e) => return (Status::Skip, e.clone()),
        Metrics::Unreadable(e) => {
            return (
                Status::Skip,
                format!("cannot read the API server's /metrics: {e}"),
            );
        }
    };
    let mut counted = Vec::new();
    for name in names {
        let errors = sum(
            text,
            "apiserver_admission_match_condition_evaluation_errors_total",
            name,
        );
        let fail_open = sum(text, "apiserver_admission_webhook_fail_open_count", name);
        if errors != 0 || fail_open != 0 {
            counted.push(format!(
                "{errors} match-condition evaluation errors and {fail_open} fail-open calls for {name}"
            ));
        }
    }
    if counted.is_empty() {
        let all = names.join(", ");
        (
            Status::Pass,
            format!("no match-condition errors and no fail-open calls counted for {all}"),
        )
    } else {
        (
            Status::Warn,
            format!(
                "since this API server started it counted {} (each one skipped that line for a Node write; the write went through ungated when it skipped every line it reached)",
                counted.join("; ")
            ),
        )
    }
}

pub async fn read(client: &Client) -> Metrics {
    match http::Request::get("/metrics").body(Vec::new()) {
        Ok(req) => match client.request_text(req).await {
            Ok(t) => Metrics::Text(t),
            Err(e) => Metrics::Unreadable(e.to_string()),
        },
        Err(e) => Metrics::Unbuilt(e.to_string()),
    }
}

/// Reads `/metrics` and reports [`verdict`] for the lines named `names`.
pub async fn check(client: &Client, names: &[String], report: &mut Report) {
    let (status, detail) = verdict(&read(client).await, names);
    report.add(CHECK, status, detail);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        let names = vec!["a.dev".to_string(), "b.dev".to_string()];
        let text = |s: &str| Metrics::Text(s.into());
        let rows = [
            (
                text("# HELP x\n"),
                Status::Pass,
                "no match-condition errors and no fail-open calls counted for a.dev, b.dev",
            ),
            (
                text(
                    "apiserver_admission_webhook_fail_open_count{name=\"b.dev\",type=\"admit\"} 2\n\
                     apiserver_admission_webhook_fail_open_count{name=\"b.dev\",type=\"validating\"} 1\n\
                     apiserver_admission_match_condition_evaluation_errors_total{name=\"a.dev\"} 0\n",
                ),
                Status::Warn,
                "since this API server started it counted 0 match-condition evaluation errors and 3 fail-open calls for b.dev (each one",
            ),
            (
                text(
                    "apiserver_admission_match_condition_evaluation_errors_total{kind=\"webhook\",name=\"a.dev\"} 4\n\
                     apiserver_admission_match_condition_evaluation_errors_total_other{name=\"b.dev\"} 9\n",
                ),
                Status::Warn,
                "counted 4 match-condition evaluation errors and 0 fail-open calls for a.dev (",
            ),
            (
                Metrics::Unreadable("403".into()),
                Status::Skip,
                "cannot read the API server's /metrics: 403",
            ),
            (Metrics::Unbuilt("bad uri".into()), Status::Skip, "bad uri"),
        ];
        for (metrics, status, part) in rows {
            let (got, detail) = verdict(&metrics, &names);
            assert_eq!(got, status, "{detail}");
            assert!(detail.contains(part), "{detail:?} lacks {part:?}");
        }
    }
}
