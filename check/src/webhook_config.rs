//! The MutatingWebhookConfiguration: present, rules that reach Node creates,
//! updates and status writes, a caBundle, a dry-run-safe `sideEffects`, and
//! matchConditions that evaluate on a Node CREATE the way the API server
//! binds them ([`crate::matching`]).
//!
//! [`read`] gets the configuration; [`verdict`] judges it into three lines
//! (`webhook configuration`, `failure policy`, `match conditions`) and the
//! [`Hook`] the later checks read.

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use kube::{Api, Client};
use nodegate_shared::match_conditions::Verdict;
use nodegate_webhook::rules::Rule;
use serde_json::{Value, json};

use crate::matching::{conditions, covers, evaluate, evaluate_as, node};
use crate::read::Read;
use crate::report::{Line, Report, Status};

pub const CHECK: &str = "webhook configuration";
const FAILURE_POLICY: &str = "failure policy";
const MATCH_CONDITIONS: &str = "match conditions";

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

/// What the check looks for.
#[derive(Debug, Clone, Copy)]
pub struct Wanted<'a> {
    /// The MutatingWebhookConfiguration (`--webhook-config`).
    pub config: &'a str,
    /// Its first line's entry (`--webhook`).
    pub webhook: &'a str,
    /// A MutatingAdmissionPolicy admits Node CREATE and UPDATE (the
    /// admission-policy overlay), so the webhook needs only `nodes/status`
    /// and Node CREATE (to see a kubelet re-registering after a reboot; the
    /// policy already tainted the create, so its answer adds nothing).
    pub policy_mode: bool,
}

