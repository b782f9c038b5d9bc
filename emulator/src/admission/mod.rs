//! The admission chain in kube-apiserver's order: built-in mutation
//! (defaulting, TaintNodesByCondition), mutating webhooks (with reinvocation),
//! then NodeRestriction. Storage happens after, in the API handlers.
//!
//! Follows `k8s.io/apiserver/pkg/admission/chain.go` (`chainAdmissionHandler`),
//! `k8s.io/apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go`
//! (`Dispatch`, reinvocation via `reinvocationcontext.go`) and
//! `plugin/pkg/admission/noderestriction/admission.go` (`admitNode`).
//! Below it: `attributes`, `metrics`, `nodetaint`, `noderestriction`, the
//! webhook client (`webhook`), CEL (`cel`, `cel_compile`), the policies
//! (`policy`, `validating_policy`) and object validation (`validation`).

pub mod attributes;
pub mod cel;
pub mod cel_compile;
pub mod metrics;
pub mod noderestriction;
pub mod nodetaint;
pub mod policy;
pub mod validating_policy;
pub mod validation;
pub mod webhook;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use serde_json::{Value, json};

use crate::resources;
use crate::status::ApiError;
use crate::store::Store;
use crate::users;

pub use attributes::{Attributes, Operation};
pub use metrics::{
    AdmissionMetrics, MATCH_CONDITION_ERRORS, MATCH_CONDITION_EXCLUSIONS, WEBHOOK_FAIL_OPEN,
};
use noderestriction::forbidden_label_changes;
pub use nodetaint::NOT_READY_TAINT_KEY;
use nodetaint::taint_nodes_by_condition;

/// The object after admission and the warnings for the client.
#[derive(Debug)]
pub struct Admitted {
    pub object: Value,
    pub warnings: Vec<String>,
}

/// One webhook call, for latency statistics.
#[derive(Debug, Clone)]
pub struct CallRecord {
    pub webhook: String,
    pub duration: Duration,
    pub ok: bool,
}

/// Admission state shared by all requests.
#[derive(Debug)]
pub struct Admission {
    store: Arc<Store>,
    endpoints: RwLock<HashMap<String, SocketAddr>>,
    calls: Mutex<Vec<CallRecord>>,
    /// Failures that failurePolicy Ignore swallowed (for tests to assert on).
    ignored: Mutex<Vec<String>>,
    metrics: AdmissionMetrics,
    pool: webhook::Pool,
}

fn taints_of(obj: &Value) -> Value {
    match obj.pointer("/spec/taints") {
        Some(Value::Array(a)) if !a.is_empty() => Value::Array(a.clone()),
        _ => json!([]),
    }
}

impl Admission {
    pub fn new(store: Arc<Store>, endpoints: HashMap<String, SocketAddr>) -> Self {
        Self {
            store,
            endpoints: RwLock::new(endpoints),
            calls: Mutex::new(Vec::new()),
            ignored: Mutex::new(Vec::new()),
            metrics: AdmissionMetrics::default(),
            pool: webhook::Pool::default(),
        }
    }

    pub fn set_endpoint(&self, service: &str, addr: SocketAddr) {
        self.endpoints
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(service.to_string(), addr);
    }

    pub fn remove_endpoint(&self, service: &str) {
        self.endpoints
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(service);
    }

    /// Every webhook call so far (and clears the record when `drain`).
    pub fn calls(&self, drain: bool) -> Vec<CallRecord> {
        let mut g = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        if drain {
            std::mem::take(&mut *g)
        } else {
            g.clone()
        }
    }

