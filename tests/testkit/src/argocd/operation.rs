//! Sync operations as Argo CD's application controller runs them, one step per
//! reconcile: a requested `.operation` (or an automated sync) starts as
//! `status.operationState` phase `Running`; the next step ends it `Succeeded` or
//! `Failed` and clears `.operation` in the same write; a client that sets the phase
//! to `Terminating` gets `Failed` with "Operation terminated". A failed attempt of
//! an operation with a retry strategy is tried again after its backoff (`retry`).
//! Pure, so every transition is unit-tested; the controller turns a step into a
//! merge patch.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

use super::application::{AppSpec, str_at};
use super::heads::Heads;
use super::knobs::{Knobs, SYNC, SyncKnob};
use super::project::NOT_VALID_MESSAGE;
use super::retry::{Strategy, due_in};

pub const RUNNING: &str = "Running";
pub const TERMINATING: &str = "Terminating";
pub const SUCCEEDED: &str = "Succeeded";
pub const FAILED: &str = "Failed";
pub const ERROR: &str = "Error";

/// Argo CD's message for a sync that applied everything.
pub const SUCCEEDED_MESSAGE: &str = "successfully synced (all tasks run)";
/// Argo CD's message for a terminated operation.
pub const TERMINATED_MESSAGE: &str = "Operation terminated";
/// The message of a running sync.
pub const RUNNING_MESSAGE: &str = "one or more tasks are running";

/// What the operation needs to know about the Application besides its JSON.
#[derive(Debug)]
pub struct OperationInput<'a> {
    pub spec: &'a AppSpec,
    pub knobs: &'a Knobs,
    /// The branch heads tests set (see `heads`); empty: none.
    pub heads: &'a Heads,
    /// InvalidSpecError messages: a running sync fails with them.
    pub spec_errors: &'a [String],
    /// Comparison failed: a running sync fails with this message.
    pub comparison_error: Option<&'a str>,
    /// A resource the sync would create that the project does not permit (Argo CD's
    /// per-resource message): a running sync fails as not valid.
    pub sync_refusal: Option<&'a str>,
    /// `.operation` as requested by a client.
    pub requested: Option<&'a Value>,
    /// `status.operationState` as currently stored.
    pub state: Option<&'a Value>,
    /// RFC 3339 time of this step.
    pub now: &'a str,
}

/// The outcome of one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperationStep {
    /// The new `status.operationState`, when it changes.
    pub state: Option<Value>,
    /// `.operation` is to be removed (the operation completed).
    pub clear_requested: bool,
    /// The operation just succeeded: record a history entry.
    pub succeeded: bool,
    /// A failed attempt waits for its retry: look again after this long.
    pub retry_after: Option<Duration>,
}

/// The next step of the operation of one Application.
pub fn step(input: &OperationInput<'_>) -> OperationStep {
    let state = input.state.filter(|state| state.is_object());
    let phase = state.map(|state| str_at(state, "/phase")).unwrap_or("");
    if phase == TERMINATING {
        return finish(input, state, FAILED, TERMINATED_MESSAGE.to_owned());
    }
    if phase == RUNNING {
        return run(input, state);
    }
    if let Some(requested) = input.requested.filter(|requested| requested.is_object()) {
        return start(input, requested.clone());
    }
    if let Some(operation) = automated_sync(input, state) {
        return start(input, operation);
    }
    OperationStep::default()
}

