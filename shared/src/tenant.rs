//! Tenants: one per API namespace, keyed by the namespace's UID.

use tokio_postgres::Transaction;
use uuid::Uuid;

use crate::db::DbError;
use crate::model::{EngineInstanceId, RowState, TenantId};

/// A tenant row as the writer needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenant {
    pub id: TenantId,
    pub engine_instance_id: Option<EngineInstanceId>,
    /// Not `active` once its namespace went: nothing new may be written for it.
    pub row_state: RowState,
}

const UPSERT: &str = "
INSERT INTO tenant (namespace_uid, namespace_name, engine_instance_id) VALUES ($1, $2, $3)
ON CONFLICT (namespace_uid) DO UPDATE
   SET engine_instance_id = COALESCE(tenant.engine_instance_id, EXCLUDED.engine_instance_id),
       updated_at = now()
 WHERE tenant.engine_instance_id IS NULL AND EXCLUDED.engine_instance_id IS NOT NULL
RETURNING id, engine_instance_id";

const GET_LOCKED: &str = "
SELECT id, engine_instance_id, row_state FROM tenant WHERE namespace_uid = $1 FOR UPDATE";

/// Finds or creates the tenant of a namespace and locks its row for the rest of
/// `txn` (quotas are counted under this lock). A tenant without an instance is
/// placed on `place_on` when given; a placed tenant stays where it is.
pub async fn tenant_upsert_locked_in_txn(
    txn: &Transaction<'_>,
    namespace_uid: Uuid,
    namespace_name: &str,
    place_on: Option<EngineInstanceId>,
) -> Result<Tenant, DbError> {
    txn.execute(UPSERT, &[&namespace_uid, &namespace_name, &place_on.map(|i| i.0)])
        .await
        .map_err(DbError::query("upsert a tenant"))?;
    let row = txn.query_one(GET_LOCKED, &[&namespace_uid]).await.map_err(DbError::query("lock a tenant"))?;
    Ok(Tenant {
        id: TenantId(row.get(0)),
        engine_instance_id: row.get::<_, Option<i64>>(1).map(EngineInstanceId),
        row_state: row.get(2),
    })
}
