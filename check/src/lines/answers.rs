//! `line <entry>`: each line's replica, called directly through the API
//! server's service proxy with a canary Node CREATE (at the line's path
//! without its token: [`proxied_path`]), must allow it with a patch adding
//! every expected taint, the gates owned elsewhere included (the webhook
//! adds them at create). [`read`] calls every line; [`verdict`] judges each
//! call.

use std::time::Duration;

use base64::Engine;
use http_body_util::BodyExt;
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::Client;
use kube::core::admission::{
    AdmissionRequest, AdmissionReview, META_API_VERSION_V1, META_KIND, Operation,
};
use kube::core::{DynamicObject, GroupVersionKind, GroupVersionResource, TypeMeta};
use nodegate_shared::keys::NODE_USER_PREFIX;
use serde_json::{Value, json};

use super::{Line, ServiceRef, lines, proxied_path, registering_node};
use crate::container_flags::Flags;
use crate::expected::{NOTHING_TO_EXPECT, all, flag_names};
use crate::report::{Report, Status};
use crate::webhook_config::Hook;

/// A line's answer through the proxy; kube's own retries of a 503 would
/// otherwise hold a dead line's check for minutes when no config is given.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// An AdmissionReview of a kubelet's registration of `node`, as the API
/// server sends it. Marked dry-run: the webhook then answers the same patch
/// without queueing its re-registration follow-up for a Node that does not
/// exist.
fn review(uid: &str, node: &Value) -> Result<AdmissionReview<DynamicObject>, String> {
    let object: DynamicObject = serde_json::from_value(node.clone()).map_err(|e| e.to_string())?;
    let name = object.metadata.name.clone().unwrap_or_default();
    let types = TypeMeta {
        api_version: META_API_VERSION_V1.into(),
        kind: META_KIND.into(),
    };
    let request = AdmissionRequest {
        types: types.clone(),
        uid: uid.into(),
        kind: GroupVersionKind::gvk("", "v1", "Node"),
        resource: GroupVersionResource::gvr("", "v1", "nodes"),
        sub_resource: None,
        request_kind: Some(GroupVersionKind::gvk("", "v1", "Node")),
        request_resource: Some(GroupVersionResource::gvr("", "v1", "nodes")),
        request_sub_resource: None,
        name: name.clone(),
        namespace: None,
        operation: Operation::Create,
        user_info: UserInfo {
            username: Some(format!("{NODE_USER_PREFIX}{name}")),
            groups: Some(vec!["system:nodes".into(), "system:authenticated".into()]),
            ..Default::default()
        },
        object: Some(object),
        old_object: None,
        dry_run: true,
        options: Some(RawExtension(json!({
            "kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "dryRun": ["All"],
        }))),
    };
    Ok(AdmissionReview {
        types,
        request: Some(request),
        response: None,
    })
}

/// The taints `node` carries after the answer's patch, or what is wrong
/// with the answer. Read as JSON, not as kube's `AdmissionResponse`: that
/// type expects the patch as an array of numbers, the wire carries base64.
fn judge(body: &[u8], uid: &str, node: &Value) -> Result<Vec<Value>, String> {
    let answer: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON ({e})"))?;
    if answer["apiVersion"] != META_API_VERSION_V1 || answer["kind"] != META_KIND {
        return Err(format!(
            "not an {META_API_VERSION_V1} {META_KIND} (apiVersion {}, kind {})",
            answer["apiVersion"], answer["kind"]
        ));
    }
    let resp = &answer["response"];
    if resp["uid"] != uid {
        return Err(format!(
            "answered uid {}, not {uid:?} (the API server refuses such an answer)",
            resp["uid"]
        ));
    }
    if resp["allowed"] != true {
        return Err(format!(
            "denied the create: {}",
            resp.pointer("/status/message")
                .and_then(Value::as_str)
                .unwrap_or("(no message)")
        ));
    }
    let Some(patch) = resp["patch"].as_str() else {
        return Err("allowed the create without a patch".into());
    };
    if resp["patchType"] != "JSONPatch" {
        return Err(format!(
            "patchType {} (the API server applies JSONPatch only)",
            resp["patchType"]
        ));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .map_err(|e| format!("patch is not base64 ({e})"))?;
    let patch: json_patch::Patch =
        serde_json::from_slice(&bytes).map_err(|e| format!("patch is not a JSON patch ({e})"))?;
    let mut patched = node.clone();
    json_patch::patch(&mut patched, &patch).map_err(|e| {
        format!(
            "its patch does not apply to the Node ({e}): the API server fails the create with 500"
        )
    })?;
    Ok(patched
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default())
}

/// How one line's direct call went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Allowed, with every expected taint.
    Tainted,
    /// An AdmissionReview came back, without every taint or unusable.
    Untainted,
    /// No AdmissionReview came back (HTTP error, transport, timeout).
    Unreachable,
    /// Not called (url, no permission, nothing to expect).
    NotCalled,
}

