//! Which watch events wake a binding: only those that change what a reconcile
//! reads. Every event still reaches the store; an event that leaves an object's
//! fingerprint as it was (the layer's own status write on a binding, a deployment's
//! conditions or observed generation) wakes nothing, and a reconcile it would have
//! run would have found nothing to do. A deletion and the end of a relist always
//! pass; a relisted object wakes only if it differs from what was last seen, so a
//! watch restart does not reconcile every binding at once (the periodic resync
//! still does, slowly).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use gitops_writer::api::GitOpsDeployment;
use kube::ResourceExt;
use kube::api::PartialObjectMeta;
use kube::runtime::watcher::Event;
use serde::Serialize;

use super::index::Named;
use crate::api::{Application, Environment, Snapshot, SnapshotEnvironmentBinding};

/// The last fingerprint seen of each object of one watch.
pub struct Changes<K> {
    fingerprint: fn(&K) -> u64,
    seen: HashMap<Named, u64>,
    /// A relist under way: what it has listed so far (replaces `seen` when done).
    relist: Option<HashMap<Named, u64>>,
}

impl<K: kube::Resource> Changes<K> {
    pub fn new(fingerprint: fn(&K) -> u64) -> Changes<K> {
        Changes { fingerprint, seen: HashMap::new(), relist: None }
    }

    /// Whether `event` should wake anything; remembers what it shows.
    pub fn wakes(&mut self, event: &Event<K>) -> bool {
        let named = |object: &K| (object.namespace().unwrap_or_default(), object.name_any());
        match event {
            Event::Apply(object) => {
                let fingerprint = (self.fingerprint)(object);
                self.seen.insert(named(object), fingerprint) != Some(fingerprint)
            }
            Event::Delete(object) => {
                self.seen.remove(&named(object));
                true
            }
            Event::Init => {
                self.relist = Some(HashMap::new());
                true
            }
            Event::InitApply(object) => {
                let (name, fingerprint) = (named(object), (self.fingerprint)(object));
                let changed = self.seen.get(&name) != Some(&fingerprint);
                self.relist.get_or_insert_with(HashMap::new).insert(name, fingerprint);
                changed
            }
            Event::InitDone => {
                if let Some(listed) = self.relist.take() {
                    self.seen = listed;
                }
                true
            }
        }
    }
}

fn hash_of(value: &impl Serialize) -> u64 {
    let mut hasher = DefaultHasher::new();
    // Serialising these types cannot fail (string keys, no foreign maps); an
    // error would hash as empty and only cost a missed filter.
    serde_json::to_vec(value).unwrap_or_default().hash(&mut hasher);
    hasher.finish()
}

/// What a binding reconcile reads of the binding: not the status the layer writes
/// (its deployments' entries and conditions), but what the repository generator
/// writes (components, repository conditions).
pub fn binding_inputs(binding: &SnapshotEnvironmentBinding) -> u64 {
    let meta = &binding.metadata;
    let status =
        binding.status.as_ref().map_or((&[][..], &[][..]), |s| (&s.components[..], &s.gitops_repo_conditions[..]));
    hash_of(&(&meta.uid, &meta.labels, &meta.annotations, &meta.deletion_timestamp, &binding.spec, status))
}

/// A deployment as the binding's store keeps it (already trimmed to what a binding
/// reads: names, labels, owners, spec, sync and health).
pub fn deployment_inputs(deployment: &GitOpsDeployment) -> u64 {
    hash_of(deployment)
}

/// An Application, of which a binding reads only that it exists.
pub fn application_inputs(application: &PartialObjectMeta<Application>) -> u64 {
    hash_of(&(&application.metadata.uid, &application.metadata.deletion_timestamp))
}

/// What a binding reads of its Environment: the spec.
pub fn environment_inputs(environment: &Environment) -> u64 {
    hash_of(&(&environment.metadata.uid, &environment.metadata.deletion_timestamp, &environment.spec))
}

/// What a binding reads of its Snapshot: which one it is, and its spec.
pub fn snapshot_inputs(snapshot: &Snapshot) -> u64 {
    hash_of(&(&snapshot.metadata.uid, &snapshot.spec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{BindingStatusGitOpsDeployment, SnapshotEnvironmentBindingSpec, SnapshotEnvironmentBindingStatus};

    fn binding(name: &str) -> SnapshotEnvironmentBinding {
        let mut binding = SnapshotEnvironmentBinding::new(
            name,
            SnapshotEnvironmentBindingSpec {
                application: "app".into(),
                environment: "env".into(),
                snapshot: "s1".into(),
                ..Default::default()
            },
        );
        binding.metadata.namespace = Some("ns".into());
        binding
    }

    #[test]
    fn the_layers_own_status_wakes_nothing_the_generators_does() {
        let mut changes = Changes::new(binding_inputs);
        let first = binding("b");
        assert!(changes.wakes(&Event::Apply(first.clone())), "new");
        assert!(!changes.wakes(&Event::Apply(first.clone())), "unchanged");
        let mut own = first.clone();
        own.metadata.resource_version = Some("9".into());
        own.status = Some(SnapshotEnvironmentBindingStatus {
            gitops_deployments: vec![BindingStatusGitOpsDeployment::default()],
            ..Default::default()
        });
        assert!(!changes.wakes(&Event::Apply(own.clone())), "the layer's status write");
        let mut generated = own.clone();
        generated.status.get_or_insert_default().components.push(Default::default());
        assert!(changes.wakes(&Event::Apply(generated.clone())), "components");
        let mut moved = generated.clone();
        moved.spec.snapshot = "s2".into();
        assert!(changes.wakes(&Event::Apply(moved.clone())), "spec");
        assert!(changes.wakes(&Event::Delete(moved.clone())), "a deletion always");
        assert!(changes.wakes(&Event::Apply(moved)), "made again after its deletion");
    }

    #[test]
    fn a_relist_wakes_only_what_changed_and_forgets_what_it_did_not_list() {
        let mut changes = Changes::new(binding_inputs);
        let (a, b) = (binding("a"), binding("b"));
        changes.wakes(&Event::Apply(a.clone()));
        changes.wakes(&Event::Apply(b.clone()));
        let mut changed = a.clone();
        changed.spec.snapshot = "s2".into();
        assert!(changes.wakes(&Event::Init));
        assert!(changes.wakes(&Event::InitApply(changed.clone())), "changed during the gap");
        assert!(changes.wakes(&Event::InitDone));
        assert!(!changes.wakes(&Event::Apply(changed)), "seen by the relist");
        assert!(changes.wakes(&Event::Apply(b)), "b was not relisted: gone, so new again");
    }
}
