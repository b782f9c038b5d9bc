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
//!
//! Anyone who can write a ConfigMap in the namespace can write a shard, so
//! decoding refuses whatever no publisher writes: more than [`MAX_SHARDS`]
//! shards, an epoch ahead of the reader's clock by more than
//! [`MAX_EPOCH_AHEAD_SECS`] (a publisher's new epoch is its Unix time, see
//! `publisher::choose_epoch`), records whose name, uid, addresses or CIDRs
//! are not what the API server accepts, and labels or boot IDs (dropped by
//! `NodeRecord::for_roster`). Decoding is not trust: a valid shard can still
//! lie, which is why an agent confirms every deletion with the API server.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

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
/// Most shards a roster may have (`--shards` is bounded by it): ~700 nodes
/// per shard fit 700,000 nodes, and a reader allocates per shard index.
pub const MAX_SHARDS: u32 = 1024;
/// How far ahead of a reader's clock an epoch may be. A publisher starts an
/// epoch at its own Unix time (never more than half of this ahead, see
/// [`PUBLISHER_EPOCH_AHEAD_SECS`]), so the rest is room for clock skew.
pub const MAX_EPOCH_AHEAD_SECS: u64 = 600;
/// A publisher builds only on epochs at most this far ahead of its clock;
/// anything later was not written by a publisher and is replaced.
pub const PUBLISHER_EPOCH_AHEAD_SECS: u64 = MAX_EPOCH_AHEAD_SECS / 2;
/// Longest uid accepted (the API server's are 36-character UUIDs).
const MAX_UID: usize = 128;
/// Longest providerID accepted.
const MAX_PROVIDER_ID: usize = 1024;
/// Most addresses or podCIDRs per record (a Node has a handful).
const MAX_LIST: usize = 32;

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
    #[error("{0} shards: more than the {MAX_SHARDS} a publisher writes")]
    Count(u32),
    #[error(
        "epoch {epoch} is not one a publisher writes (1 up to {MAX_EPOCH_AHEAD_SECS} s past now = {now})"
    )]
    Epoch { epoch: u64, now: u64 },
    #[error("record {name:?} is invalid: {reason}")]
    Record { name: String, reason: String },
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// True for an epoch a publisher could have written, as seen at `now`.
pub fn epoch_plausible(epoch: u64, now: u64) -> bool {
    epoch >= 1 && epoch <= now.saturating_add(MAX_EPOCH_AHEAD_SECS)
}

/// A DNS-1123 subdomain, as the API server requires of Node names.
pub fn is_dns_subdomain(s: &str) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    !s.is_empty() && s.len() <= 253 && s.split('.').all(label_ok)
}

