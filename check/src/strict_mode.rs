//! Strict mode (`--boot-taint`, the `strict-mode` component): on or off, and
//! whether every piece agrees on the boot gate. The gate is NoExecute, so a
//! disagreement does not fail safe: a gate the agent does not list is never
//! removed (every node's workloads evicted), one only the agent adds comes
//! after the kubelet started the bound pods, and confinement or an admission
//! policy generated without it refuses or skips the writes that carry it.
//!
//! [`flags`] and [`verdict`] decide from what was read; [`check`] only reads.

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use nodegate_shared::TaintSpec;
use nodegate_webhook::{confinement, policy};
use serde_json::Value;

use crate::container_flags::{Flags, flags};
use crate::installed::{Installed, Workload};
use crate::report::{Report, Status};

pub const CHECK: &str = "strict mode";
const AGENT_POLICY: &str = "nodegate-agent-confinement";
const WEBHOOK_POLICY: &str = "nodegate-webhook-confinement";
/// The name `nodegate-webhook policy` gives its policy.
const GENERATED_POLICY: &str = "nodegate";

/// What [`verdict`] decides on.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// The webhook StatefulSet's flags.
    pub webhook: Flags,
    /// The agent DaemonSet's flags.
    pub agent: Flags,
    /// `spec` of `nodegate-agent-confinement`; `None` when missing (the
    /// credential confinement check reports that).
    pub agent_policy: Option<Value>,
    /// `spec` of `nodegate-webhook-confinement`; `None` when missing.
    pub webhook_policy: Option<Value>,
    /// Name and `spec` of the MutatingAdmissionPolicy, when installed.
    pub admission_policy: Option<(String, Value)>,
}

fn listed(taints: &[TaintSpec]) -> String {
    let v: Vec<String> = taints.iter().map(ToString::to_string).collect();
    v.join(", ")
}

/// Same taints, in any order.
fn same(a: &[TaintSpec], b: &[TaintSpec]) -> bool {
    let sorted = |t: &[TaintSpec]| {
        let mut v: Vec<String> = t.iter().map(ToString::to_string).collect();
        v.sort();
        v
    };
    sorted(a) == sorted(b)
}

/// A string with every run of whitespace made one space: kustomize re-folds
/// multi-line scalars, which changes no CEL expression.
fn squeezed(v: &Value) -> String {
    v.as_str()
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// `(first, second)` of each entry of `spec[list]`, squeezed.
fn pairs(spec: &Value, list: &str, first: &str, second: &str) -> Vec<(String, String)> {
    spec[list]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|e| (squeezed(&e[first]), squeezed(&e[second])))
                .collect()
        })
        .unwrap_or_default()
}

/// `spec` of the document `kind`/`name` in a generator's YAML stream.
fn generated(yaml: &str, kind: &str, name: &str) -> Option<Value> {
    yaml.split("\n---\n")
        .filter_map(|d| serde_yaml::from_str::<Value>(d).ok())
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .map(|d| d["spec"].clone())
}

/// How an installed policy compares with the generator's output.
#[derive(Debug, PartialEq, Eq)]
enum Match {
    /// Generated for the running flags.
    Current,
    /// Generated for the same taints without `--boot-taint`.
    WithoutGate,
    Other,
}

fn compare(
    installed: &Value,
    strict: Option<Value>,
    plain: Option<Value>,
    shape: impl Fn(&Value) -> Vec<(String, String)>,
) -> Match {
    let got = shape(installed);
    if strict.is_some_and(|s| shape(&s) == got) {
        Match::Current
    } else if plain.is_some_and(|p| shape(&p) == got) {
        Match::WithoutGate
    } else {
        Match::Other
    }
}

