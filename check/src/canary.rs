//! The decisive check: a server-side dry-run create of a canary Node goes
//! through the API server's real admission chain (matchConditions, caBundle,
//! the webhook call) and stores nothing. Every configured taint, the gates
//! owned elsewhere (`--owned-taint`: added at create too), strict mode's
//! boot gate when configured, and the webhook's warning for each must come
//! back.
//!
//! [`create`] sends the dry-run; [`verdict`] judges what came back.

use http::StatusCode;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::PostParams;
use kube::{Api, Client};
use nodegate_shared::TaintSpec;
use serde_json::{Value, json};

use crate::container_flags::Flags;
use crate::expected::{NOTHING_TO_EXPECT, all, flag_names};
use crate::report::{Report, Status};

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

/// How the dry-run create went.
#[derive(Debug, Clone)]
pub enum Sent {
    /// The request could not be built.
    Unbuilt(String),
    /// No answer (transport error).
    Failed(String),
    Answered {
        status: StatusCode,
        /// The `Warning` headers.
        warnings: Vec<String>,
        /// The answer's body (`Null` when not JSON).
        body: Value,
        /// The dry-run stored the Node after all (it was deleted again).
        stored: bool,
    },
}

/// What the check expects of the canary.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// The taints, gates owned elsewhere and boot gate the create must come
    /// back with.
    pub want: &'a Flags,
    /// The webhook admits creates (it warns); with the admission policy no
    /// warning can come back.
    pub want_warning: bool,
}

/// `key:effect` of each taint in a Node's `spec.taints`.
fn shown(taints: &[Value]) -> Vec<String> {
    taints
        .iter()
        .map(|t| {
            let k = t.get("key").and_then(Value::as_str).unwrap_or_default();
            let e = t.get("effect").and_then(Value::as_str).unwrap_or_default();
            format!("{k}:{e}")
        })
        .collect()
}

/// `key:effect` of each taint.
fn keys(taints: &[&TaintSpec]) -> Vec<String> {
    taints
        .iter()
        .map(|t| format!("{}:{}", t.key(), t.effect()))
        .collect()
}

/// What the parenthesis of the passing line says was included besides the
/// ordinary taints.
fn included(want: &Flags) -> &'static str {
    match (want.owned.is_empty(), want.boot.is_empty()) {
        (true, true) => "",
        (false, true) => " (gates owned elsewhere included)",
        (true, false) => " (strict mode's boot gate included)",
        (false, false) => " (gates owned elsewhere and strict mode's boot gate included)",
    }
}

/// The line for an admitted, unstored canary that came back with `got`
/// and `warnings`.
fn admitted(
    name: &str,
    expected: &Expected,
    got: &[Value],
    warnings: &[String],
) -> (Status, String, Outcome) {
    let want = expected.want;
    let absent = |taints: &[TaintSpec]| -> Vec<String> {
        taints
            .iter()
            .filter(|t| !t.is_in(got))
            .map(ToString::to_string)
            .collect()
    };
    let (missing, missing_owned, missing_gate) = (
        absent(&want.taints),
        absent(&want.owned),
        absent(&want.boot),
    );
    let taints = all(want);
    // The gate shares its key with a taint: a warning counts for the key and
    // effect it names.
    let warned = |t: &TaintSpec| {
        warnings
            .iter()
            .any(|w| w.contains(t.key()) && w.contains(t.effect().as_str()))
    };
    let (by_webhook, unwarned): (Vec<&TaintSpec>, Vec<&TaintSpec>) = taints
        .iter()
        .copied()
        .filter(|t| t.is_in(got))
        .partition(|t| warned(t));
    let (by_webhook, unwarned) = (keys(&by_webhook), keys(&unwarned));
    let shown = shown(got);
    let missed = |detail: String| (Status::Fail, detail, Outcome::Missing);
    if !missing.is_empty() {
        let missing: Vec<String> = missing
            .into_iter()
            .chain(missing_owned)
            .chain(missing_gate)
            .collect();
        return missed(format!(
            "Node {name} was admitted WITHOUT {missing:?} (it came back with {shown:?}): new nodes are schedulable before their network agent is ready"
        ));
    }
    if !missing_owned.is_empty() {
        return missed(format!(
            "Node {name} was admitted WITHOUT the gates owned elsewhere {missing_owned:?} (it came back with {shown:?}): they are configured (--owned-taint) but not applied, so new nodes take pods before the components that own them are ready"
        ));
    }
    if !missing_gate.is_empty() {
        return missed(format!(
            "Node {name} was admitted WITHOUT the boot gate {missing_gate:?} (it came back with {shown:?}): strict mode is configured but not applied, so pods bound to a new or rebooted node run before its network agent is ready"
        ));
    }
    if expected.want_warning && !unwarned.is_empty() {
        return missed(format!(
            "Node {name} came back tainted but without the webhook's warning for {unwarned:?} (warnings: {warnings:?})"
        ));
    }
    // With the admission-policy install the webhook still sees Node creates
    // (for re-registrations) and taints what the policy left untainted: its
    // warning on every taint means the policy did not apply.
    if !expected.want_warning && !warnings.is_empty() && unwarned.is_empty() {
        return missed(format!(
            "Node {name} came back tainted by the webhook, not the admission policy (warnings: {warnings:?}): the policy did not apply, so new nodes depend on the webhook again"
        ));
    }
    let shown_want: Vec<String> = taints.iter().map(ToString::to_string).collect();
    let besides = included(want);
    // Its warning on some: the policy applied without them (generated for
    // other flags). The nodes are gated while the webhook answers, so a
    // warning, not a failure.
    if !expected.want_warning && !by_webhook.is_empty() {
        return (
            Status::Warn,
            format!(
                "Node {name} came back with {shown_want:?}{besides}, but {by_webhook:?} from the webhook, not the admission policy (warnings: {warnings:?}): the policy does not add them, so while the webhook is down new nodes go without them; apply the policy generated with the webhook's {} (nodegate-webhook policy)",
                flag_names(want)
            ),
            Outcome::Tainted,
        );
    }
    let by = if expected.want_warning {
        "and the webhook's warning"
    } else {
        "from the admission policy"
    };
    (
        Status::Pass,
        format!("Node {name} came back with {shown_want:?}{besides} {by}; nothing stored"),
        Outcome::Tainted,
    )
}

