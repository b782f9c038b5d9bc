//! Realistic Node objects and AdmissionReviews, as the API server sends them.
//!
//! Used by the tests and by the performance harness so both post
//! the same shapes: a kubelet CREATE of about 25 KB (50 images, full status)
//! and node-controller / kubelet UPDATEs with `oldObject`. Behind the cargo
//! feature `fixtures`: the shipped library leaves it out.

use serde_json::{Value, json};

use crate::rules::Rule;

/// A Node as a kubelet registers it: labels, annotations, spec without
/// taints (TaintNodesByCondition adds `not-ready` before webhooks run, see
/// [`with_taints`]), a full status with `images` entries.
pub fn kubelet_node(name: &str, boot_id: &str, images: usize) -> Value {
    let images: Vec<Value> = (0..images)
        .map(|i| {
            json!({
                "names": [
                    format!(
                        "123456789012.dkr.ecr.eu-west-1.amazonaws.com/platform/service-component-{i}@sha256:{:064x}",
                        i * 7919 + 17
                    ),
                    format!("123456789012.dkr.ecr.eu-west-1.amazonaws.com/platform/service-component-{i}:v1.{i}.3-eksbuild.1"),
                    format!("mirror.registry.example.com/platform/service-component-{i}@sha256:{:064x}", i * 104_729 + 3)
                ],
                "sizeBytes": 10_000_000 + i * 123_457
            })
        })
        .collect();
    let condition = |t: &str, status: &str, reason: &str, msg: &str| {
        json!({"type": t, "status": status, "lastHeartbeatTime": "2025-01-01T00:00:00Z",
               "lastTransitionTime": "2025-01-01T00:00:00Z", "reason": reason, "message": msg})
    };
    json!({
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "creationTimestamp": null,
            "managedFields": [{
                "manager": "kubelet",
                "operation": "Update",
                "apiVersion": "v1",
                "time": "2025-01-01T00:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {"f:annotations": {".": {}, "f:node.alpha.kubernetes.io/ttl": {},
                        "f:volumes.kubernetes.io/controller-managed-attach-detach": {}},
                        "f:labels": {".": {}, "f:beta.kubernetes.io/arch": {}, "f:beta.kubernetes.io/os": {},
                            "f:kubernetes.io/arch": {}, "f:kubernetes.io/hostname": {}, "f:kubernetes.io/os": {},
                            "f:node.kubernetes.io/instance-type": {}, "f:topology.kubernetes.io/region": {},
                            "f:topology.kubernetes.io/zone": {}}},
                    "f:spec": {"f:podCIDR": {}, "f:podCIDRs": {".": {}, "v:\"10.244.1.0/24\"": {}},
                        "f:providerID": {}},
                    "f:status": {"f:addresses": {}, "f:allocatable": {}, "f:capacity": {}, "f:conditions": {},
                        "f:daemonEndpoints": {}, "f:images": {}, "f:nodeInfo": {}}
                }
            }],
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "m5.xlarge",
                "topology.kubernetes.io/region": "eu-west-1",
                "topology.kubernetes.io/zone": "eu-west-1a"
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"
            }
        },
        "spec": {
            "podCIDR": "10.244.1.0/24",
            "podCIDRs": ["10.244.1.0/24"],
            "providerID": format!("aws:///eu-west-1a/i-0{name}")
        },
        "status": {
            "capacity": {"cpu": "4", "ephemeral-storage": "104845292Ki", "hugepages-1Gi": "0",
                         "hugepages-2Mi": "0", "memory": "16209800Ki", "pods": "110"},
            "allocatable": {"cpu": "3920m", "ephemeral-storage": "96625420948", "hugepages-1Gi": "0",
                            "hugepages-2Mi": "0", "memory": "15186824Ki", "pods": "110"},
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "False", "KubeletNotReady", "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized")
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.0.12.34"},
                {"type": "Hostname", "address": name},
                {"type": "InternalDNS", "address": format!("{name}.eu-west-1.compute.internal")}
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "ec2f1d8e3b6f4a0f9d1e2c3b4a596877",
                "systemUUID": "ec2f1d8e-3b6f-4a0f-9d1e-2c3b4a596877",
                "bootID": boot_id,
                "kernelVersion": "6.1.112-124.190.amzn2023.x86_64",
                "osImage": "Amazon Linux 2023.6.20241031",
                "containerRuntimeVersion": "containerd://1.7.22",
                "kubeletVersion": "v1.32.0",
                "kubeProxyVersion": "v1.32.0",
                "operatingSystem": "linux",
                "architecture": "amd64"
            },
            "images": images
        }
    })
}

/// `node` with `spec.taints` set to `taints`.
pub fn with_taints(mut node: Value, taints: Value) -> Value {
    node["spec"]["taints"] = taints;
    node
}

