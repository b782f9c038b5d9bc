//! What the watches saw: every version of every Node and Pod, whole, from
//! the one observer ([`crate::observe`]). Orderings between a Node's and a
//! Pod's versions are read from their resourceVersions, which one etcd
//! numbers from one revision counter.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};

pub use crate::observe::Seen;
use crate::observe::{Observer, Watches};

use super::harness::wait;
use super::objects::{NS, gated, name_of, node_of, ns_of, uid_of};

/// Every version of every Node and Pod since the start.
pub type Recorder = Observer<Node, Pod>;

/// Starts watching every Node and every Pod as `admin`.
pub fn start(admin: kube::Config) -> Recorder {
    Observer::start(admin, Watches::default()).expect("the observer's thread")
}

/// Versions of `node` after `since` (by resourceVersion), in order.
pub fn versions_after(r: &Recorder, node: &str, since: u64) -> Vec<Seen<Node>> {
    r.node(node).into_iter().filter(|s| s.rv > since).collect()
}

/// The latest version of `node`, unless it was deleted.
pub fn node_now(r: &Recorder, node: &str) -> Option<Node> {
    r.node(node)
        .into_iter()
        .next_back()
        .filter(|s| !s.deleted)
        .map(|s| s.obj)
}

/// Waits up to `secs` for the first version of `node` after `since` for
/// which `pred` holds.
pub async fn first_version(
    r: &Recorder,
    node: &str,
    since: u64,
    what: &str,
    secs: u64,
    pred: impl Fn(&Node) -> bool,
) -> Seen<Node> {
    wait(what, secs, async || {
        versions_after(r, node, since)
            .into_iter()
            .find(|s| pred(&s.obj))
    })
    .await
}

/// Pods bound to `node` with a version in `(from, to)`, other than
/// nodegate's own and those in `bound_before`: workloads bound while the
/// node was gated.
pub fn bound_between(
    r: &Recorder,
    node: &str,
    from: u64,
    to: u64,
    bound_before: &BTreeSet<String>,
) -> Vec<String> {
    let mut out = BTreeSet::new();
    for s in r.pods() {
        if s.rv > from
            && s.rv < to
            && node_of(&s.obj) == Some(node)
            && ns_of(&s.obj) != NS
            && !bound_before.contains(uid_of(&s.obj))
        {
            out.insert(name_of(&s.obj).to_string());
        }
    }
    out.into_iter().collect()
}

/// The uids of the pods bound to `node` up to version `until`.
pub fn uids_bound_to(r: &Recorder, node: &str, until: u64) -> BTreeSet<String> {
    r.pods()
        .into_iter()
        .filter(|s| s.rv <= until && node_of(&s.obj) == Some(node))
        .filter_map(|s| s.obj.metadata.uid)
        .collect()
}

/// The intervals during which `node` was gated since `since`.
pub fn gated_windows(r: &Recorder, node: &str, since: Instant) -> Vec<Duration> {
    let mut out = Vec::new();
    let mut start: Option<Instant> = None;
    for s in r.node(node).into_iter().filter(|s| s.at >= since) {
        match (gated(&s.obj), start) {
            (true, None) => start = Some(s.at),
            (false, Some(t)) => {
                out.push(s.at - t);
                start = None;
            }
            _ => {}
        }
    }
    out
}
