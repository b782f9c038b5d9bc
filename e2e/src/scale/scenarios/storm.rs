//! Scenario 1, the registration storm: `n` nodes registering evenly
//! within `within`; every node's first stored version gated (by every
//! gate), none ungated before its network (and every other gate's
//! stand-in) is ready, no gate opened before its own stand-in, no Pod bound
//! to a gated node; the writes each join cost.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::latency::{webhook_buckets, webhook_latency, write_latency};
use super::writes::write_figures;
use super::{
    Ctx, P50_P99, P50_P99_MAX, Report, after_registration, all_gates, all_ungated, bound_pods, cpu,
    cpu_figures, deployment, ms, ms_quantiles, started_after_ready,
};
use crate::metrics::{self, Scrape};
use crate::scale::control_plane::wait_ok;
use crate::scale::fleet::{Times, node_name};
use crate::scale::observe::{self, Record, percentile};

pub async fn storm(c: &Ctx<'_>, r: &mut Report, n: usize, within: Duration) -> anyhow::Result<()> {
    println!("\n== storm: {n} nodes within {within:?}");
    let run = register(c, n, within).await?;
    r.figure("storm_nodes", n);
    r.figure(
        "storm_boot_calls_s",
        format!("{:.1}", run.registered_in.as_secs_f64()),
    );
    r.figure(
        "storm_settled_s",
        format!("{:.1}", run.settle.as_secs_f64()),
    );
    cpu_figures(r, "storm", &run.cpu0, &run.cpu1, run.settle.as_secs_f64());
    let gates = gate_figures(c, r, n, &run.names);
    start_figures(c, r, &run.names);
    r.figure("storm_gates", c.gates);
    webhook_latency(
        r,
        "storm",
        &run.before,
        &run.after,
        &run.wh_before,
        &run.wh_after,
        &["CREATE"],
    );
    let api = write_latency(r, "storm", &run.before, &run.after);
    let writes = write_figures(
        r,
        "storm",
        &c.audit_log,
        (run.wall0, run.wall1),
        &run.names,
        api,
    );
    let fail_open = run
        .after
        .sum("apiserver_admission_webhook_fail_open_count", &[])
        - run
            .before
            .sum("apiserver_admission_webhook_fail_open_count", &[]);
    r.figure("storm_fail_open", fail_open);
    let bound = {
        let rec = c.rec.lock();
        observe::bound_while_gated(&rec, 0)
    };
    r.figure("storm_pods_bound_while_gated", bound.len());
    let workload = bound_pods(&c.admin, "storm-workload").await?;
    r.figure("storm_workload_bound", workload);
    goals(r, n, &run.settled, &gates, fail_open, &bound);
    r.goal(
        writes.agent_max <= c.gates,
        format!(
            "storm: at most one agent write per gate per join ({} ≤ {})",
            writes.agent_max, c.gates
        ),
    );
    Ok(())
}

/// What the storm measured around the boots.
struct Run {
    names: Vec<String>,
    /// From the first boot to the last.
    registered_in: Duration,
    settled: anyhow::Result<()>,
    /// From the first boot until every node was ungated (or the wait gave up).
    settle: Duration,
    before: Scrape,
    after: Scrape,
    wh_before: Vec<(f64, f64)>,
    wh_after: Vec<(f64, f64)>,
    cpu0: BTreeMap<String, f64>,
    cpu1: BTreeMap<String, f64>,
    /// The same window on the audit log's clock.
    wall0: Timestamp,
    wall1: Timestamp,
}

/// Boots the `n` nodes evenly within `within` and waits until every one is
/// ungated, with the metrics and CPU before and after.
async fn register(c: &Ctx<'_>, n: usize, within: Duration) -> anyhow::Result<Run> {
    // Workload waiting for nodes: bound only to ungated ones.
    deployment(&c.admin, "storm-workload", (n / 10).max(5), None).await?;
    let before = metrics::apiserver(&c.admin).await?;
    let wh_before = webhook_buckets(&c.webhook_admin).await;
    let cpu0 = cpu(&c.pids);
    let wall0 = Timestamp::now();
    let names: Vec<String> = (0..n).map(node_name).collect();
    // Credentials first: the storm's pace is the boots'.
    for i in 0..n {
        c.fleet.add(c.pki, i)?;
    }
    let t0 = Instant::now();
    let step = within.div_f64(n as f64);
    for (i, name) in names.iter().enumerate() {
        tokio::time::sleep_until(t0 + step.mul_f64(i as f64)).await;
        c.fleet.boot(name)?;
    }
    let registered_in = t0.elapsed();
    let deadline = Duration::from_secs(120)
        + c.fleet.network_start
        + c.gate_stagger * (c.gates as u32 - 1)
        + within / 2;
    let settled = wait_ok("every node registered and ungated", deadline, || async {
        all_ungated(&c.rec, &names).then_some(())
    })
    .await;
    let settle = t0.elapsed();
    // The agents' last patches answered are in the audit log.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let wall1 = Timestamp::now();
    let after = metrics::apiserver(&c.admin).await?;
    let wh_after = webhook_buckets(&c.webhook_admin).await;
    let cpu1 = cpu(&c.pids);
    Ok(Run {
        names,
        registered_in,
        settled,
        settle,
        before,
        after,
        wh_before,
        wh_after,
        cpu0,
        cpu1,
        wall0,
        wall1,
    })
}

