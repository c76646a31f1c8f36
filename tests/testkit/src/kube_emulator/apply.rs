//! Server-side apply and field ownership, as kube-apiserver (structured-merge-diff) does
//! them, so that `kube`'s `Patch::Apply`, `kubectl apply --server-side` and every write
//! leave the same `metadata.managedFields` and the same conflicts as a real cluster.
//!
//! Implemented (checked against kube-apiserver v1.20):
//! - `fieldsV1` sets: `f:` fields, `k:{"name":..}` items of keyed lists, `v:` items of
//!   set lists, `"."` for a path that is a member and has children; entries `{manager,
//!   operation Apply|Update, apiVersion, time, fieldsType FieldsV1, fieldsV1,
//!   subresource?}`, sorted as the server sorts them (Apply first, then by time, manager).
//!   A manager is identified by name, operation and subresource (and apiVersion for
//!   Update), so one name can hold an Apply and an Update entry.
//! - Apply by M: the applied configuration is merged into the live object (maps key by
//!   key, keyed lists and sets item by item with live order kept and new items appended,
//!   everything else replaced); M's Apply entry then owns exactly the applied fields
//!   (scalars, nulls, atomic lists, list items; a map is implied by what is under it and
//!   an empty map is not owned, as in v1.20).
//!   Fields M applied before and not now are removed from the object unless another
//!   entry (Apply or Update) or M's new configuration owns them; a map or list emptied by
//!   that removal and owned by no one goes too. Conflicts: every field that the apply
//!   changes or adds and another entry owns; without `force` the apply fails listing
//!   (manager, path) for all of them, with `force` they move to M. A field applied with
//!   the value it already has is shared, never a conflict. Entries left empty vanish. M's
//!   `time` moves only when the object or M's set changes.
//! - Ordinary writes (`record_update`): the fields a write adds or changes become the
//!   writer's (Update entry), leaving every other entry; removed fields leave everyone.
//!   A write that changes nothing touches no entry. A write carrying
//!   `managedFields: []` (or `[{}]`) resets the record; one carrying entries replaces it.
//! - Never tracked: apiVersion, kind, and metadata name, namespace, uid, resourceVersion,
//!   generation, creationTimestamp, selfLink, clusterName, managedFields.
//! - The first apply to an object with no record gives its existing fields to an Update
//!   entry `before-first-apply`, as the server does.
//! - Before every write each recorded set is reconciled as the server does: a map or
//!   keyed list owned as a bare member (an updater that lost its children to others) is
//!   widened to everything under it in the live object — so an updater that lost
//!   `.data.y` to another writer conflicts on it again at the next apply, as on v1.20.
//! - Conflict messages and causes (`ApplyConflict::message`/`causes`) word for word as
//!   v1.20 writes them (`conflict with "m" using v1: .data.x`, grouped per manager).
//!
//! Compared step by step with a v1.20 server (ConfigMaps: creates, merge patches,
//! applies by four managers with and without force, finalizers, labels, annotations;
//! a custom resource with atomic lists; a Deployment's containers and env): the same
//! objects, `managedFields` (times aside) and conflict messages, except where listed
//! below.
//!
//! Simplified (no per-kind schema; see `managed::DefaultListRules`):
//! - Which lists merge by key: `metadata.finalizers` is a set and
//!   `metadata.ownerReferences` is keyed by `uid` on every kind; on built-in kinds lists of
//!   maps with a distinct `name` are keyed by `name` (the real schema keys a few by other
//!   fields, e.g. `volumeMounts` by `mountPath`), RBAC `subjects` is atomic; on custom
//!   resources every other list is atomic, as on the real server for CRDs without
//!   `x-kubernetes-list-type`. Callers with a schema can pass their own `ListRules`.
//! - Maps are never atomic: `x-kubernetes-map-type: atomic` (e.g. a Deployment's
//!   `selector`) and the values under `x-kubernetes-preserve-unknown-fields`, which the
//!   server owns whole (`.spec.free.k`), are owned field by field (`.spec.free.k.deep`).
//!   Every map key is treated as a declared field, so a non-empty object under a
//!   free-form map is not itself a member.
//! - Creating through an Update records `"."` for a new top-level `spec` of a built-in
//!   kind (the real server, starting from a typed zero value, does not).
//! - Where v1.20 leaves an emptied map as `null` after removing a manager's fields (which
//!   then fails CRD validation), the map is removed instead.
//! - Not done: conversion between versions, the cap of ten Update entries
//!   (`ancient-changes`), the `last-applied-configuration` hand-over from client-side
//!   apply, and resetting the other half of objects with a status subresource — callers
//!   pass an applied configuration without `status` for the main resource and with only
//!   `status` (and metadata) for the `status` subresource.
//! - A null in an applied configuration is merged and owned as a value, as on the real
//!   server; rejecting it for a typed field is the caller's validation.

