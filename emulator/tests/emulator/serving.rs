//! Serving around storage: authentication, malformed requests answered with a
//! Status while the server keeps serving, and Events as kube-runtime's
//! recorder and core/v1 clients write them.

use kube::api::{Api, ListParams, PostParams};
use nodegate_emulator::users;
use serde_json::json;

use crate::support::{emulator, node, nodes};

#[tokio::test]
async fn unknown_token_is_401() {
    let emu = emulator().await;
    let r = emu
        .raw(None, "GET", "/api/v1/nodes", "application/json", vec![])
        .await
        .unwrap();
    assert_eq!(r.status, 401);
    let r = emu
        .raw(
            Some(users::ADMIN),
            "GET",
            "/apis",
            "application/json",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json().unwrap()["kind"], "APIGroupList");
}

#[tokio::test]
async fn bad_input_gets_a_status_and_the_server_keeps_serving() {
    let emu = emulator().await;
    let post = |path: &'static str, body: &'static [u8]| {
        let emu = &emu;
        async move {
            emu.raw(
                Some(users::ADMIN),
                "POST",
                path,
                "application/json",
                body.to_vec(),
            )
            .await
            .unwrap()
        }
    };
    for (path, body, code) in [
        ("/api/v1/nodes", &b"{not json"[..], 400),
        ("/api/v1/nodes", &b"[1,2]"[..], 400),
        (
            "/api/v1/nodes",
            &br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x"}}"#[..],
            400,
        ),
        (
            "/api/v1/nodes",
            &br#"{"apiVersion":"v1","kind":"Node","metadata":{}}"#[..],
            422,
        ),
        (
            "/api/v1/nodes",
            &br#"{"apiVersion":"v1","kind":"Node","metadata":"weird","spec":"odd"}"#[..],
            422,
        ),
        (
            "/api/v1/namespaces/default/pods",
            &br#"{"metadata":{"name":"p"},"spec":"odd"}"#[..],
            201,
        ),
        (
            "/api/v1/namespaces/default/pods/p/binding",
            &br#"{"target":{"name":"n1"}}"#[..],
            201,
        ),
        ("/api/v1/nopes", &b"{}"[..], 404),
    ] {
        let r = post(path, body).await;
        assert_eq!(r.status, code, "{path} {}", String::from_utf8_lossy(body));
        if code >= 400 {
            assert_eq!(r.json().unwrap()["kind"], "Status");
        }
    }
    let r = emu
        .raw(
            Some(users::ADMIN),
            "PATCH",
            "/api/v1/nodes/x",
            "application/json-patch+json",
            b"[]".to_vec(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    let r = emu
        .raw(
            Some(users::ADMIN),
            "GET",
            "/api/v1/nodes?labelSelector=a%20in%201",
            "",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    let r = emu
        .raw(
            Some(users::ADMIN),
            "GET",
            "/api/v1/nodes?continue=garbage",
            "",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    // Still serving.
    let api = nodes(&emu, users::ADMIN).await;
    api.create(&PostParams::default(), &node("fine"))
        .await
        .unwrap();
}

#[tokio::test]
async fn kube_runtime_event_recorder_and_core_events() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event as NewEvent;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let emu = emulator().await;
    let client = emu.client(users::AGENT).await.unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "nodegate-agent".into(),
            instance: None,
        },
    );
    let node_ref = k8s_openapi::api::core::v1::ObjectReference {
        kind: Some("Node".into()),
        name: Some("n1".into()),
        api_version: Some("v1".into()),
        ..Default::default()
    };
    let ev = Event {
        type_: EventType::Normal,
        reason: "AgentReady".into(),
        note: Some("ready".into()),
        action: "RemoveTaint".into(),
        secondary: None,
    };
    recorder.publish(&ev, &node_ref).await.unwrap();
    recorder.publish(&ev, &node_ref).await.unwrap(); // a series: merge patch of the same event
    let events: Api<NewEvent> = Api::namespaced(client.clone(), "default");
    let list = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].series.as_ref().unwrap().count, 2);
    assert_eq!(list.items[0].reason.as_deref(), Some("AgentReady"));

    let core: Api<CoreEvent> = Api::namespaced(client, "default");
    let e: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "n1.1"},
        "involvedObject": {"kind": "Node", "name": "n1"},
        "reason": "Rebooted", "type": "Warning", "message": "bootID changed"
    }))
    .unwrap();
    core.create(&PostParams::default(), &e).await.unwrap();
    let l = core
        .list(&ListParams::default().fields("involvedObject.name=n1"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);
    assert_eq!(l.items[0].reason.as_deref(), Some("Rebooted"));
}