/// What is wrong with the confinement policies and the admission policy for
/// the agreed flags `f` (strict mode on), and notes for the pass line.
fn policy_problems(i: &Inputs, f: &Flags, problems: &mut Vec<String>, notes: &mut Vec<String>) {
    let gate = listed(&f.boot);
    // In the generators' order: a webhook's gates owned elsewhere are in
    // both policies (its token may add them, the agent's may not touch
    // them) and in the admission policy (added at CREATE).
    let shown_flags: Vec<String> = f
        .taints
        .iter()
        .map(|t| format!("--taint={t}"))
        .chain(f.owned.iter().map(|t| format!("--owned-taint={t}")))
        .chain(f.boot.iter().map(|t| format!("--boot-taint={t}")))
        .chain(
            i.agent
                .release
                .iter()
                .map(|t| format!("--release-taint={t}")),
        )
        .collect();
    let shown_flags = shown_flags.join(" ");
    let vap = "ValidatingAdmissionPolicy";
    // The agent's released taints are part of its confinement.
    let release = &i.agent.release;
    let strict = confinement::render_owned(&f.taints, &f.boot, &f.owned, release);
    let plain = confinement::render_owned(&f.taints, &[], &f.owned, release);
    let validations = |s: &Value| pairs(s, "validations", "expression", "messageExpression");
    let regenerate = format!(
        "apply the strict-mode component's confinement or the output of `nodegate-webhook confinement {shown_flags}`"
    );
    for (name, installed, without_gate) in [
        (
            AGENT_POLICY,
            &i.agent_policy,
            format!(
                "it refuses the agent's write that removes {gate} with the taints, so every new or rebooted node stays NoExecute-tainted and its workloads are evicted"
            ),
        ),
        (
            WEBHOOK_POLICY,
            &i.webhook_policy,
            format!(
                "it refuses the webhook's re-taint of a node whose reboot shows only in a status write (the patch adds {gate}), so such a node is never gated"
            ),
        ),
    ] {
        let Some(installed) = installed else {
            notes.push(format!("{name} not installed (see credential confinement)"));
            continue;
        };
        let want = (generated(&strict, vap, name), generated(&plain, vap, name));
        match compare(installed, want.0, want.1, validations) {
            Match::Current => {}
            Match::WithoutGate => problems.push(format!(
                "{name} was generated without --boot-taint: {without_gate}; {regenerate}"
            )),
            Match::Other => problems.push(format!(
                "{name} is not generated for {shown_flags}: it may refuse the agent's removal of the gate (nodes stay gated) or the webhook's adding it (nodes never gated); {regenerate}"
            )),
        }
    }
    if problems.is_empty() && notes.is_empty() {
        notes.push(format!(
            "{AGENT_POLICY} and {WEBHOOK_POLICY} are generated for them"
        ));
    }

    let Some((name, installed)) = &i.admission_policy else {
        return;
    };
    let kind = "MutatingAdmissionPolicy";
    let want = (
        generated(
            &policy::render_owned(&f.taints, &f.boot, &f.owned, policy::ApiVersion::V1),
            kind,
            GENERATED_POLICY,
        ),
        generated(
            &policy::render_owned(&f.taints, &[], &f.owned, policy::ApiVersion::V1),
            kind,
            GENERATED_POLICY,
        ),
    );
    // Its variables list every taint it adds.
    let variables = |s: &Value| pairs(s, "variables", "name", "expression");
    let regenerate = format!(
        "apply the strict-mode component over the admission-policy overlay, or the output of `nodegate-webhook policy {shown_flags}`"
    );
    match compare(installed, want.0, want.1, variables) {
        Match::Current => notes.push(format!("MutatingAdmissionPolicy {name} adds the gate")),
        Match::WithoutGate => problems.push(format!(
            "MutatingAdmissionPolicy {name} does not add the boot gate {gate}: a node whose reboot shows in a Node update is tainted without it, so its kubelet starts the pods bound to it before the agent is ready; {regenerate}"
        )),
        Match::Other => problems.push(format!(
            "MutatingAdmissionPolicy {name} is not generated for {shown_flags}: the taints it adds are not the webhook's; {regenerate}"
        )),
    }
}

