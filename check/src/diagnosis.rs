//! `diagnosis`: when the canary came back without its taints, why, from
//! what the other checks found. It reads nothing: lib.rs hands it their
//! findings.

use crate::canary::Outcome;
use crate::lines::answers::Answer;
use crate::report::{Report, Status};
use crate::webhook_config::Hook;

pub const CHECK: &str = "diagnosis";

/// What the other checks found.
#[derive(Debug, Clone, Copy)]
pub struct Findings<'a> {
    /// The admission policy: `None` not installed, `Some(true)` sound,
    /// `Some(false)` installed with a problem.
    pub policy: Option<bool>,
    /// The first line's entry, when the configuration has it.
    pub hook: Option<&'a Hook>,
    /// The caBundle verifies the serving certificate.
    pub cert_ok: bool,
    /// The webhook's Service serves the port the configuration calls.
    pub svc_ok: bool,
    /// Available webhook replicas, when the workload was read.
    pub available: Option<i32>,
    /// How each line answered a direct call.
    pub answers: &'a [Answer],
    /// The webhook flags the expected taints come from
    /// ([`crate::expected::flag_names`]).
    pub flags: &'static str,
}

/// Why the API server's admission left the canary untainted.
fn why(f: &Findings) -> Vec<String> {
    let mut why = Vec::new();
    if f.policy == Some(false) {
        why.push(
            "the admission policy is unbound or its conditions do not apply (see above)".into(),
        );
    } else if f.policy.is_some() {
        why.push(format!(
            "the admission policy applied but did not add it: was it generated with the {} flags checked here?",
            f.flags
        ));
    } else if let Some(h) = f.hook {
        why.extend(h.create_condition_errors.iter().map(|e| {
            format!(
                "matchCondition {e} on a Node CREATE: with failurePolicy {} the API server {}",
                h.failure_policy,
                if h.failure_policy == "Ignore" {
                    "skips the webhook silently"
                } else {
                    "refuses the create"
                }
            )
        }));
    } else {
        why.push("the MutatingWebhookConfiguration is missing or unreadable".into());
    }
    if f.hook.is_some() && !f.cert_ok {
        why.push("the API server cannot verify the webhook's certificate with the caBundle".into());
    }
    if f.hook.is_some() && !f.svc_ok {
        why.push("the webhook's Service is missing or lacks the port".into());
    }
    if f.available == Some(0) {
        why.push("the webhook StatefulSet has no available replica (webhook down)".into());
    }
    let has = |a: Answer| f.answers.contains(&a);
    let reached = has(Answer::Tainted) || has(Answer::Untainted);
    if has(Answer::Unreachable) && !reached {
        why.push("no line's replica answered a direct call (see the line checks)".into());
    } else if has(Answer::Tainted) && f.policy.is_none() && why.is_empty() {
        why.push("the replicas answer a direct call with the taints, but the create through admission came back without them: the rules, match conditions or caBundle keep the API server from calling them".into());
    }
    if why.is_empty() && f.policy.is_none() {
        why.push(format!(
            "the webhook was called but did not add it: does the running webhook have the {} flags checked here (pods not restarted since the StatefulSet changed)?",
            f.flags
        ));
    }
    why
}

/// The `diagnosis` line, for a canary that came back without its taints.
pub fn verdict(f: &Findings) -> (Status, String) {
    (Status::Fail, why(f).join("; "))
}

