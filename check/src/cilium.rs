//! Cilium's operator and nodegate on one cluster: whether they share a taint
//! key. The operator's node-taint controller (`operator/watchers/node_taint.go`
//! in cilium/cilium) works on every taint whose key is its
//! `agent-not-ready-taint-key` (default `node.cilium.io/agent-not-ready`),
//! whatever its value and effect: with `remove-cilium-node-taints` (default
//! true) it removes them all once its cache shows the node's Cilium pod
//! Ready; with `set-cilium-node-taints` (default false; the Helm chart turns
//! it on with `removeNodeTaints`) it adds `<key>:NoSchedule`, empty value,
//! while the pod exists but is not Ready and no taint has the key. The
//! controller runs only with `remove-cilium-node-taints` or
//! `set-cilium-is-up-condition` (default true). A key that nodegate's webhook
//! or agent also manages is then written by two owners that undo each other.
//!
//! The operator reads those options from ConfigMap `cilium-config`, mounted
//! as its `--config-dir` (values whitespace-trimmed, booleans as Go's
//! `strconv.ParseBool` reads them); an absent key is the operator's default.
//!
//! [`verdict`] decides from what was read; [`check`] only reads.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Client;
use kube::api::{Api, ListParams};
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::DEFAULT_TAINT;
use nodegate_shared::taint::Effect;

use crate::container_flags::{Flags, flags};
use crate::installed::{Installed, Workload};
use crate::report::{Report, Status};

pub const CHECK: &str = "cilium operator";
/// The label of Cilium's agent pods (the operator's `cilium-pod-labels`
/// default, and the Helm chart's).
pub const AGENT_POD_LABEL: &str = "k8s-app=cilium";
/// The operator's key without `agent-not-ready-taint-key`
/// (`defaults.AgentNotReadyNodeTaint`).
pub const OPERATOR_DEFAULT_KEY: &str = "node.cilium.io/agent-not-ready";

const KEY: &str = "agent-not-ready-taint-key";
const REMOVE: &str = "remove-cilium-node-taints";
const SET: &str = "set-cilium-node-taints";
const IS_UP: &str = "set-cilium-is-up-condition";

/// Whether Cilium's agent pods run in the namespace (asked only when the
/// ConfigMap is missing or unreadable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pods {
    /// One of them, by name.
    Found(String),
    None,
    /// They could not be listed: why.
    Unknown(String),
}

/// What was read of the operator's ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Config {
    /// Its `data`.
    Data(BTreeMap<String, String>),
    Missing(Pods),
    /// Why it could not be read (403 …).
    Unreadable(String, Pods),
}

/// What [`verdict`] decides on.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// Namespace of the ConfigMap and of Cilium's pods.
    pub namespace: String,
    /// Name of the ConfigMap.
    pub name: String,
    pub config: Config,
    /// The webhook StatefulSet's flags; `None` when it is missing, unreadable
    /// or its flags would not start the webhook (other lines say which).
    pub webhook: Option<Flags>,
    /// The agent DaemonSet's flags, likewise.
    pub agent: Option<Flags>,
}

/// The operator's node-taint settings.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Operator {
    key: String,
    remove: bool,
    /// `remove-cilium-node-taints` is not in the ConfigMap (so: true).
    remove_absent: bool,
    set: bool,
    is_up: bool,
}

impl Operator {
    /// The controller runs at all.
    fn runs(&self) -> bool {
        self.remove || self.is_up
    }
    fn removes(&self) -> bool {
        self.remove
    }
    fn sets(&self) -> bool {
        self.set && self.runs()
    }
}

/// A boolean as Go's `strconv.ParseBool` reads it.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The operator's settings from the ConfigMap's data, or each value it
/// cannot read as a boolean.
fn operator(data: &BTreeMap<String, String>) -> Result<Operator, Vec<String>> {
    let mut bad = Vec::new();
    let mut flag = |name: &str, default: bool| match data.get(name).map(|v| v.trim()) {
        None => default,
        Some(v) => parse_bool(v).unwrap_or_else(|| {
            bad.push(format!("{name}: {v:?}"));
            default
        }),
    };
    let remove = flag(REMOVE, true);
    let set = flag(SET, false);
    let is_up = flag(IS_UP, true);
    if !bad.is_empty() {
        return Err(bad);
    }
    let key = data
        .get(KEY)
        .map(|k| k.trim())
        .filter(|k| !k.is_empty())
        .unwrap_or(OPERATOR_DEFAULT_KEY)
        .to_string();
    Ok(Operator {
        key,
        remove,
        remove_absent: !data.contains_key(REMOVE),
        set,
        is_up,
    })
}

