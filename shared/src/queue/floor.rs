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
use tokio_postgres::types::{ToSql, Type};

use super::claim::Floor;
use crate::db::{DbError, column};
use crate::model::EngineInstanceId;

/// Keys below the front the floor is set at, for a front that two racing claimers
/// moved back a batch (`operation_advance_front`).
const FRONT_SLACK: i64 = 256;

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

// The instance's shared floor, as the lease floor reads it before its own scan (only
// what was true before the scan's snapshot bounds what it finds).
pub(super) const SHARED_FLOOR: &str = "SELECT operation_mark('floor', $1) AS floor";

// One statement, one transaction (migrations/V22): the lock, the due retries' keys,
// the shared floor, the scan for the lowest waiting key and raising the shared floor
// all run in the server, so the lock that holds back every enqueue of the instance is
// held for no round trip.
const SAFE_FLOOR: &str = "SELECT operation_safe_floor($1, $2, $3, $4) AS floor";

/// Finds a safe floor for `instance`, scanning from `from` (the caller's last safe
/// floor) or the instance's shared floor, whichever is higher, raises the shared floor
/// to it, and gives due retries their keys. Waits at most `wait` for transactions
/// that are writing operations to end; None when they did not (try again later).
pub async fn operation_safe_floor(
    client: &Client,
    instance: EngineInstanceId,
    from: Floor,
    wait: Duration,
) -> Result<Option<Floor>, DbError> {
    let action = "find the queue's floor";
    let wait_ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
    let params: [(&(dyn ToSql + Sync), Type); 4] =
        [(&instance.0, Type::INT8), (&from.0, Type::INT8), (&FRONT_SLACK, Type::INT8), (&wait_ms, Type::INT4)];
    match client.query_typed_one(SAFE_FLOOR, &params).await {
        Ok(row) => Ok(Some(Floor(column(&row, "floor", action)?))),
        Err(error) if error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Ok(None),
        Err(error) => Err(DbError::query(action)(error)),
    }
}
