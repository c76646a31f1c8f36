//! The PromotionRun controller. Manual promotion: locate (or create) the binding of
//! the Application and the target Environment, point it at the Snapshot, and wait
//! until every GitOpsDeployment of the binding is Synced and Healthy at the commit the
//! repository generator reported — or fail after a time limit. Automated promotion
//! (which the original refused) does the same for each step of its plan
//! ([`automated`]: the initial Environment, then its `AppStudioAutomated`
//! descendants a generation at a time, siblings together), each step with the whole
//! time limit, stopping at the first step that fails; `environmentStatus` has one
//! entry per Environment with its step's number.
//!
//! A binding the controller creates carries the label
//! `appstudio.redhat.com/generated-by-promotion-run` and no owner reference: deleting
//! the run must not collect the binding and every deployment of the environment.
//! Bindings are watched through that label (and the run's `activeBindings`), so a
//! run moves on as soon as its binding's status changes; the poll is a fallback.
//! Only one run per application and namespace is active at a time (the oldest).
//! Where no webhook keeps a run's spec fixed, the run records the spec it started
//! with and refuses a changed one with a condition instead of following it.

pub mod automated;
pub mod progress;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::api::{
    BindingComponent, Component, Environment, PromotionRun, PromotionRunCondition, PromotionRunEnvironmentStatus,
    PromotionRunStatus, Snapshot, SnapshotEnvironmentBinding, SnapshotEnvironmentBindingSpec,
};
use crate::condition::{ERROR_OCCURRED, FALSE, TRUE, now_rfc3339};
use crate::context::{Context, ReconcileError, found, namespace_closed};
use crate::names::sha256_hex;
use progress::Progress;

pub const STATE_ACTIVE: &str = "Active";
pub const STATE_WAITING: &str = "Waiting";
pub const STATE_COMPLETE: &str = "Complete";
pub const RESULT_SUCCESS: &str = "Success";
pub const RESULT_FAILURE: &str = "Failure";
pub const STATUS_SUCCESS: &str = "Success";
pub const STATUS_IN_PROGRESS: &str = "In Progress";
pub const STATUS_FAILED: &str = "Failed";
pub const ALL_SYNCED_HEALTHY: &str = "All GitOpsDeployments are Synced/Healthy";
pub const TARGET_INVALID: &str = "Target Environment has invalid value.";
pub const ACTIVE_PROMOTION_EXISTS: &str = "Error occurred while checking for existing active promotions.";
pub const WAITING_FOR_DEPLOYMENTS: &str =
    "Waiting for the environment binding to create all of the expected GitOpsDeployments.";
/// Labels on a binding the controller created.
pub const GENERATED_BY_LABEL: &str = "appstudio.redhat.com/generated-by-promotion-run";
/// On a run: its `spec` as JSON, as the run started with it (the webhook keeps it
/// fixed; this is the controller's check where none runs).
pub const SPEC_ANNOTATION: &str = "appstudio.redhat.com/promotion-spec";
pub const APPLICATION_LABEL: &str = "appstudio.application";
pub const ENVIRONMENT_LABEL: &str = "appstudio.environment";

/// The binding a promotion creates for (application, environment):
/// `lower(<app>-<env>-generated-binding)`, or over 250 characters
/// `generated-environment-binding-<sha256 hex of that>`.
pub fn generated_binding_name(application: &str, environment: &str) -> String {
    let name = format!("{application}-{environment}-generated-binding").to_lowercase();
    if name.len() > 250 { format!("generated-environment-binding-{}", sha256_hex(&name)) } else { name }
}

