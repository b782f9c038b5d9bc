//! Taint specs as users write them on the command line: `key[=value]:Effect`.
//!
//! Validation follows Kubernetes' own rules (`ValidateTaint` in
//! `pkg/apis/core/validation`) so that a spec accepted here is never refused
//! by the API server when the webhook or the agent writes it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Key prefix that belongs to Kubernetes' own node lifecycle controller.
/// Reusing it would let the node controller remove our taint.
const RESERVED_PREFIX: &str = "node.kubernetes.io/";

/// The effect of a taint, exactly as the API spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Effect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::NoSchedule => "NoSchedule",
            Effect::PreferNoSchedule => "PreferNoSchedule",
            Effect::NoExecute => "NoExecute",
        }
    }
}

impl FromStr for Effect {
    type Err = TaintError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "NoSchedule" => Ok(Effect::NoSchedule),
            "PreferNoSchedule" => Ok(Effect::PreferNoSchedule),
            "NoExecute" => Ok(Effect::NoExecute),
            other => Err(TaintError::Effect(other.to_owned())),
        }
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a taint spec was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaintError {
    #[error("taint {0:?} has no effect: expected key[=value]:Effect")]
    MissingEffect(String),
    #[error("unknown taint effect {0:?}: expected NoSchedule, PreferNoSchedule or NoExecute")]
    Effect(String),
    #[error("invalid taint key {key:?}: {reason}")]
    Key { key: String, reason: String },
    #[error("invalid taint value {value:?}: {reason}")]
    Value { value: String, reason: String },
    #[error(
        "taint key {0:?} uses the reserved prefix node.kubernetes.io/ (the node controller owns it)"
    )]
    Reserved(String),
    #[error("taint {0} is listed twice (key and effect identify a taint)")]
    Duplicate(String),
    #[error(
        "boot taint {0} must have effect NoExecute: the kubelet checks only NoExecute taints when it admits the pods bound to it"
    )]
    BootEffect(String),
    #[error(
        "release taint {0} has the key and effect of a managed taint: the agent would remove what the webhook adds"
    )]
    ReleaseManaged(String),
}

/// One configured taint. Identity is key + effect, as in the API server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaintSpec {
    key: String,
    value: Option<String>,
    effect: Effect,
}

impl TaintSpec {
    /// Builds a spec after validating each part.
    pub fn new(key: &str, value: Option<&str>, effect: Effect) -> Result<Self, TaintError> {
        validate_key(key)?;
        if let Some(v) = value {
            validate_value(v)?;
        }
        Ok(Self {
            key: key.to_owned(),
            value: value.filter(|v| !v.is_empty()).map(str::to_owned),
            effect,
        })
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn value(&self) -> Option<&str> {
        self.value.as_deref()
    }

    pub fn effect(&self) -> Effect {
        self.effect
    }

    /// True when `taint` (a JSON taint from a Node) has the same key and effect.
    pub fn matches(&self, taint: &Value) -> bool {
        taint.get("key").and_then(Value::as_str) == Some(self.key.as_str())
            && taint.get("effect").and_then(Value::as_str) == Some(self.effect.as_str())
    }

    /// True when `taint` is exactly this one: key, value (absent = empty)
    /// and effect. Releasing a taint another writer may own under the same
    /// key (Cilium's operator adds it with an empty value) must not touch
    /// theirs.
    pub fn matches_exactly(&self, taint: &Value) -> bool {
        self.matches(taint)
            && taint.get("value").and_then(Value::as_str).unwrap_or("")
                == self.value.as_deref().unwrap_or("")
    }

    /// True when some entry of `taints` is this taint.
    pub fn is_in(&self, taints: &[Value]) -> bool {
        taints.iter().any(|t| self.matches(t))
    }

    /// The taint as the API serializes it (`value` omitted when empty).
    pub fn to_json(&self) -> Value {
        match &self.value {
            Some(v) => json!({"key": self.key, "value": v, "effect": self.effect.as_str()}),
            None => json!({"key": self.key, "effect": self.effect.as_str()}),
        }
    }
}

impl fmt::Display for TaintSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}={}:{}", self.key, v, self.effect),
            None => write!(f, "{}:{}", self.key, self.effect),
        }
    }
}