    /// Webhook failures swallowed by `failurePolicy: Ignore` so far.
    pub fn ignored_failures(&self) -> Vec<String> {
        self.ignored
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The admission counters (match-condition errors, exclusions, fail-open).
    pub fn metrics(&self) -> &AdmissionMetrics {
        &self.metrics
    }

    fn builtin_mutation(&self, a: &Attributes<'_>, obj: &mut Value) {
        if a.operation != Operation::Create || !a.subresource.is_empty() {
            return;
        }
        if a.res.key() == resources::NODES.key() {
            taint_nodes_by_condition(obj);
        }
        if a.res.key() == resources::PODS.key() {
            if obj.pointer("/status/phase").is_none() {
                if !obj.get("status").is_some_and(Value::is_object) {
                    obj["status"] = json!({});
                }
                obj["status"]["phase"] = json!("Pending");
            }
            if obj.pointer("/spec/schedulerName").is_none()
                && obj.get("spec").is_some_and(Value::is_object)
            {
                obj["spec"]["schedulerName"] = json!("default-scheduler");
            }
        }
    }

    /// NodeRestriction for Node writes by a kubelet.
    fn node_restriction(
        &self,
        a: &Attributes<'_>,
        obj: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let Some(me) = users::node_name_of(a.user) else {
            return Ok(());
        };
        if a.res.key() != resources::NODES.key() {
            return Ok(());
        }
        let forbidden = |why: String| ApiError::forbidden(a.res.plural, a.res.group, a.name, &why);
        if a.name != me {
            return Err(forbidden(format!(
                "node \"{me}\" is not allowed to modify node \"{}\"",
                a.name
            )));
        }
        let empty = Value::Null;
        let forbidden_labels = forbidden_label_changes(obj, old.unwrap_or(&empty));
        if !forbidden_labels.is_empty() {
            let verb = if a.operation == Operation::Create {
                "set the following labels"
            } else {
                "modify labels"
            };
            return Err(forbidden(format!(
                "node \"{me}\" is not allowed to {verb}: {}",
                forbidden_labels.join(", ")
            )));
        }
        if a.operation == Operation::Update
            && let Some(old) = old
            && taints_of(obj) != taints_of(old)
        {
            return Err(forbidden(format!(
                "node \"{me}\" is not allowed to modify taints"
            )));
        }
        Ok(())
    }

    fn webhooks(&self) -> Vec<MutatingWebhook> {
        let (configs, _) = self.store.list(&resources::MUTATING_WEBHOOKS, None);
        // The API server orders configurations by name.
        let mut hooks = Vec::new();
        for c in configs {
            match serde_json::from_value::<MutatingWebhookConfiguration>((*c).clone()) {
                Ok(cfg) => hooks.extend(cfg.webhooks.unwrap_or_default()),
                Err(e) => {
                    tracing::warn!(error = %e, "ignoring unreadable MutatingWebhookConfiguration")
                }
            }
        }
        hooks
    }

    fn target(&self, hook: &MutatingWebhook) -> Result<webhook::Target, String> {
        let cc = &hook.client_config;
        if let Some(svc) = &cc.service {
            let server_name = format!("{}.{}.svc", svc.name, svc.namespace);
            let addr = self
                .endpoints
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(&server_name)
                .copied()
                .ok_or_else(|| {
                    format!(
                        "failed to call webhook: service \"{}/{}\" has no endpoints",
                        svc.namespace, svc.name
                    )
                })?;
            return Ok(webhook::Target {
                addr,
                server_name,
                port: u16::try_from(svc.port.unwrap_or(443)).unwrap_or(443),
                path: svc.path.clone().unwrap_or_else(|| "/".into()),
            });
        }
        let url = cc
            .url
            .as_deref()
            .ok_or("webhook has neither service nor url")?;
        let rest = url
            .strip_prefix("https://")
            .ok_or("webhook url must be https")?;
        let (hostport, path) = rest
            .split_once('/')
            .map(|(h, p)| (h, format!("/{p}")))
            .unwrap_or((rest, "/".into()));
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) => (
                h.to_string(),
                p.parse::<u16>()
                    .map_err(|e| format!("webhook url port: {e}"))?,
            ),
            None => (hostport.to_string(), 443),
        };
        let addr = format!("{host}:{port}")
            .parse::<SocketAddr>()
            .map_err(|_| {
                format!("webhook url host {host} must be an IP address in the emulator")
            })?;
        Ok(webhook::Target {
            addr,
            server_name: host,
            port,
            path,
        })
    }

    fn review(&self, a: &Attributes<'_>, uid: &str, obj: &Value, old: &Value) -> Value {
        let gvr = json!({"group": a.res.group, "version": a.res.version, "resource": a.res.plural});
        let gvk = json!({"group": a.res.group, "version": a.res.version, "kind": a.res.kind});
        let mut req = json!({
            "uid": uid,
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": a.name,
            "operation": a.operation.as_str(),
            "userInfo": users::user_info(a.user),
            "object": obj,
            "oldObject": old,
            "dryRun": a.dry_run,
            "options": a.options,
        });
        if !a.subresource.is_empty() {
            req["subResource"] = json!(a.subresource);
            req["requestSubResource"] = json!(a.subresource);
        }
        if !a.namespace.is_empty() {
            req["namespace"] = json!(a.namespace);
        }
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})
    }

    /// Runs one webhook if it matches: `None` when it was not called,
    /// `Some(changed)` when it was.
    async fn run_webhook(
        &self,
        hook: &MutatingWebhook,
        a: &Attributes<'_>,
        obj: &mut Value,
        old: &Value,
        warnings: &mut Vec<String>,
    ) -> Result<Option<bool>, ApiError> {
        let ignore = webhook::failure_policy_ignore(hook);
        let op = a.operation.as_str();
        let fail = |msg: String| -> Result<Option<bool>, ApiError> {
            if ignore {
                tracing::warn!(webhook = %hook.name, error = %msg, "webhook failed, failurePolicy Ignore");
                self.metrics.add(WEBHOOK_FAIL_OPEN, &hook.name, op, 1);
                self.ignored
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("{}: {msg}", hook.name));
                Ok(None)
            } else {
                Err(ApiError::internal(format!(
                    "failed calling webhook \"{}\": {msg}",
                    hook.name
                )))
            }
        };
        match webhook::matches(hook, a, obj, old) {
            Ok(true) => {}
            Ok(false) => return Ok(None),
            Err(e) => return fail(e),
        }
        // generic/webhook.go ShouldCallHook: match conditions after the
        // selectors, with the request bound as CreateAdmissionRequest builds it.
        let conditions = hook.match_conditions.as_deref().unwrap_or_default();
        if !conditions.is_empty() {
            let request = cel::request_variable(a);
            let (verdict, errors) = cel::match_all(
                conditions
                    .iter()
                    .map(|c| (c.name.as_str(), c.expression.as_str())),
                obj,
                old,
                &request,
            );
            self.metrics
                .add(MATCH_CONDITION_ERRORS, &hook.name, op, errors as u64);
            match verdict {
                cel::Verdict::Call => {}
                cel::Verdict::Excluded(_) => {
                    self.metrics
                        .add(MATCH_CONDITION_EXCLUSIONS, &hook.name, op, 1);
                    return Ok(None);
                }
                cel::Verdict::Errors(errs) if ignore => {
                    // matcher.go: Ignore turns errors into "does not match",
                    // silently (counted, logged, no fail-open count).
                    tracing::warn!(webhook = %hook.name, errors = ?errs, "match conditions failed to evaluate, failurePolicy Ignore: webhook skipped");
                    self.metrics
                        .add(MATCH_CONDITION_EXCLUSIONS, &hook.name, op, 1);
                    self.ignored
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(format!(
                            "{}: match conditions: {}",
                            hook.name,
                            errs.join("; ")
                        ));
                    return Ok(None);
                }
                cel::Verdict::Errors(errs) => {
                    return Err(ApiError::forbidden(
                        a.res.plural,
                        a.res.group,
                        a.name,
                        &errs.join(", "),
                    ));
                }
            }
        }
        let uid = uuid_like();
        let review = self.review(a, &uid, obj, old);
        if a.dry_run && !matches!(hook.side_effects.as_str(), "None" | "NoneOnDryRun") {
            return Err(ApiError::bad_request(format!(
                "admission webhook \"{}\" does not support dry run",
                hook.name
            )));
        }
        let target = match self.target(hook) {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        let start = Instant::now();
        let verdict = webhook::call(&self.pool, hook, &target, &review, &uid).await;
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(CallRecord {
                webhook: hook.name.clone(),
                duration: start.elapsed(),
                ok: verdict.is_ok(),
            });
        let verdict = match verdict {
            Ok(v) => v,
            Err(e) => return fail(e),
        };
        warnings.extend(verdict.warnings);
        if !verdict.allowed {
            let result = verdict.result.unwrap_or_default();
            let code = result
                .get("code")
                .and_then(Value::as_u64)
                .filter(|c| *c >= 400)
                .unwrap_or(400);
            let msg = result
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let mut e = ApiError::new(
                u16::try_from(code).unwrap_or(400),
                "BadRequest",
                format!(
                    "admission webhook \"{}\" denied the request: {msg}",
                    hook.name
                ),
            );
            if code == 403 {
                e.reason = "Forbidden";
            }
            return Err(e);
        }
        let Some(patch) = verdict.patch else {
            return Ok(Some(false));
        };
        let before = obj.clone();
        // A patch that does not apply fails the request whatever the policy.
        json_patch::patch(obj, &patch).map_err(ApiError::internal)?;
        Ok(Some(*obj != before))
    }

    /// One policy invocation with its failurePolicy applied: `None` when it
    /// did not apply, `Some(changed)` when it was invoked
    /// (`policy_dispatcher.go` `Dispatch`).
    fn run_policy(
        &self,
        inv: &policy::Invocation,
        a: &Attributes<'_>,
        obj: &mut Value,
        old: &Value,
    ) -> Result<Option<bool>, ApiError> {
        let (outcome, errors) = policy::run(inv, a, obj, old);
        if let Some(first) = errors.first() {
            if !inv.ignore_failures() {
                // Forbidden, with the reason of the (configuration) error.
                let mut e = ApiError::new(403, "Invalid", inv.denial(first));
                e.reason = "Invalid";
                return Err(e);
            }
            // Ignore drops policy errors without a metric upstream; the
            // emulator keeps them for tests to assert on.
            tracing::warn!(policy = %inv.policy, binding = %inv.binding, errors = ?errors, "policy failed, failurePolicy Ignore");
            self.ignored
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(errors.iter().map(|e| format!("policy {}: {e}", inv.policy)));
        }
        Ok(match outcome {
            policy::Outcome::Skipped => None,
            policy::Outcome::Unchanged => Some(false),
            policy::Outcome::Mutated => Some(true),
        })
    }

    /// Runs the chain; the returned object is what storage sees. Mutating
    /// admission policies run before mutating webhooks
    /// (`AllOrderedPlugins`); if either changed the object, the chain runs
    /// once more (`pkg/admission/reinvocation.go`) and each plugin reinvokes
    /// its `IfNeeded` policies/webhooks that were invoked and either saw a
    /// later one of their kind change the object, or find the object changed
    /// since their plugin last ran (`reinvocationcontext.go` of both).
    pub async fn admit(
        &self,
        a: &Attributes<'_>,
        mut obj: Value,
        old: Option<&Value>,
    ) -> Result<Admitted, ApiError> {
        let old_v = old.cloned().unwrap_or(Value::Null);
        let mut warnings = Vec::new();
        self.builtin_mutation(a, &mut obj);
        let policies = policy::invocations(&self.store);
        let hooks = self.webhooks();
        let mut reinvoke = false;

        let mut policy_marks = Reinvocation::new(policies.len());
        for (i, inv) in policies.iter().enumerate() {
            if let Some(changed) = self.run_policy(inv, a, &mut obj, &old_v)? {
                if changed {
                    policy_marks.require_previous();
                    reinvoke = true;
                }
                policy_marks.invoked(i, inv.reinvoke_if_needed());
            }
        }
        let after_policies = obj.clone();

        let mut hook_marks = Reinvocation::new(hooks.len());
        for (i, hook) in hooks.iter().enumerate() {
            if let Some(changed) = self
                .run_webhook(hook, a, &mut obj, &old_v, &mut warnings)
                .await?
            {
                if changed {
                    hook_marks.require_previous();
                    reinvoke = true;
                }
                hook_marks.invoked(i, hook.reinvocation_policy.as_deref() == Some("IfNeeded"));
            }
        }
        let after_hooks = obj.clone();

        if reinvoke {
            self.builtin_mutation(a, &mut obj);
            if obj != after_policies {
                policy_marks.require_previous();
            }
            for (i, inv) in policies.iter().enumerate() {
                if policy_marks.required(i) {
                    self.run_policy(inv, a, &mut obj, &old_v)?;
                }
            }
            if obj != after_hooks {
                hook_marks.require_previous();
            }
            for (i, hook) in hooks.iter().enumerate() {
                if hook_marks.required(i) {
                    self.run_webhook(hook, a, &mut obj, &old_v, &mut warnings)
                        .await?;
                }
            }
        }
        self.node_restriction(a, &obj, old)?;
        Ok(Admitted {
            object: obj,
            warnings,
        })
    }

    /// Validating admission (ValidatingAdmissionPolicies) on the object as
    /// it would be stored: after mutation and the type's validation.
    pub fn validate(
        &self,
        a: &Attributes<'_>,
        obj: &Value,
        old: Option<&Value>,
    ) -> Result<Vec<String>, ApiError> {
        let old = old.cloned().unwrap_or(Value::Null);
        let d = validating_policy::admit(&self.store, a, obj, &old)?;
        if !d.ignored.is_empty()
            && let Ok(mut ignored) = self.ignored.lock()
        {
            ignored.extend(d.ignored);
        }
        Ok(d.warnings)
    }
}

/// Which `IfNeeded` policies (or webhooks) were invoked, and which must run
/// again in the reinvocation pass.
#[derive(Debug)]
struct Reinvocation {
    invoked: Vec<bool>,
    required: Vec<bool>,
}

impl Reinvocation {
    fn new(n: usize) -> Self {
        Self {
            invoked: vec![false; n],
            required: vec![false; n],
        }
    }

    /// An `IfNeeded` one was invoked (recorded after its own mutation check).
    fn invoked(&mut self, i: usize, if_needed: bool) {
        self.invoked[i] |= if_needed;
    }

    /// `RequireReinvokingPreviouslyInvoked…`: every one invoked so far.
    fn require_previous(&mut self) {
        for (r, i) in self.required.iter_mut().zip(&self.invoked) {
            *r |= *i;
        }
    }

    fn required(&self, i: usize) -> bool {
        self.required[i]
    }
}

fn uuid_like() -> String {
    uuid::Uuid::new_v4().to_string()
}
