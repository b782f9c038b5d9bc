//! What the strict-mode comparison measured, its table and the guarantees it
//! checks. Pure: no I/O.

use std::time::Duration;

use crate::report::Column;

/// One run of the strict-mode comparison (boot gate on or off).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StrictReport {
    pub name: String,
    /// The webhook and the agents ran with `--boot-taint`.
    pub strict: bool,
    pub nodes: usize,
    pub reboots: usize,
    /// Pods bound to the rebooted nodes before the wave that do not
    /// tolerate the boot gate (one per node), and those that do.
    pub bound_untolerating: usize,
    pub bound_tolerating: usize,
    /// Untolerating pods the kubelet admitted at its start after the reboot,
    /// before the node's network agent was ready: in strict mode, before
    /// the gate was stored (it follows the stored new boot); each is then
    /// evicted.
    pub admitted_early: usize,
    /// Untolerating pods the kubelet refused (`TaintToleration`); the others
    /// started first or were deleted by the taint-eviction controller before
    /// it listed them.
    pub refused: usize,
    /// Tolerating pods the kubelet refused (must be none).
    pub refused_tolerating: usize,
    /// Pods the taint-eviction controller deleted during the wave: with the
    /// gate, every untolerating pod of a rebooted node.
    pub evicted_in_wave: usize,
    /// Rebooted nodes whose first version on the new boot lacked nodegate's
    /// ordinary taint (the boot gate follows once that boot is stored).
    pub reboots_ungated: usize,
    /// Agents restarted on the same boot (their nodes each run one more
    /// untolerating pod), node versions carrying the gate meanwhile, and
    /// pods evicted meanwhile.
    pub restarts: usize,
    pub restart_gated_versions: usize,
    pub restart_evictions: usize,
    pub elapsed: Duration,
}

/// The table `nodegate-sim run --strict` prints, one column per run.
pub fn render_strict_table(reports: &[StrictReport]) -> String {
    let n = |f: fn(&StrictReport) -> usize| -> Column<StrictReport> {
        Box::new(move |r| f(r).to_string())
    };
    let rows: Vec<(&str, Column<StrictReport>)> = vec![
        (
            "nodes / rebooted",
            Box::new(|r| format!("{} / {}", r.nodes, r.reboots)),
        ),
        (
            "pods bound before the reboot (untolerating/tolerating)",
            Box::new(|r| format!("{}/{}", r.bound_untolerating, r.bound_tolerating)),
        ),
        (
            "untolerating pods admitted before the agent was ready",
            n(|r| r.admitted_early),
        ),
        (
            "of them refused by the kubelet (else evicted first)",
            n(|r| r.refused),
        ),
        ("tolerating pods refused", n(|r| r.refused_tolerating)),
        ("pods evicted in the reboot wave", n(|r| r.evicted_in_wave)),
        (
            "rebooted nodes first seen on the new boot untainted",
            // Without the gate there is nothing to see.
            Box::new(|r| {
                if r.strict {
                    r.reboots_ungated.to_string()
                } else {
                    "-".into()
                }
            }),
        ),
        ("agents restarted on the same boot", n(|r| r.restarts)),
        (
            "node versions with the gate meanwhile",
            n(|r| r.restart_gated_versions),
        ),
        ("pods evicted meanwhile", n(|r| r.restart_evictions)),
        (
            "scenario time",
            Box::new(|r| format!("{:.1} s", r.elapsed.as_secs_f64())),
        ),
    ];
    crate::report::table(
        &reports.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        reports,
        &rows,
    )
}