/// The line for the canary Node `name`.
pub fn verdict(name: &str, expected: &Expected, sent: &Sent) -> (Status, String, Outcome) {
    let error = |detail: String| (Status::Fail, detail, Outcome::Error);
    match sent {
        Sent::Unbuilt(e) => error(e.clone()),
        Sent::Failed(e) => error(format!("dry-run create of Node {name} failed: {e}")),
        Sent::Answered { status, body, .. } if status.as_u16() != 201 => {
            let msg = body
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default();
            error(format!(
                "dry-run create of Node {name} answered {status}: {msg}"
            ))
        }
        // Dry-run must store nothing; a stored canary would be a fake node.
        Sent::Answered { stored: true, .. } => {
            error(format!("the dry-run stored Node {name} (deleted it again)"))
        }
        Sent::Answered { warnings, body, .. } => {
            let got: Vec<Value> = body
                .pointer("/spec/taints")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            admitted(name, expected, &got, warnings)
        }
    }
}

/// The dry-run create of the canary `name`, and whether it was stored
/// anyway (then deleted again: a stored canary would be a fake node).
pub async fn create(client: &Client, name: &str) -> Sent {
    let pp = PostParams {
        dry_run: true,
        field_manager: Some("nodegate-check".into()),
    };
    let body = match serde_json::to_vec(&canary_node(name)) {
        Ok(b) => b,
        Err(e) => return Sent::Unbuilt(e.to_string()),
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
        Err(e) => return Sent::Failed(e),
    };
    let mut stored = false;
    if status.as_u16() == 201 {
        let nodes: Api<Node> = Api::all(client.clone());
        if let Ok(Some(_)) = nodes.get_opt(name).await {
            let _ = nodes.delete(name, &Default::default()).await;
            stored = true;
        }
    }
    Sent::Answered {
        status,
        warnings,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        stored,
    }
}

