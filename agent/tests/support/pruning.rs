//! What pruning leaves behind: the snapshot file and the deletion hook's
//! calls, both narrowed to the test's own nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use nodegate_agent::snapshot;
use serde_json::Value;

/// The whole snapshot file (name → uid): every node the agent saw.
pub fn read_snapshot(state: &Path) -> Option<BTreeMap<String, String>> {
    let bytes = std::fs::read(snapshot::path_in(state)).ok()?;
    let nodes = snapshot::decode(&bytes).expect("snapshot is never torn");
    Some(nodes.into_iter().map(|n| (n.name, n.uid)).collect())
}

/// The test's own nodes in the snapshot (a real cluster has others).
pub fn own_snapshot(state: &Path, own: &BTreeSet<String>) -> Option<BTreeMap<String, String>> {
    let mut snap = read_snapshot(state)?;
    snap.retain(|name, _| own.contains(name));
    Some(snap)
}

/// `sh -c` hook that records each call: one log line and the stdin record.
pub fn hook(dir: &Path) -> String {
    format!(
        "f=$(mktemp -p {d} rec.XXXXXX) && cat > \"$f\" && echo \"$NODEGATE_NODE_NAME $NODEGATE_DELETE_SOURCE $NODEGATE_NODE_IPS $f\" >> {d}/hook.log",
        d = dir.display()
    )
}

/// One run of the hook: (node, source, IPs, the record on stdin).
pub type HookCall = (String, String, String, Value);

/// Every hook call so far, sorted by node.
pub fn hook_calls(dir: &Path) -> Vec<HookCall> {
    let Ok(text) = std::fs::read_to_string(dir.join("hook.log")) else {
        return Vec::new();
    };
    let mut v: Vec<_> = text
        .lines()
        .map(|l| {
            let p: Vec<&str> = l.split(' ').collect();
            let rec: Value = serde_json::from_slice(&std::fs::read(p[3]).unwrap()).unwrap();
            (p[0].to_string(), p[1].to_string(), p[2].to_string(), rec)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The hook calls for the test's own nodes.
pub fn own_hook_calls(dir: &Path, own: &BTreeSet<String>) -> Vec<HookCall> {
    let mut v = hook_calls(dir);
    v.retain(|c| own.contains(&c.0));
    v
}

/// Hook calls as (node, source, IPs, the record's uid), to compare whole.
pub fn call_summaries(calls: &[HookCall]) -> Vec<(String, String, String, String)> {
    calls
        .iter()
        .map(|(n, s, ips, rec)| {
            let uid = rec["uid"].as_str().unwrap().to_string();
            (n.clone(), s.clone(), ips.clone(), uid)
        })
        .collect()
}
