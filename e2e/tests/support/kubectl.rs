//! The real `kubectl`, as the admin, its output echoed into the test log.

use std::process::Output;

use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;

pub async fn kubectl(c: &Cluster, args: &[&str]) -> Output {
    let out = c
        .kubectl(users::ADMIN)
        .unwrap()
        .args(args)
        .output()
        .await
        .unwrap();
    eprintln!(
        "kubectl {}\n--- stdout\n{}--- stderr\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
