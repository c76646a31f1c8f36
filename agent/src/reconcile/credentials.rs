//! Managed environments and repository credentials → Argo CD cluster and repository
//! Secrets. Sealed credentials are opened here, in memory, for the one apply that
//! needs them, and never logged. Each Secret names one of the tenant's projects,
//! so only that tenant's Applications can use it: a cluster Secret the project of
//! its environment (`names::project_of_environment`), a repository credential one
//! copy per project of the tenant — the main one and each environment's that
//! allows cluster-scoped resources — since Argo CD gives an Application only the
//! repository Secrets of its own project. Copies for projects that are gone are
//! removed here, and with the project (`super::project`).
//!
//! A cluster Secret for the home cluster (the tenant's home environment, or any
//! environment whose API URL is a home URL) must list its namespaces, none of them
//! reserved (`crate::destination`): otherwise the environment is refused and its
//! Secret removed, before its credentials are even opened.

use gitops_shared::crypto::{Sealed, SecretContext};
use gitops_shared::db::application_state::AgentOutcome;
use gitops_shared::db::credential::{
    CLUSTER_CREDENTIAL_TABLE, ClusterCredentials, REPOSITORY_CREDENTIAL_TABLE, RepositoryCredentials,
};
use gitops_shared::db::desired::{
    DesiredEnvironment, TenantProject, environment_project_users, managed_environment_load, repository_credential_load,
    resource_mark_deleted, tenant_project_load,
};
use gitops_shared::db::pooled;
use gitops_shared::db::resource_state::{StateOf, resource_state_record_outcome};
use gitops_shared::model::{ManagedEnvironmentId, RepositoryCredentialId, ResourceType, RowState, TenantId};
use serde::de::DeserializeOwned;

use super::{ReconcileError, Reconciler, same_tenant};
use crate::destination::{DestinationPolicy, RefusedKind};
use crate::engine::{ClusterSpec, ObjectKind, Removal, RepositorySpec};
use crate::names::{
    MANAGED_ENVIRONMENT_ID_LABEL, PROJECT_LABEL, REPOSITORY_CREDENTIAL_ID_LABEL, cluster_display_name,
    cluster_secret_name, environment_project_name, environment_repository_secret_name, environment_server, labels,
    project_name, project_of_environment, repository_secret_name,
};
use crate::sweep::{ResourceTypeKey, Target, enqueue_targets};

/// Why environment `environment` must not become a cluster Secret: on the home
/// cluster it names a reserved namespace, or none (cluster-wide). Returns the
/// namespace at fault (`*` for cluster-wide) and the reason.
pub fn cluster_refusal(policy: &DestinationPolicy, environment: &DesiredEnvironment) -> Option<(String, String)> {
    if !policy.on_home_cluster(environment.home, &environment.api_url) {
        return None;
    }
    if environment.namespaces.is_empty() {
        return Some(("*".to_owned(), "cluster-wide access to the home cluster (no namespaces listed)".to_owned()));
    }
    environment
        .namespaces
        .iter()
        .find_map(|namespace| policy.forbidden_namespace(namespace).map(|why| (namespace.clone(), why)))
}

impl Reconciler {
    fn open<T: DeserializeOwned>(
        &self,
        table: &'static str,
        tenant: TenantId,
        sealed: &Sealed,
        what: String,
    ) -> Result<T, ReconcileError> {
        let plain = self
            .secrets
            .open(SecretContext { table, tenant }, sealed)
            .map_err(|source| ReconcileError::Credentials { what: what.clone(), source })?;
        serde_json::from_slice(&plain).map_err(|source| ReconcileError::CredentialsFormat { what, source })
    }

