//! Discovery and OpenAPI v3 documents, as much as kubectl 1.32 reads.
//!
//! kubectl's default `--validate=strict` asks `/openapi/v3` whether the type's
//! PATCH operation accepts `fieldValidation`; when it does, kubectl leaves
//! validation to the server and sends `fieldValidation=Strict`.
//!
//! Follows `k8s.io/apiserver/pkg/endpoints/discovery` (`APIVersionHandler`,
//! `APIGroupListHandler`, `APIResourceListHandler`) and `k8s.io/kube-openapi/pkg/handler3`
//! (the `/openapi/v3` index).

use serde_json::{Map, Value, json};

use crate::resources::{self, ResourceDef};

pub const SERVER_VERSION: &str = "v1.32.0";

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": SERVER_VERSION,
        "gitCommit": "nodegate-emulator",
        "gitTreeState": "clean",
        "buildDate": "2024-12-11T00:00:00Z",
        "goVersion": "go1.23.4",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]
    })
}

fn group_json(group: &str, version: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
    json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
}

pub fn api_group_list() -> Value {
    let groups: Vec<Value> = resources::groups()
        .into_iter()
        .map(|(g, v)| group_json(g, v))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn api_group(group: &str) -> Option<Value> {
    let (g, v) = resources::groups().into_iter().find(|(g, _)| *g == group)?;
    let mut body = group_json(g, v);
    body["kind"] = json!("APIGroup");
    body["apiVersion"] = json!("v1");
    Some(body)
}

pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let defs = resources::in_group_version(group, version)?;
    let mut list = Vec::new();
    for r in defs {
        list.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": resources::verbs(),
            "shortNames": r.short_names,
        }));
        for sub in r.subresources {
            let (kind, verbs): (&str, &[&str]) = match *sub {
                "binding" => ("Binding", &["create"]),
                _ => (r.kind, &["get", "patch", "update"]),
            };
            list.push(json!({
                "name": format!("{}/{sub}", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": kind,
                "verbs": verbs,
            }));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list}),
    )
}

/// `/openapi/v3`: where each group-version's document lives.
pub fn openapi_root() -> Value {
    let mut paths = Map::new();
    paths.insert(
        "api/v1".into(),
        json!({"serverRelativeURL": "/openapi/v3/api/v1?hash=NODEGATEEMULATOR"}),
    );
    for (g, v) in resources::groups() {
        paths.insert(
            format!("apis/{g}/{v}"),
            json!({"serverRelativeURL": format!("/openapi/v3/apis/{g}/{v}?hash=NODEGATEEMULATOR")}),
        );
    }
    json!({"paths": paths})
}

fn schema_name(r: &ResourceDef) -> String {
    let pkg = match r.group {
        "" => "core".to_string(),
        g => g.split('.').next().unwrap_or(g).to_string(),
    };
    format!("io.k8s.api.{pkg}.{}.{}", r.version, r.kind)
}

fn param(name: &str) -> Value {
    json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}})
}

fn op(r: &ResourceDef, action: &str, id: &str, write: bool) -> Value {
    let mut params = vec![param("pretty")];
    if write {
        params.push(param("dryRun"));
        params.push(param("fieldManager"));
        params.push(param("fieldValidation"));
    }
    if action == "list" {
        for p in [
            "labelSelector",
            "fieldSelector",
            "limit",
            "continue",
            "resourceVersion",
            "watch",
            "allowWatchBookmarks",
            "timeoutSeconds",
        ] {
            params.push(param(p));
        }
    }
    let schema = json!({"$ref": format!("#/components/schemas/{}", schema_name(r))});
    json!({
        "operationId": format!("{id}{}", r.kind),
        "parameters": params,
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": schema}}}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
    })
}

/// The OpenAPI v3 document of one group-version, or `None`.
pub fn openapi_gv(group: &str, version: &str) -> Option<Value> {
    let defs = resources::in_group_version(group, version)?;
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for r in defs {
        let base = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{prefix}/{}", r.plural)
        };
        let write_params = json!([
            param("dryRun"),
            param("fieldManager"),
            param("fieldValidation")
        ]);
        paths.insert(
            base.clone(),
            json!({
                "get": op(r, "list", "list", false),
                "post": op(r, "post", "create", true),
                "parameters": write_params,
            }),
        );
        paths.insert(
            format!("{base}/{{name}}"),
            json!({
                "get": op(r, "get", "read", false),
                "put": op(r, "put", "replace", true),
                "patch": op(r, "patch", "patch", true),
                "delete": op(r, "delete", "delete", true),
                "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}},
                               param("dryRun"), param("fieldManager"), param("fieldValidation")],
            }),
        );
        if r.has_status() {
            paths.insert(
                format!("{base}/{{name}}/status"),
                json!({
                    "get": op(r, "get", "read", false),
                    "put": op(r, "put", "replace", true),
                    "patch": op(r, "patch", "patch", true),
                    "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}},
                                   param("dryRun"), param("fieldManager"), param("fieldValidation")],
                }),
            );
        }
        schemas.insert(
            schema_name(r),
            json!({
                "type": "object",
                "description": format!("{} (the emulator keeps the schema open)", r.kind),
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                },
                "x-kubernetes-preserve-unknown-fields": true,
                "x-kubernetes-group-version-kind": [{"group": r.group, "version": r.version, "kind": r.kind}],
            }),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": SERVER_VERSION},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}