/// One taint nodegate manages: whose flag, and the taint.
struct Managed<'a> {
    flag: String,
    taint: &'a TaintSpec,
    boot: bool,
}

fn managed<'a>(who: &str, f: &'a Flags) -> Vec<Managed<'a>> {
    let ordinary = f.taints.iter().map(|t| (t, false));
    let boot = f.boot.iter().map(|t| (t, true));
    ordinary
        .chain(boot)
        .map(|(taint, boot)| Managed {
            flag: format!(
                "the {who}'s --{}={taint}",
                if boot { "boot-taint" } else { "taint" }
            ),
            taint,
            boot,
        })
        .collect()
}

/// What the operator does with its key, for the lines.
fn does(op: &Operator) -> &'static str {
    match (op.removes(), op.sets()) {
        (true, true) => "removes it when the node's Cilium pod is Ready, sets it while not",
        (true, false) => "removes it when the node's Cilium pod is Ready",
        _ => "sets it while the node's Cilium pod is not Ready, and never removes it",
    }
}

fn distinct(items: impl Iterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

/// The line for a ConfigMap that is missing or unreadable (`error`).
fn unread(i: &Inputs, error: Option<&str>, pods: &Pods) -> (Status, String) {
    let (ns, name) = (&i.namespace, &i.name);
    let config = match error {
        None => format!("ConfigMap {ns}/{name} not found"),
        Some(e) => format!("ConfigMap {ns}/{name} cannot be read ({e})"),
    };
    match pods {
        Pods::Found(pod) => (
            Status::Fail,
            format!(
                "Cilium runs here (pod {ns}/{pod}), but its {config}: the operator's node-taint settings are unknown, so a fight with nodegate over a taint key cannot be ruled out; {}",
                match error {
                    None =>
                        "point --cilium-namespace and --cilium-config at the ConfigMap the operator reads",
                    Some(_) =>
                        "let nodegate-check get that ConfigMap, or point --cilium-config at the one the operator reads",
                }
            ),
        ),
        Pods::None if error.is_none() => (
            Status::Pass,
            format!(
                "Cilium is not installed in {ns} ({config}, no pod {AGENT_POD_LABEL}): no operator shares a taint key with nodegate (--cilium-namespace and --cilium-config if it runs elsewhere)"
            ),
        ),
        Pods::None => (
            Status::Skip,
            format!(
                "{config}, and no Cilium pod ({AGENT_POD_LABEL}) runs in {ns}: nothing to compare nodegate's taint keys with"
            ),
        ),
        Pods::Unknown(e) => (
            Status::Warn,
            format!(
                "{config}, and the pods of {ns} cannot be listed ({e}): cannot tell whether Cilium's operator shares a taint key with nodegate"
            ),
        ),
    }
}

/// The Cilium line: the operator and nodegate own different keys, the
/// operator leaves taints alone, or they share one (what that does to nodes,
/// and the fix).
pub fn verdict(i: &Inputs) -> (Status, String) {
    let data = match &i.config {
        Config::Data(d) => d,
        Config::Missing(pods) => return unread(i, None, pods),
        Config::Unreadable(e, pods) => return unread(i, Some(e), pods),
    };
    let at = format!("{}/{}", i.namespace, i.name);
    let op = match operator(data) {
        Ok(op) => op,
        Err(bad) => {
            let (what, it, each) = if bad.len() == 1 {
                ("not a boolean", "it", "it")
            } else {
                ("not booleans", "them", "each")
            };
            return (
                Status::Fail,
                format!(
                    "ConfigMap {at} has {}, {what} (true or false): the operator misreads or refuses {it}, so what it does with taints is unknown; set {each} to \"true\" or \"false\"",
                    bad.join(", ")
                ),
            );
        }
    };
    let mut all = Vec::new();
    if let Some(w) = &i.webhook {
        all.extend(managed("webhook", w));
    }
    if let Some(a) = &i.agent {
        all.extend(managed("agent", a));
    }
    if i.webhook.is_none() && i.agent.is_none() {
        return (
            Status::Skip,
            "cannot tell which taint keys nodegate uses: neither the webhook StatefulSet's nor the agent DaemonSet's flags could be read (see above)".into(),
        );
    }
    let ours = distinct(all.iter().map(|m| m.taint.key().to_string())).join(", ");
    let k = &op.key;
    if !op.removes() && !op.sets() {
        let why = if op.set {
            format!("{REMOVE} and {IS_UP} are false, so its node-taint controller does not run")
        } else {
            format!("{REMOVE} and {SET} are false")
        };
        return (
            Status::Pass,
            format!("Cilium's operator leaves taints alone ({why}); nodegate owns {ours}"),
        );
    }

    let clash: Vec<&Managed> = all.iter().filter(|m| m.taint.key() == k).collect();
    if !clash.is_empty() {
        return (Status::Fail, clash_line(&op, &at, &clash));
    }

    let mut notes = vec![format!(
        "Cilium's operator owns {k} ({}); nodegate owns {ours}",
        does(&op)
    )];
    let mut warn = false;
    if op.removes() {
        notes[0].push_str("; a node takes pods when both are gone");
    } else {
        warn = true;
        notes.push(format!(
            "but {REMOVE} is false: once the operator sets {k} it stays, and the node takes no pods (the Helm chart refuses this combination); set {REMOVE}: \"true\" in {at}"
        ));
    }
    let released = i
        .agent
        .iter()
        .flat_map(|a| &a.release)
        .filter(|r| r.key() == k);
    for r in released {
        let operators_own = r.value().is_none() && r.effect() == Effect::NoSchedule;
        if operators_own && op.sets() {
            warn = true;
            notes.push(format!(
                "but the agent's --release-taint={r} is the operator's own taint exactly (empty value, NoSchedule): the agent's ready patch removes it, even while the node's Cilium pod is not Ready; release {k}=true:NoSchedule, the taint an older nodegate added"
            ));
        } else if operators_own {
            // The operator does not set it now, but kubelets may register
            // with it: the agent's ready patch removes that one.
            notes.push(format!(
                "the agent's --release-taint={r} removes, once, a taint with exactly that empty value (the operator does not set it here, but kubelets registering with it lose it at nodegate's ready patch), and never adds it"
            ));
        } else {
            notes.push(format!(
                "the agent's --release-taint={r} removes the taint an older nodegate added, once, when it matches exactly (key, value and effect), and never adds it: the operator's own (empty value) is not touched"
            ));
        }
    }
    (
        if warn { Status::Warn } else { Status::Pass },
        notes.join("; "),
    )
}

/// The FAIL line of a shared key: what the two owners do to nodes, and the
/// two fixes.
fn clash_line(op: &Operator, at: &str, clash: &[&Managed]) -> String {
    let k = &op.key;
    let flags: Vec<&str> = clash.iter().map(|m| m.flag.as_str()).collect();
    let mut effects = vec![
        "the two undo each other's Node writes (a write loop between the operator and the agent, thousands of writes)".to_string(),
    ];
    if op.removes() {
        effects.push(
            "at re-registration the operator removes nodegate's gate from its stale cache (the node's Cilium pod was Ready before the reboot), so pods land before the network agent is ready".into(),
        );
        let gates = distinct(clash.iter().filter(|m| m.boot).map(|m| m.taint.to_string()));
        if !gates.is_empty() {
            effects.push(format!(
                "in strict mode it removes the boot gate {} too, so the pods bound to a rebooted node start before it is ready",
                gates.join(", ")
            ));
        }
    }
    let default_key = DEFAULT_TAINT
        .parse::<TaintSpec>()
        .map(|t| t.key().to_string())
        .unwrap_or_default();
    let own_key = if default_key == *k {
        "give nodegate a key of its own (the same --taint and --boot-taint flags with another key, on the webhook and the agent)".to_string()
    } else {
        // The same taints under nodegate's key; the old ones released.
        let moved = distinct(clash.iter().filter_map(|m| {
            TaintSpec::new(&default_key, m.taint.value(), m.taint.effect())
                .ok()
                .map(|t| format!("--{}={t}", if m.boot { "boot-taint" } else { "taint" }))
        }));
        let old = distinct(clash.iter().map(|m| format!("--release-taint={}", m.taint)));
        format!(
            "either give nodegate its own key, the default {default_key} ({} on the webhook and the agent instead, and {} on the agent so what they added goes, once, by exact value)",
            moved.join(" "),
            old.join(" ")
        )
    };
    let absent = if op.remove_absent && op.removes() {
        format!("; {REMOVE} is absent from {at}, and the operator's default is true")
    } else {
        String::new()
    };
    format!(
        "Cilium's operator owns every taint with key {k} ({does}{absent}), and nodegate manages that key too ({flags}): {effects}; fix: {own_key}, or have the operator leave taints alone: {REMOVE}: \"false\" and {SET}: \"false\" in {at} (Helm: operator.removeNodeTaints=false, operator.setNodeTaints=false and extraConfig.{REMOVE}=\"false\": the chart leaves the key out when it is false, and the operator's default is true)",
        does = does(op),
        flags = flags.join(", "),
        effects = effects.join("; "),
    )
}

async fn pods(client: &Client, ns: &str) -> Pods {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    match api
        .list(&ListParams::default().labels(AGENT_POD_LABEL).limit(1))
        .await
    {
        Ok(l) => match l.items.into_iter().next() {
            Some(p) => Pods::Found(p.metadata.name.unwrap_or_default()),
            None => Pods::None,
        },
        Err(e) => Pods::Unknown(e.to_string()),
    }
}

/// Where Cilium keeps its operator's options.
#[derive(Debug, Clone, Copy)]
pub struct Where<'a> {
    /// The namespace of its ConfigMap and agent pods (`k8s-app=cilium`).
    pub namespace: &'a str,
    /// The ConfigMap its operator reads its options from.
    pub config: &'a str,
}

