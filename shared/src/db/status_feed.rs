//! The status feed: what a writer reads to carry observed state back to tenant
//! resources, and its durable cursor (`writer_shard.status_xid`).
//!
//! A writer reads, per shard it owns, the `application_state` and `resource_state`
//! rows changed by transactions at or after the shard's cursor, in transaction
//! order. The cursor is a transaction id because sequence numbers are taken before commit and so
//! become visible out of order, whereas every transaction older than a snapshot's
//! `xmin` has finished, and its rows are visible in that snapshot. After handling
//! a batch the cursor moves to that `xmin` (or, for a full batch, to the last
//! handled row's transaction if that is lower): rows of transactions still in
//! flight stay at or past the cursor and are read once they commit. Rows at the
//! cursor may be read twice; patching only what changed makes that harmless.
//! Only the shard's current owner, under an unexpired lease, may move the
//! cursor, and it never moves backwards.

use serde_json::Value;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::db::resource_state::StateOf;
use crate::db::{DbError, Statements};
use crate::model::{ApplicationId, RowState, SyncOperationId, SyncOperationState};

/// Rows read per shard and statement.
pub const STATUS_FEED_BATCH: i64 = 500;

pub use crate::db::writer_shard::writer_shard_advance_status;

/// One changed `application_state` row with where its tenant resource lives.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusFeedRow {
    pub seq: i64,
    /// The transaction that made the change (`changed_xid`).
    pub xid: i64,
    /// The reader's snapshot `xmin`: every transaction older has finished.
    pub snapshot_xmin: i64,
    pub application_id: ApplicationId,
    /// Whether the row waits in `status_retry` (see `crate::db::status_retry`).
    pub retrying: bool,
    pub namespace: String,
    pub resource_name: String,
    pub resource_uid: Uuid,
    /// The managed environment's resource name, if the deployment names one (None
    /// for the tenant's own namespace, whose home environment has no resource).
    pub environment: Option<String>,
    pub sync_status: Option<String>,
    pub sync_revision: Option<String>,
    pub health_status: Option<String>,
    pub health_message: Option<String>,
    pub resources: Value,
    pub conditions: Value,
    pub operation_state: Option<Value>,
    pub reconciled_state: Option<Value>,
    /// The application row's state: the agent touches the state row when it
    /// confirms a deletion, so a writer waiting for the prune hears of it.
    pub row_state: RowState,
    /// The generation of the row the agent last applied.
    pub applied_generation: Option<i64>,
    /// The tenant's message of the agent's last failed reconcile (None after a success).
    pub agent_message: Option<String>,
    /// Whether that failure is permanent (retrying cannot help).
    pub agent_stalled: bool,
    /// Why the tenant is moving to another engine instance (`failover`,
    /// `degraded`, `rebalance`, `drain`, an operator's word); None: not moving.
    pub moving: Option<String>,
    /// Why a deletion is stuck (Argo CD has not removed its finalizer for long).
    pub deletion_message: Option<String>,
    /// The health of the tenant's engine instance (`healthy`, `degraded`, `lost`).
    pub instance_health: Option<String>,
}

/// What the agent last made of a managed environment or a repository credential.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceFeedRow {
    pub seq: i64,
    pub xid: i64,
    pub snapshot_xmin: i64,
    pub kind: StateOf,
    pub id: i64,
    /// Whether the row waits in `status_retry`.
    pub retrying: bool,
    pub namespace: String,
    pub resource_name: String,
    pub resource_uid: Uuid,
    pub row_state: RowState,
    /// The generation of the row the agent last applied.
    pub applied_generation: Option<i64>,
    /// The tenant's message of the agent's last failed reconcile (None after a success).
    pub agent_message: Option<String>,
    /// Whether that failure is permanent.
    pub agent_stalled: bool,
    /// Why the tenant is moving to another engine instance (`failover`,
    /// `degraded`, `rebalance`, `drain`, an operator's word); None: not moving.
    pub moving: Option<String>,
    /// The health of the tenant's engine instance.
    pub instance_health: Option<String>,
}

/// One row of the feed, of whichever kind.
#[derive(Debug, Clone, PartialEq)]
pub enum FeedRow {
    Application(Box<StatusFeedRow>),
    Resource(ResourceFeedRow),
}

impl FeedRow {
    /// The transaction that made the change.
    pub fn xid(&self) -> i64 {
        match self {
            FeedRow::Application(row) => row.xid,
            FeedRow::Resource(row) => row.xid,
        }
    }

