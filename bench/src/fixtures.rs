//! Realistic AdmissionReviews as the API server sends them for Nodes.
//!
//! Bodies are serialized once with a fixed-width placeholder where
//! `request.uid` goes, so each request only copies ~25 KB and writes a fresh
//! uid instead of re-serializing the Node.

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Value, json};

use nodegate_shared::keys::READY_BOOT_ID_ANNOTATION;

/// Length of a uid as the API server writes it (a UUID).
pub const UID_LEN: usize = 36;
const UID_PLACEHOLDER: &str = "@@@@@@@@-@@@@-@@@@-@@@@-@@@@@@@@@@@@";

/// Node name used by every fixture.
pub const NODE_NAME: &str = "ip-10-0-37-142.eu-west-1.compute.internal";
/// bootID the agent recorded when it was last ready (before the reboot).
pub const OLD_BOOT_ID: &str = "3f1b6c0e-5f39-4d6e-9d4b-7c1f2e8a9b10";
/// bootID the kubelet reports after the reboot.
pub const NEW_BOOT_ID: &str = "a7d2e4c9-81b3-4f0a-b6e5-0c9d8f7e6a51";

/// Which review a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Kubelet registration: a Node CREATE of about 25 KB.
    Create,
    /// Node-controller taint UPDATE after a reboot, with oldObject (~50 KB).
    Update,
    /// Alternate CREATE and UPDATE.
    Mix,
}

/// One pre-serialized review and what a correct webhook answers to it.
#[derive(Debug, Clone)]
pub struct Fixture {
    pub name: &'static str,
    prefix: Bytes,
    suffix: Bytes,
    /// The webhook must return a JSON patch (a taint is missing and the rule applies).
    pub expect_patch: bool,
}

impl Fixture {
    fn from_review(name: &'static str, text: &str, expect_patch: bool) -> Fixture {
        let at = text
            .find(UID_PLACEHOLDER)
            .expect("fixture reviews carry the uid placeholder");
        Fixture {
            name,
            prefix: Bytes::copy_from_slice(&text.as_bytes()[..at]),
            suffix: Bytes::copy_from_slice(&text.as_bytes()[at + UID_LEN..]),
            expect_patch,
        }
    }

    /// The request body with `uid` in `request.uid`.
    pub fn body(&self, uid: &str) -> Bytes {
        let mut b = BytesMut::with_capacity(self.len());
        b.put_slice(&self.prefix);
        b.put_slice(uid.as_bytes());
        b.put_slice(&self.suffix);
        b.freeze()
    }

    /// Size of a body in bytes.
    pub fn len(&self) -> usize {
        self.prefix.len() + UID_LEN + self.suffix.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

/// A unique, UUID-shaped uid for request `seq` of worker `worker`.
pub fn uid(worker: u32, seq: u64) -> String {
    format!(
        "{worker:08x}-0000-4000-8000-{:012x}",
        seq & 0xffff_ffff_ffff
    )
}

/// The fixtures of a workload, cycled through in order.
pub fn workload(w: Workload) -> Vec<Fixture> {
    match w {
        Workload::Create => vec![kubelet_create()],
        Workload::Update => vec![controller_update()],
        Workload::Mix => vec![kubelet_create(), controller_update()],
    }
}

/// Kubelet's first write of a Node: TaintNodesByCondition already added
/// `node.kubernetes.io/not-ready`, nodegate's taint is missing.
pub fn kubelet_create() -> Fixture {
    let node = node(
        &[json!({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})],
        None,
        NEW_BOOT_ID,
        false,
    );
    let review = review(
        "CREATE",
        json!({"username": format!("system:node:{NODE_NAME}"),
               "groups": ["system:nodes", "system:authenticated"]}),
        node,
        Value::Null,
        json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubelet"}),
    );
    Fixture::from_review("kubelet-create", &review, true)
}

/// The node controller swaps `unreachable` for `not-ready` on a node that
/// came back from a reboot: the agent's annotation still names the old
/// bootID, so nodegate must add its taint again.
pub fn controller_update() -> Fixture {
    let old = node(
        &[
            json!({"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule",
                   "timeAdded": "2026-11-22T20:01:13Z"}),
            json!({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
                   "timeAdded": "2026-11-22T20:01:18Z"}),
        ],
        Some(OLD_BOOT_ID),
        NEW_BOOT_ID,
        true,
    );
    let new = node(
        &[
            json!({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule",
                 "timeAdded": "2026-11-22T20:03:02Z"}),
        ],
        Some(OLD_BOOT_ID),
        NEW_BOOT_ID,
        true,
    );
    let review = review(
        "UPDATE",
        json!({"username": "system:serviceaccount:kube-system:node-controller",
               "uid": "5c0d7b1e-2f4a-4a8e-9b61-3e2d1c0b9a87",
               "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system",
                          "system:authenticated"]}),
        new,
        old,
        json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1",
               "fieldManager": "kube-controller-manager"}),
    );
    Fixture::from_review("controller-update", &review, true)
}

