//! The probe thresholds as a state machine: round results in, verdict
//! changes out.
//!
//! All probes must pass in one round for the round to count as a success;
//! the node is ready after `success_threshold` consecutive successful rounds
//! and stops being ready after `failure_threshold` consecutive failed ones
//! (the kubelet's probe semantics).

/// Consecutive-result thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    pub success: u32,
    pub failure: u32,
}

/// A change of the gate's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Ready,
    NotReady,
}

/// The gate's verdict from a sequence of rounds. Starts not ready.
#[derive(Debug, Clone)]
pub struct Readiness {
    th: Thresholds,
    ready: bool,
    successes: u32,
    failures: u32,
}

impl Readiness {
    pub fn new(th: Thresholds) -> Self {
        Self {
            th: Thresholds {
                success: th.success.max(1),
                failure: th.failure.max(1),
            },
            ready: false,
            successes: 0,
            failures: 0,
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// Back to not ready with no history (a new boot must prove itself again).
    pub fn reset(&mut self) {
        *self = Self::new(self.th);
    }

    /// Feeds one round's result.
    pub fn observe(&mut self, ok: bool) -> Option<Transition> {
        if ok {
            self.failures = 0;
            self.successes = self.successes.saturating_add(1);
            if !self.ready && self.successes >= self.th.success {
                self.ready = true;
                return Some(Transition::Ready);
            }
        } else {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
            if self.ready && self.failures >= self.th.failure {
                self.ready = false;
                return Some(Transition::NotReady);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn th(success: u32, failure: u32) -> Readiness {
        Readiness::new(Thresholds { success, failure })
    }

    #[test]
    fn success_threshold_needs_consecutive_passes() {
        let mut r = th(3, 2);
        assert_eq!(r.observe(true), None);
        assert_eq!(r.observe(true), None);
        assert_eq!(r.observe(false), None, "a failure resets the streak");
        assert_eq!(r.observe(true), None);
        assert_eq!(r.observe(true), None);
        assert_eq!(r.observe(true), Some(Transition::Ready));
        assert!(r.is_ready());
        assert_eq!(r.observe(true), None, "no repeated transition");
    }

    #[test]
    fn failure_threshold_needs_consecutive_failures() {
        let mut r = th(1, 3);
        assert_eq!(r.observe(false), None, "not ready yet: no transition");
        assert_eq!(r.observe(true), Some(Transition::Ready));
        assert_eq!(r.observe(false), None);
        assert_eq!(r.observe(false), None);
        assert_eq!(r.observe(true), None, "a pass resets the failure streak");
        assert_eq!(r.observe(false), None);
        assert_eq!(r.observe(false), None);
        assert_eq!(r.observe(false), Some(Transition::NotReady));
        assert!(!r.is_ready());
        r.observe(true);
        assert!(r.is_ready());
        r.reset();
        assert!(!r.is_ready());
    }

    #[test]
    fn zero_thresholds_behave_as_one() {
        let mut r = th(0, 0);
        assert_eq!(r.observe(true), Some(Transition::Ready));
        assert_eq!(r.observe(false), Some(Transition::NotReady));
    }

    /// Every transition as a table: thresholds, the rounds fed one by one
    /// (`+` pass, `-` fail, `r` reset), and the verdict change each gives.
    #[test]
    fn transition_table() {
        use Transition::{NotReady as N, Ready as R};
        type Row = ((u32, u32), &'static str, &'static [Option<Transition>]);
        let table: &[Row] = &[
            ((1, 1), "+-+", &[Some(R), Some(N), Some(R)]),
            ((2, 1), "+-++", &[None, None, None, Some(R)]),
            ((1, 2), "+-+--", &[Some(R), None, None, None, Some(N)]),
            ((1, 1), "--", &[None, None]),
            ((1, 1), "+r+", &[Some(R), None, Some(R)]),
            ((2, 2), "++r+", &[None, Some(R), None, None]),
        ];
        for ((success, failure), rounds, want) in table {
            let mut r = th(*success, *failure);
            let got: Vec<Option<Transition>> = rounds
                .chars()
                .map(|c| match c {
                    'r' => {
                        r.reset();
                        None
                    }
                    c => r.observe(c == '+'),
                })
                .collect();
            assert_eq!(
                &got, want,
                "thresholds {success}/{failure}, rounds {rounds}"
            );
        }
    }
}
