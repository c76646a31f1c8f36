//! Managed environments and repository credentials → Argo CD cluster and repository
//! Secrets. Sealed credentials are opened here, in memory, for the one apply that
//! needs them, and never logged. Each Secret names the tenant's project, so only
//! that tenant's Applications can use it.

use gitops_shared::credential::{
    CLUSTER_CREDENTIAL_TABLE, ClusterCredentials, REPOSITORY_CREDENTIAL_TABLE, RepositoryCredentials,
};
use gitops_shared::crypto::{Sealed, SecretContext};
use gitops_shared::db::pooled;
use gitops_shared::desired::{managed_environment_load, repository_credential_load, resource_mark_deleted};
use gitops_shared::model::{ResourceType, RowState, TenantId};
use serde::de::DeserializeOwned;

use super::{ReconcileError, Reconciler, same_tenant};
use crate::engine::{ClusterSpec, ObjectKind, Removal, RepositorySpec};
use crate::names::{
    MANAGED_ENVIRONMENT_ID_LABEL, REPOSITORY_CREDENTIAL_ID_LABEL, cluster_display_name, cluster_secret_name,
    environment_server, labels, project_name, repository_secret_name,
};

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

    pub(super) async fn environment(&self, tenant: TenantId, id: i64) -> Result<(), ReconcileError> {
        let environment = {
            let client = pooled(&self.pool).await?;
            managed_environment_load(&client, id).await?
        };
        let Some(environment) = environment else {
            self.remove_orphans(ObjectKind::Cluster, id).await?;
            return self.apply_project(tenant).await;
        };
        same_tenant(tenant, environment.tenant_id, "managed environment")?;
        let name = cluster_secret_name(environment.resource_uid);
        match environment.row_state {
            RowState::Active => {
                let Some(sealed) = &environment.credentials else {
                    return Err(ReconcileError::not_yet(
                        format!("managed environment {id} has no stored credentials"),
                        "waiting for the environment's credentials",
                    ));
                };
                let credentials: ClusterCredentials =
                    self.open(CLUSTER_CREDENTIAL_TABLE, tenant, sealed, format!("managed environment {id}"))?;
                let spec = ClusterSpec {
                    name,
                    labels: labels(tenant, &[(MANAGED_ENVIRONMENT_ID_LABEL, id.to_string())]),
                    display_name: cluster_display_name(id),
                    server: environment_server(&environment.api_url, id),
                    project: project_name(tenant),
                    namespaces: environment.namespaces.clone(),
                    cluster_resources: environment.cluster_resources,
                    insecure: environment.allow_insecure_skip_tls_verify,
                    credentials,
                };
                self.apply_project(tenant).await?;
                self.engine().apply_cluster(&spec).await?;
                Ok(())
            }
            RowState::Deleting => {
                self.confirm_removed(self.engine().delete_cluster(&name).await?, ResourceType::ManagedEnvironment, id, &name)
                    .await?;
                self.apply_project(tenant).await
            }
            RowState::Deleted => {
                self.remove_orphans(ObjectKind::Cluster, id).await?;
                self.apply_project(tenant).await
            }
            RowState::Unknown => Err(ReconcileError::not_yet(
                format!("managed environment {id} has an unknown row state"),
                "waiting for an agent upgrade",
            )),
        }
    }

    pub(super) async fn repository(&self, tenant: TenantId, id: i64) -> Result<(), ReconcileError> {
        let credential = {
            let client = pooled(&self.pool).await?;
            repository_credential_load(&client, id).await?
        };
        let Some(credential) = credential else {
            self.remove_orphans(ObjectKind::Repository, id).await?;
            return self.apply_project(tenant).await;
        };
        same_tenant(tenant, credential.tenant_id, "repository credential")?;
        let name = repository_secret_name(credential.resource_uid);
        match (credential.row_state, &credential.credentials) {
            (RowState::Active, Some(sealed)) => {
                let credentials: RepositoryCredentials =
                    self.open(REPOSITORY_CREDENTIAL_TABLE, tenant, sealed, format!("repository credential {id}"))?;
                let spec = RepositorySpec {
                    name,
                    labels: labels(tenant, &[(REPOSITORY_CREDENTIAL_ID_LABEL, id.to_string())]),
                    project: project_name(tenant),
                    url: credential.repo_url.clone(),
                    credentials,
                };
                self.apply_project(tenant).await?;
                self.engine().apply_repository(&spec).await?;
                Ok(())
            }
            // No valid Secret (yet, or any more): no credentials in Argo CD either.
            (RowState::Active, None) => {
                self.engine().delete_repository(&name).await?;
                self.apply_project(tenant).await
            }
            (RowState::Deleting, _) => {
                let removal = self.engine().delete_repository(&name).await?;
                self.confirm_removed(removal, ResourceType::RepositoryCredential, id, &name).await?;
                self.apply_project(tenant).await
            }
            (RowState::Deleted, _) => {
                self.remove_orphans(ObjectKind::Repository, id).await?;
                self.apply_project(tenant).await
            }
            (RowState::Unknown, _) => Err(ReconcileError::not_yet(
                format!("repository credential {id} has an unknown row state"),
                "waiting for an agent upgrade",
            )),
        }
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
