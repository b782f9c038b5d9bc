//! Calling one mutating webhook the way kube-apiserver does: match its rules,
//! selectors and conditions, POST an AdmissionReview over verified TLS, and
//! check the answer.
//!
//! Follows `k8s.io/apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go`
//! (`callAttrMutatingHook`), `plugin/webhook/generic/webhook.go` (`ShouldCallHook`) and
//! `plugin/webhook/request/admissionreview.go` (`VerifyAdmissionResponse`).

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, RuleWithOperations};
use rustls::pki_types::ServerName;
use serde_json::Value;

use super::attributes::{Attributes, Operation};
use crate::selectors::LabelSelector;

/// Where a webhook call goes, resolved from its clientConfig.
#[derive(Debug, Clone)]
pub struct Target {
    /// Address to connect to.
    pub addr: SocketAddr,
    /// Name verified against the certificate's SANs (and sent as Host).
    pub server_name: String,
    pub port: u16,
    pub path: String,
}

fn rule_matches(rule: &RuleWithOperations, a: &Attributes<'_>) -> bool {
    let any = |list: &Option<Vec<String>>, want: &str| {
        list.as_ref()
            .is_some_and(|l| l.iter().any(|x| x == "*" || x == want))
    };
    if !any(&rule.operations, a.operation.as_str()) {
        return false;
    }
    if !any(&rule.api_groups, a.res.group) || !any(&rule.api_versions, a.res.version) {
        return false;
    }
    let scope_ok = match rule.scope.as_deref().unwrap_or("*") {
        "Cluster" => !a.res.namespaced,
        "Namespaced" => a.res.namespaced,
        _ => true,
    };
    if !scope_ok {
        return false;
    }
    let resources = rule.resources.as_deref().unwrap_or_default();
    resources.iter().any(|r| {
        let (res, sub) = r.split_once('/').unwrap_or((r.as_str(), ""));
        let res_ok = res == "*" || res == a.res.plural;
        let sub_ok = if sub.is_empty() {
            a.subresource.is_empty()
        } else {
            sub == "*" || sub == a.subresource
        };
        res_ok && sub_ok
    })
}

/// Rules and objectSelector (old or new object matches). Match conditions
/// are evaluated separately because their errors follow failurePolicy.
pub fn matches(
    hook: &MutatingWebhook,
    a: &Attributes<'_>,
    object: &Value,
    old: &Value,
) -> Result<bool, String> {
    let rules = hook.rules.as_deref().unwrap_or_default();
    if !rules.iter().any(|r| rule_matches(r, a)) {
        return Ok(false);
    }
    if let Some(sel) = &hook.object_selector {
        let sel = serde_json::to_value(sel).map_err(|e| e.to_string())?;
        let sel = LabelSelector::from_object(&sel)?;
        let hit = (!object.is_null() && sel.matches_object(object))
            || (!old.is_null() && sel.matches_object(old));
        if !hit {
            return Ok(false);
        }
    }
    Ok(true)
}

pub fn failure_policy_ignore(hook: &MutatingWebhook) -> bool {
    hook.failure_policy.as_deref() == Some("Ignore")
}

pub fn timeout(hook: &MutatingWebhook) -> Duration {
    Duration::from_secs(hook.timeout_seconds.unwrap_or(10).clamp(1, 30) as u64)
}

pub fn display_url(t: &Target, timeout: Duration) -> String {
    format!(
        "https://{}:{}{}?timeout={}s",
        t.server_name,
        t.port,
        t.path,
        timeout.as_secs()
    )
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// Idle keep-alive connections per (address, server name, caBundle), reused
/// like Go's http.Transport does for the API server's webhook calls.
#[derive(Default)]
pub struct Pool {
    idle: std::sync::Mutex<std::collections::HashMap<(SocketAddr, String, u64), Vec<Sender>>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").finish_non_exhaustive()
    }
}

impl Pool {
    fn take(&self, key: &(SocketAddr, String, u64)) -> Option<Sender> {
        let mut g = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = g.get_mut(key)?;
        while let Some(s) = list.pop() {
            if !s.is_closed() {
                return Some(s);
            }
        }
        None
    }

    fn put(&self, key: (SocketAddr, String, u64), s: Sender) {
        let mut g = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = g.entry(key).or_default();
        if list.len() < 32 {
            list.push(s);
        }
    }
}

fn pool_key(target: &Target, ca: &[u8]) -> (SocketAddr, String, u64) {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ca.hash(&mut h);
    (target.addr, target.server_name.clone(), h.finish())
}

async fn connect(target: &Target, ca: &[u8]) -> Result<Sender, String> {
    let cfg = crate::tls::client_config_for_bundle(ca)?;
    let tcp = tokio::net::TcpStream::connect(target.addr)
        .await
        .map_err(|e| format!("dial tcp {}: {e}", target.addr))?;
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from(target.server_name.clone()).map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("tls: {e}"))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "webhook connection ended");
        }
    });
    Ok(sender)
}

/// A mutating webhook's verdict.
#[derive(Debug, Default)]
pub struct Verdict {
    pub allowed: bool,
    /// Status from a denial.
    pub result: Option<Value>,
    pub patch: Option<json_patch::Patch>,
    pub warnings: Vec<String>,
}

