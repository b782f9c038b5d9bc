//! The MutatingAdmissionPolicy install (`manifests/overlays/admission-policy`):
//! the policy and a binding naming it, `failurePolicy`, and its
//! matchConditions evaluated the way the API server binds them on a Node
//! CREATE and on the node controller's update after a reboot. An Ignore'd
//! policy error leaves no trace in the API server (no metric), so an
//! erroring condition here is the only warning before nodes go untainted.

use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::{Client, core::GroupVersionKind};
use nodegate_shared::keys::READY_BOOT_ID_ANNOTATION;
use nodegate_shared::match_conditions::Verdict;
use serde_json::{Value, json};

use crate::matching::{evaluate_as, node};
use crate::report::{Report, Status};

const CHECK: &str = "admission policy";

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
        plural,
    )
}

/// The policy as read, when installed.
#[derive(Debug, Clone)]
pub struct Installed {
    /// Its `spec`.
    pub spec: Value,
    /// The `spec` of every MutatingAdmissionPolicyBinding, or why they
    /// could not be listed.
    pub bindings: Result<Vec<Value>, String>,
}

/// The conditions' problems on the request shapes the policy must admit.
fn condition_problems(conditions: &[(&str, &str)]) -> Vec<String> {
    let fresh = node("nodegate-check-node", "boot-1");
    let mut stored = fresh.clone();
    stored["metadata"]["annotations"] = json!({READY_BOOT_ID_ANNOTATION: "boot-1"});
    stored["status"]["nodeInfo"]["bootID"] = json!("boot-2");
    let kubelet = format!(
        "{}nodegate-check-node",
        nodegate_shared::keys::NODE_USER_PREFIX
    );
    let controller = "system:serviceaccount:kube-system:node-controller";
    let mut problems = Vec::new();
    for (what, op, user, obj, old) in [
        (
            "a Node CREATE",
            "CREATE",
            kubelet.as_str(),
            &fresh,
            &Value::Null,
        ),
        (
            "the node controller's update after a reboot",
            "UPDATE",
            controller,
            &stored,
            &stored,
        ),
    ] {
        match evaluate_as(conditions, op, "", user, obj, old) {
            Verdict::Call => {}
            Verdict::Excluded(c) => problems.push(format!(
                "condition {c} is false on {what}: the policy does not taint it"
            )),
            Verdict::Errors(errs) => problems.push(format!(
                "{} on {what} — with failurePolicy Ignore the API server skips the policy without a trace; guard optional fields with has()",
                errs.join("; ")
            )),
        }
    }
    problems
}

/// The line for policy `name` as installed, and whether it is sound.
pub fn verdict(name: &str, installed: &Installed) -> (Status, String, bool) {
    let spec = &installed.spec;
    let mut problems = Vec::new();
    match &installed.bindings {
        Ok(bindings) => {
            if !bindings.iter().any(|b| b["policyName"] == json!(name)) {
                problems.push(format!(
                    "no MutatingAdmissionPolicyBinding names policy {name}: it never applies"
                ));
            }
        }
        Err(e) => problems.push(format!("cannot list MutatingAdmissionPolicyBindings: {e}")),
    }
    if spec["failurePolicy"] != "Ignore" {
        problems.push(format!(
            "failurePolicy {}: an evaluation error would refuse every Node create",
            spec["failurePolicy"].as_str().unwrap_or("Fail (unset)")
        ));
    }
    let conditions = nodegate_shared::match_conditions::named_conditions(&spec["matchConditions"]);
    problems.extend(condition_problems(&conditions));
    if problems.is_empty() {
        (
            Status::Pass,
            format!(
                "MutatingAdmissionPolicy {name} is bound; failurePolicy Ignore; {} condition(s) apply on a Node CREATE and on an update after a reboot",
                conditions.len()
            ),
            true,
        )
    } else {
        (Status::Fail, problems.join("; "), false)
    }
}

/// The policy `name` and the bindings, when the policy is installed (a 404
/// also when the API server does not serve the v1 API, < 1.36).
pub async fn read(client: &Client, name: &str) -> Option<Installed> {
    let policies: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource("MutatingAdmissionPolicy", "mutatingadmissionpolicies"),
    );
    let policy = policies.get_opt(name).await.ok().flatten()?;
    let bindings: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource(
            "MutatingAdmissionPolicyBinding",
            "mutatingadmissionpolicybindings",
        ),
    );
    let bindings = match bindings.list(&ListParams::default()).await {
        Ok(list) => Ok(list
            .items
            .into_iter()
            .map(|b| b.data["spec"].clone())
            .collect()),
        Err(e) => Err(e.to_string()),
    };
    Some(Installed {
        spec: policy.data.get("spec").cloned().unwrap_or(Value::Null),
        bindings,
    })
}

/// `Some(true)` when the policy `name` is installed and sound,
/// `Some(false)` when installed with a problem (reported), `None` when not
/// installed (the webhook install; nothing reported).
pub async fn check(client: &Client, name: &str, report: &mut Report) -> Option<bool> {
    let installed = read(client, name).await?;
    let (status, detail, sound) = verdict(name, &installed);
    report.add(CHECK, status, detail);
    Some(sound)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generator's policy for nodegate's default taint.
    fn shipped() -> Value {
        use nodegate_webhook::policy::{ApiVersion, render};
        let taints = [nodegate_shared::keys::DEFAULT_TAINT.parse().unwrap()];
        render(&taints, &[], ApiVersion::V1)
            .split("\n---\n")
            .map(|d| serde_yaml::from_str::<Value>(d).unwrap())
            .find(|d| d["kind"] == "MutatingAdmissionPolicy")
            .unwrap()["spec"]
            .clone()
    }

    fn installed(spec: Value, bound: Result<&str, &str>) -> Installed {
        Installed {
            spec,
            bindings: bound
                .map(|name| vec![json!({"policyName": name})])
                .map_err(str::to_string),
        }
    }

    #[test]
    fn verdicts() {
        let mut fail = shipped();
        fail["failurePolicy"] = Value::Null;
        let mut unguarded = shipped();
        unguarded["matchConditions"] =
            json!([{"name": "x", "expression": "request.subResource != 'status'"}]);
        let mut excluded = shipped();
        excluded["matchConditions"] = json!([{"name": "never", "expression": "false"}]);
        let rows = [
            (
                installed(shipped(), Ok("nodegate")),
                Status::Pass,
                "MutatingAdmissionPolicy nodegate is bound; failurePolicy Ignore;",
            ),
            (
                installed(shipped(), Ok("other")),
                Status::Fail,
                "no MutatingAdmissionPolicyBinding names policy nodegate: it never applies",
            ),
            (
                installed(shipped(), Err("403")),
                Status::Fail,
                "cannot list MutatingAdmissionPolicyBindings: 403",
            ),
            (
                installed(fail, Ok("nodegate")),
                Status::Fail,
                "failurePolicy Fail (unset): an evaluation error would refuse every Node create",
            ),
            (
                installed(unguarded, Ok("nodegate")),
                Status::Fail,
                "on a Node CREATE — with failurePolicy Ignore the API server skips the policy without a trace",
            ),
            (
                installed(excluded, Ok("nodegate")),
                Status::Fail,
                "condition never is false on a Node CREATE: the policy does not taint it; condition never is false on the node controller's update after a reboot",
            ),
        ];
        for (installed, status, part) in rows {
            let (got, detail, sound) = verdict("nodegate", &installed);
            assert_eq!((got, sound), (status, status == Status::Pass), "{detail}");
            assert!(detail.contains(part), "{detail:?} lacks {part:?}");
        }
    }
}