/// Reports [`verdict`] when the canary came back without its taints (a
/// canary that errored says why itself).
pub fn check(canary: Outcome, f: &Findings, report: &mut Report) {
    if canary == Outcome::Missing {
        let (status, detail) = verdict(f);
        report.add(CHECK, status, detail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(failure_policy: &str, errors: &[&str]) -> Hook {
        Hook {
            name: "nodes.nodegate.dev".into(),
            entries: Vec::new(),
            failure_policy: failure_policy.into(),
            service: None,
            ca_bundle: Vec::new(),
            create_condition_errors: errors.iter().map(ToString::to_string).collect(),
        }
    }

    /// Every reason the line gives for `f`, in order, starts with the
    /// matching part of `want` (and there is no other).
    fn assert_reasons(name: &str, f: &Findings, want: &[&str]) {
        let (status, detail) = verdict(f);
        assert_eq!(status, Status::Fail, "{name}");
        let got: Vec<&str> = detail.split("; ").collect();
        assert_eq!(got.len(), want.len(), "{name}: {detail}");
        for (g, w) in got.iter().zip(want) {
            assert!(g.starts_with(w), "{name}: {g:?} does not start with {w:?}");
        }
    }

    const SOUND: Findings = Findings {
        policy: None,
        hook: None,
        cert_ok: true,
        svc_ok: true,
        available: Some(2),
        answers: &[Answer::Tainted, Answer::Tainted],
        flags: "--taint and --boot-taint",
    };

    /// The webhook install: what the configuration, the Service, the
    /// certificate and the direct calls tell.
    #[test]
    fn webhook_verdicts() {
        let ignore = hook("Ignore", &[]);
        let unguarded = hook("Ignore", &["not-a-heartbeat: no such key"]);
        let failing = hook("Fail", &["not-a-heartbeat: no such key"]);
        let sound = Findings {
            hook: Some(&ignore),
            ..SOUND
        };
        let rows: Vec<(&str, Findings, &[&str])> = vec![
            (
                "replicas taint, admission does not",
                sound,
                &[
                    "the replicas answer a direct call with the taints, but the create through admission came back without them",
                ],
            ),
            (
                "the running webhook lacks the flags",
                Findings {
                    answers: &[Answer::Untainted],
                    ..sound
                },
                &[
                    "the webhook was called but did not add it: does the running webhook have the --taint and --boot-taint flags checked here",
                ],
            ),
            (
                "the running webhook lacks the flags, gates owned elsewhere",
                Findings {
                    answers: &[Answer::Untainted],
                    flags: "--taint, --owned-taint and --boot-taint",
                    ..sound
                },
                &[
                    "the webhook was called but did not add it: does the running webhook have the --taint, --owned-taint and --boot-taint flags checked here",
                ],
            ),
            (
                "nothing called",
                Findings {
                    answers: &[],
                    ..sound
                },
                &["the webhook was called but did not add it"],
            ),
            (
                "a condition errors, Ignore",
                Findings {
                    hook: Some(&unguarded),
                    ..sound
                },
                &[
                    "matchCondition not-a-heartbeat: no such key on a Node CREATE: with failurePolicy Ignore the API server skips the webhook silently",
                ],
            ),
            (
                "a condition errors, Fail",
                Findings {
                    hook: Some(&failing),
                    answers: &[],
                    ..sound
                },
                &[
                    "matchCondition not-a-heartbeat: no such key on a Node CREATE: with failurePolicy Fail the API server refuses the create",
                ],
            ),
            (
                "no configuration",
                Findings {
                    cert_ok: false,
                    svc_ok: false,
                    answers: &[],
                    ..SOUND
                },
                &["the MutatingWebhookConfiguration is missing or unreadable"],
            ),
            (
                "wrong caBundle",
                Findings {
                    cert_ok: false,
                    ..sound
                },
                &["the API server cannot verify the webhook's certificate with the caBundle"],
            ),
            (
                "no Service",
                Findings {
                    svc_ok: false,
                    ..sound
                },
                &["the webhook's Service is missing or lacks the port"],
            ),
        ];
        for (name, findings, want) in rows {
            assert_reasons(name, &findings, want);
        }
    }

    /// The workload down, the lines unreachable, and the admission policy.
    #[test]
    fn workload_and_policy_verdicts() {
        let ignore = hook("Ignore", &[]);
        let sound = Findings {
            hook: Some(&ignore),
            ..SOUND
        };
        let rows: Vec<(&str, Findings, &[&str])> = vec![
            (
                "webhook down",
                Findings {
                    available: Some(0),
                    answers: &[Answer::Unreachable, Answer::Unreachable],
                    ..sound
                },
                &[
                    "the webhook StatefulSet has no available replica (webhook down)",
                    "no line's replica answered a direct call (see the line checks)",
                ],
            ),
            (
                "one replica answered",
                Findings {
                    answers: &[Answer::Unreachable, Answer::Untainted],
                    ..sound
                },
                &["the webhook was called but did not add it"],
            ),
            (
                "policy unbound",
                Findings {
                    policy: Some(false),
                    ..sound
                },
                &["the admission policy is unbound or its conditions do not apply (see above)"],
            ),
            (
                "policy without the flags",
                Findings {
                    policy: Some(true),
                    ..sound
                },
                &[
                    "the admission policy applied but did not add it: was it generated with the --taint and --boot-taint flags checked here?",
                ],
            ),
            (
                "policy without the flags, gates owned elsewhere",
                Findings {
                    policy: Some(true),
                    flags: "--taint, --owned-taint and --boot-taint",
                    ..sound
                },
                &[
                    "the admission policy applied but did not add it: was it generated with the --taint, --owned-taint and --boot-taint flags checked here?",
                ],
            ),
            (
                "policy without the flags, lines unreached",
                Findings {
                    policy: Some(true),
                    answers: &[Answer::NotCalled],
                    ..sound
                },
                &["the admission policy applied but did not add it"],
            ),
        ];
        for (name, findings, want) in rows {
            assert_reasons(name, &findings, want);
        }
    }
}