    /// The reader's snapshot `xmin`.
    pub fn snapshot_xmin(&self) -> i64 {
        match self {
            FeedRow::Application(row) => row.snapshot_xmin,
            FeedRow::Resource(row) => row.snapshot_xmin,
        }
    }

    /// Whether the row waits in `status_retry`.
    pub fn retrying(&self) -> bool {
        match self {
            FeedRow::Application(row) => row.retrying,
            FeedRow::Resource(row) => row.retrying,
        }
    }

    /// The tenant resource's namespace and name.
    pub fn names(&self) -> (&str, &str) {
        match self {
            FeedRow::Application(row) => (&row.namespace, &row.resource_name),
            FeedRow::Resource(row) => (&row.namespace, &row.resource_name),
        }
    }
}

/// One sync request of a deployment, for its GitOpsDeploymentSyncRun's status.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncRunRow {
    pub id: SyncOperationId,
    pub namespace: String,
    pub resource_name: String,
    pub resource_uid: Uuid,
    pub state: SyncOperationState,
    pub synced_revision: Option<String>,
    pub message: Option<String>,
    /// Why the service ended the sync (`InstanceMoved`); None when Argo CD did.
    pub failure_reason: Option<String>,
}

/// The feed's read: up to $3 rows of shard $1 past its cursor.
///
/// The shard must be owned by $2 under a live lease: a writer that lost the shard
/// reads nothing. The snapshot's xmin comes from the same statement, so from the
/// snapshot the rows were read with. xid8 travels as text. Applications, managed
/// environments and repository credentials come in one transaction order; the
/// latter two carry only the agent's outcome (the application columns are null).
///
/// A state row carries its tenant's shard (kept by the triggers of migration V28),
/// so each table is read as one range of its (writer_shard, changed_xid, seq) index
/// past the cursor, in the order returned and cut at the batch: a read costs about
/// the rows it returns, however many tenants the shard holds (probing each tenant,
/// as before, cost ~700 buffers at 10,000 tenants). Each branch filters before its
/// own limit, so the union's first rows are the feed's first rows. A generic plan
/// cannot know that few rows lie past the cursor (it guesses a third of the
/// shard's), and would then hash all tenants or applications to join them: the
/// `OFFSET 0` subqueries keep those joins to one primary-key probe per row read. `w` is
/// materialised so that the plan does not depend on the cursor's value, and the
/// statement is planned once per connection.
pub const FEED_READ: &str = "
WITH w AS MATERIALIZED (
    SELECT shard, status_xid FROM writer_shard
     WHERE shard = $1 AND writer_id = $2 AND lease_expires_at > now()
)
SELECT f.*, f.changed_xid::text::bigint AS xid,
       pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS snapshot_xmin,
       EXISTS (SELECT 1 FROM status_retry r WHERE r.kind = f.kind AND r.row_id = f.row_id) AS retrying,
       engine_instance_health(e.heartbeat_at, e.progress_at) AS instance_health
  FROM w
 CROSS JOIN LATERAL (
    (SELECT 'application' AS kind, s.seq, s.changed_xid, a.id AS row_id, t.namespace_name, t.engine_instance_id,
            CASE WHEN t.move_state IS NOT NULL THEN COALESCE(t.move_reason, '') END AS moving,
            a.resource_name, a.resource_uid, CASE WHEN m.home THEN NULL ELSE m.resource_name END AS environment,
            s.sync_status, s.sync_revision, s.health_status, s.health_message,
            s.resources, s.conditions, s.operation_state, s.reconciled_state, a.row_state,
            s.applied_generation, s.agent_message, s.agent_stalled, a.deletion_message
       FROM application_state s
      CROSS JOIN LATERAL (SELECT * FROM application WHERE id = s.application_id AND tenant_id = s.tenant_id
                           OFFSET 0) a
      CROSS JOIN LATERAL (SELECT * FROM tenant WHERE id = s.tenant_id OFFSET 0) t
       LEFT JOIN managed_environment m ON m.id = a.managed_environment_id
      WHERE s.writer_shard = w.shard AND s.changed_xid >= w.status_xid
      ORDER BY s.changed_xid, s.seq
      LIMIT $3)
    UNION ALL
    (SELECT CASE WHEN r.id IS NOT NULL THEN 'managed_environment' ELSE 'repository_credential' END,
            s.seq, s.changed_xid, COALESCE(r.id, c.id), t.namespace_name, t.engine_instance_id,
            CASE WHEN t.move_state IS NOT NULL THEN COALESCE(t.move_reason, '') END,
            COALESCE(r.resource_name, c.resource_name), COALESCE(r.resource_uid, c.resource_uid),
            NULL, NULL, NULL, NULL, NULL, '[]'::jsonb, '[]'::jsonb, NULL, NULL, COALESCE(r.row_state, c.row_state),
            s.applied_generation, s.agent_message, s.agent_stalled, NULL
       FROM resource_state s
      CROSS JOIN LATERAL (SELECT * FROM tenant WHERE id = s.tenant_id OFFSET 0) t
       LEFT JOIN managed_environment r ON r.id = s.managed_environment_id AND r.tenant_id = s.tenant_id
       LEFT JOIN repository_credential c ON c.id = s.repository_credential_id AND c.tenant_id = s.tenant_id
      WHERE s.writer_shard = w.shard AND s.changed_xid >= w.status_xid AND (r.id IS NOT NULL OR c.id IS NOT NULL)
      ORDER BY s.changed_xid, s.seq
      LIMIT $3)
  ) f
  LEFT JOIN engine_instance e ON e.id = f.engine_instance_id
 ORDER BY f.changed_xid, f.seq
 LIMIT $3";

