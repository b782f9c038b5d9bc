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
/// A controller's client limits; none (the component's defaults) for 0.
fn client_limits(qps: u32) -> Vec<String> {
    if qps == 0 {
        return Vec::new();
    }
    vec![
        format!("--kube-api-qps={qps}"),
        format!("--kube-api-burst={qps}"),
    ]
}

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

impl ControlPlane {
    pub async fn start(dir: &Path, net: Net, pki: &Pki, qps: u32) -> anyhow::Result<Self> {
        let log = dir.join("log");
        std::fs::create_dir_all(&log)?;
        net.up()?;
        let api_ip = net.ip(1);
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let api_port = free_port(api_ip)?;
        let server = format!("https://{api_ip}:{api_port}");
        let ca_pem = pki.ca_pem();
        let pki_dir = dir.join("pki");
        std::fs::create_dir_all(&pki_dir)?;
        let w = |name: &str, data: &str| -> anyhow::Result<PathBuf> {
            let p = pki_dir.join(name);
            nodegate_certs::write_atomic(&p, data.as_bytes(), 0o600)?;
            Ok(p)
        };
        let ca_file = w("ca.crt", &ca_pem)?;
        let serving = pki.serving(
            &[
                "kubernetes".into(),
                "kubernetes.default".into(),
                "kubernetes.default.svc".into(),
                "kubernetes.default.svc.cluster.local".into(),
                "localhost".into(),
            ],
            &[api_ip, "10.96.0.1".parse()?, lo],
        )?;
        let tls_crt = w("apiserver.crt", &serving.cert_pem)?;
        let tls_key = w("apiserver.key", &serving.key_pem)?;
        let (sa_key, sa_pub) = signing_key_pem()?;
        let sa_key = w("sa.key", &sa_key)?;
        let sa_pub = w("sa.pub", &sa_pub)?;
        let kc = |name: &str, cn: &str, orgs: &[&str]| -> anyhow::Result<PathBuf> {
            let p = dir.join(format!("{name}.kubeconfig"));
            write_kubeconfig(&p, &server, &ca_pem, Some(&pki.client(cn, orgs)?), None)?;
            Ok(p)
        };
        let admin = kc("admin", "admin", &["system:masters"])?;
        let kcm = kc("kcm", "system:kube-controller-manager", &[])?;
        let sched = kc("scheduler", "system:kube-scheduler", &[])?;

        let mut procs = Vec::new();
        let (etcd_port, etcd_peer) = (free_port(lo)?, free_port(lo)?);
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        let etcd = on_path("etcd").context("etcd")?;
        procs.push(Proc::spawn(
            "etcd",
            &log,
            &etcd,
            &[
                "--data-dir".into(),
                dir.join("etcd").display().to_string(),
                "--name".into(),
                "scale".into(),
                "--listen-client-urls".into(),
                etcd_url.clone(),
                "--advertise-client-urls".into(),
                etcd_url.clone(),
                "--listen-peer-urls".into(),
                peer_url.clone(),
                "--initial-advertise-peer-urls".into(),
                peer_url.clone(),
                "--initial-cluster".into(),
                format!("scale={peer_url}"),
                // The default 2 GiB quota is reached by no run here; the
                // history of 1,000 Leases renewed every 10 s is compacted by
                // the API server every 5 min.
                "--quota-backend-bytes".into(),
                "8589934592".into(),
            ],
            &[],
        )?);
        let s = |p: &Path| p.display().to_string();
        // nodegate's requests by user, verb and resource: APF's per-FlowSchema
        // counters give the totals, this log the breakdown. Nothing else is
        // logged, so the audit costs the API server little.
        let audit_policy = dir.join("audit-policy.yaml");
        std::fs::write(
            &audit_policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  - level: Metadata\n    userGroups: [\"system:serviceaccounts:nodegate\"]\n  - level: None\n",
        )?;
        let apiserver = kube_bin("kube-apiserver").context("kube-apiserver")?;
        procs.push(Proc::spawn(
            "kube-apiserver",
            &log,
            &apiserver,
            &[
                format!("--etcd-servers={etcd_url}"),
                format!("--bind-address={api_ip}"),
                format!("--advertise-address={api_ip}"),
                format!("--secure-port={api_port}"),
                "--service-cluster-ip-range=10.96.0.0/16".into(),
                format!("--client-ca-file={}", s(&ca_file)),
                format!("--tls-cert-file={}", s(&tls_crt)),
                format!("--tls-private-key-file={}", s(&tls_key)),
                format!("--service-account-key-file={}", s(&sa_pub)),
                format!("--service-account-signing-key-file={}", s(&sa_key)),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                "--authorization-mode=Node,RBAC".into(),
                "--enable-admission-plugins=NodeRestriction".into(),
                // No kube-proxy: the API server resolves the webhook's
                // Services to their endpoints itself.
                "--enable-aggregator-routing=true".into(),
                "--profiling=false".into(),
                format!("--audit-policy-file={}", s(&audit_policy)),
                format!("--audit-log-path={}", s(&log.join("audit.log"))),
                "--audit-log-format=json".into(),
                "--audit-log-maxsize=0".into(),
            ],
            &[],
        )?);
        let cp = Self {
            dir: dir.to_path_buf(),
            net,
            server,
            ca_pem,
            admin_kubeconfig: admin,
            procs,
        };
        let client = cp.admin_client().await?;
        wait_ok("kube-apiserver /readyz", Duration::from_secs(120), || {
            let client = client.clone();
            async move {
                let req = http::Request::get("/readyz").body(Vec::new()).ok()?;
                client.request_text(req).await.ok()
            }
        })
        .await?;
        let mut cp = cp;
        let kcm_bin = kube_bin("kube-controller-manager").context("kube-controller-manager")?;
        cp.procs.push(Proc::spawn(
            "kube-controller-manager",
            &log,
            &kcm_bin,
            &[
                format!("--kubeconfig={}", s(&kcm)),
                format!("--authentication-kubeconfig={}", s(&kcm)),
                format!("--authorization-kubeconfig={}", s(&kcm)),
                format!("--service-account-private-key-file={}", s(&sa_key)),
                format!("--root-ca-file={}", s(&ca_file)),
                "--use-service-account-credentials".into(),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port(lo)?),
                "--service-cluster-ip-range=10.96.0.0/16".into(),
            ]
            .into_iter()
            .chain(client_limits(qps))
            .collect::<Vec<_>>(),
            &[],
        )?);
        let sched_bin = kube_bin("kube-scheduler").context("kube-scheduler")?;
        cp.procs.push(Proc::spawn(
            "kube-scheduler",
            &log,
            &sched_bin,
            &[
                format!("--kubeconfig={}", s(&sched)),
                format!("--authentication-kubeconfig={}", s(&sched)),
                format!("--authorization-kubeconfig={}", s(&sched)),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port(lo)?),
            ]
            .into_iter()
            .chain(client_limits(qps))
            .collect::<Vec<_>>(),
            &[],
        )?);
        Ok(cp)
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
