//! The agent's gates against the webhook's flags: every gate the agent
//! opens must be a `--taint` of the webhook (else new and rebooted nodes are
//! never held for it), every gate owned elsewhere an `--owned-taint`, and
//! every taint the webhook adds a declared gate (else nothing the check
//! knows of removes it). Strict mode's boot gates are the strict-mode line's.
//!
//! [`verdict`] decides from what was read; [`check`] only hands it the
//! containers read once in `installed`.

use nodegate_shared::TaintSpec;

use crate::container_flags::Flags;
use crate::gates::{Declaration, declaration};
use crate::installed::Installed;
use crate::report::{Report, Status};
use crate::strict_mode::installed_flags;

pub const CHECK: &str = "gates declaration";

/// How to make the two agree.
const FIX: &str = "render the agent's --gates and the webhook's --taint, --owned-taint and --boot-taint from the one declaration (nodegate-webhook gates-component)";

fn count(n: usize, one: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {one}s")
    }
}

/// The declaration as the PASS line shows it.
fn described(d: &Declaration) -> String {
    let g = &d.gates;
    let opened: Vec<String> = g
        .opened()
        .map(|x| {
            let probes = match x.probes.len() {
                0 => "no probe: opened as soon as the agent runs".to_string(),
                n => count(n, "probe"),
            };
            format!("{} ({}, {probes})", x.name, x.taint.0)
        })
        .collect();
    let owned: Vec<String> = g
        .owned()
        .filter_map(|x| {
            let o = x.owner.as_ref()?;
            Some(format!(
                "{} ({}) owned by DaemonSet {}",
                x.name, x.taint.0, o.daemon_set
            ))
        })
        .collect();
    let mut parts = vec![format!("opened by the agent: {}", opened.join(", "))];
    if !owned.is_empty() {
        parts.push(owned.join(", "));
    }
    let source = if d.from_flag {
        format!(
            "the agent's --gates declares {}",
            count(g.gates.len(), "gate")
        )
    } else {
        "the agent has no --gates: one gate, of its --taint and --probe-* flags".to_string()
    };
    format!("{source}: {}", parts.join("; "))
}

fn has(list: &[TaintSpec], t: &TaintSpec) -> bool {
    list.contains(t)
}

/// The line: the declaration and the webhook's flags agree, or each gate
/// and taint that does not, named, with what it does to nodes.
pub fn verdict(agent: &Declaration, webhook: &Flags) -> (Status, String) {
    let g = &agent.gates;
    let mut problems = Vec::new();
    for x in g.opened() {
        let t = &x.taint.0;
        if has(&webhook.taints, t) {
            continue;
        }
        problems.push(if has(&webhook.owned, t) {
            format!(
                "gate {} ({t}) is opened by the agent's probes, but the webhook runs with it as --owned-taint, not --taint",
                x.name
            )
        } else {
            format!(
                "gate {} ({t}): the agent opens it, but the webhook does not add it (no --taint={t}): new and rebooted nodes are not held for it, so pods land before its probes pass",
                x.name
            )
        });
    }
    for x in g.owned() {
        let t = &x.taint.0;
        if has(&webhook.owned, t) {
            continue;
        }
        let owner = x.owner.as_ref().map_or("", |o| o.daemon_set.as_str());
        problems.push(if has(&webhook.taints, t) {
            format!(
                "gate {} ({t}) is owned by DaemonSet {owner}, but the webhook runs with it as --taint, not --owned-taint",
                x.name
            )
        } else {
            format!(
                "gate {} ({t}), owned by DaemonSet {owner}: the webhook does not add it (no --owned-taint={t}): new and rebooted nodes are not held until {owner} is ready",
                x.name
            )
        });
    }
    let declared: Vec<TaintSpec> = g.gates.iter().map(|x| x.taint.0.clone()).collect();
    for t in webhook.taints.iter().filter(|t| !has(&declared, t)) {
        problems.push(format!(
            "the webhook adds {t} (--taint) but no gate of the agent declares it: nothing removes it, so every new and rebooted node stays gated"
        ));
    }
    for t in webhook.owned.iter().filter(|t| !has(&declared, t)) {
        problems.push(format!(
            "the webhook adds {t} (--owned-taint) but no gate of the agent declares it, with the DaemonSet that removes it: nodegate-check cannot tell whether anything does"
        ));
    }
    if problems.is_empty() {
        let flags = if g.owned().next().is_some() {
            "--taint, --owned-taint"
        } else {
            "--taint"
        };
        let each = if g.gates.len() == 1 { "it" } else { "each" };
        (
            Status::Pass,
            format!(
                "{}; the webhook adds {each} ({flags}) and no other",
                described(agent)
            ),
        )
    } else {
        (Status::Fail, format!("{}; {FIX}", problems.join("; ")))
    }
}

