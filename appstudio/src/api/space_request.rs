//! The dev sandbox's SpaceRequest (`toolchain.dev.openshift.com/v1alpha1`), as far as
//! the layer's dev-sandbox provisioner writes and reads it. The sandbox operator owns
//! the real CRD; [`super::fixture_crds`] holds a reduced one for development and
//! tests, where the test plays the operator by writing the status.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, preserve_unknown_fields, require};

/// A request for a namespace in the sandbox, fulfilled by the sandbox operator.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "toolchain.dev.openshift.com",
    version = "v1alpha1",
    kind = "SpaceRequest",
    namespaced,
    status = "SpaceRequestStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A request for a sandbox namespace (development and test fixture of the sandbox operator's CRD).",
    printcolumn = r#"{"name":"Tier","type":"string","jsonPath":".spec.tierName"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[schemars(transform = space_request_required)]
pub struct SpaceRequestSpec {
    /// The tier of the namespace asked for (`appstudio-env`).
    #[serde(rename = "tierName", default)]
    pub tier_name: String,
    /// Cluster roles the target cluster must have.
    #[serde(rename = "targetClusterRoles", default)]
    pub target_cluster_roles: Vec<String>,
}

fn space_request_required(schema: &mut schemars::Schema) {
    require(schema, &["tierName"]);
    preserve_unknown_fields(schema);
}

/// What the sandbox operator reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = preserve_unknown_fields)]
pub struct SpaceRequestStatus {
    /// `Ready` once the namespace exists.
    #[serde(rename = "conditions", default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The API URL of the cluster the namespace is on.
    #[serde(rename = "targetClusterURL", default, skip_serializing_if = "String::is_empty")]
    pub target_cluster_url: String,
    /// The namespaces made, each with the Secret holding its credentials.
    #[serde(rename = "namespaceAccess", default, skip_serializing_if = "Vec::is_empty")]
    pub namespace_access: Vec<NamespaceAccess>,
}

/// One namespace of a SpaceRequest and the Secret (in the request's namespace)
/// with a kubeconfig for it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NamespaceAccess {
    #[serde(rename = "name", default)]
    pub name: String,
    #[serde(rename = "secretRef", default)]
    pub secret_ref: String,
}
