//! What the canary and every line must come back with: nodegate-check's own
//! `--taint` and `--boot-taint` as one set, as the webhook reads them, else
//! the webhook StatefulSet's. Mixing the two would expect a configuration
//! nothing runs.

use nodegate_shared::gate_flags::GateFlags;

use crate::container_flags::Flags;
use crate::report::{Report, Status};

pub const CHECK: &str = "configured taints";
/// The line of a check that compares with the expected taints, when
/// nodegate-check's own flags are invalid.
pub const NOTHING_TO_EXPECT: &str =
    "nothing to expect of it: nodegate-check's taint flags are invalid (see above)";

/// The taints to expect: `running` (the StatefulSet's) when `gate` names
/// none, else `gate`'s (nodegate's default taint without `--taint`). `Err`:
/// flags no webhook runs with, so nothing to compare the canary with.
pub fn verdict(gate: &GateFlags, running: &Flags) -> Result<Flags, (Status, String)> {
    if !gate.given() {
        return Ok(running.clone());
    }
    if let Err(e) = gate.validate() {
        return Err((
            Status::Fail,
            format!(
                "nodegate-check's --taint/--boot-taint: {e} (nodegate-webhook refuses them too)"
            ),
        ));
    }
    Ok(Flags {
        taints: gate.ordinary(),
        boot: gate.boot_taints.clone(),
        release: Vec::new(),
        owned: Vec::new(),
    })
}

/// [`verdict`], reported when the flags are invalid.
pub fn check(gate: &GateFlags, running: &Flags, report: &mut Report) -> Option<Flags> {
    match verdict(gate, running) {
        Ok(want) => Some(want),
        Err((status, detail)) => {
            report.add(CHECK, status, detail);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodegate_shared::keys::DEFAULT_TAINT;

    fn gate(taints: &[&str], boot: &[&str]) -> GateFlags {
        let parse = |l: &[&str]| l.iter().map(|s| s.parse().unwrap()).collect();
        GateFlags {
            taints: parse(taints),
            boot_taints: parse(boot),
        }
    }

    #[test]
    fn verdicts() {
        let g = "example.com/x:NoExecute";
        let running = Flags::of(&["example.com/x:NoSchedule"], &[g]);
        let rows = [
            // Neither flag: what the StatefulSet runs with, as it is.
            (gate(&[], &[]), Ok::<_, String>(running.clone())),
            (
                gate(&[DEFAULT_TAINT], &[]),
                Ok(Flags::of(&[DEFAULT_TAINT], &[])),
            ),
            // `--boot-taint` alone: nodegate's default taint and that gate.
            (gate(&[], &[g]), Ok(Flags::of(&[DEFAULT_TAINT], &[g]))),
            (
                gate(&[], &[DEFAULT_TAINT]),
                Err(format!(
                    "nodegate-check's --taint/--boot-taint: boot taint {DEFAULT_TAINT} must have effect NoExecute"
                )),
            ),
        ];
        for (gate, want) in rows {
            match (verdict(&gate, &running), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{gate:?}"),
                (Err((status, detail)), Err(start)) => {
                    assert_eq!(status, Status::Fail);
                    assert!(
                        detail.starts_with(&start)
                            && detail.ends_with(" (nodegate-webhook refuses them too)"),
                        "{detail}"
                    );
                }
                (got, want) => panic!("{gate:?}: {got:?}, want {want:?}"),
            }
        }
    }
}
