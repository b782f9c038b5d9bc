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

/// CPU time used so far (user + system) by all threads of `pid`.
pub fn cpu_time(pid: u32) -> Result<Duration, ProcError> {
    let text =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|source| ProcError::Read {
            pid,
            file: "stat",
            source,
        })?;
    parse_cpu_ticks(&text)
        .map(|t| Duration::from_millis(t * 1000 / USER_HZ))
        .ok_or(ProcError::Format { pid, file: "stat" })
}

/// `utime + stime` in ticks from the text of /proc/PID/stat.
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: skip past the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // rest starts at field 3 (state); utime and stime are fields 14 and 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
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
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|source| {
        ProcError::Read {
            pid,
            file: "status",
            source,
        }
    })?;
    parse_memory(&text).ok_or(ProcError::Format {
        pid,
        file: "status",
    })
}

/// VmRSS and VmHWM from the text of /proc/PID/status.
pub fn parse_memory(status: &str) -> Option<Memory> {
    let kb = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|v| v * 1024)
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
        assert_eq!(parse_cpu_ticks(stat), Some(475));
        assert_eq!(parse_cpu_ticks("1 (x) S 1 2"), None);
        assert_eq!(parse_cpu_ticks("garbage"), None);
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
        let before = cpu_time(me).unwrap();
        let mut x = 0u64;
        while cpu_time(me).unwrap() == before {
            for i in 0..100_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
        }
        assert!(x != 1);
        assert!(cpu_time(me).unwrap() > before);
    }
}
