//! What the canary and every line must come back with: nodegate-check's own
//! `--taint`, `--boot-taint` and `--owned-taint` as one set, as the webhook
//! reads them, else the webhook StatefulSet's. Mixing the two would expect a
//! configuration nothing runs.

use nodegate_shared::TaintSpec;
use nodegate_shared::gate_flags::{GateFlags, OwnedFlags};

use crate::container_flags::Flags;
use crate::report::{Report, Status};

pub const CHECK: &str = "configured taints";
/// The line of a check that compares with the expected taints, when
/// nodegate-check's own flags are invalid.
pub const NOTHING_TO_EXPECT: &str =
    "nothing to expect of it: nodegate-check's taint flags are invalid (see above)";

/// nodegate-check was given a taint flag of its own: its flags stand for
/// the webhook's, all three of them.
fn given(gate: &GateFlags, owned: &OwnedFlags) -> bool {
    gate.given() || !owned.owned_taints.is_empty()
}

/// The taints to expect: `running` (the StatefulSet's) when `gate` and
/// `owned` name none, else theirs (nodegate's default taint without
/// `--taint`, no gate owned elsewhere without `--owned-taint`). `Err`: flags
/// no webhook runs with, so nothing to compare the canary with.
pub fn verdict(
    gate: &GateFlags,
    owned: &OwnedFlags,
    running: &Flags,
) -> Result<Flags, (Status, String)> {
    if !given(gate, owned) {
        return Ok(running.clone());
    }
    let refused = |flags: &str, e: String| {
        (
            Status::Fail,
            format!("nodegate-check's {flags}: {e} (nodegate-webhook refuses them too)"),
        )
    };
    gate.validate()
        .map_err(|e| refused("--taint/--boot-taint", e.to_string()))?;
    owned
        .validate(gate)
        .map_err(|e| refused("--owned-taint", e.to_string()))?;
    Ok(Flags {
        taints: gate.ordinary(),
        boot: gate.boot_taints.clone(),
        release: Vec::new(),
        owned: owned.owned_taints.clone(),
    })
}

/// [`verdict`], reported when the flags are invalid.
pub fn check(
    gate: &GateFlags,
    owned: &OwnedFlags,
    running: &Flags,
    report: &mut Report,
) -> Option<Flags> {
    match verdict(gate, owned, running) {
        Ok(want) => Some(want),
        Err((status, detail)) => {
            report.add(CHECK, status, detail);
            None
        }
    }
}

/// The webhook flags `want` comes from, as a line asking whether a webhook
/// runs with them names them.
pub fn flag_names(want: &Flags) -> &'static str {
    if want.owned.is_empty() {
        "--taint and --boot-taint"
    } else {
        "--taint, --owned-taint and --boot-taint"
    }
}

/// Every taint of `want` in the order the lines show them: the ordinary
/// ones, the gates owned elsewhere, strict mode's boot gate.
pub fn all(want: &Flags) -> Vec<&TaintSpec> {
    want.taints
        .iter()
        .chain(&want.owned)
        .chain(&want.boot)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegate_shared::keys::DEFAULT_TAINT;

    const EBS: &str = "ebs.csi.aws.com/agent-not-ready:NoExecute";

    fn parse(l: &[&str]) -> Vec<TaintSpec> {
        l.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn gate(taints: &[&str], boot: &[&str]) -> GateFlags {
        GateFlags {
            taints: parse(taints),
            boot_taints: parse(boot),
        }
    }

    fn owned(taints: &[&str]) -> OwnedFlags {
        OwnedFlags {
            owned_taints: parse(taints),
        }
    }

    fn with_owned(mut f: Flags, taints: &[&str]) -> Flags {
        f.owned = parse(taints);
        f
    }

    #[test]
    fn verdicts() {
        let g = "example.com/x:NoExecute";
        let running = with_owned(Flags::of(&["example.com/x:NoSchedule"], &[g]), &[EBS]);
        let rows = [
            // No flag: what the StatefulSet runs with, as it is (its
            // --owned-taint included).
            (gate(&[], &[]), owned(&[]), Ok::<_, String>(running.clone())),
            // `--taint` replaces the StatefulSet's flags as one set: no gate
            // owned elsewhere without `--owned-taint`.
            (
                gate(&[DEFAULT_TAINT], &[]),
                owned(&[]),
                Ok(Flags::of(&[DEFAULT_TAINT], &[])),
            ),
            (
                gate(&[DEFAULT_TAINT], &[]),
                owned(&[EBS]),
                Ok(with_owned(Flags::of(&[DEFAULT_TAINT], &[]), &[EBS])),
            ),
            // `--boot-taint` alone: nodegate's default taint and that gate.
            (
                gate(&[], &[g]),
                owned(&[]),
                Ok(Flags::of(&[DEFAULT_TAINT], &[g])),
            ),
            // `--owned-taint` alone: nodegate's default taint and that gate.
            (
                gate(&[], &[]),
                owned(&[EBS]),
                Ok(with_owned(Flags::of(&[DEFAULT_TAINT], &[]), &[EBS])),
            ),
            (
                gate(&[], &[DEFAULT_TAINT]),
                owned(&[]),
                Err(format!(
                    "nodegate-check's --taint/--boot-taint: boot taint {DEFAULT_TAINT} must have effect NoExecute"
                )),
            ),
            (
                gate(&[], &[]),
                owned(&["nodegate.dev/agent-not-ready=other:NoSchedule"]),
                Err("nodegate-check's --owned-taint: ".to_string()),
            ),
            (
                gate(&[], &[]),
                owned(&["readiness.k8s.io/nodegate-agent-not-ready=true:NoSchedule"]),
                Err("nodegate-check's --owned-taint: owned taint readiness.k8s.io/nodegate-agent-not-ready=true:NoSchedule has the key and effect of a gate nodegate ships".to_string()),
            ),
        ];
        for (gate, owned, want) in rows {
            match (verdict(&gate, &owned, &running), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{gate:?} {owned:?}"),
                (Err((status, detail)), Err(start)) => {
                    assert_eq!(status, Status::Fail);
                    assert!(
                        detail.starts_with(&start)
                            && detail.ends_with(" (nodegate-webhook refuses them too)"),
                        "{detail}"
                    );
                }
                (got, want) => panic!("{gate:?} {owned:?}: {got:?}, want {want:?}"),
            }
        }
    }

    /// The lines list the ordinary taints, then the gates owned elsewhere,
    /// then strict mode's boot gate, and name the flags they come from.
    #[test]
    fn every_taint_in_order_and_its_flags() {
        let g = "example.com/x:NoExecute";
        let rows = [
            (
                Flags::of(&[DEFAULT_TAINT], &[]),
                vec![DEFAULT_TAINT],
                "--taint and --boot-taint",
            ),
            (
                with_owned(Flags::of(&[DEFAULT_TAINT], &[g]), &[EBS]),
                vec![DEFAULT_TAINT, EBS, g],
                "--taint, --owned-taint and --boot-taint",
            ),
        ];
        for (want, shown, names) in rows {
            let got: Vec<String> = all(&want).iter().map(ToString::to_string).collect();
            assert_eq!(got, shown);
            assert_eq!(flag_names(&want), names);
        }
    }
}
