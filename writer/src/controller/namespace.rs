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

use gitops_shared::db::pooled;
use gitops_shared::db::tenant::{tenant_live_in_shards, tenant_stale_in_txn, tenant_tombstone_with_rows_in_txn};
use gitops_shared::queue::operation_enqueue_in_txn;
use uuid::Uuid;

use super::{Controllers, Next, ReconcileError, Settled, home};
use crate::shard::{shard_fence_in_txn, shard_of};

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
                let mut cleaned: Vec<Uuid> = Vec::new();
                for stale in tenant_stale_in_txn(txn, &ns_name, keep).await? {
                    cleaned.push(stale.namespace_uid);
                    let tombstoned = tenant_tombstone_with_rows_in_txn(txn, stale.id).await?;
                    if let Some(instance) = stale.engine_instance_id {
                        for (resource_type, id) in tombstoned {
                            operation_enqueue_in_txn(txn, instance, stale.id, resource_type, id).await?;
                        }
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
        tenant_live_in_shards(&client, &shards).await?
    };
    for (namespace, uid) in tenants {
        let current = ctl.namespace_cached(&namespace);
        if current.is_none_or(|state| state.uid != uid || state.terminating) {
            ctl.offer(super::namespace_key(&namespace));
        }
    }
    Ok(())
}
