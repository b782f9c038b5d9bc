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
use tokio::sync::{broadcast, mpsc, watch};

use super::scope::*;
use crate::fanout::Fanout;
use crate::resources::ResourceDef;
use crate::selectors::{self, FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{EventType, StoredEvent, TypeKey, rv_of};
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
    fn of(t: &Target, q: &HashMap<String, String>) -> Result<Self> {
        let (ls, fs) = selectors::of_query(q, t.res)?;
        Ok(Self {
            key: t.res.key(),
            ns: (!t.ns.is_empty()).then(|| t.ns.clone()),
            ls,
            fs,
        })
    }

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
    let filter = WatchFilter::of(t, q)?;
    let query = WatchQuery::of(q);
    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    let counter = Counter {
        fanout: st.fanout.clone(),
        key: t.res.key(),
        user: user.to_string(),
    };
    // Resolve the starting point now, so errors and the initial state are consistent.
    let start = starting_point(st, t.res, &filter, &query, as_table)?;
    let shutdown = st.shutdown.clone();
    let mut kick = st.kick.clone();
    kick.mark_unchanged();
    let feed = Feed {
        res: t.res,
        as_table,
        filter,
        bookmarks: query.bookmarks,
        timeout: query.timeout,
        interval: st.bookmark_interval,
        shutdown,
        kick,
        counter,
        tx,
    };
    tokio::spawn(feed.run(start));
    Ok(stream_response(rx))
}

/// What a watch asks for besides its selectors.
struct WatchQuery {
    bookmarks: bool,
    timeout: Duration,
    send_initial: bool,
    resource_version: String,
}

impl WatchQuery {
    fn of(q: &HashMap<String, String>) -> Self {
        Self {
            bookmarks: q.get("allowWatchBookmarks").is_some_and(|v| v == "true"),
            timeout: q
                .get("timeoutSeconds")
                .and_then(|s| s.parse::<u64>().ok())
                .map(Duration::from_secs)
                .unwrap_or(Duration::from_secs(1800)),
            send_initial: q.get("sendInitialEvents").is_some_and(|v| v == "true"),
            resource_version: q.get("resourceVersion").cloned().unwrap_or_default(),
        }
    }

    /// Whether the watch starts from the stored state rather than replaying
    /// the events after a resourceVersion.
    fn starts_from_stored_state(&self) -> bool {
        self.resource_version.is_empty() || self.resource_version == "0" || self.send_initial
    }
}

/// A BOOKMARK's object: the type and a resourceVersion, annotated when it
/// ends the initial events.
fn bookmark_object(res: &ResourceDef, rv: u64, initial_end: bool) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"kind": res.kind, "apiVersion": res.api_version(), "metadata": meta})
}

/// Where a watch starts: the lines sent first, the resourceVersion they
/// reach, and the live events after it (none after a 410).
struct Start {
    first: Vec<Bytes>,
    last_rv: u64,
    live: Option<broadcast::Receiver<Arc<StoredEvent>>>,
}

fn starting_point(
    st: &AppState,
    res: &'static ResourceDef,
    filter: &WatchFilter,
    query: &WatchQuery,
    as_table: bool,
) -> Result<Start> {
    if query.starts_from_stored_state() {
        return Ok(start_from_stored_state(st, res, filter, query, as_table));
    }
    let rv_param = &query.resource_version;
    let rv: u64 = rv_param
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv_param:?}")))?;
    Ok(replay_from(st, res, filter, rv, as_table))
}

