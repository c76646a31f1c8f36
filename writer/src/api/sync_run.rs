//! GitOpsDeploymentSyncRun: a one-shot request to sync a manual GitOpsDeployment
//! to a revision; deleting it terminates a sync still running.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

// Checked by `crate::validate::sync_run`, not by the schema.
/// Which deployment to sync, and to what revision.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "managed-gitops.redhat.com",
    version = "v1alpha1",
    kind = "GitOpsDeploymentSyncRun",
    namespaced,
    status = "GitOpsDeploymentSyncRunStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "gitopsdeplsyncrun",
    shortname = "gdsr",
    doc = "A request to sync a manual GitOpsDeployment to a revision.",
    printcolumn = r#"{"name":"Deployment","type":"string","jsonPath":".spec.gitopsDeploymentName"}"#,
    printcolumn = r#"{"name":"Revision","type":"string","jsonPath":".spec.revisionID"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GitOpsDeploymentSyncRunSpec {
    #[serde(default)]
    pub gitops_deployment_name: String,
    #[serde(rename = "revisionID", default)]
    pub revision_id: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitOpsDeploymentSyncRunStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
