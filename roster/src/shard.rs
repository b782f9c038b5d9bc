//! The roster's storage format: one ConfigMap per shard.
//!
//! `<roster>-<i>` (label `nodegate.dev/roster=<roster>`; the roster's name
//! is `nodegate-roster` unless configured) holds, under
//! `data["roster.json"]`, `{"version":1,"epoch":E,"shard":i,"shards":S,
//! "nodes":[NodeRecord...]}` sorted by name. A node lives in shard
//! `fnv1a64(name) % S`, so one join or leave rewrites one shard.
//!
//! Completeness: the view is complete when, for the highest epoch present,
//! every shard `0..S` exists with that epoch and that `S`. A publisher that
//! builds a roster from nothing or changes `S` writes a new epoch; until it
//! has written every shard, readers see an incomplete view and prune nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::record::NodeRecord;

/// Label on every shard, its value the roster's name; readers watch by it.
pub const LABEL: &str = "nodegate.dev/roster";
/// The shipped roster's name: shard prefix, label value and Lease name.
pub const DEFAULT_NAME: &str = "nodegate-roster";
pub const DATA_KEY: &str = "roster.json";
/// The only format version this build reads and writes.
pub const VERSION: u64 = 1;
/// A ConfigMap's data may hold 1 MiB (`ValidateConfigMap`); the publisher
/// warns well before, at a quarter of it.
pub const WARN_BYTES: usize = 256 * 1024;

/// One decoded shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub epoch: u64,
    pub index: u32,
    pub count: u32,
    /// By name.
    pub nodes: BTreeMap<String, NodeRecord>,
}

#[derive(Serialize)]
struct BodyOut<'a> {
    version: u64,
    epoch: u64,
    shard: u32,
    shards: u32,
    nodes: Vec<&'a NodeRecord>,
}

#[derive(Deserialize)]
struct BodyIn {
    version: u64,
    epoch: u64,
    shard: u32,
    shards: u32,
    nodes: Vec<NodeRecord>,
}

/// Why a shard ConfigMap cannot be trusted; readers treat it as missing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShardError {
    #[error("name {0:?} is not <roster>-<index>")]
    Name(String),
    #[error("no data key {DATA_KEY:?}")]
    NoData,
    #[error("not valid roster JSON: {0}")]
    Json(String),
    #[error("unknown roster format version {0} (this build reads {VERSION})")]
    Version(u64),
    #[error("shard {index} of {count} is out of range or named for shard {named}")]
    Index { index: u32, count: u32, named: u32 },
    #[error("node {0:?} does not belong in this shard")]
    Misplaced(String),
    #[error("node {0:?} appears twice")]
    Duplicate(String),
}

/// `(epoch, count)` of the newest epoch among `shards` when every shard
/// `0..count` of it is present and they agree on `count`; `None` otherwise.
/// Readers prune only from such a view; a publisher keeps only such an epoch.
pub fn complete_epoch<'a>(shards: impl IntoIterator<Item = &'a Shard>) -> Option<(u64, u32)> {
    let shards: Vec<&Shard> = shards.into_iter().collect();
    let epoch = shards.iter().map(|s| s.epoch).max()?;
    let current: Vec<&&Shard> = shards.iter().filter(|s| s.epoch == epoch).collect();
    let count = current.first()?.count;
    if current.iter().any(|s| s.count != count) {
        return None;
    }
    let mut seen = vec![false; count as usize];
    for s in &current {
        *seen.get_mut(s.index as usize)? = true;
    }
    seen.iter().all(|s| *s).then_some((epoch, count))
}

/// The shard of a node name: FNV-1a 64 (stable across releases and
/// architectures, unlike std's hasher) modulo `count`.
pub fn shard_of(name: &str, count: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(count.max(1))) as u32
}

/// The readers' label selector for roster `roster`.
pub fn selector(roster: &str) -> String {
    format!("{LABEL}={roster}")
}

pub fn name_of(roster: &str, index: u32) -> String {
    format!("{roster}-{index}")
}

/// The index a shard's ConfigMap name carries.
pub fn index_of(roster: &str, name: &str) -> Option<u32> {
    let digits = name.strip_prefix(roster)?.strip_prefix('-')?;
    if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
        return None;
    }
    digits.parse().ok()
}

/// The `roster.json` text of a shard (records sorted by name).
pub fn encode<'a>(
    epoch: u64,
    index: u32,
    count: u32,
    nodes: impl IntoIterator<Item = &'a NodeRecord>,
) -> String {
    let mut nodes: Vec<&NodeRecord> = nodes.into_iter().collect();
    nodes.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    // Plain structs of strings: serialization cannot fail.
    serde_json::to_string(&BodyOut {
        version: VERSION,
        epoch,
        shard: index,
        shards: count,
        nodes,
    })
    .unwrap_or_default()
}

/// The ConfigMap that stores shard `index` of `roster` with body `text`.
pub fn config_map(namespace: &str, roster: &str, index: u32, text: String) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name_of(roster, index)),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([
                (LABEL.to_string(), roster.to_string()),
                (
                    "app.kubernetes.io/part-of".to_string(),
                    "nodegate".to_string(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(DATA_KEY.to_string(), text)])),
        ..ConfigMap::default()
    }
}

