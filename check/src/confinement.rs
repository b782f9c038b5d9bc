//! The credential confinement of the install (`manifests/base/confinement.yaml`):
//! the agent's and the webhook's ValidatingAdmissionPolicies exist and are
//! bound with `Deny`, and — the decisive part — a server-side dry-run of a
//! forbidden change made as the agent's ServiceAccount with a node claim
//! (impersonated: `Impersonate-User` plus `Impersonate-Extra-…node-name`) on
//! an existing Node is refused. Without the policy, a token stolen from any
//! node could rewrite every Node in the cluster: that fails the check.

use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::{Client, Config};
use nodegate_shared::keys::EXCLUDE_LABEL;
use serde_json::{Value, json};

use crate::read::Read;
use crate::report::{Report, Status};

const CHECK: &str = "credential confinement";
const PROBE: &str = "confinement dry-run";
const AGENT_POLICY: &str = "nodegate-agent-confinement";
const WEBHOOK_POLICY: &str = "nodegate-webhook-confinement";
const NODE_CLAIM: &str = "authentication.kubernetes.io/node-name";
const POD_NAME_CLAIM: &str = "authentication.kubernetes.io/pod-name";
const POD_UID_CLAIM: &str = "authentication.kubernetes.io/pod-uid";
/// The pod name and uid the probe's impersonated token carries: fixed, so
/// the check's own Role may impersonate these claims with these values only
/// (`manifests/components/check-rbac`); the policy requires them present,
/// whatever their value.
pub const PROBE_POD: &str = "nodegate-check-probe";

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
        plural,
    )
}

/// The two policies as read, and every binding's `spec` (listed when
/// either policy is there).
#[derive(Debug, Clone)]
pub struct Policies {
    pub agent: Read<()>,
    pub webhook: Read<()>,
    pub bindings: Result<Vec<Value>, String>,
}

/// Problems with one policy and its bindings (empty: bound with Deny).
fn bound_with_deny(
    name: &str,
    policy: &Read<()>,
    bindings: &Result<Vec<Value>, String>,
) -> Vec<String> {
    match policy {
        Read::Found(()) => {}
        Read::Missing => return vec![format!("ValidatingAdmissionPolicy {name} is missing")],
        Read::Unreadable(e) => {
            return vec![format!("cannot read ValidatingAdmissionPolicy {name}: {e}")];
        }
    }
    match bindings {
        Ok(list) => {
            let denies = list.iter().any(|b| {
                b["policyName"] == json!(name)
                    && b["validationActions"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|x| x == "Deny"))
            });
            if denies {
                Vec::new()
            } else {
                vec![format!(
                    "no ValidatingAdmissionPolicyBinding binds {name} with validationActions Deny"
                )]
            }
        }
        Err(e) => vec![format!(
            "cannot list ValidatingAdmissionPolicyBindings: {e}"
        )],
    }
}

/// The `credential confinement` line.
pub fn policies_verdict(p: &Policies) -> (Status, String) {
    let mut problems = bound_with_deny(AGENT_POLICY, &p.agent, &p.bindings);
    problems.extend(bound_with_deny(WEBHOOK_POLICY, &p.webhook, &p.bindings));
    if problems.is_empty() {
        (
            Status::Pass,
            format!("{AGENT_POLICY} and {WEBHOOK_POLICY} are bound with Deny"),
        )
    } else {
        (
            Status::Fail,
            format!(
                "{}: a token stolen from one node can rewrite every Node (apply manifests/base/confinement.yaml; needs Kubernetes >= 1.30, node claims >= 1.32)",
                problems.join("; ")
            ),
        )
    }
}

/// How the dry-run as the agent went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// No kubeconfig to impersonate with.
    NoConfig,
    /// The cluster has no Node to try it on.
    NoNode,
    NodesUnlistable(String),
    /// The impersonating client could not be built.
    Unbuilt(String),
    /// The dry-run label of `node` was admitted.
    Admitted {
        node: String,
    },
    /// It failed: `forbidden` is the message of a 403, `error` the whole
    /// error.
    Refused {
        node: String,
        forbidden: Option<String>,
        error: String,
    },
}

