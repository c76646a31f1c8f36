//! GitOpsDeploymentManagedEnvironment: a cluster a tenant deploys to, reached at
//! `apiURL` with the kubeconfig in a Secret of the same namespace.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

/// The condition type that reports whether the writer could use the environment's
/// credentials (and, when connection checks are enabled, reach `apiURL`).
pub const CONNECTION_INITIALIZATION_SUCCEEDED: &str = "ConnectionInitializationSucceeded";

// Checked by `crate::validate::environment`, not by the schema.
/// The cluster and the Secret with its credentials.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "managed-gitops.redhat.com",
    version = "v1alpha1",
    kind = "GitOpsDeploymentManagedEnvironment",
    namespaced,
    status = "GitOpsDeploymentManagedEnvironmentStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "gitopsdeplmenv",
    shortname = "gdme",
    doc = "A cluster that GitOpsDeployments in the same namespace can deploy to.",
    printcolumn = r#"{"name":"API URL","type":"string","jsonPath":".spec.apiURL"}"#,
    printcolumn = r#"{"name":"Connection","type":"string","jsonPath":".status.conditions[?(@.type==\"ConnectionInitializationSucceeded\")].status"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GitOpsDeploymentManagedEnvironmentSpec {
    #[serde(rename = "apiURL", default)]
    pub api_url: String,
    /// Name of a Secret in the same namespace whose `kubeconfig` key holds the credentials.
    #[serde(default)]
    pub credentials_secret: String,
    /// Skip verifying the cluster's TLS certificate.
    #[serde(rename = "allowInsecureSkipTLSVerify", default, skip_serializing_if = "Option::is_none")]
    pub allow_insecure_skip_tls_verify: Option<bool>,
    /// Namespaces the engine may deploy to; empty: all that the credentials reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Vec<String>>,
    /// Whether cluster-scoped resources may be deployed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_resources: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitOpsDeploymentManagedEnvironmentStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
