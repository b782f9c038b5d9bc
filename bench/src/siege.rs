//! `nodegate-siege`: the webhook under an exhaustion attack from anyone who
//! can reach its port, while a client shaped like the API server (one
//! keep-alive HTTP/1.1 connection, a fixed rate of reviews) must still get
//! every answer quickly, and the webhook's memory must stay bounded.
//!
//! Attackers, all on loopback: *slowloris* connections finish TLS, send part
//! of a request head and then a header line now and then; *slow bodies*
//! send a whole head (half declare a 4 MiB Content-Length, half are chunked
//! with no length), then trickle the body. Each attacker reconnects after
//! the server closes it, after a pause (a faster loop is a handshake flood,
//! a different attack).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::certdir::{CertDir, RotateStyle};
use crate::client::{Proto, SERVER_NAME, Target};
use crate::fixtures;
use crate::process::{Server, sibling_binary};
use crate::procfs;
use crate::stats::{Checker, Expect, Failure, Failures, Latencies};

/// `nodegate-siege` flags.
#[derive(Debug, clap::Parser)]
#[command(
    name = "nodegate-siege",
    about = "The webhook under slowloris connections and slow bodies, with an API-server-shaped client"
)]
pub struct Args {
    /// Slowloris connections.
    #[arg(long, default_value_t = 1500)]
    pub slowloris: usize,
    /// Connections sending slow bodies.
    #[arg(long, default_value_t = 100)]
    pub slow_bodies: usize,
    /// Size each slow body claims or is meant to reach.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub body_bytes: usize,
    /// Bytes per second each slow body sends.
    #[arg(long, default_value_t = 64 * 1024)]
    pub body_rate: usize,
    /// Reviews per second of the API-server-shaped client.
    #[arg(long, default_value_t = 50)]
    pub rate: u32,
    /// How long the client is measured, once the attack is in place.
    #[arg(long, default_value = "30s", value_parser = crate::duration::parse)]
    pub duration: Duration,
    /// Time for the attackers to connect before measuring.
    #[arg(long, default_value = "10s", value_parser = crate::duration::parse)]
    pub ramp: Duration,
    /// An attacker waits this long before reconnecting after a close.
    #[arg(long, default_value = "1s", value_parser = crate::duration::parse)]
    pub reconnect_pause: Duration,
    /// Targets: the client's p99 must be below this...
    #[arg(long, default_value = "100ms", value_parser = crate::duration::parse)]
    pub max_p99: Duration,
    /// ...and the webhook's peak RSS below this many MiB.
    #[arg(long, default_value_t = 64)]
    pub max_rss_mib: u64,
    /// Exit non-zero when a target is missed.
    #[arg(long)]
    pub check: bool,
    /// Webhook binary (default: nodegate-webhook next to this one).
    #[arg(long)]
    pub webhook_bin: Option<PathBuf>,
    /// Extra argument for the webhook (repeatable), e.g. `--webhook-arg=--max-connections=4096`.
    #[arg(long, allow_hyphen_values = true)]
    pub webhook_arg: Vec<String>,
}

/// What the attackers saw.
#[derive(Debug, Default)]
struct AttackStats {
    /// TLS handshakes completed.
    connected: AtomicU64,
    /// Connections closed before the handshake finished (the cap).
    refused: AtomicU64,
    /// Connections the server closed after the handshake (a timeout).
    closed: AtomicU64,
    /// Slow bodies answered with a status line (413, 408, 503…).
    answered: AtomicU64,
    /// Attackers holding an open connection now.
    holding: AtomicU64,
}

/// The outcome of one run.
#[derive(Debug)]
pub struct Report {
    pub sent: u64,
    pub ok: u64,
    pub failures: Failures,
    pub latency: crate::stats::Summary,
    pub peak_rss: u64,
    pub end_rss: u64,
    pub server_cpu: Duration,
    pub elapsed: Duration,
    pub attack: String,
    pub refusals: String,
}

impl Report {
    pub fn met(&self, a: &Args) -> bool {
        self.ok == self.sent
            && self.sent > 0
            && self.latency.p99 < a.max_p99
            && self.peak_rss < a.max_rss_mib * 1024 * 1024
    }
}

