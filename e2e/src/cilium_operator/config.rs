//! The settings of cilium-operator's node-taint controller, read from the
//! `cilium-config` ConfigMap the way the operator reads its mounted copy
//! (one key per flag, string values).
//!
//! Upstream (cilium/cilium main):
//! - `operator/watchers/node_taint_cell.go`: `NodeTaintSyncConfig` and its
//!   `Flags` — `remove-cilium-node-taints` (default true),
//!   `set-cilium-node-taints` (default **false**), `set-cilium-is-up-condition`
//!   (default true), `taint-sync-workers` (default 10); `registerNodeTaintSync`
//!   starts nothing unless remove-cilium-node-taints or
//!   set-cilium-is-up-condition is true.
//! - `operator/pkg/ciliumpod/cell.go`: `cilium-pod-labels` (default
//!   `k8s-app=cilium`), `cilium-pod-namespace` (default empty; `ResolveNamespace`
//!   falls back to the agent option `k8s-namespace`, then `default`).
//! - `pkg/option/config.go` + `pkg/defaults`: `agent-not-ready-taint-key`,
//!   default `node.cilium.io/agent-not-ready` (`AgentNotReadyNodeTaintValue`).
//!
//! Helm (`install/kubernetes/cilium/values.yaml`): `operator.removeNodeTaints:
//! true`, `operator.setNodeTaints: ~` ("@default -- same as removeNodeTaints"),
//! `operator.setNodeNetworkStatus: true`, `agentNotReadyTaintKey` (default
//! key). Current charts render all of them into `cilium-config`
//! (`templates/cilium-configmap.yaml`) as `remove-cilium-node-taints`,
//! `set-cilium-node-taints`, `set-cilium-is-up-condition` and
//! `agent-not-ready-taint-key`, so a default install has all three switches
//! "true" — unlike the operator's own default for `set-cilium-node-taints`.
//! (Older templates wrote the two switches only when true: a `false` left
//! the key out and the operator's default, true, applied.)

use std::collections::BTreeMap;

/// The agent-not-ready taint key (`pkg/defaults` `AgentNotReadyNodeTaint`).
pub const DEFAULT_TAINT_KEY: &str = "node.cilium.io/agent-not-ready";
/// `ciliumpod.Config` default `Labels`.
pub const DEFAULT_POD_LABELS: &str = "k8s-app=cilium";
/// `NodeTaintSyncConfig` default `TaintSyncWorkers`.
pub const DEFAULT_WORKERS: usize = 10;

pub const KEY_REMOVE: &str = "remove-cilium-node-taints";
pub const KEY_SET: &str = "set-cilium-node-taints";
pub const KEY_IS_UP: &str = "set-cilium-is-up-condition";
pub const KEY_TAINT: &str = "agent-not-ready-taint-key";
pub const KEY_POD_LABELS: &str = "cilium-pod-labels";
pub const KEY_POD_NAMESPACE: &str = "cilium-pod-namespace";
pub const KEY_K8S_NAMESPACE: &str = "k8s-namespace";
pub const KEY_WORKERS: &str = "taint-sync-workers";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The operator refuses to start on a value `strconv.ParseBool` rejects.
    #[error("{key}: {value:?} is not a boolean")]
    NotABool { key: String, value: String },
    #[error("{key}: {value:?} is not a positive integer")]
    NotAPositiveInt { key: String, value: String },
}

/// What the node-taint controller runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorConfig {
    /// `remove-cilium-node-taints` (`markNodeOptions.RemoveNodeTaint`).
    pub remove_node_taints: bool,
    /// `set-cilium-node-taints` (`markNodeOptions.SetNodeTaint`).
    pub set_node_taints: bool,
    /// `set-cilium-is-up-condition` (`markNodeOptions.SetCiliumIsUpCondition`).
    pub set_cilium_is_up_condition: bool,
    /// `agent-not-ready-taint-key`.
    pub taint_key: String,
    /// `cilium-pod-labels`: the label selector of the Cilium pod watch.
    pub pod_labels: String,
    /// `cilium-pod-namespace`, if set.
    pub pod_namespace: Option<String>,
    /// `k8s-namespace` (the agent option the pod namespace falls back to;
    /// the chart's operator Deployment sets it from its own namespace).
    pub k8s_namespace: Option<String>,
    /// `taint-sync-workers`.
    pub workers: usize,
}

