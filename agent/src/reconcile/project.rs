//! The tenant's AppProject: rebuilt from the tenant's rows whenever one of its
//! applications, environments or repository credentials changes, and removed when
//! the tenant goes (after its other rows are gone). It lists only that tenant's
//! repositories and its environments' server strings with explicit namespaces —
//! never a wildcard namespace. The tenant's own namespace is one of them: its home
//! environment's, reached with credentials scoped to that namespace. A destination
//! on the home cluster in a reserved namespace (`crate::destination`) is left out
//! whatever the rows say, and the omission counted.

use gitops_shared::db::desired::{TenantProject, resource_mark_deleted, tenant_project_load, tenant_rows_pending};
use gitops_shared::db::pooled;
use gitops_shared::model::{ResourceType, RowState, TenantId};

use super::moves::MoveStep;
use super::{ReconcileError, Reconciler};
use crate::destination::{DestinationPolicy, RefusedKind};
use crate::engine::{ProjectSpec, Removal};
use crate::names::{environment_server, labels, project_name};
use gitops_shared::db::tenant_move::tenant_placement_by_id;

/// Characters that Argo CD reads as patterns in project fields; values holding them
/// are left out rather than widening what the project permits.
fn is_literal(value: &str) -> bool {
    !value.is_empty() && !value.starts_with('!') && !value.contains(['*', '[', ']'])
}

/// A destination left out of a project: (namespace, why).
pub type RefusedDestination = (String, String);

/// The project a tenant's rows call for, and the destinations `policy` left out.
pub fn project_spec(project: &TenantProject, policy: &DestinationPolicy) -> (ProjectSpec, Vec<RefusedDestination>) {
    // Only environments' destinations: the tenant's own namespace is its home
    // environment's, reached with credentials scoped to that namespace.
    let mut destinations = Vec::new();
    let mut refused = Vec::new();
    for environment in &project.environments {
        let server = environment_server(&environment.api_url, environment.id);
        let namespaces = if environment.namespaces.is_empty() {
            &environment.application_namespaces
        } else {
            &environment.namespaces
        };
        for namespace in namespaces.iter().filter(|ns| is_literal(ns)) {
            match policy.refusal(environment.home, &environment.api_url, namespace) {
                Some(why) => refused.push((namespace.clone(), why)),
                None => destinations.push((server.clone(), namespace.clone())),
            }
        }
    }
    destinations.sort();
    destinations.dedup();
    refused.sort();
    refused.dedup();
    let spec = ProjectSpec {
        name: project_name(project.tenant_id),
        labels: labels(project.tenant_id, &[]),
        source_repos: project.repo_urls.iter().filter(|url| is_literal(url)).cloned().collect(),
        destinations,
        cluster_resources: project.environments.iter().any(|e| e.cluster_resources),
    };
    (spec, refused)
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
            RowState::Active => self.apply_active_project(&project).await,
            RowState::Deleting => self.remove_project_when_empty(tenant).await,
            RowState::Deleted | RowState::Unknown => Ok(()),
        }
    }

    /// Applies an active tenant's project, without (and counting) refused destinations.
    async fn apply_active_project(&self, project: &TenantProject) -> Result<(), ReconcileError> {
        let policy = self.destination_policy().await?;
        let (spec, refused) = project_spec(project, &policy);
        for (namespace, why) in &refused {
            self.destinations.refused(
                RefusedKind::ProjectDestination,
                Some(project.tenant_id),
                namespace,
                &spec.name,
                why,
            );
        }
        self.engine().apply_project(&spec).await?;
        Ok(())
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
        let placement = {
            let client = pooled(&self.pool).await?;
            tenant_placement_by_id(&client, tenant).await?
        };
        if let Some(placement) = &placement {
            match self.move_step(placement) {
                MoveStep::Release => return self.release_tenant(placement).await,
                MoveStep::Adopt => return self.adopt_tenant(placement).await,
                MoveStep::None if placement.instance_id != Some(self.instance.id) => {
                    // Placed elsewhere (a move already past this instance): nothing here.
                    return Ok(());
                }
                MoveStep::None => {}
            }
        }
        let project = {
            let client = pooled(&self.pool).await?;
            tenant_project_load(&client, tenant).await?
        };
        let Some(project) = project else { return Ok(()) };
        match project.row_state {
            RowState::Active => self.apply_active_project(&project).await,
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
    use gitops_shared::db::desired::ProjectEnvironment;
    use gitops_shared::model::ManagedEnvironmentId;

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
                    id: ManagedEnvironmentId(1),
                    api_url: "https://c.example.invalid".into(),
                    namespaces: vec!["dev".into(), "*".into()],
                    cluster_resources: false,
                    application_namespaces: vec!["other".into()],
                    home: false,
                },
                ProjectEnvironment {
                    id: ManagedEnvironmentId(2),
                    api_url: "https://c.example.invalid".into(),
                    namespaces: vec![],
                    cluster_resources: false,
                    application_namespaces: vec!["prod".into()],
                    home: false,
                },
            ],
        };
        let (spec, refused) = project_spec(&project, &DestinationPolicy::default());
        assert!(refused.is_empty());
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

    #[test]
    fn reserved_destinations_of_the_home_cluster_are_left_out() {
        let environment = |id: i64, api_url: &str, home, namespaces: &[&str]| ProjectEnvironment {
            id: ManagedEnvironmentId(id),
            api_url: api_url.into(),
            namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
            cluster_resources: false,
            application_namespaces: vec![],
            home,
        };
        let project = TenantProject {
            tenant_id: TenantId(3),
            namespace_name: "team-a".into(),
            row_state: RowState::Active,
            repo_urls: vec![],
            environments: vec![
                environment(1, "https://home.example.invalid", true, &["team-a", "kube-system"]),
                environment(2, "HTTPS://kubernetes.default.svc:443/", false, &["default", "team-a-dev"]),
                environment(3, "https://c.example.invalid", false, &["kube-system"]),
            ],
        };
        let (spec, refused) = project_spec(&project, &DestinationPolicy::default());
        assert_eq!(
            spec.destinations,
            [
                ("HTTPS://kubernetes.default.svc:443/?managed-environment=2".to_owned(), "team-a-dev".to_owned()),
                ("https://c.example.invalid?managed-environment=3".to_owned(), "kube-system".to_owned()),
                ("https://home.example.invalid?managed-environment=1".to_owned(), "team-a".to_owned()),
            ]
        );
        let namespaces: Vec<&str> = refused.iter().map(|(ns, _)| ns.as_str()).collect();
        assert_eq!(namespaces, ["default", "kube-system"]);
    }
}
