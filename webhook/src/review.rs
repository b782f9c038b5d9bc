//! AdmissionReview bytes in and out.
//!
//! Decoding is kube's `AdmissionReview` with serde_json, the Node read as the
//! workspace's [`NodeView`] (serde skips images, conditions and the rest of a
//! 25 KB kubelet object). Encoding writes the `admission.k8s.io/v1` answer
//! with the patch as a base64 string: Go encodes `[]byte` that way and the API
//! server expects it, while kube's `AdmissionResponse` serializes it as an
//! array of numbers.

use base64::Engine;
use kube::core::admission::{AdmissionReview, META_API_VERSION_V1, META_KIND};
use nodegate_shared::NodeView;
use serde::{Deserialize, Serialize};

use crate::rules::{Added, Request};

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
pub fn decode(body: &[u8]) -> Result<Request, BadInput> {
    match serde_json::from_slice::<AdmissionReview<NodeView>>(body) {
        Ok(review) => {
            let Some(req) = review.request else {
                return Err(BadInput::Reject("AdmissionReview has no request".into()));
            };
            let types = &review.types;
            if types.api_version != META_API_VERSION_V1 || types.kind != META_KIND {
                return Err(BadInput::Answer {
                    reason: format!(
                        "expected {META_API_VERSION_V1} {META_KIND}, got apiVersion {:?} kind {:?}",
                        types.api_version, types.kind
                    ),
                    uid: req.uid,
                });
            }
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

/// The answer as the API server reads it (Go's field names and encodings).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Answer<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: Response<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Response<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    warnings: Option<Vec<String>>,
}

/// The `admission.k8s.io/v1` AdmissionReview answering `uid`: allowed, with
/// the patch and one warning per taint when taints are added.
pub fn encode(uid: &str, added: Option<&Added>) -> Vec<u8> {
    let patch = added.map(|a| {
        // A `Patch` of plain JSON values always serializes.
        let json = serde_json::to_vec(&a.patch).unwrap_or_default();
        base64::engine::general_purpose::STANDARD.encode(json)
    });
    let answer = Answer {
        api_version: META_API_VERSION_V1,
        kind: META_KIND,
        response: Response {
            uid,
            allowed: true,
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch,
            warnings: added.map(Added::warnings),
        },
    };
    // Strings and booleans only: serializing cannot fail.
    serde_json::to_vec(&answer).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use kube::core::DynamicObject;
    use serde_json::{Value, json};

    use super::*;
    use crate::fixtures::{kubelet_create, kubelet_node, review, with_taints};
    use crate::rules::Rules;
    use nodegate_shared::keys::DEFAULT_TAINT;

    #[test]
    fn bad_input_is_answered_or_rejected_with_a_reason() {
        let good = serde_json::to_vec(&kubelet_create("uid-9", "n1")).unwrap();
        let mut wrong_kind = kubelet_create("uid-9", "n1");
        wrong_kind["kind"] = json!("ConversionReview");
        let mut bad_object = kubelet_create("uid-9", "n1");
        bad_object["request"]["object"]["metadata"]["labels"] = json!(5);
        let mut bad_label = kubelet_create("uid-9", "n1");
        bad_label["request"]["object"]["metadata"]["labels"]["a"] = json!(5);
        let mut bad_op = kubelet_create("uid-9", "n1");
        bad_op["request"]["operation"] = json!("EXPLODE");
        let mut no_user = kubelet_create("uid-9", "n1");
        no_user["request"]
            .as_object_mut()
            .unwrap()
            .remove("userInfo");
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
                "label value not a string",
                serde_json::to_vec(&bad_label).unwrap(),
                Err("uid:malformed"),
            ),
            (
                "unknown operation",
                serde_json::to_vec(&bad_op).unwrap(),
                Err("uid:malformed"),
            ),
            (
                "no userInfo (kube requires it)",
                serde_json::to_vec(&no_user).unwrap(),
                Err("uid:userInfo"),
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
            match (decode(&body), want) {
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
    fn odd_taint_entries_and_null_maps_are_not_errors() {
        let node = with_taints(
            kubelet_node("n1", "boot-1", 2),
            json!([{"key": "a", "effect": "NoSchedule"}, "junk", 3, null, [1, {"key": "b"}],
                   {"key": 5, "effect": ["NoSchedule"]}]),
        );
        let body = serde_json::to_vec(&review("u", "CREATE", None, "x", node, None, true)).unwrap();
        let req = decode(&body).unwrap();
        assert!(req.dry_run);
        assert_eq!(req.object.unwrap().taints().len(), 6);
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{
            "uid":"u","kind":{"group":"","version":"v1","kind":"Node"},"resource":{"group":"","version":"v1","resource":"nodes"},
            "operation":"UPDATE","userInfo":{},"options":{"a":[1,{"b":"\u0000"}]},
            "object":{"metadata":{"labels":null,"annotations":null},"spec":{"taints":null}},
            "oldObject":null}}"#;
        let req = decode(body).unwrap();
        let node = req.object.as_ref().unwrap();
        assert!(node.has_spec() && node.taints().is_empty());
        assert!(req.old_object.is_none());
    }

    #[test]
    fn allowed_answer_echoes_the_uid_and_nothing_else() {
        let out: Value = serde_json::from_slice(&encode("u-\"1\"", None)).unwrap();
        assert_eq!(
            out,
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "response": {"uid": "u-\"1\"", "allowed": true}})
        );
    }

    /// kube's `AdmissionReview<DynamicObject>` reads our answers. kube's own
    /// `Deserialize` wants `patch` as a byte array and a `status` object,
    /// while the API server gets Go's form (base64 string, `status` omitted
    /// when allowed); those two are converted, everything else must decode
    /// as is.
    #[test]
    fn answers_decode_as_kube_admission_reviews() {
        let rules = Rules::new(vec![DEFAULT_TAINT.parse().unwrap()]).unwrap();
        let body = serde_json::to_vec(&kubelet_create("uid-7", "n1")).unwrap();
        let req = decode(&body).unwrap();
        let d = rules.review(&req);
        let added = d.added.as_ref().expect("a create is patched");
        let patch_bytes = serde_json::to_vec(&added.patch).unwrap();
        for (bytes, patched) in [
            (encode(&req.uid, Some(added)), true),
            (encode(&req.uid, None), false),
        ] {
            let mut v: Value = serde_json::from_slice(&bytes).unwrap();
            let resp = v["response"].as_object_mut().unwrap();
            assert!(!resp.contains_key("status"));
            assert_eq!(resp.contains_key("patchType"), patched);
            resp.insert("status".into(), json!({}));
            if let Some(p) = resp.get_mut("patch") {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(p.as_str().expect("patch is a base64 string"))
                    .unwrap();
                *p = json!(raw);
            }
            let kube: AdmissionReview<DynamicObject> = serde_json::from_value(v).unwrap();
            assert_eq!(kube.types.api_version, META_API_VERSION_V1);
            assert_eq!(kube.types.kind, META_KIND);
            let resp = kube.response.unwrap();
            assert_eq!(resp.uid, "uid-7");
            assert!(resp.allowed);
            assert_eq!(
                resp.patch.as_deref(),
                patched.then_some(patch_bytes.as_slice())
            );
            let warnings = resp.warnings.unwrap_or_default();
            assert_eq!(warnings.len(), usize::from(patched));
            if patched {
                assert!(warnings[0].contains(DEFAULT_TAINT) && warnings[0].contains("new node"));
            }
        }
    }
}