    pub(super) async fn environment(&self, tenant: TenantId, id: ManagedEnvironmentId) -> Result<(), ReconcileError> {
        let environment = {
            let client = pooled(&self.pool).await?;
            managed_environment_load(&client, id).await?
        };
        let Some(environment) = environment else {
            self.remove_orphans(ObjectKind::Cluster, id.0).await?;
            return self.apply_project(tenant).await;
        };
        same_tenant(tenant, environment.tenant_id, "managed environment")?;
        let name = cluster_secret_name(environment.resource_uid);
        match environment.row_state {
            RowState::Active => {
                let policy = self.destination_policy().await?;
                if let Some((namespace, why)) = cluster_refusal(&policy, &environment) {
                    self.destinations.refused(RefusedKind::ClusterSecret, Some(tenant), &namespace, &name, &why);
                    let removal = self.engine().delete_cluster(&name).await?;
                    self.apply_project(tenant).await?;
                    return Err(ReconcileError::refused(
                        format!(
                            "managed environment {id} reaches namespace {namespace:?} of the home cluster, which is \
                             reserved ({why}); cluster Secret {name} not applied, an existing one removed ({removal:?})"
                        ),
                        if namespace == "*" {
                            "the environment would reach every namespace of this cluster, reserved ones included: \
                             list the namespaces it may use"
                                .to_owned()
                        } else {
                            format!(
                                "the environment would reach namespace {namespace:?} of this cluster, which is \
                                 reserved: the GitOps service never deploys there"
                            )
                        },
                    ));
                }
                let Some(sealed) = &environment.credentials else {
                    return Err(ReconcileError::not_yet(
                        format!("managed environment {id} has no stored credentials"),
                        "waiting for the environment's credentials",
                    ));
                };
                let credentials: ClusterCredentials =
                    self.open(CLUSTER_CREDENTIAL_TABLE, tenant, sealed, format!("managed environment {id}"))?;
                self.switch_project_users(tenant, &environment).await?;
                let spec = ClusterSpec {
                    name,
                    labels: labels(tenant, &[(MANAGED_ENVIRONMENT_ID_LABEL, id.to_string())]),
                    display_name: cluster_display_name(id),
                    server: environment_server(&environment.api_url, id),
                    project: project_of_environment(tenant, id, environment.cluster_resources),
                    namespaces: environment.namespaces.clone(),
                    cluster_resources: environment.cluster_resources,
                    insecure: environment.allow_insecure_skip_tls_verify,
                    credentials,
                    generation: Some(environment.generation),
                };
                self.apply_project(tenant).await?;
                self.engine().apply_cluster(&spec).await?;
                self.record_applied(StateOf::ManagedEnvironment, id.0, environment.generation).await
            }
            RowState::Deleting => {
                self.confirm_removed(
                    self.engine().delete_cluster(&name).await?,
                    ResourceType::ManagedEnvironment,
                    id.0,
                    &name,
                )
                .await?;
                self.apply_project(tenant).await
            }
            RowState::Deleted => {
                self.remove_orphans(ObjectKind::Cluster, id.0).await?;
                self.apply_project(tenant).await
            }
            RowState::Unknown => Err(ReconcileError::not_yet(
                format!("managed environment {id} has an unknown row state"),
                "waiting for an agent upgrade",
            )),
        }
    }

