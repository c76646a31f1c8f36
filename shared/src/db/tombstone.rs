//! Deleting a tenant resource's row: one statement per table marks the live row
//! `deleting` and returns what the operation needs (the row, its tenant, the
//! tenant's engine instance), so the writer tombstones and enqueues in the same
//! transaction the same way for every kind. A deleted SyncRun's row also asks the
//! agent to terminate its sync.

use tokio_postgres::Transaction;
use uuid::Uuid;

use crate::db::DbError;
use crate::model::{EngineInstanceId, ResourceType, TenantId};

/// The table rows of these kinds live in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TombstoneOf {
    Application,
    ManagedEnvironment,
    RepositoryCredential,
    SyncOperation,
}

impl TombstoneOf {
    /// The operation that carries the deletion to the agent.
    pub fn resource_type(self) -> ResourceType {
        match self {
            TombstoneOf::Application => ResourceType::Application,
            TombstoneOf::ManagedEnvironment => ResourceType::ManagedEnvironment,
            TombstoneOf::RepositoryCredential => ResourceType::RepositoryCredential,
            TombstoneOf::SyncOperation => ResourceType::SyncOperation,
        }
    }

    fn statement(self) -> &'static str {
        match self {
            TombstoneOf::Application => APPLICATION,
            TombstoneOf::ManagedEnvironment => MANAGED_ENVIRONMENT,
            TombstoneOf::RepositoryCredential => REPOSITORY_CREDENTIAL,
            TombstoneOf::SyncOperation => SYNC_OPERATION,
        }
    }
}

const APPLICATION: &str = "
WITH r AS (UPDATE application SET row_state = 'deleting', updated_at = now()
            WHERE resource_uid = $1 AND row_state = 'active' RETURNING id, tenant_id)
SELECT r.id, r.tenant_id, t.engine_instance_id FROM r JOIN tenant t ON t.id = r.tenant_id";

const MANAGED_ENVIRONMENT: &str = "
WITH r AS (UPDATE managed_environment SET row_state = 'deleting', updated_at = now()
            WHERE resource_uid = $1 AND row_state = 'active' RETURNING id, tenant_id)
SELECT r.id, r.tenant_id, t.engine_instance_id FROM r JOIN tenant t ON t.id = r.tenant_id";

const REPOSITORY_CREDENTIAL: &str = "
WITH r AS (UPDATE repository_credential SET row_state = 'deleting', updated_at = now()
            WHERE resource_uid = $1 AND row_state = 'active' RETURNING id, tenant_id)
SELECT r.id, r.tenant_id, t.engine_instance_id FROM r JOIN tenant t ON t.id = r.tenant_id";

// The tenant is locked as an intent transaction locks it.
const SYNC_OPERATION: &str = "
WITH r AS (UPDATE sync_operation SET terminate_requested = true, row_state = 'deleting', updated_at = now()
            WHERE resource_uid = $1 AND row_state = 'active' RETURNING id, tenant_id),
     t AS (SELECT id, engine_instance_id FROM tenant WHERE id IN (SELECT tenant_id FROM r) FOR UPDATE)
SELECT r.id, r.tenant_id, t.engine_instance_id FROM r JOIN t ON t.id = r.tenant_id";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[APPLICATION, MANAGED_ENVIRONMENT, REPOSITORY_CREDENTIAL, SYNC_OPERATION];

/// A row marked for deletion, and where its operation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tombstoned {
    pub id: i64,
    pub tenant_id: TenantId,
    pub engine_instance_id: Option<EngineInstanceId>,
}

/// Marks the live row of resource `resource_uid` for deletion; None when there was none.
pub async fn resource_tombstone_in_txn(
    txn: &Transaction<'_>,
    of: TombstoneOf,
    resource_uid: Uuid,
) -> Result<Option<Tombstoned>, DbError> {
    let row = txn.query_opt(of.statement(), &[&resource_uid]).await.map_err(DbError::query("tombstone a row"))?;
    let read = |row: tokio_postgres::Row| -> Result<Tombstoned, tokio_postgres::Error> {
        Ok(Tombstoned {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            engine_instance_id: row.try_get("engine_instance_id")?,
        })
    };
    row.map(read).transpose().map_err(DbError::query("read a tombstoned row"))
}
