//! What happens to a launched instance, and when, in virtual time: the
//! cloud provider boots it and its kubelet creates the Node (`launch` after
//! the NodeClaim), the kubelet reports Ready (`ready` after the create), and
//! the network agent becomes ready, whereupon nodegate's agent removes the
//! gate — a fixed time after Ready, or after registration (so possibly
//! before Ready). Karpenter registers a Node the moment it appears (its
//! NodeClaim controllers watch Nodes), so registration is the create here.

use std::time::Duration;

/// When the gate opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateOpens {
    AfterReady(Duration),
    AfterRegistration(Duration),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// NodeClaim created → Node created (instance boot, kubelet start).
    pub launch: Duration,
    /// Node created → kubelet reports Ready.
    pub ready: Duration,
    pub gate: GateOpens,
}

/// One step of an instance's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    CreateNode,
    PostReady,
    OpenGate,
}

/// One launched instance and the moments its steps happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub name: String,
    pub launched_at: Duration,
    pub created_at: Option<Duration>,
    pub ready_at: Option<Duration>,
    pub gate_opened_at: Option<Duration>,
}

impl Instance {
    pub fn new(name: &str, launched_at: Duration) -> Self {
        Self {
            name: name.to_string(),
            launched_at,
            created_at: None,
            ready_at: None,
            gate_opened_at: None,
        }
    }

    /// The next step and when it is due; the earlier of Ready and the gate
    /// first (Ready on a tie).
    pub fn next(&self, t: &Timings) -> Option<(Duration, Step)> {
        let Some(created) = self.created_at else {
            return Some((self.launched_at + t.launch, Step::CreateNode));
        };
        let ready = self
            .ready_at
            .is_none()
            .then_some((created + t.ready, Step::PostReady));
        let gate = match (self.gate_opened_at, t.gate) {
            (Some(_), _) => None,
            (None, GateOpens::AfterRegistration(d)) => Some(created + d),
            (None, GateOpens::AfterReady(d)) => self.ready_at.map(|r| r + d),
        }
        .map(|at| (at, Step::OpenGate));
        [ready, gate].into_iter().flatten().min()
    }

    /// Records that `step` happened at `at`.
    pub fn record(&mut self, step: Step, at: Duration) {
        let slot = match step {
            Step::CreateNode => &mut self.created_at,
            Step::PostReady => &mut self.ready_at,
            Step::OpenGate => &mut self.gate_opened_at,
        };
        *slot = Some(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn walk(t: Timings) -> Vec<(Duration, Step)> {
        let mut i = Instance::new("n", secs(1));
        let mut out = Vec::new();
        while let Some((at, step)) = i.next(&t) {
            i.record(step, at);
            out.push((at, step));
        }
        out
    }

    #[test]
    fn gate_after_ready_or_before() {
        use Step::*;
        let after_ready = Timings {
            launch: secs(18),
            ready: secs(12),
            gate: GateOpens::AfterReady(secs(25)),
        };
        assert_eq!(
            walk(after_ready),
            vec![
                (secs(19), CreateNode),
                (secs(31), PostReady),
                (secs(56), OpenGate)
            ]
        );
        let before_ready = Timings {
            ready: secs(40),
            gate: GateOpens::AfterRegistration(secs(15)),
            ..after_ready
        };
        assert_eq!(
            walk(before_ready),
            vec![
                (secs(19), CreateNode),
                (secs(34), OpenGate),
                (secs(59), PostReady)
            ]
        );
    }
}
