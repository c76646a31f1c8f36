//! What the writers tell tenants about their engine instance's health: each writer
//! watches `engine_instance_health()` of every instance and, when one changes,
//! touches the observed-state rows of the tenants it serves there, so the status
//! feed carries the instance's state to their resources (`Ready=False` while it is
//! degraded or lost).

use std::collections::BTreeMap;

use tokio_postgres::Client;

use crate::db::{DbError, column};
use crate::model::EngineInstanceId;

const HEALTH: &str = "
SELECT id, name, engine_instance_health(heartbeat_at, progress_at) AS health FROM engine_instance";

// Every change stamps the rows anew (their triggers), so the feed reads them again.
const TOUCH_APPLICATIONS: &str = "
UPDATE application_state s SET updated_at = now()
  FROM tenant t
 WHERE s.tenant_id = t.id AND t.engine_instance_id = $1 AND t.writer_shard = ANY($2)";

const TOUCH_RESOURCES: &str = "
UPDATE resource_state s SET updated_at = now()
  FROM tenant t
 WHERE s.tenant_id = t.id AND t.engine_instance_id = $1 AND t.writer_shard = ANY($2)";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[HEALTH, TOUCH_APPLICATIONS, TOUCH_RESOURCES];

/// One instance's name and health now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceHealth {
    pub name: String,
    /// `healthy`, `degraded` or `lost`.
    pub health: String,
}

/// Every instance's health now.
pub async fn instance_health_all(client: &Client) -> Result<BTreeMap<EngineInstanceId, InstanceHealth>, DbError> {
    let action = "read the instances' health";
    let rows = client.query(HEALTH, &[]).await.map_err(DbError::query(action))?;
    rows.iter()
        .map(|row| {
            let id = column(row, "id", action)?;
            Ok((id, InstanceHealth { name: column(row, "name", action)?, health: column(row, "health", action)? }))
        })
        .collect()
}

/// Touches the observed-state rows of the tenants of `shards` placed on `instance`;
/// returns how many rows.
pub async fn instance_health_touch(
    client: &Client,
    instance: EngineInstanceId,
    shards: &[i32],
) -> Result<u64, DbError> {
    let action = "tell tenants of an instance's health";
    let applications =
        client.execute(TOUCH_APPLICATIONS, &[&instance, &shards]).await.map_err(DbError::query(action))?;
    let resources = client.execute(TOUCH_RESOURCES, &[&instance, &shards]).await.map_err(DbError::query(action))?;
    Ok(applications + resources)
}
