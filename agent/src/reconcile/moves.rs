//! A tenant moving between instances (`gitops_shared::db::tenant_move`): on the
//! source this agent *releases* it — once none of its own claims on the tenant is
//! left, it removes the tenant's Applications without pruning what they deployed,
//! then its cluster and repository Secrets and its AppProjects (every object
//! labelled with the tenant, so environments' projects and repository Secret copies
//! go too), and confirms — and on the target it *adopts* it: applies the projects,
//! then the move's end enqueues
//! every row of the tenant here under the same names, so Argo CD adopts the live
//! resources instead of recreating them.

use gitops_shared::db::tenant_move::{
    TenantPlacement, tenant_adopt_done_in_txn, tenant_claims_on, tenant_release_confirm_in_txn, tenant_retarget_from,
};
use gitops_shared::db::{in_txn_retrying, pooled};
use gitops_shared::model::TenantId;

use super::{ReconcileError, Reconciler};
use crate::engine::OwnedObject;
use crate::engine::release::release_objects;
use crate::names::TENANT_ID_LABEL;

/// What a tenant operation means to this instance.
pub(super) enum MoveStep {
    /// This instance is the source of the tenant's move and must let go.
    Release,
    /// This instance is the target and the source has let go.
    Adopt,
    /// No move concerns this instance now (an ordinary tenant operation).
    None,
}

impl Reconciler {
    /// The step of a move `placement` asks of this instance.
    pub(super) fn move_step(&self, placement: &TenantPlacement) -> MoveStep {
        let here = Some(self.instance.id);
        match placement.move_state.as_deref() {
            Some("releasing") if placement.moving_from_id == here => MoveStep::Release,
            Some("adopting") if placement.instance_id == here => MoveStep::Adopt,
            _ => MoveStep::None,
        }
    }

    /// Lets go of `tenant` here: waits for this instance's claims on it, removes its
    /// objects without pruning, then confirms.
    pub(super) async fn release_tenant(&self, placement: &TenantPlacement) -> Result<(), ReconcileError> {
        let tenant = placement.id;
        let source = self.instance.id;
        {
            let client = pooled(&self.pool).await?;
            if let Some(target) = placement.instance_id {
                tenant_retarget_from(&client, tenant, source, target).await?;
            }
            let claimed = tenant_claims_on(&client, tenant, source).await?;
            if claimed > 0 {
                return Err(ReconcileError::not_yet(
                    format!("tenant {tenant} still has {claimed} operations in progress here"),
                    "moving to another Argo CD instance",
                ));
            }
        }
        let pending = self.remove_tenant_objects(tenant).await?;
        if !pending.is_empty() {
            return Err(ReconcileError::not_yet(
                format!("objects of tenant {tenant} are still being removed: {}", pending.join(", ")),
                "moving to another Argo CD instance",
            ));
        }
        let mut client = pooled(&self.pool).await?;
        let confirmed = in_txn_retrying(&mut client, |txn| {
            Box::pin(async move { tenant_release_confirm_in_txn(txn, tenant, source).await })
        })
        .await?;
        if confirmed {
            self.destinations.metrics().tenants_released.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        tracing::info!(tenant.id = %tenant, tenant.ns = %placement.namespace, confirmed, "tenant released for a move");
        Ok(())
    }

    /// Removes every object of `tenant` in this instance, without pruning
    /// (`crate::engine::release`). Returns those still being deleted.
    async fn remove_tenant_objects(&self, tenant: TenantId) -> Result<Vec<String>, ReconcileError> {
        let wanted = tenant.0.to_string();
        let owned = self.engine().list_owned_labelled(TENANT_ID_LABEL, &wanted).await?;
        let ours: Vec<&OwnedObject> = owned.iter().filter(|o| o.labels.get(TENANT_ID_LABEL) == Some(&wanted)).collect();
        let mut released = release_objects(self.engine(), &ours).await;
        if let Some((_, error)) = released.failed.pop() {
            return Err(error.into());
        }
        Ok(released.pending)
    }

    /// Takes `tenant` on here: its projects, then every row (enqueued as the move ends).
    pub(super) async fn adopt_tenant(&self, placement: &TenantPlacement) -> Result<(), ReconcileError> {
        let tenant = placement.id;
        let target = self.instance.id;
        self.apply_project(tenant).await?;
        let mut client = pooled(&self.pool).await?;
        let done = in_txn_retrying(&mut client, |txn| {
            Box::pin(async move { tenant_adopt_done_in_txn(txn, tenant, target).await })
        })
        .await?;
        if done {
            self.destinations.metrics().tenants_adopted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        tracing::info!(tenant.id = %tenant, tenant.ns = %placement.namespace, done, "tenant adopted after a move");
        Ok(())
    }
}
