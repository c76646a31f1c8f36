//! GitOpsDeploymentRepositoryCredential reconcile: finalizer, validation of the spec
//! and of the referenced Secret (same namespace only), then the row with its sealed
//! credentials and an operation in one transaction. An invalid spec writes nothing;
//! a missing or invalid Secret stores the row without credentials (so the engine
//! drops credentials the tenant withdrew) and sets the refusal's condition. A
//! rotated Secret has a new `resourceVersion`, which re-seals. Deletion tombstones
//! the row and enqueues; the finalizer goes at once.

use std::sync::Arc;

use gitops_shared::db::credential::{RepositoryCredentialIntent, repository_credential_upsert_in_txn};
use gitops_shared::db::pooled;
use gitops_shared::model::ResourceType;
use gitops_shared::queue::operation_enqueue_in_txn;
use kube::api::Api;
use uuid::Uuid;

use gitops_shared::db::tombstone::TombstoneOf;

use super::credential::{secret_read, tombstone_and_enqueue};
use super::object::{Live, REASON_ACCEPTED, live, remove_finalizer};
use super::tenant::{Tenancy, credential_error, tenant_placed_in_txn};
use super::{Controllers, Next, ReconcileError, Settled, refuse, set_condition};
use crate::api::GitOpsDeploymentRepositoryCredential;
use crate::shard::shard_of;
use crate::validate;
use crate::work_queue::{Key, Kind};

enum Written {
    Stored,
    NoEngine,
    NotOwner,
}

pub(super) async fn reconcile(ctl: &Arc<Controllers>, namespace: &str, name: &str) -> Result<Next, ReconcileError> {
    let key = Key { kind: Kind::RepositoryCredential, namespace: namespace.to_owned(), name: name.to_owned() };
    let api: Api<GitOpsDeploymentRepositoryCredential> = Api::namespaced(ctl.ctx.kube.clone(), namespace);
    if let Some(next) = ctl.refuse_unserved(&api, name, namespace).await? {
        return Ok(next);
    }
    let (object, uid) = match live(&api, name).await? {
        Live::Present(object, uid) => (object, uid),
        Live::Gone => {
            ctl.unrefer(&key);
            return Ok(Next::Done);
        }
        Live::Deleting(object, uid) => {
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
    let shard = shard_of(namespace);
    let healthy_within = ctl.settings.healthy_within;
    let (writer_id, ns_name, sealer) = (ctl.ctx.writer_id.clone(), namespace.to_owned(), ctl.ctx.secrets.clone());
    let mut client = pooled(&ctl.ctx.pool).await?;
    let written = ctl
        .in_txn(&mut client, |txn| {
            let (intent, writer_id, ns_name, sealer) =
                (intent.clone(), writer_id.clone(), ns_name.clone(), sealer.clone());
            Box::pin(async move {
                let (tenant, instance) = match tenant_placed_in_txn(
                    txn,
                    namespace_uid,
                    &ns_name,
                    shard,
                    &writer_id,
                    healthy_within,
                )
                .await?
                {
                    Tenancy::Placed(tenant, instance) => (tenant, instance),
                    Tenancy::NotOwner | Tenancy::Gone => return Ok(Written::NotOwner),
                    Tenancy::NoEngine => return Ok(Written::NoEngine),
                };
                if let Some(id) = repository_credential_upsert_in_txn(txn, &sealer, tenant, &intent)
                    .await
                    .map_err(credential_error)?
                {
                    operation_enqueue_in_txn(txn, instance, tenant, ResourceType::RepositoryCredential, id).await?;
                }
                Ok(Written::Stored)
            })
        })
        .await?;
    drop(client);
    match (written, credentials) {
        (Written::NotOwner, _) => Ok(Next::Done),
        (Written::NoEngine, _) => {
            let message = "no GitOps engine instance is available; retrying";
            set_condition(&api, &object, true, super::REASON_NO_ENGINE, message).await?;
            Ok(Next::Retry(ctl.settings.retry_delay))
        }
        (Written::Stored, Ok(_)) => {
            let message = "the credentials are stored and handed to the GitOps engine";
            set_condition(&api, &object, false, REASON_ACCEPTED, message).await?;
            Ok(Next::Settled(Settled::Ok))
        }
        (Written::Stored, Err(invalid)) => refuse(&api, &object, invalid.reason, &invalid.message).await,
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
