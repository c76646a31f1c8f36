//! Self-healing: a periodic sweep (and one at start) that compares the Argo CD
//! objects carrying the service's managed-by label with the rows, and enqueues an
//! operation only where the two disagree: an object missing, orphaned, changed
//! behind the agent's back, or built from an older generation of its row (both told
//! by annotations the agent writes, see `crate::engine::argocd::fingerprint`). A
//! sweep of an unchanged instance enqueues nothing. The sweep never writes to Argo
//! CD: the reconciler re-reads the row and decides, so a sweep racing the writer can
//! only cause a harmless extra reconcile.
//!
//! Memory is a page, not the instance: objects are listed a page at a time (`limit`
//! and `continue`), each page is compared with the rows behind it (read by id), and
//! only the ids seen (8 bytes each) and what is to be enqueued are kept. Rows whose
//! object was never seen are found last, walking the instance's rows in id order a
//! page at a time.
//!
//! Order matters: each page of objects is listed *first*, its rows read second, so
//! an object created in between by a new row is not taken for an orphan. Objects
//! without the label are never listed, so never touched. Deleting an Application
//! deletes what it deployed, so orphan deletions are capped per sweep: above the cap
//! the sweep refuses all of them (a mass of orphans means a wrong database or a
//! restored backup, and taking them a few at a time would still take them all), logs
//! and counts the refusal. Operations are enqueued in one order (resource type, then
//! id) so that overlapping sweeps of two agents never deadlock, and a failed sweep is
//! tried again with backoff, not an interval later.

use gitops_shared::telemetry::error_chain as chain;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gitops_shared::backoff;
use gitops_shared::db::placed_rows::{PlacedRow, PlacedTable, placed_elsewhere, placed_rows_after, placed_rows_of};
use gitops_shared::db::{DbError, DbPool, in_txn_retrying, pooled};
use gitops_shared::model::{EngineInstanceId, ResourceType, RowState, TenantId};
use gitops_shared::queue::operation_enqueue_in_txn;
use tokio_util::sync::CancellationToken;

use crate::engine::release::release_objects;
use crate::engine::{Engine, EngineError, ObjectKind, OwnedObject};
use crate::metrics::Metrics;
use crate::names::{
    APPLICATION_ID_LABEL, MANAGED_ENVIRONMENT_ID_LABEL, REPOSITORY_CREDENTIAL_ID_LABEL, TENANT_ID_LABEL,
};

/// How the sweep behaves.
#[derive(Debug, Clone)]
pub struct SweepConfig {
    pub interval: Duration,
    /// Orphans one sweep may queue for deletion; more than this and it queues none.
    pub max_deletions: usize,
    /// Report only; enqueue nothing.
    pub dry_run: bool,
    /// Objects listed (and held) at a time.
    pub page_size: u32,
}

/// The default page of objects a sweep holds. Applications carry their sync
/// history and resource lists in status, tens of kB each once a page is read and
/// decoded: at 500 the sweep's passing peak was about 30 MB over the agent's 27 MB
/// steady state, and it grew as the histories filled; at 100 it is a fifth.
pub const PAGE_SIZE: u32 = 100;
/// Rows read at a time when looking for rows whose object is missing.
const ROW_PAGE: i64 = 5_000;

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("list the service's objects in the engine")]
    List(#[source] EngineError),
    #[error("read the rows to compare with")]
    Rows(#[source] DbError),
    #[error("enqueue the sweep's operations")]
    Enqueue(#[source] DbError),
}

/// One row as the sweep sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowView {
    pub tenant_id: TenantId,
    pub row_state: RowState,
    /// Its current generation failed permanently: the sweep does not enqueue it.
    pub stalled: bool,
    /// The row's generation (None: the object cannot be compared by generation).
    pub generation: Option<i64>,
    /// A live row of its kind calls for an object.
    pub expects_object: bool,
}

impl From<&PlacedRow> for RowView {
    fn from(row: &PlacedRow) -> Self {
        RowView {
            tenant_id: row.tenant_id,
            row_state: row.row_state,
            stalled: row.stalled,
            generation: row.generation,
            expects_object: row.expects_object,
        }
    }
}

/// What one sweep decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepPlan {
    /// Owned objects with no live row: queued so the reconciler deletes them.
    pub deletions: Vec<Target>,
    /// Rows whose object is missing.
    pub restores: Vec<Target>,
    /// Rows whose object differs from them (edited, built from an older generation,
    /// being deleted) or that are themselves being deleted: reconciled again.
    pub resyncs: Vec<Target>,
    /// Deletions not queued because there were more than the cap.
    pub refused: usize,
    /// Owned objects whose labels name no resource (left alone).
    pub unattributed: Vec<String>,
    /// Objects listed.
    pub listed: usize,
}

