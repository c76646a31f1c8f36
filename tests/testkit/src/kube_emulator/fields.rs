//! The emulator's side of field management: it calls the server-side apply and
//! managedFields bookkeeping of `apply.rs`, and turns apply conflicts into the
//! 409 `Status` kube-apiserver sends (message grouped by manager, one cause per
//! field, "using <apiVersion>" for managers that wrote with Update).

use serde_json::{Value, json};

use std::collections::HashSet;

use super::apply;
use super::errors::ApiError;
use super::fieldpath::display_path;
use super::managed::{DefaultListRules, object_field_set};

pub use apply::ApplyConflict;

/// Server-side apply of `applied` by `manager` onto `live` (None: create).
pub fn server_side_apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    subresource: Option<&str>,
    now: &str,
) -> Result<Value, ApiError> {
    match apply::server_side_apply(live, applied, manager, force, v120(subresource), now) {
        Ok(object) => Ok(object),
        Err(conflict) if upgrades_client_side_apply(live, manager, &conflict) => {
            apply::server_side_apply(live, applied, manager, true, v120(subresource), now)
                .map_err(|conflict| conflict_error(live, &conflict))
        }
        Err(conflict) => Err(conflict_error(live, &conflict)),
    }
}

/// kube-apiserver's lastAppliedManager: `kubectl apply --server-side` (manager
/// `kubectl`) on an object managed by client-side apply is forced when every
/// conflicting field is in the `last-applied-configuration` annotation, so users
/// move from client-side to server-side apply without conflicts.
fn upgrades_client_side_apply(live: Option<&Value>, manager: &str, conflict: &ApplyConflict) -> bool {
    const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
    if manager != "kubectl" {
        return false;
    }
    let Some(text) = live.and_then(|l| l.pointer("/metadata/annotations")).and_then(|a| a.get(LAST_APPLIED)) else {
        return false;
    };
    let Some(last_applied) = text.as_str().and_then(|t| serde_json::from_str::<Value>(t).ok()) else {
        return false;
    };
    let rules = DefaultListRules::for_object(&last_applied);
    let allowed: HashSet<String> =
        object_field_set(&last_applied, &rules).paths().iter().map(|path| display_path(path)).collect();
    conflict.conflicts.iter().all(|(_, field)| allowed.contains(field))
}

/// managedFields bookkeeping for create, update and non-apply patches.
pub fn record_update(old: Option<&Value>, new: &mut Value, manager: &str, subresource: Option<&str>, now: &str) {
    apply::record_update(old, new, manager, v120(subresource), now);
}

/// kube-apiserver v1.20 does not record the subresource in managedFields (v1.22
/// does): a manager writing both the object and its status has one entry.
fn v120(_subresource: Option<&str>) -> Option<&str> {
    None
}

/// The 409 for an apply conflict, formatted as structured-merge-diff does.
pub fn conflict_error(live: Option<&Value>, conflict: &ApplyConflict) -> ApiError {
    let causes: Vec<Value> = conflict
        .causes(live)
        .into_iter()
        .map(|(message, field)| json!({"reason": "FieldManagerConflict", "message": message, "field": field}))
        .collect();
    let mut error = ApiError::new(409, "Conflict", conflict.message(live));
    error.details = Some(json!({ "causes": causes }));
    error
}
