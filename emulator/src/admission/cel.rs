//! `matchConditions` in the emulator: the binding and verdict live in
//! `nodegate_shared::match_conditions` (one implementation, also used by
//! `nodegate-check`); this adapts the emulator's request attributes.
//!
//! Follows `k8s.io/apiserver/pkg/admission/plugin/cel/filter.go`
//! (`CreateAdmissionRequest`) and `plugin/webhook/matchconditions/matcher.go` (`Match`).

use serde_json::Value;

use nodegate_shared::match_conditions::{RequestAttributes, request_variable as bind};
pub use nodegate_shared::match_conditions::{Verdict, eval_condition, match_all};

use super::attributes::Attributes;

/// The `request` variable for an emulated request.
pub fn request_variable(a: &Attributes<'_>) -> Value {
    let groups: Vec<String> = crate::users::groups(a.user);
    bind(&RequestAttributes {
        group: a.res.group,
        version: a.res.version,
        kind: a.res.kind,
        resource: a.res.plural,
        subresource: a.subresource,
        name: a.name,
        namespace: a.namespace,
        operation: a.operation.as_str(),
        username: a.user,
        groups: &groups,
        extra: a.extra,
        dry_run: a.dry_run,
        options: a.options.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    static EXTRA_NONE: crate::users::Extra = crate::users::Extra::new();
    use crate::admission::attributes::Operation;
    use crate::resources;
    use serde_json::json;

    fn attrs(sub: &'static str, op: Operation, dry: bool) -> Attributes<'static> {
        Attributes {
            res: &resources::NODES,
            subresource: sub,
            operation: op,
            name: "n1",
            namespace: "",
            user: "system:node:n1",
            extra: &EXTRA_NONE,
            dry_run: dry,
            options: json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}),
        }
    }

    fn node(boot: &str) -> Value {
        json!({"metadata": {"name": "n"}, "status": {"nodeInfo": {"bootID": boot}}})
    }

    /// The expression shipped before the real-cluster fix.
    const OLD: &str = "request.subResource != 'status' || \
        (has(object.status) && has(object.status.nodeInfo) && has(object.status.nodeInfo.bootID) && \
         has(oldObject.status) && has(oldObject.status.nodeInfo) && has(oldObject.status.nodeInfo.bootID) && \
         object.status.nodeInfo.bootID != oldObject.status.nodeInfo.bootID)";
    const FIXED: &str = "!has(request.subResource) || request.subResource != 'status' || \
        (has(object.status) && has(object.status.nodeInfo) && has(object.status.nodeInfo.bootID) && \
         has(oldObject.status) && has(oldObject.status.nodeInfo) && has(oldObject.status.nodeInfo.bootID) && \
         object.status.nodeInfo.bootID != oldObject.status.nodeInfo.bootID)";

    #[test]
    fn request_omits_empty_omitempty_fields() {
        let r = request_variable(&attrs("", Operation::Create, false));
        let m = r.as_object().unwrap();
        for absent in ["subResource", "requestSubResource", "namespace"] {
            assert!(!m.contains_key(absent), "{absent} must be absent: {r}");
        }
        assert_eq!(r["uid"], "", "uid has no omitempty");
        assert_eq!(
            r["dryRun"], false,
            "dryRun is a set *bool: present when false"
        );
        assert_eq!(r["object"], Value::Null);
        assert_eq!(r["name"], "n1");
        assert_eq!(r["userInfo"]["username"], "system:node:n1");
        assert_eq!(
            r["kind"],
            json!({"group": "", "version": "v1", "kind": "Node"})
        );
        let s = request_variable(&attrs("status", Operation::Update, true));
        assert_eq!(s["subResource"], "status");
        assert_eq!(s["requestSubResource"], "status");
        assert_eq!(s["dryRun"], true);
    }

    #[test]
    fn absent_field_is_an_error_and_has_guards_it() {
        let req = request_variable(&attrs("", Operation::Create, false));
        let e = eval_condition(
            "request.subResource != 'status'",
            &node("a"),
            &Value::Null,
            &req,
        )
        .unwrap_err();
        assert!(e.contains("subResource"), "{e}");
        assert!(
            eval_condition("!has(request.subResource)", &node("a"), &Value::Null, &req).unwrap()
        );
        // CEL's || absorbs an error only when the other side is true.
        assert!(
            eval_condition(
                "request.subResource == 'x' || true",
                &node("a"),
                &Value::Null,
                &req
            )
            .unwrap()
        );
        assert!(
            eval_condition(
                "request.subResource == 'x' || false",
                &node("a"),
                &Value::Null,
                &req
            )
            .is_err()
        );
    }

    #[test]
    fn old_expression_errors_on_create_fixed_one_matches() {
        let create = request_variable(&attrs("", Operation::Create, false));
        assert!(eval_condition(OLD, &node("a"), &Value::Null, &create).is_err());
        assert!(eval_condition(FIXED, &node("a"), &Value::Null, &create).unwrap());
        let main = request_variable(&attrs("", Operation::Update, false));
        assert!(eval_condition(OLD, &node("a"), &node("a"), &main).is_err());
        assert!(eval_condition(FIXED, &node("a"), &node("a"), &main).unwrap());
        let status = request_variable(&attrs("status", Operation::Update, false));
        assert!(!eval_condition(FIXED, &node("a"), &node("a"), &status).unwrap());
        assert!(eval_condition(FIXED, &node("b"), &node("a"), &status).unwrap());
        assert!(!eval_condition(FIXED, &json!({"metadata": {}}), &node("a"), &status).unwrap());
    }

    #[test]
    fn any_false_wins_over_errors_and_errors_are_counted() {
        let req = request_variable(&attrs("", Operation::Create, false));
        let obj = node("a");
        let (v, n) = match_all(
            [("err", "request.subResource == 'x'"), ("no", "false")],
            &obj,
            &Value::Null,
            &req,
        );
        assert_eq!(v, Verdict::Excluded("no".into()));
        assert_eq!(n, 1);
        let (v, n) = match_all(
            [("yes", "true"), ("err", "request.subResource == 'x'")],
            &obj,
            &Value::Null,
            &req,
        );
        assert!(matches!(&v, Verdict::Errors(e) if e.len() == 1 && e[0].starts_with("err: ")));
        assert_eq!(n, 1);
        assert_eq!(
            match_all([("yes", "true")], &obj, &Value::Null, &req),
            (Verdict::Call, 0)
        );
    }

    #[test]
    fn errors_are_reported_not_panicked() {
        let r = json!({});
        assert!(eval_condition("object.nope.deeper == 1", &json!({}), &Value::Null, &r).is_err());
        assert!(eval_condition("'str'", &json!({}), &Value::Null, &r).is_err());
        assert!(eval_condition("((", &json!({}), &Value::Null, &r).is_err());
        assert!(eval_condition("has(oldObject.status)", &json!({}), &Value::Null, &r).is_err());
    }
}
