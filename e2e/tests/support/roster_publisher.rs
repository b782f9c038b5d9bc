//! The real `nodegate-roster` binary as a test runs it, and what its log
//! must not say.

use std::path::Path;
use std::time::Duration;

use nodegate_e2e::LoggedChild;

/// Long enough for a lease renewal of the installed publisher (retry period
/// 2 s, lease 15 s) and for a failover of the tests' own (2 s).
pub const WAIT: Duration = Duration::from_secs(40);

/// A replica of the real `nodegate-roster` binary, as `kubeconfig`'s user,
/// under the shipped roster name with short lease timings (a failover takes
/// about 2 s).
pub fn publisher(kubeconfig: &Path, ns: &str, identity: &str, shards: u32) -> LoggedChild {
    let bin = nodegate_e2e::bin_path("nodegate-roster");
    assert!(
        bin.exists(),
        "{} missing: build it first (cargo build -p nodegate-roster)",
        bin.display()
    );
    let mut cmd = tokio::process::Command::new(bin);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .args(["--namespace", ns, "--identity", identity])
        .args(["--shards", &shards.to_string(), "--interval", "50ms"])
        .args(["--lease-duration", "2s", "--renew-deadline", "1500ms"])
        .args(["--retry-period", "250ms", "--admin-listen", "127.0.0.1:0"]);
    LoggedChild::spawn(identity, cmd).unwrap()
}

/// No request of the publisher was refused.
pub fn assert_never_refused(p: &LoggedChild) {
    let refusals: Vec<String> = p
        .logs()
        .into_iter()
        .filter(|l| {
            let l = l.to_lowercase();
            l.contains("forbidden") || l.contains("cannot write roster shard")
        })
        .collect();
    assert!(
        refusals.is_empty(),
        "the publisher was refused: {refusals:#?}"
    );
}
