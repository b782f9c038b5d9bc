//! What the emulated API server's admission recorded.

use nodegate_e2e::cluster::Cluster;

/// failurePolicy Ignore would hide a broken call or CEL condition. (On a real
/// cluster the `Cluster` deletes the test's nodes when it drops.)
pub fn no_ignored_failures(c: &Cluster) {
    if let Some(emu) = c.emulator() {
        assert_eq!(emu.ignored_webhook_failures(), Vec::<String>::new());
    }
}