/// Serializes a review with fields in the API server's order (Go struct
/// order: uid first, objects late), which serde_json's sorted maps would lose.
fn review(op: &str, user: Value, object: Value, old: Value, options: Value) -> String {
    let gvk = json!({"group": "", "version": "v1", "kind": "Node"});
    let gvr = json!({"group": "", "version": "v1", "resource": "nodes"});
    let fields: [(&str, Value); 12] = [
        ("uid", json!(UID_PLACEHOLDER)),
        ("kind", gvk.clone()),
        ("resource", gvr.clone()),
        ("requestKind", gvk),
        ("requestResource", gvr),
        ("name", json!(NODE_NAME)),
        ("operation", json!(op)),
        ("userInfo", user),
        ("object", object),
        ("oldObject", old),
        ("dryRun", json!(false)),
        ("options", options),
    ];
    let mut request = String::from("{");
    for (k, v) in &fields {
        if request.len() > 1 {
            request.push(',');
        }
        request.push_str(&format!("{}:{v}", Value::from(*k)));
    }
    request.push('}');
    format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{request}}}"#
    )
}

/// Deterministic pseudo-random numbers (splitmix64), so fixtures are stable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn digest(&mut self) -> String {
        format!(
            "sha256:{:016x}{:016x}{:016x}{:016x}",
            self.next(),
            self.next(),
            self.next(),
            self.next()
        )
    }
}

/// Images a typical EKS/GKE worker has pulled: system pods plus workloads.
const IMAGES: &[(&str, &str)] = &[
    ("quay.io/cilium/cilium", "v1.16.5"),
    ("quay.io/cilium/operator-generic", "v1.16.5"),
    ("quay.io/cilium/hubble-relay", "v1.16.5"),
    ("registry.k8s.io/kube-proxy", "v1.32.2"),
    ("registry.k8s.io/coredns/coredns", "v1.11.3"),
    ("registry.k8s.io/pause", "3.10"),
    ("registry.k8s.io/metrics-server/metrics-server", "v0.7.2"),
    ("registry.k8s.io/ingress-nginx/controller", "v1.12.0"),
    (
        "registry.k8s.io/sig-storage/csi-node-driver-registrar",
        "v2.12.0",
    ),
    ("registry.k8s.io/sig-storage/livenessprobe", "v2.14.0"),
    ("registry.k8s.io/sig-storage/csi-provisioner", "v5.1.0"),
    ("registry.k8s.io/sig-storage/csi-attacher", "v4.7.0"),
    ("registry.k8s.io/sig-storage/csi-snapshotter", "v8.1.0"),
    ("registry.k8s.io/sig-storage/csi-resizer", "v1.12.0"),
    (
        "public.ecr.aws/ebs-csi-driver/aws-ebs-csi-driver",
        "v1.37.0",
    ),
    (
        "602401143452.dkr.ecr.eu-west-1.amazonaws.com/amazon-k8s-cni",
        "v1.19.0",
    ),
    ("docker.io/grafana/promtail", "3.3.2"),
    ("docker.io/grafana/loki", "3.3.2"),
    ("quay.io/prometheus/node-exporter", "v1.8.2"),
    ("quay.io/prometheus/prometheus", "v3.1.0"),
    (
        "quay.io/prometheus-operator/prometheus-config-reloader",
        "v0.79.2",
    ),
    ("quay.io/prometheus-operator/prometheus-operator", "v0.79.2"),
    (
        "registry.k8s.io/kube-state-metrics/kube-state-metrics",
        "v2.14.0",
    ),
    ("docker.io/fluent/fluent-bit", "3.2.4"),
    ("docker.io/library/nginx", "1.27.3-alpine"),
    ("docker.io/library/redis", "7.4.2-alpine"),
    ("docker.io/library/postgres", "17.2"),
    ("docker.io/bitnami/kafka", "3.9.0-debian-12-r6"),
    ("docker.io/bitnami/zookeeper", "3.9.3-debian-12-r3"),
    ("ghcr.io/external-secrets/external-secrets", "v0.12.1"),
    ("quay.io/jetstack/cert-manager-controller", "v1.16.2"),
    ("quay.io/jetstack/cert-manager-webhook", "v1.16.2"),
    ("quay.io/jetstack/cert-manager-cainjector", "v1.16.2"),
    ("ghcr.io/fluxcd/source-controller", "v1.4.1"),
    ("ghcr.io/fluxcd/kustomize-controller", "v1.4.0"),
    ("ghcr.io/fluxcd/helm-controller", "v1.1.0"),
    ("docker.io/istio/proxyv2", "1.24.2"),
    ("docker.io/istio/pilot", "1.24.2"),
    ("ghcr.io/aquasecurity/trivy-operator", "0.23.0"),
    ("docker.io/datadog/agent", "7.61.0"),
    ("gcr.io/distroless/static-debian12", "nonroot"),
    ("docker.io/otel/opentelemetry-collector-contrib", "0.116.1"),
    ("registry.k8s.io/autoscaling/cluster-autoscaler", "v1.32.0"),
    ("public.ecr.aws/karpenter/controller", "1.1.1"),
    ("docker.io/velero/velero", "v1.15.1"),
    ("ghcr.io/kyverno/kyverno", "v1.13.2"),
    ("registry.example.com/payments/api", "2026.11.18-4f2c9a1"),
    ("registry.example.com/payments/worker", "2026.11.18-4f2c9a1"),
    ("registry.example.com/search/indexer", "2026.11.20-b81d0e7"),
    ("registry.example.com/web/frontend", "2026.11.21-09ac3d2"),
];

