//! Karpenter's taint helpers.
//!
//! Upstream: `pkg/scheduling/taints.go` — `KnownEphemeralTaints`,
//! `KnownEphemeralTaintKeyPrefixes`, `IsKnownEphemeralTaint`,
//! `Taints.Tolerates`, `Taints.Merge`; `pkg/apis/v1/taints.go`
//! `UnregisteredNoExecuteTaint`; `k8s.io/api/core/v1` `Taint.MatchTaint`
//! and `Toleration.ToleratesTaint`.

use k8s_openapi::api::core::v1::{Taint, Toleration};
use nodegate_emulator::tolerations;

use super::version::Version;

pub const UNREGISTERED_KEY: &str = "karpenter.sh/unregistered";
pub const NOT_READY_KEY: &str = "node.kubernetes.io/not-ready";
pub const UNREACHABLE_KEY: &str = "node.kubernetes.io/unreachable";
/// `cloudproviderapi.TaintExternalCloudProvider`.
pub const EXTERNAL_CLOUD_PROVIDER_KEY: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// Node Readiness Controller's domain.
pub const READINESS_PREFIX: &str = "readiness.k8s.io/";

pub const NO_SCHEDULE: &str = "NoSchedule";
pub const NO_EXECUTE: &str = "NoExecute";

/// A taint as the API holds it (`value` absent when empty).
pub fn taint(key: &str, value: &str, effect: &str) -> Taint {
    Taint {
        key: key.to_string(),
        value: (!value.is_empty()).then(|| value.to_string()),
        effect: effect.to_string(),
        time_added: None,
    }
}

/// `UnregisteredNoExecuteTaint`: what Karpenter's nodes register with and
/// registration removes.
pub fn unregistered() -> Taint {
    taint(UNREGISTERED_KEY, "", NO_EXECUTE)
}

/// `Taint.MatchTaint`: key and effect; the value is ignored.
pub fn match_taint(a: &Taint, b: &Taint) -> bool {
    a.key == b.key && a.effect == b.effect
}

/// `KnownEphemeralTaints` of release `v`.
pub fn known_ephemeral_taints(v: Version) -> Vec<Taint> {
    let mut out = vec![taint(NOT_READY_KEY, "", NO_SCHEDULE)];
    if v >= Version::NOT_READY_NO_EXECUTE {
        out.push(taint(NOT_READY_KEY, "", NO_EXECUTE));
    }
    out.extend([
        taint(UNREACHABLE_KEY, "", NO_SCHEDULE),
        taint(EXTERNAL_CLOUD_PROVIDER_KEY, "true", NO_SCHEDULE),
        unregistered(),
    ]);
    out
}

/// `KnownEphemeralTaintKeyPrefixes` of release `v`.
pub fn known_ephemeral_key_prefixes(v: Version) -> &'static [&'static str] {
    if v >= Version::READINESS_PREFIX {
        &[READINESS_PREFIX]
    } else {
        &[]
    }
}

/// `IsKnownEphemeralTaint`: one of the list by `MatchTaint` (its comment
/// says key, value and effect, but `MatchTaint` ignores the value), or a
/// key under a known prefix, whatever the effect.
pub fn is_known_ephemeral_taint(t: &Taint, v: Version) -> bool {
    known_ephemeral_taints(v).iter().any(|k| match_taint(k, t))
        || known_ephemeral_key_prefixes(v)
            .iter()
            .any(|p| t.key.starts_with(p))
}

/// `Taints.Tolerates`: every taint that no toleration tolerates, of any
/// effect (PreferNoSchedule too), as upstream collects them into one error.
/// Karpenter calls `ToleratesTaint` with comparison operators enabled.
pub fn untolerated<'a>(taints: &'a [Taint], tolerations: &[Toleration]) -> Vec<&'a Taint> {
    taints
        .iter()
        .filter(|t| !tolerations::any_tolerates(tolerations, t, true))
        .collect()
}

/// The first of [`untolerated`].
pub fn first_untolerated<'a>(taints: &'a [Taint], tolerations: &[Toleration]) -> Option<&'a Taint> {
    taints
        .iter()
        .find(|t| !tolerations::any_tolerates(tolerations, t, true))
}

/// `Taints.Merge`: `ts` plus each taint of `with` that no taint of the
/// result matches (key and effect), in order.
pub fn merge(ts: &[Taint], with: &[Taint]) -> Vec<Taint> {
    let mut out = ts.to_vec();
    for t in with {
        if !out.iter().any(|o| match_taint(t, o)) {
            out.push(t.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ephemeral_taints_by_release() {
        let v12 = Version::new(1, 12, 0);
        let v13 = Version::READINESS_PREFIX;
        let gate = taint("nodegate.dev/agent-not-ready", "true", NO_SCHEDULE);
        let readiness = taint("readiness.k8s.io/network", "x", NO_EXECUTE);
        let not_ready_exec = taint(NOT_READY_KEY, "", NO_EXECUTE);
        // The value does not matter (MatchTaint), the effect does.
        assert!(is_known_ephemeral_taint(
            &taint(EXTERNAL_CLOUD_PROVIDER_KEY, "", NO_SCHEDULE),
            v12
        ));
        assert!(!is_known_ephemeral_taint(
            &taint(UNREACHABLE_KEY, "", NO_EXECUTE),
            v13
        ));
        assert!(is_known_ephemeral_taint(&unregistered(), v12));
        assert!(!is_known_ephemeral_taint(&gate, v13));
        assert!(!is_known_ephemeral_taint(&readiness, v12));
        assert!(is_known_ephemeral_taint(&readiness, v13));
        assert!(is_known_ephemeral_taint(&not_ready_exec, v12));
        assert!(!is_known_ephemeral_taint(
            &not_ready_exec,
            Version::new(1, 6, 3)
        ));
    }

    #[test]
    fn merge_keeps_existing_values() {
        let ts = vec![taint("a", "1", NO_SCHEDULE)];
        let with = vec![taint("a", "2", NO_SCHEDULE), taint("a", "2", NO_EXECUTE)];
        let merged = merge(&ts, &with);
        assert_eq!(merged, vec![ts[0].clone(), with[1].clone()]);
    }

    #[test]
    fn tolerates_every_effect() {
        let pref = taint("p", "", "PreferNoSchedule");
        assert_eq!(
            first_untolerated(std::slice::from_ref(&pref), &[]),
            Some(&pref)
        );
        let exists = Toleration {
            key: Some("p".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        };
        let other = taint("q", "", NO_SCHEDULE);
        let both = [pref.clone(), other.clone()];
        assert_eq!(untolerated(&both, &[]), vec![&pref, &other]);
        assert_eq!(
            untolerated(&both, std::slice::from_ref(&exists)),
            vec![&other]
        );
        assert_eq!(first_untolerated(&[pref], &[exists]), None);
    }
}