/// The strict-mode line: off, on and consistent, or every inconsistency
/// with what it does to nodes and how to fix it.
pub fn verdict(i: &Inputs) -> (Status, String) {
    // The gates themselves (--taint, --owned-taint, the agent's --gates)
    // are compared by the gates declaration line.
    let (w, a) = (&i.webhook, &i.agent);
    let mut problems = Vec::new();
    match (w.boot.is_empty(), a.boot.is_empty()) {
        (true, true) => {
            return (
                Status::Pass,
                "off: neither the webhook nor the agent runs with --boot-taint".into(),
            );
        }
        (false, true) => problems.push(format!(
            "the webhook adds the boot gate {gate} but the agent DaemonSet has no --boot-taint: nothing removes the gate, so every new or rebooted node stays NoExecute-tainted and all its workloads are evicted; add --boot-taint={gate} to the agent's args (the strict-mode component sets both)",
            gate = listed(&w.boot)
        )),
        (true, false) => problems.push(format!(
            "the agent runs with --boot-taint={gate} but the webhook StatefulSet does not: the gate then comes only from the agent's start-up safety net, after the kubelet already started the pods bound to a rebooted node; add --boot-taint={gate} to the webhook's args (the strict-mode component sets both)",
            gate = listed(&a.boot)
        )),
        (false, false) if !same(&w.boot, &a.boot) => problems.push(format!(
            "the webhook's boot gate {} differs from the agent's {}: the agent never removes a gate it does not list, so nodes stay NoExecute-tainted and their workloads evicted; give both the same --boot-taint flags",
            listed(&w.boot),
            listed(&a.boot)
        )),
        (false, false) => {}
    }
    let agreed = same(&w.boot, &a.boot);
    let mut notes = Vec::new();
    if problems.is_empty() {
        policy_problems(i, w, &mut problems, &mut notes);
    }
    let on = format!("on (boot gate {})", listed(&w.boot));
    if problems.is_empty() {
        notes.insert(
            0,
            "the webhook and the agent run with the same --boot-taint flags".into(),
        );
        (Status::Pass, format!("{on}: {}", notes.join("; ")))
    } else if agreed {
        (Status::Fail, format!("{on}, but {}", problems.join("; ")))
    } else {
        (
            Status::Fail,
            format!("inconsistent: {}", problems.join("; ")),
        )
    }
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
        plural,
    )
}

/// `spec` of a cluster-scoped object, `None` when absent or unreadable
/// (also when the API server does not serve the kind).
async fn spec_of(client: &Client, res: &ApiResource, name: &str) -> Option<Value> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), res);
    let obj = api.get_opt(name).await.ok().flatten()?;
    Some(obj.data.get("spec").cloned().unwrap_or(Value::Null))
}

/// The webhook's and the agent's flags, from their container 0 (read
/// once, in `installed`), or the line saying why they cannot be compared.
pub fn installed_flags(installed: &Installed) -> Result<(Flags, Flags), (Status, String)> {
    for w in [&installed.webhook, &installed.agent] {
        if let Workload::Unreadable(e) = w {
            return Err((Status::Skip, e.clone()));
        }
    }
    let (Some(webhook), Some(agent)) = (installed.webhook.container(), installed.agent.container())
    else {
        return Err((
            Status::Skip,
            "the webhook StatefulSet or the agent DaemonSet (or its container) is missing".into(),
        ));
    };
    match (flags(webhook), flags(agent)) {
        (Ok(w), Ok(a)) => Ok((w, a)),
        (w, a) => {
            let mut why = Vec::new();
            if let Err(e) = w {
                why.push(format!(
                    "nodegate-webhook refuses to start with the StatefulSet's flags: {e}"
                ));
            }
            if let Err(e) = a {
                why.push(format!(
                    "nodegate-agent refuses to start with the DaemonSet's flags: {e}"
                ));
            }
            Err((Status::Fail, why.join("; ")))
        }
    }
}

