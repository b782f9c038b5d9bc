//! Servers under test run as separate processes, so their CPU time and
//! memory can be read from /proc without the load generator's.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// How long a server may take to print its listening line.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Lines of server output kept for error messages.
const KEEP_LINES: usize = 30;

/// A running server process.
pub struct Server {
    child: Child,
    pub pid: u32,
    pub https: SocketAddr,
    /// The admin address, when the listening line names one (the webhook's).
    pub admin: Option<SocketAddr>,
    pub name: String,
    log: Arc<Mutex<VecDeque<String>>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.name)
            .field("pid", &self.pid)
            .field("https", &self.https)
            .finish()
    }
}

/// A binary next to the running one (same target dir, same profile).
pub fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the running binary")?;
    let dir = exe.parent().context("binary has no directory")?;
    let path = dir.join(name);
    if !path.is_file() {
        bail!(
            "{} not found: build it first with `cargo build --release -p nodegate-bench -p nodegate-webhook`",
            path.display()
        );
    }
    Ok(path)
}

impl Server {
    /// Starts `bin args…` and waits until it logs `https=ADDR`.
    pub async fn start(bin: &Path, args: &[String]) -> anyhow::Result<Server> {
        let name = bin
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut child = Command::new(bin)
            .args(args)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            // No cluster: the webhook must serve without credentials.
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("KUBECONFIG", "/nonexistent/nodegate-bench-kubeconfig")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id().context("server exited at once")?;
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, mut rx) = mpsc::unbounded_channel();
        if let Some(out) = child.stdout.take() {
            tokio::spawn(drain(out, log.clone(), tx.clone()));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(drain(err, log.clone(), tx));
        }
        let https = tokio::time::timeout(START_TIMEOUT, async {
            while let Some(line) = rx.recv().await {
                if let Some(addr) = listening_addr(&line, "https") {
                    return Some((addr, listening_addr(&line, "admin")));
                }
            }
            None
        })
        .await;
        let mut server = Server {
            child,
            pid,
            https: SocketAddr::from(([0, 0, 0, 0], 0)),
            admin: None,
            name,
            log,
        };
        match https {
            Ok(Some((addr, admin))) => {
                server.https = addr;
                server.admin = admin;
                Ok(server)
            }
            Ok(None) => bail!(
                "{} exited before listening:\n{}",
                server.name,
                server.log_tail()
            ),
            Err(_) => bail!(
                "{} printed no `https=ADDR` line within {START_TIMEOUT:?}:\n{}",
                server.name,
                server.log_tail()
            ),
        }
    }

    /// The last lines the server printed.
    pub fn log_tail(&self) -> String {
        self.log
            .lock()
            .map(|l| l.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, wait for the drain, SIGKILL if it takes too long.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .await;
        match tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await {
            Ok(_) => Ok(()),
            Err(_) => {
                self.child.kill().await.context("killing the server")?;
                bail!("{} did not stop within 15 s of SIGTERM", self.name)
            }
        }
    }
}

async fn drain(
    out: impl AsyncRead + Unpin,
    log: Arc<Mutex<VecDeque<String>>>,
    tx: mpsc::UnboundedSender<String>,
) {
    let mut lines = BufReader::new(out).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line = strip_ansi(&line);
        if let Ok(mut l) = log.lock() {
            if l.len() == KEEP_LINES {
                l.pop_front();
            }
            l.push_back(line.clone());
        }
        let _ = tx.send(line);
    }
}

/// Removes terminal colour sequences (`ESC [ … letter`).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The address after `field=` (text logs) or `"field":"` (JSON logs).
pub fn listening_addr(line: &str, field: &str) -> Option<SocketAddr> {
    let text = format!("{field}=");
    let json = format!("\"{field}\":\"");
    let rest = if let Some(i) = line.find(&json) {
        &line[i + json.len()..]
    } else {
        let i = line
            .match_indices(&text)
            .find(|(i, _)| *i == 0 || !line.as_bytes()[i - 1].is_ascii_alphanumeric())?
            .0;
        &line[i + text.len()..]
    };
    let end = rest
        .find(|c: char| c.is_whitespace() || c == '"' || c == ',' || c == '}')
        .unwrap_or(rest.len());
    rest[..end].trim_start_matches("https://").parse().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn finds_the_address_in_text_and_json_logs() {
        let want: SocketAddr = "127.0.0.1:40123".parse().unwrap();
        let text = "2026-11-22T20:00:00Z  INFO nodegate_webhook: listening https=127.0.0.1:40123 admin=127.0.0.1:40124";
        assert_eq!(listening_addr(text, "https"), Some(want));
        assert_eq!(
            listening_addr(text, "admin"),
            Some("127.0.0.1:40124".parse().unwrap())
        );
        let json = r#"{"level":"INFO","fields":{"message":"listening","https":"127.0.0.1:40123","admin":"127.0.0.1:1"}}"#;
        assert_eq!(listening_addr(json, "https"), Some(want));
        assert_eq!(listening_addr("listening admin=127.0.0.1:1", "https"), None);
        assert_eq!(listening_addr("xhttps=127.0.0.1:5", "https"), None);
        assert_eq!(
            listening_addr("https=[::1]:8443", "https"),
            Some("[::1]:8443".parse().unwrap())
        );
    }

    #[test]
    fn colours_are_stripped() {
        let coloured = "\u{1b}[2m2026\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m listening \u{1b}[3mhttps\u{1b}[0m\u{1b}[2m=\u{1b}[0m127.0.0.1:9";
        let plain = strip_ansi(coloured);
        assert_eq!(plain, "2026  INFO listening https=127.0.0.1:9");
        assert_eq!(
            listening_addr(&plain, "https"),
            Some("127.0.0.1:9".parse().unwrap())
        );
    }
}
