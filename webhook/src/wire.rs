//! AdmissionReview bytes in and out.
//!
//! Decoding borrows from the request body and keeps only what the rules read:
//! a kubelet CREATE is ~25 KB (images, conditions, managedFields) and
//! building owned maps and strings for it was most of the webhook's own CPU.
//! Strings are `Cow`: borrowed unless the JSON string has escapes. Labels and
//! annotations are never collected: only the values of `nodegate.dev/exclude`
//! and `nodegate.dev/ready-boot-id` are kept. kube's
//! `AdmissionReview<SlimNode>` remains the contract; the rule tests check this
//! decoder reaches the same decisions on every fixture.
//!
//! Encoding writes the `admission.k8s.io/v1` answer directly: the patch as a
//! base64 string (Go's encoding of `[]byte`, which the API server expects;
//! kube's `Serialize` writes an array of numbers), and the pre-serialized
//! rest of the answer from [`crate::patches`].

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use kube::core::admission::{META_API_VERSION_V1, META_KIND, Operation};
use nodegate_shared::TaintSpec;
use nodegate_shared::keys::{EXCLUDE_LABEL, READY_BOOT_ID_ANNOTATION};
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::patches::Prepared;

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

/// The top level of an AdmissionReview, as far as nodegate reads it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Review<'a> {
    #[serde(borrow)]
    pub(crate) api_version: Cow<'a, str>,
    #[serde(borrow)]
    pub(crate) kind: Cow<'a, str>,
    #[serde(default, borrow)]
    pub(crate) request: Option<Request<'a>>,
}

/// An admission request: the fields the rules and the log line read.
///
/// Required fields are the ones kube's `AdmissionRequest` requires (`uid`,
/// `kind`, `resource`, `operation`, `userInfo`), so a review kube refuses is
/// refused here too. `options`, `requestKind` and the like are skipped.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request<'a> {
    #[serde(borrow)]
    pub uid: Cow<'a, str>,
    #[serde(borrow)]
    pub kind: Gvk<'a>,
    #[allow(dead_code, reason = "required like kube's, never read")]
    pub(crate) resource: IgnoredAny,
    #[serde(default, borrow, deserialize_with = "opt_str")]
    pub sub_resource: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub name: Cow<'a, str>,
    pub operation: Operation,
    #[serde(borrow)]
    pub user_info: UserInfo<'a>,
    #[serde(default, borrow)]
    pub object: Option<Node<'a>>,
    #[serde(default, borrow)]
    pub old_object: Option<Node<'a>>,
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Deserialize)]
pub struct Gvk<'a> {
    #[serde(borrow)]
    pub group: Cow<'a, str>,
    #[serde(borrow)]
    pub version: Cow<'a, str>,
    #[serde(borrow)]
    pub kind: Cow<'a, str>,
}

#[derive(Debug, Default, Deserialize)]
pub struct UserInfo<'a> {
    #[serde(default, borrow, deserialize_with = "opt_str")]
    pub username: Option<Cow<'a, str>>,
}

/// A Node as far as the rules read it.
#[derive(Debug, Default, Deserialize)]
pub struct Node<'a> {
    #[serde(default, borrow)]
    pub metadata: Meta<'a>,
    #[serde(default, borrow)]
    pub spec: Option<Spec<'a>>,
    #[serde(default, borrow)]
    pub status: Option<Status<'a>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta<'a> {
    #[serde(default, borrow, deserialize_with = "opt_str")]
    pub name: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "opt_str")]
    pub resource_version: Option<Cow<'a, str>>,
    /// The value of `nodegate.dev/exclude`, if labelled.
    #[serde(default, rename = "labels", deserialize_with = "exclude_label")]
    pub exclude: Option<Cow<'a, str>>,
    /// The value of `nodegate.dev/ready-boot-id`, if annotated.
    #[serde(default, rename = "annotations", deserialize_with = "ready_boot_id")]
    pub ready_boot_id: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Spec<'a> {
    #[serde(default, borrow)]
    pub taints: Option<Vec<Taint<'a>>>,
}

/// One entry of `spec.taints`: only what identifies it (key + effect).
///
/// Any JSON is accepted as an entry, as when taints were decoded as raw
/// `serde_json::Value`s; a key or effect that is not a string matches nothing.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Taint<'a> {
    pub key: Option<Cow<'a, str>>,
    pub effect: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status<'a> {
    #[serde(default, borrow)]
    pub node_info: Option<NodeInfo<'a>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct NodeInfo<'a> {
    #[serde(default, borrow, rename = "bootID", deserialize_with = "opt_str")]
    pub boot_id: Option<Cow<'a, str>>,
}

