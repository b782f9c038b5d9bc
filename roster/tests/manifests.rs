//! The pruning component's RBAC and policies (`manifests/components/pruning`)
//! allow the publisher's ServiceAccount exactly what the code writes: every
//! shard name `--shards` allows (`<name>-<i>`, i below `MAX_SHARDS`) and the
//! Lease, under the shipped roster name, and no other ConfigMap or Lease.
//! When the code's names change, these fail and say what to ship.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use nodegate_emulator::rbac::{Policy, Request};
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use nodegate_roster::shard::{DEFAULT_NAME, LABEL, MAX_SHARDS, name_of};
use serde::Deserialize;
use serde_json::{Value, json};

fn read(path: &str) -> String {
    let p = format!("{}/../manifests/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

fn documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// The `resourceNames` block rbac.yaml must carry for the shards.
fn expected_block() -> String {
    let names: Vec<String> = (0..MAX_SHARDS).map(|i| name_of(DEFAULT_NAME, i)).collect();
    let lines: Vec<String> = names
        .chunks(5)
        .map(|c| format!("      {}", c.join(", ")))
        .collect();
    format!("    resourceNames: [\n{}\n    ]", lines.join(",\n"))
}

/// The shipped RBAC, as the API server's RBAC authorizer reads it, allows
/// the publisher every request it makes for its own names and refuses the
/// same verbs on any other name.
#[test]
fn the_writer_role_names_every_shard_and_the_lease() {
    let policy = Policy::from_documents(&documents(&read("components/pruning/rbac.yaml"))).unwrap();
    let may = |verb: &str, group: &str, resource: &str, name: Option<&str>| {
        policy
            .authorize(&Request {
                user: users::ROSTER,
                verb,
                group,
                resource: resource.into(),
                namespace: "nodegate",
                name,
            })
            .is_ok()
    };
    let shard = |verb: &str, name: &str| may(verb, "", "configmaps", Some(name));
    let lease = |verb: &str, name: &str| may(verb, "coordination.k8s.io", "leases", Some(name));
    let missing: Vec<String> = (0..MAX_SHARDS)
        .map(|i| name_of(DEFAULT_NAME, i))
        .filter(|n| !["get", "update", "delete"].iter().all(|v| shard(v, n)))
        .collect();
    assert!(
        missing.is_empty(),
        "manifests/components/pruning/rbac.yaml does not let the publisher write {} shards \
         (first {:?}); its nodegate-roster-writer rule for get, update and delete must carry:\n{}",
        missing.len(),
        missing.first(),
        expected_block()
    );
    // What the publisher's watch, its creates and its election need.
    for verb in ["list", "watch", "create"] {
        assert!(may(verb, "", "configmaps", None), "configmaps {verb}");
    }
    assert!(may("create", "coordination.k8s.io", "leases", None));
    for verb in ["get", "update"] {
        assert!(lease(verb, DEFAULT_NAME), "lease {verb}");
    }
    // Nothing else by name.
    for name in [
        name_of(DEFAULT_NAME, MAX_SHARDS),
        format!("{DEFAULT_NAME}-01"),
        "other-config".into(),
        "kube-root-ca.crt".into(),
        DEFAULT_NAME.into(),
    ] {
        for verb in ["get", "update", "patch", "delete"] {
            assert!(!shard(verb, &name), "configmap {name}: {verb} allowed");
        }
    }
    assert!(!may("deletecollection", "", "configmaps", None));
    for name in [format!("{DEFAULT_NAME}-0"), "other-lease".into()] {
        for verb in ["get", "update", "patch", "delete"] {
            assert!(!lease(verb, &name), "lease {name}: {verb} allowed");
        }
    }
    for verb in ["patch", "delete"] {
        assert!(!lease(verb, DEFAULT_NAME), "own lease {verb} allowed");
    }
    // The roster's readers (the agents) still read every shard.
    let agent = policy.authorize(&Request {
        user: users::AGENT,
        verb: "list",
        group: "",
        resource: "configmaps".into(),
        namespace: "nodegate",
        name: None,
    });
    assert!(agent.is_ok(), "{agent:?}");
}

/// The shipped confinement policy lets the publisher's token create every
/// shard `--shards` allows and its Lease, and no ConfigMap outside the
/// roster's prefix nor another Lease (RBAC cannot name a create). Each
/// create is a server-side dry run in the emulator, which evaluates the
/// policy as the API server does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_may_create_only_its_shards_and_its_lease() {
    let emu = Emulator::start(EmulatorOptions::default()).await.unwrap();
    emu.apply(&read("components/pruning/policy.yaml")).unwrap();
    emu.apply(&read("base/namespace.yaml")).unwrap();
    let client = emu.client(users::ROSTER).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "nodegate");
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let create = |name: String| {
        let (cms, dry) = (cms.clone(), dry.clone());
        async move {
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {LABEL: DEFAULT_NAME}},
                "data": {"roster.json": "{}"},
            }))
            .unwrap();
            let res = cms.create(&dry, &cm).await;
            (name, res)
        }
    };
    let refused: Vec<String> =
        futures::stream::iter((0..MAX_SHARDS).map(|i| name_of(DEFAULT_NAME, i)))
            .map(create)
            .buffer_unordered(16)
            .filter_map(|(name, res)| async move { res.err().map(|e| format!("{name}: {e}")) })
            .collect()
            .await;
    assert!(
        refused.is_empty(),
        "manifests/components/pruning/policy.yaml (nodegate-roster-confinement) refuses \
         {} shards the publisher writes, first {:?}",
        refused.len(),
        refused.first()
    );
    for name in [
        DEFAULT_NAME.to_string(),
        format!("{DEFAULT_NAME}x-0"),
        "other-config".into(),
        "kube-root-ca.crt".into(),
    ] {
        match create(name.clone()).await.1 {
            Err(kube::Error::Api(e)) => {
                assert_eq!(e.code, 403, "{name}: {}", e.message);
                let want = format!(
                    "nodegate-roster may write only its shards (ConfigMaps {DEFAULT_NAME}-*) \
                     and its Lease {DEFAULT_NAME}, not configmap {name} (CREATE)"
                );
                assert!(e.message.contains(&want), "{name}: {}", e.message);
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    let leases: Api<Lease> = Api::namespaced(client, "nodegate");
    let lease = |name: &str| -> Lease {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    };
    leases.create(&dry, &lease(DEFAULT_NAME)).await.unwrap();
    match leases.create(&dry, &lease("other-lease")).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{}", e.message),
        other => panic!("other-lease: {other:?}"),
    }
}