/// The `webhook configuration` line: rules, caBundle and sideEffects of
/// the first line's entry.
fn shape(wanted: &Wanted, hook: &MutatingWebhook, service: Option<&(String, String, i32)>) -> Line {
    let rules = hook.rules.as_deref().unwrap_or_default();
    let mut problems = Vec::new();
    for (op, sub, what, rule) in [
        (
            "CREATE",
            "",
            "Node CREATE",
            (
                Rule::NodeCreate,
                ", and the re-taint when a kubelet re-registers after a reboot",
            ),
        ),
        ("UPDATE", "", "Node UPDATE", (Rule::UpdateAfterReboot, "")),
        (
            "UPDATE",
            "status",
            "nodes/status UPDATE",
            (Rule::StatusShowsReboot, ""),
        ),
    ] {
        if wanted.policy_mode && op == "UPDATE" && sub.is_empty() {
            continue;
        }
        if !covers(rules, op, sub) {
            let (rule, more) = rule;
            problems.push(format!(
                "no rule sends {what} (rule {}{more})",
                rule.number()
            ));
        }
    }
    if ca_bundle(hook).is_empty() {
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
    if !problems.is_empty() {
        return Line::new(CHECK, Status::Fail, problems.join("; "));
    }
    let target = match service {
        Some((ns, n, p)) => format!("service {ns}/{n}:{p}"),
        None => hook.client_config.url.clone().unwrap_or_default(),
    };
    Line::new(
        CHECK,
        Status::Pass,
        format!(
            "{}/{}: rules reach {}; caBundle set; sideEffects {}; {target}",
            wanted.config,
            hook.name,
            if wanted.policy_mode {
                "Node CREATE (re-registrations) and nodes/status UPDATE (the admission policy admits Node CREATE/UPDATE)"
            } else {
                "Node CREATE/UPDATE and nodes/status UPDATE"
            },
            hook.side_effects
        ),
    )
}

/// The `failure policy` line for the entry's policy as configured.
fn failure_policy(policy: &str) -> Line {
    if policy == "Ignore" {
        Line::new(
            FAILURE_POLICY,
            Status::Pass,
            "Ignore: an outage never blocks node registration (the agent's safety net taints, and its NodegateWebhookMissed Event tells)",
        )
    } else {
        Line::new(
            FAILURE_POLICY,
            Status::Warn,
            format!(
                "{policy}: while the webhook is down every Node create fails, and a kubelet retries forever without reporting status"
            ),
        )
    }
}

/// The request shapes the first line is judged on: (what, operation,
/// subresource, object, old object, whether it must be called).
fn request_shapes() -> Vec<(&'static str, &'static str, &'static str, Value, Value, bool)> {
    let fresh = node("nodegate-check-node", "boot-1");
    let mut ready = fresh.clone();
    ready["metadata"]["annotations"] =
        json!({nodegate_shared::keys::READY_BOOT_ID_ANNOTATION: "boot-1"});
    let mut rebooted = ready.clone();
    rebooted["status"]["nodeInfo"]["bootID"] = json!("boot-2");
    vec![
        ("a Node CREATE", "CREATE", "", fresh, Value::Null, true),
        (
            "a Node UPDATE after a reboot",
            "UPDATE",
            "",
            rebooted.clone(),
            rebooted.clone(),
            true,
        ),
        (
            "a reboot's status write",
            "UPDATE",
            "status",
            rebooted,
            ready.clone(),
            true,
        ),
        (
            "a heartbeat",
            "UPDATE",
            "status",
            ready.clone(),
            ready.clone(),
            false,
        ),
        (
            "an update of a ready node",
            "UPDATE",
            "",
            ready.clone(),
            ready,
            false,
        ),
    ]
}

/// The `match conditions` line, and the conditions that error on a Node
/// CREATE (for the canary's diagnosis).
fn match_conditions(hook: &MutatingWebhook, policy_mode: bool) -> (Line, Vec<String>) {
    let rules = hook.rules.as_deref().unwrap_or_default();
    let mut create_condition_errors = Vec::new();
    let mut bad = Vec::new();
    let mut costly = Vec::new();
    for (what, op, sub, obj, old, want_call) in request_shapes() {
        // Only the request shapes the rules send to this webhook.
        if !covers(rules, op, sub) {
            continue;
        }
        // The node itself writes its status; an update of the main resource
        // that `Rule::UpdateAfterReboot` acts on comes from anyone else (a controller here).
        let verdict = if sub.is_empty() && op == "UPDATE" {
            evaluate_as(
                &conditions(hook),
                op,
                sub,
                "system:serviceaccount:kube-system:node-controller",
                &obj,
                &old,
            )
        } else {
            evaluate(hook, op, sub, &obj, &old)
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
    let line = if !bad.is_empty() {
        Line::new(MATCH_CONDITIONS, Status::Fail, bad.join("; "))
    } else if !costly.is_empty() {
        Line::new(MATCH_CONDITIONS, Status::Warn, costly.join("; "))
    } else {
        Line::new(
            MATCH_CONDITIONS,
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
        )
    };
    (line, create_condition_errors)
}

fn ca_bundle(hook: &MutatingWebhook) -> Vec<u8> {
    hook.client_config
        .ca_bundle
        .as_ref()
        .map(|b| b.0.clone())
        .unwrap_or_default()
}

/// The lines, and the [`Hook`] when the first line's entry was found (then
/// all three lines; else only `webhook configuration`, failed).
pub fn verdict(
    wanted: &Wanted,
    read: &Read<MutatingWebhookConfiguration>,
) -> (Vec<Line>, Option<Hook>) {
    let fail = |detail: String| (vec![Line::new(CHECK, Status::Fail, detail)], None);
    let cfg = match read {
        Read::Found(c) => c,
        Read::Missing => {
            return fail(format!(
                "MutatingWebhookConfiguration {} not found: apply it with its caBundle (README, install step 3)",
                wanted.config
            ));
        }
        Read::Unreadable(e) => {
            return fail(format!(
                "cannot read MutatingWebhookConfiguration {}: {e}",
                wanted.config
            ));
        }
    };
    let hooks = cfg.webhooks.clone().unwrap_or_default();
    let Some(hook) = hooks.iter().find(|h| h.name == wanted.webhook) else {
        let names: Vec<&str> = hooks.iter().map(|h| h.name.as_str()).collect();
        return fail(format!(
            "no webhook {} in {} (it has {names:?})",
            wanted.webhook, wanted.config
        ));
    };
    let service = hook
        .client_config
        .service
        .as_ref()
        .map(|s| (s.namespace.clone(), s.name.clone(), s.port.unwrap_or(443)));
    let policy = hook.failure_policy.clone().unwrap_or_else(|| "Fail".into());
    let (conditions, create_condition_errors) = match_conditions(hook, wanted.policy_mode);
    let lines = vec![
        shape(wanted, hook, service.as_ref()),
        failure_policy(&policy),
        conditions,
    ];
    let found = Hook {
        name: hook.name.clone(),
        ca_bundle: ca_bundle(hook),
        entries: hooks.clone(),
        failure_policy: policy,
        service,
        create_condition_errors,
    };
    (lines, Some(found))
}

pub async fn read(client: &Client, name: &str) -> Read<MutatingWebhookConfiguration> {
    Read::of(Api::all(client.clone()).get_opt(name).await)
}

/// Reads the configuration and reports [`verdict`].
pub async fn check(client: &Client, wanted: &Wanted<'_>, report: &mut Report) -> Option<Hook> {
    let (lines, hook) = verdict(wanted, &read(client, wanted.config).await);
    report.extend(lines);
    hook
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegate_shared::keys::DEFAULT_TAINT;

    /// The generator's configuration for nodegate's default taint, with a
    /// caBundle.
    fn generated() -> MutatingWebhookConfiguration {
        let specs = [DEFAULT_TAINT.parse().unwrap()];
        let yaml = nodegate_webhook::webhook_config::render(&specs, &[], 2);
        let mut cfg: MutatingWebhookConfiguration = serde_yaml::from_str(&yaml).unwrap();
        for w in cfg.webhooks.iter_mut().flatten() {
            w.client_config.ca_bundle = Some(k8s_openapi::ByteString(b"CA".to_vec()));
        }
        cfg
    }

    /// The generated configuration with its first entry changed by `edit`.
    fn first(edit: impl FnOnce(&mut MutatingWebhook)) -> Read<MutatingWebhookConfiguration> {
        let mut cfg = generated();
        if let Some(w) = cfg.webhooks.as_mut().and_then(|w| w.first_mut()) {
            edit(w);
        }
        Read::Found(cfg)
    }

    const WEBHOOK: Wanted = Wanted {
        config: "nodegate",
        webhook: "nodes.nodegate.dev",
        policy_mode: false,
    };

    /// The lines `verdict` gives for `read`: (status, part of the detail)
    /// for each, in order (`webhook configuration`, then `failure policy`
    /// and `match conditions` when the entry was found). A detail ends in
    /// `\n` here, so a part can say where it ends.
    fn assert_lines(
        name: &str,
        policy_mode: bool,
        read: Read<MutatingWebhookConfiguration>,
        want: &[(Status, &str)],
    ) {
        let wanted = Wanted {
            policy_mode,
            ..WEBHOOK
        };
        let (lines, hook) = verdict(&wanted, &read);
        assert_eq!(lines.len(), want.len(), "{name}: {lines:?}");
        assert_eq!(hook.is_some(), want.len() == 3, "{name}");
        let checks = [CHECK, FAILURE_POLICY, MATCH_CONDITIONS];
        for ((got, check), (status, part)) in lines.iter().zip(checks).zip(want) {
            let detail = format!("{}\n", got.detail);
            assert_eq!(
                (got.check.as_str(), got.status),
                (check, *status),
                "{name}: {detail}"
            );
            assert!(detail.contains(part), "{name}: {detail:?} lacks {part:?}");
        }
    }

    /// (status, part of the detail) of each line, in order.
    type Lines = Vec<(Status, &'static str)>;

    const SHAPE_PASSES: (Status, &str) = (
        Status::Pass,
        "nodegate/nodes.nodegate.dev: rules reach Node CREATE/UPDATE and nodes/status UPDATE; caBundle set; sideEffects NoneOnDryRun; service nodegate/nodegate-webhook:443\n",
    );
    const IGNORE: (Status, &str) = (
        Status::Pass,
        "Ignore: an outage never blocks node registration (the agent's safety net taints, and its NodegateWebhookMissed Event tells)",
    );
    const CONDITIONS_PASS: (Status, &str) = (
        Status::Pass,
        "2 condition(s): call on a Node CREATE, a Node UPDATE after a reboot and a reboot's status write; skip a heartbeat and an update of a ready node\n",
    );

    /// The configuration, its entry, its rules, caBundle, sideEffects and
    /// failurePolicy.
    #[test]
    fn configuration_verdicts() {
        let fail = |part| vec![(Status::Fail, part)];
        let rows: Vec<(&str, Read<MutatingWebhookConfiguration>, Lines)> = vec![
            (
                "the generated configuration",
                Read::Found(generated()),
                vec![SHAPE_PASSES, IGNORE, CONDITIONS_PASS],
            ),
            (
                "missing",
                Read::Missing,
                fail(
                    "MutatingWebhookConfiguration nodegate not found: apply it with its caBundle (README, install step 3)\n",
                ),
            ),
            (
                "unreadable",
                Read::Unreadable("403".into()),
                fail("cannot read MutatingWebhookConfiguration nodegate: 403\n"),
            ),
            (
                "no such entry",
                first(|w| w.name = "other".into()),
                fail(
                    "no webhook nodes.nodegate.dev in nodegate (it has [\"other\", \"replica-0.nodes.nodegate.dev\", \"replica-1.nodes.nodegate.dev\"])\n",
                ),
            ),
            (
                "no rule for nodes/status, empty caBundle, sideEffects Some",
                first(|w| {
                    let status = Some(vec!["nodes/status".to_string()]);
                    w.rules.as_mut().unwrap().retain(|r| r.resources != status);
                    w.client_config.ca_bundle = None;
                    w.side_effects = "Some".into();
                }),
                vec![
                    (
                        Status::Fail,
                        "no rule sends nodes/status UPDATE (rule 3); caBundle is empty: fill it in (nodegate-certs --webhook-config, or cert-manager); sideEffects Some makes every dry-run request fail with 400\n",
                    ),
                    IGNORE,
                    (Status::Pass, "2 condition(s): call on"),
                ],
            ),
            (
                "no rule for Node CREATE or UPDATE",
                first(|w| w.rules.as_mut().unwrap()[0].operations = Some(vec!["DELETE".into()])),
                vec![
                    (
                        Status::Fail,
                        "no rule sends Node CREATE (rule 1, and the re-taint when a kubelet re-registers after a reboot); no rule sends Node UPDATE (rule 2)\n",
                    ),
                    IGNORE,
                    (Status::Pass, "condition(s)"),
                ],
            ),
            (
                "failurePolicy unset: the API server's Fail",
                first(|w| w.failure_policy = None),
                vec![
                    SHAPE_PASSES,
                    (
                        Status::Warn,
                        "Fail: while the webhook is down every Node create fails, and a kubelet retries forever without reporting status\n",
                    ),
                    CONDITIONS_PASS,
                ],
            ),
        ];
        for (name, read, want) in rows {
            assert_lines(name, false, read, &want);
        }
    }

    /// The matchConditions on each request shape the rules send, with and
    /// without the admission policy.
    #[test]
    fn condition_verdicts() {
        let conditions = |part| vec![SHAPE_PASSES, IGNORE, part];
        let rows: Vec<(&str, bool, Read<MutatingWebhookConfiguration>, Lines)> = vec![
            (
                "an unguarded condition errors on a Node CREATE",
                false,
                first(|w| {
                    w.match_conditions.as_mut().unwrap()[0].expression =
                        "request.subResource != 'status'".into();
                }),
                conditions((
                    Status::Fail,
                    " on a Node CREATE — guard optional request fields with has(): the API server leaves empty omitempty fields absent",
                )),
            ),
            (
                "a condition false on a Node CREATE",
                false,
                first(|w| w.match_conditions.as_mut().unwrap()[0].expression = "false".into()),
                conditions((
                    Status::Fail,
                    "is false on a Node CREATE: the webhook is never called for it",
                )),
            ),
            (
                "every write called: heartbeats too",
                false,
                first(|w| w.match_conditions = None),
                conditions((
                    Status::Fail,
                    "a heartbeat reaches the webhook (heartbeats cost one call per node every status write)\n",
                )),
            ),
            (
                "an update of a ready node called: costly",
                false,
                first(|w| {
                    let c = w.match_conditions.as_mut().unwrap();
                    c.retain(|c| c.name != "create-or-update-after-reboot");
                }),
                conditions((
                    Status::Warn,
                    "an update of a ready node reaches the webhook, where no rule acts on it (the agent's ready patch and every controller's Node write wait on a call): regenerate the configuration with `nodegate-webhook webhook-config`\n",
                )),
            ),
            (
                "policy mode: Node UPDATE is the policy's",
                true,
                first(|w| {
                    let nodes = Some(vec!["nodes".to_string()]);
                    for r in w.rules.as_mut().unwrap() {
                        let resources = r.resources.clone();
                        let ops = r.operations.as_mut().unwrap();
                        ops.retain(|o| o != "UPDATE" || resources != nodes);
                    }
                }),
                vec![
                    (
                        Status::Pass,
                        "nodegate/nodes.nodegate.dev: rules reach Node CREATE (re-registrations) and nodes/status UPDATE (the admission policy admits Node CREATE/UPDATE); caBundle set",
                    ),
                    IGNORE,
                    (
                        Status::Pass,
                        "condition(s): call on a Node CREATE and a reboot's status write; skip a heartbeat\n",
                    ),
                ],
            ),
        ];
        for (name, policy_mode, read, want) in rows {
            assert_lines(name, policy_mode, read, &want);
        }
    }

    /// The Hook carries what the later checks read: every entry, the
    /// service, the caBundle and the conditions that error on a CREATE.
    #[test]
    fn the_hook_carries_every_line() {
        let (_, hook) = verdict(&WEBHOOK, &Read::Found(generated()));
        let hook = hook.unwrap();
        assert_eq!(hook.entries.len(), 3);
        assert_eq!(
            hook.service,
            Some(("nodegate".into(), "nodegate-webhook".into(), 443))
        );
        assert_eq!(
            (hook.ca_bundle.as_slice(), hook.failure_policy.as_str()),
            (&b"CA"[..], "Ignore")
        );
        assert!(hook.create_condition_errors.is_empty());
        let unguarded = first(|w| {
            w.match_conditions.as_mut().unwrap()[0].expression =
                "request.subResource != 'status'".into();
        });
        let (_, hook) = verdict(&WEBHOOK, &unguarded);
        assert_eq!(hook.unwrap().create_condition_errors.len(), 1);
    }
}
