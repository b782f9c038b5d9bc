//! ValidatingAdmissionPolicy (`admissionregistration.k8s.io/v1`) in the
//! emulator, after k8s.io/apiserver `pkg/admission/plugin/policy/validating`:
//!
//! - `dispatcher.go` `Dispatch`: for each policy and each binding naming it,
//!   the policy's `matchConstraints` (resource rules, namespaceSelector,
//!   objectSelector on the old or new object), then the validator; the first Deny decision refuses
//!   the request as `<resource> "<name>" is forbidden: ValidatingAdmissionPolicy
//!   '<p>' with binding '<b>' denied request: <message>` with the code of the
//!   validation's `reason` (default Invalid: 422); Warn adds the warning
//!   `Validation failed for ValidatingAdmissionPolicy '<p>' with binding
//!   '<b>': <message>`; Audit writes an audit annotation (no audit log here).
//! - `validator.go` `Validate`: matchConditions (an error follows the
//!   failurePolicy, default Fail), variables, then every validation: an
//!   evaluation error follows the failurePolicy (its text is the message),
//!   a false result is a denial whose message is the messageExpression's
//!   string, else `message`, else `failed expression: <expression>`.
//!
//! It runs after every mutating plugin and after the type's validation
//! (`AllOrderedPlugins`, `rest.BeforeCreate` then `createValidation`), so it
//! sees the object as it would be stored. Not modelled, refused as
//! configuration errors under the failurePolicy: `paramKind`, binding
//! `matchResources`, `excludeResourceRules`, `auditAnnotations`.

use serde_json::Value;

use super::attributes::Attributes;
use super::cel as admission_cel;
use super::policy;
use crate::resources;
use crate::status::ApiError;
use crate::store::Store;

/// What the stored policies decided for one request.
#[derive(Debug, Default)]
pub struct Decision {
    pub warnings: Vec<String>,
    /// Failures a failurePolicy Ignore dropped.
    pub ignored: Vec<String>,
}

struct Invocation {
    policy: String,
    binding: String,
    spec: Value,
    binding_spec: Value,
}

