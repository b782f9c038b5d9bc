//! The real control plane from `KUBE_BIN_DIR`: etcd (Debian's) on loopback,
//! kube-apiserver on a private address of a dummy interface, and
//! kube-controller-manager (every default controller) and kube-scheduler,
//! each a child process that dies with the harness (`kill_on_drop`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use base64::Engine;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::control_plane_args::{self as args, Layout};
use super::pki::{Pair, Pki, signing_key_pem};

/// The Kubernetes binaries the harness needs, and where to find them.
pub const KUBE_BINARIES: [&str; 3] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// `$KUBE_BIN_DIR/NAME`, else NAME on PATH.
pub fn kube_bin(name: &str) -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("KUBE_BIN_DIR") {
        let p = Path::new(&dir).join(name);
        if p.is_file() {
            return Some(p);
        }
    }
    on_path(name)
}

pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// `None` when everything is there, else the one-line reason to refuse.
pub fn missing_binaries() -> Option<String> {
    let missing: Vec<&str> = KUBE_BINARIES
        .iter()
        .copied()
        .filter(|b| kube_bin(b).is_none())
        .collect();
    if !missing.is_empty() {
        return Some(format!(
            "no {} in $KUBE_BIN_DIR or PATH: put your Kubernetes version's server binaries there (see e2e/scale/README.md)",
            missing.join(" ")
        ));
    }
    for b in ["etcd", "ip", "kubectl"] {
        if on_path(b).is_none() {
            return Some(format!(
                "no {b} on PATH: run 'e2e/real-nodes/cluster deps' (Debian packages)"
            ));
        }
    }
    if !is_root() {
        return Some("must run as root (a dummy interface for the private addresses)".into());
    }
    None
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Where the cluster lives: a dummy interface (or empty bridge) holding `/24` of private
/// addresses (`.1` the API server, `.2`/`.3` the webhook's two replicas).
#[derive(Debug, Clone)]
pub struct Net {
    pub iface: String,
    pub prefix: [u8; 3],
}

impl Net {
    pub fn ip(&self, host: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(
            self.prefix[0],
            self.prefix[1],
            self.prefix[2],
            host,
        ))
    }

    fn up(&self) -> anyhow::Result<()> {
        // Left over from a run that was killed: start clean.
        let _ = self.down();
        // A dummy interface where the kernel has the module; else an empty
        // bridge (local delivery works on it all the same).
        if ip(&["link", "add", &self.iface, "type", "dummy"]).is_err() {
            ip(&["link", "add", &self.iface, "type", "bridge"])?;
        }
        for host in [1, 2, 3] {
            ip(&[
                "addr",
                "add",
                &format!("{}/24", self.ip(host)),
                "dev",
                &self.iface,
            ])?;
        }
        ip(&["link", "set", &self.iface, "up"])
    }

    pub fn down(&self) -> anyhow::Result<()> {
        ip(&["link", "del", &self.iface])
    }
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .context("running ip")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A free TCP port on `ip` (bound and released: the OS hands out another
/// next time, so races with other programs are unlikely, not impossible).
pub fn free_port(ip: IpAddr) -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind(SocketAddr::new(ip, 0))?;
    Ok(l.local_addr()?.port())
}

/// A child process with its log file; killed when dropped.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    pub child: Child,
}

impl Proc {
    pub fn spawn(
        name: &str,
        log_dir: &Path,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
    ) -> anyhow::Result<Self> {
        let log = std::fs::File::create(log_dir.join(format!("{name}.log")))?;
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        Ok(Self {
            name: name.into(),
            child,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGTERM, then wait up to `grace` before SIGKILL.
    pub async fn stop(mut self, grace: Duration) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
            if tokio::time::timeout(grace, self.child.wait()).await.is_ok() {
                return;
            }
        }
        let _ = self.child.kill().await;
    }
}

/// Writes a kubeconfig with embedded credentials (mode 0600).
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca_pem: &str,
    cert: Option<&Pair>,
    token: Option<&str>,
) -> anyhow::Result<()> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let user = match (cert, token) {
        (Some(p), _) => serde_json::json!({
            "client-certificate-data": b64(&p.cert_pem),
            "client-key-data": b64(&p.key_pem),
        }),
        (None, Some(t)) => serde_json::json!({ "token": t }),
        (None, None) => bail!("a kubeconfig needs a certificate or a token"),
    };
    let cfg = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "scale", "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "scale", "context": {"cluster": "scale", "user": "u"}}],
        "current-context": "scale",
    });
    nodegate_certs::write_atomic(path, serde_yaml::to_string(&cfg)?.as_bytes(), 0o600)?;
    Ok(())
}

