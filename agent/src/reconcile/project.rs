//! The tenant's AppProject: rebuilt from the tenant's rows whenever one of its
//! applications, environments or repository credentials changes, and removed when
//! the tenant goes (after its other rows are gone). It lists only that tenant's
//! repositories and its environments' server strings with explicit namespaces —
//! never a wildcard namespace. The tenant's own namespace is one of them: its home
//! environment's, reached with credentials scoped to that namespace.

use gitops_shared::db::pooled;
use gitops_shared::desired::{TenantProject, resource_mark_deleted, tenant_project_load, tenant_rows_pending};
use gitops_shared::model::{ResourceType, RowState, TenantId};

use super::{ReconcileError, Reconciler};
use crate::engine::{ProjectSpec, Removal};
use crate::names::{environment_server, labels, project_name};

/// Characters that Argo CD reads as patterns in project fields; values holding them
/// are left out rather than widening what the project permits.
fn is_literal(value: &str) -> bool {
    !value.is_empty() && !value.starts_with('!') && !value.contains(['*', '[', ']'])
}

/// The project a tenant's rows call for.
pub fn project_spec(project: &TenantProject) -> ProjectSpec {
    // Only environments' destinations: the tenant's own namespace is its home
    // environment's, reached with credentials scoped to that namespace.
    let mut destinations = Vec::new();
    for environment in &project.environments {
        let server = environment_server(&environment.api_url, environment.id);
        let namespaces =
            if environment.namespaces.is_empty() { &environment.application_namespaces } else { &environment.namespaces };
        for namespace in namespaces.iter().filter(|ns| is_literal(ns)) {
            destinations.push((server.clone(), namespace.clone()));
        }
    }
    destinations.sort();
    destinations.dedup();
    ProjectSpec {
        name: project_name(project.tenant_id),
        labels: labels(project.tenant_id, &[]),
        source_repos: project.repo_urls.iter().filter(|url| is_literal(url)).cloned().collect(),
        destinations,
        cluster_resources: project.environments.iter().any(|e| e.cluster_resources),
    }
}

impl Reconciler {
    /// Applies the tenant's project as its rows stand now.
    pub(super) async fn apply_project(&self, tenant: TenantId) -> Result<(), ReconcileError> {
        let project = {
            let client = pooled(&self.pool).await?;
            tenant_project_load(&client, tenant).await?
        };
        // No tenant row: it was purged after its deletion, which removed the project.
        let Some(project) = project else { return Ok(()) };
        match project.row_state {
            RowState::Active => {
                self.engine().apply_project(&project_spec(&project)).await?;
                Ok(())
            }
            RowState::Deleting => self.remove_project_when_empty(tenant).await,
            RowState::Deleted | RowState::Unknown => Ok(()),
        }
    }

    /// Removes a deleting tenant's project once none of its rows is left to delete.
    /// Each row's deletion is confirmed before this count, so whichever agent
    /// confirms the last one sees none pending and removes the project.
    async fn remove_project_when_empty(&self, tenant: TenantId) -> Result<(), ReconcileError> {
        let pending = {
            let client = pooled(&self.pool).await?;
            tenant_rows_pending(&client, tenant).await?
        };
        if pending > 0 {
            return Ok(());
        }
        self.remove_project(tenant).await
    }

    /// A tenant operation: keep its project, or remove it once the tenant is deleting
    /// and its other rows are gone (else the last of their deletions removes it).
    pub(super) async fn tenant(&self, tenant: TenantId) -> Result<(), ReconcileError> {
        let project = {
            let client = pooled(&self.pool).await?;
            tenant_project_load(&client, tenant).await?
        };
        let Some(project) = project else { return Ok(()) };
        match project.row_state {
            RowState::Active => self.engine().apply_project(&project_spec(&project)).await.map_err(Into::into),
            RowState::Deleting => self.remove_project_when_empty(tenant).await,
            RowState::Deleted | RowState::Unknown => Ok(()),
        }
    }

    async fn remove_project(&self, tenant: TenantId) -> Result<(), ReconcileError> {
        match self.engine().delete_project(&project_name(tenant)).await? {
            Removal::Gone => {
                let client = pooled(&self.pool).await?;
                resource_mark_deleted(&client, ResourceType::Tenant, tenant.0).await?;
                Ok(())
            }
            Removal::Pending => Err(ReconcileError::not_yet(
                format!("AppProject of tenant {tenant} still present"),
                "waiting for Argo CD to remove the project",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use gitops_shared::desired::ProjectEnvironment;

    use super::*;

    #[test]
    fn destinations_are_explicit_and_patterns_are_dropped() {
        let project = TenantProject {
            tenant_id: TenantId(3),
            namespace_name: "team-a".into(),
            row_state: RowState::Active,
            repo_urls: vec!["https://git.example.invalid/a.git".into(), "*".into()],
            environments: vec![
                ProjectEnvironment {
                    id: 1,
                    api_url: "https://c.example.invalid".into(),
                    namespaces: vec!["dev".into(), "*".into()],
                    cluster_resources: false,
                    application_namespaces: vec!["other".into()],
                },
                ProjectEnvironment {
                    id: 2,
                    api_url: "https://c.example.invalid".into(),
                    namespaces: vec![],
                    cluster_resources: false,
                    application_namespaces: vec!["prod".into()],
                },
            ],
        };
        let spec = project_spec(&project);
        assert_eq!(spec.source_repos, ["https://git.example.invalid/a.git"]);
        assert_eq!(
            spec.destinations,
            [
                ("https://c.example.invalid?managed-environment=1".to_owned(), "dev".to_owned()),
                ("https://c.example.invalid?managed-environment=2".to_owned(), "prod".to_owned()),
            ]
        );
        assert!(!spec.cluster_resources);
    }
}
