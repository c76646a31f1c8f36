//! The writers' automatic scale-up (`instance_scale_up`): when the fleet's free
//! capacity falls below a threshold, a writer provisions the next instance. One
//! attempt is `provisioning` at a time — the partial unique index refuses a second
//! insert, so of two racing writers one begins and the other sees `None` — and the
//! attempt's writer renews it while it works; an attempt whose writer stopped
//! renewing is ended as failed by the next writer that looks.
//!
//! An attempt begins only if the fleet is still short when it does: the free
//! capacity is read again after taking a lock on the table that the end of an
//! attempt also needs (its UPDATE). A writer that looked while another attempt
//! was provisioning therefore either still finds that attempt provisioning, or
//! finds the instance it registered (registration commits before the attempt
//! ends), never neither — without this, an attempt ending between a writer's look
//! and its begin made a second, unneeded instance.

use std::time::{Duration, SystemTime};

use tokio_postgres::Client;

use crate::db::{DbError, column};

/// Tenants the fleet can still take: the free slots of instances open to placement
/// (not cordoned, not fenced; slots held for a rollout's tenants are not free); and
/// how many such instances there are.
const FREE_CAPACITY: &str = "
SELECT COALESCE(sum(greatest(capacity - tenants - reserved, 0)), 0)::bigint AS free, count(*)::bigint AS open
  FROM engine_instance
 WHERE NOT cordoned AND fenced_at IS NULL";

// Conflicts with itself and with the row locks of RENEW and FINISH, not with reads.
const LOCK: &str = "LOCK TABLE instance_scale_up IN SHARE ROW EXCLUSIVE MODE";

const ABANDON: &str = "
UPDATE instance_scale_up
   SET state = 'failed', finished_at = now(), error = 'abandoned: its writer stopped renewing it'
 WHERE state = 'provisioning' AND expires_at < now()";

// $5: the name to try again (a failed attempt's), else the next `<prefix>-<n>`.
const BEGIN: &str = "
INSERT INTO instance_scale_up (instance_name, holder, free_capacity, expires_at)
SELECT COALESCE($5::text, $1::text || '-' || (count(*) + 1)::text), $2::text, $3::bigint,
       now() + make_interval(secs => $4::float8)
  FROM instance_scale_up
RETURNING id, instance_name";

// The latest attempt, when it failed and its instance was never registered: what it
// made on the cluster may be completed by trying its name again.
const RETRYABLE: &str = "
SELECT s.instance_name FROM instance_scale_up s
 WHERE s.id = (SELECT max(id) FROM instance_scale_up) AND s.state = 'failed'
   AND NOT EXISTS (SELECT 1 FROM engine_instance e WHERE e.name = s.instance_name)";

const RENEW: &str = "
UPDATE instance_scale_up SET expires_at = now() + make_interval(secs => $3::float8)
 WHERE id = $1 AND holder = $2 AND state = 'provisioning'";

const FINISH: &str = "
UPDATE instance_scale_up SET state = $3, error = $4, finished_at = now()
 WHERE id = $1 AND holder = $2 AND state = 'provisioning'";

const RECENT: &str = "
SELECT id, instance_name, state, holder, free_capacity, error, started_at, finished_at
  FROM instance_scale_up ORDER BY id DESC LIMIT $1";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[FREE_CAPACITY, LOCK, ABANDON, BEGIN, RETRYABLE, RENEW, FINISH, RECENT];

/// The fleet's room for new tenants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeCapacity {
    /// Free slots over the instances open to placement.
    pub free: i64,
    /// Instances open to placement.
    pub open: i64,
}

/// One scale-up attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleUp {
    pub id: i64,
    pub instance_name: String,
    /// `provisioning`, `completed` or `failed`.
    pub state: String,
    pub holder: String,
    pub free_capacity: i64,
    pub error: Option<String>,
    pub started_at: SystemTime,
    pub finished_at: Option<SystemTime>,
}

impl TryFrom<&tokio_postgres::Row> for ScaleUp {
    type Error = tokio_postgres::Error;

