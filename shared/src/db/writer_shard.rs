//! The `writer_shard` table: one row per shard of tenant namespaces (64, from
//! migration V2), each held by at most one writer at a time under a lease, and the
//! shard's durable cursor over the status feed (`status_xid`). Every statement that
//! reads or writes it is here; the writer's shard keeper decides when to call them.
//! Lease times are compared on the database's clock only (`now()`), and how long
//! another writer's lease has left is returned as a duration, never as a timestamp
//! for a process clock to compare with.

use std::time::Duration;

use tokio_postgres::Client;

use crate::db::{DbError, Statements};

const RENEW: &str = "
UPDATE writer_shard SET lease_expires_at = now() + $2::bigint * interval '1 millisecond', updated_at = now()
 WHERE writer_id = $1 AND lease_expires_at > now()
RETURNING shard";

// The other writers holding unexpired leases: how many shards each, and how long
// until the first of its leases runs out.
const OTHER_WRITERS: &str = "
SELECT writer_id, count(*) AS shards,
       extract(epoch FROM min(lease_expires_at) - now())::float8 AS expires_in_s
  FROM writer_shard
 WHERE lease_expires_at > now() AND writer_id <> $1
 GROUP BY writer_id";

// updated_at: when the row was let go (after waiting for the owner's fenced
// transactions), not when the statement began.
const RELEASE: &str = "
UPDATE writer_shard SET writer_id = NULL, lease_expires_at = NULL, updated_at = clock_timestamp()
 WHERE writer_id = $1 AND shard = ANY($2)";

// Hands one shard of $1 straight to writer $3, with the lease $3 last renewed its
// own shards to, and only when that renewal is at most $5 ms old (a writer that
// stopped renewing may have crashed: a shard handed to it would wait for its lease
// to run out). Like RELEASE it waits for $1's fenced transactions on the row.
const HAND_OVER: &str = "
UPDATE writer_shard s
   SET writer_id = r.writer_id, lease_expires_at = r.expires, updated_at = clock_timestamp()
  FROM (SELECT writer_id, max(lease_expires_at) AS expires FROM writer_shard
         WHERE writer_id = $3
         GROUP BY writer_id
        HAVING max(lease_expires_at) > now() + ($4::bigint - $5::bigint) * interval '1 millisecond') r
 WHERE s.shard = $2 AND s.writer_id = $1 AND s.lease_expires_at > now()
RETURNING s.shard";

// `FOR NO KEY UPDATE`, the lock the UPDATE takes anyway: it waits for (here: skips)
// an owner's fence (`FOR SHARE`) but not the key-share lock a foreign key check on
// `tenant.writer_shard` holds until its transaction ends, which `FOR UPDATE` would.
const ACQUIRE: &str = "
UPDATE writer_shard SET writer_id = $1, lease_expires_at = now() + $2::bigint * interval '1 millisecond', updated_at = now()
 WHERE shard IN (SELECT shard FROM writer_shard
                  WHERE writer_id IS NULL OR lease_expires_at <= now()
                  ORDER BY shard LIMIT $3 FOR NO KEY UPDATE SKIP LOCKED)
RETURNING shard";

// One shard of the writer holding the most, when that writer holds more than $3.
const TAKE_OVER: &str = "
UPDATE writer_shard SET writer_id = $1, lease_expires_at = now() + $2::bigint * interval '1 millisecond', updated_at = now()
 WHERE shard = (SELECT shard FROM writer_shard
                 WHERE lease_expires_at > now()
                   AND writer_id = (SELECT writer_id FROM writer_shard
                                     WHERE lease_expires_at > now() AND writer_id <> $1
                                     GROUP BY writer_id HAVING count(*) > $3
                                     ORDER BY count(*) DESC, writer_id LIMIT 1)
                 ORDER BY shard DESC LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED)
RETURNING shard";

// Bounds the transaction's lock waits in the same exchange: `set_config(..., true)`
// is `SET LOCAL`, and a fence that returns its row has run it.
const FENCE: &str = "
SELECT set_config('lock_timeout', '2s', true) AS lock_timeout FROM writer_shard
 WHERE shard = $1 AND writer_id = $2 AND lease_expires_at > now() FOR SHARE";

const CURSOR_ADVANCE: &str = "
UPDATE writer_shard
   SET status_xid = $3::text::xid8, updated_at = now()
 WHERE shard = $1 AND writer_id = $2 AND lease_expires_at > now() AND status_xid < $3::text::xid8";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] =
    &[RENEW, OTHER_WRITERS, RELEASE, HAND_OVER, ACQUIRE, UNOWNED, TAKE_OVER, FENCE, CURSOR_ADVANCE];

// Free or expired shards nobody has taken yet.
const UNOWNED: &str =
    "SELECT count(*) AS unowned FROM writer_shard WHERE writer_id IS NULL OR lease_expires_at <= now()";

fn millis(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}

fn shards(rows: &[tokio_postgres::Row]) -> Result<Vec<i32>, DbError> {
    rows.iter().map(|row| row.try_get("shard").map_err(DbError::query("read a shard"))).collect()
}