/// Of the nodes' stored versions: how many started gated by every gate,
/// how many went ungated before every gate's stand-in was ready, how long
/// after that the others went ungated, and each gate on its own.
#[derive(Debug, Default)]
struct Gates {
    gated_first: usize,
    ungated_before_ready: usize,
    /// Ready → the first ungated version, milliseconds.
    untaint: Vec<f64>,
    /// The same, of the nodes whose agent already ran at ready.
    untaint_agent_up: Vec<f64>,
    nodes_seen: usize,
    /// (node, gate) pairs whose taint went before the gate's own stand-in
    /// was ready.
    gates_opened_early: usize,
    /// A gate's stand-in ready → the first version without its taint, ms.
    gate_open: Vec<f64>,
    /// Node versions stored (every writer's), all nodes.
    versions: usize,
}

fn gates(rec: &Record, times: &Times, names: &[String], n_gates: usize) -> Gates {
    let mut g = Gates::default();
    let all = all_gates(n_gates);
    for name in names {
        let Some(vs) = rec.nodes.get(name) else {
            continue;
        };
        g.nodes_seen += 1;
        g.versions += vs.len();
        if vs.first().is_some_and(|v| v.obj.gates & all == all) {
            g.gated_first += 1;
        }
        let ready = times.all_ready(name, n_gates);
        let first_ungated = vs.iter().find(|v| !v.obj.gated);
        match (ready, first_ungated) {
            (Some(rd), Some(u)) if observe::seen(u) >= rd => {
                g.untaint.push(ms(observe::seen(u) - rd));
                if times.agent_started.get(name).is_some_and(|a| *a <= rd) {
                    g.untaint_agent_up.push(ms(observe::seen(u) - rd));
                }
            }
            (_, Some(_)) => g.ungated_before_ready += 1,
            _ => {}
        }
        if n_gates > 1 {
            for k in 0..n_gates {
                let opened = vs.iter().find(|v| v.obj.gates & (1 << k) == 0);
                match (times.gate_ready_at(name, k), opened) {
                    (Some(rd), Some(o)) if observe::seen(o) >= rd => {
                        g.gate_open.push(ms(observe::seen(o) - rd));
                    }
                    (_, Some(_)) => g.gates_opened_early += 1,
                    _ => {}
                }
            }
        }
    }
    g
}

/// What the goals need of the gates: the counts and ready→untaint's p99.
struct GateOutcome {
    gated_first: usize,
    ungated_before_ready: usize,
    gates_opened_early: usize,
    p99: f64,
}

fn gate_figures(c: &Ctx<'_>, r: &mut Report, n: usize, names: &[String]) -> GateOutcome {
    let g = {
        let rec = c.rec.lock();
        let times = c.fleet.times.lock().unwrap_or_else(|e| e.into_inner());
        gates(&rec, &times, names, c.gates)
    };
    r.figure(
        "storm_first_version_gated",
        format!("{}/{n}", g.gated_first),
    );
    r.figure("storm_nodes_seen", g.nodes_seen);
    r.figure(
        "storm_node_versions_per_node",
        format!("{:.1}", g.versions as f64 / n.max(1) as f64),
    );
    r.figure("storm_ungated_before_ready", g.ungated_before_ready);
    if c.gates > 1 {
        r.figure("storm_gates_opened_before_ready", g.gates_opened_early);
        let mut open = g.gate_open;
        ms_quantiles(r, "storm_gate_ready_to_open", &mut open, P50_P99);
    }
    let mut u = g.untaint;
    let p99 = percentile(&mut u, 0.99);
    ms_quantiles(r, "storm_ready_to_untaint", &mut u, P50_P99_MAX);
    // nodegate's own part: the nodes whose agent already ran at ready.
    let mut up = g.untaint_agent_up;
    r.figure("storm_agent_up_at_ready", up.len());
    ms_quantiles(r, "storm_ready_to_untaint_agent_up", &mut up, P50_P99);
    GateOutcome {
        gated_first: g.gated_first,
        ungated_before_ready: g.ungated_before_ready,
        gates_opened_early: g.gates_opened_early,
        p99,
    }
}

/// Both DaemonSets' Pods: how soon the controller created them.
fn start_figures(c: &Ctx<'_>, r: &mut Report, names: &[String]) {
    let times = c.fleet.times.lock().unwrap_or_else(|e| e.into_inner());
    for (what, started) in [
        ("agent", &times.agent_started),
        ("network_agent", &times.network_started),
    ] {
        let mut after = after_registration(&times, started, names);
        ms_quantiles(r, &format!("storm_register_to_{what}"), &mut after, P50_P99);
    }
    let late = started_after_ready(&times, &times.agent_started, names);
    r.figure("storm_agent_started_after_ready", late);
}

fn goals(
    r: &mut Report,
    n: usize,
    settled: &anyhow::Result<()>,
    g: &GateOutcome,
    fail_open: f64,
    bound: &[String],
) {
    let (gated_first, ungated_before_ready, p99) = (g.gated_first, g.ungated_before_ready, g.p99);
    r.goal(
        settled.is_ok(),
        format!("storm: all {n} nodes ungated after ready ({settled:?})"),
    );
    r.goal(
        gated_first == n,
        format!("storm: first stored version gated {gated_first}/{n}"),
    );
    r.goal(
        ungated_before_ready == 0,
        format!("storm: {ungated_before_ready} nodes ungated before ready"),
    );
    r.goal(
        g.gates_opened_early == 0,
        format!(
            "storm: {} gates opened before their own stand-in was ready",
            g.gates_opened_early
        ),
    );
    r.goal(
        fail_open == 0.0,
        format!("storm: {fail_open} admission calls failed open"),
    );
    r.goal(
        bound.is_empty(),
        format!("storm: pods bound while gated: {bound:?}"),
    );
    r.goal(
        p99 < 1000.0,
        format!("storm: ready→untaint p99 {p99:.0} ms < 1000 ms"),
    );
}