/// ADDED for every matching object stored now, then (with
/// `sendInitialEvents` and bookmarks) the bookmark ending them.
fn start_from_stored_state(
    st: &AppState,
    res: &'static ResourceDef,
    filter: &WatchFilter,
    query: &WatchQuery,
    as_table: bool,
) -> Start {
    let mut first: Vec<Bytes> = Vec::new();
    let ns = filter.ns.as_deref();
    let (items, rv, live) = st.store.snapshot_and_subscribe(res, ns);
    for o in items.iter().filter(|o| filter.matches(o)) {
        first.push(event_line("ADDED", &watch_object(res, as_table, o)));
    }
    if query.send_initial && query.bookmarks {
        first.push(event_line("BOOKMARK", &bookmark_object(res, rv, true)));
    }
    Start {
        first,
        last_rv: rv,
        live: Some(live),
    }
}

/// The stored events after `rv` as this watch sees them, or the 410 when
/// they are no longer kept.
fn replay_from(
    st: &AppState,
    res: &'static ResourceDef,
    filter: &WatchFilter,
    rv: u64,
    as_table: bool,
) -> Start {
    let mut first: Vec<Bytes> = Vec::new();
    match st.store.watch_from(rv) {
        Ok((past, live)) => {
            let mut last = rv;
            for e in past {
                if let Some((ty, o)) = filter.translate(&e) {
                    first.push(event_line(ty, &watch_object(res, as_table, &o)));
                }
                last = last.max(e.rv);
            }
            Start {
                first,
                last_rv: last,
                live: Some(live),
            }
        }
        Err(oldest) => {
            // What the real server does: HTTP 200, then one ERROR event.
            let status =
                ApiError::gone(format!("too old resource version: {rv} ({oldest})")).to_status();
            first.push(event_line("ERROR", &status));
            Start {
                first,
                last_rv: rv,
                live: None,
            }
        }
    }
}

/// Counted as handed to the connection, bookmarks as bytes only.
struct Counter {
    fanout: Arc<Fanout>,
    key: TypeKey,
    user: String,
}

impl Counter {
    fn count(&self, line: &Bytes) {
        self.fanout.add(
            self.key,
            &self.user,
            // Keys are sorted: `type` is the last one.
            !line.ends_with(b"\"type\":\"BOOKMARK\"}\n"),
            line.len(),
        );
    }
}

/// The task that writes one watch's lines, and what ends it.
struct Feed {
    res: &'static ResourceDef,
    as_table: bool,
    filter: WatchFilter,
    bookmarks: bool,
    timeout: Duration,
    interval: Duration,
    shutdown: watch::Receiver<bool>,
    kick: watch::Receiver<u64>,
    counter: Counter,
    tx: mpsc::Sender<Bytes>,
}

impl Feed {
    /// Counts `line` and sends it: false once the client is gone.
    async fn send(&self, line: Bytes) -> bool {
        self.counter.count(&line);
        self.tx.send(line).await.is_ok()
    }

    /// The starting lines, then live events and bookmarks until the timeout,
    /// shutdown, a kick or the client leaving.
    async fn run(mut self, start: Start) {
        let Start {
            first,
            mut last_rv,
            live,
        } = start;
        for line in first {
            if !self.send(line).await {
                return;
            }
        }
        let Some(mut live) = live else {
            return;
        };
        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(self.interval);
        tick.tick().await;
        loop {
            tokio::select! {
                ev = live.recv() => match ev {
                    Ok(e) => {
                        if e.rv <= last_rv {
                            continue;
                        }
                        last_rv = e.rv;
                        if let Some((ty, o)) = self.filter.translate(&e) {
                            let line = event_line(ty, &watch_object(self.res, self.as_table, &o));
                            if !self.send(line).await {
                                return;
                            }
                        }
                    }
                    // A watcher that falls behind is closed; the client resumes from its last RV.
                    Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick(), if self.bookmarks => {
                    let line = event_line("BOOKMARK", &bookmark_object(self.res, last_rv, false));
                    if !self.send(line).await {
                        return;
                    }
                }
                _ = &mut deadline => return,
                _ = self.shutdown.changed() => return,
                _ = self.kick.changed() => return,
                _ = self.tx.closed() => return,
            }
        }
    }
}

/// The response that streams what the task sends.
fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response {
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
    resp
}