/// A resource to enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    pub resource_type: ResourceTypeKey,
    pub resource_id: i64,
    pub tenant_id: TenantId,
}

/// `ResourceType` with an order, for stable plans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceTypeKey {
    Application,
    ManagedEnvironment,
    RepositoryCredential,
    Tenant,
}

impl ResourceTypeKey {
    const ALL: [ResourceTypeKey; 4] = [
        ResourceTypeKey::Application,
        ResourceTypeKey::ManagedEnvironment,
        ResourceTypeKey::RepositoryCredential,
        ResourceTypeKey::Tenant,
    ];

    pub fn resource_type(self) -> ResourceType {
        match self {
            ResourceTypeKey::Application => ResourceType::Application,
            ResourceTypeKey::ManagedEnvironment => ResourceType::ManagedEnvironment,
            ResourceTypeKey::RepositoryCredential => ResourceType::RepositoryCredential,
            ResourceTypeKey::Tenant => ResourceType::Tenant,
        }
    }

    /// The object kind and the label holding the row id.
    fn object(self) -> (ObjectKind, &'static str) {
        match self {
            ResourceTypeKey::Application => (ObjectKind::Application, APPLICATION_ID_LABEL),
            ResourceTypeKey::ManagedEnvironment => (ObjectKind::Cluster, MANAGED_ENVIRONMENT_ID_LABEL),
            ResourceTypeKey::RepositoryCredential => (ObjectKind::Repository, REPOSITORY_CREDENTIAL_ID_LABEL),
            ResourceTypeKey::Tenant => (ObjectKind::Project, TENANT_ID_LABEL),
        }
    }

    pub fn of_kind(kind: ObjectKind) -> ResourceTypeKey {
        match kind {
            ObjectKind::Application => ResourceTypeKey::Application,
            ObjectKind::Cluster => ResourceTypeKey::ManagedEnvironment,
            ObjectKind::Repository => ResourceTypeKey::RepositoryCredential,
            ObjectKind::Project => ResourceTypeKey::Tenant,
        }
    }

    /// The table its rows live in.
    fn table(self) -> PlacedTable {
        match self {
            ResourceTypeKey::Application => PlacedTable::Application,
            ResourceTypeKey::ManagedEnvironment => PlacedTable::ManagedEnvironment,
            ResourceTypeKey::RepositoryCredential => PlacedTable::RepositoryCredential,
            ResourceTypeKey::Tenant => PlacedTable::Tenant,
        }
    }
}

fn label_id(object: &OwnedObject, label: &str) -> Option<i64> {
    object.labels.get(label).and_then(|v| v.parse().ok())
}

/// The row id and tenant an object names, if it names them.
fn attribution(object: &OwnedObject) -> Option<(ResourceTypeKey, i64, TenantId)> {
    let key = ResourceTypeKey::of_kind(object.kind);
    let (_, label) = key.object();
    Some((key, label_id(object, label)?, TenantId(label_id(object, TENANT_ID_LABEL)?)))
}

/// What one object (with the row it names, if live here) calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Matches its row: nothing to do.
    Current,
    /// Differs from its row: reconcile the row.
    Resync,
    /// No live row here: a candidate for deletion (unless its row lives elsewhere).
    Orphan,
}

