//! Placement: which engine instance a new tenant goes to. Only instances whose
//! agents reported within the health window are candidates; among them the one
//! with the fewest tenants relative to its capacity wins (ties by id). Placement is
//! sticky: it is asked only for a tenant without an instance.

use std::time::Duration;

use tokio_postgres::Transaction;

use crate::db::DbError;
use crate::model::EngineInstanceId;

const CHOOSE: &str = "
SELECT e.id
  FROM engine_instance e
 WHERE e.heartbeat_at > now() - $1::bigint * interval '1 millisecond'
 ORDER BY (SELECT count(*) FROM tenant t WHERE t.engine_instance_id = e.id)::float8 / e.capacity, e.id
 LIMIT 1";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[CHOOSE];

/// The healthy, least-loaded instance, or None when no instance is healthy.
pub async fn placement_choose_in_txn(
    txn: &Transaction<'_>,
    healthy_within: Duration,
) -> Result<Option<EngineInstanceId>, DbError> {
    let window_ms = i64::try_from(healthy_within.as_millis()).unwrap_or(i64::MAX);
    let row = txn.query_opt(CHOOSE, &[&window_ms]).await.map_err(DbError::query("choose an engine instance"))?;
    row.map(|row| crate::db::column(&row, "id", "choose an engine instance")).transpose()
}
