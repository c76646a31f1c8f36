//! The DeploymentTarget reclaimer: every target carries the finalizer
//! `dt.appstudio.redhat.com/finalizer` (so a claim's release can still find it), a
//! `Bound` target of a `Retain` class whose claim is gone is `Released` and free of
//! it (a target reserved for a claim not made yet waits for the claim), and a
//! class that is missing or has an unknown reclaim policy is reported on the target
//! (the original ignored a missing class silently).
//!
//! A target being deleted whose class says `Delete` takes its SpaceRequest (a
//! provisioned namespace) along, as the original did: the request gets the sandbox
//! operator's finalizer, must report a `Ready` condition, is deleted, and the target
//! keeps its own finalizer until the request is gone. A request that has been
//! terminating for longer than `--space-request-termination-timeout` while its
//! `Ready` reason is `UnableToTerminate` makes the target `Failed`; the target still
//! goes once the request does. What to do next is [`space_request_step`], a pure
//! function of the request, how long it has been terminating and the target's phase.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use serde_json::json;

use super::provision::{
    CONDITION_READY, FINALIZER_TOOLCHAIN, LABEL_DT, LABEL_DTC, REASON_UNABLE_TO_TERMINATE, space_requests_of,
};
use super::{PHASE_FAILED, PHASE_RELEASED, RECLAIM_DELETE, RECLAIM_RETAIN, outcome_conditions, phase_of_target};
use crate::api::{DeploymentTarget, DeploymentTargetClaim, DeploymentTargetClass, SpaceRequest};
use crate::context::{Context, ReconcileError, deleted, found};
use crate::names::FINALIZER_DT;

/// Runs the reclaimer until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static) {
    let config = watcher::Config::default();
    let controller = Controller::new(ctx.served::<DeploymentTarget>(), config.clone());
    let store = controller.store();
    let by_request = store.clone();
    controller
        .watches(ctx.served::<DeploymentTargetClaim>(), config.clone(), move |claim| {
            let name = claim.name_any();
            store
                .state()
                .into_iter()
                .filter(|t| t.namespace() == claim.namespace())
                .filter(|t| {
                    t.spec.claim_ref.as_deref() == Some(name.as_str())
                        || claim.spec.target_name.as_deref() == Some(t.name_any().as_str())
                })
                .map(|t| ObjectRef::from_obj(t.as_ref()))
                .collect::<Vec<_>>()
        })
        .watches(ctx.served::<SpaceRequest>(), config, move |request| targets_of(&by_request, &request))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| {
            let metrics = ctx.metrics.clone();
            async move {
                metrics.outcome("target", &result);
                if let Err(error) = result {
                    tracing::debug!(error = %gitops_shared::telemetry::error_chain(&error), "target reconcile");
                }
            }
        })
        .await;
}

/// The target a SpaceRequest was turned into (its `dt` label), else the targets of
/// the claim it was made for: a change of the request (its deletion above all)
/// wakes the target waiting for it.
fn targets_of(store: &Store<DeploymentTarget>, request: &SpaceRequest) -> Vec<ObjectRef<DeploymentTarget>> {
    let labels = request.labels();
    let (target, claim) = (labels.get(LABEL_DT), labels.get(LABEL_DTC));
    store
        .state()
        .into_iter()
        .filter(|t| t.namespace() == request.namespace())
        .filter(|t| match target {
            Some(target) => &t.name_any() == target,
            None => claim.is_some() && t.spec.claim_ref.as_ref() == claim,
        })
        .map(|t| ObjectRef::from_obj(t.as_ref()))
        .collect()
}

