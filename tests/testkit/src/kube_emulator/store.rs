//! The emulator's memory: every object as a `serde_json::Value`, one table per
//! resource (keyed by namespace and name, so a list is an ordered range), one
//! global monotonically increasing resourceVersion, and per resource a history of
//! recent events plus a broadcast channel for live watchers. All writes happen
//! under one lock, so the event order is the commit order.
//!
//! History is kept by time and by count, in two windows, as the API server keeps
//! it ([`HistoryWindows`]): watches resume from the watch cache's window (75 s, and
//! at least the last 100 events); lists at an old resourceVersion and `continue`
//! tokens are served from etcd's, 5 minutes until compaction. No event keeps the
//! parsed tree of the version it replaced, only its labels (for selectors) and its
//! JSON (shared with that version's own event); an event leaving the watch window
//! keeps only what a list needs (the key and that JSON), so history costs about one
//! JSON document per write in the last 5 minutes, not full objects. Older
//! resourceVersions answer 410 Gone.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Map, Value};
use tokio::sync::broadcast;

use super::meta;
use super::resources::Registry;

/// How long history is kept: two windows, as kube-apiserver 1.20 and etcd keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryWindows {
    /// A watch resumes from any event younger than this (the watch cache: 75 s) …
    pub watch_age: Duration,
    /// … or among this many latest events of its resource (the cache's 100).
    pub watch_events: usize,
    /// Lists at an old resourceVersion and `continue` tokens are served this long
    /// (etcd's compaction: 5 minutes); never less than the watch window.
    pub list_age: Duration,
}

impl Default for HistoryWindows {
    fn default() -> Self {
        HistoryWindows { watch_age: Duration::from_secs(75), watch_events: 100, list_age: Duration::from_secs(300) }
    }
}

/// How often the history was too short: 410 answers since the emulator started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExpiredAnswers {
    /// Watches that could not resume (a kube watcher relists after one).
    pub watches: u64,
    /// `continue` tokens past the list window (the paged list starts over).
    pub lists: u64,
}
/// Live events a slow watcher may fall behind before it replays from history.
const BROADCAST_CAPACITY: usize = 4_096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One committed change.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: EventType,
    pub object: Arc<Value>,
    /// `object` serialized once, shared by every watcher.
    pub json: Bytes,
    /// The labels of the version the change replaced (modified or deleted; None
    /// for a creation): a watch's label selector decides from them whether the
    /// object was in its selection (names and namespaces never change).
    pub old_labels: Option<Map<String, Value>>,
    /// That version's JSON (its own event's `json`, shared): lists at an older
    /// resourceVersion and a watcher the object leaves read it. No event keeps the
    /// replaced version's tree, so a superseded object costs its JSON alone.
    pub old_json: Option<Bytes>,
}

/// One event of the history: whole while in the watch window, then only what a
/// list at an older resourceVersion needs.
#[derive(Debug)]
struct Kept {
    rv: u64,
    at: Instant,
    kind: EventType,
    key: ObjectKey,
    old_json: Option<Bytes>,
    /// None once out of the watch window.
    event: Option<Arc<Event>>,
}

/// An object's JSON, rendered once per write so lists and watches copy bytes.
pub fn to_json(object: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(object).unwrap_or_default())
}

/// (namespace or "" for cluster-scoped, name).
pub type ObjectKey = (String, String);

/// (storage key, namespace, name).
pub type StoredKey = (String, String, String);

/// The uids an object names as owners.
pub fn owner_uids(object: &Value) -> Vec<&str> {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|owners| owners.iter().filter_map(|o| o.get("uid").and_then(Value::as_str)).collect())
        .unwrap_or_default()
}

#[derive(Debug)]
pub struct Table {
    pub objects: BTreeMap<ObjectKey, Arc<Value>>,
    /// The JSON of each object in `objects`.
    json: HashMap<ObjectKey, Bytes>,
    /// How many of `objects` each namespace holds (a list's `remainingItemCount`
    /// without a walk over the rest).
    per_namespace: HashMap<String, usize>,
    /// Label key → value → the objects carrying that label: a label-selected list
    /// walks the objects of its most selective `key=value` pair, not the table.
    by_label: HashMap<String, HashMap<String, BTreeSet<ObjectKey>>>,
    history: VecDeque<Kept>,
    /// Leading entries of `history` out of the watch window (whole no more).
    slim: usize,
    /// A watch may resume from this resourceVersion or later.
    watch_floor: u64,
    /// A list may be served at this resourceVersion or later.
    list_floor: u64,
    sender: broadcast::Sender<Arc<Event>>,
}

