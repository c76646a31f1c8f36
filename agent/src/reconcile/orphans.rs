//! Objects whose row is gone (or already confirmed deleted) but which still carry
//! the service's labels — left by a crash between delete and confirm, or found
//! by the sweep. The reconciler removes them by their id label, so the sweep
//! itself never deletes anything, and objects without the label are never touched.

use crate::engine::{ObjectKind, Removal};
use crate::names::{APPLICATION_ID_LABEL, MANAGED_ENVIRONMENT_ID_LABEL, REPOSITORY_CREDENTIAL_ID_LABEL};

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
        let owned = self.engine().list_owned().await?;
        let mut pending = Vec::new();
        for object in owned.iter().filter(|o| o.kind == kind && o.labels.get(label) == Some(&wanted)) {
            tracing::info!(object = %object.name, ?kind, row = id, "removing an object whose row is gone");
            let removal = match kind {
                ObjectKind::Application => self.engine().delete_application(&object.name).await?,
                ObjectKind::Cluster => self.engine().delete_cluster(&object.name).await?,
                ObjectKind::Repository => self.engine().delete_repository(&object.name).await?,
                ObjectKind::Project => Removal::Gone,
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