fn error_policy(_: Arc<DeploymentTarget>, error: &ReconcileError, _: Arc<Context>) -> Action {
    tracing::warn!(error = %gitops_shared::telemetry::error_chain(error), "target reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// What a target being deleted, of a `Delete` class, does next about its SpaceRequest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpaceRequestStep {
    /// Put the sandbox operator's finalizer on the request (before it is deleted:
    /// none can be added after), then decide again.
    AddFinalizer,
    /// The request has no `Ready` condition: report this (the original's message) and
    /// look again; the request is not deleted until the operator reports on it.
    NoReadyCondition(String),
    /// Delete the request, and look again.
    Delete,
    /// Terminating for longer than the timeout with `UnableToTerminate`: the target's
    /// phase becomes `Failed` (it still goes once the request does).
    Fail,
    /// Terminating (or the target is `Failed` already): look again later.
    Wait,
}

/// The next step for `request`, terminating for `deleting_for` (None: not deleted
/// yet), with the target in `target_phase`. After `timeout` of terminating (strictly
/// more, as the original's clock compared) with the `Ready` reason
/// `UnableToTerminate`, the target fails.
pub fn space_request_step(
    request: &SpaceRequest,
    deleting_for: Option<Duration>,
    timeout: Duration,
    target_phase: &str,
) -> SpaceRequestStep {
    if deleting_for.is_none() && !request.finalizers().iter().any(|f| f == FINALIZER_TOOLCHAIN) {
        return SpaceRequestStep::AddFinalizer;
    }
    let conditions = request.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let Some(ready) = conditions.iter().find(|c| c.type_ == CONDITION_READY) else {
        return SpaceRequestStep::NoReadyCondition(format!(
            "failed to find ConditionReady for SpaceRequest: {}",
            request.name_any()
        ));
    };
    let Some(deleting_for) = deleting_for else { return SpaceRequestStep::Delete };
    if target_phase != PHASE_FAILED && deleting_for > timeout && ready.reason == REASON_UNABLE_TO_TERMINATE {
        return SpaceRequestStep::Fail;
    }
    SpaceRequestStep::Wait
}

/// The SpaceRequest of `target`: labelled with the target, else with its claim (and
/// not made into another target already); the first of the tier by name.
async fn space_request_of(
    requests: &Api<SpaceRequest>,
    target: &DeploymentTarget,
) -> Result<Option<SpaceRequest>, ReconcileError> {
    let mut found_requests = space_requests_of(requests, LABEL_DT, &target.name_any()).await?;
    if found_requests.is_empty()
        && let Some(claim) = target.spec.claim_ref.as_deref().filter(|c| !c.is_empty())
    {
        found_requests = space_requests_of(requests, LABEL_DTC, claim).await?;
        found_requests.retain(|request| !request.labels().contains_key(LABEL_DT));
    }
    found_requests.sort_by_key(ResourceExt::name_any);
    Ok(found_requests.into_iter().next())
}

/// What a target being deleted still waits for.
enum Reclaim {
    /// Nothing (no SpaceRequest, or the class keeps it): the target may go.
    Done,
    /// Its SpaceRequest: the phase to write (None: unchanged) and the error to report.
    Waiting { phase: Option<&'static str>, error: Option<String> },
}

/// With a `Delete` class, takes `target`'s SpaceRequest along (see [`space_request_step`]).
async fn reclaim_space_request(
    ctx: &Context,
    target: &DeploymentTarget,
    namespace: &str,
) -> Result<Reclaim, ReconcileError> {
    let requests = Api::<SpaceRequest>::namespaced(ctx.client.clone(), namespace);
    let Some(mut request) = space_request_of(&requests, target).await? else { return Ok(Reclaim::Done) };
    let class_name = &target.spec.deployment_target_class_name;
    let classes = Api::<DeploymentTargetClass>::all(ctx.client.clone());
    let class = found(classes.get(class_name).await, "read the DeploymentTargetClass")?;
    if reclaim_policy(class_name, class.as_ref()).as_deref() != Ok(RECLAIM_DELETE) {
        return Ok(Reclaim::Done);
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    let deleting_for = |request: &SpaceRequest| {
        request
            .metadata
            .deletion_timestamp
            .as_ref()
            .map(|at| Duration::try_from(now.duration_since(at.0)).unwrap_or(Duration::ZERO))
    };
    let timeout = ctx.settings.space_request_termination_timeout;
    let phase = phase_of_target(target);
    let name = request.name_any();
    let mut step = space_request_step(&request, deleting_for(&request), timeout, phase);
    if step == SpaceRequestStep::AddFinalizer {
        let mut finalizers = request.finalizers().to_vec();
        finalizers.push(FINALIZER_TOOLCHAIN.to_owned());
        // Conditional on the version read: the operator may change the list too.
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": request.resource_version()}});
        let patched = found(
            requests.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await,
            "add the sandbox operator's finalizer to the SpaceRequest",
        )?;
        let Some(patched) = patched else { return Ok(Reclaim::Done) };
        request = patched;
        step = space_request_step(&request, deleting_for(&request), timeout, phase);
    }
    Ok(match step {
        SpaceRequestStep::NoReadyCondition(message) => Reclaim::Waiting { phase: None, error: Some(message) },
        SpaceRequestStep::Delete => {
            deleted(requests.delete(&name, &DeleteParams::default()).await, "delete the target's SpaceRequest")?;
            tracing::info!(tenant.ns = %namespace, target = %target.name_any(), request = %name, "SpaceRequest of a deleted target deleted");
            Reclaim::Waiting { phase: None, error: None }
        }
        SpaceRequestStep::Fail => {
            tracing::warn!(tenant.ns = %namespace, target = %target.name_any(), request = %name, timeout_s = timeout.as_secs(), "SpaceRequest unable to terminate: target Failed");
            Reclaim::Waiting { phase: Some(PHASE_FAILED), error: None }
        }
        SpaceRequestStep::AddFinalizer | SpaceRequestStep::Wait => Reclaim::Waiting { phase: None, error: None },
    })
}

/// What the class says about reclaiming, or why it cannot say.
pub fn reclaim_policy(class_name: &str, class: Option<&DeploymentTargetClass>) -> Result<String, String> {
    let Some(class) = class else {
        return Err(format!("DeploymentTargetClass {class_name} of the DeploymentTarget does not exist"));
    };
    match class.spec.reclaim_policy.as_str() {
        policy @ (RECLAIM_DELETE | RECLAIM_RETAIN) => Ok(policy.to_owned()),
        other => Err(format!(
            "DeploymentTargetClass {class_name} has reclaimPolicy {other:?}; expected {RECLAIM_DELETE} or {RECLAIM_RETAIN}"
        )),
    }
}

async fn reconcile(target: Arc<DeploymentTarget>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let namespace = target.namespace().ok_or(ReconcileError::Incomplete("namespace"))?;
    let targets = Api::<DeploymentTarget>::namespaced(ctx.client.clone(), &namespace);
    let name = target.name_any();
    let has_finalizer = target.finalizers().iter().any(|f| f == FINALIZER_DT);
    if target.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            return Ok(Action::await_change());
        }
        if let Reclaim::Waiting { phase, error } = reclaim_space_request(&ctx, &target, &namespace).await? {
            write_status(&targets, &target, phase, error.as_deref()).await?;
            return Ok(Action::requeue(ctx.settings.reclaim_poll));
        }
        let finalizers: Vec<String> = target.finalizers().iter().filter(|f| *f != FINALIZER_DT).cloned().collect();
        deleted(
            targets
                .patch(&name, &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": finalizers}})))
                .await,
            "remove the target's finalizer",
        )?;
        return Ok(Action::await_change());
    }
    if !has_finalizer {
        let mut finalizers = target.finalizers().to_vec();
        finalizers.push(FINALIZER_DT.to_owned());
        targets
            .patch(&name, &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": finalizers}})))
            .await
            .map_err(|source| ReconcileError::Kube { action: "add the target's finalizer", source })?;
    }
    let class_name = &target.spec.deployment_target_class_name;
    let classes = Api::<DeploymentTargetClass>::all(ctx.client.clone());
    let class = found(classes.get(class_name).await, "read the DeploymentTargetClass")?;
    let policy = reclaim_policy(class_name, class.as_ref());
    let mut phase = None;
    // Only a target that was bound is released: one reserved for a claim that does
    // not exist yet (made before it, as a PersistentVolume can be) waits for it.
    if let (Ok(policy), Some(claim_name)) = (&policy, target.spec.claim_ref.as_deref().filter(|c| !c.is_empty()))
        && policy == RECLAIM_RETAIN
        && phase_of_target(&target) == super::PHASE_BOUND
    {
        let claims = Api::<DeploymentTargetClaim>::namespaced(ctx.client.clone(), &namespace);
        if found(claims.get_metadata(claim_name).await, "read the claim")?.is_none() {
            targets
                .patch(&name, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"claimRef": null}})))
                .await
                .map_err(|source| ReconcileError::Kube { action: "clear the target's claim", source })?;
            phase = Some(PHASE_RELEASED);
        }
    }
    write_status(&targets, &target, phase, policy.as_ref().err().map(String::as_str)).await?;
    Ok(Action::requeue(ctx.settings.resync_interval))
}

