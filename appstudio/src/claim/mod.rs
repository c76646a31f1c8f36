//! The DeploymentTargetClaim binder and the DeploymentTarget reclaimer, modelled on
//! PersistentVolumeClaims and PersistentVolumes. A claim binds the target its
//! `targetName` names, or a matching free one (then `targetName` is set and the claim
//! marked `bound-by-controller`); both become `Bound` and the claim
//! `bind-complete`. Unlike the original, binding also sets the target's `claimRef`,
//! so a statically matched target is reserved on both sides. A claim no target
//! matches is marked for a provisioner (`dt-provisioner: <class>`) and stays
//! `Pending`. A bound claim whose target disappears is `Lost`. Deleting a bound claim
//! releases its target: `Delete` classes delete it, and the claim stays until the
//! target (and the namespace provisioned for it, see [`reclaim`]) is gone; `Retain`
//! classes keep it `Released` with no claim. [`bound_claim_phase`] and
//! [`release_step`] are these rules without I/O.
//!
//! A marked claim is then handed to its class's provisioner ([`provision`]; the
//! dev sandbox's asks for a namespace with a SpaceRequest), and binds the target
//! made for it once there is one.

pub mod matching;
pub mod provision;
pub mod reclaim;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use serde_json::json;

use crate::api::{Condition, DeploymentTarget, DeploymentTargetClaim, DeploymentTargetClass};
use crate::condition::{self, ERROR_OCCURRED, FALSE, TRUE, now_rfc3339};
use crate::context::{Context, ReconcileError, deleted, found};
use crate::names::{ANN_BIND_COMPLETED, ANN_BOUND_BY_CONTROLLER, ANN_DT_PROVISIONER, FINALIZER_BINDER};

pub const PHASE_PENDING: &str = "Pending";
pub const PHASE_BOUND: &str = "Bound";
pub const PHASE_LOST: &str = "Lost";
pub const PHASE_RELEASED: &str = "Released";
pub const PHASE_FAILED: &str = "Failed";
pub const REASON_SUCCESS: &str = "Success";
pub const ALREADY_CLAIMED: &str = "DeploymentTargetClaim wants to claim a DeploymentTarget that is already claimed";
pub const RECLAIM_DELETE: &str = "Delete";
pub const RECLAIM_RETAIN: &str = "Retain";

/// Runs the binder until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static) {
    let config = watcher::Config::default();
    let controller = Controller::new(ctx.served::<DeploymentTargetClaim>(), config.clone());
    let store = controller.store();
    controller
        .watches(ctx.served::<DeploymentTarget>(), config, move |target| claims_of(&store, &target))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| {
            let metrics = ctx.metrics.clone();
            async move {
                metrics.outcome("claim", &result);
                if let Err(error) = result {
                    tracing::debug!(error = %gitops_shared::telemetry::error_chain(&error), "claim reconcile");
                }
            }
        })
        .await;
}

/// The claims of the target's namespace that name it, or that it names, or that wait.
fn claims_of(store: &Store<DeploymentTargetClaim>, target: &DeploymentTarget) -> Vec<ObjectRef<DeploymentTargetClaim>> {
    let name = target.name_any();
    store
        .state()
        .into_iter()
        .filter(|claim| claim.namespace() == target.namespace())
        .filter(|claim| {
            claim.spec.target_name.as_deref() == Some(name.as_str())
                || target.spec.claim_ref.as_deref() == Some(claim.name_any().as_str())
                || phase_of_claim(claim) != PHASE_BOUND
        })
        .map(|claim| ObjectRef::from_obj(claim.as_ref()))
        .collect()
}

