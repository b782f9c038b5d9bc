//! Server-side printing: `kubectl get` asks for a `meta.k8s.io/v1` Table.

use serde_json::{Value, json};

use crate::resources::{self, ResourceDef};
use crate::util;

fn col(name: &str, ty: &str, format: &str, description: &str) -> Value {
    json!({"name": name, "type": ty, "format": format, "description": description, "priority": 0})
}

fn age(obj: &Value) -> String {
    obj.pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(util::parse_rfc3339)
        .map(|t| util::human_age(util::now_secs().saturating_sub(t)))
        .unwrap_or_else(|| "<unknown>".into())
}

fn node_status(obj: &Value) -> String {
    let ready = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str());
    let mut s = match ready {
        Some("True") => "Ready".to_string(),
        Some(_) => "NotReady".to_string(),
        None => "Unknown".to_string(),
    };
    if obj.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        s.push_str(",SchedulingDisabled");
    }
    s
}

fn node_roles(obj: &Value) -> String {
    let roles: Vec<&str> = obj
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .collect()
        })
        .unwrap_or_default();
    if roles.is_empty() {
        "<none>".into()
    } else {
        roles.join(",")
    }
}

/// Renders one object's row cells.
type Cells = fn(&Value) -> Vec<Value>;

fn columns_and_cells(res: &ResourceDef) -> (Vec<Value>, Cells) {
    let name = col(
        "Name",
        "string",
        "name",
        "Name must be unique within a namespace.",
    );
    let age_col = col(
        "Age",
        "string",
        "",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
    );
    if res.key() == resources::NODES.key() {
        (
            vec![
                name,
                col("Status", "string", "", "The status of the node"),
                col("Roles", "string", "", "The roles of the node"),
                age_col,
                col(
                    "Version",
                    "string",
                    "",
                    "Kubelet Version reported by the node.",
                ),
            ],
            |o| {
                vec![
                    o["metadata"]["name"].clone(),
                    json!(node_status(o)),
                    json!(node_roles(o)),
                    json!(age(o)),
                    o.pointer("/status/nodeInfo/kubeletVersion")
                        .cloned()
                        .unwrap_or(json!("")),
                ]
            },
        )
    } else if res.key() == resources::PODS.key() {
        (
            vec![
                name,
                col(
                    "Ready",
                    "string",
                    "",
                    "The aggregate readiness state of this pod for accepting traffic.",
                ),
                col(
                    "Status",
                    "string",
                    "",
                    "The aggregate status of the containers in this pod.",
                ),
                col(
                    "Restarts",
                    "string",
                    "",
                    "The number of times the containers in this pod have been restarted.",
                ),
                age_col,
            ],
            |o| {
                let total = o
                    .pointer("/spec/containers")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                let statuses = o
                    .pointer("/status/containerStatuses")
                    .and_then(Value::as_array);
                let ready = statuses.map_or(0, |s| s.iter().filter(|c| c["ready"] == true).count());
                let restarts: u64 = statuses.map_or(0, |s| {
                    s.iter().filter_map(|c| c["restartCount"].as_u64()).sum()
                });
                vec![
                    o["metadata"]["name"].clone(),
                    json!(format!("{ready}/{total}")),
                    o.pointer("/status/phase")
                        .cloned()
                        .unwrap_or(json!("Pending")),
                    json!(restarts.to_string()),
                    json!(age(o)),
                ]
            },
        )
    } else {
        (vec![name, age_col], |o| {
            vec![o["metadata"]["name"].clone(), json!(age(o))]
        })
    }
}

/// A Table of `items`, each row carrying the object's metadata.
pub fn table(res: &ResourceDef, items: &[&Value], rv: u64, cont: Option<&str>) -> Value {
    let (columns, cells) = columns_and_cells(res);
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            json!({
                "cells": cells(o),
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o["metadata"],
                }
            })
        })
        .collect();
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns,
        "rows": rows,
    })
}
