//! Validation of the admission configuration objects at create and update,
//! after kubernetes `pkg/apis/admissionregistration/validation/validation.go`:
//!
//! - `validateMutatingAdmissionPolicySpec`, `validateValidatingAdmissionPolicySpec`:
//!   matchConstraints with at least one resource rule (MAP: no DELETE),
//!   failurePolicy and reinvocationPolicy values, variables (CEL identifiers,
//!   compiled in order with a composited compiler), mutations or validations.
//! - `validateMatchConditions`: at most 64, names unique, each expression
//!   compiled with the **stateless** compiler (no `variables`), params only
//!   for a policy with a paramKind, never for webhooks.
//! - `validateJSONPatch`/`validateApplyConfiguration`: compiled with the patch
//!   types (`HasPatchTypes`); `validateMessageExpression`: no authorizer.
//! - `convertCELErrorToValidationError`: a compile error is
//!   `field.Invalid(path, expression, "compilation failed: …")`.
//! - `validateValidationActions`: non-empty, known, unique, not Deny with Warn.
//! - `validateResources`: a rule's resources, with their wildcard rules.
//!
//! Structural rules that defaulting makes unreachable (failurePolicy,
//! matchPolicy, selectors) are not checked.

use serde_json::Value;

use super::cel_compile::{self, Decls, Output, Ty};

/// One `field.Error`: the path and the body (`Invalid value: …`).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub field: String,
    pub detail: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

/// Go's `%q` for the values shown in errors (JSON escaping is the same for
/// what expressions contain).
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, field: impl Into<String>, detail: String) {
        self.0.push(FieldError {
            field: field.into(),
            detail,
        });
    }

    fn required(&mut self, field: impl Into<String>, why: &str) {
        let detail = if why.is_empty() {
            "Required value".to_string()
        } else {
            format!("Required value: {why}")
        };
        self.push(field, detail);
    }

    fn invalid(&mut self, field: impl Into<String>, value: &str, why: &str) {
        self.push(field, format!("Invalid value: {}: {why}", quoted(value)));
    }

    fn not_supported(&mut self, field: impl Into<String>, value: &str, supported: &[&str]) {
        let list: Vec<String> = supported.iter().map(|s| quoted(s)).collect();
        self.push(
            field,
            format!(
                "Unsupported value: {}: supported values: {}",
                quoted(value),
                list.join(", ")
            ),
        );
    }

    /// Compiles an expression (trimmed, as the validation does) and records
    /// a compile error as `field.Invalid`. The output type, or dyn on error.
    fn cel(&mut self, field: String, expression: &Value, decls: &Decls, output: Output) -> Ty {
        let Some(text) = expression.as_str().filter(|t| !t.trim().is_empty()) else {
            self.required(field, "expression is not specified");
            return Ty::Dyn;
        };
        match cel_compile::compile(text.trim(), decls, output) {
            Ok(t) => t,
            Err(why) => {
                self.invalid(field, text.trim(), &why);
                Ty::Dyn
            }
        }
    }
}