/// Reads the ConfigMap (and, without it, whether Cilium's pods run), the
/// webhook's and the agent's flags, and reports [`verdict`].
pub async fn check(client: &Client, at: &Where<'_>, installed: &Installed, report: &mut Report) {
    let ns = at.namespace;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let config = match cms.get_opt(at.config).await {
        Ok(Some(cm)) => Config::Data(cm.data.unwrap_or_default()),
        Ok(None) => Config::Missing(pods(client, ns).await),
        Err(e) => Config::Unreadable(e.to_string(), pods(client, ns).await),
    };
    // Unreadable or invalid flags leave that workload out of the verdict.
    let read = |w: &Workload| w.container().and_then(|c| flags(c).ok());
    let webhook = read(&installed.webhook);
    let agent = read(&installed.agent);
    let inputs = Inputs {
        namespace: ns.to_string(),
        name: at.config.to_string(),
        config,
        webhook,
        agent,
    };
    let (status, detail) = verdict(&inputs);
    report.add(CHECK, status, detail);
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegate_shared::keys::LEGACY_TAINT;

    /// nodegate's default taint with `effect`: the boot gate of the
    /// strict-mode component when NoExecute.
    fn with_effect(taint: &str, effect: Effect) -> String {
        let t: TaintSpec = taint.parse().unwrap();
        TaintSpec::new(t.key(), t.value(), effect)
            .unwrap()
            .to_string()
    }

    fn data(pairs: &[(&str, &str)]) -> Config {
        Config::Data(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    /// What `helm install cilium` writes by default (`operator.removeNodeTaints`
    /// true, `setNodeTaints` unset so the same, `setNodeNetworkStatus` true).
    fn helm_defaults() -> Config {
        data(&[
            (KEY, OPERATOR_DEFAULT_KEY),
            (REMOVE, "true"),
            (SET, "true"),
            (IS_UP, "true"),
        ])
    }

    fn flags(taints: &[&str], boot: &[&str], release: &[&str]) -> Flags {
        let mut f = Flags::of(taints, boot);
        f.release = release.iter().map(|s| s.parse().unwrap()).collect();
        f
    }

    /// nodegate as shipped: its own key, the agent releasing the old default.
    fn shipped(config: Config) -> Inputs {
        Inputs {
            namespace: "kube-system".into(),
            name: "cilium-config".into(),
            config,
            webhook: Some(flags(&[DEFAULT_TAINT], &[], &[])),
            agent: Some(flags(&[DEFAULT_TAINT], &[], &[LEGACY_TAINT])),
        }
    }

    /// nodegate configured with `taints` and `boot` on both sides.
    fn configured(config: Config, taints: &[&str], boot: &[&str]) -> Inputs {
        Inputs {
            webhook: Some(flags(taints, boot, &[])),
            agent: Some(flags(taints, boot, &[])),
            ..shipped(config)
        }
    }

    #[test]
    fn parses_booleans_as_go_does() {
        for (v, want) in [
            ("true", Some(true)),
            ("True", Some(true)),
            ("1", Some(true)),
        ] {
            assert_eq!(parse_bool(v), want, "{v}");
        }
        for (v, want) in [
            ("false", Some(false)),
            ("F", Some(false)),
            ("yes", None),
            ("", None),
        ] {
            assert_eq!(parse_bool(v), want, "{v:?}");
        }
        // Absent keys are the operator's defaults.
        let op = operator(&BTreeMap::new()).unwrap();
        assert_eq!(
            op,
            Operator {
                key: OPERATOR_DEFAULT_KEY.into(),
                remove: true,
                remove_absent: true,
                set: false,
                is_up: true,
            }
        );
        assert!(op.removes() && !op.sets());
        // An empty key is the default one; values are trimmed.
        let Config::Data(d) = data(&[(KEY, " "), (REMOVE, " false\n")]) else {
            unreachable!()
        };
        let op = operator(&d).unwrap();
        assert_eq!(op.key, OPERATOR_DEFAULT_KEY);
        assert!(!op.remove && !op.remove_absent);
    }

    type Case = (&'static str, Inputs, Status, Vec<String>);

    /// Each case's verdict has its status and every part of its detail.
    fn assert_cases(cases: Vec<Case>) {
        for (name, inputs, status, want) in cases {
            let (got, detail) = verdict(&inputs);
            assert_eq!(got, status, "{name}: {detail}");
            for w in want {
                assert!(detail.contains(&w), "{name}: {detail:?} lacks {w:?}");
            }
        }
    }

    /// nodegate's own key.
    fn own_key() -> String {
        DEFAULT_TAINT
            .parse::<TaintSpec>()
            .unwrap()
            .key()
            .to_string()
    }

    /// The pass of two keys, two owners.
    fn owns() -> String {
        format!(
            "Cilium's operator owns {OPERATOR_DEFAULT_KEY} (removes it when the node's Cilium pod is Ready, sets it while not); nodegate owns {}; a node takes pods when both are gone",
            own_key()
        )
    }

    /// Which of the two manages which key, by the operator's options and
    /// nodegate's flags.
    #[test]
    fn verdicts_on_who_owns_which_key() {
        let own_key = own_key();
        let gate = crate::container_flags::default_gate();
        let legacy_gate = with_effect(LEGACY_TAINT, Effect::NoExecute);
        let fix_helm = "operator.removeNodeTaints=false, operator.setNodeTaints=false and extraConfig.remove-cilium-node-taints=\"false\"";
        let owns = owns();
        let mut only_webhook = configured(helm_defaults(), &[LEGACY_TAINT], &[]);
        only_webhook.agent = Some(flags(&[DEFAULT_TAINT], &[], &[]));
        assert_cases(vec![

            (
                "Helm defaults, nodegate as shipped",
                shipped(helm_defaults()),
                Status::Pass,
                vec![
                    owns.clone(),
                    format!("the agent's --release-taint={LEGACY_TAINT} removes the taint an older nodegate added, once, when it matches exactly (key, value and effect), and never adds it: the operator's own (empty value) is not touched"),
                ],
            ),
            (
                "Helm defaults, strict mode on nodegate's key",
                configured(helm_defaults(), &[DEFAULT_TAINT], &[&gate]),
                Status::Pass,
                vec![owns.clone()],
            ),
            (
                "operator's defaults without the ConfigMap keys",
                configured(data(&[]), &[DEFAULT_TAINT], &[]),
                Status::Pass,
                vec![format!(
                    "Cilium's operator owns {OPERATOR_DEFAULT_KEY} (removes it when the node's Cilium pod is Ready); nodegate owns {own_key}; a node takes pods"
                )],
            ),
            (
                "nodegate on the operator's key, Helm defaults",
                configured(helm_defaults(), &[LEGACY_TAINT], &[]),
                Status::Fail,
                vec![
                    format!("Cilium's operator owns every taint with key {OPERATOR_DEFAULT_KEY} (removes it when the node's Cilium pod is Ready, sets it while not), and nodegate manages that key too (the webhook's --taint={LEGACY_TAINT}, the agent's --taint={LEGACY_TAINT})"),
                    "a write loop between the operator and the agent".into(),
                    "at re-registration the operator removes nodegate's gate from its stale cache".into(),
                    format!("fix: either give nodegate its own key, the default {own_key} (--taint={DEFAULT_TAINT} on the webhook and the agent instead, and --release-taint={LEGACY_TAINT} on the agent so what they added goes, once, by exact value)"),
                    fix_helm.into(),
                ],
            ),
            (
                "strict mode on the operator's key",
                configured(helm_defaults(), &[DEFAULT_TAINT], &[&legacy_gate]),
                Status::Fail,
                vec![
                    format!("(the webhook's --boot-taint={legacy_gate}, the agent's --boot-taint={legacy_gate})"),
                    format!("in strict mode it removes the boot gate {legacy_gate} too"),
                    format!("(--boot-taint={gate} on the webhook and the agent instead, and --release-taint={legacy_gate} on the agent"),
                ],
            ),
            (
                "only the webhook on the operator's key",
                only_webhook,
                Status::Fail,
                vec![format!("nodegate manages that key too (the webhook's --taint={LEGACY_TAINT})")],
            ),
            (
                "operator removes only, by default (key absent)",
                configured(data(&[(KEY, OPERATOR_DEFAULT_KEY)]), &[LEGACY_TAINT], &[]),
                Status::Fail,
                vec![
                    format!("Cilium's operator owns every taint with key {OPERATOR_DEFAULT_KEY} (removes it when the node's Cilium pod is Ready; remove-cilium-node-taints is absent from kube-system/cilium-config, and the operator's default is true)"),
                    "stale cache".into(),
                ],
            ),
            (
                "operator sets only (its controller runs for the condition)",
                configured(data(&[(REMOVE, "false"), (SET, "true")]), &[LEGACY_TAINT], &[]),
                Status::Fail,
                vec!["(sets it while the node's Cilium pod is not Ready, and never removes it), and nodegate manages".into()],
            ),
            (
                "operator's key moved to nodegate's",
                configured(helm_defaults_with_key(&own_key), &[DEFAULT_TAINT], &[]),
                Status::Fail,
                vec!["fix: give nodegate a key of its own".into()],
            ),
            (
                "operator leaves taints alone, nodegate on its key",
                configured(data(&[(REMOVE, "false"), (SET, "false")]), &[LEGACY_TAINT], &[]),
                Status::Pass,
                vec![format!(
                    "Cilium's operator leaves taints alone (remove-cilium-node-taints and set-cilium-node-taints are false); nodegate owns {OPERATOR_DEFAULT_KEY}"
                )],
            ),
            (
                "set alone does not start the controller",
                configured(data(&[(REMOVE, "false"), (SET, "true"), (IS_UP, "false")]), &[LEGACY_TAINT], &[]),
                Status::Pass,
                vec!["its node-taint controller does not run".into()],
            ),
        ]);
    }

    /// Releases of the operator's own taint, values that are not booleans,
    /// and what cannot be read.
    #[test]
    fn verdicts_on_releases_values_and_reads() {
        let owns = owns();
        let operators_own = format!("{OPERATOR_DEFAULT_KEY}:NoSchedule");
        let mut releases_operators_own = shipped(helm_defaults());
        releases_operators_own.agent = Some(flags(&[DEFAULT_TAINT], &[], &[&operators_own]));
        let mut unknown_flags = shipped(helm_defaults());
        unknown_flags.webhook = None;
        unknown_flags.agent = None;
        let mut agent_unknown = shipped(helm_defaults());
        agent_unknown.agent = None;
        let pod = || Pods::Found("cilium-abcde".into());
        assert_cases(vec![

            (
                "operator sets but never removes",
                shipped(data(&[(REMOVE, "False"), (SET, "1")])),
                Status::Warn,
                vec![format!("once the operator sets {OPERATOR_DEFAULT_KEY} it stays, and the node takes no pods")],
            ),
            (
                "release of the operator's own taint",
                releases_operators_own.clone(),
                Status::Warn,
                vec![format!("--release-taint={operators_own} is the operator's own taint exactly (empty value, NoSchedule)")],
            ),
            (
                "the agent releases the operator's own taint, which the operator does not set",
                Inputs {
                    config: data(&[(REMOVE, "true"), (SET, "false")]),
                    ..releases_operators_own
                },
                Status::Pass,
                vec![format!("--release-taint={operators_own} removes, once, a taint with exactly that empty value (the operator does not set it here, but kubelets registering with it lose it")],
            ),
            (
                "values that are not booleans",
                shipped(data(&[(REMOVE, "yes"), (SET, "")])),
                Status::Fail,
                vec!["ConfigMap kube-system/cilium-config has remove-cilium-node-taints: \"yes\", set-cilium-node-taints: \"\", not booleans (true or false): the operator misreads or refuses them".into()],
            ),
            (
                "one value that is not a boolean",
                shipped(data(&[(IS_UP, "on")])),
                Status::Fail,
                vec!["has set-cilium-is-up-condition: \"on\", not a boolean (true or false): the operator misreads or refuses it, so what it does with taints is unknown; set it to \"true\" or \"false\"".into()],
            ),
            (
                "nodegate's flags unreadable",
                unknown_flags,
                Status::Skip,
                vec!["cannot tell which taint keys nodegate uses".into()],
            ),
            (
                "the agent's flags unreadable: the webhook's decide",
                agent_unknown,
                Status::Pass,
                vec![owns.clone()],
            ),
            (
                "no Cilium",
                shipped(Config::Missing(Pods::None)),
                Status::Pass,
                vec!["Cilium is not installed in kube-system (ConfigMap kube-system/cilium-config not found, no pod k8s-app=cilium)".into()],
            ),
            (
                "Cilium pods without the ConfigMap",
                shipped(Config::Missing(pod())),
                Status::Fail,
                vec!["Cilium runs here (pod kube-system/cilium-abcde), but its ConfigMap kube-system/cilium-config not found: the operator's node-taint settings are unknown, so a fight with nodegate over a taint key cannot be ruled out".into()],
            ),
            (
                "ConfigMap forbidden, Cilium pods",
                shipped(Config::Unreadable("403 Forbidden".into(), pod())),
                Status::Fail,
                vec!["its ConfigMap kube-system/cilium-config cannot be read (403 Forbidden)".into(), "let nodegate-check get that ConfigMap".into()],
            ),
            (
                "ConfigMap forbidden, no Cilium pod",
                shipped(Config::Unreadable("403 Forbidden".into(), Pods::None)),
                Status::Skip,
                vec!["cannot be read (403 Forbidden), and no Cilium pod (k8s-app=cilium) runs in kube-system".into()],
            ),
            (
                "nothing readable",
                shipped(Config::Unreadable("403 Forbidden".into(), Pods::Unknown("403 pods".into()))),
                Status::Warn,
                vec!["the pods of kube-system cannot be listed (403 pods): cannot tell whether".into()],
            ),
            (
                "ConfigMap missing, pods unlistable",
                shipped(Config::Missing(Pods::Unknown("timeout".into()))),
                Status::Warn,
                vec!["ConfigMap kube-system/cilium-config not found, and the pods of kube-system cannot be listed (timeout)".into()],
            ),
        ]);
    }

    fn helm_defaults_with_key(key: &str) -> Config {
        let Config::Data(mut d) = helm_defaults() else {
            unreachable!()
        };
        d.insert(KEY.into(), key.into());
        Config::Data(d)
    }
}
