//! EndpointSlices as the EndpointSlice controller writes them for the
//! webhook's host-network replicas: each Pod at its node's address
//! (loopback here), on the port the Service's `https` port targets.

use nodegate_emulator::Emulator;
use serde_json::{Value, json};

/// A slice `name` of `service` with `pods`, all ready, at `port` (one slice
/// per port, as the controller groups them).
pub fn endpoint_slice(name: &str, service: &str, port: u16, pods: &[&str]) -> String {
    let endpoints: Vec<Value> = pods
        .iter()
        .map(|p| {
            json!({
                "addresses": ["127.0.0.1"],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": format!("node-of-{p}"),
                "targetRef": {"kind": "Pod", "namespace": "nodegate", "name": p},
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "nodegate",
                     "labels": {"kubernetes.io/service-name": service,
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    })
    .to_string()
}

/// The slices of the install's three Services: replica 0 at `port0`,
/// replica 1 at `port1` (the first line's Service selects both).
pub fn endpoint_slices(emu: &Emulator, port0: u16, port1: u16) {
    const R0: &str = "nodegate-webhook-0";
    const R1: &str = "nodegate-webhook-1";
    for doc in [
        endpoint_slice("nodegate-webhook-r0", "nodegate-webhook", port0, &[R0]),
        endpoint_slice("nodegate-webhook-r1", "nodegate-webhook", port1, &[R1]),
        endpoint_slice("nodegate-webhook-0-r0", R0, port0, &[R0]),
        endpoint_slice("nodegate-webhook-1-r1", R1, port1, &[R1]),
    ] {
        emu.apply(&doc).unwrap();
    }
}