/// Compares the webhook's and the agent's flags ([`installed_flags`]), the
/// confinement policies and the admission policy (`policy`: the
/// MutatingAdmissionPolicy of the admission-policy install), and reports
/// [`verdict`].
pub async fn check(client: &Client, policy: &str, installed: &Installed, report: &mut Report) {
    let (webhook, agent) = match installed_flags(installed) {
        Ok(f) => f,
        Err((status, detail)) => {
            report.add(CHECK, status, detail);
            return;
        }
    };
    let vap = resource("ValidatingAdmissionPolicy", "validatingadmissionpolicies");
    let map = resource("MutatingAdmissionPolicy", "mutatingadmissionpolicies");
    let inputs = Inputs {
        webhook,
        agent,
        agent_policy: spec_of(client, &vap, AGENT_POLICY).await,
        webhook_policy: spec_of(client, &vap, WEBHOOK_POLICY).await,
        admission_policy: spec_of(client, &map, policy)
            .await
            .map(|s| (policy.to_string(), s)),
    };
    let (status, detail) = verdict(&inputs);
    report.add(CHECK, status, detail);
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegate_shared::keys::DEFAULT_TAINT;
    use serde_json::json;

    fn t(s: &str) -> TaintSpec {
        s.parse().unwrap()
    }

    fn f(taints: &[&str], boot: &[&str]) -> Flags {
        Flags::of(taints, boot)
    }

    /// What the install ships: confinement (and admission policy) generated
    /// for `taints` and `boot`.
    fn installed(taints: &[&str], boot: &[&str], with_policy: bool) -> Inputs {
        installed_owned(taints, boot, &[], with_policy)
    }

    /// The same with gates owned elsewhere (the webhook's `--owned-taint`;
    /// the agent's `--gates` declares them).
    fn installed_owned(
        taints: &[&str],
        boot: &[&str],
        owned: &[&str],
        with_policy: bool,
    ) -> Inputs {
        let mut g = f(taints, boot);
        g.owned = owned.iter().map(|s| t(s)).collect();
        let text = confinement::render_owned(&g.taints, &g.boot, &g.owned, &[]);
        Inputs {
            agent_policy: generated(&text, "ValidatingAdmissionPolicy", AGENT_POLICY),
            webhook_policy: generated(&text, "ValidatingAdmissionPolicy", WEBHOOK_POLICY),
            admission_policy: with_policy.then(|| {
                let text =
                    policy::render_owned(&g.taints, &g.boot, &g.owned, policy::ApiVersion::V1);
                (
                    "nodegate".to_string(),
                    generated(&text, "MutatingAdmissionPolicy", "nodegate").unwrap(),
                )
            }),
            webhook: g.clone(),
            agent: g,
        }
    }

    type Case<'a> = (&'a str, Inputs, Status, Vec<&'a str>);

    /// Each case's verdict has its status and every part of its detail.
    fn assert_cases(cases: Vec<Case>) {
        for (name, inputs, status, want) in cases {
            let (got, detail) = verdict(&inputs);
            assert_eq!(got, status, "{name}: {detail}");
            for w in want {
                assert!(detail.contains(w), "{name}: {detail:?} lacks {w:?}");
            }
        }
    }

    /// The webhook's and the agent's flags: off, on, and each way they
    /// differ.
    #[test]
    fn verdicts_on_the_flags() {
        let gate = crate::container_flags::default_gate();
        let gate = gate.as_str();
        let on_gate = format!("on (boot gate {gate}): ");
        let only_on_webhook = format!(
            "inconsistent: the webhook adds the boot gate {gate} but the agent DaemonSet has no --boot-taint"
        );
        let add_to_agent = format!("add --boot-taint={gate} to the agent's args");
        let gate_only_on = |webhook: bool| {
            let mut i = installed(&[DEFAULT_TAINT], &[gate], false);
            if webhook {
                i.agent.boot.clear();
            } else {
                i.webhook.boot.clear();
            }
            i
        };
        let mut other_gate = installed(&[DEFAULT_TAINT], &[gate], false);
        other_gate.agent.boot = vec![t("example.com/gate:NoExecute")];
        let mut other_taints = installed(&[DEFAULT_TAINT], &[gate], false);
        other_taints
            .agent
            .taints
            .push(t("example.com/x:NoSchedule"));
        let mut off_other_taints = installed(&[DEFAULT_TAINT], &[], false);
        off_other_taints.agent.taints = vec![t("example.com/x:NoSchedule")];
        // kustomize re-folds multi-line scalars.
        let mut refolded = installed(&[DEFAULT_TAINT], &[gate], true);
        for v in refolded.agent_policy.as_mut().unwrap()["validations"]
            .as_array_mut()
            .unwrap()
        {
            let e = v["expression"].as_str().unwrap().replace(" || ", "\n\n|| ");
            v["expression"] = json!(e);
        }

        assert_cases(vec![
            (
                "default install",
                installed(&[DEFAULT_TAINT], &[], false),
                Status::Pass,
                vec!["off: neither the webhook nor the agent runs with --boot-taint"],
            ),
            (
                "strict-mode component",
                installed(&[DEFAULT_TAINT], &[gate], false),
                Status::Pass,
                vec![on_gate.as_str(), "are generated for them"],
            ),
            (
                "strict-mode component over the admission-policy overlay",
                installed(&[DEFAULT_TAINT], &[gate], true),
                Status::Pass,
                vec!["MutatingAdmissionPolicy nodegate adds the gate"],
            ),
            (
                "re-folded by kustomize",
                refolded,
                Status::Pass,
                vec!["on (boot gate"],
            ),
            (
                "gate only on the webhook",
                gate_only_on(true),
                Status::Fail,
                vec![
                    only_on_webhook.as_str(),
                    "stays NoExecute-tainted and all its workloads are evicted",
                    add_to_agent.as_str(),
                ],
            ),
            (
                "gate only on the agent",
                gate_only_on(false),
                Status::Fail,
                vec![
                    "only from the agent's start-up safety net",
                    "to the webhook's args",
                ],
            ),
            (
                "different gates",
                other_gate,
                Status::Fail,
                vec!["differs from the agent's example.com/gate:NoExecute"],
            ),
            // The gates themselves are the gates declaration line's.
            (
                "different taints",
                other_taints,
                Status::Pass,
                vec![on_gate.as_str()],
            ),
            (
                "different taints, strict mode off",
                off_other_taints,
                Status::Pass,
                vec!["off: "],
            ),
        ]);
    }

    /// The confinement and the admission policy generated for the flags.
    #[test]
    fn verdicts_on_the_policies() {
        let gate = crate::container_flags::default_gate();
        let gate = gate.as_str();
        let regenerate =
            format!("nodegate-webhook confinement --taint={DEFAULT_TAINT} --boot-taint={gate}");
        let old_confinement = |agent: bool| {
            let mut i = installed(&[DEFAULT_TAINT], &[gate], false);
            let plain = installed(&[DEFAULT_TAINT], &[], false);
            if agent {
                i.agent_policy = plain.agent_policy;
            } else {
                i.webhook_policy = plain.webhook_policy;
            }
            i
        };
        let mut foreign_confinement = installed(&[DEFAULT_TAINT], &[gate], false);
        foreign_confinement.agent_policy =
            installed(&["example.com/x:NoSchedule"], &[gate], false).agent_policy;
        let mut old_policy = installed(&[DEFAULT_TAINT], &[gate], false);
        old_policy.admission_policy = installed(&[DEFAULT_TAINT], &[], true).admission_policy;
        let mut no_confinement = installed(&[DEFAULT_TAINT], &[gate], false);
        no_confinement.agent_policy = None;
        // A gates declaration with an owned gate and bootTaints: its
        // policies are generated with --owned-taint.
        let ebs = "ebs.csi.aws.com/agent-not-ready:NoExecute";
        let owned = installed_owned(&[DEFAULT_TAINT], &[gate], &[ebs], true);
        let mut owned_old_policy = installed_owned(&[DEFAULT_TAINT], &[gate], &[ebs], true);
        owned_old_policy.admission_policy =
            installed(&[DEFAULT_TAINT], &[gate], true).admission_policy;
        let mut owned_old_confinement = installed_owned(&[DEFAULT_TAINT], &[gate], &[ebs], false);
        owned_old_confinement.webhook_policy =
            installed(&[DEFAULT_TAINT], &[gate], false).webhook_policy;
        let regenerate_owned = format!(
            "nodegate-webhook policy --taint={DEFAULT_TAINT} --owned-taint={ebs} --boot-taint={gate}"
        );

        assert_cases(vec![
            (
                "agent confinement not regenerated",
                old_confinement(true),
                Status::Fail,
                vec![
                    "nodegate-agent-confinement was generated without --boot-taint",
                    "refuses the agent's write that removes",
                    regenerate.as_str(),
                ],
            ),
            (
                "webhook confinement not regenerated",
                old_confinement(false),
                Status::Fail,
                vec![
                    "nodegate-webhook-confinement was generated without --boot-taint",
                    "never gated",
                ],
            ),
            (
                "confinement for other taints",
                foreign_confinement,
                Status::Fail,
                vec!["nodegate-agent-confinement is not generated for --taint="],
            ),
            (
                "admission policy without the gate",
                old_policy,
                Status::Fail,
                vec![
                    "MutatingAdmissionPolicy nodegate does not add the boot gate",
                    "nodegate-webhook policy --taint=",
                ],
            ),
            (
                "confinement missing",
                no_confinement,
                Status::Pass,
                vec!["nodegate-agent-confinement not installed (see credential confinement)"],
            ),
            (
                "gates owned elsewhere, every policy generated with them",
                owned,
                Status::Pass,
                vec![
                    "are generated for them",
                    "MutatingAdmissionPolicy nodegate adds the gate",
                ],
            ),
            (
                "gates owned elsewhere, admission policy without them",
                owned_old_policy,
                Status::Fail,
                vec![
                    "MutatingAdmissionPolicy nodegate is not generated for",
                    regenerate_owned.as_str(),
                ],
            ),
            (
                "gates owned elsewhere, confinement without them",
                owned_old_confinement,
                Status::Fail,
                vec![&format!(
                    "nodegate-webhook-confinement is not generated for --taint={DEFAULT_TAINT} --owned-taint={ebs} --boot-taint={gate}"
                )],
            ),
        ]);
    }

    /// The flags are compared only when both workloads' containers are
    /// read and both binaries would start with them.
    #[test]
    fn installed_flags_or_why_not() {
        let container = |args: &[&str]| {
            Workload::Container(Box::new(
                serde_json::from_value(json!({"name": "c", "args": args})).unwrap(),
            ))
        };
        let both = |webhook, agent| Installed {
            webhook,
            agent,
            agent_placement: None,
        };
        let ok = installed_flags(&both(container(&[]), container(&[]))).unwrap();
        assert_eq!(ok.0, ok.1);
        let rows = [
            (
                both(Workload::Unreadable("403".into()), container(&[])),
                Status::Skip,
                "403",
            ),
            (
                both(container(&[]), Workload::Missing),
                Status::Skip,
                "the webhook StatefulSet or the agent DaemonSet (or its container) is missing",
            ),
            (
                both(
                    container(&["--boot-taint=a.dev/x:NoSchedule"]),
                    container(&["--taint=bad"]),
                ),
                Status::Fail,
                "nodegate-webhook refuses to start with the StatefulSet's flags: ",
            ),
            (
                both(container(&[]), container(&["--taint=bad"])),
                Status::Fail,
                "nodegate-agent refuses to start with the DaemonSet's flags: --taint=bad",
            ),
        ];
        for (installed, status, part) in rows {
            let (got, detail) = installed_flags(&installed).unwrap_err();
            assert_eq!(got, status, "{detail}");
            assert!(
                detail.starts_with(part),
                "{detail:?} does not start with {part:?}"
            );
        }
    }
}
