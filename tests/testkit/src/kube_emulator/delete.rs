//! Deletion: preconditions, finalizers (`deletionTimestamp` +
//! `deletionGracePeriodSeconds: 0`, generation bumped, object kept until the
//! last finalizer goes), and the cascades the controllers of a real cluster run:
//! a terminating namespace deletes its objects and disappears once empty; a
//! deleted CRD deletes its custom resources and stops being served once they
//! are gone. The cascades run inline, under the store lock.

use std::sync::Arc;

use serde_json::{Value, json};

use super::errors::ApiError;
use super::meta;
use super::resources::{CRD_GROUP, ResourceInfo};
use super::selector::Filter;
use super::store::State;
use super::write::commit;

/// `DeleteOptions` as far as the emulator honours them.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    /// `propagationPolicy: Orphan` or `orphanDependents: true` (see `gc`).
    pub orphan: bool,
}

impl DeleteOptions {
    /// From a DELETE body (a `DeleteOptions` object, possibly empty).
    pub fn from_body(body: &[u8]) -> Result<DeleteOptions, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(DeleteOptions::default());
        }
        let value: Value =
            serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?;
        let s = |path: &str| value.pointer(path).and_then(Value::as_str).map(str::to_owned);
        Ok(DeleteOptions {
            precondition_uid: s("/preconditions/uid"),
            precondition_rv: s("/preconditions/resourceVersion"),
            orphan: s("/propagationPolicy").as_deref() == Some("Orphan")
                || value.get("orphanDependents") == Some(&Value::Bool(true)),
        })
    }
}

/// The outcome of a DELETE.
pub enum Deleted {
    /// Kept by finalizers (or a namespace/CRD cleanup in progress): the object now.
    Pending(Arc<Value>),
    /// Removed: the object as it was last stored.
    Gone(Arc<Value>),
}

fn is_namespace(info: &ResourceInfo) -> bool {
    info.group.is_empty() && info.plural == "namespaces"
}

fn is_crd(info: &ResourceInfo) -> bool {
    info.group == CRD_GROUP && info.plural == "customresourcedefinitions"
}

/// The storage key of the custom resources a CRD object defines.
fn crd_storage_key(crd: &Value) -> String {
    let group = crd.pointer("/spec/group").and_then(Value::as_str).unwrap_or("");
    let plural = crd.pointer("/spec/names/plural").and_then(Value::as_str).unwrap_or("");
    format!("{group}/{plural}")
}

/// Whether an object being deleted can go now.
pub fn may_remove(state: &State, info: &ResourceInfo, object: &Value) -> bool {
    if !meta::finalizers(object).is_empty() {
        return false;
    }
    if is_namespace(info) {
        return !state.namespace_has_objects(meta::name(object));
    }
    if is_crd(info) {
        let key = crd_storage_key(object);
        return state.table_ref(&key).is_none_or(|t| t.objects.is_empty());
    }
    true
}

/// Removes an object now and runs the cascades that its removal completes.
pub fn remove_now(state: &mut State, info: &ResourceInfo, namespace: &str, name: &str) -> Option<Arc<Value>> {
    let removed = state.remove(&info.storage_key(), namespace, name)?;
    if is_crd(info) {
        state.registry.set_crd(name, Vec::new());
        state.drop_table(&crd_storage_key(&removed));
    }
    if info.namespaced
        && let Some(ns) = state.get("/namespaces", "", namespace)
        && meta::is_deleting(&ns)
        && let Some(ns_info) = state.registry.lookup("", "v1", "namespaces")
        && may_remove(state, &ns_info, &ns)
    {
        remove_now(state, &ns_info, "", namespace);
    }
    if let Some(custom) = &info.custom
        && let Some(crd) = state.get(&format!("{CRD_GROUP}/customresourcedefinitions"), "", &custom.crd_name)
        && meta::is_deleting(&crd)
        && let Some(crd_info) = state.registry.lookup(CRD_GROUP, "v1", "customresourcedefinitions")
        && may_remove(state, &crd_info, &crd)
    {
        remove_now(state, &crd_info, "", &custom.crd_name);
    }
    super::gc::collect(state, meta::uid(&removed));
    Some(removed)
}