impl FromStr for TaintSpec {
    type Err = TaintError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kv, effect) = s
            .rsplit_once(':')
            .ok_or_else(|| TaintError::MissingEffect(s.to_owned()))?;
        let effect: Effect = effect.parse()?;
        match kv.split_once('=') {
            Some((k, v)) => TaintSpec::new(k, Some(v), effect),
            None => TaintSpec::new(kv, None, effect),
        }
    }
}

/// Checks a list of specs for duplicates (same key and effect).
pub fn check_unique(specs: &[TaintSpec]) -> Result<(), TaintError> {
    for (i, a) in specs.iter().enumerate() {
        if specs[..i]
            .iter()
            .any(|b| a.key == b.key && a.effect == b.effect)
        {
            return Err(TaintError::Duplicate(a.to_string()));
        }
    }
    Ok(())
}

/// Checks the ordinary taints and the boot gate (strict mode) together: no
/// duplicates across both lists, and every boot taint NoExecute, since only
/// that effect stops a kubelet from starting pods already bound to it.
pub fn check_taints(taints: &[TaintSpec], boot: &[TaintSpec]) -> Result<(), TaintError> {
    if let Some(b) = boot.iter().find(|b| b.effect != Effect::NoExecute) {
        return Err(TaintError::BootEffect(b.to_string()));
    }
    let all: Vec<TaintSpec> = taints.iter().chain(boot).cloned().collect();
    check_unique(&all)
}

/// Checks the taints the agent releases (`--release-taint`, removed only,
/// never added) against the ones it manages: one key and effect cannot be
/// both.
pub fn check_release(managed: &[TaintSpec], release: &[TaintSpec]) -> Result<(), TaintError> {
    if let Some(r) = release.iter().find(|r| {
        managed
            .iter()
            .any(|m| m.key == r.key && m.effect == r.effect)
    }) {
        return Err(TaintError::ReleaseManaged(r.to_string()));
    }
    check_unique(release)
}

/// Every gate nodegate ships: each key profile's taint
/// ([`PROFILE_TAINTS`](crate::keys::PROFILE_TAINTS), NoSchedule) and strict
/// mode's NoExecute boot gate under the same key and value.
pub fn shipped_gates() -> Vec<TaintSpec> {
    let profiles: Vec<TaintSpec> = crate::keys::PROFILE_TAINTS
        .iter()
        .filter_map(|t| t.parse().ok())
        .collect();
    let boot_gates: Vec<TaintSpec> = profiles
        .iter()
        .map(|t| TaintSpec {
            effect: Effect::NoExecute,
            ..t.clone()
        })
        .collect();
    profiles.into_iter().chain(boot_gates).collect()
}

