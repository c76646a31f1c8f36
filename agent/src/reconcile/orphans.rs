//! Objects whose row is gone (or already confirmed deleted) but which still carry
//! the service's labels — left by a crash between delete and confirm, or found
//! by the sweep. The reconciler removes them by their id label, so the sweep
//! itself never deletes anything, and objects without the label are never touched.
//!
//! An orphaned Application aimed at a reserved namespace is removed without
//! pruning. With its row gone the agent cannot tell which cluster it deploys to, so
//! it takes the safe side: leaving resources behind on a tenant's own cluster is
//! recoverable, pruning what runs the home cluster is not.

use gitops_shared::model::TenantId;

use crate::destination::RefusedKind;
use crate::engine::{ObjectKind, Removal};
use crate::names::{
    APPLICATION_ID_LABEL, MANAGED_ENVIRONMENT_ID_LABEL, REPOSITORY_CREDENTIAL_ID_LABEL, TENANT_ID_LABEL,
};

use super::{ReconcileError, Reconciler};

impl Reconciler {
    /// Deletes every owned object of `kind` labelled with row `id`. Done when all
    /// are gone; not yet while one is still being deleted.
    pub(super) async fn remove_orphans(&self, kind: ObjectKind, id: i64) -> Result<(), ReconcileError> {
        let label = match kind {
            ObjectKind::Application => APPLICATION_ID_LABEL,
            ObjectKind::Cluster => MANAGED_ENVIRONMENT_ID_LABEL,
            ObjectKind::Repository => REPOSITORY_CREDENTIAL_ID_LABEL,
            // Projects are named after the tenant and reconciled with it.
            ObjectKind::Project => return Ok(()),
        };
        let wanted = id.to_string();
        let owned = self.engine().list_owned_labelled(label, &wanted).await?;
        let policy = if kind == ObjectKind::Application { Some(self.destination_policy().await?) } else { None };
        let mut pending = Vec::new();
        for object in owned.iter().filter(|o| o.kind == kind && o.labels.get(label) == Some(&wanted)) {
            tracing::info!(object = %object.name, ?kind, row = id, "removing an object whose row is gone");
            let namespace = object.destination_namespace.as_deref().unwrap_or_default();
            let forbidden = policy.as_ref().and_then(|p| p.forbidden_namespace(namespace));
            let removal = match (kind, forbidden) {
                (ObjectKind::Application, Some(why)) => {
                    let tenant = object.labels.get(TENANT_ID_LABEL).and_then(|t| t.parse().ok()).map(TenantId);
                    self.destinations.refused(RefusedKind::Application, tenant, namespace, &object.name, &why);
                    self.engine().release_application(&object.name).await?
                }
                (ObjectKind::Application, None) => self.engine().delete_application(&object.name).await?,
                (ObjectKind::Cluster, _) => self.engine().delete_cluster(&object.name).await?,
                (ObjectKind::Repository, _) => self.engine().delete_repository(&object.name).await?,
                (ObjectKind::Project, _) => Removal::Gone,
            };
            if removal == Removal::Pending {
                pending.push(object.name.clone());
            }
        }
        if pending.is_empty() {
            Ok(())
        } else {
            Err(ReconcileError::not_yet(
                format!("objects of removed row {id} are still being deleted: {}", pending.join(", ")),
                "a removed deployment is still being cleaned up",
            ))
        }
    }
}
