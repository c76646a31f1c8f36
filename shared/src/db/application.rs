//! The `application` table: the intent behind a GitOpsDeployment, upserted by the
//! writer together with its operation, tombstoned on deletion, and what the writer
//! reads of it (quota, deletion progress, the target of a sync run).

use tokio_postgres::Transaction;
use tokio_postgres::types::Type;
use uuid::Uuid;

use crate::db::{DbError, Statements};
use crate::model::{ApplicationId, EngineInstanceId, ManagedEnvironmentId, RowState, SyncType, TenantId};

/// What a tenant asked for, validated (the tenant is passed beside it: it is known
/// only inside the intent transaction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplicationIntent {
    pub resource_uid: Uuid,
    pub resource_name: String,
    pub generation: i64,
    pub repo_url: String,
    pub path: String,
    pub target_revision: String,
    pub managed_environment_id: Option<ManagedEnvironmentId>,
    pub destination_namespace: String,
    pub sync_type: SyncType,
    pub create_namespace: bool,
    pub wait_for_pruning: bool,
}

// Sent with its parameter types (`query_typed`): one round trip, no separate prepare.
// The sync type travels as text and is cast here.
//
// Guarded by generation: older intent never overwrites newer. A row of the same
// generation is left as it is (a replayed event changes nothing).
const UPSERT: &str = "
INSERT INTO application (tenant_id, resource_uid, resource_name, generation, repo_url, path,
                         target_revision, managed_environment_id, destination_namespace,
                         sync_type, create_namespace, wait_for_pruning)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::sync_type, $11, $12)
ON CONFLICT (resource_uid) DO UPDATE
   SET resource_name = EXCLUDED.resource_name, generation = EXCLUDED.generation,
       repo_url = EXCLUDED.repo_url, path = EXCLUDED.path,
       target_revision = EXCLUDED.target_revision,
       managed_environment_id = EXCLUDED.managed_environment_id,
       destination_namespace = EXCLUDED.destination_namespace,
       sync_type = EXCLUDED.sync_type, create_namespace = EXCLUDED.create_namespace,
       wait_for_pruning = EXCLUDED.wait_for_pruning, updated_at = now()
 WHERE application.generation < EXCLUDED.generation
   AND application.tenant_id = EXCLUDED.tenant_id
   AND application.row_state = 'active'
RETURNING id";

/// Writes the intent if it is newer than what is stored. Returns the row id when
/// something changed (enqueue an operation then), `None` when the stored row is as
/// new or newer.
pub async fn application_upsert_in_txn(
    txn: &Transaction<'_>,
    tenant: TenantId,
    intent: &ApplicationIntent,
) -> Result<Option<ApplicationId>, DbError> {
    let environment = intent.managed_environment_id.map(|id| id.0);
    let rows = txn
        .query_typed(
            UPSERT,
            &[
                (&tenant.0, Type::INT8),
                (&intent.resource_uid, Type::UUID),
                (&intent.resource_name, Type::TEXT),
                (&intent.generation, Type::INT8),
                (&intent.repo_url, Type::TEXT),
                (&intent.path, Type::TEXT),
                (&intent.target_revision, Type::TEXT),
                (&environment, Type::INT8),
                (&intent.destination_namespace, Type::TEXT),
                (&intent.sync_type.as_str(), Type::TEXT),
                (&intent.create_namespace, Type::BOOL),
                (&intent.wait_for_pruning, Type::BOOL),
            ],
        )
        .await
        .map_err(DbError::query("upsert an application"))?;
    rows.first().map(|row| row.try_get("id")).transpose().map_err(DbError::query("upsert an application"))
}

/// A live deployment into its tenant's own namespace (through the home
/// environment), as an operator reviews them: whoever could push to its repository
/// acts there with the home role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeDeploymentRow {
    pub namespace: String,
    pub name: String,
    pub repo_url: String,
    pub path: String,
    pub target_revision: String,
    pub created_at: std::time::SystemTime,
}

impl TryFrom<&tokio_postgres::Row> for HomeDeploymentRow {
    type Error = tokio_postgres::Error;

    fn try_from(row: &tokio_postgres::Row) -> Result<Self, Self::Error> {
        Ok(HomeDeploymentRow {
            namespace: row.try_get("namespace_name")?,
            name: row.try_get("resource_name")?,
            repo_url: row.try_get("repo_url")?,
            path: row.try_get("path")?,
            target_revision: row.try_get("target_revision")?,
            created_at: row.try_get("created_at")?,
        })
    }
}

