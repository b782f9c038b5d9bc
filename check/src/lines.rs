//! The lines of admission (`nodegate-webhook webhook-config`): the
//! configuration's first entry reaches every replica through the webhook's
//! Service; after it, one backup entry per StatefulSet replica reaches that
//! replica alone through its own Service, and its conditions let it fire
//! only while the Node under review still lacks a configured taint, i.e.
//! only when the lines before it failed open. The API server never retries a
//! failed call, so a Node write is stored ungated only when every line it
//! reached failed.
//!
//! This module reads the configuration's entries as [`Line`]s; the checks:
//!
//! - [`backups`] (`webhook lines`): a backup line per replica, each calling a
//!   Service of its own that exists and selects exactly that replica;
//!   failurePolicy Ignore and reinvocationPolicy Never on every line; backup
//!   conditions that evaluate on a Node CREATE and go quiet once it carries
//!   the taints;
//! - [`answers`] (`line <entry>`): each line's replica, called through the
//!   API server's service proxy with a canary Node CREATE, answers with
//!   every taint;
//! - [`placement`] (`replica placement`): the backup lines' replicas on
//!   distinct nodes.

pub mod answers;
pub mod backups;
pub mod placement;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhook;
use k8s_openapi::api::core::v1::Service;
use nodegate_shared::path_token::PATH_PREFIX;
use serde_json::{Value, json};

use crate::canary::canary_node;
use crate::webhook_config::Hook;

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

    /// Where the check posts, for the report: [`proxied_path`], so the
    /// path's token, a secret, is left out.
    fn shown(&self) -> String {
        format!(
            "{}/{}:{}{}",
            self.namespace,
            self.name,
            self.port,
            proxied_path(&self.path)
        )
    }
}

/// The path the check posts a line's review to: the line's path with its
/// token cut off (`/mutate/<token>` → `/mutate`), any other path as it is.
/// The check posts through the API server's service proxy, whose URL the
/// audit log records (`requestURI`), so the token must not be in it; the
/// webhook answers `/mutate` as it answers the token's path, only without
/// writing a stored Node, and the check needs only the answer.
pub fn proxied_path(path: &str) -> &str {
    if path.starts_with(PATH_PREFIX) {
        PATH_PREFIX.trim_end_matches('/')
    } else {
        path
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

/// The backup lines' Services as read, for [`placement`].
#[derive(Debug, Clone, Default)]
pub struct Backups {
    /// `(line, Service)` of each backup line whose Service was read.
    pub services: Vec<(String, Service)>,
}

/// A Node as the API server hands it to the webhooks on a kubelet's
/// registration: TaintNodesByCondition has added `not-ready`.
fn registering_node(name: &str) -> Value {
    let mut n = canary_node(name);
    n["spec"] =
        json!({"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]});
    n
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(shown, "nodegate/nodegate-webhook:443/mutate");
        assert_eq!(
            svc("/mutate").shown(),
            "nodegate/nodegate-webhook:443/mutate"
        );
    }

    #[test]
    fn the_proxied_path_drops_the_token_and_nothing_else() {
        let token = "0f3a9d2c4e6b8a1f0c2d4e6f8a0b1c2d3e4f5a6b7c8d9e0f";
        for (line, posted) in [
            (format!("/mutate/{token}"), "/mutate"),
            ("/mutate/".to_string(), "/mutate"),
            ("/mutate".to_string(), "/mutate"),
            ("/".to_string(), "/"),
            ("/other/path".to_string(), "/other/path"),
            ("/mutated".to_string(), "/mutated"),
        ] {
            let got = proxied_path(&line);
            assert_eq!(got, posted, "{line}");
            assert!(!got.contains(token));
        }
    }
}
