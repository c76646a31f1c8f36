//! GitOpsDeployment reconcile: finalizer, validation, then the intent — tenant
//! (placed on first use), application row and operation — in one transaction under
//! the tenant's row lock, where the quota is counted. A deployment that names no
//! environment goes to the tenant's home environment (its own namespace, through
//! credentials scoped to it: see `home`). An invalid spec gets a
//! condition and writes nothing. Deletion tombstones the row and enqueues; the
//! finalizer goes at once, or once the agent confirmed the prune when the tenant
//! asked to wait (the wait-for-pruning annotation, or the original service's
//! `resources-finalizer.managed-gitops.redhat.com`, released with ours).

use std::sync::Arc;

use gitops_shared::db::application::{
    application_active_generation, application_count_others_in_txn, application_row_state, application_upsert_in_txn,
};
use gitops_shared::db::managed_environment::managed_environment_by_name;
use gitops_shared::db::pooled;
use gitops_shared::model::{ResourceType, RowState};
use gitops_shared::queue::operation_enqueue_in_txn;
use kube::api::Api;
use uuid::Uuid;

use gitops_shared::db::tombstone::TombstoneOf;

use super::credential::tombstone_and_enqueue;
use super::home::{Home, home_environment};
use super::object::{Live, Opened, REASON_ACCEPTED, RESOURCES_FINALIZER, open, remove_finalizer};
use super::tenant::Placed;
use super::{Controllers, Next, ReconcileError, Settled, refuse, set_condition};
use crate::api::GitOpsDeployment;
use crate::validate::{self, Invalid, environment_resolved};
use gitops_shared::db::placement::Unplaced;

/// The annotation by which a tenant asks the finalizer to stay until Argo CD pruned.
pub const WAIT_FOR_PRUNING: &str = "managed-gitops.redhat.com/wait-for-pruning";
pub const REASON_QUOTA_EXCEEDED: &str = "QuotaExceeded";
pub const REASON_NO_ENGINE: &str = "NoEngineInstanceAvailable";
/// A home deployment whose requester could not be checked (no admission webhook).
pub const REASON_REQUESTER_UNVERIFIED: &str = "RequesterUnverified";
/// The home role or namespace is missing.
pub const REASON_HOME_UNAVAILABLE: &str = "HomeIdentityUnavailable";

/// How long a home deployment refused for an unverified requester waits before it
/// is looked at again (the webhook may have been registered meanwhile).
const UNVERIFIED_RETRY: std::time::Duration = std::time::Duration::from_secs(60);

/// What the intent transaction decided.
enum Stored {
    Stored,
    Quota(i64),
}

pub(super) async fn reconcile(ctl: &Arc<Controllers>, namespace: &str, name: &str) -> Result<Next, ReconcileError> {
    let api: Api<GitOpsDeployment> = Api::namespaced(ctl.ctx.kube.clone(), namespace);
    let (object, uid) = match open(ctl, &api, crate::work_queue::Kind::Deployment, name, namespace).await? {
        Opened::Ended(next) => return Ok(next),
        Opened::Live(Live::Present(object, uid)) => (object, uid),
        Opened::Live(Live::Gone) => return Ok(Next::Done),
        Opened::Live(Live::Deleting(object, uid)) => return delete(ctl, &api, &object, uid).await,
    };
    let generation = object.metadata.generation;
    let valid = match validate::deployment(&object.spec) {
        Ok(valid) => valid,
        Err(invalid) => return invalid_condition(&api, &object, &invalid).await,
    };
    let namespace_uid = ctl.namespace_uid(namespace).await?;
    let environment_id = match &valid.environment {
        None => {
            if let Err(invalid) = validate::home_destination(&valid, namespace) {
                return invalid_condition(&api, &object, &invalid).await;
            }
            if !ctl.ctx.allow_unverified_home && !approved(ctl, uid, generation.unwrap_or(0)).await? {
                return unverified(ctl, &api, &object, uid).await;
            }
            match home_environment(ctl, namespace, namespace_uid).await? {
                Home::Ready(id) => id,
                Home::NotOwner | Home::Gone | Home::NotServed => return Ok(Next::Done),
                Home::NoEngine(why) => return no_engine(&api, &object, why, ctl.settings.retry_delay).await,
                Home::Unavailable(problem) => {
                    tracing::warn!(tenant.ns = %namespace, %problem, "home deployment waits for the home identity");
                    let message = "the GitOps service cannot act in this namespace now (its home identity is unavailable); retrying";
                    set_condition(&api, &object, true, REASON_HOME_UNAVAILABLE, message).await?;
                    return Ok(Next::Retry(ctl.settings.retry_delay));
                }
            }
        }
        Some(env) => {
            let client = pooled(&ctl.ctx.pool).await?;
            let found = managed_environment_by_name(&client, namespace_uid, env).await?;
            match environment_resolved(env, found.map(|id| validate::EnvironmentRef { id })) {
                Ok(id) => id,
                Err(invalid) => return invalid_condition(&api, &object, &invalid).await,
            }
        }
    };
    let wait = wait_for_pruning(&object);
    let intent =
        valid.into_intent(uid, name.to_owned(), generation.unwrap_or(0), Some(environment_id), namespace, wait);
    let settings = ctl.settings;
    let written = ctl
        .in_tenant_txn(namespace, namespace_uid, move |txn, tenant, instance| {
            let intent = intent.clone();
            Box::pin(async move {
                let count = application_count_others_in_txn(txn, tenant, intent.resource_uid).await?;
                if count >= settings.max_deployments {
                    return Ok(Stored::Quota(count));
                }
                if let Some(id) = application_upsert_in_txn(txn, tenant, &intent).await? {
                    operation_enqueue_in_txn(txn, instance, tenant, ResourceType::Application, id.0).await?;
                }
                Ok(Stored::Stored)
            })
        })
        .await?;
    match written {
        Placed::NotOwner | Placed::Gone => Ok(Next::Done),
        Placed::Stored(Stored::Stored) => {
            set_condition(
                &api,
                &object,
                false,
                REASON_ACCEPTED,
                "the deployment is stored and handed to the GitOps engine",
            )
            .await?;
            Ok(Next::Settled(Settled::Ok))
        }
        Placed::Stored(Stored::Quota(count)) => {
            let message = format!(
                "this namespace has {count} GitOpsDeployments; at most {} are allowed",
                settings.max_deployments
            );
            set_condition(&api, &object, true, REASON_QUOTA_EXCEEDED, &message).await?;
            Ok(Next::Retry(settings.retry_delay))
        }
        Placed::NoEngine(why) => no_engine(&api, &object, why, settings.retry_delay).await,
    }
}