const HOME_DEPLOYMENTS: &str = "
SELECT t.namespace_name, a.resource_name, a.repo_url, a.path, a.target_revision, a.created_at
  FROM application a
  JOIN tenant t ON t.id = a.tenant_id
  JOIN managed_environment e ON e.id = a.managed_environment_id
 WHERE a.row_state = 'active' AND e.home
 ORDER BY t.namespace_name, a.resource_name";

/// Every live home deployment, by namespace and name.
pub async fn application_list_home(client: &tokio_postgres::Client) -> Result<Vec<HomeDeploymentRow>, DbError> {
    let rows = client.query(HOME_DEPLOYMENTS, &[]).await.map_err(DbError::query("list home deployments"))?;
    rows.iter().map(|row| HomeDeploymentRow::try_from(row).map_err(DbError::query("read a home deployment"))).collect()
}

const ROW_STATE: &str = "SELECT row_state FROM application WHERE resource_uid = $1";

const COUNT_OTHERS: &str = "
SELECT count(*) AS applications FROM application WHERE tenant_id = $1 AND row_state <> 'deleted' AND resource_uid <> $2";

const ACTIVE_GENERATION: &str = "SELECT generation FROM application WHERE resource_uid = $1 AND row_state = 'active'";

const SYNC_TARGET: &str = "
SELECT a.id, a.tenant_id, a.sync_type, t.engine_instance_id, coalesce(e.home, false) AS home
  FROM application a JOIN tenant t ON t.id = a.tenant_id
  LEFT JOIN managed_environment e ON e.id = a.managed_environment_id
 WHERE a.resource_uid = $1 AND a.row_state = 'active'";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[UPSERT, HOME_DEPLOYMENTS, ROW_STATE, COUNT_OTHERS, ACTIVE_GENERATION, SYNC_TARGET];

/// The row state of a GitOpsDeployment's application; None once purged (or never stored).
pub async fn application_row_state(
    client: &tokio_postgres::Client,
    resource_uid: Uuid,
) -> Result<Option<RowState>, DbError> {
    let row = client.query_opt(ROW_STATE, &[&resource_uid]).await.map_err(DbError::query("read an application"))?;
    row.map(|row| row.try_get("row_state")).transpose().map_err(DbError::query("read an application"))
}

/// The tenant's applications not confirmed deleted, other than `resource_uid`'s
/// (counted under the tenant's row lock for the quota).
pub async fn application_count_others_in_txn(
    txn: &impl Statements,
    tenant: TenantId,
    resource_uid: Uuid,
) -> Result<i64, DbError> {
    let row = txn.row(COUNT_OTHERS, &[&tenant, &resource_uid]).await.map_err(DbError::query("count deployments"))?;
    row.try_get("applications").map_err(DbError::query("count deployments"))
}

/// The generation stored for a live GitOpsDeployment, if any.
pub async fn application_active_generation(
    client: &tokio_postgres::Client,
    resource_uid: Uuid,
) -> Result<Option<i64>, DbError> {
    let row =
        client.query_opt(ACTIVE_GENERATION, &[&resource_uid]).await.map_err(DbError::query("read an application"))?;
    row.map(|row| row.try_get("generation")).transpose().map_err(DbError::query("read an application"))
}

/// What a sync run needs of the deployment it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncTargetRow {
    pub id: ApplicationId,
    pub tenant_id: TenantId,
    pub sync_type: SyncType,
    pub engine_instance_id: Option<EngineInstanceId>,
    /// It deploys into its own namespace (the home environment).
    pub home: bool,
}

impl TryFrom<&tokio_postgres::Row> for SyncTargetRow {
    type Error = tokio_postgres::Error;

    fn try_from(row: &tokio_postgres::Row) -> Result<Self, Self::Error> {
        Ok(SyncTargetRow {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            sync_type: row.try_get("sync_type")?,
            engine_instance_id: row.try_get("engine_instance_id")?,
            home: row.try_get("home")?,
        })
    }
}

/// The live application of the GitOpsDeployment `resource_uid`, as a sync run needs it.
pub async fn application_sync_target(
    client: &tokio_postgres::Client,
    resource_uid: Uuid,
) -> Result<Option<SyncTargetRow>, DbError> {
    let row = client.query_opt(SYNC_TARGET, &[&resource_uid]).await.map_err(DbError::query("read an application"))?;
    row.as_ref().map(SyncTargetRow::try_from).transpose().map_err(DbError::query("read an application"))
}
