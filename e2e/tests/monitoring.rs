//! The monitoring component refers only to metrics that exist: every metric
//! name in the PrometheusRule and the Grafana dashboard is one the webhook,
//! the agent or the roster publisher registers, or one kube-apiserver serves (as the emulator names
//! them after `k8s.io/apiserver/pkg/admission/metrics`), or `up`. And every
//! alert has its runbook section in docs/alerts.md.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use nodegate_emulator::admission::{
    MATCH_CONDITION_ERRORS, MATCH_CONDITION_EXCLUSIONS, WEBHOOK_FAIL_OPEN, WEBHOOK_REQUESTS,
};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Series names a `/metrics` exposition can contain, from its `# TYPE` lines.
fn series_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        let mut parts = line.split_whitespace();
        if (parts.next(), parts.next()) != (Some("#"), Some("TYPE")) {
            continue;
        }
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                names.insert(format!("{}_total", name.trim_end_matches("_total")));
            }
            "histogram" => {
                for suffix in ["_bucket", "_count", "_sum"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

fn exported() -> BTreeSet<String> {
    let mut names = series_names(&nodegate_webhook::metrics::Metrics::new().encode());
    // A labelled family is encoded only once it has a child: make one in each.
    use nodegate_agent::metrics as m;
    let metrics = m::Metrics::default();
    let s = || String::from("x");
    drop(metrics.probe_results.get_or_create(&m::ProbeLabels {
        kind: "x",
        index: 0,
        result: "x",
    }));
    drop(metrics.probe_up.get_or_create(&m::ProbeName {
        kind: "x",
        index: 0,
    }));
    drop(
        metrics
            .time_to_ready
            .get_or_create(&m::OriginLabel { origin: s() }),
    );
    drop(metrics.taint_adds.get_or_create(&m::Reason { reason: s() }));
    drop(metrics.gate_open.get_or_create(&m::GateLabel { gate: s() }));
    drop(
        metrics
            .pruned_nodes
            .get_or_create(&m::Source { source: s() }),
    );
    drop(
        metrics
            .handler_failures
            .get_or_create(&m::HandlerLabels { handler: s() }),
    );
    let mut agent = String::new();
    prometheus_client::encoding::text::encode(&mut agent, &metrics.registry()).unwrap();
    names.extend(series_names(&agent));
    let mut roster = String::new();
    prometheus_client::encoding::text::encode(
        &mut roster,
        &nodegate_roster::metrics::Metrics::default().registry(),
    )
    .unwrap();
    names.extend(series_names(&roster));
    names.extend(
        [
            MATCH_CONDITION_ERRORS,
            MATCH_CONDITION_EXCLUSIONS,
            WEBHOOK_FAIL_OPEN,
            WEBHOOK_REQUESTS,
        ]
        .map(String::from),
    );
    names.insert("up".into());
    names
}

/// Metric names in PromQL: identifiers outside strings, label matchers,
/// ranges and `by (…)`/`without (…)` lists that are neither function calls
/// nor keywords.
fn metric_names(promql: &str) -> BTreeSet<String> {
    // Blank out "strings", {matchers} and [ranges].
    let mut cleaned = String::with_capacity(promql.len());
    let (mut in_string, mut depth) = (false, 0i32);
    for c in promql.chars() {
        match c {
            '"' => in_string = !in_string,
            '{' | '[' if !in_string => depth += 1,
            '}' | ']' if !in_string => depth -= 1,
            _ if !in_string && depth == 0 => {
                cleaned.push(c);
                continue;
            }
            _ => {}
        }
        cleaned.push(' ');
    }
    // Blank out grouping label lists.
    for kw in ["by", "without", "on", "ignoring"] {
        let mut from = 0;
        while let Some(pos) = cleaned[from..].find(&format!("{kw} (")).map(|p| p + from) {
            let open = pos + kw.len() + 1;
            let close = cleaned[open..]
                .find(')')
                .map_or(cleaned.len(), |c| c + open);
            cleaned.replace_range(open..close, &" ".repeat(close - open));
            from = close;
        }
    }
    // Keywords, and aggregations (which may put `by (…)` before their parenthesis).
    const KEYWORDS: [&str; 22] = [
        "by",
        "without",
        "on",
        "ignoring",
        "offset",
        "unless",
        "or",
        "and",
        "bool",
        "group_left",
        "group_right",
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "group",
    ];
    let mut out = BTreeSet::new();
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut rest = cleaned.as_str();
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
        let tail = &rest[start..];
        let end = tail.find(|c: char| !is_ident(c)).unwrap_or(tail.len());
        let word = &tail[..end];
        let after = tail[end..].trim_start();
        // A unit after digits (`offset 15m`) is no name.
        let duration = rest[..start].ends_with(|c: char| c.is_ascii_digit());
        if !after.starts_with('(') && !KEYWORDS.contains(&word) && !duration {
            out.insert(word.to_string());
        }
        rest = &tail[end..];
    }
    out
}

#[test]
fn rules_and_dashboard_use_only_metrics_that_exist() {
    let exported = exported();
    assert!(
        exported.contains("nodegate_agent_taint_adds_total"),
        "{exported:?}"
    );
    assert!(exported.contains("nodegate_webhook_request_duration_seconds_bucket"));

    let rule: serde_yaml::Value =
        serde_yaml::from_str(&read("manifests/components/monitoring/prometheusrule.yaml")).unwrap();
    let mut exprs: Vec<(String, String)> = Vec::new();
    for group in rule["spec"]["groups"].as_sequence().unwrap() {
        for r in group["rules"].as_sequence().unwrap() {
            exprs.push((
                r["alert"].as_str().unwrap().to_string(),
                r["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    let dash: serde_json::Value =
        serde_json::from_str(&read("manifests/components/monitoring/dashboard.json")).unwrap();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            exprs.push((
                format!("panel {}", p["title"]),
                t["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    let mut used = BTreeSet::new();
    for (what, expr) in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{what}: no metric found in {expr}");
        for n in names {
            assert!(
                exported.contains(&n),
                "{what}: {n} is not a metric nodegate or the API server exports"
            );
            used.insert(n);
        }
    }
    // The alarm the real-cluster issue added is on a dashboard and alerted.
    for must in [
        "nodegate_agent_taint_adds_total",
        "nodegate_agent_time_to_ready_seconds_bucket",
        MATCH_CONDITION_ERRORS,
        WEBHOOK_FAIL_OPEN,
        WEBHOOK_REQUESTS,
        // Pruning's alarms: a forged roster, a mass deletion, the roster.
        "nodegate_agent_prune_refused_total",
        "nodegate_agent_prune_holds_total",
        "nodegate_agent_roster_complete",
        "nodegate_roster_leader",
    ] {
        assert!(used.contains(must), "{must} unused");
    }
}

#[test]
fn the_metric_name_parser_finds_metrics_and_nothing_else() {
    let got = metric_names(
        r#"sum by (node, handler) (increase(nodegate_agent_handler_failures_total{job="a_b"}[15m])) > 0 or absent(up{job="x"}) unless x_y offset 15m"#,
    );
    assert_eq!(
        got,
        ["nodegate_agent_handler_failures_total", "up", "x_y"]
            .map(String::from)
            .into()
    );
}

#[test]
fn every_alert_has_a_runbook() {
    let doc = read("docs/alerts.md");
    let rule: serde_yaml::Value =
        serde_yaml::from_str(&read("manifests/components/monitoring/prometheusrule.yaml")).unwrap();
    for group in rule["spec"]["groups"].as_sequence().unwrap() {
        for r in group["rules"].as_sequence().unwrap() {
            let alert = r["alert"].as_str().unwrap();
            let anchor = r["annotations"]["runbook"].as_str().unwrap();
            let section = anchor
                .strip_prefix("docs/alerts.md#")
                .expect("runbook in docs/alerts.md");
            let heading = doc
                .lines()
                .find(|l| l.starts_with("## ") && l[3..].trim().to_lowercase() == section)
                .unwrap_or_else(|| {
                    panic!("{alert}: no section '## …' for #{section} in docs/alerts.md")
                });
            assert!(heading.len() > 3, "{alert}");
        }
    }
}
