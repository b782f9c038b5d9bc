//! AdmissionReview bytes in and out.
//!
//! Decoding uses kube's `AdmissionReview<SlimNode>`. Encoding is done here
//! rather than with kube's `Serialize`, which writes `patch` as an array of
//! numbers: the API server expects what every Go webhook emits, a base64
//! string (Go's encoding of `[]byte`).

use std::collections::HashMap;

use base64::Engine;
use kube::core::Status;
use kube::core::admission::{
    AdmissionRequest, AdmissionResponse, AdmissionReview, META_API_VERSION_V1, META_KIND,
};
use serde::{Deserialize, Serialize};

use crate::slim::SlimNode;

/// Input that is not a usable AdmissionReview.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadInput {
    /// The request uid is known: answer allowed (never block a write because
    /// of our own parsing) with the uid echoed.
    #[error("{reason} (uid {uid})")]
    Answer { uid: String, reason: String },
    /// Not even a uid: the caller gets HTTP 400 with this message.
    #[error("{0}")]
    Reject(String),
}

/// Just enough to find `request.uid` in a review that failed to decode.
#[derive(Deserialize)]
struct UidOnly {
    request: Option<UidRequest>,
}

#[derive(Deserialize)]
struct UidRequest {
    uid: Option<String>,
}

/// Decodes a review body into its request.
pub fn decode_request(body: &[u8]) -> Result<AdmissionRequest<SlimNode>, BadInput> {
    match serde_json::from_slice::<AdmissionReview<SlimNode>>(body) {
        Ok(review) => {
            let types = review.types.clone();
            let Some(req) = review.request else {
                return Err(BadInput::Reject("AdmissionReview has no request".into()));
            };
            if types.api_version != META_API_VERSION_V1 || types.kind != META_KIND {
                return Err(BadInput::Answer {
                    uid: req.uid,
                    reason: format!(
                        "expected {META_API_VERSION_V1} {META_KIND}, got apiVersion {:?} kind {:?}",
                        types.api_version, types.kind
                    ),
                });
            }
            let mut req = req;
            req.types = types;
            Ok(req)
        }
        Err(err) => {
            let reason = format!("malformed AdmissionReview: {err}");
            match serde_json::from_slice::<UidOnly>(body) {
                Ok(UidOnly {
                    request: Some(UidRequest { uid: Some(uid) }),
                }) if !uid.is_empty() => Err(BadInput::Answer { uid, reason }),
                Ok(UidOnly { request: None }) => {
                    Err(BadInput::Reject("AdmissionReview has no request".into()))
                }
                _ => Err(BadInput::Reject(reason)),
            }
        }
    }
}

/// An allowed, untouched answer for a request we could not read.
///
/// kube's `AdmissionResponse` is `non_exhaustive` and built either from a
/// decoded request or by `invalid()` (which denies); start from the latter
/// and turn it into an allow, since nodegate never blocks a write over its
/// own parsing problems.
pub fn allow_uid(uid: String) -> AdmissionResponse {
    let mut r = AdmissionResponse::invalid("");
    r.allowed = true;
    r.result = Status::default();
    r.uid = uid;
    r
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireReview<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: WireResponse<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireResponse<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a Status>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    audit_annotations: &'a HashMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    warnings: Option<&'a [String]>,
}

/// The `admission.k8s.io/v1` AdmissionReview carrying `resp`, as JSON.
pub fn encode_response(resp: &AdmissionResponse) -> Vec<u8> {
    let patch = resp
        .patch
        .as_ref()
        .map(|p| base64::engine::general_purpose::STANDARD.encode(p));
    let wire = WireReview {
        api_version: META_API_VERSION_V1,
        kind: META_KIND,
        response: WireResponse {
            uid: &resp.uid,
            allowed: resp.allowed,
            status: (resp.result != Status::default()).then_some(&resp.result),
            // kube only sets a patch through `with_patch`, always JSONPatch.
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch,
            audit_annotations: &resp.audit_annotations,
            warnings: resp.warnings.as_deref(),
        },
    };
    // Strings, bools and maps of strings always serialize.
    serde_json::to_vec(&wire).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::fixtures::kubelet_create;

    #[test]
    fn bad_input_is_answered_or_rejected_with_a_reason() {
        let good = serde_json::to_vec(&kubelet_create("uid-9", "n1")).unwrap();
        let mut wrong_kind = kubelet_create("uid-9", "n1");
        wrong_kind["kind"] = json!("ConversionReview");
        let mut bad_object = kubelet_create("uid-9", "n1");
        bad_object["request"]["object"]["metadata"]["labels"] = json!(5);
        let mut bad_op = kubelet_create("uid-9", "n1");
        bad_op["request"]["operation"] = json!("EXPLODE");
        let no_request = json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"});
        let cases: Vec<(&str, Vec<u8>, Result<(), &str>)> = vec![
            ("good", good.clone(), Ok(())),
            (
                "wrong kind",
                serde_json::to_vec(&wrong_kind).unwrap(),
                Err("uid:ConversionReview"),
            ),
            (
                "undecodable object",
                serde_json::to_vec(&bad_object).unwrap(),
                Err("uid:malformed"),
            ),
            (
                "unknown operation",
                serde_json::to_vec(&bad_op).unwrap(),
                Err("uid:malformed"),
            ),
            (
                "missing request",
                serde_json::to_vec(&no_request).unwrap(),
                Err("400:no request"),
            ),
            (
                "truncated",
                good[..good.len() / 2].to_vec(),
                Err("400:malformed"),
            ),
            ("not JSON", b"hello".to_vec(), Err("400:malformed")),
            ("empty", Vec::new(), Err("400:malformed")),
            ("null", b"null".to_vec(), Err("400:")),
            ("array", b"[1,2]".to_vec(), Err("400:malformed")),
        ];
        for (name, body, want) in cases {
            match (decode_request(&body), want) {
                (Ok(req), Ok(())) => assert_eq!(req.uid, "uid-9"),
                (Err(BadInput::Answer { uid, reason }), Err(w)) if w.starts_with("uid:") => {
                    assert_eq!(uid, "uid-9", "{name}");
                    assert!(reason.contains(&w[4..]), "{name}: {reason}");
                }
                (Err(BadInput::Reject(reason)), Err(w)) if w.starts_with("400:") => {
                    assert!(reason.contains(&w[4..]), "{name}: {reason}");
                }
                (got, _) => panic!("{name}: unexpected {got:?}"),
            }
        }
    }

    #[test]
    fn allowed_answer_for_unreadable_request_echoes_uid() {
        let out: Value =
            serde_json::from_slice(&encode_response(&allow_uid("u-1".into()))).unwrap();
        assert_eq!(
            out,
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "response": {"uid": "u-1", "allowed": true}})
        );
    }
}