use serde_json::{Value, json};

use super::fieldpath::{
    ManagedEntry, Operation, PathElement, Recorded, display_path, entries_of, read_entries, without_managed_fields,
    write_entries,
};
use super::managed::{DefaultListRules, ListRules, compare, merge, object_field_set, prune, reconcile};

/// The manager that gets an object's existing fields at its first apply.
const BEFORE_FIRST_APPLY: &str = "before-first-apply";

/// An apply refused because other managers own fields it would change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message(None))]
pub struct ApplyConflict {
    /// (manager, field path like `.spec.replicas`), sorted by manager then path.
    pub conflicts: Vec<(String /*manager*/, String /*field path like .spec.replicas*/)>,
}

impl ApplyConflict {
    /// The `Status` message kube-apiserver writes (409, reason `Conflict`), e.g.
    /// `Apply failed with 1 conflict: conflict with "creator" using v1: .data.x`. The live
    /// object tells which managers are updaters (printed with `using <apiVersion>`).
    pub fn message(&self, live: Option<&Value>) -> String {
        let printed = self.printed_managers(live);
        if let ([(_, path)], [manager]) = (self.conflicts.as_slice(), printed.as_slice()) {
            return format!("Apply failed with 1 conflict: conflict with {manager}: {path}");
        }
        let mut lines = Vec::new();
        let mut current: Option<&str> = None;
        for ((_, path), manager) in self.conflicts.iter().zip(&printed) {
            if current != Some(manager.as_str()) {
                lines.push(format!("conflicts with {manager}:"));
                current = Some(manager);
            }
            lines.push(format!("- {path}"));
        }
        format!("Apply failed with {} conflicts: {}", self.conflicts.len(), lines.join("\n"))
    }

    /// The `Status` causes, as (message, field): reason `FieldManagerConflict`, message
    /// `conflict with "m"`, field `.spec.replicas`.
    pub fn causes(&self, live: Option<&Value>) -> Vec<(String, String)> {
        let printed = self.printed_managers(live);
        self.conflicts
            .iter()
            .zip(printed)
            .map(|((_, path), manager)| (format!("conflict with {manager}"), path.clone()))
            .collect()
    }

    fn printed_managers(&self, live: Option<&Value>) -> Vec<String> {
        let live_object = live.map(without_managed_fields).unwrap_or_else(|| json!({}));
        let rules = DefaultListRules::for_object(&live_object);
        let mut entries = live.map(entries_of).unwrap_or_default();
        for entry in &mut entries {
            entry.fields = reconcile(&entry.fields, &live_object, &rules);
        }
        entries.sort_by(|a, b| {
            (a.operation, &a.api_version, &a.subresource).cmp(&(b.operation, &b.api_version, &b.subresource))
        });
        let api_version = live_object.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let mut seen: Vec<&(String, String)> = Vec::new();
        self.conflicts
            .iter()
            .map(|conflict| {
                // The n-th conflict on one path by one name is with the n-th entry of that
                // name owning it (an Apply and an Update entry may both).
                let (manager, path) = conflict;
                let nth = seen.iter().filter(|earlier| **earlier == conflict).count();
                seen.push(conflict);
                let owner = entries
                    .iter()
                    .filter(|entry| entry.manager == *manager)
                    .filter(|entry| entry.fields.paths().iter().any(|p| display_path(p) == *path))
                    .nth(nth);
                match owner {
                    Some(entry) => entry.printed(),
                    None if manager == BEFORE_FIRST_APPLY => format!("{manager:?} using {api_version}"),
                    None => format!("{manager:?}"),
                }
            })
            .collect()
    }
}