fn items(v: &Value) -> impl Iterator<Item = (usize, &Value)> {
    v.as_array().into_iter().flatten().enumerate()
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// The errors of one admission configuration object, or none for any other
/// kind.
pub fn validate(kind: &str, obj: &Value) -> Vec<FieldError> {
    let mut e = Errors::default();
    let spec = &obj["spec"];
    match kind {
        "MutatingAdmissionPolicy" => policy_spec(&mut e, spec, true),
        "ValidatingAdmissionPolicy" => policy_spec(&mut e, spec, false),
        "MutatingAdmissionPolicyBinding" => binding_spec(&mut e, spec, false),
        "ValidatingAdmissionPolicyBinding" => binding_spec(&mut e, spec, true),
        "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration" => {
            for (i, hook) in items(&obj["webhooks"]) {
                if let Some(path) = hook
                    .pointer("/clientConfig/service/path")
                    .and_then(Value::as_str)
                {
                    service_path(
                        &mut e,
                        &format!("webhooks[{i}].clientConfig.service.path"),
                        path,
                    );
                }
                let decls = Decls {
                    authorizer: true,
                    ..Decls::default()
                };
                match_conditions(
                    &mut e,
                    &format!("webhooks[{i}].matchConditions"),
                    &hook["matchConditions"],
                    &decls,
                );
            }
        }
        _ => {}
    }
    e.0
}

/// `ValidateWebhookService` (k8s.io/apiserver `pkg/util/webhook/validation.go`):
/// a path other than empty or `/` starts with `/`, and each segment (a
/// trailing `/` dropped) is a lowercase DNS-1123 subdomain.
fn service_path(e: &mut Errors, field: &str, path: &str) {
    if path.is_empty() || path == "/" {
        return;
    }
    if path == "//" {
        e.push(
            field,
            format!("Invalid value: {path:?}: segment[0] may not be empty"),
        );
        return;
    }
    let Some(rest) = path.strip_prefix('/') else {
        e.push(
            field,
            format!("Invalid value: {path:?}: must start with a '/'"),
        );
        return;
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    for (i, segment) in rest.split('/').enumerate() {
        if segment.is_empty() {
            e.push(
                field,
                format!("Invalid value: {path:?}: segment[{i}] may not be empty"),
            );
        } else if !nodegate_shared::taint::is_dns1123_subdomain(segment) {
            e.push(
                field,
                format!("Invalid value: {path:?}: segment[{i}]: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"),
            );
        }
    }
}

fn policy_spec(e: &mut Errors, spec: &Value, mutating: bool) {
    let params = spec.get("paramKind").is_some_and(|p| !p.is_null());
    if let Some(f) = spec.get("failurePolicy").and_then(Value::as_str)
        && f != "Fail"
        && f != "Ignore"
    {
        e.not_supported("spec.failurePolicy", f, &["Fail", "Ignore"]);
    }
    match_constraints(e, spec, mutating);
    match_conditions(
        e,
        "spec.matchConditions",
        &spec["matchConditions"],
        &Decls {
            params,
            authorizer: true,
            ..Decls::default()
        },
    );
    // Variables: a composited compiler (for a VAP only when it has any).
    let composited = mutating || !spec["variables"].as_array().is_none_or(Vec::is_empty);
    let mut variables: Vec<(String, Ty)> = Vec::new();
    for (i, v) in items(&spec["variables"]) {
        let name = text(&v["name"]);
        let path = format!("spec.variables[{i}]");
        if name.trim().is_empty() {
            e.required(format!("{path}.name"), "name is not specified");
        } else if !is_cel_identifier(name) {
            e.invalid(
                format!("{path}.name"),
                name,
                "must be a valid CEL identifier",
            );
        }
        let decls = Decls {
            params,
            authorizer: true,
            variables: Some(variables.clone()),
            ..Decls::default()
        };
        let t = e.cel(
            format!("{path}.expression"),
            &v["expression"],
            &decls,
            Output::Any,
        );
        variables.push((name.to_string(), cel_compile::variable_field_type(&t)));
    }
    let with = |authorizer: bool, patch_types: bool| Decls {
        params,
        authorizer,
        patch_types,
        variables: composited.then(|| variables.clone()),
    };
    if mutating {
        mutations(e, spec, &with(true, true));
        match spec.get("reinvocationPolicy").and_then(Value::as_str) {
            Some("Never" | "IfNeeded") => {}
            Some(other) => {
                e.not_supported("spec.reinvocationPolicy", other, &["IfNeeded", "Never"])
            }
            None => e.required("spec.reinvocationPolicy", ""),
        }
    } else {
        validations(e, spec, &with(true, false), &with(false, false));
    }
}

fn match_constraints(e: &mut Errors, spec: &Value, mutating: bool) {
    let Some(constraints) = spec.get("matchConstraints").filter(|c| !c.is_null()) else {
        e.required("spec.matchConstraints", "");
        return;
    };
    let rules = &constraints["resourceRules"];
    if rules.as_array().is_none_or(Vec::is_empty) {
        e.required(
            "spec.matchConstraints.resourceRules",
            "at least one resourceRule must be defined to provide type information",
        );
    }
    let supported: &[&str] = if mutating {
        &["*", "CONNECT", "CREATE", "UPDATE"]
    } else {
        &["*", "CONNECT", "CREATE", "DELETE", "UPDATE"]
    };
    for (i, rule) in items(rules) {
        let path = format!("spec.matchConstraints.resourceRules[{i}].operations");
        let ops: Vec<&str> = items(&rule["operations"]).map(|(_, o)| text(o)).collect();
        if ops.is_empty() {
            e.required(path.clone(), "");
        }
        for op in &ops {
            if !supported.contains(op) {
                e.not_supported(path.clone(), op, supported);
            }
        }
        if ops.len() > 1 && ops.contains(&"*") {
            e.invalid(
                path,
                &ops.join(","),
                "if '*' is present, must not specify other operations",
            );
        }
        resources(
            e,
            &format!("spec.matchConstraints.resourceRules[{i}].resources"),
            &rule["resources"],
        );
    }
}

/// `validateResources`: the wildcard rules of a rule's resources list
/// (`*` all resources, `*/*` all resources and subresources, `x/*`, `*/x`).
fn resources(e: &mut Errors, path: &str, list: &Value) {
    let all: Vec<&str> = items(list).map(|(_, r)| text(r)).collect();
    if all.is_empty() {
        e.required(path, "");
    }
    let shown = serde_json::to_string(&all).unwrap_or_default();
    let (mut wild_sub, mut wild_res) = (Vec::new(), Vec::new());
    let (mut double, mut single, mut without_sub) = (false, false, false);
    for (i, r) in all.iter().enumerate() {
        if r.is_empty() {
            e.required(format!("{path}[{i}]"), "");
            continue;
        }
        double |= *r == "*/*";
        single |= *r == "*";
        let Some((res, sub)) = r.split_once('/') else {
            without_sub = *r != "*";
            continue;
        };
        if wild_sub.contains(&res) {
            e.invalid(
                format!("{path}[{i}]"),
                r,
                &format!("if '{res}/*' is present, must not specify {r}"),
            );
        }
        if wild_res.contains(&sub) {
            e.invalid(
                format!("{path}[{i}]"),
                r,
                &format!("if '*/{sub}' is present, must not specify {r}"),
            );
        }
        if sub == "*" {
            wild_sub.push(res);
        }
        if res == "*" {
            wild_res.push(sub);
        }
    }
    if all.len() > 1 && double {
        e.push(
            path,
            format!(
                "Invalid value: {shown}: if '*/*' is present, must not specify other resources"
            ),
        );
    }
    if single && without_sub {
        e.push(path, format!("Invalid value: {shown}: if '*' is present, must not specify other resources without subresources"));
    }
}

fn match_conditions(e: &mut Errors, path: &str, list: &Value, decls: &Decls) {
    let conditions: Vec<&Value> = items(list).map(|(_, c)| c).collect();
    if conditions.len() > 64 {
        e.push(
            path,
            format!("Too many: {}: must have at most 64 items", conditions.len()),
        );
    }
    let mut seen = std::collections::HashSet::new();
    for (i, c) in conditions.iter().enumerate() {
        let name = text(&c["name"]);
        if name.is_empty() {
            e.required(format!("{path}[{i}].name"), "");
        } else if !seen.insert(name) {
            e.push(
                format!("{path}[{i}].name"),
                format!("Duplicate value: {}", quoted(name)),
            );
        }
        e.cel(
            format!("{path}[{i}].expression"),
            &c["expression"],
            decls,
            Output::Bool,
        );
    }
}

fn mutations(e: &mut Errors, spec: &Value, decls: &Decls) {
    let list: Vec<&Value> = items(&spec["mutations"]).map(|(_, m)| m).collect();
    if list.is_empty() {
        e.required("spec.mutations", "mutations must contain at least one item");
    }
    for (i, m) in list.iter().enumerate() {
        let path = format!("spec.mutations[{i}]");
        match text(&m["patchType"]) {
            "JSONPatch" => {
                e.cel(
                    format!("{path}.jsonPatch.expression"),
                    &m["jsonPatch"]["expression"],
                    decls,
                    Output::JsonPatches,
                );
            }
            "ApplyConfiguration" => {
                e.cel(
                    format!("{path}.applyConfiguration.expression"),
                    &m["applyConfiguration"]["expression"],
                    decls,
                    Output::ApplyConfiguration,
                );
            }
            "" => e.required(format!("{path}.patchType"), ""),
            other => e.not_supported(
                format!("{path}.patchType"),
                other,
                &["ApplyConfiguration", "JSONPatch"],
            ),
        }
    }
}

fn validations(e: &mut Errors, spec: &Value, decls: &Decls, message_decls: &Decls) {
    let list: Vec<&Value> = items(&spec["validations"]).map(|(_, v)| v).collect();
    let audit: Vec<&Value> = items(&spec["auditAnnotations"]).map(|(_, v)| v).collect();
    if list.is_empty() && audit.is_empty() {
        let why = "validations or auditAnnotations must contain at least one item";
        e.required("spec.validations", why);
        e.required("spec.auditAnnotations", why);
    }
    for (i, v) in list.iter().enumerate() {
        let path = format!("spec.validations[{i}]");
        e.cel(
            format!("{path}.expression"),
            &v["expression"],
            decls,
            Output::Bool,
        );
        if let Some(m) = v.get("messageExpression").and_then(Value::as_str) {
            if m.trim().is_empty() {
                e.invalid(
                    format!("{path}.messageExpression"),
                    m,
                    "must be non-empty if specified",
                );
            } else {
                e.cel(
                    format!("{path}.messageExpression"),
                    &v["messageExpression"],
                    message_decls,
                    Output::String,
                );
            }
        }
        if let Some(m) = v.get("message").and_then(Value::as_str) {
            if m.trim().is_empty() {
                e.invalid(
                    format!("{path}.message"),
                    m,
                    "must be non-empty if specified",
                );
            } else if m.contains('\n') {
                e.invalid(format!("{path}.message"), m, "must not contain line breaks");
            }
        }
        if let Some(r) = v.get("reason").and_then(Value::as_str)
            && !["Forbidden", "Invalid", "RequestEntityTooLarge"].contains(&r)
        {
            e.not_supported(
                format!("{path}.reason"),
                r,
                &["Forbidden", "Invalid", "RequestEntityTooLarge"],
            );
        }
    }
    for (i, a) in audit.iter().enumerate() {
        e.cel(
            format!("spec.auditAnnotations[{i}].valueExpression"),
            &a["valueExpression"],
            decls,
            Output::StringOrNull,
        );
    }
}

fn binding_spec(e: &mut Errors, spec: &Value, validating: bool) {
    if text(&spec["policyName"]).is_empty() {
        e.required("spec.policyName", "");
    }
    if !validating {
        return;
    }
    let actions: Vec<&str> = items(&spec["validationActions"])
        .map(|(_, a)| text(a))
        .collect();
    if actions.is_empty() {
        e.required(
            "spec.validationActions",
            "at least one validation action is required",
        );
    }
    let mut seen = std::collections::HashSet::new();
    for (i, a) in actions.iter().enumerate() {
        let path = format!("spec.validationActions[{i}]");
        if !["Deny", "Warn", "Audit"].contains(a) {
            e.not_supported(path, a, &["Audit", "Deny", "Warn"]);
        } else if !seen.insert(*a) {
            e.push(path, format!("Duplicate value: {}", quoted(a)));
        }
    }
    if actions.contains(&"Deny") && actions.contains(&"Warn") {
        e.push(
            "spec.validationActions",
            format!(
                "Invalid value: {}: must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)",
                serde_json::to_string(&actions).unwrap_or_default()
            ),
        );
    }
}

/// `isCELIdentifier`: `[_a-zA-Z][_a-zA-Z0-9]*`, not a CEL reserved word.
fn is_cel_identifier(name: &str) -> bool {
    const RESERVED: &[&str] = &[
        "true",
        "false",
        "null",
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
    ];
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        && !RESERVED.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(variable: &str, mutation: &str) -> Value {
        json!({"spec": {
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["nodes"]}]},
            "variables": [{"name": "missing", "expression": variable}],
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": mutation}}],
        }})
    }

    #[test]
    fn resource_wildcards_follow_validate_resources() {
        let cases: [(&[&str], Option<&str>); 6] = [
            (&["nodes", "nodes/status"], None),
            (&["*/*"], None),
            (
                &["*", "*/*"],
                Some("if '*/*' is present, must not specify other resources"),
            ),
            (
                &["*", "nodes"],
                Some("if '*' is present, must not specify other resources without subresources"),
            ),
            (
                &["nodes/*", "nodes/status"],
                Some("if 'nodes/*' is present, must not specify nodes/status"),
            ),
            (&[], Some("Required value")),
        ];
        for (list, want) in cases {
            let mut e = Errors::default();
            resources(&mut e, "r", &serde_json::json!(list));
            match want {
                None => assert!(e.0.is_empty(), "{list:?}: {:?}", e.0),
                Some(w) => assert!(
                    e.0.iter().any(|f| f.detail.contains(w)),
                    "{list:?}: {:?}",
                    e.0
                ),
            }
        }
    }

    #[test]
    fn an_object_literal_in_a_variable_is_refused_and_accepted_in_a_mutation() {
        let literal = "[Object.spec.taints{key: 'k', effect: 'NoSchedule'}]";
        let errs = validate(
            "MutatingAdmissionPolicy",
            &map(
                literal,
                "variables.missing.map(t, JSONPatch{op: 'add', path: '/spec/taints/-', value: t})",
            ),
        );
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "spec.variables[0].expression");
        assert!(
            errs[0].detail.starts_with(&format!(
                "Invalid value: {}: compilation failed: ERROR: <input>:1:20: undeclared reference to 'Object.spec.taints' (in container '')",
                quoted(literal)
            )),
            "{}",
            errs[0]
        );
        let in_mutation =
            format!("{literal}.map(t, JSONPatch{{op: 'add', path: '/spec/taints/-', value: t}})");
        assert!(validate("MutatingAdmissionPolicy", &map("[1]", &in_mutation)).is_empty());
    }

    #[test]
    fn match_conditions_see_no_variables_and_must_be_bool() {
        let mut p = map("[1]", "[JSONPatch{op: 'add', path: '/a', value: 1}]");
        p["spec"]["matchConditions"] = json!([
            {"name": "a", "expression": "size(variables.missing) > 0"},
            {"name": "a", "expression": "object.spec"},
        ]);
        let errs = validate("MutatingAdmissionPolicy", &p);
        let shown: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(errs.len(), 3, "{shown:?}");
        assert!(shown[0].contains("undeclared reference to 'variables'"));
        assert_eq!(
            shown[1],
            "spec.matchConditions[1].name: Duplicate value: \"a\""
        );
        assert!(shown[2].ends_with("must evaluate to bool but got dyn"));
    }

    #[test]
    fn structure_of_policies_and_bindings() {
        let mut p = map("[1]", "[]");
        p["spec"]["matchConstraints"]["resourceRules"][0]["operations"] = json!(["DELETE"]);
        p["spec"]["variables"][0]["name"] = json!("in");
        p["spec"]["mutations"] = json!([]);
        let shown: Vec<String> = validate("MutatingAdmissionPolicy", &p)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(
            shown[0].starts_with(
                "spec.matchConstraints.resourceRules[0].operations: Unsupported value: \"DELETE\""
            ),
            "{shown:?}"
        );
        assert!(
            shown[1].contains("must be a valid CEL identifier"),
            "{shown:?}"
        );
        assert!(
            shown[2].contains("mutations must contain at least one item"),
            "{shown:?}"
        );
        let b = json!({"spec": {"policyName": "p", "validationActions": ["Deny", "Warn"]}});
        let shown: Vec<String> = validate("ValidatingAdmissionPolicyBinding", &b)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(shown.len(), 1);
        assert!(shown[0].contains("must not contain both Deny and Warn"));
        let none = json!({"spec": {"policyName": "p"}});
        assert_eq!(validate("ValidatingAdmissionPolicyBinding", &none).len(), 1);
    }

    #[test]
    fn validating_policies_type_messages_and_see_variables_only_when_declared() {
        let vap = |variables: Value, expression: &str, message: &str| {
            json!({"spec": {
                "matchConstraints": {"resourceRules": [{"operations": ["UPDATE"], "resources": ["nodes"]}]},
                "variables": variables,
                "validations": [{"expression": expression, "messageExpression": message}],
            }})
        };
        let ok = vap(
            json!([{"name": "node", "expression": "request.userInfo.extra['authentication.kubernetes.io/node-name'][0]"}]),
            "variables.node == object.metadata.name",
            "'only node ' + variables.node",
        );
        assert_eq!(validate("ValidatingAdmissionPolicy", &ok), Vec::new());
        let no_vars = vap(json!([]), "variables.node == 'a'", "'m'");
        let errs = validate("ValidatingAdmissionPolicy", &no_vars);
        assert!(
            errs[0]
                .detail
                .contains("undeclared reference to 'variables'"),
            "{errs:?}"
        );
        let authz_in_message = vap(
            json!([]),
            "true",
            "authorizer.path('/').check('get').reason()",
        );
        let errs = validate("ValidatingAdmissionPolicy", &authz_in_message);
        assert_eq!(errs[0].field, "spec.validations[0].messageExpression");
        assert!(
            errs[0]
                .detail
                .contains("undeclared reference to 'authorizer'"),
            "{errs:?}"
        );
    }

    /// The real API server refused a base64url token in a webhook path
    /// (uppercase, `_`): each segment must be a lowercase DNS-1123 subdomain.
    #[test]
    fn webhook_service_paths_are_lowercase_dns_segments() {
        let mwc = |path: &str| json!({"webhooks": [{"name": "a", "clientConfig": {"service": {"name": "s", "namespace": "n", "path": path}}}]});
        for ok in ["", "/", "/mutate", "/mutate/0f3a9d2c4e6b", "/a.b/c-d/"] {
            assert_eq!(
                validate("MutatingWebhookConfiguration", &mwc(ok)),
                Vec::new(),
                "{ok}"
            );
        }
        for (bad, why) in [
            (
                "/mutate/dBDaQCWK_h73",
                "segment[1]: a lowercase RFC 1123 subdomain",
            ),
            ("mutate", "must start with a '/'"),
            ("//", "segment[0] may not be empty"),
            ("/a//b", "segment[1] may not be empty"),
        ] {
            let errs = validate("MutatingWebhookConfiguration", &mwc(bad));
            assert_eq!(errs.len(), 1, "{bad}: {errs:?}");
            assert_eq!(errs[0].field, "webhooks[0].clientConfig.service.path");
            assert!(errs[0].detail.contains(why), "{bad}: {errs:?}");
        }
    }

    #[test]
    fn webhook_match_conditions_have_no_params() {
        let mwc = json!({"webhooks": [{"matchConditions": [
            {"name": "p", "expression": "params.a == 1"}]}]});
        let errs = validate("MutatingWebhookConfiguration", &mwc);
        assert_eq!(errs[0].field, "webhooks[0].matchConditions[0].expression");
        assert!(errs[0].detail.contains("undeclared reference to 'params'"));
    }
}
