//! The real `kubectl` against nodegate: a server-side dry run shows the
//! taint and its warning and stores nothing; create, taint, get and get
//! --watch behave as on a cluster.

use std::time::Duration;

use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::admission::no_ignored_failures;
use crate::support::kubectl::kubectl;
use crate::support::taints::TAINT_KEY;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn node_yaml(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    example.com/pool: e2e\n"
    )
}

#[tokio::test]
async fn kubectl_dry_run_shows_taint_and_warning_and_stores_nothing() {
    let c = Cluster::start().await.unwrap();
    let name = c.node_name("dry");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), node_yaml(&name)).unwrap();
    let path = file.path().to_str().unwrap();
    // Default validation (strict): no --validate=false.
    let out = kubectl(
        &c,
        &["create", "--dry-run=server", "-f", path, "-o", "yaml"],
    )
    .await;
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    assert!(stdout.contains(&format!("key: {TAINT_KEY}")), "{stdout}");
    assert!(
        stdout.contains("key: node.kubernetes.io/not-ready"),
        "{stdout}"
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("Warning:") && stderr.contains(TAINT_KEY),
        "{stderr}"
    );

    let out = kubectl(&c, &["get", "node", &name]).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("not found"));
    no_ignored_failures(&c);
}

#[tokio::test]
async fn kubectl_create_taint_and_get_behave_as_on_a_cluster() {
    let c = Cluster::start().await.unwrap();
    let name = c.node_name("made");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), node_yaml(&name)).unwrap();
    let out = kubectl(&c, &["create", "-f", file.path().to_str().unwrap()]).await;
    assert!(out.status.success());
    assert!(text(&out.stdout).contains(&format!("node/{name} created")));

    let keys = kubectl(
        &c,
        &["get", "node", &name, "-o", "jsonpath={.spec.taints[*].key}"],
    )
    .await;
    let keys = text(&keys.stdout);
    assert!(keys.contains(TAINT_KEY), "{keys}");
    // On a real cluster the node lifecycle controller adds and removes
    // `node.kubernetes.io/not-ready` on its own schedule after the create,
    // so only the emulator's stored create is asserted to carry it.
    if !c.is_real() {
        assert!(keys.contains("node.kubernetes.io/not-ready"), "{keys}");
    }

    let out = kubectl(
        &c,
        &["taint", "node", &name, "example.com/extra=1:NoSchedule"],
    )
    .await;
    assert!(out.status.success());
    assert!(text(&out.stdout).contains(&format!("node/{name} tainted")));
    // An admin removing nodegate's taint: no ready annotation, so not re-added.
    let out = kubectl(
        &c,
        &["taint", "node", &name, &format!("{TAINT_KEY}:NoSchedule-")],
    )
    .await;
    assert!(out.status.success());
    assert!(text(&out.stdout).contains(&format!("node/{name} untainted")));
    let keys = kubectl(
        &c,
        &["get", "node", &name, "-o", "jsonpath={.spec.taints[*].key}"],
    )
    .await;
    let keys = text(&keys.stdout);
    assert!(
        keys.contains("example.com/extra") && !keys.contains(TAINT_KEY),
        "{keys}"
    );
    // Removing a taint that is not there fails like the real kubectl.
    let out = kubectl(
        &c,
        &["taint", "node", &name, "example.com/none:NoSchedule-"],
    )
    .await;
    assert!(!out.status.success());

    let out = kubectl(&c, &["get", "nodes", "-l", "example.com/pool=e2e"]).await;
    let table = text(&out.stdout);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("STATUS") && table.contains(&name), "{table}");
    no_ignored_failures(&c);
}

#[tokio::test]
async fn kubectl_get_watch_prints_rows() {
    let c = Cluster::start().await.unwrap();
    let name = c.node_name("watched");
    let mut child = c
        .kubectl(users::ADMIN)
        .unwrap()
        .args(["get", "nodes", "-w", "--output-watch-events"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Whether the node is in kubectl's initial list or arrives on its watch,
    // it is printed as an ADDED row of the server-side Table.
    let kubelet = c.kubelet(&name).await.unwrap();
    kubelet.register().await.unwrap();
    let row = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let line = lines.next_line().await.unwrap().unwrap();
            if line.contains(&name) {
                return line;
            }
        }
    })
    .await
    .expect("kubectl printed the node");
    assert!(row.starts_with("ADDED") && row.contains("Ready"), "{row}");
    child.kill().await.unwrap();
    no_ignored_failures(&c);
}
