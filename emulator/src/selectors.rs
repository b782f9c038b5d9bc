//! Label and field selectors, in the string form of list/watch queries and the
//! structured `LabelSelector` form of webhook `objectSelector`s.
//!
//! Follows `k8s.io/apimachinery/pkg/labels/selector.go` (`Parse`),
//! `k8s.io/apimachinery/pkg/fields/selector.go` (`ParseSelector`) and
//! `k8s.io/apimachinery/pkg/apis/meta/v1/helpers.go` (`LabelSelectorAsSelector`).

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use crate::resources::ResourceDef;
use crate::status::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Req>);

fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn set_values(rest: &str, full: &str) -> Result<Vec<String>, ApiError> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| ApiError::bad_request(format!("unable to parse requirement: {full}")))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

/// The `labelSelector` and `fieldSelector` of a list or watch query (absent
/// ones select everything).
pub fn of_query(
    q: &HashMap<String, String>,
    res: &ResourceDef,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let get = |k: &str| q.get(k).map(String::as_str).unwrap_or("");
    Ok((
        LabelSelector::parse(get("labelSelector"))?,
        FieldSelector::parse(get("fieldSelector"), res)?,
    ))
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top_level(s) {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let req = if let Some(k) = p.strip_prefix('!') {
                Req::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = p.split_once("!=") {
                Req::NotEq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = p.split_once("==") {
                Req::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = p.split_once('=') {
                Req::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, rest)) = p.split_once(" notin ") {
                Req::NotIn(k.trim().to_string(), set_values(rest, p)?)
            } else if let Some((k, rest)) = p.split_once(" in ") {
                Req::In(k.trim().to_string(), set_values(rest, p)?)
            } else if p.contains([' ', '(', ')']) {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement: {p}"
                )));
            } else {
                Req::Exists(p.to_string())
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// From a `metav1.LabelSelector` object (matchLabels + matchExpressions).
    pub fn from_object(v: &Value) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if let Some(m) = v.get("matchLabels").and_then(Value::as_object) {
            for (k, val) in m {
                reqs.push(Req::Eq(
                    k.clone(),
                    val.as_str().unwrap_or_default().to_string(),
                ));
            }
        }
        for e in v
            .get("matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = e
                .get("key")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let values: Vec<String> = e
                .get("values")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            let req = match e.get("operator").and_then(Value::as_str) {
                Some("In") => Req::In(key, values),
                Some("NotIn") => Req::NotIn(key, values),
                Some("Exists") => Req::Exists(key),
                Some("DoesNotExist") => Req::NotExists(key),
                other => return Err(format!("invalid label selector operator {other:?}")),
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => labels.get(k) == Some(v),
            Req::NotEq(k, v) => labels.get(k) != Some(v),
            Req::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Req::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Req::Exists(k) => labels.contains_key(k),
            Req::NotExists(k) => !labels.contains_key(k),
        })
    }

    pub fn matches_object(&self, obj: &Value) -> bool {
        self.matches(&labels_of(obj))
    }
}

/// The labels of an object (empty when absent).
pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// A parsed field selector, checked against the fields the type supports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(s: &str, res: &ResourceDef) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, eq, value) = if let Some((k, v)) = p.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = p.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = p.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{p}'"
                )));
            };
            let field = field.trim();
            let supported = field == "metadata.name"
                || (field == "metadata.namespace" && res.namespaced)
                || res.field_selectors.contains(&field);
            if !supported {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            reqs.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, eq, value)| {
            let path = format!("/{}", field.replace('.', "/"));
            let actual = match obj.pointer(&path) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                // Unset fields compare as empty, as the server's field sets do
                // (an unset `spec.unschedulable` reads "false").
                _ if field == "spec.unschedulable" => "false".to_string(),
                _ => String::new(),
            };
            (actual == *value) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selector_forms() {
        let l = labels(&[("a", "1"), ("b", "2")]);
        for (sel, want) in [
            ("", true),
            ("a=1", true),
            ("a==1,b=2", true),
            ("a!=1", false),
            ("c!=1", true),
            ("a", true),
            ("!a", false),
            ("!c", true),
            ("a in (1,3)", true),
            ("a notin (1,3)", false),
            ("c notin (1)", true),
            ("b in (3)", false),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&l),
                want,
                "{sel}"
            );
        }
        assert!(LabelSelector::parse("a in 1").is_err());
        assert!(LabelSelector::parse("a b").is_err());
    }

    #[test]
    fn object_selector() {
        let s = LabelSelector::from_object(&json!({"matchExpressions": [
            {"key": "node-restriction.kubernetes.io/nodegate-exclude", "operator": "NotIn", "values": ["true"]}
        ]}))
        .unwrap();
        assert!(s.matches(&labels(&[])));
        assert!(!s.matches(&labels(&[(
            "node-restriction.kubernetes.io/nodegate-exclude",
            "true"
        )])));
        assert!(
            LabelSelector::from_object(
                &json!({"matchExpressions": [{"key": "a", "operator": "Nope"}]})
            )
            .is_err()
        );
    }

    #[test]
    fn field_selectors_are_checked_per_type() {
        let pod = json!({"metadata": {"name": "p", "namespace": "d"}, "spec": {"nodeName": "n1"}});
        let s = FieldSelector::parse("spec.nodeName=n1", &crate::resources::PODS).unwrap();
        assert!(s.matches(&pod));
        let s = FieldSelector::parse("spec.nodeName!=n1", &crate::resources::PODS).unwrap();
        assert!(!s.matches(&pod));
        let err = FieldSelector::parse("spec.nodeName=n1", &crate::resources::NODES).unwrap_err();
        assert_eq!(err.code, 400);
        assert!(FieldSelector::parse("metadata.name=x", &crate::resources::NODES).is_ok());
    }
}
