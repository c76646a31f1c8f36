//! Status back: the loop that carries what the agents observed
//! (`application_state`, `resource_state`, `sync_operation`) to the tenants'
//! GitOpsDeployments, managed environments, repository credentials and
//! GitOpsDeploymentSyncRuns.
//!
//! For each shard this writer owns, it reads the `application_state` and
//! `resource_state` rows past the shard's durable cursor (`writer_shard.status_xid`),
//! patches the matching resource's status when it differs, refreshes the SyncRuns of those
//! deployments, and moves the cursor past what it handled, never past a
//! transaction still in flight (see `gitops_shared::db::status_feed`). It scans on start, on every `status`
//! notification and reconnect of the listener, when the owned shards change and
//! on a timer; it never polls every deployment. Sync requests still in flight are
//! looked at again on each scan until they finish, because the agent records a
//! sync's end after the application state that announced it.
//!
//! One resource never holds back the others of its shard. A row whose patch fails
//! for a reason of that resource alone (`StatusError::is_row_specific`: the API
//! server refuses the patch of that object, or the object keeps changing under it)
//! is recorded in `status_retry` in the transaction that moves the cursor past it,
//! and put back in the feed when it comes due (`gitops_shared::db::status_retry`);
//! the loop wakes for the first due retry. A failure that concerns every row (a
//! refused read, an API server or database that does not answer or throttles,
//! refused credentials) stops the cursor before the row, and the scan starts again.
//!
//! Signal protocol (`gitops_shared::signal`): several writers share the one `status`
//! signal. A scan that handles new rows (moves a shard's cursor; rows held back by a
//! transaction in flight, read again, do not count) marks it awake, so agents' commits
//! stop notifying while this writer is at work, and the loop scans on without waiting.
//! Because the other writers' rows now arrive without a notification, an awake writer
//! relays: each later scan of its busy spell that handles new rows ends with one
//! notification to all writers (marking the signal awake again, should another writer
//! have set it asleep), and so does the `try_sleep` that ends the spell, taken when a
//! scan finds nothing new and so after every agent transaction that read the signal
//! awake has ended. A failed scan tries the same (see `settle`), and shutdown notifies
//! in any case. A writer woken by a relay scans; it marks the signal awake, and relays,
//! only if it handles new rows itself, so idle writers do not wake each other in turn.
//! A writer that dies awake leaves the signal awake until another writer's next
//! `try_sleep`, at the latest after that writer's timer ([`STATUS_SCAN_INTERVAL`]). A
//! busy spell gives way to shutdown and to a change of the owned shards.

