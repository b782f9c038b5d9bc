//! Load generator and transport-limit baseline for the nodegate webhook.
//!
//! `nodegate-loadgen compare` starts the baseline (`nodegate-baseline`: the
//! same TLS + HTTP stack answering a fixed review) and the real
//! `nodegate-webhook` as separate processes, drives both with realistic Node
//! AdmissionReviews and reports throughput, latency, errors and the servers'
//! CPU time and memory.

pub mod baseline;
pub mod certdir;
pub mod cli;
pub mod client;
pub mod compare;
pub mod duration;
pub mod fanout;
pub mod fixtures;
pub mod load;
pub mod micro;
pub mod process;
pub mod procfs;
pub mod schedule;
pub mod siege;
pub mod stats;
