//! The MutatingWebhookConfiguration: present, rules that reach Node creates,
//! updates and status writes, a caBundle, a dry-run-safe `sideEffects`, and
//! matchConditions that evaluate on a Node CREATE the way the API server
//! binds them (absent `omitempty` fields are errors, not `''`).

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
};
use kube::{Api, Client};
use nodegate_shared::match_conditions::{RequestAttributes, Verdict, match_all, request_variable};
use serde_json::{Value, json};

use crate::{Args, Report, Status};

/// What later checks need from the webhook entry.
#[derive(Debug, Clone)]
pub struct Hook {
    /// The first line's entry name (`--webhook`).
    pub name: String,
    /// Every entry of the configuration, in the order the API server calls
    /// them: the first line and its backups ([`crate::lines`]).
    pub entries: Vec<MutatingWebhook>,
    /// As configured; the API server's default is Fail.
    pub failure_policy: String,
    /// `(namespace, name, port)` of a `service` clientConfig.
    pub service: Option<(String, String, i32)>,
    pub ca_bundle: Vec<u8>,
    /// Conditions that error on a Node CREATE (`name: error`).
    pub create_condition_errors: Vec<String>,
}

/// Does any rule send `operation` on `nodes[/sub]` to the webhook?
/// Follows `k8s.io/apiserver/pkg/admission/plugin/webhook/predicates/rules`
/// `Matcher` (`*`, `*/*`, `nodes/*`, `*/status`).
pub fn covers(rules: &[RuleWithOperations], operation: &str, sub: &str) -> bool {
    let has = |l: &Option<Vec<String>>, v: &str| {
        l.as_ref()
            .is_some_and(|l| l.iter().any(|x| x == "*" || x == v))
    };
    rules.iter().any(|r| {
        has(&r.operations, operation)
            && has(&r.api_groups, "")
            && has(&r.api_versions, "v1")
            && r.resources
                .as_deref()
                .unwrap_or_default()
                .iter()
                .any(|res| {
                    let (res, rsub) = res.split_once('/').unwrap_or((res.as_str(), ""));
                    let res_ok = res == "*" || res == "nodes";
                    let sub_ok = if sub.is_empty() {
                        rsub.is_empty()
                    } else {
                        rsub == "*" || rsub == sub
                    };
                    res_ok && sub_ok
                })
            && !matches!(r.scope.as_deref(), Some("Namespaced"))
    })
}

pub fn node(name: &str, boot: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
           "status": {"nodeInfo": {"bootID": boot}}})
}

/// The conditions' verdict for one request shape, sent by the node's kubelet.
fn evaluate(hook: &MutatingWebhook, op: &str, sub: &str, obj: &Value, old: &Value) -> Verdict {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let user = format!("{}{name}", nodegate_shared::keys::NODE_USER_PREFIX);
    evaluate_as(&conditions(hook), op, sub, &user, obj, old)
}

/// A webhook entry's matchConditions as (name, expression) pairs.
pub fn conditions(hook: &MutatingWebhook) -> Vec<(&str, &str)> {
    hook.match_conditions
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|c| (c.name.as_str(), c.expression.as_str()))
        .collect()
}

/// `matchConditions` (name, expression) for one request shape sent by `user`,
/// with `request` bound as the API server binds it.
pub fn evaluate_as(
    conditions: &[(&str, &str)],
    op: &str,
    sub: &str,
    user: &str,
    obj: &Value,
    old: &Value,
) -> Verdict {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let groups: Vec<String> = if user.starts_with(nodegate_shared::keys::NODE_USER_PREFIX) {
        vec!["system:nodes".into(), "system:authenticated".into()]
    } else {
        vec!["system:authenticated".into()]
    };
    let options = if op == "CREATE" {
        "CreateOptions"
    } else {
        "UpdateOptions"
    };
    let request = request_variable(&RequestAttributes {
        group: "",
        version: "v1",
        kind: "Node",
        resource: "nodes",
        subresource: sub,
        name,
        namespace: "",
        operation: op,
        username: user,
        groups: &groups,
        extra: &Default::default(),
        dry_run: false,
        options: json!({"kind": options, "apiVersion": "meta.k8s.io/v1"}),
    });
    match_all(conditions.iter().copied(), obj, old, &request).0
}

