//! The real binaries as child processes: the agent (and the roster
//! publisher), their admin address, their output and their signals.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use super::roster::{SHARDS, roster_writer};
use super::wait::WAIT;

/// The real agent binary, its admin address and its output.
pub struct Agent {
    child: Child,
    admin: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
    kubeconfig: PathBuf,
}

impl Agent {
    /// Acts as the agent's service account (impersonated on a real cluster).
    pub async fn start(c: &Cluster, node: &str, state: &Path, extra: &[&str]) -> Agent {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nodegate-agent"));
        cmd.args(["--node-name", node, "--admin-listen", "127.0.0.1:0"])
            .arg("--state-dir")
            .arg(state)
            .args(["--snapshot-interval", "100ms", "--shutdown-deadline", "10s"])
            .args(extra);
        // The DaemonSet pod's credential: a token bound to a pod on `node`.
        let kubeconfig = c.agent_kubeconfig(node).await.unwrap();
        Self::spawn_with(c, cmd, users::AGENT, kubeconfig, state).await
    }

    /// A roster publisher replica: the real `nodegate-roster` binary as the
    /// publisher's service account (the admin on a real cluster), writing
    /// roster `roster` in `nodegate` with short lease timings so a failover
    /// takes about 2 s.
    pub async fn publisher(c: &Cluster, roster: &str, replica: usize, home: &Path) -> Agent {
        let bin = nodegate_e2e::process::bin_path("nodegate-roster");
        assert!(
            bin.exists(),
            "build it first: cargo build -p nodegate-roster"
        );
        let mut cmd = Command::new(bin);
        cmd.args(["--namespace", "nodegate", "--name", roster])
            .args(["--identity", &format!("{roster}-{replica}")])
            .args(["--shards", &SHARDS.to_string(), "--interval", "50ms"])
            .args(["--lease-duration", "2s", "--renew-deadline", "1500ms"])
            .args(["--retry-period", "250ms", "--admin-listen", "127.0.0.1:0"]);
        Self::spawn(c, cmd, roster_writer(c), home).await
    }

    pub async fn spawn(c: &Cluster, cmd: Command, user: &str, home: &Path) -> Agent {
        let kubeconfig = c.kubeconfig(user).unwrap();
        Self::spawn_with(c, cmd, user, kubeconfig, home).await
    }

    pub async fn spawn_with(
        c: &Cluster,
        mut cmd: Command,
        user: &str,
        kubeconfig: PathBuf,
        home: &Path,
    ) -> Agent {
        if c.is_real() {
            // A real kubeconfig may run an exec credential plugin that needs
            // the caller's environment; only the agent's own settings go.
            for (k, _) in std::env::vars_os() {
                let k = k.to_string_lossy();
                if k.starts_with("NODEGATE_") || k == "NODE_NAME" {
                    cmd.env_remove(&*k);
                }
            }
        } else {
            cmd.env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .env("HOME", home);
        }
        cmd.env("KUBECONFIG", &kubeconfig)
            .env(
                "RUST_LOG",
                "info,nodegate_agent=debug,nodegate_roster=debug",
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn the binary");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let echo = std::env::var_os("NODEGATE_TEST_VERBOSE").is_some();
        let out: Vec<Box<dyn tokio::io::AsyncRead + Unpin + Send>> = vec![
            Box::new(child.stdout.take().unwrap()),
            Box::new(child.stderr.take().unwrap()),
        ];
        for pipe in out {
            let (logs, tx, user) = (logs.clone(), tx.clone(), user.to_string());
            tokio::spawn(async move {
                let mut lines = BufReader::new(pipe).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if echo {
                        eprintln!("[{user}] {line}");
                    }
                    if let Some(rest) = line.split("listening admin=").nth(1) {
                        let addr = rest.split_whitespace().next().unwrap_or("");
                        if let Ok(a) = addr.parse::<SocketAddr>() {
                            let _ = tx.send(a);
                        }
                    }
                    logs.lock().unwrap().push(line);
                }
            });
        }
        let admin = tokio::time::timeout(WAIT, rx.recv())
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| {
                panic!(
                    "{user} did not log its admin address: {:?}",
                    logs.lock().unwrap()
                )
            });
        Agent {
            child,
            admin,
            logs,
            kubeconfig,
        }
    }

    /// The admin port's address (bound on loopback by these tests).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// The kubeconfig it runs with (its credential).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id().expect("running") as i32)
    }

    pub fn logged(&self, needle: &str) -> bool {
        self.logged_with(&[needle])
    }

    /// One line of the output holds every needle.
    pub fn logged_with(&self, needles: &[&str]) -> bool {
        let logs = self.logs.lock().unwrap();
        logs.iter().any(|l| needles.iter().all(|n| l.contains(n)))
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        self.request("GET", path).await
    }

    /// `method` of `path` on the admin port, without a body: the status (0:
    /// no answer) and the body.
    pub async fn request(&self, method: &str, path: &str) -> (u16, String) {
        let Ok(mut s) = tokio::net::TcpStream::connect(self.admin).await else {
            return (0, String::new());
        };
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        if s.write_all(req.as_bytes()).await.is_err() {
            return (0, String::new());
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        let code = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
        (code, body.unwrap_or_default())
    }

    pub async fn metric(&self, series: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics").await;
        body.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    pub async fn ready(&self) -> bool {
        self.get("/readyz").await.0 == 200
    }

    pub async fn term(&mut self) -> ExitStatus {
        kill(self.pid(), Signal::SIGTERM).unwrap();
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("agent exits after SIGTERM")
            .unwrap()
    }

    pub async fn kill9(&mut self) {
        kill(self.pid(), Signal::SIGKILL).unwrap();
        self.child.wait().await.unwrap();
    }
}
