//! Purging rows whose deletion is confirmed. A tombstoned row goes `active` →
//! `deleting` (writer) → `deleted` (agent, once Argo CD removed its objects); after
//! a grace period nothing reads it any more, and this module removes it for good.
//!
//! Tables are purged in the order their foreign keys need: sync operations, then
//! applications (`application_state` cascades), repository credentials, managed
//! environments (`cluster_credential` cascades) and last the tenant itself. A row is
//! kept while anything still points at it: a waiting or claimed operation for it, a
//! sync operation of an application, an application on an environment, any row of a
//! tenant. `active` and `deleting` rows are never touched.
//!
//! Each statement deletes at most one batch and is its own short transaction. It
//! picks its rows with `FOR UPDATE SKIP LOCKED` and the delete checks `row_state`
//! again, so a row that a concurrent transaction holds (say, a writer reviving or
//! updating it) is skipped this round, and one changed and committed meanwhile is
//! re-read under the lock and left alone. Purging is idempotent: two writers (one
//! losing a shard, one taking it) may run it over the same tenants at once.

use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use crate::db::{DbError, in_txn_retrying};

/// Rows removed by one [`purge_deleted`], per table. Rows removed by a cascade
/// (`application_state`, `cluster_credential`) are not counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PurgeReport {
    pub sync_operations: u64,
    pub applications: u64,
    pub repository_credentials: u64,
    pub managed_environments: u64,
    pub tenants: u64,
}

impl PurgeReport {
    /// Rows removed from all tables together.
    pub fn total(&self) -> u64 {
        self.sync_operations
            + self.applications
            + self.repository_credentials
            + self.managed_environments
            + self.tenants
    }
}

// Every statement takes $1 = the shards (int4[]), $2 = the grace period in seconds,
// $3 = the batch size, and returns nothing but its count.

const SYNC_OPERATIONS: &str = "
WITH doomed AS (
    SELECT s.id FROM sync_operation s
      JOIN tenant t ON t.id = s.tenant_id
     WHERE t.writer_shard = ANY($1)
       AND s.row_state = 'deleted'
       AND s.updated_at <= now() - make_interval(secs => $2)
       AND NOT EXISTS (SELECT 1 FROM operation o
                        WHERE o.resource_type = 'sync_operation' AND o.resource_id = s.id
                          AND o.state IN ('waiting', 'claimed'))
     ORDER BY s.id
     LIMIT $3
       FOR UPDATE OF s SKIP LOCKED
)
DELETE FROM sync_operation s USING doomed WHERE s.id = doomed.id AND s.row_state = 'deleted'";

const APPLICATIONS: &str = "
WITH doomed AS (
    SELECT a.id FROM application a
      JOIN tenant t ON t.id = a.tenant_id
     WHERE t.writer_shard = ANY($1)
       AND a.row_state = 'deleted'
       AND a.updated_at <= now() - make_interval(secs => $2)
       AND NOT EXISTS (SELECT 1 FROM operation o
                        WHERE o.resource_type = 'application' AND o.resource_id = a.id
                          AND o.state IN ('waiting', 'claimed'))
       AND NOT EXISTS (SELECT 1 FROM sync_operation s WHERE s.application_id = a.id)
     ORDER BY a.id
     LIMIT $3
       FOR UPDATE OF a SKIP LOCKED
)
DELETE FROM application a USING doomed WHERE a.id = doomed.id AND a.row_state = 'deleted'";

const REPOSITORY_CREDENTIALS: &str = "
WITH doomed AS (
    SELECT r.id FROM repository_credential r
      JOIN tenant t ON t.id = r.tenant_id
     WHERE t.writer_shard = ANY($1)
       AND r.row_state = 'deleted'
       AND r.updated_at <= now() - make_interval(secs => $2)
       AND NOT EXISTS (SELECT 1 FROM operation o
                        WHERE o.resource_type = 'repository_credential' AND o.resource_id = r.id
                          AND o.state IN ('waiting', 'claimed'))
     ORDER BY r.id
     LIMIT $3
       FOR UPDATE OF r SKIP LOCKED
)
DELETE FROM repository_credential r USING doomed WHERE r.id = doomed.id AND r.row_state = 'deleted'";

const MANAGED_ENVIRONMENTS: &str = "
WITH doomed AS (
    SELECT e.id FROM managed_environment e
      JOIN tenant t ON t.id = e.tenant_id
     WHERE t.writer_shard = ANY($1)
       AND e.row_state = 'deleted'
       AND e.updated_at <= now() - make_interval(secs => $2)
       AND NOT EXISTS (SELECT 1 FROM operation o
                        WHERE o.resource_type = 'managed_environment' AND o.resource_id = e.id
                          AND o.state IN ('waiting', 'claimed'))
       AND NOT EXISTS (SELECT 1 FROM application a WHERE a.managed_environment_id = e.id)
     ORDER BY e.id
     LIMIT $3
       FOR UPDATE OF e SKIP LOCKED
)
DELETE FROM managed_environment e USING doomed WHERE e.id = doomed.id AND e.row_state = 'deleted'";