pub async fn run(a: &Args) -> anyhow::Result<Report> {
    let bin = match &a.webhook_bin {
        Some(p) => p.clone(),
        None => sibling_binary("nodegate-webhook")?,
    };
    let certs = CertDir::new(RotateStyle::Secret)?;
    let mut args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--disable-reboot-patches",
        "--tls-cert",
    ]
    .map(str::to_owned)
    .to_vec();
    args.push(certs.cert_path().display().to_string());
    args.push("--tls-key".to_owned());
    args.push(certs.key_path().display().to_string());
    args.extend(a.webhook_arg.iter().cloned());
    let server = Server::start(&bin, &args).await?;
    let admin = server
        .admin
        .context("the webhook printed no admin address")?;

    // The API server's connection exists before the attack, as it would.
    let target = Target::new(server.https, certs.ca_pem(), Proto::H1)?;
    let mut conn = target.connect().await.context("client connection")?;
    let tls = attacker_tls(certs.ca_pem())?;
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(AttackStats::default());
    let mut attackers = Vec::new();
    let total = a.slowloris + a.slow_bodies;
    for i in 0..total {
        let kind = if i < a.slow_bodies {
            if i % 2 == 0 {
                Kind::DeclaredBody
            } else {
                Kind::ChunkedBody
            }
        } else {
            Kind::Slowloris
        };
        // Spread the first handshakes over the ramp's first half.
        let delay = a.ramp.mul_f64(0.5 * i as f64 / total.max(1) as f64);
        let attacker = Attacker {
            addr: server.https,
            tls: tls.clone(),
            kind,
            body_bytes: a.body_bytes,
            body_rate: a.body_rate.max(1),
            pause: a.reconnect_pause,
            stop: stop.clone(),
            stats: stats.clone(),
        };
        attackers.push(tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            attacker.run().await;
        }));
    }
    // Keep the client's connection alive through the ramp, as a busy API
    // server would, and sample memory all along.
    let pid = server.pid;
    let sampler_stop = stop.clone();
    let sampler = tokio::spawn(async move {
        let mut peak = 0;
        while !sampler_stop.load(Ordering::Relaxed) {
            if let Ok(m) = procfs::memory(pid) {
                peak = peak.max(m.peak);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        peak
    });
    let fixture = fixtures::kubelet_create();
    let ramp_end = Instant::now() + a.ramp;
    let mut seq = 0u64;
    while Instant::now() < ramp_end {
        seq += 1;
        let _ = conn.post(fixture.body(&fixtures::uid(0, seq))).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "attack in place: {} attackers holding a connection, {} handshakes, {} closed before the handshake",
        stats.holding.load(Ordering::Relaxed),
        stats.connected.load(Ordering::Relaxed),
        stats.refused.load(Ordering::Relaxed)
    );

    let cpu_before = procfs::usage(pid).ok();
    let start = Instant::now();
    let period = Duration::from_secs_f64(1.0 / f64::from(a.rate.max(1)));
    let n = (a.duration.as_secs_f64() * f64::from(a.rate)).round() as u64;
    let mut latency = Latencies::new();
    let mut failures = Failures::default();
    let mut checker = Checker::default();
    let mut ok = 0;
    for i in 0..n {
        let due = start + period.mul_f64(i as f64);
        tokio::time::sleep_until(due.into()).await;
        seq += 1;
        let uid = fixtures::uid(1, seq);
        let answer =
            tokio::time::timeout(Duration::from_secs(10), conn.post(fixture.body(&uid))).await;
        // From the due time: a late send counts against the webhook too.
        latency.record(due.elapsed());
        let outcome = match answer {
            Err(_) => Err(Failure::Timeout),
            Ok(Err(_)) => Err(Failure::Transport),
            Ok(Ok((200, body))) => checker.check(&body, &uid, Expect::Webhook { patch: true }),
            Ok(Ok((status, _))) => Err(Failure::Status(status)),
        };
        match outcome {
            Ok(()) => ok += 1,
            Err(f) => {
                failures.add(f);
                if matches!(f, Failure::Timeout | Failure::Transport) {
                    // The API server would reconnect; so do we, and it counts.
                    if let Ok(c) = target.connect().await {
                        conn = c;
                    }
                }
            }
        }
    }
    let elapsed = start.elapsed();
    let server_cpu = match (cpu_before, procfs::usage(pid).ok()) {
        (Some(b), Some(a)) => a.since(&b).cpu(),
        _ => Duration::ZERO,
    };
    let refusals = scrape(admin)
        .await
        .unwrap_or_else(|e| format!("(metrics: {e})"));
    let attack = format!(
        "{} handshakes, {} closed before the handshake (cap), {} closed by the server after it (timeouts), {} slow bodies answered, {} holding at the end",
        stats.connected.load(Ordering::Relaxed),
        stats.refused.load(Ordering::Relaxed),
        stats.closed.load(Ordering::Relaxed),
        stats.answered.load(Ordering::Relaxed),
        stats.holding.load(Ordering::Relaxed),
    );
    stop.store(true, Ordering::Relaxed);
    let end_rss = procfs::memory(pid).map(|m| m.rss).unwrap_or(0);
    let peak_rss = sampler
        .await
        .unwrap_or(0)
        .max(procfs::memory(pid).map(|m| m.peak).unwrap_or(0));
    for t in attackers {
        t.abort();
    }
    server.stop().await?;
    Ok(Report {
        sent: n,
        ok,
        failures,
        latency: latency.summary(),
        peak_rss,
        end_rss,
        server_cpu,
        elapsed,
        attack,
        refusals,
    })
}

pub fn print(a: &Args, r: &Report) {
    println!(
        "attack: {} slowloris + {} slow bodies ({} bytes at {} B/s, half declared, half chunked), reconnect pause {:?}",
        a.slowloris, a.slow_bodies, a.body_bytes, a.body_rate, a.reconnect_pause
    );
    println!("attackers: {}", r.attack);
    println!(
        "client: {} reviews at {}/s over one keep-alive HTTP/1.1 connection: {} answered correctly, failures: {}",
        r.sent, a.rate, r.ok, r.failures
    );
    println!("client latency (from due time): {}", r.latency);
    println!(
        "webhook: peak RSS {:.1} MiB, RSS at the end {:.1} MiB, CPU {:.2} cores",
        procfs::mib(r.peak_rss),
        procfs::mib(r.end_rss),
        r.server_cpu.as_secs_f64() / r.elapsed.as_secs_f64().max(1e-9)
    );
    println!("webhook refusals: {}", r.refusals);
    println!(
        "target (every answer, p99 < {:?}, peak RSS < {} MiB): {}",
        a.max_p99,
        a.max_rss_mib,
        if r.met(a) { "met" } else { "MISSED" }
    );
}

/// The webhook's refusal counters, as `reason=count` pairs.
async fn scrape(admin: SocketAddr) -> anyhow::Result<String> {
    let mut s = TcpStream::connect(admin).await?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await?;
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut text)).await??;
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(rest) =
            line.strip_prefix("nodegate_webhook_refused_total{port=\"https\",reason=\"")
            && let Some((reason, n)) = rest.split_once("\"} ")
            && n.trim() != "0"
        {
            out.push(format!("{reason}={}", n.trim()));
        }
    }
    Ok(if out.is_empty() {
        "none".to_owned()
    } else {
        out.join(" ")
    })
}