/// Registry mirror most images on a node were pulled through.
const PULL_THROUGH: &str = "602401143452.dkr.ecr.eu-west-1.amazonaws.com/pull-through";

fn images(rng: &mut Rng) -> Vec<Value> {
    IMAGES
        .iter()
        .map(|(repo, tag)| {
            let digest = rng.digest();
            // Kubelet lists the digest reference first, then the tag(s).
            let mut names = vec![
                json!(format!("{repo}@{digest}")),
                json!(format!("{repo}:{tag}")),
            ];
            // Most images also came through the ECR pull-through cache.
            if !rng.next().is_multiple_of(6) {
                let cached = format!(
                    "{PULL_THROUGH}/{}",
                    repo.split_once('/').map_or(*repo, |r| r.1)
                );
                names.insert(0, json!(format!("{cached}@{}", rng.digest())));
                names.push(json!(format!("{cached}:{tag}")));
            }
            let size = 2_000_000 + rng.next() % 900_000_000;
            json!({"names": names, "sizeBytes": size})
        })
        .collect()
}

/// `f:` markers for every key of a JSON map, as server-side apply records them.
fn fields_of(map: &Value) -> Value {
    let mut f = serde_json::Map::new();
    f.insert(".".into(), json!({}));
    if let Some(m) = map.as_object() {
        for k in m.keys() {
            f.insert(format!("f:{k}"), json!({}));
        }
    }
    Value::Object(f)
}

