//! Reviews no API server sent, on the real nodes: a forged Node CREATE and
//! status write claiming a new boot of a ready node, posted the three ways
//! an attacker reaches a replica — from a pod (pod network), from another
//! node's host network, and through the API server's service proxy — at the
//! paths a forger can know. Each is answered (HTTP 200, an AdmissionReview)
//! and re-gates nothing, evicts nothing in strict mode; the webhook counts
//! each side effect it refused. The crash reboot that follows each run is
//! the genuine one, still gated from the first version of its new boot.

use std::collections::BTreeMap;

use nodegate_e2e::forged_review::{PATHS, copy_with_boot, review};
use nodegate_e2e::metrics::parse;
use serde_json::Value;

use nodegate_e2e::real_nodes::harness::{Harness, figure, ok, step, wait};
use nodegate_e2e::real_nodes::live::{live_node, live_pods, replica_hosts};
use nodegate_e2e::real_nodes::objects::{NS, boot_gated, gated, name_of, pod_ready};
use nodegate_e2e::real_nodes::record::versions_after;
use nodegate_e2e::real_nodes::scenario::Ctx;

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
pub(crate) async fn forged_reviews(c: &Ctx, node: &str, mode: &str) {
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
    let pid = start_forger(c, &other).await;
    let before_rv = rec.last_rv();
    let refused_before = refused(c, &hosts);

    let mut sent = Sent::default();
    for file in ["forged-create.json", "forged-status.json"] {
        for (_, ip) in &hosts {
            for path in PATHS {
                let url = format!("https://{ip}:9443{path}");
                sent.direct(
                    h,
                    "a pod",
                    curl(&format!("nsenter -t {pid} -n"), file, &url),
                );
                sent.direct(
                    h,
                    "a node's host network",
                    curl(&format!("ip netns exec ng-{other}"), file, &url),
                );
            }
        }
    }
    sent.through_service_proxy(h);
    let total = sent.report(mode);
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
    nothing_regated(c, node, mode, before_rv).await;
    h.kubectl(&format!("delete pod {FORGER} --wait=false"));
    node_creator(c, node, mode).await;
    impersonated_webhook(c, node, mode).await;
}

/// A namespace editor acts as the webhook's ServiceAccount (`edit` may
/// impersonate it): the ordinary gate and, in strict mode, the evicting one
/// are both refused by the webhook's confinement, which wants the claims of
/// a token bound to a Pod of its StatefulSet.
async fn impersonated_webhook(c: &Ctx, node: &str, mode: &str) {
    let Ctx { h, client, rec, .. } = c;
    step(&format!(
        "the webhook's ServiceAccount impersonated ({mode}): no taint, no boot gate"
    ));
    let before_rv = rec.last_rv();
    let mut refused = 0;
    for effect in ["NoSchedule", "NoExecute"] {
        let out = h.sh(&format!(
            "kubectl --as=system:serviceaccount:{NS}:nodegate-webhook taint node {node} \
               nodegate.dev/agent-not-ready=true:{effect} 2>&1"
        ));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        println!("{effect}: {}", text.trim());
        assert!(
            !out.status.success(),
            "impersonated webhook tainted {node} {effect}"
        );
        assert!(
            text.contains("only with the token of a pod of its StatefulSet"),
            "{text}"
        );
        refused += 1;
    }
    figure(&format!("impersonated_webhook_{mode}_refused"), refused);
    let now = live_node(client, node).await.unwrap();
    assert!(!gated(&now) && !boot_gated(&now), "{node} gated");
    let regated = versions_after(rec, node, before_rv)
        .into_iter()
        .filter(|s| gated(&s.obj) || boot_gated(&s.obj))
        .count();
    figure(
        &format!("impersonated_webhook_{mode}_gated_versions"),
        regated,
    );
    assert_eq!(regated, 0);
}

