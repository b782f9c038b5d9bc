//! Drives N connections against a target and measures the answers and the
//! server process.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::client::{Conn, Target};
use crate::fixtures::{Fixture, uid};
use crate::procfs::{self, Memory, Usage};
use crate::schedule::{Schedule, latency_origin};
use crate::stats::{Expect, Failure, Failures, Latencies};

/// What to send and how fast.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub connections: usize,
    /// Requests per second in open loop; `None` = closed loop, as fast as answers come.
    pub rate: Option<f64>,
    pub duration: Option<Duration>,
    pub requests: Option<u64>,
    pub fixtures: Arc<Vec<Fixture>>,
    /// Check answers as the webhook's (uid, patch) or only as a transport.
    pub webhook: bool,
    /// Close and reopen a connection after this many requests (forces handshakes).
    pub reconnect_after: Option<u64>,
    pub timeout: Duration,
    /// The server process, for CPU time and memory.
    pub server_pid: Option<u32>,
    /// How often to sample the server's memory.
    pub sample_every: Duration,
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub elapsed: Duration,
    pub ok: u64,
    pub failures: Failures,
    /// From due time (open loop, includes queueing) or send (closed loop) to full answer.
    pub latency: Latencies,
    /// From the actual send to the full answer.
    pub service: Latencies,
    pub connects: u64,
    pub bytes_sent: u64,
    /// What the server used during the run.
    pub server: Option<Usage>,
    /// What the load generator itself used.
    pub own: Option<Usage>,
    /// Server memory over the run (time since start, memory).
    pub memory: Vec<(Duration, Memory)>,
}

impl LoadReport {
    pub fn requests_per_sec(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.ok as f64 / secs
        } else {
            0.0
        }
    }

    /// Server CPU per successful request.
    pub fn cpu_per_request(&self) -> Option<Duration> {
        self.per_request(self.server?.cpu())
    }

    /// `total` spread over the successful requests.
    pub fn per_request(&self, total: Duration) -> Option<Duration> {
        (self.ok > 0).then(|| total / u32::try_from(self.ok).unwrap_or(u32::MAX))
    }

    /// Server context switches per successful request.
    pub fn switches_per_request(&self) -> Option<f64> {
        let server = self.server?;
        (self.ok > 0).then(|| server.switches() as f64 / self.ok as f64)
    }

    /// Server CPU use as a share of one core.
    pub fn server_cores(&self) -> Option<f64> {
        self.cores(self.server?.cpu())
    }

    /// `cpu` as a share of one core over the run.
    pub fn cores(&self, cpu: Duration) -> Option<f64> {
        let secs = self.elapsed.as_secs_f64();
        (secs > 0.0).then(|| cpu.as_secs_f64() / secs)
    }

    pub fn peak_rss(&self) -> Option<u64> {
        self.memory.iter().map(|(_, m)| m.peak).max()
    }
}

#[derive(Default)]
struct WorkerResult {
    ok: u64,
    failures: Failures,
    latency: Latencies,
    service: Latencies,
    connects: u64,
    bytes_sent: u64,
    last_done: Option<Instant>,
}

/// Runs one measurement.
pub async fn run(target: &Target, cfg: &LoadConfig) -> LoadReport {
    let start = Instant::now();
    let schedule = Arc::new(Schedule::new(start, cfg.rate, cfg.duration, cfg.requests));
    let server_before = cfg.server_pid.and_then(|p| procfs::usage(p).ok());
    let own_before = procfs::usage(std::process::id()).ok();

    let (stop_tx, stop_rx) = watch::channel(false);
    let sampler = cfg
        .server_pid
        .map(|pid| tokio::spawn(sample_memory(pid, start, cfg.sample_every, stop_rx)));

    let mut workers = Vec::with_capacity(cfg.connections);
    for id in 0..cfg.connections {
        let (target, cfg, schedule) = (target.clone(), cfg.clone(), schedule.clone());
        let id = u32::try_from(id).unwrap_or(u32::MAX);
        workers.push(tokio::spawn(async move {
            worker(id, &target, &cfg, &schedule).await
        }));
    }
    let mut report = LoadReport::default();
    let mut last_done = start;
    for w in workers {
        let Ok(r) = w.await else {
            report.failures.add(Failure::Transport);
            continue;
        };
        report.ok += r.ok;
        report.failures.merge(&r.failures);
        report.latency.merge(&r.latency);
        report.service.merge(&r.service);
        report.connects += r.connects;
        report.bytes_sent += r.bytes_sent;
        last_done = last_done.max(r.last_done.unwrap_or(start));
    }
    report.elapsed = last_done - start;
    report.server = server_before.and_then(|before| {
        let after = procfs::usage(cfg.server_pid?).ok()?;
        Some(after.since(&before))
    });
    report.own = own_before.and_then(|before| {
        let after = procfs::usage(std::process::id()).ok()?;
        Some(after.since(&before))
    });
    let _ = stop_tx.send(true);
    if let Some(s) = sampler {
        report.memory = s.await.unwrap_or_default();
    }
    report
}

