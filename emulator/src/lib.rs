//! nodegate-emulator: a Kubernetes API server for the resources nodegate
//! touches, modelled module by module on the upstream packages it follows
//! (each file names them), with the real admission order and webhook calls;
//! plus a kubelet that writes its Node the way kubelet does and a scripted
//! webhook to pin the admission semantics. Test code: nothing shipped
//! depends on it.
//!
//! Modules, from the bottom up (a module uses only those above it):
//! `util`, `users`, `resources`, `status`, `tls`, `fanout`, `smp`,
//! `selectors`, `store`, `table`, `discovery`, `rbac`, `node_authz`,
//! `admission`, `impersonation`, `token_request`, `api`, `server`, `raw`,
//! `kubelet`, `fake_webhook`.

pub mod admission;
pub mod api;
pub mod discovery;
pub mod fake_webhook;
pub mod fanout;
pub mod impersonation;
pub mod kubelet;
pub mod node_authz;
pub mod raw;
pub mod rbac;
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