/// The value of [`GENERATED_BY_LABEL`] for the run `name`: the name when it fits a
/// label value (63 characters), else its first 30 characters, `-` and 32 hex digits
/// of its SHA-256 (a longer name would have the binding refused).
pub fn generated_by_value(name: &str) -> String {
    if name.len() <= 63 {
        return name.to_owned();
    }
    let prefix: String = name.chars().take(30).collect();
    format!("{prefix}-{}", &sha256_hex(name)[..32])
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static) {
    let config = watcher::Config::default();
    let controller = Controller::new(ctx.served::<PromotionRun>(), config.clone());
    let store = controller.store();
    let (by_binding, by_snapshot, by_sibling) = (store.clone(), store.clone(), store);
    controller
        // A run that completes lets the next run of its application start.
        .watches(ctx.served::<PromotionRun>(), config.clone(), move |finished| {
            if !complete(&finished) {
                return Vec::new();
            }
            runs(&by_sibling, finished.namespace().as_deref(), |run| run.spec.application == finished.spec.application)
        })
        // A binding wakes the run its label names (the one that generated it) and
        // the runs acting on it; bindings of the same application and environment
        // that no run uses wake nobody.
        .watches(ctx.served::<SnapshotEnvironmentBinding>(), config.clone(), move |binding| {
            let name = binding.name_any();
            let generated_by = binding.labels().get(GENERATED_BY_LABEL).cloned();
            runs(&by_binding, binding.namespace().as_deref(), |run| {
                generated_by.as_deref().is_some_and(|value| value == generated_by_value(&run.name_any()))
                    || run.status.as_ref().is_some_and(|s| s.active_bindings.contains(&name))
            })
        })
        .watches(ctx.served::<Snapshot>(), config, move |snapshot| {
            let name = snapshot.name_any();
            runs(&by_snapshot, snapshot.namespace().as_deref(), |run| run.spec.snapshot == name)
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| {
            let metrics = ctx.metrics.clone();
            async move {
                metrics.outcome("promotion", &result);
                if let Err(error) = result {
                    tracing::debug!(error = %gitops_shared::telemetry::error_chain(&error), "promotion reconcile");
                }
            }
        })
        .await;
}

/// The unfinished runs of `namespace` that `matches` accepts.
fn runs(
    store: &Store<PromotionRun>,
    namespace: Option<&str>,
    matches: impl Fn(&PromotionRun) -> bool,
) -> Vec<ObjectRef<PromotionRun>> {
    store
        .state()
        .into_iter()
        .filter(|run| run.namespace().as_deref() == namespace && !complete(run) && matches(run))
        .map(|run| ObjectRef::from_obj(run.as_ref()))
        .collect()
}

fn complete(run: &PromotionRun) -> bool {
    run.status.as_ref().is_some_and(|s| s.state == STATE_COMPLETE)
}

fn error_policy(_: Arc<PromotionRun>, error: &ReconcileError, _: Arc<Context>) -> Action {
    tracing::warn!(error = %gitops_shared::telemetry::error_chain(error), "promotion reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

fn error_condition(message: &str, now: &str) -> PromotionRunCondition {
    PromotionRunCondition {
        type_: ERROR_OCCURRED.to_owned(),
        status: TRUE.to_owned(),
        reason: Some(ERROR_OCCURRED.to_owned()),
        message: Some(message.to_owned()),
        last_probe_time: Some(now.to_owned()),
        last_transition_time: Some(now.to_owned()),
    }
}

fn no_error_condition(now: &str) -> PromotionRunCondition {
    PromotionRunCondition {
        type_: ERROR_OCCURRED.to_owned(),
        status: FALSE.to_owned(),
        reason: None,
        message: None,
        last_probe_time: Some(now.to_owned()),
        last_transition_time: Some(now.to_owned()),
    }
}

/// Sets the one `ErrorOccurred` condition, keeping its times when nothing changed.
fn set_condition(status: &mut PromotionRunStatus, new: PromotionRunCondition) {
    if let Some(old) = status.conditions.iter_mut().find(|c| c.type_ == new.type_) {
        if old.status == new.status && old.reason == new.reason && old.message == new.message {
            return;
        }
        *old = new;
    } else {
        status.conditions.push(new);
    }
}

async fn reconcile(run: Arc<PromotionRun>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let namespace = run.namespace().ok_or(ReconcileError::Incomplete("namespace"))?;
    if complete(&run)
        || run.metadata.deletion_timestamp.is_some()
        || namespace_closed(&ctx, &namespace).await?.is_some()
    {
        return Ok(Action::await_change());
    }
    let old = run.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let action = step(&ctx, &run, &namespace, &mut status).await?;
    if status != old {
        let api = Api::<PromotionRun>::namespaced(ctx.client.clone(), &namespace);
        let patch = json!({"status": status});
        api.patch_status(&run.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| ReconcileError::Kube { action: "write the PromotionRun's status", source })?;
    }
    Ok(action)
}

/// One step of the promotion; updates `status` and says when to look again.
async fn step(
    ctx: &Context,
    run: &PromotionRun,
    namespace: &str,
    status: &mut PromotionRunStatus,
) -> Result<Action, ReconcileError> {
    let now = now_rfc3339();
    let user_error = |status: &mut PromotionRunStatus, message: &str| {
        set_condition(status, error_condition(message, &now));
    };
    if let Some(message) = spec_changed(ctx, run, namespace).await? {
        let mut condition = error_condition(&message, &now);
        condition.reason = Some(crate::binding::IMMUTABLE_FIELD_CHANGED.to_owned());
        set_condition(status, condition);
        return Ok(Action::await_change());
    }
    if let Some(older) = older_active_run(ctx, run, namespace).await? {
        tracing::debug!(tenant.ns = %namespace, run = %run.name_any(), %older, "another promotion of the application is active");
        user_error(status, ACTIVE_PROMOTION_EXISTS);
        return Ok(Action::requeue(ctx.settings.promotion_poll));
    }
    let steps = if run.spec.automated_promotion.initial_environment.is_empty() {
        let target = run.spec.manual_promotion.target_environment.as_str();
        if target.is_empty() {
            user_error(status, TARGET_INVALID);
            return Ok(Action::await_change());
        }
        vec![vec![target.to_owned()]]
    } else {
        match plan_in(ctx, namespace, &run.spec.automated_promotion.initial_environment).await? {
            Ok(steps) => steps,
            Err(message) => {
                // No plan (a cycle, a missing initial Environment): the run ends, so
                // it does not hold up the application's later runs.
                status.state = STATE_COMPLETE.to_owned();
                status.completion_result = Some(RESULT_FAILURE.to_owned());
                user_error(status, &message);
                return Ok(Action::await_change());
            }
        }
    };
    let snapshots = Api::<Snapshot>::namespaced(ctx.client.clone(), namespace);
    let snapshot_exists = found(snapshots.get_metadata(&run.spec.snapshot).await, "read the Snapshot")?.is_some();
    if status.state.is_empty() {
        status.state = STATE_ACTIVE.to_owned();
    }
    status.promotion_start_time.get_or_insert_with(|| now.clone());
    let limit = ctx.settings.promotion_timeout;
    for (index, environments) in steps.iter().enumerate() {
        let number = i64::try_from(index).unwrap_or(i64::MAX - 1) + 1;
        if environments.iter().all(|env| environment_state(status, env) == Some(STATUS_SUCCESS)) {
            continue;
        }
        let started = step_started(ctx, run, namespace, number, status).await?;
        let elapsed =
            Duration::try_from(k8s_openapi::jiff::Timestamp::now().duration_since(started)).unwrap_or(Duration::ZERO);
        let poll = ctx.settings.promotion_poll.min(limit.saturating_sub(elapsed) + Duration::from_secs(1));
        let mut bindings = Vec::new();
        let mut all_done = true;
        // The step's time limit holds whatever keeps it from progressing (a binding
        // that cannot be made, one whose Snapshot keeps being changed back).
        let timed_out = |status: &mut PromotionRunStatus, environment: &str| {
            status.state = STATE_COMPLETE.to_owned();
            status.completion_result = Some(RESULT_FAILURE.to_owned());
            let message = format!("Promotion Failed. Could not be completed in {}.", progress::limit_text(limit));
            set_environment_status(status, number, environment, STATUS_FAILED, &message);
            set_condition(status, error_condition(&message, &now));
        };
        for environment in environments {
            let binding = match locate_or_create_binding(ctx, run, namespace, environment).await? {
                Ok(binding) => binding,
                Err(message) if elapsed > limit => {
                    timed_out(status, environment);
                    tracing::info!(tenant.ns = %namespace, run = %run.name_any(), %message, "promotion step timed out");
                    return Ok(Action::await_change());
                }
                Err(message) => {
                    user_error(status, &message);
                    return Ok(Action::requeue(ctx.settings.user_error_requeue));
                }
            };
            let binding_name = binding.name_any();
            if !snapshot_exists {
                let message =
                    format!("Snapshot: {} referred in Binding: {binding_name} does not exist.", run.spec.snapshot);
                user_error(status, &message);
                return Ok(Action::await_change());
            }
            bindings.push(binding_name.clone());
            let known = status.active_bindings.contains(&binding_name);
            if steps.len() == 1 && status.active_bindings.first().is_some_and(|active| *active != binding_name) {
                let message = format!(
                    "The binding changed after the PromotionRun first start: it was {}, it is now {binding_name}.",
                    status.active_bindings[0]
                );
                user_error(status, &message);
                return Ok(Action::await_change());
            }
            if binding.spec.snapshot != run.spec.snapshot || !known {
                if elapsed > limit {
                    status.active_bindings = bindings;
                    timed_out(status, environment);
                    return Ok(Action::await_change());
                }
                if binding.spec.snapshot != run.spec.snapshot {
                    let api = Api::<SnapshotEnvironmentBinding>::namespaced(ctx.client.clone(), namespace);
                    api.patch(
                        &binding_name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"spec": {"snapshot": run.spec.snapshot}})),
                    )
                    .await
                    .map_err(|source| ReconcileError::Kube { action: "point the binding at the Snapshot", source })?;
                }
                // The binding's status still speaks of the old Snapshot: look again once it changes.
                set_environment_status(status, number, environment, STATUS_IN_PROGRESS, WAITING_FOR_DEPLOYMENTS);
                all_done = false;
                continue;
            }
            let binding_status = binding.status.clone().unwrap_or_default();
            match progress::progress(
                binding.spec.components.len(),
                &binding_status.components,
                &binding_status.gitops_deployments,
                elapsed,
                limit,
            ) {
                Progress::Creating => {
                    set_environment_status(status, number, environment, STATUS_IN_PROGRESS, WAITING_FOR_DEPLOYMENTS);
                    all_done = false;
                }
                Progress::Waiting(names) => {
                    status.state = STATE_WAITING.to_owned();
                    let message =
                        format!("Waiting for following GitOpsDeployments to be Synced/Healthy: {}", names.join(", "));
                    set_environment_status(status, number, environment, STATUS_IN_PROGRESS, &message);
                    all_done = false;
                }
                Progress::TimedOut => {
                    status.state = STATE_COMPLETE.to_owned();
                    status.completion_result = Some(RESULT_FAILURE.to_owned());
                    let message =
                        format!("Promotion Failed. Could not be completed in {}.", progress::limit_text(limit));
                    set_environment_status(status, number, environment, STATUS_FAILED, &message);
                    status.active_bindings = bindings;
                    user_error(status, &message);
                    return Ok(Action::await_change());
                }
                Progress::Done => {
                    set_environment_status(status, number, environment, STATUS_SUCCESS, ALL_SYNCED_HEALTHY);
                }
            }
        }
        status.active_bindings = bindings;
        set_condition(status, no_error_condition(&now));
        if !all_done {
            return Ok(Action::requeue(poll));
        }
    }
    status.state = STATE_COMPLETE.to_owned();
    status.completion_result = Some(RESULT_SUCCESS.to_owned());
    set_condition(status, no_error_condition(&now));
    Ok(Action::await_change())
}

