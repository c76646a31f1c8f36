//! The writer's watch on the fleet: every few seconds it reads each engine
//! instance's health (`engine_instance_health()`: healthy, degraded when Argo CD
//! stops making progress, lost when no agent reaches it), shows it as metrics, and
//! when an instance's health changes it touches the observed-state rows of the
//! tenants of its own shards placed there, so the status feed tells them
//! (`Ready=False` reason `InstanceDegraded` or `InstanceLost`, and back). Shards it
//! gains are told of instances that are unhealthy already.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gitops_shared::db::instance_health::{instance_health_all, instance_health_touch};
use gitops_shared::db::{DbError, DbPool, pooled};
use gitops_shared::model::EngineInstanceId;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::WriterMetrics;

/// How often the instances' health is read.
pub const FLEET_WATCH_INTERVAL: Duration = Duration::from_secs(5);

/// Runs until `cancel` fires.
pub async fn run_fleet_watch(
    pool: DbPool,
    mut shards: watch::Receiver<Vec<i32>>,
    metrics: Arc<WriterMetrics>,
    every: Duration,
    cancel: CancellationToken,
) {
    let mut known: BTreeMap<EngineInstanceId, String> = BTreeMap::new();
    let mut told: Vec<i32> = Vec::new();
    loop {
        let owned = shards.borrow_and_update().clone();
        match look(&pool, &owned, &told, &mut known, &metrics).await {
            Ok(()) => told = owned,
            Err(error) => tracing::warn!(%error, "could not read the instances' health"),
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// One look: tells the tenants of `owned` of every change since `known`, and those
/// of shards not yet `told` of every unhealthy instance.
async fn look(
    pool: &DbPool,
    owned: &[i32],
    told: &[i32],
    known: &mut BTreeMap<EngineInstanceId, String>,
    metrics: &WriterMetrics,
) -> Result<(), DbError> {
    let client = pooled(pool).await?;
    let now = instance_health_all(&client).await?;
    let gained: Vec<i32> = owned.iter().copied().filter(|shard| !told.contains(shard)).collect();
    for (id, instance) in &now {
        let before = known.get(id);
        let shards: &[i32] = match before {
            Some(health) if *health != instance.health => owned,
            None if instance.health != "healthy" => owned,
            _ if instance.health != "healthy" => &gained,
            _ => &[],
        };
        if let Some(before) = before
            && *before != instance.health
        {
            tracing::info!(engine.instance = %instance.name, from = %before, to = %instance.health, "engine instance health changed");
        }
        if !shards.is_empty() {
            let rows = instance_health_touch(&client, *id, shards).await?;
            tracing::debug!(engine.instance = %instance.name, rows, "tenants told of their instance's health");
        }
    }
    metrics.set_instance_health(now.values().map(|i| (i.name.clone(), i.health.clone())).collect());
    *known = now.into_iter().map(|(id, instance)| (id, instance.health)).collect();
    Ok(())
}
