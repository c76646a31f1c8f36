//! SnapshotEnvironmentBinding: deploys a Snapshot of an Application to an
//! Environment. The repository generator fills `status.components` (where each
//! component's manifests are); the layer writes the rest of the status.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, EnvVarPair, preserve_unknown_object, require};

/// An Application's Snapshot deployed to an Environment.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "appstudio.redhat.com",
    version = "v1alpha1",
    kind = "SnapshotEnvironmentBinding",
    namespaced,
    status = "SnapshotEnvironmentBindingStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "aseb",
    shortname = "binding",
    doc = "Deploys a Snapshot of an Application to an Environment.",
    printcolumn = r#"{"name":"Application","type":"string","jsonPath":".spec.application"}"#,
    printcolumn = r#"{"name":"Environment","type":"string","jsonPath":".spec.environment"}"#,
    printcolumn = r#"{"name":"Snapshot","type":"string","jsonPath":".spec.snapshot"}"#,
    printcolumn = r#"{"name":"Deployed","type":"string","jsonPath":".status.componentDeploymentConditions[?(@.type==\"AllComponentsDeployed\")].message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[schemars(transform = binding_required)]
pub struct SnapshotEnvironmentBindingSpec {
    /// The Application (same namespace).
    #[serde(rename = "application", default)]
    pub application: String,
    /// The Environment (same namespace).
    #[serde(rename = "environment", default)]
    pub environment: String,
    /// The Snapshot (same namespace).
    #[serde(rename = "snapshot", default)]
    pub snapshot: String,
    /// The components and their configuration (applied by the repository generator).
    #[serde(rename = "components", default)]
    pub components: Vec<BindingComponent>,
}

fn binding_required(schema: &mut schemars::Schema) {
    require(schema, &["application", "environment", "snapshot", "components"]);
}

/// A component of the binding.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = name_required)]
pub struct BindingComponent {
    /// The Component's name.
    #[serde(rename = "name", default)]
    pub name: String,
    /// Its configuration in this Environment.
    #[serde(rename = "configuration", default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<BindingComponentConfiguration>,
}

fn name_required(schema: &mut schemars::Schema) {
    require(schema, &["name"]);
}

/// Replicas, resources and environment variables of a component in one Environment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BindingComponentConfiguration {
    /// Number of replicas.
    #[serde(rename = "replicas", default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Compute resources (a Kubernetes ResourceRequirements).
    #[serde(rename = "resources", default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub resources: Option<serde_json::Value>,
    /// Environment variables.
    #[serde(rename = "env", default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVarPair>,
}

/// What the repository generator and the layer report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotEnvironmentBindingStatus {
    /// Where each component's manifests are (written by the repository generator).
    #[serde(rename = "components", default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<BindingStatusComponent>,
    /// The repository generator's conditions; the last one gates deployment.
    #[serde(rename = "gitopsRepoConditions", default, skip_serializing_if = "Vec::is_empty")]
    pub gitops_repo_conditions: Vec<Condition>,
    /// One entry per component: its GitOpsDeployment and what it reports.
    #[serde(rename = "gitopsDeployments", default, skip_serializing_if = "Vec::is_empty")]
    pub gitops_deployments: Vec<BindingStatusGitOpsDeployment>,
    /// `AllComponentsDeployed`: "N of M components deployed".
    #[serde(rename = "componentDeploymentConditions", default, skip_serializing_if = "Vec::is_empty")]
    pub component_deployment_conditions: Vec<Condition>,
    /// The layer's own conditions (`ErrorOccurred`, `Reconciled`).
    #[serde(rename = "bindingConditions", default, skip_serializing_if = "Vec::is_empty")]
    pub binding_conditions: Vec<Condition>,
}

/// Where a component's manifests for this Environment are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = status_component_required)]
pub struct BindingStatusComponent {
    /// The Component's name.
    #[serde(rename = "name", default)]
    pub name: String,
    /// The Route the repository generator made, if any.
    #[serde(rename = "generatedRouteName", default, skip_serializing_if = "Option::is_none")]
    pub generated_route_name: Option<String>,
    /// The repository, branch and path.
    #[serde(rename = "gitopsRepository", default)]
    pub gitops_repository: BindingComponentGitOpsRepository,
}

fn status_component_required(schema: &mut schemars::Schema) {
    require(schema, &["name", "gitopsRepository"]);
}

/// A component's manifests in the GitOps repository.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = repository_required)]
pub struct BindingComponentGitOpsRepository {
    /// The repository.
    #[serde(rename = "url", default)]
    pub url: String,
    /// The branch.
    #[serde(rename = "branch", default)]
    pub branch: String,
    /// The directory (the Environment's overlay).
    #[serde(rename = "path", default)]
    pub path: String,
    /// The files the repository generator wrote.
    #[serde(rename = "generatedResources", default)]
    pub generated_resources: Vec<String>,
    /// The commit the repository generator made.
    #[serde(rename = "commitID", default)]
    pub commit_id: String,
}

fn repository_required(schema: &mut schemars::Schema) {
    require(schema, &["url", "branch", "path", "generatedResources", "commitID"]);
}

/// A component's GitOpsDeployment and what it reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = deployment_status_required)]
pub struct BindingStatusGitOpsDeployment {
    /// The Component's name.
    #[serde(rename = "componentName", default)]
    pub component_name: String,
    /// The GitOpsDeployment's name.
    #[serde(rename = "gitopsDeployment", default)]
    pub gitops_deployment: String,
    /// Its sync status (`Synced`, `OutOfSync`, …).
    #[serde(rename = "syncStatus", default)]
    pub sync_status: String,
    /// Its health (`Healthy`, `Progressing`, …).
    #[serde(rename = "health", default)]
    pub health: String,
    /// The commit it is synced to.
    #[serde(rename = "commitID", default)]
    pub commit_id: String,
}

fn deployment_status_required(schema: &mut schemars::Schema) {
    require(schema, &["componentName"]);
}
