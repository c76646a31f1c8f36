//! What the controllers do the same way: the two credential-bearing kinds
//! (GitOpsDeploymentManagedEnvironment and GitOpsDeploymentRepositoryCredential)
//! read the Secret they name (same namespace only; a missing one is a refusal the
//! tenant can read), and every kind, on deletion, tombstones its row and enqueues an
//! operation for the tenant's engine in one transaction under the shard fence.

use std::sync::Arc;

use gitops_shared::db::pooled;
use gitops_shared::db::tombstone::{TombstoneOf, resource_tombstone_in_txn};
use gitops_shared::queue::operation_enqueue_in_txn;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use uuid::Uuid;

use super::environment::REASON_SECRET_NOT_FOUND;
use super::{Controllers, ReconcileError};
use crate::shard::{shard_fence_in_txn, shard_of};
use crate::validate::Invalid;

/// The Secret `name` in `namespace`; a missing one is `Err(Invalid)` with
/// `REASON_SECRET_NOT_FOUND`.
pub(super) async fn secret_read(
    ctl: &Arc<Controllers>,
    namespace: &str,
    name: &str,
) -> Result<Result<Secret, Invalid>, ReconcileError> {
    let secrets: Api<Secret> = Api::namespaced(ctl.ctx.kube.clone(), namespace);
    let secret = secrets
        .get_opt(name)
        .await
        .map_err(|source| ReconcileError::Kube { action: "read the credentials Secret", source })?;
    Ok(secret.ok_or_else(|| {
        Invalid::new(REASON_SECRET_NOT_FOUND, format!("the Secret {name:?} does not exist in this namespace"))
    }))
}

/// Tombstones the row of resource `uid` and enqueues its operation for the tenant's
/// engine, when this writer owns the namespace's shard. `false` when it does not
/// (nothing written).
pub(super) async fn tombstone_and_enqueue(
    ctl: &Arc<Controllers>,
    namespace: &str,
    uid: Uuid,
    of: TombstoneOf,
) -> Result<bool, ReconcileError> {
    let shard = shard_of(namespace);
    let writer_id = ctl.ctx.writer_id.clone();
    let mut client = pooled(&ctl.ctx.pool).await?;
    let owner = ctl
        .in_txn(&mut client, |txn| {
            let writer_id = writer_id.clone();
            Box::pin(async move {
                if !shard_fence_in_txn(txn, shard, &writer_id).await? {
                    return Ok(false);
                }
                if let Some(row) = resource_tombstone_in_txn(txn, of, uid).await?
                    && let Some(instance) = row.engine_instance_id
                {
                    operation_enqueue_in_txn(txn, instance, row.tenant_id, of.resource_type(), row.id).await?;
                }
                Ok(true)
            })
        })
        .await?;
    Ok(owner)
}