impl Table {
    /// A table whose history starts at `floor` (the resourceVersion when it was made,
    /// as a watch cache starts at its first list).
    fn new(floor: u64) -> Table {
        let (sender, _) = broadcast::channel(BROADCAST_CAPACITY);
        Table {
            objects: BTreeMap::new(),
            json: HashMap::new(),
            per_namespace: HashMap::new(),
            by_label: HashMap::new(),
            history: VecDeque::new(),
            slim: 0,
            watch_floor: floor,
            list_floor: floor,
            sender,
        }
    }

    fn record(&mut self, event: Event, key: ObjectKey, windows: &HistoryWindows) {
        let event = Arc::new(event);
        let now = Instant::now();
        self.history.push_back(Kept {
            rv: event.rv,
            at: now,
            kind: event.kind,
            key,
            old_json: event.old_json.clone(),
            event: Some(event.clone()),
        });
        self.expire(now, windows);
        // No receiver is not an error: nobody watches.
        let _ = self.sender.send(event);
    }

    /// Moves events out of the watch window, then drops those out of the list
    /// window (only ever ones already out of the watch window).
    fn expire(&mut self, now: Instant, windows: &HistoryWindows) {
        let keep_whole = self.history.len().saturating_sub(windows.watch_events);
        while self.slim < keep_whole {
            let Some(entry) = self.history.get_mut(self.slim) else { break };
            if now.saturating_duration_since(entry.at) < windows.watch_age {
                break;
            }
            entry.event = None;
            self.watch_floor = entry.rv;
            self.slim += 1;
        }
        let list_age = windows.list_age.max(windows.watch_age);
        while self.slim > 0 {
            let Some(front) = self.history.front() else { break };
            if now.saturating_duration_since(front.at) < list_age {
                break;
            }
            self.list_floor = front.rv;
            self.history.pop_front();
            self.slim -= 1;
        }
    }

    /// Events after `since` (for a watch), or `Err(oldest kept)` when some are out
    /// of the watch window.
    pub fn events_after(&self, since: u64) -> Result<Vec<Arc<Event>>, u64> {
        if since < self.watch_floor {
            let oldest = self.history.get(self.slim).map_or(self.watch_floor, |e| e.rv);
            return Err(oldest);
        }
        let start = self.history.partition_point(|e| e.rv <= since);
        Ok(self.history.range(start..).filter_map(|e| e.event.clone()).collect())
    }

    /// The stored JSON of an object of this table.
    pub fn json_of(&self, key: &ObjectKey) -> Option<&Bytes> {
        self.json.get(key)
    }

    /// How the objects changed since `rv` looked at `rv`: None for those created
    /// later, the earlier version for those modified or deleted later. Err when
    /// the history no longer reaches back to `rv` (out of the list window).
    pub fn changed_since(&self, rv: u64) -> Result<HashMap<ObjectKey, Option<Arc<Value>>>, u64> {
        if rv < self.list_floor {
            return Err(self.history.front().map_or(self.list_floor, |e| e.rv));
        }
        let start = self.history.partition_point(|e| e.rv <= rv);
        let mut earlier = HashMap::new();
        for kept in self.history.range(start..) {
            if earlier.contains_key(&kept.key) {
                continue;
            }
            let before = match kept.kind {
                EventType::Added => None,
                EventType::Modified | EventType::Deleted => {
                    kept.old_json.as_ref().and_then(|json| serde_json::from_slice(json).ok()).map(Arc::new)
                }
            };
            earlier.insert(kept.key.clone(), before);
        }
        Ok(earlier)
    }

    /// Forgets the history up to `rv`: older resourceVersions answer 410 from now on.
    fn compact(&mut self, rv: u64) {
        self.history.clear();
        self.slim = 0;
        self.watch_floor = self.watch_floor.max(rv);
        self.list_floor = self.list_floor.max(rv);
    }

