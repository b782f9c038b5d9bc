//! nodegate's objects after an uninstall: its admission objects, its
//! ClusterRoles and ClusterRoleBindings, and its workloads and Secrets in
//! its namespace. An object is nodegate's when it carries
//! `app.kubernetes.io/part-of=nodegate`; admission objects also by a name
//! starting `nodegate` (or the names the check was given), workloads and
//! Secrets by the install's names (the Secrets are made by hand or by the
//! certs controller, without the label).

use std::collections::BTreeMap;

use crate::report::{Line, Status};

use super::Names;

pub const PART_OF: &str = "app.kubernetes.io/part-of";
/// The CA Secret the certs controller keeps beside the serving certificate.
pub const CA_SECRET: &str = "nodegate-webhook-ca";

/// Where a kind is and how its objects are recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Cluster-scoped; by label, name prefix or the configured names.
    Admission,
    /// Cluster-scoped; by label.
    Cluster,
    /// In nodegate's namespace; by label or the install's names.
    Namespaced,
    /// In any namespace (the agent's Events Role in `default`, probe-pod's
    /// and the check's in `kube-system`); by label.
    AnyNamespace,
}

/// A kind the check lists.
#[derive(Debug, PartialEq, Eq)]
pub struct Kind {
    pub kind: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub scope: Scope,
    /// What a leftover one still does.
    pub why: &'static str,
}

const fn kind(
    kind: &'static str,
    group: &'static str,
    plural: &'static str,
    scope: Scope,
    why: &'static str,
) -> Kind {
    let version = "v1";
    Kind {
        kind,
        group,
        version,
        plural,
        scope,
        why,
    }
}

const ADMISSION: &str = "admissionregistration.k8s.io";
const RBAC: &str = "rbac.authorization.k8s.io";

/// Every kind, in the order the lines report them.
pub const KINDS: &[Kind] = &[
    kind(
        "MutatingAdmissionPolicy",
        ADMISSION,
        "mutatingadmissionpolicies",
        Scope::Admission,
        "the API server still taints every new or rebooted Node with it, and no agent removes the taint",
    ),
    kind(
        "MutatingAdmissionPolicyBinding",
        ADMISSION,
        "mutatingadmissionpolicybindings",
        Scope::Admission,
        "it puts a policy that taints Nodes in force",
    ),
    kind(
        "MutatingWebhookConfiguration",
        ADMISSION,
        "mutatingwebhookconfigurations",
        Scope::Admission,
        "the API server still calls a webhook that is gone on Node writes (they fail open, after the call fails)",
    ),
    kind(
        "ValidatingAdmissionPolicy",
        ADMISSION,
        "validatingadmissionpolicies",
        Scope::Admission,
        "it still judges writes of nodegate's identities",
    ),
    kind(
        "ValidatingAdmissionPolicyBinding",
        ADMISSION,
        "validatingadmissionpolicybindings",
        Scope::Admission,
        "it puts a policy of nodegate's in force",
    ),
    kind(
        "ClusterRole",
        RBAC,
        "clusterroles",
        Scope::Cluster,
        "its grants stay",
    ),
    kind(
        "ClusterRoleBinding",
        RBAC,
        "clusterrolebindings",
        Scope::Cluster,
        "a ServiceAccount made again under that name gets its grants back",
    ),
    kind(
        "DaemonSet",
        "apps",
        "daemonsets",
        Scope::Namespaced,
        "its Pods still run",
    ),
    kind(
        "StatefulSet",
        "apps",
        "statefulsets",
        Scope::Namespaced,
        "its Pods still run",
    ),
    kind(
        "Deployment",
        "apps",
        "deployments",
        Scope::Namespaced,
        "its Pods still run",
    ),
    kind(
        "Secret",
        "",
        "secrets",
        Scope::Namespaced,
        "it still holds a key or the path token",
    ),
    kind(
        "Role",
        RBAC,
        "roles",
        Scope::AnyNamespace,
        "its grants stay",
    ),
    kind(
        "RoleBinding",
        RBAC,
        "rolebindings",
        Scope::AnyNamespace,
        "a ServiceAccount made again under that name gets its grants back",
    ),
];

