//! MutatingAdmissionPolicy (`admissionregistration.k8s.io/v1`) in the
//! emulator, after k8s.io/apiserver `pkg/admission/plugin/policy`:
//!
//! - `generic/policy_dispatcher.go` `Dispatch`: a policy applies through each
//!   binding naming it (`spec.policyName`); a policy or binding that cannot be
//!   used is a configuration error; errors then follow the policy's
//!   `failurePolicy` (default Fail): Ignore drops them **without a metric**,
//!   Fail refuses the request with 403 "policy '…' with binding '…' denied
//!   request: …".
//! - `mutating/dispatcher.go` `dispatchInvocations`: `matchConditions` (an
//!   error is a configuration error), then the mutations in order;
//!   `reinvocationPolicy: IfNeeded` policies run again when the object changed
//!   after them (`reinvocationcontext.go`).
//! - `mutating/patch/json_patch.go` `jsonPatcher.Patch`: the expression is a
//!   list of `JSONPatch{op, path, from, value}`; the patch is applied to the
//!   object's JSON; a failed `test` op leaves the object unchanged (no error);
//!   any other failure is an error.
//!
//! CEL: `object`, `oldObject` and `request` are bound as for webhook
//! `matchConditions`; `variables.<name>` from `spec.variables`, in order.
//! `Object.<path>{…}` literals (the unstructured type provider of
//! `k8s.io/apiserver/pkg/cel/mutation/unstructured`) build objects with the
//! given fields. Not modelled, and refused loudly as configuration errors:
//! `ApplyConfiguration` mutations, `paramKind`, bindings with
//! `matchResources`, `excludeResourceRules`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cel::common::types::{CelMap, CelMapKey, Type};
use cel::common::value::{CowVal, Val};
use cel::{ExecutionError, StructType};
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, RuleWithOperations};
use serde_json::Value;

use super::attributes::Attributes;
use super::cel as admission_cel;
use super::webhook;
use crate::resources;
use crate::store::Store;

/// One policy applied through one binding.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub policy: String,
    pub binding: String,
    spec: Value,
    binding_spec: Value,
}

impl Invocation {
    /// The key reinvocation is tracked by (`keyFor`: policy and binding).
    pub fn key(&self) -> (String, String) {
        (self.policy.clone(), self.binding.clone())
    }

    pub fn reinvoke_if_needed(&self) -> bool {
        self.spec["reinvocationPolicy"] == "IfNeeded"
    }

    /// Unset means Fail (`Dispatch`: "we always default the FailurePolicy").
    pub fn ignore_failures(&self) -> bool {
        self.spec["failurePolicy"] == "Ignore"
    }

    /// The error text the API server puts in its 403 under Fail.
    pub fn denial(&self, why: &str) -> String {
        format!(
            "policy '{}' with binding '{}' denied request: {why}",
            self.policy, self.binding
        )
    }
}

/// Every stored (policy, binding) pair.
pub fn invocations(store: &Store) -> Vec<Invocation> {
    let (policies, _) = store.list(&resources::MUTATING_POLICIES, None);
    let (bindings, _) = store.list(&resources::MUTATING_POLICY_BINDINGS, None);
    let policies: Vec<&Value> = policies.iter().map(|p| &**p).collect();
    let bindings: Vec<&Value> = bindings.iter().map(|b| &**b).collect();
    from_objects(&policies, &bindings)
}

