//! `matchConditions` as CEL, with the variables bound as kube-apiserver binds
//! them, and the all-conditions verdict of its matcher.
//!
//! Upstream (k8s.io/apiserver):
//! - `pkg/admission/plugin/cel/filter.go` `CreateAdmissionRequest` builds the
//!   `request` variable: no uid, no object/oldObject, `dryRun` always set (a
//!   `*bool`), `options` from the operation options.
//! - `convertObjectToUnstructured` → apimachinery
//!   `runtime.DefaultUnstructuredConverter.ToUnstructured`: an `omitempty`
//!   field that is empty (`isZero`: "" / nil pointer / empty map or slice) is
//!   **absent**, so reading it is a CEL "no such key" error, never `''`.
//! - `pkg/admission/plugin/webhook/matchconditions/matcher.go` `Match`: any
//!   condition false → not called (errors or not); else any error → the
//!   failurePolicy decides; every error is counted.

use serde_json::{Map, Value, json};

use super::Attributes;

/// The `request` variable: the AdmissionRequest as `CreateAdmissionRequest`
/// builds it, turned into unstructured JSON with `omitempty` honoured.
pub fn request_variable(a: &Attributes<'_>) -> Value {
    let gvk = json!({"group": a.res.group, "version": a.res.version, "kind": a.res.kind});
    let gvr = json!({"group": a.res.group, "version": a.res.version, "resource": a.res.plural});
    let mut user = Map::new();
    let info = crate::users::user_info(a.user);
    // authentication/v1 UserInfo: username, uid, groups, extra are all omitempty.
    if !a.user.is_empty() {
        user.insert("username".into(), json!(a.user));
    }
    if let Some(g) = info
        .get("groups")
        .filter(|g| g.as_array().is_some_and(|g| !g.is_empty()))
    {
        user.insert("groups".into(), g.clone());
    }
    let mut r = Map::new();
    // `uid` has no omitempty and is left unset: present as "".
    r.insert("uid".into(), json!(""));
    r.insert("kind".into(), gvk.clone());
    r.insert("resource".into(), gvr.clone());
    r.insert("requestKind".into(), gvk);
    r.insert("requestResource".into(), gvr);
    for (key, v) in [
        ("subResource", a.subresource),
        ("requestSubResource", a.subresource),
        ("name", a.name),
        ("namespace", a.namespace),
    ] {
        if !v.is_empty() {
            r.insert(key.into(), json!(v));
        }
    }
    r.insert("operation".into(), json!(a.operation.as_str()));
    r.insert("userInfo".into(), Value::Object(user));
    // RawExtension fields are structs (never "empty"), left unset → null.
    r.insert("object".into(), Value::Null);
    r.insert("oldObject".into(), Value::Null);
    r.insert("dryRun".into(), json!(a.dry_run));
    r.insert("options".into(), a.options.clone());
    Value::Object(r)
}

/// Evaluates one match condition. `Err` is an evaluation (or compilation)
/// error, which the matcher resolves with the failurePolicy.
pub fn eval_condition(
    expression: &str,
    object: &Value,
    old_object: &Value,
    request: &Value,
) -> Result<bool, String> {
    let program =
        cel::Program::compile(expression).map_err(|e| format!("compilation failed: {e}"))?;
    let mut ctx = cel::Context::default();
    for (name, v) in [
        ("object", object),
        ("oldObject", old_object),
        ("request", request),
    ] {
        let v = cel::to_value(v).map_err(|e| format!("binding {name}: {e}"))?;
        ctx.add_variable_from_value(name, v);
    }
    match program.execute(&ctx) {
        Ok(cel::Value::Bool(b)) => Ok(b),
        Ok(other) => Err(format!("expression did not evaluate to bool: {other:?}")),
        Err(e) => Err(format!("evaluation failed: {e}")),
    }
}

/// What the matcher decided for one webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every condition is true: call the webhook.
    Call,
    /// A condition is false (named): skip, whatever the other conditions did.
    Excluded(String),
    /// No condition is false, at least one errored: the failurePolicy decides.
    Errors(Vec<String>),
}

