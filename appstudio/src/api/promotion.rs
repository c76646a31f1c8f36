//! PromotionRun: a request to deploy a Snapshot to an Environment (manual) or along
//! the Environments' promotion graph (automated), and how far it got.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::require;

/// Promotes a Snapshot of an Application.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "appstudio.redhat.com",
    version = "v1alpha1",
    kind = "PromotionRun",
    namespaced,
    status = "PromotionRunStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "apr",
    shortname = "promotion",
    doc = "Promotes a Snapshot of an Application to an Environment.",
    printcolumn = r#"{"name":"Application","type":"string","jsonPath":".spec.application"}"#,
    printcolumn = r#"{"name":"Snapshot","type":"string","jsonPath":".spec.snapshot"}"#,
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".spec.manualPromotion.targetEnvironment"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Result","type":"string","jsonPath":".status.completionResult"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[schemars(transform = promotion_required)]
pub struct PromotionRunSpec {
    /// The Snapshot to promote (same namespace).
    #[serde(rename = "snapshot", default)]
    pub snapshot: String,
    /// Its Application (same namespace).
    #[serde(rename = "application", default)]
    pub application: String,
    /// Promote to one Environment.
    #[serde(rename = "manualPromotion", default)]
    pub manual_promotion: ManualPromotionConfiguration,
    /// Promote along the Environments' `parentEnvironment` graph.
    #[serde(rename = "automatedPromotion", default)]
    pub automated_promotion: AutomatedPromotionConfiguration,
}

fn promotion_required(schema: &mut schemars::Schema) {
    require(schema, &["snapshot", "application"]);
}

/// The one Environment of a manual promotion.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = manual_required)]
pub struct ManualPromotionConfiguration {
    /// The Environment (same namespace).
    #[serde(rename = "targetEnvironment", default)]
    pub target_environment: String,
}

fn manual_required(schema: &mut schemars::Schema) {
    require(schema, &["targetEnvironment"]);
}

/// Where an automated promotion starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = automated_required)]
pub struct AutomatedPromotionConfiguration {
    /// The first Environment (same namespace).
    #[serde(rename = "initialEnvironment", default)]
    pub initial_environment: String,
}

fn automated_required(schema: &mut schemars::Schema) {
    require(schema, &["initialEnvironment"]);
}

/// How far the promotion got.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = status_required)]
pub struct PromotionRunStatus {
    /// `Active`, `Waiting` or `Complete`.
    #[serde(rename = "state", default)]
    pub state: String,
    /// `Success` or `Failure`, once complete.
    #[serde(rename = "completionResult", default, skip_serializing_if = "Option::is_none")]
    pub completion_result: Option<String>,
    /// One entry per Environment promoted to.
    #[serde(rename = "environmentStatus", default, skip_serializing_if = "Vec::is_empty")]
    pub environment_status: Vec<PromotionRunEnvironmentStatus>,
    /// The bindings the promotion acts on.
    #[serde(rename = "activeBindings", default, skip_serializing_if = "Vec::is_empty")]
    pub active_bindings: Vec<String>,
    /// When the promotion started (RFC 3339).
    #[serde(rename = "promotionStartTime", default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub promotion_start_time: Option<String>,
    /// `ErrorOccurred`.
    #[serde(rename = "conditions", default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<PromotionRunCondition>,
}

fn status_required(schema: &mut schemars::Schema) {
    require(schema, &["state"]);
}

/// The promotion to one Environment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = environment_status_required)]
pub struct PromotionRunEnvironmentStatus {
    /// The step, from 1.
    #[serde(rename = "step", default)]
    pub step: i64,
    /// The Environment.
    #[serde(rename = "environmentName", default)]
    pub environment_name: String,
    /// `Success`, `In Progress` or `Failed`.
    #[serde(rename = "status", default)]
    pub status: String,
    /// What is happening, for people.
    #[serde(rename = "displayStatus", default)]
    pub display_status: String,
}

fn environment_status_required(schema: &mut schemars::Schema) {
    require(schema, &["step", "environmentName", "status", "displayStatus"]);
}

/// A PromotionRun's condition (only `type` and `status` are required).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = promotion_condition_required)]
pub struct PromotionRunCondition {
    /// `ErrorOccurred`.
    #[serde(rename = "type", default)]
    pub type_: String,
    /// Why, for people.
    #[serde(rename = "message", default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the condition was last checked (RFC 3339).
    #[serde(rename = "lastProbeTime", default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub last_probe_time: Option<String>,
    /// When the status last changed (RFC 3339).
    #[serde(rename = "lastTransitionTime", default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub last_transition_time: Option<String>,
    /// `True`, `False` or `Unknown`.
    #[serde(rename = "status", default)]
    pub status: String,
    /// `ErrorOccurred`, or empty.
    #[serde(rename = "reason", default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

fn promotion_condition_required(schema: &mut schemars::Schema) {
    require(schema, &["type", "status"]);
}