/// Moves a running operation on: held, failed or succeeded.
fn run(input: &OperationInput<'_>, state: Option<&Value>) -> OperationStep {
    let operation = state.and_then(|state| state.get("operation")).unwrap_or(&Value::Null);
    if !operation.get("sync").is_some_and(Value::is_object) {
        return finish(input, state, ERROR, "operation has no sync to run".to_owned());
    }
    if !input.spec_errors.is_empty() {
        return finish(input, state, FAILED, input.spec_errors.join("; "));
    }
    let strategy = Strategy::of(operation);
    let now = input.now.parse::<Timestamp>().ok();
    if let (Some(strategy), Some(state), Some(now)) = (&strategy, state, now)
        && let Some(wait) = due_in(state, strategy, now).filter(|wait| !wait.is_zero())
    {
        return OperationStep { retry_after: Some(wait), ..OperationStep::default() };
    }
    if let Some(message) = input.comparison_error {
        return fail(input, state, strategy.as_ref(), format!("ComparisonError: {message}"));
    }
    if let Some(refusal) = input.sync_refusal {
        let mut failed = fail(input, state, strategy.as_ref(), NOT_VALID_MESSAGE.to_owned());
        if let Some(state) = failed.state.as_mut() {
            state["syncResult"]["resources"] = json!([{
                "status": "SyncFailed",
                "syncPhase": "Sync",
                "message": refusal,
            }]);
        }
        return failed;
    }
    match input.knobs.sync {
        SyncKnob::Hold => OperationStep::default(),
        SyncKnob::Fail => {
            let message = input.knobs.sync_message.clone().unwrap_or_else(|| {
                format!(
                    "one or more objects failed to apply, reason: stand-in failure requested by annotation {SYNC}=fail"
                )
            });
            fail(input, state, strategy.as_ref(), message)
        }
        SyncKnob::Succeed => finish(input, state, SUCCEEDED, SUCCEEDED_MESSAGE.to_owned()),
    }
}

/// A failed attempt: retried after its backoff while the strategy allows,
/// otherwise the operation ends `Failed`.
fn fail(
    input: &OperationInput<'_>,
    state: Option<&Value>,
    strategy: Option<&Strategy>,
    message: String,
) -> OperationStep {
    let count = state.and_then(|s| s.get("retryCount")).and_then(Value::as_u64).unwrap_or(0);
    let Some(strategy) = strategy.filter(|strategy| strategy.allows(count)) else {
        return finish(input, state, FAILED, message);
    };
    let attempt = count + 1;
    let wait = strategy.backoff(attempt);
    let mut next = state.and_then(Value::as_object).cloned().unwrap_or_default();
    next.insert("phase".to_owned(), json!(RUNNING));
    next.insert("retryCount".to_owned(), json!(attempt));
    next.insert("finishedAt".to_owned(), json!(input.now));
    next.insert("message".to_owned(), json!(format!("{message}. Retrying attempt #{attempt} in {}s.", wait.as_secs())));
    OperationStep { state: Some(Value::Object(next)), retry_after: Some(wait), ..OperationStep::default() }
}

/// Completes the operation in `state` with `phase` and `message`.
fn finish(input: &OperationInput<'_>, state: Option<&Value>, phase: &str, message: String) -> OperationStep {
    let mut next = state.and_then(Value::as_object).cloned().unwrap_or_default();
    if !next.contains_key("operation") {
        next.insert("operation".to_owned(), input.requested.cloned().unwrap_or_else(|| json!({})));
    }
    if !next.get("startedAt").is_some_and(Value::is_string) {
        next.insert("startedAt".to_owned(), json!(input.now));
    }
    if !next.contains_key("syncResult") {
        let revision = sync_revision(input.spec, next.get("operation").unwrap_or(&Value::Null), input.heads);
        next.insert("syncResult".to_owned(), json!({"revision": revision, "source": input.spec.source_json}));
    }
    next.insert("phase".to_owned(), json!(phase));
    next.insert("message".to_owned(), json!(message));
    next.insert("finishedAt".to_owned(), json!(input.now));
    OperationStep {
        state: Some(Value::Object(next)),
        clear_requested: input.requested.is_some(),
        succeeded: phase == SUCCEEDED,
        retry_after: None,
    }
}

/// Starts `operation`: phase Running, with the revision it will sync to.
fn start(input: &OperationInput<'_>, operation: Value) -> OperationStep {
    let revision = sync_revision(input.spec, &operation, input.heads);
    let mut state = Map::new();
    state.insert("operation".to_owned(), operation);
    state.insert("phase".to_owned(), json!(RUNNING));
    state.insert("message".to_owned(), json!(RUNNING_MESSAGE));
    state.insert("startedAt".to_owned(), json!(input.now));
    state.insert("syncResult".to_owned(), json!({"revision": revision, "source": input.spec.source_json}));
    OperationStep { state: Some(Value::Object(state)), ..OperationStep::default() }
}

