//! The connection cap: a connection accepted over the cap is closed at once,
//! so a flood of connections costs a socket for a moment instead of memory
//! for as long as the attacker likes.
//!
//! A few extra slots are kept for peers on this host (loopback, or the
//! host's own address, which is where the kubelet's probes of a host-network
//! pod come from), so a full admin port still answers its probes.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Slots of one listener.
#[derive(Debug, Clone)]
pub struct ConnectionGate {
    any: Arc<Semaphore>,
    local: Arc<Semaphore>,
}

impl ConnectionGate {
    /// `max` connections from anyone, plus `local_reserve` more from this host.
    pub fn new(max: usize, local_reserve: usize) -> Self {
        Self {
            any: Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))),
            local: Arc::new(Semaphore::new(local_reserve.min(Semaphore::MAX_PERMITS))),
        }
    }

    /// A slot for a connection from `peer` accepted on `local`, or `None`
    /// when it must be closed.
    pub fn admit(&self, peer: SocketAddr, local: SocketAddr) -> Option<OwnedSemaphorePermit> {
        if let Ok(p) = self.any.clone().try_acquire_owned() {
            return Some(p);
        }
        let same_host = peer.ip().is_loopback() || peer.ip() == local.ip();
        if same_host {
            self.local.clone().try_acquire_owned().ok()
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_gate_refuses_remote_peers_and_keeps_a_reserve_for_this_host() {
        let gate = ConnectionGate::new(2, 1);
        let local: SocketAddr = "10.0.0.5:9444".parse().unwrap_or_else(|_| unreachable!());
        let remote: SocketAddr = "10.0.0.9:40000".parse().unwrap_or_else(|_| unreachable!());
        let kubelet: SocketAddr = "10.0.0.5:51000".parse().unwrap_or_else(|_| unreachable!());
        let a = gate.admit(remote, local);
        let b = gate.admit(remote, local);
        assert!(a.is_some() && b.is_some());
        assert!(gate.admit(remote, local).is_none());
        let k = gate.admit(kubelet, local);
        assert!(k.is_some());
        assert!(gate.admit(kubelet, local).is_none());
        drop(a);
        assert!(gate.admit(remote, local).is_some());
    }
}