    /// Events kept (whole or not).
    #[cfg(test)]
    pub fn history_len(&self) -> usize {
        self.history.len()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.sender.subscribe()
    }

    /// How many objects one namespace (or all, for `None`) holds now.
    pub fn count(&self, namespace: Option<&str>) -> usize {
        match namespace {
            None => self.objects.len(),
            Some(ns) => self.per_namespace.get(ns).copied().unwrap_or(0),
        }
    }

    /// Indexes `key` under the labels of `new` in place of those of `old`.
    fn reindex_labels(&mut self, key: &ObjectKey, old: Option<&Value>, new: Option<&Value>) {
        if old.is_some() && new.is_some() && old.and_then(meta::labels) == new.and_then(meta::labels) {
            return;
        }
        let pairs = |object: Option<&Value>| -> Vec<(String, String)> {
            object
                .and_then(meta::labels)
                .map(|labels| labels.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect())
                .unwrap_or_default()
        };
        let (before, after) = (pairs(old), pairs(new));
        for (label, value) in before.iter().filter(|pair| !after.contains(pair)) {
            let Some(values) = self.by_label.get_mut(label) else { continue };
            if let Some(keys) = values.get_mut(value) {
                keys.remove(key);
                if keys.is_empty() {
                    values.remove(value);
                }
            }
            if values.is_empty() {
                self.by_label.remove(label);
            }
        }
        for (label, value) in after.into_iter().filter(|pair| !before.contains(pair)) {
            self.by_label.entry(label).or_default().entry(value).or_default().insert(key.clone());
        }
    }

    /// The objects labelled `label=value`, in key order (empty when none is).
    pub fn labelled(&self, label: &str, value: &str) -> Option<&BTreeSet<ObjectKey>> {
        self.by_label.get(label).and_then(|values| values.get(value))
    }

    /// Objects of one namespace (or all, for `None`) in key order, starting after `after`.
    pub fn range<'a>(
        &'a self,
        namespace: Option<&'a str>,
        after: Option<&'a ObjectKey>,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)> + 'a {
        use std::ops::Bound;
        let lower = match after {
            Some(key) => Bound::Excluded(key.clone()),
            None => match namespace {
                Some(ns) => Bound::Included((ns.to_owned(), String::new())),
                None => Bound::Unbounded,
            },
        };
        self.objects
            .range((lower, Bound::Unbounded))
            .take_while(move |((ns, _), _)| namespace.is_none_or(|wanted| wanted == ns))
    }
}

/// Everything behind the emulator's lock.
#[derive(Debug)]
pub struct State {
    rv: u64,
    tables: HashMap<String, Table>,
    /// How long history is kept.
    windows: HistoryWindows,
    pub registry: Registry,
    /// Owner uid → the objects naming it in `ownerReferences` (storage key,
    /// namespace, name): garbage collection finds dependents without a scan.
    dependents: HashMap<String, std::collections::BTreeSet<StoredKey>>,
    /// uid → where the object with it is stored (stale entries are checked on read).
    uids: HashMap<String, StoredKey>,
    /// 410 answers to watches and to `continue` tokens (counted under a shared
    /// borrow: a list holds only that).
    expired_watches: AtomicU64,
    expired_lists: AtomicU64,
    /// When each Event (of either events API) was last written: Events expire that
    /// long after it ([`State::expire_events`]), as the API server's `--event-ttl`.
    events_written: HashMap<StoredKey, Instant>,
}

/// Whether a table holds Events (core or `events.k8s.io`).
fn is_event_table(storage_key: &str) -> bool {
    storage_key == "/events" || storage_key == "events.k8s.io/events"
}

impl Default for State {
    fn default() -> Self {
        State::new()
    }
}

impl State {
    pub fn new() -> State {
        State::with_history(HistoryWindows::default())
    }

    pub fn with_history(windows: HistoryWindows) -> State {
        State {
            rv: 0,
            tables: HashMap::new(),
            windows,
            registry: Registry::new(),
            dependents: HashMap::new(),
            uids: HashMap::new(),
            expired_watches: AtomicU64::new(0),
            expired_lists: AtomicU64::new(0),
            events_written: HashMap::new(),
        }
    }