/// Judges one object against its row. Pure, for tests.
pub fn judge(object: &OwnedObject, row: Option<&RowView>) -> Verdict {
    let Some(row) = row.filter(|row| row.row_state != RowState::Deleted) else {
        // An object on its way out needs nobody.
        return if object.deleting { Verdict::Current } else { Verdict::Orphan };
    };
    match row.row_state {
        // Deleting rows are enqueued from the row walk, present or not.
        RowState::Deleting | RowState::Deleted => Verdict::Current,
        RowState::Active | RowState::Unknown if row.stalled => Verdict::Current,
        RowState::Active | RowState::Unknown => {
            let older = row.generation.is_some() && object.generation != row.generation;
            if object.deleting || object.drifted || older || !row.expects_object {
                Verdict::Resync
            } else {
                Verdict::Current
            }
        }
    }
}

/// What a row whose object was never seen calls for: None, or a restore / resync.
pub fn judge_unseen(row: &RowView) -> Option<bool> {
    match row.row_state {
        RowState::Deleted => None,
        // Reconciled until it is marked deleted.
        RowState::Deleting => Some(false),
        RowState::Active | RowState::Unknown if row.stalled || !row.expects_object => None,
        RowState::Active | RowState::Unknown => Some(true),
    }
}

/// A sweep's findings, built page by page; holds ids and targets, never objects.
#[derive(Debug, Default)]
pub struct Planner {
    plan: SweepPlan,
    seen: HashMap<ResourceTypeKey, Vec<i64>>,
    orphans: Vec<Target>,
    orphan_count: usize,
    max_deletions: usize,
}

impl Planner {
    pub fn new(max_deletions: usize) -> Self {
        Planner { max_deletions, ..Planner::default() }
    }

    /// Takes one page of objects of one kind and the live rows they name here;
    /// returns the orphan candidates (the caller sorts out those whose rows live on
    /// another instance, then passes the rest to [`Planner::orphan`]).
    pub fn page<'o>(
        &mut self,
        objects: &'o [OwnedObject],
        rows: &HashMap<i64, RowView>,
    ) -> Vec<(Target, &'o OwnedObject)> {
        self.plan.listed += objects.len();
        let mut candidates = Vec::new();
        for object in objects {
            let Some((key, id, tenant)) = attribution(object) else {
                self.plan.unattributed.push(object.name.clone());
                continue;
            };
            self.seen.entry(key).or_default().push(id);
            let target = Target { resource_type: key, resource_id: id, tenant_id: tenant };
            match judge(object, rows.get(&id)) {
                Verdict::Current => {}
                Verdict::Resync => {
                    let row = rows.get(&id).map_or(tenant, |r| r.tenant_id);
                    self.plan.resyncs.push(Target { tenant_id: row, ..target });
                }
                Verdict::Orphan => candidates.push((target, object)),
            }
        }
        candidates
    }

    /// An orphan whose row lives nowhere else.
    pub fn orphan(&mut self, target: Target) {
        self.orphan_count += 1;
        // Above the cap every orphan is refused: only the count is kept.
        if self.orphan_count > self.max_deletions {
            self.orphans = Vec::new();
        } else {
            self.orphans.push(target);
        }
    }

    /// Every object has been paged through: the ids seen are made searchable.
    pub fn objects_done(&mut self) {
        for ids in self.seen.values_mut() {
            ids.sort_unstable();
            ids.dedup();
        }
    }

    /// Takes a row of the instance (after [`Planner::objects_done`]).
    pub fn row(&mut self, key: ResourceTypeKey, id: i64, row: &RowView) {
        let seen = self.seen.get(&key).is_some_and(|ids| ids.binary_search(&id).is_ok());
        let target = Target { resource_type: key, resource_id: id, tenant_id: row.tenant_id };
        if row.row_state == RowState::Deleting {
            self.plan.resyncs.push(target);
        } else if !seen && judge_unseen(row) == Some(true) {
            self.plan.restores.push(target);
        }
    }

    pub fn finish(mut self) -> SweepPlan {
        if self.orphan_count > self.max_deletions {
            self.plan.refused = self.orphan_count;
        } else {
            self.orphans.sort();
            self.plan.deletions = self.orphans;
        }
        self.plan.resyncs.sort();
        self.plan.resyncs.dedup();
        self.plan.restores.sort();
        self.plan
    }
}

