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
use serde_json::json;

use crate::{Args, Report, Status};

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

/// Problems with one policy and its bindings (empty: bound with Deny).
async fn bound_with_deny(client: &Client, name: &str) -> Vec<String> {
    let policies: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
    );
    match policies.get_opt(name).await {
        Ok(Some(_)) => {}
        Ok(None) => return vec![format!("ValidatingAdmissionPolicy {name} is missing")],
        Err(e) => return vec![format!("cannot read ValidatingAdmissionPolicy {name}: {e}")],
    }
    let bindings: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource(
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
        ),
    );
    match bindings.list(&ListParams::default()).await {
        Ok(list) => {
            let denies = list.items.iter().any(|b| {
                b.data["spec"]["policyName"] == json!(name)
                    && b.data["spec"]["validationActions"]
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

/// Runs both parts; `config` is the one the check's client was built from
/// (the dry-run needs it to impersonate the agent).
pub async fn check(client: &Client, config: Option<&Config>, args: &Args, report: &mut Report) {
    let mut problems = bound_with_deny(client, AGENT_POLICY).await;
    problems.extend(bound_with_deny(client, WEBHOOK_POLICY).await);
    if problems.is_empty() {
        report.add(
            CHECK,
            Status::Pass,
            format!("{AGENT_POLICY} and {WEBHOOK_POLICY} are bound with Deny"),
        );
    } else {
        report.add(
            CHECK,
            Status::Fail,
            format!(
                "{}: a token stolen from one node can rewrite every Node (apply manifests/base/confinement.yaml; needs Kubernetes >= 1.30, node claims >= 1.32)",
                problems.join("; ")
            ),
        );
    }
    let Some(config) = config else {
        report.add(PROBE, Status::Skip, "no kubeconfig to impersonate with");
        return;
    };
    // Any existing Node serves as the canary: the patch is a dry-run.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let node = match nodes.list(&ListParams::default().limit(1)).await {
        Ok(l) => match l.items.into_iter().next().and_then(|n| n.metadata.name) {
            Some(n) => n,
            None => {
                report.add(PROBE, Status::Skip, "the cluster has no Node to try it on");
                return;
            }
        },
        Err(e) => {
            report.add(PROBE, Status::Skip, format!("cannot list Nodes: {e}"));
            return;
        }
    };
    let mut as_agent = config.clone();
    as_agent.auth_info.impersonate = Some(format!(
        "system:serviceaccount:{}:nodegate-agent",
        args.namespace
    ));
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
        Err(e) => {
            report.add(PROBE, Status::Skip, format!("client: {e}"));
            return;
        }
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
        Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains(AGENT_POLICY) => {
            report.add(
                PROBE,
                Status::Pass,
                format!(
                    "the agent's token (node claim {node}) may not label its own node: refused by {AGENT_POLICY}"
                ),
            );
        }
        Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("impersonate") => {
            report.add(
                PROBE,
                Status::Warn,
                format!("cannot impersonate the agent to try it (run as a cluster admin, or with the credential of manifests/components/check-rbac): {}", e.message),
            );
        }
        Err(e) => report.add(
            PROBE,
            Status::Fail,
            format!("a dry-run label of node {node} as the agent failed unexpectedly: {e}"),
        ),
        Ok(_) => report.add(
            PROBE,
            Status::Fail,
            format!(
                "the agent's token may set {EXCLUDE_LABEL}=true on node {node} (dry-run admitted): the confinement policy is not in force"
            ),
        ),
    }
}
