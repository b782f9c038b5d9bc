//! Watches: the 410 ERROR event in a 200 stream, replay from a
//! resourceVersion with bookmarks, and kube-runtime's watcher (paged lists,
//! re-list after a 410, streaming lists).

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use serde_json::{Value, json};

use crate::support::{NOT_READY, emulator, node, nodes, taint_keys, with_node_a};

#[tokio::test]
async fn expired_resource_version_is_an_error_event_in_a_200_stream() {
    let (emu, api) = with_node_a().await;
    let old = emu.store().current_rv() - 1;
    api.create(&PostParams::default(), &node("b"))
        .await
        .unwrap();
    emu.compact();
    let r = emu
        .raw(
            Some(users::ADMIN),
            "GET",
            &format!("/api/v1/nodes?watch=true&resourceVersion={old}&timeoutSeconds=1"),
            "application/json",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let lines: Vec<Value> = r
        .body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["type"], "ERROR");
    assert_eq!(lines[0]["object"]["code"], 410);
    assert_eq!(lines[0]["object"]["reason"], "Expired");

    // kube's typed watch surfaces it as an Error event (not a transport error).
    let mut s = api
        .watch(&WatchParams::default(), &old.to_string())
        .await
        .unwrap()
        .boxed();
    match s.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!(e.code, 410),
        other => panic!("expected a 410 error event, got {other:?}"),
    }
}

#[tokio::test]
async fn watch_replays_from_resource_version_with_bookmarks() {
    let emu = Emulator::start(EmulatorOptions {
        bookmark_interval: Duration::from_millis(100),
        ..Default::default()
    })
    .await
    .unwrap();
    let api = nodes(&emu, users::ADMIN).await;
    let a = api
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    let rv = a.metadata.resource_version.clone().unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
    )
    .await
    .unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let mut s = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    let mut seen = Vec::new();
    while let Some(ev) = s.try_next().await.unwrap() {
        match ev {
            WatchEvent::Modified(_) => seen.push("MODIFIED"),
            WatchEvent::Deleted(_) => seen.push("DELETED"),
            WatchEvent::Added(_) => seen.push("ADDED"),
            WatchEvent::Bookmark(b) => {
                assert!(!b.metadata.resource_version.is_empty());
                seen.push("BOOKMARK");
                break;
            }
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(seen, vec!["MODIFIED", "DELETED", "BOOKMARK"]);
}

#[tokio::test]
async fn kube_runtime_watcher_works_unchanged() {
    let emu = emulator().await;
    let api = nodes(&emu, users::ADMIN).await;
    for i in 0..3 {
        api.create(&PostParams::default(), &node(&format!("pre{i}")))
            .await
            .unwrap();
    }
    // Paged initial list (limit 2) then a watch.
    let mut stream = watcher(api.clone(), watcher::Config::default().page_size(2))
        .applied_objects()
        .boxed();
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 3 {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.insert(n.metadata.name.unwrap());
    }
    api.create(&PostParams::default(), &node("late"))
        .await
        .unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let n = stream.try_next().await.unwrap().unwrap();
            if n.metadata.name.as_deref() == Some("late") {
                return n;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(taint_keys(&n), vec![NOT_READY]);
}

#[tokio::test]
async fn kube_runtime_watcher_relists_after_a_410() {
    let (emu, api) = with_node_a().await;
    let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
    let mut restarts = 0;
    // Initial list.
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(watcher::Event::InitDone) => {
                restarts += 1;
                break;
            }
            Some(_) => {}
            None => panic!("ended"),
        }
    }
    // Changes the watcher will miss, then history gone and the watch cut:
    // its re-watch from the old resourceVersion gets the 410 ERROR event.
    api.create(&PostParams::default(), &node("b"))
        .await
        .unwrap();
    emu.compact();
    emu.close_watches();
    let mut seen_b = false;
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::InitDone) => restarts += 1,
                Ok(watcher::Event::InitApply(n) | watcher::Event::Apply(n))
                    if n.metadata.name.as_deref() == Some("b") =>
                {
                    seen_b = true
                }
                // kube reports the 410 as an error item, then re-lists.
                Ok(_) | Err(_) => {}
            }
            if seen_b && restarts >= 2 {
                break;
            }
        }
    })
    .await
    .expect("the watcher recovered by re-listing");
    assert!(seen_b);
    assert!(restarts >= 2, "a fresh list after the 410");
}

#[tokio::test]
async fn kube_runtime_streaming_list_watcher() {
    let (_emu, api) = with_node_a().await;
    // sendInitialEvents: ADDED for the state, then the initial-events-end bookmark.
    let mut stream = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut initial = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(watcher::Event::InitApply(n)) => initial.push(n.metadata.name.unwrap()),
            Some(watcher::Event::InitDone) => break,
            Some(_) => {}
            None => panic!("ended"),
        }
    }
    assert_eq!(initial, vec!["a"]);
    api.create(&PostParams::default(), &node("b"))
        .await
        .unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(next, Some(watcher::Event::Apply(n)) if n.metadata.name.as_deref() == Some("b"))
    );
}
