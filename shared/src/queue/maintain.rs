//! Queue upkeep run by every consumer: reclaiming expired leases and pruning
//! finished operations, and how long until the next lease of an instance expires
//! (so that a consumer reclaims a crashed claimer's operations as soon as they are
//! due, not on its next round).

use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::types::Type;

use super::floor::SHARED_FLOOR;
use super::{RetryPolicy, secs};
use crate::db::{DbError, column, in_txn_retrying};
use crate::model::{EngineInstanceId, OperationId};

// Claimed operations are found by key from the instance's lease floor ($2), over
// operation_claimed_key_idx: the live ones (a few batches) and the entries left by
// what was claimed since the oldest of them, not every lease taken since a held
// snapshot (see migrations/V21 and `operation_lease_floor`).

// Expired claims of one instance, locked so two reclaimers never handle the same row.
const EXPIRED: &str = "
SELECT o.id, o.lease_expiries,
       (SELECT w.id FROM operation w
         WHERE w.state = 'waiting' AND w.resource_type = o.resource_type
           AND w.resource_id = o.resource_id) AS waiting_id
  FROM operation o
 WHERE o.engine_instance_id = $1 AND o.state = 'claimed' AND o.queue_key >= $2
   AND o.lease_expires_at < now()
 ORDER BY o.lease_expires_at
 LIMIT $3
   FOR UPDATE OF o SKIP LOCKED";

// How long until the first claimed lease of an instance expires (NULL: none claimed).
// Measured on the database's clock, like the lease.
pub const NEXT_LEASE_EXPIRY: &str = "
SELECT extract(epoch FROM min(lease_expires_at) - now())::float8 AS expires_in_s
  FROM operation
 WHERE engine_instance_id = $1 AND state = 'claimed' AND queue_key >= $2";

// The lowest claimed key from the lease floor on, bounded by the claim floor ($2),
// which the caller read before this statement's snapshot was taken: whatever is
// claimed after the snapshot was waiting then, at or above that floor. The lease
// floor is raised to the result.
const LEASE_FLOOR: &str = "
SELECT operation_advance_mark('lease_floor', $1,
         LEAST($2::bigint,
               (SELECT queue_key FROM operation
                 WHERE engine_instance_id = $1 AND state = 'claimed'
                   AND queue_key >= operation_mark('lease_floor', $1)
                 ORDER BY queue_key LIMIT 1))) AS floor";

/// Raises the lease floor of `instance` (a lower bound of every claimed operation's
/// key) as far as it goes now, and returns it. Two statements, outside a
/// transaction: the claim floor must be read before the claimed keys are looked at.
pub async fn operation_lease_floor(client: &Client, instance: EngineInstanceId) -> Result<i64, DbError> {
    let action = "find the lease floor";
    let row =
        client.query_typed_one(SHARED_FLOOR, &[(&instance.0, Type::INT8)]).await.map_err(DbError::query(action))?;
    let claim_floor: i64 = column(&row, "floor", action)?;
    let row = client
        .query_typed_one(LEASE_FLOOR, &[(&instance.0, Type::INT8), (&claim_floor, Type::INT8)])
        .await
        .map_err(DbError::query(action))?;
    column(&row, "floor", action)
}

const RECLAIM_TO_WAITING: &str = "
UPDATE operation SET state = 'waiting', run_after = now(), lease_expires_at = NULL,
       lease_expiries = lease_expiries + 1,
       operator_error = 'lease expired: the claimer crashed or stalled'
 WHERE id = $1";

const RECLAIM_DEAD: &str = "
UPDATE operation SET state = 'failed', completed_at = clock_timestamp(), lease_expires_at = NULL,
       lease_expiries = lease_expiries + 1,
       operator_error = 'lease expired ' || (lease_expiries + 1) || ' times: every claimer crashed or stalled on it',
       tenant_message = 'The service could not process this change: it stopped every attempt. It is not retried; '
                        || 'change the resource, or ask the operator to look at the failed operation.'
 WHERE id = $1";

// The waiting operation takes over, inheriting the expiries so that a resource that
// crashes its claimers still ends in `failed`; the expired one is filed as superseded.
const RECLAIM_MERGE: &str = concat!(
    "
WITH finished AS (
    DELETE FROM operation WHERE id = $1 RETURNING *
), filed AS (
    ",
    file_finished!(
        "superseded",
        "attempts",
        "lease_expiries + 1",
        "'lease expired; a newer waiting operation takes over'"
    ),
    "
)
UPDATE operation w SET attempts = GREATEST(w.attempts, finished.attempts),
                       lease_expiries = GREATEST(w.lease_expiries, finished.lease_expiries + 1)
  FROM finished WHERE w.id = $2"
);