/// Server-side apply of `applied` (the full applied configuration object) by `manager` onto `live` (None = create).
/// Returns the new object with metadata.managedFields updated. Fields previously owned by `manager` (its Apply entry) that are absent from `applied` are removed from the object unless another manager also owns them.
pub fn server_side_apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    subresource: Option<&str>,
    now: &str, /*RFC3339*/
) -> Result<Value, ApplyConflict> {
    let rules = DefaultListRules::for_object(applied);
    server_side_apply_with(&rules, live, applied, manager, force, subresource, now)
}

/// [`server_side_apply`] with the caller's list rules (e.g. from a CRD schema).
pub fn server_side_apply_with(
    rules: &dyn ListRules,
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    subresource: Option<&str>,
    now: &str,
) -> Result<Value, ApplyConflict> {
    let applied = without_managed_fields(applied);
    let live_object = live.map(without_managed_fields).unwrap_or_else(|| json!({}));
    let api_version = api_version_of(&applied).or_else(|| api_version_of(&live_object)).unwrap_or_default();

    let mut entries = live.map(entries_of).unwrap_or_default();
    for entry in &mut entries {
        entry.fields = reconcile(&entry.fields, &live_object, rules);
    }
    if live.is_some() && entries.is_empty() {
        let existing = compare(&json!({}), &live_object, rules);
        entries.push(ManagedEntry {
            manager: BEFORE_FIRST_APPLY.to_owned(),
            operation: Operation::Update,
            api_version: api_version_of(&live_object).unwrap_or_else(|| api_version.clone()),
            time: Some(now.to_owned()),
            subresource: None,
            fields: existing.added.union(&existing.modified),
        });
    }

    let mut merged = merge(&mut Vec::new(), Some(&live_object), Some(&applied), rules).unwrap_or_else(|| json!({}));
    let applied_set = object_field_set(&applied, rules);
    let previous = entries
        .iter()
        .position(|entry| entry.is(manager, Operation::Apply, &api_version, subresource))
        .map(|index| entries.remove(index));
    if let Some(previous) = &previous {
        let keep = entries.iter().fold(applied_set.clone(), |keep, entry| keep.union(&entry.fields));
        prune(&mut merged, &mut Vec::new(), &previous.fields, &keep, rules);
    }

    let comparison = compare(&live_object, &merged, rules);
    let changed = comparison.added.union(&comparison.modified);
    let mut conflicts: Vec<(&ManagedEntry, Vec<PathElement>)> = Vec::new();
    for entry in &entries {
        conflicts.extend(entry.fields.intersection(&changed).paths().into_iter().map(|path| (entry, path)));
    }
    if !conflicts.is_empty() && !force {
        conflicts.sort_by(|(a, pa), (b, pb)| {
            (&a.manager, a.operation, &a.api_version, &a.subresource, pa).cmp(&(
                &b.manager,
                b.operation,
                &b.api_version,
                &b.subresource,
                pb,
            ))
        });
        return Err(ApplyConflict {
            conflicts: conflicts
                .into_iter()
                .map(|(entry, path)| (entry.manager.clone(), display_path(&path)))
                .collect(),
        });
    }
    for entry in &mut entries {
        entry.fields = entry.fields.difference(&changed).difference(&comparison.removed);
    }

    let time = match &previous {
        Some(previous) if previous.fields == applied_set && comparison.is_same() => previous.time.clone(),
        _ => Some(now.to_owned()),
    };
    entries.push(ManagedEntry {
        manager: manager.to_owned(),
        operation: Operation::Apply,
        api_version,
        time,
        subresource: subresource.map(str::to_owned),
        fields: applied_set,
    });
    write_entries(&mut merged, entries);
    Ok(merged)
}

/// Bookkeeping for ordinary writes (create/update/patch): fields whose value changed between `old` and `new` (or all fields of `new` on create) become owned by `manager` in an entry with operation "Update", and leave other managers' field sets. Mutates new.metadata.managedFields.
pub fn record_update(old: Option<&Value>, new: &mut Value, manager: &str, subresource: Option<&str>, now: &str) {
    let rules = DefaultListRules::for_object(new);
    record_update_with(&rules, old, new, manager, subresource, now);
}

