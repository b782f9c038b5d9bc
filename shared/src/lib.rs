//! Types and rules shared by the nodegate webhook and agent: taint specs,
//! the keys nodegate writes on Nodes, the reboot rule, JSON patch builders,
//! how a binary waits for its stop signal, and the connection cap of every
//! nodegate port.

#[cfg(feature = "admin")]
pub mod admin;
pub mod connection_gate;
pub mod duration;
#[cfg(feature = "cli")]
pub mod gate_flags;
pub mod gates;
pub mod keys;
#[cfg(feature = "cel")]
pub mod match_conditions;
pub mod node;
pub mod patch;
pub mod path_token;
pub mod signal;
pub mod taint;

#[cfg(feature = "kube")]
pub use node::NodeResource;
pub use node::{NodeAddress, NodeView};
pub use taint::{Effect, TaintError, TaintSpec};
