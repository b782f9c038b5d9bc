//! The admission chain in kube-apiserver's order: built-in mutation
//! (defaulting, TaintNodesByCondition), mutating webhooks (with reinvocation),
//! then NodeRestriction. Storage happens after, in the API handlers.
//!
//! Follows `k8s.io/apiserver/pkg/admission/chain.go` (`chainAdmissionHandler`),
//! `k8s.io/apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go`
//! (`Dispatch`, reinvocation via `reinvocationcontext.go`), the webhook order of
//! `configuration/mutating_webhook_manager.go` (`getMutatingWebhookConfigurations`) and
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
    WEBHOOK_REQUESTS,
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

    /// Where a service name (`"<svc>.<ns>.svc"`) points, if anywhere (the
    /// service proxy resolves Services through the same map).
    pub fn endpoint(&self, service: &str) -> Option<SocketAddr> {
        self.endpoints
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(service)
            .copied()
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
        // admitNode's order and messages: on update, taints before labels.
        if a.operation == Operation::Update
            && let Some(old) = old
            && taints_of(obj) != taints_of(old)
        {
            return Err(forbidden(format!(
                "node \"{me}\" is not allowed to modify taints"
            )));
        }
        // Labels are judged on create (every label) and update only.
        let before = match (a.operation, old) {
            (Operation::Create, _) => &Value::Null,
            (Operation::Update, Some(old)) => old,
            _ => return Ok(()),
        };
        let forbidden_labels = forbidden_label_changes(obj, before);
        if !forbidden_labels.is_empty() {
            let labels = forbidden_labels.join(", ");
            return Err(forbidden(if a.operation == Operation::Create {
                format!("node \"{me}\" is not allowed to set the following labels: {labels}")
            } else {
                format!("is not allowed to modify labels: {labels}")
            }));
        }
        Ok(())
    }

    fn webhooks(&self) -> Vec<MutatingWebhook> {
        let (configs, _) = self.store.list(&resources::MUTATING_WEBHOOKS, None);
        let configs = configs
            .iter()
            .filter_map(|c| {
                serde_json::from_value::<MutatingWebhookConfiguration>((**c).clone())
                    .inspect_err(|e| {
                        tracing::warn!(error = %e, "ignoring unreadable MutatingWebhookConfiguration")
                    })
                    .ok()
            })
            .collect();
        ordered_webhooks(configs)
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
            "userInfo": users::user_info(a.user, a.extra),
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

    /// `generic/webhook.go` `ShouldCallHook`: rules, objectSelector, then
    /// matchConditions, all on the current object (earlier webhooks' patches
    /// included). `false` skips the webhook; it then does not count as invoked.
    fn should_call(
        &self,
        hook: &MutatingWebhook,
        a: &Attributes<'_>,
        obj: &Value,
        old: &Value,
    ) -> Result<bool, ApiError> {
        let ignore = webhook::failure_policy_ignore(hook);
        let op = a.operation.as_str();
        // predicates/object/matcher.go MatchObjectSelector: an unusable
        // selector is an InternalError whatever the failurePolicy.
        if !webhook::matches(hook, a, obj, old).map_err(ApiError::internal)? {
            return Ok(false);
        }
        let conditions = hook.match_conditions.as_deref().unwrap_or_default();
        if conditions.is_empty() {
            return Ok(true);
        }
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
            cel::Verdict::Call => Ok(true),
            cel::Verdict::Excluded(_) => {
                self.metrics
                    .add(MATCH_CONDITION_EXCLUSIONS, &hook.name, op, 1);
                Ok(false)
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
                Ok(false)
            }
            cel::Verdict::Errors(errs) => Err(ApiError::forbidden(
                a.res.plural,
                a.res.group,
                a.name,
                &errs.join(", "),
            )),
        }
    }

    /// Calls a webhook `should_call` selected (`callAttrMutatingHook` plus
    /// the failurePolicy handling of `Dispatch`) and returns whether its patch
    /// changed the object. A call failure that failurePolicy Ignore swallows
    /// is `Ok(false)`: upstream it still counts as invoked.
    async fn call_webhook(
        &self,
        hook: &MutatingWebhook,
        a: &Attributes<'_>,
        obj: &mut Value,
        old: &Value,
        warnings: &mut Vec<String>,
    ) -> Result<bool, ApiError> {
        let fail = |msg: String| -> Result<bool, ApiError> {
            if webhook::failure_policy_ignore(hook) {
                tracing::warn!(webhook = %hook.name, error = %msg, "webhook failed, failurePolicy Ignore");
                self.metrics
                    .add(WEBHOOK_FAIL_OPEN, &hook.name, a.operation.as_str(), 1);
                self.ignored
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("{}: {msg}", hook.name));
                Ok(false)
            } else {
                Err(ApiError::internal(format!(
                    "failed calling webhook \"{}\": {msg}",
                    hook.name
                )))
            }
        };
        if a.dry_run && !matches!(hook.side_effects.as_str(), "None" | "NoneOnDryRun") {
            return Err(ApiError::bad_request(format!(
                "admission webhook \"{}\" does not support dry run",
                hook.name
            )));
        }
        let uid = uuid_like();
        let review = self.review(a, &uid, obj, old);
        // Counted whatever the outcome, as `Dispatch` observes an unresolvable
        // service or a failed call like an answer.
        self.metrics
            .add(WEBHOOK_REQUESTS, &hook.name, a.operation.as_str(), 1);
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
            return Ok(false);
        };
        let before = obj.clone();
        // A patch that does not apply fails the request whatever the policy.
        json_patch::patch(obj, &patch).map_err(ApiError::internal)?;
        Ok(*obj != before)
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
    /// Webhooks run in `ordered_webhooks` order; each round decides whom to
    /// call on the current object (`should_call`); a webhook counts as
    /// invoked once called, even if the call failed open under Ignore.
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
            if !self.should_call(hook, a, &obj, &old_v)? {
                continue;
            }
            // dispatcher.go Dispatch: marked after the call whatever its
            // outcome, so a call that failed open is reinvoked too.
            let changed = self
                .call_webhook(hook, a, &mut obj, &old_v, &mut warnings)
                .await?;
            if changed {
                hook_marks.require_previous();
                reinvoke = true;
            }
            hook_marks.invoked(i, hook.reinvocation_policy.as_deref() == Some("IfNeeded"));
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
                // dispatcher.go Dispatch: ShouldCallHook runs for every
                // webhook (its errors and exclusion counts included) before
                // the reinvocation check, so a webhook not invoked in the
                // first round is never called for the first time here.
                if !self.should_call(hook, a, &obj, &old_v)? || !hook_marks.required(i) {
                    continue;
                }
                self.call_webhook(hook, a, &mut obj, &old_v, &mut warnings)
                    .await?;
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

