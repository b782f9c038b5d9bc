//! Benchmark of the pruning path at cluster scale (run with `--release`):
//! decoding Nodes into slim records, snapshot write, snapshot load + diff +
//! dispatch, and the resident memory that costs.
//!
//! `cargo run --release -p nodegate-bench --bin nodegate-agent-bench -- --nodes 10000`

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use futures::future::BoxFuture;
use kube::runtime::watcher::Event;
use nodegate_agent::handler::{DeleteSource, Dispatcher, HandlerError, NodeDeleteHandler};
use nodegate_agent::metrics::Metrics;
use nodegate_agent::prune::{NodeEvents, Pruner};
use nodegate_agent::record::NodeRecord;
use nodegate_agent::snapshot::{self, Loaded};
use nodegate_shared::NodeResource;
use serde_json::json;

#[derive(Parser)]
struct Opts {
    /// Nodes in the simulated cluster.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// Nodes deleted while the agent was "down".
    #[arg(long, default_value_t = 300)]
    deleted: usize,
    /// Of those, how many come back under the same name (new uid).
    #[arg(long, default_value_t = 100)]
    recreated: usize,
    /// Directory for the snapshot (default: a fresh one under $TMPDIR, removed after).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Repetitions of the snapshot write (median reported).
    #[arg(long, default_value_t = 9)]
    runs: usize,
}

/// A realistic kubelet-written Node (~50 images, conditions, managed fields),
/// so decoding cost and transient memory are honest.
fn full_node(i: usize, uid_gen: usize) -> Vec<u8> {
    let images: Vec<_> = (0..50)
        .map(|k| json!({"names": [format!("registry.example.com/team/app-{k}@sha256:{:064x}", k * 7919 + i),
                                   format!("registry.example.com/team/app-{k}:v1.{k}.0")],
                        "sizeBytes": 123_456_789 + k}))
        .collect();
    let conditions: Vec<_> = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        .iter()
        .map(|t| {
            json!({"type": t, "status": if *t == "Ready" {"True"} else {"False"},
                        "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                        "reason": "KubeletReady", "message": "kubelet is posting ready status"})
        })
        .collect();
    serde_json::to_vec(&json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": format!("node-{i:05}"), "uid": format!("{uid_gen:08x}-0000-4000-8000-{i:012x}"),
            "resourceVersion": format!("{}", 1000 + i),
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"kubernetes.io/hostname": format!("node-{i:05}"), "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "m6i.xlarge",
                       "topology.kubernetes.io/region": "eu-west-1", "topology.kubernetes.io/zone": "eu-west-1a",
                       "node-role.kubernetes.io/worker": ""},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                            "nodegate.dev/ready-boot-id": "b"},
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                               "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}}}}]
        },
        "spec": {"podCIDR": format!("10.{}.{}.0/24", i / 256, i % 256),
                 "podCIDRs": [format!("10.{}.{}.0/24", i / 256, i % 256), format!("fd00:{i:x}::/64")],
                 "providerID": format!("aws:///eu-west-1a/i-{i:017x}")},
        "status": {
            "addresses": [{"type": "InternalIP", "address": format!("172.16.{}.{}", i / 256, i % 256)},
                          {"type": "InternalIP", "address": format!("fd01::{i:x}")},
                          {"type": "Hostname", "address": format!("node-{i:05}")}],
            "nodeInfo": {"bootID": format!("{i:08x}-boot"), "kernelVersion": "6.8.0", "osImage": "Ubuntu 24.04",
                         "containerRuntimeVersion": "containerd://2.0.0", "kubeletVersion": "v1.32.0",
                         "machineID": format!("{i:032x}"), "systemUUID": format!("{i:032x}")},
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "15Gi", "pods": "110"},
            "conditions": conditions,
            "images": images
        }
    }))
    .unwrap_or_default()
}

fn decode(i: usize, uid_gen: usize) -> anyhow::Result<NodeResource> {
    serde_json::from_slice(&full_node(i, uid_gen)).context("decode node")
}

fn proc_status(field: &str) -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .map(|l| l[field.len()..].trim().to_owned())
        })
        .unwrap_or_else(|| "n/a".into())
}

/// Removes the directory on drop only when the bench created it.
struct CleanDir(std::path::PathBuf, bool);