fn attacker_tls(ca_pem: &str) -> anyhow::Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c?)?;
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(cfg)))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Slowloris,
    DeclaredBody,
    ChunkedBody,
}

struct Attacker {
    addr: SocketAddr,
    tls: TlsConnector,
    kind: Kind,
    body_bytes: usize,
    body_rate: usize,
    pause: Duration,
    stop: Arc<AtomicBool>,
    stats: Arc<AttackStats>,
}

impl Attacker {
    async fn run(self) {
        while !self.stop.load(Ordering::Relaxed) {
            match self.connect().await {
                Some(tls) => {
                    self.stats.connected.fetch_add(1, Ordering::Relaxed);
                    self.stats.holding.fetch_add(1, Ordering::Relaxed);
                    let answered = self.attack(tls).await;
                    self.stats.holding.fetch_sub(1, Ordering::Relaxed);
                    if answered {
                        self.stats.answered.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.stats.closed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                None => {
                    self.stats.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
            tokio::time::sleep(self.pause).await;
        }
    }

    async fn connect(&self) -> Option<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await.ok()?;
        let name = ServerName::try_from(SERVER_NAME).ok()?;
        tokio::time::timeout(Duration::from_secs(30), self.tls.connect(name, tcp))
            .await
            .ok()?
            .ok()
    }

    /// Holds the connection as long as the server lets it; `true` when the
    /// server answered with a status line rather than just closing.
    async fn attack(&self, mut tls: TlsStream<TcpStream>) -> bool {
        let head = match self.kind {
            Kind::Slowloris => "POST /mutate?timeout=3s HTTP/1.1\r\nHost: x\r\n".to_owned(),
            Kind::DeclaredBody => format!(
                "POST /mutate?timeout=3s HTTP/1.1\r\nHost: {SERVER_NAME}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                self.body_bytes
            ),
            Kind::ChunkedBody => format!(
                "POST /mutate?timeout=3s HTTP/1.1\r\nHost: {SERVER_NAME}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            ),
        };
        if tls.write_all(head.as_bytes()).await.is_err() {
            return false;
        }
        let (mut rd, mut wr) = tokio::io::split(tls);
        let stop = self.stop.clone();
        let (kind, total, rate) = (self.kind, self.body_bytes, self.body_rate);
        let writer = async move {
            let mut sent = 0usize;
            // A review's opening, so the server sees what looks like a real one.
            let mut first = Some(
                br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"attacker","object":{"metadata":{"annotations":{"pad":""#
                    .to_vec(),
            );
            let piece = (rate / 10).max(1);
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let data = match kind {
                    // One more header line now and then, never the blank line.
                    Kind::Slowloris => {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        b"X-Slow: 1\r\n".to_vec()
                    }
                    _ => {
                        let mut d = first.take().unwrap_or_default();
                        let n = piece.min(total.saturating_sub(sent)).max(d.len());
                        d.resize(n, b' ');
                        sent += n;
                        if kind == Kind::ChunkedBody {
                            let mut c = format!("{n:x}\r\n").into_bytes();
                            c.extend_from_slice(&d);
                            c.extend_from_slice(b"\r\n");
                            c
                        } else {
                            d
                        }
                    }
                };
                if wr.write_all(&data).await.is_err() || wr.flush().await.is_err() {
                    return;
                }
                if sent >= total && kind != Kind::Slowloris {
                    // Never finish the body: stall until the server gives up.
                    std::future::pending::<()>().await;
                }
            }
        };
        let reader = async move {
            let mut buf = [0u8; 512];
            let mut got = Vec::new();
            loop {
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => return got.starts_with(b"HTTP/1.1 "),
                    Ok(n) => got.extend_from_slice(&buf[..n.min(64)]),
                }
            }
        };
        tokio::select! {
            answered = reader => answered,
            () = writer => false,
        }
    }
}
