//! WATCH: replay from a resourceVersion, bookmarks, the `410 Gone` ERROR
//! event in a 200 stream, and the end of every watch on shutdown.
//!
//! Follows `k8s.io/apiserver/pkg/endpoints/handlers/watch.go` (`serveWatch`,
//! `WatchServer.ServeHTTP`) and `pkg/storage/cacher/cacher.go` (bookmarks,
//! `Watch` from a too old resourceVersion).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::HeaderValue;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use super::scope::*;
use crate::resources::ResourceDef;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{EventType, StoredEvent, rv_of};
use crate::table;
use crate::users;

pub(crate) fn event_line(etype: &str, object: &Value) -> Bytes {
    let mut line =
        serde_json::to_vec(&json!({"type": etype, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

pub(crate) struct WatchFilter {
    pub(crate) key: crate::store::TypeKey,
    pub(crate) ns: Option<String>,
    pub(crate) ls: LabelSelector,
    pub(crate) fs: FieldSelector,
}

impl WatchFilter {
    fn matches(&self, o: &Value) -> bool {
        self.ls.matches_object(o) && self.fs.matches(o)
    }

    /// The event a filtered watcher sees for a stored change, if any.
    fn translate(&self, e: &StoredEvent) -> Option<(&'static str, Arc<Value>)> {
        if e.key != self.key || self.ns.as_ref().is_some_and(|n| *n != e.namespace) {
            return None;
        }
        let now = self.matches(&e.object);
        let before = e.prev.as_ref().is_some_and(|p| self.matches(p));
        let t = match e.etype {
            EventType::Added if now => EventType::Added,
            EventType::Deleted if before || now => EventType::Deleted,
            EventType::Modified if now && before => EventType::Modified,
            EventType::Modified if now => EventType::Added,
            EventType::Modified if before => EventType::Deleted,
            _ => return None,
        };
        Some((t.as_str(), e.object.clone()))
    }
}

/// A watched object as sent: itself, or a one-row Table when kubectl asked
/// for server-side printing (`kubectl get -w`).
pub(crate) fn watch_object(res: &ResourceDef, as_table: bool, o: &Value) -> Value {
    if as_table {
        table::table(res, &[o], rv_of(o).unwrap_or(0), None)
    } else {
        o.clone()
    }
}

pub(crate) fn watch_stream(
    st: &Arc<AppState>,
    t: &Target,
    q: &HashMap<String, String>,
    user: &users::Identity,
    as_table: bool,
) -> Result<Response> {
    let res: &'static ResourceDef = t.res;
    let filter = WatchFilter {
        key: t.res.key(),
        ns: (!t.ns.is_empty()).then(|| t.ns.clone()),
        ls: LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?,
        fs: FieldSelector::parse(
            q.get("fieldSelector").map(String::as_str).unwrap_or(""),
            t.res,
        )?,
    };
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let send_initial = q.get("sendInitialEvents").is_some_and(|v| v == "true");
    let rv_param = q.get("resourceVersion").cloned().unwrap_or_default();
    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    let fanout = st.fanout.clone();
    let key = t.res.key();
    let watcher_user = user.to_string();
    let bookmark_obj = |rv: u64, initial_end: bool| {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        json!({"kind": t.res.kind, "apiVersion": t.res.api_version(), "metadata": meta})
    };
    // Resolve the starting point now, so errors and the initial state are consistent.
    let mut first: Vec<Bytes> = Vec::new();
    let (mut last_rv, live) = if rv_param.is_empty() || rv_param == "0" || send_initial {
        let ns = filter.ns.as_deref();
        let (items, rv, live) = st.store.snapshot_and_subscribe(t.res, ns);
        for o in items.iter().filter(|o| filter.matches(o)) {
            first.push(event_line("ADDED", &watch_object(res, as_table, o)));
        }
        if send_initial && bookmarks {
            first.push(event_line("BOOKMARK", &bookmark_obj(rv, true)));
        }
        (rv, Some(live))
    } else {
        let rv: u64 = rv_param
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv_param:?}")))?;
        match st.store.watch_from(rv) {
            Ok((past, live)) => {
                let mut last = rv;
                for e in past {
                    if let Some((ty, o)) = filter.translate(&e) {
                        first.push(event_line(ty, &watch_object(res, as_table, &o)));
                    }
                    last = last.max(e.rv);
                }
                (last, Some(live))
            }
            Err(oldest) => {
                // What the real server does: HTTP 200, then one ERROR event.
                let status = ApiError::gone(format!("too old resource version: {rv} ({oldest})"))
                    .to_status();
                first.push(event_line("ERROR", &status));
                (rv, None)
            }
        }
    };
    let mut shutdown = st.shutdown.clone();
    let mut kick = st.kick.clone();
    kick.mark_unchanged();
    let interval = st.bookmark_interval;
    let kind = t.res.kind;
    let api_version = t.res.api_version();
    // Counted as handed to the connection, bookmarks as bytes only.
    let count = move |line: &Bytes| {
        fanout.add(
            key,
            &watcher_user,
            // Keys are sorted: `type` is the last one.
            !line.ends_with(b"\"type\":\"BOOKMARK\"}\n"),
            line.len(),
        );
    };
    tokio::spawn(async move {
        for line in first {
            count(&line);
            if tx.send(line).await.is_err() {
                return;
            }
        }
        let Some(mut live) = live else {
            return;
        };
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            tokio::select! {
                ev = live.recv() => match ev {
                    Ok(e) => {
                        if e.rv <= last_rv {
                            continue;
                        }
                        last_rv = e.rv;
                        if let Some((ty, o)) = filter.translate(&e) {
                            let line = event_line(ty, &watch_object(res, as_table, &o));
                            count(&line);
                            if tx.send(line).await.is_err() {
                                return;
                            }
                        }
                    }
                    // A watcher that falls behind is closed; the client resumes from its last RV.
                    Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick(), if bookmarks => {
                    let b = json!({"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": last_rv.to_string()}});
                    let line = event_line("BOOKMARK", &b);
                    count(&line);
                    if tx.send(line).await.is_err() {
                        return;
                    }
                }
                _ = &mut deadline => return,
                _ = shutdown.changed() => return,
                _ = kick.changed() => return,
                _ = tx.closed() => return,
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    Ok(resp)
}
