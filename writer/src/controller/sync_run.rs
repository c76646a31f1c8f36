//! GitOpsDeploymentSyncRun reconcile: finalizer, validation, then — once the named
//! deployment's row exists and is manual — the sync_operation row and its operation
//! in one transaction. A run for an automated deployment is refused with a
//! condition; one that arrives before its deployment waits and is retried.
//! Deletion asks the agent to terminate the sync and releases the finalizer.

use std::sync::Arc;

use gitops_shared::db::application::{SyncTargetRow, application_sync_target};
use gitops_shared::db::pooled;
use gitops_shared::db::sync_operation::{SyncIntent, sync_operation_upsert_in_txn};
use gitops_shared::db::tenant::tenant_lock_in_txn;
use gitops_shared::db::tombstone::TombstoneOf;
use gitops_shared::model::{ResourceType, SyncType};
use gitops_shared::queue::operation_enqueue_in_txn;
use kube::api::Api;

use super::credential::tombstone_and_enqueue;
use super::object::{Live, Opened, REASON_ACCEPTED, open, remove_finalizer};
use super::{Controllers, Next, REASON_REQUESTER_UNVERIFIED, ReconcileError, Settled, refuse, set_condition};
use crate::api::{GitOpsDeployment, GitOpsDeploymentSyncRun};
use crate::shard::{shard_fence_in_txn, shard_of};
use crate::validate;

pub const REASON_DEPLOYMENT_NOT_FOUND: &str = "DeploymentNotFound";
pub const REASON_DEPLOYMENT_AUTOMATED: &str = "DeploymentAutomated";

pub(super) async fn reconcile(ctl: &Arc<Controllers>, namespace: &str, name: &str) -> Result<Next, ReconcileError> {
    let api: Api<GitOpsDeploymentSyncRun> = Api::namespaced(ctl.ctx.kube.clone(), namespace);
    let (object, uid) = match open(ctl, &api, crate::work_queue::Kind::SyncRun, name, namespace).await? {
        Opened::Ended(next) => return Ok(next),
        Opened::Live(Live::Present(object, uid)) => (object, uid),
        Opened::Live(Live::Gone) => return Ok(Next::Done),
        Opened::Live(Live::Deleting(object, uid)) => return delete(ctl, &api, &object, uid, namespace).await,
    };
    let shard = shard_of(namespace);
    let writer_id = ctl.ctx.writer_id.clone();
    let valid = match validate::sync_run(&object.spec) {
        Ok(valid) => valid,
        Err(invalid) => return refuse(&api, &object, invalid.reason, &invalid.message).await,
    };
    let deployments: Api<GitOpsDeployment> = Api::namespaced(ctl.ctx.kube.clone(), namespace);
    let deployment = deployments
        .get_opt(&valid.deployment_name)
        .await
        .map_err(|source| ReconcileError::Kube { action: "read the GitOpsDeployment", source })?;
    let deployment_uid = match deployment.as_ref().map(|d| super::uid(&d.metadata)).transpose()? {
        Some(uid) => uid,
        None => return wait_for_deployment(ctl, &api, &object, &valid.deployment_name).await,
    };
    let target = {
        let client = pooled(&ctl.ctx.pool).await?;
        application_sync_target(&client, deployment_uid).await?
    };
    let Some(target) = target else { return wait_for_deployment(ctl, &api, &object, &valid.deployment_name).await };
    let SyncTargetRow { id: application_id, tenant_id, sync_type, home, .. } = target;
    // Its revision chooses what runs with the home role: the requester must have
    // been checked, as for the deployment.
    let generation = object.metadata.generation.unwrap_or(0);
    if home && !ctl.ctx.allow_unverified_home && !super::deployment::approved(ctl, uid, generation).await? {
        let message = "sync runs of deployments into this namespace need the GitOps service's admission webhook to \
                       check that you could grant its role here, and it did not approve this one";
        return refuse(&api, &object, REASON_REQUESTER_UNVERIFIED, message).await;
    }
    if sync_type == SyncType::Automated {
        let message = format!(
            "GitOpsDeployment {:?} is automated; sync runs are only for manual deployments",
            valid.deployment_name
        );
        return refuse(&api, &object, REASON_DEPLOYMENT_AUTOMATED, &message).await;
    }
    let intent = SyncIntent {
        tenant_id,
        resource_uid: uid,
        resource_name: name.to_owned(),
        generation: object.metadata.generation.unwrap_or(0),
        deployment_name: valid.deployment_name.clone(),
        application_id,
        revision: valid.revision.clone(),
    };
    let mut client = pooled(&ctl.ctx.pool).await?;
    let owner = ctl
        .in_txn(&mut client, |txn| {
            let (intent, writer_id) = (intent.clone(), writer_id.clone());
            Box::pin(async move {
                if !shard_fence_in_txn(txn, shard, &writer_id).await? {
                    return Ok(false);
                }
                let instance = tenant_lock_in_txn(txn, intent.tenant_id).await?;
                if let (Some(id), Some(instance)) = (sync_operation_upsert_in_txn(txn, &intent).await?, instance) {
                    operation_enqueue_in_txn(txn, instance, intent.tenant_id, ResourceType::SyncOperation, id.0)
                        .await?;
                }
                Ok(true)
            })
        })
        .await?;
    drop(client);
    if !owner {
        return Ok(Next::Done);
    }
    set_condition(&api, &object, false, REASON_ACCEPTED, "the sync run is stored and handed to the GitOps engine")
        .await?;
    Ok(Next::Settled(Settled::Ok))
}

async fn wait_for_deployment(
    ctl: &Arc<Controllers>,
    api: &Api<GitOpsDeploymentSyncRun>,
    object: &GitOpsDeploymentSyncRun,
    deployment: &str,
) -> Result<Next, ReconcileError> {
    let message = format!("waiting for GitOpsDeployment {deployment:?} in this namespace");
    set_condition(api, object, true, REASON_DEPLOYMENT_NOT_FOUND, &message).await?;
    Ok(Next::Retry(ctl.settings.retry_delay))
}

/// A deleted SyncRun: its sync is asked to terminate (and re-enqueued) in one
/// transaction under the shard fence, then the finalizer is released.
async fn delete(
    ctl: &Arc<Controllers>,
    api: &Api<GitOpsDeploymentSyncRun>,
    object: &GitOpsDeploymentSyncRun,
    uid: uuid::Uuid,
    namespace: &str,
) -> Result<Next, ReconcileError> {
    let owner = tombstone_and_enqueue(ctl, namespace, uid, TombstoneOf::SyncOperation).await?;
    if owner {
        remove_finalizer(api, object).await?;
        return Ok(Next::Settled(Settled::Ok));
    }
    Ok(Next::Done)
}
