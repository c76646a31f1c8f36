//! The status Argo CD would write for an Application, and the merge patch that
//! gets it there from what is stored.
//!
//! Argo CD's Application has no status subresource: status is written on the main
//! resource, every such write bumps `generation` and comes back to the stand-in as
//! a watch event. So `plan` is a pure function of the stored object that reaches a
//! fixed point: it compares the desired status with the stored one and returns no
//! patch when they agree, keeping timestamps (`lastTransitionTime`,
//! `reconciledAt`) unless the value they date changed. Unit tests apply each patch
//! and re-plan until nothing is left to write.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

use super::application::{AppSpec, str_at};
use super::heads::Heads;
use super::knobs::{FINALIZER, Knobs, SyncKnob};
use super::operation::{self, ERROR, FAILED, OperationInput, SUCCEEDED};
use super::project::{INVALID_SPEC_ERROR, ProjectRules, spec_errors, sync_refusal};

/// Argo CD's annotation asking for a refresh; removed once done.
pub const REFRESH_ANNOTATION: &str = "argocd.argoproj.io/refresh";
/// Argo CD's condition when comparing fails (e.g. the repository is unreadable).
pub const COMPARISON_ERROR: &str = "ComparisonError";
/// Argo CD's condition when the last automated sync attempt failed.
pub const SYNC_ERROR: &str = "SyncError";
/// Argo CD's condition when deleting the Application's resources fails.
pub const DELETION_ERROR: &str = "DeletionError";
/// Argo CD's default `spec.revisionHistoryLimit`.
const DEFAULT_HISTORY_LIMIT: usize = 10;

/// Everything `plan` looks at.
#[derive(Debug)]
pub struct PlanInput<'a> {
    /// The Application as stored (whole JSON object).
    pub object: &'a Value,
    /// Its annotations.
    pub annotations: &'a BTreeMap<String, String>,
    /// Its project's rules; `None` when the project does not exist.
    pub project: Option<&'a ProjectRules>,
    /// The namespace the stand-in serves (`status.controllerNamespace`).
    pub controller_namespace: &'a str,
    pub now: Timestamp,
    /// Why the destination cluster does not answer (see `destination`); `None`: it does.
    pub destination_error: Option<&'a str>,
    /// Why the source cannot be read (see `repository`); `None`: it can.
    pub source_error: Option<&'a str>,
    /// The branch heads tests set (see `heads`); empty: none.
    pub heads: &'a Heads,
    /// Argo CD's reconciliation timeout: `reconciledAt` older than this is
    /// refreshed. Zero: never.
    pub resync: Duration,
}

/// What to write, and facts for the log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// A JSON merge patch for the Application; `None`: nothing to write.
    pub patch: Option<Value>,
    /// When to look again without a watch event; `None`: only on events.
    pub requeue_after: Option<Duration>,
    pub sync_status: String,
    pub health_status: String,
    /// The phase of the operation after this plan, if any.
    pub operation_phase: Option<String>,
    /// Knob annotations that were not understood.
    pub unknown_knobs: Vec<String>,
}

/// RFC 3339 with whole seconds, as Kubernetes serialises `metav1.Time`.
pub fn format_time(now: Timestamp) -> String {
    Timestamp::from_second(now.as_second()).unwrap_or(now).to_string()
}

