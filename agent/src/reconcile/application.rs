//! Application operations: an active row becomes an Argo CD Application (after the
//! tenant's project, which must admit it); a deleting row is deleted, confirmed
//! gone, and only then marked deleted. A deletion that hangs (Argo CD's finalizer
//! not released) is retried and, after a bounded wait, reported on the row.
//!
//! An Application names the project of its environment: the tenant's main
//! project, or the environment's own while it allows cluster-scoped resources
//! (`super::project`). When that changes the environment's reconcile enqueues its
//! Applications; each is applied under its new project, then the tenant's
//! projects again, so the one it left stops listing its destination, or goes
//! once no Application names it.
//!
//! A row whose destination is a reserved namespace of the home cluster (see
//! `crate::destination`) is refused whatever else it says: no Application is made,
//! and one that exists (made by an earlier version, or by hand) is removed without
//! pruning — Argo CD's resources finalizer is taken off before the delete, so what
//! it deployed there stays untouched.

use gitops_shared::db::application_state::{AgentOutcome, application_state_record_outcome};
use gitops_shared::db::desired::{
    DesiredApplication, application_load, application_mark_deleted, application_set_deletion_message,
};
use gitops_shared::db::pooled;
use gitops_shared::model::{ApplicationId, RowState, SyncType, TenantId};

use super::{ReconcileError, Reconciler, same_tenant};
use crate::destination::{DestinationPolicy, RefusedKind};
use crate::engine::{ApplicationSpec, ObjectKind, Removal};
use crate::names::{APPLICATION_ID_LABEL, application_name, environment_server, labels, project_of_environment};

/// The Application a row calls for; Err when its environment cannot be used.
pub fn application_spec(app: &DesiredApplication) -> Result<ApplicationSpec, ReconcileError> {
    let (server, namespace, project) = match (&app.environment, app.managed_environment_id) {
        (Some(environment), _) if environment.row_state == RowState::Active => (
            environment_server(&environment.api_url, environment.id),
            app.destination_namespace.clone(),
            project_of_environment(app.tenant_id, environment.id, environment.cluster_resources),
        ),
        (Some(environment), _) => {
            return Err(ReconcileError::not_yet(
                format!(
                    "managed environment {} of application {} is {}",
                    environment.id, app.id, environment.row_state
                ),
                "the deployment's managed environment is being deleted",
            ));
        }
        (None, Some(id)) => {
            return Err(ReconcileError::refused(
                format!("managed environment {id} of application {} is not the tenant's", app.id),
                "the deployment's managed environment does not exist in this namespace",
            ));
        }
        // Every deployment reaches its destination through an environment's
        // credentials (the tenant's home environment for its own namespace); Argo
        // CD's own, cluster-wide credentials are never used for a tenant.
        (None, None) => {
            return Err(ReconcileError::refused(
                format!("application {} has no managed environment", app.id),
                "the deployment has no destination credentials",
            ));
        }
    };
    Ok(ApplicationSpec {
        name: application_name(app.resource_uid),
        labels: labels(app.tenant_id, &[(APPLICATION_ID_LABEL, app.id.to_string())]),
        project,
        repo_url: app.repo_url.clone(),
        path: app.path.clone(),
        target_revision: app.target_revision.clone(),
        server,
        namespace,
        automated: app.sync_type == SyncType::Automated,
        create_namespace: app.create_namespace,
        generation: Some(app.generation),
    })
}

/// Why the row's destination must never reach Argo CD, or None. An application
/// whose environment is unknown is judged by its namespace alone (on the safe side:
/// it is only ever removed, never created, that way).
pub fn application_refusal(policy: &DestinationPolicy, app: &DesiredApplication) -> Option<String> {
    let namespace = &app.destination_namespace;
    match &app.environment {
        Some(environment) => policy.refusal(environment.home, &environment.api_url, namespace),
        None => policy.forbidden_namespace(namespace),
    }
}