/// The webhook's refusal of a changed spec, when the run started with another
/// (recorded then in [`SPEC_ANNOTATION`]); records the spec on the first look.
async fn spec_changed(ctx: &Context, run: &PromotionRun, namespace: &str) -> Result<Option<String>, ReconcileError> {
    let Some(recorded) = run.annotations().get(SPEC_ANNOTATION) else {
        let spec = serde_json::to_string(&run.spec)
            .map_err(|source| ReconcileError::Encode { what: "the PromotionRun's spec", source })?;
        let api = Api::<PromotionRun>::namespaced(ctx.client.clone(), namespace);
        let patch = json!({"metadata": {"annotations": {SPEC_ANNOTATION: spec}}});
        api.patch(&run.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| ReconcileError::Kube { action: "record the PromotionRun's spec", source })?;
        return Ok(None);
    };
    // Not ours to read (edited by hand): nothing to compare with.
    let Ok(old) = serde_json::from_str::<crate::api::PromotionRunSpec>(recorded) else { return Ok(None) };
    Ok(crate::webhook::rules::promotion_update(&old, &run.spec).err().map(|refusal| {
        format!(
            "{refusal}; the run acts for the spec it started with only (snapshot {}, target {}): change it back, \
             or delete the run and make a new one",
            old.snapshot,
            if old.automated_promotion.initial_environment.is_empty() {
                &old.manual_promotion.target_environment
            } else {
                &old.automated_promotion.initial_environment
            }
        )
    }))
}

