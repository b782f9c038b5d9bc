//! Writes: create, update, patch, delete and `pods/binding`, through admission
//! and validation into storage, with the retries on a storage conflict the
//! real server makes for patches.
//!
//! Follows `k8s.io/apiserver/pkg/endpoints/handlers/create.go` (`createHandler`),
//! `update.go` (`UpdateResource`), `patch.go` (`patchResource`, `applyPatch`:
//! json, merge and strategic merge), `delete.go` (`DeleteResource`),
//! `pkg/registry/rest/create.go` (`BeforeCreate`), `pkg/registry/rest/update.go`
//! (`BeforeUpdate`: main resource vs status) and
//! `pkg/registry/core/pod/storage/storage.go` (`BindingREST.Create`).

use std::collections::HashMap;

use http::StatusCode;
use serde_json::{Value, json};

use super::scope::*;
use super::validation::{name_of, validate};
use crate::admission::{Attributes, Operation};
use crate::resources::ResourceDef;
use crate::smp;
use crate::status::ApiError;
use crate::store::{WriteError, rv_of};
use crate::users;

/// How often a write retries after a storage conflict it did not ask for.
pub(crate) const MAX_RETRIES: usize = 8;

/// Fills in what every stored object carries.
pub(crate) fn normalise(res: &ResourceDef, ns: &str, obj: &mut Value) -> Result<()> {
    if !obj.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or(res.kind);
    let av = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| res.api_version());
    if kind != res.kind || av != res.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) or kind ({kind}) does not match the expected {}, Kind={}",
            res.api_version(),
            res.kind
        )));
    }
    obj["kind"] = json!(res.kind);
    obj["apiVersion"] = json!(res.api_version());
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    if res.namespaced {
        match obj.pointer("/metadata/namespace").and_then(Value::as_str) {
            Some(n) if !n.is_empty() && n != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => obj["metadata"]["namespace"] = json!(ns),
        }
    } else if let Some(m) = obj["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    Ok(())
}

pub(crate) async fn create(
    st: &AppState,
    t: &Target,
    q: &HashMap<String, String>,
    user: &users::Identity,
    body: &[u8],
) -> Result<Reply> {
    let dry = dry_run(q)?;
    let mut obj = yaml_or_json(body)?;
    normalise(t.res, &t.ns, &mut obj)?;
    if name_of(&obj).is_empty()
        && let Some(prefix) = obj
            .pointer("/metadata/generateName")
            .and_then(Value::as_str)
    {
        let suffix: String = (0..5)
            .map(|_| {
                let i = rand::random::<u8>() % 36;
                char::from_digit(u32::from(i), 36).unwrap_or('x')
            })
            .collect();
        obj["metadata"]["name"] = json!(format!("{prefix}{suffix}"));
    }
    let name = name_of(&obj);
    let attrs = Attributes {
        res: t.res,
        subresource: "",
        operation: Operation::Create,
        name: &name,
        namespace: &t.ns,
        user,
        extra: &user.extra,
        dry_run: dry,
        options: options("CreateOptions", q, dry),
    };
    let mut admitted = st.admission.admit(&attrs, obj, None).await?;
    validate(t.res, &admitted.object)?;
    admitted
        .warnings
        .extend(st.admission.validate(&attrs, &admitted.object, None)?);
    let stored = st
        .store
        .create(t.res, &t.ns, admitted.object, dry)
        .map_err(|e| write_error(e, t.res, &name))?;
    Ok(Reply {
        code: StatusCode::CREATED,
        body: stored,
        warnings: admitted.warnings,
    })
}

pub(crate) fn write_error(e: WriteError, res: &ResourceDef, name: &str) -> ApiError {
    match e {
        WriteError::NotFound => ApiError::not_found(res.plural, res.group, name),
        WriteError::AlreadyExists => ApiError::already_exists(res.plural, res.group, name),
        WriteError::Conflict => ApiError::conflict(res.plural, res.group, name),
    }
}

/// How an update changes the stored object.
#[derive(Debug)]
pub(crate) enum Change {
    Replace(Value),
    Json(json_patch::Patch),
    Merge(Value),
    Strategic(Value),
    Apply(Value),
}

impl Change {
    /// Whether the request itself names a resourceVersion (a precondition).
    fn mentions_rv(&self) -> bool {
        let rv_set = |v: &Value| {
            v.pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
        };
        match self {
            Change::Replace(v) => rv_set(v),
            Change::Merge(v) | Change::Strategic(v) => rv_set(v),
            Change::Json(p) => {
                p.0.iter()
                    .any(|op| op.path().as_str() == "/metadata/resourceVersion")
            }
            Change::Apply(_) => false,
        }
    }

    fn apply(&self, cur: &Value) -> Result<Value> {
        let mut new = cur.clone();
        match self {
            Change::Replace(v) => new = v.clone(),
            Change::Json(p) => json_patch::patch(&mut new, p).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?,
            Change::Merge(p) | Change::Apply(p) => json_patch::merge(&mut new, p),
            Change::Strategic(p) => smp::apply(&mut new, p).map_err(ApiError::bad_request)?,
        }
        Ok(new)
    }
}

