//! nodegate-emulator: a Kubernetes API server for the resources nodegate
//! touches, modelled module by module on the upstream packages it follows
//! (each file names them), with the real admission order and webhook calls;
//! plus a kubelet that writes its Node and admits its pods the way kubelet
//! does, kube-controller-manager's taint-eviction controller, and a scripted
//! webhook to pin the admission semantics. Test code: nothing shipped
//! depends on it.
//!
//! Modules, from the bottom up (a module uses only those above it):
//! `util`, `tolerations`, `pod_admission`, `taint_eviction`, `users`,
//! `resources`, `status`, `tls`, `fanout`, `smp`, `selectors`, `store`,
//! `table`, `discovery`, `rbac`, `node_authz`, `admission`,
//! `impersonation`, `token_request`, `service_proxy`, `api`, `server`, `raw`, `kubelet`,
//! `taint_eviction_controller`, `fake_webhook`.

pub mod admission;
pub mod api;
pub mod discovery;
pub mod fake_webhook;
pub mod fanout;
pub mod impersonation;
pub mod kubelet;
pub mod node_authz;
pub mod pod_admission;
pub mod raw;
pub mod rbac;
pub mod resources;
pub mod selectors;
pub mod server;
pub mod service_proxy;
pub mod smp;
pub mod status;
pub mod store;
pub mod table;
pub mod taint_eviction;
pub mod taint_eviction_controller;
pub mod tls;
pub mod token_request;
pub mod tolerations;
pub mod users;
pub mod util;

pub use server::{Emulator, EmulatorOptions};