/// Runs sweeps for one instance.
pub struct Sweeper {
    pub engine: Arc<dyn Engine>,
    pub pool: DbPool,
    pub instance: EngineInstanceId,
    pub config: SweepConfig,
    pub metrics: Arc<Metrics>,
    /// Sweeps only while this process holds the instance's duty lease (None: always).
    pub duty: Option<crate::heartbeat::Duty>,
}

/// Operations enqueued per transaction.
const ENQUEUE_BATCH: usize = 500;
/// The first wait before a failed sweep is tried again; it doubles up to the interval.
const RETRY_FIRST: Duration = Duration::from_secs(1);

/// Enqueues an operation for each of `targets` on `instance`, in batches. Every
/// enqueuer of many operations inserts them in one order (resource type, then id),
/// so two sweeps that overlap wait for each other instead of deadlocking; a batch
/// PostgreSQL aborts anyway (a writer's enqueue in between) is run again.
pub async fn enqueue_targets(
    client: &mut tokio_postgres::Client,
    instance: EngineInstanceId,
    mut targets: Vec<Target>,
) -> Result<(), DbError> {
    targets.sort();
    targets.dedup_by_key(|t| (t.resource_type, t.resource_id));
    for chunk in targets.chunks(ENQUEUE_BATCH) {
        in_txn_retrying(client, |txn| {
            // The body may run again: each run gets its own copy of the batch.
            let chunk = chunk.to_vec();
            Box::pin(async move {
                for target in chunk {
                    let resource_type = target.resource_type.resource_type();
                    operation_enqueue_in_txn(txn, instance, target.tenant_id, resource_type, target.resource_id)
                        .await?;
                }
                Ok(())
            })
        })
        .await?;
    }
    Ok(())
}

