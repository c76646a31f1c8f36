//! An index beside a reflector store: the objects of a watch grouped by a key
//! (the binding that owns a deployment; a binding's namespace, application and
//! environment), so a reconcile finds its few objects without walking every object
//! the store holds. It follows the same watch events as the store, including a
//! relist, which replaces it whole once the list is complete.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use kube::ResourceExt;
use kube::runtime::watcher::Event;

/// An object's namespace and name.
pub type Named = (String, String);

#[derive(Default)]
struct Groups {
    members: HashMap<String, BTreeSet<Named>>,
    key_of: HashMap<Named, String>,
}

impl Groups {
    fn remove(&mut self, object: &Named) {
        if let Some(key) = self.key_of.remove(object)
            && let Some(members) = self.members.get_mut(&key)
        {
            members.remove(object);
            if members.is_empty() {
                self.members.remove(&key);
            }
        }
    }

    fn put(&mut self, object: Named, key: Option<String>) {
        self.remove(&object);
        if let Some(key) = key {
            self.members.entry(key.clone()).or_default().insert(object.clone());
            self.key_of.insert(object, key);
        }
    }
}

#[derive(Default)]
struct State {
    live: Groups,
    /// A relist under way: what it has listed so far.
    relist: Option<Groups>,
}

/// Objects grouped by `key`; cheap to clone (one shared state).
pub struct Index<K> {
    key: fn(&K) -> Option<String>,
    state: Arc<Mutex<State>>,
}

impl<K> Clone for Index<K> {
    fn clone(&self) -> Self {
        Index { key: self.key, state: self.state.clone() }
    }
}

impl<K: kube::Resource> Index<K> {
    /// An empty index grouping by `key` (None: the object is in no group).
    pub fn new(key: fn(&K) -> Option<String>) -> Index<K> {
        Index { key, state: Arc::default() }
    }

    /// Follows one watch event.
    pub fn apply(&self, event: &Event<K>) {
        let named = |object: &K| (object.namespace().unwrap_or_default(), object.name_any());
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match event {
            Event::Apply(object) => state.live.put(named(object), (self.key)(object)),
            Event::Delete(object) => state.live.remove(&named(object)),
            Event::Init => state.relist = Some(Groups::default()),
            Event::InitApply(object) => {
                state.relist.get_or_insert_with(Groups::default).put(named(object), (self.key)(object));
            }
            Event::InitDone => {
                if let Some(listed) = state.relist.take() {
                    state.live = listed;
                }
            }
        }
    }

    /// The objects whose key is `key`.
    pub fn members(&self, key: &str) -> Vec<Named> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.live.members.get(key).map(|members| members.iter().cloned().collect()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn map(name: &str, group: &str) -> ConfigMap {
        let mut map = ConfigMap::default();
        map.metadata.name = Some(name.into());
        map.metadata.namespace = Some("ns".into());
        map.metadata.labels = Some([("group".to_owned(), group.to_owned())].into());
        map
    }

    fn names(index: &Index<ConfigMap>, group: &str) -> Vec<String> {
        index.members(group).into_iter().map(|(_, name)| name).collect()
    }

    #[test]
    fn objects_move_between_groups_go_and_a_relist_replaces_all() {
        let index = Index::new(|map: &ConfigMap| map.labels().get("group").cloned());
        index.apply(&Event::Apply(map("a", "one")));
        index.apply(&Event::Apply(map("b", "one")));
        index.apply(&Event::Apply(map("c", "two")));
        assert_eq!(names(&index, "one"), ["a", "b"]);
        index.apply(&Event::Apply(map("b", "two")));
        assert_eq!(names(&index, "one"), ["a"], "b moved");
        assert_eq!(names(&index, "two"), ["b", "c"]);
        index.apply(&Event::Delete(map("c", "two")));
        assert_eq!(names(&index, "two"), ["b"]);

        // A relist: the old groups hold until it is complete, then only what it listed.
        index.apply(&Event::Init);
        index.apply(&Event::InitApply(map("d", "one")));
        assert_eq!(names(&index, "one"), ["a"], "still the old view");
        index.apply(&Event::InitDone);
        assert_eq!(names(&index, "one"), ["d"]);
        assert!(names(&index, "two").is_empty(), "b was not listed again: gone");
    }
}