/// The declaration and the webhook's flags, or the line saying why they
/// cannot be compared.
pub fn read(installed: &Installed) -> Result<(Declaration, Flags), (Status, String)> {
    let (webhook, _) = installed_flags(installed)?;
    let agent = installed
        .agent
        .container()
        .map(declaration)
        .transpose()
        .map_err(|e| {
            (
                Status::Fail,
                format!("nodegate-agent refuses to start with the DaemonSet's flags: {e}"),
            )
        })?;
    match agent {
        Some(a) => Ok((a, webhook)),
        None => Err((
            Status::Skip,
            "the agent DaemonSet (or its container) is missing".into(),
        )),
    }
}

/// Reports [`verdict`] on the workloads read once; the declaration, for the
/// gate lines, when it could be read.
pub fn check(installed: &Installed, report: &mut Report) -> Option<Declaration> {
    match read(installed) {
        Ok((agent, webhook)) => {
            let (status, detail) = verdict(&agent, &webhook);
            report.add(CHECK, status, detail);
            Some(agent)
        }
        Err((status, detail)) => {
            report.add(CHECK, status, detail);
            installed
                .agent
                .container()
                .and_then(|c| declaration(c).ok())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::THREE_GATES;
    use nodegate_shared::gates::Gates;
    use nodegate_shared::keys::DEFAULT_TAINT;

    const CNI: &str = "nodegate.dev/agent-not-ready=true:NoSchedule";
    const DNS: &str = "example.com/dns-not-ready:NoSchedule";
    const EBS: &str = "ebs.csi.aws.com/agent-not-ready:NoExecute";

    fn three() -> Declaration {
        Declaration {
            gates: Gates::parse(THREE_GATES).unwrap(),
            from_flag: true,
        }
    }

    fn legacy() -> Declaration {
        let c = serde_json::from_value(serde_json::json!({
            "name": "agent",
            "args": ["--probe-http=http://127.0.0.1:9879/healthz", "--probe-file=/host/etc/cni/net.d/05-cilium.conflist"],
        }))
        .unwrap();
        declaration(&c).unwrap()
    }

    fn webhook(taints: &[&str], owned: &[&str]) -> Flags {
        let mut f = Flags::of(taints, &[]);
        f.owned = owned.iter().map(|s| s.parse().unwrap()).collect();
        f
    }

    #[test]
    fn verdicts() {
        let rows: Vec<(&str, Declaration, Flags, Status, Vec<&str>)> = vec![
            (
                "three gates, all added",
                three(),
                webhook(&[CNI, DNS], &[EBS]),
                Status::Pass,
                vec![
                    "the agent's --gates declares 3 gates: opened by the agent: cni (nodegate.dev/agent-not-ready=true:NoSchedule, 2 probes), dns (example.com/dns-not-ready:NoSchedule, 1 probe); ebs-csi (ebs.csi.aws.com/agent-not-ready:NoExecute) owned by DaemonSet kube-system/ebs-csi-node; the webhook adds each (--taint, --owned-taint) and no other",
                ],
            ),
            (
                "the legacy single gate",
                legacy(),
                webhook(&[DEFAULT_TAINT], &[]),
                Status::Pass,
                vec![
                    "the agent has no --gates: one gate, of its --taint and --probe-* flags: opened by the agent: default (nodegate.dev/agent-not-ready=true:NoSchedule, 2 probes); the webhook adds it (--taint) and no other",
                ],
            ),
            (
                "a gate the webhook does not add",
                three(),
                webhook(&[CNI], &[EBS]),
                Status::Fail,
                vec![
                    "gate dns (example.com/dns-not-ready:NoSchedule): the agent opens it, but the webhook does not add it (no --taint=example.com/dns-not-ready:NoSchedule)",
                    "nodegate-webhook gates-component",
                ],
            ),
            (
                "an owned taint the webhook does not add",
                three(),
                webhook(&[CNI, DNS], &[]),
                Status::Fail,
                vec![
                    "gate ebs-csi (ebs.csi.aws.com/agent-not-ready:NoExecute), owned by DaemonSet kube-system/ebs-csi-node: the webhook does not add it (no --owned-taint=ebs.csi.aws.com/agent-not-ready:NoExecute)",
                ],
            ),
            (
                "an owned gate the webhook has as its own",
                three(),
                webhook(&[CNI, DNS, EBS], &[]),
                Status::Fail,
                vec![
                    "gate ebs-csi (ebs.csi.aws.com/agent-not-ready:NoExecute) is owned by DaemonSet kube-system/ebs-csi-node, but the webhook runs with it as --taint, not --owned-taint",
                ],
            ),
            (
                "a webhook taint no gate declares",
                legacy(),
                webhook(&[DEFAULT_TAINT, DNS], &[EBS]),
                Status::Fail,
                vec![
                    "the webhook adds example.com/dns-not-ready:NoSchedule (--taint) but no gate of the agent declares it: nothing removes it",
                    "the webhook adds ebs.csi.aws.com/agent-not-ready:NoExecute (--owned-taint) but no gate of the agent declares it",
                ],
            ),
            (
                "another value is another taint",
                legacy(),
                webhook(&["nodegate.dev/agent-not-ready=false:NoSchedule"], &[]),
                Status::Fail,
                vec![
                    "gate default (nodegate.dev/agent-not-ready=true:NoSchedule): the agent opens it, but the webhook does not add it",
                    "the webhook adds nodegate.dev/agent-not-ready=false:NoSchedule (--taint) but no gate",
                ],
            ),
        ];
        for (name, agent, webhook, status, parts) in rows {
            let (got, detail) = verdict(&agent, &webhook);
            assert_eq!(got, status, "{name}: {detail}");
            for p in parts {
                assert!(detail.contains(p), "{name}: {detail:?} lacks {p:?}");
            }
        }
    }

    /// A declaration the agent refuses fails the line; a missing agent
    /// skips it.
    #[test]
    fn what_cannot_be_compared() {
        use crate::installed::Workload;
        let container = |args: &[&str]| {
            Workload::Container(Box::new(
                serde_json::from_value(serde_json::json!({"name": "c", "args": args})).unwrap(),
            ))
        };
        let both = |webhook, agent| Installed {
            webhook,
            agent,
            agent_placement: None,
        };
        let (s, d) = read(&both(container(&[]), container(&["--gates={gates: []}"]))).unwrap_err();
        assert_eq!(s, Status::Fail, "{d}");
        assert!(
            d.starts_with("nodegate-agent refuses to start with the DaemonSet's flags: --gates: ")
                && d.contains("no gate nodegate opens"),
            "{d}"
        );
        let (s, _) = read(&both(container(&[]), Workload::Missing)).unwrap_err();
        assert_eq!(s, Status::Skip);
        let mut report = Report::default();
        let got = check(&both(container(&[]), container(&[])), &mut report);
        assert_eq!(got.map(|d| d.from_flag), Some(false));
        assert_eq!(report.get(CHECK).map(|l| l.status), Some(Status::Pass));
    }
}