fn invocations(store: &Store) -> Vec<Invocation> {
    let (policies, _) = store.list(&resources::VALIDATING_POLICIES, None);
    let (bindings, _) = store.list(&resources::VALIDATING_POLICY_BINDINGS, None);
    let name = |o: &Value| {
        o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let mut out = Vec::new();
    for p in policies.iter() {
        for b in bindings.iter() {
            if b["spec"]["policyName"].as_str() == Some(name(p).as_str()) {
                out.push(Invocation {
                    policy: name(p),
                    binding: name(b),
                    spec: p["spec"].clone(),
                    binding_spec: b["spec"].clone(),
                });
            }
        }
    }
    out.sort_by(|a, b| (&a.policy, &a.binding).cmp(&(&b.policy, &b.binding)));
    out
}

/// `matchConstraints.namespaceSelector` for a namespaced request, against
/// the namespace's labels (`MatchNamespaceSelector`; the API server labels
/// every namespace `kubernetes.io/metadata.name`, which the emulator assumes
/// for namespaces it does not store).
fn namespace_matches(store: &Store, spec: &Value, a: &Attributes<'_>) -> Result<bool, String> {
    let Some(sel) = spec["matchConstraints"].get("namespaceSelector") else {
        return Ok(true);
    };
    if a.namespace.is_empty() {
        return Ok(true);
    }
    let selector = crate::selectors::LabelSelector::from_object(sel)
        .map_err(|e| format!("matchConstraints.namespaceSelector: {e}"))?;
    let mut labels = store
        .get(&resources::NAMESPACES, "", a.namespace)
        .map(|n| crate::selectors::labels_of(&n))
        .unwrap_or_default();
    labels.insert("kubernetes.io/metadata.name".into(), a.namespace.into());
    Ok(selector.matches(&labels))
}

/// One validation's outcome: `Ok(None)` passed, `Ok(Some(msg))` denied,
/// `Err` an evaluation error.
fn validate_one(
    v: &Value,
    obj: &Value,
    old: &Value,
    request: &Value,
    variables: &Value,
) -> Result<Option<(String, String)>, String> {
    let expression = v["expression"].as_str().unwrap_or_default();
    let result = policy::eval(expression, obj, old, request, variables, false)?;
    if result == Value::Bool(true) {
        return Ok(None);
    }
    if !result.is_boolean() {
        return Err(format!(
            "expression {expression:?} did not evaluate to bool"
        ));
    }
    let from_expression = v["messageExpression"].as_str().and_then(|m| {
        policy::eval(m, obj, old, request, variables, false)
            .ok()
            .and_then(|r| r.as_str().map(|s| s.trim().to_string()))
            .filter(|s| !s.is_empty() && s.len() <= 5 * 1024 && !s.contains('\n'))
    });
    let message = from_expression
        .or_else(|| {
            v["message"]
                .as_str()
                .map(|m| m.trim().to_string())
                .filter(|m| !m.is_empty())
        })
        .unwrap_or_else(|| format!("failed expression: {}", expression.trim()));
    let reason = v["reason"].as_str().unwrap_or("Invalid").to_string();
    Ok(Some((message, reason)))
}

fn code_of(reason: &str) -> (u16, &'static str) {
    match reason {
        "Forbidden" => (403, "Forbidden"),
        "RequestEntityTooLarge" => (413, "RequestEntityTooLarge"),
        _ => (422, "Invalid"),
    }
}

/// Runs every bound policy on the object as it would be stored (`obj` is
/// null for a DELETE, `old` null for a CREATE).
pub fn admit(
    store: &Store,
    a: &Attributes<'_>,
    obj: &Value,
    old: &Value,
) -> Result<Decision, ApiError> {
    let mut decision = Decision::default();
    for inv in invocations(store) {
        let fail = inv.spec["failurePolicy"] != "Ignore";
        let actions: Vec<&str> = inv.binding_spec["validationActions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let label = format!(
            "ValidatingAdmissionPolicy '{}' with binding '{}'",
            inv.policy, inv.binding
        );
        let deny = |msg: &str, reason: &str| {
            let (code, reason) = code_of(reason);
            let forbidden = ApiError::forbidden(
                a.res.plural,
                a.res.group,
                a.name,
                &format!("{label} denied request: {msg}"),
            );
            ApiError {
                code,
                reason,
                ..forbidden
            }
        };
        // A failure of the policy itself (configuration or evaluation)
        // follows the failurePolicy.
        macro_rules! failed {
            ($why:expr) => {{
                let why: String = $why;
                if fail {
                    return Err(deny(&why, "Invalid"));
                }
                decision.ignored.push(format!("{label}: {why}"));
            }};
        }
        if inv.spec.get("paramKind").is_some()
            || inv.binding_spec.get("matchResources").is_some()
            || inv.spec["matchConstraints"]
                .get("excludeResourceRules")
                .is_some()
            || inv.spec.get("auditAnnotations").is_some()
        {
            failed!(
                "the emulator does not model paramKind, binding matchResources, excludeResourceRules or auditAnnotations"
                    .into()
            );
            continue;
        }
        match policy::matches(&inv.spec, a, obj, old)
            .and_then(|m| Ok(m && namespace_matches(store, &inv.spec, a)?))
        {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                failed!(format!("failed to configure policy: {e}"));
                continue;
            }
        }
        let request = admission_cel::request_variable(a);
        let conditions =
            nodegate_shared::match_conditions::named_conditions(&inv.spec["matchConditions"]);
        match admission_cel::match_all(conditions, obj, old, &request).0 {
            admission_cel::Verdict::Call => {}
            admission_cel::Verdict::Excluded(_) => continue,
            admission_cel::Verdict::Errors(errs) => {
                failed!(errs.join("; "));
                continue;
            }
        }
        let variables = match policy::eval_variables(&inv.spec, obj, old, &request) {
            Ok(v) => v,
            Err(e) => {
                failed!(e);
                continue;
            }
        };
        for v in inv.spec["validations"].as_array().into_iter().flatten() {
            let (message, reason) = match validate_one(v, obj, old, &request, &variables) {
                Ok(None) => continue,
                Ok(Some(denied)) => denied,
                Err(e) => {
                    failed!(e);
                    continue;
                }
            };
            for action in &actions {
                match *action {
                    "Deny" => return Err(deny(&message, &reason)),
                    "Warn" => decision
                        .warnings
                        .push(format!("Validation failed for {label}: {message}")),
                    // An audit annotation; the emulator keeps no audit log.
                    _ => {}
                }
            }
        }
    }
    Ok(decision)
}