/// The field ownership records the API server attaches before admission.
fn managed_fields(metadata: &Value, stored: bool) -> Value {
    let by_type = |kinds: &[&str]| {
        let mut m = serde_json::Map::new();
        m.insert(".".into(), json!({}));
        for k in kinds {
            m.insert(
                format!("k:{{\"type\":\"{k}\"}}"),
                json!({".": {}, "f:lastHeartbeatTime": {}, "f:lastTransitionTime": {},
                            "f:message": {}, "f:reason": {}, "f:status": {}, "f:type": {}}),
            );
        }
        Value::Object(m)
    };
    let resources = json!({".": {}, "f:cpu": {}, "f:ephemeral-storage": {}, "f:hugepages-1Gi": {},
                           "f:hugepages-2Mi": {}, "f:memory": {}, "f:pods": {}});
    let kubelet = json!({
        "manager": "kubelet",
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-11-22T20:02:41Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {
            "f:metadata": {
                "f:annotations": fields_of(&metadata["annotations"]),
                "f:labels": fields_of(&metadata["labels"]),
            },
            "f:spec": {"f:providerID": {}},
            "f:status": {
                "f:addresses": {".": {}, "k:{\"type\":\"Hostname\"}": {".": {}, "f:address": {}, "f:type": {}},
                                "k:{\"type\":\"InternalDNS\"}": {".": {}, "f:address": {}, "f:type": {}},
                                "k:{\"type\":\"InternalIP\"}": {".": {}, "f:address": {}, "f:type": {}}},
                "f:allocatable": resources,
                "f:capacity": resources,
                "f:conditions": by_type(&["DiskPressure", "MemoryPressure", "PIDPressure", "Ready"]),
                "f:config": {},
                "f:daemonEndpoints": {"f:kubeletEndpoint": {"f:Port": {}}},
                "f:features": {".": {}, "f:supplementalGroupsPolicy": {}},
                "f:images": {},
                "f:nodeInfo": {"f:architecture": {}, "f:bootID": {}, "f:containerRuntimeVersion": {},
                               "f:kernelVersion": {}, "f:kubeProxyVersion": {}, "f:kubeletVersion": {},
                               "f:machineID": {}, "f:operatingSystem": {}, "f:osImage": {},
                               "f:systemUUID": {}},
                "f:runtimeHandlers": {},
            }
        }
    });
    if !stored {
        return json!([kubelet]);
    }
    json!([
        kubelet,
        {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
         "time": "2026-11-22T20:03:02Z", "fieldsType": "FieldsV1",
         "fieldsV1": {"f:metadata": {"f:annotations": {"f:node.alpha.kubernetes.io/ttl": {}}},
                      "f:spec": {"f:podCIDR": {}, "f:podCIDRs": {".": {}, "v:\"10.244.37.0/24\"": {}},
                                 "f:taints": {}}}},
        {"manager": "nodegate-agent", "operation": "Update", "apiVersion": "v1",
         "time": "2026-11-22T19:40:12Z", "fieldsType": "FieldsV1",
         "fieldsV1": {"f:metadata": {"f:annotations": {"f:nodegate.dev/ready-boot-id": {}}}}},
    ])
}

fn condition(kind: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({
        "type": kind,
        "status": status,
        "lastHeartbeatTime": "2026-11-22T20:02:55Z",
        "lastTransitionTime": "2026-11-22T20:02:41Z",
        "reason": reason,
        "message": message,
    })
}

/// A full Node as the kubelet writes it; `controller_owned` adds what exists
/// only once the node is stored (uid, resourceVersion, podCIDR, managedFields-free).
/// A realistic stored Node (labels, annotations, images, conditions) named
/// `name` with its own address and podCIDR, for the fan-out benchmark.
pub fn cluster_node(name: &str, i: usize) -> Value {
    let mut n = node(&[], Some(NEW_BOOT_ID), NEW_BOOT_ID, true);
    let ip = format!("10.{}.{}.{}", 64 + i / 65_536, (i / 256) % 256, i % 256);
    let text = serde_json::to_string(&n)
        .unwrap_or_default()
        .replace(NODE_NAME, name)
        .replace("10.0.37.142", &ip);
    n = serde_json::from_str(&text).unwrap_or(n);
    if let Some(m) = n["metadata"].as_object_mut() {
        m.remove("uid");
        m.remove("resourceVersion");
        m.remove("creationTimestamp");
    }
    let cidr = format!("10.{}.{}.0/24", 128 + i / 256, i % 256);
    n["spec"]["podCIDR"] = json!(cidr);
    n["spec"]["podCIDRs"] = json!([cidr]);
    n
}

