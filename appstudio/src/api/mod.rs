//! The AppStudio API, `appstudio.redhat.com/v1alpha1`, as Rust types from which its
//! CustomResourceDefinitions are generated (`gitopsctl crds`, checked in under
//! `ops/crds/appstudio/`, never edited by hand).
//!
//! The original service defined these types in Go, where a field without
//! `omitempty` is always written (`""`, `false`, `{}`) and its CRD marks it
//! required. Clients written against the original therefore rely on those fields
//! being present, and the CRD refuses objects without them: every such field here is
//! always serialised and listed as required. Every JSON name is spelled out with
//! `rename`, because the original's are not consistently camelCase (`apiURL`,
//! `commitID`, `gitopsRepository`, `syncStatus`, …).
//!
//! Application and Component belong to the repository generator, SpaceRequest to
//! the sandbox operator, which install their CRDs; [`fixture_crds`] holds reduced
//! versions for development and tests only, never to be applied over the real ones (a reduced schema would prune their
//! fields).

mod application;
mod binding;
mod environment;
mod promotion;
mod snapshot;
mod space_request;
mod target;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use application::{
    Application, ApplicationGitOpsRepository, ApplicationSpec, ApplicationStatus, Component, ComponentGitOpsStatus,
    ComponentSpec, ComponentStatus,
};
pub use binding::{
    BindingComponent, BindingComponentConfiguration, BindingComponentGitOpsRepository, BindingStatusComponent,
    BindingStatusGitOpsDeployment, SnapshotEnvironmentBinding, SnapshotEnvironmentBindingSpec,
    SnapshotEnvironmentBindingStatus,
};
pub use environment::{
    DeploymentTargetClaimConfig, EnvVarPair, Environment, EnvironmentConfiguration, EnvironmentSpec, EnvironmentStatus,
    EnvironmentTarget, KubernetesClusterCredentials, UnstableEnvironmentConfiguration,
};
pub use promotion::{
    AutomatedPromotionConfiguration, ManualPromotionConfiguration, PromotionRun, PromotionRunCondition,
    PromotionRunEnvironmentStatus, PromotionRunSpec, PromotionRunStatus,
};
pub use snapshot::{
    ComponentSource, GitSource, Snapshot, SnapshotArtifacts, SnapshotComponent, SnapshotSpec, SnapshotStatus,
};
pub use space_request::{NamespaceAccess, SpaceRequest, SpaceRequestSpec, SpaceRequestStatus};
pub use target::{
    DeploymentTarget, DeploymentTargetClaim, DeploymentTargetClaimSpec, DeploymentTargetClaimStatus,
    DeploymentTargetClass, DeploymentTargetClassSpec, DeploymentTargetClassStatus,
    DeploymentTargetKubernetesClusterCredentials, DeploymentTargetParameters, DeploymentTargetSpec,
    DeploymentTargetStatus,
};

/// The API group of the AppStudio resources.
pub const GROUP: &str = "appstudio.redhat.com";
/// Their version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of every AppStudio resource.
pub const API_VERSION: &str = "appstudio.redhat.com/v1alpha1";

/// A status condition as Kubernetes' `metav1.Condition`: every field but
/// `observedGeneration` is required and always sent (`message` may be empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = condition_required)]
pub struct Condition {
    /// What the condition speaks of (`Reconciled`, `ErrorOccurred`, …).
    #[serde(rename = "type", default)]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[serde(rename = "status", default)]
    pub status: String,
    /// Why, as one CamelCase word.
    #[serde(rename = "reason", default)]
    pub reason: String,
    /// Why, for a person (may be empty).
    #[serde(rename = "message", default)]
    pub message: String,
    /// RFC 3339 time of the last change of status, reason or message.
    #[serde(rename = "lastTransitionTime", default)]
    #[schemars(extend("format" = "date-time"))]
    pub last_transition_time: String,
    /// The generation the condition speaks of.
    #[serde(rename = "observedGeneration", default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

fn condition_required(schema: &mut schemars::Schema) {
    require(schema, &["type", "status", "reason", "message", "lastTransitionTime"]);
}

/// The core API's helper: the same rule for required properties and defaults.
pub(crate) use gitops_writer::api::require;

/// Schema of a field holding any JSON object, kept as it is.
fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Lets an object schema keep fields it does not declare (fixture CRDs of resources
/// other components own).
fn preserve_unknown_fields(schema: &mut schemars::Schema) {
    schema.ensure_object().insert("x-kubernetes-preserve-unknown-fields".to_owned(), serde_json::Value::Bool(true));
}

/// The CRDs of the AppStudio layer's own resources, in a fixed order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        Environment::crd(),
        Snapshot::crd(),
        SnapshotEnvironmentBinding::crd(),
        PromotionRun::crd(),
        DeploymentTarget::crd(),
        DeploymentTargetClaim::crd(),
        DeploymentTargetClass::crd(),
    ]
}

/// Reduced CRDs of Application, Component (the repository generator's) and
/// SpaceRequest (the sandbox operator's), for development and tests only.
pub fn fixture_crds() -> Vec<CustomResourceDefinition> {
    vec![Application::crd(), Component::crd(), SpaceRequest::crd()]
}

/// Why the CRD YAML could not be rendered or written (the core's: both are rendered alike).
pub use gitops_writer::api::CrdRenderError;

/// The first line of every generated file.
pub const CRD_FILE_HEADER: &str = "# Generated from appstudio/src/api by `gitopsctl crds`; do not edit.\n";

/// Where, under the core CRDs' directory, the layer's CRDs are written.
pub const CRD_SUBDIR: &str = "appstudio";
/// Where, under the core CRDs' directory, the fixture CRDs are written.
pub const FIXTURE_CRD_SUBDIR: &str = "appstudio-fixtures";

/// `crds` as files: (`<plural>.<group>.yaml`, YAML text).
pub fn render_crd_files(crds: Vec<CustomResourceDefinition>) -> Result<Vec<(String, String)>, CrdRenderError> {
    gitops_writer::api::render_crd_files(crds, CRD_FILE_HEADER)
}

/// Writes [`crds`] into `<dir>/appstudio` and [`fixture_crds`] into
/// `<dir>/appstudio-fixtures` (created if missing); returns the paths written.
pub fn write_crd_files(dir: &std::path::Path) -> Result<Vec<std::path::PathBuf>, CrdRenderError> {
    let mut written = Vec::new();
    for (subdir, crds) in [(CRD_SUBDIR, crds()), (FIXTURE_CRD_SUBDIR, fixture_crds())] {
        written.extend(gitops_writer::api::write_files(&dir.join(subdir), render_crd_files(crds)?)?);
    }
    Ok(written)
}

#[cfg(test)]
mod tests;
