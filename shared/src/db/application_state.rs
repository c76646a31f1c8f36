//! Observed state: what the engine (Argo CD) reports about an application and about
//! a requested sync, written by the agent and read by the writer's status loop.
//!
//! Kept apart from the intent types on purpose: intent is what a tenant asked for,
//! observed state is what the engine says happened. Every write here is skipped
//! when it would change nothing, because each `application_state` update takes a
//! new sequence number (trigger `application_state_stamp`) and wakes the writers
//! (statement trigger `application_state_signal`, which fires even for a statement
//! that touches no row — hence the check before the upsert).

use std::time::SystemTime;

use serde_json::Value;
use uuid::Uuid;

use crate::db::engine_instance::InstanceEpoch;
use crate::db::{DbError, Statements};
use crate::model::{ApplicationId, EngineInstanceId, SyncOperationState, TenantId};
use crate::placed_at_epoch;

/// One `application_state` row's content, as the engine reported it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ObservedApplication {
    pub application_id: ApplicationId,
    pub tenant_id: TenantId,
    pub sync_status: Option<String>,
    pub sync_revision: Option<String>,
    pub health_status: Option<String>,
    pub health_message: Option<String>,
    /// A JSON array.
    pub resources: Value,
    /// A JSON array.
    pub conditions: Value,
    pub operation_state: Option<Value>,
    /// The source and destination the engine last compared against.
    pub reconciled_state: Option<Value>,
}

/// Progress of one requested sync, as the engine reported it.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedSync {
    pub application_id: ApplicationId,
    /// `sync_operation.correlation_id`, echoed by the engine.
    pub correlation_id: Uuid,
    pub state: SyncOperationState,
    pub synced_revision: Option<String>,
    pub message: Option<String>,
    pub started_at: Option<SystemTime>,
    pub finished_at: Option<SystemTime>,
}

/// The application row an engine object belongs to, as far as this instance knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApplicationOwner {
    pub application_id: ApplicationId,
    pub tenant_id: TenantId,
}

// The row must exist and belong to a tenant placed on this instance: an object in
// the instance's namespace never writes the state of another instance's row.
const OWNER_BY_ID: &str = "
SELECT a.id, a.tenant_id
  FROM application a JOIN tenant t ON t.id = a.tenant_id
 WHERE a.id = $1 AND t.engine_instance_id = $2";

const OWNER_BY_UID: &str = "
SELECT a.id, a.tenant_id
  FROM application a JOIN tenant t ON t.id = a.tenant_id
 WHERE a.resource_uid = $1 AND t.engine_instance_id = $2";

// Compared in SQL, so JSON equality is jsonb's (key order does not matter).
const UNCHANGED: &str = "
SELECT 1 FROM application_state s
 WHERE s.application_id = $1
   AND (s.tenant_id, s.sync_status, s.sync_revision, s.health_status, s.health_message,
        s.resources, s.conditions, s.operation_state, s.reconciled_state)
       IS NOT DISTINCT FROM
       ($2, $3, $4, $5, $6, $7::jsonb, $8::jsonb, $9::jsonb, $10::jsonb)";

// Inserted only while the application row exists (a concurrent purge wins) and its
// tenant is placed on the writing instance at its current epoch (a fenced or moved-
// from instance writes nothing); an update only when something differs, so a racing
// replica cannot add a sequence number for nothing.
const UPSERT: &str = concat!(
    "
INSERT INTO application_state (application_id, tenant_id, sync_status, sync_revision,
                               health_status, health_message, resources, conditions,
                               operation_state, reconciled_state)
SELECT a.id, $2, $3, $4, $5, $6, $7::jsonb, $8::jsonb, $9::jsonb, $10::jsonb
  FROM application a JOIN tenant t ON t.id = a.tenant_id
 WHERE a.id = $1 AND ",
    placed_at_epoch!("$11", "$12"),
    "
ON CONFLICT (application_id) DO UPDATE
   SET tenant_id = EXCLUDED.tenant_id, sync_status = EXCLUDED.sync_status,
       sync_revision = EXCLUDED.sync_revision, health_status = EXCLUDED.health_status,
       health_message = EXCLUDED.health_message, resources = EXCLUDED.resources,
       conditions = EXCLUDED.conditions, operation_state = EXCLUDED.operation_state,
       reconciled_state = EXCLUDED.reconciled_state, updated_at = now()
 WHERE (application_state.tenant_id, application_state.sync_status,
        application_state.sync_revision, application_state.health_status,
        application_state.health_message, application_state.resources,
        application_state.conditions, application_state.operation_state,
        application_state.reconciled_state)
       IS DISTINCT FROM
       (EXCLUDED.tenant_id, EXCLUDED.sync_status, EXCLUDED.sync_revision,
        EXCLUDED.health_status, EXCLUDED.health_message, EXCLUDED.resources,
        EXCLUDED.conditions, EXCLUDED.operation_state, EXCLUDED.reconciled_state)
RETURNING seq"
);