/// The state of `environment`'s entry, if it has one.
fn environment_state<'a>(status: &'a PromotionRunStatus, environment: &str) -> Option<&'a str> {
    status.environment_status.iter().find(|e| e.environment_name == environment).map(|e| e.status.as_str())
}

/// On an automated PromotionRun: `<step> <RFC 3339 time>`, when its current step
/// started (each step has the whole time limit).
pub const STEP_STARTED_ANNOTATION: &str = "appstudio.redhat.com/promotion-step-started";

/// When step `number` started: a manual promotion's one step when the run did; an
/// automated one's as the run's annotation says, recorded now when it names
/// another step.
async fn step_started(
    ctx: &Context,
    run: &PromotionRun,
    namespace: &str,
    number: i64,
    status: &PromotionRunStatus,
) -> Result<k8s_openapi::jiff::Timestamp, ReconcileError> {
    let now = k8s_openapi::jiff::Timestamp::now();
    if run.spec.automated_promotion.initial_environment.is_empty() {
        return Ok(status.promotion_start_time.as_deref().and_then(|t| t.parse().ok()).unwrap_or(now));
    }
    let recorded = run.annotations().get(STEP_STARTED_ANNOTATION).and_then(|value| {
        let (step, at) = value.split_once(' ')?;
        (step.parse::<i64>().ok()? == number).then(|| at.parse::<k8s_openapi::jiff::Timestamp>().ok()).flatten()
    });
    if let Some(started) = recorded {
        return Ok(started);
    }
    let value = format!("{number} {}", now.strftime("%Y-%m-%dT%H:%M:%SZ"));
    let api = Api::<PromotionRun>::namespaced(ctx.client.clone(), namespace);
    api.patch(
        &run.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": {STEP_STARTED_ANNOTATION: value}}})),
    )
    .await
    .map_err(|source| ReconcileError::Kube { action: "record the promotion step's start", source })?;
    Ok(now)
}

