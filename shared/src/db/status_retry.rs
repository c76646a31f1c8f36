//! The `status_retry` table (migration V24): status-feed rows a writer passed over
//! because their own resource refused the patch, or kept changing under it.
//!
//! A shard's status feed is read in transaction order behind one cursor, so a row
//! that cannot be patched would otherwise hold back every row after it, those of
//! every other tenant of the shard, for as long as that one object refuses. Instead
//! the writer records the row here in the transaction that moves the cursor past
//! it. When the row comes due, the shard's owner stamps its state row again (the
//! same content, a new transaction id), which puts it back at the end of the feed,
//! and pushes its due time on by the row's delay (1 s, doubling per failed attempt,
//! at most 60 s). A patch that succeeds, or finds the object gone, deletes the row;
//! so does a replay that finds the state row gone. Nothing is held in a writer's
//! memory: a writer that dies leaves the rows to the shard's next owner.

use std::time::Duration;

use crate::db::resource_state::StateOf;
use crate::db::status_feed::FeedRow;
use crate::db::{DbError, Statements, column};

/// Which feed row a retry is for: the kind as the table spells it and the intent
/// row's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RetryKey {
    pub kind: &'static str,
    pub row_id: i64,
}

impl FeedRow {
    /// The row's key in `status_retry`.
    pub fn retry_key(&self) -> RetryKey {
        match self {
            FeedRow::Application(row) => RetryKey { kind: "application", row_id: row.application_id.0 },
            FeedRow::Resource(row) => RetryKey {
                kind: match row.kind {
                    StateOf::ManagedEnvironment => "managed_environment",
                    StateOf::RepositoryCredential => "repository_credential",
                },
                row_id: row.id,
            },
        }
    }
}

/// The retries of one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardRetries {
    pub shard: i32,
    /// Rows waiting to be tried again.
    pub waiting: u64,
    /// Until the first of them comes due (zero: due now).
    pub due_in: Duration,
}

// Per shard, by status_retry_shard_idx: usually no row at all.
const PENDING: &str = "
SELECT shard, count(*) AS waiting,
       GREATEST(0, extract(epoch FROM min(due_at) - now()))::float8 AS due_in_s
  FROM status_retry
 WHERE shard = ANY ($1::integer[])
 GROUP BY shard";

// Only the shard's owner, under its lease, puts rows back: those due now, and with
// them those due within the next few seconds (so replays come in batches), at most
// 500. A row whose state row is stamped again goes back in the feed (the
// stamp trigger gives it a new transaction id, past the cursor) and waits out its
// delay before the next replay. A state row another transaction holds (an agent
// writing it) is skipped, not waited for: it stays due. A row whose state row is
// gone (its intent was deleted) is dropped. The final SELECT only counts.
const REPLAY: &str = "
WITH owner AS (
    SELECT 1 FROM writer_shard WHERE shard = $1 AND writer_id = $2 AND lease_expires_at > now()
), due AS (
    SELECT r.kind, r.row_id FROM status_retry r
     WHERE r.shard = $1 AND r.due_at <= now() + interval '5 seconds' AND EXISTS (SELECT 1 FROM owner)
     ORDER BY r.due_at
     LIMIT 500
), application_locked AS (
    SELECT s.application_id FROM application_state s JOIN due ON due.kind = 'application' AND s.application_id = due.row_id
       FOR UPDATE OF s SKIP LOCKED
), environment_locked AS (
    SELECT s.managed_environment_id AS id FROM resource_state s
      JOIN due ON due.kind = 'managed_environment' AND s.managed_environment_id = due.row_id
       FOR UPDATE OF s SKIP LOCKED
), credential_locked AS (
    SELECT s.repository_credential_id AS id FROM resource_state s
      JOIN due ON due.kind = 'repository_credential' AND s.repository_credential_id = due.row_id
       FOR UPDATE OF s SKIP LOCKED
), applications AS (
    UPDATE application_state s SET updated_at = s.updated_at
      FROM application_locked l WHERE s.application_id = l.application_id
    RETURNING 'application'::text AS kind, s.application_id AS row_id
), environments AS (
    UPDATE resource_state s SET updated_at = s.updated_at
      FROM environment_locked l WHERE s.managed_environment_id = l.id
    RETURNING 'managed_environment'::text AS kind, s.managed_environment_id AS row_id
), credentials AS (
    UPDATE resource_state s SET updated_at = s.updated_at
      FROM credential_locked l WHERE s.repository_credential_id = l.id
    RETURNING 'repository_credential'::text AS kind, s.repository_credential_id AS row_id
), replayed AS (
    SELECT kind, row_id FROM applications
    UNION ALL SELECT kind, row_id FROM environments
    UNION ALL SELECT kind, row_id FROM credentials
), gone AS (
    DELETE FROM status_retry r USING due
     WHERE r.kind = due.kind AND r.row_id = due.row_id
       AND NOT EXISTS (SELECT 1 FROM application_state s
                        WHERE due.kind = 'application' AND s.application_id = due.row_id)
       AND NOT EXISTS (SELECT 1 FROM resource_state s
                        WHERE (due.kind = 'managed_environment' AND s.managed_environment_id = due.row_id)
                           OR (due.kind = 'repository_credential' AND s.repository_credential_id = due.row_id))
    RETURNING 1
), pushed AS (
    UPDATE status_retry r SET due_at = now() + status_retry_delay(r.attempts), updated_at = now()
      FROM replayed p WHERE r.kind = p.kind AND r.row_id = p.row_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM pushed) AS replayed, (SELECT count(*) FROM gone) AS dropped";