/// POSTs the review and validates the answer. Every `Err` here is a call
/// failure that failurePolicy decides about.
pub async fn call(
    pool: &Pool,
    hook: &MutatingWebhook,
    target: &Target,
    review: &Value,
    uid: &str,
) -> Result<Verdict, String> {
    let timeout = timeout(hook);
    let url = display_url(target, timeout);
    let fut = async {
        let ca = hook
            .client_config
            .ca_bundle
            .as_ref()
            .map(|b| b.0.clone())
            .unwrap_or_default();
        let key = pool_key(target, &ca);
        let body = Bytes::from(serde_json::to_vec(review).map_err(|e| e.to_string())?);
        let request = || {
            http::Request::post(format!("{}?timeout={}s", target.path, timeout.as_secs()))
                .header(
                    http::header::HOST,
                    format!("{}:{}", target.server_name, target.port),
                )
                .header(http::header::CONTENT_TYPE, "application/json")
                .header(http::header::ACCEPT, "application/json, */*")
                .body(Full::new(body.clone()))
                .map_err(|e| e.to_string())
        };
        // A pooled connection the server closed while idle fails before any
        // response; like Go's transport, retry such a request once on a new one.
        let pooled = pool.take(&key);
        let reused = pooled.is_some();
        let mut sender = match pooled {
            Some(s) => s,
            None => connect(target, &ca).await?,
        };
        let first = match sender.ready().await {
            Ok(()) => sender.send_request(request()?).await,
            Err(e) => Err(e),
        };
        let resp = match first {
            Ok(r) => r,
            Err(e) if reused && (e.is_canceled() || e.is_closed() || e.is_incomplete_message()) => {
                sender = connect(target, &ca).await?;
                sender
                    .send_request(request()?)
                    .await
                    .map_err(|e| e.to_string())?
            }
            Err(e) => return Err(e.to_string()),
        };
        let code = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        pool.put(key, sender);
        if !code.is_success() {
            return Err(format!(
                "an error on the server ({}) has prevented the request from succeeding",
                String::from_utf8_lossy(&bytes).trim()
            ));
        }
        Ok::<_, String>(bytes)
    };
    let bytes = match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Err(format!("failed to call webhook: Post \"{url}\": {e}")),
        Err(_) => {
            return Err(format!(
                "failed to call webhook: Post \"{url}\": context deadline exceeded"
            ));
        }
    };
    parse_response(&bytes, uid)
}

/// Validates an AdmissionReview answer as the API server does.
pub fn parse_response(bytes: &[u8], uid: &str) -> Result<Verdict, String> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("received invalid webhook response: {e}"))?;
    let (av, kind) = (v.get("apiVersion"), v.get("kind"));
    if av.and_then(Value::as_str) != Some("admission.k8s.io/v1")
        || kind.and_then(Value::as_str) != Some("AdmissionReview")
    {
        return Err(format!(
            "received invalid webhook response: expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {}, Kind={}",
            av.and_then(Value::as_str).unwrap_or_default(),
            kind.and_then(Value::as_str).unwrap_or_default()
        ));
    }
    let resp = v
        .get("response")
        .filter(|r| r.is_object())
        .ok_or("received invalid webhook response: response was absent")?;
    let got = resp.get("uid").and_then(Value::as_str).unwrap_or_default();
    if got != uid {
        return Err(format!(
            "received invalid webhook response: expected response.uid=\"{uid}\", got \"{got}\""
        ));
    }
    let warnings = resp
        .get("warnings")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|w| w.as_str().map(str::to_string))
        .collect();
    let patch_type = resp.get("patchType").and_then(Value::as_str);
    let patch_bytes =
        match resp.get("patch") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(STANDARD.decode(s).map_err(|e| {
                format!("received invalid webhook response: patch is not base64: {e}")
            })?),
            Some(Value::Array(a)) => Some(
                a.iter()
                    .map(|x| x.as_u64().and_then(|n| u8::try_from(n).ok()))
                    .collect::<Option<Vec<u8>>>()
                    .ok_or("received invalid webhook response: patch is not bytes")?,
            ),
            Some(_) => return Err("received invalid webhook response: patch is not bytes".into()),
        };
    let patch = match (patch_bytes, patch_type) {
        (None, None) => None,
        (Some(b), Some("JSONPatch")) => Some(
            serde_json::from_slice::<json_patch::Patch>(&b).map_err(|e| {
                format!("received invalid webhook response: invalid JSON patch: {e}")
            })?,
        ),
        (Some(_), other) => {
            return Err(format!(
                "received invalid webhook response: unsupported patch type {other:?}"
            ));
        }
        (None, Some(_)) => {
            return Err("received invalid webhook response: patchType without patch".into());
        }
    };
    Ok(Verdict {
        allowed: resp
            .get("allowed")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        result: resp.get("status").cloned(),
        patch,
        warnings,
    })
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn response_validation() {
        let ok = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": "u", "allowed": true, "patchType": "JSONPatch",
                         "patch": STANDARD.encode(r#"[{"op":"add","path":"/a","value":1}]"#),
                         "warnings": ["w"]}});
        let v = parse_response(&serde_json::to_vec(&ok).unwrap(), "u").unwrap();
        assert!(v.allowed);
        assert_eq!(v.warnings, vec!["w".to_string()]);
        assert_eq!(v.patch.unwrap().0.len(), 1);
        assert!(parse_response(&serde_json::to_vec(&ok).unwrap(), "other").is_err());
        let mut bad = ok.clone();
        bad["apiVersion"] = json!("admission.k8s.io/v1beta1");
        assert!(parse_response(&serde_json::to_vec(&bad).unwrap(), "u").is_err());
        let bytes_form = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": "u", "allowed": true, "patchType": "JSONPatch",
                         "patch": br#"[{"op":"remove","path":"/a"}]"#.to_vec()}});
        let v = parse_response(&serde_json::to_vec(&bytes_form).unwrap(), "u").unwrap();
        assert_eq!(v.patch.unwrap().0.len(), 1);
        assert!(parse_response(b"{not json", "u").is_err());
    }
}