/// The running control plane.
#[derive(Debug)]
pub struct ControlPlane {
    pub dir: PathBuf,
    pub net: Net,
    pub server: String,
    pub ca_pem: String,
    pub admin_kubeconfig: PathBuf,
    pub procs: Vec<Proc>,
}

/// nodegate's requests by user, verb and resource: APF's per-FlowSchema
/// counters give the totals, this log the breakdown. Nothing else is
/// logged, so the audit costs the API server little.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts:nodegate"]
  - level: None
"#;

impl ControlPlane {
    /// Certificates and kubeconfigs in `dir`, then etcd and the API server
    /// on `net` (waited for), then the controllers with `qps` as their
    /// client limits.
    pub async fn start(dir: &Path, net: Net, pki: &Pki, qps: u32) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir.join("log"))?;
        net.up()?;
        let api_ip = net.ip(1);
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let api_port = free_port(api_ip)?;
        let server = format!("https://{api_ip}:{api_port}");
        let ca_pem = pki.ca_pem();
        write_pki(&dir.join("pki"), pki, &ca_pem, api_ip)?;
        let admin_kubeconfig = write_kubeconfigs(dir, pki, &server, &ca_pem)?;
        let layout = Layout {
            dir: dir.to_path_buf(),
            api_ip,
            api_port,
            etcd_port: free_port(lo)?,
            etcd_peer_port: free_port(lo)?,
        };
        let mut procs = vec![spawn_etcd(&layout)?];
        procs.push(spawn_apiserver(&layout)?);
        let mut cp = Self {
            dir: dir.to_path_buf(),
            net,
            server,
            ca_pem,
            admin_kubeconfig,
            procs,
        };
        cp.wait_api_ready().await?;
        cp.start_controllers(&layout, qps)?;
        Ok(cp)
    }

    async fn wait_api_ready(&self) -> anyhow::Result<()> {
        let client = self.admin_client().await?;
        wait_ok("kube-apiserver /readyz", Duration::from_secs(120), || {
            let client = client.clone();
            async move {
                let req = http::Request::get("/readyz").body(Vec::new()).ok()?;
                client.request_text(req).await.ok()
            }
        })
        .await?;
        Ok(())
    }

    /// kube-controller-manager and kube-scheduler, each on a free loopback
    /// port for its health endpoint.
    fn start_controllers(&mut self, l: &Layout, qps: u32) -> anyhow::Result<()> {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let kcm = kube_bin("kube-controller-manager").context("kube-controller-manager")?;
        let kcm_args = args::kube_controller_manager(l, free_port(lo)?, qps)?;
        self.procs.push(Proc::spawn(
            "kube-controller-manager",
            &l.log(),
            &kcm,
            &kcm_args,
            &[],
        )?);
        let sched = kube_bin("kube-scheduler").context("kube-scheduler")?;
        let sched_args = args::kube_scheduler(l, free_port(lo)?, qps)?;
        self.procs.push(Proc::spawn(
            "kube-scheduler",
            &l.log(),
            &sched,
            &sched_args,
            &[],
        )?);
        Ok(())
    }

    pub async fn admin_client(&self) -> anyhow::Result<kube::Client> {
        Ok(kube::Client::try_from(self.admin_config().await?)?)
    }

    /// The admin's client configuration (a client is bound to the runtime
    /// it is made on).
    pub async fn admin_config(&self) -> anyhow::Result<kube::Config> {
        let kc = kube::config::Kubeconfig::read_from(&self.admin_kubeconfig)?;
        Ok(kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?)
    }

    /// A client for the API server with `auth` as its credentials.
    pub fn client_with(&self, auth: kube::config::AuthInfo) -> anyhow::Result<kube::Client> {
        let mut cfg = kube::Config::new(self.server.parse()?);
        cfg.root_cert = Some(vec![pem_der(&self.ca_pem)?]);
        cfg.auth_info = auth;
        Ok(kube::Client::try_from(cfg)?)
    }

    /// The pid of a control-plane process, for its RSS.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.procs.iter().find(|p| p.name == name)?.pid()
    }

    pub async fn stop(self) {
        for p in self.procs.into_iter().rev() {
            p.stop(Duration::from_secs(10)).await;
        }
        let _ = self.net.down();
    }
}