/// `policy_mode`: a MutatingAdmissionPolicy admits Node CREATE and UPDATE
/// (the admission-policy overlay), so the webhook needs only `nodes/status`
/// and Node CREATE (to see a kubelet re-registering after a reboot; the
/// policy already tainted the create, so its answer adds nothing).
pub async fn check(
    client: &Client,
    args: &Args,
    policy_mode: bool,
    report: &mut Report,
) -> Option<Hook> {
    const CHECK: &str = "webhook configuration";
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let cfg = match api.get_opt(&args.webhook_config).await {
        Ok(Some(c)) => c,
        Ok(None) => {
            report.add(
                CHECK,
                Status::Fail,
                format!(
                    "MutatingWebhookConfiguration {} not found: apply it with its caBundle (README, install step 3)",
                    args.webhook_config
                ),
            );
            return None;
        }
        Err(e) => {
            report.add(
                CHECK,
                Status::Fail,
                format!(
                    "cannot read MutatingWebhookConfiguration {}: {e}",
                    args.webhook_config
                ),
            );
            return None;
        }
    };
    let hooks = cfg.webhooks.unwrap_or_default();
    let Some(hook) = hooks.iter().find(|h| h.name == args.webhook) else {
        let names: Vec<&str> = hooks.iter().map(|h| h.name.as_str()).collect();
        report.add(
            CHECK,
            Status::Fail,
            format!(
                "no webhook {} in {} (it has {names:?})",
                args.webhook, args.webhook_config
            ),
        );
        return None;
    };
    let rules = hook.rules.as_deref().unwrap_or_default();
    let mut problems = Vec::new();
    for (op, sub, what) in [
        (
            "CREATE",
            "",
            "Node CREATE (rule 1, and the re-taint when a kubelet re-registers after a reboot)",
        ),
        ("UPDATE", "", "Node UPDATE (rule 2)"),
        ("UPDATE", "status", "nodes/status UPDATE (rule 3)"),
    ] {
        if policy_mode && op == "UPDATE" && sub.is_empty() {
            continue;
        }
        if !covers(rules, op, sub) {
            problems.push(format!("no rule sends {what}"));
        }
    }
    let ca_bundle = hook
        .client_config
        .ca_bundle
        .as_ref()
        .map(|b| b.0.clone())
        .unwrap_or_default();
    if ca_bundle.is_empty() {
        problems.push(
            "caBundle is empty: fill it in (nodegate-certs --webhook-config, or cert-manager)"
                .into(),
        );
    }
    if !matches!(hook.side_effects.as_str(), "None" | "NoneOnDryRun") {
        problems.push(format!(
            "sideEffects {} makes every dry-run request fail with 400",
            hook.side_effects
        ));
    }
    let failure_policy = hook.failure_policy.clone().unwrap_or_else(|| "Fail".into());
    let service = hook
        .client_config
        .service
        .as_ref()
        .map(|s| (s.namespace.clone(), s.name.clone(), s.port.unwrap_or(443)));
    if problems.is_empty() {
        let target = match &service {
            Some((ns, n, p)) => format!("service {ns}/{n}:{p}"),
            None => hook.client_config.url.clone().unwrap_or_default(),
        };
        report.add(
            CHECK,
            Status::Pass,
            format!(
                "{}/{}: rules reach {}; caBundle set; sideEffects {}; {target}",
                args.webhook_config,
                hook.name,
                if policy_mode {
                    "Node CREATE (re-registrations) and nodes/status UPDATE (the admission policy admits Node CREATE/UPDATE)"
                } else {
                    "Node CREATE/UPDATE and nodes/status UPDATE"
                },
                hook.side_effects
            ),
        );
    } else {
        report.add(CHECK, Status::Fail, problems.join("; "));
    }
    if failure_policy == "Ignore" {
        report.add(
            "failure policy",
            Status::Pass,
            "Ignore: an outage never blocks node registration (the agent's safety net taints, and its NodegateWebhookMissed Event tells)",
        );
    } else {
        report.add(
            "failure policy",
            Status::Warn,
            format!("{failure_policy}: while the webhook is down every Node create fails, and a kubelet retries forever without reporting status"),
        );
    }

    // matchConditions, evaluated as the API server binds them.
    let fresh = node("nodegate-check-node", "boot-1");
    let mut ready = fresh.clone();
    ready["metadata"]["annotations"] =
        json!({nodegate_shared::keys::READY_BOOT_ID_ANNOTATION: "boot-1"});
    let rebooted = {
        let mut n = ready.clone();
        n["status"]["nodeInfo"]["bootID"] = json!("boot-2");
        n
    };
    let mut create_condition_errors = Vec::new();
    let mut bad = Vec::new();
    let mut costly = Vec::new();
    for (what, op, sub, obj, old, want_call) in [
        ("a Node CREATE", "CREATE", "", &fresh, &Value::Null, true),
        (
            "a Node UPDATE after a reboot",
            "UPDATE",
            "",
            &rebooted,
            &rebooted,
            true,
        ),
        (
            "a reboot's status write",
            "UPDATE",
            "status",
            &rebooted,
            &ready,
            true,
        ),
        ("a heartbeat", "UPDATE", "status", &ready, &ready, false),
        (
            "an update of a ready node",
            "UPDATE",
            "",
            &ready,
            &ready,
            false,
        ),
    ] {
        // Only the request shapes the rules send to this webhook.
        if !covers(rules, op, sub) {
            continue;
        }
        // The node itself writes its status; an update of the main resource
        // that rule 2 acts on comes from anyone else (a controller here).
        let verdict = if sub.is_empty() && op == "UPDATE" {
            evaluate_as(
                &conditions(hook),
                op,
                sub,
                "system:serviceaccount:kube-system:node-controller",
                obj,
                old,
            )
        } else {
            evaluate(hook, op, sub, obj, old)
        };
        match verdict {
            Verdict::Call if want_call => {}
            // Heartbeats are most Node writes: one call per node every
            // status write.
            Verdict::Call if sub == "status" => bad.push(format!(
                "{what} reaches the webhook (heartbeats cost one call per node every status write)"
            )),
            // Correct but costly: the agent's ready patch and every
            // controller's taint or annotation write wait on a call.
            Verdict::Call => costly.push(format!(
                "{what} reaches the webhook, where no rule acts on it (the agent's ready patch and every controller's Node write wait on a call): regenerate the configuration with `nodegate-webhook webhook-config`"
            )),
            Verdict::Excluded(c) if want_call => bad.push(format!(
                "condition {c} is false on {what}: the webhook is never called for it"
            )),
            Verdict::Excluded(_) => {}
            Verdict::Errors(errs) => {
                if op == "CREATE" {
                    create_condition_errors.extend(errs.iter().cloned());
                }
                bad.push(format!(
                    "{} on {what} — guard optional request fields with has(): the API server leaves empty omitempty fields absent",
                    errs.join("; ")
                ));
            }
        }
    }
    let n = hook.match_conditions.as_ref().map_or(0, Vec::len);
    if !bad.is_empty() {
        report.add("match conditions", Status::Fail, bad.join("; "));
    } else if !costly.is_empty() {
        report.add("match conditions", Status::Warn, costly.join("; "));
    } else {
        report.add(
            "match conditions",
            Status::Pass,
            format!(
                "{n} condition(s): call on {}a reboot's status write; skip a heartbeat{}",
                if policy_mode {
                    "a Node CREATE and "
                } else {
                    "a Node CREATE, a Node UPDATE after a reboot and "
                },
                if policy_mode {
                    ""
                } else {
                    " and an update of a ready node"
                }
            ),
        );
    }
    Some(Hook {
        name: hook.name.clone(),
        entries: hooks.clone(),
        failure_policy,
        service,
        ca_bundle,
        create_condition_errors,
    })
}

