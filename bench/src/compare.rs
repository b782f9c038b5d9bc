//! `nodegate-loadgen compare`: baseline and webhook in one go, then the
//! webhook at half its maximum rate, and the targets checked.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;

use crate::certdir::{CertDir, RotateStyle};
use crate::client::{Proto, Target};
use crate::fixtures::{self, Workload};
use crate::load::{self, LoadConfig, LoadReport};
use crate::process::{Server, sibling_binary};
use crate::procfs::mib;
use crate::stats::ms;

/// The targets.
pub const MIN_RATIO: f64 = 0.70;
pub const MAX_P99: Duration = Duration::from_millis(2);
pub const MAX_PEAK_RSS: u64 = 30 * 1024 * 1024;
/// RSS growth over a soak that still counts as "no growth" (allocator noise).
pub const MAX_RSS_GROWTH: i64 = 1024 * 1024;

/// Everything `compare` needs.
#[derive(Debug, Clone)]
pub struct CompareConfig {
    pub duration: Duration,
    pub warmup: Duration,
    pub connections: usize,
    pub proto: Proto,
    pub workload: Workload,
    pub rounds: u32,
    pub rotate: Option<RotateStyle>,
    pub rotate_every: Duration,
    pub reconnect_after: Option<u64>,
    pub soak: Option<Duration>,
    pub timeout: Duration,
    pub webhook_bin: Option<PathBuf>,
    pub baseline_bin: Option<PathBuf>,
    pub webhook_args: Vec<String>,
}

/// One target and whether it was met.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub name: &'static str,
    pub target: String,
    pub measured: String,
    pub met: bool,
}

/// What `compare` measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub text: String,
    pub verdicts: Vec<Verdict>,
}

impl Outcome {
    pub fn all_met(&self) -> bool {
        self.verdicts.iter().all(|v| v.met)
    }
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cores} cores, {model}")
}

fn load_config(cfg: &CompareConfig, pid: u32, webhook: bool) -> LoadConfig {
    LoadConfig {
        connections: cfg.connections,
        rate: None,
        duration: Some(cfg.duration),
        requests: None,
        fixtures: Arc::new(fixtures::workload(cfg.workload)),
        webhook,
        reconnect_after: None,
        timeout: cfg.timeout,
        server_pid: Some(pid),
        sample_every: Duration::from_secs(1),
    }
}

/// Prints one phase's numbers.
pub fn describe(label: &str, r: &LoadReport) -> String {
    let mut s = format!(
        "{label}: {:.0} req/s ({} ok in {:.1}s, errors: {})\n  latency  {}\n",
        r.requests_per_sec(),
        r.ok,
        r.elapsed.as_secs_f64(),
        r.failures,
        r.latency.summary()
    );
    if r.latency.summary() != r.service.summary() {
        let _ = writeln!(s, "  service  {}", r.service.summary());
    }
    let _ = write!(s, "  server");
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    if let Some(c) = r.cpu_per_request() {
        let _ = write!(s, " cpu {:.1}µs/req", us(c));
    }
    // User vs system time and switches show the scheduling cost that
    // grows when the server, not the generator, is the bottleneck.
    if let Some(u) = r.server
        && let (Some(user), Some(sys), Some(sw)) = (
            r.per_request(u.user),
            r.per_request(u.system),
            r.switches_per_request(),
        )
    {
        let _ = write!(
            s,
            " [user {:.1} + sys {:.1}; {sw:.2} switches/req]",
            us(user),
            us(sys)
        );
    }
    if let Some(c) = r.server_cores() {
        let _ = write!(s, " ({c:.2} cores)");
    }
    if let Some(p) = r.peak_rss() {
        let _ = write!(s, ", peak RSS {:.1} MiB", mib(p));
    }
    if let Some((_, last)) = r.memory.last() {
        let _ = write!(s, ", RSS now {:.1} MiB", mib(last.rss));
    }
    if let Some(own) = r.own
        && let (Some(cores), Some(per)) = (r.cores(own.cpu()), r.per_request(own.cpu()))
    {
        let _ = write!(s, "; loadgen {cores:.2} cores, {:.1}µs/req", us(per));
    }
    let _ = writeln!(s, "; {} connects", r.connects);
    s
}

