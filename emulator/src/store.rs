//! Object storage with one global resourceVersion counter, like etcd's revision,
//! and a bounded event history that watches resume from.
//!
//! Follows `k8s.io/apiserver/pkg/storage/etcd3/store.go` (`Create`,
//! `GuaranteedUpdate`, `Delete`) and `pkg/storage/cacher/watch_cache.go` (the event
//! window, `GetAllEventsSinceThreadUnsafe`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::resources::ResourceDef;
use crate::util;

/// Storage key of a type: (group, plural).
pub type TypeKey = (&'static str, &'static str);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as watches replay it.
#[derive(Debug)]
pub struct StoredEvent {
    pub rv: u64,
    pub key: TypeKey,
    pub namespace: String,
    pub etype: EventType,
    pub object: Arc<Value>,
    /// The object before the change, so a filtered watch can tell an object
    /// that left its selector (DELETED) from one that entered it (ADDED).
    pub prev: Option<Arc<Value>>,
}

/// Why a conditional write failed.
#[derive(Debug, PartialEq)]
pub enum WriteError {
    NotFound,
    AlreadyExists,
    /// The stored object moved on since it was read.
    Conflict,
}

type ObjKey = (TypeKey, String, String);

#[derive(Debug)]
struct Inner {
    rv: u64,
    objects: BTreeMap<ObjKey, Arc<Value>>,
    history: VecDeque<Arc<StoredEvent>>,
    cap: usize,
    /// Events up to and including this revision are gone from the history.
    compacted: u64,
}

#[derive(Debug)]
pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<StoredEvent>>,
}

pub fn rv_of(obj: &Value) -> Option<u64> {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
}

fn new_uid() -> String {
    uuid::Uuid::new_v4().to_string()
}