/// [`record_update`] with the caller's list rules (e.g. from a CRD schema).
pub fn record_update_with(
    rules: &dyn ListRules,
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    subresource: Option<&str>,
    now: &str,
) {
    // As kube-apiserver: entries sent with the write win, `[]` resets, none keeps the old.
    let mut entries = match read_entries(new) {
        Recorded::Reset => Vec::new(),
        Recorded::Entries(entries) if !entries.is_empty() => entries,
        Recorded::Entries(_) | Recorded::Absent => old.map(entries_of).unwrap_or_default(),
    };
    let old_object = old.map(without_managed_fields).unwrap_or_else(|| json!({}));
    let new_object = without_managed_fields(new);
    let api_version = api_version_of(&new_object).unwrap_or_default();
    let comparison = compare(&old_object, &new_object, rules);
    let changed = comparison.added.union(&comparison.modified);
    for entry in &mut entries {
        entry.fields =
            reconcile(&entry.fields, &old_object, rules).difference(&changed).difference(&comparison.removed);
    }
    if !changed.is_empty() {
        match entries.iter_mut().find(|entry| entry.is(manager, Operation::Update, &api_version, subresource)) {
            Some(entry) => {
                entry.fields = entry.fields.union(&changed);
                entry.time = Some(now.to_owned());
            }
            None => entries.push(ManagedEntry {
                manager: manager.to_owned(),
                operation: Operation::Update,
                api_version,
                time: Some(now.to_owned()),
                subresource: subresource.map(str::to_owned),
                fields: changed,
            }),
        }
    }
    write_entries(new, entries);
}

