//! The resource types the emulator serves, with what discovery and storage need to know.
//!
//! Follows the `APIResource` entries `k8s.io/apiserver/pkg/endpoints/installer.go`
//! (`registerResourceHandlers`) builds for each registered type.

/// One served resource type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceDef {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Subresources served besides the main resource (`status`, `binding`).
    pub subresources: &'static [&'static str],
    pub short_names: &'static [&'static str],
    /// Field selectors the real API server accepts for this type, besides
    /// `metadata.name` and `metadata.namespace`.
    pub field_selectors: &'static [&'static str],
}

impl ResourceDef {
    /// `v1` or `group/version`, as `apiVersion` spells it.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    pub fn has_status(&self) -> bool {
        self.subresources.contains(&"status")
    }

    /// Storage key, unique per type (`events` exists in two groups).
    pub fn key(&self) -> (&'static str, &'static str) {
        (self.group, self.plural)
    }
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

macro_rules! res {
    ($group:expr, $version:expr, $plural:expr, $singular:expr, $kind:expr, $ns:expr, $subs:expr, $short:expr, $fields:expr) => {
        ResourceDef {
            group: $group,
            version: $version,
            plural: $plural,
            singular: $singular,
            kind: $kind,
            namespaced: $ns,
            subresources: $subs,
            short_names: $short,
            field_selectors: $fields,
        }
    };
}

pub const NODES: ResourceDef = res!(
    "",
    "v1",
    "nodes",
    "node",
    "Node",
    false,
    &["status"],
    &["no"],
    &["spec.unschedulable"]
);
pub const PODS: ResourceDef = res!(
    "",
    "v1",
    "pods",
    "pod",
    "Pod",
    true,
    &["status", "binding"],
    &["po"],
    &["spec.nodeName", "status.phase", "spec.schedulerName"]
);
pub const EVENTS: ResourceDef = res!(
    "",
    "v1",
    "events",
    "event",
    "Event",
    true,
    &[],
    &["ev"],
    &[
        "involvedObject.kind",
        "involvedObject.name",
        "involvedObject.namespace",
        "involvedObject.uid",
        "reason",
        "type"
    ]
);
pub const NAMESPACES: ResourceDef = res!(
    "",
    "v1",
    "namespaces",
    "namespace",
    "Namespace",
    false,
    &["status"],
    &["ns"],
    &["status.phase"]
);
pub const EVENTS_V1: ResourceDef = res!(
    "events.k8s.io",
    "v1",
    "events",
    "event",
    "Event",
    true,
    &[],
    &["ev"],
    &[
        "regarding.kind",
        "regarding.name",
        "regarding.namespace",
        "reason",
        "type"
    ]
);
pub const LEASES: ResourceDef = res!(
    "coordination.k8s.io",
    "v1",
    "leases",
    "lease",
    "Lease",
    true,
    &[],
    &[],
    &[]
);
pub const MUTATING_WEBHOOKS: ResourceDef = res!(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "mutatingwebhookconfiguration",
    "MutatingWebhookConfiguration",
    false,
    &[],
    &[],
    &[]
);
/// `admissionregistration.k8s.io/v1` MutatingAdmissionPolicy (GA in 1.36).
pub const MUTATING_POLICIES: ResourceDef = res!(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingadmissionpolicies",
    "mutatingadmissionpolicy",
    "MutatingAdmissionPolicy",
    false,
    &[],
    &[],
    &[]
);
/// `admissionregistration.k8s.io/v1` ValidatingAdmissionPolicy (GA in 1.30).
pub const VALIDATING_POLICIES: ResourceDef = res!(
    "admissionregistration.k8s.io",
    "v1",
    "validatingadmissionpolicies",
    "validatingadmissionpolicy",
    "ValidatingAdmissionPolicy",
    false,
    &[],
    &[],
    &[]
);
pub const VALIDATING_POLICY_BINDINGS: ResourceDef = res!(
    "admissionregistration.k8s.io",
    "v1",
    "validatingadmissionpolicybindings",
    "validatingadmissionpolicybinding",
    "ValidatingAdmissionPolicyBinding",
    false,
    &[],
    &[],
    &[]
);
pub const MUTATING_POLICY_BINDINGS: ResourceDef = res!(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingadmissionpolicybindings",
    "mutatingadmissionpolicybinding",
    "MutatingAdmissionPolicyBinding",
    false,
    &[],
    &[],
    &[]
);

pub const SERVICES: ResourceDef = res!(
    "",
    "v1",
    "services",
    "service",
    "Service",
    true,
    &["status"],
    &["svc"],
    &[]
);
pub const CONFIGMAPS: ResourceDef = res!(
    "",
    "v1",
    "configmaps",
    "configmap",
    "ConfigMap",
    true,
    &[],
    &["cm"],
    &[]
);
pub const SECRETS: ResourceDef = res!(
    "",
    "v1",
    "secrets",
    "secret",
    "Secret",
    true,
    &[],
    &[],
    &["type"]
);
pub const DEPLOYMENTS: ResourceDef = res!(
    "apps",
    "v1",
    "deployments",
    "deployment",
    "Deployment",
    true,
    &["status"],
    &["deploy"],
    &[]
);
pub const STATEFULSETS: ResourceDef = res!(
    "apps",
    "v1",
    "statefulsets",
    "statefulset",
    "StatefulSet",
    true,
    &["status"],
    &["sts"],
    &[]
);
pub const DAEMONSETS: ResourceDef = res!(
    "apps",
    "v1",
    "daemonsets",
    "daemonset",
    "DaemonSet",
    true,
    &["status"],
    &["ds"],
    &[]
);

/// Stored only: no endpoint controller writes them; tests store the slices
/// of the webhook's Services (their pods run as processes on loopback).
pub const ENDPOINT_SLICES: ResourceDef = res!(
    "discovery.k8s.io",
    "v1",
    "endpointslices",
    "endpointslice",
    "EndpointSlice",
    true,
    &[],
    &[],
    &[]
);

/// Every served type, in discovery order.
/// The resources served under one group-version, or `None` when it is unknown.
pub fn in_group_version(group: &str, version: &str) -> Option<Vec<&'static ResourceDef>> {
    let defs: Vec<&'static ResourceDef> = ALL
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    (!defs.is_empty()).then_some(defs)
}

pub const ALL: &[ResourceDef] = &[
    NODES,
    PODS,
    EVENTS,
    NAMESPACES,
    EVENTS_V1,
    SERVICES,
    CONFIGMAPS,
    SECRETS,
    LEASES,
    MUTATING_WEBHOOKS,
    MUTATING_POLICIES,
    MUTATING_POLICY_BINDINGS,
    VALIDATING_POLICIES,
    VALIDATING_POLICY_BINDINGS,
    DEPLOYMENTS,
    STATEFULSETS,
    DAEMONSETS,
    ENDPOINT_SLICES,
];

/// API groups other than the core group, each with its one version.
pub fn groups() -> Vec<(&'static str, &'static str)> {
    let mut g: Vec<(&str, &str)> = ALL
        .iter()
        .filter(|r| !r.group.is_empty())
        .map(|r| (r.group, r.version))
        .collect();
    g.dedup();
    g
}

/// The type an object's `apiVersion` and `kind` name.
pub fn by_kind(api_version: &str, kind: &str) -> Option<&'static ResourceDef> {
    ALL.iter()
        .find(|r| r.api_version() == api_version && r.kind == kind)
}

pub fn lookup(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
    ALL.iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

pub fn verbs() -> &'static [&'static str] {
    VERBS
}