/// Writes the target's `ErrorOccurred` condition, and `phase` if given (else the
/// phase is left as it is: the binder writes it too), when they changed.
async fn write_status(
    targets: &Api<DeploymentTarget>,
    target: &DeploymentTarget,
    phase: Option<&str>,
    error: Option<&str>,
) -> Result<(), ReconcileError> {
    let status = target.status.clone().unwrap_or_default();
    let conditions = outcome_conditions(&status.conditions, error);
    let new_phase = phase.filter(|p| status.phase.as_deref() != Some(*p));
    if new_phase.is_none() && conditions == status.conditions {
        return Ok(());
    }
    let mut patch = json!({"status": {"conditions": conditions}});
    if let Some(phase) = new_phase {
        patch["status"]["phase"] = json!(phase);
    }
    deleted(
        targets.patch_status(&target.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await,
        "write the target's status",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Condition, DeploymentTargetClassSpec, SpaceRequestSpec, SpaceRequestStatus};

    const TIMEOUT: Duration = Duration::from_secs(120);

    fn request(finalizer: bool, ready_reason: Option<&str>) -> SpaceRequest {
        let mut request = SpaceRequest::new("dtc-abcde", SpaceRequestSpec::default());
        if finalizer {
            request.metadata.finalizers = Some(vec![FINALIZER_TOOLCHAIN.to_owned()]);
        }
        request.status = Some(SpaceRequestStatus {
            conditions: ready_reason
                .map(|reason| Condition {
                    type_: CONDITION_READY.into(),
                    status: "False".into(),
                    reason: reason.into(),
                    ..Condition::default()
                })
                .into_iter()
                .collect(),
            ..SpaceRequestStatus::default()
        });
        request
    }

    #[test]
    fn a_space_request_gets_the_finalizer_a_ready_report_and_its_deletion_in_that_order() {
        assert_eq!(
            space_request_step(&request(false, Some("Provisioned")), None, TIMEOUT, "Bound"),
            SpaceRequestStep::AddFinalizer
        );
        assert_eq!(
            space_request_step(&request(true, None), None, TIMEOUT, "Bound"),
            SpaceRequestStep::NoReadyCondition("failed to find ConditionReady for SpaceRequest: dtc-abcde".into())
        );
        assert_eq!(
            space_request_step(&request(true, Some("Provisioned")), None, TIMEOUT, "Bound"),
            SpaceRequestStep::Delete
        );
        // Terminating: no finalizer is added any more (the API server refuses it).
        let terminating = request(false, Some("Terminating"));
        assert_eq!(space_request_step(&terminating, Some(Duration::ZERO), TIMEOUT, "Bound"), SpaceRequestStep::Wait);
    }

    #[test]
    fn only_unable_to_terminate_past_the_timeout_fails_the_target_and_only_once() {
        let stuck = request(true, Some(REASON_UNABLE_TO_TERMINATE));
        let just_over = TIMEOUT + Duration::from_millis(1);
        assert_eq!(
            space_request_step(&stuck, Some(TIMEOUT), TIMEOUT, "Bound"),
            SpaceRequestStep::Wait,
            "not yet: strictly after"
        );
        assert_eq!(space_request_step(&stuck, Some(just_over), TIMEOUT, "Bound"), SpaceRequestStep::Fail);
        assert_eq!(space_request_step(&stuck, Some(just_over), TIMEOUT, PHASE_RELEASED), SpaceRequestStep::Fail);
        assert_eq!(
            space_request_step(&stuck, Some(just_over), TIMEOUT, PHASE_FAILED),
            SpaceRequestStep::Wait,
            "Failed already"
        );
        let slow = request(true, Some("Terminating"));
        assert_eq!(
            space_request_step(&slow, Some(TIMEOUT * 10), TIMEOUT, "Bound"),
            SpaceRequestStep::Wait,
            "still terminating"
        );
        let missing = request(true, None);
        assert!(matches!(
            space_request_step(&missing, Some(just_over), TIMEOUT, "Bound"),
            SpaceRequestStep::NoReadyCondition(_)
        ));
    }

    #[test]
    fn a_missing_class_or_unknown_policy_is_an_error() {
        assert!(reclaim_policy("c", None).expect_err("missing").contains("does not exist"));
        let class = |policy: &str| {
            DeploymentTargetClass::new(
                "c",
                DeploymentTargetClassSpec { reclaim_policy: policy.into(), ..Default::default() },
            )
        };
        assert_eq!(reclaim_policy("c", Some(&class("Retain"))), Ok("Retain".to_owned()));
        assert_eq!(reclaim_policy("c", Some(&class("Delete"))), Ok("Delete".to_owned()));
        assert!(reclaim_policy("c", Some(&class("Recycle"))).is_err());
    }
}