/// (policy, binding) pairs from objects: policies by name, then bindings by
/// name (*assumed* order; nodegate installs one of each).
pub fn from_objects(policies: &[&Value], bindings: &[&Value]) -> Vec<Invocation> {
    let name = |o: &Value| {
        o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let mut policies = policies.to_vec();
    policies.sort_by_key(|p| name(p));
    let mut bindings = bindings.to_vec();
    bindings.sort_by_key(|b| name(b));
    let mut out = Vec::new();
    for p in policies {
        for b in &bindings {
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
    out
}

/// What one invocation did.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// Constraints or conditions did not match (or failed): not invoked, so
    /// not a candidate for reinvocation either.
    Skipped,
    /// Invoked, the object unchanged.
    Unchanged,
    Mutated,
}

/// `matchConstraints`: resource rules and objectSelector, as for a webhook
/// (`matching.Matcher`; the selector matches the old or the new object).
/// Shared by mutating and validating policies.
pub(crate) fn matches(
    spec: &Value,
    a: &Attributes<'_>,
    obj: &Value,
    old: &Value,
) -> Result<bool, String> {
    let constraints = &spec["matchConstraints"];
    let rules: Vec<RuleWithOperations> = constraints
        .get("resourceRules")
        .map(|r| serde_json::from_value(r.clone()))
        .transpose()
        .map_err(|e| format!("matchConstraints.resourceRules: {e}"))?
        .unwrap_or_default();
    let as_hook = MutatingWebhook {
        rules: Some(rules),
        object_selector: constraints
            .get("objectSelector")
            .map(|s| serde_json::from_value(s.clone()))
            .transpose()
            .map_err(|e| format!("matchConstraints.objectSelector: {e}"))?,
        ..Default::default()
    };
    webhook::matches(&as_hook, a, obj, old)
}

/// Runs one invocation on `obj`: what it did, and its errors (configuration
/// or evaluation), which the caller resolves with the failurePolicy. As in
/// `dispatchInvocations`, a failing condition stops the invocation, a failing
/// mutation does not stop the ones after it.
pub fn run(
    inv: &Invocation,
    a: &Attributes<'_>,
    obj: &mut Value,
    old: &Value,
) -> (Outcome, Vec<String>) {
    let skipped = |errors: Vec<String>| (Outcome::Skipped, errors);
    if inv.spec.get("paramKind").is_some()
        || inv.binding_spec.get("matchResources").is_some()
        || inv.spec["matchConstraints"]
            .get("excludeResourceRules")
            .is_some()
    {
        return skipped(vec![
            "the emulator does not model paramKind, binding matchResources or excludeResourceRules"
                .into(),
        ]);
    }
    match matches(&inv.spec, a, obj, old) {
        Ok(true) => {}
        Ok(false) => return skipped(Vec::new()),
        Err(e) => return skipped(vec![e]),
    }
    let request = admission_cel::request_variable(a);
    let conditions =
        nodegate_shared::match_conditions::named_conditions(&inv.spec["matchConditions"]);
    let (verdict, _) = admission_cel::match_all(conditions, obj, old, &request);
    match verdict {
        admission_cel::Verdict::Call => {}
        admission_cel::Verdict::Excluded(_) => return skipped(Vec::new()),
        admission_cel::Verdict::Errors(errs) => return skipped(errs),
    }
    let before = obj.clone();
    let mut errors = Vec::new();
    for (i, m) in inv.spec["mutations"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        match mutate(m, &inv.spec, obj, old, &request) {
            Ok(Some(next)) => *obj = next,
            Ok(None) => {}
            Err(e) => errors.push(format!("mutations[{i}]: {e}")),
        }
    }
    let outcome = if *obj == before {
        Outcome::Unchanged
    } else {
        Outcome::Mutated
    };
    (outcome, errors)
}

/// One mutation: the patched object, or `None` when a `test` op failed
/// (`jsonPatcher.Patch` returns the object unchanged then, without error).
fn mutate(
    m: &Value,
    spec: &Value,
    obj: &Value,
    old: &Value,
    request: &Value,
) -> Result<Option<Value>, String> {
    if m["patchType"] != "JSONPatch" {
        return Err(format!(
            "patchType {} is not modelled by the emulator",
            m["patchType"]
        ));
    }
    let expression = m["jsonPatch"]["expression"].as_str().unwrap_or_default();
    // Evaluated eagerly (upstream: lazily, when referenced).
    let variables = eval_variables(spec, obj, old, request)?;
    let ops = eval(expression, obj, old, request, &variables, true)?;
    let patch = to_json_patch(&ops)?;
    let mut next = obj.clone();
    match json_patch::patch(&mut next, &patch) {
        Ok(()) => Ok(Some(next)),
        Err(e) if matches!(e.kind, json_patch::PatchErrorKind::TestFailed) => Ok(None),
        Err(e) => Err(format!("JSONPath: {e}")),
    }
}

/// `spec.variables`, in order; each sees the ones before it.
pub(crate) fn eval_variables(
    spec: &Value,
    obj: &Value,
    old: &Value,
    request: &Value,
) -> Result<Value, String> {
    let mut vars = serde_json::Map::new();
    for v in spec["variables"].as_array().into_iter().flatten() {
        let name = v["name"].as_str().unwrap_or_default();
        let value = eval(
            v["expression"].as_str().unwrap_or_default(),
            obj,
            old,
            request,
            &Value::Object(vars.clone()),
            false,
        )
        .map_err(|e| format!("variables.{name}: {e}"))?;
        vars.insert(name.to_string(), value);
    }
    Ok(Value::Object(vars))
}

/// A mutation expression's result as a JSON patch (`evaluatePatchExpression`).
fn to_json_patch(result: &Value) -> Result<json_patch::Patch, String> {
    let ops = result
        .as_array()
        .ok_or("type mismatch: JSONPatchType.expression should evaluate to array")?;
    let mut out = Vec::new();
    for op in ops {
        let map = op
            .as_object()
            .filter(|m| m.get(JSONPATCH_MARK) == Some(&Value::Bool(true)))
            .ok_or(
                "type mismatch: JSONPatchType.expression should evaluate to array of JSONPatch",
            )?;
        let mut o = serde_json::Map::new();
        for key in ["op", "path", "from", "value"] {
            if let Some(v) = map.get(key) {
                o.insert(key.into(), v.clone());
            }
        }
        out.push(Value::Object(o));
    }
    serde_json::from_value(Value::Array(out)).map_err(|e| format!("JSONPath: {e}"))
}

/// Marks a map built by a `JSONPatch{…}` literal (removed before applying).
const JSONPATCH_MARK: &str = "\u{0}jsonpatch";

/// A struct literal type whose values are maps of its fields.
struct MapStruct {
    ty: Type,
    /// `Some`: only these fields (JSONPatch); `None`: any (unstructured Object).
    fields: Option<&'static [&'static str]>,
    mark: bool,
}

impl StructType for MapStruct {
    fn get_type(&self) -> &Type {
        &self.ty
    }

    fn new_value<'b, 'v>(
        &self,
        fields: BTreeMap<String, CowVal<'b, 'v>>,
    ) -> Result<Box<dyn Val + 'v>, ExecutionError> {
        let mut map: HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> = HashMap::new();
        for (k, v) in fields {
            if let Some(allowed) = self.fields
                && !allowed.contains(&k.as_str())
            {
                return Err(ExecutionError::function_error(
                    self.ty.name(),
                    format!("no such field {k}"),
                ));
            }
            map.insert(CelMapKey::from(k), v.into_owned());
        }
        if self.mark {
            map.insert(
                CelMapKey::from(JSONPATCH_MARK.to_string()),
                Box::new(cel::common::types::CelBool::from(true)),
            );
        }
        Ok(Box::new(CelMap::from(map)))
    }
}

