//! The lines of admission (`nodegate-webhook webhook-config`): the
//! configuration's first entry reaches every replica through the webhook's
//! Service; after it, one backup entry per StatefulSet replica reaches that
//! replica alone through its own Service, and its conditions let it fire
//! only while the Node under review still lacks a configured taint, i.e.
//! only when the lines before it failed open. The API server never retries a
//! failed call, so a Node write is stored ungated only when every line it
//! reached failed.
//!
//! - [`check`] (`webhook lines`): a backup line per replica, each calling a
//!   Service of its own that exists and selects exactly that replica;
//!   failurePolicy Ignore and reinvocationPolicy Never on every line; backup
//!   conditions that evaluate on a Node CREATE and go quiet once it carries
//!   the taints;
//! - [`check_answers`] (`line <entry>`): each line's replica, called through
//!   the API server's service proxy with a canary Node CREATE, answers with
//!   every taint;
//! - [`check_placement`] (`replica placement`): the backup lines' replicas
//!   on distinct nodes.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use http_body_util::BodyExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhook;
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::core::admission::{
    AdmissionRequest, AdmissionReview, META_API_VERSION_V1, META_KIND, Operation,
};
use kube::core::{DynamicObject, GroupVersionKind, GroupVersionResource, TypeMeta};
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::NODE_USER_PREFIX;
use nodegate_shared::match_conditions::Verdict;
use serde_json::{Value, json};

use crate::container_flags::Flags;
use crate::webhook_config::{Hook, conditions, covers, evaluate_as};
use crate::workloads::{Kind, WebhookWorkload};
use crate::{Report, Status};

pub const CHECK: &str = "webhook lines";
pub const PLACEMENT: &str = "replica placement";
/// The label the StatefulSet controller puts on each of its Pods.
const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
/// A line's answer through the proxy; kube's own retries of a 503 would
/// otherwise hold a dead line's check for minutes when no config is given.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// Where a line calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
    pub port: i32,
    /// With its leading `/`.
    pub path: String,
}

impl ServiceRef {
    /// The name the API server verifies the serving certificate for.
    pub fn host(&self) -> String {
        format!("{}.{}.svc", self.name, self.namespace)
    }

    /// For the report: the path's token, a secret, left out.
    fn shown(&self) -> String {
        let path = match self
            .path
            .strip_prefix(nodegate_shared::path_token::PATH_PREFIX)
        {
            Some(_) => format!("{}<token>", nodegate_shared::path_token::PATH_PREFIX),
            None => self.path.clone(),
        };
        format!("{}/{}:{}{path}", self.namespace, self.name, self.port)
    }
}

/// One entry of the configuration.
#[derive(Debug, Clone)]
pub struct Line {
    pub name: String,
    /// `None`: called by `url`.
    pub service: Option<ServiceRef>,
    pub ca_bundle: Vec<u8>,
    /// As configured; the API server's default is Fail.
    pub failure_policy: String,
    /// As configured; the API server's default is Never.
    pub reinvocation_policy: String,
    /// What the API server sends as `?timeout=` (default 10 s).
    pub timeout_seconds: i32,
}

impl Line {
    fn of(w: &MutatingWebhook) -> Line {
        let cc = &w.client_config;
        Line {
            name: w.name.clone(),
            service: cc.service.as_ref().map(|s| {
                let path = s.path.clone().unwrap_or_default();
                ServiceRef {
                    namespace: s.namespace.clone(),
                    name: s.name.clone(),
                    port: s.port.unwrap_or(443),
                    path: if path.starts_with('/') {
                        path
                    } else {
                        format!("/{path}")
                    },
                }
            }),
            ca_bundle: cc
                .ca_bundle
                .as_ref()
                .map(|b| b.0.clone())
                .unwrap_or_default(),
            failure_policy: w.failure_policy.clone().unwrap_or_else(|| "Fail".into()),
            reinvocation_policy: w
                .reinvocation_policy
                .clone()
                .unwrap_or_else(|| "Never".into()),
            timeout_seconds: w.timeout_seconds.unwrap_or(10),
        }
    }
}

