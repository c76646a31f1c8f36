//! Application and Component, as far as the layer reads them. Both belong to the
//! repository generator, which installs their full CRDs; the CRDs generated from
//! these types are fixtures for development and tests and keep unknown fields.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, preserve_unknown_fields, require};

/// An application: a set of Components (the layer reads only its existence).
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "appstudio.redhat.com",
    version = "v1alpha1",
    kind = "Application",
    namespaced,
    status = "ApplicationStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "An application (development and test fixture of the repository generator's CRD).",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[schemars(transform = application_required)]
pub struct ApplicationSpec {
    /// A name for people.
    #[serde(rename = "displayName", default)]
    pub display_name: String,
    /// The repository of the application's model.
    #[serde(rename = "appModelRepository", default, skip_serializing_if = "Option::is_none")]
    pub app_model_repository: Option<ApplicationGitOpsRepository>,
    /// The GitOps repository the repository generator writes to.
    #[serde(rename = "gitOpsRepository", default, skip_serializing_if = "Option::is_none")]
    pub git_ops_repository: Option<ApplicationGitOpsRepository>,
    /// A description for people.
    #[serde(rename = "description", default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

fn application_required(schema: &mut schemars::Schema) {
    require(schema, &["displayName"]);
    preserve_unknown_fields(schema);
}

/// A Git repository, branch and directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ApplicationGitOpsRepository {
    /// The repository.
    #[serde(rename = "url", default)]
    pub url: String,
    /// The branch.
    #[serde(rename = "branch", default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The directory.
    #[serde(rename = "context", default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
}

/// What the repository generator reports about an Application (kept as it is).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = preserve_unknown_fields)]
pub struct ApplicationStatus {
    /// Conditions.
    #[serde(rename = "conditions", default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A component of an Application (the layer reads its name and application).
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "appstudio.redhat.com",
    version = "v1alpha1",
    kind = "Component",
    namespaced,
    status = "ComponentStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A component of an Application (development and test fixture of the repository generator's CRD).",
    printcolumn = r#"{"name":"Application","type":"string","jsonPath":".spec.application"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[schemars(transform = component_required)]
pub struct ComponentSpec {
    /// The component's name inside the Application.
    #[serde(rename = "componentName", default)]
    pub component_name: String,
    /// The Application (same namespace).
    #[serde(rename = "application", default)]
    pub application: String,
    /// Whether the repository generator leaves this component alone.
    #[serde(rename = "skipGitOpsResourceGeneration", default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_git_ops_resource_generation: bool,
}

fn component_required(schema: &mut schemars::Schema) {
    require(schema, &["componentName", "application"]);
    preserve_unknown_fields(schema);
}

/// What the repository generator reports about a Component.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = preserve_unknown_fields)]
pub struct ComponentStatus {
    /// Where its manifests are.
    #[serde(rename = "gitops", default, skip_serializing_if = "Option::is_none")]
    pub gitops: Option<ComponentGitOpsStatus>,
    /// Conditions.
    #[serde(rename = "conditions", default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The Component's GitOps repository.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ComponentGitOpsStatus {
    /// The repository.
    #[serde(rename = "repositoryURL", default)]
    pub repository_url: String,
    /// The branch.
    #[serde(rename = "branch", default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The directory.
    #[serde(rename = "context", default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
}
