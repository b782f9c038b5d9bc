//! Each type's `strategy.Validate`, run after mutating admission on every
//! write, and on objects a test stores directly.
//!
//! Follows `pkg/apis/core/validation/validation.go` (`ValidateObjectMeta`,
//! `ValidateConfigMap`) and the structural and CEL rules of
//! `crate::admission::validation` for the registered types.

use serde_json::Value;

use super::scope::Result;
use crate::resources::{self, ResourceDef};
use crate::status::ApiError;

pub(crate) fn name_of(obj: &Value) -> String {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The type's validation (`strategy.Validate`), run after mutating admission
/// on every write, and on objects a test stores directly.
pub fn validate(res: &ResourceDef, obj: &Value) -> Result<()> {
    let name = name_of(obj);
    if name.is_empty() {
        return Err(ApiError::invalid(
            res.kind,
            "",
            "metadata.name: Required value: name or generateName is required",
        ));
    }
    if res.key() == resources::CONFIGMAPS.key() {
        validate_config_map(obj, &name)?;
    }
    let errors = crate::admission::validation::validate(res.kind, obj);
    if !errors.is_empty() {
        let errors: Vec<(String, String)> =
            errors.into_iter().map(|e| (e.field, e.detail)).collect();
        return Err(ApiError::invalid_fields(
            res.kind, res.group, &name, &errors,
        ));
    }
    if res.key() == resources::NODES.key() {
        // Kubernetes rejects two taints with the same key and effect.
        let taints = obj
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for (i, a) in taints.iter().enumerate() {
            if a.get("key")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .is_empty()
            {
                return Err(ApiError::invalid(
                    res.kind,
                    &name,
                    &format!("spec.taints[{i}].key: Required value"),
                ));
            }
            if taints[..i]
                .iter()
                .any(|b| b.get("key") == a.get("key") && b.get("effect") == a.get("effect"))
            {
                return Err(ApiError::invalid(
                    res.kind,
                    &name,
                    &format!(
                        "spec.taints[{i}]: Duplicate value: \"{}:{}\"",
                        a["key"].as_str().unwrap_or_default(),
                        a["effect"].as_str().unwrap_or_default()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `ValidateConfigMap` (pkg/apis/core/validation): every key of `data` and
/// `binaryData` passes `IsConfigMapKey`, no key is in both, and all values
/// together stay within `MaxSecretSize` (1 MiB), counting `binaryData`
/// decoded.
pub(crate) fn validate_config_map(obj: &Value, name: &str) -> Result<()> {
    const MAX_SIZE: usize = 1024 * 1024;
    let invalid = |msg: String| ApiError::invalid("ConfigMap", name, &msg);
    let key_ok = |k: &str| {
        !k.is_empty()
            && k.len() <= 253
            && k != "."
            && k != ".."
            && !k.starts_with("..")
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    };
    let mut total = 0usize;
    let data = obj.get("data").and_then(Value::as_object);
    for (k, v) in data.into_iter().flatten() {
        if !key_ok(k) {
            return Err(invalid(format!(
                "data[{k}]: Invalid value: {k:?}: a valid config key must consist of alphanumeric characters, '-', '_' or '.'"
            )));
        }
        total += v.as_str().map_or(0, str::len);
    }
    let binary = obj.get("binaryData").and_then(Value::as_object);
    for (k, v) in binary.into_iter().flatten() {
        if !key_ok(k) || data.is_some_and(|d| d.contains_key(k)) {
            return Err(invalid(format!(
                "binaryData[{k}]: Invalid value: {k:?}: a valid config key must be unique and consist of alphanumeric characters, '-', '_' or '.'"
            )));
        }
        total += v.as_str().map_or(0, |s| s.len() / 4 * 3);
    }
    if total > MAX_SIZE {
        return Err(invalid(format!(
            "[]: Too long: may not be more than {MAX_SIZE} bytes"
        )));
    }
    Ok(())
}
