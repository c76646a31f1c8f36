//! The tenant API: the four `managed-gitops.redhat.com/v1alpha1` custom resources
//! as Rust types, from which their CustomResourceDefinitions are generated
//! (`gitopsctl crds`, checked in under `ops/crds/`, never edited by hand).
//!
//! The schemas refuse at apply time what a schema can express: required fields,
//! allowed values, lengths (in characters) and the simple forms of names, URLs and
//! revisions in [`pattern`] — never stricter than [`crate::validate`], which holds
//! every rule and runs twice more: in the admission webhook (refusing at apply time
//! what a schema cannot say) and in the controllers, the safety net for objects
//! stored before a rule existed or while the webhook was not registered. Every field
//! has a description (`kubectl explain`). Fields of the original service that this
//! one sets itself (`project`, `destination.server`, `destination.name`) are declared,
//! so they survive pruning, and then refused naming the field.

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
    GitOpsDeploymentSpec, GitOpsDeploymentStatus, ReconciledDestination, ReconciledSource, ReconciledState, SyncPolicy,
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

/// The patterns the schemas use, each no stricter than the rule in
/// [`crate::validate`] it stands for (lengths are the [`crate::validate::limits`]).
pub mod pattern {
    /// A DNS-1123 label (a namespace).
    pub const DNS_LABEL: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
    /// A DNS-1123 subdomain (a resource or Secret name).
    pub const DNS_SUBDOMAIN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
    /// `https://`, `ssh://`, `git://` or scp-like `[user@]host:path`, no spaces.
    /// (An scp-like path may start with one `/`, never `//`: that is another scheme.)
    pub const REPOSITORY_URL: &str = r"^(https://|ssh://|git://|[^\s/:-][^\s/:]*:([^\s:/-]|/([^/\s]|$)))\S*$";
    /// `https://` or `ssh://`, no spaces.
    pub const CREDENTIAL_URL: &str = r"^(https|ssh)://\S+$";
    /// `https://` and a host, no spaces.
    pub const API_URL: &str = r"^https://[^\s/?#]+\S*$";
    /// [`DNS_LABEL`] or empty (an optional field left empty counts as absent).
    pub const DNS_LABEL_OR_EMPTY: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$";
    /// [`DNS_SUBDOMAIN`] or empty.
    pub const DNS_SUBDOMAIN_OR_EMPTY: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$";
    /// A branch, tag or commit: no spaces, not starting with `-`.
    pub const REVISION: &str = r"^[^\s-]\S*$";
    /// [`REVISION`] or empty (`HEAD`).
    pub const REVISION_OR_EMPTY: &str = r"^([^\s-]\S*)?$";
    /// Relative to the repository's root, no control characters.
    pub const PATH: &str = r"^[^/\\\x00-\x1F\x7F][^\x00-\x1F\x7F]*$";
}

/// Makes `names` required properties of an object schema and drops their `default`
/// (which would otherwise stand in for a missing value before validation). The Rust
/// types keep `#[serde(default)]`, so objects stored before a field was required
/// still read.
pub fn require(schema: &mut schemars::Schema, names: &[&str]) {
    if let Some(properties) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        for name in names {
            if let Some(property) = properties.get_mut(*name).and_then(|p| p.as_object_mut()) {
                property.remove("default");
            }
        }
    }
    let required = schema.ensure_object().entry("required").or_insert_with(|| serde_json::Value::Array(Vec::new()));
    if let Some(list) = required.as_array_mut() {
        for name in names {
            if !list.iter().any(|n| n == name) {
                list.push(serde_json::Value::from(*name));
            }
        }
    }
}

// As `metav1.Condition`, but every field except `type` and `status` is optional,
// so pure code can build one without a clock.
/// A status condition: `reason` is a CamelCase word, `message` explains it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// What the condition speaks of (`Ready`, `ErrorOccurred`, …).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Why, as one CamelCase word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// RFC 3339 time of the last change of `status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// The generation of the spec the condition speaks of.
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
    render_crd_files(crds(), CRD_FILE_HEADER)
}

/// `crds` as files: (`<plural>.<group>.yaml`, `header` then the YAML text), in order.
/// Shared with the AppStudio layer, whose CRDs are rendered the same way.
pub fn render_crd_files(
    crds: Vec<CustomResourceDefinition>,
    header: &str,
) -> Result<Vec<(String, String)>, CrdRenderError> {
    crds.into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let yaml =
                serde_saphyr::to_string(&crd).map_err(|source| CrdRenderError::Yaml { name: name.clone(), source })?;
            Ok((format!("{name}.yaml"), format!("{header}{yaml}")))
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
    write_files(dir, crd_files()?)
}

/// Writes rendered CRD `files` into `dir` (created if missing); returns the paths written.
pub fn write_files(
    dir: &std::path::Path,
    files: Vec<(String, String)>,
) -> Result<Vec<std::path::PathBuf>, CrdRenderError> {
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
