//! Field ownership (`metadata.managedFields`): neither stolen token may
//! rewrite it, and the writes nodegate makes still go through while the API
//! server records it, up to and past its cap of update managers.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use nodegate_shared::keys::READY_BOOT_ID_ANNOTATION;
use serde_json::{Value, json};

use crate::support::node_writes::{json_patch, json_patch_with, patch, ready_boot_id_path};
use crate::support::refusals::{AGENT_POLICY, WEBHOOK_POLICY, assert_refused};
use crate::support::taints::{TAINT_KEY, taints};
use crate::support::target_node::node;

/// What a real API server records when the admin creates [`node`]'s Node
/// (measured on kube-apiserver: one update entry of the client's manager).
fn creation_entry(manager: &str) -> Value {
    json!({"manager": manager, "operation": "Update", "apiVersion": "v1",
           "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
           "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:example.com/owner": {}},
                                       "f:labels": {".": {}, "f:kubernetes.io/hostname": {}}},
                        "f:spec": {"f:taints": {}}}})
}

/// An update entry of `manager` at `time` owning `fields`.
fn update_entry(manager: &str, time: &str, fields: Value) -> Value {
    json!({"manager": manager, "operation": "Update", "apiVersion": "v1", "time": time,
           "fieldsType": "FieldsV1", "fieldsV1": fields})
}

fn set_ownership(entries: &Value) -> Value {
    // `add` replaces the member when it exists, and creates it when not.
    json!([{"op": "add", "path": "/metadata/managedFields", "value": entries}])
}

