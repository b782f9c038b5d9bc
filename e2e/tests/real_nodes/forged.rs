//! Reviews no API server sent, on the real nodes: a forged Node CREATE and
//! status write claiming a new boot of a ready node, posted the three ways
//! an attacker reaches a replica — from a pod (pod network), from another
//! node's host network, and through the API server's service proxy — at the
//! paths a forger can know. Each is answered (HTTP 200, an AdmissionReview)
//! and re-gates nothing, evicts nothing in strict mode; the webhook counts
//! each side effect it refused. The crash reboot that follows each run is
//! the genuine one, still gated from the first version of its new boot.

use std::collections::BTreeMap;

use nodegate_e2e::forged_review::{PATHS, review};
use nodegate_e2e::scale::metrics::parse;
use serde_json::Value;

use super::strict::boot_gated;
use super::{
    Ctx, NS, figure, gated, last_rv, live_node, live_pods, name_of, ok, pod_ready, replica_hosts,
    step, versions_after, wait,
};

const REFUSED: &str = "nodegate_webhook_unauthenticated_side_effects_total";
const FORGER: &str = "nodegate-e2e-forger";

/// The webhook's count of refused side effects, summed over its replicas
/// (each replica's admin port, on its node's IP).
fn refused(c: &Ctx, hosts: &[(String, String)]) -> u64 {
    hosts
        .iter()
        .map(|(_, ip)| {
            let text = ok(
                "webhook metrics",
                c.h.sh(&format!("curl -fsS --max-time 5 http://{ip}:9444/metrics")),
            );
            parse(&text).sum(REFUSED, &[]) as u64
        })
        .sum()
}

/// `curl` POSTing `file` to `url`, run by `prefix` (the namespace to enter);
/// prints the HTTP code after the body.
fn curl(prefix: &str, file: &str, url: &str) -> String {
    format!(
        "{prefix} curl -sk --max-time 10 -X POST -H 'content-type: application/json' \
         --data-binary @{file} -w '\\n%{{http_code}}' {url}"
    )
}

/// The pid of a process whose network namespace holds `ip`: the pod's
/// sandbox or container (both run the harness's pause image, busybox
/// `sleep`), as the forger's own process would be.
fn pod_netns_pid(c: &Ctx, ip: &str) -> String {
    let pid = ok(
        "the forger pod's network namespace",
        c.h.sh(&format!(
            "for p in $(pgrep -f 'sleep 2147483647'); do \
               nsenter -t $p -n ip -4 -o addr show 2>/dev/null | grep -q ' {ip}/' && echo $p && break; \
             done"
        )),
    );
    let pid = pid.trim().to_string();
    assert!(!pid.is_empty(), "no process in the network of pod IP {ip}");
    pid
}

/// Sends the forged reviews of a ready, ungated `node` every way and
/// asserts they changed nothing; `mode` names the install in the figures.
pub(super) async fn forged_reviews(c: &Ctx, node: &str, mode: &str) {
    let Ctx { h, client, rec, .. } = c;
    step(&format!(
        "forged reviews ({mode}): from a pod, another node's host network and the service proxy; nothing re-gated"
    ));
    let stored = live_node(client, node).await.unwrap();
    assert!(!gated(&stored), "{node} must start ready and ungated");
    let node_json = serde_json::to_value(&stored).unwrap();
    for (file, status_write) in [("forged-create.json", false), ("forged-status.json", true)] {
        let body = serde_json::to_vec(&review(&node_json, "forged", status_write)).unwrap();
        std::fs::write(h.work.path().join(file), body).unwrap();
    }
    let hosts = replica_hosts(client).await;
    // The forger's host network: a node that runs no replica and is not the target.
    let other = c
        .nodes0
        .iter()
        .find(|n| n.as_str() != node)
        .cloned()
        .unwrap();
    h.kubectl(&format!(
        "run {FORGER} --image=localhost/pause:1 --image-pull-policy=Never --restart=Never \
         --overrides='{{\"spec\":{{\"nodeName\":\"{other}\",\"terminationGracePeriodSeconds\":1}}}}'"
    ));
    let pod_ip = wait("the forger pod running", 120, async || {
        live_pods(client)
            .await
            .into_iter()
            .find(|p| name_of(p) == FORGER && pod_ready(p))
            .and_then(|p| p.status?.pod_ip)
    })
    .await;
    let pid = pod_netns_pid(c, &pod_ip);
    let before_rv = last_rv(rec);
    let refused_before = refused(c, &hosts);

    let mut sent: BTreeMap<&str, u64> = BTreeMap::new();
    let mut answered = 0;
    let mut send = |from: &'static str, command: String| {
        let out = ok(&format!("forged review from {from}"), h.sh(&command));
        let (body, code) = out.trim_end().rsplit_once('\n').unwrap_or(("", out.trim()));
        *sent.entry(from).or_default() += 1;
        let v: Value = serde_json::from_str(body).unwrap_or_default();
        if code == "200" && v["response"]["allowed"] == true {
            answered += 1;
        } else {
            println!("{from}: HTTP {code} {body}");
        }
    };
    for file in ["forged-create.json", "forged-status.json"] {
        for (_, ip) in &hosts {
            for path in PATHS {
                let url = format!("https://{ip}:9443{path}");
                send("a pod", curl(&format!("nsenter -t {pid} -n"), file, &url));
                send(
                    "a node's host network",
                    curl(&format!("ip netns exec ng-{other}"), file, &url),
                );
            }
        }
    }
    // Anyone with `create services/proxy` in the namespace: every line's Service.
    for service in [
        "nodegate-webhook",
        "nodegate-webhook-0",
        "nodegate-webhook-1",
    ] {
        for path in ["mutate", ""] {
            let out = ok(
                "forged review through the service proxy",
                h.sh(&format!(
                    "kubectl create --raw /api/v1/namespaces/{NS}/services/https:{service}:443/proxy/{path} \
                     -f forged-create.json"
                )),
            );
            *sent.entry("the service proxy").or_default() += 1;
            let v: Value = serde_json::from_str(&out).unwrap_or_default();
            if v["response"]["allowed"] == true {
                answered += 1;
            } else {
                println!("service proxy {service}/{path}: {out}");
            }
        }
    }
    let total: u64 = sent.values().sum();
    for (from, n) in &sent {
        println!("forged reviews from {from}: {n}");
    }
    figure(&format!("forged_{mode}_reviews_sent"), total);
    figure(&format!("forged_{mode}_answered"), answered);
    assert_eq!(answered, total, "every forged review gets an answer");
    // Each review would have written the stored Node: the webhook counts
    // each write it refused, which is also when its decision was made.
    let counted = wait(
        "every forged side effect counted as refused",
        30,
        async || {
            let n = refused(c, &hosts) - refused_before;
            (n >= total).then_some(n)
        },
    )
    .await;
    figure(&format!("forged_{mode}_side_effects_refused"), counted);
    assert_eq!(counted, total);
    let regated: Vec<_> = versions_after(rec, node, before_rv)
        .into_iter()
        .filter(|s| gated(&s.obj) || boot_gated(&s.obj))
        .collect();
    figure(&format!("forged_{mode}_gated_versions"), regated.len());
    assert!(
        regated.is_empty(),
        "a forged review re-gated {node} ({} versions)",
        regated.len()
    );
    let now = live_node(client, node).await.unwrap();
    assert!(
        !gated(&now) && !boot_gated(&now),
        "{node} gated by a forged review"
    );
    h.kubectl(&format!("delete pod {FORGER} --wait=false"));
}
