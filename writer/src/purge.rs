//! The purge loop: every `interval`, rows of this writer's shards that have been
//! `deleted` for longer than `after` are removed for good
//! ([`gitops_shared::db::purge::purge_deleted`]). The grace period lets the deletion
//! paths (which release a finalizer once the row is `deleted` or gone) and the
//! status loop see the confirmed deletion first; a row that is gone reads the same
//! to them as one that is `deleted`.
//!
//! A shard taken over mid-purge needs no fence: purging is idempotent and skips
//! rows another transaction holds, so two writers purging one shard do no harm.

use std::time::Duration;

use gitops_shared::db::purge::{PurgeReport, purge_deleted};
use gitops_shared::db::{DbError, DbPool, pooled};
use gitops_shared::telemetry::error_chain;
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

/// How often the owned shards are purged.
pub const DEFAULT_PURGE_INTERVAL: Duration = Duration::from_secs(60);
/// How long a row stays `deleted` before it is purged.
pub const DEFAULT_PURGE_AFTER: Duration = Duration::from_secs(600);
/// Rows per purge transaction.
pub const DEFAULT_PURGE_BATCH: i64 = 500;

/// When and how much the purge loop removes.
#[derive(Debug, Clone, Copy)]
pub struct PurgeSettings {
    pub interval: Duration,
    /// The grace period: rows `deleted` for less than this stay.
    pub after: Duration,
    pub batch: i64,
}

impl Default for PurgeSettings {
    fn default() -> Self {
        PurgeSettings { interval: DEFAULT_PURGE_INTERVAL, after: DEFAULT_PURGE_AFTER, batch: DEFAULT_PURGE_BATCH }
    }
}

/// Purges the shards in `shards` (the set this writer owns now) every interval
/// until `cancel` fires. A failed round is logged and the next one tries again.
pub async fn run_purge_loop(
    pool: DbPool,
    shards: watch::Receiver<Vec<i32>>,
    settings: PurgeSettings,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(settings.interval.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let owned = shards.borrow().clone();
        if owned.is_empty() {
            continue;
        }
        match purge_once(&pool, &owned, &settings).await {
            Ok(report) if report.total() > 0 => tracing::info!(
                shards = owned.len(),
                purged.sync_operations = report.sync_operations,
                purged.applications = report.applications,
                purged.repository_credentials = report.repository_credentials,
                purged.managed_environments = report.managed_environments,
                purged.tenants = report.tenants,
                "purged deleted rows"
            ),
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "could not purge deleted rows; retrying next round")
            }
        }
        // Admission approvals are not sharded; a writer that owns shard 0 forgets old ones.
        if owned.contains(&0)
            && let Err(error) = purge_approvals(&pool, settings.batch).await
        {
            tracing::warn!(error = %error_chain(&error), "could not purge old admission approvals; retrying next round");
        }
    }
}

/// How long an admission approval is kept: the writer needs it only until it stored
/// the approved generation, normally within seconds.
pub const APPROVAL_RETENTION: Duration = Duration::from_secs(24 * 3600);

async fn purge_approvals(pool: &DbPool, batch: i64) -> Result<u64, DbError> {
    let client = pooled(pool).await?;
    gitops_shared::db::admission_approval::admission_approval_purge(&client, APPROVAL_RETENTION, batch).await
}

/// One purge of `shards` on a pooled connection.
pub async fn purge_once(pool: &DbPool, shards: &[i32], settings: &PurgeSettings) -> Result<PurgeReport, DbError> {
    let mut client = pooled(pool).await?;
    purge_deleted(&mut client, shards, settings.after, settings.batch).await
}