/// `node` with an annotation set.
pub fn with_annotation(mut node: Value, key: &str, value: &str) -> Value {
    node["metadata"]["annotations"][key] = Value::String(value.to_owned());
    node
}

/// An `admission.k8s.io/v1` AdmissionReview request for a Node.
pub fn review(
    uid: &str,
    operation: &str,
    sub_resource: Option<&str>,
    username: &str,
    object: Value,
    old_object: Option<Value>,
    dry_run: bool,
) -> Value {
    let name = object["metadata"]["name"].clone();
    let options_kind = if operation == "CREATE" {
        "CreateOptions"
    } else {
        "UpdateOptions"
    };
    let mut req = json!({
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Node"},
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "requestKind": {"group": "", "version": "v1", "kind": "Node"},
        "requestResource": {"group": "", "version": "v1", "resource": "nodes"},
        "name": name,
        "operation": operation,
        "userInfo": {"username": username, "groups": ["system:authenticated"]},
        "object": object,
        "oldObject": old_object.unwrap_or(Value::Null),
        "dryRun": dry_run,
        "options": {"kind": options_kind, "apiVersion": "meta.k8s.io/v1"}
    });
    if let Some(sub) = sub_resource {
        req["subResource"] = json!(sub);
        req["requestSubResource"] = json!(sub);
    }
    json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": req})
}

/// The kubelet's registration: CREATE by `system:node:<name>` of a node
/// with 50 images and the `not-ready` taint TaintNodesByCondition added.
pub fn kubelet_create(uid: &str, name: &str) -> Value {
    let node = with_taints(
        kubelet_node(name, "b0f1a2c3-0000-4000-8000-000000000001", 50),
        json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]),
    );
    review(
        uid,
        "CREATE",
        None,
        &format!("system:node:{name}"),
        node,
        None,
        false,
    )
}

/// The node lifecycle controller's taint PATCH (an UPDATE of the main
/// resource) on a node that rebooted since its agent recorded it ready.
pub fn node_controller_update_after_reboot(uid: &str, name: &str) -> Value {
    let old = with_annotation(
        kubelet_node(name, "boot-2", 50),
        nodegate_shared::keys::READY_BOOT_ID_ANNOTATION,
        "boot-1",
    );
    let new = with_taints(
        old.clone(),
        json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule",
                "timeAdded": "2025-01-01T00:01:00Z"}]),
    );
    review(
        uid,
        "UPDATE",
        None,
        "system:serviceaccount:kube-system:node-controller",
        new,
        Some(old),
        false,
    )
}

/// One main-resource admission the rules decide ([`Rule::NodeCreate`],
/// [`Rule::UpdateAfterReboot`], [`Rule::Excluded`], [`Rule::Idempotent`]):
/// the rule table the webhook's tests iterate and the emulator runs through
/// the MutatingAdmissionPolicy, so both admissions are held to the same cases.
#[derive(Debug, Clone)]
pub struct RuleCase {
    pub name: &'static str,
    /// The rule that decides it.
    pub rule: Rule,
    /// CREATE or UPDATE.
    pub operation: &'static str,
    pub user: &'static str,
    pub object: Value,
    pub old_object: Option<Value>,
    pub dry_run: bool,
    /// Taint keys after admission, in order; `None`: left untouched.
    pub taints_after: Option<Vec<&'static str>>,
}

pub const CILIUM: &str = "nodegate.dev/agent-not-ready";
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
pub const KUBELET: &str = "system:node:n1";
pub const CONTROLLER: &str = "system:serviceaccount:kube-system:node-controller";
pub const ADMIN: &str = "kubernetes-admin";
const EXCLUDE: &str = "node-restriction.kubernetes.io/nodegate-exclude";
/// The exclude label before it moved under node-restriction.kubernetes.io:
/// any kubelet could set it, so it must exclude nothing.
const OLD_EXCLUDE: &str = "nodegate.dev/exclude";
const READY_ANNOTATION: &str = "nodegate.dev/ready-boot-id";

/// A kubelet's node after TaintNodesByCondition (not-ready) — the usual CREATE.
pub fn node_with_not_ready() -> Value {
    with_taints(
        kubelet_node("n1", "boot-1", 3),
        json!([{"key": NOT_READY, "effect": "NoSchedule"}]),
    )
}