/// The CA, the API server's serving pair and the ServiceAccount signing
/// pair in `pki_dir`, under the names e2e/control-plane/*.flags give them.
fn write_pki(pki_dir: &Path, pki: &Pki, ca_pem: &str, api_ip: IpAddr) -> anyhow::Result<()> {
    std::fs::create_dir_all(pki_dir)?;
    let w = |name: &str, data: &str| {
        nodegate_certs::write_atomic(&pki_dir.join(name), data.as_bytes(), 0o600)
    };
    w("ca.crt", ca_pem)?;
    let serving = pki.serving(
        &[
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
            "kubernetes.default.svc.cluster.local".into(),
            "localhost".into(),
        ],
        &[
            api_ip,
            "10.96.0.1".parse()?,
            IpAddr::V4(Ipv4Addr::LOCALHOST),
        ],
    )?;
    w("apiserver.crt", &serving.cert_pem)?;
    w("apiserver.key", &serving.key_pem)?;
    let (sa_key, sa_pub) = signing_key_pem()?;
    w("sa.key", &sa_key)?;
    w("sa.pub", &sa_pub)?;
    Ok(())
}

/// The admin's, the controller-manager's and the scheduler's kubeconfigs in
/// `dir`, each with a client certificate of its own; the admin's path.
fn write_kubeconfigs(dir: &Path, pki: &Pki, server: &str, ca_pem: &str) -> anyhow::Result<PathBuf> {
    let kc = |name: &str, cn: &str, orgs: &[&str]| -> anyhow::Result<PathBuf> {
        let p = dir.join(format!("{name}.kubeconfig"));
        write_kubeconfig(&p, server, ca_pem, Some(&pki.client(cn, orgs)?), None)?;
        Ok(p)
    };
    let admin = kc("admin", "admin", &["system:masters"])?;
    kc("kcm", "system:kube-controller-manager", &[])?;
    kc("scheduler", "system:kube-scheduler", &[])?;
    Ok(admin)
}

fn spawn_etcd(l: &Layout) -> anyhow::Result<Proc> {
    let etcd = on_path("etcd").context("etcd")?;
    Proc::spawn("etcd", &l.log(), &etcd, &args::etcd(l)?, &[])
}

/// The API server, with this harness's audit policy where the shared flags
/// name it.
fn spawn_apiserver(l: &Layout) -> anyhow::Result<Proc> {
    std::fs::write(l.dir.join("audit-policy.yaml"), AUDIT_POLICY)?;
    let apiserver = kube_bin("kube-apiserver").context("kube-apiserver")?;
    Proc::spawn(
        "kube-apiserver",
        &l.log(),
        &apiserver,
        &args::kube_apiserver(l)?,
        &[],
    )
}

/// The DER of the first certificate in `pem`.
pub fn pem_der(pem: &str) -> anyhow::Result<Vec<u8>> {
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    Ok(base64::engine::general_purpose::STANDARD.decode(body)?)
}

/// Polls `f` until it returns `Some` or `within` passes (the condition wait
/// every step of the harness uses; no fixed sleeps).
pub async fn wait_ok<T, F, Fut>(what: &str, within: Duration, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if Instant::now() >= end {
            bail!("timed out after {within:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
