//! Webhook `matchConditions` as kube-apiserver evaluates them: the `request`
//! variable bound as the server binds it, and the all-conditions verdict.
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

/// What the API server knows of a request, as far as `request` shows it.
#[derive(Debug, Clone)]
pub struct RequestAttributes<'a> {
    pub group: &'a str,
    pub version: &'a str,
    pub kind: &'a str,
    /// Plural resource name (`nodes`).
    pub resource: &'a str,
    /// "" for the main resource.
    pub subresource: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    /// CREATE, UPDATE, DELETE, CONNECT.
    pub operation: &'a str,
    pub username: &'a str,
    pub groups: &'a [String],
    /// `userInfo.extra`, e.g. the node claim of a pod-bound token.
    pub extra: &'a std::collections::BTreeMap<String, Vec<String>>,
    pub dry_run: bool,
    /// CreateOptions / UpdateOptions / DeleteOptions.
    pub options: Value,
}

/// The `request` variable: the AdmissionRequest as `CreateAdmissionRequest`
/// builds it, turned into unstructured JSON with `omitempty` honoured.
pub fn request_variable(a: &RequestAttributes<'_>) -> Value {
    let gvk = json!({"group": a.group, "version": a.version, "kind": a.kind});
    let gvr = json!({"group": a.group, "version": a.version, "resource": a.resource});
    // authentication/v1 UserInfo: username, uid, groups, extra are all omitempty.
    let mut user = Map::new();
    if !a.username.is_empty() {
        user.insert("username".into(), json!(a.username));
    }
    if !a.groups.is_empty() {
        user.insert("groups".into(), json!(a.groups));
    }
    if !a.extra.is_empty() {
        user.insert("extra".into(), json!(a.extra));
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
    r.insert("operation".into(), json!(a.operation));
    r.insert("userInfo".into(), Value::Object(user));
    // RawExtension fields are structs (never "empty"), left unset → null.
    r.insert("object".into(), Value::Null);
    r.insert("oldObject".into(), Value::Null);
    r.insert("dryRun".into(), json!(a.dry_run));
    r.insert("options".into(), a.options.clone());
    Value::Object(r)
}

type Compiled = (std::sync::Arc<cel::Env>, std::sync::Arc<cel::Program>);

/// The API server's base environment (cel-go's strings extension included)
/// and the expression compiled in it, cached: conditions run on every write.
pub fn compiled(expression: &str) -> Result<Compiled, String> {
    use std::collections::HashMap;
    use std::sync::{Arc, LazyLock, Mutex};
    static ENV: LazyLock<Result<Arc<cel::Env>, String>> = LazyLock::new(|| {
        let mut env = cel::Env::stdlib();
        env.add_extension(cel::extensions::strings)
            .map_err(|e| format!("environment: {e}"))?;
        Ok(Arc::new(env))
    });
    static CACHE: LazyLock<Mutex<HashMap<String, Arc<cel::Program>>>> =
        LazyLock::new(Default::default);
    let env = ENV.clone()?;
    if let Some(p) = CACHE.lock().ok().and_then(|c| c.get(expression).cloned()) {
        return Ok((env, p));
    }
    let program = Arc::new(
        env.compile(expression)
            .map_err(|e| format!("compilation failed: {e}"))?,
    );
    if let Ok(mut c) = CACHE.lock() {
        // Bounded: the expressions of the stored configurations.
        if c.len() > 4096 {
            c.clear();
        }
        c.insert(expression.to_string(), program.clone());
    }
    Ok((env, program))
}

/// Evaluates one match condition. `Err` is an evaluation (or compilation)
/// error, which the matcher resolves with the failurePolicy.
pub fn eval_condition(
    expression: &str,
    object: &Value,
    old_object: &Value,
    request: &Value,
) -> Result<bool, String> {
    let (env, program) = compiled(expression)?;
    let mut ctx = cel::Context::with_env(env);
    // `namespaceObject` is declared and always null in match conditions
    // (`matcher.go` `Match` evaluates with no namespace).
    for (name, v) in [
        ("object", object),
        ("oldObject", old_object),
        ("request", request),
        ("namespaceObject", &Value::Null),
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

/// `(name, expression)` of each entry of a `matchConditions` list in JSON
/// form (a policy read without typed structs); missing fields are empty.
pub fn named_conditions(list: &Value) -> Vec<(&str, &str)> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default(),
                c["expression"].as_str().unwrap_or_default(),
            )
        })
        .collect()
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