/// The `confinement dry-run` line.
pub fn probe_verdict(probe: &Probe) -> (Status, String) {
    match probe {
        Probe::NoConfig => (Status::Skip, "no kubeconfig to impersonate with".into()),
        Probe::NoNode => (Status::Skip, "the cluster has no Node to try it on".into()),
        Probe::NodesUnlistable(e) => (Status::Skip, format!("cannot list Nodes: {e}")),
        Probe::Unbuilt(e) => (Status::Skip, format!("client: {e}")),
        Probe::Refused {
            node,
            forbidden: Some(m),
            ..
        } if m.contains(AGENT_POLICY) => (
            Status::Pass,
            format!(
                "the agent's token (node claim {node}) may not label its own node: refused by {AGENT_POLICY}"
            ),
        ),
        Probe::Refused {
            forbidden: Some(m), ..
        } if m.contains("impersonate") => (
            Status::Warn,
            format!(
                "cannot impersonate the agent to try it (run as a cluster admin, or with the credential of manifests/components/check-rbac): {m}"
            ),
        ),
        Probe::Refused { node, error, .. } => (
            Status::Fail,
            format!("a dry-run label of node {node} as the agent failed unexpectedly: {error}"),
        ),
        Probe::Admitted { node } => (
            Status::Fail,
            format!(
                "the agent's token may set {EXCLUDE_LABEL}=true on node {node} (dry-run admitted): the confinement policy is not in force"
            ),
        ),
    }
}

/// Both policies, and the bindings when either is there.
pub async fn read_policies(client: &Client) -> Policies {
    let policies: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
    );
    let get = |name| {
        let policies = policies.clone();
        async move { Read::of(policies.get_opt(name).await).map(|_| ()) }
    };
    let (agent, webhook) = (get(AGENT_POLICY).await, get(WEBHOOK_POLICY).await);
    let any = [&agent, &webhook]
        .iter()
        .any(|p| matches!(p, Read::Found(())));
    let bindings = if any {
        let api: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &resource(
                "ValidatingAdmissionPolicyBinding",
                "validatingadmissionpolicybindings",
            ),
        );
        match api.list(&ListParams::default()).await {
            Ok(list) => Ok(list
                .items
                .into_iter()
                .map(|b| b.data["spec"].clone())
                .collect()),
            Err(e) => Err(e.to_string()),
        }
    } else {
        Ok(Vec::new())
    };
    Policies {
        agent,
        webhook,
        bindings,
    }
}

/// A dry-run label of any existing Node (the canary: nothing is stored) as
/// the agent's ServiceAccount in `namespace`, impersonated with the claims
/// of an agent pod's token on that node.
pub async fn probe(client: &Client, config: Option<&Config>, namespace: &str) -> Probe {
    let Some(config) = config else {
        return Probe::NoConfig;
    };
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let node = match nodes.list(&ListParams::default().limit(1)).await {
        Ok(l) => match l.items.into_iter().next().and_then(|n| n.metadata.name) {
            Some(n) => n,
            None => return Probe::NoNode,
        },
        Err(e) => return Probe::NodesUnlistable(e.to_string()),
    };
    let mut as_agent = config.clone();
    as_agent.auth_info.impersonate =
        Some(format!("system:serviceaccount:{namespace}:nodegate-agent"));
    as_agent.auth_info.impersonate_groups = None;
    // The claims of an agent pod's token on that node, so the policy
    // judges the change, not a token it would refuse anyway.
    as_agent.auth_info.impersonate_user_extra = Some(
        [
            (NODE_CLAIM.to_string(), vec![node.clone()]),
            (POD_NAME_CLAIM.to_string(), vec![PROBE_POD.to_string()]),
            (POD_UID_CLAIM.to_string(), vec![PROBE_POD.to_string()]),
        ]
        .into_iter()
        .collect(),
    );
    let agent = match Client::try_from(as_agent) {
        Ok(c) => c,
        Err(e) => return Probe::Unbuilt(e.to_string()),
    };
    let pp = PatchParams {
        dry_run: true,
        field_manager: Some("nodegate-check".into()),
        ..Default::default()
    };
    // What a thief would do first: switch the gate off on its own node.
    let forbidden = json!({"metadata": {"labels": {EXCLUDE_LABEL: "true"}}});
    let r = Api::<k8s_openapi::api::core::v1::Node>::all(agent)
        .patch(&node, &pp, &Patch::Merge(&forbidden))
        .await;
    match r {
        Ok(_) => Probe::Admitted { node },
        Err(e) => Probe::Refused {
            forbidden: match &e {
                kube::Error::Api(a) if a.code == 403 => Some(a.message.clone()),
                _ => None,
            },
            error: e.to_string(),
            node,
        },
    }
}