impl Node<'_> {
    pub fn name(&self) -> Option<&str> {
        self.metadata.name.as_deref()
    }

    /// `nodegate.dev/exclude=true` opts a node out of everything.
    pub fn is_excluded(&self) -> bool {
        self.metadata.exclude.as_deref() == Some("true")
    }

    /// The bootID the kubelet reports, if non-empty.
    pub fn boot_id(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .and_then(|i| i.boot_id.as_deref())
            .filter(|b| !b.is_empty())
    }

    /// The bootID the agent recorded when it removed the taint.
    pub fn ready_boot_id(&self) -> Option<&str> {
        self.metadata.ready_boot_id.as_deref()
    }

    pub fn has_spec(&self) -> bool {
        self.spec.is_some()
    }

    /// Whether `spec.taints` is present (possibly empty).
    pub fn has_taints_array(&self) -> bool {
        self.spec.as_ref().is_some_and(|s| s.taints.is_some())
    }

    /// The taints, or none when `spec` or `spec.taints` is absent.
    pub fn taints(&self) -> &[Taint<'_>] {
        self.spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or(&[])
    }

    /// Whether the node carries `spec` (same key and effect).
    pub fn has_taint(&self, spec: &TaintSpec) -> bool {
        self.taints().iter().any(|t| {
            t.key.as_deref() == Some(spec.key())
                && t.effect.as_deref() == Some(spec.effect().as_str())
        })
    }
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

/// Which decoder read a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoder {
    /// [`crate::scan`]: compact JSON as the API server writes it.
    Fast,
    /// serde_json: everything the fast reader cannot vouch for.
    Serde,
}

/// Decodes a review body into its request, borrowing from `body`.
pub fn decode_request(body: &[u8]) -> Result<Request<'_>, BadInput> {
    decode_request_with(body).0
}

/// [`decode_request`], and which decoder read the body: the fast reader when
/// it can vouch for the body, else serde_json (which also explains what is
/// wrong with bad input).
pub fn decode_request_with(body: &[u8]) -> (Result<Request<'_>, BadInput>, Decoder) {
    match crate::scan::review(body) {
        Some(review) => (checked(Ok(review), body), Decoder::Fast),
        None => (
            checked(serde_json::from_slice::<Review<'_>>(body), body),
            Decoder::Serde,
        ),
    }
}

/// The request of a decoded review, or why there is none.
fn checked<'a>(
    review: Result<Review<'a>, serde_json::Error>,
    body: &[u8],
) -> Result<Request<'a>, BadInput> {
    match review {
        Ok(review) => {
            let Some(req) = review.request else {
                return Err(BadInput::Reject("AdmissionReview has no request".into()));
            };
            if review.api_version != META_API_VERSION_V1 || review.kind != META_KIND {
                return Err(BadInput::Answer {
                    uid: req.uid.into_owned(),
                    reason: format!(
                        "expected {META_API_VERSION_V1} {META_KIND}, got apiVersion {:?} kind {:?}",
                        review.api_version, review.kind
                    ),
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

/// Everything of an answer before the uid's JSON string.
const HEAD: &[u8] =
    br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"#;
/// The rest of an answer that allows without a patch.
pub(crate) const ALLOW_TAIL: &[u8] = br#","allowed":true}}"#;

/// The `admission.k8s.io/v1` AdmissionReview answering `uid`: allowed, with
/// the prepared patch and warnings if any.
pub fn encode_response(uid: &str, patch: Option<&Prepared>) -> Vec<u8> {
    let tail = patch.map_or(ALLOW_TAIL, Prepared::answer_tail);
    let mut out = Vec::with_capacity(HEAD.len() + uid.len() + 2 + tail.len());
    out.extend_from_slice(HEAD);
    write_json_str(&mut out, uid);
    out.extend_from_slice(tail);
    out
}

/// `s` as a JSON string (quoted and escaped).
pub(crate) fn write_json_str(out: &mut Vec<u8>, s: &str) {
    // Writing a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// A string borrowed from the input when it has no escapes.
struct Str<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Str<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// An optional string, borrowed when it has no escapes. serde's own
/// `Option<Cow<str>>` always copies: `#[serde(borrow)]` only borrows a
/// bare `Cow`.
fn opt_str<'de: 'a, 'a, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'a, str>>, D::Error> {
    Ok(Option::<Str<'de>>::deserialize(d)?.map(|s| s.0))
}

/// A string whose content is not needed: checked to be a string (as a
/// `BTreeMap<String, String>` would), never copied.
struct AnyString;

impl<'de> Deserialize<'de> for AnyString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = AnyString;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(AnyString)
            }
        }
        d.deserialize_str(V)
    }
}

/// The value under `key` in a map of strings (or null), skipping every other
/// entry. Other values must still be strings, as labels and annotations are.
fn pick<'de, D: Deserializer<'de>>(
    d: D,
    key: &'static str,
) -> Result<Option<Cow<'de, str>>, D::Error> {
    struct V<'de>(&'static str, PhantomData<&'de ()>);
    impl<'de> Visitor<'de> for V<'de> {
        type Value = Option<Cow<'de, str>>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map of strings or null")
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(Str(k)) = map.next_key::<Str<'de>>()? {
                if k == self.0 {
                    // Last one wins, as in a map.
                    found = Some(map.next_value::<Str<'de>>()?.0);
                } else {
                    map.next_value::<AnyString>()?;
                }
            }
            Ok(found)
        }
    }
    d.deserialize_option(V(key, PhantomData))
}

