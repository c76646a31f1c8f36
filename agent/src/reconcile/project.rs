//! The tenant's AppProjects: rebuilt from the tenant's rows whenever one of its
//! applications, environments or repository credentials changes, and removed when
//! the tenant goes (after its other rows are gone). They list only that tenant's
//! repositories and its environments' server strings with explicit namespaces —
//! never a wildcard namespace. The tenant's own namespace is one of them: its home
//! environment's, reached with credentials scoped to that namespace. A destination
//! on the home cluster in a reserved namespace (`crate::destination`) is left out
//! whatever the rows say, and the omission counted.
//!
//! Cluster-scoped resources are scoped per environment: the main project
//! (`names::project_name`) holds the destinations of environments that do not
//! allow them and whitelists none; each environment with `clusterResources: true`
//! gets its own project (`names::environment_project_name`) with only its
//! destinations and every group and kind whitelisted. While an environment's
//! Applications switch between the two, the project an Application still names
//! keeps its destination (see [`project_specs`]); each Application's reconcile
//! switches it and applies the projects again. When an environment stops needing
//! its project (cluster resources turned off, the environment deleted), the
//! project is removed once no Application names it any more, together with the
//! repository Secret copies that served it.

use std::collections::BTreeSet;

use gitops_shared::db::desired::{TenantProject, resource_mark_deleted, tenant_project_load, tenant_rows_pending};
use gitops_shared::db::pooled;
use gitops_shared::model::{ResourceType, RowState, TenantId};

use super::moves::MoveStep;
use super::{ReconcileError, Reconciler};
use crate::destination::{DestinationPolicy, RefusedKind};
use crate::engine::{ObjectKind, OwnedObject, ProjectSpec, Removal};
use crate::names::{
    MANAGED_ENVIRONMENT_ID_LABEL, PROJECT_LABEL, environment_project_name, environment_server, labels, project_name,
};
use gitops_shared::db::tenant_move::tenant_placement_by_id;

/// Characters that Argo CD reads as patterns in project fields; values holding them
/// are left out rather than widening what the project permits.
fn is_literal(value: &str) -> bool {
    !value.is_empty() && !value.starts_with('!') && !value.contains(['*', '[', ']'])
}

/// A destination left out of a project: (namespace, why).
pub type RefusedDestination = (String, String);

/// A destination an Application in Argo CD deploys to now, with the project it
/// names: (project, server, namespace).
pub type LiveDestination = (String, String, String);

/// The projects a tenant's rows call for — its main project first, then one per
/// environment that allows cluster-scoped resources, by environment id — and the
/// destinations `policy` left out.
///
/// `live` are the destinations the tenant's Applications in Argo CD deploy to now.
/// A destination of the tenant stays listed in the project an Application there
/// still names, until that Application has switched project: otherwise a switch
/// (an environment's cluster resources turned on or off) would refuse the
/// Application's spec in between, and Argo CD would end a sync in progress for
/// good. Nothing is widened by this: only destinations the rows give the tenant
/// count, and no project's whitelist changes.
pub fn project_specs(
    project: &TenantProject,
    policy: &DestinationPolicy,
    live: &[LiveDestination],
) -> (Vec<ProjectSpec>, Vec<RefusedDestination>) {
    let tenant = project.tenant_id;
    let source_repos: Vec<String> = project.repo_urls.iter().filter(|url| is_literal(url)).cloned().collect();
    // Only environments' destinations: the tenant's own namespace is its home
    // environment's, reached with credentials scoped to that namespace.
    let mut main = Vec::new();
    let mut own = Vec::new();
    let mut refused = Vec::new();
    for environment in &project.environments {
        let server = environment_server(&environment.api_url, environment.id);
        let namespaces = if environment.namespaces.is_empty() {
            &environment.application_namespaces
        } else {
            &environment.namespaces
        };
        let mut destinations = Vec::new();
        for namespace in namespaces.iter().filter(|ns| is_literal(ns)) {
            match policy.refusal(environment.home, &environment.api_url, namespace) {
                Some(why) => refused.push((namespace.clone(), why)),
                None => destinations.push((server.clone(), namespace.clone())),
            }
        }
        if environment.cluster_resources {
            own.push(ProjectSpec {
                name: environment_project_name(tenant, environment.id),
                labels: labels(tenant, &[(MANAGED_ENVIRONMENT_ID_LABEL, environment.id.to_string())]),
                source_repos: source_repos.clone(),
                destinations,
                cluster_resources: true,
            });
        } else {
            main.extend(destinations);
        }
    }
    refused.sort();
    refused.dedup();
    let mut specs = vec![ProjectSpec {
        name: project_name(tenant),
        labels: labels(tenant, &[]),
        source_repos,
        destinations: main,
        cluster_resources: false,
    }];
    specs.extend(own);
    let granted: BTreeSet<(String, String)> = specs.iter().flat_map(|s| s.destinations.iter().cloned()).collect();
    for spec in &mut specs {
        for (_, server, namespace) in live.iter().filter(|(project, _, _)| *project == spec.name) {
            let destination = (server.clone(), namespace.clone());
            if granted.contains(&destination) {
                spec.destinations.push(destination);
            }
        }
        spec.destinations.sort();
        spec.destinations.dedup();
    }
    (specs, refused)
}