/// Runs both parts; `config` is the one the check's client was built from
/// (the dry-run needs it to impersonate the agent in `namespace`).
pub async fn check(client: &Client, config: Option<&Config>, namespace: &str, report: &mut Report) {
    let (status, detail) = policies_verdict(&read_policies(client).await);
    report.add(CHECK, status, detail);
    let (status, detail) = probe_verdict(&probe(client, config, namespace).await);
    report.add(PROBE, status, detail);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(name: &str, actions: &[&str]) -> Value {
        json!({"policyName": name, "validationActions": actions})
    }

    #[test]
    fn policy_verdicts() {
        let both = |bindings| Policies {
            agent: Read::Found(()),
            webhook: Read::Found(()),
            bindings,
        };
        let rows = [
            (
                both(Ok(vec![binding(AGENT_POLICY, &["Deny"]), binding(WEBHOOK_POLICY, &["Audit", "Deny"])])),
                Status::Pass,
                "nodegate-agent-confinement and nodegate-webhook-confinement are bound with Deny".to_string(),
            ),
            (
                both(Ok(vec![binding(AGENT_POLICY, &["Audit"]), binding(WEBHOOK_POLICY, &["Deny"])])),
                Status::Fail,
                "no ValidatingAdmissionPolicyBinding binds nodegate-agent-confinement with validationActions Deny: a token stolen from one node can rewrite every Node".into(),
            ),
            (
                both(Err("403".into())),
                Status::Fail,
                "cannot list ValidatingAdmissionPolicyBindings: 403; cannot list ValidatingAdmissionPolicyBindings: 403: a token".into(),
            ),
            (
                Policies {
                    agent: Read::Missing,
                    webhook: Read::Unreadable("timeout".into()),
                    bindings: Ok(Vec::new()),
                },
                Status::Fail,
                "ValidatingAdmissionPolicy nodegate-agent-confinement is missing; cannot read ValidatingAdmissionPolicy nodegate-webhook-confinement: timeout: a token stolen".into(),
            ),
        ];
        for (policies, status, part) in rows {
            let (got, detail) = policies_verdict(&policies);
            assert_eq!(got, status, "{detail}");
            assert!(detail.contains(&part), "{detail:?} lacks {part:?}");
        }
    }

    #[test]
    fn probe_verdicts() {
        let refused = |forbidden: Option<&str>, error: &str| Probe::Refused {
            node: "n1".into(),
            forbidden: forbidden.map(str::to_string),
            error: error.into(),
        };
        let rows = [
            (
                Probe::NoConfig,
                Status::Skip,
                "no kubeconfig to impersonate with",
            ),
            (
                Probe::NoNode,
                Status::Skip,
                "the cluster has no Node to try it on",
            ),
            (
                Probe::NodesUnlistable("403".into()),
                Status::Skip,
                "cannot list Nodes: 403",
            ),
            (Probe::Unbuilt("bad".into()), Status::Skip, "client: bad"),
            (
                refused(
                    Some("denied by ValidatingAdmissionPolicy 'nodegate-agent-confinement'"),
                    "x",
                ),
                Status::Pass,
                "the agent's token (node claim n1) may not label its own node: refused by nodegate-agent-confinement",
            ),
            (
                refused(Some("users \"x\" is forbidden: cannot impersonate"), "x"),
                Status::Warn,
                "cannot impersonate the agent to try it (run as a cluster admin, or with the credential of manifests/components/check-rbac): users \"x\" is forbidden: cannot impersonate",
            ),
            (
                refused(None, "connection reset"),
                Status::Fail,
                "a dry-run label of node n1 as the agent failed unexpectedly: connection reset",
            ),
            (
                refused(
                    Some("nodes is forbidden by RBAC"),
                    "ApiError: nodes is forbidden by RBAC",
                ),
                Status::Fail,
                "failed unexpectedly: ApiError: nodes is forbidden by RBAC",
            ),
            (
                Probe::Admitted { node: "n1".into() },
                Status::Fail,
                "may set node-restriction.kubernetes.io/nodegate-exclude=true on node n1 (dry-run admitted): the confinement policy is not in force",
            ),
        ];
        for (probe, status, part) in rows {
            let (got, detail) = probe_verdict(&probe);
            assert_eq!(got, status, "{detail}");
            assert!(detail.contains(part), "{detail:?} lacks {part:?}");
        }
    }
}
