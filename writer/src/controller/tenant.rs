//! The intent transaction every controller writes through: fence the shard, then
//! find the namespace's tenant (placing it on an engine instance on first use) under
//! its row lock and record its shard, then store the intent (`Controllers::in_tenant_txn`).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use gitops_shared::db::credential::CredentialError;
use gitops_shared::db::placement::{Unplaced, placement_choose_in_txn};
use gitops_shared::db::tenant::{tenant_placement_in_txn, tenant_set_shard_in_txn, tenant_upsert_locked_in_txn};
use gitops_shared::db::{DbError, PooledTransaction};
use gitops_shared::model::{EngineInstanceId, RowState, TenantId};
use uuid::Uuid;

use super::Controllers;
use crate::shard::{shard_fence_in_txn, shard_of};

/// What an intent transaction did.
pub(super) enum Placed<T> {
    /// The intent's own outcome.
    Stored(T),
    /// This writer does not hold the namespace's shard (nothing written).
    NotOwner,
    /// No engine instance can take the tenant now, and why.
    NoEngine(Unplaced),
    /// The tenant is being cleaned up (its namespace went): nothing written.
    Gone,
}

impl Controllers {
    /// Runs `body` (retried on conflicts) in a transaction that first places and
    /// locks the tenant of `namespace`, under the shard fence; `body` gets the tenant
    /// and its engine instance.
    pub(super) async fn in_tenant_txn<T, F>(
        &self,
        namespace: &str,
        namespace_uid: Uuid,
        body: F,
    ) -> Result<Placed<T>, DbError>
    where
        T: Send + 'static,
        F: for<'t> Fn(&'t PooledTransaction<'t>, TenantId, EngineInstanceId) -> BoxFuture<'t, Result<T, DbError>>
            + Send
            + Sync
            + 'static,
    {
        let body = Arc::new(body);
        let (shard, healthy_within) = (shard_of(namespace), self.settings.healthy_within);
        let (writer_id, namespace) = (Arc::new(self.ctx.writer_id.clone()), Arc::new(namespace.to_owned()));
        let mut client = gitops_shared::db::pooled(&self.ctx.pool).await?;
        let placed = self
            .in_txn(&mut client, |txn| {
                let (body, writer_id, namespace) = (body.clone(), writer_id.clone(), namespace.clone());
                Box::pin(async move {
                    match tenant_placed_in_txn(txn, namespace_uid, &namespace, shard, &writer_id, healthy_within)
                        .await?
                    {
                        Tenancy::Placed(tenant, instance) => body(txn, tenant, instance).await.map(Placed::Stored),
                        Tenancy::NotOwner => Ok(Placed::NotOwner),
                        Tenancy::NoEngine(why) => Ok(Placed::NoEngine(why)),
                        Tenancy::Gone => Ok(Placed::Gone),
                    }
                })
            })
            .await?;
        if let Placed::NoEngine(why) = &placed {
            self.ctx.metrics.unplaced(why.as_str());
        }
        Ok(placed)
    }
}

/// Where the intent goes, or why it cannot be written now.
enum Tenancy {
    Placed(TenantId, EngineInstanceId),
    NotOwner,
    NoEngine(Unplaced),
    /// The tenant is being cleaned up (its namespace went): write nothing.
    Gone,
}

async fn tenant_placed_in_txn(
    txn: &impl gitops_shared::db::Statements,
    namespace_uid: Uuid,
    namespace: &str,
    shard: i32,
    writer_id: &str,
    healthy_within: Duration,
) -> Result<Tenancy, DbError> {
    if !shard_fence_in_txn(txn, shard, writer_id).await? {
        return Ok(Tenancy::NotOwner);
    }
    let placed = tenant_placement_in_txn(txn, namespace_uid).await?;
    let place_on = match placed.flatten() {
        Some(_) => None,
        None => match placement_choose_in_txn(txn, healthy_within).await? {
            Ok(instance) => Some(instance),
            Err(why) => return Ok(Tenancy::NoEngine(why)),
        },
    };
    let tenant = tenant_upsert_locked_in_txn(txn, namespace_uid, namespace, place_on).await?;
    if tenant.row_state != RowState::Active {
        return Ok(Tenancy::Gone);
    }
    let Some(instance) = tenant.engine_instance_id else { return Ok(Tenancy::NoEngine(Unplaced::Unavailable)) };
    tenant_set_shard_in_txn(txn, tenant.id, shard).await?;
    Ok(Tenancy::Placed(tenant.id, instance))
}

/// A credential upsert's error as the transaction's; the message never carries
/// secret material.
pub(super) fn credential_error(error: CredentialError) -> DbError {
    match error {
        CredentialError::Db(error) => error,
        other => DbError::Credentials { source: Box::new(other) },
    }
}