const TENANTS: &str = "
WITH doomed AS (
    SELECT t.id FROM tenant t
     WHERE t.writer_shard = ANY($1)
       AND t.row_state = 'deleted'
       AND t.updated_at <= now() - make_interval(secs => $2)
       AND NOT EXISTS (SELECT 1 FROM operation o
                        WHERE o.resource_type = 'tenant' AND o.resource_id = t.id
                          AND o.state IN ('waiting', 'claimed'))
       AND NOT EXISTS (SELECT 1 FROM managed_environment x WHERE x.tenant_id = t.id)
       AND NOT EXISTS (SELECT 1 FROM cluster_credential x WHERE x.tenant_id = t.id)
       AND NOT EXISTS (SELECT 1 FROM repository_credential x WHERE x.tenant_id = t.id)
       AND NOT EXISTS (SELECT 1 FROM application x WHERE x.tenant_id = t.id)
       AND NOT EXISTS (SELECT 1 FROM application_state x WHERE x.tenant_id = t.id)
       AND NOT EXISTS (SELECT 1 FROM sync_operation x WHERE x.tenant_id = t.id)
     ORDER BY t.id
     LIMIT $3
       FOR UPDATE OF t SKIP LOCKED
)
DELETE FROM tenant t USING doomed WHERE t.id = doomed.id AND t.row_state = 'deleted'";

/// The purge statements in foreign-key order, each with the action its error names
/// (public so a test can prepare and explain them).
/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[SYNC_OPERATIONS, APPLICATIONS, REPOSITORY_CREDENTIALS, MANAGED_ENVIRONMENTS, TENANTS];

pub const PURGE_STATEMENTS: [(&str, &str); 5] = [
    ("purge deleted sync operations", SYNC_OPERATIONS),
    ("purge deleted applications", APPLICATIONS),
    ("purge deleted repository credentials", REPOSITORY_CREDENTIALS),
    ("purge deleted managed environments", MANAGED_ENVIRONMENTS),
    ("purge deleted tenants", TENANTS),
];

/// Deletes the rows of the tenants in `shards` that have been `deleted` for at
/// least `older_than` and that nothing references any more, in transactions of at
/// most `batch` rows each. Returns how many rows each table lost.
pub async fn purge_deleted(
    client: &mut Client,
    shards: &[i32],
    older_than: Duration,
    batch: i64,
) -> Result<PurgeReport, DbError> {
    if shards.is_empty() || batch < 1 {
        return Ok(PurgeReport::default());
    }
    let older_than_s = older_than.as_secs_f64();
    let sync_operations = purge_table(client, PURGE_STATEMENTS[0], shards, older_than_s, batch).await?;
    let applications = purge_table(client, PURGE_STATEMENTS[1], shards, older_than_s, batch).await?;
    let repository_credentials = purge_table(client, PURGE_STATEMENTS[2], shards, older_than_s, batch).await?;
    let managed_environments = purge_table(client, PURGE_STATEMENTS[3], shards, older_than_s, batch).await?;
    let tenants = purge_table(client, PURGE_STATEMENTS[4], shards, older_than_s, batch).await?;
    Ok(PurgeReport { sync_operations, applications, repository_credentials, managed_environments, tenants })
}

/// Runs one purge statement batch after batch until a batch comes back short.
async fn purge_table(
    client: &mut Client,
    (action, statement): (&'static str, &'static str),
    shards: &[i32],
    older_than_s: f64,
    batch: i64,
) -> Result<u64, DbError> {
    let full = u64::try_from(batch).unwrap_or(u64::MAX);
    let mut total = 0;
    loop {
        let outcome = in_txn_retrying(client, |txn| {
            let shards = shards.to_vec();
            Box::pin(async move {
                txn.execute(statement, &[&shards, &older_than_s, &batch]).await.map_err(DbError::query(action))
            })
        })
        .await;
        let purged = match outcome {
            Ok(purged) => purged,
            // A referencing row committed between the statement's snapshot and its
            // delete: the row is referenced after all. The next round skips it.
            Err(error) if matches!(error.sql_state(), Some(s) if *s == SqlState::FOREIGN_KEY_VIOLATION) => {
                tracing::debug!(%error, "a row to purge gained a reference; left for the next round");
                return Ok(total);
            }
            Err(error) => return Err(error),
        };
        total += purged;
        if purged < full {
            return Ok(total);
        }
    }
}