/// Marks an object as being deleted (first time only) and stores it.
fn mark_deleting(state: &mut State, info: &ResourceInfo, namespace: &str, object: &Value, now: &str) -> Arc<Value> {
    let mut marked = object.clone();
    let metadata = meta::metadata_mut(&mut marked);
    metadata.insert("deletionTimestamp".into(), json!(now));
    if !is_namespace(info) {
        metadata.insert("deletionGracePeriodSeconds".into(), json!(0));
    }
    if let Some(generation) = metadata.get("generation").and_then(Value::as_i64) {
        metadata.insert("generation".into(), json!(generation + 1));
    }
    if is_namespace(info) {
        marked["status"] = json!({"phase": "Terminating"});
    }
    if is_crd(info) {
        super::crd::set_status(&mut marked, now);
    }
    commit(state, info, namespace, marked, now)
}

/// DELETE of one object.
pub fn delete(
    state: &mut State,
    info: &ResourceInfo,
    namespace: &str,
    name: &str,
    options: &DeleteOptions,
    now: &str,
) -> Result<Deleted, ApiError> {
    let existing = check(state, info, namespace, name, options)?;
    if options.orphan {
        super::gc::orphan(state, meta::uid(&existing));
    }
    Ok(delete_one(state, info, namespace, &existing, now))
}

/// The object a DELETE may remove: it exists, may be deleted, and matches the
/// preconditions.
pub fn check(
    state: &State,
    info: &ResourceInfo,
    namespace: &str,
    name: &str,
    options: &DeleteOptions,
) -> Result<Arc<Value>, ApiError> {
    let existing = state.get(&info.storage_key(), namespace, name).ok_or_else(|| ApiError::not_found(info, name))?;
    if is_namespace(info) && matches!(name, "default" | "kube-system" | "kube-public") {
        return Err(ApiError::forbidden(
            format!("namespaces \"{name}\" is forbidden: this namespace may not be deleted"),
            json!({"name": name, "kind": "namespaces"}),
        ));
    }
    if let Some(uid) = options.precondition_uid.as_deref().filter(|u| *u != meta::uid(&existing)) {
        return Err(ApiError::conflict_because(
            info,
            name,
            &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {}", meta::uid(&existing)),
        ));
    }
    if let Some(rv) = options.precondition_rv.as_deref().filter(|rv| *rv != meta::resource_version(&existing)) {
        return Err(ApiError::conflict_because(
            info,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                meta::resource_version(&existing)
            ),
        ));
    }
    Ok(existing)
}

fn delete_one(state: &mut State, info: &ResourceInfo, namespace: &str, existing: &Arc<Value>, now: &str) -> Deleted {
    let name = meta::name(existing).to_owned();
    if meta::is_deleting(existing) {
        return Deleted::Pending(existing.clone());
    }
    let cascades = is_namespace(info) || is_crd(info);
    if !cascades && meta::finalizers(existing).is_empty() {
        return match remove_now(state, info, namespace, &name) {
            Some(removed) => Deleted::Gone(removed),
            None => Deleted::Gone(existing.clone()),
        };
    }
    let marked = mark_deleting(state, info, namespace, existing, now);
    if is_namespace(info) {
        for entry in state.registry.storage_entries() {
            if !entry.namespaced {
                continue;
            }
            for (ns, child) in state.keys(&entry.storage_key(), Some(&name)) {
                if let Some(object) = state.get(&entry.storage_key(), &ns, &child) {
                    delete_one(state, &entry, &ns, &object, now);
                }
            }
        }
    }
    if is_crd(info) {
        let key = crd_storage_key(&marked);
        if let Some(entry) = state.registry.by_storage_key(&key) {
            for (ns, child) in state.keys(&key, None) {
                if let Some(object) = state.get(&key, &ns, &child) {
                    delete_one(state, &entry, &ns, &object, now);
                }
            }
        }
    }
    if let Some(current) = state.get(&info.storage_key(), namespace, &name)
        && may_remove(state, info, &current)
    {
        remove_now(state, info, namespace, &name);
    }
    Deleted::Pending(marked)
}

/// DELETE on a collection: every object matching `filter` in `namespace` (or all).
pub fn delete_collection(
    state: &mut State,
    info: &ResourceInfo,
    namespace: Option<&str>,
    filter: &Filter,
    now: &str,
) -> Vec<Arc<Value>> {
    let mut out = Vec::new();
    for (ns, name) in state.keys(&info.storage_key(), namespace) {
        let Some(object) = state.get(&info.storage_key(), &ns, &name) else { continue };
        if !filter.matches(&object) {
            continue;
        }
        match delete_one(state, info, &ns, &object, now) {
            Deleted::Pending(o) | Deleted::Gone(o) => out.push(o),
        }
    }
    out
}
