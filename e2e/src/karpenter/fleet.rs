//! What happens to a launched instance, and when, in virtual time: the
//! cloud provider boots it and its kubelet creates the Node (`launch` after
//! the NodeClaim), the kubelet reports Ready (`ready` after the create), and
//! the network agent becomes ready, whereupon nodegate's agent removes the
//! gate — a fixed time after Ready, or after registration (so possibly
//! before Ready). Karpenter registers a Node the moment it appears (its
//! NodeClaim controllers watch Nodes), so registration is the create here.
//!
//! An instance may reboot once its first boot is done ([`Reboot`]): the
//! kubelet starts on a new bootID (its create of the existing Node, then
//! its status, NotReady), reports Ready `ready` later, and the network agent
//! is ready again `gate` after that. nodegate's webhook re-adds the gate at
//! the kubelet's create; the agent removes it as on the first boot.

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

/// A reboot wave: the first `nodes` NodeClaims (in launch order) reboot at
/// `at`, each Ready `ready` after its kubelet's start and its gate open
/// `gate` after Ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebootWave {
    pub at: Duration,
    pub nodes: usize,
    pub ready: Duration,
    pub gate: Duration,
}

impl RebootWave {
    /// The reboot of one instance of the wave.
    pub fn reboot(&self) -> Reboot {
        Reboot::new(self.at, self.ready, self.gate)
    }

    /// When the gates of a wave that started on time open again.
    pub fn gates_open_at(&self) -> Duration {
        self.at + self.ready + self.gate
    }
}

/// One step of an instance's life. After a reboot, `PostReady` and
/// `OpenGate` are the new boot's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    CreateNode,
    PostReady,
    OpenGate,
    Reboot,
}

/// A reboot of an instance and the moments its steps happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reboot {
    /// When the kubelet starts on the new boot (or when the first boot's
    /// last step happened, if later).
    pub at: Duration,
    /// The kubelet's start → Ready.
    pub ready: Duration,
    /// Ready → the network agent ready, the gate open.
    pub gate: Duration,
    pub done_at: Option<Duration>,
    pub ready_at: Option<Duration>,
    pub gate_opened_at: Option<Duration>,
}

impl Reboot {
    pub fn new(at: Duration, ready: Duration, gate: Duration) -> Self {
        Self {
            at,
            ready,
            gate,
            done_at: None,
            ready_at: None,
            gate_opened_at: None,
        }
    }

    /// Rebooted and the gate not open again yet.
    pub fn in_progress(&self) -> bool {
        self.done_at.is_some() && self.gate_opened_at.is_none()
    }
}

/// One launched instance and the moments its steps happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub name: String,
    pub launched_at: Duration,
    pub created_at: Option<Duration>,
    pub ready_at: Option<Duration>,
    pub gate_opened_at: Option<Duration>,
    pub reboot: Option<Reboot>,
}

impl Instance {
    pub fn new(name: &str, launched_at: Duration) -> Self {
        Self {
            name: name.to_string(),
            launched_at,
            created_at: None,
            ready_at: None,
            gate_opened_at: None,
            reboot: None,
        }
    }

    /// The kubelet has started on a new boot.
    pub fn rebooted(&self) -> bool {
        self.reboot.is_some_and(|r| r.done_at.is_some())
    }

    /// The next step and when it is due; the earlier of Ready and the gate
    /// first (Ready on a tie); then the reboot, if any, and its steps.
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
        let first = [ready, gate].into_iter().flatten().min();
        if first.is_some() {
            return first;
        }
        let r = self.reboot?;
        let Some(done) = r.done_at else {
            let first_done = self.ready_at.max(self.gate_opened_at).unwrap_or(created);
            return Some((r.at.max(first_done), Step::Reboot));
        };
        let ready = r
            .ready_at
            .is_none()
            .then_some((done + r.ready, Step::PostReady));
        let gate = match (r.gate_opened_at, r.ready_at) {
            (None, Some(ready)) => Some((ready + r.gate, Step::OpenGate)),
            _ => None,
        };
        [ready, gate].into_iter().flatten().min()
    }

    /// Records that `step` happened at `at`.
    pub fn record(&mut self, step: Step, at: Duration) {
        let slot = match (step, self.reboot.as_mut().filter(|r| r.done_at.is_some())) {
            (Step::CreateNode, _) => &mut self.created_at,
            (Step::Reboot, _) => match self.reboot.as_mut() {
                Some(r) => &mut r.done_at,
                None => return,
            },
            (Step::PostReady, Some(r)) => &mut r.ready_at,
            (Step::OpenGate, Some(r)) => &mut r.gate_opened_at,
            (Step::PostReady, None) => &mut self.ready_at,
            (Step::OpenGate, None) => &mut self.gate_opened_at,
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

    #[test]
    fn reboot_after_the_first_boot() {
        use Step::*;
        let t = Timings {
            launch: secs(18),
            ready: secs(12),
            gate: GateOpens::AfterReady(secs(25)),
        };
        let mut i = Instance::new("n", secs(1));
        // Due at 40 s, but the first boot's gate opens at 56 s: after it.
        i.reboot = Some(super::Reboot::new(secs(40), secs(12), secs(25)));
        let mut steps = Vec::new();
        while let Some((at, step)) = i.next(&t) {
            i.record(step, at);
            steps.push((at, step));
        }
        assert_eq!(
            steps,
            vec![
                (secs(19), CreateNode),
                (secs(31), PostReady),
                (secs(56), OpenGate),
                (secs(56), Reboot),
                (secs(68), PostReady),
                (secs(93), OpenGate),
            ]
        );
        assert_eq!(
            (i.ready_at, i.gate_opened_at),
            (Some(secs(31)), Some(secs(56)))
        );
        let r = i.reboot.unwrap();
        assert_eq!((r.done_at, r.ready_at), (Some(secs(56)), Some(secs(68))));
        assert!(i.rebooted() && !r.in_progress());
    }
}