/// The plan of an automated promotion over the namespace's Environments.
async fn plan_in(
    ctx: &Context,
    namespace: &str,
    initial: &str,
) -> Result<Result<Vec<Vec<String>>, String>, ReconcileError> {
    let environments = Api::<Environment>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map_err(|source| ReconcileError::Kube { action: "list the Environments", source })?;
    let nodes = environments
        .items
        .into_iter()
        .map(|env| {
            let node = automated::Node {
                parent: env.spec.parent_environment.clone(),
                strategy: env.spec.deployment_strategy.clone(),
            };
            (env.name_any(), node)
        })
        .collect();
    Ok(automated::plan(initial, &nodes))
}

/// The entry of `environment` at step `step`.
fn set_environment_status(status: &mut PromotionRunStatus, step: i64, environment: &str, state: &str, display: &str) {
    let entry = PromotionRunEnvironmentStatus {
        step,
        environment_name: environment.to_owned(),
        status: state.to_owned(),
        display_status: display.to_owned(),
    };
    match status.environment_status.iter_mut().find(|e| e.environment_name == environment) {
        Some(old) => *old = entry,
        None => status.environment_status.push(entry),
    }
}

/// An older unfinished run of the same application in the namespace, if any.
async fn older_active_run(
    ctx: &Context,
    run: &PromotionRun,
    namespace: &str,
) -> Result<Option<String>, ReconcileError> {
    let api = Api::<PromotionRun>::namespaced(ctx.client.clone(), namespace);
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|source| ReconcileError::Kube { action: "list the PromotionRuns", source })?;
    let key = |r: &PromotionRun| (r.metadata.creation_timestamp.clone().map(|t| t.0), r.name_any());
    Ok(list
        .items
        .iter()
        .filter(|other| other.metadata.uid != run.metadata.uid && !complete(other))
        .filter(|other| other.spec.application == run.spec.application && key(other) < key(run))
        .map(|other| other.name_any())
        .min())
}

