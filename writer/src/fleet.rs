//! The writer's watch on the fleet: every few seconds it reads each engine
//! instance's health (`engine_instance_health()`: healthy, degraded when Argo CD
//! stops making progress, lost when no agent reaches it), shows it as metrics, and
//! when an instance's health changes it touches the observed-state rows of the
//! tenants of its own shards placed there, so the status feed tells them
//! (`Ready=False` reason `InstanceDegraded` or `InstanceLost`, and back). Shards it
//! gains are told of instances that are unhealthy already. It also takes failover
//! steps (`gitops_shared::db::failover`): an instance lost for longer than the grace
//! is fenced and its tenants placed on healthy instances, a bounded batch per step;
//! an advisory lock lets one writer at a time act. Balancing, rollouts
//! (`crate::rollout`) and the automatic scale-up (`crate::scale_up`) take their
//! steps here too.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gitops_shared::db::failover::failover_step;
use gitops_shared::db::fleet_balance::{BalanceSettings, balance_step};
use gitops_shared::db::instance_health::{instance_health_all, instance_health_touch};
use gitops_shared::db::managed_environment::{managed_environment_home_revocations, managed_environment_home_revoked};
use gitops_shared::db::{DbError, DbPool, pooled};
use gitops_shared::model::EngineInstanceId;
use k8s_openapi::api::core::v1::ServiceAccount;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::WriterMetrics;

/// How often the instances' health is read (and a failover step taken): two small
/// statements, so often enough that a grace ending is acted on within seconds.
pub const FLEET_WATCH_INTERVAL: Duration = Duration::from_secs(2);

/// How soon the next failover step follows one that used its whole batch.
const FAILOVER_BATCH_EVERY: Duration = Duration::from_secs(1);

/// When a lost instance fails over, and how fast.
#[derive(Debug, Clone, Copy)]
pub struct FailoverSettings {
    /// How long an instance stays lost before it is fenced and its tenants move.
    pub grace: Duration,
    /// Most tenants re-placed per step (a step a second while tenants are left).
    pub batch: i64,
}

impl Default for FailoverSettings {
    fn default() -> Self {
        FailoverSettings { grace: Duration::from_secs(120), batch: 20 }
    }
}

/// The fleet watch's settings.
pub struct FleetWatch {
    pub every: Duration,
    pub failover: Option<FailoverSettings>,
    /// Draining degraded instances and rebalancing.
    pub balance: Option<BalanceSettings>,
    /// As placement's: an instance whose agents reported within this is a candidate.
    pub healthy_within: Duration,
    /// The automatic scale-up (None: off).
    pub scale_up: Option<crate::scale_up::ScaleUp>,
}

/// Runs until `cancel` fires.
pub async fn run_fleet_watch(
    pool: DbPool,
    homes: HomeIdentities,
    mut shards: watch::Receiver<Vec<i32>>,
    metrics: Arc<WriterMetrics>,
    mut settings: FleetWatch,
    cancel: CancellationToken,
) {
    let mut known: BTreeMap<EngineInstanceId, String> = BTreeMap::new();
    let mut told: Vec<i32> = Vec::new();
    loop {
        let owned = shards.borrow_and_update().clone();
        match look(&pool, &owned, &told, &mut known, &metrics).await {
            Ok(()) => {
                told = owned;
                metrics.database_up.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            Err(error) => {
                metrics.database_up.store(false, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(%error, "could not read the instances' health");
            }
        }
        // A step that used its whole batch left tenants to move: the next one comes
        // after a second, so the rate is a batch per second, not per look.
        let mut next = settings.every;
        if let Some(failover) = settings.failover {
            match fail_over(&pool, failover, settings.healthy_within, &metrics).await {
                Ok(more) if more => next = next.min(FAILOVER_BATCH_EVERY),
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "could not take a failover step"),
            }
            if let Err(error) = replace_home_identities(&pool, &homes).await {
                tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error),
                    "could not replace the home identities of failed-over tenants; retrying");
            }
        }
        if let Some(balance) = settings.balance
            && let Err(error) = rebalance(&pool, balance, &metrics).await
        {
            tracing::warn!(%error, "could not take a balancing step");
        }
        if let Err(error) = crate::rollout::advance_rollouts(&pool, &metrics).await {
            tracing::warn!(%error, "could not advance the rollouts");
        }
        if let Some(scale_up) = settings.scale_up.as_mut()
            && let Err(error) = scale_up.step(&pool, &metrics).await
        {
            tracing::warn!(%error, "could not take a scale-up step");
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(next) => {}
        }
    }
}

