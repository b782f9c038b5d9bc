//! Killing a command together with everything it started.

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// SIGKILLs the process group led by `pid` (commands are spawned with
/// `process_group(0)`, so `sh -c` and its children go together).
pub fn kill_group(pid: Option<u32>) {
    let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) else {
        return;
    };
    if let Err(e) = killpg(Pid::from_raw(pid), Signal::SIGKILL) {
        tracing::debug!(pid, error = %e, "killpg");
    }
}
