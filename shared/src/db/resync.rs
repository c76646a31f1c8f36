//! What the writer's anti-entropy pass compares with the live tenant resources:
//! the live rows of each resource table whose tenant is in a set of writer shards,
//! a page at a time in id order, with the namespace and name the resource had.

use tokio_postgres::Client;
use uuid::Uuid;

use crate::db::DbError;
use crate::db::tombstone::TombstoneOf;

// The home environment has no tenant resource behind it: it is never compared.
const APPLICATION: &str = "
SELECT r.id, r.resource_uid, r.resource_name, r.generation, t.namespace_name
  FROM application r JOIN tenant t ON t.id = r.tenant_id
 WHERE t.writer_shard = ANY($1) AND r.row_state = 'active' AND r.id > $2
 ORDER BY r.id LIMIT $3";

const MANAGED_ENVIRONMENT: &str = "
SELECT r.id, r.resource_uid, r.resource_name, r.generation, t.namespace_name
  FROM managed_environment r JOIN tenant t ON t.id = r.tenant_id
 WHERE t.writer_shard = ANY($1) AND r.row_state = 'active' AND NOT r.home AND r.id > $2
 ORDER BY r.id LIMIT $3";

const REPOSITORY_CREDENTIAL: &str = "
SELECT r.id, r.resource_uid, r.resource_name, r.generation, t.namespace_name
  FROM repository_credential r JOIN tenant t ON t.id = r.tenant_id
 WHERE t.writer_shard = ANY($1) AND r.row_state = 'active' AND r.id > $2
 ORDER BY r.id LIMIT $3";

const SYNC_OPERATION: &str = "
SELECT r.id, r.resource_uid, r.resource_name, r.generation, t.namespace_name
  FROM sync_operation r JOIN tenant t ON t.id = r.tenant_id
 WHERE t.writer_shard = ANY($1) AND r.row_state = 'active' AND r.id > $2
 ORDER BY r.id LIMIT $3";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[APPLICATION, MANAGED_ENVIRONMENT, REPOSITORY_CREDENTIAL, SYNC_OPERATION];

/// A live row as its resource was when the row was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResyncRow {
    /// The row's id in its table (the page cursor).
    pub id: i64,
    pub resource_uid: Uuid,
    pub resource_name: String,
    pub generation: i64,
    pub namespace: String,
}

impl TryFrom<&tokio_postgres::Row> for ResyncRow {
    type Error = tokio_postgres::Error;

    fn try_from(row: &tokio_postgres::Row) -> Result<Self, Self::Error> {
        Ok(ResyncRow {
            id: row.try_get("id")?,
            resource_uid: row.try_get("resource_uid")?,
            resource_name: row.try_get("resource_name")?,
            generation: row.try_get("generation")?,
            namespace: row.try_get("namespace_name")?,
        })
    }
}

fn statement(table: TombstoneOf) -> &'static str {
    match table {
        TombstoneOf::Application => APPLICATION,
        TombstoneOf::ManagedEnvironment => MANAGED_ENVIRONMENT,
        TombstoneOf::RepositoryCredential => REPOSITORY_CREDENTIAL,
        TombstoneOf::SyncOperation => SYNC_OPERATION,
    }
}

/// Up to `limit` live rows of `table` after id `after` whose tenant is in `shards`.
pub async fn resync_rows_page(
    client: &Client,
    table: TombstoneOf,
    shards: &[i32],
    after: i64,
    limit: i64,
) -> Result<Vec<ResyncRow>, DbError> {
    let action = "read rows to compare with the tenant resources";
    let rows = client.query(statement(table), &[&shards, &after, &limit]).await.map_err(DbError::query(action))?;
    rows.iter().map(|row| ResyncRow::try_from(row).map_err(DbError::query(action))).collect()
}