impl Default for OperatorConfig {
    /// The operator's flag defaults (no key set at all).
    fn default() -> Self {
        Self {
            remove_node_taints: true,
            set_node_taints: false,
            set_cilium_is_up_condition: true,
            taint_key: DEFAULT_TAINT_KEY.to_string(),
            pod_labels: DEFAULT_POD_LABELS.to_string(),
            pod_namespace: None,
            k8s_namespace: None,
            workers: DEFAULT_WORKERS,
        }
    }
}

/// Go's `strconv.ParseBool`, which the operator's config decoding uses.
fn parse_bool(key: &str, value: &str) -> Result<bool, Error> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(Error::NotABool {
            key: key.into(),
            value: value.into(),
        }),
    }
}

impl OperatorConfig {
    /// From the ConfigMap's `data`. A missing key takes the operator's flag
    /// default ([`Default`]), as a key missing from the mounted directory
    /// does — note `set-cilium-node-taints` is then false, whereas Helm
    /// always writes the key ([`Self::helm_defaults`]). An empty string
    /// counts as unset (`cmp.Or` for the namespace; the chart never writes
    /// an empty switch).
    pub fn from_configmap_data(data: &BTreeMap<String, String>) -> Result<Self, Error> {
        let mut c = Self::default();
        let get = |k: &str| data.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        if let Some(v) = get(KEY_REMOVE) {
            c.remove_node_taints = parse_bool(KEY_REMOVE, v)?;
        }
        if let Some(v) = get(KEY_SET) {
            c.set_node_taints = parse_bool(KEY_SET, v)?;
        }
        if let Some(v) = get(KEY_IS_UP) {
            c.set_cilium_is_up_condition = parse_bool(KEY_IS_UP, v)?;
        }
        if let Some(v) = get(KEY_TAINT) {
            c.taint_key = v.to_string();
        }
        if let Some(v) = get(KEY_POD_LABELS) {
            c.pod_labels = v.to_string();
        }
        c.pod_namespace = get(KEY_POD_NAMESPACE).map(str::to_string);
        c.k8s_namespace = get(KEY_K8S_NAMESPACE).map(str::to_string);
        if let Some(v) = get(KEY_WORKERS) {
            c.workers =
                v.parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| Error::NotAPositiveInt {
                        key: KEY_WORKERS.into(),
                        value: v.into(),
                    })?;
        }
        Ok(c)
    }

    /// What Cilium's chart renders with its default values: every switch
    /// on (`setNodeTaints` follows `removeNodeTaints`), the default key.
    pub fn helm_defaults() -> Self {
        Self {
            set_node_taints: true,
            ..Self::default()
        }
    }

    /// `registerNodeTaintSync`: the controller runs only if it removes
    /// taints or sets the condition; `set-cilium-node-taints` alone starts
    /// nothing.
    pub fn controller_enabled(&self) -> bool {
        self.remove_node_taints || self.set_cilium_is_up_condition
    }

    /// `ciliumpod.Config.ResolveNamespace(k8s-namespace)`: the first
    /// non-empty of `cilium-pod-namespace`, `k8s-namespace`, then
    /// `own_namespace` (what the chart's Deployment puts in `k8s-namespace`:
    /// the operator's namespace), then `default`.
    pub fn resolve_pod_namespace(&self, own_namespace: &str) -> String {
        [
            self.pod_namespace.as_deref(),
            self.k8s_namespace.as_deref(),
            Some(own_namespace),
        ]
        .into_iter()
        .flatten()
        .find(|s| !s.is_empty())
        .unwrap_or("default")
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn missing_keys_take_the_operators_flag_defaults() {
        let c = OperatorConfig::from_configmap_data(&BTreeMap::new()).unwrap();
        assert_eq!(c, OperatorConfig::default());
        assert!(c.remove_node_taints && !c.set_node_taints && c.set_cilium_is_up_condition);
        assert_eq!(c.taint_key, "node.cilium.io/agent-not-ready");
        assert_eq!(c.pod_labels, "k8s-app=cilium");
        assert_eq!(c.workers, 10);
    }

    #[test]
    fn helm_defaults_are_what_the_chart_renders() {
        // The chart's default rendering of cilium-config, as parsed.
        let rendered = data(&[
            (KEY_REMOVE, "true"),
            (KEY_SET, "true"),
            (KEY_IS_UP, "true"),
            (KEY_TAINT, DEFAULT_TAINT_KEY),
        ]);
        assert_eq!(
            OperatorConfig::from_configmap_data(&rendered).unwrap(),
            OperatorConfig::helm_defaults()
        );
    }

    #[test]
    fn table() {
        // (data, remove, set, is_up, key)
        type Case<'a> = (&'a [(&'a str, &'a str)], bool, bool, bool, &'a str);
        let cases: &[Case] = &[
            (
                &[(KEY_REMOVE, "false")],
                false,
                false,
                true,
                DEFAULT_TAINT_KEY,
            ),
            (
                &[(KEY_REMOVE, "False"), (KEY_SET, "1")],
                false,
                true,
                true,
                DEFAULT_TAINT_KEY,
            ),
            (&[(KEY_IS_UP, "f")], true, false, false, DEFAULT_TAINT_KEY),
            (
                &[(KEY_SET, "T"), (KEY_TAINT, "example.com/not-ready")],
                true,
                true,
                true,
                "example.com/not-ready",
            ),
            // An empty value is no value.
            (
                &[(KEY_REMOVE, ""), (KEY_TAINT, "")],
                true,
                false,
                true,
                DEFAULT_TAINT_KEY,
            ),
        ];
        for (kv, remove, set, is_up, key) in cases {
            let c = OperatorConfig::from_configmap_data(&data(kv)).unwrap();
            assert_eq!(
                (
                    c.remove_node_taints,
                    c.set_node_taints,
                    c.set_cilium_is_up_condition,
                    c.taint_key.as_str()
                ),
                (*remove, *set, *is_up, *key),
                "{kv:?}"
            );
        }
    }

    #[test]
    fn invalid_values_are_errors() {
        let e = OperatorConfig::from_configmap_data(&data(&[(KEY_SET, "yes")])).unwrap_err();
        assert_eq!(
            e,
            Error::NotABool {
                key: KEY_SET.into(),
                value: "yes".into()
            }
        );
        assert!(OperatorConfig::from_configmap_data(&data(&[(KEY_WORKERS, "0")])).is_err());
        let c = OperatorConfig::from_configmap_data(&data(&[(KEY_WORKERS, "3")])).unwrap();
        assert_eq!(c.workers, 3);
    }

    #[test]
    fn controller_runs_only_to_remove_or_set_the_condition() {
        let mut c = OperatorConfig::helm_defaults();
        assert!(c.controller_enabled());
        c.remove_node_taints = false;
        assert!(c.controller_enabled());
        c.set_cilium_is_up_condition = false;
        // set-cilium-node-taints alone: registerNodeTaintSync returns early.
        assert!(c.set_node_taints && !c.controller_enabled());
    }

    #[test]
    fn pod_namespace_resolution() {
        let mut c = OperatorConfig::default();
        assert_eq!(c.resolve_pod_namespace("kube-system"), "kube-system");
        assert_eq!(c.resolve_pod_namespace(""), "default");
        c.k8s_namespace = Some("cilium".into());
        assert_eq!(c.resolve_pod_namespace("kube-system"), "cilium");
        c.pod_namespace = Some("agents".into());
        assert_eq!(c.resolve_pod_namespace("kube-system"), "agents");
    }
}