    fn try_from(row: &tokio_postgres::Row) -> Result<Self, Self::Error> {
        Ok(ScaleUp {
            id: row.try_get("id")?,
            instance_name: row.try_get("instance_name")?,
            state: row.try_get("state")?,
            holder: row.try_get("holder")?,
            free_capacity: row.try_get("free_capacity")?,
            error: row.try_get("error")?,
            started_at: row.try_get("started_at")?,
            finished_at: row.try_get("finished_at")?,
        })
    }
}

/// The fleet's free capacity now.
pub async fn fleet_free_capacity(client: &Client) -> Result<FreeCapacity, DbError> {
    let action = "read the fleet's free capacity";
    let row = client.query_one(FREE_CAPACITY, &[]).await.map_err(DbError::query(action))?;
    Ok(FreeCapacity { free: column(&row, "free", action)?, open: column(&row, "open", action)? })
}

/// The name of the latest attempt when it failed before its instance was
/// registered (None otherwise): the next attempt may try it again.
pub async fn scale_up_retryable(client: &Client) -> Result<Option<String>, DbError> {
    let action = "read the last scale-up";
    let row = client.query_opt(RETRYABLE, &[]).await.map_err(DbError::query(action))?;
    row.map(|row| column(&row, "instance_name", action)).transpose()
}

/// Begins an attempt for `holder`, named `retry` (a failed attempt's name, see
/// [`scale_up_retryable`]) or else `<prefix>-<n>`, when the fleet's free capacity is
/// still below `below_free` (read again here: see the module's documentation). None
/// when the fleet has room by now or another attempt is provisioning (an abandoned
/// one is ended first). Returns the attempt's id and the instance name to provision.
pub async fn scale_up_begin(
    client: &mut Client,
    prefix: &str,
    retry: Option<&str>,
    holder: &str,
    below_free: i64,
    lease: Duration,
) -> Result<Option<(i64, String)>, DbError> {
    let action = "begin a scale-up";
    let txn = client.transaction().await.map_err(DbError::query(action))?;
    txn.execute(LOCK, &[]).await.map_err(DbError::query(action))?;
    txn.execute(ABANDON, &[]).await.map_err(DbError::query(action))?;
    let row = txn.query_one(FREE_CAPACITY, &[]).await.map_err(DbError::query(action))?;
    let free: i64 = column(&row, "free", action)?;
    if free >= below_free {
        txn.commit().await.map_err(DbError::query(action))?;
        return Ok(None);
    }
    let begun = match txn.query_one(BEGIN, &[&prefix, &holder, &free, &lease.as_secs_f64(), &retry]).await {
        Ok(row) => (column(&row, "id", action)?, column(&row, "instance_name", action)?),
        Err(source) => {
            let error = DbError::Query { action, source };
            return if error.is_unique_violation() { Ok(None) } else { Err(error) };
        }
    };
    txn.commit().await.map_err(DbError::query(action))?;
    Ok(Some(begun))
}

/// Extends attempt `id` of `holder`; false when it is no longer its to finish.
pub async fn scale_up_renew(client: &Client, id: i64, holder: &str, lease: Duration) -> Result<bool, DbError> {
    let renewed = client
        .execute(RENEW, &[&id, &holder, &lease.as_secs_f64()])
        .await
        .map_err(DbError::query("renew a scale-up"))?;
    Ok(renewed > 0)
}

/// Ends attempt `id` of `holder`: completed, or failed with `error`.
pub async fn scale_up_finish(client: &Client, id: i64, holder: &str, error: Option<&str>) -> Result<(), DbError> {
    let state = if error.is_some() { "failed" } else { "completed" };
    client.execute(FINISH, &[&id, &holder, &state, &error]).await.map_err(DbError::query("finish a scale-up"))?;
    Ok(())
}

/// The `limit` latest attempts, newest first.
pub async fn scale_up_recent(client: &Client, limit: i64) -> Result<Vec<ScaleUp>, DbError> {
    let rows = client.query(RECENT, &[&limit]).await.map_err(DbError::query("list scale-ups"))?;
    rows.iter().map(|row| ScaleUp::try_from(row).map_err(DbError::query("read a scale-up"))).collect()
}