impl Store {
    pub fn new(history_cap: usize) -> Self {
        let (tx, _) = broadcast::channel(4096);
        Self {
            inner: Mutex::new(Inner {
                rv: 1,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                cap: history_cap.max(1),
                compacted: 0,
            }),
            tx,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-written
        // (every write is a single insert), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    pub fn get(&self, res: &ResourceDef, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.lock()
            .objects
            .get(&(res.key(), ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Every object of a type (in one namespace, or all), ordered by namespace
    /// and name, with the revision the list reflects.
    pub fn list(&self, res: &ResourceDef, ns: Option<&str>) -> (Vec<Arc<Value>>, u64) {
        let g = self.lock();
        let items = g
            .objects
            .iter()
            .filter(|((k, n, _), _)| *k == res.key() && ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| v.clone())
            .collect();
        (items, g.rv)
    }

    fn record(&self, g: &mut Inner, ev: StoredEvent) {
        let ev = Arc::new(ev);
        g.history.push_back(ev.clone());
        while g.history.len() > g.cap {
            if let Some(old) = g.history.pop_front() {
                g.compacted = old.rv;
            }
        }
        // No receiver is fine: nobody watches.
        let _ = self.tx.send(ev);
    }

    /// Stores a new object: uid, creationTimestamp and resourceVersion are set
    /// here. A dry run returns what would be stored, without a resourceVersion.
    pub fn create(
        &self,
        res: &ResourceDef,
        ns: &str,
        mut obj: Value,
        dry_run: bool,
    ) -> Result<Value, WriteError> {
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let mut g = self.lock();
        let key = (res.key(), ns.to_string(), name);
        if g.objects.contains_key(&key) {
            return Err(WriteError::AlreadyExists);
        }
        let meta = &mut obj["metadata"];
        meta["uid"] = json!(new_uid());
        meta["creationTimestamp"] = json!(util::now_rfc3339());
        if let Some(m) = meta.as_object_mut() {
            m.remove("resourceVersion");
        }
        if dry_run {
            return Ok(obj);
        }
        let stored = self.commit(&mut g, res, ns, EventType::Added, obj, None);
        g.objects.insert(key, stored.clone());
        Ok((*stored).clone())
    }

    /// Replaces an object if it is still at `expected_rv`.
    pub fn update(
        &self,
        res: &ResourceDef,
        ns: &str,
        name: &str,
        mut obj: Value,
        expected_rv: u64,
        dry_run: bool,
    ) -> Result<Value, WriteError> {
        let mut g = self.lock();
        let key = (res.key(), ns.to_string(), name.to_string());
        let prev = g.objects.get(&key).cloned().ok_or(WriteError::NotFound)?;
        let current = rv_of(&prev).unwrap_or(0);
        if current != expected_rv {
            return Err(WriteError::Conflict);
        }
        if dry_run {
            obj["metadata"]["resourceVersion"] = json!(current.to_string());
            return Ok(obj);
        }
        if *prev == obj {
            // A no-op write keeps the resourceVersion and emits no event.
            return Ok(obj);
        }
        let stored = self.commit(&mut g, res, ns, EventType::Modified, obj, Some(prev));
        g.objects.insert(key, stored.clone());
        Ok((*stored).clone())
    }

    pub fn delete(
        &self,
        res: &ResourceDef,
        ns: &str,
        name: &str,
        expected_rv: Option<u64>,
        dry_run: bool,
    ) -> Result<Value, WriteError> {
        let mut g = self.lock();
        let key = (res.key(), ns.to_string(), name.to_string());
        let prev = g.objects.get(&key).cloned().ok_or(WriteError::NotFound)?;
        if expected_rv.is_some_and(|e| Some(e) != rv_of(&prev)) {
            return Err(WriteError::Conflict);
        }
        if dry_run {
            return Ok((*prev).clone());
        }
        g.objects.remove(&key);
        let gone = (*prev).clone();
        let stored = self.commit(&mut g, res, ns, EventType::Deleted, gone, Some(prev));
        Ok((*stored).clone())
    }

    /// Stamps the next resourceVersion on `obj` and records its event; the
    /// caller stores (or, for a delete, has removed) the object.
    fn commit(
        &self,
        g: &mut Inner,
        res: &ResourceDef,
        ns: &str,
        etype: EventType,
        mut obj: Value,
        prev: Option<Arc<Value>>,
    ) -> Arc<Value> {
        g.rv += 1;
        let rv = g.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let stored = Arc::new(obj);
        self.record(
            g,
            StoredEvent {
                rv,
                key: res.key(),
                namespace: ns.to_string(),
                etype,
                object: stored.clone(),
                prev,
            },
        );
        stored
    }

    /// Events after `rv` still in the history, plus a receiver for later ones,
    /// taken atomically so nothing falls between them. `Err(oldest)` when
    /// events after `rv` were already dropped (the watch must answer 410).
    #[allow(clippy::type_complexity)]
    pub fn watch_from(
        &self,
        rv: u64,
    ) -> Result<(Vec<Arc<StoredEvent>>, broadcast::Receiver<Arc<StoredEvent>>), u64> {
        let g = self.lock();
        if rv < g.compacted {
            return Err(g.compacted + 1);
        }
        let past = g.history.iter().filter(|e| e.rv > rv).cloned().collect();
        Ok((past, self.tx.subscribe()))
    }

    /// A snapshot of one type plus a receiver for later events, atomically.
    #[allow(clippy::type_complexity)]
    pub fn snapshot_and_subscribe(
        &self,
        res: &ResourceDef,
        ns: Option<&str>,
    ) -> (Vec<Arc<Value>>, u64, broadcast::Receiver<Arc<StoredEvent>>) {
        let g = self.lock();
        let items = g
            .objects
            .iter()
            .filter(|((k, n, _), _)| *k == res.key() && ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| v.clone())
            .collect();
        (items, g.rv, self.tx.subscribe())
    }

    /// Drops the whole event history, so every older resourceVersion expires
    /// (what etcd compaction does; tests use it to provoke a 410).
    pub fn compact(&self) {
        let mut g = self.lock();
        g.history.clear();
        g.compacted = g.rv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::NODES;

    #[test]
    fn resource_versions_and_conflicts() {
        let s = Store::new(10);
        let a = s
            .create(&NODES, "", json!({"metadata": {"name": "a"}}), false)
            .unwrap();
        let rv = rv_of(&a).unwrap();
        assert_eq!(
            s.create(&NODES, "", json!({"metadata": {"name": "a"}}), false),
            Err(WriteError::AlreadyExists)
        );
        let dry = s
            .create(&NODES, "", json!({"metadata": {"name": "b"}}), true)
            .unwrap();
        assert!(rv_of(&dry).is_none());
        assert!(s.get(&NODES, "", "b").is_none());
        let mut changed = a.clone();
        changed["spec"] = json!({"unschedulable": true});
        let b = s
            .update(&NODES, "", "a", changed.clone(), rv, false)
            .unwrap();
        assert!(rv_of(&b).unwrap() > rv);
        assert_eq!(
            s.update(&NODES, "", "a", changed, rv, false),
            Err(WriteError::Conflict)
        );
    }

    #[test]
    fn history_is_bounded_and_expires() {
        let s = Store::new(2);
        for n in ["a", "b", "c"] {
            s.create(&NODES, "", json!({"metadata": {"name": n}}), false)
                .unwrap();
        }
        assert!(s.watch_from(1).is_err());
        let (past, _) = s.watch_from(s.current_rv() - 1).unwrap();
        assert_eq!(past.len(), 1);
        s.compact();
        assert!(s.watch_from(s.current_rv() - 1).is_err());
        assert!(s.watch_from(s.current_rv()).is_ok());
    }
}