/// Extends every unexpired lease of `writer_id` by `lease`; returns the shards held.
pub async fn writer_shard_renew(client: &Client, writer_id: &str, lease: Duration) -> Result<Vec<i32>, DbError> {
    let rows =
        client.query(RENEW, &[&writer_id, &millis(lease)]).await.map_err(DbError::query("renew shard leases"))?;
    shards(&rows)
}

/// Another writer that holds unexpired leases.
#[derive(Debug, Clone, PartialEq)]
pub struct OtherWriterRow {
    pub writer_id: String,
    /// How many shards it holds.
    pub shards: i64,
    /// How long until the first of its leases expires (database clock).
    pub expires_in: Duration,
}

impl TryFrom<&tokio_postgres::Row> for OtherWriterRow {
    type Error = tokio_postgres::Error;

    fn try_from(row: &tokio_postgres::Row) -> Result<Self, Self::Error> {
        let expires_in_s: f64 = row.try_get("expires_in_s")?;
        Ok(OtherWriterRow {
            writer_id: row.try_get("writer_id")?,
            shards: row.try_get("shards")?,
            expires_in: Duration::try_from_secs_f64(expires_in_s.max(0.0)).unwrap_or(Duration::ZERO),
        })
    }
}

/// The writers other than `writer_id` that hold an unexpired lease.
pub async fn writer_shard_other_writers(client: &Client, writer_id: &str) -> Result<Vec<OtherWriterRow>, DbError> {
    let rows = client.query(OTHER_WRITERS, &[&writer_id]).await.map_err(DbError::query("list live writers"))?;
    rows.iter().map(|row| OtherWriterRow::try_from(row).map_err(DbError::query("read a live writer"))).collect()
}

/// Gives `shards` back (those `writer_id` holds).
pub async fn writer_shard_release(client: &Client, writer_id: &str, shards: &[i32]) -> Result<(), DbError> {
    client.execute(RELEASE, &[&writer_id, &shards]).await.map_err(DbError::query("release shards"))?;
    Ok(())
}

/// Hands `shard` (held by `writer_id`) to `recipient` under the lease the recipient
/// last renewed its own shards to, if it did so within `fresh` (its leases last
/// `lease`). Returns whether the shard changed hands; it is never left unowned.
pub async fn writer_shard_hand_over(
    client: &Client,
    writer_id: &str,
    shard: i32,
    recipient: &str,
    lease: Duration,
    fresh: Duration,
) -> Result<bool, DbError> {
    let rows = client
        .query(HAND_OVER, &[&writer_id, &shard, &recipient, &millis(lease), &millis(fresh)])
        .await
        .map_err(DbError::query("hand a shard over"))?;
    Ok(!rows.is_empty())
}

/// Takes up to `want` free or expired shards; returns them. Shards another writer
/// is taking at the same moment are skipped, not waited for.
pub async fn writer_shard_acquire(
    client: &Client,
    writer_id: &str,
    lease: Duration,
    want: i64,
) -> Result<Vec<i32>, DbError> {
    let rows =
        client.query(ACQUIRE, &[&writer_id, &millis(lease), &want]).await.map_err(DbError::query("acquire shards"))?;
    shards(&rows)
}

/// How many shards are free or expired now.
pub async fn writer_shard_unowned(client: &Client) -> Result<i64, DbError> {
    let row = client.query_one(UNOWNED, &[]).await.map_err(DbError::query("count unowned shards"))?;
    crate::db::column(&row, "unowned", "count unowned shards")
}

/// Takes one shard from the writer holding the most, when it holds more than `share`.
pub async fn writer_shard_take_over(
    client: &Client,
    writer_id: &str,
    lease: Duration,
    share: i64,
) -> Result<Vec<i32>, DbError> {
    let rows = client
        .query(TAKE_OVER, &[&writer_id, &millis(lease), &share])
        .await
        .map_err(DbError::query("take over a shard"))?;
    shards(&rows)
}

/// Whether `writer_id` holds `shard`, locking the row against a hand-over until
/// `txn` ends.
pub async fn writer_shard_fence_in_txn(txn: &impl Statements, shard: i32, writer_id: &str) -> Result<bool, DbError> {
    // A fenced transaction holds the shard's row until it ends: after the fence it
    // waits for no lock longer than 2 s (see FENCE), so one of a crashed writer (whose
    // session only notices when it next speaks) cannot keep the shard from its next
    // owner.
    let row = txn.row_opt(FENCE, &[&shard, &writer_id]).await.map_err(DbError::query("check a shard lease"))?;
    Ok(row.is_some())
}

/// Moves `shard`'s status cursor forward to transaction `xid`. False when
/// `writer_id` no longer holds the shard, or the cursor is already there.
pub async fn writer_shard_advance_status(
    client: &impl Statements,
    shard: i32,
    writer_id: &str,
    xid: i64,
) -> Result<bool, DbError> {
    let updated = client
        .run(CURSOR_ADVANCE, &[&shard, &writer_id, &xid.to_string()])
        .await
        .map_err(DbError::query("advance the status cursor"))?;
    Ok(updated == 1)
}