/// Runs the whole comparison.
pub async fn run(cfg: CompareConfig) -> anyhow::Result<Outcome> {
    let baseline_bin = match &cfg.baseline_bin {
        Some(p) => p.clone(),
        None => sibling_binary("nodegate-baseline")?,
    };
    let webhook_bin = match &cfg.webhook_bin {
        Some(p) => p.clone(),
        None => sibling_binary("nodegate-webhook")?,
    };
    let mut certs = CertDir::new(cfg.rotate.unwrap_or(RotateStyle::Secret))?;
    let tls_args = [
        "--tls-cert".to_owned(),
        certs.cert_path().display().to_string(),
        "--tls-key".to_owned(),
        certs.key_path().display().to_string(),
    ];
    let mut base_args = vec!["--listen".to_owned(), "127.0.0.1:0".to_owned()];
    base_args.extend(tls_args.iter().cloned());
    let mut hook_args = vec![
        "--listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--admin-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        // No cluster here: the reboot patches have nothing to call.
        "--disable-reboot-patches".to_owned(),
    ];
    hook_args.extend(tls_args.iter().cloned());
    hook_args.extend(cfg.webhook_args.iter().cloned());

    let mut out = format!(
        "machine: {}\nworkload: {:?} ({} bytes), {} connections, {:?}, {}s per phase\n\n",
        machine(),
        cfg.workload,
        fixtures::workload(cfg.workload)
            .first()
            .map_or(0, fixtures::Fixture::len),
        cfg.connections,
        cfg.proto,
        cfg.duration.as_secs_f64()
    );
    print!("{out}");

    // Phases 1 and 2: maximum throughput, alternating so drift hits both.
    let baseline = Server::start(&baseline_bin, &base_args).await?;
    let webhook = Server::start(&webhook_bin, &hook_args).await?;
    let base_target = Target::new(baseline.https, certs.ca_pem(), cfg.proto)?;
    let hook_target = Target::new(webhook.https, certs.ca_pem(), cfg.proto)?;
    let mut best_base: Option<LoadReport> = None;
    let mut best_hook: Option<LoadReport> = None;
    for round in 1..=cfg.rounds.max(1) {
        for (name, server, target, is_hook) in [
            ("baseline", &baseline, &base_target, false),
            ("webhook", &webhook, &hook_target, true),
        ] {
            let mut lc = load_config(&cfg, server.pid, is_hook);
            lc.duration = Some(cfg.warmup);
            load::run(target, &lc).await;
            lc.duration = Some(cfg.duration);
            let r = load::run(target, &lc).await;
            let text = describe(&format!("[round {round}] {name} max (closed loop)"), &r);
            print!("{text}");
            out.push_str(&text);
            let best = if is_hook {
                &mut best_hook
            } else {
                &mut best_base
            };
            if best
                .as_ref()
                .is_none_or(|b| r.requests_per_sec() > b.requests_per_sec())
            {
                *best = Some(r);
            }
        }
    }
    let hook_tail = webhook.log_tail();
    webhook.stop().await.context("stopping the webhook")?;
    let base = best_base.context("no baseline run")?;
    let hook = best_hook.context("no webhook run")?;
    let ratio = if base.requests_per_sec() > 0.0 {
        hook.requests_per_sec() / base.requests_per_sec()
    } else {
        0.0
    };
    let cpu_ratio = match (base.cpu_per_request(), hook.cpu_per_request()) {
        (Some(b), Some(h)) if !h.is_zero() => format!(
            " (ratio {:.2}; the webhook's own work {:.1}µs/req)",
            b.as_secs_f64() / h.as_secs_f64(),
            (h.as_secs_f64() - b.as_secs_f64()) * 1e6
        ),
        _ => String::new(),
    };
    let line = format!(
        "\nratio webhook/baseline: {:.2} ({:.0} / {:.0} req/s); server cpu/req {} vs {}{cpu_ratio}\n\n",
        ratio,
        hook.requests_per_sec(),
        base.requests_per_sec(),
        hook.cpu_per_request()
            .map_or("?".into(), |c| format!("{:.1}µs", c.as_secs_f64() * 1e6)),
        base.cpu_per_request()
            .map_or("?".into(), |c| format!("{:.1}µs", c.as_secs_f64() * 1e6)),
    );
    print!("{line}");
    out.push_str(&line);

    // Control: the transport alone at the rate phase 3 uses. On a busy
    // machine its p99 shows how much of the webhook's tail is the machine's.
    let rate = (hook.requests_per_sec() / 2.0).max(1.0);
    let mut lc = load_config(&cfg, baseline.pid, false);
    lc.rate = Some(rate);
    lc.duration = Some(cfg.warmup);
    load::run(&base_target, &lc).await;
    lc.duration = Some(cfg.duration);
    let control = load::run(&base_target, &lc).await;
    let text = describe(
        &format!("baseline at the same rate ({rate:.0} req/s, open loop, control)"),
        &control,
    );
    print!("{text}");
    out.push_str(&text);
    baseline.stop().await.context("stopping the baseline")?;

    // Phase 3: a fresh webhook at half its maximum, open loop (p99, RSS).
    let run_for = cfg.soak.unwrap_or(cfg.duration);
    let half = half_rate(
        &webhook_bin,
        &hook_args,
        &mut certs,
        &cfg,
        rate,
        run_for,
        None,
    )
    .await?;
    let label = format!(
        "webhook at half max ({rate:.0} req/s, open loop, {}s)",
        run_for.as_secs()
    );
    let mut text = describe(&label, &half.report);
    if let Some(g) = load::rss_growth(&half.report.memory) {
        let _ = writeln!(
            text,
            "  RSS growth (last vs first quarter): {:+.2} MiB over {} samples",
            g as f64 / (1024.0 * 1024.0),
            half.report.memory.len()
        );
    }
    print!("{text}");
    out.push_str(&text);

    // Phase 4: the same rate while the certificate rotates and connections
    // reopen, so handshakes meet the swap.
    let rotation = match cfg.rotate {
        Some(style) => {
            let r = half_rate(
                &webhook_bin,
                &hook_args,
                &mut certs,
                &cfg,
                rate,
                cfg.duration,
                Some(style),
            )
            .await?;
            let mut text = describe(
                &format!(
                    "webhook at half max, rotating certs every {:?} ({style:?})",
                    cfg.rotate_every
                ),
                &r.report,
            );
            let _ = writeln!(
                text,
                "  cert rotation: {} rotations, {} probe handshakes saw {} distinct leaf certs",
                r.rotated,
                r.leaves.len(),
                count_distinct(&r.leaves)
            );
            print!("{text}");
            out.push_str(&text);
            Some(r)
        }
        None => None,
    };
    let half_report = &half.report;

    // Targets.
    let mut verdicts = vec![
        Verdict {
            name: "throughput",
            target: format!("webhook/baseline >= {MIN_RATIO:.2}"),
            measured: format!("{ratio:.2}"),
            met: ratio >= MIN_RATIO,
        },
        Verdict {
            name: "max-rate errors",
            target: "0".into(),
            measured: format!("{}", hook.failures.total()),
            met: hook.failures.total() == 0,
        },
        Verdict {
            name: "p99 at half max",
            target: format!("<= {}", ms(MAX_P99)),
            measured: ms(half_report.latency.summary().p99),
            met: half_report.latency.summary().p99 <= MAX_P99,
        },
        Verdict {
            name: "errors at half max",
            target: "0".into(),
            measured: format!(
                "{} ({})",
                half_report.failures.total(),
                half_report.failures
            ),
            met: half_report.failures.total() == 0 && half_report.ok > 0,
        },
        Verdict {
            name: "peak RSS at half max",
            target: format!("<= {:.0} MiB", mib(MAX_PEAK_RSS)),
            measured: half_report
                .peak_rss()
                .map_or("?".into(), |p| format!("{:.1} MiB", mib(p))),
            met: half_report.peak_rss().is_some_and(|p| p <= MAX_PEAK_RSS),
        },
        Verdict {
            name: "server survived",
            target: "running until stopped".into(),
            measured: if half.alive { "yes" } else { "no" }.into(),
            met: half.alive,
        },
    ];
    if cfg.soak.is_some() {
        let g = load::rss_growth(&half_report.memory);
        verdicts.push(Verdict {
            name: "RSS growth over soak",
            target: format!("<= {:.0} MiB", MAX_RSS_GROWTH as f64 / (1024.0 * 1024.0)),
            measured: g.map_or("too few samples".into(), |g| {
                format!("{:+.2} MiB", g as f64 / (1024.0 * 1024.0))
            }),
            met: g.is_some_and(|g| g <= MAX_RSS_GROWTH),
        });
    }
    if let Some(r) = &rotation {
        let distinct = count_distinct(&r.leaves);
        verdicts.push(Verdict {
            name: "cert rotation",
            target: "0 failed requests, new cert served".into(),
            measured: format!(
                "{} failed ({}), {distinct} distinct certs seen",
                r.report.failures.total(),
                r.report.failures
            ),
            met: r.report.failures.total() == 0 && r.report.ok > 0 && distinct >= 2 && r.alive,
        });
    }
    let mut table = String::from("\ntargets:\n");
    for v in &verdicts {
        let _ = writeln!(
            table,
            "  [{}] {:<22} target {:<34} measured {}",
            if v.met { "met" } else { "MISSED" },
            v.name,
            v.target,
            v.measured
        );
    }
    print!("{table}");
    out.push_str(&table);
    let tails = [
        (!half.alive, &half.tail),
        (
            rotation.as_ref().is_some_and(|r| {
                !r.alive || r.report.failures.total() > 0 || count_distinct(&r.leaves) < 2
            }),
            &rotation
                .as_ref()
                .map(|r| r.tail.clone())
                .unwrap_or_default(),
        ),
        (hook.failures.total() > 0, &hook_tail),
    ];
    if let Some((_, tail)) = tails.iter().find(|(show, _)| *show) {
        let tail = format!("\nwebhook log tail:\n{tail}\n");
        print!("{tail}");
        out.push_str(&tail);
    }
    Ok(Outcome {
        text: out,
        verdicts,
    })
}

