//! GitOpsDeployment rules: source (repository URL, path, revision), destination
//! (environment name, namespace), type and sync options. The result is the
//! validated part of shared's `ApplicationIntent`; the controller adds what needs
//! the cluster or the database (tenant, UID, generation, the environment's row).

use gitops_shared::db::application::ApplicationIntent;
use gitops_shared::model::{ManagedEnvironmentId, SyncType};
use uuid::Uuid;

use super::text::{required, text};
use super::{Invalid, dns_label, dns_subdomain, limits, reason, repository_url};
use crate::api::GitOpsDeploymentSpec;

/// The revision used when `targetRevision` is absent or empty.
pub const DEFAULT_REVISION: &str = "HEAD";

/// A GitOpsDeployment spec that passed every rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidDeployment {
    pub repo_url: String,
    pub path: String,
    pub target_revision: String,
    /// A GitOpsDeploymentManagedEnvironment in the deployment's namespace; None:
    /// the tenant's own namespace on the home cluster.
    pub environment: Option<String>,
    pub destination_namespace: Option<String>,
    pub sync_type: SyncType,
    pub create_namespace: bool,
}

/// Checks a GitOpsDeployment spec; the first broken rule is the answer, in field order.
pub fn deployment(spec: &GitOpsDeploymentSpec) -> Result<ValidDeployment, Invalid> {
    set_by_service(spec)?;
    let repo_url = repository_url("spec.source.repoURL", &spec.source.repo_url)?;
    let path = path("spec.source.path", &spec.source.path)?;
    let target_revision = target_revision("spec.source.targetRevision", spec.source.target_revision.as_deref())?;
    let environment = non_empty(spec.destination.environment.as_deref())
        .map(|name| dns_subdomain("spec.destination.environment", name, reason::INVALID_ENVIRONMENT_NAME))
        .transpose()?;
    let destination_namespace = non_empty(spec.destination.namespace.as_deref())
        .map(|ns| dns_label("spec.destination.namespace", ns, reason::INVALID_DESTINATION_NAMESPACE))
        .transpose()?;
    let sync_type = sync_type("spec.type", &spec.type_)?;
    let options = spec.sync_policy.as_ref().map(|p| p.sync_options.as_slice()).unwrap_or_default();
    let create_namespace = sync_options("spec.syncPolicy.syncOptions", options)?;
    Ok(ValidDeployment {
        repo_url,
        path,
        target_revision,
        environment,
        destination_namespace,
        sync_type,
        create_namespace,
    })
}

/// Fields of the original service's API that this service sets itself: declared in
/// the schema so they are not pruned, refused here naming the field.
fn set_by_service(spec: &GitOpsDeploymentSpec) -> Result<(), Invalid> {
    let fields = [
        ("spec.project", spec.project.as_deref(), "the service chooses the Argo CD project of each tenant"),
        (
            "spec.destination.server",
            spec.destination.server.as_deref(),
            "name a GitOpsDeploymentManagedEnvironment in spec.destination.environment instead",
        ),
        (
            "spec.destination.name",
            spec.destination.name.as_deref(),
            "name a GitOpsDeploymentManagedEnvironment in spec.destination.environment instead",
        ),
    ];
    match fields.into_iter().find(|(_, value, _)| non_empty(*value).is_some()) {
        Some((field, _, instead)) => Err(Invalid::new(
            reason::FIELD_SET_BY_SERVICE,
            format!("{field} is set by the GitOps service and may not be given; {instead}"),
        )),
        None => Ok(()),
    }
}

fn non_empty(value: Option<&str>) -> Option<&str> {
    value.filter(|v| !v.is_empty())
}

/// A path inside the repository: relative, not empty, not `/`, no `..` segment.
/// `.` is the repository's root. Other characters (quotes, `;`, `$`, spaces) are
/// plain text.
pub fn path(field: &str, value: &str) -> Result<String, Invalid> {
    let value = required(field, value, limits::PATH)?;
    if value.trim_matches('/').is_empty() {
        return Err(Invalid::new(
            reason::INVALID_PATH,
            format!("{field} must not be '/'; use '.' for the repository's root"),
        ));
    }
    if value.starts_with('/') || value.starts_with('\\') {
        return Err(Invalid::new(reason::INVALID_PATH, format!("{field} must be relative to the repository's root")));
    }
    if value.split(['/', '\\']).any(|segment| segment == "..") {
        return Err(Invalid::new(reason::INVALID_PATH, format!("{field} must not contain a '..' segment")));
    }
    Ok(value.to_owned())
}