impl Kind {
    /// How kubectl names one: `mutatingwebhookconfiguration/nodegate`.
    fn arg(&self, name: &str) -> String {
        format!("{}/{name}", self.kind.to_lowercase())
    }
}

/// An object as listed: what the verdict needs of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Object {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Its namespace, for a kind listed in every namespace.
    pub namespace: Option<String>,
}

impl Object {
    pub fn new(name: &str, labels: &[(&str, &str)]) -> Object {
        Object {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            namespace: None,
        }
    }
}

/// Whether `o`, of kind `k`, is nodegate's.
pub fn is_nodegates(k: &Kind, o: &Object, names: &Names) -> bool {
    if o.labels.get(PART_OF).is_some_and(|v| v == "nodegate") {
        return true;
    }
    let n = o.name.as_str();
    match k.scope {
        Scope::Admission => {
            n.starts_with("nodegate") || n == names.webhook_config || n == names.policy
        }
        Scope::Cluster | Scope::AnyNamespace => false,
        Scope::Namespaced => match k.kind {
            "DaemonSet" => n == names.daemonset,
            "StatefulSet" => n == names.webhook_workload,
            // The certs controller, and an older install's webhook Deployment.
            "Deployment" => n == names.certs_deployment || n == names.webhook_workload,
            "Secret" => n == names.tls_secret || n == CA_SECRET || n == crate::path_token::SECRET,
            _ => false,
        },
    }
}

/// The check of a scope's lines.
fn scope_check(scope: Scope) -> &'static str {
    match scope {
        Scope::Admission => "admission objects",
        Scope::Cluster => "cluster roles",
        Scope::Namespaced => "namespace objects",
        Scope::AnyNamespace => "roles elsewhere",
    }
}

/// The lines for the objects as listed (`listed`: each kind of [`KINDS`]
/// with its list) and the namespace's existence.
pub fn verdict(
    listed: &[(&Kind, Result<Vec<Object>, String>)],
    namespace: &Result<bool, String>,
    names: &Names,
) -> Vec<Line> {
    let ns = names.namespace;
    let mut lines = Vec::new();
    // kubectl arguments of the leftovers: cluster-scoped, then namespaced.
    let mut cluster_args: Vec<String> = Vec::new();
    let mut ns_args: Vec<String> = Vec::new();
    for scope in [
        Scope::Admission,
        Scope::Cluster,
        Scope::Namespaced,
        Scope::AnyNamespace,
    ] {
        let check = scope_check(scope);
        let before = lines.len();
        for (k, objects) in listed.iter().filter(|(k, _)| k.scope == scope) {
            let objects = match objects {
                Ok(o) => o,
                Err(e) => {
                    lines.push(Line::new(
                        check,
                        Status::Fail,
                        format!(
                            "cannot list {} ({e}): whether nodegate left any is unknown; run with a credential that may list them",
                            k.plural
                        ),
                    ));
                    continue;
                }
            };
            let mut mine: Vec<&Object> = objects
                .iter()
                .filter(|o| is_nodegates(k, o, names))
                .collect();
            mine.sort_by(|a, b| a.name.cmp(&b.name));
            for o in mine {
                let (arg, command) = match scope {
                    Scope::Namespaced => {
                        let arg = k.arg(&o.name);
                        let command = format!("kubectl -n {ns} delete {arg}");
                        ns_args.push(arg);
                        (None, command)
                    }
                    Scope::AnyNamespace => {
                        let at = o.namespace.as_deref().unwrap_or("default");
                        (None, format!("kubectl -n {at} delete {}", k.arg(&o.name)))
                    }
                    _ => {
                        let arg = k.arg(&o.name);
                        (Some(arg.clone()), format!("kubectl delete {arg}"))
                    }
                };
                cluster_args.extend(arg);
                let place = match scope {
                    Scope::Namespaced => format!("{ns}/{}", o.name),
                    Scope::AnyNamespace => {
                        format!("{}/{}", o.namespace.as_deref().unwrap_or_default(), o.name)
                    }
                    _ => o.name.clone(),
                };
                lines.push(Line::new(
                    check,
                    Status::Fail,
                    format!("{} {place} is left: {}; {command}", k.kind, k.why),
                ));
            }
        }
        if lines.len() == before {
            let what = match scope {
                Scope::Admission => "no MutatingWebhookConfiguration, MutatingAdmissionPolicy, ValidatingAdmissionPolicy or binding of nodegate's".to_string(),
                Scope::Cluster => {
                    format!("no ClusterRole or ClusterRoleBinding labelled {PART_OF}=nodegate")
                }
                Scope::Namespaced => format!(
                    "none of nodegate's workloads or Secrets in namespace {ns}"
                ),
                Scope::AnyNamespace => {
                    format!("no Role or RoleBinding labelled {PART_OF}=nodegate in any namespace")
                }
            };
            lines.push(Line::new(check, Status::Pass, what));
        }
    }
    lines.push(namespace_line(namespace, ns, !ns_args.is_empty()));
    if !cluster_args.is_empty() || !ns_args.is_empty() {
        let mut commands = Vec::new();
        if !cluster_args.is_empty() {
            commands.push(format!("kubectl delete {}", cluster_args.join(" ")));
        }
        if !ns_args.is_empty() {
            commands.push(format!("kubectl -n {ns} delete {}", ns_args.join(" ")));
        }
        lines.push(Line::new(
            "all objects",
            Status::Info,
            format!(
                "to delete every object above at once: {}",
                commands.join(" && ")
            ),
        ));
    }
    lines
}

