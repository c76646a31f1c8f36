//! The controller's check of the Snapshot a binding uses, where no webhook keeps a
//! Snapshot's `application` and `components` fixed: the binding records them the
//! first time it acts on the Snapshot (annotation [`SNAPSHOT_USED_ANNOTATION`], with
//! the Snapshot's UID), and a later reconcile that finds them changed on the same
//! Snapshot reports it instead of deploying. Pointing the binding at another
//! Snapshot, or a Snapshot deleted and made again, is a new first use.

use kube::ResourceExt;
use serde::{Deserialize, Serialize};

use crate::api::{Snapshot, SnapshotComponent, SnapshotEnvironmentBinding, SnapshotSpec};
use crate::context::ReconcileError;

/// On a binding: the Snapshot it acts on as first seen, JSON of [`SnapshotUsed`].
pub const SNAPSHOT_USED_ANNOTATION: &str = "appstudio.redhat.com/snapshot-used";

/// What a binding records of its Snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotUsed {
    pub snapshot: String,
    pub uid: String,
    pub application: String,
    #[serde(default)]
    pub components: Vec<SnapshotComponent>,
}

impl SnapshotUsed {
    fn of(snapshot: &Snapshot) -> SnapshotUsed {
        SnapshotUsed {
            snapshot: snapshot.name_any(),
            uid: snapshot.uid().unwrap_or_default(),
            application: snapshot.spec.application.clone(),
            components: snapshot.spec.components.clone(),
        }
    }
}

/// The webhook's refusal, when `recorded` is the same Snapshot as `live` with
/// another application or other components; None when it is unchanged or another
/// Snapshot (to be recorded anew).
pub fn changed(recorded: &SnapshotUsed, live: &Snapshot) -> Option<String> {
    if recorded.snapshot != live.name_any() || Some(&recorded.uid) != live.uid().as_ref() {
        return None;
    }
    let old = SnapshotSpec {
        application: recorded.application.clone(),
        components: recorded.components.clone(),
        ..live.spec.clone()
    };
    crate::webhook::rules::snapshot_update(&old, &live.spec).err().map(|refusal| {
        format!(
            "Snapshot {}: {refusal}; a Snapshot is fixed once a binding used it: change it back, or make a new \
             Snapshot and point the binding at it",
            recorded.snapshot
        )
    })
}

/// What [`check`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Check {
    /// The Snapshot changed: the binding must not act (the message says why).
    Changed(String),
    /// The binding acts on this Snapshot for the first time: record this
    /// [`SNAPSHOT_USED_ANNOTATION`] value.
    FirstUse(String),
    /// As recorded, or no Snapshot.
    Same,
}

/// Checks the binding's Snapshot against what the binding recorded of it. A
/// Snapshot that does not exist is not the binding's concern (the repository
/// generator reports what to deploy).
pub fn check(binding: &SnapshotEnvironmentBinding, live: Option<&Snapshot>) -> Result<Check, ReconcileError> {
    let Some(live) = live else { return Ok(Check::Same) };
    let recorded = binding
        .annotations()
        .get(SNAPSHOT_USED_ANNOTATION)
        .and_then(|value| serde_json::from_str::<SnapshotUsed>(value).ok());
    if let Some(message) = recorded.as_ref().and_then(|recorded| changed(recorded, live)) {
        return Ok(Check::Changed(message));
    }
    let current = SnapshotUsed::of(live);
    if recorded.as_ref() == Some(&current) {
        return Ok(Check::Same);
    }
    serde_json::to_string(&current)
        .map(Check::FirstUse)
        .map_err(|source| ReconcileError::Encode { what: "the Snapshot the binding uses", source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(uid: &str, application: &str, image: &str) -> Snapshot {
        let mut snapshot = Snapshot::new(
            "s1",
            SnapshotSpec {
                application: application.into(),
                components: vec![SnapshotComponent { name: "c".into(), container_image: image.into(), source: None }],
                ..SnapshotSpec::default()
            },
        );
        snapshot.metadata.uid = Some(uid.into());
        snapshot
    }

    #[test]
    fn only_a_change_of_the_same_snapshot_is_refused() {
        let recorded = SnapshotUsed::of(&snapshot("u1", "app", "img:1"));
        assert_eq!(changed(&recorded, &snapshot("u1", "app", "img:1")), None);
        let mut displayed = snapshot("u1", "app", "img:1");
        displayed.spec.display_name = Some("shown".into());
        assert_eq!(changed(&recorded, &displayed), None, "display fields may change");
        let message = changed(&recorded, &snapshot("u1", "app", "img:2")).expect("components changed");
        assert!(message.starts_with("Snapshot s1: components cannot be updated to [{Name:c ContainerImage:img:2}]"));
        let message = changed(&recorded, &snapshot("u1", "other", "img:1")).expect("application changed");
        assert!(message.starts_with("Snapshot s1: application field cannot be updated to other"), "{message}");
        assert_eq!(changed(&recorded, &snapshot("u2", "app", "img:2")), None, "made again: a new Snapshot");
    }
}