/// A user whose only right is `create nodes` (Cluster API's, virtual-kubelet's,
/// an autoscaler provider's) creates a copy of the ready `node` with another
/// boot ID, as its kubelet re-registering after a reboot would. The API
/// server answers AlreadyExists only after mutating admission ran: the
/// webhook must write nothing, so no version is gated and, in strict mode,
/// no pod on the node is evicted.
async fn node_creator(c: &Ctx, node: &str, mode: &str) {
    const CREATOR: &str = "nodegate-e2e-node-creator";
    let Ctx { h, client, rec, .. } = c;
    step(&format!(
        "a node creator's create of a ready node with a new boot ID ({mode}): AlreadyExists, nothing gated"
    ));
    h.kubectl(&format!(
        "create clusterrole {CREATOR} --verb=create --resource=nodes --dry-run=client -o yaml | kubectl apply -f -"
    ));
    h.kubectl(&format!(
        "create clusterrolebinding {CREATOR} --clusterrole={CREATOR} --user={CREATOR} --dry-run=client -o yaml | kubectl apply -f -"
    ));
    let copy = copy_with_boot(
        &serde_json::to_value(live_node(client, node).await.unwrap()).unwrap(),
        "ffffffff-0000-4000-8000-0000000000aa",
    );
    std::fs::write(
        h.work.path().join("n.json"),
        serde_json::to_vec(&copy).unwrap(),
    )
    .unwrap();
    let before_rv = rec.last_rv();
    let evicting_before = evicting(c, node).await;
    // RBAC reaches the authorizer's cache within a moment.
    let answer = wait(
        "the node creator's create answered AlreadyExists",
        30,
        async || {
            let out = h.sh(&format!("kubectl create -f n.json --as={CREATOR} 2>&1"));
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.contains("AlreadyExists").then_some(text)
        },
    )
    .await;
    println!("{}", answer.trim());
    // The webhook decides before the answer; a background patch would follow
    // within a second. Watch the node for longer than that.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < end {
        let now = live_node(client, node).await.unwrap();
        assert!(
            !gated(&now) && !boot_gated(&now),
            "{node} gated by a node creator"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let regated = versions_after(rec, node, before_rv)
        .into_iter()
        .filter(|s| gated(&s.obj) || boot_gated(&s.obj))
        .count();
    let evicted = evicting(c, node).await.saturating_sub(evicting_before);
    figure(&format!("node_creator_{mode}_gated_versions"), regated);
    figure(&format!("node_creator_{mode}_evicted_pods"), evicted);
    assert_eq!((regated, evicted), (0, 0));
    h.kubectl(&format!(
        "delete clusterrolebinding {CREATOR} && kubectl delete clusterrole {CREATOR}"
    ));
}

/// Pods on `node` being deleted (the taint-eviction controller's mark).
async fn evicting(c: &Ctx, node: &str) -> usize {
    live_pods(&c.client)
        .await
        .into_iter()
        .filter(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                && p.metadata.deletion_timestamp.is_some()
        })
        .count()
}

/// Runs the forger's pod on `other` and returns the pid of a process in its
/// network namespace.
async fn start_forger(c: &Ctx, other: &str) -> String {
    c.h.kubectl(&format!(
        "run {FORGER} --image=localhost/pause:1 --image-pull-policy=Never --restart=Never \
         --overrides='{{\"spec\":{{\"nodeName\":\"{other}\",\"terminationGracePeriodSeconds\":1}}}}'"
    ));
    let pod_ip = wait("the forger pod running", 120, async || {
        live_pods(&c.client)
            .await
            .into_iter()
            .find(|p| name_of(p) == FORGER && pod_ready(p))
            .and_then(|p| p.status?.pod_ip)
    })
    .await;
    pod_netns_pid(c, &pod_ip)
}

/// The forged reviews sent, by where from, and how many were answered.
#[derive(Default)]
struct Sent {
    from: BTreeMap<&'static str, u64>,
    answered: u64,
}

impl Sent {
    /// Runs `command` (a curl that prints the HTTP code after the body) as
    /// a forger `from` somewhere.
    fn direct(&mut self, h: &Harness, from: &'static str, command: String) {
        let out = ok(&format!("forged review from {from}"), h.sh(&command));
        let (body, code) = out.trim_end().rsplit_once('\n').unwrap_or(("", out.trim()));
        *self.from.entry(from).or_default() += 1;
        let v: Value = serde_json::from_str(body).unwrap_or_default();
        if code == "200" && v["response"]["allowed"] == true {
            self.answered += 1;
        } else {
            println!("{from}: HTTP {code} {body}");
        }
    }

    /// Anyone with `create services/proxy` in the namespace: every line's Service.
    fn through_service_proxy(&mut self, h: &Harness) {
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
                *self.from.entry("the service proxy").or_default() += 1;
                let v: Value = serde_json::from_str(&out).unwrap_or_default();
                if v["response"]["allowed"] == true {
                    self.answered += 1;
                } else {
                    println!("service proxy {service}/{path}: {out}");
                }
            }
        }
    }

    /// Prints the counts as figures, asserts every review was answered, and
    /// returns how many were sent.
    fn report(&self, mode: &str) -> u64 {
        let total: u64 = self.from.values().sum();
        for (from, n) in &self.from {
            println!("forged reviews from {from}: {n}");
        }
        figure(&format!("forged_{mode}_reviews_sent"), total);
        figure(&format!("forged_{mode}_answered"), self.answered);
        assert_eq!(self.answered, total, "every forged review gets an answer");
        total
    }
}

/// No version of `node` since `before_rv` carries either gate, nor does the
/// stored Node.
async fn nothing_regated(c: &Ctx, node: &str, mode: &str, before_rv: u64) {
    let regated: Vec<_> = versions_after(&c.rec, node, before_rv)
        .into_iter()
        .filter(|s| gated(&s.obj) || boot_gated(&s.obj))
        .collect();
    figure(&format!("forged_{mode}_gated_versions"), regated.len());
    assert!(
        regated.is_empty(),
        "a forged review re-gated {node} ({} versions)",
        regated.len()
    );
    let now = live_node(&c.client, node).await.unwrap();
    assert!(
        !gated(&now) && !boot_gated(&now),
        "{node} gated by a forged review"
    );
}
