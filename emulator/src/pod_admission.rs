//! The kubelet's admission of a pod bound to its node, as far as taints go:
//! only `NoExecute` taints count (`NoSchedule` ones stop the scheduler, not
//! pods already bound).
//!
//! Upstream (kubernetes v1.36):
//! - `pkg/kubelet/kubelet.go` `HandlePodAdditions`: a mirror pod is never
//!   admitted (its static pod was, from the file), nor a pod already in a
//!   terminal phase; a refused pod goes to `rejectPod`, which sets phase
//!   `Failed`, the reason, and `"Pod was rejected: " + message`.
//! - `pkg/kubelet/lifecycle/predicate.go` `generalFilter`: unless
//!   `types.IsStaticPod`, `FindMatchingUntoleratedTaint` over the node's
//!   taints filtered to `NoExecute` gives `PredicateFailureError{TaintToleration,
//!   ErrReasonNotMatch}`; `predicateAdmitHandler.Admit` reports the first
//!   failure as reason `PredicateName`, message `PredicateFailureError.Error()`.
//! - `pkg/kubelet/types/pod_update.go` `IsStaticPod`, `IsMirrorPod`; and
//!   `pkg/kubelet/config/config.go` (`updatePodsFunc`) overwrites
//!   `kubernetes.io/config.source` with `api` on every pod from the API
//!   server, so such a pod is never static whatever its annotations say.
//! - `pkg/scheduler/framework/plugins/tainttoleration` `Name`,
//!   `ErrReasonNotMatch`.
//!
//! The other checks of `Admit` (OS, resources, ports, node affinity, …) are
//! not modelled: the emulator's pods and nodes never fail them.

use k8s_openapi::api::core::v1::{Pod, Taint};
use serde_json::{Value, json};

use crate::tolerations::{self, NO_EXECUTE};

/// `tainttoleration.Name`: the `PredicateName`, so the pod's status reason.
pub const TAINT_TOLERATION: &str = "TaintToleration";
/// `tainttoleration.ErrReasonNotMatch`.
pub const ERR_REASON_NOT_MATCH: &str = "node(s) had taints that the pod didn't tolerate";
/// `kubetypes.ConfigSourceAnnotationKey`, `ConfigMirrorAnnotationKey`.
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";
/// `kubetypes.ApiserverSource`.
pub const API_SOURCE: &str = "api";

/// What the kubelet does with a pod bound to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// `HandlePodAdditions` does not run admission for it.
    Skipped(Skip),
    Admitted,
    /// `PodAdmitResult{Admit: false, Reason, Message}`.
    Rejected {
        reason: String,
        message: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    Mirror,
    Terminal,
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// `IsMirrorPod`: the mirror annotation is present (any value).
pub fn is_mirror_pod(pod: &Pod) -> bool {
    annotation(pod, CONFIG_MIRROR).is_some()
}

/// `IsStaticPod`: a source annotation other than `api`.
pub fn is_static_pod(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE).is_some_and(|s| s != API_SOURCE)
}

/// The pod as the kubelet's config hands it on from the API server source.
fn from_api_source(pod: &Pod) -> Pod {
    let mut p = pod.clone();
    p.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(CONFIG_SOURCE.into(), API_SOURCE.into());
    p
}

/// Admission of `pod`, read from the API server, on a node with `node_taints`.
pub fn admit(node_taints: &[Taint], pod: &Pod, comparison_operators: bool) -> Admission {
    if is_mirror_pod(pod) {
        return Admission::Skipped(Skip::Mirror);
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Failed" | "Succeeded")) {
        return Admission::Skipped(Skip::Terminal);
    }
    let pod = from_api_source(pod);
    if is_static_pod(&pod) {
        return Admission::Admitted;
    }
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    let untolerated = tolerations::first_untolerated(
        node_taints,
        tolerations,
        |t| t.effect == NO_EXECUTE,
        comparison_operators,
    );
    match untolerated {
        None => Admission::Admitted,
        Some(_) => Admission::Rejected {
            reason: TAINT_TOLERATION.into(),
            message: format!("Predicate {TAINT_TOLERATION} failed: {ERR_REASON_NOT_MATCH}"),
        },
    }
}