/// One failover step, logged and counted; returns whether it used its whole batch
/// (tenants may be left to move).
async fn fail_over(
    pool: &DbPool,
    settings: FailoverSettings,
    healthy_within: Duration,
    metrics: &WriterMetrics,
) -> Result<bool, DbError> {
    let mut client = pooled(pool).await?;
    let step = failover_step(&mut client, settings.grace, settings.batch, healthy_within).await?;
    for instance in &step.fenced {
        tracing::warn!(engine.instance = %instance, grace_s = settings.grace.as_secs(),
            "engine instance lost past the grace: fenced, its tenants move to healthy instances");
    }
    if !step.moved.is_empty() {
        tracing::warn!(tenants = step.moved.len(), "tenants of a lost instance placed on healthy instances");
        metrics.failover_moves(step.moved.len() as u64);
    }
    if let Some(why) = step.refused.first() {
        tracing::error!(tenants = step.refused.len(), reason = %why,
            "tenants of a lost instance wait: the instance chosen for them could not adopt them");
    }
    if step.unplaced > step.refused.len() {
        tracing::error!(
            tenants = step.unplaced - step.refused.len(),
            "tenants of a lost instance wait: no healthy instance has room"
        );
    }
    Ok(i64::try_from(step.moved.len()).unwrap_or(i64::MAX) >= settings.batch)
}

/// Where the tenants' home identities live (their ServiceAccounts).
#[derive(Clone)]
pub struct HomeIdentities {
    pub kube: kube::Client,
    /// The home namespace.
    pub namespace: String,
}

/// Why a home identity could not be replaced now (tried again next round).
#[derive(Debug, thiserror::Error)]
pub enum ReplaceError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("could not delete home ServiceAccount {name}")]
    Kube { name: String, source: kube::Error },
}

/// Replaces the home identities failover asked for: deletes each ServiceAccount,
/// so every token of it stops working (the lost instance's Argo CD may hold one);
/// the identity watch of the tenant's writer makes it again, with a new token for
/// the tenant's new instance.
async fn replace_home_identities(pool: &DbPool, homes: &HomeIdentities) -> Result<(), ReplaceError> {
    let client = pooled(pool).await?;
    let pending = managed_environment_home_revocations(&client, 100).await?;
    let accounts: kube::Api<ServiceAccount> = kube::Api::namespaced(homes.kube.clone(), &homes.namespace);
    for revocation in &pending {
        let name = crate::controller::home_account_name(revocation.namespace_uid);
        match accounts.delete(&name, &kube::api::DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => return Err(ReplaceError::Kube { name, source }),
        }
        managed_environment_home_revoked(&client, revocation).await?;
        tracing::warn!(home.account = %name, "home identity of a failed-over tenant replaced:             the lost instance's token no longer works");
    }
    Ok(())
}

/// One balancing step, logged and counted.
async fn rebalance(pool: &DbPool, settings: BalanceSettings, metrics: &WriterMetrics) -> Result<(), DbError> {
    let mut client = pooled(pool).await?;
    let step = balance_step(&mut client, settings).await?;
    for instance in &step.drained {
        tracing::warn!(engine.instance = %instance, "engine instance degraded past the grace: cordoned, its tenants move");
    }
    for instance in &step.stranded {
        tracing::debug!(engine.instance = %instance, "engine instance degraded past the grace, left open: no other instance has room for its tenants");
    }
    for moved in &step.moves {
        tracing::info!(tenant.namespace = %moved.namespace, from = %moved.from, to = %moved.to, reason = moved.reason,
            "tenant move started");
        metrics.fleet_move(moved.reason);
    }
    for refused in &step.refused {
        tracing::info!(reason = %refused, "a planned tenant move was refused; tried again next step");
    }
    Ok(())
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