/// The next write for a live (not deleted) Application.
pub fn plan(input: &PlanInput<'_>) -> Plan {
    let now = format_time(input.now);
    let object = input.object;
    let spec = AppSpec::from_object(object);
    let knobs = Knobs::from_annotations(input.annotations);
    let errors = spec_errors(&spec, input.project);
    let comparison_error = if errors.is_empty() {
        knobs.comparison_error.as_deref().or(input.source_error).or(input.destination_error)
    } else {
        None
    };
    let deployed = deployed_kind(&spec);
    let sync_refusal = input.project.and_then(|rules| sync_refusal(&spec, rules, (deployed.0, deployed.2, deployed.3)));
    let current = object.get("status").filter(|status| status.is_object()).cloned().unwrap_or_else(|| json!({}));

    let requested = object.get("operation").filter(|operation| !operation.is_null());
    let step = operation::step(&OperationInput {
        spec: &spec,
        knobs: &knobs,
        heads: input.heads,
        spec_errors: &errors,
        comparison_error,
        sync_refusal: sync_refusal.as_deref(),
        requested,
        state: current.get("operationState"),
        now: &now,
    });

    let mut desired = current.as_object().cloned().unwrap_or_default();
    desired.insert("controllerNamespace".to_owned(), json!(input.controller_namespace));
    if let Some(state) = &step.state {
        desired.insert("operationState".to_owned(), state.clone());
        if step.succeeded {
            record_history(&mut desired, object, &spec, state, &now);
        }
    }
    let operation_state = desired.get("operationState").cloned().unwrap_or(Value::Null);
    let target = operation::target_revision(&spec, input.heads);
    let tracks_head = input.heads.head(&spec.source.repo_url, &spec.source.target_revision).is_some();

    let mut conditions: Vec<(&str, String)> =
        errors.iter().map(|message| (INVALID_SPEC_ERROR, message.clone())).collect();
    let (sync, health) = if !errors.is_empty() {
        // Argo CD only marks both Unknown and leaves the rest of sync as it was.
        (with_status(current.get("sync"), "Unknown"), transition(current.get("health"), "Unknown", None, &now))
    } else {
        // Argo CD cannot assess the health of what it cannot reach.
        let health = if input.destination_error.is_some() { "Unknown".to_owned() } else { health_status(&knobs) };
        let health_message = health_message(&knobs, &health, &resource_name(object, &spec));
        let health = transition(current.get("health"), &health, health_message.as_deref(), &now);
        let compared_to = json!({"source": spec.source_json, "destination": spec.destination_json});
        if let Some(message) = comparison_error {
            conditions.push((COMPARISON_ERROR, message.to_owned()));
            (json!({"status": "Unknown", "comparedTo": compared_to}), health)
        } else {
            let (status, revision) = sync_status(&spec, &knobs, &operation_state, &target, tracks_head);
            let health_status = str_at(&health, "/status").to_owned();
            desired.insert("resources".to_owned(), json!([resource(object, &spec, status, &health_status)]));
            desired.insert("sourceType".to_owned(), json!("Directory"));
            if spec.automated && last_attempt_failed(&operation_state, &target) {
                let message = format!("Failed last sync attempt to {target}: {}", str_at(&operation_state, "/message"));
                conditions.push((SYNC_ERROR, message));
            }
            (json!({"status": status, "revision": revision, "comparedTo": compared_to}), health)
        }
    };
    desired.insert("sync".to_owned(), sync);
    desired.insert("health".to_owned(), health);
    set_conditions(&mut desired, current.get("conditions"), &conditions, &now);

    let refresh = input.annotations.contains_key(REFRESH_ANNOTATION);
    let stale = reconcile_is_stale(current.get("reconciledAt"), input.now, input.resync);
    let mut desired = Value::Object(desired);
    let mut status_patch = merge_diff(&current, &desired);
    if status_patch.is_some() || refresh || stale {
        desired["reconciledAt"] = json!(now);
        status_patch = merge_diff(&current, &desired);
    }

    let mut patch = Map::new();
    if let Some(status_patch) = status_patch {
        patch.insert("status".to_owned(), status_patch);
    }
    if step.clear_requested {
        patch.insert("operation".to_owned(), Value::Null);
    }
    if refresh {
        patch.insert("metadata".to_owned(), json!({"annotations": {REFRESH_ANNOTATION: null}}));
    }
    let resync_after = (!input.resync.is_zero()).then(|| {
        let reconciled =
            desired.get("reconciledAt").and_then(Value::as_str).and_then(|at| at.parse::<Timestamp>().ok());
        let age = reconciled.map_or(0, |at| input.now.as_second().saturating_sub(at.as_second()).max(0));
        input.resync.saturating_sub(Duration::from_secs(age.unsigned_abs())).max(Duration::from_secs(1))
    });
    // A waiting retry is due by the clock, not by an event.
    let retry_after = step.retry_after.map(|wait| wait.max(Duration::from_secs(1)));
    let requeue_after = match (resync_after, retry_after) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Plan {
        patch: (!patch.is_empty()).then_some(Value::Object(patch)),
        requeue_after,
        sync_status: str_at(&desired, "/sync/status").to_owned(),
        health_status: str_at(&desired, "/health/status").to_owned(),
        operation_phase: desired.pointer("/operationState/phase").and_then(Value::as_str).map(str::to_owned),
        unknown_knobs: knobs.unknown,
    }
}

/// The status patch for an Application whose deletion is held by the `hang`
/// knob: a `DeletionError` condition, once.
pub fn deletion_held_patch(object: &Value, now: Timestamp) -> Option<Value> {
    let current = object.pointer("/status/conditions");
    let message = format!("stand-in: pruning held by annotation {FINALIZER}=hang");
    let mut desired = Map::new();
    set_conditions(&mut desired, current, &[(DELETION_ERROR, message)], &format_time(now));
    let current = json!({"conditions": current.cloned().unwrap_or(Value::Null)});
    merge_diff(&current, &Value::Object(desired)).map(|status| json!({"status": status}))
}