/// The service proxy URL of the line's Service, at [`proxied_path`]: never
/// the path token.
fn proxy_url(svc: &ServiceRef, timeout: i32) -> String {
    format!(
        "/api/v1/namespaces/{}/services/https:{}:{}/proxy{}?timeout={timeout}s",
        svc.namespace,
        svc.name,
        svc.port,
        proxied_path(&svc.path)
    )
}

/// POSTs `review` to the line's Service through the API server's proxy:
/// HTTP status and body, or the transport error.
async fn call(
    proxy: &Client,
    svc: &ServiceRef,
    timeout: i32,
    review: &[u8],
) -> Result<(u16, Vec<u8>), String> {
    let url = proxy_url(svc, timeout);
    let req = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(kube::client::Body::from(review.to_vec()))
        .map_err(|e| e.to_string())?;
    let sent = async {
        let resp = proxy.send(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, body.to_vec()))
    };
    tokio::time::timeout(CALL_TIMEOUT, sent)
        .await
        .map_err(|_| format!("no answer within {} s", CALL_TIMEOUT.as_secs()))?
}

/// How the call of one line went.
#[derive(Debug, Clone)]
pub enum Call {
    /// Not called, and why.
    Skipped(&'static str),
    /// The review could not be built.
    Unbuilt(String),
    /// No HTTP answer (transport error, timeout).
    Failed { svc: ServiceRef, error: String },
    /// An HTTP answer to the review of `node` (uid `uid`), which must add
    /// every taint of `want`.
    Answered {
        svc: ServiceRef,
        want: Flags,
        uid: String,
        node: Value,
        status: u16,
        body: Vec<u8>,
    },
}

/// Where to call and what to expect of the answer, or why the line is not
/// called.
fn target<'a>(
    l: &'a Line,
    want: Option<&'a Flags>,
) -> Result<(&'a ServiceRef, &'a Flags), &'static str> {
    let Some(svc) = &l.service else {
        return Err("called by url: the API server's service proxy cannot reach it");
    };
    let Some(want) = want else {
        return Err(NOTHING_TO_EXPECT);
    };
    Ok((svc, want))
}

/// The `message` of a Status answer, else the body's first 200 characters.
fn message(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(200).collect())
}

/// The line for one line's call, and how it answered.
pub fn verdict(call: &Call) -> (Status, String, Answer) {
    let via = |svc: &ServiceRef| format!("{} through the API server's service proxy", svc.shown());
    let (svc, want, uid, node, status, body) = match call {
        Call::Skipped(why) => return (Status::Skip, why.to_string(), Answer::NotCalled),
        Call::Unbuilt(e) => {
            return (
                Status::Fail,
                format!("cannot build the AdmissionReview: {e}"),
                Answer::NotCalled,
            );
        }
        Call::Failed { svc, error } => {
            return (
                Status::Fail,
                format!("POST to {}: {error}", via(svc)),
                Answer::Unreachable,
            );
        }
        Call::Answered {
            svc,
            want,
            uid,
            node,
            status,
            body,
        } => (svc, want, uid, node, *status, body),
    };
    let via = via(svc);
    if status == 403 {
        return (
            Status::Warn,
            format!(
                "not called: nodegate-check may not create services/proxy in namespace {} ({}); grant it that to check each line's replica directly",
                svc.namespace,
                message(body)
            ),
            Answer::NotCalled,
        );
    }
    if !(200..300).contains(&status) {
        return (
            Status::Fail,
            format!(
                "POST to {via} answered HTTP {status}: {}: this line fails open (is its replica down or not Ready?)",
                message(body)
            ),
            Answer::Unreachable,
        );
    }
    let taints = match judge(body, uid, node) {
        Ok(t) => t,
        Err(e) => return (Status::Fail, format!("{via}: {e}"), Answer::Untainted),
    };
    let expected = all(want);
    let missing: Vec<String> = expected
        .iter()
        .filter(|t| !t.is_in(&taints))
        .map(ToString::to_string)
        .collect();
    let names: Vec<String> = expected.iter().map(ToString::to_string).collect();
    if missing.is_empty() {
        (
            Status::Pass,
            format!("{via} allowed a Node CREATE with a patch adding {names:?}"),
            Answer::Tainted,
        )
    } else {
        (
            Status::Fail,
            format!(
                "{via} allowed a Node CREATE WITHOUT {missing:?}: does that replica run with the {} flags checked here?",
                flag_names(want)
            ),
            Answer::Untainted,
        )
    }
}

