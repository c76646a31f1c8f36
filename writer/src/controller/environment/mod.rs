//! GitOpsDeploymentManagedEnvironment reconcile: finalizer, validation of the spec
//! and of the kubeconfig in the referenced Secret (same namespace only), then the
//! environment row, its sealed cluster credential and an operation in one
//! transaction. Then, after the commit, the optional connection check
//! (`crate::controller::connection`): the writer contacts `apiURL` only when the operator turned
//! checks on and its allow/deny lists allow it, and the
//! `ConnectionInitializationSucceeded` condition reports the outcome (disabled,
//! denied, failed, unauthorized or succeeded); a failed check never undoes or
//! prevents storing the environment. When the environment is
//! stored, changed or deleted, the namespace's GitOpsDeployments are queued again so
//! those that name it pick it up (or learn it is gone). Deletion tombstones the row
//! and enqueues; the finalizer goes at once. A refusal writes nothing: an
//! environment stored before keeps its last valid credentials until the tenant
//! fixes or deletes it.

pub mod connection;

use std::sync::Arc;

use gitops_shared::db::credential::{ManagedEnvironmentIntent, managed_environment_upsert_in_txn};
use gitops_shared::model::ResourceType;
use gitops_shared::queue::operation_enqueue_in_txn;
use kube::api::Api;
use uuid::Uuid;

use gitops_shared::db::tombstone::TombstoneOf;

use super::credential::{secret_read, tombstone_and_enqueue};
use super::object::{Live, Opened, REASON_ACCEPTED, now_rfc3339, open, remove_finalizer};
use super::tenant::{Placed, credential_error};
use super::{Controllers, Next, ReconcileError, Settled, refuse, set_condition, set_conditions};
use crate::api::{Condition, GitOpsDeploymentManagedEnvironment};
use crate::controller::connection::connection_check;
use crate::validate::{self, Invalid};
use crate::work_queue::{Key, Kind};

/// The credentials Secret does not exist in the environment's namespace.
pub const REASON_SECRET_NOT_FOUND: &str = "SecretNotFound";
/// The condition about reaching the environment's API server.
pub const CONNECTION_CONDITION: &str = "ConnectionInitializationSucceeded";
/// Its reason while connection checks are off (the default); the others are in
/// `crate::controller::connection`.
pub use crate::controller::connection::REASON_CONNECTION_CHECK_DISABLED;

pub(super) async fn reconcile(ctl: &Arc<Controllers>, namespace: &str, name: &str) -> Result<Next, ReconcileError> {
    let key = Key { kind: Kind::Environment, namespace: namespace.to_owned(), name: name.to_owned() };
    let api: Api<GitOpsDeploymentManagedEnvironment> = Api::namespaced(ctl.ctx.kube.clone(), namespace);
    let (object, uid) = match open(ctl, &api, name, namespace).await? {
        Opened::Ended(next) => return Ok(next),
        Opened::Live(Live::Present(object, uid)) => (object, uid),
        Opened::Live(Live::Gone) => {
            ctl.unrefer(&key);
            return Ok(Next::Done);
        }
        Opened::Live(Live::Deleting(object, uid)) => {
            ctl.unrefer(&key);
            return delete(ctl, &api, &object, uid).await;
        }
    };
    let valid = match validate::environment(&object.spec) {
        Ok(valid) => valid,
        Err(invalid) => return refused(&api, &object, &invalid).await,
    };
    if !ctl.ctx.api_url_allow_private
        && let Err(invalid) = validate::public_api_url("spec.apiURL", &valid.api_url)
    {
        return refused(&api, &object, &invalid).await;
    }
    ctl.refer(key, &valid.credentials_secret);
    let secret = match secret_read(ctl, namespace, &valid.credentials_secret).await? {
        Ok(secret) => secret,
        Err(invalid) => return refused(&api, &object, &invalid).await,
    };
    let kubeconfig = match validate::environment_secret(&secret, &valid.api_url) {
        Ok(kubeconfig) => kubeconfig,
        Err(invalid) => return refused(&api, &object, &invalid).await,
    };
    let namespace_uid = ctl.namespace_uid(namespace).await?;
    let intent = valid.into_intent(
        uid,
        name.to_owned(),
        object.metadata.generation.unwrap_or(0),
        secret.metadata.resource_version.clone(),
        kubeconfig,
    );
    let (sealer, stored) = (ctl.ctx.secrets.clone(), intent.clone());
    let written = ctl
        .in_tenant_txn(namespace, namespace_uid, move |txn, tenant, instance| {
            let (intent, sealer) = (stored.clone(), sealer.clone());
            Box::pin(async move {
                let changed =
                    managed_environment_upsert_in_txn(txn, &sealer, tenant, &intent).await.map_err(credential_error)?;
                if let Some(id) = changed {
                    operation_enqueue_in_txn(txn, instance, tenant, ResourceType::ManagedEnvironment, id.0).await?;
                }
                Ok(changed.is_some())
            })
        })
        .await?;
    match written {
        Placed::NotOwner | Placed::Gone => Ok(Next::Done),
        Placed::Stored(changed) => {
            if changed {
                ctl.deployments_again(namespace);
            }
            let connection = connection_condition(ctl, namespace, name, &intent, object.metadata.generation).await;
            let message = "the environment and its credentials are stored and handed to the GitOps engine";
            set_conditions(&api, &object, false, REASON_ACCEPTED, message, Some(connection)).await?;
            Ok(Next::Settled(Settled::Ok))
        }
        Placed::NoEngine(why) => {
            set_condition(&api, &object, true, super::REASON_NO_ENGINE, why.message()).await?;
            Ok(Next::Retry(ctl.settings.retry_delay))
        }
    }
}

/// The connection check's outcome as a condition; logged for the operator with the
/// error chain, which the tenant does not see.
async fn connection_condition(
    ctl: &Controllers,
    namespace: &str,
    name: &str,
    intent: &ManagedEnvironmentIntent,
    generation: Option<i64>,
) -> Condition {
    let outcome = connection_check(ctl.ctx.connection_check.as_ref(), intent).await;
    if ctl.ctx.connection_check.is_some() {
        tracing::info!(
            tenant.ns = %namespace,
            environment = %name,
            reason = outcome.reason,
            error = outcome.detail.as_deref().unwrap_or(""),
            "environment connection check"
        );
    }
    Condition {
        type_: CONNECTION_CONDITION.to_owned(),
        status: outcome.status.to_owned(),
        reason: Some(outcome.reason.to_owned()),
        message: Some(outcome.message),
        last_transition_time: Some(now_rfc3339()),
        observed_generation: generation,
    }
}

/// Sets the refusal's condition; nothing is written. A Secret event or an edit
/// queues the environment again.
async fn refused(
    api: &Api<GitOpsDeploymentManagedEnvironment>,
    object: &GitOpsDeploymentManagedEnvironment,
    invalid: &Invalid,
) -> Result<Next, ReconcileError> {
    refuse(api, object, invalid.reason, &invalid.message).await
}

async fn delete(
    ctl: &Arc<Controllers>,
    api: &Api<GitOpsDeploymentManagedEnvironment>,
    object: &GitOpsDeploymentManagedEnvironment,
    uid: Uuid,
) -> Result<Next, ReconcileError> {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    if !tombstone_and_enqueue(ctl, &namespace, uid, TombstoneOf::ManagedEnvironment).await? {
        return Ok(Next::Done);
    }
    ctl.deployments_again(&namespace);
    remove_finalizer(api, object).await?;
    Ok(Next::Settled(Settled::Ok))
}