impl Reconciler {
    /// Applies the tenant's projects as its rows stand now, and removes those no
    /// longer called for that no Application names.
    pub(super) async fn apply_project(&self, tenant: TenantId) -> Result<(), ReconcileError> {
        let project = {
            let client = pooled(&self.pool).await?;
            tenant_project_load(&client, tenant).await?
        };
        // No tenant row: it was purged after its deletion, which removed the projects.
        let Some(project) = project else { return Ok(()) };
        match project.row_state {
            RowState::Active => self.apply_active_project(&project).await,
            RowState::Deleting => self.remove_project_when_empty(tenant).await,
            RowState::Deleted | RowState::Unknown => Ok(()),
        }
    }

    /// Applies an active tenant's projects, without (and counting) refused
    /// destinations, then prunes the projects it no longer needs.
    async fn apply_active_project(&self, project: &TenantProject) -> Result<(), ReconcileError> {
        self.apply_active_project_seen(project).await.map(|_| ())
    }

    /// Applies the tenant's projects and returns its Applications as Argo CD held
    /// them before (their project and destination).
    pub(super) async fn apply_project_seen(&self, tenant: TenantId) -> Result<Vec<OwnedObject>, ReconcileError> {
        let project = {
            let client = pooled(&self.pool).await?;
            tenant_project_load(&client, tenant).await?
        };
        match project {
            Some(project) if project.row_state == RowState::Active => self.apply_active_project_seen(&project).await,
            Some(project) if project.row_state == RowState::Deleting => {
                self.remove_project_when_empty(tenant).await.map(|()| Vec::new())
            }
            _ => Ok(Vec::new()),
        }
    }

    async fn apply_active_project_seen(&self, project: &TenantProject) -> Result<Vec<OwnedObject>, ReconcileError> {
        let policy = self.destination_policy().await?;
        let applications = self.engine().list_tenant(ObjectKind::Application, project.tenant_id).await?;
        let live: Vec<LiveDestination> = applications
            .iter()
            .filter_map(|app| {
                Some((app.project.clone()?, app.destination_server.clone()?, app.destination_namespace.clone()?))
            })
            .collect();
        let (specs, refused) = project_specs(project, &policy, &live);
        for (namespace, why) in &refused {
            self.destinations.refused(
                RefusedKind::ProjectDestination,
                Some(project.tenant_id),
                namespace,
                &specs[0].name,
                why,
            );
        }
        for spec in &specs {
            self.engine().apply_project(spec).await?;
        }
        let wanted: BTreeSet<String> = specs.into_iter().map(|spec| spec.name).collect();
        self.prune_projects(project.tenant_id, &wanted, &applications).await?;
        Ok(applications)
    }

    /// Removes the tenant's projects not in `wanted` that no Application of the
    /// tenant names any more, with the repository Secret copies that served them.
    /// A project still named is left for the reconcile of the Application that
    /// names it (which switches it over, then prunes).
    async fn prune_projects(
        &self,
        tenant: TenantId,
        wanted: &BTreeSet<String>,
        applications: &[OwnedObject],
    ) -> Result<(), ReconcileError> {
        let projects = self.engine().list_tenant(ObjectKind::Project, tenant).await?;
        let stale: Vec<&str> =
            projects.iter().map(|p| p.name.as_str()).filter(|name| !wanted.contains(*name)).collect();
        if stale.is_empty() {
            return Ok(());
        }
        let repositories = self.engine().list_tenant(ObjectKind::Repository, tenant).await?;
        for name in stale {
            if applications.iter().any(|app| app.project.as_deref() == Some(name)) {
                continue;
            }
            for copy in repositories.iter().filter(|r| r.labels.get(PROJECT_LABEL).map(String::as_str) == Some(name)) {
                self.engine().delete_repository(&copy.name).await?;
            }
            tracing::info!(tenant.id = %tenant, project = name, "removing a project no longer needed");
            self.engine().delete_project(name).await?;
        }
        Ok(())
    }

    /// Removes a deleting tenant's projects once none of its rows is left to delete.
    /// Each row's deletion is confirmed before this count, so whichever agent
    /// confirms the last one sees none pending and removes the projects.
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

