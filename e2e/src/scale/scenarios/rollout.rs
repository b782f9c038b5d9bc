//! Scenario 4, the agent DaemonSet rolled (`kubectl rollout restart`, the
//! shipped maxUnavailable 10%): each agent's restart re-taints its node for
//! a moment, and none may stay gated.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::Api;
use tokio::time::Instant;

use super::{Ctx, P50_P99_MAX, Report, all_ungated, ms, ms_quantiles};
use crate::scale::control_plane::wait_ok;
use crate::scale::install::kubectl;
use crate::scale::observe::{Record, seen};

pub async fn rollout(c: &Ctx<'_>, r: &mut Report, kubeconfig: &Path) -> anyhow::Result<()> {
    println!("\n== agent rollout");
    let names = c.fleet.names();
    let rv0 = c.rec.last_rv();
    let t0 = Instant::now();
    kubectl(
        kubeconfig,
        &[
            "-n",
            "nodegate",
            "rollout",
            "restart",
            "daemonset/nodegate-agent",
        ],
        None,
    )?;
    let done = wait_rolled(c, names.len() as i32).await;
    let ungated = wait_ok(
        "every node ungated after the rollout",
        Duration::from_secs(120),
        || async { all_ungated(&c.rec, &names).then_some(()) },
    )
    .await;
    let took = t0.elapsed();
    let w = {
        let rec = c.rec.lock();
        retaints(&rec, &names, rv0)
    };
    let (mut windows, left) = (w.windows, w.left);
    r.figure("rollout_s", format!("{:.1}", took.as_secs_f64()));
    r.figure("rollout_nodes_retainted", w.nodes);
    ms_quantiles(r, "rollout_retaint_window", &mut windows, P50_P99_MAX);
    r.figure("rollout_nodes_left_gated", left);
    r.goal(
        done.is_ok() && ungated.is_ok() && left == 0,
        format!("rollout: done, {left} nodes left gated ({done:?})"),
    );
    Ok(())
}

/// Until the DaemonSet's status shows every one of its `n` Pods updated
/// and available.
async fn wait_rolled(c: &Ctx<'_>, n: i32) -> anyhow::Result<()> {
    let ds: Api<DaemonSet> = Api::namespaced(c.admin.clone(), "nodegate");
    wait_ok("the rollout", Duration::from_secs(1200), || async {
        let d = ds.get("nodegate-agent").await.ok()?;
        let s = d.status?;
        let fresh = s.observed_generation? >= d.metadata.generation?;
        (fresh
            && s.updated_number_scheduled? == n
            && s.number_available? == n
            && s.number_unavailable.unwrap_or(0) == 0)
            .then_some(())
    })
    .await
}

/// The re-taints since revision `rv0`.
struct Retaints {
    /// Each gated → ungated window, in milliseconds.
    windows: Vec<f64>,
    /// Nodes with at least one closed window.
    nodes: usize,
    /// Nodes still gated.
    left: usize,
}

fn retaints(rec: &Record, names: &[String], rv0: u64) -> Retaints {
    let mut w = Retaints {
        windows: Vec::new(),
        nodes: 0,
        left: 0,
    };
    for name in names {
        let Some(vs) = rec.nodes.get(name) else {
            continue;
        };
        let mut open: Option<Instant> = None;
        let mut any = false;
        for v in vs.iter().filter(|v| v.rv > rv0) {
            match (v.obj.gated, open) {
                (true, None) => open = Some(seen(v)),
                (false, Some(o)) => {
                    w.windows.push(ms(seen(v) - o));
                    open = None;
                    any = true;
                }
                _ => {}
            }
        }
        if open.is_some() {
            w.left += 1;
        }
        w.nodes += usize::from(any);
    }
    w
}
