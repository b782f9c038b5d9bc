//! The decisive check: a server-side dry-run create of a canary Node goes
//! through the API server's real admission chain (matchConditions, caBundle,
//! the webhook call) and stores nothing. Every configured taint, strict
//! mode's boot gate when configured, and the webhook's warning for each must
//! come back.

use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::PostParams;
use kube::{Api, Client};
use nodegate_shared::TaintSpec;
use serde_json::{Value, json};

use crate::container_flags::Flags;
use crate::{Report, Status};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every taint and its warning came back.
    Tainted,
    /// The create was admitted without (some of) the taints or warnings.
    Missing,
    /// The dry-run itself failed.
    Error,
}

pub const CHECK: &str = "canary dry-run create";

/// A canary Node shaped like a kubelet's registration.
pub fn canary_node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                 "app.kubernetes.io/created-by": "nodegate-check"}},
           "status": {"nodeInfo": {"bootID": "nodegate-check"}}})
}

/// `want`: the taints and boot gate the create must come back with.
/// `want_warning`: the webhook admits creates (it warns); with the admission
/// policy no warning can come back.
pub async fn check(
    client: &Client,
    want: &Flags,
    want_warning: bool,
    report: &mut Report,
) -> Outcome {
    let name = format!("nodegate-check-{:08x}", rand::random::<u32>());
    let pp = PostParams {
        dry_run: true,
        field_manager: Some("nodegate-check".into()),
    };
    let body = match serde_json::to_vec(&canary_node(&name)) {
        Ok(b) => b,
        Err(e) => {
            report.add(CHECK, Status::Fail, e.to_string());
            return Outcome::Error;
        }
    };
    let sent = async {
        let req = kube::core::Request::new("/api/v1/nodes")
            .create(&pp, body)
            .map_err(|e| e.to_string())?;
        let resp = client
            .send(req.map(kube::client::Body::from))
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let warnings: Vec<String> = resp
            .headers()
            .get_all(http::header::WARNING)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, warnings, bytes))
    };
    let (status, warnings, bytes) = match sent.await {
        Ok(r) => r,
        Err(e) => {
            report.add(
                CHECK,
                Status::Fail,
                format!("dry-run create of Node {name} failed: {e}"),
            );
            return Outcome::Error;
        }
    };
    let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if status.as_u16() != 201 {
        let msg = answer
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default();
        report.add(
            CHECK,
            Status::Fail,
            format!("dry-run create of Node {name} answered {status}: {msg}"),
        );
        return Outcome::Error;
    }
    let got: Vec<Value> = answer
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let absent = |taints: &[TaintSpec]| -> Vec<String> {
        taints
            .iter()
            .filter(|t| !t.is_in(&got))
            .map(ToString::to_string)
            .collect()
    };
    let (missing, missing_gate) = (absent(&want.taints), absent(&want.boot));
    let taints: Vec<&TaintSpec> = want.taints.iter().chain(&want.boot).collect();
    // The gate shares its key with a taint: a warning counts for the key and
    // effect it names.
    let unwarned: Vec<String> = taints
        .iter()
        .filter(|t| {
            t.is_in(&got)
                && !warnings
                    .iter()
                    .any(|w| w.contains(t.key()) && w.contains(t.effect().as_str()))
        })
        .map(|t| format!("{}:{}", t.key(), t.effect()))
        .collect();
    // Dry-run must store nothing; a stored canary would be a fake node.
    let nodes: Api<Node> = Api::all(client.clone());
    if let Ok(Some(_)) = nodes.get_opt(&name).await {
        let _ = nodes.delete(&name, &Default::default()).await;
        report.add(
            CHECK,
            Status::Fail,
            format!("the dry-run stored Node {name} (deleted it again)"),
        );
        return Outcome::Error;
    }
    let shown: Vec<String> = got
        .iter()
        .map(|t| {
            let k = t.get("key").and_then(Value::as_str).unwrap_or_default();
            let e = t.get("effect").and_then(Value::as_str).unwrap_or_default();
            format!("{k}:{e}")
        })
        .collect();
    if !missing.is_empty() {
        let missing: Vec<String> = missing.into_iter().chain(missing_gate).collect();
        report.add(
            CHECK,
            Status::Fail,
            format!("Node {name} was admitted WITHOUT {missing:?} (it came back with {shown:?}): new nodes are schedulable before their network agent is ready"),
        );
        return Outcome::Missing;
    }
    if !missing_gate.is_empty() {
        report.add(
            CHECK,
            Status::Fail,
            format!("Node {name} was admitted WITHOUT the boot gate {missing_gate:?} (it came back with {shown:?}): strict mode is configured but not applied, so pods bound to a new or rebooted node run before its network agent is ready"),
        );
        return Outcome::Missing;
    }
    if want_warning && !unwarned.is_empty() {
        report.add(
            CHECK,
            Status::Fail,
            format!("Node {name} came back tainted but without the webhook's warning for {unwarned:?} (warnings: {warnings:?})"),
        );
        return Outcome::Missing;
    }
    // With the admission-policy install the webhook still sees Node creates
    // (for re-registrations) and taints what the policy left untainted: its
    // warning on every taint means the policy did not apply.
    if !want_warning && !warnings.is_empty() && unwarned.is_empty() {
        report.add(
            CHECK,
            Status::Fail,
            format!("Node {name} came back tainted by the webhook, not the admission policy (warnings: {warnings:?}): the policy did not apply, so new nodes depend on the webhook again"),
        );
        return Outcome::Missing;
    }
    let keys: Vec<String> = taints.iter().map(ToString::to_string).collect();
    let gate = if want.boot.is_empty() {
        ""
    } else {
        " (strict mode's boot gate included)"
    };
    let by = if want_warning {
        "and the webhook's warning"
    } else {
        "from the admission policy"
    };
    report.add(
        CHECK,
        Status::Pass,
        format!("Node {name} came back with {keys:?}{gate} {by}; nothing stored"),
    );
    Outcome::Tainted
}
