//! Helpers the end-to-end suites' scenario files share (`nodegate`,
//! `confinement`, `roster_writers`; each declares `mod support;`). Each
//! suite uses only part of them, hence `dead_code` allowed here.
#![allow(dead_code)]

pub mod admission;
pub mod credentials;
pub mod dry_run;
pub mod editor;
pub mod kubectl;
pub mod node_writes;
pub mod poll;
pub mod refusals;
pub mod registration;
pub mod roster;
pub mod roster_publisher;
pub mod taints;
pub mod target_node;
