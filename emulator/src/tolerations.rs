//! Whether a pod's tolerations tolerate a node's taints.
//!
//! Upstream: `k8s.io/api/core/v1/toleration.go` (`Toleration.ToleratesTaint`,
//! `compareNumericValues`), `k8s.io/apimachinery/pkg/api/validate/content`
//! (`IsDecimalInteger`), `k8s.io/component-helpers/scheduling/corev1/helpers.go`
//! (`TolerationsTolerateTaint`, `FindMatchingUntoleratedTaint`) and
//! `pkg/apis/core/v1/helper/helpers.go` (`GetMatchingTolerations`).

use k8s_openapi::api::core::v1::{Taint, Toleration};

/// The `TaintTolerationComparisonOperators` feature gate (`Lt`/`Gt`): alpha
/// and off by default in v1.36 (`pkg/features/kube_features.go`), so a
/// default cluster never matches a toleration using them.
pub const COMPARISON_OPERATORS_DEFAULT: bool = false;

pub const NO_EXECUTE: &str = "NoExecute";

/// `Toleration.ToleratesTaint`.
pub fn tolerates(t: &Toleration, taint: &Taint, comparison_operators: bool) -> bool {
    let effect = t.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = t.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    let value = t.value.as_deref().unwrap_or_default();
    let taint_value = taint.value.as_deref().unwrap_or_default();
    match t.operator.as_deref().unwrap_or_default() {
        // An empty operator means Equal (no defaulting: tolerations are not
        // defaulted where this runs).
        "" | "Equal" => value == taint_value,
        "Exists" => true,
        op @ ("Lt" | "Gt") => comparison_operators && compare_numeric(value, taint_value, op),
        _ => false,
    }
}

/// `compareNumericValues`: both values must be canonical decimal integers.
fn compare_numeric(toleration: &str, taint: &str, op: &str) -> bool {
    let (Some(t), Some(n)) = (decimal_integer(toleration), decimal_integer(taint)) else {
        return false;
    };
    match op {
        "Lt" => n < t,
        "Gt" => n > t,
        _ => false,
    }
}

/// `IsDecimalInteger` then `strconv.ParseInt`: an optional `-`, no leading
/// zeros (only `0` itself), no `+`, within i64.
fn decimal_integer(s: &str) -> Option<i64> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let canonical = match digits.as_bytes() {
        [] => false,
        [b'0'] => !s.starts_with('-'),
        [first, rest @ ..] => {
            (b'1'..=b'9').contains(first) && rest.iter().all(|c| c.is_ascii_digit())
        }
    };
    if !canonical {
        return None;
    }
    s.parse().ok()
}

/// `TolerationsTolerateTaint`: any toleration tolerates the taint.
pub fn any_tolerates(
    tolerations: &[Toleration],
    taint: &Taint,
    comparison_operators: bool,
) -> bool {
    tolerations
        .iter()
        .any(|t| tolerates(t, taint, comparison_operators))
}

/// `FindMatchingUntoleratedTaint`: the first taint passing `filter` that no
/// toleration tolerates.
pub fn first_untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    filter: impl Fn(&Taint) -> bool,
    comparison_operators: bool,
) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| filter(t))
        .find(|t| !any_tolerates(tolerations, t, comparison_operators))
}