mod patch;
pub mod render;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use gitops_shared::db::status_feed::{
    FeedRow, STATUS_FEED_BATCH, SyncRunRow, cursor_after, status_feed_read, sync_runs_by_id, sync_runs_of_applications,
    writer_shard_advance_status,
};
use gitops_shared::db::status_retry::{
    RetryKey, ShardRetries, status_retry_pending, status_retry_replay, status_retry_settle_in_txn,
};
use gitops_shared::db::writer_shard::writer_shard_fence_in_txn;
use gitops_shared::db::{DbError, pooled};
use gitops_shared::listen::Listener;
use gitops_shared::model::{ApplicationId, RowState, SyncOperationId};
use gitops_shared::signal::{Signal, SleepAttempt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use patch::{PatchOutcome, patch_deletion_stuck, patch_deployment, patch_resource, patch_sync_run};

use crate::context::WriterContext;
use crate::work_queue::{Key, Kind};

/// Status patches in flight at once within a batch of the feed.
const PATCHES_IN_FLIGHT: usize = 16;

/// Scan this often even without a notification.
pub const STATUS_SCAN_INTERVAL: Duration = Duration::from_secs(30);
/// Scan again this soon while rows of transactions in flight hold a cursor back,
/// or after a failure.
const RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// Why the status loop stopped or a scan failed.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("the listener does not carry the status signal")]
    NotSubscribed,
    #[error("status feed database access failed")]
    Db {
        #[from]
        source: DbError,
    },
    #[error("could not {action} a tenant resource")]
    Kube { action: &'static str, source: kube::Error },
    #[error("the status of {name} kept changing under the patch")]
    Contended { name: String },
}

impl StatusError {
    /// Whether the failure belongs to the one resource rather than to the API server,
    /// the writer or the database: the object keeps changing under the patch, or the
    /// API server refused the patch of that object (forbidden for it, say by an
    /// admission policy; invalid; too large). Such a row is retried on its own
    /// (`gitops_shared::db::status_retry`) and the rows after it go on. Anything else
    /// (a read refused, which with the writer's cluster-wide rights means those rights
    /// are missing; unauthorized; timeouts, throttling, server errors, lost
    /// connections) concerns every row: the scan stops and starts again.
    pub fn is_row_specific(&self) -> bool {
        match self {
            StatusError::Contended { .. } => true,
            StatusError::Kube { action, source: kube::Error::Api(status) } => {
                *action == patch::PATCH_ACTION && matches!(status.code, 403 | 413 | 422)
            }
            _ => false,
        }
    }
}

/// How much of a refusal is kept for operators in `status_retry.last_error`.
const RETRY_ERROR_CHARS: usize = 1000;

/// The soonest a scan comes back for retries that are due (a due retry is put back
/// in the feed by the next scan, which pushes its due time on).
const RETRY_WAKE_MIN: Duration = Duration::from_secs(1);

/// What one scan of the owned shards found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ScanReport {
    pub rows: usize,
    pub patched: usize,
    /// Rows whose cursor could not move yet (transactions in flight, or a failure).
    pub held_back: bool,
    /// Whether a shard's cursor moved: new rows were handled.
    pub advanced: bool,
    /// Rows passed over to be retried on their own (`StatusError::is_row_specific`).
    pub deferred: usize,
    /// When the first retry of the owned shards comes due (None: none waits).
    pub retry_in: Option<Duration>,
}