/// `rejectPod`'s status (a merge patch body's `status`; the QoS class is
/// kept as it is).
pub fn rejected_status(reason: &str, message: &str) -> Value {
    json!({
        "phase": "Failed",
        "reason": reason,
        "message": format!("Pod was rejected: {message}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate() -> Taint {
        Taint {
            key: "nodegate.dev/agent-not-ready".into(),
            value: Some("true".into()),
            effect: NO_EXECUTE.into(),
            time_added: None,
        }
    }

    fn no_schedule(key: &str) -> Taint {
        Taint {
            key: key.into(),
            value: None,
            effect: "NoSchedule".into(),
            time_added: None,
        }
    }

    fn pod(v: Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn rejected() -> Admission {
        Admission::Rejected {
            reason: "TaintToleration".into(),
            message:
                "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"
                    .into(),
        }
    }

    #[test]
    fn only_untolerated_no_execute_taints_refuse() {
        let plain = json!({"metadata": {"name": "p"}, "spec": {"containers": []}});
        let tolerating = json!({"metadata": {"name": "p"}, "spec": {"containers": [], "tolerations": [
            {"key": "nodegate.dev/agent-not-ready", "operator": "Exists", "effect": "NoExecute"}]}});
        let schedule_only = json!({"metadata": {"name": "p"}, "spec": {"containers": [], "tolerations": [
            {"key": "nodegate.dev/agent-not-ready", "operator": "Exists", "effect": "NoSchedule"}]}});
        let everything = json!({"metadata": {"name": "p"}, "spec": {"containers": [], "tolerations": [
            {"operator": "Exists"}]}});
        let ns = [
            no_schedule("node.kubernetes.io/not-ready"),
            no_schedule("nodegate.dev/agent-not-ready"),
        ];
        let with_gate = [ns[0].clone(), ns[1].clone(), gate()];
        // (node taints, pod, admission)
        let table: Vec<(&[Taint], Value, Admission)> = vec![
            (&[], plain.clone(), Admission::Admitted),
            // NoSchedule taints never stop a bound pod.
            (&ns, plain.clone(), Admission::Admitted),
            (&with_gate, plain.clone(), rejected()),
            (&with_gate, tolerating, Admission::Admitted),
            (&with_gate, schedule_only, rejected()),
            (&with_gate, everything, Admission::Admitted),
        ];
        for (taints, p, want) in table {
            assert_eq!(admit(taints, &pod(p.clone()), false), want, "{p}");
        }
    }

    #[test]
    fn mirror_and_terminal_pods_are_not_admitted_and_api_pods_are_never_static() {
        let taints = [gate()];
        let mirror = pod(json!({"metadata": {"name": "m", "annotations": {
            "kubernetes.io/config.mirror": "abc", "kubernetes.io/config.source": "file"}}}));
        assert_eq!(
            admit(&taints, &mirror, false),
            Admission::Skipped(Skip::Mirror)
        );
        for phase in ["Failed", "Succeeded"] {
            let done = pod(json!({"metadata": {"name": "d"}, "status": {"phase": phase}}));
            assert_eq!(
                admit(&taints, &done, false),
                Admission::Skipped(Skip::Terminal)
            );
        }
        let running = pod(json!({"metadata": {"name": "r"}, "status": {"phase": "Running"}}));
        assert_eq!(admit(&taints, &running, false), rejected());
        // The API source overwrites a "file" source: no exemption.
        let claims_static = pod(json!({"metadata": {"name": "s", "annotations": {
            "kubernetes.io/config.source": "file"}}}));
        assert!(is_static_pod(&claims_static));
        assert_eq!(admit(&taints, &claims_static, false), rejected());
    }

    #[test]
    fn rejection_status_is_what_reject_pod_writes() {
        let Admission::Rejected { reason, message } = admit(&[gate()], &pod(json!({})), false)
        else {
            panic!("expected a rejection");
        };
        assert_eq!(
            rejected_status(&reason, &message),
            json!({"phase": "Failed", "reason": "TaintToleration",
                   "message": "Pod was rejected: Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"})
        );
    }
}