impl Sweeper {
    /// Sweeps at once (once the duties are this process's), then every `interval`, until `cancel` fires. A failed sweep is tried again after 1 s, doubling (with jitter) up to the interval.
    pub async fn run(self, cancel: CancellationToken) {
        let mut failures: u32 = 0;
        loop {
            if let Some(duty) = &self.duty
                && !duty.wait_held(&cancel).await
            {
                return;
            }
            let wait = match self.sweep_once().await {
                Ok(plan) => {
                    failures = 0;
                    tracing::info!(
                        deletions = plan.deletions.len(),
                        restores = plan.restores.len(),
                        resyncs = plan.resyncs.len(),
                        refused = plan.refused,
                        dry_run = self.config.dry_run,
                        "sweep finished"
                    );
                    self.config.interval
                }
                Err(error) => {
                    failures = failures.saturating_add(1);
                    self.metrics.sweep_failures.fetch_add(1, Ordering::Relaxed);
                    let wait =
                        backoff::exponential(failures, RETRY_FIRST, self.config.interval, backoff::unit_random());
                    tracing::warn!(error = %chain(&error), retry_in_ms = wait.as_millis() as u64, "sweep failed");
                    wait
                }
            };
            self.metrics.sweep_runs.fetch_add(1, Ordering::SeqCst);
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One sweep: page through the objects comparing each page with its rows, walk
    /// the rows for missing objects, then enqueue (unless dry-run).
    pub async fn sweep_once(&self) -> Result<SweepPlan, SweepError> {
        let client = pooled(&self.pool).await.map_err(SweepError::Rows)?;
        let mut planner = Planner::new(self.config.max_deletions);
        let mut released = 0;
        for kind in ObjectKind::ALL {
            let key = ResourceTypeKey::of_kind(kind);
            let mut from: Option<String> = None;
            loop {
                let page = self
                    .engine
                    .list_owned_page(kind, from.as_deref(), self.config.page_size)
                    .await
                    .map_err(SweepError::List)?;
                let ids: Vec<i64> = page.objects.iter().filter_map(|o| attribution(o).map(|(_, id, _)| id)).collect();
                let rows: HashMap<i64, RowView> = if ids.is_empty() {
                    HashMap::new()
                } else {
                    placed_rows_of(&client, key.table(), self.instance, &ids)
                        .await
                        .map_err(SweepError::Rows)?
                        .iter()
                        .map(|row| (row.id, RowView::from(row)))
                        .collect()
                };
                let candidates = planner.page(&page.objects, &rows);
                let elsewhere = self.elsewhere(&client, key, &candidates).await?;
                let mut theirs = Vec::new();
                for (target, object) in candidates {
                    if elsewhere.contains(&target.resource_id) {
                        theirs.push(object);
                    } else {
                        planner.orphan(target);
                    }
                }
                if !theirs.is_empty() && !self.config.dry_run {
                    released += self.release_elsewhere(&theirs).await;
                }
                from = page.next;
                if from.is_none() {
                    break;
                }
            }
        }
        planner.objects_done();
        for key in ResourceTypeKey::ALL {
            let mut after = i64::MIN;
            loop {
                let rows = placed_rows_after(&client, key.table(), self.instance, after, ROW_PAGE)
                    .await
                    .map_err(SweepError::Rows)?;
                for row in &rows {
                    planner.row(key, row.id, &RowView::from(row));
                }
                match rows.last() {
                    Some(last) if rows.len() as i64 == ROW_PAGE => after = last.id,
                    _ => break,
                }
            }
        }
        drop(client);
        let plan = planner.finish();
        if released > 0 {
            self.metrics.objects_released.fetch_add(released, Ordering::Relaxed);
            tracing::info!(released, "objects of tenants placed elsewhere released");
        }
        for name in &plan.unattributed {
            tracing::warn!(argocd.object = %name, "owned object names no row; left alone");
        }
        if plan.refused > 0 {
            self.metrics.sweep_deletions_refused.fetch_add(plan.refused as u64, Ordering::Relaxed);
            tracing::error!(
                orphans = plan.refused,
                max_deletions = self.config.max_deletions,
                "refusing to delete: more orphaned objects than the sweep may delete at once; check the database \
                 the agent uses, then raise --sweep-max-deletions if the deletions are intended"
            );
        }
        for target in &plan.deletions {
            tracing::warn!(
                resource.type = %target.resource_type.resource_type(), resource.id = target.resource_id,
                tenant.id = target.tenant_id.0, dry_run = self.config.dry_run,
                "orphaned object: queued for deletion by the reconciler"
            );
        }
        if self.config.dry_run {
            let would = plan.deletions.len() + plan.restores.len() + plan.resyncs.len();
            self.metrics.sweep_dry_run_skipped.fetch_add(would as u64, Ordering::Relaxed);
            return Ok(plan);
        }
        let all: Vec<Target> = plan.deletions.iter().chain(&plan.restores).chain(&plan.resyncs).copied().collect();
        if !all.is_empty() {
            let mut client = pooled(&self.pool).await.map_err(SweepError::Rows)?;
            enqueue_targets(&mut client, self.instance, all).await.map_err(SweepError::Enqueue)?;
        }
        self.metrics.sweep_deletions_enqueued.fetch_add(plan.deletions.len() as u64, Ordering::Relaxed);
        self.metrics.sweep_restores_enqueued.fetch_add(plan.restores.len() as u64, Ordering::Relaxed);
        self.metrics.sweep_resyncs_enqueued.fetch_add(plan.resyncs.len() as u64, Ordering::Relaxed);
        Ok(plan)
    }

    /// Those of the orphan candidates whose rows live on another instance (a tenant
    /// placed elsewhere): enqueueing here would pull its operation over, so they are
    /// released here instead (see [`Sweeper::release_elsewhere`]), never deleted.
    async fn elsewhere(
        &self,
        client: &tokio_postgres::Client,
        key: ResourceTypeKey,
        candidates: &[(Target, &OwnedObject)],
    ) -> Result<HashSet<i64>, SweepError> {
        if candidates.is_empty() {
            return Ok(HashSet::new());
        }
        let ids: Vec<i64> = candidates.iter().map(|(t, _)| t.resource_id).collect();
        let elsewhere: HashSet<i64> = placed_elsewhere(client, key.table(), &ids, self.instance)
            .await
            .map_err(SweepError::Rows)?
            .into_iter()
            .collect();
        for id in &elsewhere {
            tracing::warn!(resource.type = %key.resource_type(), resource.id = id,
                "object belongs to a row placed on another instance: released here, never deleted");
        }
        Ok(elsewhere)
    }

    /// Removes here, without pruning (`crate::engine::release`), the objects of rows
    /// placed on another instance (left behind by a move or a failover). The
    /// deletion cap does not apply: nothing deployed is touched. Returns how many went.
    async fn release_elsewhere(&self, objects: &[&OwnedObject]) -> u64 {
        let released = release_objects(self.engine.as_ref(), objects).await;
        for (name, error) in &released.failed {
            tracing::warn!(error = %chain(error), argocd.object = %name, "could not release an object");
        }
        released.removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(kind: ObjectKind, name: &str, labels: &[(&str, &str)]) -> OwnedObject {
        OwnedObject {
            kind,
            name: name.into(),
            labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            deleting: false,
            destination_namespace: None,
            project: None,
            destination_server: None,
            drifted: false,
            generation: Some(1),
        }
    }

    fn app(id: &str) -> OwnedObject {
        object(ObjectKind::Application, id, &[(APPLICATION_ID_LABEL, id), (TENANT_ID_LABEL, "1")])
    }

    fn row(row_state: RowState, stalled: bool) -> RowView {
        RowView { tenant_id: TenantId(1), row_state, stalled, generation: Some(1), expects_object: true }
    }

    /// Runs a planner over `pages` of objects and then `rows`, every candidate an orphan.
    fn sweep(pages: &[Vec<OwnedObject>], rows: &HashMap<i64, RowView>, cap: usize) -> SweepPlan {
        let mut planner = Planner::new(cap);
        for page in pages {
            let of_page: HashMap<i64, RowView> = page
                .iter()
                .filter_map(|o| attribution(o).and_then(|(_, id, _)| rows.get(&id).map(|r| (id, *r))))
                .collect();
            let candidates: Vec<Target> = planner.page(page, &of_page).into_iter().map(|(t, _)| t).collect();
            for target in candidates {
                planner.orphan(target);
            }
        }
        planner.objects_done();
        let mut ids: Vec<_> = rows.keys().copied().collect();
        ids.sort();
        for id in ids {
            planner.row(ResourceTypeKey::Application, id, &rows[&id]);
        }
        planner.finish()
    }

    fn ids(targets: &[Target]) -> Vec<i64> {
        targets.iter().map(|t| t.resource_id).collect()
    }

    #[test]
    fn only_what_differs_is_planned_across_pages() {
        let rows = HashMap::from([
            (1, row(RowState::Active, false)),
            (2, row(RowState::Active, false)),
            (3, row(RowState::Deleted, false)),
            // Refused by Argo CD at its current generation: neither orphan nor retried.
            (4, row(RowState::Active, true)),
            (5, row(RowState::Active, true)),
            (6, RowView { generation: Some(2), ..row(RowState::Active, false) }),
            (7, row(RowState::Active, false)),
            (8, row(RowState::Deleting, false)),
            (10, RowView { expects_object: false, ..row(RowState::Active, false) }),
        ]);
        let mut drifted = app("7");
        drifted.drifted = true;
        let pages = vec![
            vec![app("1"), app("3"), app("4"), drifted],
            vec![app("9"), object(ObjectKind::Application, "odd", &[]), app("6"), app("8")],
        ];
        let planned = sweep(&pages, &rows, 5);
        assert_eq!(ids(&planned.deletions), vec![3, 9]);
        assert_eq!(ids(&planned.restores), vec![2], "missing; not the stalled 5, not 10 that wants none");
        assert_eq!(ids(&planned.resyncs), vec![6, 7, 8], "older generation, edited, being deleted");
        assert_eq!(planned.unattributed, vec!["odd".to_owned()]);
        assert_eq!(planned.listed, 8);

        let unchanged: Vec<Vec<OwnedObject>> = vec![vec![app("1"), app("2")], vec![app("7")]];
        let quiet = HashMap::from([(1, rows[&1]), (2, rows[&2]), (7, rows[&7])]);
        assert_eq!(sweep(&unchanged, &quiet, 5), SweepPlan { listed: 3, ..SweepPlan::default() });

        let capped = sweep(&pages, &rows, 1);
        assert!(capped.deletions.is_empty());
        assert_eq!(capped.refused, 2);
    }
}
