//! The `admission_approval` table: what the writer's admission webhook let in after
//! checking the requester, by object UID and generation (see the migration V5). The
//! webhook records an approval before it answers; the writer looks one up before it
//! stores a home deployment or a sync run; the purge loop forgets old ones.

use std::time::Duration;

use tokio_postgres::Client;
use uuid::Uuid;

use crate::db::{DbError, Statements};

const RECORD: &str = "
INSERT INTO admission_approval (resource_uid, generation, kind, requester) VALUES ($1, $2, $3, $4)
ON CONFLICT (resource_uid, generation) DO NOTHING";

const EXISTS: &str = "
SELECT EXISTS (SELECT 1 FROM admission_approval WHERE resource_uid = $1 AND generation = $2) AS approved";

const PURGE: &str = "
DELETE FROM admission_approval WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM admission_approval WHERE approved_at < now() - make_interval(secs => $1) LIMIT $2))";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[RECORD, EXISTS, PURGE];

/// The kinds an approval is recorded for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovedKind {
    Deployment,
    SyncRun,
}

impl ApprovedKind {
    fn as_str(self) -> &'static str {
        match self {
            ApprovedKind::Deployment => "GitOpsDeployment",
            ApprovedKind::SyncRun => "GitOpsDeploymentSyncRun",
        }
    }
}

/// Records that the webhook approved `uid` at `generation` for `requester`.
pub async fn admission_approval_record(
    client: &impl Statements,
    uid: Uuid,
    generation: i64,
    kind: ApprovedKind,
    requester: &str,
) -> Result<(), DbError> {
    client
        .run(RECORD, &[&uid, &generation, &kind.as_str(), &requester])
        .await
        .map_err(DbError::query("record an admission approval"))?;
    Ok(())
}

/// Whether the webhook approved `uid` at `generation`.
pub async fn admission_approval_exists(client: &impl Statements, uid: Uuid, generation: i64) -> Result<bool, DbError> {
    let row = client.row(EXISTS, &[&uid, &generation]).await.map_err(DbError::query("read an admission approval"))?;
    crate::db::column(&row, "approved", "read an admission approval")
}

/// Removes up to `batch` approvals older than `older_than`; returns how many.
pub async fn admission_approval_purge(client: &Client, older_than: Duration, batch: i64) -> Result<u64, DbError> {
    client
        .execute(PURGE, &[&older_than.as_secs_f64(), &batch])
        .await
        .map_err(DbError::query("purge old admission approvals"))
}
