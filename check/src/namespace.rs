//! The namespace nodegate runs in against the identities its confinement
//! policies confine. The policies match the agent's and the webhook's
//! ServiceAccounts by user name (`system:serviceaccount:<ns>:<name>`); one
//! that names another namespace than the workloads run in (an old
//! generator's output under kustomize's `namespace:`, or a hand edit)
//! matches none of their writes, and their tokens are as strong as RBAC
//! makes them: every Node, every field. The check evaluates each policy's
//! matchConditions, as the API server does, for the user the workloads'
//! tokens carry in `--namespace`.

use std::collections::BTreeMap;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use nodegate_shared::match_conditions::{
    RequestAttributes, Verdict, match_all, named_conditions, request_variable,
};
use nodegate_webhook::confinement::{
    AGENT_POLICY, AGENT_SA, NODE_CLAIM, POD_NAME_CLAIM, POD_UID_CLAIM, WEBHOOK_POLICY, WEBHOOK_SA,
};
use serde_json::Value;

use crate::report::{Report, Status};

pub const CHECK: &str = "confinement namespace";

/// The user names a policy's conditions spell out, for the diagnosis.
fn named_users(policy: &Value) -> Vec<String> {
    let mut users = Vec::new();
    for (_, expression) in named_conditions(&policy["spec"]["matchConditions"]) {
        for piece in expression.split(['\'', '"']) {
            let whole = piece.split(':').filter(|p| !p.is_empty()).count() == 4;
            if whole
                && piece.starts_with("system:serviceaccount:")
                && !users.iter().any(|u| u == piece)
            {
                users.push(piece.to_string());
            }
        }
    }
    users
}

/// Whether `policy` (named `name`; `None` when missing) applies to the
/// Node updates of ServiceAccount `sa` in `namespace`, by its
/// matchConditions. `Err` says why it does not.
pub fn applies(
    policy: Option<&Value>,
    name: &str,
    namespace: &str,
    sa: &str,
) -> Result<String, (Status, String)> {
    let user = format!("system:serviceaccount:{namespace}:{sa}");
    let Some(policy) = policy else {
        return Err((
            Status::Skip,
            format!("{name} is missing (see credential confinement)"),
        ));
    };
    let groups = vec![
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{namespace}"),
        "system:authenticated".to_string(),
    ];
    // What a token of the workload's pod carries.
    let extra: BTreeMap<String, Vec<String>> = [
        (NODE_CLAIM, "node"),
        (POD_NAME_CLAIM, "pod"),
        (POD_UID_CLAIM, "uid"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
    .collect();
    let request = request_variable(&RequestAttributes {
        group: "",
        version: "v1",
        kind: "Node",
        resource: "nodes",
        subresource: "",
        name: "node",
        namespace: "",
        operation: "UPDATE",
        username: &user,
        groups: &groups,
        extra: &extra,
        dry_run: false,
        options: serde_json::json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}),
    });
    let conditions = named_conditions(&policy["spec"]["matchConditions"]);
    let (verdict, _) = match_all(conditions, &Value::Null, &Value::Null, &request);
    let names = named_users(policy);
    let naming = if names.is_empty() {
        String::new()
    } else {
        format!(" (it names {})", names.join(", "))
    };
    match verdict {
        Verdict::Call => Ok(user),
        Verdict::Excluded(condition) => Err((
            Status::Fail,
            format!(
                "{name} does not apply to {user}: its matchCondition {condition} is false{naming}, so that token is confined by RBAC alone (every Node, every field); apply the confinement `nodegate-webhook confinement` generates now (it matches the ServiceAccount in any namespace)"
            ),
        )),
        Verdict::Errors(errors) => Err((
            Status::Fail,
            format!(
                "{name}'s matchConditions fail for {user} ({}): with failurePolicy Fail every write of that workload is refused",
                errors.join("; ")
            ),
        )),
    }
}

/// Both policies as read (`None`: missing), or the first read's error.
pub type Policies = Result<[Option<Value>; 2], (&'static str, String)>;

/// The line: whether each policy confines its workload's ServiceAccount
/// in `namespace`.
pub fn verdict(policies: &Policies, namespace: &str) -> (Status, String) {
    let policies = match policies {
        Ok(p) => p,
        Err((name, e)) => return (Status::Skip, format!("cannot read {name}: {e}")),
    };
    let (mut confined, mut failed, mut skipped) = (Vec::new(), Vec::new(), Vec::new());
    let accounts = [(AGENT_POLICY, AGENT_SA), (WEBHOOK_POLICY, WEBHOOK_SA)];
    for ((name, sa), policy) in accounts.into_iter().zip(policies) {
        match applies(policy.as_ref(), name, namespace, sa) {
            Ok(user) => confined.push(user),
            Err((Status::Fail, why)) => failed.push(why),
            Err((_, why)) => skipped.push(why),
        }
    }
    if !failed.is_empty() {
        (Status::Fail, failed.join("; "))
    } else if !skipped.is_empty() {
        (Status::Skip, skipped.join("; "))
    } else {
        (
            Status::Pass,
            format!(
                "the policies confine {} (namespace {namespace})",
                confined.join(" and ")
            ),
        )
    }
}

/// Reads the agent's, then the webhook's policy; stops at the first error.
pub async fn read(client: &Client) -> Policies {
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingAdmissionPolicy",
            ),
            "validatingadmissionpolicies",
        ),
    );
    let mut out = [None, None];
    for (slot, name) in out.iter_mut().zip([AGENT_POLICY, WEBHOOK_POLICY]) {
        match api.get_opt(name).await {
            Ok(p) => *slot = p.map(|p| serde_json::to_value(p).unwrap_or(Value::Null)),
            Err(e) => return Err((name, e.to_string())),
        }
    }
    Ok(out)
}