fn is_cidr(s: &str) -> bool {
    let Some((ip, bits)) = s.split_once('/') else {
        return false;
    };
    let Ok(ip) = ip.parse::<IpAddr>() else {
        return false;
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    !bits.is_empty()
        && bits.len() <= 3
        && bits.bytes().all(|b| b.is_ascii_digit())
        && bits.parse::<u8>().is_ok_and(|b| b <= max)
}

/// Why a record could not have come from a publisher (its fields end up in a
/// deletion handler's environment and arguments), or `None`.
pub fn record_problem(r: &NodeRecord) -> Option<String> {
    if !is_dns_subdomain(&r.name) {
        return Some("name is not a DNS-1123 subdomain".into());
    }
    if r.uid.is_empty()
        || r.uid.len() > MAX_UID
        || !r
            .uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Some("uid is not a Kubernetes uid".into());
    }
    if r.addresses.len() > MAX_LIST || r.pod_cidrs.len() > MAX_LIST {
        return Some("too many addresses or podCIDRs".into());
    }
    for a in &r.addresses {
        let kind_ok = !a.kind.is_empty()
            && a.kind.len() <= 32
            && a.kind.bytes().all(|b| b.is_ascii_alphanumeric());
        let addr_ok = a.address.parse::<IpAddr>().is_ok()
            || (!a.kind.ends_with("IP") && is_dns_subdomain(&a.address.to_ascii_lowercase()));
        if !kind_ok || !addr_ok {
            return Some(format!("address {:?} ({:?}) is invalid", a.address, a.kind));
        }
    }
    if let Some(c) = r.pod_cidrs.iter().find(|c| !is_cidr(c)) {
        return Some(format!("podCIDR {c:?} is not a CIDR"));
    }
    if let Some(p) = &r.provider_id
        && (p.is_empty() || p.len() > MAX_PROVIDER_ID || p.chars().any(char::is_control))
    {
        return Some("providerID is empty, too long or has control characters".into());
    }
    if r.boot_id.is_some() || !r.labels.is_empty() {
        return Some("carries a boot ID or labels, which a publisher drops".into());
    }
    None
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

/// Decodes and checks a shard against the clock: [`decode_at`] now.
pub fn decode(roster: &str, cm: &ConfigMap) -> Result<Shard, ShardError> {
    decode_at(roster, cm, unix_now())
}

/// Decodes and checks a shard: its name, version, shard count, index and
/// epoch (as seen at Unix time `now`), and that every record is valid and
/// belongs in it, once. Anything off makes it untrusted.
pub fn decode_at(roster: &str, cm: &ConfigMap, now: u64) -> Result<Shard, ShardError> {
    let name = cm.metadata.name.clone().unwrap_or_default();
    let named = index_of(roster, &name).ok_or_else(|| ShardError::Name(name.clone()))?;
    let text = text_of(cm).ok_or(ShardError::NoData)?;
    let body: BodyIn = serde_json::from_str(text).map_err(|e| ShardError::Json(e.to_string()))?;
    if body.version != VERSION {
        return Err(ShardError::Version(body.version));
    }
    if body.shards > MAX_SHARDS {
        return Err(ShardError::Count(body.shards));
    }
    if body.count_invalid(named) {
        return Err(ShardError::Index {
            index: body.shard,
            count: body.shards,
            named,
        });
    }
    if !epoch_plausible(body.epoch, now) {
        return Err(ShardError::Epoch {
            epoch: body.epoch,
            now,
        });
    }
    let mut nodes = BTreeMap::new();
    for n in body.nodes {
        if let Some(reason) = record_problem(&n) {
            // Bounded: the name itself may be the attack.
            let name = n.name.chars().take(64).collect();
            return Err(ShardError::Record { name, reason });
        }
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

    const NOW: u64 = 1_800_000_000;

    fn raw(index: u32, body: serde_json::Value) -> ConfigMap {
        cm(index, &body.to_string())
    }

    /// What a namespace editor (or the roster's own token) can write, and
    /// why each is refused.
    #[test]
    fn poisoned_shards_are_refused() {
        use serde_json::json;
        let ok = |nodes: serde_json::Value| json!({"version":1,"epoch":NOW,"shard":0,"shards":1,"nodes":nodes});
        let node = |extra: serde_json::Value| {
            let mut n = json!({"name":"n1","uid":"0b5c6a1e-7b4e-4d2f-9a0e-1c2d3e4f5a6b"});
            n.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            ok(json!([n]))
        };
        assert!(decode_at(R, &raw(0, node(json!({}))), NOW).is_ok());
        let cases: Vec<(serde_json::Value, &str)> = vec![
            (
                json!({"version":1,"epoch":u64::MAX,"shard":0,"shards":1,"nodes":[]}),
                "epoch 18446744073709551615",
            ),
            (
                json!({"version":1,"epoch":NOW + MAX_EPOCH_AHEAD_SECS + 1,"shard":0,"shards":1,"nodes":[]}),
                "not one a publisher writes",
            ),
            (
                json!({"version":1,"epoch":0,"shard":0,"shards":1,"nodes":[]}),
                "epoch 0",
            ),
            (
                json!({"version":1,"epoch":NOW,"shard":0,"shards":u32::MAX,"nodes":[]}),
                "4294967295 shards",
            ),
            (
                json!({"version":1,"epoch":NOW,"shard":0,"shards":MAX_SHARDS + 1,"nodes":[]}),
                "more than the 1024",
            ),
            (ok(json!([{"name":"N1; rm -rf /","uid":"u"}])), "DNS-1123"),
            (ok(json!([{"name":"-n","uid":"u"}])), "DNS-1123"),
            (ok(json!([{"name":"a".repeat(254),"uid":"u"}])), "DNS-1123"),
            (node(json!({"uid":""})), "uid"),
            (node(json!({"uid":"$(reboot)"})), "uid"),
            (node(json!({"uid":"u".repeat(129)})), "uid"),
            (
                node(json!({"addresses":[{"type":"InternalIP","address":"10.0.0.1 10.0.0.2"}]})),
                "address",
            ),
            (
                node(json!({"addresses":[{"type":"InternalIP","address":"host.example"}]})),
                "address",
            ),
            (
                node(json!({"addresses":[{"type":"Hostname","address":"a b"}]})),
                "address",
            ),
            (node(json!({"podCIDRs":["10.0.0.0/33"]})), "podCIDR"),
            (node(json!({"podCIDRs":["fd00::/129"]})), "podCIDR"),
            (node(json!({"podCIDRs":["10.0.0.0"]})), "podCIDR"),
            (node(json!({"podCIDRs":["10.0.0.0/+8"]})), "podCIDR"),
            (node(json!({"providerID":"aws:///i-1\nx"})), "providerID"),
            (node(json!({"labels":{"a":"b"}})), "labels"),
            (node(json!({"bootID":"b"})), "boot ID"),
        ];
        for (body, want) in cases {
            let err = decode_at(R, &raw(0, body.clone()), NOW)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{body}: {err} should contain {want}");
            assert!(err.len() < 400, "bounded error: {err}");
        }
        // What the publisher writes passes, IPv6, DNS addresses and all.
        let good = node(json!({
            "addresses":[{"type":"InternalIP","address":"fd00::1"},{"type":"Hostname","address":"Node-1.example"}],
            "podCIDRs":["10.0.1.0/24","fd00:1::/64"],"providerID":"kind://docker/kind/n1"}));
        assert!(decode_at(R, &raw(0, good), NOW).is_ok());
        // An epoch from the old counter scheme (small) is still valid.
        assert!(epoch_plausible(3, NOW));
        assert!(epoch_plausible(NOW + MAX_EPOCH_AHEAD_SECS, NOW));
    }

    #[test]
    fn dns_subdomains() {
        for ok in ["a", "n-1", "ip-10-0-0-1.ec2.internal", &"a".repeat(63)] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in ["", "A", "a..b", "a.", ".a", "a_b", &"a".repeat(64), "é"] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
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