    /// A tenant operation: keep its projects, or remove them once the tenant is
    /// deleting and its other rows are gone (else the last of their deletions does).
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
        self.apply_project(tenant).await
    }

    /// Removes every project of the tenant (its main one and any environment's),
    /// then confirms the tenant's deletion.
    async fn remove_project(&self, tenant: TenantId) -> Result<(), ReconcileError> {
        let mut names: BTreeSet<String> =
            self.engine().list_tenant(ObjectKind::Project, tenant).await?.into_iter().map(|p| p.name).collect();
        names.insert(project_name(tenant));
        let mut pending = Vec::new();
        for name in &names {
            if self.engine().delete_project(name).await? == Removal::Pending {
                pending.push(name.as_str());
            }
        }
        if !pending.is_empty() {
            return Err(ReconcileError::not_yet(
                format!("AppProjects of tenant {tenant} still present: {}", pending.join(", ")),
                "waiting for Argo CD to remove the project",
            ));
        }
        let client = pooled(&self.pool).await?;
        resource_mark_deleted(&client, ResourceType::Tenant, tenant.0).await?;
        Ok(())
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
        let (specs, refused) = project_specs(&project, &DestinationPolicy::default(), &[]);
        assert_eq!(specs.len(), 1, "no environment allows cluster resources: one project");
        let spec = &specs[0];
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
        let (specs, refused) = project_specs(&project, &DestinationPolicy::default(), &[]);
        let spec = &specs[0];
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

    #[test]
    fn cluster_resources_get_a_project_of_their_environment_only() {
        let environment = |id: i64, home, cluster_resources, namespaces: &[&str]| ProjectEnvironment {
            id: ManagedEnvironmentId(id),
            api_url: if home { "https://home.example.invalid".into() } else { "https://c.example.invalid".into() },
            namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
            cluster_resources,
            application_namespaces: vec!["from-apps".into()],
            home,
        };
        let project = TenantProject {
            tenant_id: TenantId(3),
            namespace_name: "team-a".into(),
            row_state: RowState::Active,
            repo_urls: vec!["https://git.example.invalid/a.git".into()],
            environments: vec![
                environment(1, true, false, &["team-a"]),
                environment(2, false, true, &["ops"]),
                environment(3, false, false, &["dev"]),
                environment(4, false, true, &[]),
            ],
        };
        let (specs, refused) = project_specs(&project, &DestinationPolicy::default(), &[]);
        assert!(refused.is_empty());
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["gitops-tenant-3", "gitops-tenant-3-env-2", "gitops-tenant-3-env-4"]);
        let main = &specs[0];
        assert!(!main.cluster_resources, "the main project never whitelists cluster resources");
        assert_eq!(
            main.destinations,
            [
                ("https://c.example.invalid?managed-environment=3".to_owned(), "dev".to_owned()),
                ("https://home.example.invalid?managed-environment=1".to_owned(), "team-a".to_owned()),
            ],
            "nor lists the destinations of environments with a project of their own"
        );
        assert!(specs[1..].iter().all(|s| s.cluster_resources && s.source_repos == main.source_repos));
        assert_eq!(
            specs[1].destinations,
            [("https://c.example.invalid?managed-environment=2".to_owned(), "ops".to_owned())]
        );
        assert_eq!(
            specs[2].destinations,
            [("https://c.example.invalid?managed-environment=4".to_owned(), "from-apps".to_owned())],
            "an environment without namespaces: those its applications use"
        );
        assert_eq!(specs[1].labels[crate::names::MANAGED_ENVIRONMENT_ID_LABEL], "2");

        // While an Application of environment 2 still names the main project, and
        // one of environment 3 already names 2's, each keeps its destination there;
        // a destination the rows do not give the tenant is never added.
        let e2 = ("https://c.example.invalid?managed-environment=2".to_owned(), "ops".to_owned());
        let e3 = ("https://c.example.invalid?managed-environment=3".to_owned(), "dev".to_owned());
        let live = [
            ("gitops-tenant-3".to_owned(), e2.0.clone(), e2.1.clone()),
            ("gitops-tenant-3-env-2".to_owned(), e3.0.clone(), e3.1.clone()),
            ("gitops-tenant-3".to_owned(), "https://other.example.invalid".to_owned(), "x".to_owned()),
        ];
        let (lingering, _) = project_specs(&project, &DestinationPolicy::default(), &live);
        assert!(lingering[0].destinations.contains(&e2) && lingering[0].destinations.contains(&e3));
        assert_eq!(lingering[0].destinations.len(), 3);
        assert_eq!(lingering[1].destinations, [e2.clone(), e3.clone()]);
        assert!(!lingering[0].cluster_resources, "the whitelist never follows");
    }
}