fn exclude_label<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    pick(d, EXCLUDE_LABEL)
}

fn ready_boot_id<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    pick(d, READY_BOOT_ID_ANNOTATION)
}

/// Any JSON value: `Some` with the text when it is a string.
struct MaybeStr<'a>(Option<Cow<'a, str>>);

impl<'de> Deserialize<'de> for MaybeStr<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MaybeStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(MaybeStr(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(MaybeStr(Some(Cow::Owned(v.to_owned()))))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(MaybeStr(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(MaybeStr(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(MaybeStr(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(MaybeStr(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(MaybeStr(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                IgnoredAny.visit_seq(seq).map(|_| MaybeStr(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                IgnoredAny.visit_map(map).map(|_| MaybeStr(None))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Taint<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Taint<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a taint")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut taint = Taint::default();
                while let Some(Str(k)) = map.next_key::<Str<'de>>()? {
                    match k.as_ref() {
                        "key" => taint.key = map.next_value::<MaybeStr<'de>>()?.0,
                        "effect" => taint.effect = map.next_value::<MaybeStr<'de>>()?.0,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(taint)
            }
            // Anything else is an entry that matches no taint.
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Taint::default())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Taint::default())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Taint::default())
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Taint::default())
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Taint::default())
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Taint::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                IgnoredAny.visit_seq(seq).map(|_| Taint::default())
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use kube::core::DynamicObject;
    use kube::core::admission::AdmissionReview;
    use serde_json::{Value, json};

    use super::*;
    use crate::fixtures::{kubelet_create, kubelet_node, review, with_annotation, with_taints};
    use crate::rules::Rules;

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
            // kube's decoder agrees on what is decodable.
            let kube_ok = serde_json::from_slice::<AdmissionReview<DynamicObject>>(&body)
                .is_ok_and(|r| r.request.is_some() && r.types.kind == META_KIND);
            assert_eq!(kube_ok, want.is_ok(), "{name}: kube disagrees");
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

    /// The API server's compact JSON takes the fast reader; the same review
    /// pretty-printed goes to serde_json; both read the same request.
    #[test]
    fn both_decoders_read_the_same_request() {
        let review = kubelet_create("uid-5", "n1");
        let compact = serde_json::to_vec(&review).unwrap();
        let pretty = serde_json::to_vec_pretty(&review).unwrap();
        let (fast, by) = decode_request_with(&compact);
        assert_eq!(by, Decoder::Fast);
        let (slow, by) = decode_request_with(&pretty);
        assert_eq!(by, Decoder::Serde);
        assert_eq!(
            format!("{:?}", fast.unwrap()),
            format!("{:?}", slow.unwrap())
        );
        // Bad input is explained by serde_json, whoever looked first.
        let bad_op = String::from_utf8(compact)
            .unwrap()
            .replace("\"CREATE\"", "\"EXPLODE\"");
        let (bad, by) = decode_request_with(bad_op.as_bytes());
        assert_eq!(by, Decoder::Serde);
        assert!(matches!(bad, Err(BadInput::Answer { uid, .. }) if uid == "uid-5"));
    }

    #[test]
    fn allowed_answer_for_unreadable_request_echoes_uid() {
        let out: Value = serde_json::from_slice(&encode_response("u-\"1\"", None)).unwrap();
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
        let rules =
            Rules::new(vec![nodegate_shared::keys::DEFAULT_TAINT.parse().unwrap()]).unwrap();
        let body = serde_json::to_vec(&kubelet_create("uid-7", "n1")).unwrap();
        let req = decode_request(&body).unwrap();
        let d = rules.review(&req);
        let prepared = d.patch.as_deref().expect("a create is patched");
        for (bytes, patched) in [
            (encode_response(&req.uid, Some(prepared)), true),
            (encode_response(&req.uid, None), false),
        ] {
            let mut v: Value = serde_json::from_slice(&bytes).unwrap();
            let resp = v["response"].as_object_mut().unwrap();
            assert!(!resp.contains_key("status"));
            resp.insert("status".into(), json!({}));
            if let Some(p) = resp.get_mut("patch") {
                let raw = base64::Engine::decode(
                    &base64::engine::general_purpose::STANDARD,
                    p.as_str().unwrap(),
                )
                .unwrap();
                *p = json!(raw);
            }
            let kube: AdmissionReview<DynamicObject> = serde_json::from_value(v).unwrap();
            assert_eq!(kube.types.api_version, META_API_VERSION_V1);
            assert_eq!(kube.types.kind, META_KIND);
            let resp = kube.response.unwrap();
            assert_eq!(resp.uid, "uid-7");
            assert!(resp.allowed);
            assert_eq!(resp.patch.as_deref(), patched.then_some(prepared.patch()));
            assert_eq!(resp.warnings.map(|w| w.len()), patched.then_some(1));
        }
    }

    #[test]
    fn borrows_strings_picks_two_keys_and_tolerates_odd_taints() {
        let mut node = with_annotation(
            kubelet_node("n\\1", "boot-1", 2),
            READY_BOOT_ID_ANNOTATION,
            "x/y",
        );
        node = with_taints(
            node,
            json!([{"key": "a", "effect": "NoSchedule"}, "junk", 3, null, [1, {"key": "b"}],
                   {"key": 5, "effect": ["NoSchedule"]}, {"key": "node.cilium.io/agent-not-ready",
                   "value": "true", "effect": "NoSchedule", "timeAdded": null}]),
        );
        node["metadata"]["labels"][EXCLUDE_LABEL] = json!("false");
        let rv = review("uid-1", "CREATE", None, "system:node:n1", node, None, true);
        let body = serde_json::to_vec(&rv).unwrap();
        let req = decode_request(&body).unwrap();
        assert!(matches!(req.uid, Cow::Borrowed("uid-1")));
        assert!(req.dry_run);
        assert_eq!(req.operation, Operation::Create);
        let node = req.object.as_ref().unwrap();
        assert_eq!(node.name(), Some("n\\1"), "escaped string is decoded");
        assert!(matches!(node.metadata.name, Some(Cow::Owned(_))));
        // Strings without escapes are not copied, optional ones included.
        assert!(matches!(req.user_info.username, Some(Cow::Borrowed(_))));
        let boot = node.status.as_ref().and_then(|s| s.node_info.as_ref());
        assert!(matches!(
            boot.and_then(|i| i.boot_id.as_ref()),
            Some(Cow::Borrowed(_))
        ));
        assert!(matches!(
            node.metadata.ready_boot_id,
            Some(Cow::Borrowed(_))
        ));
        assert_eq!(node.ready_boot_id(), Some("x/y"));
        assert_eq!(node.metadata.exclude.as_deref(), Some("false"));
        assert!(!node.is_excluded());
        assert_eq!(node.boot_id(), Some("boot-1"));
        assert_eq!(node.taints().len(), 7);
        let t: Vec<TaintSpec> = [
            "a:NoSchedule",
            "b:NoSchedule",
            "node.cilium.io/agent-not-ready:NoSchedule",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        assert!(node.has_taint(&t[0]));
        assert!(!node.has_taint(&t[1]));
        assert!(node.has_taint(&t[2]));
        // null labels/annotations/spec.taints are absent, not errors.
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{
            "uid":"u","kind":{"group":"","version":"v1","kind":"Node"},"resource":{},
            "operation":"UPDATE","userInfo":{},"options":{"a":[1,{"b":"\u0000"}]},
            "object":{"metadata":{"labels":null,"annotations":null},"spec":{"taints":null}},
            "oldObject":null}}"#;
        let req = decode_request(body).unwrap();
        let node = req.object.as_ref().unwrap();
        assert!(node.has_spec() && !node.has_taints_array());
        assert!(req.old_object.is_none());
    }
}
