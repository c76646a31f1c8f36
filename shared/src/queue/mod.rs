//! The operation queue: an outbox of "reconcile resource T/id on engine instance I".
//!
//! Operations carry no payload; the agent reconciles to the current rows, so a
//! burst of changes to one resource coalesces into one waiting operation and a
//! repeated reconcile is harmless. The life of an operation:
//!
//! ```text
//! enqueue (in the writer's transaction) → waiting → claimed (lease) → completed
//!                                            ↑          │ retryable failure / lease expired
//!                                            └──────────┘ permanent or too many attempts → failed
//! ```
//!
//! A claimed operation whose resource gets a newer waiting operation ends
//! `superseded` when it is retried or reclaimed: the waiting one does the work.
//! Completed and superseded operations leave `operation` for `operation_history` in
//! the statement that finishes them (`file_finished!`); dead letters stay.
//!
//! Every write that checks a lease (completion, renewal, failure) finds its rows
//! by primary key, and compares the state as text (`state::text = 'claimed'`): the
//! planner then cannot prove the predicate of the claimed-key index or of the
//! claimed-resource index, and cannot read either of them whole. Planned
//! generically (a kept prepared statement does not show it the ids), it took those
//! indexes for a few live entries and read them instead; while a snapshot is held
//! their dead entries stay, and such a read visited every operation claimed since
//! (`queue_admin::lease_checked_writes_find_their_rows_by_primary_key`).

/// SQL that files the rows of CTE `finished` (deleted from `operation`, every column
/// returned) in `operation_history` as `$state`, with `$attempts`, `$expiries` and
/// `$error` (SQL expressions over those rows) as their attempts, lease expiries and
/// operator error.
macro_rules! file_finished {
    ($state:literal, $attempts:literal, $expiries:literal, $error:literal) => {
        concat!(
            "INSERT INTO operation_history (id, engine_instance_id, tenant_id, resource_type, resource_id, state,
                               attempts, lease_expiries, claimed_by, created_at, claimed_at, completed_at,
                               operator_error)
    SELECT id, engine_instance_id, tenant_id, resource_type, resource_id, '",
            $state,
            "', ",
            $attempts,
            ", ",
            $expiries,
            ", claimed_by, created_at, claimed_at, clock_timestamp(), ",
            $error,
            "
      FROM finished"
        )
    };
}

/// A statement that puts the one operation `$pick` selects (`o`, locked) back to
/// waiting with `$requeue` (SET assignments) or, when its resource has a newer waiting
/// operation, files it superseded (see `file_finished!`); returns the state it got,
/// no row when `$pick` found none.
macro_rules! requeue_or_supersede {
    ($pick:literal, $requeue:literal, $attempts:literal, $expiries:literal, $error:literal) => {
        concat!(
            "
WITH mine AS (
    SELECT o.id, EXISTS (SELECT 1 FROM operation x
                          WHERE x.state = 'waiting'
                            AND x.resource_type = o.resource_type
                            AND x.resource_id = o.resource_id) AS superseded
      FROM operation o
     WHERE ",
            $pick,
            "
       FOR UPDATE
), requeued AS (
    UPDATE operation o
       SET ",
            $requeue,
            "
      FROM mine
     WHERE o.id = mine.id AND NOT mine.superseded
    RETURNING o.state
), finished AS (
    DELETE FROM operation o USING mine
     WHERE o.id = mine.id AND mine.superseded
    RETURNING o.*
), filed AS (
    ",
            file_finished!("superseded", $attempts, $expiries, $error),
            "
    RETURNING state
)
SELECT state FROM requeued UNION ALL SELECT state FROM filed"
        )
    };
}

mod admin;
mod backoff;
mod claim;
mod consumer;
mod enqueue;
mod floor;
mod horizon;
mod lease;
mod maintain;

use std::time::{Duration, SystemTime};

pub use admin::{
    FailedOperation, QueueSummary, QueueSummaryRow, RetryOutcome, operation_discard, operation_discard_all_failed,
    operation_list_failed, operation_retry, operation_retry_all_failed, operation_waiting_count, queue_summary,
};
pub use backoff::RetryPolicy;
pub use claim::{
    CLAIM as CLAIM_SQL, COMPLETE as COMPLETE_SQL, ClaimClient, ClaimParams, ClaimRound, FAIL_DEAD as FAIL_DEAD_SQL,
    FAIL_RETRY as FAIL_RETRY_SQL, FailOutcome, Failure, Floor, operation_claim, operation_complete,
    operation_complete_and_claim, operation_fail,
};
pub use consumer::{Consumer, ConsumerConfig, ConsumerStats, Handler, Outcome};
pub use enqueue::{Enqueued, operation_enqueue_in_txn};
pub use floor::{operation_promote_due, operation_safe_floor};
pub use horizon::{HorizonHolder, STATEMENTS as HORIZON_STATEMENTS, xmin_horizon_holder};
pub use lease::{Lease, LeaseKeeper, RENEW as RENEW_SQL, operation_renew};
pub use maintain::{
    NEXT_LEASE_EXPIRY as NEXT_LEASE_EXPIRY_SQL, operation_lease_floor, operation_make_due, operation_next_lease_expiry,
    operation_prune, operation_reclaim_expired,
};

use crate::model::{EngineInstanceId, OperationId, ResourceType, TenantId};

/// An operation this process holds a lease on.
#[derive(Debug, Clone)]
pub struct ClaimedOperation {
    pub id: OperationId,
    pub engine_instance_id: EngineInstanceId,
    pub tenant_id: TenantId,
    pub resource_type: ResourceType,
    pub resource_id: i64,
    /// How many times this operation has been claimed, this claim included.
    pub attempts: i32,
    /// When the operation was inserted (database clock).
    pub created_at: SystemTime,
    /// When this claim happened (database clock).
    pub claimed_at: SystemTime,
    pub lease: Lease,
}

/// The resource an operation is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResourceRef {
    pub resource_type: ResourceType,
    pub resource_id: i64,
}

impl ClaimedOperation {
    /// The resource this operation reconciles.
    pub fn resource(&self) -> ResourceRef {
        ResourceRef { resource_type: self.resource_type, resource_id: self.resource_id }
    }
}

/// Converts a duration to the seconds PostgreSQL's `make_interval` takes.
fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
