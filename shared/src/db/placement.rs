//! Placement: which engine instance a new tenant goes to. Candidates are healthy
//! instances (`engine_instance_health()`) whose agents reported within the health
//! window, that are not cordoned, are no rollout's target and have room: slots
//! neither taken (`engine_instance.tenants`) nor held for tenants a rollout moved
//! away (`reserved`, migration V18). Capacity is also enforced by the database: a
//! trigger keeps both counts and refuses a placement past the capacity. Among them the one
//! with the fewest tenants relative to its capacity wins (ties by id). Nothing is
//! locked while choosing (locking candidates in load order would deadlock racing
//! placements): placements racing for an instance's last slot are serialised by the
//! trigger's increment, and the later one fails as a serialization failure, so
//! `in_txn_retrying` runs it again and it chooses among the instances with room.
//! Placement is sticky: it is asked only for a tenant without an instance.

use std::time::Duration;

use crate::db::{DbError, Statements};
use crate::model::EngineInstanceId;

const CHOOSE: &str = "
SELECT e.id
  FROM engine_instance e
 WHERE e.heartbeat_at > now() - $1::bigint * interval '1 millisecond'
   AND engine_instance_health(e.heartbeat_at, e.progress_at) = 'healthy'
   AND NOT e.cordoned AND e.tenants + e.reserved < e.capacity
   AND NOT EXISTS (SELECT 1 FROM rollout r WHERE r.target_instance_id = e.id
                     AND r.state IN ('moving', 'baking', 'waiting', 'rolling_back'))
 ORDER BY (e.tenants + e.reserved)::float8 / e.capacity, e.id
 LIMIT 1";

// Why nothing was chosen: no live instance at all, or every live one full or cordoned.
const LIVE: &str = "
SELECT count(*) AS live FROM engine_instance e
 WHERE e.heartbeat_at > now() - $1::bigint * interval '1 millisecond'";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[CHOOSE, LIVE];

/// Why a tenant could not be placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unplaced {
    /// No instance's agents reported within the health window.
    Unavailable,
    /// Instances are up, but each is full, cordoned or unhealthy.
    Full,
}

impl Unplaced {
    /// The tenant's message.
    pub fn message(self) -> &'static str {
        match self {
            Unplaced::Unavailable => {
                "no GitOps engine instance is available now; this namespace is placed as soon as one is"
            }
            Unplaced::Full => {
                "every GitOps engine instance is full, closed to new tenants or unhealthy; this namespace is placed \
                 as soon as one has room"
            }
        }
    }

    /// Its label in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Unplaced::Unavailable => "unavailable",
            Unplaced::Full => "full",
        }
    }
}

/// The healthy, least-loaded instance with room, or why there is none.
pub async fn placement_choose_in_txn(
    txn: &impl Statements,
    healthy_within: Duration,
) -> Result<Result<EngineInstanceId, Unplaced>, DbError> {
    let window_ms = i64::try_from(healthy_within.as_millis()).unwrap_or(i64::MAX);
    let row = txn.row_opt(CHOOSE, &[&window_ms]).await.map_err(DbError::query("choose an engine instance"))?;
    if let Some(row) = row {
        return crate::db::column(&row, "id", "choose an engine instance").map(Ok);
    }
    let row = txn.row(LIVE, &[&window_ms]).await.map_err(DbError::query("count live engine instances"))?;
    let live: i64 = crate::db::column(&row, "live", "count live engine instances")?;
    Ok(Err(if live == 0 { Unplaced::Unavailable } else { Unplaced::Full }))
}
