//! Claim floors: where a claimer's scan of the queue starts.
//!
//! Queue keys rise as claims proceed (migrations/V20), so the claim index holds, below
//! the lowest live key, only entries of operations claimed already. While a snapshot
//! is held those dead entries cannot be cleaned up, and a scan from the start of the
//! index would visit every one of them on every claim. A claimer therefore starts at
//! a floor, which moves in two ways:
//!
//! - **Optimistically**, after each claim, up to the lowest key it took, or to the
//!   highest when the batch was full (`ClaimRound::next_floor`: a backlog, whose
//!   claimed entries the next scan would otherwise visit again). What it passes over
//!   may be: an operation another claimer has locked (it claims it), one whose
//!   resource is still claimed, or one that was being written with a key below the
//!   floor when the claim ran. The last two are the reason for the second way.
//! - **Safely**, at least every `ConsumerConfig::floor_sync_every` and before going
//!   to sleep: holding the instance's signal lock exclusively, which every
//!   transaction that makes an operation waiting holds shared until it ends
//!   (`signal_raise`), nothing is being written, so the lowest live key is the truth;
//!   the floor is set to it, or to the instance's front if lower. Operations written
//!   later get keys at or past the front. The same transaction gives keys to the
//!   operations whose backoff has ended.
//!
//! An operation passed over optimistically therefore waits at most until the next
//! safe floor, never for ever. A safe floor stays a lower bound of every waiting key
//! from the moment it was found on, so the instance's consumers share the highest one
//! found (kept in a sequence, see migrations/V21): the next safe floor's scan starts
//! there (or at the consumer's own, if higher) and visits only what was claimed since,
//! also for a consumer that has just started.
//!
//! The lease upkeep has a floor of its own (`operation_lease_floor`): claimed
//! operations keep their key, and each was waiting, at or above the claim floor, when
//! it was claimed.

use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::claim::Floor;
use crate::db::{DbError, column};
use crate::model::EngineInstanceId;

/// Keys below the front the floor is set at, for a front that two racing claimers
/// moved back a batch (`operation_advance_front`).
const FRONT_SLACK: i64 = 256;

const LOCK: &str = "SELECT pg_advisory_xact_lock(signal_lock_key('operations', $1))";

// Backoffs that ended: the key trigger gives them their place in the queue.
const PROMOTE: &str = "
UPDATE operation SET run_after = run_after
 WHERE engine_instance_id = $1 AND state = 'waiting' AND queue_key IS NULL AND run_after <= now()";

/// Gives the operations of `instance` whose backoff ended their place in the queue;
/// returns how many. A consumer does it with every safe floor; who claims without a
/// consumer (`operation_claim`) does it first.
pub async fn operation_promote_due(client: &Client, instance: EngineInstanceId) -> Result<u64, DbError> {
    client.execute(PROMOTE, &[&instance.0]).await.map_err(DbError::query("give due retries their keys"))
}

/// The safe floor's query (public so a test can EXPLAIN it).
// The first live entry from `$2` on, as an ordered scan that stops there (an
// aggregate may be planned as a read of the whole range, backlog included).
pub const LOWEST_LIVE_KEY: &str = "
SELECT LEAST(operation_front($1),
             (SELECT queue_key FROM operation
               WHERE engine_instance_id = $1 AND state = 'waiting'
                 AND queue_key IS NOT NULL AND queue_key >= $2
               ORDER BY queue_key LIMIT 1)) AS lowest";

// The instance's shared floor, read before the scan (only what was true before the
// scan's snapshot bounds what it finds); the lease floor reads it the same way.
pub(super) const SHARED_FLOOR: &str = "SELECT operation_mark('floor', $1) AS floor";

const ADVANCE_FLOOR: &str = "SELECT operation_advance_mark('floor', $1, $2)";

/// Finds a safe floor for `instance`, scanning from `from` (the caller's last safe
/// floor) or the instance's shared floor, whichever is higher, raises the shared floor
/// to it, and gives due retries their keys. Waits at most `wait` for transactions
/// that are writing operations to end; None when they did not (try again later).
pub async fn operation_safe_floor(
    client: &mut Client,
    instance: EngineInstanceId,
    from: Floor,
    wait: Duration,
) -> Result<Option<Floor>, DbError> {
    let action = "find the queue's floor";
    let txn = client.transaction().await.map_err(DbError::query(action))?;
    let timeout = format!("SET LOCAL lock_timeout = '{}ms'", wait.as_millis().max(1));
    txn.batch_execute(&timeout).await.map_err(DbError::query(action))?;
    match txn.execute(LOCK, &[&instance.0]).await {
        Ok(_) => {}
        Err(error) if error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => return Ok(None),
        Err(error) => return Err(DbError::query(action)(error)),
    }
    txn.execute(PROMOTE, &[&instance.0]).await.map_err(DbError::query("give due retries their keys"))?;
    let shared = txn.query_one(SHARED_FLOOR, &[&instance.0]).await.map_err(DbError::query(action))?;
    let from = from.max(Floor(column(&shared, "floor", action)?));
    let row = txn.query_one(LOWEST_LIVE_KEY, &[&instance.0, &from.0]).await.map_err(DbError::query(action))?;
    let lowest: i64 = column(&row, "lowest", action)?;
    let floor = Floor(lowest.saturating_sub(FRONT_SLACK).max(from.0));
    txn.execute(ADVANCE_FLOOR, &[&instance.0, &floor.0]).await.map_err(DbError::query(action))?;
    txn.commit().await.map_err(DbError::query(action))?;
    Ok(Some(floor))
}
