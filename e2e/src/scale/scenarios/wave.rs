//! Scenario 3, the reboot wave: every `every`-th node crashes at once and
//! boots; each must be gated again (by every gate) from its new boot's
//! first version until its network (and every other gate's stand-in) is
//! ready, and no Pod may land on it meanwhile; the writes each reboot cost.
//! With several gates their stand-ins turn ready `--wave-gate-stagger`
//! apart (at once by default).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::latency::write_latency;
use super::writes::write_figures;
use super::{
    Ctx, P50_P99, Report, after_registration, all_gates, bound_pods, deployment, ms, ms_quantiles,
    started_after_ready,
};
use crate::metrics;
use crate::scale::control_plane::wait_ok;
use crate::scale::fleet::{Times, node_name};
use crate::scale::observe::{self, NodeVersion, Record, seen};

pub async fn wave(c: &Ctx<'_>, r: &mut Report, n: usize, every: usize) -> anyhow::Result<()> {
    let wave: Vec<String> = (0..n).step_by(every).map(node_name).collect();
    let k = wave.len();
    println!("\n== reboot wave: {k} nodes");
    let boots = Boots {
        old: old_boots(c, &wave),
        rv0: c.rec.last_rv(),
    };
    c.fleet.set_gate_stagger(c.wave_gate_stagger);
    // A crashed node's agent writes nothing on the way down.
    c.fleet.cut_off(&wave).await?;
    let before = metrics::apiserver(&c.admin).await?;
    let wall0 = Timestamp::now();
    let t0 = Instant::now();
    for w in &wave {
        c.fleet.crash(w)?;
    }
    for w in &wave {
        c.fleet.boot(w)?;
    }
    let back = wait_back(c, &wave, &boots).await?;
    let all_back = t0.elapsed();
    // The agents' last patches answered are in the audit log.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let wall1 = Timestamp::now();
    let after = metrics::apiserver(&c.admin).await?;
    c.fleet.set_gate_stagger(c.gate_stagger);
    let api = write_latency(r, "wave", &before, &after);
    let writes = write_figures(r, "wave", &c.audit_log, (wall0, wall1), &wave, api);
    let bound_ok = wait_ok(
        "the wave's workload bound",
        Duration::from_secs(120),
        || async { (bound_pods(&c.admin, "wave-workload").await.ok()? == k).then_some(()) },
    )
    .await;
    restart_figures(c, r, &wave);
    let g = {
        let rec = c.rec.lock();
        let times = c.fleet.times.lock().unwrap_or_else(|e| e.into_inner());
        regating(&rec, &times, &wave, &boots, t0, c.gates)
    };
    let bound = {
        let rec = c.rec.lock();
        observe::bound_while_gated(&rec, boots.rv0)
    };
    let (regated, early, gates_early) = (g.regated, g.ungated_before_ready, g.gates_early);
    let mut failed = g.failed;
    failed.sort();
    failed.dedup();
    let (mut tt, mut u) = (g.to_taint, g.untaint);
    r.figure("wave_nodes", k);
    r.figure(
        "wave_first_new_boot_version_gated",
        format!("{regated}/{k}"),
    );
    ms_quantiles(r, "wave_crash_to_regated", &mut tt, &[("p99", 0.99)]);
    ms_quantiles(r, "wave_ready_to_untaint", &mut u, P50_P99);
    r.figure("wave_all_back_s", format!("{:.1}", all_back.as_secs_f64()));
    r.figure("wave_ungated_before_ready", early);
    if c.gates > 1 {
        r.figure("wave_gates_opened_before_ready", gates_early);
    }
    r.figure("wave_pods_bound_while_gated", bound.len());
    r.figure(
        "wave_workload_bound",
        bound_pods(&c.admin, "wave-workload").await?,
    );
    r.goal(
        regated == k,
        format!("wave: re-gated at re-registration {regated}/{k} (not: {failed:?})"),
    );
    r.goal(
        bound.is_empty(),
        format!("wave: pods bound while gated: {bound:?}"),
    );
    r.goal(
        early == 0 && gates_early == 0,
        format!(
            "wave: {early} nodes ungated and {gates_early} gates opened before their stand-ins were ready {failed:?}"
        ),
    );
    r.goal(
        writes.agent_max <= c.gates,
        format!(
            "wave: at most one agent write per gate per reboot ({} ≤ {})",
            writes.agent_max, c.gates
        ),
    );
    r.goal(
        back.is_ok() && bound_ok.is_ok(),
        format!("wave: all back ({back:?}, {bound_ok:?})"),
    );
    Ok(())
}

/// The wave's nodes' boots before the crash, and the revision it started at.
struct Boots {
    old: BTreeMap<String, String>,
    rv0: u64,
}