const SYNC_RUNS_OF: &str = "
SELECT o.id, t.namespace_name, o.resource_name, o.resource_uid, o.state, o.synced_revision, o.message,
       o.failure_reason
  FROM sync_operation o JOIN tenant t ON t.id = o.tenant_id
 WHERE o.application_id = ANY($1) AND o.row_state = 'active'
 ORDER BY o.id";

const SYNC_RUNS_BY_ID: &str = "
SELECT o.id, t.namespace_name, o.resource_name, o.resource_uid, o.state, o.synced_revision, o.message,
       o.failure_reason
  FROM sync_operation o JOIN tenant t ON t.id = o.tenant_id
 WHERE o.id = ANY($1) AND o.row_state = 'active'
 ORDER BY o.id";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[FEED_READ, SYNC_RUNS_OF, SYNC_RUNS_BY_ID];

impl TryFrom<&tokio_postgres::Row> for FeedRow {
    type Error = tokio_postgres::Error;

    fn try_from(row: &tokio_postgres::Row) -> Result<Self, Self::Error> {
        let kind = match row.try_get::<_, &str>("kind")? {
            "managed_environment" => StateOf::ManagedEnvironment,
            "repository_credential" => StateOf::RepositoryCredential,
            _ => return StatusFeedRow::try_from(row).map(|row| FeedRow::Application(Box::new(row))),
        };
        Ok(FeedRow::Resource(ResourceFeedRow {
            seq: row.try_get("seq")?,
            xid: row.try_get("xid")?,
            snapshot_xmin: row.try_get("snapshot_xmin")?,
            kind,
            id: row.try_get("row_id")?,
            retrying: row.try_get("retrying")?,
            namespace: row.try_get("namespace_name")?,
            resource_name: row.try_get("resource_name")?,
            resource_uid: row.try_get("resource_uid")?,
            row_state: row.try_get("row_state")?,
            applied_generation: row.try_get("applied_generation")?,
            agent_message: row.try_get("agent_message")?,
            agent_stalled: row.try_get("agent_stalled")?,
            moving: row.try_get("moving")?,
            instance_health: row.try_get("instance_health")?,
        }))
    }
}

impl TryFrom<&tokio_postgres::Row> for StatusFeedRow {
    type Error = tokio_postgres::Error;

    fn try_from(row: &tokio_postgres::Row) -> Result<Self, Self::Error> {
        Ok(StatusFeedRow {
            seq: row.try_get("seq")?,
            xid: row.try_get("xid")?,
            snapshot_xmin: row.try_get("snapshot_xmin")?,
            application_id: ApplicationId(row.try_get("row_id")?),
            retrying: row.try_get("retrying")?,
            namespace: row.try_get("namespace_name")?,
            resource_name: row.try_get("resource_name")?,
            resource_uid: row.try_get("resource_uid")?,
            environment: row.try_get("environment")?,
            sync_status: row.try_get("sync_status")?,
            sync_revision: row.try_get("sync_revision")?,
            health_status: row.try_get("health_status")?,
            health_message: row.try_get("health_message")?,
            resources: row.try_get("resources")?,
            conditions: row.try_get("conditions")?,
            operation_state: row.try_get("operation_state")?,
            reconciled_state: row.try_get("reconciled_state")?,
            row_state: row.try_get("row_state")?,
            applied_generation: row.try_get("applied_generation")?,
            agent_message: row.try_get("agent_message")?,
            agent_stalled: row.try_get("agent_stalled")?,
            moving: row.try_get("moving")?,
            deletion_message: row.try_get("deletion_message")?,
            instance_health: row.try_get("instance_health")?,
        })
    }
}

