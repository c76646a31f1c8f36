//! GitOpsDeployment: a tenant's request to deploy a path of a Git repository to a
//! destination, and the status the writer reports back from the engine.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, preserve_unknown_object};

// Every field is checked by `crate::validate::deployment`, not by the schema.
/// What to deploy and where.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "managed-gitops.redhat.com",
    version = "v1alpha1",
    kind = "GitOpsDeployment",
    namespaced,
    status = "GitOpsDeploymentStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "gitopsdepl",
    shortname = "gd",
    doc = "A Git repository path deployed to a destination by the GitOps service.",
    printcolumn = r#"{"name":"Sync Status","type":"string","jsonPath":".status.sync.status"}"#,
    printcolumn = r#"{"name":"Health Status","type":"string","jsonPath":".status.health.status"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GitOpsDeploymentSpec {
    #[serde(default)]
    pub source: DeploymentSource,
    #[serde(default)]
    pub destination: DeploymentDestination,
    /// `automated` (sync on every change) or `manual` (sync on a GitOpsDeploymentSyncRun).
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_policy: Option<SyncPolicy>,
}

/// The Git source: repository, path inside it and revision.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentSource {
    #[serde(rename = "repoURL", default)]
    pub repo_url: String,
    #[serde(default)]
    pub path: String,
    /// Branch, tag or commit; `HEAD` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_revision: Option<String>,
}

/// Where to deploy: a GitOpsDeploymentManagedEnvironment in the same namespace
/// (absent: the tenant's own namespace on the home cluster) and a namespace there.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentDestination {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Sync options; only `CreateNamespace=true|false` is accepted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncPolicy {
    #[serde(default)]
    pub sync_options: Vec<String>,
}

/// What the engine reports, as the writer last patched it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitOpsDeploymentStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<DeploymentSync>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<DeploymentHealth>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<DeploymentResource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciled_state: Option<ReconciledState>,
    /// The engine's last operation (a sync), as it reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub operation_state: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Sync status (`Synced`, `OutOfSync`, `Unknown`) and the revision compared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentSync {
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

/// Health status (`Healthy`, `Progressing`, `Degraded`, …) and its message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentHealth {
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One deployed object with its sync and health.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentResource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<DeploymentHealth>,
}

/// The source and destination the engine last compared against.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReconciledState {
    #[serde(default)]
    pub source: DeploymentSource,
    #[serde(default)]
    pub destination: DeploymentDestination,
}