    /// Deletes the Events last written longer than `ttl` before `now` (each with its
    /// DELETED watch event), as kube-apiserver's `--event-ttl` (1 h by default)
    /// expires them; returns how many went.
    pub fn expire_events(&mut self, now: Instant, ttl: Duration) -> usize {
        let due: Vec<StoredKey> = self
            .events_written
            .iter()
            .filter(|(_, written)| now.saturating_duration_since(**written) >= ttl)
            .map(|(key, _)| key.clone())
            .collect();
        for (storage_key, namespace, name) in &due {
            self.remove(storage_key, namespace, name);
        }
        due.len()
    }

    /// Counts a watch answered 410 (its resourceVersion out of the watch window).
    pub fn count_expired_watch(&self) {
        self.expired_watches.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a `continue` token answered 410 (out of the list window).
    pub fn count_expired_list(&self) {
        self.expired_lists.fetch_add(1, Ordering::Relaxed);
    }

    /// The 410 answers so far.
    pub fn expired_answers(&self) -> ExpiredAnswers {
        ExpiredAnswers {
            watches: self.expired_watches.load(Ordering::Relaxed),
            lists: self.expired_lists.load(Ordering::Relaxed),
        }
    }

    /// Changes how long history is kept (from the next write on).
    #[cfg(test)]
    pub fn set_history(&mut self, windows: HistoryWindows) {
        self.windows = windows;
    }

    /// Forgets every resource's history now, as etcd's compaction at the current
    /// revision does: a watch or list at an older resourceVersion gets 410 Gone.
    pub fn compact(&mut self) {
        let rv = self.rv;
        for table in self.tables.values_mut() {
            table.compact(rv);
        }
    }

    /// Applies the windows to `storage_key`'s history now (a watch about to resume
    /// after a quiet spell sees what the API server would).
    pub fn expire(&mut self, storage_key: &str) {
        let windows = self.windows;
        if let Some(table) = self.tables.get_mut(storage_key) {
            table.expire(Instant::now(), &windows);
        }
    }

    /// The resourceVersion of the last commit.
    pub fn current_rv(&self) -> u64 {
        self.rv
    }

    pub fn table(&mut self, storage_key: &str) -> &mut Table {
        let floor = self.rv;
        self.tables.entry(storage_key.to_owned()).or_insert_with(|| Table::new(floor))
    }

    /// Forgets a table and its history (a deleted CRD); its watchers end.
    pub fn drop_table(&mut self, storage_key: &str) {
        self.tables.remove(storage_key);
    }

    pub fn table_ref(&self, storage_key: &str) -> Option<&Table> {
        self.tables.get(storage_key)
    }

    pub fn get(&self, storage_key: &str, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.tables.get(storage_key)?.objects.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    /// Stores `object` (created or modified) with the next resourceVersion.
    pub fn put(&mut self, storage_key: &str, namespace: &str, mut object: Value) -> Arc<Value> {
        self.rv += 1;
        let rv = self.rv;
        meta::metadata_mut(&mut object).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let key = (namespace.to_owned(), meta::name(&object).to_owned());
        let stored = (storage_key.to_owned(), key.0.clone(), key.1.clone());
        let new_owners: Vec<String> = owner_uids(&object).into_iter().map(str::to_owned).collect();
        let uid = meta::uid(&object).to_owned();
        let json = to_json(&object);
        let object = Arc::new(object);
        let windows = self.windows;
        let table = self.table(storage_key);
        let old_json = table.json.insert(key.clone(), json.clone());
        let old = table.objects.insert(key.clone(), object.clone());
        table.reindex_labels(&key, old.as_deref(), Some(&object));
        if old.is_none() {
            *table.per_namespace.entry(key.0.clone()).or_default() += 1;
        }
        let kind = if old.is_some() { EventType::Modified } else { EventType::Added };
        let old_owners: Vec<String> =
            old.as_deref().map(|o| owner_uids(o).into_iter().map(str::to_owned).collect()).unwrap_or_default();
        let old_labels = old.as_deref().map(|o| meta::labels(o).cloned().unwrap_or_default());
        table.record(Event { rv, kind, object: object.clone(), json, old_labels, old_json }, key, &windows);
        if is_event_table(storage_key) {
            self.events_written.insert(stored.clone(), Instant::now());
        }
        self.unindex_owners(&stored, &old_owners);
        for owner in new_owners {
            self.dependents.entry(owner).or_default().insert(stored.clone());
        }
        if !uid.is_empty() {
            self.uids.insert(uid, stored);
        }
        object
    }

    /// Removes an object; the DELETED event carries it with a new resourceVersion.
    pub fn remove(&mut self, storage_key: &str, namespace: &str, name: &str) -> Option<Arc<Value>> {
        let key = (namespace.to_owned(), name.to_owned());
        let table = self.tables.get_mut(storage_key)?;
        let existing = table.objects.remove(&key)?;
        table.reindex_labels(&key, Some(&existing), None);
        if let Some(count) = table.per_namespace.get_mut(&key.0) {
            *count -= 1;
            if *count == 0 {
                table.per_namespace.remove(&key.0);
            }
        }
        let old_json = table.json.remove(&key);
        let stored = (storage_key.to_owned(), key.0.clone(), key.1.clone());
        self.events_written.remove(&stored);
        let owners: Vec<String> = owner_uids(&existing).into_iter().map(str::to_owned).collect();
        self.unindex_owners(&stored, &owners);
        self.uids.remove(meta::uid(&existing));
        self.rv += 1;
        let rv = self.rv;
        let mut object = (*existing).clone();
        meta::metadata_mut(&mut object).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let json = to_json(&object);
        let object = Arc::new(object);
        let windows = self.windows;
        let old_labels = Some(meta::labels(&existing).cloned().unwrap_or_default());
        let event = Event { rv, kind: EventType::Deleted, object: object.clone(), json, old_labels, old_json };
        self.table(storage_key).record(event, key, &windows);
        Some(object)
    }

    fn unindex_owners(&mut self, stored: &StoredKey, owners: &[String]) {
        for owner in owners {
            if let Some(set) = self.dependents.get_mut(owner) {
                set.remove(stored);
                if set.is_empty() {
                    self.dependents.remove(owner);
                }
            }
        }
    }

    /// The objects naming `owner_uid` as an owner: (storage key, namespace, name, object).
    pub fn dependents_of(&self, owner_uid: &str) -> Vec<(String, String, String, Arc<Value>)> {
        let Some(keys) = self.dependents.get(owner_uid) else { return Vec::new() };
        keys.iter()
            .filter_map(|(key, namespace, name)| {
                let object = self.get(key, namespace, name)?;
                Some((key.clone(), namespace.clone(), name.clone(), object))
            })
            .collect()
    }

    /// Whether an object with this uid is stored.
    pub fn uid_exists(&self, uid: &str) -> bool {
        self.uids
            .get(uid)
            .and_then(|(key, namespace, name)| self.get(key, namespace, name))
            .is_some_and(|object| meta::uid(&object) == uid)
    }

    /// Names of all objects of a table in one namespace (or all namespaces).
    pub fn keys(&self, storage_key: &str, namespace: Option<&str>) -> Vec<ObjectKey> {
        match self.tables.get(storage_key) {
            Some(table) => table.range(namespace, None).map(|(k, _)| k.clone()).collect(),
            None => Vec::new(),
        }
    }

    /// Values of a table in one namespace (or all), for small tables (RBAC).
    pub fn values(&self, storage_key: &str, namespace: Option<&str>) -> Vec<Value> {
        match self.tables.get(storage_key) {
            Some(table) => table.range(namespace, None).map(|(_, v)| (**v).clone()).collect(),
            None => Vec::new(),
        }
    }

    /// Whether any object remains in `namespace`, in any namespaced table.
    pub fn namespace_has_objects(&self, namespace: &str) -> bool {
        self.tables.values().any(|table| table.range(Some(namespace), None).next().is_some())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn ranges_stay_in_their_namespace_and_history_expires() {
        let mut state = State::new();
        for (ns, name) in [("a", "x"), ("b", "y"), ("b", "z"), ("c", "w")] {
            state.put("/configmaps", ns, json!({"metadata": {"name": name, "namespace": ns}}));
        }
        let table = state.table_ref("/configmaps").expect("table");
        let names: Vec<&str> = table.range(Some("b"), None).map(|((_, n), _)| n.as_str()).collect();
        assert_eq!(names, ["y", "z"]);
        assert_eq!(table.range(None, None).count(), 4);
        assert_eq!(table.events_after(2).map(|e| e.len()), Ok(2));

        // Young events stay, however many there are.
        for i in 0..300 {
            state.put("/configmaps", "a", json!({"metadata": {"name": format!("n{}", i % 7)}}));
        }
        let table = state.table_ref("/configmaps").expect("table");
        assert_eq!(table.events_after(1).map(|e| e.len()), Ok(303));
        assert!(table.changed_since(1).is_ok());
    }

    #[test]
    fn the_watch_window_is_shorter_than_the_list_window() {
        // No time: the watch keeps the last 3 events whole, lists keep the rest.
        let windows =
            HistoryWindows { watch_age: Duration::ZERO, watch_events: 3, list_age: Duration::from_secs(3600) };
        let mut state = State::with_history(windows);
        state.put("/configmaps", "a", json!({"metadata": {"name": "x", "data": 1}}));
        let first = state.current_rv();
        for i in 0..10 {
            state.put("/configmaps", "a", json!({"metadata": {"name": format!("n{i}")}}));
        }
        state.put("/configmaps", "a", json!({"metadata": {"name": "x", "data": 2}}));
        let table = state.table_ref("/configmaps").expect("table");
        assert!(table.events_after(first).is_err(), "a watch from the first event is out of its window");
        assert_eq!(table.events_after(state.current_rv() - 3).map(|e| e.len()), Ok(3));
        // A list at the first version still sees x as it was then (from the slim history).
        let earlier = table.changed_since(first).expect("in the list window");
        let key = ("a".to_owned(), "x".to_owned());
        assert_eq!(earlier[&key].as_deref().map(|o| o["metadata"]["data"].clone()), Some(json!(1)));
        assert_eq!(earlier[&("a".to_owned(), "n0".to_owned())], None, "created later");

        // Out of the list window too: 410 for both.
        state.set_history(HistoryWindows { list_age: Duration::ZERO, ..windows });
        state.put("/configmaps", "a", json!({"metadata": {"name": "y"}}));
        let table = state.table_ref("/configmaps").expect("table");
        assert!(table.changed_since(first).is_err());
        assert_eq!(table.history_len(), 3, "only the watch window's count is left");
    }

    #[test]
    fn events_expire_a_ttl_after_their_last_write_and_nothing_else_does() {
        let mut state = State::new();
        let event = |name: &str| serde_json::json!({"metadata": {"name": name, "namespace": "ns"}, "reason": "Ready"});
        state.put("events.k8s.io/events", "ns", event("old"));
        state.put("/events", "ns", event("core"));
        state.put("/configmaps", "ns", event("not-an-event"));
        let later = Instant::now() + Duration::from_secs(3600);
        state.put("events.k8s.io/events", "ns", event("fresh"));
        assert_eq!(state.expire_events(Instant::now(), Duration::from_secs(3600)), 0, "none is an hour old yet");
        // An hour after the first two were written, the one written after them is not due.
        let before = state.current_rv();
        assert_eq!(state.expire_events(later, Duration::from_secs(3600)), 2, "old and core");
        assert!(state.get("events.k8s.io/events", "ns", "fresh").is_some(), "written later: not due yet");
        assert!(state.get("events.k8s.io/events", "ns", "old").is_none());
        assert!(state.get("/events", "ns", "core").is_none());
        assert!(state.get("/configmaps", "ns", "not-an-event").is_some(), "other kinds never expire");
        let deleted = state.table_ref("events.k8s.io/events").expect("table").events_after(before).expect("history");
        assert!(deleted.iter().any(|e| e.kind == EventType::Deleted), "watchers see the expiry as a deletion");
        // A rewrite starts its TTL again.
        state.put("events.k8s.io/events", "ns", event("again"));
        state.put("events.k8s.io/events", "ns", event("again"));
        assert_eq!(state.expire_events(Instant::now() + Duration::from_secs(59), Duration::from_secs(60)), 0);
    }
}