/// Handles up to `limit` expired leases of `instance`: back to waiting, merged into
/// the resource's waiting operation, or dead-lettered past the attempt limit.
/// Returns how many were handled.
pub async fn operation_reclaim_expired(
    client: &mut Client,
    instance: EngineInstanceId,
    policy: &RetryPolicy,
    limit: i64,
) -> Result<u64, DbError> {
    let max_attempts = policy.max_attempts;
    let floor = operation_lease_floor(client, instance).await?;
    in_txn_retrying(client, |txn| {
        Box::pin(async move {
            let rows = txn
                .query(EXPIRED, &[&instance.0, &floor, &limit])
                .await
                .map_err(DbError::query("find expired leases"))?;
            for row in &rows {
                let read = "read an expired lease";
                let id: OperationId = column(row, "id", read)?;
                let expiries: i32 = column(row, "lease_expiries", read)?;
                let waiting: Option<OperationId> = column(row, "waiting_id", read)?;
                if expiries + 1 >= max_attempts {
                    txn.execute(RECLAIM_DEAD, &[&id])
                        .await
                        .map_err(DbError::query("dead-letter an expired operation"))?;
                } else if let Some(waiting_id) = waiting {
                    txn.execute(RECLAIM_MERGE, &[&id, &waiting_id])
                        .await
                        .map_err(DbError::query("merge an expired operation"))?;
                } else {
                    txn.execute(RECLAIM_TO_WAITING, &[&id])
                        .await
                        .map_err(DbError::query("requeue an expired operation"))?;
                }
            }
            Ok(rows.len() as u64)
        })
    })
    .await
}

const MAKE_DUE: &str = "
UPDATE operation SET run_after = now()
 WHERE engine_instance_id = $1 AND state = 'waiting' AND run_after > now()";

/// Makes every backed-off waiting operation of `instance` due now (its instance
/// recovered: what failed because of it need not wait out its backoff).
pub async fn operation_make_due(client: &Client, instance: EngineInstanceId) -> Result<u64, DbError> {
    client.execute(MAKE_DUE, &[&instance]).await.map_err(DbError::query("make waiting operations due"))
}

/// How long until the first claimed lease of `instance` expires: zero when one has
/// expired already, None when nothing is claimed.
pub async fn operation_next_lease_expiry(
    client: &Client,
    instance: EngineInstanceId,
) -> Result<Option<Duration>, DbError> {
    let action = "find the next lease expiry";
    let floor = operation_lease_floor(client, instance).await?;
    let rows = client
        .query_typed(NEXT_LEASE_EXPIRY, &[(&instance.0, Type::INT8), (&floor, Type::INT8)])
        .await
        .map_err(DbError::query(action))?;
    let row = rows.first().ok_or(DbError::NotFound { what: "the next lease expiry".to_owned() })?;
    let expires_in_s: Option<f64> = column(row, "expires_in_s", action)?;
    Ok(expires_in_s.map(|s| Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::ZERO)))
}

const PRUNE: &str = "
DELETE FROM operation_history WHERE id IN (
    SELECT id FROM operation_history
     WHERE completed_at < now() - make_interval(secs => $1)
     ORDER BY completed_at
     LIMIT $2)";

// Finished rows an agent of the release before V25 left in the queue table while
// the new agents rolled out (operation_prune_idx; empty once they are gone).
const PRUNE_LEGACY: &str = "
DELETE FROM operation WHERE id IN (
    SELECT id FROM operation
     WHERE state IN ('completed', 'superseded')
       AND completed_at < now() - make_interval(secs => $1)
     ORDER BY completed_at
     LIMIT $2)";

const PRUNE_FAILED: &str = "
DELETE FROM operation WHERE id IN (
    SELECT id FROM operation
     WHERE state = 'failed' AND completed_at < now() - make_interval(secs => $1)
     ORDER BY completed_at
     LIMIT $2)";

/// Deletes up to `batch` finished operations (`operation_history`) older than `retention`, and up to
/// `batch` dead letters older than `failed_retention` (None: kept).
pub async fn operation_prune(
    client: &Client,
    retention: Option<Duration>,
    failed_retention: Option<Duration>,
    batch: i64,
) -> Result<u64, DbError> {
    let mut pruned = 0;
    if let Some(retention) = retention {
        for statement in [PRUNE, PRUNE_LEGACY] {
            pruned += client
                .execute(statement, &[&secs(retention), &batch])
                .await
                .map_err(DbError::query("prune finished operations"))?;
        }
    }
    if let Some(retention) = failed_retention {
        pruned += client
            .execute(PRUNE_FAILED, &[&secs(retention), &batch])
            .await
            .map_err(DbError::query("prune failed operations"))?;
    }
    Ok(pruned)
}