/// `configuration/mutating_webhook_manager.go`
/// `getMutatingWebhookConfigurations`: configurations sorted by name (a
/// stable sort), each one's webhooks in list order.
fn ordered_webhooks(mut configs: Vec<MutatingWebhookConfiguration>) -> Vec<MutatingWebhook> {
    configs.sort_by(|x, y| x.metadata.name.cmp(&y.metadata.name));
    configs
        .into_iter()
        .flat_map(|c| c.webhooks.unwrap_or_default())
        .collect()
}

fn uuid_like() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(name: &str, hooks: &[&str]) -> MutatingWebhookConfiguration {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "webhooks": hooks.iter().map(|h| json!({
                "name": h, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "clientConfig": {"url": "https://127.0.0.1:1/"},
            })).collect::<Vec<_>>(),
        }))
        .expect("a valid configuration")
    }

    /// Configurations by name whatever order the store lists them in;
    /// entries keep their list order (not sorted by webhook name).
    #[test]
    fn webhooks_are_ordered_by_configuration_name_then_entry() {
        let hooks = ordered_webhooks(vec![
            config("z-late", &["a.z"]),
            config("a-early", &["y.a", "x.a"]),
            config("m-middle", &["m"]),
        ]);
        let names: Vec<_> = hooks.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["y.a", "x.a", "m", "a.z"]);
    }
}