/// The commit a sync operation deploys: `operation.sync.revision`, or the
/// target revision, resolved as Argo CD would (see `Heads::resolve`).
pub fn sync_revision(spec: &AppSpec, operation: &Value, heads: &Heads) -> String {
    let revision = match str_at(operation, "/sync/revision") {
        "" => spec.source.target_revision.as_str(),
        revision => revision,
    };
    heads.resolve(&spec.source.repo_url, &spec.source.path, revision)
}

/// The commit the spec's target revision resolves to.
pub fn target_revision(spec: &AppSpec, heads: &Heads) -> String {
    heads.resolve(&spec.source.repo_url, &spec.source.path, &spec.source.target_revision)
}

/// Argo CD's automated sync: an automated, valid Application whose last attempt
/// was not at the target revision of the current source gets an operation
/// initiated by the controller, with the Application's retry strategy
/// (`spec.syncPolicy.retry`, none when absent). An operation that failed for good
/// is not started again at the same revision (Argo CD reports a `SyncError`
/// condition instead).
fn automated_sync(input: &OperationInput<'_>, state: Option<&Value>) -> Option<Value> {
    let spec = input.spec;
    if !spec.automated || !input.spec_errors.is_empty() || input.comparison_error.is_some() {
        return None;
    }
    let target = target_revision(spec, input.heads);
    if let Some(state) = state {
        let result = state.get("syncResult").unwrap_or(&Value::Null);
        if str_at(result, "/revision") == target && result.get("source") == Some(&spec.source_json) {
            return None;
        }
    }
    let mut operation = json!({
        "sync": {"revision": target, "prune": spec.automated_prune},
        "initiatedBy": {"automated": true},
    });
    if let Some(retry) = &spec.retry {
        operation["retry"] = retry.clone();
    }
    Some(operation)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::argocd::revision::fake_revision;

    static NO_HEADS: Heads = Heads::NONE;

    fn spec(automated: bool) -> AppSpec {
        let mut app = json!({"spec": {
            "project": "p",
            "source": {"repoURL": "https://git.example.invalid/a", "path": "web", "targetRevision": "main"},
            "destination": {"server": "https://c.example.invalid", "namespace": "ns"},
        }});
        if automated {
            app["spec"]["syncPolicy"] = json!({"automated": {"prune": true}});
        }
        AppSpec::from_object(&app)
    }

    fn input<'a>(
        spec: &'a AppSpec,
        knobs: &'a Knobs,
        requested: Option<&'a Value>,
        state: Option<&'a Value>,
    ) -> OperationInput<'a> {
        OperationInput {
            spec,
            knobs,
            heads: &NO_HEADS,
            spec_errors: &[],
            comparison_error: None,
            sync_refusal: None,
            requested,
            state,
            now: "2030-01-01T00:00:00Z",
        }
    }

    #[test]
    fn requested_sync_runs_then_succeeds_and_clears() {
        let spec = spec(false);
        let knobs = Knobs::default();
        let requested = json!({"sync": {"revision": "v1.2"}, "info": [{"name": "reason", "value": "test"}]});
        let started = step(&input(&spec, &knobs, Some(&requested), None));
        let state = started.state.unwrap();
        assert_eq!(state["phase"], RUNNING);
        assert_eq!(state["operation"], requested);
        assert!(!started.clear_requested);
        let revision = fake_revision("https://git.example.invalid/a", "web", "v1.2");
        assert_eq!(state["syncResult"]["revision"], revision.as_str());

        let done = step(&input(&spec, &knobs, Some(&requested), Some(&state)));
        let finished = done.state.unwrap();
        assert_eq!(finished["phase"], SUCCEEDED);
        assert_eq!(finished["message"], SUCCEEDED_MESSAGE);
        assert_eq!(finished["operation"]["info"][0]["value"], "test");
        assert_eq!(finished["startedAt"], state["startedAt"]);
        assert!(finished["finishedAt"].is_string());
        assert!(done.clear_requested && done.succeeded);

        // Completed and cleared: nothing more to do.
        assert_eq!(step(&input(&spec, &knobs, None, Some(&finished))), OperationStep::default());
    }

    #[test]
    fn knobs_hold_and_fail() {
        let spec = spec(false);
        let requested = json!({"sync": {}});
        let hold = Knobs { sync: SyncKnob::Hold, ..Knobs::default() };
        let running = step(&input(&spec, &hold, Some(&requested), None)).state.unwrap();
        assert_eq!(step(&input(&spec, &hold, Some(&requested), Some(&running))), OperationStep::default());

        let fail = Knobs { sync: SyncKnob::Fail, sync_message: Some("boom".into()), ..Knobs::default() };
        let failed = step(&input(&spec, &fail, Some(&requested), Some(&running)));
        assert_eq!(failed.state.as_ref().unwrap()["phase"], FAILED);
        assert_eq!(failed.state.as_ref().unwrap()["message"], "boom");
        assert!(failed.clear_requested && !failed.succeeded);
    }

    #[test]
    fn a_resource_the_project_does_not_permit_fails_the_sync() {
        let spec = spec(false);
        let knobs = Knobs::default();
        let requested = json!({"sync": {}});
        let running = step(&input(&spec, &knobs, Some(&requested), None)).state.unwrap();
        let refusal = "resource rbac.authorization.k8s.io:ClusterRole is not permitted in project p";
        let failed = step(&OperationInput {
            sync_refusal: Some(refusal),
            ..input(&spec, &knobs, Some(&requested), Some(&running))
        });
        let state = failed.state.unwrap();
        assert_eq!((state["phase"].as_str(), state["message"].as_str()), (Some(FAILED), Some(NOT_VALID_MESSAGE)));
        assert_eq!(state["syncResult"]["resources"][0]["message"], refusal);
        assert!(failed.clear_requested && !failed.succeeded);
    }

    #[test]
    fn terminating_becomes_failed() {
        let spec = spec(false);
        let knobs = Knobs { sync: SyncKnob::Hold, ..Knobs::default() };
        let requested = json!({"sync": {}});
        let mut state = step(&input(&spec, &knobs, Some(&requested), None)).state.unwrap();
        state["phase"] = json!(TERMINATING);
        let terminated = step(&input(&spec, &knobs, Some(&requested), Some(&state)));
        let terminated_state = terminated.state.unwrap();
        assert_eq!(terminated_state["phase"], FAILED);
        assert_eq!(terminated_state["message"], TERMINATED_MESSAGE);
        assert!(terminated.clear_requested);
        // A Terminating phase with no operation around still ends.
        let bare = json!({"phase": TERMINATING});
        let ended = step(&input(&spec, &knobs, None, Some(&bare))).state.unwrap();
        assert_eq!(ended["phase"], FAILED);
        assert!(ended["startedAt"].is_string() && ended["operation"].is_object());
    }

    #[test]
    fn invalid_spec_fails_a_running_sync() {
        let spec = spec(false);
        let knobs = Knobs::default();
        let running = json!({"phase": RUNNING, "operation": {"sync": {}}, "startedAt": "2030-01-01T00:00:00Z"});
        let errors = ["Application referencing project p which does not exist".to_owned()];
        let step = step(&OperationInput { spec_errors: &errors, ..input(&spec, &knobs, None, Some(&running)) });
        assert_eq!(step.state.unwrap()["message"], errors[0]);
        let odd = json!({"phase": RUNNING, "operation": "x"});
        assert_eq!(super::step(&input(&spec, &knobs, None, Some(&odd))).state.unwrap()["phase"], ERROR);
    }

    #[test]
    fn automated_sync_once_per_revision() {
        let spec = spec(true);
        let knobs = Knobs::default();
        let started = step(&input(&spec, &knobs, None, None)).state.unwrap();
        assert_eq!(started["operation"]["initiatedBy"]["automated"], true);
        assert_eq!(started["operation"]["sync"]["prune"], true);
        let done = step(&input(&spec, &knobs, None, Some(&started))).state.unwrap();
        assert_eq!(done["phase"], SUCCEEDED);
        assert_eq!(step(&input(&spec, &knobs, None, Some(&done))), OperationStep::default());
        let mut failed = done.clone();
        failed["phase"] = json!(FAILED);
        assert_eq!(step(&input(&spec, &knobs, None, Some(&failed))), OperationStep::default());
        // A new target revision is synced again.
        let mut moved = spec.clone();
        moved.source.target_revision = "v2".into();
        assert!(step(&input(&moved, &knobs, None, Some(&done))).state.is_some());
        // Not for manual applications.
        assert_eq!(step(&input(&super::tests::spec(false), &knobs, None, None)), OperationStep::default());
    }

    #[test]
    fn a_failed_attempt_is_retried_as_the_application_asks_then_fails_for_good() {
        let mut spec = spec(true);
        spec.retry = Some(json!({"limit": 2, "backoff": {"duration": "5s", "factor": 2, "maxDuration": "3m"}}));
        let fail = Knobs { sync: SyncKnob::Fail, sync_message: Some("boom".into()), ..Knobs::default() };
        let at =
            |now: &'static str, state: &Value| step(&OperationInput { now, ..input(&spec, &fail, None, Some(state)) });
        let started = step(&input(&spec, &fail, None, None)).state.unwrap();
        assert_eq!(started["operation"]["retry"]["limit"], 2, "the Application's strategy, nothing made up");
        let first = at("2030-01-01T00:00:00Z", &started);
        assert_eq!(first.retry_after, Some(Duration::from_secs(5)));
        let waiting = first.state.unwrap();
        assert_eq!((waiting["phase"].as_str(), waiting["retryCount"].as_u64()), (Some(RUNNING), Some(1)));
        assert!(waiting["message"].as_str().unwrap().starts_with("boom. Retrying attempt #1"));
        // Before its backoff is over nothing happens, only a later look.
        let early = at("2030-01-01T00:00:03Z", &waiting);
        assert_eq!((early.state, early.retry_after), (None, Some(Duration::from_secs(2))));
        let second = at("2030-01-01T00:00:05Z", &waiting).state.unwrap();
        assert_eq!(second["retryCount"], 2);
        let last = at("2030-01-01T00:00:15Z", &second).state.unwrap();
        assert_eq!((last["phase"].as_str(), last["message"].as_str()), (Some(FAILED), Some("boom")));
        // Failed for good: not started again at the same revision.
        assert_eq!(step(&input(&spec, &fail, None, Some(&last))), OperationStep::default());
    }

    #[test]
    fn without_a_strategy_a_failure_is_final_and_a_retry_that_succeeds_ends_it() {
        let spec = spec(true);
        let fail = Knobs { sync: SyncKnob::Fail, ..Knobs::default() };
        let started = step(&input(&spec, &fail, None, None)).state.unwrap();
        assert!(started["operation"].get("retry").is_none(), "no strategy of the stand-in's own");
        assert_eq!(step(&input(&spec, &fail, None, Some(&started))).state.unwrap()["phase"], FAILED);

        let mut retried = spec.clone();
        retried.retry = Some(json!({"limit": -1}));
        let started = step(&input(&retried, &fail, None, None)).state.unwrap();
        let waiting = step(&input(&retried, &fail, None, Some(&started))).state.unwrap();
        let healed = Knobs::default();
        let now = "2030-01-01T00:00:05Z";
        let done = step(&OperationInput { now, ..input(&retried, &healed, None, Some(&waiting)) }).state.unwrap();
        assert_eq!(done["phase"], SUCCEEDED);
    }
}