/// What one half-rate run of a fresh webhook process measured.
struct HalfRun {
    report: LoadReport,
    rotated: u64,
    leaves: Vec<u64>,
    alive: bool,
    tail: String,
}

/// Starts a fresh webhook, warms it up at `rate`, then measures `run_for`
/// at `rate` in open loop; with `rotate`, swaps its certificate every
/// `cfg.rotate_every`, reopens connections and probes which cert is served.
async fn half_rate(
    bin: &std::path::Path,
    args: &[String],
    certs: &mut CertDir,
    cfg: &CompareConfig,
    rate: f64,
    run_for: Duration,
    rotate: Option<RotateStyle>,
) -> anyhow::Result<HalfRun> {
    let webhook = Server::start(bin, args).await?;
    let target = Target::new(webhook.https, certs.ca_pem(), cfg.proto)?;
    let mut lc = load_config(cfg, webhook.pid, true);
    lc.rate = Some(rate);
    lc.duration = Some(cfg.warmup);
    load::run(&target, &lc).await;
    lc.duration = Some(run_for);
    if run_for >= Duration::from_secs(60) {
        lc.sample_every = Duration::from_secs(5);
    }
    if rotate.is_some() {
        lc.reconnect_after = cfg.reconnect_after.or(Some(100));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let probe = rotate.map(|_| {
        let (target, stop) = (target.clone(), stop.clone());
        tokio::spawn(async move { probe_leaves(&target, &stop).await })
    });
    let load = load::run(&target, &lc);
    tokio::pin!(load);
    let mut tick = tokio::time::interval(cfg.rotate_every);
    tick.tick().await;
    let mut rotated = 0u64;
    let report = loop {
        tokio::select! {
            r = &mut load => break r,
            _ = tick.tick(), if rotate.is_some() => {
                if let Some(style) = rotate {
                    certs.rotate(style)?;
                    rotated += 1;
                }
            }
        }
    };
    stop.store(true, Ordering::Relaxed);
    let leaves = match probe {
        Some(p) => p.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let mut webhook = webhook;
    let alive = webhook.is_running();
    let tail = webhook.log_tail();
    webhook.stop().await.context("stopping the webhook")?;
    Ok(HalfRun {
        report,
        rotated,
        leaves,
        alive,
        tail,
    })
}

/// Handshakes every 200 ms and records which leaf certificate was served.
async fn probe_leaves(target: &Target, stop: &AtomicBool) -> Vec<u64> {
    let mut seen = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        if let Ok(fp) = target.leaf_fingerprint().await {
            seen.push(fp);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    seen
}

fn count_distinct(v: &[u64]) -> usize {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.dedup();
    v.len()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::procfs::Usage;

    #[test]
    fn describe_splits_server_time_and_counts_switches() {
        let r = LoadReport {
            elapsed: Duration::from_secs(2),
            ok: 1000,
            server: Some(Usage {
                user: Duration::from_millis(20),
                system: Duration::from_millis(10),
                voluntary: 200,
                involuntary: 50,
            }),
            own: Some(Usage {
                user: Duration::from_millis(30),
                system: Duration::from_millis(10),
                ..Usage::default()
            }),
            ..LoadReport::default()
        };
        let text = describe("webhook", &r);
        assert!(
            text.starts_with("webhook: 500 req/s (1000 ok in 2.0s"),
            "{text}"
        );
        assert!(
            text.contains("cpu 30.0µs/req [user 20.0 + sys 10.0; 0.25 switches/req] (0.01 cores)"),
            "{text}"
        );
        assert!(text.contains("loadgen 0.02 cores, 40.0µs/req"), "{text}");
        // Without a server process, only what is known is printed.
        let bare = describe("x", &LoadReport::default());
        assert!(
            !bare.contains("switches") && !bare.contains("loadgen"),
            "{bare}"
        );
    }
}