/// [`Rule::NodeCreate`], [`Rule::Excluded`] and [`Rule::Idempotent`] on
/// CREATE, for the default taint.
pub fn create_cases() -> Vec<RuleCase> {
    let no_spec = {
        let mut n = kubelet_node("n1", "boot-1", 0);
        if let Some(o) = n.as_object_mut() {
            o.remove("spec");
        }
        n
    };
    let present = with_taints(
        kubelet_node("n1", "boot-1", 0),
        json!([{"key": CILIUM, "value": "other", "effect": "NoSchedule"}]),
    );
    let mut excluded = node_with_not_ready();
    excluded["metadata"]["labels"][EXCLUDE] = json!("true");
    let mut old_label = node_with_not_ready();
    old_label["metadata"]["labels"][OLD_EXCLUDE] = json!("true");
    let large = with_taints(
        kubelet_node("n1", "boot-1", 50),
        json!([{"key": NOT_READY, "effect": "NoSchedule"}]),
    );
    let case = |name, object, dry_run, taints_after| RuleCase {
        name,
        rule: Rule::NodeCreate,
        operation: "CREATE",
        user: KUBELET,
        object,
        old_object: None,
        dry_run,
        taints_after,
    };
    vec![
        case(
            "kubelet create with not-ready",
            node_with_not_ready(),
            false,
            Some(vec![CILIUM, NOT_READY]),
        ),
        case("no spec", no_spec, false, Some(vec![CILIUM])),
        case(
            "spec without taints",
            kubelet_node("n1", "boot-1", 0),
            false,
            Some(vec![CILIUM]),
        ),
        RuleCase {
            rule: Rule::Idempotent,
            ..case("taint already present (other value)", present, false, None)
        },
        case(
            "dry-run create is patched too",
            node_with_not_ready(),
            true,
            Some(vec![CILIUM, NOT_READY]),
        ),
        // NodeRestriction refuses the label from a kubelet: an admin's create.
        RuleCase {
            user: ADMIN,
            rule: Rule::Excluded,
            ..case("excluded node", excluded, false, None)
        },
        case(
            "kubelet create with the old exclude label",
            old_label,
            false,
            Some(vec![CILIUM, NOT_READY]),
        ),
        case(
            "large node with 50 images",
            large,
            false,
            Some(vec![CILIUM, NOT_READY]),
        ),
    ]
}

/// [`Rule::UpdateAfterReboot`], [`Rule::Excluded`] and [`Rule::Idempotent`]
/// on an UPDATE of the main resource, for the default taint.
/// The stored node rebooted (bootID boot-2); its agent was last ready on boot-1.
pub fn update_cases() -> Vec<RuleCase> {
    let stored = with_annotation(kubelet_node("n1", "boot-2", 50), READY_ANNOTATION, "boot-1");
    let controller_write = with_taints(
        stored.clone(),
        json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule",
                "timeAdded": "2025-01-01T00:01:00Z"}]),
    );
    let agent_write = with_annotation(kubelet_node("n1", "boot-2", 50), READY_ANNOTATION, "boot-2");
    let not_rebooted = with_annotation(kubelet_node("n1", "boot-1", 0), READY_ANNOTATION, "boot-1");
    let no_annotation = kubelet_node("n1", "boot-2", 0);
    let mut excluded = controller_write.clone();
    excluded["metadata"]["labels"][EXCLUDE] = json!("true");
    let mut old_label = controller_write.clone();
    old_label["metadata"]["labels"][OLD_EXCLUDE] = json!("true");
    let case = |name, user, object, old: &Value, taints_after| RuleCase {
        name,
        rule: Rule::UpdateAfterReboot,
        operation: "UPDATE",
        user,
        object,
        old_object: Some(old.clone()),
        dry_run: false,
        taints_after,
    };
    vec![
        case(
            "node-controller PATCH after reboot",
            CONTROLLER,
            controller_write.clone(),
            &stored,
            Some(vec![CILIUM, "node.kubernetes.io/unreachable"]),
        ),
        case(
            "kubelet's own update",
            KUBELET,
            controller_write.clone(),
            &stored,
            None,
        ),
        case(
            "another node's kubelet is not the node itself",
            "system:node:n2",
            controller_write.clone(),
            &stored,
            Some(vec![CILIUM, "node.kubernetes.io/unreachable"]),
        ),
        case(
            "agent records the current boot",
            "system:serviceaccount:kube-system:nodegate-agent",
            agent_write,
            &stored,
            None,
        ),
        case(
            "no reboot since ready",
            CONTROLLER,
            not_rebooted.clone(),
            &not_rebooted,
            None,
        ),
        case(
            "never ready (no annotation)",
            CONTROLLER,
            no_annotation.clone(),
            &no_annotation,
            None,
        ),
        RuleCase {
            rule: Rule::Excluded,
            ..case("excluded node", CONTROLLER, excluded, &stored, None)
        },
        case(
            "old exclude label",
            CONTROLLER,
            old_label,
            &stored,
            Some(vec![CILIUM, "node.kubernetes.io/unreachable"]),
        ),
    ]
}

/// Every main-resource case of the rule table.
pub fn rule_table() -> Vec<RuleCase> {
    let mut all = create_cases();
    all.extend(update_cases());
    all
}