async fn worker(id: u32, target: &Target, cfg: &LoadConfig, schedule: &Schedule) -> WorkerResult {
    let mut r = WorkerResult::default();
    let mut checker = crate::stats::Checker::default();
    let mut conn: Option<Conn> = None;
    let mut used = 0u64;
    loop {
        let taken = Instant::now();
        let Some(ticket) = schedule.take(taken) else {
            break;
        };
        if let Some(due) = ticket.due.filter(|d| *d > taken) {
            tokio::time::sleep_until(due.into()).await;
        }
        if cfg.reconnect_after.is_some_and(|n| used >= n) {
            conn = None;
        }
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match tokio::time::timeout(cfg.timeout, target.connect()).await {
                Ok(Ok(c)) => {
                    r.connects += 1;
                    used = 0;
                    conn.insert(c)
                }
                _ => {
                    r.failures.add(Failure::Connect);
                    // Do not spin on a server that refuses connections.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let fixture = &cfg.fixtures[(ticket.seq % cfg.fixtures.len() as u64) as usize];
        let uid = uid(id, ticket.seq);
        let body = fixture.body(&uid);
        r.bytes_sent += body.len() as u64;
        let sent = Instant::now();
        let origin = latency_origin(ticket.due, taken, sent);
        let answer = tokio::time::timeout(cfg.timeout, c.post(body)).await;
        let done = Instant::now();
        used += 1;
        r.latency.record(done - origin);
        r.service.record(done - sent);
        r.last_done = Some(done);
        let expect = if cfg.webhook {
            Expect::Webhook {
                patch: fixture.expect_patch,
            }
        } else {
            Expect::Transport
        };
        let outcome = match answer {
            Err(_) => Err(Failure::Timeout),
            Ok(Err(_)) => Err(Failure::Transport),
            Ok(Ok((200, body))) => checker.check(&body, &uid, expect),
            Ok(Ok((status, _))) => Err(Failure::Status(status)),
        };
        match outcome {
            Ok(()) => r.ok += 1,
            Err(f) => {
                if matches!(f, Failure::Timeout | Failure::Transport) {
                    conn = None;
                }
                r.failures.add(f);
            }
        }
    }
    r
}

async fn sample_memory(
    pid: u32,
    start: Instant,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) -> Vec<(Duration, Memory)> {
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => {
                if let Ok(m) = procfs::memory(pid) {
                    samples.push((start.elapsed(), m));
                }
                return samples;
            }
        }
        if let Ok(m) = procfs::memory(pid) {
            samples.push((start.elapsed(), m));
        }
    }
}

/// RSS growth over a run: mean of the last quarter of samples minus mean of
/// the first quarter after warm-up (the first sample is skipped). `None`
/// with fewer than 8 samples.
pub fn rss_growth(samples: &[(Duration, Memory)]) -> Option<i64> {
    let s: Vec<u64> = samples.iter().skip(1).map(|(_, m)| m.rss).collect();
    if s.len() < 8 {
        return None;
    }
    let q = s.len() / 4;
    let mean = |v: &[u64]| (v.iter().sum::<u64>() / v.len() as u64) as i64;
    Some(mean(&s[s.len() - q..]) - mean(&s[..q]))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn samples(rss: &[u64]) -> Vec<(Duration, Memory)> {
        rss.iter()
            .enumerate()
            .map(|(i, r)| (Duration::from_secs(i as u64), Memory { rss: *r, peak: *r }))
            .collect()
    }

    #[test]
    fn growth_compares_last_and_first_quarters() {
        // First sample (start-up) is ignored.
        let flat = samples(&[1, 10, 10, 10, 10, 10, 10, 10, 10]);
        assert_eq!(rss_growth(&flat), Some(0));
        let leak = samples(&[5, 10, 10, 20, 20, 30, 30, 40, 40]);
        assert_eq!(rss_growth(&leak), Some(30));
        assert_eq!(rss_growth(&samples(&[1, 2, 3])), None);
    }

    #[test]
    fn report_rates() {
        let r = LoadReport {
            elapsed: Duration::from_secs(2),
            ok: 1000,
            server: Some(Usage {
                user: Duration::from_millis(700),
                system: Duration::from_millis(300),
                voluntary: 150,
                involuntary: 50,
            }),
            memory: samples(&[3, 9, 4]),
            ..LoadReport::default()
        };
        assert!((r.requests_per_sec() - 500.0).abs() < 1e-9);
        assert_eq!(r.cpu_per_request(), Some(Duration::from_millis(1)));
        assert_eq!(
            r.per_request(Duration::from_millis(300)),
            Some(Duration::from_micros(300))
        );
        assert!((r.switches_per_request().unwrap() - 0.2).abs() < 1e-9);
        assert!((r.server_cores().unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(r.peak_rss(), Some(9));
        assert_eq!(LoadReport::default().requests_per_sec(), 0.0);
        assert_eq!(LoadReport::default().cpu_per_request(), None);
        assert_eq!(LoadReport::default().switches_per_request(), None);
    }
}