/// The namespace itself: gone, or still there (a note: it may hold more
/// than nodegate's, and `helm uninstall` leaves a namespace it was told to
/// create).
fn namespace_line(namespace: &Result<bool, String>, ns: &str, holds_leftovers: bool) -> Line {
    const CHECK: &str = "namespace";
    match namespace {
        Ok(false) => Line::new(CHECK, Status::Pass, format!("namespace {ns} is gone")),
        Ok(true) if holds_leftovers => Line::new(
            CHECK,
            Status::Info,
            format!(
                "namespace {ns} still exists with the objects above; if nothing else of yours is in it, kubectl delete namespace {ns} removes them all"
            ),
        ),
        Ok(true) => Line::new(
            CHECK,
            Status::Info,
            format!(
                "namespace {ns} still exists, without nodegate's workloads or Secrets; if nothing else of yours is in it: kubectl delete namespace {ns}"
            ),
        ),
        Err(e) => Line::new(
            CHECK,
            Status::Skip,
            format!("cannot read namespace {ns}: {e}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: Names = Names {
        namespace: "nodegate",
        webhook_config: "nodegate",
        policy: "nodegate",
        webhook_workload: "nodegate-webhook",
        daemonset: "nodegate-agent",
        certs_deployment: "nodegate-certs",
        tls_secret: "nodegate-webhook-tls",
    };

    fn kind_of(name: &str) -> &'static Kind {
        KINDS.iter().find(|k| k.kind == name).unwrap()
    }

    /// Every kind listed empty, then `found` (kind, objects) put in.
    fn listed(
        found: Vec<(&str, Result<Vec<Object>, String>)>,
    ) -> Vec<(&'static Kind, Result<Vec<Object>, String>)> {
        let mut all: Vec<(&'static Kind, Result<Vec<Object>, String>)> =
            KINDS.iter().map(|k| (k, Ok(Vec::new()))).collect();
        for (kind, objects) in found {
            let slot = all.iter_mut().find(|(k, _)| k.kind == kind).unwrap();
            slot.1 = objects;
        }
        all
    }

    #[test]
    fn whose_objects() {
        let label = [(PART_OF, "nodegate")];
        let rows = [
            (
                "MutatingWebhookConfiguration",
                Object::new("nodegate", &[]),
                true,
            ),
            (
                "MutatingWebhookConfiguration",
                Object::new("cilium", &[]),
                false,
            ),
            (
                "MutatingAdmissionPolicyBinding",
                Object::new("nodegate-binding", &[]),
                true,
            ),
            (
                "ValidatingAdmissionPolicy",
                Object::new("confine", &label),
                true,
            ),
            (
                "ValidatingAdmissionPolicy",
                Object::new("confine", &[(PART_OF, "other")]),
                false,
            ),
            ("ClusterRole", Object::new("nodegate-agent", &label), true),
            // Cluster roles by label only: a name is no proof.
            ("ClusterRole", Object::new("nodegate-agent", &[]), false),
            ("DaemonSet", Object::new("nodegate-agent", &[]), true),
            ("DaemonSet", Object::new("cilium", &[]), false),
            ("StatefulSet", Object::new("nodegate-webhook", &[]), true),
            ("Deployment", Object::new("nodegate-certs", &[]), true),
            ("Deployment", Object::new("nodegate-webhook", &[]), true),
            ("Deployment", Object::new("coredns", &[]), false),
            ("Secret", Object::new("nodegate-webhook-tls", &[]), true),
            ("Secret", Object::new(CA_SECRET, &[]), true),
            ("Secret", Object::new("nodegate-webhook-path", &[]), true),
            ("Secret", Object::new("mine", &[]), false),
        ];
        for (kind, o, want) in rows {
            assert_eq!(
                is_nodegates(kind_of(kind), &o, &NAMES),
                want,
                "{kind} {o:?}"
            );
        }
    }

    /// Each row: what was listed and whether the namespace exists, then
    /// (check, status, part of the detail) of every line, in order.
    #[test]
    fn verdicts() {
        type Row<'a> = (
            Vec<(&'a str, Result<Vec<Object>, String>)>,
            Result<bool, String>,
            Vec<(&'a str, Status, &'a str)>,
        );
        let label = [(PART_OF, "nodegate")];
        let rows: Vec<Row> = vec![
            (
                vec![(
                    "MutatingWebhookConfiguration",
                    Ok(vec![Object::new("other", &[])]),
                )],
                Ok(false),
                vec![
                    (
                        "admission objects",
                        Status::Pass,
                        "no MutatingWebhookConfiguration",
                    ),
                    (
                        "cluster roles",
                        Status::Pass,
                        "no ClusterRole or ClusterRoleBinding labelled app.kubernetes.io/part-of=nodegate",
                    ),
                    (
                        "namespace objects",
                        Status::Pass,
                        "none of nodegate's workloads or Secrets in namespace nodegate",
                    ),
                    ("namespace", Status::Pass, "namespace nodegate is gone"),
                ],
            ),
            (
                vec![
                    (
                        "MutatingWebhookConfiguration",
                        Ok(vec![Object::new("nodegate", &[])]),
                    ),
                    (
                        "ValidatingAdmissionPolicy",
                        Ok(vec![Object::new("nodegate-agent-confinement", &label)]),
                    ),
                    (
                        "ClusterRole",
                        Ok(vec![
                            Object::new("nodegate-webhook", &label),
                            Object::new("view", &[]),
                        ]),
                    ),
                    ("Secret", Ok(vec![Object::new("nodegate-webhook-tls", &[])])),
                ],
                Ok(true),
                vec![
                    (
                        "admission objects",
                        Status::Fail,
                        "MutatingWebhookConfiguration nodegate is left: the API server still calls a webhook that is gone on Node writes (they fail open, after the call fails); kubectl delete mutatingwebhookconfiguration/nodegate",
                    ),
                    (
                        "admission objects",
                        Status::Fail,
                        "ValidatingAdmissionPolicy nodegate-agent-confinement is left: it still judges writes of nodegate's identities; kubectl delete validatingadmissionpolicy/nodegate-agent-confinement",
                    ),
                    (
                        "cluster roles",
                        Status::Fail,
                        "ClusterRole nodegate-webhook is left: its grants stay; kubectl delete clusterrole/nodegate-webhook",
                    ),
                    (
                        "namespace objects",
                        Status::Fail,
                        "Secret nodegate/nodegate-webhook-tls is left: it still holds a key or the path token; kubectl -n nodegate delete secret/nodegate-webhook-tls",
                    ),
                    (
                        "namespace",
                        Status::Info,
                        "namespace nodegate still exists with the objects above; if nothing else of yours is in it, kubectl delete namespace nodegate removes them all",
                    ),
                    (
                        "all objects",
                        Status::Info,
                        "to delete every object above at once: kubectl delete mutatingwebhookconfiguration/nodegate validatingadmissionpolicy/nodegate-agent-confinement clusterrole/nodegate-webhook && kubectl -n nodegate delete secret/nodegate-webhook-tls",
                    ),
                ],
            ),
            (
                vec![(
                    "MutatingAdmissionPolicy",
                    Ok(vec![Object::new("nodegate", &[])]),
                )],
                Ok(true),
                vec![
                    (
                        "admission objects",
                        Status::Fail,
                        "MutatingAdmissionPolicy nodegate is left: the API server still taints every new or rebooted Node",
                    ),
                    ("cluster roles", Status::Pass, ""),
                    ("namespace objects", Status::Pass, ""),
                    (
                        "namespace",
                        Status::Info,
                        "still exists, without nodegate's workloads or Secrets; if nothing else of yours is in it: kubectl delete namespace nodegate",
                    ),
                    (
                        "all objects",
                        Status::Info,
                        "kubectl delete mutatingadmissionpolicy/nodegate",
                    ),
                ],
            ),
            (
                vec![
                    ("ClusterRoleBinding", Err("403 forbidden".into())),
                    ("DaemonSet", Ok(vec![Object::new("nodegate-agent", &[])])),
                ],
                Err("403".into()),
                vec![
                    ("admission objects", Status::Pass, ""),
                    (
                        "cluster roles",
                        Status::Fail,
                        "cannot list clusterrolebindings (403 forbidden): whether nodegate left any is unknown",
                    ),
                    (
                        "namespace objects",
                        Status::Fail,
                        "DaemonSet nodegate/nodegate-agent is left: its Pods still run; kubectl -n nodegate delete daemonset/nodegate-agent",
                    ),
                    (
                        "namespace",
                        Status::Skip,
                        "cannot read namespace nodegate: 403",
                    ),
                    (
                        "all objects",
                        Status::Info,
                        "at once: kubectl -n nodegate delete daemonset/nodegate-agent",
                    ),
                ],
            ),
        ];
        for (found, namespace, want) in rows {
            // The roles-elsewhere scope passes in every row; its own test
            // covers it.
            let lines: Vec<Line> = verdict(&listed(found), &namespace, &NAMES)
                .into_iter()
                .filter(|l| !(l.check == "roles elsewhere" && l.status == Status::Pass))
                .collect();
            assert_eq!(lines.len(), want.len(), "{lines:#?}");
            for (got, (check, status, part)) in lines.iter().zip(&want) {
                assert_eq!(
                    (got.check.as_str(), got.status),
                    (*check, *status),
                    "{}",
                    got.detail
                );
                assert!(got.detail.contains(part), "{:?} lacks {part:?}", got.detail);
            }
        }
    }

    #[test]
    fn roles_left_in_other_namespaces_are_named_with_their_namespace() {
        let mut role = Object::new("nodegate-agent-events", &[(PART_OF, "nodegate")]);
        role.namespace = Some("default".into());
        let mut theirs = Object::new("nodegate-lookalike", &[]);
        theirs.namespace = Some("default".into());
        let lines = verdict(
            &listed(vec![("Role", Ok(vec![role, theirs]))]),
            &Ok(false),
            &NAMES,
        );
        let fails: Vec<&Line> = lines.iter().filter(|l| l.status == Status::Fail).collect();
        assert_eq!(fails.len(), 1, "{lines:?}");
        assert!(
            fails[0].detail.contains("default/nodegate-agent-events")
                && fails[0]
                    .detail
                    .contains("kubectl -n default delete role/nodegate-agent-events"),
            "{:?}",
            fails[0]
        );
        let clean = verdict(&listed(vec![]), &Ok(false), &NAMES);
        assert!(
            clean
                .iter()
                .any(|l| l.check == "roles elsewhere" && l.status == Status::Pass)
        );
    }
}