/// The node and pod strategies: a main-resource write keeps the stored
/// status, a status write keeps the stored spec. Identity fields never change.
pub(crate) fn prepare_for_update(res: &ResourceDef, sub: &str, new: &mut Value, cur: &Value) {
    if res.has_status() {
        let keep = if sub == "status" { "spec" } else { "status" };
        match cur.get(keep) {
            Some(v) => new[keep] = v.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove(keep);
                }
            }
        }
    }
    for f in ["uid", "creationTimestamp", "name", "namespace"] {
        match cur["metadata"].get(f) {
            Some(v) => new["metadata"][f] = v.clone(),
            None => {
                if let Some(m) = new["metadata"].as_object_mut() {
                    m.remove(f);
                }
            }
        }
    }
}

pub(crate) async fn write(
    st: &AppState,
    t: &Target,
    name: &str,
    q: &HashMap<String, String>,
    user: &users::Identity,
    change: Change,
) -> Result<Reply> {
    let dry = dry_run(q)?;
    for _ in 0..MAX_RETRIES {
        let Some(cur) = st.store.get(t.res, &t.ns, name) else {
            if let (Change::Apply(obj), "") = (&change, t.sub.as_str()) {
                let body = serde_json::to_vec(obj).map_err(ApiError::internal)?;
                return create(st, t, q, user, &body).await;
            }
            return Err(ApiError::not_found(t.res.plural, t.res.group, name));
        };
        let cur_rv = rv_of(&cur).unwrap_or(0);
        let mut new = change.apply(&cur)?;
        normalise(t.res, &t.ns, &mut new)?;
        let body_name = name_of(&new);
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        // A resourceVersion in the new object is a precondition: no retries.
        let precondition = if change.mentions_rv() {
            new.pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string)
        } else {
            None
        };
        if let Some(rv) = &precondition
            && *rv != cur_rv.to_string()
        {
            return Err(ApiError::conflict(t.res.plural, t.res.group, name));
        }
        let attrs = Attributes {
            res: t.res,
            subresource: &t.sub,
            operation: Operation::Update,
            name,
            namespace: &t.ns,
            user,
            extra: &user.extra,
            dry_run: dry,
            options: options("UpdateOptions", q, dry),
        };
        let mut admitted = st.admission.admit(&attrs, new, Some(&cur)).await?;
        let mut obj = admitted.object;
        prepare_for_update(t.res, &t.sub, &mut obj, &cur);
        validate(t.res, &obj)?;
        admitted
            .warnings
            .extend(st.admission.validate(&attrs, &obj, Some(&cur))?);
        match st.store.update(t.res, &t.ns, name, obj, cur_rv, dry) {
            Ok(stored) => {
                return Ok(Reply {
                    code: StatusCode::OK,
                    body: stored,
                    warnings: admitted.warnings,
                });
            }
            Err(WriteError::Conflict) if precondition.is_none() => continue,
            Err(e) => return Err(write_error(e, t.res, name)),
        }
    }
    Err(ApiError::conflict(t.res.plural, t.res.group, name))
}

pub(crate) async fn delete(
    st: &AppState,
    t: &Target,
    name: &str,
    q: &HashMap<String, String>,
    user: &users::Identity,
    body: &[u8],
) -> Result<Reply> {
    let opts: Value = if body.is_empty() {
        json!({})
    } else {
        json_body(body)?
    };
    // DeleteOptions may carry dryRun in the body (kube-rs sends it there).
    let dry = dry_run(q)?
        || opts
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|d| d.iter().any(|x| x.as_str() == Some("All")));
    let precondition = opts
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<u64>().ok());
    let cur = st
        .store
        .get(t.res, &t.ns, name)
        .ok_or_else(|| ApiError::not_found(t.res.plural, t.res.group, name))?;
    let attrs = Attributes {
        res: t.res,
        subresource: "",
        operation: Operation::Delete,
        name,
        namespace: &t.ns,
        user,
        extra: &user.extra,
        dry_run: dry,
        options: options("DeleteOptions", q, dry),
    };
    let mut admitted = st.admission.admit(&attrs, Value::Null, Some(&cur)).await?;
    admitted
        .warnings
        .extend(st.admission.validate(&attrs, &Value::Null, Some(&cur))?);
    let gone = st
        .store
        .delete(t.res, &t.ns, name, precondition, dry)
        .map_err(|e| write_error(e, t.res, name))?;
    Ok(Reply {
        code: StatusCode::OK,
        body: gone,
        warnings: admitted.warnings,
    })
}

/// `pods/binding`: what the scheduler posts to place a pod.
pub(crate) fn bind(st: &AppState, t: &Target, name: &str, body: &[u8]) -> Result<Reply> {
    let binding = json_body(body)?;
    let node = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::invalid("Binding", name, "target.name: Required value"))?;
    for _ in 0..MAX_RETRIES {
        let cur = st
            .store
            .get(t.res, &t.ns, name)
            .ok_or_else(|| ApiError::not_found(t.res.plural, t.res.group, name))?;
        if let Some(on) = cur
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node \"{on}\""
                ),
            ));
        }
        let mut new = (*cur).clone();
        if !new.get("spec").is_some_and(Value::is_object) {
            new["spec"] = json!({});
        }
        new["spec"]["nodeName"] = json!(node);
        match st
            .store
            .update(t.res, &t.ns, name, new, rv_of(&cur).unwrap_or(0), false)
        {
            Ok(_) => {
                return Ok(Reply {
                    code: StatusCode::CREATED,
                    body: json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
                    warnings: Vec::new(),
                });
            }
            Err(WriteError::Conflict) => continue,
            Err(e) => return Err(write_error(e, t.res, name)),
        }
    }
    Err(ApiError::conflict(t.res.plural, t.res.group, name))
}
