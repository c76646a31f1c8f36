//! Sync operations: the intent behind a GitOpsDeploymentSyncRun, written by the
//! writer with its operation; progress is the agent's (see `observed`).

use tokio_postgres::Transaction;
use uuid::Uuid;

use crate::db::DbError;
use crate::model::{ApplicationId, SyncOperationId, TenantId};

/// A validated sync request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncIntent {
    pub tenant_id: TenantId,
    pub resource_uid: Uuid,
    pub resource_name: String,
    pub generation: i64,
    pub deployment_name: String,
    pub application_id: ApplicationId,
    pub revision: String,
}

// Guarded by generation; a changed spec asks for a new sync (new correlation id).
const UPSERT: &str = "
INSERT INTO sync_operation (tenant_id, resource_uid, resource_name, generation, deployment_name,
                            application_id, revision)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (resource_uid) DO UPDATE
   SET generation = EXCLUDED.generation, deployment_name = EXCLUDED.deployment_name,
       application_id = EXCLUDED.application_id, revision = EXCLUDED.revision,
       correlation_id = gen_random_uuid(), state = 'pending', synced_revision = NULL,
       message = NULL, started_at = NULL, finished_at = NULL, updated_at = now()
 WHERE sync_operation.generation < EXCLUDED.generation
   AND sync_operation.tenant_id = EXCLUDED.tenant_id
   AND sync_operation.row_state = 'active'
RETURNING id";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[UPSERT];

/// Writes the request if newer than the stored one; the row id when it changed.
pub async fn sync_operation_upsert_in_txn(
    txn: &Transaction<'_>,
    intent: &SyncIntent,
) -> Result<Option<SyncOperationId>, DbError> {
    let row = txn
        .query_opt(
            UPSERT,
            &[
                &intent.tenant_id,
                &intent.resource_uid,
                &intent.resource_name,
                &intent.generation,
                &intent.deployment_name,
                &intent.application_id,
                &intent.revision,
            ],
        )
        .await
        .map_err(DbError::query("upsert a sync operation"))?;
    row.map(|row| row.try_get("id")).transpose().map_err(DbError::query("upsert a sync operation"))
}
