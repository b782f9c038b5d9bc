//! The connection cap: a connection accepted over the cap is closed at once,
//! so a flood of connections costs a socket for a moment instead of memory
//! (and a file descriptor) for as long as the attacker likes.
//!
//! A few extra slots are kept for peers on this host (loopback, or the
//! address the peer dialled, which is where the kubelet's probes of a
//! host-network pod come from), so a full port still answers its probes.
//!
//! Used by the webhook's ports and by the admin port of the agent and the
//! roster publisher ([`GatedListener`]).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Decides whether a peer is on this host, given its IP and the IP it dialled.
pub type SameHost = fn(peer: IpAddr, local: IpAddr) -> bool;

/// The rule of [`ConnectionGate::new`]: loopback, or the peer's source is
/// the very address it dialled (only this host can send from it; a
/// host-network pod such as the kubelet's probes uses the node's IP).
/// IPv4-mapped IPv6 addresses, as a dual-stack listener sees IPv4 peers,
/// count as the IPv4 address.
pub fn same_host(peer: IpAddr, local: IpAddr) -> bool {
    let (peer, local) = (peer.to_canonical(), local.to_canonical());
    peer.is_loopback() || peer == local
}

/// Slots of one listener.
#[derive(Debug, Clone)]
pub struct ConnectionGate {
    any: Arc<Semaphore>,
    local: Arc<Semaphore>,
    same_host: SameHost,
}

impl ConnectionGate {
    /// `max` connections from anyone, plus `local_reserve` more from this host.
    pub fn new(max: usize, local_reserve: usize) -> Self {
        Self {
            any: Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))),
            local: Arc::new(Semaphore::new(local_reserve.min(Semaphore::MAX_PERMITS))),
            same_host,
        }
    }

    /// Replaces the [`same_host`] rule (tests: all of 127/8 is loopback, so
    /// a test narrows "this host" to stand in for a remote peer).
    pub fn with_same_host(mut self, rule: SameHost) -> Self {
        self.same_host = rule;
        self
    }

    /// A slot for a connection from `peer` accepted on `local`, or `None`
    /// when it must be closed.
    pub fn admit(&self, peer: SocketAddr, local: SocketAddr) -> Option<OwnedSemaphorePermit> {
        if let Ok(p) = self.any.clone().try_acquire_owned() {
            return Some(p);
        }
        if (self.same_host)(peer.ip(), local.ip()) {
            self.local.clone().try_acquire_owned().ok()
        } else {
            None
        }
    }
}

/// At most one "connection cap reached" warning per this.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// A connection the gate let in; its slot frees when `slot` is dropped.
#[derive(Debug)]
pub struct Admitted {
    pub stream: TcpStream,
    pub peer: SocketAddr,
    pub slot: OwnedSemaphorePermit,
}

/// A listener behind a [`ConnectionGate`]: connections over the cap are
/// closed as soon as accepted, with a rate-limited warning.
#[derive(Debug)]
pub struct GatedListener {
    listener: TcpListener,
    local: SocketAddr,
    gate: ConnectionGate,
    max: usize,
    last_warning: Option<Instant>,
}

impl GatedListener {
    /// `max` connections from anyone plus `local_reserve` from this host.
    pub fn new(listener: TcpListener, max: usize, local_reserve: usize) -> io::Result<Self> {
        Self::with_gate(listener, ConnectionGate::new(max, local_reserve), max)
    }

    /// With a gate made by the caller; `max` is only reported in the warning.
    pub fn with_gate(listener: TcpListener, gate: ConnectionGate, max: usize) -> io::Result<Self> {
        Ok(Self {
            local: listener.local_addr()?,
            listener,
            gate,
            max,
            last_warning: None,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The next connection the gate admits; `refused` is called for each
    /// one closed on the way. Cancel-safe (for `select!`): a connection is
    /// either returned or already closed.
    pub async fn accept(&mut self, mut refused: impl FnMut()) -> Admitted {
        loop {
            let (stream, peer) = match self.listener.accept().await {
                Ok(a) => a,
                Err(err) => {
                    // EMFILE and the like: back off instead of spinning.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // The address dialled, not the listener's: with an unspecified
            // bind, that is the one the same-host rule needs.
            let dialled = stream.local_addr().unwrap_or(self.local);
            if let Some(slot) = self.gate.admit(peer, dialled) {
                return Admitted { stream, peer, slot };
            }
            // Closing at once keeps the cost of a flood at one socket for
            // a moment; the peer sees the connection closed.
            drop(stream);
            refused();
            if self.last_warning.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                self.last_warning = Some(Instant::now());
                tracing::warn!(local = %self.local, max = self.max, "connection cap reached: closing new connections");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap_or_else(|_| unreachable!())
    }

    #[test]
    fn full_gate_refuses_remote_peers_and_keeps_a_reserve_for_this_host() {
        let gate = ConnectionGate::new(2, 1);
        let local = addr("10.0.0.5:9444");
        let remote = addr("10.0.0.9:40000");
        let kubelet = addr("10.0.0.5:51000");
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

    #[test]
    fn this_host_is_loopback_or_the_address_dialled() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap_or_else(|_| unreachable!());
        let node = ip("10.0.0.5");
        assert!(same_host(ip("127.0.0.1"), node));
        assert!(same_host(ip("127.0.0.2"), ip("127.0.0.1")));
        assert!(same_host(ip("::1"), ip("::1")));
        assert!(same_host(node, node));
        // A dual-stack listener sees IPv4 peers as IPv4-mapped addresses.
        assert!(same_host(ip("::ffff:127.0.0.1"), ip("::ffff:10.0.0.5")));
        assert!(same_host(ip("::ffff:10.0.0.5"), node));
        // A pod on the node: its own IP, not the node's.
        assert!(!same_host(ip("10.244.1.7"), node));
        assert!(!same_host(ip("::ffff:10.244.1.7"), ip("::ffff:10.0.0.5")));
    }
}
