//! GitOpsDeploymentManagedEnvironment: a cluster a tenant deploys to, reached at
//! `apiURL` with the kubeconfig in a Secret of the same namespace.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, pattern, require};
use crate::validate::limits;

/// The condition type that reports whether the writer could use the environment's
/// credentials (and, when connection checks are enabled, reach `apiURL`).
pub const CONNECTION_INITIALIZATION_SUCCEEDED: &str = "ConnectionInitializationSucceeded";

// The schema refuses what it can express; `crate::validate::environment` holds
// every rule (the webhook and the controller run it).
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
#[schemars(transform = environment_required)]
pub struct GitOpsDeploymentManagedEnvironmentSpec {
    /// The cluster's API server: `https://host[:port][/path]`, no user, query or fragment.
    #[serde(rename = "apiURL", default)]
    #[schemars(length(min = 1, max = limits::URL), pattern(pattern::API_URL))]
    pub api_url: String,
    /// Name of a Secret in the same namespace whose `kubeconfig` key holds the credentials.
    #[serde(default)]
    #[schemars(length(min = 1, max = limits::DNS_SUBDOMAIN), pattern(pattern::DNS_SUBDOMAIN))]
    pub credentials_secret: String,
    /// Skip verifying the cluster's TLS certificate.
    #[serde(rename = "allowInsecureSkipTLSVerify", default, skip_serializing_if = "Option::is_none")]
    pub allow_insecure_skip_tls_verify: Option<bool>,
    /// Namespaces the engine may deploy to; empty: all that the credentials reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = limits::NAMESPACES), inner(length(max = limits::DNS_LABEL), pattern(pattern::DNS_LABEL)))]
    pub namespaces: Option<Vec<String>>,
    /// Whether cluster-scoped resources may be deployed to this environment. Only
    /// to it: its deployments get an Argo CD project of their own that permits
    /// them, while every other destination of the namespace stays without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_resources: Option<bool>,
    /// Install, with the Secret's credentials, a ServiceAccount of the service's own on
    /// the cluster (with a Role in each of `namespaces`, or a ClusterRole when
    /// `clusterResources` is true) and deploy with its token, renewed before it
    /// expires, instead of the Secret's credentials; removed when the environment is
    /// deleted. `namespaces` is required unless `clusterResources` is true, and the
    /// operator must allow the writer to contact `apiURL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_new_service_account: Option<bool>,
}

fn environment_required(schema: &mut schemars::Schema) {
    require(schema, &["apiURL", "credentialsSecret"]);
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
/// What the writer found.
#[serde(rename_all = "camelCase")]
pub struct GitOpsDeploymentManagedEnvironmentStatus {
    /// `Ready` (and the kind's own conditions), each with its reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation of the spec this status speaks of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
