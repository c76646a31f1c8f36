//! Operator views and actions on the queue (what `gitopsctl queue` shows and does;
//! the same questions as `sql/inspect/*.sql`).

use std::time::Duration;

use tokio_postgres::Client;

use crate::db::{DbError, column, in_txn_retrying};
use crate::model::{OperationId, OperationState};

/// Queue depth of one instance in one state.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSummaryRow {
    pub instance: String,
    pub state: OperationState,
    pub operations: i64,
    /// Age of the oldest operation in this state (by creation).
    pub oldest: Option<Duration>,
}

/// The queue at a glance.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSummary {
    pub rows: Vec<QueueSummaryRow>,
    /// Claimed operations whose lease has expired (a claimer crashed or stalled).
    pub expired_leases: i64,
    /// Operations completed in the last hour.
    pub completed_last_hour: i64,
}

const SUMMARY: &str = include_str!("../../../sql/inspect/queue_depth.sql");

const EXPIRED_COUNT: &str =
    "SELECT count(*) AS expired FROM operation WHERE state = 'claimed' AND lease_expires_at < now()";

const COMPLETED_LAST_HOUR: &str = "SELECT count(*) AS completed FROM operation_history
 WHERE state = 'completed' AND completed_at > now() - interval '1 hour'";

// Each count through its own partial index.
const WAITING: &str = "
SELECT (SELECT count(*) FROM operation WHERE engine_instance_id = $1 AND state = 'waiting') AS waiting,
       (SELECT count(*) FROM operation WHERE engine_instance_id = $1 AND state = 'failed') AS failed";

/// Operations of `instance` waiting to be claimed, and its dead letters.
pub async fn operation_waiting_count(
    client: &Client,
    instance: crate::model::EngineInstanceId,
) -> Result<(i64, i64), DbError> {
    let row = client.query_one(WAITING, &[&instance]).await.map_err(DbError::query("count waiting operations"))?;
    let read = |column| row.try_get(column).map_err(DbError::query("count waiting operations"));
    Ok((read("waiting")?, read("failed")?))
}

/// Reads the queue summary.
pub async fn queue_summary(client: &Client) -> Result<QueueSummary, DbError> {
    let read = |row: &tokio_postgres::Row| -> Result<QueueSummaryRow, tokio_postgres::Error> {
        Ok(QueueSummaryRow {
            instance: row.try_get("instance")?,
            state: row.try_get("state")?,
            operations: row.try_get("operations")?,
            oldest: row.try_get::<_, Option<f64>>("oldest_age_s")?.map(|s| Duration::from_secs_f64(s.max(0.0))),
        })
    };
    let rows = client.query(SUMMARY, &[]).await.map_err(DbError::query("summarise the queue"))?;
    let rows = rows.iter().map(read).collect::<Result<_, _>>().map_err(DbError::query("summarise the queue"))?;
    let row = client.query_one(EXPIRED_COUNT, &[]).await.map_err(DbError::query("count expired leases"))?;
    let expired_leases = column(&row, "expired", "count expired leases")?;
    let row = client.query_one(COMPLETED_LAST_HOUR, &[]).await.map_err(DbError::query("count recent completions"))?;
    let completed_last_hour = column(&row, "completed", "count recent completions")?;
    Ok(QueueSummary { rows, expired_leases, completed_last_hour })
}

/// What `operation_retry` did with one dead operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryOutcome {
    /// Waiting again, due now, with its attempts reset.
    Requeued,
    /// Its resource already has a waiting operation, which will do the work.
    Superseded,
    /// No failed operation with that id.
    NotFailed,
}

const RETRY_ONE: &str = requeue_or_supersede!(
    "o.id = $1 AND o.state = 'failed'",
    "state = 'waiting', attempts = 0, lease_expiries = 0, run_after = now(), completed_at = NULL",
    "0",
    "0",
    "operator_error"
);