/// Every entry of the configuration as a line, in the order the API server
/// calls them.
pub fn lines(hook: &Hook) -> Vec<Line> {
    hook.entries.iter().map(Line::of).collect()
}

/// The backup lines' Services as read, for [`check_placement`].
#[derive(Debug, Clone, Default)]
pub struct Backups {
    /// `(line, Service)` of each backup line whose Service was read.
    pub services: Vec<(String, Service)>,
}

/// Which replica a backup line's Service selects: `Ok(Some(i))`,
/// `Ok(None)` when the workload is unknown, `Err(what is wrong)`.
fn selection(
    selector: &BTreeMap<String, String>,
    svc: &ServiceRef,
    w: Option<&WebhookWorkload>,
) -> Result<Option<i32>, String> {
    let Some(pod) = selector.get(POD_NAME_LABEL) else {
        return Err(format!(
            "selects every replica (no {POD_NAME_LABEL} in its selector): a dead replica still takes its share of the line's calls"
        ));
    };
    let Some(w) = w else {
        return Ok(None);
    };
    if w.kind != Kind::StatefulSet {
        return Err(format!(
            "selects Pod {pod}, but the webhook runs as {}, whose Pods carry no {POD_NAME_LABEL}: it selects nothing",
            w.describe()
        ));
    }
    if svc.namespace != w.namespace {
        return Err(format!(
            "is not in the namespace of {}: it selects none of its Pods",
            w.describe()
        ));
    }
    let foreign: Vec<String> = selector
        .iter()
        .filter(|(k, v)| k.as_str() != POD_NAME_LABEL && w.template_labels.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !foreign.is_empty() {
        return Err(format!(
            "selects {foreign:?}, which the Pods of {} do not carry: it selects none of them",
            w.describe()
        ));
    }
    pod.strip_prefix(&format!("{}-", w.name))
        .and_then(|i| i.parse::<i32>().ok().filter(|n| n.to_string() == i))
        .filter(|i| (0..w.replicas).contains(i))
        .map(Some)
        .ok_or_else(|| {
            format!(
                "selects Pod {pod}, not one of the {} replicas of {} ({})",
                w.replicas,
                w.describe(),
                (0..w.replicas)
                    .map(|i| w.pod(i))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// A Node as the API server hands it to the webhooks on a kubelet's
/// registration: TaintNodesByCondition has added `not-ready`.
fn registering_node(name: &str) -> Value {
    let mut n = crate::canary::canary_node(name);
    n["spec"] =
        json!({"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]});
    n
}

/// What is wrong with a backup line's conditions (`problems`), or costly
/// (`risks`): it must be called on a Node CREATE that lacks the taints and,
/// when `want` is known, skipped on one that carries them. Evaluated with
/// `request` bound as for a real (not dry-run) create, where an absent
/// `dryRun` is an error too.
fn backup_conditions(
    entry: &MutatingWebhook,
    want: Option<&Flags>,
    problems: &mut Vec<String>,
    risks: &mut Vec<String>,
) {
    let name = &entry.name;
    if !covers(entry.rules.as_deref().unwrap_or_default(), "CREATE", "") {
        problems.push(format!(
            "no rule sends a Node CREATE to {name}: it backs up no registration"
        ));
        return;
    }
    let conditions = conditions(entry);
    let node = "nodegate-check-node";
    let user = format!("{NODE_USER_PREFIX}{node}");
    let bare = registering_node(node);
    let silent = |errs: Vec<String>, on: &str| {
        format!(
            "{} of {name} on {on}: with failurePolicy Ignore the API server skips that line silently, so it never backs up the first one — guard optional request fields with has()",
            errs.join("; ")
        )
    };
    match evaluate_as(&conditions, "CREATE", "", &user, &bare, &Value::Null) {
        Verdict::Call => {}
        Verdict::Excluded(c) => problems.push(format!(
            "condition {c} of {name} is false on a Node CREATE that lacks the taints: the line never backs up the first one"
        )),
        Verdict::Errors(errs) => problems.push(silent(errs, "a Node CREATE")),
    }
    let Some(want) = want else {
        return;
    };
    let mut tainted = bare;
    let all: Vec<&TaintSpec> = want.taints.iter().chain(&want.boot).collect();
    if let Some(list) = tainted["spec"]["taints"].as_array_mut() {
        list.extend(all.iter().map(|t| t.to_json()));
    }
    match evaluate_as(&conditions, "CREATE", "", &user, &tainted, &Value::Null) {
        Verdict::Excluded(_) => {}
        Verdict::Call => risks.push(format!(
            "{name} is called even on a Node CREATE that carries every taint ({}): each Node write then costs one more call, and a dead replica a timeout; its conditions must list the webhook's --taint and --boot-taint flags (regenerate with `nodegate-webhook webhook-config`)",
            all.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        )),
        Verdict::Errors(errs) => problems.push(silent(errs, "a tainted Node CREATE")),
    }
}

/// The `webhook lines` line: the shape of the configuration against the
/// webhook's workload (`None`: missing or unreadable, another line says
/// which) and its taints (`want`).
pub async fn check(
    client: &Client,
    hook: &Hook,
    workload: Option<&WebhookWorkload>,
    want: Option<&Flags>,
    report: &mut Report,
) -> Backups {
    let all = lines(hook);
    // webhook_config::check found the first line, or there is no Hook.
    let first = all.iter().position(|l| l.name == hook.name).unwrap_or(0);
    let (mut problems, mut risks, mut notes) = (Vec::new(), Vec::new(), Vec::new());
    for l in &all {
        if l.failure_policy != "Ignore" {
            problems.push(format!(
                "{} has failurePolicy {}: while its replica is down the API server refuses the Node write instead of trying the next line (and a kubelet retries its create forever); set Ignore",
                l.name, l.failure_policy
            ));
        }
        if l.reinvocation_policy != "Never" {
            problems.push(format!(
                "{} has reinvocationPolicy {}: a line that failed open is called again after a later line's patch, so a dead replica costs a second timeout; set Never",
                l.name, l.reinvocation_policy
            ));
        }
    }
    for l in &all[..first] {
        problems.push(format!(
            "{} comes before the first line {}: it is called ahead of it on every Node write",
            l.name, hook.name
        ));
    }

    let mut claimed: Vec<(ServiceRef, String)> = all[first]
        .service
        .iter()
        .map(|s| (s.clone(), hook.name.clone()))
        .collect();
    let mut covered: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    let mut out = Backups::default();
    let mut shown = Vec::new();
    let backups: Vec<(&Line, &MutatingWebhook)> = all
        .iter()
        .zip(&hook.entries)
        .enumerate()
        .filter(|(i, _)| *i != first)
        .map(|(_, p)| p)
        .collect();
    for (l, entry) in &backups {
        backup_conditions(entry, want, &mut problems, &mut risks);
        let Some(svc) = &l.service else {
            problems.push(format!(
                "{} calls a url, not a replica's own Service",
                l.name
            ));
            continue;
        };
        let at = format!("{}/{}", svc.namespace, svc.name);
        if let Some((_, other)) = claimed
            .iter()
            .find(|(s, _)| s.namespace == svc.namespace && s.name == svc.name)
        {
            problems.push(format!(
                "{} and {other} both call Service {at}: a backup line needs a replica's own Service",
                l.name
            ));
            continue;
        }
        claimed.push((svc.clone(), l.name.clone()));
        let api: Api<Service> = Api::namespaced(client.clone(), &svc.namespace);
        let object = match api.get_opt(&svc.name).await {
            Ok(Some(o)) => o,
            Ok(None) => {
                problems.push(format!(
                    "Service {at} of {} not found: that line always fails open",
                    l.name
                ));
                continue;
            }
            Err(e) => {
                notes.push(format!("cannot read Service {at} of {}: {e}", l.name));
                continue;
            }
        };
        let spec = object.spec.clone().unwrap_or_default();
        let ports: Vec<i32> = spec.ports.iter().flatten().map(|p| p.port).collect();
        if !ports.contains(&svc.port) {
            problems.push(format!(
                "Service {at} of {} has ports {ports:?}, the line calls {}",
                l.name, svc.port
            ));
        }
        match selection(&spec.selector.unwrap_or_default(), svc, workload) {
            Ok(Some(i)) => {
                covered.entry(i).or_default().push(l.name.clone());
                if let Some(w) = workload {
                    shown.push(format!("{} → {at} (Pod {})", l.name, w.pod(i)));
                }
            }
            Ok(None) => shown.push(format!("{} → {at}", l.name)),
            Err(why) => problems.push(format!("Service {at} of {} {why}", l.name)),
        }
        out.services.push((l.name.clone(), object));
    }

    match workload {
        Some(w) if w.kind == Kind::StatefulSet => {
            let missing: Vec<String> = (0..w.replicas)
                .filter(|i| !covered.contains_key(i))
                .map(|i| w.pod(i))
                .collect();
            if !missing.is_empty() {
                problems.push(format!(
                    "no backup line for replica {} of {}: a call the first line routes to a crashed replica's node then stores the Node ungated (docs/webhook.md#lines-of-admission-what-a-dead-replica-costs); regenerate the configuration with `nodegate-webhook webhook-config --replicas {}`",
                    missing.join(", "),
                    w.describe(),
                    w.replicas
                ));
            }
            for (i, names) in covered.iter().filter(|(_, n)| n.len() > 1) {
                problems.push(format!(
                    "{} all call replica {}: that replica down fails all of them open",
                    names.join(" and "),
                    w.pod(*i)
                ));
            }
        }
        Some(w) if backups.is_empty() => risks.push(format!(
            "{} (an install from before the per-replica lines): one line of admission, so a call the API server routes to a crashed replica's node stores the Node ungated; apply the current manifests for the StatefulSet and a backup line per replica (docs/webhook.md#lines-of-admission-what-a-dead-replica-costs)",
            w.describe()
        )),
        // A Deployment with backup lines: `selection` said what is wrong.
        Some(_) => {}
        None if backups.is_empty() => risks.push(
            "the configuration has the first line only: a call the API server routes to a crashed replica's node stores the Node ungated (docs/webhook.md#lines-of-admission-what-a-dead-replica-costs)"
                .into(),
        ),
        None => notes.push(
            "the webhook's workload is missing or unreadable: the lines were not matched with its replicas"
                .into(),
        ),
    }

    let tail = if notes.is_empty() {
        String::new()
    } else {
        format!(" (not verified: {})", notes.join("; "))
    };
    if !problems.is_empty() {
        report.add(
            CHECK,
            Status::Fail,
            format!("{}{tail}", problems.join("; ")),
        );
    } else if !risks.is_empty() {
        report.add(CHECK, Status::Warn, format!("{}{tail}", risks.join("; ")));
    } else {
        let first_svc = all[first]
            .service
            .as_ref()
            .map(|s| format!("{}/{}", s.namespace, s.name))
            .unwrap_or_else(|| "a url".into());
        report.add(
            CHECK,
            Status::Pass,
            format!(
                "first line {} → {first_svc}, then {}; failurePolicy Ignore and reinvocationPolicy Never on every line; each backup is called on a Node CREATE that lacks the taints and skipped once it carries them{tail}",
                hook.name,
                shown.join(", ")
            ),
        );
    }
    out
}

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

/// POSTs `review` to the line's Service through the API server's proxy:
/// HTTP status and body, or the transport error.
async fn call(
    proxy: &Client,
    svc: &ServiceRef,
    timeout: i32,
    review: &[u8],
) -> Result<(u16, Vec<u8>), String> {
    let url = format!(
        "/api/v1/namespaces/{}/services/https:{}:{}/proxy{}?timeout={timeout}s",
        svc.namespace, svc.name, svc.port, svc.path
    );
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

/// One `line <entry>` check per line: its replica, called directly through
/// the API server's service proxy (`proxy`, a client that does not retry a
/// 503) with a canary Node CREATE, must allow it with a patch adding every
/// taint of `want`.
pub async fn check_answers(
    proxy: &Client,
    hook: &Hook,
    want: Option<&Flags>,
    report: &mut Report,
) -> Vec<Answer> {
    let mut out = Vec::new();
    for l in lines(hook) {
        let check = format!("line {}", l.name);
        let Some(svc) = &l.service else {
            report.add(
                check,
                Status::Skip,
                "called by url: the API server's service proxy cannot reach it",
            );
            out.push(Answer::NotCalled);
            continue;
        };
        let Some(want) = want else {
            report.add(
                check,
                Status::Skip,
                "nothing to expect of it: nodegate-check's taint flags are invalid (see above)",
            );
            out.push(Answer::NotCalled);
            continue;
        };
        let uid = format!("nodegate-check-{:08x}", rand::random::<u32>());
        let node = registering_node(&uid);
        let body =
            review(&uid, &node).and_then(|r| serde_json::to_vec(&r).map_err(|e| e.to_string()));
        let body = match body {
            Ok(b) => b,
            Err(e) => {
                report.add(
                    check,
                    Status::Fail,
                    format!("cannot build the AdmissionReview: {e}"),
                );
                out.push(Answer::NotCalled);
                continue;
            }
        };
        let via = format!("{} through the API server's service proxy", svc.shown());
        let (status, bytes) = match call(proxy, svc, l.timeout_seconds, &body).await {
            Ok(r) => r,
            Err(e) => {
                report.add(check, Status::Fail, format!("POST to {via}: {e}"));
                out.push(Answer::Unreachable);
                continue;
            }
        };
        let message = || {
            serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).chars().take(200).collect())
        };
        if status == 403 {
            report.add(
                check,
                Status::Warn,
                format!(
                    "not called: nodegate-check may not create services/proxy in namespace {} ({}); grant it that to check each line's replica directly",
                    svc.namespace,
                    message()
                ),
            );
            out.push(Answer::NotCalled);
            continue;
        }
        if !(200..300).contains(&status) {
            report.add(
                check,
                Status::Fail,
                format!(
                    "POST to {via} answered HTTP {status}: {}: this line fails open (is its replica down or not Ready?)",
                    message()
                ),
            );
            out.push(Answer::Unreachable);
            continue;
        }
        let taints = match judge(&bytes, &uid, &node) {
            Ok(t) => t,
            Err(e) => {
                report.add(check, Status::Fail, format!("{via}: {e}"));
                out.push(Answer::Untainted);
                continue;
            }
        };
        let expected: Vec<&TaintSpec> = want.taints.iter().chain(&want.boot).collect();
        let missing: Vec<String> = expected
            .iter()
            .filter(|t| !t.is_in(&taints))
            .map(ToString::to_string)
            .collect();
        let names: Vec<String> = expected.iter().map(ToString::to_string).collect();
        if missing.is_empty() {
            report.add(
                check,
                Status::Pass,
                format!("{via} allowed a Node CREATE with a patch adding {names:?}"),
            );
            out.push(Answer::Tainted);
        } else {
            report.add(
                check,
                Status::Fail,
                format!(
                    "{via} allowed a Node CREATE WITHOUT {missing:?}: does that replica run with the --taint and --boot-taint flags checked here?"
                ),
            );
            out.push(Answer::Untainted);
        }
    }
    out
}

/// The backup lines' replicas on distinct nodes: one node failure then
/// takes at most one line. Skipped when no Pod is visible (not scheduled, or
/// an API server without kubelets).
pub async fn check_placement(client: &Client, backups: &Backups, report: &mut Report) {
    // (line, Pod, node)
    let mut placed: Vec<(String, String, String)> = Vec::new();
    for (line, svc) in &backups.services {
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        let selector = svc
            .spec
            .as_ref()
            .and_then(|s| s.selector.clone())
            .unwrap_or_default();
        if selector.is_empty() {
            // A Service without selector selects no Pod by label.
            continue;
        }
        let labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        match pods
            .list(&ListParams::default().labels(&labels.join(",")))
            .await
        {
            Ok(list) => placed.extend(list.items.into_iter().filter_map(|p| {
                let node = p.spec?.node_name?;
                Some((line.clone(), p.metadata.name.unwrap_or_default(), node))
            })),
            Err(e) => {
                report.add(
                    PLACEMENT,
                    Status::Skip,
                    format!("cannot list the Pods in {ns}: {e}"),
                );
                return;
            }
        }
    }
    if placed.is_empty() {
        report.add(
            PLACEMENT,
            Status::Skip,
            "no scheduled Pod behind the backup lines' Services: nothing to compare",
        );
        return;
    }
    let mut by_node: BTreeMap<&str, Vec<&(String, String, String)>> = BTreeMap::new();
    for p in &placed {
        by_node.entry(p.2.as_str()).or_default().push(p);
    }
    let shared: Vec<String> = by_node
        .iter()
        .filter_map(|(node, ps)| {
            let mut lines: Vec<&str> = ps.iter().map(|p| p.0.as_str()).collect();
            lines.dedup();
            (lines.len() > 1).then(|| {
                let pods: Vec<&str> = ps.iter().map(|p| p.1.as_str()).collect();
                format!(
                    "{} run on node {node} (Pods {})",
                    lines.join(" and "),
                    pods.join(", ")
                )
            })
        })
        .collect();
    if shared.is_empty() {
        let shown: Vec<String> = placed
            .iter()
            .map(|(l, p, n)| format!("{l} → {p} on {n}"))
            .collect();
        report.add(
            PLACEMENT,
            Status::Pass,
            format!(
                "each backup line's replica on a node of its own: {}",
                shown.join(", ")
            ),
        );
    } else {
        report.add(
            PLACEMENT,
            Status::Warn,
            format!(
                "{}: one node failure takes those lines at once; keep the StatefulSet's required pod anti-affinity on kubernetes.io/hostname",
                shared.join("; ")
            ),
        );
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_report_never_shows_the_path_token() {
        let svc = |path: &str| ServiceRef {
            namespace: "nodegate".into(),
            name: "nodegate-webhook".into(),
            port: 443,
            path: path.into(),
        };
        let token = "0f3a9d2c4e6b8a1f0c2d4e6f8a0b1c2d3e4f5a6b7c8d9e0f";
        let shown = svc(&format!("/mutate/{token}")).shown();
        assert_eq!(shown, "nodegate/nodegate-webhook:443/mutate/<token>");
        assert_eq!(
            svc("/mutate").shown(),
            "nodegate/nodegate-webhook:443/mutate"
        );
    }

    use super::*;

    fn sts(replicas: i32) -> WebhookWorkload {
        WebhookWorkload {
            kind: Kind::StatefulSet,
            namespace: "nodegate".into(),
            name: "nodegate-webhook".into(),
            replicas,
            available: replicas,
            available_condition: true,
            template_labels: BTreeMap::from([(
                "app.kubernetes.io/name".into(),
                "nodegate-webhook".into(),
            )]),
            containers: Vec::new(),
            leftover_deployment: false,
        }
    }

    fn svc(name: &str) -> ServiceRef {
        ServiceRef {
            namespace: "nodegate".into(),
            name: name.into(),
            port: 443,
            path: "/mutate".into(),
        }
    }

    fn selector(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_backup_service_selects_exactly_one_replica() {
        let w = sts(2);
        let app = ("app.kubernetes.io/name", "nodegate-webhook");
        let one = selector(&[app, (POD_NAME_LABEL, "nodegate-webhook-1")]);
        assert_eq!(selection(&one, &svc("x"), Some(&w)), Ok(Some(1)));
        assert_eq!(selection(&one, &svc("x"), None), Ok(None));
        let every = selection(&selector(&[app]), &svc("x"), Some(&w)).unwrap_err();
        assert!(every.contains("selects every replica"), "{every}");
        let beyond = selector(&[app, (POD_NAME_LABEL, "nodegate-webhook-2")]);
        let e = selection(&beyond, &svc("x"), Some(&w)).unwrap_err();
        assert!(
            e.contains("not one of the 2 replicas")
                && e.contains("nodegate-webhook-0, nodegate-webhook-1"),
            "{e}"
        );
        let padded = selector(&[app, (POD_NAME_LABEL, "nodegate-webhook-01")]);
        assert!(selection(&padded, &svc("x"), Some(&w)).is_err());
        let other_app = selector(&[("app", "x"), (POD_NAME_LABEL, "nodegate-webhook-0")]);
        let e = selection(&other_app, &svc("x"), Some(&w)).unwrap_err();
        assert!(e.contains("[\"app=x\"]"), "{e}");
        let mut deploy = sts(2);
        deploy.kind = Kind::Deployment;
        let e = selection(&one, &svc("x"), Some(&deploy)).unwrap_err();
        assert!(
            e.contains("runs as Deployment nodegate/nodegate-webhook"),
            "{e}"
        );
    }

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

    /// The generator's backup entries for `taints`.
    fn generated_backups(taints: &[&str]) -> Vec<MutatingWebhook> {
        let specs: Vec<TaintSpec> = taints.iter().map(|t| t.parse().unwrap()).collect();
        let yaml = nodegate_webhook::webhook_config::render(&specs, &[], 2);
        let cfg: k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration =
            serde_yaml::from_str(&yaml).unwrap();
        cfg.webhooks.unwrap().into_iter().skip(1).collect()
    }

    #[test]
    fn backup_conditions_call_an_ungated_create_and_skip_a_gated_one() {
        use nodegate_shared::keys::DEFAULT_TAINT;
        let backups = generated_backups(&[DEFAULT_TAINT]);
        assert_eq!(backups.len(), 2);
        let want = Flags::of(&[DEFAULT_TAINT], &[]);
        let (mut problems, mut risks) = (Vec::new(), Vec::new());
        for b in &backups {
            backup_conditions(b, Some(&want), &mut problems, &mut risks);
        }
        assert_eq!(
            (problems.len(), risks.len()),
            (0, 0),
            "{problems:?} {risks:?}"
        );

        // Conditions that wait for a taint the webhook does not add: the
        // backup lines fire on every write.
        let more = generated_backups(&[DEFAULT_TAINT, "example.com/x:NoSchedule"]);
        backup_conditions(&more[0], Some(&want), &mut problems, &mut risks);
        assert!(problems.is_empty(), "{problems:?}");
        assert!(
            risks[0].contains("replica-0.nodes.nodegate.dev is called even on a Node CREATE that carries every taint"),
            "{risks:?}"
        );

        // The first line's old mistake, in a backup line: an unguarded read
        // of an absent request field errors on every create.
        let mut unguarded = backups[1].clone();
        unguarded.match_conditions.as_mut().unwrap()[0].expression =
            "request.subResource != 'status'".into();
        let mut problems = Vec::new();
        backup_conditions(&unguarded, Some(&want), &mut problems, &mut risks);
        assert!(
            problems[0].contains("of replica-1.nodes.nodegate.dev on a Node CREATE")
                && problems[0].contains("never backs up the first one"),
            "{problems:?}"
        );
        // No rule for Node CREATE.
        let mut updates_only = backups[1].clone();
        updates_only.rules.as_mut().unwrap()[0].operations = Some(vec!["UPDATE".into()]);
        let mut problems = Vec::new();
        backup_conditions(&updates_only, Some(&want), &mut problems, &mut risks);
        assert!(
            problems[0].starts_with("no rule sends a Node CREATE to replica-1"),
            "{problems:?}"
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
}