/// The binding of (application, `target`): the first in the namespace, else a new one
/// listing every Component of the application. `Err`: the tenant's problem.
async fn locate_or_create_binding(
    ctx: &Context,
    run: &PromotionRun,
    namespace: &str,
    target: &str,
) -> Result<Result<SnapshotEnvironmentBinding, String>, ReconcileError> {
    let api = Api::<SnapshotEnvironmentBinding>::namespaced(ctx.client.clone(), namespace);
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|source| ReconcileError::Kube { action: "list the bindings", source })?;
    let mut matching: Vec<SnapshotEnvironmentBinding> = list
        .items
        .into_iter()
        .filter(|b| b.spec.application == run.spec.application && b.spec.environment == target)
        .collect();
    matching.sort_by_key(|b| (b.metadata.creation_timestamp.clone().map(|t| t.0), b.name_any()));
    if let Some(binding) = matching.into_iter().next() {
        return Ok(Ok(binding));
    }
    let components = Api::<Component>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map_err(|source| ReconcileError::Kube { action: "list the Components", source })?;
    let mut names: Vec<String> =
        components.items.iter().filter(|c| c.spec.application == run.spec.application).map(|c| c.name_any()).collect();
    names.sort();
    if names.is_empty() {
        return Ok(Err(format!(
            "no Components of Application {} to promote to Environment {target}",
            run.spec.application
        )));
    }
    let name = generated_binding_name(&run.spec.application, target);
    let mut binding = SnapshotEnvironmentBinding::new(
        &name,
        SnapshotEnvironmentBindingSpec {
            application: run.spec.application.clone(),
            environment: target.to_owned(),
            snapshot: run.spec.snapshot.clone(),
            components: names.into_iter().map(|name| BindingComponent { name, configuration: None }).collect(),
        },
    );
    binding.meta_mut().labels = Some(
        [
            (APPLICATION_LABEL.to_owned(), run.spec.application.clone()),
            (ENVIRONMENT_LABEL.to_owned(), target.to_owned()),
            (GENERATED_BY_LABEL.to_owned(), generated_by_value(&run.name_any())),
        ]
        .into(),
    );
    match api.create(&PostParams::default(), &binding).await {
        Ok(created) => Ok(Ok(created)),
        Err(kube::Error::Api(status)) if status.code == 409 => found(
            api.get(&name).await,
            "read the generated binding",
        )?
        .map_or_else(|| Ok(Err(format!("the binding {name} could not be created"))), |existing| Ok(Ok(existing))),
        Err(kube::Error::Api(status)) if matches!(status.code, 400 | 403 | 422) => {
            Ok(Err(format!("the binding {name} was refused: {}", status.message)))
        }
        Err(source) => Err(ReconcileError::Kube { action: "create the binding", source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_binding_names_are_lowercase_and_hashed_when_long() {
        assert_eq!(generated_binding_name("New-Demo-App", "Prod"), "new-demo-app-prod-generated-binding");
        let app = "a".repeat(240);
        let long = format!("{app}-prod-generated-binding");
        assert_eq!(
            generated_binding_name(&app, "prod"),
            format!("generated-environment-binding-{}", sha256_hex(&long))
        );
    }

    #[test]
    fn the_generated_by_label_fits_a_label_value() {
        assert_eq!(generated_by_value("promote"), "promote");
        let long = format!("{}.promote", "r".repeat(80));
        let value = generated_by_value(&long);
        assert_eq!(value.len(), 63);
        assert_eq!(value, format!("{}-{}", "r".repeat(30), &sha256_hex(&long)[..32]));
        assert_ne!(value, generated_by_value(&format!("{}.other", "r".repeat(80))), "different runs, different labels");
    }
}
