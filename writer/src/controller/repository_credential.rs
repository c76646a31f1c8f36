//! GitOpsDeploymentRepositoryCredential reconcile: finalizer, validation of the spec
//! and of the referenced Secret (same namespace only), then the row with its sealed
//! credentials and an operation in one transaction. An invalid spec writes nothing;
//! a missing or invalid Secret stores the row without credentials (so the engine
//! drops credentials the tenant withdrew) and sets the refusal's condition. A
//! rotated Secret has a new `resourceVersion`, which re-seals. Stored credentials are
//! then validated against the repository when the operator turned that on
//! ([`super::repository_check`]; again every 10 minutes). Deletion tombstones the row
//! and enqueues; the finalizer goes at once.

use std::sync::Arc;

use gitops_shared::db::credential::{RepositoryCredentialIntent, repository_credential_upsert_in_txn};
use gitops_shared::model::ResourceType;
use gitops_shared::queue::operation_enqueue_in_txn;
use kube::api::Api;
use uuid::Uuid;

use gitops_shared::db::tombstone::TombstoneOf;

use super::credential::{secret_read, tombstone_and_enqueue};
use super::object::{Live, Opened, REASON_ACCEPTED, open, remove_finalizer};
use super::tenant::{Placed, credential_error};
use super::{Controllers, Next, ReconcileError, Settled, refuse, repository_check, set_condition, set_conditions};
use crate::api::GitOpsDeploymentRepositoryCredential;
use crate::validate;
use crate::work_queue::{Key, Kind};

pub(super) async fn reconcile(ctl: &Arc<Controllers>, namespace: &str, name: &str) -> Result<Next, ReconcileError> {
    let key = Key { kind: Kind::RepositoryCredential, namespace: namespace.to_owned(), name: name.to_owned() };
    let api: Api<GitOpsDeploymentRepositoryCredential> = Api::namespaced(ctl.ctx.kube.clone(), namespace);
    let (object, uid) = match open(ctl, &api, Kind::RepositoryCredential, name, namespace).await? {
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
    let valid = match validate::repository_credential(&object.spec) {
        Ok(valid) => valid,
        Err(invalid) => {
            return refuse(&api, &object, invalid.reason, &invalid.message).await;
        }
    };
    ctl.refer(key, &valid.secret);
    let (secret_resource_version, credentials) = match secret_read(ctl, namespace, &valid.secret).await? {
        Err(invalid) => (None, Err(invalid)),
        Ok(secret) => (secret.metadata.resource_version.clone(), validate::repository_secret(&secret)),
    };
    let namespace_uid = ctl.namespace_uid(namespace).await?;
    let intent = RepositoryCredentialIntent {
        resource_uid: uid,
        resource_name: name.to_owned(),
        generation: object.metadata.generation.unwrap_or(0),
        repo_url: valid.repository,
        secret_name: valid.secret,
        secret_resource_version,
        credentials: credentials.as_ref().ok().cloned(),
    };
    let sealer = ctl.ctx.secrets.clone();
    let written = ctl
        .in_tenant_txn(namespace, namespace_uid, move |txn, tenant, instance| {
            let (intent, sealer) = (intent.clone(), sealer.clone());
            Box::pin(async move {
                if let Some(id) = repository_credential_upsert_in_txn(txn, &sealer, tenant, &intent)
                    .await
                    .map_err(credential_error)?
                {
                    operation_enqueue_in_txn(txn, instance, tenant, ResourceType::RepositoryCredential, id.0).await?;
                }
                Ok(())
            })
        })
        .await?;
    match (written, credentials) {
        (Placed::NotOwner | Placed::Gone, _) => Ok(Next::Done),
        (Placed::NoEngine(why), _) => {
            set_condition(&api, &object, true, super::REASON_NO_ENGINE, why.message()).await?;
            Ok(Next::Retry(ctl.settings.retry_delay))
        }
        (Placed::Stored(()), Ok(credentials)) => {
            let settings = ctl.ctx.repository_check.as_ref();
            let validation = repository_check::validate(settings, &object.spec.repository, &credentials).await;
            if let Some(detail) = &validation.detail {
                tracing::debug!(
                    tenant.ns = %namespace,
                    object = %name,
                    reason = validation.credential.1,
                    git.stderr = %detail,
                    "repository validated"
                );
            }
            let now = super::object::now_rfc3339();
            let conditions = validation.conditions(object.metadata.generation, &now);
            let message = "the credentials are stored and handed to the GitOps engine";
            set_conditions(&api, &object, false, REASON_ACCEPTED, message, conditions).await?;
            match settings {
                Some(settings) => Ok(Next::Revisit(settings.revalidate_every)),
                None => Ok(Next::Settled(Settled::Ok)),
            }
        }
        (Placed::Stored(()), Err(invalid)) => {
            // An earlier validation no longer speaks of these credentials.
            let not_validated = repository_check::Validation::not_validated()
                .conditions(object.metadata.generation, &super::object::now_rfc3339());
            set_conditions(&api, &object, true, invalid.reason, &invalid.message, not_validated).await?;
            Ok(Next::Settled(Settled::Invalid(invalid.reason)))
        }
    }
}

async fn delete(
    ctl: &Arc<Controllers>,
    api: &Api<GitOpsDeploymentRepositoryCredential>,
    object: &GitOpsDeploymentRepositoryCredential,
    uid: Uuid,
) -> Result<Next, ReconcileError> {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    if !tombstone_and_enqueue(ctl, &namespace, uid, TombstoneOf::RepositoryCredential).await? {
        return Ok(Next::Done);
    }
    remove_finalizer(api, object).await?;
    Ok(Next::Settled(Settled::Ok))
}