/// `GetMatchingTolerations`: if every taint is tolerated, for each taint the
/// *first* toleration that tolerates it (so later, longer or forever ones
/// for the same taint do not count); `None` if one is not tolerated.
pub fn matching_tolerations<'a>(
    taints: &[Taint],
    tolerations: &'a [Toleration],
    comparison_operators: bool,
) -> Option<Vec<&'a Toleration>> {
    taints
        .iter()
        .map(|taint| {
            tolerations
                .iter()
                .find(|t| tolerates(t, taint, comparison_operators))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: (!value.is_empty()).then(|| value.into()),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn tol(v: serde_json::Value) -> Toleration {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn toleration_matching_follows_tolerates_taint() {
        let gate = taint("nodegate.dev/agent-not-ready", "true", NO_EXECUTE);
        // (toleration, tolerates the NoExecute gate with comparison operators off)
        let table = [
            (json!({"operator": "Exists"}), true),
            (json!({}), false), // empty key + Equal: value "" != "true"
            (json!({"value": "true"}), true), // empty key matches every key
            (json!({"operator": "Exists", "effect": "NoSchedule"}), false),
            (json!({"operator": "Exists", "effect": "NoExecute"}), true),
            (
                json!({"key": "nodegate.dev/agent-not-ready", "operator": "Exists"}),
                true,
            ),
            (
                json!({"key": "nodegate.dev/agent-not-ready", "value": "true"}),
                true,
            ),
            (
                json!({"key": "nodegate.dev/agent-not-ready", "operator": "Equal", "value": "true", "effect": "NoExecute"}),
                true,
            ),
            (
                json!({"key": "nodegate.dev/agent-not-ready", "operator": "Equal", "value": "false"}),
                false,
            ),
            (
                json!({"key": "nodegate.dev/agent-not-ready", "operator": "Equal"}),
                false,
            ),
            (json!({"key": "other", "operator": "Exists"}), false),
            (
                json!({"key": "nodegate.dev/agent-not-ready", "operator": "Gt", "value": "0"}),
                false,
            ),
            (
                json!({"key": "nodegate.dev/agent-not-ready", "operator": "Bogus"}),
                false,
            ),
        ];
        for (t, want) in table {
            assert_eq!(tolerates(&tol(t.clone()), &gate, false), want, "{t}");
        }
    }

    #[test]
    fn comparison_operators_need_the_gate_and_canonical_integers() {
        let t = |op: &str, v: &str| tol(json!({"key": "k", "operator": op, "value": v}));
        let n = |v: &str| taint("k", v, NO_EXECUTE);
        // (toleration, taint value, tolerated with the gate on)
        let table = [
            (t("Gt", "5"), "6", true),
            (t("Gt", "5"), "5", false),
            (t("Lt", "5"), "4", true),
            (t("Lt", "5"), "-7", true),
            (t("Lt", "0"), "-1", true),
            (t("Gt", "5"), "06", false), // leading zero: not an integer
            (t("Gt", "5"), "+6", false),
            (t("Gt", "-0"), "1", false), // "-0" is refused
            (t("Gt", "5"), "", false),
            (t("Gt", "5"), "99999999999999999999", false), // beyond i64
        ];
        for (tol, value, want) in table {
            assert_eq!(tolerates(&tol, &n(value), true), want, "{tol:?} vs {value}");
            assert!(!tolerates(&tol, &n(value), false), "gate off never matches");
        }
    }

    #[test]
    fn first_untolerated_only_looks_at_filtered_taints() {
        let taints = [
            taint("node.kubernetes.io/not-ready", "", "NoSchedule"),
            taint("nodegate", "true", "NoSchedule"),
            taint("gate", "true", NO_EXECUTE),
        ];
        let no_execute = |t: &Taint| t.effect == NO_EXECUTE;
        assert_eq!(
            first_untolerated(&taints, &[], no_execute, false).map(|t| t.key.as_str()),
            Some("gate")
        );
        let tolerating = [tol(json!({"key": "gate", "operator": "Exists"}))];
        assert!(first_untolerated(&taints, &tolerating, no_execute, false).is_none());
        // Without the filter the NoSchedule taints count too.
        assert_eq!(
            first_untolerated(&taints, &tolerating, |_| true, false).map(|t| t.key.as_str()),
            Some("node.kubernetes.io/not-ready")
        );
    }

    #[test]
    fn matching_tolerations_takes_the_first_match_per_taint() {
        let taints = [taint("a", "", NO_EXECUTE), taint("b", "", NO_EXECUTE)];
        let tols = [
            tol(json!({"key": "a", "operator": "Exists", "tolerationSeconds": 30})),
            tol(json!({"operator": "Exists"})),
            tol(json!({"key": "b", "operator": "Exists", "tolerationSeconds": 5})),
        ];
        let used = matching_tolerations(&taints, &tols, false).unwrap();
        assert_eq!(used.len(), 2);
        assert_eq!(used[0].toleration_seconds, Some(30));
        // "b" is tolerated first by the catch-all (no seconds), not by the 5 s one.
        assert_eq!(used[1].toleration_seconds, None);
        assert!(matching_tolerations(&taints, &tols[..1], false).is_none());
        assert_eq!(
            matching_tolerations(&[], &[], false).map(|v| v.len()),
            Some(0)
        );
    }
}