/// The API server's own counters for every line (`names`; this API server
/// only; needs `get` on the non-resource URL `/metrics`): match-condition
/// errors and fail-open calls are the silent failures, so any count is worth
/// a warning.
pub async fn check_apiserver_metrics(client: &Client, names: &[String], report: &mut Report) {
    const CHECK: &str = "api server counters";
    let req = match http::Request::get("/metrics").body(Vec::new()) {
        Ok(r) => r,
        Err(e) => {
            report.add(CHECK, Status::Skip, e.to_string());
            return;
        }
    };
    let text = match client.request_text(req).await {
        Ok(t) => t,
        Err(e) => {
            report.add(
                CHECK,
                Status::Skip,
                format!("cannot read the API server's /metrics: {e}"),
            );
            return;
        }
    };
    let sum = |metric: &str, name: &str| -> u64 {
        let label = format!("name=\"{name}\"");
        text.lines()
            .filter(|l| {
                l.starts_with(metric) && l[metric.len()..].starts_with('{') && l.contains(&label)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
            // Counters: whole and non-negative (an empty f64 sum is -0).
            .max(0.0) as u64
    };
    let mut counted = Vec::new();
    for name in names {
        let errors = sum(
            "apiserver_admission_match_condition_evaluation_errors_total",
            name,
        );
        let fail_open = sum("apiserver_admission_webhook_fail_open_count", name);
        if errors != 0 || fail_open != 0 {
            counted.push(format!(
                "{errors} match-condition evaluation errors and {fail_open} fail-open calls for {name}"
            ));
        }
    }
    let all = names.join(", ");
    if counted.is_empty() {
        report.add(
            CHECK,
            Status::Pass,
            format!("no match-condition errors and no fail-open calls counted for {all}"),
        );
    } else {
        report.add(
            CHECK,
            Status::Warn,
            format!(
                "since this API server started it counted {} (each one skipped that line for a Node write; the write went through ungated when it skipped every line it reached)",
                counted.join("; ")
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(ops: &[&str], res: &[&str]) -> RuleWithOperations {
        RuleWithOperations {
            api_groups: Some(vec![String::new()]),
            api_versions: Some(vec!["v1".into()]),
            operations: Some(ops.iter().map(|s| s.to_string()).collect()),
            resources: Some(res.iter().map(|s| s.to_string()).collect()),
            scope: Some("Cluster".into()),
        }
    }

    #[test]
    fn rule_coverage_follows_the_matcher() {
        let shipped = [
            rule(&["CREATE", "UPDATE"], &["nodes"]),
            rule(&["UPDATE"], &["nodes/status"]),
        ];
        assert!(covers(&shipped, "CREATE", ""));
        assert!(covers(&shipped, "UPDATE", "status"));
        assert!(
            !covers(&[rule(&["UPDATE"], &["nodes"])], "UPDATE", "status"),
            "nodes ≠ nodes/status"
        );
        assert!(covers(&[rule(&["*"], &["nodes/*"])], "UPDATE", "status"));
        assert!(!covers(&[rule(&["*"], &["nodes/*"])], "CREATE", ""));
        assert!(covers(&[rule(&["CREATE"], &["*"])], "CREATE", ""));
        assert!(!covers(&[rule(&["UPDATE"], &["nodes"])], "CREATE", ""));
    }
}