impl Drop for CleanDir {
    fn drop(&mut self) {
        if self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

struct Counting(AtomicUsize);

impl NodeDeleteHandler for Counting {
    fn name(&self) -> &str {
        "counting"
    }
    fn handle<'a>(
        &'a self,
        _: &'a NodeRecord,
        _: DeleteSource,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Box::pin(async { Ok(()) })
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let o = Opts::parse();
    let n = o.nodes;
    println!(
        "nodegate-agent-bench: {n} nodes, {} deleted while down ({} re-created)",
        o.deleted, o.recreated
    );
    println!(
        "baseline            VmRSS {}  VmHWM {}",
        proc_status("VmRSS:"),
        proc_status("VmHWM:")
    );

    // 1. First list: full Node JSON decoded straight into slim records.
    let mut pruner = Pruner::new("node-self", Vec::new());
    let mut events = NodeEvents::default();
    let t = Instant::now();
    events.apply(Event::Init);
    let mut json_bytes = 0usize;
    for i in 0..n {
        json_bytes += full_node(i, 0).len();
        events.apply(Event::InitApply(decode(i, 0)?));
    }
    if let Some(m) = events.apply(Event::InitDone) {
        pruner.apply(m);
    }
    let list = t.elapsed();
    println!(
        "list+project        {} for {n} nodes ({:.1} MB of Node JSON, {:.1} µs/node incl. generating it)",
        ms(list),
        json_bytes as f64 / 1e6,
        list.as_secs_f64() * 1e6 / n as f64
    );
    println!(
        "after live set      VmRSS {}  VmHWM {}",
        proc_status("VmRSS:"),
        proc_status("VmHWM:")
    );

    // 2. Snapshot write (encode + temp file + fsync + rename + dir fsync).
    let dir = o.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("nodegate-agent-bench-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir)?;
    let dir = CleanDir(dir, o.dir.is_none());
    let mut times = Vec::new();
    let mut size = 0;
    for _ in 0..o.runs.max(1) {
        let t = Instant::now();
        let bytes = snapshot::encode(pruner.records())?;
        size = bytes.len();
        snapshot::write_atomic(&dir.0, &bytes)?;
        times.push(t.elapsed());
    }
    times.sort();
    let enc = {
        let t = Instant::now();
        let _ = snapshot::encode(pruner.records())?;
        t.elapsed()
    };
    println!(
        "snapshot write      median {} (min {}, max {}; encode alone {}), {:.2} MB",
        ms(times[times.len() / 2]),
        ms(times[0]),
        ms(times[times.len() - 1]),
        ms(enc),
        size as f64 / 1e6
    );
    drop(pruner);

    // 3. Restart: load + first list + diff + dispatch.
    let deleted: Vec<usize> = (0..o.deleted.min(n))
        .map(|k| k * (n / o.deleted.max(1)).max(1))
        .collect();
    let recreated: std::collections::HashSet<usize> =
        deleted.iter().take(o.recreated).copied().collect();
    let deleted: std::collections::HashSet<usize> = deleted.into_iter().collect();

    let t = Instant::now();
    let loaded = snapshot::load(&dir.0)?;
    let load = t.elapsed();
    let snap = match loaded {
        Loaded::Found(s) => s,
        other => anyhow::bail!("snapshot not readable: {other:?}"),
    };
    let mut pruner = Pruner::new("node-self", snap);
    let mut events = NodeEvents::default();
    let t = Instant::now();
    events.apply(Event::Init);
    for i in 0..n {
        if deleted.contains(&i) && !recreated.contains(&i) {
            continue;
        }
        let generation = usize::from(recreated.contains(&i));
        events.apply(Event::InitApply(decode(i, generation)?));
    }
    let relist = t.elapsed();
    let t = Instant::now();
    let deletions = events
        .apply(Event::InitDone)
        .map(|m| pruner.apply(m))
        .unwrap_or_default();
    let diff = t.elapsed();

    let counter = Arc::new(Counting(AtomicUsize::new(0)));
    let dispatcher = Dispatcher::new(vec![counter.clone()], Metrics::default());
    let t = Instant::now();
    for (rec, src) in &deletions {
        dispatcher.dispatch(rec, *src).await;
    }
    let dispatch = t.elapsed();
    let handled = counter.0.load(Ordering::Relaxed);
    anyhow::ensure!(
        handled == deleted.len(),
        "handled {handled}, expected {}",
        deleted.len()
    );
    println!("snapshot load       {}", ms(load));
    println!("relist ({} live)  {}", pruner.len(), ms(relist));
    println!(
        "diff                {} -> {} deletions",
        ms(diff),
        deletions.len()
    );
    println!(
        "dispatch            {} ({} handler calls)",
        ms(dispatch),
        handled
    );
    println!("load+diff+dispatch  {}", ms(load + diff + dispatch));
    println!(
        "end                 VmRSS {}  VmHWM {}",
        proc_status("VmRSS:"),
        proc_status("VmHWM:")
    );
    Ok(())
}