fn node(taints: &[Value], ready_boot: Option<&str>, boot_id: &str, stored: bool) -> Value {
    let mut rng = Rng(0x6e6f_6465_6761_7465);
    let mut annotations = json!({
        "alpha.kubernetes.io/provided-node-ip": "10.0.37.142",
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "csi.volume.kubernetes.io/nodeid": "{\"ebs.csi.aws.com\":\"i-0a1b2c3d4e5f60718\"}",
    });
    if let Some(b) = ready_boot {
        annotations[READY_BOOT_ID_ANNOTATION] = json!(b);
    }
    let mut metadata = json!({
        "name": NODE_NAME,
        "labels": {
            "beta.kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/instance-type": "m6i.2xlarge",
            "beta.kubernetes.io/os": "linux",
            "failure-domain.beta.kubernetes.io/region": "eu-west-1",
            "failure-domain.beta.kubernetes.io/zone": "eu-west-1a",
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": NODE_NAME,
            "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "m6i.2xlarge",
            "topology.kubernetes.io/region": "eu-west-1",
            "topology.kubernetes.io/zone": "eu-west-1a",
            "topology.ebs.csi.aws.com/zone": "eu-west-1a",
            "eks.amazonaws.com/nodegroup": "workers-general-20261101",
            "eks.amazonaws.com/capacityType": "ON_DEMAND",
        },
        "annotations": annotations,
    });
    let mut spec = json!({
        "providerID": "aws:///eu-west-1a/i-0a1b2c3d4e5f60718",
        "taints": taints,
    });
    if stored {
        metadata["uid"] = json!("9d3c2b1a-0f9e-4d8c-b7a6-5e4d3c2b1a09");
        metadata["resourceVersion"] = json!("48213377");
        metadata["creationTimestamp"] = json!("2026-11-01T08:14:22Z");
        spec["podCIDR"] = json!("10.244.37.0/24");
        spec["podCIDRs"] = json!(["10.244.37.0/24"]);
    }
    metadata["managedFields"] = managed_fields(&metadata, stored);
    let resources = json!({
        "cpu": "8", "ephemeral-storage": "104845292Ki", "hugepages-1Gi": "0",
        "hugepages-2Mi": "0", "memory": "32386544Ki", "pods": "58",
    });
    json!({
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": metadata,
        "spec": spec,
        "status": {
            "capacity": resources,
            "allocatable": {
                "cpu": "7910m", "ephemeral-storage": "95551679124", "hugepages-1Gi": "0",
                "hugepages-2Mi": "0", "memory": "31369712Ki", "pods": "58",
            },
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory",
                          "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure",
                          "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID",
                          "kubelet has sufficient PID available"),
                condition("Ready", "False", "KubeletNotReady",
                          "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.0.37.142"},
                {"type": "InternalDNS", "address": NODE_NAME},
                {"type": "Hostname", "address": NODE_NAME},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "ec2f3b9a8d7c6e5f4a3b2c1d0e9f8a7b",
                "systemUUID": "ec2f3b9a-8d7c-6e5f-4a3b-2c1d0e9f8a7b",
                "bootID": boot_id,
                "kernelVersion": "6.1.119-129.201.amzn2023.x86_64",
                "osImage": "Amazon Linux 2023.6.20241212",
                "containerRuntimeVersion": "containerd://1.7.23",
                "kubeletVersion": "v1.32.2-eks-aeac579",
                "kubeProxyVersion": "v1.32.2-eks-aeac579",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": images(&mut rng),
            "config": {},
            "runtimeHandlers": [
                {"name": "runc", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}},
                {"name": "", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}},
            ],
            "features": {"supplementalGroupsPolicy": true},
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use nodegate_shared::NodeView;
    use nodegate_shared::keys::{DEFAULT_TAINT, NODE_USER_PREFIX};
    use nodegate_shared::node::rebooted_since_ready;
    use nodegate_shared::patch::{Guard, add_taints};
    use nodegate_shared::taint::TaintSpec;

    fn parsed(f: &Fixture, uid: &str) -> Value {
        serde_json::from_slice(&f.body(uid)).expect("fixture body is valid JSON")
    }

    #[test]
    fn uid_is_uuid_shaped_and_unique() {
        let a = uid(3, 1);
        assert_eq!(a.len(), UID_LEN);
        assert_eq!(a, "00000003-0000-4000-8000-000000000001");
        assert_ne!(uid(3, 2), a);
        assert_ne!(uid(4, 1), a);
        assert_eq!(uid(u32::MAX, u64::MAX).len(), UID_LEN);
    }

    #[test]
    fn create_is_about_25_kb_with_uid_in_place() {
        let f = kubelet_create();
        let body = f.body(&uid(1, 7));
        assert_eq!(body.len(), f.len());
        assert!((23_000..=28_000).contains(&body.len()), "{}", body.len());
        let v = parsed(&f, &uid(1, 7));
        assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(v["kind"], "AdmissionReview");
        assert_eq!(v["request"]["uid"], uid(1, 7));
        assert_eq!(v["request"]["operation"], "CREATE");
        assert!(v["request"]["oldObject"].is_null());
        let status = &v["request"]["object"]["status"];
        assert_eq!(status["images"].as_array().unwrap().len(), 50);
        assert_eq!(status["conditions"].as_array().unwrap().len(), 4);
        assert_eq!(status["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10250);
        assert_eq!(status["nodeInfo"]["bootID"], NEW_BOOT_ID);
    }

    /// The CREATE comes from the node itself, carries not-ready (added by
    /// TaintNodesByCondition) and lacks nodegate's taint: the create is patched.
    #[test]
    fn create_needs_the_default_taint_first() {
        let v = parsed(&kubelet_create(), &uid(0, 0));
        let req = &v["request"];
        let user = req["userInfo"]["username"].as_str().unwrap();
        assert_eq!(user, format!("{NODE_USER_PREFIX}{NODE_NAME}"));
        let node: NodeView = serde_json::from_value(req["object"].clone()).unwrap();
        assert!(!node.is_excluded());
        let specs: Vec<TaintSpec> = vec![DEFAULT_TAINT.parse().unwrap()];
        let missing = node.missing(&specs);
        assert_eq!(missing.len(), 1);
        let patch = add_taints(&node, &missing, Guard::None);
        let mut obj = req["object"].clone();
        json_patch::patch(&mut obj, &patch).unwrap();
        let taints = obj["spec"]["taints"].as_array().unwrap();
        assert_eq!(taints.len(), 2);
        assert_eq!(taints[0]["key"], "nodegate.dev/agent-not-ready");
        assert_eq!(taints[1]["key"], "node.kubernetes.io/not-ready");
    }

    /// The UPDATE is a main-resource write by the node controller on a node
    /// whose recorded ready bootID is stale: the update is patched.
    #[test]
    fn update_is_a_post_reboot_controller_write() {
        let f = controller_update();
        assert!((45_000..=60_000).contains(&f.len()), "{}", f.len());
        let v = parsed(&f, &uid(2, 9));
        let req = &v["request"];
        assert_eq!(req["uid"], uid(2, 9));
        assert_eq!(req["operation"], "UPDATE");
        assert!(req.get("subResource").is_none());
        let user = req["userInfo"]["username"].as_str().unwrap();
        assert!(!user.starts_with(NODE_USER_PREFIX));
        let new: NodeView = serde_json::from_value(req["object"].clone()).unwrap();
        let old: NodeView = serde_json::from_value(req["oldObject"].clone()).unwrap();
        assert_eq!(new.ready_boot_id(), Some(OLD_BOOT_ID));
        assert!(rebooted_since_ready(new.ready_boot_id(), old.boot_id()));
        let specs: Vec<TaintSpec> = vec![DEFAULT_TAINT.parse().unwrap()];
        assert_eq!(new.missing(&specs).len(), 1);
        assert_ne!(new.taints(), old.taints());
    }

    /// The webhook's own decoder and rules patch both fixtures as intended,
    /// and the loadgen's answer check accepts what the webhook encodes.
    #[test]
    fn webhook_rules_patch_both_fixtures() {
        use nodegate_webhook::review;
        use nodegate_webhook::rules::Rules;
        let rules = Rules::new(vec![DEFAULT_TAINT.parse().unwrap()]).unwrap();
        for f in workload(Workload::Mix) {
            let id = uid(5, 42);
            let body = f.body(&id);
            let req = review::decode(&body).expect("webhook decodes the fixture");
            let d = rules.review(&req);
            assert!(d.added.is_some(), "{}: {}", f.name, d.why);
            let out = review::encode(&req.uid, d.added.as_ref());
            assert_eq!(
                crate::stats::check_review(
                    &out,
                    &id,
                    crate::stats::Expect::Webhook { patch: true }
                ),
                Ok(()),
                "{}",
                f.name
            );
            // The patch applies to the object and puts nodegate's taint before the others.
            let patch = &d.added.as_ref().unwrap().patch;
            let mut obj = parsed(&f, &id)["request"]["object"].clone();
            json_patch::patch(&mut obj, patch).unwrap();
            let taints = obj["spec"]["taints"].as_array().unwrap();
            assert_eq!(taints.len(), 2, "{}", f.name);
            assert_eq!(taints[0]["key"], "nodegate.dev/agent-not-ready");
            // A second call on the mutated object adds nothing (reinvocation).
            let mut again = parsed(&f, &id);
            again["request"]["object"] = obj;
            let again = serde_json::to_vec(&again).unwrap();
            let req = review::decode(&again).unwrap();
            assert!(rules.review(&req).added.is_none(), "{}", f.name);
        }
    }

    #[test]
    fn fixtures_are_deterministic() {
        assert_eq!(kubelet_create().body("x"), kubelet_create().body("x"));
        assert_eq!(workload(Workload::Mix).len(), 2);
        assert!(workload(Workload::Create).iter().all(|f| f.expect_patch));
    }
}
