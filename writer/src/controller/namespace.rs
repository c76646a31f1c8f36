//! Tenant namespaces: a tenant is its namespace's UID, so when the namespace is
//! deleted (terminating or gone), or deleted and made again under the same name,
//! the old tenant is cleaned up: in one transaction its row and every live row of
//! it are tombstoned and an operation is enqueued for each, so the agent removes
//! its Argo CD Applications, cluster and repository Secrets, and then its
//! AppProject. The writer also removes the tenant's home ServiceAccount (in the
//! home namespace) and, when the namespace is still there to hold it, the binding.
//!
//! The watcher of namespaces queues a namespace key when one is deleted or starts
//! terminating; after its first listing, and whenever this writer gains shards,
//! every live tenant of the owned shards whose namespace is missing is queued too,
//! so a namespace deleted while no writer ran is not missed.

use std::sync::Arc;

use gitops_shared::db::{DbError, pooled};
use gitops_shared::model::{EngineInstanceId, ResourceType, TenantId};
use gitops_shared::queue::operation_enqueue_in_txn;
use uuid::Uuid;

use super::{Controllers, Next, ReconcileError, Settled, home};
use crate::shard::{shard_fence_in_txn, shard_of};

const STALE_TENANTS: &str = "
SELECT id, engine_instance_id, namespace_uid FROM tenant
 WHERE namespace_name = $1 AND row_state = 'active' AND namespace_uid IS DISTINCT FROM $2
 ORDER BY id
   FOR UPDATE";

/// Each live row of a tenant, tombstoned; `resource_type` names the operation.
const TOMBSTONES: [(&str, ResourceType); 4] = [
    (
        "UPDATE sync_operation SET row_state = 'deleting', terminate_requested = true, updated_at = now()
          WHERE tenant_id = $1 AND row_state = 'active' RETURNING id",
        ResourceType::SyncOperation,
    ),
    (
        "UPDATE application SET row_state = 'deleting', updated_at = now()
          WHERE tenant_id = $1 AND row_state = 'active' RETURNING id",
        ResourceType::Application,
    ),
    (
        "UPDATE repository_credential SET row_state = 'deleting', updated_at = now()
          WHERE tenant_id = $1 AND row_state = 'active' RETURNING id",
        ResourceType::RepositoryCredential,
    ),
    (
        "UPDATE managed_environment SET row_state = 'deleting', updated_at = now()
          WHERE tenant_id = $1 AND row_state = 'active' RETURNING id",
        ResourceType::ManagedEnvironment,
    ),
];

const TENANT_TOMBSTONE: &str = "UPDATE tenant SET row_state = 'deleting', updated_at = now() WHERE id = $1";

const LIVE_TENANTS: &str = "
SELECT namespace_name, namespace_uid FROM tenant WHERE row_state = 'active' AND writer_shard = ANY($1)";

/// Cleans up the tenants of `namespace` that are not its live UID.
pub(super) async fn reconcile(ctl: &Arc<Controllers>, namespace: &str) -> Result<Next, ReconcileError> {
    let live = ctl.namespace_state(namespace).await?;
    let keep: Option<Uuid> = match &live {
        Some(state) if !state.terminating => Some(state.uid),
        _ => None,
    };
    let shard = shard_of(namespace);
    let writer_id = ctl.ctx.writer_id.clone();
    let ns_name = namespace.to_owned();
    let mut client = pooled(&ctl.ctx.pool).await?;
    let cleaned = ctl
        .in_txn(&mut client, |txn| {
            let (writer_id, ns_name) = (writer_id.clone(), ns_name.clone());
            Box::pin(async move {
                if !shard_fence_in_txn(txn, shard, &writer_id).await? {
                    return Ok(None);
                }
                let tenants = txn
                    .query(STALE_TENANTS, &[&ns_name, &keep])
                    .await
                    .map_err(DbError::query("find a namespace's old tenants"))?;
                let mut cleaned: Vec<Uuid> = Vec::new();
                for row in tenants {
                    let tenant = TenantId(row.get(0));
                    let instance: Option<i64> = row.get(1);
                    cleaned.push(row.get(2));
                    for (statement, resource_type) in TOMBSTONES {
                        let ids = txn
                            .query(statement, &[&tenant.0])
                            .await
                            .map_err(DbError::query("tombstone a tenant's rows"))?;
                        if let Some(instance) = instance {
                            for id in ids {
                                operation_enqueue_in_txn(
                                    txn,
                                    EngineInstanceId(instance),
                                    tenant,
                                    resource_type,
                                    id.get(0),
                                )
                                .await?;
                            }
                        }
                    }
                    txn.execute(TENANT_TOMBSTONE, &[&tenant.0]).await.map_err(DbError::query("tombstone a tenant"))?;
                    if let Some(instance) = instance {
                        operation_enqueue_in_txn(
                            txn,
                            EngineInstanceId(instance),
                            tenant,
                            ResourceType::Tenant,
                            tenant.0,
                        )
                        .await?;
                    }
                }
                Ok(Some(cleaned))
            })
        })
        .await?;
    drop(client);
    let Some(cleaned) = cleaned else { return Ok(Next::Done) };
    ctl.forget_home(&cleaned);
    home::remove_identity(&ctl.ctx.kube, &ctl.ctx.home, namespace, &cleaned, live.is_some() && keep.is_none()).await?;
    if !cleaned.is_empty() {
        tracing::info!(tenant.ns = %namespace, tenants = cleaned.len(), "tenant namespace gone; its rows are tombstoned");
        return Ok(Next::Settled(Settled::Ok));
    }
    Ok(Next::Done)
}

/// Queues every namespace of a live tenant in the owned shards that the namespace
/// watcher does not know (deleted while no writer owned it).
pub(super) async fn queue_missing(ctl: &Arc<Controllers>) -> Result<(), ReconcileError> {
    let shards = ctl.shards.borrow().clone();
    if shards.is_empty() {
        return Ok(());
    }
    let tenants: Vec<(String, Uuid)> = {
        let client = pooled(&ctl.ctx.pool).await?;
        client
            .query(LIVE_TENANTS, &[&shards])
            .await
            .map_err(DbError::query("list live tenants"))?
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect()
    };
    for (namespace, uid) in tenants {
        let current = ctl.namespace_cached(&namespace);
        if current.is_none_or(|state| state.uid != uid || state.terminating) {
            ctl.offer(super::namespace_key(&namespace));
        }
    }
    Ok(())
}