/// Sends a canary of a random name and reports [`verdict`]; skipped when
/// there is nothing to expect of it (`None`: nodegate-check's own taint
/// flags are invalid).
pub async fn check(
    client: &Client,
    expected: Option<&Expected<'_>>,
    report: &mut Report,
) -> Outcome {
    let Some(expected) = expected else {
        report.add(CHECK, Status::Skip, NOTHING_TO_EXPECT);
        return Outcome::Error;
    };
    let name = format!("nodegate-check-{:08x}", rand::random::<u32>());
    let (status, detail, outcome) = verdict(&name, expected, &create(client, &name).await);
    report.add(CHECK, status, detail);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegate_shared::keys::DEFAULT_TAINT;

    const GATE: &str = "nodegate.dev/agent-not-ready=true:NoExecute";
    const EBS: &str = "ebs.csi.aws.com/agent-not-ready:NoExecute";

    fn answered(taints: &[&str], warnings: &[&str]) -> Sent {
        // As JSON: the kubelet's own not-ready taint is no TaintSpec.
        let taints: Vec<Value> = taints
            .iter()
            .map(|t| {
                let (key_value, effect) = t.rsplit_once(':').unwrap();
                let (key, value) = key_value.split_once('=').unwrap_or((key_value, ""));
                json!({"key": key, "value": value, "effect": effect})
            })
            .collect();
        Sent::Answered {
            status: StatusCode::CREATED,
            warnings: warnings.iter().map(ToString::to_string).collect(),
            body: json!({"spec": {"taints": taints}}),
            stored: false,
        }
    }

    /// A webhook's warning for `taint`, as it words it.
    fn warning(taint: &str) -> String {
        let t: TaintSpec = taint.parse().unwrap();
        format!("299 - \"nodegate: added taint {}:{}\"", t.key(), t.effect())
    }

    #[test]
    fn verdicts() {
        let plain = Flags::of(&[DEFAULT_TAINT], &[]);
        let strict = Flags::of(&[DEFAULT_TAINT], &[GATE]);
        let with_owned = |mut f: Flags| {
            f.owned = vec![EBS.parse().unwrap()];
            f
        };
        let (owned, strict_owned) = (with_owned(plain.clone()), with_owned(strict.clone()));
        let (w, wg, we) = (warning(DEFAULT_TAINT), warning(GATE), warning(EBS));
        let webhook = |want| Expected {
            want,
            want_warning: true,
        };
        let policy = |want| Expected {
            want,
            want_warning: false,
        };
        let rejected = Sent::Answered {
            status: StatusCode::FORBIDDEN,
            warnings: Vec::new(),
            body: json!({"message": "nodes is forbidden"}),
            stored: false,
        };
        let stored = match answered(&[DEFAULT_TAINT], &[&w]) {
            Sent::Answered {
                status,
                warnings,
                body,
                ..
            } => Sent::Answered {
                status,
                warnings,
                body,
                stored: true,
            },
            other => other,
        };
        let rows: Vec<(&str, Expected, Sent, Status, Outcome, String)> = vec![
            ("tainted and warned", webhook(&plain), answered(&[DEFAULT_TAINT], &[&w]), Status::Pass, Outcome::Tainted,
                format!("Node n came back with [\"{DEFAULT_TAINT}\"] and the webhook's warning; nothing stored")),
            ("strict mode", webhook(&strict), answered(&[DEFAULT_TAINT, GATE], &[&w, &wg]), Status::Pass, Outcome::Tainted,
                format!("Node n came back with [\"{DEFAULT_TAINT}\", \"{GATE}\"] (strict mode's boot gate included) and the webhook's warning")),
            ("by the policy", policy(&plain), answered(&[DEFAULT_TAINT], &[]), Status::Pass, Outcome::Tainted,
                format!("[\"{DEFAULT_TAINT}\"] from the admission policy; nothing stored")),
            ("unbuilt", webhook(&plain), Sent::Unbuilt("bad".into()), Status::Fail, Outcome::Error, "bad".into()),
            ("no answer", webhook(&plain), Sent::Failed("reset".into()), Status::Fail, Outcome::Error,
                "dry-run create of Node n failed: reset".into()),
            ("refused", webhook(&plain), rejected, Status::Fail, Outcome::Error,
                "dry-run create of Node n answered 403 Forbidden: nodes is forbidden".into()),
            ("stored", webhook(&plain), stored, Status::Fail, Outcome::Error,
                "the dry-run stored Node n (deleted it again)".into()),
            ("untainted", webhook(&strict), answered(&["node.kubernetes.io/not-ready:NoSchedule"], &[]), Status::Fail, Outcome::Missing,
                format!("Node n was admitted WITHOUT [\"{DEFAULT_TAINT}\", \"{GATE}\"] (it came back with [\"node.kubernetes.io/not-ready:NoSchedule\"]): new nodes are schedulable")),
            ("without the gate", webhook(&strict), answered(&[DEFAULT_TAINT], &[&w]), Status::Fail, Outcome::Missing,
                format!("Node n was admitted WITHOUT the boot gate [\"{GATE}\"] (it came back with [\"nodegate.dev/agent-not-ready:NoSchedule\"]): strict mode is configured but not applied")),
            ("without the warning", webhook(&strict), answered(&[DEFAULT_TAINT, GATE], &[&w]), Status::Fail, Outcome::Missing,
                "came back tainted but without the webhook's warning for [\"nodegate.dev/agent-not-ready:NoExecute\"]".into()),
            ("the webhook, not the policy", policy(&plain), answered(&[DEFAULT_TAINT], &[&w]), Status::Fail, Outcome::Missing,
                "came back tainted by the webhook, not the admission policy".into()),
            // The policy added the taint, the webhook the gate: nodes are
            // gated only while the webhook answers.
            ("the policy, some warning", policy(&strict), answered(&[DEFAULT_TAINT, GATE], &[&wg]), Status::Warn, Outcome::Tainted,
                format!("(strict mode's boot gate included), but [\"nodegate.dev/agent-not-ready:NoExecute\"] from the webhook, not the admission policy (warnings: [{wg:?}]): the policy does not add them, so while the webhook is down new nodes go without them; apply the policy generated with the webhook's --taint and --boot-taint (nodegate-webhook policy)")),
            // Gates owned elsewhere (`--owned-taint`): added at create, warned
            // for, and in the policy's output.
            ("owned, tainted and warned", webhook(&owned), answered(&[DEFAULT_TAINT, EBS], &[&w, &we]), Status::Pass, Outcome::Tainted,
                format!("Node n came back with [\"{DEFAULT_TAINT}\", \"{EBS}\"] (gates owned elsewhere included) and the webhook's warning; nothing stored")),
            ("owned and strict mode", webhook(&strict_owned), answered(&[DEFAULT_TAINT, EBS, GATE], &[&w, &we, &wg]), Status::Pass, Outcome::Tainted,
                format!("Node n came back with [\"{DEFAULT_TAINT}\", \"{EBS}\", \"{GATE}\"] (gates owned elsewhere and strict mode's boot gate included) and the webhook's warning")),
            ("owned, untainted", webhook(&strict_owned), answered(&[], &[]), Status::Fail, Outcome::Missing,
                format!("Node n was admitted WITHOUT [\"{DEFAULT_TAINT}\", \"{EBS}\", \"{GATE}\"] (it came back with []): new nodes are schedulable")),
            ("without the owned gate", webhook(&strict_owned), answered(&[DEFAULT_TAINT, GATE], &[&w, &wg]), Status::Fail, Outcome::Missing,
                format!("Node n was admitted WITHOUT the gates owned elsewhere [\"{EBS}\"] (it came back with [\"nodegate.dev/agent-not-ready:NoSchedule\", \"nodegate.dev/agent-not-ready:NoExecute\"]): they are configured (--owned-taint) but not applied, so new nodes take pods before the components that own them are ready")),
            ("owned, without its warning", webhook(&owned), answered(&[DEFAULT_TAINT, EBS], &[&w]), Status::Fail, Outcome::Missing,
                format!("came back tainted but without the webhook's warning for [\"{EBS}\"]")),
            ("owned, by the policy", policy(&owned), answered(&[DEFAULT_TAINT, EBS], &[]), Status::Pass, Outcome::Tainted,
                format!("Node n came back with [\"{DEFAULT_TAINT}\", \"{EBS}\"] (gates owned elsewhere included) from the admission policy; nothing stored")),
            ("owned, by the webhook beside the policy", policy(&owned), answered(&[DEFAULT_TAINT, EBS], &[&we]), Status::Warn, Outcome::Tainted,
                format!("Node n came back with [\"{DEFAULT_TAINT}\", \"{EBS}\"] (gates owned elsewhere included), but [\"{EBS}\"] from the webhook, not the admission policy (warnings: [{we:?}]): the policy does not add them, so while the webhook is down new nodes go without them; apply the policy generated with the webhook's --taint, --owned-taint and --boot-taint (nodegate-webhook policy)")),
            ("owned, all by the webhook", policy(&owned), answered(&[DEFAULT_TAINT, EBS], &[&w, &we]), Status::Fail, Outcome::Missing,
                "came back tainted by the webhook, not the admission policy".into()),
        ];
        for (name, expected, sent, status, outcome, part) in rows {
            let (s, detail, o) = verdict("n", &expected, &sent);
            assert_eq!((s, o), (status, outcome), "{name}: {detail}");
            assert!(detail.contains(&part), "{name}: {detail:?} lacks {part:?}");
        }
    }
}
