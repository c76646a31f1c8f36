//! Test knobs: annotations on an Application that make the stand-in misbehave the
//! way a real Argo CD can (degraded workloads, unreadable repositories, failing or
//! stuck syncs, stuck deletions), so the service's handling of each can be tested
//! without a cluster that actually fails. The convention is documented in the
//! module documentation of `argocd`; unknown values are ignored with a warning.

use std::collections::BTreeMap;

/// Prefix of every knob annotation.
pub const KNOB_PREFIX: &str = "standin.gitops.test/";
/// Health status to report (`Healthy`, `Progressing`, `Degraded`, `Suspended`, `Missing`, `Unknown`).
pub const HEALTH: &str = "standin.gitops.test/health";
/// Message for a non-Healthy health status (a default is made up when absent).
pub const HEALTH_MESSAGE: &str = "standin.gitops.test/health-message";
/// Non-empty: comparison fails with this message (condition `ComparisonError`, sync `Unknown`).
pub const COMPARISON_ERROR: &str = "standin.gitops.test/comparison-error";
/// `fail`: syncs end `Failed`; `hold`: syncs stay `Running` until changed (e.g. to `release`) or removed.
pub const SYNC: &str = "standin.gitops.test/sync";
/// Message of a failed sync (a default is used when absent).
pub const SYNC_MESSAGE: &str = "standin.gitops.test/sync-message";
/// `hang`: the resources finalizer is never removed (condition `DeletionError`).
pub const FINALIZER: &str = "standin.gitops.test/finalizer";

/// `unreachable`: a destination that is not on loopback counts as not answering
/// (loopback destinations are probed instead); `reachable` (the default): it answers.
pub const DESTINATION: &str = "standin.gitops.test/destination";

/// The health statuses Argo CD reports.
const HEALTH_STATUSES: [&str; 6] = ["Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"];

/// How syncs of one Application behave.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SyncKnob {
    /// Syncs succeed.
    #[default]
    Succeed,
    /// Syncs end `Failed`, and the comparison says `OutOfSync`.
    Fail,
    /// Syncs stay `Running` until the knob changes.
    Hold,
}

/// The knobs set on one Application.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Knobs {
    /// Health status to report instead of `Healthy`.
    pub health: Option<String>,
    pub health_message: Option<String>,
    pub comparison_error: Option<String>,
    pub sync: SyncKnob,
    pub sync_message: Option<String>,
    pub finalizer_hangs: bool,
    /// A destination off loopback counts as not answering.
    pub destination_unreachable: bool,
    /// Knob annotations with a value the stand-in does not know, for a warning.
    pub unknown: Vec<String>,
}

impl Knobs {
    /// Reads the knobs from an Application's annotations.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Self {
        let mut knobs = Knobs::default();
        for (key, value) in annotations.iter().filter(|(key, _)| key.starts_with(KNOB_PREFIX)) {
            let value = value.trim();
            match key.as_str() {
                HEALTH => match HEALTH_STATUSES.iter().find(|status| status.eq_ignore_ascii_case(value)) {
                    Some(status) => knobs.health = Some((*status).to_owned()),
                    None => knobs.unknown.push(format!("{key}={value}")),
                },
                HEALTH_MESSAGE if !value.is_empty() => knobs.health_message = Some(value.to_owned()),
                COMPARISON_ERROR if !value.is_empty() => knobs.comparison_error = Some(value.to_owned()),
                SYNC => match value.to_ascii_lowercase().as_str() {
                    "fail" => knobs.sync = SyncKnob::Fail,
                    "hold" => knobs.sync = SyncKnob::Hold,
                    "release" | "succeed" | "" => knobs.sync = SyncKnob::Succeed,
                    _ => knobs.unknown.push(format!("{key}={value}")),
                },
                SYNC_MESSAGE if !value.is_empty() => knobs.sync_message = Some(value.to_owned()),
                FINALIZER => match value.to_ascii_lowercase().as_str() {
                    "hang" => knobs.finalizer_hangs = true,
                    "" | "release" => {}
                    _ => knobs.unknown.push(format!("{key}={value}")),
                },
                DESTINATION => match value.to_ascii_lowercase().as_str() {
                    "unreachable" => knobs.destination_unreachable = true,
                    "reachable" | "" => {}
                    _ => knobs.unknown.push(format!("{key}={value}")),
                },
                HEALTH_MESSAGE | COMPARISON_ERROR | SYNC_MESSAGE => {}
                _ => knobs.unknown.push(key.clone()),
            }
        }
        knobs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn reads_every_knob() {
        let knobs = Knobs::from_annotations(&annotations(&[
            (HEALTH, "degraded"),
            (HEALTH_MESSAGE, "pods crash"),
            (COMPARISON_ERROR, "repo unreachable"),
            (SYNC, "Hold"),
            (FINALIZER, "hang"),
            (DESTINATION, "Unreachable"),
            ("other.example/annotation", "x"),
        ]));
        assert_eq!(knobs.health.as_deref(), Some("Degraded"));
        assert_eq!(knobs.health_message.as_deref(), Some("pods crash"));
        assert_eq!(knobs.comparison_error.as_deref(), Some("repo unreachable"));
        assert_eq!(knobs.sync, SyncKnob::Hold);
        assert!(knobs.finalizer_hangs);
        assert!(knobs.destination_unreachable);
        assert!(knobs.unknown.is_empty());
    }

    #[test]
    fn unknown_values_are_reported_not_applied() {
        let knobs = Knobs::from_annotations(&annotations(&[
            (HEALTH, "Sad"),
            (SYNC, "sometimes"),
            ("standin.gitops.test/typo", "1"),
            (COMPARISON_ERROR, "  "),
        ]));
        assert_eq!(knobs.health, None);
        assert_eq!(knobs.sync, SyncKnob::Succeed);
        assert_eq!(knobs.comparison_error, None);
        assert_eq!(knobs.unknown.len(), 3);
        assert_eq!(Knobs::from_annotations(&annotations(&[(SYNC, "release")])).sync, SyncKnob::Succeed);
    }
}
