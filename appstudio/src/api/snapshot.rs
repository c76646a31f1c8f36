//! Snapshot: one version of an Application, a container image per component.
//! The layer reads only its existence (PromotionRun) and, at apply time, checks that
//! `application` and `components` do not change.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, preserve_unknown_object, require};

/// A set of component images that make up one version of an Application.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "appstudio.redhat.com",
    version = "v1alpha1",
    kind = "Snapshot",
    namespaced,
    status = "SnapshotStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "as",
    shortname = "snapshot",
    doc = "The component images that make up one version of an Application.",
    printcolumn = r#"{"name":"Application","type":"string","jsonPath":".spec.application"}"#,
    printcolumn = r#"{"name":"Display Name","type":"string","jsonPath":".spec.displayName"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[schemars(transform = snapshot_required)]
pub struct SnapshotSpec {
    /// The Application (same namespace).
    #[serde(rename = "application", default)]
    pub application: String,
    /// A name for people.
    #[serde(rename = "displayName", default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// A description for people.
    #[serde(rename = "displayDescription", default, skip_serializing_if = "Option::is_none")]
    pub display_description: Option<String>,
    /// One image per component.
    #[serde(rename = "components", default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<SnapshotComponent>,
    /// Free-form data.
    #[serde(rename = "artifacts", default)]
    pub artifacts: SnapshotArtifacts,
}

fn snapshot_required(schema: &mut schemars::Schema) {
    require(schema, &["application"]);
}

/// A component's image in a Snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = component_required)]
pub struct SnapshotComponent {
    /// The Component's name.
    #[serde(rename = "name", default)]
    pub name: String,
    /// The image.
    #[serde(rename = "containerImage", default)]
    pub container_image: String,
    /// Where the image was built from.
    #[serde(rename = "source", default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ComponentSource>,
}

fn component_required(schema: &mut schemars::Schema) {
    require(schema, &["name", "containerImage"]);
}

/// A component's source (one kind: Git).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ComponentSource {
    /// A Git repository.
    #[serde(rename = "git", default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitSource>,
}

/// A place in a Git repository.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = git_required)]
pub struct GitSource {
    /// The repository.
    #[serde(rename = "url", default)]
    pub url: String,
    /// Branch, tag or commit.
    #[serde(rename = "revision", default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Directory inside the repository.
    #[serde(rename = "context", default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// The devfile's URL.
    #[serde(rename = "devfileUrl", default, skip_serializing_if = "Option::is_none")]
    pub devfile_url: Option<String>,
    /// The Dockerfile's URL.
    #[serde(rename = "dockerfileUrl", default, skip_serializing_if = "Option::is_none")]
    pub dockerfile_url: Option<String>,
}

fn git_required(schema: &mut schemars::Schema) {
    require(schema, &["url"]);
}

/// Free-form data about a Snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotArtifacts {
    /// Any JSON object, kept as it is.
    #[serde(rename = "unstableFields", default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub unstable_fields: Option<serde_json::Value>,
}

/// Conditions other components report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotStatus {
    /// Conditions.
    #[serde(rename = "conditions", default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