/// The node's field ownership as stored.
async fn ownership(c: &Cluster, node: &str) -> Vec<Value> {
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let n = serde_json::to_value(api.get(node).await.unwrap()).unwrap();
    n["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Whether the API server records field ownership: a real one does for the
/// Node's create; the emulator keeps none, also when it is the "real"
/// cluster of real-cluster mode (`nodegate-sim serve`).
async fn records_ownership(c: &Cluster, node: &str) -> bool {
    !ownership(c, node).await.is_empty()
}

/// The emulator keeps no field ownership (emulator/README.md): give the
/// test's node what a real API server records at its creation. A real
/// cluster has recorded it already.
async fn recorded_ownership(c: &Cluster, node: &str) -> Vec<Value> {
    if !records_ownership(c, node).await {
        let admin = c.client(users::ADMIN).await.unwrap();
        json_patch(
            &admin,
            node,
            set_ownership(&json!([creation_entry("nodegate-e2e")])),
        )
        .await
        .unwrap();
    }
    ownership(c, node).await
}

fn managers(entries: &[Value]) -> Vec<String> {
    let mut m: Vec<String> = entries
        .iter()
        .map(|e| format!("{} ({})", e["manager"], e["operation"]))
        .collect();
    m.sort();
    m
}

/// `metadata.managedFields` decides what a server-side apply deletes: a
/// manager's apply prunes the fields its apply entry owned and no longer
/// sets, unless another manager owns them too. A write may carry its own
/// managedFields, and the API server takes them (`decodeLiveOrNew`), so a
/// stolen token could make any applier the sole owner of `spec.taints` — its
/// next apply deletes every taint. Both tokens may leave only what the API
/// server's field manager records for their own writes.
#[tokio::test]
async fn a_stolen_token_cannot_forge_field_ownership() {
    let c = Cluster::start().await.unwrap();
    let a = node(&c, "conf-owners").await;
    let records = records_ownership(&c, &a).await;
    let before = recorded_ownership(&c, &a).await;
    let agent = c.agent_client(&a).await.unwrap();
    let webhook = c.webhook_client().await.unwrap();
    let forged = json!({"manager": "x", "operation": "Apply", "apiVersion": "v1",
                        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:taints": {}}}});
    let replace =
        |v: Value| json!([{"op": "replace", "path": "/metadata/managedFields", "value": v}]);
    let mut beside = before.clone();
    beside.push(forged.clone());
    for (who, client, policy) in [
        ("agent", &agent, AGENT_POLICY),
        ("webhook", &webhook, WEBHOOK_POLICY),
    ] {
        let tries = [
            // The reported attack: x alone owns spec.taints.
            ("x alone owns spec.taints", replace(json!([forged]))),
            // x's apply entry beside the recorded ones: still x's to prune.
            ("x owns spec.taints too", replace(json!(beside))),
            // An empty list resets ownership: nobody holds anything.
            ("ownership reset", replace(json!([]))),
        ];
        for (what, ops) in tries {
            assert_refused(
                &format!("{who}: {what}"),
                json_patch(client, &a, ops).await,
                &[
                    policy,
                    "may not rewrite metadata.managedFields",
                    &format!("node '{a}'"),
                ],
            );
        }
    }
    // Inside a write the agent may make (its ready patch): the creator's
    // entry dropped, so an applier's omission could prune its labels.
    let key = ready_boot_id_path();
    let own = update_entry(
        "nodegate-agent",
        "2026-01-01T00:00:01Z",
        json!({"f:metadata": {"f:annotations": {format!("f:{READY_BOOT_ID_ANNOTATION}"): {}}},
               "f:spec": {"f:taints": {}}}),
    );
    assert_refused(
        "agent: ready patch dropping the creator's ownership",
        json_patch(
            &agent,
            &a,
            json!([
                {"op": "test", "path": "/spec/taints/0/key", "value": TAINT_KEY},
                {"op": "remove", "path": "/spec/taints/0"},
                {"op": "add", "path": key, "value": "boot-1"},
                {"op": "replace", "path": "/metadata/managedFields", "value": [own]},
            ]),
        )
        .await,
        &[AGENT_POLICY, "may not rewrite metadata.managedFields"],
    );
    assert_eq!(
        managers(&ownership(&c, &a).await),
        managers(&before),
        "ownership unchanged"
    );
    assert_eq!(
        taints(&c, &a).await,
        [
            format!("{TAINT_KEY}:NoSchedule"),
            "example.com/dedicated:NoSchedule".to_string()
        ],
        "taints unchanged"
    );

    // What the policy stands between: on a real API server the same forgery
    // (here by the unconfined admin) and x's apply of a Node without taints
    // delete every taint. The emulator has no server-side apply semantics,
    // also behind a kubeconfig (real-cluster mode against it).
    if records {
        let admin = c.client(users::ADMIN).await.unwrap();
        json_patch(&admin, &a, replace(json!([forged])))
            .await
            .unwrap();
        Api::<Node>::all(admin)
            .patch(
                &a,
                &PatchParams::apply("x"),
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": a}})),
            )
            .await
            .unwrap();
        assert_eq!(
            taints(&c, &a).await,
            Vec::<String>::new(),
            "x's apply pruned the taints it was made to own"
        );
    }
}

/// The writes nodegate makes still go through while the API server records
/// their field ownership: the ready patch, the webhook's re-taint, the next
/// ready patch (which drops the webhook's entry), beside an applier's entry,
/// and past the 10 update managers at which the API server merges the
/// oldest into `ancient-changes`. On a real cluster the API server writes
/// managedFields itself; the emulator keeps none, so there each write
/// carries what the field manager would record (apimachinery
/// `managedfields/internal`, structured-merge-diff `merge/update.go`).
#[tokio::test]
async fn recorded_field_ownership_lets_the_workloads_write() {
    let c = Cluster::start().await.unwrap();
    let r = Recorded::start(&c, "conf-recorded").await;
    r.ready_patch(0, "add", "boot-1", "2026-01-01T00:00:10Z")
        .await
        .expect("the ready patch");
    r.webhook_retaint().await;
    // The next ready patch: the webhook's entry owned only the taints and
    // is dropped.
    let i = r.index_of_the_gate().await;
    r.ready_patch(i, "replace", "boot-2", "2026-01-01T00:00:30Z")
        .await
        .expect("the second ready patch");
    let labelled = r.nine_more_managers().await;
    r.retaint_at_the_cap(&labelled).await;
    let now = ownership(&c, &r.a).await;
    assert!(
        now.iter().any(|e| e["manager"] == "ancient-changes"),
        "the cap was reached: {:?}",
        managers(&now)
    );
    assert!(
        now.iter()
            .any(|e| e["manager"] == "x" && e["operation"] == "Apply" && e["fieldsV1"] == team()),
        "the applier's entry is intact: {now:?}"
    );
    assert_eq!(
        taints(&c, &r.a).await,
        [
            "example.com/dedicated:NoSchedule".to_string(),
            format!("{TAINT_KEY}:NoSchedule")
        ]
    );
}

/// The fields of an applier's label.
fn team() -> Value {
    json!({"f:metadata": {"f:labels": {"f:example.com/team": {}}}})
}

/// The applier's entry: its apply must survive every write.
fn applier() -> Value {
    json!({"manager": "x", "operation": "Apply", "apiVersion": "v1",
        "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": team()})
}

/// The creator's entry once a write changed the taint list.
fn creator_without_taints() -> Value {
    json!({"manager": "nodegate-e2e", "operation": "Update",
        "apiVersion": "v1", "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:example.com/owner": {}},
                                    "f:labels": {".": {}, "f:kubernetes.io/hostname": {}}}}})
}

/// The agent's entry of the write at `time`: the ready annotation, and the
/// taint list while no later write changed it.
fn agent_entry(time: &str, with_taints: bool) -> Value {
    let ready_key = format!("f:{READY_BOOT_ID_ANNOTATION}");
    let mut fields = json!({"f:metadata": {"f:annotations": {ready_key: {}}}});
    if with_taints {
        fields["f:spec"] = json!({"f:taints": {}});
    }
    update_entry("nodegate-agent", time, fields)
}

fn gate() -> Value {
    json!({"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"})
}

/// Named managers: each write of theirs is an entry of its own, so the
/// webhook's last write adds one past the cap on a real API server too.
fn as_manager(m: &str) -> PatchParams {
    PatchParams {
        field_manager: Some(m.into()),
        ..Default::default()
    }
}

/// The node `a` of [`recorded_field_ownership_lets_the_workloads_write`]
/// and the clients that write it.
struct Recorded<'c> {
    c: &'c Cluster,
    a: String,
    admin: kube::Client,
    agent: kube::Client,
    webhook: kube::Client,
    /// The API server records no ownership (the emulator): each write
    /// carries what it would record.
    emulated: bool,
}

