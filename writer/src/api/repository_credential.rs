//! GitOpsDeploymentRepositoryCredential: credentials for a private Git repository,
//! kept in a Secret of the same namespace.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

// Checked by `crate::validate::repository_credential`, not by the schema.
/// The repository and the Secret with its credentials.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "managed-gitops.redhat.com",
    version = "v1alpha1",
    kind = "GitOpsDeploymentRepositoryCredential",
    namespaced,
    status = "GitOpsDeploymentRepositoryCredentialStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "gitopsdeplrepocred",
    shortname = "gdrc",
    doc = "Credentials for a Git repository, from a Secret in the same namespace.",
    printcolumn = r#"{"name":"Repository","type":"string","jsonPath":".spec.repository"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GitOpsDeploymentRepositoryCredentialSpec {
    /// `https://` or `ssh://` URL of the repository.
    #[serde(default)]
    pub repository: String,
    /// Name of a Secret in the same namespace with `username` and `password`, or `sshPrivateKey`.
    #[serde(default)]
    pub secret: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitOpsDeploymentRepositoryCredentialStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