/// A JSON merge patch that turns `current` into `desired` (RFC 7386): objects
/// are diffed key by key, removed keys become `null`, anything else is replaced
/// whole. `None` when they are equal.
pub fn merge_diff(current: &Value, desired: &Value) -> Option<Value> {
    match (current.as_object(), desired.as_object()) {
        (Some(current), Some(desired)) => {
            let mut patch = Map::new();
            for (key, value) in desired {
                let changed = match current.get(key) {
                    Some(old) => merge_diff(old, value),
                    None => Some(value.clone()),
                };
                if let Some(changed) = changed {
                    patch.insert(key.clone(), changed);
                }
            }
            for key in current.keys().filter(|key| !desired.contains_key(*key)) {
                patch.insert(key.clone(), Value::Null);
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        _ => (current != desired).then(|| desired.clone()),
    }
}

/// `current` (an object, or a new one) with `status` set.
fn with_status(current: Option<&Value>, status: &str) -> Value {
    let mut value = current.and_then(Value::as_object).cloned().unwrap_or_default();
    value.insert("status".to_owned(), json!(status));
    Value::Object(value)
}

/// A health value: the current one when status and message are unchanged (so
/// `lastTransitionTime` keeps its date), a fresh one otherwise.
fn transition(current: Option<&Value>, status: &str, message: Option<&str>, now: &str) -> Value {
    if let Some(current) = current.filter(|current| current.is_object()) {
        let same_message = current.get("message").and_then(Value::as_str) == message;
        if str_at(current, "/status") == status && same_message && current.get("lastTransitionTime").is_some() {
            return current.clone();
        }
    }
    let mut health = json!({"status": status, "lastTransitionTime": now});
    if let Some(message) = message {
        health["message"] = json!(message);
    }
    health
}

fn health_status(knobs: &Knobs) -> String {
    knobs.health.clone().unwrap_or_else(|| "Healthy".to_owned())
}

/// The knob's message, or what Argo CD's health checks say of a Deployment in
/// that state.
fn health_message(knobs: &Knobs, status: &str, resource: &str) -> Option<String> {
    if let Some(message) = &knobs.health_message {
        return Some(message.clone());
    }
    match status {
        "Degraded" => Some(format!("Deployment \"{resource}\" exceeded its progress deadline")),
        "Progressing" => {
            Some(format!("Waiting for rollout to finish: 0 of 1 updated replicas are available... ({resource})"))
        }
        _ => None,
    }
}

/// `status.sync.status` and `status.sync.revision` of a valid Application. The
/// stand-in has no Git: a manual Application counts as synced at its last
/// successful sync's revision and is `OutOfSync` before any sync (nothing of it is
/// deployed yet, as Argo CD finds); an automated one is OutOfSync until a sync at
/// its target revision succeeded. A manual Application whose branch has a head
/// (`tracks_head`) is compared with it as Argo CD compares with Git: `OutOfSync`
/// at the head once the head moved past its last sync.
fn sync_status(
    spec: &AppSpec,
    knobs: &Knobs,
    state: &Value,
    target: &str,
    tracks_head: bool,
) -> (&'static str, String) {
    if knobs.sync == SyncKnob::Fail {
        return ("OutOfSync", target.to_owned());
    }
    let result = state.get("syncResult").unwrap_or(&Value::Null);
    let last_success = (str_at(state, "/phase") == SUCCEEDED && result.get("source") == Some(&spec.source_json))
        .then(|| str_at(result, "/revision"))
        .filter(|revision| !revision.is_empty());
    if spec.automated || tracks_head {
        let status = if last_success == Some(target) { "Synced" } else { "OutOfSync" };
        (status, target.to_owned())
    } else {
        match last_success {
            Some(revision) => ("Synced", revision.to_owned()),
            None => ("OutOfSync", target.to_owned()),
        }
    }
}

fn last_attempt_failed(state: &Value, target: &str) -> bool {
    matches!(str_at(state, "/phase"), FAILED | ERROR) && str_at(state, "/syncResult/revision") == target
}

/// The last segment of a path that makes the stand-in deploy a cluster-scoped
/// resource begins with this (`apps/cluster-rbac`: a ClusterRole).
pub const CLUSTER_SCOPED_PATH_PREFIX: &str = "cluster-";

/// The kind of the one resource an Application "deploys" — (group, version, kind,
/// namespaced): a ClusterRole when the last segment of its path begins with
/// [`CLUSTER_SCOPED_PATH_PREFIX`], a Deployment otherwise.
pub fn deployed_kind(spec: &AppSpec) -> (&'static str, &'static str, &'static str, bool) {
    let segment = spec.source.path.rsplit('/').find(|segment| !segment.is_empty() && *segment != ".").unwrap_or("");
    if segment.starts_with(CLUSTER_SCOPED_PATH_PREFIX) {
        ("rbac.authorization.k8s.io", "v1", "ClusterRole", false)
    } else {
        ("apps", "v1", "Deployment", true)
    }
}

/// The one resource an Application "deploys" (see [`deployed_kind`]), named after
/// the last segment of its path (or after the Application).
fn resource(object: &Value, spec: &AppSpec, sync_status: &str, health: &str) -> Value {
    let (group, version, kind, namespaced) = deployed_kind(spec);
    let mut resource = json!({
        "group": group,
        "version": version,
        "kind": kind,
        "name": resource_name(object, spec),
        "status": sync_status,
        "health": {"status": health},
    });
    if namespaced {
        resource["namespace"] = json!(spec.destination.namespace);
    }
    resource
}

fn resource_name(object: &Value, spec: &AppSpec) -> String {
    let segment = spec.source.path.rsplit('/').find(|segment| !segment.is_empty() && *segment != ".").unwrap_or("");
    let mut name: String = segment
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect::<String>()
        .trim_matches('-')
        .to_owned();
    name.truncate(63);
    let name = name.trim_end_matches('-');
    if name.is_empty() { str_at(object, "/metadata/name").to_owned() } else { name.to_owned() }
}

/// Sets `conditions` to `wanted`, keeping `lastTransitionTime` of a condition
/// that was already there with the same type and message; removes the key when
/// there are none.
fn set_conditions(status: &mut Map<String, Value>, current: Option<&Value>, wanted: &[(&str, String)], now: &str) {
    if wanted.is_empty() {
        status.remove("conditions");
        return;
    }
    let existing = current.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let conditions = wanted
        .iter()
        .map(|(kind, message)| {
            existing
                .iter()
                .find(|c| {
                    str_at(c, "/type") == *kind
                        && str_at(c, "/message") == message
                        && c.get("lastTransitionTime").is_some()
                })
                .cloned()
                .unwrap_or_else(|| json!({"type": kind, "message": message, "lastTransitionTime": now}))
        })
        .collect();
    status.insert("conditions".to_owned(), Value::Array(conditions));
}

/// Appends the just-succeeded operation to `status.history`, trimmed to the
/// revision history limit.
fn record_history(status: &mut Map<String, Value>, object: &Value, spec: &AppSpec, state: &Value, now: &str) {
    let mut history = status.get("history").and_then(Value::as_array).cloned().unwrap_or_default();
    let next_id = history.iter().filter_map(|entry| entry.get("id").and_then(Value::as_i64)).max().unwrap_or(-1) + 1;
    let mut entry = json!({
        "id": next_id,
        "revision": str_at(state, "/syncResult/revision"),
        "deployedAt": now,
        "source": spec.source_json,
    });
    if let Some(started) = state.get("startedAt").filter(|started| started.is_string()) {
        entry["deployStartedAt"] = started.clone();
    }
    if let Some(initiated_by) = state.pointer("/operation/initiatedBy").filter(|by| by.is_object()) {
        entry["initiatedBy"] = initiated_by.clone();
    }
    history.push(entry);
    let limit = object
        .pointer("/spec/revisionHistoryLimit")
        .and_then(Value::as_u64)
        .and_then(|limit| usize::try_from(limit).ok())
        .unwrap_or(DEFAULT_HISTORY_LIMIT)
        .max(1);
    let excess = history.len().saturating_sub(limit);
    history.drain(..excess);
    status.insert("history".to_owned(), Value::Array(history));
}

fn reconcile_is_stale(reconciled_at: Option<&Value>, now: Timestamp, resync: Duration) -> bool {
    let Some(at) = reconciled_at.and_then(Value::as_str).and_then(|at| at.parse::<Timestamp>().ok()) else {
        return true;
    };
    !resync.is_zero()
        && now.as_second().saturating_sub(at.as_second()) >= i64::try_from(resync.as_secs()).unwrap_or(i64::MAX)
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
