//! The gates declaration: every taint nodegate holds a node under, what opens
//! each, and the ones another component opens. One file (YAML or JSON), the
//! one home of the idea: `nodegate-webhook gates-component` derives every
//! flag, policy and admission line from it, the agent takes it whole
//! (`--gates`), and `nodegate-check` reads it back from the agent's
//! DaemonSet. docs/gates.md.
//!
//! ```yaml
//! gates:
//!   - name: cni
//!     taint: nodegate.dev/agent-not-ready=true:NoSchedule
//!     probes:
//!       http: [http://127.0.0.1:9879/healthz]
//!   - name: ebs-csi
//!     taint: ebs.csi.aws.com/agent-not-ready:NoExecute
//!     owner: {daemonSet: kube-system/ebs-csi-node}
//! bootTaints: []
//! ```

use serde::{Deserialize, Serialize};

use crate::taint::{
    Effect, TaintError, TaintSpec, check_taints, check_unique, is_dns1123_label, shipped_gates,
};

/// A shipped gate's key and effect: nodegate's agents release those.
fn is_shipped(t: &TaintSpec) -> bool {
    shipped_gates()
        .iter()
        .any(|s| s.key() == t.key() && s.effect() == t.effect())
}

/// The whole declaration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gates {
    pub gates: Vec<Gate>,
    /// Strict mode's boot gates (`NoExecute`): added with the gates on a new
    /// node or a new boot, removed once every gate nodegate opens is open.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub boot_taints: Vec<Taint>,
}

/// One gate: a taint, and either the probes that open it (nodegate's) or
/// the component that removes it (owned elsewhere).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gate {
    /// A DNS label: the gate in logs, Events, metrics and the check.
    pub name: String,
    pub taint: Taint,
    /// What must pass on the node before nodegate removes the taint.
    #[serde(default, skip_serializing_if = "Probes::is_empty")]
    pub probes: Probes,
    /// Set when another component removes the taint: nodegate adds it at
    /// create and at every new boot, and never removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
}

/// A taint as `key[=value]:Effect`, checked when read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Taint(pub TaintSpec);

impl TryFrom<String> for Taint {
    type Error = TaintError;
    fn try_from(s: String) -> Result<Self, TaintError> {
        s.parse().map(Taint)
    }
}

impl From<Taint> for String {
    fn from(t: Taint) -> String {
        t.0.to_string()
    }
}

/// The agent's probe kinds, each as its `--probe-*` flag takes it. All of a
/// gate's probes must pass in one round.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probes {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tcp: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub file: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exec: Vec<String>,
    /// `NAMESPACE/LABEL_SELECTOR`: a Ready Pod on this node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod: Vec<String>,
}

impl Probes {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.http.len() + self.tcp.len() + self.file.len() + self.exec.len() + self.pod.len()
    }
}

/// Who removes a gate owned elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Owner {
    /// `NAMESPACE/NAME` of the DaemonSet whose pods remove the taint
    /// (`nodegate-check` looks for it on the gated nodes).
    pub daemon_set: String,
}

impl Owner {
    /// The DaemonSet's namespace and name.
    pub fn daemon_set(&self) -> Option<(&str, &str)> {
        self.daemon_set
            .split_once('/')
            .filter(|(ns, n)| is_dns1123_label(ns) && !n.is_empty())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GatesError {
    #[error("the gates declaration: {0}")]
    Parse(String),
    #[error("the gates declaration names no gate nodegate opens (one with probes)")]
    NoGate,
    #[error("gate {0:?}: the name must be a DNS label")]
    Name(String),
    #[error("gate name {0:?} is used twice")]
    DuplicateName(String),
    #[error(
        "gate {0:?}: give either probes (nodegate opens it) or an owner (another component does), not both"
    )]
    ProbesAndOwner(String),
    #[error("gate {0:?}: no probes and no owner: nothing would ever open it")]
    NeitherProbesNorOwner(String),
    #[error("gate {0:?}: owner.daemonSet {1:?} is not NAMESPACE/NAME")]
    Owner(String, String),
    #[error(
        "gate {0:?}: a gate nodegate opens must be NoSchedule (strict mode's NoExecute gate is bootTaints)"
    )]
    Effect(String),
    #[error(
        "gate {0:?}: {1} is a gate nodegate ships: nodegate's agents release it, so it cannot be owned elsewhere"
    )]
    Shipped(String, String),
    #[error(transparent)]
    Taint(#[from] TaintError),
}

