//! The tenant step of the credential controllers' intent transactions: fence the
//! shard, then find the namespace's tenant (placing it on an engine instance on
//! first use) under its row lock and record its shard, as the deployment
//! controller does before storing an application.

use std::time::Duration;

use gitops_shared::db::DbError;
use gitops_shared::db::credential::CredentialError;
use gitops_shared::db::placement::placement_choose_in_txn;
use gitops_shared::db::tenant::{tenant_placement_in_txn, tenant_set_shard_in_txn, tenant_upsert_locked_in_txn};
use gitops_shared::model::{EngineInstanceId, RowState, TenantId};
use tokio_postgres::Transaction;
use uuid::Uuid;

use crate::shard::shard_fence_in_txn;

/// Where the intent goes, or why it cannot be written now.
pub(super) enum Tenancy {
    Placed(TenantId, EngineInstanceId),
    NotOwner,
    NoEngine,
    /// The tenant is being cleaned up (its namespace went): write nothing.
    Gone,
}

pub(super) async fn tenant_placed_in_txn(
    txn: &Transaction<'_>,
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
            Some(instance) => Some(instance),
            None => return Ok(Tenancy::NoEngine),
        },
    };
    let tenant = tenant_upsert_locked_in_txn(txn, namespace_uid, namespace, place_on).await?;
    if tenant.row_state != RowState::Active {
        return Ok(Tenancy::Gone);
    }
    let Some(instance) = tenant.engine_instance_id else { return Ok(Tenancy::NoEngine) };
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