/// `matcher.go` `Match` over all conditions. Returns the verdict and how many
/// conditions errored (each is counted, even when another is false).
pub fn match_all<'a>(
    conditions: impl IntoIterator<Item = (&'a str, &'a str)>,
    object: &Value,
    old_object: &Value,
    request: &Value,
) -> (Verdict, usize) {
    let mut errors = Vec::new();
    let mut counted = 0;
    for (name, expression) in conditions {
        match eval_condition(expression, object, old_object, request) {
            Ok(true) => {}
            Ok(false) => return (Verdict::Excluded(name.to_string()), counted),
            Err(e) => {
                counted += 1;
                errors.push(format!("{name}: {e}"));
            }
        }
    }
    if errors.is_empty() {
        (Verdict::Call, 0)
    } else {
        (Verdict::Errors(errors), counted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Operation;
    use crate::resources;

    fn attrs(sub: &'static str, op: Operation, dry: bool) -> Attributes<'static> {
        Attributes {
            res: &resources::NODES,
            subresource: sub,
            operation: op,
            name: "n1",
            namespace: "",
            user: "system:node:n1",
            dry_run: dry,
            options: json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}),
        }
    }

    fn node(boot: &str) -> Value {
        json!({"metadata": {"name": "n"}, "status": {"nodeInfo": {"bootID": boot}}})
    }

    /// The expression shipped before the real-cluster fix.
    const OLD: &str = "request.subResource != 'status' || \
        (has(object.status) && has(object.status.nodeInfo) && has(object.status.nodeInfo.bootID) && \
         has(oldObject.status) && has(oldObject.status.nodeInfo) && has(oldObject.status.nodeInfo.bootID) && \
         object.status.nodeInfo.bootID != oldObject.status.nodeInfo.bootID)";
    const FIXED: &str = "!has(request.subResource) || request.subResource != 'status' || \
        (has(object.status) && has(object.status.nodeInfo) && has(object.status.nodeInfo.bootID) && \
         has(oldObject.status) && has(oldObject.status.nodeInfo) && has(oldObject.status.nodeInfo.bootID) && \
         object.status.nodeInfo.bootID != oldObject.status.nodeInfo.bootID)";

    #[test]
    fn request_omits_empty_omitempty_fields() {
        let r = request_variable(&attrs("", Operation::Create, false));
        let m = r.as_object().unwrap();
        for absent in ["subResource", "requestSubResource", "namespace"] {
            assert!(!m.contains_key(absent), "{absent} must be absent: {r}");
        }
        assert_eq!(r["uid"], "", "uid has no omitempty");
        assert_eq!(
            r["dryRun"], false,
            "dryRun is a set *bool: present when false"
        );
        assert_eq!(r["object"], Value::Null);
        assert_eq!(r["name"], "n1");
        assert_eq!(r["userInfo"]["username"], "system:node:n1");
        assert_eq!(
            r["kind"],
            json!({"group": "", "version": "v1", "kind": "Node"})
        );
        let s = request_variable(&attrs("status", Operation::Update, true));
        assert_eq!(s["subResource"], "status");
        assert_eq!(s["requestSubResource"], "status");
        assert_eq!(s["dryRun"], true);
    }

    #[test]
    fn absent_field_is_an_error_and_has_guards_it() {
        let req = request_variable(&attrs("", Operation::Create, false));
        let e = eval_condition(
            "request.subResource != 'status'",
            &node("a"),
            &Value::Null,
            &req,
        )
        .unwrap_err();
        assert!(e.contains("subResource"), "{e}");
        assert!(
            eval_condition("!has(request.subResource)", &node("a"), &Value::Null, &req).unwrap()
        );
        // CEL's || absorbs an error only when the other side is true.
        assert!(
            eval_condition(
                "request.subResource == 'x' || true",
                &node("a"),
                &Value::Null,
                &req
            )
            .unwrap()
        );
        assert!(
            eval_condition(
                "request.subResource == 'x' || false",
                &node("a"),
                &Value::Null,
                &req
            )
            .is_err()
        );
    }

    #[test]
    fn old_expression_errors_on_create_fixed_one_matches() {
        let create = request_variable(&attrs("", Operation::Create, false));
        assert!(eval_condition(OLD, &node("a"), &Value::Null, &create).is_err());
        assert!(eval_condition(FIXED, &node("a"), &Value::Null, &create).unwrap());
        let main = request_variable(&attrs("", Operation::Update, false));
        assert!(eval_condition(OLD, &node("a"), &node("a"), &main).is_err());
        assert!(eval_condition(FIXED, &node("a"), &node("a"), &main).unwrap());
        let status = request_variable(&attrs("status", Operation::Update, false));
        assert!(!eval_condition(FIXED, &node("a"), &node("a"), &status).unwrap());
        assert!(eval_condition(FIXED, &node("b"), &node("a"), &status).unwrap());
        assert!(!eval_condition(FIXED, &json!({"metadata": {}}), &node("a"), &status).unwrap());
    }

    #[test]
    fn any_false_wins_over_errors_and_errors_are_counted() {
        let req = request_variable(&attrs("", Operation::Create, false));
        let obj = node("a");
        let (v, n) = match_all(
            [("err", "request.subResource == 'x'"), ("no", "false")],
            &obj,
            &Value::Null,
            &req,
        );
        assert_eq!(v, Verdict::Excluded("no".into()));
        assert_eq!(n, 1);
        let (v, n) = match_all(
            [("yes", "true"), ("err", "request.subResource == 'x'")],
            &obj,
            &Value::Null,
            &req,
        );
        assert!(matches!(&v, Verdict::Errors(e) if e.len() == 1 && e[0].starts_with("err: ")));
        assert_eq!(n, 1);
        assert_eq!(
            match_all([("yes", "true")], &obj, &Value::Null, &req),
            (Verdict::Call, 0)
        );
    }

    #[test]
    fn errors_are_reported_not_panicked() {
        let r = json!({});
        assert!(eval_condition("object.nope.deeper == 1", &json!({}), &Value::Null, &r).is_err());
        assert!(eval_condition("'str'", &json!({}), &Value::Null, &r).is_err());
        assert!(eval_condition("((", &json!({}), &Value::Null, &r).is_err());
        assert!(eval_condition("has(oldObject.status)", &json!({}), &Value::Null, &r).is_err());
    }
}
