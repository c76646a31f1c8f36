//! What the two credential-bearing kinds (GitOpsDeploymentManagedEnvironment and
//! GitOpsDeploymentRepositoryCredential) do the same way: read the Secret they name
//! (same namespace only; a missing one is a refusal the tenant can read) and, on
//! deletion, tombstone their row and enqueue an operation for the tenant's engine.

use std::sync::Arc;

use gitops_shared::db::{DbError, pooled};
use gitops_shared::model::{EngineInstanceId, ResourceType, TenantId};
use gitops_shared::queue::operation_enqueue_in_txn;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use uuid::Uuid;

use super::environment::REASON_SECRET_NOT_FOUND;
use super::{Controllers, ReconcileError};
use crate::shard::{shard_fence_in_txn, shard_of};
use crate::validate::Invalid;

const TENANT_INSTANCE: &str = "SELECT engine_instance_id FROM tenant WHERE id = $1";

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

/// Tombstones the row of resource `uid` with `tombstone` (an `UPDATE … RETURNING id,
/// tenant_id`) and enqueues a `resource` operation for the tenant's engine, when this
/// writer owns the namespace's shard. `false` when it does not (nothing written).
pub(super) async fn tombstone_and_enqueue(
    ctl: &Arc<Controllers>,
    namespace: &str,
    uid: Uuid,
    tombstone: &'static str,
    resource: ResourceType,
    action: &'static str,
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
                let tombstoned = txn.query_opt(tombstone, &[&uid]).await.map_err(DbError::query(action))?;
                if let Some(row) = tombstoned {
                    let (id, tenant): (i64, i64) = (row.get(0), row.get(1));
                    let instance: Option<i64> = txn
                        .query_one(TENANT_INSTANCE, &[&tenant])
                        .await
                        .map_err(DbError::query("read a tenant"))?
                        .get(0);
                    if let Some(instance) = instance {
                        operation_enqueue_in_txn(txn, EngineInstanceId(instance), TenantId(tenant), resource, id)
                            .await?;
                    }
                }
                Ok(true)
            })
        })
        .await?;
    Ok(owner)
}
