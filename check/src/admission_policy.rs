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

use crate::webhook_config::{evaluate_as, node};
use crate::{Args, Report, Status};

const CHECK: &str = "admission policy";

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
        plural,
    )
}

/// `Some(true)` when the policy is installed and sound, `Some(false)` when
/// installed with a problem (reported), `None` when not installed (the
/// webhook install; nothing reported).
pub async fn check(client: &Client, args: &Args, report: &mut Report) -> Option<bool> {
    let policies: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource("MutatingAdmissionPolicy", "mutatingadmissionpolicies"),
    );
    // A 404 also when the API server does not serve the v1 API (< 1.36).
    let policy = policies.get_opt(&args.policy).await.ok().flatten()?;
    let spec = policy.data.get("spec").cloned().unwrap_or(Value::Null);
    let mut problems = Vec::new();

    let bindings: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource(
            "MutatingAdmissionPolicyBinding",
            "mutatingadmissionpolicybindings",
        ),
    );
    match bindings.list(&ListParams::default()).await {
        Ok(list) => {
            if !list
                .items
                .iter()
                .any(|b| b.data["spec"]["policyName"] == json!(args.policy))
            {
                problems.push(format!(
                    "no MutatingAdmissionPolicyBinding names policy {}: it never applies",
                    args.policy
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
    let fresh = node("nodegate-check-node", "boot-1");
    let mut stored = fresh.clone();
    stored["metadata"]["annotations"] = json!({READY_BOOT_ID_ANNOTATION: "boot-1"});
    stored["status"]["nodeInfo"]["bootID"] = json!("boot-2");
    let kubelet = format!(
        "{}nodegate-check-node",
        nodegate_shared::keys::NODE_USER_PREFIX
    );
    let controller = "system:serviceaccount:kube-system:node-controller";
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
        match evaluate_as(&conditions, op, "", user, obj, old) {
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
    if problems.is_empty() {
        report.add(
            CHECK,
            Status::Pass,
            format!(
                "MutatingAdmissionPolicy {} is bound; failurePolicy Ignore; {} condition(s) apply on a Node CREATE and on an update after a reboot",
                args.policy,
                conditions.len()
            ),
        );
        Some(true)
    } else {
        report.add(CHECK, Status::Fail, problems.join("; "));
        Some(false)
    }
}