fn old_boots(c: &Ctx<'_>, wave: &[String]) -> BTreeMap<String, String> {
    let rec = c.rec.lock();
    wave.iter()
        .filter_map(|w| Some((w.clone(), rec.nodes.get(w)?.last()?.obj.boot_id.clone())))
        .collect()
}

/// The first version of `w` since the crash that shows a new boot.
fn new_boot(rec: &Record, w: &str, boots: &Boots) -> Option<NodeVersion> {
    rec.nodes
        .get(w)?
        .iter()
        .find(|v| {
            v.rv > boots.rv0
                && !v.obj.boot_id.is_empty()
                && Some(&v.obj.boot_id) != boots.old.get(w)
        })
        .cloned()
}

/// Every rebooted node shows its new boot, then workload pinned to them;
/// then the wait until every one was gated since the crash and is ungated
/// now: its outcome, or the error of creating the workload.
async fn wait_back(
    c: &Ctx<'_>,
    wave: &[String],
    boots: &Boots,
) -> anyhow::Result<anyhow::Result<()>> {
    let _ = wait_ok(
        "every rebooted node's new boot",
        Duration::from_secs(120),
        || async {
            let rec = c.rec.lock();
            wave.iter()
                .all(|w| new_boot(&rec, w, boots).is_some())
                .then_some(())
        },
    )
    .await;
    deployment(&c.admin, "wave-workload", wave.len(), Some(wave)).await?;
    let back = wait_ok(
        "every rebooted node ungated",
        Duration::from_secs(300),
        || async {
            let rec = c.rec.lock();
            wave.iter()
                .all(|w| {
                    rec.nodes.get(w).is_some_and(|vs| {
                        vs.iter().any(|v| v.rv > boots.rv0 && v.obj.gated)
                            && vs.last().is_some_and(|v| !v.obj.gated)
                    })
                })
                .then_some(())
        },
    )
    .await;
    Ok(back)
}

/// The agents' containers after the reboot: how soon they ran again.
fn restart_figures(c: &Ctx<'_>, r: &mut Report, wave: &[String]) {
    let times = c.fleet.times.lock().unwrap_or_else(|e| e.into_inner());
    let mut after = after_registration(&times, &times.agent_restarted, wave);
    ms_quantiles(r, "wave_register_to_agent", &mut after, &[("p99", 0.99)]);
    let late = started_after_ready(&times, &times.agent_restarted, wave);
    r.figure("wave_agent_started_after_ready", late);
}

/// Of the rebooted nodes: how many came back gated by every gate, crash →
/// the new boot's first version, ready → the first ungated version since
/// (ms), and how many went ungated (or lost a gate) before their stand-ins
/// were ready.
struct Regating {
    regated: usize,
    to_taint: Vec<f64>,
    untaint: Vec<f64>,
    ungated_before_ready: usize,
    gates_early: usize,
    /// The nodes of either count, and of the ones not re-gated.
    failed: Vec<String>,
}

fn regating(
    rec: &Record,
    times: &Times,
    wave: &[String],
    boots: &Boots,
    t0: Instant,
    n_gates: usize,
) -> Regating {
    let all = all_gates(n_gates);
    let mut g = Regating {
        regated: 0,
        to_taint: Vec::new(),
        untaint: Vec::new(),
        ungated_before_ready: 0,
        gates_early: 0,
        failed: Vec::new(),
    };
    for w in wave {
        let Some(v) = new_boot(rec, w, boots) else {
            continue;
        };
        if v.obj.gates & all == all {
            g.regated += 1;
        } else {
            g.failed.push(w.clone());
        }
        g.to_taint.push(ms(seen(&v) - t0));
        let Some(vs) = rec.nodes.get(w) else {
            continue;
        };
        // The new boot's versions, from its first on.
        let since: Vec<&NodeVersion> = vs.iter().filter(|x| x.rv >= v.rv).collect();
        let ready = times.all_ready(w, n_gates);
        match (ready, since.iter().find(|x| !x.obj.gated)) {
            (Some(rd), Some(u)) if seen(u) >= rd => g.untaint.push(ms(seen(u) - rd)),
            (_, Some(_)) => {
                g.ungated_before_ready += 1;
                g.failed.push(w.clone());
            }
            _ => {}
        }
        if n_gates > 1 {
            for k in 0..n_gates {
                let opened = since.iter().find(|x| x.obj.gates & (1 << k) == 0);
                if let Some(o) = opened
                    && times.gate_ready_at(w, k).is_none_or(|rd| seen(o) < rd)
                {
                    g.gates_early += 1;
                    g.failed.push(w.clone());
                }
            }
        }
    }
    g
}
