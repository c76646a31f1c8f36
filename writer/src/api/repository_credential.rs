//! GitOpsDeploymentRepositoryCredential: credentials for a private Git repository,
//! kept in a Secret of the same namespace.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, pattern, require};
use crate::validate::limits;

// The schema refuses what it can express; `crate::validate::repository_credential`
// holds every rule (the webhook and the controller run it).
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
#[schemars(transform = credential_required)]
pub struct GitOpsDeploymentRepositoryCredentialSpec {
    /// `https://` or `ssh://` URL of the repository.
    #[serde(default)]
    #[schemars(length(min = 1, max = limits::URL), pattern(pattern::CREDENTIAL_URL))]
    pub repository: String,
    /// Name of a Secret in the same namespace with `username` and `password`, or `sshPrivateKey`.
    #[serde(default)]
    #[schemars(length(min = 1, max = limits::DNS_SUBDOMAIN), pattern(pattern::DNS_SUBDOMAIN))]
    pub secret: String,
}

fn credential_required(schema: &mut schemars::Schema) {
    require(schema, &["repository", "secret"]);
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
/// What the writer found.
#[serde(rename_all = "camelCase")]
pub struct GitOpsDeploymentRepositoryCredentialStatus {
    /// `Ready`, `ErrorOccurred`, and `ValidRepositoryURL` and `ValidRepositoryCredential`
    /// (what validating the credentials against the repository found), each with its reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation of the spec this status speaks of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
