//! Names and labels of the objects the agent writes into an Argo CD namespace.
//! Names derive from tenant resource UIDs and row ids (never from names a tenant
//! chose), so two tenants can never collide; labels link every object to its row
//! and tenant, and the managed-by label is how the sweep tells our objects from
//! anyone else's.

use uuid::Uuid;

use gitops_shared::model::{ManagedEnvironmentId, TenantId};

/// Field manager of ordinary server-side applies (always with `force`).
pub const FIELD_MANAGER: &str = "gitops-agent";
/// Field manager of one-shot requests (sync, terminate), kept apart so an ordinary
/// apply can neither repeat nor cancel them.
pub const SYNC_FIELD_MANAGER: &str = "gitops-agent-sync";

/// `app.kubernetes.io/managed-by` = [`MANAGED_BY_VALUE`] on every object we own.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "gitops-agent";
/// The tenant (`tenant.id`) an object belongs to.
pub const TENANT_ID_LABEL: &str = "gitops.managed-gitops.redhat.com/tenant-id";
/// The `application.id` behind an Argo CD Application.
pub const APPLICATION_ID_LABEL: &str = "gitops.managed-gitops.redhat.com/application-id";
/// The `managed_environment.id` behind a cluster Secret.
pub const MANAGED_ENVIRONMENT_ID_LABEL: &str = "gitops.managed-gitops.redhat.com/managed-environment-id";
/// The `repository_credential.id` behind a repository Secret.
pub const REPOSITORY_CREDENTIAL_ID_LABEL: &str = "gitops.managed-gitops.redhat.com/repository-credential-id";
/// The AppProject a repository Secret serves (one copy per project of the tenant).
pub const PROJECT_LABEL: &str = "gitops.managed-gitops.redhat.com/project";

/// The hash of what the agent applied to an object (see `crate::engine::argocd::fingerprint`).
pub const SPEC_HASH_ANNOTATION: &str = "gitops.managed-gitops.redhat.com/spec-hash";
/// The generation of the row an object was built from (absent for projects).
pub const GENERATION_ANNOTATION: &str = "gitops.managed-gitops.redhat.com/generation";

/// The query parameter that makes each environment's server string distinct.
pub const ENVIRONMENT_QUERY: &str = "managed-environment";

/// The Argo CD Application of the GitOpsDeployment with `uid`.
pub fn application_name(uid: Uuid) -> String {
    format!("gitops-{uid}")
}

/// The AppProject of tenant `tenant`: every destination of the tenant except those
/// of environments that allow cluster-scoped resources.
pub fn project_name(tenant: TenantId) -> String {
    format!("gitops-tenant-{}", tenant.0)
}

/// The AppProject of environment `environment` of `tenant`, which exists only while
/// the environment allows cluster-scoped resources: its destinations alone, with
/// cluster-scoped resources permitted.
pub fn environment_project_name(tenant: TenantId, environment: ManagedEnvironmentId) -> String {
    format!("gitops-tenant-{}-env-{environment}", tenant.0)
}

/// The project whose Applications deploy to environment `environment`, and whose
/// name its cluster Secret carries.
pub fn project_of_environment(tenant: TenantId, environment: ManagedEnvironmentId, cluster_resources: bool) -> String {
    if cluster_resources { environment_project_name(tenant, environment) } else { project_name(tenant) }
}

/// The cluster Secret of the managed environment with `uid`.
pub fn cluster_secret_name(uid: Uuid) -> String {
    format!("gitops-cluster-{uid}")
}

/// The repository Secret of the repository credential with `uid` (the copy for the
/// tenant's main project).
pub fn repository_secret_name(uid: Uuid) -> String {
    format!("gitops-repo-{uid}")
}

/// The copy of that repository Secret for the project of environment `environment`.
pub fn environment_repository_secret_name(uid: Uuid, environment: ManagedEnvironmentId) -> String {
    format!("gitops-repo-{uid}-env-{environment}")
}

/// The cluster name shown in Argo CD for environment `id`.
pub fn cluster_display_name(id: ManagedEnvironmentId) -> String {
    format!("managed-environment-{id}")
}

/// The server string of environment `id`: its API URL with a query parameter
/// naming the environment. Argo CD keys clusters by server, so two environments
/// with the same API URL (two tenants, or one tenant twice) stay two clusters with
/// their own credentials; the parameter is passed through to the API server, which
/// ignores it.
pub fn environment_server(api_url: &str, id: ManagedEnvironmentId) -> String {
    let separator = if api_url.contains('?') { '&' } else { '?' };
    format!("{api_url}{separator}{ENVIRONMENT_QUERY}={id}")
}

/// Labels every object of `tenant` carries, plus `extra`.
pub fn labels(tenant: TenantId, extra: &[(&str, String)]) -> std::collections::BTreeMap<String, String> {
    let mut labels = std::collections::BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned()),
        (TENANT_ID_LABEL.to_owned(), tenant.0.to_string()),
    ]);
    labels.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels_and_servers_distinct() {
        let uid = Uuid::new_v4();
        for name in [
            application_name(uid),
            cluster_secret_name(uid),
            repository_secret_name(uid),
            project_name(TenantId(7)),
            environment_project_name(TenantId(7), ManagedEnvironmentId(9_999_999_999)),
        ] {
            assert!(
                name.len() <= 63 && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{name}"
            );
        }
        assert_eq!(
            environment_server("https://c.example.invalid:6443", ManagedEnvironmentId(4)),
            "https://c.example.invalid:6443?managed-environment=4"
        );
        assert_eq!(
            environment_server("https://c.example.invalid/?x=1", ManagedEnvironmentId(4)),
            "https://c.example.invalid/?x=1&managed-environment=4"
        );
        assert!(environment_repository_secret_name(uid, ManagedEnvironmentId(9_999_999_999)).len() <= 253);
        assert_eq!(project_of_environment(TenantId(7), ManagedEnvironmentId(4), false), project_name(TenantId(7)));
        assert_eq!(project_of_environment(TenantId(7), ManagedEnvironmentId(4), true), "gitops-tenant-7-env-4");
        assert_ne!(
            environment_server("https://c.example.invalid", ManagedEnvironmentId(1)),
            environment_server("https://c.example.invalid", ManagedEnvironmentId(2))
        );
    }
}
