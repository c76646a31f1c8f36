//! The rows an engine instance serves, across the four tables whose rows become
//! Argo CD objects (application, managed_environment, repository_credential and
//! tenant, each placed through its tenant): what an agent's sweep compares with the
//! objects it finds in Argo CD.

use tokio_postgres::Client;

use crate::db::DbError;
use crate::model::{EngineInstanceId, RowState, TenantId};

/// A table whose rows become Argo CD objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PlacedTable {
    Application,
    ManagedEnvironment,
    RepositoryCredential,
    Tenant,
}

// `stalled`: the row's current generation failed permanently (Argo CD refused it);
// trying it again cannot help until the tenant changes it. `generation`: the row's
// (NULL for tenants, whose project is built from several rows). `expects_object`:
// false when the row is live but calls for no object (a repository credential
// without a usable Secret). Each statement is read in two ways: by ids (`$2`, the
// rows behind one page of objects) or as a keyset page (`id > $3`, up to `$4` rows,
// in id order), so that no caller ever holds every row of an instance.
macro_rules! placed {
    ($select:literal, $from:literal) => {
        [
            concat!($select, " ", $from, " = $1 AND r.id = ANY($2)"),
            concat!($select, " ", $from, " = $1 AND r.id > $2 ORDER BY r.id LIMIT $3"),
        ]
    };
}

const ROWS: [[&str; 2]; 4] = [
    placed!(
        "SELECT r.id, r.tenant_id, r.row_state, r.generation, true AS expects_object,
                EXISTS (SELECT 1 FROM application_state s WHERE s.application_id = r.id AND s.agent_stalled
                           AND s.stalled_generation = r.generation) AS stalled",
        "FROM application r JOIN tenant t ON t.id = r.tenant_id WHERE t.engine_instance_id"
    ),
    placed!(
        "SELECT r.id, r.tenant_id, r.row_state, r.generation, true AS expects_object,
                EXISTS (SELECT 1 FROM resource_state s WHERE s.managed_environment_id = r.id AND s.agent_stalled
                           AND s.stalled_generation = r.generation) AS stalled",
        "FROM managed_environment r JOIN tenant t ON t.id = r.tenant_id WHERE t.engine_instance_id"
    ),
    placed!(
        "SELECT r.id, r.tenant_id, r.row_state, r.generation, r.ciphertext IS NOT NULL AS expects_object,
                EXISTS (SELECT 1 FROM resource_state s WHERE s.repository_credential_id = r.id AND s.agent_stalled
                           AND s.stalled_generation = r.generation) AS stalled",
        "FROM repository_credential r JOIN tenant t ON t.id = r.tenant_id WHERE t.engine_instance_id"
    ),
    placed!(
        "SELECT r.id, r.id AS tenant_id, r.row_state, NULL::bigint AS generation, true AS expects_object,
                false AS stalled",
        "FROM tenant r WHERE r.engine_instance_id"
    ),
];

const ELSEWHERE: [&str; 4] = [
    "SELECT r.id FROM application r JOIN tenant t ON t.id = r.tenant_id
      WHERE r.id = ANY($1) AND r.row_state <> 'deleted' AND t.engine_instance_id IS DISTINCT FROM $2",
    "SELECT r.id FROM managed_environment r JOIN tenant t ON t.id = r.tenant_id
      WHERE r.id = ANY($1) AND r.row_state <> 'deleted' AND t.engine_instance_id IS DISTINCT FROM $2",
    "SELECT r.id FROM repository_credential r JOIN tenant t ON t.id = r.tenant_id
      WHERE r.id = ANY($1) AND r.row_state <> 'deleted' AND t.engine_instance_id IS DISTINCT FROM $2",
    "SELECT t.id FROM tenant t
      WHERE t.id = ANY($1) AND t.row_state <> 'deleted' AND t.engine_instance_id IS DISTINCT FROM $2",
];

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[
    ROWS[0][0],
    ROWS[0][1],
    ROWS[1][0],
    ROWS[1][1],
    ROWS[2][0],
    ROWS[2][1],
    ROWS[3][0],
    ROWS[3][1],
    ELSEWHERE[0],
    ELSEWHERE[1],
    ELSEWHERE[2],
    ELSEWHERE[3],
];

impl PlacedTable {
    fn index(self) -> usize {
        match self {
            PlacedTable::Application => 0,
            PlacedTable::ManagedEnvironment => 1,
            PlacedTable::RepositoryCredential => 2,
            PlacedTable::Tenant => 3,
        }
    }
}

/// A row placed on an instance: its id, tenant and state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacedRow {
    pub id: i64,
    pub tenant_id: TenantId,
    pub row_state: RowState,
    /// Its current generation failed permanently: not worth another attempt.
    pub stalled: bool,
    /// The row's generation (None for tenants).
    pub generation: Option<i64>,
    /// Whether a live row of this kind calls for an object in the engine.
    pub expects_object: bool,
}

impl TryFrom<&tokio_postgres::Row> for PlacedRow {
    type Error = tokio_postgres::Error;

    fn try_from(row: &tokio_postgres::Row) -> Result<Self, Self::Error> {
        Ok(PlacedRow {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            row_state: row.try_get("row_state")?,
            stalled: row.try_get("stalled")?,
            generation: row.try_get("generation")?,
            expects_object: row.try_get("expects_object")?,
        })
    }
}

fn rows(found: &[tokio_postgres::Row]) -> Result<Vec<PlacedRow>, DbError> {
    found.iter().map(|row| PlacedRow::try_from(row).map_err(DbError::query("read rows for the sweep"))).collect()
}

/// Those of rows `ids` of `table` whose tenant is placed on `instance`.
pub async fn placed_rows_of(
    client: &Client,
    table: PlacedTable,
    instance: EngineInstanceId,
    ids: &[i64],
) -> Result<Vec<PlacedRow>, DbError> {
    let found = client
        .query(ROWS[table.index()][0], &[&instance, &ids])
        .await
        .map_err(DbError::query("read rows for the sweep"))?;
    rows(&found)
}

/// Up to `limit` rows of `table` whose tenant is placed on `instance`, with ids
/// above `after`, in id order: one page of a walk through the instance's rows.
pub async fn placed_rows_after(
    client: &Client,
    table: PlacedTable,
    instance: EngineInstanceId,
    after: i64,
    limit: i64,
) -> Result<Vec<PlacedRow>, DbError> {
    let found = client
        .query(ROWS[table.index()][1], &[&instance, &after, &limit])
        .await
        .map_err(DbError::query("read rows for the sweep"))?;
    rows(&found)
}

/// Those of `ids` (rows of `table`) that are live and placed on another instance.
pub async fn placed_elsewhere(
    client: &Client,
    table: PlacedTable,
    ids: &[i64],
    instance: EngineInstanceId,
) -> Result<Vec<i64>, DbError> {
    let rows = client
        .query(ELSEWHERE[table.index()], &[&ids, &instance])
        .await
        .map_err(DbError::query("find rows of other instances"))?;
    rows.iter().map(|row| row.try_get("id").map_err(DbError::query("find rows of other instances"))).collect()
}