    pub(super) async fn repository(&self, tenant: TenantId, id: RepositoryCredentialId) -> Result<(), ReconcileError> {
        let credential = {
            let client = pooled(&self.pool).await?;
            repository_credential_load(&client, id).await?
        };
        let Some(credential) = credential else {
            self.remove_orphans(ObjectKind::Repository, id.0).await?;
            return self.apply_project(tenant).await;
        };
        same_tenant(tenant, credential.tenant_id, "repository credential")?;
        let name = repository_secret_name(credential.resource_uid);
        match (credential.row_state, &credential.credentials) {
            (RowState::Active, Some(sealed)) => {
                let credentials: RepositoryCredentials =
                    self.open(REPOSITORY_CREDENTIAL_TABLE, tenant, sealed, format!("repository credential {id}"))?;
                self.apply_project(tenant).await?;
                // One copy per project of the tenant: a repository Secret serves one project.
                let projects = {
                    let client = pooled(&self.pool).await?;
                    tenant_project_load(&client, tenant).await?
                };
                let mut wanted = Vec::new();
                for (project, environment) in repository_projects(tenant, projects.as_ref()) {
                    let name = match environment {
                        None => repository_secret_name(credential.resource_uid),
                        Some(environment) => environment_repository_secret_name(credential.resource_uid, environment),
                    };
                    let spec = RepositorySpec {
                        name: name.clone(),
                        labels: labels(
                            tenant,
                            &[(REPOSITORY_CREDENTIAL_ID_LABEL, id.to_string()), (PROJECT_LABEL, project.clone())],
                        ),
                        project,
                        url: credential.repo_url.clone(),
                        credentials: credentials.clone(),
                        generation: Some(credential.generation),
                    };
                    self.engine().apply_repository(&spec).await?;
                    wanted.push(name);
                }
                let removal = self.remove_repository_copies(tenant, id, &wanted).await?;
                if removal == Removal::Pending {
                    return Err(ReconcileError::not_yet(
                        format!("copies of repository Secret {name} for removed projects are still being deleted"),
                        "waiting for Argo CD to remove the object",
                    ));
                }
                self.record_applied(StateOf::RepositoryCredential, id.0, credential.generation).await
            }
            // No valid Secret (yet, or any more): no credentials in Argo CD either.
            // That is applied too; the writer's condition tells the tenant why.
            (RowState::Active, None) => {
                self.engine().delete_repository(&name).await?;
                self.remove_repository_copies(tenant, id, &[]).await?;
                self.apply_project(tenant).await?;
                self.record_applied(StateOf::RepositoryCredential, id.0, credential.generation).await
            }
            (RowState::Deleting, _) => {
                let removal = match self.engine().delete_repository(&name).await? {
                    Removal::Gone => self.remove_repository_copies(tenant, id, &[]).await?,
                    Removal::Pending => Removal::Pending,
                };
                self.confirm_removed(removal, ResourceType::RepositoryCredential, id.0, &name).await?;
                self.apply_project(tenant).await
            }
            (RowState::Deleted, _) => {
                self.remove_orphans(ObjectKind::Repository, id.0).await?;
                self.apply_project(tenant).await
            }
            (RowState::Unknown, _) => Err(ReconcileError::not_yet(
                format!("repository credential {id} has an unknown row state"),
                "waiting for an agent upgrade",
            )),
        }
    }

    /// Deletes the Secrets of repository credential `id` other than `keep` (copies
    /// for projects the tenant no longer has, or all of them). Gone when none is left.
    async fn remove_repository_copies(
        &self,
        tenant: TenantId,
        id: RepositoryCredentialId,
        keep: &[String],
    ) -> Result<Removal, ReconcileError> {
        let wanted = id.to_string();
        let mut removal = Removal::Gone;
        for copy in self.engine().list_tenant(ObjectKind::Repository, tenant).await? {
            if copy.labels.get(REPOSITORY_CREDENTIAL_ID_LABEL) != Some(&wanted) || keep.contains(&copy.name) {
                continue;
            }
            if self.engine().delete_repository(&copy.name).await? == Removal::Pending {
                removal = Removal::Pending;
            }
        }
        Ok(removal)
    }

    /// When environment `environment` starts or stops having a project of its own,
    /// enqueues the rows whose objects name its project — its applications and the
    /// tenant's repository credentials — so each is applied under the project it
    /// now needs. Enqueued before anything is applied, so a crash in between
    /// repeats the check rather than losing the switch; each of those reconciles
    /// applies the tenant's projects itself, whichever runs first.
    async fn switch_project_users(
        &self,
        tenant: TenantId,
        environment: &DesiredEnvironment,
    ) -> Result<(), ReconcileError> {
        let own = environment_project_name(tenant, environment.id);
        let exists = self.engine().list_tenant(ObjectKind::Project, tenant).await?.iter().any(|p| p.name == own);
        if exists == environment.cluster_resources {
            return Ok(());
        }
        let mut client = pooled(&self.pool).await?;
        let (applications, credentials) = environment_project_users(&client, tenant, environment.id).await?;
        let targets = applications
            .iter()
            .map(|app| Target { resource_type: ResourceTypeKey::Application, resource_id: app.0, tenant_id: tenant })
            .chain(credentials.iter().map(|credential| Target {
                resource_type: ResourceTypeKey::RepositoryCredential,
                resource_id: credential.0,
                tenant_id: tenant,
            }))
            .collect();
        tracing::info!(
            tenant.id = %tenant,
            environment.id = %environment.id,
            cluster_resources = environment.cluster_resources,
            applications = applications.len(),
            "the environment's project changes: its users are reconciled again"
        );
        enqueue_targets(&mut client, self.instance.id, targets).await?;
        Ok(())
    }