impl<'c> Recorded<'c> {
    /// The node, with its creation's ownership and an applier's label.
    async fn start(c: &'c Cluster, base: &str) -> Recorded<'c> {
        let a = node(c, base).await;
        let admin = c.client(users::ADMIN).await.unwrap();
        let agent = c.agent_client(&a).await.unwrap();
        let webhook = c.webhook_client().await.unwrap();
        let emulated = !records_ownership(c, &a).await;
        recorded_ownership(c, &a).await;
        let r = Recorded {
            c,
            a,
            admin,
            agent,
            webhook,
            emulated,
        };
        r.an_appliers_label().await;
        r
    }

    /// An applier's label (its apply entry must survive every write below).
    async fn an_appliers_label(&self) {
        let a = &self.a;
        if self.emulated {
            patch(
                &self.admin,
                a,
                json!({"metadata": {"labels": {"example.com/team": "a"}}}),
            )
            .await
            .unwrap();
            let mut entries = ownership(self.c, a).await;
            entries.push(applier());
            json_patch(&self.admin, a, set_ownership(&json!(entries)))
                .await
                .unwrap();
        } else {
            Api::<Node>::all(self.admin.clone())
                .patch(
                    a,
                    &PatchParams::apply("x"),
                    &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": a, "labels": {"example.com/team": "a"}}})),
                )
                .await
                .unwrap();
        }
    }

    /// On the emulator, the write's ops plus the ownership the API server
    /// would record for it.
    fn with_ownership(&self, mut ops: Value, entries: Value) -> Value {
        if self.emulated {
            ops.as_array_mut().unwrap().push(
                json!({"op": "replace", "path": "/metadata/managedFields", "value": entries}),
            );
        }
        ops
    }

    /// The agent's ready patch at `time`, removing the gate at index `i` and
    /// recording `boot` (`record`: the JSON-patch op, `add` the first time):
    /// the taint list changed, so the creator loses it and the agent's
    /// entry holds it and the annotation.
    async fn ready_patch(
        &self,
        i: usize,
        record: &str,
        boot: &str,
        time: &str,
    ) -> Result<Node, Box<kube::core::Status>> {
        let ann = ready_boot_id_path();
        json_patch_with(
            &self.agent,
            &self.a,
            self.with_ownership(
                json!([
                    {"op": "test", "path": format!("/spec/taints/{i}/key"), "value": TAINT_KEY},
                    {"op": "remove", "path": format!("/spec/taints/{i}")},
                    {"op": record, "path": ann, "value": boot},
                ]),
                json!([creator_without_taints(), applier(), agent_entry(time, true)]),
            ),
            &as_manager("nodegate-agent"),
        )
        .await
    }

    /// The webhook's re-taint: the agent's entry loses the taints.
    async fn webhook_retaint(&self) {
        json_patch_with(
            &self.webhook,
            &self.a,
            self.with_ownership(
                json!([{"op": "add", "path": "/spec/taints/-", "value": gate()}]),
                json!([
                    creator_without_taints(),
                    applier(),
                    agent_entry("2026-01-01T00:00:10Z", false),
                    update_entry(
                        "nodegate-webhook",
                        "2026-01-01T00:00:20Z",
                        json!({"f:spec": {"f:taints": {}}})
                    )
                ]),
            ),
            &as_manager("nodegate-webhook"),
        )
        .await
        .expect("the webhook's re-taint");
    }

    /// Where the gate is in the stored taint list.
    async fn index_of_the_gate(&self) -> usize {
        let stored = serde_json::to_value(
            Api::<Node>::all(self.admin.clone())
                .get(&self.a)
                .await
                .unwrap(),
        )
        .unwrap();
        stored["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .position(|t| t["key"] == TAINT_KEY)
            .unwrap()
    }

    /// Nine more update managers, each with a label of its own: with the
    /// creator and the agent, 11 update entries, one over the cap. Returns
    /// their entries.
    async fn nine_more_managers(&self) -> Vec<Value> {
        let label = |i: usize| format!("example.com/m{i}");
        let mut labelled = Vec::new();
        for i in 1..=9 {
            let body = json!({"metadata": {"labels": {label(i): "v"}}});
            Api::<Node>::all(self.admin.clone())
                .patch(&self.a, &as_manager(&format!("m{i}")), &Patch::Merge(&body))
                .await
                .unwrap();
            labelled.push(update_entry(
                &format!("m{i}"),
                &format!("2026-01-01T00:01:0{i}Z"),
                json!({"f:metadata": {"f:labels": {format!("f:{}", label(i)): {}}}}),
            ));
        }
        labelled
    }

    /// The webhook's re-taint adds an 11th update entry: the API server
    /// merges the oldest (the agent's, which lost the taints) into the
    /// bucket. A forged merge, without the agent's annotation, is refused.
    async fn retaint_at_the_cap(&self, labelled: &[Value]) {
        let ready_key = format!("f:{READY_BOOT_ID_ANNOTATION}");
        if self.emulated {
            // The emulator's stored state: what the API server keeps at the
            // cap (the creator and m1, the oldest, merged into the bucket).
            let bucket = update_entry(
                "ancient-changes",
                "2026-01-01T00:01:01Z",
                json!({"f:metadata": {"f:annotations": {".": {}, "f:example.com/owner": {}},
                    "f:labels": {".": {}, "f:kubernetes.io/hostname": {}, "f:example.com/m1": {}}}}),
            );
            let mut at_cap = vec![bucket, applier(), agent_entry("2026-01-01T00:00:30Z", true)];
            at_cap.extend(labelled[1..].iter().cloned());
            json_patch(&self.admin, &self.a, set_ownership(&json!(at_cap)))
                .await
                .unwrap();
        }
        let mut merged = vec![
            update_entry(
                "ancient-changes",
                "2026-01-01T00:00:30Z",
                json!({"f:metadata": {"f:annotations": {".": {}, "f:example.com/owner": {}, &ready_key: {}},
                    "f:labels": {".": {}, "f:kubernetes.io/hostname": {}, "f:example.com/m1": {}}}}),
            ),
            applier(),
            update_entry(
                "nodegate-webhook",
                "2026-01-01T00:02:00Z",
                json!({"f:spec": {"f:taints": {}}}),
            ),
        ];
        merged.extend(labelled[1..].iter().cloned());
        let retaint = async |entries: &[Value]| {
            json_patch_with(
                &self.webhook,
                &self.a,
                self.with_ownership(
                    json!([{"op": "add", "path": "/spec/taints/-", "value": gate()}]),
                    json!(entries),
                ),
                &as_manager("nodegate-webhook"),
            )
            .await
        };
        if self.emulated {
            let mut forged = merged.clone();
            forged[0]["fieldsV1"]["f:metadata"]["f:annotations"]
                .as_object_mut()
                .unwrap()
                .remove(&ready_key);
            assert_refused(
                "webhook: a merge that drops the agent's ownership",
                retaint(&forged).await,
                &[WEBHOOK_POLICY, "nodegate-agent (Update)"],
            );
        }
        retaint(&merged)
            .await
            .expect("the webhook's re-taint at the cap");
    }
}