/// Calls one line's replica with the review of a canary Node.
async fn call_line(proxy: &Client, l: &Line, want: Option<&Flags>) -> Call {
    let (svc, want) = match target(l, want) {
        Ok(t) => t,
        Err(why) => return Call::Skipped(why),
    };
    let uid = format!("nodegate-check-{:08x}", rand::random::<u32>());
    let node = registering_node(&uid);
    let body = review(&uid, &node).and_then(|r| serde_json::to_vec(&r).map_err(|e| e.to_string()));
    let body = match body {
        Ok(b) => b,
        Err(e) => return Call::Unbuilt(e),
    };
    match call(proxy, svc, l.timeout_seconds, &body).await {
        Ok((status, body)) => Call::Answered {
            svc: svc.clone(),
            want: want.clone(),
            uid,
            node,
            status,
            body,
        },
        Err(error) => Call::Failed {
            svc: svc.clone(),
            error,
        },
    }
}

/// Calls every line in turn: `(line, how it went)`.
pub async fn read(proxy: &Client, hook: &Hook, want: Option<&Flags>) -> Vec<(String, Call)> {
    let mut out = Vec::new();
    for l in lines(hook) {
        let called = call_line(proxy, &l, want).await;
        out.push((l.name, called));
    }
    out
}

/// One `line <entry>` check per line: its replica, called directly through
/// the API server's service proxy (`proxy`, a client that does not retry a
/// 503) with a canary Node CREATE, must allow it with a patch adding every
/// taint of `want`. Returns how each answered, for the diagnosis.
pub async fn check(
    proxy: &Client,
    hook: &Hook,
    want: Option<&Flags>,
    report: &mut Report,
) -> Vec<Answer> {
    let mut out = Vec::new();
    for (name, called) in read(proxy, hook, want).await {
        let (status, detail, answer) = verdict(&called);
        report.add(format!("line {name}"), status, detail);
        out.push(answer);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_with(taints: Value) -> Value {
        let mut n = registering_node("n");
        n["spec"]["taints"] = taints;
        n
    }

    fn answer(uid: &str, resp: Value) -> Vec<u8> {
        let mut r = resp;
        r["uid"] = json!(uid);
        serde_json::to_vec(
            &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": r}),
        )
        .unwrap()
    }

    #[test]
    fn judges_the_answer_as_the_api_server_reads_it() {
        let node = node_with(json!([]));
        let gate = json!({"key": "g", "value": "true", "effect": "NoSchedule"});
        let patch = base64::engine::general_purpose::STANDARD
            .encode(json!([{"op": "add", "path": "/spec/taints/-", "value": gate}]).to_string());
        let ok = answer(
            "u",
            json!({"allowed": true, "patch": patch, "patchType": "JSONPatch"}),
        );
        assert_eq!(judge(&ok, "u", &node), Ok(vec![gate]));
        assert!(
            judge(&ok, "v", &node)
                .unwrap_err()
                .contains("answered uid \"u\"")
        );
        let denied = answer("u", json!({"allowed": false, "status": {"message": "no"}}));
        assert_eq!(
            judge(&denied, "u", &node),
            Err("denied the create: no".into())
        );
        let bare = answer("u", json!({"allowed": true}));
        assert!(
            judge(&bare, "u", &node)
                .unwrap_err()
                .contains("without a patch")
        );
        // `add /spec/taints/-` needs the list: a Node without one fails.
        let mut untainted = node.clone();
        untainted["spec"] = json!({});
        assert!(
            judge(&ok, "u", &untainted)
                .unwrap_err()
                .contains("does not apply")
        );
        assert!(
            judge(b"{}", "u", &node)
                .unwrap_err()
                .contains("not an admission.k8s.io/v1")
        );
    }

    #[test]
    fn the_review_reads_as_the_webhook_reads_it() {
        let node = registering_node("n1");
        let r = serde_json::to_value(review("u-1", &node).unwrap()).unwrap();
        assert_eq!(r["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(r["kind"], "AdmissionReview");
        assert_eq!(r["request"]["uid"], "u-1");
        assert_eq!(r["request"]["operation"], "CREATE");
        assert_eq!(
            r["request"]["kind"],
            json!({"group": "", "version": "v1", "kind": "Node"})
        );
        assert_eq!(r["request"]["userInfo"]["username"], "system:node:n1");
        assert_eq!(r["request"]["object"]["metadata"]["name"], "n1");
        assert_eq!(
            r["request"]["object"]["spec"]["taints"][0]["key"],
            "node.kubernetes.io/not-ready"
        );
        assert_eq!(r["request"]["oldObject"], Value::Null);
    }

    #[test]
    fn the_proxy_url_carries_no_path_token() {
        let token = "0f3a9d2c4e6b8a1f0c2d4e6f8a0b1c2d3e4f5a6b7c8d9e0f";
        let svc = ServiceRef {
            namespace: "nodegate".into(),
            name: "nodegate-webhook-1".into(),
            port: 443,
            path: format!("/mutate/{token}"),
        };
        assert_eq!(
            proxy_url(&svc, 10),
            "/api/v1/namespaces/nodegate/services/https:nodegate-webhook-1:443/proxy/mutate?timeout=10s"
        );
    }

    /// Each way a line's call ends, and the answer it counts as.
    #[test]
    fn verdicts() {
        use nodegate_shared::TaintSpec;
        use nodegate_shared::keys::DEFAULT_TAINT;
        const EBS: &str = "ebs.csi.aws.com/agent-not-ready:NoExecute";
        let svc = ServiceRef {
            namespace: "nodegate".into(),
            name: "nodegate-webhook-1".into(),
            port: 443,
            path: "/mutate/secret".into(),
        };
        let want = Flags::of(&[DEFAULT_TAINT], &[]);
        let node = registering_node("u");
        let gate: TaintSpec = DEFAULT_TAINT.parse().unwrap();
        let patch = |taints: Vec<Value>| {
            let ops: Vec<Value> = taints
                .into_iter()
                .map(|t| json!({"op": "add", "path": "/spec/taints/-", "value": t}))
                .collect();
            base64::engine::general_purpose::STANDARD.encode(Value::Array(ops).to_string())
        };
        let mut owned = want.clone();
        owned.owned = vec![EBS.parse().unwrap()];
        let ebs: TaintSpec = EBS.parse().unwrap();
        let answered_for = |want: &Flags, status: u16, body: Vec<u8>| Call::Answered {
            svc: svc.clone(),
            want: want.clone(),
            uid: "u".into(),
            node: node.clone(),
            status,
            body,
        };
        let answered = |status: u16, body: Vec<u8>| answered_for(&want, status, body);
        let allowed = |taints| {
            answer(
                "u",
                json!({"allowed": true, "patchType": "JSONPatch", "patch": patch(taints)}),
            )
        };
        let other = json!({"key": "example.com/x", "effect": "NoSchedule"});
        let via = "nodegate/nodegate-webhook-1:443/mutate through the API server's service proxy";
        let rows = [
            (Call::Skipped("called by url"), Status::Skip, Answer::NotCalled, "called by url".to_string()),
            (Call::Unbuilt("bad".into()), Status::Fail, Answer::NotCalled, "cannot build the AdmissionReview: bad".into()),
            (
                Call::Failed { svc: svc.clone(), error: "no answer within 20 s".into() },
                Status::Fail,
                Answer::Unreachable,
                format!("POST to {via}: no answer within 20 s"),
            ),
            (
                answered(403, br#"{"message": "services \"x\" is forbidden"}"#.to_vec()),
                Status::Warn,
                Answer::NotCalled,
                "not called: nodegate-check may not create services/proxy in namespace nodegate (services \"x\" is forbidden); grant it that to check each line's replica directly".into(),
            ),
            (
                answered(503, b"no endpoints available".to_vec()),
                Status::Fail,
                Answer::Unreachable,
                format!("POST to {via} answered HTTP 503: no endpoints available: this line fails open (is its replica down or not Ready?)"),
            ),
            (
                answered(200, b"{}".to_vec()),
                Status::Fail,
                Answer::Untainted,
                format!("{via}: not an admission.k8s.io/v1 AdmissionReview"),
            ),
            (
                answered(200, allowed(vec![other])),
                Status::Fail,
                Answer::Untainted,
                format!("{via} allowed a Node CREATE WITHOUT [\"{DEFAULT_TAINT}\"]: does that replica run with the --taint and --boot-taint flags checked here?"),
            ),
            (
                answered(200, allowed(vec![gate.to_json()])),
                Status::Pass,
                Answer::Tainted,
                format!("{via} allowed a Node CREATE with a patch adding [\"{DEFAULT_TAINT}\"]"),
            ),
            // A gate owned elsewhere is added at create too.
            (
                answered_for(&owned, 200, allowed(vec![gate.to_json()])),
                Status::Fail,
                Answer::Untainted,
                format!("{via} allowed a Node CREATE WITHOUT [\"{EBS}\"]: does that replica run with the --taint, --owned-taint and --boot-taint flags checked here?"),
            ),
            (
                answered_for(&owned, 200, allowed(vec![ebs.to_json(), gate.to_json()])),
                Status::Pass,
                Answer::Tainted,
                format!("{via} allowed a Node CREATE with a patch adding [\"{DEFAULT_TAINT}\", \"{EBS}\"]"),
            ),
        ];
        for (call, status, answer, part) in rows {
            let (got, detail, a) = verdict(&call);
            assert_eq!((got, a), (status, answer), "{detail}");
            assert!(
                detail.starts_with(&part),
                "{detail:?} does not start with {part:?}"
            );
        }
    }
}