// A finished sync keeps its result; the row is matched by correlation id *and*
// application, so an object can only report on its own application's syncs. A
// sync that failed after termination was asked for is `terminated`; a row being
// terminated does not go back to `running`.
const SYNC_PROGRESS: &str = concat!(
    "
WITH observed AS (
    SELECT s.id,
           CASE WHEN $3 = 'failed'::sync_operation_state
                 AND (s.state = 'terminating' OR s.terminate_requested)
                THEN 'terminated'::sync_operation_state
                ELSE $3 END AS state,
           COALESCE($6, s.started_at) AS started_at
      FROM sync_operation s
     WHERE s.correlation_id = $1 AND s.application_id = $2
       AND s.state NOT IN ('succeeded', 'failed', 'terminated')
       AND NOT (s.state = 'terminating' AND $3 IN ('running', 'pending'))
       AND EXISTS (SELECT 1 FROM application a JOIN tenant t ON t.id = a.tenant_id
                    WHERE a.id = $2 AND ",
    placed_at_epoch!("$8", "$9"),
    ")
)
UPDATE sync_operation s
   SET state = o.state, synced_revision = $4, message = $5,
       started_at = o.started_at, finished_at = $7, updated_at = now()
  FROM observed o
 WHERE s.id = o.id
   AND (s.state, s.synced_revision, s.message, s.started_at, s.finished_at)
       IS DISTINCT FROM (o.state, $4, $5, o.started_at, $7)
RETURNING s.id"
);

// Inserted only while the application row exists; changed only when it differs
// (every change takes a place in the status feed).
const AGENT_OUTCOME: &str = concat!(
    "
INSERT INTO application_state (application_id, tenant_id, applied_generation, agent_message, agent_stalled,
                               stalled_generation)
SELECT a.id, a.tenant_id, $2, $3, $4, CASE WHEN $4 THEN a.generation END
  FROM application a JOIN tenant t ON t.id = a.tenant_id
 WHERE a.id = $1 AND ",
    placed_at_epoch!("$5", "$6"),
    "
ON CONFLICT (application_id) DO UPDATE
   SET applied_generation = COALESCE(EXCLUDED.applied_generation, application_state.applied_generation),
       agent_message = EXCLUDED.agent_message, agent_stalled = EXCLUDED.agent_stalled,
       stalled_generation = EXCLUDED.stalled_generation, updated_at = now()
 WHERE (COALESCE(EXCLUDED.applied_generation, application_state.applied_generation),
        EXCLUDED.agent_message, EXCLUDED.agent_stalled, EXCLUDED.stalled_generation)
       IS DISTINCT FROM
       (application_state.applied_generation, application_state.agent_message, application_state.agent_stalled,
        application_state.stalled_generation)"
);

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[OWNER_BY_ID, OWNER_BY_UID, UNCHANGED, UPSERT, SYNC_PROGRESS, AGENT_OUTCOME];

/// What the agent's last reconcile of an application came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentOutcome {
    /// The row at `generation` is what Argo CD has now.
    Applied { generation: i64 },
    /// It failed; `message` is for the tenant (sanitised), `stalled` when retrying cannot help.
    Failed { message: String, stalled: bool },
}

