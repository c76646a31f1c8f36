//! The DeploymentTarget reclaimer: every target carries the finalizer
//! `dt.appstudio.redhat.com/finalizer` (so a claim's release can still find it), a
//! target of a `Retain` class whose claim is gone is `Released` and free of it, and a
//! class that is missing or has an unknown reclaim policy is reported on the target
//! (the original ignored a missing class silently). A target being deleted whose
//! class says `Delete` takes its SpaceRequest (a provisioned namespace) along and
//! goes once that is gone.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::json;

use super::provision::{LABEL_DT, LABEL_DTC, space_requests_of};
use super::{PHASE_RELEASED, RECLAIM_DELETE, RECLAIM_RETAIN, outcome_conditions};
use crate::api::{DeploymentTarget, DeploymentTargetClaim, DeploymentTargetClass, SpaceRequest};
use crate::context::{Context, ReconcileError, deleted, found};
use crate::names::FINALIZER_DT;

/// Runs the reclaimer until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static) {
    let config = watcher::Config::default();
    let controller = Controller::new(ctx.served::<DeploymentTarget>(), config.clone());
    let store = controller.store();
    controller
        .watches(ctx.served::<DeploymentTargetClaim>(), config, move |claim| {
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
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| {
            let metrics = ctx.metrics.clone();
            async move {
                metrics.reconciled("target", result.is_err());
                if let Err(error) = result {
                    tracing::debug!(error = %gitops_shared::telemetry::error_chain(&error), "target reconcile");
                }
            }
        })
        .await;
}

fn error_policy(_: Arc<DeploymentTarget>, error: &ReconcileError, _: Arc<Context>) -> Action {
    tracing::warn!(error = %gitops_shared::telemetry::error_chain(error), "target reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// How often a target being deleted looks whether its SpaceRequest is gone.
const SPACE_REQUEST_POLL: Duration = Duration::from_secs(2);

/// Whether `target` (being deleted) still has a SpaceRequest to wait for: with a
/// `Delete` class, its SpaceRequest (labelled with the target, else with its claim)
/// is deleted and waited for; with `Retain`, or none, there is nothing to wait for.
async fn space_request_remains(
    ctx: &Context,
    target: &DeploymentTarget,
    namespace: &str,
) -> Result<bool, ReconcileError> {
    let requests = Api::<SpaceRequest>::namespaced(ctx.client.clone(), namespace);
    let mut found_requests = space_requests_of(&requests, LABEL_DT, &target.name_any()).await?;
    if found_requests.is_empty()
        && let Some(claim) = target.spec.claim_ref.as_deref().filter(|c| !c.is_empty())
    {
        // Only those not made into another target already.
        found_requests = space_requests_of(&requests, LABEL_DTC, claim).await?;
        found_requests.retain(|request| !request.labels().contains_key(LABEL_DT));
    }
    if found_requests.is_empty() {
        return Ok(false);
    }
    let class_name = &target.spec.deployment_target_class_name;
    let classes = Api::<DeploymentTargetClass>::all(ctx.client.clone());
    let class = found(classes.get(class_name).await, "read the DeploymentTargetClass")?;
    if reclaim_policy(class_name, class.as_ref()).as_deref() != Ok(RECLAIM_DELETE) {
        return Ok(false);
    }
    for request in found_requests.iter().filter(|r| r.metadata.deletion_timestamp.is_none()) {
        deleted(
            requests.delete(&request.name_any(), &DeleteParams::default()).await,
            "delete the target's SpaceRequest",
        )?;
    }
    Ok(true)
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
        // A namespace provisioned for it goes with it when its class says Delete;
        // the target waits until the SpaceRequest is gone.
        if has_finalizer && space_request_remains(&ctx, &target, &namespace).await? {
            return Ok(Action::requeue(SPACE_REQUEST_POLL));
        }
        if has_finalizer {
            let finalizers: Vec<String> = target.finalizers().iter().filter(|f| *f != FINALIZER_DT).cloned().collect();
            deleted(
                targets
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"metadata": {"finalizers": finalizers}})),
                    )
                    .await,
                "remove the target's finalizer",
            )?;
        }
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
    let mut phase = target.status.as_ref().and_then(|s| s.phase.clone());
    if let (Ok(policy), Some(claim_name)) = (&policy, target.spec.claim_ref.as_deref().filter(|c| !c.is_empty()))
        && policy == RECLAIM_RETAIN
    {
        let claims = Api::<DeploymentTargetClaim>::namespaced(ctx.client.clone(), &namespace);
        if found(claims.get_metadata(claim_name).await, "read the claim")?.is_none() {
            targets
                .patch(&name, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"claimRef": null}})))
                .await
                .map_err(|source| ReconcileError::Kube { action: "clear the target's claim", source })?;
            phase = Some(PHASE_RELEASED.to_owned());
        }
    }
    let status = target.status.clone().unwrap_or_default();
    let conditions = outcome_conditions(&status.conditions, policy.as_ref().err().map(String::as_str));
    if phase != status.phase || conditions != status.conditions {
        let patch = json!({"status": {"phase": phase, "conditions": conditions}});
        deleted(
            targets.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await,
            "write the target's status",
        )?;
    }
    Ok(Action::requeue(ctx.settings.resync_interval))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DeploymentTargetClassSpec;

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