/// Up to `limit` rows of `shard` past its cursor, in transaction order; none
/// unless `writer_id` holds the shard's lease.
pub async fn status_feed_read(
    client: &impl Statements,
    shard: i32,
    writer_id: &str,
    limit: i64,
) -> Result<Vec<FeedRow>, DbError> {
    let rows =
        client.rows(FEED_READ, &[&shard, &writer_id, &limit]).await.map_err(DbError::query("read the status feed"))?;
    rows.iter().map(|row| FeedRow::try_from(row).map_err(DbError::query("read the status feed"))).collect()
}

/// Where the cursor may move after the first `handled` of `rows` (one read, in
/// transaction order, of at most `batch` rows) were handled: to the snapshot's
/// `xmin` when the read was not cut short and every row was handled; otherwise to
/// the last handled row's transaction (inclusive: its other rows are read again),
/// and never past the `xmin`. None when nothing was handled.
pub fn cursor_after(rows: &[FeedRow], handled: usize, batch: i64) -> Option<i64> {
    let last = rows.get(handled.checked_sub(1)?)?;
    let whole = handled == rows.len() && (rows.len() as i64) < batch;
    Some(if whole { last.snapshot_xmin() } else { last.xid().min(last.snapshot_xmin()) })
}

/// The active sync requests of `applications`.
pub async fn sync_runs_of_applications(
    client: &Client,
    applications: &[ApplicationId],
) -> Result<Vec<SyncRunRow>, DbError> {
    sync_runs(client, SYNC_RUNS_OF, applications).await
}

/// The active sync requests with these ids.
pub async fn sync_runs_by_id(client: &Client, ids: &[SyncOperationId]) -> Result<Vec<SyncRunRow>, DbError> {
    sync_runs(client, SYNC_RUNS_BY_ID, ids).await
}

async fn sync_runs<T: tokio_postgres::types::ToSql + Sync>(
    client: &Client,
    statement: &str,
    ids: &[T],
) -> Result<Vec<SyncRunRow>, DbError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = client.query(statement, &[&ids]).await.map_err(DbError::query("read sync requests"))?;
    let read = |row: &tokio_postgres::Row| -> Result<SyncRunRow, tokio_postgres::Error> {
        Ok(SyncRunRow {
            id: row.try_get("id")?,
            namespace: row.try_get("namespace_name")?,
            resource_name: row.try_get("resource_name")?,
            resource_uid: row.try_get("resource_uid")?,
            state: row.try_get("state")?,
            synced_revision: row.try_get("synced_revision")?,
            message: row.try_get("message")?,
            failure_reason: row.try_get("failure_reason")?,
        })
    };
    rows.iter().map(|row| read(row).map_err(DbError::query("read sync requests"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(xid: i64, snapshot_xmin: i64) -> FeedRow {
        FeedRow::Application(Box::new(StatusFeedRow {
            seq: xid,
            xid,
            snapshot_xmin,
            application_id: ApplicationId(1),
            retrying: false,
            namespace: "ns".into(),
            resource_name: "app".into(),
            resource_uid: Uuid::nil(),
            environment: None,
            sync_status: None,
            sync_revision: None,
            health_status: None,
            health_message: None,
            resources: Value::Array(Vec::new()),
            conditions: Value::Array(Vec::new()),
            operation_state: None,
            reconciled_state: None,
            row_state: RowState::Active,
            applied_generation: None,
            agent_message: None,
            agent_stalled: false,
            moving: None,
            deletion_message: None,
            instance_health: None,
        }))
    }

    #[test]
    fn the_cursor_never_passes_the_snapshot_xmin_or_an_unhandled_row() {
        // A whole read: to the xmin, even when rows of later transactions were seen.
        assert_eq!(cursor_after(&[row(3, 9), row(5, 9)], 2, 500), Some(9));
        assert_eq!(cursor_after(&[row(3, 4), row(7, 4)], 2, 500), Some(4));
        // A full batch: the last row's transaction, at most the xmin.
        assert_eq!(cursor_after(&[row(3, 9), row(5, 9)], 2, 2), Some(5));
        assert_eq!(cursor_after(&[row(3, 4), row(7, 4)], 2, 2), Some(4));
        // A failure part-way: the last handled row's transaction.
        assert_eq!(cursor_after(&[row(3, 9), row(5, 9), row(6, 9)], 2, 500), Some(5));
        assert_eq!(cursor_after(&[row(3, 9)], 0, 500), None);
        assert_eq!(cursor_after(&[], 0, 500), None);
    }
}
