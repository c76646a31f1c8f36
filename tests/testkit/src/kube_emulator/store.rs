//! The emulator's memory: every object as a `serde_json::Value`, one table per
//! resource (keyed by namespace and name, so a list is an ordered range), one
//! global monotonically increasing resourceVersion, and per resource a ring
//! buffer of recent watch events plus a broadcast channel for live watchers.
//! All writes happen under one lock, so the event order is the commit order.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::broadcast;

use super::meta;
use super::resources::Registry;

/// Events kept per resource for watches that resume from a resourceVersion.
pub const HISTORY_PER_RESOURCE: usize = 10_000;
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
    /// The object before the change (modified or deleted): selector transitions
    /// and list snapshots read it.
    pub old: Option<Arc<Value>>,
}

/// An object's JSON, rendered once per write so lists and watches copy bytes.
pub fn to_json(object: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(object).unwrap_or_default())
}

/// (namespace or "" for cluster-scoped, name).
pub type ObjectKey = (String, String);

#[derive(Debug)]
pub struct Table {
    pub objects: BTreeMap<ObjectKey, Arc<Value>>,
    /// The JSON of each object in `objects`.
    json: HashMap<ObjectKey, Bytes>,
    history: VecDeque<Arc<Event>>,
    /// Events with a resourceVersion at or below this one may have been dropped.
    floor: u64,
    sender: broadcast::Sender<Arc<Event>>,
}

impl Table {
    /// A table whose history starts at `floor` (the resourceVersion when it was made,
    /// as a watch cache starts at its first list).
    fn new(floor: u64) -> Table {
        let (sender, _) = broadcast::channel(BROADCAST_CAPACITY);
        Table { objects: BTreeMap::new(), json: HashMap::new(), history: VecDeque::new(), floor, sender }
    }

    fn record(&mut self, event: Event) {
        let event = Arc::new(event);
        if self.history.len() == HISTORY_PER_RESOURCE
            && let Some(dropped) = self.history.pop_front()
        {
            self.floor = dropped.rv;
        }
        self.history.push_back(event.clone());
        // No receiver is not an error: nobody watches.
        let _ = self.sender.send(event);
    }

    /// Events after `since`, or `Err(oldest kept)` when some may be lost.
    pub fn events_after(&self, since: u64) -> Result<Vec<Arc<Event>>, u64> {
        if since < self.floor {
            return Err(self.history.front().map(|e| e.rv).unwrap_or(self.floor));
        }
        let start = self.history.partition_point(|e| e.rv <= since);
        Ok(self.history.range(start..).cloned().collect())
    }

    /// The stored JSON of an object of this table.
    pub fn json_of(&self, key: &ObjectKey) -> Option<&Bytes> {
        self.json.get(key)
    }

    /// How the objects changed since `rv` looked at `rv`: None for those created
    /// later, the earlier version for those modified or deleted later. Err when
    /// the history no longer reaches back to `rv`.
    pub fn changed_since(&self, rv: u64) -> Result<HashMap<ObjectKey, Option<Arc<Value>>>, u64> {
        let events = self.events_after(rv)?;
        let mut earlier = HashMap::new();
        for event in events {
            let object = event.old.as_ref().unwrap_or(&event.object);
            let key = (meta::meta_str(object, "namespace").to_owned(), meta::name(object).to_owned());
            earlier.entry(key).or_insert_with(|| match event.kind {
                EventType::Added => None,
                EventType::Modified | EventType::Deleted => event.old.clone(),
            });
        }
        Ok(earlier)
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.sender.subscribe()
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
    pub registry: Registry,
    /// Objects with `ownerReferences` (storage key, namespace, name), so garbage
    /// collection looks at these only.
    owned: std::collections::BTreeSet<(String, String, String)>,
}

impl Default for State {
    fn default() -> Self {
        State::new()
    }
}

impl State {
    pub fn new() -> State {
        State { rv: 0, tables: HashMap::new(), registry: Registry::new(), owned: Default::default() }
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
        let owned = (storage_key.to_owned(), key.0.clone(), key.1.clone());
        if object.pointer("/metadata/ownerReferences").and_then(Value::as_array).is_some_and(|o| !o.is_empty()) {
            self.owned.insert(owned);
        } else {
            self.owned.remove(&owned);
        }
        let json = to_json(&object);
        let object = Arc::new(object);
        let table = self.table(storage_key);
        table.json.insert(key.clone(), json.clone());
        let old = table.objects.insert(key, object.clone());
        let kind = if old.is_some() { EventType::Modified } else { EventType::Added };
        table.record(Event { rv, kind, object: object.clone(), json, old });
        object
    }

    /// Removes an object; the DELETED event carries it with a new resourceVersion.
    pub fn remove(&mut self, storage_key: &str, namespace: &str, name: &str) -> Option<Arc<Value>> {
        let key = (namespace.to_owned(), name.to_owned());
        let table = self.tables.get_mut(storage_key)?;
        let existing = table.objects.remove(&key)?;
        table.json.remove(&key);
        self.owned.remove(&(storage_key.to_owned(), key.0.clone(), key.1.clone()));
        self.rv += 1;
        let rv = self.rv;
        let mut object = (*existing).clone();
        meta::metadata_mut(&mut object).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let json = to_json(&object);
        let object = Arc::new(object);
        self.table(storage_key).record(Event {
            rv,
            kind: EventType::Deleted,
            object: object.clone(),
            json,
            old: Some(existing),
        });
        Some(object)
    }

    /// The objects that name owners: (storage key, namespace, name, object).
    pub fn owned_objects(&self) -> Vec<(String, String, String, Arc<Value>)> {
        self.owned
            .iter()
            .filter_map(|(key, namespace, name)| {
                let object = self.get(key, namespace, name)?;
                Some((key.clone(), namespace.clone(), name.clone(), object))
            })
            .collect()
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

        for i in 0..HISTORY_PER_RESOURCE {
            state.put("/configmaps", "a", json!({"metadata": {"name": format!("n{i}")}}));
        }
        let table = state.table_ref("/configmaps").expect("table");
        assert!(table.events_after(1).is_err());
        assert_eq!(table.events_after(state.current_rv() - 3).map(|e| e.len()), Ok(3));
    }
}
