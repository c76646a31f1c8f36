//! The `tenant` table: one row per API namespace, keyed by the namespace's UID,
//! placed on an engine instance and owned by a writer shard. Every statement the
//! writer runs against it is here, including the cleanup of a tenant whose
//! namespace went (its rows of every kind are tombstoned in the same transaction).

use tokio_postgres::Transaction;
use uuid::Uuid;

use crate::db::{DbError, Statements};
use crate::model::{EngineInstanceId, ResourceType, RowState, TenantId};

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
    txn: &impl Statements,
    namespace_uid: Uuid,
    namespace_name: &str,
    place_on: Option<EngineInstanceId>,
) -> Result<Tenant, DbError> {
    txn.run(UPSERT, &[&namespace_uid, &namespace_name, &place_on.map(|i| i.0)])
        .await
        .map_err(DbError::query("upsert a tenant"))?;
    let row = txn.row(GET_LOCKED, &[&namespace_uid]).await.map_err(DbError::query("lock a tenant"))?;
    Tenant::try_from(&row).map_err(DbError::query("read a tenant"))
}

impl TryFrom<&tokio_postgres::Row> for Tenant {
    type Error = tokio_postgres::Error;

    fn try_from(row: &tokio_postgres::Row) -> Result<Self, Self::Error> {
        Ok(Tenant {
            id: row.try_get("id")?,
            engine_instance_id: row.try_get("engine_instance_id")?,
            row_state: row.try_get("row_state")?,
        })
    }
}

const OF_NAMESPACE_LOCKED: &str = "
SELECT id, engine_instance_id, row_state, writer_shard FROM tenant WHERE namespace_uid = $1 FOR UPDATE";

const SET_SHARD: &str = "
UPDATE tenant SET writer_shard = $2, updated_at = now() WHERE id = $1 AND writer_shard IS DISTINCT FROM $2";

const LOCK: &str = "SELECT engine_instance_id FROM tenant WHERE id = $1 FOR UPDATE";

const STALE: &str = "
SELECT id, engine_instance_id, namespace_uid FROM tenant
 WHERE namespace_name = $1 AND row_state = 'active' AND namespace_uid IS DISTINCT FROM $2
 ORDER BY id
   FOR UPDATE";

/// Each live row of a tenant, tombstoned; `resource_type` names the operation.
const TOMBSTONE_ROWS: [(&str, ResourceType); 4] = [
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

const TOMBSTONE: &str = "UPDATE tenant SET row_state = 'deleting', updated_at = now() WHERE id = $1";

const LIVE_IN_SHARDS: &str = "
SELECT namespace_name, namespace_uid FROM tenant WHERE row_state = 'active' AND writer_shard = ANY($1)";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[
    UPSERT,
    GET_LOCKED,
    OF_NAMESPACE_LOCKED,
    SET_SHARD,
    LOCK,
    STALE,
    TOMBSTONE_ROWS[0].0,
    TOMBSTONE_ROWS[1].0,
    TOMBSTONE_ROWS[2].0,
    TOMBSTONE_ROWS[3].0,
    TOMBSTONE,
    LIVE_IN_SHARDS,
];

/// A tenant row, locked, and the writer shard last recorded on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockedTenant {
    pub tenant: Tenant,
    pub writer_shard: Option<i32>,
}

/// The tenant of `namespace_uid`, its row locked for the rest of `txn` (quotas are
/// counted under this lock); None while the namespace has none. One statement, so
/// that an intent for a placed tenant reads and locks it in one round trip.
pub async fn tenant_of_namespace_locked_in_txn(
    txn: &impl Statements,
    namespace_uid: Uuid,
) -> Result<Option<LockedTenant>, DbError> {
    let action = "lock a namespace's tenant";
    let Some(row) = txn.row_opt(OF_NAMESPACE_LOCKED, &[&namespace_uid]).await.map_err(DbError::query(action))? else {
        return Ok(None);
    };
    let tenant = Tenant::try_from(&row).map_err(DbError::query(action))?;
    let writer_shard = row.try_get("writer_shard").map_err(DbError::query(action))?;
    Ok(Some(LockedTenant { tenant, writer_shard }))
}