impl Gates {
    /// Reads a declaration (YAML, of which JSON is a subset) and checks it.
    pub fn parse(text: &str) -> Result<Self, GatesError> {
        let gates: Gates =
            serde_yaml::from_str(text).map_err(|e| GatesError::Parse(e.to_string()))?;
        gates.validate()?;
        Ok(gates)
    }

    /// The one-line JSON the agent's `--gates` flag carries.
    pub fn to_flag(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Names are DNS labels and unique; each gate is opened by probes or by
    /// an owner, not both; nodegate's gates are NoSchedule; no two taints
    /// share a key and effect; at least one gate is nodegate's.
    pub fn validate(&self) -> Result<(), GatesError> {
        let mut names = std::collections::HashSet::new();
        for g in &self.gates {
            if !is_dns1123_label(&g.name) {
                return Err(GatesError::Name(g.name.clone()));
            }
            if !names.insert(g.name.as_str()) {
                return Err(GatesError::DuplicateName(g.name.clone()));
            }
            match (&g.owner, g.probes.is_empty()) {
                (Some(_), false) => return Err(GatesError::ProbesAndOwner(g.name.clone())),
                (None, true) => return Err(GatesError::NeitherProbesNorOwner(g.name.clone())),
                (Some(o), true) if o.daemon_set().is_none() => {
                    return Err(GatesError::Owner(g.name.clone(), o.daemon_set.clone()));
                }
                (None, false) if g.taint.0.effect() != Effect::NoSchedule => {
                    return Err(GatesError::Effect(g.name.clone()));
                }
                (Some(_), true) if is_shipped(&g.taint.0) => {
                    return Err(GatesError::Shipped(g.name.clone(), g.taint.0.to_string()));
                }
                _ => {}
            }
        }
        if self.opened().next().is_none() {
            return Err(GatesError::NoGate);
        }
        check_taints(&self.taints(), &self.boot_taints())?;
        let mut all = self.taints();
        all.extend(self.owned_taints());
        all.extend(self.boot_taints());
        check_unique(&all)?;
        Ok(())
    }

    /// The gates nodegate opens, in order.
    pub fn opened(&self) -> impl Iterator<Item = &Gate> {
        self.gates.iter().filter(|g| g.owner.is_none())
    }

    /// The gates another component opens, in order.
    pub fn owned(&self) -> impl Iterator<Item = &Gate> {
        self.gates.iter().filter(|g| g.owner.is_some())
    }

    /// The taints of the gates nodegate opens: the webhook's `--taint`s.
    pub fn taints(&self) -> Vec<TaintSpec> {
        self.opened().map(|g| g.taint.0.clone()).collect()
    }

    /// The taints of the gates owned elsewhere: the webhook's `--owned-taint`s.
    pub fn owned_taints(&self) -> Vec<TaintSpec> {
        self.owned().map(|g| g.taint.0.clone()).collect()
    }

    /// Strict mode's boot gates: the webhook's and agent's `--boot-taint`s.
    pub fn boot_taints(&self) -> Vec<TaintSpec> {
        self.boot_taints.iter().map(|t| t.0.clone()).collect()
    }

    /// The gate `taint` belongs to (by key and effect).
    pub fn gate_of(&self, taint: &serde_json::Value) -> Option<&Gate> {
        self.gates.iter().find(|g| g.taint.0.matches(taint))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CILIUM_EBS: &str = r#"
gates:
  - name: cni
    taint: nodegate.dev/agent-not-ready=true:NoSchedule
    probes:
      http: [http://127.0.0.1:9879/healthz]
      file: [/host/etc/cni/net.d/05-cilium.conflist]
  - name: ebs-csi
    taint: ebs.csi.aws.com/agent-not-ready:NoExecute
    owner: {daemonSet: kube-system/ebs-csi-node}
"#;

    #[test]
    fn a_declaration_splits_into_what_nodegate_opens_and_what_others_do() {
        let g = Gates::parse(CILIUM_EBS).unwrap();
        assert_eq!(
            g.taints(),
            vec![
                "nodegate.dev/agent-not-ready=true:NoSchedule"
                    .parse()
                    .unwrap()
            ]
        );
        assert_eq!(
            g.owned_taints(),
            vec!["ebs.csi.aws.com/agent-not-ready:NoExecute".parse().unwrap()]
        );
        assert_eq!(g.opened().next().unwrap().probes.len(), 2);
        assert_eq!(
            g.owned()
                .next()
                .unwrap()
                .owner
                .as_ref()
                .unwrap()
                .daemon_set(),
            Some(("kube-system", "ebs-csi-node"))
        );
        // The flag round-trips.
        assert_eq!(Gates::parse(&g.to_flag()).unwrap(), g);
    }

    #[test]
    fn a_declaration_that_cannot_work_is_refused_with_the_gate_named() {
        let cases = [
            ("gates: []", "no gate nodegate opens"),
            (
                "gates: [{name: a, taint: 'a.dev/x:NoSchedule', owner: {daemonSet: ns/d}}]",
                "no gate nodegate opens",
            ),
            (
                "gates: [{name: A_, taint: 'a.dev/x:NoSchedule', probes: {tcp: ['h:1']}}]",
                "DNS label",
            ),
            (
                "gates: [{name: a, taint: 'a.dev/x:NoSchedule'}]",
                "nothing would ever open it",
            ),
            (
                "gates: [{name: a, taint: 'a.dev/x:NoSchedule', probes: {tcp: ['h:1']}, owner: {daemonSet: ns/d}}]",
                "not both",
            ),
            (
                "gates: [{name: a, taint: 'a.dev/x:NoExecute', probes: {tcp: ['h:1']}}]",
                "must be NoSchedule",
            ),
            (
                "gates: [{name: a, taint: 'a.dev/x:NoSchedule', probes: {tcp: ['h:1']}}, {name: a, taint: 'b.dev/x:NoSchedule', probes: {tcp: ['h:1']}}]",
                "used twice",
            ),
            (
                "gates: [{name: a, taint: 'a.dev/x:NoSchedule', probes: {tcp: ['h:1']}}, {name: b, taint: 'a.dev/x=y:NoSchedule', owner: {daemonSet: ns/d}}]",
                "a.dev/x",
            ),
            (
                "gates: [{name: a, taint: 'a.dev/x:NoSchedule', probes: {tcp: ['h:1']}}, {name: b, taint: 'b.dev/x:NoSchedule', owner: {daemonSet: nope}}]",
                "NAMESPACE/NAME",
            ),
            (
                "gates: [{name: a, taint: 'a.dev/x:NoSchedule', probes: {tcpp: ['h:1']}}]",
                "tcpp",
            ),
            ("gates: [{name: a, taint: 'no effect'}]", "declaration"),
            (
                "gates: [{name: a, taint: 'a.dev/x:NoSchedule', probes: {tcp: ['h:1']}}, {name: b, taint: 'readiness.k8s.io/nodegate-agent-not-ready:NoSchedule', owner: {daemonSet: ns/d}}]",
                "a gate nodegate ships",
            ),
        ];
        for (text, want) in cases {
            let err = Gates::parse(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}
