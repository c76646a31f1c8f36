//! Environment: a place an Application is deployed to — a cluster reached with
//! credentials, a DeploymentTargetClaim, or (with neither) the namespace itself.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, require};

/// Where and how an Application is deployed.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "appstudio.redhat.com",
    version = "v1alpha1",
    kind = "Environment",
    namespaced,
    status = "EnvironmentStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "env",
    doc = "A deployment environment (a cluster, a DeploymentTargetClaim or the namespace itself).",
    printcolumn = r#"{"name":"Display Name","type":"string","jsonPath":".spec.displayName"}"#,
    printcolumn = r#"{"name":"Claim","type":"string","jsonPath":".spec.configuration.target.deploymentTargetClaim.claimName"}"#,
    printcolumn = r#"{"name":"API URL","type":"string","jsonPath":".spec.unstableConfigurationFields.apiURL"}"#,
    printcolumn = r#"{"name":"Reconciled","type":"string","jsonPath":".status.conditions[?(@.type==\"Reconciled\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[schemars(transform = environment_required)]
pub struct EnvironmentSpec {
    /// Deprecated: `POC` or `Non-POC`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// A name for people; not used by the service.
    #[serde(rename = "displayName", default)]
    pub display_name: String,
    /// `Manual` or `AppStudioAutomated`.
    #[serde(rename = "deploymentStrategy", default)]
    pub deployment_strategy: String,
    /// The Environment a Snapshot is promoted from before this one.
    #[serde(rename = "parentEnvironment", default, skip_serializing_if = "Option::is_none")]
    pub parent_environment: Option<String>,
    /// Free-form tags.
    #[serde(rename = "tags", default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Environment variables (applied by the repository generator) and the target claim.
    #[serde(rename = "configuration", default)]
    pub configuration: EnvironmentConfiguration,
    /// A cluster reached with credentials (absent: no cluster of its own).
    #[serde(rename = "unstableConfigurationFields", default, skip_serializing_if = "Option::is_none")]
    pub unstable_configuration_fields: Option<UnstableEnvironmentConfiguration>,
}

fn environment_required(schema: &mut schemars::Schema) {
    require(schema, &["displayName", "deploymentStrategy"]);
}

/// What the repository generator applies, and the claim of a DeploymentTarget.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EnvironmentConfiguration {
    /// Environment variables of every component deployed here.
    #[serde(rename = "env", default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVarPair>,
    /// The DeploymentTargetClaim deployed to (its `claimName` empty: none).
    #[serde(rename = "target", default)]
    pub target: EnvironmentTarget,
}

/// One environment variable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = env_var_required)]
pub struct EnvVarPair {
    /// The variable's name.
    #[serde(rename = "name", default)]
    pub name: String,
    /// Its value.
    #[serde(rename = "value", default)]
    pub value: String,
}

fn env_var_required(schema: &mut schemars::Schema) {
    require(schema, &["name", "value"]);
}

/// The DeploymentTargetClaim an Environment deploys to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = target_required)]
pub struct EnvironmentTarget {
    /// The claim.
    #[serde(rename = "deploymentTargetClaim", default)]
    pub deployment_target_claim: DeploymentTargetClaimConfig,
}

fn target_required(schema: &mut schemars::Schema) {
    require(schema, &["deploymentTargetClaim"]);
}

/// Names a DeploymentTargetClaim of the Environment's namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = claim_config_required)]
pub struct DeploymentTargetClaimConfig {
    /// The claim's name; empty: none.
    #[serde(rename = "claimName", default)]
    pub claim_name: String,
}

fn claim_config_required(schema: &mut schemars::Schema) {
    require(schema, &["claimName"]);
}

/// A cluster reached with credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UnstableEnvironmentConfiguration {
    /// `Kubernetes` or `OpenShift`.
    #[serde(rename = "clusterType", default, skip_serializing_if = "Option::is_none")]
    pub cluster_type: Option<String>,
    /// The cluster and its credentials (inline).
    #[serde(flatten)]
    pub kubernetes_credentials: KubernetesClusterCredentials,
}

/// The cluster, the namespace deployed to and the Secret with the credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = credentials_required)]
pub struct KubernetesClusterCredentials {
    /// The namespace the components are deployed to.
    #[serde(rename = "targetNamespace", default)]
    pub target_namespace: String,
    /// The cluster's API server (`https://…`).
    #[serde(rename = "apiURL", default)]
    pub api_url: String,
    /// The cluster's ingress domain (needed for `Kubernetes` clusters).
    #[serde(rename = "ingressDomain", default, skip_serializing_if = "Option::is_none")]
    pub ingress_domain: Option<String>,
    /// A Secret of the Environment's namespace holding the credentials (a kubeconfig).
    #[serde(rename = "clusterCredentialsSecret", default)]
    pub cluster_credentials_secret: String,
    /// Skip verifying the cluster's TLS certificate.
    #[serde(rename = "allowInsecureSkipTLSVerify", default)]
    pub allow_insecure_skip_tls_verify: bool,
    /// Namespaces the GitOps engine may deploy to (empty: all the credentials reach).
    #[serde(rename = "namespaces", default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Whether cluster-scoped resources may be deployed.
    #[serde(rename = "clusterResources", default, skip_serializing_if = "std::ops::Not::not")]
    pub cluster_resources: bool,
}

fn credentials_required(schema: &mut schemars::Schema) {
    require(schema, &["targetNamespace", "apiURL", "clusterCredentialsSecret", "allowInsecureSkipTLSVerify"]);
}

/// What the controller found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EnvironmentStatus {
    /// Present only after an error (`ErrorOccurred`, `Reconciled`).
    #[serde(rename = "conditions", default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl EnvironmentSpec {
    /// The claim's name, if one is set.
    pub fn claim_name(&self) -> Option<&str> {
        let name = self.configuration.target.deployment_target_claim.claim_name.as_str();
        (!name.is_empty()).then_some(name)
    }
}
