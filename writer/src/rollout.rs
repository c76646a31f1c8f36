//! The writers' side of canary rollouts (`gitops_shared::db::rollout`): every look
//! of the fleet watch advances each active rollout by one step (one writer at a
//! time, by an advisory lock), and says what happened in logs and metrics. Tenants
//! read it on their deployments: `Ready=False`, reason `Moving`, while a rollout or
//! its rollback moves them.

use std::sync::atomic::Ordering;

use gitops_shared::db::rollout::{RolloutEvent, rollout_step};
use gitops_shared::db::{DbError, DbPool, pooled};

use crate::metrics::WriterMetrics;

/// One rollout step, logged and counted.
pub async fn advance_rollouts(pool: &DbPool, metrics: &WriterMetrics) -> Result<(), DbError> {
    let mut client = pooled(pool).await?;
    let step = rollout_step(&mut client).await?;
    if step.skipped {
        return Ok(());
    }
    for event in &step.events {
        match event {
            RolloutEvent::Baking { id, wave } => {
                tracing::info!(rollout.id = id, rollout.wave = wave, "rollout wave on its target: baking");
            }
            RolloutEvent::Passed { id, wave, ok } => {
                metrics.rollout_waves_passed.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    rollout.id = id,
                    rollout.wave = wave,
                    deployments_ok = ok,
                    "rollout wave passed its bake"
                );
            }
            RolloutEvent::WaveStarted { id, wave, tenants } => {
                tracing::info!(rollout.id = id, rollout.wave = wave, tenants, "rollout wave started");
            }
            RolloutEvent::RollingBack { id, reason } => {
                metrics.rollout_rollbacks.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(rollout.id = id, %reason, "rollout rolling back: its tenants move back");
            }
            RolloutEvent::ReturnRefused { id, namespace, reason } => {
                tracing::warn!(rollout.id = id, tenant.ns = %namespace, %reason,
                    "a rolled-back tenant cannot move back yet; tried again next step");
            }
            RolloutEvent::Finished { id, state, reason } => {
                tracing::info!(rollout.id = id, rollout.state = %state, reason = reason.as_deref().unwrap_or(""),
                    "rollout ended");
            }
        }
    }
    metrics.set_rollouts(step.active.into_iter().map(|(_, state)| state));
    Ok(())
}