/// A branch, tag or commit; `HEAD` when absent or empty. Never starting with `-`
/// (it would read as an option to `git`), no spaces.
pub fn target_revision(field: &str, value: Option<&str>) -> Result<String, Invalid> {
    let Some(value) = non_empty(value) else { return Ok(DEFAULT_REVISION.to_owned()) };
    let value = text(field, value, limits::REVISION)?;
    if value.starts_with('-') || value.chars().any(char::is_whitespace) {
        return Err(Invalid::new(
            reason::INVALID_TARGET_REVISION,
            format!("{field} must be a branch, tag or commit: no spaces, not starting with '-'"),
        ));
    }
    Ok(value.to_owned())
}

/// `automated` or `manual`.
pub fn sync_type(field: &str, value: &str) -> Result<SyncType, Invalid> {
    match required(field, value, limits::DEPLOYMENT_TYPE)? {
        "automated" => Ok(SyncType::Automated),
        "manual" => Ok(SyncType::Manual),
        _ => Err(Invalid::new(reason::INVALID_DEPLOYMENT_TYPE, format!("{field} must be 'automated' or 'manual'"))),
    }
}

/// Only `CreateNamespace=true` or `CreateNamespace=false`, at most once each way;
/// returns whether the namespace is created.
pub fn sync_options(field: &str, options: &[String]) -> Result<bool, Invalid> {
    if options.len() > limits::SYNC_OPTIONS {
        return Err(Invalid::new(
            reason::FIELD_TOO_LONG,
            format!("{field} has {} entries; at most {} are allowed", options.len(), limits::SYNC_OPTIONS),
        ));
    }
    let mut create = None;
    for (i, option) in options.iter().enumerate() {
        let item = format!("{field}[{i}]");
        let value = match text(&item, option, limits::SYNC_OPTION)? {
            "CreateNamespace=true" => true,
            "CreateNamespace=false" => false,
            _ => {
                return Err(Invalid::new(
                    reason::INVALID_SYNC_OPTION,
                    format!(
                        "{item} is not a supported sync option; only CreateNamespace=true and CreateNamespace=false are"
                    ),
                ));
            }
        };
        if create.is_some_and(|c| c != value) {
            return Err(Invalid::new(
                reason::INVALID_SYNC_OPTION,
                format!("{field} sets CreateNamespace both true and false"),
            ));
        }
        create = Some(value);
    }
    Ok(create.unwrap_or(false))
}

/// Without an environment a deployment goes into its own namespace: a different
/// `destination.namespace` is refused.
pub fn home_destination(valid: &ValidDeployment, namespace: &str) -> Result<(), Invalid> {
    match valid.destination_namespace.as_deref().filter(|d| valid.environment.is_none() && *d != namespace) {
        Some(destination) => Err(Invalid::new(
            reason::INVALID_DESTINATION_NAMESPACE,
            format!(
                "spec.destination.namespace: without an environment a deployment goes into its own namespace {namespace:?}, not {destination:?}"
            ),
        )),
        None => Ok(()),
    }
}

/// A managed environment found by the controller's lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvironmentRef {
    pub id: ManagedEnvironmentId,
}

/// Turns the lookup's answer into the environment id, or `EnvironmentNotFound`.
pub fn environment_resolved(name: &str, found: Option<EnvironmentRef>) -> Result<ManagedEnvironmentId, Invalid> {
    found.map(|e| e.id).ok_or_else(|| {
        Invalid::new(
            reason::ENVIRONMENT_NOT_FOUND,
            format!(
                "spec.destination.environment: no GitOpsDeploymentManagedEnvironment named {name:?} in this namespace"
            ),
        )
    })
}

impl ValidDeployment {
    /// The intent row: `destination_namespace` falls back to `default_namespace`
    /// (the tenant's own namespace when no environment is named).
    #[allow(clippy::too_many_arguments)]
    pub fn into_intent(
        self,
        resource_uid: Uuid,
        resource_name: String,
        generation: i64,
        managed_environment_id: Option<ManagedEnvironmentId>,
        default_namespace: &str,
        wait_for_pruning: bool,
    ) -> ApplicationIntent {
        ApplicationIntent {
            resource_uid,
            resource_name,
            generation,
            repo_url: self.repo_url,
            path: self.path,
            target_revision: self.target_revision,
            managed_environment_id,
            destination_namespace: self.destination_namespace.unwrap_or_else(|| default_namespace.to_owned()),
            sync_type: self.sync_type,
            create_namespace: self.create_namespace,
            wait_for_pruning,
        }
    }
}

#[cfg(test)]
#[path = "deployment_tests.rs"]
mod tests;
