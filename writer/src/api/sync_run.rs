//! GitOpsDeploymentSyncRun: a one-shot request to sync a manual GitOpsDeployment
//! to a revision; deleting it terminates a sync still running.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, pattern, require};
use crate::validate::limits;

// The schema refuses what it can express; `crate::validate::sync_run` holds every
// rule (the webhook and the controller run it).
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
#[schemars(transform = sync_run_required)]
pub struct GitOpsDeploymentSyncRunSpec {
    /// The manual GitOpsDeployment in the same namespace to sync.
    #[serde(default)]
    #[schemars(length(min = 1, max = limits::DNS_SUBDOMAIN), pattern(pattern::DNS_SUBDOMAIN))]
    pub gitops_deployment_name: String,
    /// The branch, tag or commit to sync to.
    #[serde(rename = "revisionID", default)]
    #[schemars(length(min = 1, max = limits::REVISION), pattern(pattern::REVISION))]
    pub revision_id: String,
}

fn sync_run_required(schema: &mut schemars::Schema) {
    require(schema, &["gitopsDeploymentName", "revisionID"]);
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
/// What the writer and the engine report.
#[serde(rename_all = "camelCase")]
pub struct GitOpsDeploymentSyncRunStatus {
    /// `Ready` (and the kind's own conditions), each with its reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation of the spec this status speaks of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