    /// Records that the row of `generation` is what Argo CD has now (the status feed
    /// carries it to the tenant resource).
    async fn record_applied(&self, kind: StateOf, id: i64, generation: i64) -> Result<(), ReconcileError> {
        let client = pooled(&self.pool).await?;
        resource_state_record_outcome(&client, self.epoch(), kind, id, &AgentOutcome::Applied { generation }).await?;
        Ok(())
    }

    /// Marks a row deleted once its object is gone; otherwise asks to be retried.
    async fn confirm_removed(
        &self,
        removal: Removal,
        resource_type: ResourceType,
        id: i64,
        object: &str,
    ) -> Result<(), ReconcileError> {
        match removal {
            Removal::Gone => {
                let client = pooled(&self.pool).await?;
                resource_mark_deleted(&client, resource_type, id).await?;
                Ok(())
            }
            Removal::Pending => Err(ReconcileError::not_yet(
                format!("{object} is still being deleted"),
                "waiting for Argo CD to remove the object",
            )),
        }
    }
}

/// The projects a repository credential of `tenant` must serve, each with the
/// environment it belongs to (None: the main project). Without a tenant row, the
/// main project only.
pub fn repository_projects(
    tenant: TenantId,
    project: Option<&TenantProject>,
) -> Vec<(String, Option<ManagedEnvironmentId>)> {
    let own = project
        .into_iter()
        .flat_map(|p| p.environments.iter())
        .filter(|e| e.cluster_resources)
        .map(|e| (environment_project_name(tenant, e.id), Some(e.id)));
    std::iter::once((project_name(tenant), None)).chain(own).collect()
}

#[cfg(test)]
mod tests {
    use gitops_shared::model::TenantId;
    use uuid::Uuid;

    use super::*;

    fn environment(api_url: &str, home: bool, namespaces: &[&str]) -> DesiredEnvironment {
        DesiredEnvironment {
            id: ManagedEnvironmentId(1),
            tenant_id: TenantId(1),
            resource_uid: Uuid::new_v4(),
            resource_name: "e".into(),
            generation: 1,
            api_url: api_url.into(),
            allow_insecure_skip_tls_verify: false,
            namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
            cluster_resources: false,
            row_state: RowState::Active,
            home,
            credentials: None,
        }
    }

    #[test]
    fn home_cluster_secrets_must_name_unreserved_namespaces() {
        let policy = DestinationPolicy::default();
        let remote = "https://c.example.invalid";
        assert_eq!(cluster_refusal(&policy, &environment(remote, true, &["team-a"])), None);
        assert_eq!(cluster_refusal(&policy, &environment(remote, false, &[])), None, "another cluster, cluster-wide");
        assert_eq!(cluster_refusal(&policy, &environment(remote, false, &["kube-system"])), None);
        let refused = cluster_refusal(&policy, &environment(remote, true, &["team-a", "kube-system"]));
        assert_eq!(refused.map(|(ns, _)| ns).as_deref(), Some("kube-system"));
        let refused = cluster_refusal(&policy, &environment("https://kubernetes.default.svc/", false, &[]));
        assert_eq!(refused.map(|(ns, _)| ns).as_deref(), Some("*"), "cluster-wide on the home cluster");
    }

    #[test]
    fn repository_credentials_serve_every_project_of_their_tenant() {
        use gitops_shared::db::desired::ProjectEnvironment;
        let environment = |id: i64, cluster_resources| ProjectEnvironment {
            id: ManagedEnvironmentId(id),
            api_url: "https://c.example.invalid".into(),
            namespaces: vec!["ns".into()],
            cluster_resources,
            application_namespaces: vec![],
            home: false,
        };
        let project = TenantProject {
            tenant_id: TenantId(5),
            namespace_name: "team-a".into(),
            row_state: RowState::Active,
            repo_urls: vec![],
            environments: vec![environment(1, false), environment(2, true)],
        };
        assert_eq!(
            repository_projects(TenantId(5), Some(&project)),
            [("gitops-tenant-5".to_owned(), None), ("gitops-tenant-5-env-2".to_owned(), Some(ManagedEnvironmentId(2)))]
        );
        assert_eq!(repository_projects(TenantId(5), None), [("gitops-tenant-5".to_owned(), None)]);
    }
}
