//! Self-healing: a periodic sweep (and one at start) that compares the Argo CD
//! objects carrying the service's managed-by label with the rows, and enqueues an
//! operation wherever the two may disagree. The sweep never writes to Argo CD: the
//! reconciler re-reads the row and decides, so a sweep racing the writer can only
//! cause a harmless extra reconcile.
//!
//! Order matters: objects are listed *first*, rows read second, so an object created
//! in between by a new row is not taken for an orphan. Objects without the label are
//! never listed, so never touched. Deleting an Application deletes what it deployed,
//! so orphan deletions are capped per sweep: above the cap the sweep refuses all of
//! them (a mass of orphans means a wrong database or a restored backup, and taking
//! them a few at a time would still take them all), logs and counts the refusal.
//! Every row of the instance is also enqueued once per sweep, so edits made behind
//! the agent's back are put right by the reconciler's apply. Operations are enqueued
//! in one order (resource type, then id) so that overlapping sweeps of two agents
//! never deadlock, and a failed sweep is tried again with backoff, not an interval later.

use gitops_shared::telemetry::error_chain as chain;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gitops_shared::backoff;
use gitops_shared::db::placed_rows::{PlacedTable, placed_elsewhere, placed_rows};
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
}

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
}

/// What one sweep decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepPlan {
    /// Owned objects with no live row: queued so the reconciler deletes them.
    pub deletions: Vec<Target>,
    /// Rows whose object is missing.
    pub restores: Vec<Target>,
    /// Rows whose object exists (or is being deleted): reconciled again.
    pub resyncs: Vec<Target>,
    /// Deletions not queued because there were more than the cap.
    pub refused: usize,
    /// Owned objects whose labels name no resource (left alone).
    pub unattributed: Vec<String>,
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

    fn of_kind(kind: ObjectKind) -> ResourceTypeKey {
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

/// Rows of the instance, per type and id.
pub type Rows = HashMap<ResourceTypeKey, HashMap<i64, RowView>>;

fn label_id(object: &OwnedObject, label: &str) -> Option<i64> {
    object.labels.get(label).and_then(|v| v.parse().ok())
}

/// Compares `objects` (listed first) with `rows` (read after). Pure, for tests.
pub fn plan(objects: &[OwnedObject], rows: &Rows, max_deletions: usize) -> SweepPlan {
    let mut plan = SweepPlan::default();
    let mut present: HashSet<(ResourceTypeKey, i64)> = HashSet::new();
    let mut orphans: BTreeMap<Target, ()> = BTreeMap::new();
    for object in objects {
        let key = ResourceTypeKey::of_kind(object.kind);
        let (_, label) = key.object();
        let (Some(id), Some(tenant)) = (label_id(object, label), label_id(object, TENANT_ID_LABEL)) else {
            plan.unattributed.push(object.name.clone());
            continue;
        };
        present.insert((key, id));
        let live = rows.get(&key).and_then(|r| r.get(&id)).filter(|row| row.row_state != RowState::Deleted);
        if live.is_none() && !object.deleting {
            orphans.insert(Target { resource_type: key, resource_id: id, tenant_id: TenantId(tenant) }, ());
        }
    }
    for key in ResourceTypeKey::ALL {
        let Some(of_type) = rows.get(&key) else { continue };
        let mut ids: Vec<_> = of_type.iter().filter(|(_, row)| row.row_state != RowState::Deleted).collect();
        ids.sort_by_key(|(id, _)| **id);
        for (id, row) in ids.into_iter().filter(|(_, row)| !(row.stalled && row.row_state == RowState::Active)) {
            let target = Target { resource_type: key, resource_id: *id, tenant_id: row.tenant_id };
            if present.contains(&(key, *id)) || row.row_state == RowState::Deleting {
                plan.resyncs.push(target);
            } else {
                plan.restores.push(target);
            }
        }
    }
    let orphans: Vec<Target> = orphans.into_keys().collect();
    if orphans.len() > max_deletions {
        plan.refused = orphans.len();
    } else {
        plan.deletions = orphans;
    }
    plan
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

    /// One sweep: list, read, plan, enqueue (unless dry-run).
    pub async fn sweep_once(&self) -> Result<SweepPlan, SweepError> {
        let objects = self.engine.list_owned().await.map_err(SweepError::List)?;
        let mut client = pooled(&self.pool).await.map_err(SweepError::Rows)?;
        let mut rows: Rows = HashMap::new();
        for key in ResourceTypeKey::ALL {
            let found = placed_rows(&client, key.table(), self.instance).await.map_err(SweepError::Rows)?;
            rows.insert(
                key,
                found
                    .iter()
                    .map(|r| (r.id, RowView { tenant_id: r.tenant_id, row_state: r.row_state, stalled: r.stalled }))
                    .collect(),
            );
        }
        let mut plan = plan(&objects, &rows, self.config.max_deletions);
        let elsewhere = self.leave_other_instances(&client, &mut plan).await?;
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
        if !elsewhere.is_empty() {
            let released = self.release_elsewhere(&objects, &elsewhere).await;
            self.metrics.objects_released.fetch_add(released, Ordering::Relaxed);
            tracing::info!(released, "objects of tenants placed elsewhere released");
        }
        let all: Vec<Target> = plan.deletions.iter().chain(&plan.restores).chain(&plan.resyncs).copied().collect();
        enqueue_targets(&mut client, self.instance, all).await.map_err(SweepError::Enqueue)?;
        self.metrics.sweep_deletions_enqueued.fetch_add(plan.deletions.len() as u64, Ordering::Relaxed);
        self.metrics.sweep_restores_enqueued.fetch_add(plan.restores.len() as u64, Ordering::Relaxed);
        Ok(plan)
    }

    /// Takes out of the deletions the objects whose rows live on another instance (a
    /// tenant placed elsewhere): enqueueing here would pull its operation over. They
    /// are returned, to be released here (see [`Sweeper::release_elsewhere`]).
    async fn leave_other_instances(
        &self,
        client: &tokio_postgres::Client,
        plan: &mut SweepPlan,
    ) -> Result<Vec<Target>, SweepError> {
        let mut taken = Vec::new();
        for key in ResourceTypeKey::ALL {
            let ids: Vec<i64> =
                plan.deletions.iter().filter(|t| t.resource_type == key).map(|t| t.resource_id).collect();
            if ids.is_empty() {
                continue;
            }
            let elsewhere: HashSet<i64> = placed_elsewhere(client, key.table(), &ids, self.instance)
                .await
                .map_err(SweepError::Rows)?
                .into_iter()
                .collect();
            for id in &elsewhere {
                tracing::warn!(resource.type = %key.resource_type(), resource.id = id,
                    "object belongs to a row placed on another instance: released here, never deleted");
            }
            taken
                .extend(plan.deletions.iter().filter(|t| t.resource_type == key && elsewhere.contains(&t.resource_id)));
            plan.deletions.retain(|t| t.resource_type != key || !elsewhere.contains(&t.resource_id));
        }
        Ok(taken)
    }

    /// Removes here, without pruning (`crate::engine::release`), the objects of rows
    /// placed on another instance (left behind by a move or a failover). The
    /// deletion cap does not apply: nothing deployed is touched. Returns how many went.
    async fn release_elsewhere(&self, objects: &[OwnedObject], targets: &[Target]) -> u64 {
        let theirs: Vec<&OwnedObject> = objects
            .iter()
            .filter(|o| {
                let key = ResourceTypeKey::of_kind(o.kind);
                targets.iter().any(|t| t.resource_type == key && Some(t.resource_id) == label_id(o, key.object().1))
            })
            .collect();
        let released = release_objects(self.engine.as_ref(), &theirs).await;
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
        }
    }

    fn app(id: &str) -> OwnedObject {
        object(ObjectKind::Application, id, &[(APPLICATION_ID_LABEL, id), (TENANT_ID_LABEL, "1")])
    }

    #[test]
    fn orphans_restores_and_the_cap() {
        let rows: Rows = HashMap::from([(
            ResourceTypeKey::Application,
            HashMap::from([
                (1, RowView { tenant_id: TenantId(1), row_state: RowState::Active, stalled: false }),
                (2, RowView { tenant_id: TenantId(1), row_state: RowState::Active, stalled: false }),
                (3, RowView { tenant_id: TenantId(1), row_state: RowState::Deleted, stalled: false }),
                // Refused by Argo CD at its current generation: present, neither orphan nor retried.
                (4, RowView { tenant_id: TenantId(1), row_state: RowState::Active, stalled: true }),
                (5, RowView { tenant_id: TenantId(1), row_state: RowState::Active, stalled: true }),
            ]),
        )]);
        let objects = vec![app("1"), app("3"), app("4"), app("9"), object(ObjectKind::Application, "odd", &[])];
        let planned = plan(&objects, &rows, 5);
        let ids = |targets: &[Target]| targets.iter().map(|t| t.resource_id).collect::<Vec<_>>();
        assert_eq!(ids(&planned.deletions), vec![3, 9]);
        assert_eq!(ids(&planned.restores), vec![2]);
        assert_eq!(ids(&planned.resyncs), vec![1]);
        assert_eq!(planned.unattributed, vec!["odd".to_owned()]);
        let capped = plan(&objects, &rows, 1);
        assert!(capped.deletions.is_empty());
        assert_eq!(capped.refused, 2);
    }
}
