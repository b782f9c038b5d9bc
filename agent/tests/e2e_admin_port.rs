//! End-to-end, the admin port. On the host network it binds the node's IP,
//! which every pod can reach; it stays there because the kubelet's httpGet
//! probes and Prometheus dial that IP. So what it serves must be harmless to
//! anyone: GETs of `/livez`, `/readyz` and `/metrics` only, and metrics that
//! hold no secret of the flags nor the agent's credential; and holding
//! connections open must not starve the kubelet's probes (a failed liveness
//! probe restarts the agent, whose shutdown re-taints the node). The harness
//! and real-cluster mode: `support`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::nodes::cluster;
use support::process::Agent;
use support::wait::eventually;

/// A secret in every flag that may carry one: the HTTP probe's URL (user
/// info and query), the exec probe's and the deletion handler's command.
const SECRET: &str = "s3cr3t0f3a9d2c4e6b8a1f0c2d4e6f8a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_serves_reads_only_and_no_secret() {
    let (c, _nodes) = cluster().await;
    let name = c.node_name("admin-port");
    c.kubelet(&name).await.unwrap().register().await.unwrap();
    // Nothing listens there: the HTTP probe fails, and its round is counted.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let http = format!("http://probe:{SECRET}@127.0.0.1:{port}/healthz?token={SECRET}");
    let exec = format!("test {SECRET} = x");
    let handler = format!("true {SECRET}");
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        &c,
        &name,
        &dir.path().join("state"),
        &[
            "--probe-http",
            &http,
            "--probe-exec",
            &exec,
            "--probe-period",
            "1h",
            "--pending-probe-period",
            "1h",
            "--on-node-delete",
            &handler,
            "--prune-source",
            "nodes",
        ],
    )
    .await;
    let series = r#"nodegate_agent_probe_results_total{kind="http",index="0",result="fail"}"#;
    eventually("a failed probe round", || async {
        agent.metric(series).await.unwrap_or(0.0) >= 1.0
    })
    .await;

    let (code, metrics) = agent.get("/metrics").await;
    assert_eq!(code, 200);
    assert!(metrics.contains("nodegate_agent_nodes_known"), "{metrics}");
    assert!(!metrics.contains(SECRET), "a flag's secret: {metrics}");
    // The agent's kubeconfig holds only its pod-bound token.
    let kubeconfig: serde_json::Value =
        serde_json::from_slice(&std::fs::read(agent.kubeconfig()).unwrap()).unwrap();
    let token = kubeconfig["users"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|u| u["user"]["token"].as_str())
        .expect("a token in the agent's kubeconfig");
    assert!(
        token.len() >= 16 && !metrics.contains(token),
        "the agent's credential: {metrics}"
    );
    // Any bearer token of Kubernetes is a JWT, whose header starts so.
    assert!(!metrics.contains("eyJ"), "a JWT: {metrics}");

    for (method, path, want) in [
        ("POST", "/metrics", 405),
        ("PUT", "/readyz", 405),
        ("DELETE", "/livez", 405),
        ("PATCH", "/metrics", 405),
        ("GET", "/", 404),
        ("GET", "/debug/pprof/", 404),
        ("POST", "/mutate", 404),
    ] {
        let (code, body) = agent.request(method, path).await;
        assert_eq!(code, want, "{method} {path}: {body}");
    }
    assert_eq!(agent.get("/livez").await.0, 200, "still serving");
}

/// `--admin-max-connections` caps the admin port, with 16 more kept for
/// this host: the kubelet's probes come from there, pods do not. From
/// loopback every connection is this host's, so past the cap the probe is
/// answered from the reserve, and past both a connection is closed unserved.
/// (The cap against pods alone, and the timeouts: nodegate-shared's
/// `tests/admin_port.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_cannot_starve_the_admin_ports_probe() {
    const CAP: usize = 2;
    const RESERVE: usize = 16;
    let (c, _nodes) = cluster().await;
    let name = c.node_name("admin-cap");
    c.kubelet(&name).await.unwrap().register().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        &c,
        &name,
        &dir.path().join("state"),
        &[
            "--probe-file",
            &dir.path().join("absent").to_string_lossy(),
            "--admin-max-connections",
            &CAP.to_string(),
        ],
    )
    .await;
    // A GET of /livez answered 200 on a connection then kept idle (the
    // agent's idle limit is 10 s; this test needs a fraction of that).
    let hold = || async {
        let mut s = TcpStream::connect(agent.admin_addr()).await.ok()?;
        s.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.ok()?;
        (&head == b"HTTP/1.1 200").then_some(s)
    };
    let mut held = Vec::new();
    for i in 0..CAP {
        held.push(hold().await.unwrap_or_else(|| panic!("connection {i}")));
    }
    // The kubelet's probe with the cap full, and what more this host holds.
    for i in 0..RESERVE {
        let probe = hold().await;
        assert!(probe.is_some(), "this host's connection {i} past the cap");
        held.extend(probe);
    }
    // Closed unserved at once: an admitted connection would answer at once.
    assert_eq!(
        agent.get("/livez").await.0,
        0,
        "served past cap and reserve"
    );
    held.pop();
    eventually("the probe again once a slot is free", || async {
        agent.get("/livez").await.0 == 200
    })
    .await;
}
