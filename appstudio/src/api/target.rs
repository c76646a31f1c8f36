//! DeploymentTarget, DeploymentTargetClaim and DeploymentTargetClass: clusters
//! bound to claims as PersistentVolumes are to PersistentVolumeClaims, provisioned on
//! demand by the class's provisioner.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, require};

/// A cluster (or a namespace in one) that a DeploymentTargetClaim can bind.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "appstudio.redhat.com",
    version = "v1alpha1",
    kind = "DeploymentTarget",
    namespaced,
    status = "DeploymentTargetStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "dt",
    doc = "A cluster namespace that a DeploymentTargetClaim can bind.",
    printcolumn = r#"{"name":"Class","type":"string","jsonPath":".spec.deploymentTargetClassName"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Claim","type":"string","jsonPath":".spec.claimRef"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[schemars(transform = target_required)]
pub struct DeploymentTargetSpec {
    /// The DeploymentTargetClass.
    #[serde(rename = "deploymentTargetClassName", default)]
    pub deployment_target_class_name: String,
    /// The cluster and its credentials.
    #[serde(rename = "kubernetesCredentials", default)]
    pub kubernetes_credentials: DeploymentTargetKubernetesClusterCredentials,
    /// The DeploymentTargetClaim this target is reserved for or bound to.
    #[serde(rename = "claimRef", default, skip_serializing_if = "Option::is_none")]
    pub claim_ref: Option<String>,
}

fn target_required(schema: &mut schemars::Schema) {
    require(schema, &["deploymentTargetClassName", "kubernetesCredentials"]);
}

/// The cluster, the namespace deployed to and the Secret with the credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = credentials_required)]
pub struct DeploymentTargetKubernetesClusterCredentials {
    /// The namespace deployed to (empty: as the credentials allow).
    #[serde(rename = "defaultNamespace", default)]
    pub default_namespace: String,
    /// The cluster's API server (`https://…`).
    #[serde(rename = "apiURL", default)]
    pub api_url: String,
    /// A Secret of the target's namespace holding the credentials.
    #[serde(rename = "clusterCredentialsSecret", default)]
    pub cluster_credentials_secret: String,
    /// Skip verifying the cluster's TLS certificate.
    #[serde(rename = "allowInsecureSkipTLSVerify", default)]
    pub allow_insecure_skip_tls_verify: bool,
}

fn credentials_required(schema: &mut schemars::Schema) {
    require(schema, &["defaultNamespace", "apiURL", "clusterCredentialsSecret", "allowInsecureSkipTLSVerify"]);
}

/// The target's phase and conditions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DeploymentTargetStatus {
    /// `Pending`, `Available`, `Bound`, `Released` or `Failed`.
    #[serde(rename = "phase", default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// `ErrorOccurred`.
    #[serde(rename = "conditions", default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A request for a DeploymentTarget of a class.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "appstudio.redhat.com",
    version = "v1alpha1",
    kind = "DeploymentTargetClaim",
    namespaced,
    status = "DeploymentTargetClaimStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "dtc",
    doc = "A request for a DeploymentTarget of a class.",
    printcolumn = r#"{"name":"Class","type":"string","jsonPath":".spec.deploymentTargetClassName"}"#,
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".spec.targetName"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[schemars(transform = claim_required)]
pub struct DeploymentTargetClaimSpec {
    /// The DeploymentTargetClass.
    #[serde(rename = "deploymentTargetClassName", default)]
    pub deployment_target_class_name: String,
    /// The DeploymentTarget bound (or wanted).
    #[serde(rename = "targetName", default, skip_serializing_if = "Option::is_none")]
    pub target_name: Option<String>,
}

fn claim_required(schema: &mut schemars::Schema) {
    require(schema, &["deploymentTargetClassName"]);
}

/// The claim's phase and conditions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DeploymentTargetClaimStatus {
    /// `Pending`, `Bound` or `Lost`.
    #[serde(rename = "phase", default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// `ErrorOccurred`.
    #[serde(rename = "conditions", default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A kind of DeploymentTarget: who provisions it and what happens when released.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "appstudio.redhat.com",
    version = "v1alpha1",
    kind = "DeploymentTargetClass",
    status = "DeploymentTargetClassStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "dtcls",
    doc = "A kind of DeploymentTarget: its provisioner and reclaim policy.",
    printcolumn = r#"{"name":"Provisioner","type":"string","jsonPath":".spec.provisioner"}"#,
    printcolumn = r#"{"name":"Reclaim Policy","type":"string","jsonPath":".spec.reclaimPolicy"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[schemars(transform = class_required)]
pub struct DeploymentTargetClassSpec {
    /// Who provisions targets of this class (`appstudio.redhat.com/devsandbox`).
    #[serde(rename = "provisioner", default)]
    pub provisioner: String,
    /// Parameters of the provisioner (none yet).
    #[serde(rename = "parameters", default)]
    pub parameters: DeploymentTargetParameters,
    /// `Delete` (the target goes with its claim) or `Retain`.
    #[serde(rename = "reclaimPolicy", default)]
    pub reclaim_policy: String,
}

fn class_required(schema: &mut schemars::Schema) {
    require(schema, &["provisioner", "reclaimPolicy"]);
}

/// Parameters of a provisioner (an empty object for now).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DeploymentTargetParameters {}

/// A class has no status of its own.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DeploymentTargetClassStatus {}