/// `Object`, `Object.spec`, … named in `expression` (any is allowed).
fn object_type_names(expression: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expression;
    while let Some(pos) = rest.find("Object") {
        let tail = &rest[pos..];
        let end = tail.find(|c: char| !is_name_char(c)).unwrap_or(tail.len());
        if starts_a_name(&rest[..pos]) && opens_a_literal(&tail[end..]) {
            out.push(tail[..end].to_string());
        }
        rest = &tail[end.max(1)..];
    }
    out.sort();
    out.dedup();
    out
}

/// A character of a (qualified) type name.
fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '.'
}

/// Whether a name can start right after `before` (not inside a longer one).
fn starts_a_name(before: &str) -> bool {
    before.chars().last().is_none_or(|c| !is_name_char(c))
}

/// Whether `after` a type name a struct literal's fields open.
fn opens_a_literal(after: &str) -> bool {
    after.trim_start().starts_with('{')
}

/// Evaluates a policy expression to JSON. `patch_types`: the `JSONPatch` and
/// `Object.*` types exist, as for mutations only (`compilePolicy` sets
/// `HasPatchTypes` for the mutation evaluators alone).
pub(crate) fn eval(
    expression: &str,
    obj: &Value,
    old: &Value,
    request: &Value,
    variables: &Value,
    patch_types: bool,
) -> Result<Value, String> {
    let (env, program) = if patch_types {
        let mut env = cel::Env::stdlib();
        // The API server's base environment has cel-go's strings extension
        // (`join`, `lowerAscii`, …).
        env.add_extension(cel::extensions::strings)
            .map_err(|e| e.to_string())?;
        let jsonpatch = MapStruct {
            ty: Type::new_struct("JSONPatch".into()),
            fields: Some(&["op", "path", "from", "value"]),
            mark: true,
        };
        env.add_type(jsonpatch).map_err(|e| e.to_string())?;
        for name in object_type_names(expression) {
            env.add_type(MapStruct {
                ty: Type::new_struct(name),
                fields: None,
                mark: false,
            })
            .map_err(|e| e.to_string())?;
        }
        let program = env
            .compile(expression)
            .map_err(|e| format!("compilation failed: {e}"))?;
        (Arc::new(env), Arc::new(program))
    } else {
        nodegate_shared::match_conditions::compiled(expression)?
    };
    let mut ctx = cel::Context::with_env(env);
    // Nodes are cluster-scoped: `namespaceObject` is null (`Dispatch` loads
    // a namespace only for namespaced requests).
    for (name, v) in [
        ("object", obj),
        ("oldObject", old),
        ("request", request),
        ("variables", variables),
        ("namespaceObject", &Value::Null),
    ] {
        let v = cel::to_value(v).map_err(|e| format!("binding {name}: {e}"))?;
        ctx.add_variable_from_value(name, v);
    }
    let value = program
        .execute(&ctx)
        .map_err(|e| format!("evaluation failed: {e}"))?;
    value
        .json()
        .map_err(|e| format!("result is not JSON: {e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run_expr(expression: &str, obj: Value) -> Result<Value, String> {
        eval(expression, &obj, &Value::Null, &json!({}), &json!({}), true)
    }

    #[test]
    fn struct_literals_build_objects_and_patches() {
        let got = run_expr(
            "[JSONPatch{op: 'add', path: '/spec/taints/-', value: Object.spec.taints{key: 'k', effect: 'NoSchedule'}}]",
            json!({}),
        )
        .unwrap();
        let patch = to_json_patch(&got).unwrap();
        let mut obj = json!({"spec": {"taints": []}});
        json_patch::patch(&mut obj, &patch).unwrap();
        assert_eq!(
            obj,
            json!({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}})
        );
    }

    #[test]
    fn jsonpatch_has_only_its_fields_and_lists_must_hold_jsonpatches() {
        let e = run_expr("[JSONPatch{op: 'add', path: '/a', valu: 1}]", json!({})).unwrap_err();
        assert!(e.contains("no such field valu"), "{e}");
        let not_patches = run_expr("[{'op': 'add', 'path': '/a', 'value': 1}]", json!({})).unwrap();
        assert!(
            to_json_patch(&not_patches)
                .unwrap_err()
                .contains("array of JSONPatch")
        );
    }

    #[test]
    fn variables_have_no_patch_types() {
        let e = eval(
            "[Object.spec.taints{key: 'k'}]",
            &json!({}),
            &Value::Null,
            &json!({}),
            &json!({}),
            false,
        )
        .unwrap_err();
        assert!(e.contains("Object.spec.taints"), "{e}");
    }

    #[test]
    fn object_type_names_are_found_only_before_a_brace() {
        assert_eq!(
            object_type_names(
                "Object.spec{taints: [Object.spec.taints{key: 'a'}]} + object.spec + MyObject{}"
            ),
            vec!["Object.spec".to_string(), "Object.spec.taints".to_string()]
        );
    }
}
