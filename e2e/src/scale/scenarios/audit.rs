//! nodegate's requests as the API server's audit log records them (the
//! scale harness's policy logs nodegate's ServiceAccounts only).

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::jiff::Timestamp;

/// nodegate's requests in `[from, to)` from the audit log, by
/// (ServiceAccount, verb, resource[/subresource]).
pub(super) fn audit_counts(
    path: &Path,
    from: Timestamp,
    to: Timestamp,
) -> BTreeMap<(String, String, String), usize> {
    let mut out = BTreeMap::new();
    let Ok(text) = std::fs::read_to_string(path) else {
        return out;
    };
    for line in text.lines() {
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(at) = ev["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<Timestamp>().ok())
        else {
            continue;
        };
        if at < from || at >= to {
            continue;
        }
        // A watch is counted when it starts (it completes minutes later);
        // every other request once, when it completes.
        let watch = ev["verb"].as_str() == Some("watch");
        let stage = ev["stage"].as_str().unwrap_or("");
        if stage
            != if watch {
                "ResponseStarted"
            } else {
                "ResponseComplete"
            }
        {
            continue;
        }
        let user = ev["user"]["username"]
            .as_str()
            .unwrap_or("")
            .trim_start_matches("system:serviceaccount:nodegate:")
            .to_string();
        let mut res = ev["objectRef"]["resource"]
            .as_str()
            .unwrap_or("-")
            .to_string();
        if let Some(sub) = ev["objectRef"]["subresource"].as_str() {
            res = format!("{res}/{sub}");
        }
        let verb = ev["verb"].as_str().unwrap_or("-").to_string();
        *out.entry((user, verb, res)).or_default() += 1;
    }
    out
}

pub(super) fn agent_watches(audit: &BTreeMap<(String, String, String), usize>) -> f64 {
    audit
        .iter()
        .filter(|((u, v, _), _)| u == "nodegate-agent" && v == "watch")
        .map(|(_, c)| *c as f64)
        .sum()
}

/// Watch restarts per agent per minute once settled: two watches per
/// agent (its Node, the roster), each restarting every `timeoutSeconds`,
/// averaged over the agents' watch starts in the audit log.
pub(super) fn agent_watch_rate(path: &Path) -> f64 {
    let Ok(text) = std::fs::read_to_string(path) else {
        return f64::NAN;
    };
    let mut per_min = Vec::new();
    for line in text.lines() {
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if ev["verb"].as_str() != Some("watch")
            || ev["stage"].as_str() != Some("ResponseStarted")
            || ev["user"]["username"].as_str()
                != Some("system:serviceaccount:nodegate:nodegate-agent")
        {
            continue;
        }
        let uri = ev["requestURI"].as_str().unwrap_or("");
        let t = uri
            .split(['?', '&'])
            .find_map(|kv| kv.strip_prefix("timeoutSeconds="))
            .and_then(|v| v.parse::<f64>().ok());
        if let Some(t) = t.filter(|t| *t > 0.0) {
            per_min.push(60.0 / t);
        }
    }
    if per_min.is_empty() {
        return f64::NAN;
    }
    2.0 * per_min.iter().sum::<f64>() / per_min.len() as f64
}
