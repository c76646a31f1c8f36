//! Letting go of objects without pruning what they deployed — one order for a
//! tenant's move, a lifted fence and the sweep's objects of rows placed elsewhere:
//! Applications first (Argo CD's resources finalizer goes before they do), then,
//! once none of them is still being deleted, cluster and repository Secrets and
//! AppProjects (an Application may need them until it is gone).

use super::{Engine, EngineError, ObjectKind, OwnedObject, Removal};

/// What one pass did.
#[derive(Debug, Default)]
pub struct Released {
    /// Objects gone.
    pub removed: u64,
    /// Objects still being deleted, or left for the next pass.
    pub pending: Vec<String>,
    /// Objects the engine refused or failed to remove (the pass went on).
    pub failed: Vec<(String, EngineError)>,
}

impl Released {
    /// Whether everything is gone.
    pub fn done(&self) -> bool {
        self.pending.is_empty() && self.failed.is_empty()
    }
}

/// Removes `objects` from `engine` in the order above.
pub async fn release_objects(engine: &dyn Engine, objects: &[&OwnedObject]) -> Released {
    let mut out = Released::default();
    let mut applications_left = false;
    for kind in [ObjectKind::Application, ObjectKind::Cluster, ObjectKind::Repository, ObjectKind::Project] {
        let of_kind = objects.iter().filter(|o| o.kind == kind);
        if applications_left {
            out.pending.extend(of_kind.map(|o| o.name.clone()));
            continue;
        }
        for object in of_kind {
            let removal = match kind {
                ObjectKind::Application => engine.release_application(&object.name).await,
                ObjectKind::Cluster => engine.delete_cluster(&object.name).await,
                ObjectKind::Repository => engine.delete_repository(&object.name).await,
                ObjectKind::Project => engine.delete_project(&object.name).await,
            };
            match removal {
                Ok(Removal::Gone) => out.removed += 1,
                Ok(Removal::Pending) => out.pending.push(object.name.clone()),
                Err(error) => out.failed.push((object.name.clone(), error)),
            }
        }
        // Secrets and projects stay while an Application may still need them.
        applications_left = kind == ObjectKind::Application && !out.done();
    }
    out
}