/// Puts one dead operation back in the queue.
pub async fn operation_retry(client: &mut Client, id: OperationId) -> Result<RetryOutcome, DbError> {
    in_txn_retrying(client, |txn| {
        Box::pin(async move {
            let row = txn.query_opt(RETRY_ONE, &[&id.0]).await.map_err(DbError::query("retry a failed operation"))?;
            Ok(match row.map(|row| row.get::<_, OperationState>(0)) {
                None => RetryOutcome::NotFailed,
                Some(OperationState::Superseded) => RetryOutcome::Superseded,
                Some(_) => RetryOutcome::Requeued,
            })
        })
    })
    .await
}

const FAILED_IDS: &str = "SELECT id FROM operation WHERE state = 'failed' ORDER BY id";

const DISCARD_ONE: &str = "DELETE FROM operation WHERE id = $1 AND state = 'failed'";

const DISCARD_ALL: &str = "DELETE FROM operation WHERE state = 'failed'";

/// Removes one dead letter (its resource keeps what the last success left); false
/// when there is no failed operation with that id.
pub async fn operation_discard(client: &Client, id: OperationId) -> Result<bool, DbError> {
    let removed = client.execute(DISCARD_ONE, &[&id]).await.map_err(DbError::query("discard a failed operation"))?;
    Ok(removed > 0)
}

/// Removes every dead letter; returns how many.
pub async fn operation_discard_all_failed(client: &Client) -> Result<u64, DbError> {
    client.execute(DISCARD_ALL, &[]).await.map_err(DbError::query("discard the failed operations"))
}

/// Puts every dead operation back; returns (requeued, superseded).
pub async fn operation_retry_all_failed(client: &mut Client) -> Result<(u64, u64), DbError> {
    let rows = client.query(FAILED_IDS, &[]).await.map_err(DbError::query("list failed operations"))?;
    let ids: Vec<OperationId> =
        rows.iter().map(|row| column(row, "id", "list failed operations")).collect::<Result<_, _>>()?;
    let (mut requeued, mut superseded) = (0, 0);
    for id in ids {
        match operation_retry(client, id).await? {
            RetryOutcome::Requeued => requeued += 1,
            RetryOutcome::Superseded => superseded += 1,
            RetryOutcome::NotFailed => {}
        }
    }
    Ok((requeued, superseded))
}

/// A dead-lettered operation as an operator sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedOperation {
    pub id: OperationId,
    pub instance: String,
    pub resource_type: crate::model::ResourceType,
    pub resource_id: i64,
    pub attempts: i32,
    pub operator_error: Option<String>,
    pub tenant_message: Option<String>,
    pub failed_at: Option<std::time::SystemTime>,
}

impl TryFrom<&tokio_postgres::Row> for FailedOperation {
    type Error = tokio_postgres::Error;

    fn try_from(row: &tokio_postgres::Row) -> Result<Self, Self::Error> {
        Ok(FailedOperation {
            id: row.try_get("id")?,
            instance: row.try_get("instance")?,
            resource_type: row.try_get("resource_type")?,
            resource_id: row.try_get("resource_id")?,
            attempts: row.try_get("attempts")?,
            operator_error: row.try_get("operator_error")?,
            tenant_message: row.try_get("tenant_message")?,
            failed_at: row.try_get("completed_at")?,
        })
    }
}

// Served by operation_failed_idx for the state; a dead letter queue stays small.
const FAILED: &str = "
SELECT o.id, i.name AS instance, o.resource_type, o.resource_id, o.attempts,
       o.operator_error, o.tenant_message, o.completed_at
  FROM operation o
  JOIN engine_instance i ON i.id = o.engine_instance_id
 WHERE o.state = 'failed'
 ORDER BY o.id
 LIMIT $1";

/// Up to `limit` failed operations, oldest id first.
pub async fn operation_list_failed(client: &Client, limit: i64) -> Result<Vec<FailedOperation>, DbError> {
    let rows = client.query(FAILED, &[&limit]).await.map_err(DbError::query("select failed operations"))?;
    rows.iter().map(|row| FailedOperation::try_from(row).map_err(DbError::query("read a failed operation"))).collect()
}
