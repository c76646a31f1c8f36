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
//! and enqueues; the finalizer goes at once, unless the writer installed a
//! ServiceAccount for the environment (`createNewServiceAccount`, see
//! `service_account`): then it goes once that is removed, or after
//! `service_account::CLEANUP_LIMIT`. Such an environment stores the installed
//! ServiceAccount's token instead of the Secret's credentials, and its connection
//! condition reports the installation rather than a separate check. A refusal writes
//! nothing: an environment stored before keeps its last valid credentials until the
//! tenant fixes or deletes it.

pub mod connection;
pub mod service_account;

use std::sync::Arc;
use std::time::SystemTime;

use gitops_shared::db::credential::{ManagedEnvironmentIntent, managed_environment_upsert_in_txn};
use gitops_shared::db::managed_environment::{managed_environment_set_expiry_in_txn, managed_environment_token};
use gitops_shared::db::pooled;
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
    let (object, uid) = match open(ctl, &api, Kind::Environment, name, namespace).await? {
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
        Err(invalid) => return refused_secret(ctl, &api, &object, &valid, uid, &invalid).await,
    };
    let kubeconfig = match validate::environment_secret(&secret, &valid.api_url) {
        Ok(kubeconfig) => kubeconfig,
        Err(invalid) => return refused_secret(ctl, &api, &object, &valid, uid, &invalid).await,
    };
    let namespace_uid = ctl.namespace_uid(namespace).await?;
    let create_new_service_account = valid.create_new_service_account;
    let mut intent = valid.into_intent(
        uid,
        name.to_owned(),
        object.metadata.generation.unwrap_or(0),
        secret.metadata.resource_version.clone(),
        kubeconfig,
    );
    // With `createNewServiceAccount`, the stored credentials are a token of an
    // identity installed on the cluster; `expires_at` is that token's expiry.
    let mut expires_at = None;
    if create_new_service_account {
        match service_account_token(ctl, &api, &object, &mut intent).await? {
            Issued::Token(expiry) => expires_at = Some(expiry),
            Issued::Current => {
                let connection = installed_condition(object.metadata.generation);
                let message =
                    "the environment and its ServiceAccount's token are stored and handed to the GitOps engine";
                set_conditions(&api, &object, false, REASON_ACCEPTED, message, Some(connection)).await?;
                return Ok(Next::Settled(Settled::Ok));
            }
            Issued::Ended(next) => return Ok(next),
        }
    } else if let Err(message) = remove_turned_off(ctl, &intent).await? {
        let message = format!("the ServiceAccount installed before could not be removed: {message}");
        set_condition(&api, &object, true, service_account::REASON_SERVICE_ACCOUNT_FAILED, &message).await?;
        return Ok(Next::Retry(ctl.settings.retry_delay));
    }
    let (sealer, stored) = (ctl.ctx.secrets.clone(), intent.clone());
    let written = ctl
        .in_tenant_txn(namespace, namespace_uid, move |txn, tenant, instance| {
            let (intent, sealer) = (stored.clone(), sealer.clone());
            Box::pin(async move {
                let changed =
                    managed_environment_upsert_in_txn(txn, &sealer, tenant, &intent).await.map_err(credential_error)?;
                if let Some(id) = changed {
                    managed_environment_set_expiry_in_txn(txn, id, expires_at).await?;
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
            let (connection, message) = if create_new_service_account {
                (
                    installed_condition(object.metadata.generation),
                    "the environment and its ServiceAccount's token are stored and handed to the GitOps engine",
                )
            } else {
                (
                    connection_condition(ctl, namespace, name, &intent, object.metadata.generation).await,
                    "the environment and its credentials are stored and handed to the GitOps engine",
                )
            };
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

/// What became of the token of a `createNewServiceAccount` environment.
enum Issued {
    /// A new token is in the intent, expiring then.
    Token(SystemTime),
    /// The stored token is for this generation and not due: nothing to write.
    Current,
    /// Refused or failed: the condition says why.
    Ended(Next),
}

/// Installs (or repairs) the identity on the tenant's cluster with the tenant's
/// credentials in `intent` and, when the stored token is due, puts a new token in
/// their place. Only where the egress policy allows contacting `apiURL`.
async fn service_account_token(
    ctl: &Arc<Controllers>,
    api: &Api<GitOpsDeploymentManagedEnvironment>,
    object: &GitOpsDeploymentManagedEnvironment,
    intent: &mut ManagedEnvironmentIntent,
) -> Result<Issued, ReconcileError> {
    if let Err(message) = service_account::allowed(ctl.ctx.connection_check.as_ref(), &intent.api_url) {
        let next = refuse(api, object, service_account::REASON_SERVICE_ACCOUNT_NOT_ALLOWED, &message).await?;
        return Ok(Issued::Ended(next));
    }
    let objects = service_account::Installed::new(intent.resource_uid, &intent.namespaces, intent.cluster_resources);
    let stored = {
        let client = pooled(&ctl.ctx.pool).await?;
        managed_environment_token(&client, intent.resource_uid).await?
    };
    let due = service_account::token_due(stored.as_ref(), intent.generation, ctl.ctx.home.renew_before);
    // What an earlier spec installed that this one does not (namespaces no longer
    // listed, the ClusterRole, an account in another namespace) goes once the new
    // objects are in place, before the new state is stored.
    let leftovers = service_account::installed_for(intent.resource_uid, stored.as_ref())
        .and_then(|old| service_account::leftovers(&old, Some(&objects)));
    let failed = |failure: service_account::Failure| {
        tracing::warn!(
            tenant.ns = %object.metadata.namespace.as_deref().unwrap_or_default(),
            environment = %intent.resource_name,
            error = %failure.detail,
            "installing an environment's ServiceAccount failed"
        );
        failure.message
    };
    // `allowed` above refused a missing policy already.
    let client = match ctl.ctx.connection_check.as_ref() {
        Some(policy) => connection::checked_client(policy, intent).await.map_err(|outcome| outcome.message),
        None => Err("the writer's egress policy allows no destination".to_owned()),
    };
    let result = match client {
        Err(message) => Err(message),
        Ok(client) => match install_replacing(&client, &objects, leftovers.as_ref()).await {
            Err(failure) => Err(failed(failure)),
            Ok(()) if !due => return Ok(Issued::Current),
            Ok(()) => {
                service_account::request_token(&client, &objects, ctl.ctx.home.token_lifetime).await.map_err(failed)
            }
        },
    };
    match result {
        Ok((token, expires_at)) => {
            intent.credentials = service_account::token_credentials(&intent.credentials, token);
            // Every token is a rotation of the stored credentials.
            intent.secret_resource_version = Some(Uuid::new_v4().to_string());
            Ok(Issued::Token(expires_at))
        }
        Err(message) => {
            let message = format!("the ServiceAccount could not be installed or its token requested: {message}");
            set_condition(api, object, true, service_account::REASON_SERVICE_ACCOUNT_FAILED, &message).await?;
            Ok(Issued::Ended(Next::Retry(ctl.settings.retry_delay)))
        }
    }
}

/// Installs `objects`, then removes what an earlier spec installed and this one does not.
async fn install_replacing(
    client: &kube::Client,
    objects: &service_account::Installed,
    leftovers: Option<&(service_account::Installed, bool)>,
) -> Result<(), service_account::Failure> {
    service_account::install(client, objects).await?;
    match leftovers {
        Some((old, account)) => service_account::remove(client, old, *account).await,
        None => Ok(()),
    }
}

/// When `createNewServiceAccount` was turned off: removes what the writer installed
/// for the stored spec, with the tenant's credentials now in `intent`, before the
/// tenant's credentials replace the token. `Err` with the tenant's message when it
/// could not; where the egress policy no longer allows `apiURL`, the objects stay and
/// the operator's log says so.
async fn remove_turned_off(
    ctl: &Arc<Controllers>,
    intent: &ManagedEnvironmentIntent,
) -> Result<Result<(), String>, ReconcileError> {
    let stored = {
        let client = pooled(&ctl.ctx.pool).await?;
        managed_environment_token(&client, intent.resource_uid).await?
    };
    let Some(old) = service_account::installed_for(intent.resource_uid, stored.as_ref()) else { return Ok(Ok(())) };
    if service_account::allowed(ctl.ctx.connection_check.as_ref(), &intent.api_url).is_err() {
        tracing::warn!(environment = %intent.resource_name, "createNewServiceAccount was turned off where the writer may not contact apiURL; the installed objects stay on the cluster");
        return Ok(Ok(()));
    }
    let Some(policy) = ctl.ctx.connection_check.as_ref() else { return Ok(Ok(())) };
    let client = match connection::checked_client(policy, intent).await {
        Ok(client) => client,
        Err(outcome) => return Ok(Err(outcome.message)),
    };
    Ok(service_account::remove(&client, &old, true).await.map_err(|failure| {
        tracing::warn!(environment = %intent.resource_name, error = %failure.detail, "removing an environment's ServiceAccount failed");
        failure.message
    }))
}

/// The connection condition of an environment whose identity the writer installed.
fn installed_condition(generation: Option<i64>) -> Condition {
    Condition {
        type_: CONNECTION_CONDITION.to_owned(),
        status: "True".to_owned(),
        reason: Some(connection::REASON_SUCCEEDED.to_owned()),
        message: Some("the writer installed the ServiceAccount on the cluster and stored its token".to_owned()),
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

/// A refusal for the environment's Secret. When the writer holds a token of a
/// ServiceAccount it installed for the environment, the Secret is what renews it: the
/// condition says the token cannot be renewed (the stored one works until it expires).
async fn refused_secret(
    ctl: &Arc<Controllers>,
    api: &Api<GitOpsDeploymentManagedEnvironment>,
    object: &GitOpsDeploymentManagedEnvironment,
    valid: &validate::ValidEnvironment,
    uid: Uuid,
    invalid: &Invalid,
) -> Result<Next, ReconcileError> {
    if valid.create_new_service_account {
        let stored = {
            let client = pooled(&ctl.ctx.pool).await?;
            managed_environment_token(&client, uid).await?
        };
        if stored.is_some_and(|stored| stored.expires_at.is_some()) {
            let message = format!(
                "the ServiceAccount's token cannot be renewed with the credentials Secret ({}); the stored token \
                 is used until it expires",
                invalid.message
            );
            return refuse(api, object, service_account::REASON_TOKEN_RENEWAL_FAILED, &message).await;
        }
    }
    refused(api, object, invalid).await
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
    if object.spec.create_new_service_account == Some(true)
        && let Err(message) = remove_service_account(ctl, object, uid).await?
    {
        let deleting_since = object.metadata.deletion_timestamp.as_ref().map(|t| t.0.as_second());
        if let Some(left) = service_account::cleanup_time_left(deleting_since, SystemTime::now()) {
            let message = format!("removing the ServiceAccount from the cluster: {message}; retrying");
            set_condition(api, object, true, service_account::REASON_SERVICE_ACCOUNT_FAILED, &message).await?;
            return Ok(Next::Retry(ctl.settings.retry_delay.min(left)));
        }
        tracing::warn!(
            tenant.ns = %namespace,
            environment = %object.metadata.name.as_deref().unwrap_or_default(),
            reason = %message,
            "giving up removing an environment's ServiceAccount; its objects stay on the cluster"
        );
    }
    remove_finalizer(api, object).await?;
    Ok(Next::Settled(Settled::Ok))
}

/// Removes the identity installed for the environment, with the tenant's current
/// credentials; `Err` with the tenant's message when it could not.
async fn remove_service_account(
    ctl: &Arc<Controllers>,
    object: &GitOpsDeploymentManagedEnvironment,
    uid: Uuid,
) -> Result<Result<(), String>, ReconcileError> {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    // A spec the writer refused never had anything installed.
    let Ok(valid) = validate::environment(&object.spec) else { return Ok(Ok(())) };
    if let Err(message) = service_account::allowed(ctl.ctx.connection_check.as_ref(), &valid.api_url) {
        return Ok(Err(message));
    }
    let secret = match secret_read(ctl, &namespace, &valid.credentials_secret).await? {
        Ok(secret) => secret,
        Err(invalid) => return Ok(Err(invalid.message)),
    };
    let kubeconfig = match validate::environment_secret(&secret, &valid.api_url) {
        Ok(kubeconfig) => kubeconfig,
        Err(invalid) => return Ok(Err(invalid.message)),
    };
    let objects = service_account::Installed::new(uid, &valid.namespaces, valid.cluster_resources);
    let intent = valid.into_intent(uid, String::new(), 0, None, kubeconfig);
    let Some(policy) = ctl.ctx.connection_check.as_ref() else { return Ok(Ok(())) };
    let client = match connection::checked_client(policy, &intent).await {
        Ok(client) => client,
        Err(outcome) => return Ok(Err(outcome.message)),
    };
    Ok(service_account::remove(&client, &objects, true).await.map_err(|failure| {
        tracing::warn!(tenant.ns = %namespace, error = %failure.detail, "removing an environment's ServiceAccount failed");
        failure.message
    }))
}