impl ScanReport {
    fn add(&mut self, other: ScanReport) {
        self.rows += other.rows;
        self.patched += other.patched;
        self.held_back |= other.held_back;
        self.advanced |= other.advanced;
        self.deferred += other.deferred;
        self.retry_in = match (self.retry_in, other.retry_in) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// Runs until `cancel` fires. `shards` carries the shards this writer owns now;
/// `listener` must have been started with [`Signal::status`].
pub async fn run_status_loop(
    ctx: Arc<WriterContext>,
    mut shards: watch::Receiver<Vec<i32>>,
    listener: Listener,
    cancel: CancellationToken,
) -> Result<(), StatusError> {
    let signal = Signal::status();
    let mut wake = listener.subscribe(&signal).ok_or(StatusError::NotSubscribed)?;
    let mut syncs = InFlightSyncs::default();
    // Whether this writer marked the signal awake and owes the others a notification.
    let mut awake = false;
    loop {
        // Arm before scanning: a notification during the scan is not lost.
        wake.borrow_and_update();
        let owned = shards.borrow_and_update().clone();
        let interrupted = || cancel.is_cancelled() || shards.has_changed().unwrap_or(true);
        let outcome = scan_until_asleep(&ctx, &signal, &owned, &mut syncs, &mut awake, &interrupted).await;
        let pause = match outcome {
            Ok(report) => {
                let pause = if report.held_back {
                    RETRY_INTERVAL
                } else {
                    ctx.metrics.status_caught_up();
                    if syncs.is_empty() { STATUS_SCAN_INTERVAL } else { RETRY_INTERVAL }
                };
                report.retry_in.map_or(pause, |due| pause.min(due.max(RETRY_WAKE_MIN)))
            }
            Err(error) => {
                tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error), "status scan failed");
                // A writer that keeps failing must not keep the others unwoken.
                settle(&ctx, &signal, &mut awake, false).await;
                RETRY_INTERVAL
            }
        };
        tokio::select! {
            () = cancel.cancelled() => {
                settle(&ctx, &signal, &mut awake, true).await;
                return Ok(());
            }
            changed = wake.changed() => {
                if changed.is_err() {
                    return Ok(()); // the listener stopped: shutting down
                }
            }
            changed = shards.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
            }
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// Pays what a writer owes the others when it stops scanning outside the usual
/// end of a spell: [`hand_back`], logged if it fails too. After a failed scan it
/// notifies only once `sleeping` is set (its own notification would wake it, and a
/// scan that keeps failing fast would notify in a loop); the debt is kept and tried
/// again after the pause. At shutdown (`last`) it notifies in any case.
async fn settle(ctx: &WriterContext, signal: &Signal, awake: &mut bool, last: bool) {
    if !*awake {
        return;
    }
    if let Err(error) = hand_back(ctx, signal, awake, last).await {
        tracing::debug!(error = %gitops_shared::telemetry::error_chain(&error), "could not hand the status signal back");
    }
}

/// Scans until a scan finds nothing new, then asserts `sleeping` on the signal,
/// scanning again while an agent holds it and once more after it is set. A scan
/// that moved a cursor keeps the signal awake and relays (see the
/// module's protocol); `awake` says whether this writer owes the others a
/// notification, across failed scans. A busy spell gives way when `interrupted`
/// says so (shutdown, new shards), returning as if rows were held back.
async fn scan_until_asleep(
    ctx: &WriterContext,
    signal: &Signal,
    owned: &[i32],
    syncs: &mut InFlightSyncs,
    awake: &mut bool,
    interrupted: &(dyn Fn() -> bool + Sync),
) -> Result<ScanReport, StatusError> {
    let mut total = ScanReport::default();
    loop {
        let report = scan_shards(ctx, owned, syncs).await?;
        total.add(report);
        // A spell lasts while scans move a cursor. Rows held back by a transaction
        // in flight come back on every scan until it ends; a scan that only read
        // them again starts or extends no spell (that would relay, and wake this
        // writer, for as long as the transaction stays open).
        if report.advanced {
            let client = pooled(&ctx.pool).await?;
            if *awake {
                signal.relay(&client).await?;
            } else {
                // Owed from here on, even if the answer to the update is lost.
                *awake = true;
                signal.mark_awake(&client).await?;
            }
            drop(client);
            if interrupted() {
                total.held_back = true;
                return Ok(total);
            }
            continue;
        }
        if hand_back(ctx, signal, awake, false).await? == SleepAttempt::Asleep {
            let last = scan_shards(ctx, owned, syncs).await?;
            total.add(last);
            total.held_back = last.held_back;
            return Ok(total);
        }
    }
}

/// Tries to set `sleeping` and, if this writer had marked the signal awake, notifies
/// the others in the same transaction (so after every agent transaction that read
/// it awake has ended, when the try succeeds).
/// With `always`, notifies even when an agent is in flight (the signal stays awake
/// and owed, but the others scan now).
async fn hand_back(
    ctx: &WriterContext,
    signal: &Signal,
    awake: &mut bool,
    always: bool,
) -> Result<SleepAttempt, StatusError> {
    let mut client = pooled(&ctx.pool).await?;
    let txn = client.transaction().await.map_err(DbError::query("begin"))?;
    let attempt = signal.try_sleep_in_txn(&txn).await?;
    if *awake && (always || attempt == SleepAttempt::Asleep) {
        signal.notify(&*txn).await?;
    }
    txn.commit().await.map_err(DbError::query("commit a signal"))?;
    if attempt == SleepAttempt::Asleep {
        *awake = false;
    }
    Ok(attempt)
}

/// One pass over the owned shards and the sync requests still in flight.
pub async fn scan_shards(
    ctx: &WriterContext,
    owned: &[i32],
    syncs: &mut InFlightSyncs,
) -> Result<ScanReport, StatusError> {
    let mut report = ScanReport::default();
    let mut first_error = None;
    let retries = {
        let client = pooled(&ctx.pool).await?;
        status_retry_pending(&client, owned).await?
    };
    ctx.metrics.status_retries(retries.iter().map(|retries| retries.waiting).sum());
    for &shard in owned {
        let waiting = retries.iter().find(|retries| retries.shard == shard);
        match scan_shard(ctx, shard, syncs, waiting).await {
            Ok(shard_report) => report.add(shard_report),
            Err(error) => {
                report.held_back = true;
                first_error.get_or_insert(error);
            }
        }
    }
    let client = pooled(&ctx.pool).await?;
    if !retries.is_empty() || report.deferred > 0 {
        // Read again: replays and this scan's refusals moved the due times.
        let retries = status_retry_pending(&client, owned).await?;
        report.retry_in = retries.iter().map(|retries| retries.due_in).min();
        ctx.metrics.status_retries(retries.iter().map(|retries| retries.waiting).sum());
    }
    let pending = sync_runs_by_id(&client, &syncs.ids()).await?;
    syncs.clear_missing(&pending);
    drop(client);
    for run in &pending {
        syncs.refresh(ctx, run).await?;
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(report),
    }
}

/// Reads `shard` past its cursor batch by batch, patching and advancing. Puts the
/// shard's due retries (`waiting`) back in its feed first; a row that fails on its
/// own is recorded to be retried, in the transaction that moves the cursor past it.
async fn scan_shard(
    ctx: &WriterContext,
    shard: i32,
    syncs: &mut InFlightSyncs,
    waiting: Option<&ShardRetries>,
) -> Result<ScanReport, StatusError> {
    let mut report = ScanReport::default();
    if let Some(waiting) = waiting.filter(|waiting| waiting.due_in.is_zero()) {
        let client = pooled(&ctx.pool).await?;
        let replayed = status_retry_replay(&client, shard, &ctx.writer_id).await?;
        tracing::debug!(shard, replayed, waiting = waiting.waiting, "status retries put back in the feed");
    }
    loop {
        let client = pooled(&ctx.pool).await?;
        let rows = status_feed_read(&client, shard, &ctx.writer_id, STATUS_FEED_BATCH).await?;
        drop(client); // no connection held across Kubernetes calls
        if rows.is_empty() {
            return Ok(report);
        }
        report.rows += rows.len();
        let mut handled = 0;
        let mut failure = None;
        let mut deferred: Vec<(RetryKey, String)> = Vec::new();
        let mut settled: Vec<RetryKey> = Vec::new();
        // Patches run side by side; results come back in feed order, and the
        // cursor only passes the rows before the first failure that is not the
        // row's own.
        // (Boxed: a spawned task cannot hold the closure's higher-ranked future type.)
        let patches: Vec<futures_util::future::BoxFuture<'_, Result<PatchOutcome, StatusError>>> =
            rows.iter().map(|row| settle_row(ctx, row).boxed()).collect();
        let mut outcomes = futures_util::stream::iter(patches).buffered(PATCHES_IN_FLIGHT);
        for row in &rows {
            let Some(outcome) = outcomes.next().await else { break };
            match outcome {
                Ok(outcome) => {
                    if outcome == PatchOutcome::Patched {
                        report.patched += 1;
                        tracing::debug!(xid = row.xid(), "status patched");
                    }
                    if row.retrying() {
                        settled.push(row.retry_key());
                    }
                    handled += 1;
                }
                Err(error) if error.is_row_specific() => {
                    let (namespace, name) = row.names();
                    let message = gitops_shared::telemetry::error_chain(&error);
                    tracing::warn!(
                        tenant.ns = namespace,
                        resource = name,
                        error = %message,
                        "status not written: this resource refused it; it is tried again later, the others go on"
                    );
                    let recorded: String =
                        format!("{namespace}/{name}: {message}").chars().take(RETRY_ERROR_CHARS).collect();
                    deferred.push((row.retry_key(), recorded));
                    handled += 1;
                }
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            }
        }
        report.deferred += deferred.len();
        ctx.metrics.status_deferred(deferred.len() as u64);
        let done = &rows[..handled];
        let client = pooled(&ctx.pool).await?;
        let applications: Vec<ApplicationId> = done
            .iter()
            .filter_map(|row| match row {
                FeedRow::Application(row) => Some(row.application_id),
                FeedRow::Resource(_) => None,
            })
            .collect();
        let runs = sync_runs_of_applications(&client, &applications).await?;
        drop(client);
        for run in &runs {
            syncs.refresh(ctx, run).await?;
        }
        let end = cursor_after(&rows, handled, STATUS_FEED_BATCH);
        // Complete when the cursor passed every row read: nothing is waiting on a
        // transaction still in flight.
        let complete = handled == rows.len() && end.zip(rows.last()).is_some_and(|(end, last)| end > last.xid());
        let mut moved = false;
        if let Some(xid) = end {
            let mut client = pooled(&ctx.pool).await?;
            if deferred.is_empty() && settled.is_empty() {
                moved = writer_shard_advance_status(&client, shard, &ctx.writer_id, xid).await?;
            } else {
                // The cursor passes a deferred row only together with its record, and
                // only the shard's owner records or clears (a writer that lost the
                // shard could clear a retry its successor has just recorded).
                let txn = client.transaction().await.map_err(DbError::query("begin"))?;
                if writer_shard_fence_in_txn(&txn, shard, &ctx.writer_id).await? {
                    status_retry_settle_in_txn(&txn, shard, &deferred, &settled).await?;
                    moved = writer_shard_advance_status(&txn, shard, &ctx.writer_id, xid).await?;
                    txn.commit().await.map_err(DbError::query("commit the status cursor"))?;
                }
            }
            // Rows put back for a retry alone start or extend no spell (see
            // `scan_until_asleep`): the cursor moved, but nothing new came.
            report.advanced |= moved && done.iter().any(|row| !row.retrying());
        }
        if let Some(error) = failure {
            return Err(error);
        }
        if !complete {
            report.held_back = true;
            return Ok(report);
        }
        // Read on only after a full batch that moved the cursor (else the same rows
        // would come back).
        if (rows.len() as i64) < STATUS_FEED_BATCH || !moved {
            return Ok(report);
        }
    }
}

/// Patches the resource of a live row; for an application row being deleted, wakes
/// the deployment's reconcile instead (a deletion that waits for the prune is
/// released when the agent's confirmation comes through the feed). Environments
/// and credentials lose their finalizer at once, so their deleting rows have no
/// resource left to speak to.
async fn settle_row(ctx: &WriterContext, row: &FeedRow) -> Result<PatchOutcome, StatusError> {
    match row {
        FeedRow::Application(row) if row.row_state == RowState::Active => patch_deployment(&ctx.kube, row).await,
        FeedRow::Application(row) => {
            let key = Key { kind: Kind::Deployment, namespace: row.namespace.clone(), name: row.resource_name.clone() };
            ctx.queue.push(key);
            match (&row.deletion_message, row.row_state) {
                // Still there (waiting for the prune) and stuck: the tenant reads why.
                (Some(message), RowState::Deleting) => patch_deletion_stuck(&ctx.kube, row, message).await,
                _ => Ok(PatchOutcome::Unchanged),
            }
        }
        FeedRow::Resource(row) if row.row_state == RowState::Active => patch_resource(&ctx.kube, row).await,
        FeedRow::Resource(_) => Ok(PatchOutcome::Unchanged),
    }
}

/// Sync requests seen pending, running or terminating: looked at on every scan
/// until they finish (or their row goes).
#[derive(Debug, Default)]
pub struct InFlightSyncs {
    ids: HashSet<SyncOperationId>,
}

impl InFlightSyncs {
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    fn ids(&self) -> Vec<SyncOperationId> {
        self.ids.iter().copied().collect()
    }

    fn clear_missing(&mut self, present: &[SyncRunRow]) {
        self.ids.retain(|id| present.iter().any(|run| run.id == *id));
    }

    /// Patches the SyncRun of `run` and remembers whether it can still change. A
    /// SyncRun that refuses the patch on its own (`StatusError::is_row_specific`) is
    /// looked at again on the next scan and holds nothing else back.
    async fn refresh(&mut self, ctx: &WriterContext, run: &SyncRunRow) -> Result<(), StatusError> {
        let outcome = match patch_sync_run(&ctx.kube, run).await {
            Ok(outcome) => outcome,
            Err(error) if error.is_row_specific() => {
                tracing::warn!(
                    tenant.ns = run.namespace.as_str(),
                    resource = run.resource_name.as_str(),
                    error = %gitops_shared::telemetry::error_chain(&error),
                    "SyncRun status not written: it refused it; it is tried again on the next scan"
                );
                self.ids.insert(run.id);
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        if outcome == PatchOutcome::Gone || !render::sync_in_flight(run.state) {
            self.ids.remove(&run.id);
        } else {
            self.ids.insert(run.id);
        }
        Ok(())
    }
}
