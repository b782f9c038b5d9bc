//! Bounds on what one admission request may cost, so that anyone who can
//! reach the port cannot grow the webhook into its memory limit (an OOM kill
//! under `failurePolicy: Ignore` admits every Node untainted).
//!
//! The transport's bounds (connections, handshakes, headers, HTTP/2) are in
//! [`crate::serve::ServeOptions`]; these are the request's.
//!
//! # Body size
//!
//! [`DEFAULT_MAX_BODY_BYTES`] is 2 MiB, derived from the largest Node
//! AdmissionReview a real cluster sends (the test below builds it): per Node,
//! annotations are capped at 256 KiB in total by validation, their keys come
//! back once more in `managedFields`, the kubelet reports at most 50 images
//! (`nodeStatusMaxImages`) with at most 5 names each
//! (`maxNamesPerImageInNodeStatus`), plus ~100 labels, 128 attached volumes
//! (twice: attached and in use) and 20 conditions with 1 KB messages: about
//! 515 KiB. An UPDATE carries `object` and `oldObject`, so about 1 MiB; 2 MiB
//! leaves a margin of two. The hard ceiling (etcd's 1.5 MiB per object, so
//! ~3 MiB per review) is not reached by any Node a kubelet writes, and
//! memory is bounded by the shared [`RequestLimits::body_buffer_bytes`]
//! anyway, not by this per-request cap.

use std::time::Duration;

/// Largest request body read (see the module docs for the derivation).
pub const DEFAULT_MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// Limits of the admission route.
#[derive(Debug, Clone, Copy)]
pub struct RequestLimits {
    /// A body over this gets the oversized answer without being read further.
    pub max_body_bytes: usize,
    /// Bytes of request bodies held at once across all requests; a request
    /// that would go over is answered 503 at once (counted as `body_budget`).
    /// Bytes are reserved as they arrive, so an attacker must really send
    /// them to hold any.
    pub body_buffer_bytes: usize,
    /// Requests past their headers at once (reading a body or being decided);
    /// more wait, within the request deadline.
    pub max_inflight: usize,
    /// The whole body must have arrived within this after the headers.
    pub body_read_timeout: Duration,
    /// Deadline of one request from its headers to the answer, waiting for
    /// an in-flight slot included. The API server gives up after the
    /// configuration's `timeoutSeconds` (3 s as shipped): work past that is
    /// wasted.
    pub request_timeout: Duration,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            body_buffer_bytes: 32 * 1024 * 1024,
            max_inflight: 256,
            body_read_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(5),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::{Map, Value, json};

    use super::*;

    /// The largest Node a kubelet and its neighbours realistically write.
    fn largest_node(name: &str) -> Value {
        let mut node = crate::fixtures::kubelet_node(name, "boot-1", 50);
        // Annotations at the validation limit (256 KiB of keys and values),
        // with keys as long as allowed so managedFields repeat the most.
        let key = |i: usize| format!("{}.example.com/{:0>60}", "a".repeat(240), i);
        let mut annotations = Map::new();
        let mut total = 0;
        let mut i = 0;
        while total < 256 * 1024 - 400 {
            let k = key(i);
            let v = "v".repeat(300);
            total += k.len() + v.len();
            annotations.insert(k, Value::from(v));
            i += 1;
        }
        let owned: Map<String, Value> = annotations
            .keys()
            .map(|k| (format!("f:{k}"), json!({})))
            .collect();
        let mut labels = Map::new();
        for i in 0..100 {
            labels.insert(
                format!("feature.node.kubernetes.io/{}-{i}", "x".repeat(200)),
                Value::from("y".repeat(63)),
            );
        }
        node["metadata"]["annotations"] = Value::Object(annotations);
        node["metadata"]["labels"] = Value::Object(labels);
        node["metadata"]["managedFields"]
            .as_array_mut()
            .unwrap()
            .push(
                json!({"manager": "annotator", "operation": "Update", "apiVersion": "v1",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": owned}}}),
            );
        // 50 images with 5 long names each (registry/path@digest).
        let images: Vec<Value> = (0..50)
            .map(|i| {
                let names: Vec<String> = (0..5)
                    .map(|n| {
                        format!(
                            "registry-{n}.example.com/{}/image-{i}@sha256:{:0>64}",
                            "team/project/component".repeat(4),
                            i
                        )
                    })
                    .collect();
                json!({"names": names, "sizeBytes": 123_456_789})
            })
            .collect();
        node["status"]["images"] = Value::from(images);
        let volume = |i: usize| format!("kubernetes.io/csi/ebs.csi.aws.com^vol-{i:0>17}");
        node["status"]["volumesInUse"] = (0..128).map(volume).collect();
        node["status"]["volumesAttached"] = (0..128)
            .map(|i| json!({"name": volume(i), "devicePath": format!("/dev/xvd{i:0>4}")}))
            .collect();
        let conditions: Vec<Value> = (0..20)
            .map(|i| {
                json!({"type": format!("Condition{i}"), "status": "False",
                "reason": "NoProblem", "message": "m".repeat(1000),
                "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                "lastTransitionTime": "2026-01-01T00:00:00Z"})
            })
            .collect();
        node["status"]["conditions"] = Value::from(conditions);
        node
    }

    #[test]
    fn the_largest_real_node_update_fits_with_a_margin() {
        let node = largest_node("n1");
        let one = serde_json::to_vec(&node).unwrap().len();
        let review = crate::fixtures::review(
            "u-1",
            "UPDATE",
            None,
            "system:node:n1",
            node.clone(),
            Some(node),
            false,
        );
        let both = serde_json::to_vec(&review).unwrap().len();
        assert!(
            one > 480 * 1024 && one < 560 * 1024,
            "one Node: {one} bytes"
        );
        assert!(
            both > 1000 * 1024 && both < DEFAULT_MAX_BODY_BYTES * 3 / 5,
            "review: {both} bytes"
        );
    }
}