impl Reconciler {
    pub(super) async fn application(&self, tenant: TenantId, id: ApplicationId) -> Result<(), ReconcileError> {
        let app = {
            let client = pooled(&self.pool).await?;
            application_load(&client, id).await?
        };
        let Some(app) = app else { return self.remove_orphans(ObjectKind::Application, id.0).await };
        same_tenant(tenant, app.tenant_id, "application")?;
        match app.row_state {
            RowState::Active => {
                let spec = application_spec(&app)?;
                let policy = self.destination_policy().await?;
                if let Some(why) = application_refusal(&policy, &app) {
                    return self.refuse_application(&app, &why).await;
                }
                let before = self.apply_project_seen(app.tenant_id).await?;
                self.engine().apply_application(&spec).await?;
                // Switched project: the one it left may now permit less, or go.
                let name = &spec.name;
                if before.iter().any(|a| a.name == *name && a.project.as_ref().is_some_and(|p| *p != spec.project)) {
                    self.apply_project(app.tenant_id).await?;
                }
                // The tenant's resource reads that this generation is in Argo CD.
                let client = pooled(&self.pool).await?;
                let applied = AgentOutcome::Applied { generation: app.generation };
                application_state_record_outcome(&client, self.epoch(), app.id, &applied).await?;
                Ok(())
            }
            RowState::Deleting => self.delete_application(&app).await,
            RowState::Deleted => self.remove_orphans(ObjectKind::Application, id.0).await,
            RowState::Unknown => Err(ReconcileError::not_yet(
                format!("application {id} has a row state this agent does not know"),
                "waiting for an agent upgrade",
            )),
        }
    }

    /// Refuses an active row aimed at a reserved namespace of the home cluster and
    /// removes its Application, if any, without pruning.
    async fn refuse_application(&self, app: &DesiredApplication, why: &str) -> Result<(), ReconcileError> {
        let name = application_name(app.resource_uid);
        let namespace = &app.destination_namespace;
        self.destinations.refused(RefusedKind::Application, Some(app.tenant_id), namespace, &name, why);
        let removal = self.engine().release_application(&name).await?;
        // The project is rebuilt under the same policy, which drops such destinations.
        self.apply_project(app.tenant_id).await?;
        Err(ReconcileError::refused(
            format!(
                "application {} targets namespace {namespace:?} on the home cluster, which is reserved ({why}); \
                 Application {name} not applied, an existing one removed without pruning ({removal:?})",
                app.id
            ),
            format!(
                "the destination namespace {namespace:?} is reserved on this cluster: the GitOps service never deploys there"
            ),
        ))
    }

    async fn delete_application(&self, app: &DesiredApplication) -> Result<(), ReconcileError> {
        let name = application_name(app.resource_uid);
        let policy = self.destination_policy().await?;
        let removal = match application_refusal(&policy, app) {
            Some(why) => {
                self.destinations.refused(
                    RefusedKind::Application,
                    Some(app.tenant_id),
                    &app.destination_namespace,
                    &name,
                    &why,
                );
                self.engine().release_application(&name).await?
            }
            None => self.engine().delete_application(&name).await?,
        };
        match removal {
            Removal::Gone => {
                let client = pooled(&self.pool).await?;
                application_mark_deleted(&client, app.id).await?;
                drop(client);
                // The project may now permit less.
                self.apply_project(app.tenant_id).await
            }
            Removal::Pending if app.unchanged_for >= self.stuck_deletion_after => {
                let message = format!(
                    "Argo CD has not finished deleting the deployment: its resources finalizer is still present \
                     after more than {} s; the deletion is retried",
                    self.stuck_deletion_after.as_secs()
                );
                // Recorded before the failure's own message, which differs from the
                // one before, so the status feed carries both to the tenant.
                let client = pooled(&self.pool).await?;
                application_set_deletion_message(&client, app.id, &message).await?;
                Err(ReconcileError::not_yet(format!("Application {name} is still being deleted (stuck)"), message))
            }
            Removal::Pending => Err(ReconcileError::not_yet(
                format!("Application {name} is still being deleted"),
                "Argo CD is deleting the deployment and what it deployed",
            )),
        }
    }
}