/// Reads both policies and reports [`verdict`] for `namespace`, the one
/// nodegate runs in.
pub async fn check(client: &Client, namespace: &str, report: &mut Report) {
    let (status, detail) = verdict(&read(client).await, namespace);
    report.add(CHECK, status, detail);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use nodegate_shared::keys::DEFAULT_TAINT;

    /// The policies as the generator writes them.
    fn generated() -> BTreeMap<String, Value> {
        let text =
            nodegate_webhook::confinement::render(&[DEFAULT_TAINT.parse().unwrap()], &[], &[]);
        text.split("\n---\n")
            .map(|d| serde_yaml::from_str::<Value>(d).unwrap())
            .filter(|d| d["kind"] == "ValidatingAdmissionPolicy")
            .map(|d| (d["metadata"]["name"].as_str().unwrap().to_string(), d))
            .collect()
    }

    /// A policy of the earlier generator: one namespace, spelled out.
    fn pinned(namespace: &str, sa: &str) -> Value {
        serde_json::json!({"spec": {"matchConditions": [{"name": sa, "expression": format!(
            "has(request.userInfo.username) && request.userInfo.username == 'system:serviceaccount:{namespace}:{sa}'"
        )}]}})
    }

    #[test]
    fn verdicts() {
        let g = generated();
        let broken = serde_json::json!({"spec": {"matchConditions": [
            {"name": "typo", "expression": "request.userInfo.usernme == 'x'"}]}});
        let agent = |p: &Value| Some((p.clone(), AGENT_SA));
        // (policy and its account, namespace the workloads run in, status, detail part)
        type Row<'a> = (Option<(Value, &'a str)>, &'a str, Status, &'a str);
        let table: Vec<Row> = vec![
            (agent(&g[AGENT_POLICY]), "nodegate", Status::Pass, ""),
            (agent(&g[AGENT_POLICY]), "platform-gates", Status::Pass, ""),
            (
                Some((g[WEBHOOK_POLICY].clone(), WEBHOOK_SA)),
                "platform-gates",
                Status::Pass,
                "",
            ),
            (
                agent(&pinned("nodegate", AGENT_SA)),
                "nodegate",
                Status::Pass,
                "",
            ),
            (
                agent(&pinned("nodegate", AGENT_SA)),
                "platform-gates",
                Status::Fail,
                "does not apply to system:serviceaccount:platform-gates:nodegate-agent: its matchCondition nodegate-agent is false (it names system:serviceaccount:nodegate:nodegate-agent)",
            ),
            (None, "nodegate", Status::Skip, "is missing"),
            (
                agent(&broken),
                "nodegate",
                Status::Fail,
                "matchConditions fail",
            ),
        ];
        for (policy, namespace, want, detail) in table {
            let sa = policy.as_ref().map_or(AGENT_SA, |p| p.1);
            let got = applies(policy.as_ref().map(|p| &p.0), "the policy", namespace, sa);
            match (got, want) {
                (Ok(user), Status::Pass) => {
                    assert_eq!(user, format!("system:serviceaccount:{namespace}:{sa}"));
                }
                (Err((status, why)), want) => {
                    assert_eq!(status, want, "{namespace}: {why}");
                    assert!(
                        why.contains(detail),
                        "{namespace}: {why:?} lacks {detail:?}"
                    );
                }
                (got, want) => panic!("{namespace}: {got:?}, want {want:?}"),
            }
        }
    }

    /// The generated conditions confine the ServiceAccount name only, not a
    /// look-alike user.
    #[test]
    fn the_generated_condition_matches_the_account_name_only() {
        let g = generated();
        for sa in ["nodegate-agent-x", "x-nodegate-agent"] {
            assert!(applies(Some(&g[AGENT_POLICY]), AGENT_POLICY, "nodegate", sa).is_err());
        }
    }

    #[test]
    fn both_policies_make_one_line() {
        let g = generated();
        let both = Ok([
            Some(g[AGENT_POLICY].clone()),
            Some(g[WEBHOOK_POLICY].clone()),
        ]);
        let rows = [
            (
                both.clone(),
                "nodegate",
                Status::Pass,
                "the policies confine system:serviceaccount:nodegate:nodegate-agent and system:serviceaccount:nodegate:nodegate-webhook (namespace nodegate)",
            ),
            (
                Ok([Some(pinned("nodegate", AGENT_SA)), None]),
                "other",
                Status::Fail,
                "does not apply to system:serviceaccount:other:nodegate-agent",
            ),
            (
                Ok([Some(g[AGENT_POLICY].clone()), None]),
                "nodegate",
                Status::Skip,
                "nodegate-webhook-confinement is missing (see credential confinement)",
            ),
            (
                Err((WEBHOOK_POLICY, "403".to_string())),
                "nodegate",
                Status::Skip,
                "cannot read nodegate-webhook-confinement: 403",
            ),
        ];
        for (policies, namespace, status, part) in rows {
            let (got, detail) = verdict(&policies, namespace);
            assert_eq!(got, status, "{detail}");
            assert!(detail.contains(part), "{detail:?} lacks {part:?}");
        }
    }
}
