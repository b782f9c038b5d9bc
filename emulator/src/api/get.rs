//! GET and LIST: label and field selectors, `limit` and `continue`, Table output.
//!
//! Follows `k8s.io/apiserver/pkg/endpoints/handlers/get.go` (`ListResource`,
//! `GetResource`) and `k8s.io/apiserver/pkg/storage/continue.go`
//! (`EncodeContinue`, `DecodeContinue`).

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::HeaderMap;
use serde_json::{Value, json};

use super::scope::*;
use crate::selectors;
use crate::status::ApiError;
use crate::table;

pub(crate) fn list(
    st: &AppState,
    t: &Target,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Reply> {
    let (ls, fs) = selectors::of_query(q, t.res)?;
    let ns = (!t.ns.is_empty()).then_some(t.ns.as_str());
    let (items, mut rv) = st.store.list(t.res, ns);
    let start = match q.get("continue").filter(|c| !c.is_empty()) {
        Some(c) => {
            let (crv, key) = decode_continue(c)?;
            rv = crv;
            Some(key)
        }
        None => None,
    };
    let limit: usize = match q.get("limit").filter(|l| !l.is_empty()) {
        Some(l) => l
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        None => 0,
    };
    let mut matched: Vec<&Value> = items
        .iter()
        .map(|a| a.as_ref())
        .filter(|o| ls.matches_object(o) && fs.matches(o))
        .filter(|o| start.as_ref().is_none_or(|s| obj_key(o) > *s))
        .collect();
    let mut cont = None;
    let mut remaining = 0;
    if limit > 0 && matched.len() > limit {
        remaining = matched.len() - limit;
        matched.truncate(limit);
        cont = matched.last().map(|o| encode_continue(rv, &obj_key(o)));
    }
    if wants_table(headers) {
        return Ok(Reply::ok(table::table(
            t.res,
            &matched,
            rv,
            cont.as_deref(),
        )));
    }
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
        meta["remainingItemCount"] = json!(remaining);
    }
    Ok(Reply::ok(json!({
        "kind": t.res.list_kind(),
        "apiVersion": t.res.api_version(),
        "metadata": meta,
        "items": matched,
    })))
}

pub(crate) fn obj_key(o: &Value) -> String {
    let ns = o
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = o
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    format!("{ns}\u{0}{name}")
}

pub(crate) fn encode_continue(rv: u64, key: &str) -> String {
    URL_SAFE_NO_PAD.encode(json!({"rv": rv, "start": key}).to_string())
}

pub(crate) fn decode_continue(c: &str) -> Result<(u64, String)> {
    let bad = || ApiError::bad_request("invalid continue token");
    let bytes = URL_SAFE_NO_PAD.decode(c).map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    Ok((
        v["rv"].as_u64().ok_or_else(bad)?,
        v["start"].as_str().ok_or_else(bad)?.to_string(),
    ))
}