impl AgentOutcome {
    /// Its columns: the applied generation, the tenant's message (sanitised), stalled.
    pub(crate) fn columns(&self) -> (Option<i64>, Option<String>, bool) {
        match self {
            AgentOutcome::Applied { generation } => (Some(*generation), None, false),
            AgentOutcome::Failed { message, stalled } => {
                (None, Some(crate::sanitize::sanitize_tenant_message(message)), *stalled)
            }
        }
    }
}

/// Records `outcome` for application `id` (only when it changes what was recorded).
pub async fn application_state_record_outcome(
    client: &impl Statements,
    epoch: &InstanceEpoch,
    id: ApplicationId,
    outcome: &AgentOutcome,
) -> Result<(), DbError> {
    let (generation, message, stalled) = outcome.columns();
    client
        .run(AGENT_OUTCOME, &[&id, &generation, &message, &stalled, &epoch.instance, &epoch.current()])
        .await
        .map_err(DbError::query("record the agent's outcome"))?;
    Ok(())
}

/// The application row with id `id` if it belongs to a tenant on `instance`.
pub async fn application_owner_by_id(
    client: &impl Statements,
    instance: EngineInstanceId,
    id: ApplicationId,
) -> Result<Option<ApplicationOwner>, DbError> {
    let row = client.row_opt(OWNER_BY_ID, &[&id, &instance]).await.map_err(DbError::query("find an application"))?;
    row.as_ref().map(ApplicationOwner::try_from).transpose().map_err(DbError::query("find an application"))
}

impl TryFrom<&tokio_postgres::Row> for ApplicationOwner {
    type Error = tokio_postgres::Error;

    fn try_from(row: &tokio_postgres::Row) -> Result<Self, Self::Error> {
        Ok(ApplicationOwner { application_id: row.try_get("id")?, tenant_id: row.try_get("tenant_id")? })
    }
}

/// The application row of tenant resource `uid` if it belongs to a tenant on `instance`.
pub async fn application_owner_by_uid(
    client: &impl Statements,
    instance: EngineInstanceId,
    uid: Uuid,
) -> Result<Option<ApplicationOwner>, DbError> {
    let row = client.row_opt(OWNER_BY_UID, &[&uid, &instance]).await.map_err(DbError::query("find an application"))?;
    row.as_ref().map(ApplicationOwner::try_from).transpose().map_err(DbError::query("find an application"))
}

/// Writes `observed` when it differs from the stored row. Returns the new sequence
/// number, or `None` when nothing changed (or the application row is gone).
pub async fn application_state_upsert(
    client: &impl Statements,
    epoch: &InstanceEpoch,
    observed: &ObservedApplication,
) -> Result<Option<i64>, DbError> {
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 10] = [
        &observed.application_id,
        &observed.tenant_id,
        &observed.sync_status,
        &observed.sync_revision,
        &observed.health_status,
        &observed.health_message,
        &observed.resources,
        &observed.conditions,
        &observed.operation_state,
        &observed.reconciled_state,
    ];
    let unchanged = client.row_opt(UNCHANGED, &params).await.map_err(DbError::query("compare an application state"))?;
    if unchanged.is_some() {
        return Ok(None);
    }
    let current = epoch.current();
    let mut params = params.to_vec();
    params.extend([&epoch.instance as &(dyn tokio_postgres::types::ToSql + Sync), &current]);
    let row = client.row_opt(UPSERT, &params).await.map_err(DbError::query("upsert an application state"))?;
    row.map(|row| row.try_get("seq")).transpose().map_err(DbError::query("upsert an application state"))
}

/// Records a sync's progress on its `sync_operation` row when it changed. Returns
/// whether a row was written.
pub async fn sync_operation_progress(
    client: &impl Statements,
    epoch: &InstanceEpoch,
    observed: &ObservedSync,
) -> Result<bool, DbError> {
    let row = client
        .row_opt(
            SYNC_PROGRESS,
            &[
                &observed.correlation_id,
                &observed.application_id.0,
                &observed.state,
                &observed.synced_revision,
                &observed.message,
                &observed.started_at,
                &observed.finished_at,
                &epoch.instance,
                &epoch.current(),
            ],
        )
        .await
        .map_err(DbError::query("record sync progress"))?;
    Ok(row.is_some())
}
