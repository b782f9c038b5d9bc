//! `matchConditions` as CEL, with the variables the API server binds:
//! `object`, `oldObject` (null on CREATE) and `request` (the AdmissionRequest).

use serde_json::Value;

/// Evaluates one match condition. `Err` is an evaluation error, which the
/// caller resolves with the webhook's failurePolicy.
pub fn eval_condition(
    expression: &str,
    object: &Value,
    old_object: &Value,
    request: &Value,
) -> Result<bool, String> {
    let program =
        cel::Program::compile(expression).map_err(|e| format!("compilation failed: {e}"))?;
    // `request` is typed in the API server: declared fields read as their
    // zero value when unset (e.g. `request.subResource == ''` on the main resource).
    let mut request = request.clone();
    if let Some(m) = request.as_object_mut() {
        for f in [
            "uid",
            "subResource",
            "requestSubResource",
            "name",
            "namespace",
            "operation",
        ] {
            m.entry(f).or_insert(Value::String(String::new()));
        }
        m.entry("dryRun").or_insert(Value::Bool(false));
    }
    let mut ctx = cel::Context::default();
    for (name, v) in [
        ("object", object),
        ("oldObject", old_object),
        ("request", &request),
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const BOOT_CHANGED: &str = "request.subResource != 'status' || \
        (has(object.status) && has(object.status.nodeInfo) && has(object.status.nodeInfo.bootID) && \
         has(oldObject.status) && has(oldObject.status.nodeInfo) && has(oldObject.status.nodeInfo.bootID) && \
         object.status.nodeInfo.bootID != oldObject.status.nodeInfo.bootID)";

    fn node(boot: &str) -> Value {
        json!({"metadata": {"name": "n"}, "status": {"nodeInfo": {"bootID": boot}}})
    }

    #[test]
    fn boot_id_condition() {
        let status = json!({"subResource": "status", "operation": "UPDATE"});
        let main = json!({"operation": "UPDATE"});
        assert!(!eval_condition(BOOT_CHANGED, &node("a"), &node("a"), &status).unwrap());
        assert!(eval_condition(BOOT_CHANGED, &node("b"), &node("a"), &status).unwrap());
        assert!(eval_condition(BOOT_CHANGED, &node("a"), &node("a"), &main).unwrap());
        assert!(
            !eval_condition(BOOT_CHANGED, &json!({"metadata": {}}), &node("a"), &status).unwrap()
        );
    }

    #[test]
    fn errors_are_reported_not_panicked() {
        let r = json!({});
        assert!(eval_condition("object.nope.deeper == 1", &json!({}), &Value::Null, &r).is_err());
        assert!(eval_condition("'str'", &json!({}), &Value::Null, &r).is_err());
        assert!(eval_condition("((", &json!({}), &Value::Null, &r).is_err());
    }
}