// A row that fails again counts one more attempt and waits longer.
const RECORD: &str = "
INSERT INTO status_retry (kind, row_id, shard, attempts, due_at, last_error)
SELECT f.kind, f.row_id, $1::integer, 1, now() + status_retry_delay(1), f.error
  FROM unnest($2::text[], $3::bigint[], $4::text[]) AS f (kind, row_id, error)
ON CONFLICT (kind, row_id) DO UPDATE
   SET shard = EXCLUDED.shard, attempts = status_retry.attempts + 1,
       due_at = now() + status_retry_delay(status_retry.attempts + 1),
       last_error = EXCLUDED.last_error, updated_at = now()";

const CLEAR: &str = "
DELETE FROM status_retry r
 USING unnest($1::text[], $2::bigint[]) AS d (kind, row_id)
 WHERE r.kind = d.kind AND r.row_id = d.row_id";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[PENDING, REPLAY, RECORD, CLEAR];

/// The shards of `shards` that have rows waiting, with how many and when the first
/// comes due.
pub async fn status_retry_pending(client: &impl Statements, shards: &[i32]) -> Result<Vec<ShardRetries>, DbError> {
    let action = "read the status retries";
    let rows = client.rows(PENDING, &[&shards]).await.map_err(DbError::query(action))?;
    rows.iter()
        .map(|row| {
            let waiting: i64 = column(row, "waiting", action)?;
            let due_in_s: f64 = column(row, "due_in_s", action)?;
            Ok(ShardRetries {
                shard: column(row, "shard", action)?,
                waiting: u64::try_from(waiting).unwrap_or(0),
                due_in: Duration::try_from_secs_f64(due_in_s).unwrap_or(Duration::ZERO),
            })
        })
        .collect()
}

/// Puts the due rows of `shard` back in its feed, if `writer_id` holds the shard;
/// returns how many went back. The stamp raises the `status` signal, as an agent's
/// write does: at most one such wake-up per replay, and replays come at most every
/// few seconds per shard.
pub async fn status_retry_replay(client: &impl Statements, shard: i32, writer_id: &str) -> Result<u64, DbError> {
    let action = "put status retries back in the feed";
    let row = client.row(REPLAY, &[&shard, &writer_id]).await.map_err(DbError::query(action))?;
    let replayed: i64 = column(&row, "replayed", action)?;
    let dropped: i64 = column(&row, "dropped", action)?;
    if dropped > 0 {
        tracing::debug!(shard, dropped, "status retries of deleted resources dropped");
    }
    Ok(u64::try_from(replayed).unwrap_or(0))
}

/// Records `failed` (each with the error to show operators) as rows of `shard` to
/// try again, and forgets the retries of `succeeded`, as part of `txn` (the one that
/// moves the shard's cursor past them).
pub async fn status_retry_settle_in_txn(
    txn: &impl Statements,
    shard: i32,
    failed: &[(RetryKey, String)],
    succeeded: &[RetryKey],
) -> Result<(), DbError> {
    if !failed.is_empty() {
        let mut failed: Vec<&(RetryKey, String)> = failed.iter().collect();
        failed.sort_by_key(|(key, _)| *key);
        failed.dedup_by_key(|(key, _)| *key);
        let kinds: Vec<&str> = failed.iter().map(|(key, _)| key.kind).collect();
        let ids: Vec<i64> = failed.iter().map(|(key, _)| key.row_id).collect();
        let errors: Vec<&str> = failed.iter().map(|(_, error)| error.as_str()).collect();
        txn.run(RECORD, &[&shard, &kinds, &ids, &errors]).await.map_err(DbError::query("record status retries"))?;
    }
    if !succeeded.is_empty() {
        let kinds: Vec<&str> = succeeded.iter().map(|key| key.kind).collect();
        let ids: Vec<i64> = succeeded.iter().map(|key| key.row_id).collect();
        txn.run(CLEAR, &[&kinds, &ids]).await.map_err(DbError::query("clear status retries"))?;
    }
    Ok(())
}