fn phase_of_claim(claim: &DeploymentTargetClaim) -> &str {
    claim.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

fn phase_of_target(target: &DeploymentTarget) -> &str {
    target.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

fn error_policy(_: Arc<DeploymentTargetClaim>, error: &ReconcileError, _: Arc<Context>) -> Action {
    tracing::warn!(error = %gitops_shared::telemetry::error_chain(error), "claim reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// The `ErrorOccurred` condition both kinds always carry: False/`Success` after a
/// good reconcile, True/`ErrorOccurred` with the message after a bad one.
pub fn outcome_conditions(old: &[Condition], error: Option<&str>) -> Vec<Condition> {
    let mut conditions = old.to_vec();
    let new = match error {
        None => condition::condition(ERROR_OCCURRED, FALSE, REASON_SUCCESS, ""),
        Some(message) => condition::condition(ERROR_OCCURRED, TRUE, ERROR_OCCURRED, message),
    };
    condition::upsert(&mut conditions, new, &now_rfc3339());
    conditions
}

async fn reconcile(claim: Arc<DeploymentTargetClaim>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let namespace = claim.namespace().ok_or(ReconcileError::Incomplete("namespace"))?;
    let claims = Api::<DeploymentTargetClaim>::namespaced(ctx.client.clone(), &namespace);
    let targets = Api::<DeploymentTarget>::namespaced(ctx.client.clone(), &namespace);
    let name = claim.name_any();
    if claim.metadata.deletion_timestamp.is_some() {
        if !release(&ctx, &claim, &targets).await? {
            // A Delete class: the claim stays until its target is gone (the target's
            // deletion wakes it sooner).
            return Ok(Action::requeue(ctx.settings.reclaim_poll));
        }
        let finalizers: Vec<String> = claim.finalizers().iter().filter(|f| *f != FINALIZER_BINDER).cloned().collect();
        deleted(
            claims
                .patch(&name, &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": finalizers}})))
                .await,
            "remove the claim's finalizer",
        )?;
        return Ok(Action::await_change());
    }
    if !claim.finalizers().iter().any(|f| f == FINALIZER_BINDER) {
        let mut finalizers = claim.finalizers().to_vec();
        finalizers.push(FINALIZER_BINDER.to_owned());
        claims
            .patch(&name, &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": finalizers}})))
            .await
            .map_err(|source| ReconcileError::Kube { action: "add the claim's finalizer", source })?;
    }
    let (phase, mut error) = bind(&claim, &claims, &targets).await?;
    if phase == PHASE_PENDING && error.is_none() {
        error = provision::provision_for(&ctx, &claim).await?;
    }
    let status = claim.status.clone().unwrap_or_default();
    let conditions = outcome_conditions(&status.conditions, error.as_deref());
    if status.phase.as_deref() != Some(phase) || conditions != status.conditions {
        let patch = json!({"status": {"phase": phase, "conditions": conditions}});
        deleted(
            claims.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await,
            "write the claim's status",
        )?;
    }
    Ok(Action::requeue(ctx.settings.resync_interval))
}

/// Binds the claim if it can; returns its phase and the error to report.
async fn bind(
    claim: &DeploymentTargetClaim,
    claims: &Api<DeploymentTargetClaim>,
    targets: &Api<DeploymentTarget>,
) -> Result<(&'static str, Option<String>), ReconcileError> {
    let name = claim.name_any();
    let annotations = claim.annotations();
    if annotations.get(ANN_BIND_COMPLETED).is_some_and(|v| v == "true") {
        let target_name = claim.spec.target_name.clone().unwrap_or_default();
        let target = found(targets.get(&target_name).await, "read the bound DeploymentTarget")?;
        let (phase, error) = bound_claim_phase(&target_name, target.as_ref());
        if let Some(target) = target.filter(|_| phase == PHASE_BOUND) {
            set_target_phase(targets, &target, PHASE_BOUND).await?;
        }
        return Ok((phase, error));
    }
    let list = targets
        .list(&ListParams::default())
        .await
        .map_err(|source| ReconcileError::Kube { action: "list the DeploymentTargets", source })?;
    let chosen = match claim.spec.target_name.as_deref().filter(|t| !t.is_empty()) {
        Some(target_name) => {
            let Some(target) = list.items.iter().find(|t| t.metadata.name.as_deref() == Some(target_name)) else {
                return Ok((PHASE_PENDING, None));
            };
            if target.spec.claim_ref.as_deref().is_some_and(|c| !c.is_empty() && c != name) {
                return Ok((PHASE_PENDING, Some(ALREADY_CLAIMED.to_owned())));
            }
            if !matching::target_matches(claim, target) {
                return Ok((PHASE_PENDING, None));
            }
            (target.clone(), false)
        }
        None => {
            let waits_for_provisioner = annotations.contains_key(ANN_DT_PROVISIONER);
            match matching::choose(claim, &list.items, waits_for_provisioner) {
                Some(target) => (target.clone(), true),
                None => {
                    let class = &claim.spec.deployment_target_class_name;
                    if !class.is_empty() && annotations.get(ANN_DT_PROVISIONER) != Some(class) {
                        let patch = json!({"metadata": {"annotations": {ANN_DT_PROVISIONER: class}}});
                        claims.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(
                            |source| ReconcileError::Kube { action: "mark the claim for provisioning", source },
                        )?;
                    }
                    return Ok((PHASE_PENDING, None));
                }
            }
        }
    };
    let (target, by_controller) = chosen;
    let target_name = target.name_any();
    // Reserve the target for the claim first (the original never did), then the claim.
    targets
        .patch(&target_name, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"claimRef": name}})))
        .await
        .map_err(|source| ReconcileError::Kube { action: "reserve the DeploymentTarget", source })?;
    set_target_phase(targets, &target, PHASE_BOUND).await?;
    let mut annotations = BTreeMap::from([(ANN_BIND_COMPLETED.to_owned(), "true".to_owned())]);
    if by_controller {
        annotations.insert(ANN_BOUND_BY_CONTROLLER.to_owned(), "true".to_owned());
    }
    let patch = json!({"metadata": {"annotations": annotations}, "spec": {"targetName": target_name}});
    claims
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| ReconcileError::Kube { action: "bind the claim", source })?;
    tracing::info!(tenant.ns = %claim.namespace().unwrap_or_default(), claim = %name, target = %target_name, "claim bound");
    Ok((PHASE_BOUND, None))
}

async fn set_target_phase(
    targets: &Api<DeploymentTarget>,
    target: &DeploymentTarget,
    phase: &str,
) -> Result<(), ReconcileError> {
    if phase_of_target(target) == phase {
        return Ok(());
    }
    let patch = json!({"status": {"phase": phase}});
    deleted(
        targets.patch_status(&target.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await,
        "write the DeploymentTarget's phase",
    )
}

/// The phase of a claim whose binding is complete, and the error to report, given
/// its target as it is now: `Bound` while the target lives, `Lost` once it is gone
/// or going.
pub fn bound_claim_phase(target_name: &str, target: Option<&DeploymentTarget>) -> (&'static str, Option<String>) {
    match target {
        None => (PHASE_LOST, Some(format!("DeploymentTarget {target_name} bound to the claim does not exist"))),
        Some(target) if target.metadata.deletion_timestamp.is_some() => {
            (PHASE_LOST, Some(format!("DeploymentTarget {target_name} bound to the claim is being deleted")))
        }
        Some(_) => (PHASE_BOUND, None),
    }
}

/// What deleting a claim does to its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// The claim was not bound, or its target is gone: the claim may go.
    Done,
    /// `Retain` (or a class that says nothing usable): the target stays, without a
    /// claim, `Released`; then the claim goes.
    Keep,
    /// `Delete`: the target is deleted (`delete`: not asked yet; a `Bound` one is
    /// `Released` meanwhile) and the claim waits until it is gone.
    Delete { delete: bool },
}

/// The release step of a claim being deleted, `bound` or not, given its target as
/// it is now and its class's reclaim policy.
pub fn release_step(bound: bool, target: Option<&DeploymentTarget>, policy: &str) -> Release {
    match target {
        Some(target) if bound => match policy {
            RECLAIM_DELETE => Release::Delete { delete: target.metadata.deletion_timestamp.is_none() },
            _ => Release::Keep,
        },
        _ => Release::Done,
    }
}

/// A claim is being deleted: its target is deleted (`Delete` class) or kept
/// `Released` without a claim (`Retain`). Whether the claim may go now.
async fn release(
    ctx: &Context,
    claim: &DeploymentTargetClaim,
    targets: &Api<DeploymentTarget>,
) -> Result<bool, ReconcileError> {
    let bound = claim.annotations().get(ANN_BIND_COMPLETED).is_some_and(|v| v == "true")
        && phase_of_claim(claim) == PHASE_BOUND;
    let Some(target_name) = claim.spec.target_name.clone().filter(|_| bound) else { return Ok(true) };
    let target = found(targets.get(&target_name).await, "read the bound DeploymentTarget")?;
    let policy = match &target {
        Some(target) => {
            let classes = Api::<DeploymentTargetClass>::all(ctx.client.clone());
            let class =
                found(classes.get(&target.spec.deployment_target_class_name).await, "read the DeploymentTargetClass")?;
            class.map(|c| c.spec.reclaim_policy).unwrap_or_default()
        }
        None => String::new(),
    };
    let ns = claim.namespace().unwrap_or_default();
    match (release_step(bound, target.as_ref(), &policy), target) {
        (Release::Done, _) | (_, None) => Ok(true),
        (Release::Delete { delete }, Some(target)) => {
            if delete {
                deleted(
                    targets.delete(&target_name, &DeleteParams::default()).await,
                    "delete the released DeploymentTarget",
                )?;
                tracing::info!(tenant.ns = %ns, claim = %claim.name_any(), target = %target_name, %policy, "target of a deleted claim deleted");
            }
            if phase_of_target(&target) == PHASE_BOUND {
                set_target_phase(targets, &target, PHASE_RELEASED).await?;
            }
            Ok(false)
        }
        (Release::Keep, Some(target)) => {
            let patch = json!({"spec": {"claimRef": null}});
            deleted(
                targets.patch(&target_name, &PatchParams::default(), &Patch::Merge(&patch)).await,
                "clear the released DeploymentTarget's claim",
            )?;
            set_target_phase(targets, &target, PHASE_RELEASED).await?;
            tracing::info!(tenant.ns = %ns, claim = %claim.name_any(), target = %target_name, %policy, "target released");
            Ok(true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DeploymentTargetClaimSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn target(phase: Option<&str>, claim: Option<&str>) -> DeploymentTarget {
        matching::tests::target("dt", "cls", claim, phase)
    }

    fn deleting(mut target: DeploymentTarget) -> DeploymentTarget {
        target.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        target
    }

    /// One claim and its target through their lives: Pending while nothing matches,
    /// Bound to an Available target, Lost when the target goes; deleted, Retain keeps
    /// the target Released, Delete deletes it once and waits until it is gone.
    #[test]
    fn a_claim_and_its_target_walk_through_their_phases() {
        let claim = DeploymentTargetClaim::new(
            "dtc",
            DeploymentTargetClaimSpec { deployment_target_class_name: "cls".into(), target_name: None },
        );
        // Pending: a target of another claim does not match; a provisioned one
        // (Available, reserved) does.
        let other = target(Some(matching::PHASE_AVAILABLE), Some("someone"));
        assert!(matching::choose(&claim, std::slice::from_ref(&other), false).is_none(), "stays Pending");
        let provisioned = target(Some(matching::PHASE_AVAILABLE), Some("dtc"));
        assert!(matching::choose(&claim, std::slice::from_ref(&provisioned), true).is_some(), "binds");

        // Bound while the target lives; Lost once it is going or gone.
        let bound = target(Some(PHASE_BOUND), Some("dtc"));
        assert_eq!(bound_claim_phase("dt", Some(&bound)), (PHASE_BOUND, None));
        let (phase, error) = bound_claim_phase("dt", Some(&deleting(bound.clone())));
        assert_eq!(phase, PHASE_LOST);
        assert_eq!(error.as_deref(), Some("DeploymentTarget dt bound to the claim is being deleted"));
        let (phase, error) = bound_claim_phase("dt", None);
        assert_eq!(phase, PHASE_LOST);
        assert_eq!(error.as_deref(), Some("DeploymentTarget dt bound to the claim does not exist"));

        // Deleting the claim.
        assert_eq!(release_step(true, Some(&bound), RECLAIM_RETAIN), Release::Keep);
        assert_eq!(release_step(true, Some(&bound), ""), Release::Keep, "no usable class: the target is kept");
        assert_eq!(release_step(true, Some(&bound), RECLAIM_DELETE), Release::Delete { delete: true });
        assert_eq!(
            release_step(true, Some(&deleting(bound.clone())), RECLAIM_DELETE),
            Release::Delete { delete: false },
            "asked once, then waited for"
        );
        assert_eq!(release_step(true, None, RECLAIM_DELETE), Release::Done, "the target is gone: the claim goes");
        assert_eq!(release_step(false, Some(&bound), RECLAIM_DELETE), Release::Done, "an unbound claim owns nothing");
    }
}