/// Whether the admission webhook approved the object at `generation` after checking
/// who asked for it.
pub(super) async fn approved(ctl: &Arc<Controllers>, uid: Uuid, generation: i64) -> Result<bool, ReconcileError> {
    let client = pooled(&ctl.ctx.pool).await?;
    Ok(gitops_shared::db::admission_approval::admission_approval_exists(&client, uid, generation).await?)
}

/// A home deployment while nobody checks who asked for it: refused, unless it was
/// stored before (it keeps running as stored; the new generation is not applied).
async fn unverified(
    ctl: &Arc<Controllers>,
    api: &Api<GitOpsDeployment>,
    object: &GitOpsDeployment,
    uid: Uuid,
) -> Result<Next, ReconcileError> {
    let stored: Option<i64> = {
        let client = pooled(&ctl.ctx.pool).await?;
        application_active_generation(&client, uid).await?
    };
    let message = match stored {
        Some(generation) if Some(generation) == object.metadata.generation => {
            // Stored as it is: nothing new to apply, and nothing to refuse.
            return Ok(Next::Settled(Settled::Ok));
        }
        Some(generation) => format!(
            "deployments into this namespace need the GitOps service's admission webhook to check who asks for them, \
             and it did not check this change: it is not applied (generation {generation} keeps running)"
        ),
        None => "deployments into this namespace need the GitOps service's admission webhook to check who asks for \
                 them, and it did not check this one: ask the operator whether the webhook is installed, then change \
                 the deployment's spec (or create it again) so that it is checked"
            .to_owned(),
    };
    set_condition(api, object, true, REASON_REQUESTER_UNVERIFIED, &message).await?;
    let reference = crate::metrics::ObjectRef {
        kind: crate::work_queue::Kind::Deployment,
        namespace: object.metadata.namespace.clone().unwrap_or_default(),
        name: object.metadata.name.clone().unwrap_or_default(),
    };
    ctl.ctx.metrics.validation_failed(reference, object.metadata.generation, REASON_REQUESTER_UNVERIFIED);
    Ok(Next::Retry(UNVERIFIED_RETRY))
}

async fn no_engine(
    api: &Api<GitOpsDeployment>,
    object: &GitOpsDeployment,
    why: Unplaced,
    retry: std::time::Duration,
) -> Result<Next, ReconcileError> {
    set_condition(api, object, true, REASON_NO_ENGINE, why.message()).await?;
    Ok(Next::Retry(retry))
}

async fn invalid_condition(
    api: &Api<GitOpsDeployment>,
    object: &GitOpsDeployment,
    invalid: &Invalid,
) -> Result<Next, ReconcileError> {
    refuse(api, object, invalid.reason, &invalid.message).await
}

fn wait_for_pruning(object: &GitOpsDeployment) -> bool {
    object.metadata.annotations.as_ref().and_then(|a| a.get(WAIT_FOR_PRUNING)).is_some_and(|v| v == "true")
        || object.metadata.finalizers.as_ref().is_some_and(|f| f.iter().any(|f| f == RESOURCES_FINALIZER))
}

async fn delete(
    ctl: &Arc<Controllers>,
    api: &Api<GitOpsDeployment>,
    object: &GitOpsDeployment,
    uid: Uuid,
) -> Result<Next, ReconcileError> {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    if !tombstone_and_enqueue(ctl, &namespace, uid, TombstoneOf::Application).await? {
        return Ok(Next::Done);
    }
    let client = pooled(&ctl.ctx.pool).await?;
    let state = application_row_state(&client, uid).await?;
    drop(client);
    let pruned = matches!(state, None | Some(RowState::Deleted));
    if wait_for_pruning(object) && !pruned {
        return Ok(Next::Retry(ctl.settings.prune_poll));
    }
    remove_finalizer(api, object).await?;
    Ok(Next::Settled(Settled::Ok))
}
