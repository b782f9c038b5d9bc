//! nodegate-tests: an emulated Kubernetes API server for Nodes (with the real
//! admission order and webhook calls), a simulated kubelet, helpers that run
//! the real nodegate binaries, and the `nodegate-sim` demo.

pub mod admission;
pub mod api;
pub mod discovery;
pub mod resources;
pub mod selectors;
pub mod server;
pub mod smp;
pub mod status;
pub mod store;
pub mod table;
pub mod tls;
pub mod token_request;
pub mod users;
pub mod util;

pub use server::{Emulator, EmulatorOptions};
pub mod fake_webhook;
pub mod impersonation;
pub mod kubelet;
pub mod node_authz;
pub mod process;

pub use process::{LoggedChild, WebhookOptions, WebhookProcess, bin_path};
pub mod cluster;
pub mod fanout;
pub mod raw;
pub mod rbac;
pub mod sim;
pub mod standin;
