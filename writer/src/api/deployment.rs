//! GitOpsDeployment: a tenant's request to deploy a path of a Git repository to a
//! destination, and the status the writer reports back from the engine.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, pattern, preserve_unknown_object, require};
use crate::validate::limits;

// The schema refuses what it can express; `crate::validate::deployment` holds every
// rule (the webhook and the controller run it).
/// What to deploy and where.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "managed-gitops.redhat.com",
    version = "v1alpha1",
    kind = "GitOpsDeployment",
    namespaced,
    status = "GitOpsDeploymentStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "gitopsdepl",
    shortname = "gd",
    doc = "A Git repository path deployed to a destination by the GitOps service.",
    printcolumn = r#"{"name":"Sync Status","type":"string","jsonPath":".status.sync.status"}"#,
    printcolumn = r#"{"name":"Health Status","type":"string","jsonPath":".status.health.status"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = spec_required)]
pub struct GitOpsDeploymentSpec {
    /// The Git repository, the path inside it and the revision to deploy.
    #[serde(default)]
    pub source: DeploymentSource,
    /// Where to deploy; absent: the deployment's own namespace.
    #[serde(default)]
    pub destination: DeploymentDestination,
    /// `automated` (sync on every change) or `manual` (sync on a GitOpsDeploymentSyncRun).
    #[serde(rename = "type", default)]
    #[schemars(extend("enum" = ["automated", "manual"]))]
    pub type_: String,
    /// How the engine syncs; only sync options are accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_policy: Option<SyncPolicy>,
    /// Set by the service (the Argo CD project of the tenant); refused when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub project: Option<String>,
}

fn spec_required(schema: &mut schemars::Schema) {
    require(schema, &["source", "type"]);
}

fn source_required(schema: &mut schemars::Schema) {
    require(schema, &["repoURL", "path"]);
}

/// The Git source: repository, path inside it and revision.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = source_required)]
pub struct DeploymentSource {
    /// The Git repository: `https://host/path`, `ssh://[user@]host[:port]/path`,
    /// `git://host/path` or `user@host:path`; no password in it.
    #[serde(rename = "repoURL", default)]
    #[schemars(length(min = 1, max = limits::URL), pattern(pattern::REPOSITORY_URL))]
    pub repo_url: String,
    /// The directory inside the repository, relative to its root (`.` is the root);
    /// no `..` segment.
    #[serde(default)]
    #[schemars(length(min = 1, max = limits::PATH), pattern(pattern::PATH))]
    pub path: String,
    /// Branch, tag or commit; `HEAD` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = limits::REVISION), pattern(pattern::REVISION_OR_EMPTY))]
    pub target_revision: Option<String>,
}

/// Where to deploy: a GitOpsDeploymentManagedEnvironment in the same namespace
/// (absent: the tenant's own namespace on the home cluster) and a namespace there.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentDestination {
    /// Name of a GitOpsDeploymentManagedEnvironment in the same namespace; absent:
    /// the deployment's own namespace on the service's cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = limits::DNS_SUBDOMAIN), pattern(pattern::DNS_SUBDOMAIN_OR_EMPTY))]
    pub environment: Option<String>,
    /// The namespace to deploy into; without an environment it must be the
    /// deployment's own namespace (or absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = limits::DNS_LABEL), pattern(pattern::DNS_LABEL_OR_EMPTY))]
    pub namespace: Option<String>,
    /// Set by the service from the environment; refused when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = limits::URL))]
    pub server: Option<String>,
    /// Set by the service from the environment; refused when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = limits::DNS_SUBDOMAIN))]
    pub name: Option<String>,
}

/// Sync options; only `CreateNamespace=true|false` is accepted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncPolicy {
    /// `CreateNamespace=true` (the engine creates the destination namespace) or
    /// `CreateNamespace=false`.
    #[serde(default)]
    #[schemars(length(max = limits::SYNC_OPTIONS), transform = sync_option_values)]
    pub sync_options: Vec<String>,
}

fn sync_option_values(schema: &mut schemars::Schema) {
    if let Some(items) = schema.get_mut("items").and_then(|i| i.as_object_mut()) {
        items.insert("enum".to_owned(), serde_json::json!(["CreateNamespace=true", "CreateNamespace=false"]));
    }
}

/// What the engine reports, as the writer last patched it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitOpsDeploymentStatus {
    /// `Ready`, `Reconciling`, `Stalled` and `ErrorOccurred`, each with its reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Whether the deployed objects match the repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<DeploymentSync>,
    /// The deployed objects' combined health.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<DeploymentHealth>,
    /// The objects deployed, each with its sync and health.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<DeploymentResource>,
    /// The source and destination the engine last compared against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciled_state: Option<ReconciledState>,
    /// The engine's last operation (a sync), as it reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub operation_state: Option<serde_json::Value>,
    /// The generation of the spec this status speaks of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Sync status (`Synced`, `OutOfSync`, `Unknown`) and the revision compared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentSync {
    /// `Synced`, `OutOfSync` or `Unknown`.
    #[serde(default)]
    pub status: String,
    /// The commit compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

/// Health status (`Healthy`, `Progressing`, `Degraded`, …) and its message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentHealth {
    /// `Healthy`, `Progressing`, `Degraded`, `Suspended`, `Missing` or `Unknown`.
    #[serde(default)]
    pub status: String,
    /// Why, when the engine says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One deployed object with its sync and health.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentResource {
    /// The object's API group (empty: the core group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The object's API version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The object's kind.
    #[serde(default)]
    pub kind: String,
    /// The object's namespace (absent: cluster-scoped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The object's name.
    #[serde(default)]
    pub name: String,
    /// The object's sync status (`Synced`, `OutOfSync`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// The object's health.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<DeploymentHealth>,
}

/// The source and destination the engine last compared against.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReconciledState {
    /// The source compared.
    #[serde(default)]
    pub source: ReconciledSource,
    /// The destination compared.
    #[serde(default)]
    pub destination: ReconciledDestination,
}

// Separate from `DeploymentSource`/`DeploymentDestination`: what the engine reports
// is written as it came, so the spec's required fields and patterns do not apply.
/// The source the engine compared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReconciledSource {
    /// The repository.
    #[serde(rename = "repoURL", default)]
    pub repo_url: String,
    /// The path inside it.
    #[serde(default)]
    pub path: String,
    /// The revision asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_revision: Option<String>,
}

/// The destination the engine compared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReconciledDestination {
    /// The GitOpsDeploymentManagedEnvironment (absent: the deployment's own namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    /// The namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}
