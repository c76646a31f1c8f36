//! Embedded refinery migrations and the start-up schema check.
//!
//! The same files in `migrations/` are applied by `gitops-writer migrate`,
//! `gitopsctl migrate` and the refinery CLI; all three write refinery's
//! `refinery_schema_history`, so they agree on what has been applied.

use tokio_postgres::Client;

use super::DbError;

refinery::embed_migrations!("../migrations");

/// What `migrate` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Migrations applied by this call, as `V{n}__{name}`.
    pub applied: Vec<String>,
    /// The schema version afterwards.
    pub version: i64,
}

/// The schema version found in the database and the one this binary needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaVersion {
    pub found: i64,
    pub required: i64,
}

/// The highest migration embedded in this binary: the schema it needs.
pub fn required_schema_version() -> i64 {
    migrations::runner().get_migrations().iter().map(|m| i64::from(m.version())).max().unwrap_or(0)
}

/// Applies every embedded migration not yet applied, in order, each in its own
/// transaction. Refuses migrations whose applied checksum differs (an edited file).
pub async fn migrate(client: &mut Client) -> Result<MigrationReport, DbError> {
    let report = migrations::runner()
        .set_grouped(false)
        .set_abort_divergent(true)
        .set_abort_missing(true)
        .run_async(client)
        .await
        .map_err(|source| DbError::Migrate { source })?;
    let applied = report.applied_migrations().iter().map(|m| format!("V{}__{}", m.version(), m.name())).collect();
    let version = schema_version(client).await?;
    Ok(MigrationReport { applied, version })
}

/// The highest applied migration, 0 for an empty database.
pub async fn schema_version(client: &Client) -> Result<i64, DbError> {
    let exists: bool = client
        .query_one("SELECT to_regclass('refinery_schema_history') IS NOT NULL AS present", &[])
        .await
        .map_err(DbError::query("look for the migration history"))?
        .try_get("present")
        .map_err(DbError::query("look for the migration history"))?;
    if !exists {
        return Ok(0);
    }
    let version: Option<i32> = client
        .query_one("SELECT max(version) AS version FROM refinery_schema_history", &[])
        .await
        .map_err(DbError::query("read the schema version"))?
        .try_get("version")
        .map_err(DbError::query("read the schema version"))?;
    Ok(version.map(i64::from).unwrap_or(0))
}

/// Refuses to go on against a schema older than this binary needs. A newer schema
/// is fine: migrations only expand before a later release contracts.
pub async fn check_schema(client: &Client) -> Result<SchemaVersion, DbError> {
    let found = schema_version(client).await?;
    let required = required_schema_version();
    if found < required {
        return Err(DbError::SchemaTooOld { found, required });
    }
    if found > required {
        tracing::info!(found, required, "database schema is newer than this binary");
    }
    Ok(SchemaVersion { found, required })
}
