//! The TokenRequest API (`POST …/serviceaccounts/<name>/token`) and the
//! validation of the tokens it issues, after kubernetes
//! `pkg/registry/core/serviceaccount/storage/token.go` `TokenREST.Create`
//! and `pkg/serviceaccount/claims.go` (`Claims`, `validator.Validate`):
//!
//! - the caller needs `create` on `serviceaccounts/token` (RBAC);
//! - a `boundObjectRef` of kind Pod must name an existing pod (404), running
//!   as that service account (400), with the given uid if any (409); the
//!   token's user then carries `pod-name`/`pod-uid`, and when the pod is
//!   scheduled, `node-name` (and `node-uid` if the Node exists);
//! - a pod-bound token stops authenticating once its pod is gone or was
//!   replaced (401); the node claim is not re-checked (upstream neither).
//!
//! Not modelled (400 saying so): Secret and Node bound objects. Audiences and
//! expiry are echoed, never enforced.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};

use crate::resources;
use crate::status::ApiError;
use crate::store::Store;
use crate::users::{self, Extra, Identity};

fn service_account_user(ns: &str, name: &str) -> String {
    format!("system:serviceaccount:{ns}:{name}")
}

/// Takes the store and the RBAC policy rather than the API's state, so this
/// module stays below the REST handlers that route to it.
pub fn create(
    store: &Store,
    policy: Option<&crate::rbac::Policy>,
    ns: &str,
    sa: &str,
    caller: &Identity,
    req: Value,
) -> Result<Response, ApiError> {
    if users::node_name_of(caller).is_some() {
        // Kubelets ask for tokens of their own pods only; nodegate's
        // kubelets never do.
        return Err(ApiError::forbidden(
            "serviceaccounts",
            "",
            sa,
            "the emulator does not model kubelet token requests",
        ));
    }
    if let Some(policy) = policy {
        policy
            .authorize(&crate::rbac::Request {
                user: caller,
                verb: "create",
                group: "",
                resource: "serviceaccounts/token".into(),
                namespace: ns,
                name: Some(sa),
            })
            .map_err(|why| ApiError::forbidden("serviceaccounts", "", sa, &why))?;
    }
    let mut extra = Extra::new();
    let bound = &req["spec"]["boundObjectRef"];
    if !bound.is_null() {
        let kind = bound["kind"].as_str().unwrap_or_default();
        if kind != "Pod" {
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of type {kind} (the emulator models Pod only)"
            )));
        }
        let pod_name = bound["name"].as_str().unwrap_or_default();
        let pod = store
            .get(&resources::PODS, ns, pod_name)
            .ok_or_else(|| ApiError::not_found("pods", "", pod_name))?;
        let runs_as = pod["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default");
        if runs_as != sa {
            return Err(ApiError::bad_request(format!(
                "cannot bind token for serviceaccount {sa:?} to pod running with different serviceaccount name."
            )));
        }
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        if let Some(want) = bound["uid"].as_str().filter(|u| !u.is_empty())
            && want != uid
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "the UID in the bound object reference ({want}) does not match the UID in record. The object might have been deleted and then recreated"
                ),
            ));
        }
        extra.insert(users::POD_NAME_EXTRA.into(), vec![pod_name.into()]);
        extra.insert(users::POD_UID_EXTRA.into(), vec![uid.into()]);
        if let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
            extra.insert(users::NODE_NAME_EXTRA.into(), vec![node.into()]);
            if let Some(n) = store.get(&resources::NODES, "", node)
                && let Some(node_uid) = n["metadata"]["uid"].as_str()
            {
                extra.insert(users::NODE_UID_EXTRA.into(), vec![node_uid.into()]);
            }
        }
    }
    let token = users::token_with_extra(&service_account_user(ns, sa), &extra);
    let mut out = req;
    out["apiVersion"] = json!("authentication.k8s.io/v1");
    out["kind"] = json!("TokenRequest");
    out["metadata"]["name"] = json!(sa);
    out["metadata"]["namespace"] = json!(ns);
    out["status"] = json!({
        "token": token,
        "expirationTimestamp": "2099-01-01T00:00:00Z",
    });
    Ok((StatusCode::CREATED, axum::Json(out)).into_response())
}

/// A pod-bound token is valid while its pod exists with the same uid
/// (`validator.Validate`: "service account token has been invalidated").
pub fn still_valid(store: &Store, id: &Identity) -> bool {
    let (Some(name), Some(uid)) = (
        id.extra.get(users::POD_NAME_EXTRA).and_then(|v| v.first()),
        id.extra.get(users::POD_UID_EXTRA).and_then(|v| v.first()),
    ) else {
        return true;
    };
    let Some(ns) = id
        .name
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'))
        .map(|(ns, _)| ns)
    else {
        return false;
    };
    store
        .get(&resources::PODS, ns, name)
        .is_some_and(|p| p["metadata"]["uid"].as_str() == Some(uid.as_str()))
}