/// What broke: with the gate, no untolerating pod starts on a rebooted node
/// before its agent is ready and every one is evicted, a tolerating pod is
/// never refused, and a restart on the same boot gates and evicts
/// nothing; without it, the comparison must show the bound pods admitted at
/// once (otherwise the model, not nodegate, is off).
pub fn broken_strict_guarantees(reports: &[StrictReport]) -> Vec<String> {
    let mut broken = Vec::new();
    for r in reports {
        let n = &r.name;
        let mut check = |ok: bool, what: String| {
            if !ok {
                broken.push(format!("{n}: {what}"));
            }
        };
        check(
            r.refused_tolerating == 0,
            format!(
                "{} pods tolerating the gate were refused",
                r.refused_tolerating
            ),
        );
        check(
            r.restart_gated_versions == 0 && r.restart_evictions == 0,
            format!(
                "agent restarts on the same boot put the gate on {} node versions and evicted {} pods",
                r.restart_gated_versions, r.restart_evictions
            ),
        );
        if r.strict {
            // Untolerating pods the kubelet admitted before the gate was
            // stored (it follows the stored new boot, not the create's
            // claim) are the cost of that rule: counted, and each must be
            // evicted below.
            check(
                r.evicted_in_wave == r.bound_untolerating,
                format!(
                    "{} of {} untolerating pods evicted",
                    r.evicted_in_wave, r.bound_untolerating
                ),
            );
            check(
                r.reboots_ungated == 0,
                format!(
                    "{} rebooted nodes first seen without the taint",
                    r.reboots_ungated
                ),
            );
        } else {
            check(
                r.admitted_early == r.bound_untolerating && r.refused == 0,
                format!(
                    "without the gate {} of {} bound pods were admitted at once",
                    r.admitted_early, r.bound_untolerating
                ),
            );
        }
    }
    broken
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict() -> StrictReport {
        StrictReport {
            name: "strict".into(),
            strict: true,
            nodes: 4,
            reboots: 2,
            bound_untolerating: 2,
            bound_tolerating: 2,
            refused: 2,
            evicted_in_wave: 2,
            restarts: 2,
            ..Default::default()
        }
    }

    fn plain() -> StrictReport {
        StrictReport {
            name: "plain".into(),
            strict: false,
            admitted_early: 2,
            refused: 0,
            evicted_in_wave: 0,
            ..strict()
        }
    }

    #[test]
    fn a_clean_comparison_breaks_nothing() {
        assert_eq!(
            broken_strict_guarantees(&[strict(), plain()]),
            Vec::<String>::new()
        );
        let table = render_strict_table(&[strict(), plain()]);
        assert!(table.contains("untolerating pods admitted before the agent was ready"));
        assert_eq!(table.lines().count(), 13);
    }

    #[test]
    fn each_guarantee_is_checked() {
        let broken = |r: StrictReport| broken_strict_guarantees(&[r]);
        // Started before the gate was stored, then evicted: the cost of a
        // gate that follows only the stored new boot, not a break.
        assert!(
            broken(StrictReport {
                admitted_early: 1,
                refused: 1,
                ..strict()
            })
            .is_empty()
        );
        assert_eq!(
            broken(StrictReport {
                admitted_early: 1,
                evicted_in_wave: 1,
                ..strict()
            })
            .len(),
            1
        );
        // Deleted before the kubelet listed them rather than refused: fine.
        assert!(
            broken(StrictReport {
                refused: 0,
                ..strict()
            })
            .is_empty()
        );
        assert_eq!(
            broken(StrictReport {
                evicted_in_wave: 1,
                ..strict()
            })
            .len(),
            1
        );
        assert_eq!(
            broken(StrictReport {
                refused_tolerating: 1,
                ..strict()
            })
            .len(),
            1
        );
        assert_eq!(
            broken(StrictReport {
                reboots_ungated: 1,
                ..strict()
            })
            .len(),
            1
        );
        assert_eq!(
            broken(StrictReport {
                restart_evictions: 1,
                ..strict()
            })
            .len(),
            1
        );
        assert_eq!(
            broken(StrictReport {
                restart_gated_versions: 1,
                ..plain()
            })
            .len(),
            1
        );
        // Without the gate the problem must show.
        assert_eq!(
            broken(StrictReport {
                admitted_early: 1,
                ..plain()
            })
            .len(),
            1
        );
    }
}
