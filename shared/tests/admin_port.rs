//! The admin port under pressure from the pods of its node. The agent runs
//! on the host network, so every pod can open connections to its admin
//! port; holding them must not starve the kubelet's probes (a failed
//! liveness probe restarts the agent, whose shutdown re-taints the node).
//!
//! All of 127/8 is loopback, which the real rule counts as this host, so
//! these tests narrow "this host" to 127.0.0.1 and let 127.0.0.2 stand in
//! for a pod (the rule itself: `connection_gate`'s unit tests).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use nodegate_shared::admin::{self, AdminOptions};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The longest any wait here may take; far below the timeouts a test
/// leaves long, so "closed within WAIT" cannot be one of those.
const WAIT: Duration = Duration::from_secs(10);
/// What a test leaves long.
const LONG: Duration = Duration::from_secs(120);

const HOST: Ipv4Addr = Ipv4Addr::LOCALHOST;
const POD: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

fn only_127_0_0_1(peer: IpAddr, _dialled: IpAddr) -> bool {
    peer == IpAddr::V4(HOST)
}

struct Server {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

async fn start(opts: AdminOptions) -> Server {
    let l = TcpListener::bind((HOST, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = admin::router(
        Arc::new(Registry::default()),
        Arc::new(AtomicBool::new(true)),
        "waiting",
    );
    let (stop, rx) = watch::channel(false);
    let opts = AdminOptions {
        same_host: only_127_0_0_1,
        ..opts
    };
    let task = tokio::spawn(admin::serve_with(l, app, rx, opts));
    Server { addr, stop, task }
}

async fn connect_from(ip: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind((ip, 0).into()).unwrap();
    s.connect(to).await.unwrap()
}

/// A keep-alive GET of `/livez` on `s`: the status, 0 when the connection
/// closed without an answer.
async fn livez(s: &mut TcpStream) -> u16 {
    let req = b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n";
    if s.write_all(req).await.is_err() {
        return 0;
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        // The body is "ok": the answer is whole once the head ends and two
        // bytes follow.
        while got
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .is_none_or(|i| got.len() < i + 4 + 2)
        {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(WAIT, read)
        .await
        .expect("an answer or a close");
    String::from_utf8_lossy(&got)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// Whether the server closes `s` within `WAIT` (sending nothing on it).
async fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(WAIT, read).await.is_ok()
}

/// Polls until a new connection from `ip` is answered 200, within `WAIT`.
async fn answered_eventually(ip: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut s = connect_from(ip, to).await;
        if livez(&mut s).await == 200 {
            return s;
        }
        assert!(Instant::now() < deadline, "no slot freed for {ip}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Server {
    async fn stop(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("the server stops")
            .unwrap();
    }
}

#[tokio::test]
async fn with_the_cap_full_of_pods_a_pod_is_closed_at_once_and_the_host_still_answered() {
    let s = start(AdminOptions {
        max_connections: 2,
        local_reserve: 1,
        header_read_timeout: LONG,
        max_connection_age: LONG,
        ..AdminOptions::default()
    })
    .await;
    // Pods fill the cap with connections they keep idle.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = connect_from(POD, s.addr).await;
        assert_eq!(livez(&mut c).await, 200);
        held.push(c);
    }

    // One more from a pod: closed at once (its timeouts are far longer).
    let mut over = connect_from(POD, s.addr).await;
    assert!(closed(&mut over).await, "a pod's connection over the cap");
    let mut over = connect_from(POD, s.addr).await;
    assert_eq!(livez(&mut over).await, 0, "served over the cap");

    // The kubelet's probe, from the host itself: answered.
    let mut probe = connect_from(HOST, s.addr).await;
    assert_eq!(livez(&mut probe).await, 200, "the host's probe");
    // The reserve is the host's alone, and it too is bounded.
    let mut over = connect_from(HOST, s.addr).await;
    assert!(closed(&mut over).await, "the host over cap and reserve");
    drop(probe);

    // The connections held are still served; a slot freed is used again.
    assert_eq!(livez(&mut held[0]).await, 200);
    held.pop();
    let _again = answered_eventually(POD, s.addr).await;
    s.stop().await;
}

#[tokio::test]
async fn connections_that_send_no_request_are_closed_after_the_header_timeout() {
    let timeout = Duration::from_millis(300);
    let s = start(AdminOptions {
        max_connections: 1,
        local_reserve: 0,
        header_read_timeout: timeout,
        max_connection_age: LONG,
        ..AdminOptions::default()
    })
    .await;
    // Never sends a byte: closed after the timeout, not before.
    let started = Instant::now();
    let mut idle = connect_from(POD, s.addr).await;
    assert!(closed(&mut idle).await, "a connection without a request");
    assert!(started.elapsed() >= timeout, "{:?}", started.elapsed());

    // Its slot is free again, for someone who sends a request.
    let mut c = answered_eventually(POD, s.addr).await;
    // Kept alive but idle after its answer: closed too.
    assert!(closed(&mut c).await, "an idle keep-alive connection");

    // A head sent a line at a time and never finished: closed too.
    let mut slow = answered_eventually(POD, s.addr).await;
    slow.write_all(b"GET /livez HTTP/1.1\r\n").await.unwrap();
    assert!(closed(&mut slow).await, "an unfinished request head");
    s.stop().await;
}

#[tokio::test]
async fn a_peer_that_never_reads_its_answers_is_cut_off_at_the_connection_age() {
    let s = start(AdminOptions {
        max_connections: 1,
        local_reserve: 0,
        header_read_timeout: Duration::from_millis(300),
        max_connection_age: Duration::from_millis(300),
        ..AdminOptions::default()
    })
    .await;
    let sock = TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.bind((POD, 0).into()).unwrap();
    let mut c = sock.connect(s.addr).await.unwrap();
    // Requests without end, answers never read: once the buffers fill, the
    // server is stuck writing an answer, where no read timeout applies.
    let requests = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(1000);
    let cut = tokio::time::timeout(WAIT, async {
        while c.write_all(&requests).await.is_ok() {}
    })
    .await;
    assert!(cut.is_ok(), "a peer that never reads kept its connection");
    // Its slot is free again.
    let _next = answered_eventually(POD, s.addr).await;
    s.stop().await;
}

#[tokio::test]
async fn a_kept_alive_connection_is_closed_at_its_age() {
    let s = start(AdminOptions {
        max_connections: 1,
        local_reserve: 0,
        header_read_timeout: LONG,
        max_connection_age: Duration::from_millis(300),
        ..AdminOptions::default()
    })
    .await;
    let mut c = connect_from(POD, s.addr).await;
    assert_eq!(livez(&mut c).await, 200);
    assert!(closed(&mut c).await, "a connection past its age");
    let _next = answered_eventually(POD, s.addr).await;
    s.stop().await;
}
