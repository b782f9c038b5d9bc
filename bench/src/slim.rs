//! A reference decoder for the webhook's hot path, measured by `micro --step
//! slim`: every field the rules read, borrowed from the body (no copy unless
//! the JSON string has escapes), and nothing else. Labels and annotations
//! are never collected into maps: only the two keys nodegate reads are kept.
//!
//! It lives here as a measured suggestion for `webhook/` (see README); the
//! tests check it extracts the same facts as the webhook's own decoder.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use nodegate_shared::keys::{EXCLUDE_LABEL, READY_BOOT_ID_ANNOTATION};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Review<'a> {
    #[serde(borrow)]
    pub api_version: Cow<'a, str>,
    #[serde(borrow)]
    pub kind: Cow<'a, str>,
    #[serde(borrow)]
    pub request: Option<Request<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request<'a> {
    #[serde(borrow)]
    pub uid: Cow<'a, str>,
    #[serde(borrow)]
    pub kind: Gvk<'a>,
    #[serde(default, borrow)]
    pub sub_resource: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub operation: Cow<'a, str>,
    #[serde(default, borrow)]
    pub user_info: UserInfo<'a>,
    #[serde(default, borrow)]
    pub object: Option<Node<'a>>,
    #[serde(default, borrow)]
    pub old_object: Option<Node<'a>>,
    #[serde(default)]
    pub dry_run: Option<bool>,
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
    #[serde(default, borrow)]
    pub username: Option<Cow<'a, str>>,
}

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
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
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

/// A taint as stored; `timeAdded` is not needed to match key + effect.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Taint<'a> {
    #[serde(borrow)]
    pub key: Cow<'a, str>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub value: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub effect: Cow<'a, str>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status<'a> {
    #[serde(default, borrow)]
    pub node_info: Option<NodeInfo<'a>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct NodeInfo<'a> {
    #[serde(default, borrow, rename = "bootID")]
    pub boot_id: Option<Cow<'a, str>>,
}

/// Decodes a review body.
pub fn decode(body: &[u8]) -> serde_json::Result<Review<'_>> {
    serde_json::from_slice(body)
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

/// The value under `key` in a string map (or null), skipping every other entry.
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
                    found = Some(map.next_value::<Str<'de>>()?.0);
                } else {
                    map.next_value::<IgnoredAny>()?;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::fixtures::{Workload, uid, workload};

    /// Same facts as the webhook's decoder, for both fixtures.
    #[test]
    fn agrees_with_the_webhook_decoder() {
        for f in workload(Workload::Mix) {
            let body = f.body(&uid(1, 2));
            let slim = decode(&body).unwrap();
            let req = slim.request.unwrap();
            let theirs = nodegate_webhook::wire::decode_request(&body).unwrap();
            assert_eq!(slim.api_version, "admission.k8s.io/v1");
            assert_eq!(req.uid, theirs.uid);
            assert!(matches!(req.uid, Cow::Borrowed(_)), "uid is borrowed");
            assert_eq!(req.kind.kind, theirs.kind.kind);
            assert_eq!(req.sub_resource.as_deref(), theirs.sub_resource.as_deref());
            assert_eq!(
                req.user_info.username.as_deref(),
                theirs.user_info.username.as_deref()
            );
            assert_eq!(req.dry_run.unwrap_or(false), theirs.dry_run);
            let pairs = [
                (req.object.as_ref(), theirs.object.as_ref()),
                (req.old_object.as_ref(), theirs.old_object.as_ref()),
            ];
            for (mine, theirs) in pairs {
                let (Some(mine), Some(theirs)) = (mine, theirs) else {
                    assert!(mine.is_none() && theirs.is_none());
                    continue;
                };
                let v = &theirs.view;
                assert_eq!(mine.metadata.name.as_deref(), v.name());
                assert_eq!(mine.metadata.ready_boot_id.as_deref(), v.ready_boot_id());
                assert_eq!(
                    mine.metadata.exclude.as_deref() == Some("true"),
                    v.is_excluded()
                );
                let boot = mine
                    .status
                    .as_ref()
                    .and_then(|s| s.node_info.as_ref())
                    .and_then(|i| i.boot_id.as_deref());
                assert_eq!(boot, v.boot_id());
                let taints = mine
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .map_or(0, Vec::len);
                assert_eq!(taints, v.taints().len());
            }
        }
    }

    #[test]
    fn picks_only_the_wanted_keys_and_tolerates_null_and_escapes() {
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{
            "uid":"u\u0031","kind":{"group":"","version":"v1","kind":"Node"},"operation":"CREATE",
            "object":{"metadata":{"name":"n","labels":null,
              "annotations":{"a":"b","nodegate.dev/ready-boot-id":"x\/y","c":{"nested":[1,2]}}}}}}"#;
        let r = decode(body).unwrap().request.unwrap();
        assert_eq!(r.uid, "u1");
        let meta = r.object.unwrap().metadata;
        assert_eq!(meta.exclude, None);
        assert_eq!(meta.ready_boot_id.as_deref(), Some("x/y"));
        assert!(decode(br#"{"apiVersion":"v","kind":"k","request":{"uid":3}}"#).is_err());
    }
}
