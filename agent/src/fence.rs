//! A fenced instance coming back (`gitops_shared::db::failover`): while it was
//! lost, its tenants were placed on healthy instances. Before it rejoins, its agent
//! removes — without pruning what they deployed — every Argo CD object of a tenant
//! no longer placed on it: Applications (finalizer first), then cluster and
//! repository Secrets, then AppProjects. Then it lifts the fence; the instance stays
//! cordoned until an operator uncordons it.

use std::collections::HashSet;

use gitops_shared::db::engine_instance::InstanceEpoch;
use gitops_shared::db::failover::{instance_fenced, instance_unfence, tenants_placed_on};
use gitops_shared::db::{DbPool, pooled};

use crate::engine::release::release_objects;
use crate::engine::{Engine, EngineError, OwnedObject};
use crate::names::TENANT_ID_LABEL;

/// Why the clean-up could not finish now (it runs again on the next heartbeat).
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    #[error(transparent)]
    Db(#[from] gitops_shared::db::DbError),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// When `instance` is fenced, removes the objects of tenants placed elsewhere and
/// lifts the fence once none is left. Returns whether it is still fenced.
pub async fn clean_up_if_fenced(
    pool: &DbPool,
    engine: &dyn Engine,
    epoch: &InstanceEpoch,
    metrics: &crate::metrics::Metrics,
) -> Result<bool, FenceError> {
    let instance = epoch.instance;
    let client = pooled(pool).await?;
    let (fenced, current) = instance_fenced(&client, instance).await?;
    if !fenced {
        // Not fenced (any more): status is written at the instance's epoch now.
        epoch.set(current);
        return Ok(false);
    }
    let owned = engine.list_owned().await?;
    let tenant_of = |labels: &std::collections::BTreeMap<String, String>| {
        labels.get(TENANT_ID_LABEL).and_then(|t| t.parse::<i64>().ok())
    };
    let mut tenants: Vec<i64> = owned.iter().filter_map(|o| tenant_of(&o.labels)).collect();
    tenants.sort_unstable();
    tenants.dedup();
    let placed: HashSet<i64> = tenants_placed_on(&client, &tenants, instance).await?.into_iter().collect();
    drop(client);
    let gone: Vec<&OwnedObject> =
        owned.iter().filter(|o| tenant_of(&o.labels).is_some_and(|t| !placed.contains(&t))).collect();
    let mut released = release_objects(engine, &gone).await;
    metrics.objects_released.fetch_add(released.removed, std::sync::atomic::Ordering::Relaxed);
    if let Some((_, error)) = released.failed.pop() {
        return Err(error.into());
    }
    if !released.pending.is_empty() {
        tracing::warn!(
            removed = released.removed,
            pending = released.pending.len(),
            "fenced: removing what tenants placed elsewhere left here"
        );
        return Ok(true);
    }
    let client = pooled(pool).await?;
    instance_unfence(&client, instance).await?;
    let (_, current) = instance_fenced(&client, instance).await?;
    epoch.set(current);
    tracing::warn!(
        removed = released.removed,
        "fence lifted: objects of tenants placed elsewhere removed without pruning; \
        the instance stays cordoned until an operator uncordons it"
    );
    Ok(false)
}
