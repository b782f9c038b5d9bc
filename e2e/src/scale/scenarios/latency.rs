//! Latency figures from histograms: the API server's for Node and Lease
//! writes and for its calls to the webhook, and the webhook's own.

use std::collections::BTreeMap;

use super::Report;
use crate::metrics::{self, Scrape, bucket_delta, quantile};
use crate::scale::install::http_get;

/// Every webhook replica's request-duration buckets, summed.
pub(super) async fn webhook_buckets(urls: &[String]) -> Vec<(f64, f64)> {
    let mut all: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for u in urls {
        let Some(text) = http_get(&format!("{u}/metrics")).await else {
            continue;
        };
        let s = metrics::parse(&text);
        let name =
            s.0.iter()
                .find(|x| x.name.ends_with("request_duration_seconds_bucket"))
                .map(|x| x.name.trim_end_matches("_bucket").to_string());
        if let Some(name) = name {
            for (le, n) in s.buckets(&name, &[]) {
                all.entry(le.to_bits()).or_insert((le, 0.0)).1 += n;
            }
        }
    }
    let mut v: Vec<(f64, f64)> = all.into_values().collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

/// The API server's own latency for Node writes (every writer: the agents'
/// patches beside the controllers'; the kubelets' status patches) and the
/// kubelets' Lease renewals, which no webhook sees: what any write on this
/// machine costs at that moment. Returns PATCH nodes' p50 and p99 (ms).
pub(super) fn write_latency(
    r: &mut Report,
    prefix: &str,
    before: &Scrape,
    after: &Scrape,
) -> (f64, f64) {
    let mut patch_nodes = (f64::NAN, f64::NAN);
    for (what, verb, resource, sub) in [
        ("patch_nodes", "PATCH", "nodes", ""),
        ("patch_nodes_status", "PATCH", "nodes", "status"),
        ("put_leases", "PUT", "leases", ""),
    ] {
        let want = [("verb", verb), ("resource", resource), ("subresource", sub)];
        let d = bucket_delta(
            &before.buckets("apiserver_request_duration_seconds", &want),
            &after.buckets("apiserver_request_duration_seconds", &want),
        );
        let (p50, p99) = (quantile(&d, 0.5) * 1000.0, quantile(&d, 0.99) * 1000.0);
        if what == "patch_nodes" {
            patch_nodes = (p50, p99);
        }
        r.figure(
            &format!("{prefix}_apiserver_{what}_p50_ms"),
            format!("{p50:.0}"),
        );
        r.figure(
            &format!("{prefix}_apiserver_{what}_p99_ms"),
            format!("{p99:.0}"),
        );
    }
    patch_nodes
}

pub(super) fn webhook_latency(
    r: &mut Report,
    prefix: &str,
    before: &Scrape,
    after: &Scrape,
    wh_before: &[(f64, f64)],
    wh_after: &[(f64, f64)],
    ops: &[&str],
) {
    for op in ops {
        let want = [("name", "nodes.nodegate.dev"), ("operation", *op)];
        let d = bucket_delta(
            &before.buckets(
                "apiserver_admission_webhook_admission_duration_seconds",
                &want,
            ),
            &after.buckets(
                "apiserver_admission_webhook_admission_duration_seconds",
                &want,
            ),
        );
        let calls = d.last().map(|x| x.1).unwrap_or(0.0);
        r.figure(&format!("{prefix}_webhook_calls_{op}"), calls);
        r.figure(
            &format!("{prefix}_webhook_apiserver_p50_ms_{op}"),
            format!("{:.1}", quantile(&d, 0.5) * 1000.0),
        );
        r.figure(
            &format!("{prefix}_webhook_apiserver_p99_ms_{op}"),
            format!("{:.1}", quantile(&d, 0.99) * 1000.0),
        );
    }
    let d = bucket_delta(wh_before, wh_after);
    r.figure(
        &format!("{prefix}_webhook_own_p50_ms"),
        format!("{:.2}", quantile(&d, 0.5) * 1000.0),
    );
    r.figure(
        &format!("{prefix}_webhook_own_p99_ms"),
        format!("{:.2}", quantile(&d, 0.99) * 1000.0),
    );
}