/// The shard's text, as stored (for the publisher's "unchanged" check).
pub fn text_of(cm: &ConfigMap) -> Option<&str> {
    cm.data.as_ref()?.get(DATA_KEY).map(String::as_str)
}

/// Decodes and checks a shard: its name, version, index and that every
/// record belongs in it, once. Anything off makes it untrusted.
pub fn decode(roster: &str, cm: &ConfigMap) -> Result<Shard, ShardError> {
    let name = cm.metadata.name.clone().unwrap_or_default();
    let named = index_of(roster, &name).ok_or_else(|| ShardError::Name(name.clone()))?;
    let text = text_of(cm).ok_or(ShardError::NoData)?;
    let body: BodyIn = serde_json::from_str(text).map_err(|e| ShardError::Json(e.to_string()))?;
    if body.version != VERSION {
        return Err(ShardError::Version(body.version));
    }
    if body.count_invalid(named) {
        return Err(ShardError::Index {
            index: body.shard,
            count: body.shards,
            named,
        });
    }
    let mut nodes = BTreeMap::new();
    for n in body.nodes {
        if shard_of(&n.name, body.shards) != body.shard {
            return Err(ShardError::Misplaced(n.name));
        }
        if let Some(dup) = nodes.insert(n.name.clone(), n) {
            return Err(ShardError::Duplicate(dup.name));
        }
    }
    Ok(Shard {
        epoch: body.epoch,
        index: body.shard,
        count: body.shards,
        nodes,
    })
}

impl BodyIn {
    fn count_invalid(&self, named: u32) -> bool {
        self.shards == 0 || self.shard >= self.shards || self.shard != named
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: &str = DEFAULT_NAME;

    pub(crate) fn rec(name: &str, uid: &str) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            uid: uid.into(),
            addresses: vec![],
            pod_cidrs: vec!["198.18.0.0/24".into()],
            provider_id: None,
            boot_id: None,
            labels: Default::default(),
        }
    }

    fn cm(index: u32, text: &str) -> ConfigMap {
        config_map("nodegate", R, index, text.to_string())
    }

    #[test]
    fn shard_of_is_stable_and_spreads() {
        // Pinned: readers and writers of different releases must agree.
        assert_eq!(shard_of("", 16), (0xcbf2_9ce4_8422_2325u64 % 16) as u32);
        assert_eq!(shard_of("node-1", 1), 0);
        let mut counts = [0u32; 16];
        for i in 0..16_000 {
            counts[shard_of(&format!("node-{i}"), 16) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn round_trip() {
        let mut nodes: Vec<NodeRecord> = (0..50)
            .map(|i| rec(&format!("n{i}"), &i.to_string()))
            .filter(|r| shard_of(&r.name, 4) == 2)
            .collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let text = encode(7, 2, 4, nodes.iter().rev());
        let s = decode(R, &cm(2, &text)).unwrap();
        assert_eq!((s.epoch, s.index, s.count), (7, 2, 4));
        assert_eq!(s.nodes.values().cloned().collect::<Vec<_>>(), nodes);
        assert!(text.starts_with("{\"version\":1,\"epoch\":7,\"shard\":2,\"shards\":4,"));
    }

    #[test]
    fn untrusted_shards_are_refused_with_the_reason() {
        let misplaced = (0..20)
            .map(|i| format!("n{i}"))
            .find(|n| shard_of(n, 4) != 1)
            .unwrap();
        let cases: Vec<(ConfigMap, &str)> = vec![
            (
                config_map("nodegate", R, 1, encode(1, 1, 4, [])).tap_name("other"),
                "not <roster>-<index>",
            ),
            (cm(1, "{\"version\":1,"), "not valid roster JSON"),
            (
                cm(
                    1,
                    "{\"version\":2,\"epoch\":1,\"shard\":1,\"shards\":4,\"nodes\":[]}",
                ),
                "version 2",
            ),
            (cm(1, &encode(1, 2, 4, [])), "named for shard 1"),
            (cm(1, &encode(1, 1, 1, [])), "out of range"),
            (cm(0, &encode(1, 0, 0, [])), "out of range"),
            (
                cm(1, &encode(1, 1, 4, [&rec(&misplaced, "u")])),
                "does not belong",
            ),
            (
                ConfigMap {
                    data: None,
                    ..cm(1, "")
                },
                "no data key",
            ),
        ];
        for (c, want) in cases {
            let err = decode(R, &c).unwrap_err().to_string();
            assert!(err.contains(want), "{err} should contain {want}");
        }
        assert_eq!(index_of(R, "nodegate-roster-01"), None);
        assert_eq!(index_of(R, "nodegate-roster-10"), Some(10));
    }

    #[test]
    fn duplicate_records_are_refused() {
        let n = (0..20)
            .map(|i| format!("n{i}"))
            .find(|n| shard_of(n, 2) == 0)
            .unwrap();
        let text = encode(1, 0, 2, [&rec(&n, "a"), &rec(&n, "b")]);
        assert_eq!(
            decode(R, &cm(0, &text)).unwrap_err(),
            ShardError::Duplicate(n.clone())
        );
    }

    trait TapName {
        fn tap_name(self, name: &str) -> Self;
    }
    impl TapName for ConfigMap {
        fn tap_name(mut self, name: &str) -> Self {
            self.metadata.name = Some(name.into());
            self
        }
    }
}