fn api_version_of(object: &Value) -> Option<String> {
    object.get("apiVersion").and_then(Value::as_str).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: &str = "2024-01-01T00:00:00Z";
    const T1: &str = "2024-01-01T00:00:01Z";
    const T2: &str = "2024-01-01T00:00:02Z";

    fn cm(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}, "data": data})
    }

    /// A ConfigMap configuration without data.
    fn bare() -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}})
    }

    fn entry<'a>(object: &'a Value, manager: &str, operation: &str) -> Option<&'a Value> {
        object["metadata"]["managedFields"]
            .as_array()?
            .iter()
            .find(|e| e["manager"] == manager && e["operation"] == operation)
    }

    fn fields<'a>(object: &'a Value, manager: &str, operation: &str) -> &'a Value {
        &entry(object, manager, operation).unwrap_or_else(|| panic!("no {operation} entry for {manager}"))["fieldsV1"]
    }

    /// A ConfigMap created by `creator` with data x=1, y=2 and label a=1.
    fn created() -> Value {
        let mut object = cm(json!({"x": "1", "y": "2"}));
        object["metadata"]["labels"] = json!({"a": "1"});
        record_update(None, &mut object, "creator", None, T0);
        object
    }

    #[test]
    fn create_through_update_owns_everything_with_dots_for_new_maps() {
        let object = created();
        assert_eq!(
            fields(&object, "creator", "Update"),
            &json!({"f:data": {".": {}, "f:x": {}, "f:y": {}}, "f:metadata": {"f:labels": {".": {}, "f:a": {}}}})
        );
        let creator = entry(&object, "creator", "Update").unwrap();
        assert_eq!(
            (&creator["apiVersion"], &creator["time"], &creator["fieldsType"]),
            (&json!("v1"), &json!(T0), &json!("FieldsV1"))
        );
        assert!(creator.get("subresource").is_none());
    }

    #[test]
    fn two_managers_applying_different_fields_coexist() {
        let a = server_side_apply(None, &cm(json!({"x": "1"})), "a", false, None, T0).unwrap();
        let b = server_side_apply(Some(&a), &cm(json!({"y": "2"})), "b", false, None, T1).unwrap();
        assert_eq!(b["data"], json!({"x": "1", "y": "2"}));
        assert_eq!(fields(&b, "a", "Apply"), &json!({"f:data": {"f:x": {}}}));
        assert_eq!(fields(&b, "b", "Apply"), &json!({"f:data": {"f:y": {}}}));
        assert_eq!(entry(&b, "a", "Apply").unwrap()["time"], T0);
        // Name, namespace, apiVersion and kind are never owned.
        assert!(fields(&b, "a", "Apply").get("f:metadata").is_none());
    }

    #[test]
    fn a_conflict_without_force_lists_every_manager_and_path() {
        let live = created();
        let a = server_side_apply(Some(&live), &cm(json!({"x": "1", "z": "3"})), "a", false, None, T1).unwrap();
        // Same value as the creator's: shared, no conflict.
        assert_eq!(fields(&a, "a", "Apply"), &json!({"f:data": {"f:x": {}, "f:z": {}}}));
        assert_eq!(fields(&a, "creator", "Update")["f:data"], json!({".": {}, "f:x": {}, "f:y": {}}));
        let error =
            server_side_apply(Some(&a), &cm(json!({"x": "9", "z": "4", "w": "5"})), "b", false, None, T2).unwrap_err();
        let expected = [("a", ".data.x"), ("a", ".data.z"), ("creator", ".data.x")];
        assert_eq!(error.conflicts, expected.map(|(m, p)| (m.to_owned(), p.to_owned())));
        // The message and causes kube-apiserver v1.20 writes for this very case.
        assert_eq!(
            error.message(Some(&a)),
            "Apply failed with 3 conflicts: conflicts with \"a\":\n- .data.x\n- .data.z\nconflicts with \"creator\" using v1:\n- .data.x"
        );
        assert_eq!(error.causes(Some(&a))[2], ("conflict with \"creator\" using v1".to_owned(), ".data.x".to_owned()));
        let one = server_side_apply(Some(&live), &cm(json!({"y": "7"})), "b", false, None, T2).unwrap_err();
        assert_eq!(
            one.message(Some(&live)),
            "Apply failed with 1 conflict: conflict with \"creator\" using v1: .data.y"
        );
    }

    #[test]
    fn one_name_can_conflict_as_applier_and_as_updater() {
        let live = created();
        let mine = server_side_apply(Some(&live), &cm(json!({"x": "1"})), "creator", false, None, T1).unwrap();
        let error = server_side_apply(Some(&mine), &cm(json!({"x": "5"})), "other", false, None, T2).unwrap_err();
        assert_eq!(
            error.conflicts,
            [("creator", ".data.x"), ("creator", ".data.x")].map(|(m, p)| (m.to_owned(), p.to_owned()))
        );
        // Word for word what kube-apiserver v1.20 answered in the same situation.
        assert_eq!(
            error.message(Some(&mine)),
            "Apply failed with 2 conflicts: conflicts with \"creator\":\n- .data.x\nconflicts with \"creator\" using v1:\n- .data.x"
        );
        // The applier's own Update entry conflicts too.
        let error = server_side_apply(Some(&live), &cm(json!({"x": "2"})), "creator", false, None, T1).unwrap_err();
        assert_eq!(
            error.message(Some(&live)),
            "Apply failed with 1 conflict: conflict with \"creator\" using v1: .data.x"
        );
    }

    #[test]
    fn force_takes_ownership() {
        let live = created();
        let a = server_side_apply(Some(&live), &cm(json!({"x": "1", "z": "3"})), "a", false, None, T1).unwrap();
        let b = server_side_apply(Some(&a), &cm(json!({"x": "9"})), "b", true, None, T2).unwrap();
        assert_eq!(b["data"], json!({"x": "9", "y": "2", "z": "3"}));
        assert_eq!(fields(&b, "b", "Apply"), &json!({"f:data": {"f:x": {}}}));
        assert_eq!(fields(&b, "a", "Apply"), &json!({"f:data": {"f:z": {}}}));
        assert_eq!(fields(&b, "creator", "Update")["f:data"], json!({".": {}, "f:y": {}}));
        // Apply entries first, then updates; each by time.
        let order: Vec<&str> =
            b["metadata"]["managedFields"].as_array().unwrap().iter().map(|e| e["manager"].as_str().unwrap()).collect();
        assert_eq!(order, ["a", "b", "creator"]);
    }

    #[test]
    fn removing_a_field_from_the_applied_config_deletes_it_unless_someone_else_owns_it() {
        let live = created();
        let a = server_side_apply(Some(&live), &cm(json!({"y": "2", "z": "3"})), "a", false, None, T1).unwrap();
        let mut with_label = cm(json!({"y": "2", "z": "3"}));
        with_label["metadata"]["labels"] = json!({"b": "2"});
        let a = server_side_apply(Some(&a), &with_label, "a", false, None, T1).unwrap();
        assert_eq!(a["metadata"]["labels"], json!({"a": "1", "b": "2"}));
        // Drop z (only a's: deleted), y (also the creator's: survives) and label b (deleted).
        let a = server_side_apply(Some(&a), &bare(), "a", false, None, T2).unwrap();
        assert_eq!(a["data"], json!({"x": "1", "y": "2"}));
        assert_eq!(a["metadata"]["labels"], json!({"a": "1"}));
        // a's set is now empty: its entry is gone.
        assert!(entry(&a, "a", "Apply").is_none());
        let b = server_side_apply(None, &cm(json!({"only": "b"})), "b", false, None, T0).unwrap();
        let b = server_side_apply(Some(&b), &bare(), "b", false, None, T1).unwrap();
        // The emptied data map goes too.
        assert!(b.get("data").is_none(), "{b}");
    }

    #[test]
    fn a_field_also_applied_by_another_manager_survives_its_removal() {
        let a = server_side_apply(None, &cm(json!({"x": "1", "y": "2"})), "a", false, None, T0).unwrap();
        let b = server_side_apply(Some(&a), &cm(json!({"x": "1"})), "b", false, None, T1).unwrap();
        let a2 = server_side_apply(Some(&b), &cm(json!({"y": "2"})), "a", false, None, T2).unwrap();
        assert_eq!(a2["data"], json!({"x": "1", "y": "2"}));
        assert_eq!(fields(&a2, "b", "Apply"), &json!({"f:data": {"f:x": {}}}));
        let b2 = server_side_apply(Some(&a2), &bare(), "b", false, None, T2).unwrap();
        assert_eq!(b2["data"], json!({"y": "2"}));
    }

    #[test]
    fn labels_and_annotations_are_owned_key_by_key() {
        let mut one = bare();
        one["metadata"]["labels"] = json!({"team": "a"});
        one["metadata"]["annotations"] = json!({"note": "x"});
        let a = server_side_apply(None, &one, "a", false, None, T0).unwrap();
        let mut two = bare();
        two["metadata"]["labels"] = json!({"tier": "b"});
        let b = server_side_apply(Some(&a), &two, "b", false, None, T1).unwrap();
        assert_eq!(b["metadata"]["labels"], json!({"team": "a", "tier": "b"}));
        assert_eq!(
            fields(&b, "a", "Apply")["f:metadata"],
            json!({"f:annotations": {"f:note": {}}, "f:labels": {"f:team": {}}})
        );
        assert_eq!(fields(&b, "b", "Apply")["f:metadata"], json!({"f:labels": {"f:tier": {}}}));
        two["metadata"]["labels"] = json!({"tier": "b", "team": "other"});
        let error = server_side_apply(Some(&b), &two, "b", false, None, T2).unwrap_err();
        assert_eq!(error.conflicts, [("a".to_owned(), ".metadata.labels.team".to_owned())]);
    }

    #[test]
    fn finalizers_are_a_set() {
        let mut object = bare();
        object["metadata"]["finalizers"] = json!(["x.io/f"]);
        record_update(None, &mut object, "creator", None, T0);
        let mut patched = object.clone();
        patched["metadata"]["finalizers"] = json!(["x.io/f", "y.io/g"]);
        record_update(Some(&object), &mut patched, "patcher", None, T1);
        assert_eq!(
            fields(&patched, "patcher", "Update"),
            &json!({"f:metadata": {"f:finalizers": {"v:\"y.io/g\"": {}}}})
        );
        let mut config = bare();
        config["metadata"]["finalizers"] = json!(["z.io/h", "y.io/g"]);
        let applied = server_side_apply(Some(&patched), &config, "c", false, None, T2).unwrap();
        // Live order kept, new items appended (kube-apiserver v1.20).
        assert_eq!(applied["metadata"]["finalizers"], json!(["x.io/f", "y.io/g", "z.io/h"]));
        assert_eq!(
            fields(&applied, "c", "Apply"),
            &json!({"f:metadata": {"f:finalizers": {"v:\"y.io/g\"": {}, "v:\"z.io/h\"": {}}}})
        );
        config["metadata"]["finalizers"] = json!([]);
        let dropped = server_side_apply(Some(&applied), &config, "c", false, None, T2).unwrap();
        // y.io/g is also the patcher's; z.io/h was only c's.
        assert_eq!(dropped["metadata"]["finalizers"], json!(["x.io/f", "y.io/g"]));
        assert!(entry(&dropped, "c", "Apply").is_none());
    }

    #[test]
    fn record_update_moves_ownership_and_drops_removed_fields() {
        let live = created();
        let a = server_side_apply(Some(&live), &cm(json!({"x": "1"})), "a", false, None, T1).unwrap();
        let mut patched = a.clone();
        patched["data"]["x"] = json!("10");
        patched["metadata"].as_object_mut().unwrap().remove("labels");
        record_update(Some(&a), &mut patched, "patcher", None, T2);
        assert_eq!(fields(&patched, "patcher", "Update"), &json!({"f:data": {"f:x": {}}}));
        // a owned only x: its entry is gone; the creator keeps y and loses the labels.
        assert!(entry(&patched, "a", "Apply").is_none());
        assert_eq!(fields(&patched, "creator", "Update"), &json!({"f:data": {".": {}, "f:y": {}}}));
        // A write that changes nothing leaves the record alone.
        let mut same = patched.clone();
        record_update(Some(&patched), &mut same, "other", None, T2);
        assert_eq!(same, patched);
        // The same manager through a subresource is another entry.
        let mut status = patched.clone();
        status["status"] = json!({"ok": true});
        record_update(Some(&patched), &mut status, "patcher", Some("status"), T2);
        let entries = status["metadata"]["managedFields"].as_array().unwrap();
        let sub = entries.iter().find(|e| e["subresource"] == "status").unwrap();
        assert_eq!(
            (&sub["manager"], &sub["fieldsV1"]),
            (&json!("patcher"), &json!({"f:status": {".": {}, "f:ok": {}}}))
        );
    }

    #[test]
    fn an_updater_left_with_a_bare_map_owns_its_keys_again_as_on_v1_20() {
        let mut live = cm(json!({"y": "2"}));
        record_update(None, &mut live, "creator", None, T0);
        let mut patched = live.clone();
        patched["data"]["y"] = json!("3");
        record_update(Some(&live), &mut patched, "patcher", None, T1);
        // The creator keeps only the map itself...
        assert_eq!(fields(&patched, "creator", "Update"), &json!({"f:data": {}}));
        // ...which the next write reads as owning everything in it (kube-apiserver does).
        let error = server_side_apply(Some(&patched), &cm(json!({"y": "4"})), "c", false, None, T2).unwrap_err();
        assert_eq!(
            error.message(Some(&patched)),
            "Apply failed with 2 conflicts: conflicts with \"creator\" using v1:\n- .data.y\nconflicts with \"patcher\" using v1:\n- .data.y"
        );
        let z = server_side_apply(Some(&patched), &cm(json!({"z": "4"})), "c", false, None, T2).unwrap();
        assert_eq!(fields(&z, "creator", "Update"), &json!({"f:data": {".": {}, "f:y": {}}}));
    }

    #[test]
    fn managed_fields_sent_with_a_write_replace_or_reset_the_record() {
        let live = created();
        let mut reset = live.clone();
        reset["metadata"]["managedFields"] = json!([]);
        reset["data"]["x"] = json!("2");
        record_update(Some(&live), &mut reset, "u", None, T1);
        let entries = reset["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(fields(&reset, "u", "Update"), &json!({"f:data": {"f:x": {}}}));
        // The first apply to an object without a record hands its fields to before-first-apply.
        let mut bare = live.clone();
        bare["metadata"].as_object_mut().unwrap().remove("managedFields");
        let error = server_side_apply(Some(&bare), &cm(json!({"x": "5"})), "a", false, None, T2).unwrap_err();
        assert_eq!(error.conflicts, [("before-first-apply".to_owned(), ".data.x".to_owned())]);
        assert_eq!(
            error.message(Some(&bare)),
            "Apply failed with 1 conflict: conflict with \"before-first-apply\" using v1: .data.x"
        );
    }

    #[test]
    fn keyed_lists_merge_by_name_and_other_lists_are_atomic() {
        let pod = |containers: Value| json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {"spec": {"containers": containers}}}});
        let a = server_side_apply(
            None,
            &pod(json!([{"name": "b", "image": "busybox"}, {"name": "c", "image": "nginx", "args": ["x"]}])),
            "a",
            false,
            None,
            T0,
        )
        .unwrap();
        let z = server_side_apply(
            Some(&a),
            &pod(json!([{"name": "d", "image": "busybox"}, {"name": "c", "image": "nginx"}])),
            "z",
            false,
            None,
            T1,
        )
        .unwrap();
        let names: Vec<&Value> =
            z["spec"]["template"]["spec"]["containers"].as_array().unwrap().iter().map(|c| &c["name"]).collect();
        assert_eq!(names, [&json!("b"), &json!("c"), &json!("d")]);
        assert_eq!(
            fields(&z, "z", "Apply"),
            &json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"c\"}": {".": {}, "f:image": {}, "f:name": {}},
                "k:{\"name\":\"d\"}": {".": {}, "f:image": {}, "f:name": {}}
            }}}}})
        );
        let error =
            server_side_apply(Some(&z), &pod(json!([{"name": "c", "args": ["y"]}])), "q", false, None, T2).unwrap_err();
        assert_eq!(error.conflicts, [("a".to_owned(), ".spec.template.spec.containers[name=\"c\"].args".to_owned())]);
        // a drops container b: it goes; c stays (z owns it too).
        let a2 = server_side_apply(
            Some(&z),
            &pod(json!([{"name": "c", "image": "nginx", "args": ["x"]}])),
            "a",
            false,
            None,
            T2,
        )
        .unwrap();
        let names: Vec<&Value> =
            a2["spec"]["template"]["spec"]["containers"].as_array().unwrap().iter().map(|c| &c["name"]).collect();
        assert_eq!(names, [&json!("c"), &json!("d")]);
        // Custom resources: a list of named maps is atomic, as for a CRD without list types.
        let app = |items: Value| json!({"apiVersion": "x.invalid/v1", "kind": "Probe", "metadata": {"name": "p"}, "spec": {"items": items}});
        let a = server_side_apply(None, &app(json!([{"name": "i", "v": "1"}])), "a", false, None, T0).unwrap();
        assert_eq!(fields(&a, "a", "Apply"), &json!({"f:spec": {"f:items": {}}}));
        let error =
            server_side_apply(Some(&a), &app(json!([{"name": "j", "v": "2"}])), "b", false, None, T1).unwrap_err();
        assert_eq!(error.conflicts, [("a".to_owned(), ".spec.items".to_owned())]);
        let b = server_side_apply(Some(&a), &app(json!([{"name": "j", "v": "2"}])), "b", true, None, T1).unwrap();
        assert_eq!(b["spec"]["items"], json!([{"name": "j", "v": "2"}]));
    }

    #[test]
    fn reapplying_the_same_config_changes_nothing_and_keeps_the_time() {
        let a = server_side_apply(None, &cm(json!({"x": "1"})), "a", false, None, T0).unwrap();
        let again = server_side_apply(Some(&a), &cm(json!({"x": "1"})), "a", false, None, T2).unwrap();
        assert_eq!(again, a);
        // Applying what an updater already set shares it and stamps the new entry.
        let live = created();
        let shared = server_side_apply(Some(&live), &cm(json!({"x": "1"})), "a", false, None, T1).unwrap();
        assert_eq!(shared["data"], live["data"]);
        assert_eq!(entry(&shared, "a", "Apply").unwrap()["time"], T1);
        // Apply through the status subresource is its own entry.
        let status = server_side_apply(
            Some(&a),
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "status": {"s": 1}}),
            "a",
            false,
            Some("status"),
            T1,
        )
        .unwrap();
        let entries = status["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries.len(), 2);
        assert!(
            entries.iter().any(|e| e["subresource"] == "status" && e["fieldsV1"] == json!({"f:status": {"f:s": {}}}))
        );
    }

    #[test]
    fn nulls_are_owned_empty_maps_not_and_managed_fields_in_a_config_are_ignored() {
        let mut config = cm(json!({"x": null}));
        config["spec"] = json!({"empty": {}});
        config["metadata"]["managedFields"] = json!([{"manager": "forged", "operation": "Apply"}]);
        let a = server_side_apply(None, &config, "a", false, None, T0).unwrap();
        assert_eq!(fields(&a, "a", "Apply"), &json!({"f:data": {"f:x": {}}}));
        assert_eq!(a["spec"], json!({"empty": {}}));
        assert!(entry(&a, "forged", "Apply").is_none());
        assert_eq!(a["data"]["x"], Value::Null);
    }
}
