//! Garbage collection by `ownerReferences`, as kube-controller-manager's garbage
//! collector does it in the background: once an object is gone, every object
//! that named it as an owner (by uid) and has no other owner left is deleted
//! (finalizers respected; its own dependents follow when it goes). A DELETE with
//! `propagationPolicy: Orphan` (or `orphanDependents: true`) removes the owner's
//! references from its dependents instead. `Foreground` is treated as
//! `Background` (the owner does not wait for its dependents).
//!
//! The real collector acts a moment later, from its informers; here the
//! dependents go within the write that removed the owner, found through the
//! store's owner index (never a scan of every object).

use std::sync::Arc;

use serde_json::Value;

use super::delete::{self, DeleteOptions};
use super::meta;
use super::resources::ResourceInfo;
use super::store::{State, owner_uids};

/// Every object naming `owner_uid` as an owner: (resource, namespace, name, object).
fn dependents_of(state: &State, owner_uid: &str) -> Vec<(Arc<ResourceInfo>, String, String, Arc<Value>)> {
    if owner_uid.is_empty() {
        return Vec::new();
    }
    state
        .dependents_of(owner_uid)
        .into_iter()
        .filter_map(|(key, namespace, name, object)| {
            Some((state.registry.by_storage_key(&key)?, namespace, name, object))
        })
        .collect()
}

/// After the object with `owner_uid` is gone: deletes its dependents that have no
/// other owner left.
pub fn collect(state: &mut State, owner_uid: &str) {
    let dependents = dependents_of(state, owner_uid);
    if dependents.is_empty() {
        return;
    }
    let now = meta::now_rfc3339();
    for (info, namespace, name, object) in dependents {
        let other_owner_lives = owner_uids(&object).iter().any(|uid| *uid != owner_uid && state.uid_exists(uid));
        if other_owner_lives || meta::is_deleting(&object) {
            continue;
        }
        // Gone meanwhile (a cascade) or held by finalizers: both fine.
        let _ = delete::delete(state, &info, &namespace, &name, &DeleteOptions::default(), &now);
    }
}

/// A new object all of whose owners are gone already (each of a kind this server
/// serves, none with its uid): deleted, as the collector deletes a dependent whose
/// owners it cannot find (for instance one written by a controller just after its
/// owner was deleted). Owners of kinds nobody serves are left to whoever wrote them.
pub fn collect_if_orphaned(state: &mut State, info: &ResourceInfo, namespace: &str, object: &Value) {
    let Some(owners) = object.pointer("/metadata/ownerReferences").and_then(Value::as_array) else { return };
    if owners.is_empty() {
        return;
    }
    let all_gone = owners.iter().all(|owner| {
        let field = |name: &str| owner.get(name).and_then(Value::as_str).unwrap_or_default();
        let (group, version) = field("apiVersion").rsplit_once('/').unwrap_or(("", field("apiVersion")));
        let served = state.registry.resources_of(group, version).iter().any(|r| r.kind == field("kind"));
        served && !state.uid_exists(field("uid"))
    });
    if all_gone && !meta::is_deleting(object) {
        let now = meta::now_rfc3339();
        let _ = delete::delete(state, info, namespace, meta::name(object), &DeleteOptions::default(), &now);
    }
}

/// `propagationPolicy: Orphan`: the dependents of `owner_uid` lose their reference to it.
pub fn orphan(state: &mut State, owner_uid: &str) {
    let now = meta::now_rfc3339();
    for (info, namespace, _, object) in dependents_of(state, owner_uid) {
        let mut copy = (*object).clone();
        if let Some(owners) = copy.pointer_mut("/metadata/ownerReferences").and_then(Value::as_array_mut) {
            owners.retain(|o| o.get("uid").and_then(Value::as_str) != Some(owner_uid));
            if owners.is_empty()
                && let Some(metadata) = copy.get_mut("metadata").and_then(Value::as_object_mut)
            {
                metadata.remove("ownerReferences");
            }
        }
        super::write::commit(state, &info, &namespace, copy, &now);
    }
}