/// The shipped gates that stand in for `gate` while a switch of key profile
/// rolls out: for a `NoSchedule` gate, every shipped `NoSchedule` gate (the
/// profiles' keys, exact), `gate` first; for any other gate, `gate` alone.
///
/// During a `helm upgrade --set profile=…` old webhook replicas and agents
/// still add the old key while the new policies and lines are in force.
/// A node carrying either is gated (NoSchedule is NoSchedule), so the
/// backup lines stay silent for it and the confinement lets either
/// configuration's agent and webhook add it; the agent of the new
/// configuration releases the old one once ready ([`release_set`]). Boot
/// gates (NoExecute, strict mode) have no stand-in: each evicts, so each
/// stays confined to its own configuration. This holds while no other
/// component owns a shipped key (`nodegate-check`'s `node readiness
/// controller` line fails a NodeReadinessRule that names one).
pub fn stand_ins(gate: &TaintSpec) -> Vec<TaintSpec> {
    let mut out = vec![gate.clone()];
    if gate.effect == Effect::NoSchedule {
        for s in shipped_gates() {
            if s.effect == Effect::NoSchedule && !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}

/// The taints the agent releases (removes with its ready patch when they
/// match exactly, never adds) under a configuration that holds `held` (its
/// `--taint`s and `--boot-taint`s) and names `explicit` (`--release-taint`):
/// those, then every shipped gate ([`shipped_gates`]) it does not hold.
///
/// Built in rather than listed in each configuration's flags: a switch of
/// key profile, or strict mode turned off, then leaves no stale gate from
/// any other configuration, and the agent and its confinement policy
/// (`nodegate-webhook confinement`) both call this, so they cannot drift.
/// A held gate is left out by key and effect, as [`check_release`] refuses
/// it; an explicit one equal to a built-in one is listed once. Another
/// writer's key (Cilium's) is never built in: it stays opt-in.
pub fn release_set(held: &[TaintSpec], explicit: &[TaintSpec]) -> Vec<TaintSpec> {
    let mut out = explicit.to_vec();
    for gate in shipped_gates() {
        let is_held = held
            .iter()
            .any(|h| h.key == gate.key && h.effect == gate.effect);
        if !is_held && !out.contains(&gate) {
            out.push(gate);
        }
    }
    out
}

/// The command-line flags (`--taint`, `--boot-taint`) that configure
/// `ordinary` and `boot`, as a generated file names the command that made it.
pub fn as_flags(ordinary: &[TaintSpec], boot: &[TaintSpec]) -> String {
    let flags: Vec<String> = ordinary
        .iter()
        .map(|t| format!("--taint={t}"))
        .chain(boot.iter().map(|t| format!("--boot-taint={t}")))
        .collect();
    flags.join(" ")
}

fn key_err(key: &str, reason: impl Into<String>) -> TaintError {
    TaintError::Key {
        key: key.to_owned(),
        reason: reason.into(),
    }
}

/// A qualified name: optional DNS-1123 subdomain prefix and `/`, then a name
/// of at most 63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
fn validate_key(key: &str) -> Result<(), TaintError> {
    if key.starts_with(RESERVED_PREFIX) {
        return Err(TaintError::Reserved(key.to_owned()));
    }
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Err(key_err(key, "prefix part must be non-empty"));
        }
        if p.len() > 253 {
            return Err(key_err(
                key,
                "prefix part must be no more than 253 characters",
            ));
        }
        if !is_dns1123_subdomain(p) {
            return Err(key_err(
                key,
                "prefix part must be a lowercase RFC 1123 subdomain (e.g. example.com)",
            ));
        }
    }
    if name.is_empty() {
        return Err(key_err(key, "name part must be non-empty"));
    }
    if name.len() > 63 {
        return Err(key_err(key, "name part must be no more than 63 characters"));
    }
    if !is_qualified_name_part(name) {
        return Err(key_err(
            key,
            "name part must consist of alphanumerics, '-', '_' or '.', and start and end with an alphanumeric",
        ));
    }
    Ok(())
}

/// A label value: empty, or at most 63 characters with the name-part alphabet.
fn validate_value(value: &str) -> Result<(), TaintError> {
    if value.len() > 63 {
        return Err(TaintError::Value {
            value: value.to_owned(),
            reason: "must be no more than 63 characters".into(),
        });
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        return Err(TaintError::Value {
            value: value.to_owned(),
            reason: "must consist of alphanumerics, '-', '_' or '.', and start and end with an alphanumeric".into(),
        });
    }
    Ok(())
}

fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    let edge_ok = |c: u8| c.is_ascii_alphanumeric();
    match (b.first(), b.last()) {
        (Some(&f), Some(&l)) => {
            edge_ok(f)
                && edge_ok(l)
                && b.iter()
                    .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// A DNS-1123 subdomain (apimachinery `IsDNS1123Subdomain`): at most 253
/// characters of dot-separated labels.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// A DNS-1123 label: at most 63 lowercase alphanumerics or `-`, starting and
/// ending alphanumeric (Service and Namespace names, subdomain parts).
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_matches_exactly_and_never_a_managed_taint() {
        let legacy: TaintSpec = "node.cilium.io/agent-not-ready=true:NoSchedule"
            .parse()
            .unwrap();
        // Cilium's operator adds the key with an empty value: not ours to release.
        let operators = json!({"key": "node.cilium.io/agent-not-ready", "effect": "NoSchedule"});
        let ours = json!({"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoSchedule"});
        let other_effect = json!({"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoExecute"});
        assert!(legacy.matches(&operators), "key and effect alone match");
        assert!(!legacy.matches_exactly(&operators));
        assert!(legacy.matches_exactly(&ours));
        assert!(!legacy.matches_exactly(&other_effect));
        let managed: Vec<TaintSpec> = vec![
            "nodegate.dev/agent-not-ready=true:NoSchedule"
                .parse()
                .unwrap(),
        ];
        assert!(check_release(&managed, std::slice::from_ref(&legacy)).is_ok());
        let clash: TaintSpec = "nodegate.dev/agent-not-ready=other:NoSchedule"
            .parse()
            .unwrap();
        assert!(matches!(
            check_release(&managed, &[clash]),
            Err(TaintError::ReleaseManaged(_))
        ));
        assert!(check_release(&managed, &[legacy.clone(), legacy]).is_err());
    }

    #[test]
    fn every_shipped_gate_parses_in_both_effects() {
        use crate::keys::PROFILE_TAINTS;
        let gates = shipped_gates();
        assert_eq!(gates.len(), 2 * PROFILE_TAINTS.len());
        for (i, t) in PROFILE_TAINTS.iter().enumerate() {
            assert_eq!(gates[i].to_string(), *t);
            let boot = &gates[PROFILE_TAINTS.len() + i];
            assert_eq!(
                (boot.key(), boot.value(), boot.effect()),
                (gates[i].key(), gates[i].value(), Effect::NoExecute)
            );
        }
        assert!(check_unique(&gates).is_ok());
    }

    /// Every shipped gate the configuration does not hold (by key and
    /// effect) is released, after the explicit ones, each once, and never
    /// one that `check_release` refuses against what is held.
    #[test]
    fn a_no_schedule_gate_stands_in_for_another_a_boot_gate_for_none() {
        use crate::keys::{DEFAULT_TAINT, PROFILE_TAINTS};
        let spec = |s: &str| s.parse::<TaintSpec>().unwrap();
        let default = spec(DEFAULT_TAINT);
        let ins = stand_ins(&default);
        assert_eq!(ins[0], default);
        assert_eq!(ins.len(), PROFILE_TAINTS.len());
        for t in PROFILE_TAINTS {
            assert!(ins.contains(&spec(t)), "{t}");
        }
        let custom = spec("example.com/gate=x:NoSchedule");
        let ins = stand_ins(&custom);
        assert_eq!(ins[0], custom);
        assert_eq!(ins.len(), PROFILE_TAINTS.len() + 1);
        let boot = spec("nodegate.dev/agent-not-ready=true:NoExecute");
        assert_eq!(stand_ins(&boot), vec![boot]);
    }

    #[test]
    fn the_release_set_is_every_shipped_gate_not_held() {
        let spec = |s: &str| s.parse::<TaintSpec>().unwrap();
        let shown = |v: Vec<TaintSpec>| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        let default = spec(crate::keys::DEFAULT_TAINT);
        let boot = spec("nodegate.dev/agent-not-ready=true:NoExecute");
        let karpenter = spec(crate::keys::KARPENTER_PROFILE_TAINT);
        let legacy = spec(crate::keys::LEGACY_TAINT);
        let released = release_set(std::slice::from_ref(&default), &[]);
        assert_eq!(
            shown(released.clone()),
            [
                "startup-taint.cluster-autoscaler.kubernetes.io/nodegate-agent-not-ready=true:NoSchedule",
                "readiness.k8s.io/nodegate-agent-not-ready=true:NoSchedule",
                "nodegate.dev/agent-not-ready=true:NoExecute",
                "startup-taint.cluster-autoscaler.kubernetes.io/nodegate-agent-not-ready=true:NoExecute",
                "readiness.k8s.io/nodegate-agent-not-ready=true:NoExecute",
            ]
        );
        assert!(check_release(std::slice::from_ref(&default), &released).is_ok());
        // Strict mode holds its boot gate; a held key with another value is
        // still held (identity is key and effect).
        let other_value = spec("nodegate.dev/agent-not-ready=x:NoSchedule");
        let strict = release_set(&[other_value, boot.clone()], &[]);
        assert!(!strict.iter().any(|r| r.key() == default.key()));
        assert_eq!(strict.len(), 4);
        // An explicit release comes first and is listed once.
        let profile = release_set(
            std::slice::from_ref(&karpenter),
            &[default.clone(), legacy.clone()],
        );
        assert_eq!(profile[..2], [default.clone(), legacy.clone()]);
        assert_eq!(profile.iter().filter(|r| **r == default).count(), 1);
        assert!(profile.contains(&boot) && !profile.contains(&karpenter));
        assert!(check_release(&[karpenter], &profile).is_ok());
        // A gate of nobody else's: every shipped one is released.
        let custom = release_set(&[spec("example.com/gate:NoSchedule")], &[]);
        assert_eq!(custom, shipped_gates());
    }

    #[test]
    fn parses_the_old_default_taint() {
        let t: TaintSpec = "node.cilium.io/agent-not-ready=true:NoSchedule"
            .parse()
            .unwrap();
        assert_eq!(t.key(), "node.cilium.io/agent-not-ready");
        assert_eq!(t.value(), Some("true"));
        assert_eq!(t.effect(), Effect::NoSchedule);
        assert_eq!(
            t.to_string(),
            "node.cilium.io/agent-not-ready=true:NoSchedule"
        );
        assert_eq!(
            t.to_json(),
            json!({"key":"node.cilium.io/agent-not-ready","value":"true","effect":"NoSchedule"})
        );
    }

    #[test]
    fn value_is_optional_and_empty_value_is_omitted() {
        let t: TaintSpec = "example.com/gate:NoExecute".parse().unwrap();
        assert_eq!(t.value(), None);
        assert_eq!(
            t.to_json(),
            json!({"key":"example.com/gate","effect":"NoExecute"})
        );
        let t: TaintSpec = "gate=:PreferNoSchedule".parse().unwrap();
        assert_eq!(t.value(), None);
    }

    #[test]
    fn rejects_bad_specs_with_reason() {
        let cases = [
            ("no-effect", "has no effect"),
            ("k=v:Sometimes", "unknown taint effect"),
            ("Bad_Prefix.com/k:NoSchedule", "prefix part"),
            ("/k:NoSchedule", "prefix part must be non-empty"),
            ("example.com/:NoSchedule", "name part must be non-empty"),
            ("-k:NoSchedule", "start and end"),
            (&format!("{}:NoSchedule", "k".repeat(64)), "63"),
            (&format!("k={}:NoSchedule", "v".repeat(64)), "63"),
            ("k=a b:NoSchedule", "alphanumerics"),
            ("node.kubernetes.io/not-ready:NoSchedule", "reserved prefix"),
        ];
        for (input, want) in cases {
            let err = input.parse::<TaintSpec>().unwrap_err().to_string();
            assert!(err.contains(want), "{input}: {err} should mention {want}");
        }
    }

    #[test]
    fn identity_is_key_and_effect() {
        let t: TaintSpec = "a/b=x:NoSchedule".parse().unwrap();
        assert!(t.matches(&json!({"key":"a/b","value":"other","effect":"NoSchedule"})));
        assert!(!t.matches(&json!({"key":"a/b","value":"x","effect":"NoExecute"})));
        let dup = vec![t.clone(), "a/b:NoSchedule".parse().unwrap()];
        assert!(matches!(check_unique(&dup), Err(TaintError::Duplicate(_))));
        let ok = vec![t, "a/b:NoExecute".parse().unwrap()];
        assert!(check_unique(&ok).is_ok());
    }

    #[test]
    fn boot_taints_are_noexecute_and_distinct_from_the_ordinary_ones() {
        let ordinary: Vec<TaintSpec> = vec!["a/b=true:NoSchedule".parse().unwrap()];
        let gate: Vec<TaintSpec> = vec!["a/b=true:NoExecute".parse().unwrap()];
        assert!(check_taints(&ordinary, &gate).is_ok());
        assert!(check_taints(&ordinary, &[]).is_ok());
        let err = check_taints(&ordinary, &ordinary).unwrap_err();
        assert!(matches!(err, TaintError::BootEffect(_)), "{err}");
        assert!(err.to_string().contains("must have effect NoExecute"));
        let err = check_taints(&gate, &gate).unwrap_err();
        assert!(matches!(err, TaintError::Duplicate(_)), "{err}");
    }
}
