//! CPU time and memory of a process, read from /proc.

use std::time::Duration;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ProcError {
    #[error("reading /proc/{pid}/{file}: {source}")]
    Read {
        pid: u32,
        file: &'static str,
        source: std::io::Error,
    },
    #[error("unexpected format of /proc/{pid}/{file}")]
    Format { pid: u32, file: &'static str },
}

/// Clock ticks per second of `utime`/`stime`. Linux exports 100 to user
/// space on every architecture (USER_HZ), whatever the kernel's HZ.
pub const USER_HZ: u64 = 100;

/// CPU time and scheduling of a process so far, all threads together.
///
/// The split matters for reading a comparison: when the server is the
/// bottleneck, the load generator idles and must be woken for each answer,
/// which shows as system time and context switches on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub user: Duration,
    pub system: Duration,
    /// Context switches a thread asked for (it blocked or yielded).
    pub voluntary: u64,
    /// Context switches forced on a thread (preempted).
    pub involuntary: u64,
}

impl Usage {
    pub fn cpu(&self) -> Duration {
        self.user + self.system
    }

    pub fn switches(&self) -> u64 {
        self.voluntary + self.involuntary
    }

    /// What was used between `earlier` and `self`.
    pub fn since(&self, earlier: &Usage) -> Usage {
        Usage {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
            voluntary: self.voluntary.saturating_sub(earlier.voluntary),
            involuntary: self.involuntary.saturating_sub(earlier.involuntary),
        }
    }
}

/// CPU time (from /proc/PID/stat, which covers every thread) and context
/// switches (from each /proc/PID/task/TID/status: the process's own status
/// counts only its main thread). Threads that have exited drop out of the
/// switch counts; the servers measured here keep theirs.
pub fn usage(pid: u32) -> Result<Usage, ProcError> {
    let stat = read(pid, "stat")?;
    let (user, system) = parse_cpu_ticks(&stat).ok_or(ProcError::Format { pid, file: "stat" })?;
    let ticks = |t: u64| Duration::from_millis(t * 1000 / USER_HZ);
    let mut usage = Usage {
        user: ticks(user),
        system: ticks(system),
        ..Usage::default()
    };
    let tasks =
        std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|source| ProcError::Read {
            pid,
            file: "task",
            source,
        })?;
    for task in tasks.flatten() {
        // A thread may exit between listing and reading.
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        let (voluntary, involuntary) = parse_switches(&status).ok_or(ProcError::Format {
            pid,
            file: "task/*/status",
        })?;
        usage.voluntary += voluntary;
        usage.involuntary += involuntary;
    }
    Ok(usage)
}

fn read(pid: u32, file: &'static str) -> Result<String, ProcError> {
    std::fs::read_to_string(format!("/proc/{pid}/{file}")).map_err(|source| ProcError::Read {
        pid,
        file,
        source,
    })
}

/// `utime` and `stime` in ticks from the text of /proc/PID/stat.
pub fn parse_cpu_ticks(stat: &str) -> Option<(u64, u64)> {
    // The command name (field 2) may hold spaces and parentheses: skip past the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // rest starts at field 3 (state); utime and stime are fields 14 and 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime, stime))
}

/// Voluntary and involuntary context switches from the text of a
/// /proc/.../status file.
pub fn parse_switches(status: &str) -> Option<(u64, u64)> {
    let count = |name| status_field(status, name)?.parse::<u64>().ok();
    Some((
        count("voluntary_ctxt_switches:")?,
        count("nonvoluntary_ctxt_switches:")?,
    ))
}

/// The value of the `name` line (name with its colon) of a status file.
fn status_field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .map(str::trim)
}

/// Resident memory of a process, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Memory {
    /// Current resident set (VmRSS).
    pub rss: u64,
    /// Peak resident set since start (VmHWM).
    pub peak: u64,
}

pub fn memory(pid: u32) -> Result<Memory, ProcError> {
    let text = read(pid, "status")?;
    parse_memory(&text).ok_or(ProcError::Format {
        pid,
        file: "status",
    })
}

/// VmRSS and VmHWM from the text of /proc/PID/status.
pub fn parse_memory(status: &str) -> Option<Memory> {
    let kb = |name| {
        let v = status_field(status, name)?.strip_suffix("kB")?;
        v.trim().parse::<u64>().ok().map(|v| v * 1024)
    };
    Some(Memory {
        rss: kb("VmRSS:")?,
        peak: kb("VmHWM:")?,
    })
}

/// Megabytes (2^20 bytes) for printing.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn cpu_ticks_skip_odd_command_names() {
        let stat = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 \
                    350 125 0 0 20 0 3 0 88123 12345678 2048 18446744073709551615";
        assert_eq!(parse_cpu_ticks(stat), Some((350, 125)));
        assert_eq!(parse_cpu_ticks("1 (x) S 1 2"), None);
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn switches_are_read_by_name() {
        let status = "Name:\tx\nvoluntary_ctxt_switches:\t1200\nnonvoluntary_ctxt_switches:\t34\n";
        assert_eq!(parse_switches(status), Some((1200, 34)));
        assert_eq!(parse_switches("voluntary_ctxt_switches:\t5\n"), None);
        let (a, b) = (
            Usage {
                user: Duration::from_millis(30),
                system: Duration::from_millis(20),
                voluntary: 10,
                involuntary: 4,
            },
            Usage {
                user: Duration::from_millis(10),
                system: Duration::from_millis(5),
                voluntary: 3,
                involuntary: 1,
            },
        );
        let d = a.since(&b);
        assert_eq!(d.cpu(), Duration::from_millis(35));
        assert_eq!(d.switches(), 10);
        assert_eq!(b.since(&a), Usage::default(), "never negative");
    }

    #[test]
    fn memory_reads_rss_and_peak() {
        let status = "Name:\tnodegate-webhook\nVmPeak:\t  812340 kB\nVmHWM:\t   14336 kB\n\
                      VmRSS:\t   12288 kB\nThreads:\t3\n";
        assert_eq!(
            parse_memory(status),
            Some(Memory {
                rss: 12288 * 1024,
                peak: 14336 * 1024
            })
        );
        assert_eq!(parse_memory("Name:\tx\nVmRSS:\t1 kB\n"), None);
        assert!((mib(3 * 1024 * 1024) - 3.0).abs() < f64::EPSILON);
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let mem = memory(me).unwrap();
        assert!(mem.rss > 0 && mem.peak >= mem.rss);
        // Burn a little CPU so the counter moves from zero on any machine.
        let before = usage(me).unwrap();
        let mut x = 0u64;
        while usage(me).unwrap().cpu() == before.cpu() {
            for i in 0..100_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
        }
        assert!(x != 1);
        let after = usage(me).unwrap();
        assert!(after.cpu() > before.cpu());
        // A thread that blocks has switched voluntarily, and every
        // thread is counted, not only the main one.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let blocked = std::thread::spawn(move || rx.recv().is_err());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while usage(me).unwrap().voluntary <= after.voluntary {
            assert!(
                std::time::Instant::now() < deadline,
                "no voluntary switch counted"
            );
            std::thread::yield_now();
        }
        drop(tx);
        assert!(blocked.join().unwrap());
    }
}