/// Places the tenant of a namespace on `instance`, creating it if need be, unless it
/// is placed already. It writes nothing else: placing
/// counts the tenant on the instance, which locks the instance's row until `txn`
/// ends, so the caller commits at once.
pub async fn tenant_place_in_txn(
    txn: &impl Statements,
    namespace_uid: Uuid,
    namespace_name: &str,
    instance: EngineInstanceId,
) -> Result<(), DbError> {
    txn.run(UPSERT, &[&namespace_uid, &namespace_name, &Some(instance.0)])
        .await
        .map_err(DbError::query("place a tenant"))?;
    Ok(())
}

/// Records the writer shard of a tenant (its namespace's).
pub async fn tenant_set_shard_in_txn(txn: &impl Statements, tenant: TenantId, shard: i32) -> Result<(), DbError> {
    txn.run(SET_SHARD, &[&tenant, &shard]).await.map_err(DbError::query("record a tenant's shard"))?;
    Ok(())
}

/// Locks a tenant's row for the rest of `txn`; returns its instance.
pub async fn tenant_lock_in_txn(txn: &Transaction<'_>, tenant: TenantId) -> Result<Option<EngineInstanceId>, DbError> {
    let row = txn.query_one(LOCK, &[&tenant]).await.map_err(DbError::query("lock a tenant"))?;
    row.try_get("engine_instance_id").map_err(DbError::query("lock a tenant"))
}

/// A live tenant of a namespace name whose UID is not the namespace's live one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleTenantRow {
    pub id: TenantId,
    pub engine_instance_id: Option<EngineInstanceId>,
    pub namespace_uid: Uuid,
}

impl TryFrom<&tokio_postgres::Row> for StaleTenantRow {
    type Error = tokio_postgres::Error;

    fn try_from(row: &tokio_postgres::Row) -> Result<Self, Self::Error> {
        Ok(StaleTenantRow {
            id: row.try_get("id")?,
            engine_instance_id: row.try_get("engine_instance_id")?,
            namespace_uid: row.try_get("namespace_uid")?,
        })
    }
}

/// The live tenants named `namespace` other than the one of UID `keep`, locked.
pub async fn tenant_stale_in_txn(
    txn: &Transaction<'_>,
    namespace: &str,
    keep: Option<Uuid>,
) -> Result<Vec<StaleTenantRow>, DbError> {
    let rows =
        txn.query(STALE, &[&namespace, &keep]).await.map_err(DbError::query("find a namespace's old tenants"))?;
    rows.iter().map(|row| StaleTenantRow::try_from(row).map_err(DbError::query("read a tenant"))).collect()
}

/// Tombstones a tenant and every live row of it; returns the rows to enqueue an
/// operation for (the tenant's own last).
pub async fn tenant_tombstone_with_rows_in_txn(
    txn: &Transaction<'_>,
    tenant: TenantId,
) -> Result<Vec<(ResourceType, i64)>, DbError> {
    let mut tombstoned = Vec::new();
    for (statement, resource_type) in TOMBSTONE_ROWS {
        let rows = txn.query(statement, &[&tenant]).await.map_err(DbError::query("tombstone a tenant's rows"))?;
        for row in rows {
            tombstoned.push((resource_type, row.try_get("id").map_err(DbError::query("read a tombstoned row"))?));
        }
    }
    txn.execute(TOMBSTONE, &[&tenant]).await.map_err(DbError::query("tombstone a tenant"))?;
    tombstoned.push((ResourceType::Tenant, tenant.0));
    Ok(tombstoned)
}

/// (namespace name, namespace UID) of every live tenant in `shards`.
pub async fn tenant_live_in_shards(
    client: &tokio_postgres::Client,
    shards: &[i32],
) -> Result<Vec<(String, Uuid)>, DbError> {
    let rows = client.query(LIVE_IN_SHARDS, &[&shards]).await.map_err(DbError::query("list live tenants"))?;
    rows.iter()
        .map(|row| Ok((row.try_get("namespace_name")?, row.try_get("namespace_uid")?)))
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(DbError::query("read a live tenant"))
}
