//! The tenant API: the four `managed-gitops.redhat.com/v1alpha1` custom resources
//! as Rust types, from which their CustomResourceDefinitions are generated
//! (`gitopsctl crds`, checked in under `ops/crds/`, never edited by hand).
//!
//! The schemas check types only: every string is a plain string and every
//! semantic rule (URL forms, path rules, allowed values, lengths) lives in
//! [`crate::validate`], so the same input gets the same condition on every API
//! server, whatever its version or validation features.

mod deployment;
mod environment;
mod repository_credential;
mod sync_run;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use deployment::{
    DeploymentDestination, DeploymentHealth, DeploymentResource, DeploymentSource, DeploymentSync, GitOpsDeployment,
    GitOpsDeploymentSpec, GitOpsDeploymentStatus, ReconciledState, SyncPolicy,
};
pub use environment::{
    CONNECTION_INITIALIZATION_SUCCEEDED, GitOpsDeploymentManagedEnvironment, GitOpsDeploymentManagedEnvironmentSpec,
    GitOpsDeploymentManagedEnvironmentStatus,
};
pub use repository_credential::{
    GitOpsDeploymentRepositoryCredential, GitOpsDeploymentRepositoryCredentialSpec,
    GitOpsDeploymentRepositoryCredentialStatus,
};
pub use sync_run::{GitOpsDeploymentSyncRun, GitOpsDeploymentSyncRunSpec, GitOpsDeploymentSyncRunStatus};

/// The API group of every tenant resource.
pub const GROUP: &str = "managed-gitops.redhat.com";

// As `metav1.Condition`, but every field except `type` and `status` is optional,
// so pure code can build one without a clock.
/// A status condition: `reason` is a CamelCase word, `message` explains it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// RFC 3339 time of the last change of `status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The four CustomResourceDefinitions, in a fixed order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        GitOpsDeployment::crd(),
        GitOpsDeploymentSyncRun::crd(),
        GitOpsDeploymentManagedEnvironment::crd(),
        GitOpsDeploymentRepositoryCredential::crd(),
    ]
}

/// Why the CRD YAML could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum CrdRenderError {
    #[error("could not render CustomResourceDefinition {name} as YAML")]
    Yaml { name: String, source: serde_saphyr::SerializeError },
    #[error("could not write {path}")]
    Write { path: std::path::PathBuf, source: std::io::Error },
}

/// The first line of every generated file.
pub const CRD_FILE_HEADER: &str = "# Generated from writer/src/api by `gitopsctl crds`; do not edit.\n";

/// The CRDs as files: (`<plural>.<group>.yaml`, YAML text), in [`crds`] order.
pub fn crd_files() -> Result<Vec<(String, String)>, CrdRenderError> {
    crds()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let yaml =
                serde_saphyr::to_string(&crd).map_err(|source| CrdRenderError::Yaml { name: name.clone(), source })?;
            Ok((format!("{name}.yaml"), format!("{CRD_FILE_HEADER}{yaml}")))
        })
        .collect()
}

/// Schema of a field that holds any JSON object the engine reports (kept as is).
fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Writes [`crd_files`] into `dir` (created if missing); returns the paths written.
pub fn write_crd_files(dir: &std::path::Path) -> Result<Vec<std::path::PathBuf>, CrdRenderError> {
    let files = crd_files()?;
    std::fs::create_dir_all(dir).map_err(|source| CrdRenderError::Write { path: dir.to_owned(), source })?;
    files
        .into_iter()
        .map(|(name, yaml)| {
            let path = dir.join(name);
            std::fs::write(&path, yaml).map_err(|source| CrdRenderError::Write { path: path.clone(), source })?;
            Ok(path)
        })
        .collect()
}
