//! Which Applications name which AppProject, so that a project's change re-checks
//! only its own Applications (Argo CD keeps the same index) instead of scanning
//! every Application of the instance per project event: with 10,000 projects and
//! 25,000 Applications the scan was the stand-in's bottleneck.
//!
//! A reconcile records its Application's project *before* reading the project, so a
//! project change after that read always finds it. Applications that went away
//! are dropped when a project event finds them gone, when their finalizer is
//! removed, and, in bulk, whenever the index holds twice as many entries as the
//! controller's store has Applications (amortised: the index never grows with
//! churn, only with live Applications).

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};

#[derive(Debug, Default)]
struct Inner {
    by_project: HashMap<String, HashSet<String>>,
    project_of: HashMap<String, String>,
}

/// Application name → project, and project → Application names.
#[derive(Debug, Default)]
pub struct ProjectIndex {
    inner: Mutex<Inner>,
}

impl ProjectIndex {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Application `app` names `project` (from now on).
    pub fn set(&self, app: &str, project: &str) {
        let mut inner = self.lock();
        if inner.project_of.get(app).is_some_and(|p| p == project) {
            return;
        }
        if let Some(old) = inner.project_of.insert(app.to_owned(), project.to_owned()) {
            remove_from(&mut inner.by_project, &old, app);
        }
        inner.by_project.entry(project.to_owned()).or_default().insert(app.to_owned());
    }

    /// Application `app` is gone.
    pub fn remove(&self, app: &str) {
        let mut inner = self.lock();
        if let Some(old) = inner.project_of.remove(app) {
            remove_from(&mut inner.by_project, &old, app);
        }
    }

    /// The Applications that named `project` when last reconciled.
    pub fn apps_of(&self, project: &str) -> Vec<String> {
        self.lock().by_project.get(project).map(|apps| apps.iter().cloned().collect()).unwrap_or_default()
    }

    /// Applications indexed.
    pub fn len(&self) -> usize {
        self.lock().project_of.len()
    }

    /// Keeps only the Applications for which `alive` holds.
    pub fn retain(&self, alive: impl Fn(&str) -> bool) {
        let mut inner = self.lock();
        let gone: Vec<String> = inner.project_of.keys().filter(|app| !alive(app)).cloned().collect();
        for app in gone {
            if let Some(old) = inner.project_of.remove(&app) {
                remove_from(&mut inner.by_project, &old, &app);
            }
        }
    }
}

fn remove_from(by_project: &mut HashMap<String, HashSet<String>>, project: &str, app: &str) {
    if let Some(apps) = by_project.get_mut(project) {
        apps.remove(app);
        if apps.is_empty() {
            by_project.remove(project);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_application_is_found_under_its_current_project_only() {
        let index = ProjectIndex::default();
        index.set("a", "p");
        index.set("b", "p");
        index.set("a", "q");
        let mut of_p = index.apps_of("p");
        of_p.sort();
        assert_eq!((of_p, index.apps_of("q")), (vec!["b".to_owned()], vec!["a".to_owned()]));
        index.remove("b");
        assert!(index.apps_of("p").is_empty());
        index.set("c", "q");
        index.retain(|app| app == "c");
        assert_eq!((index.apps_of("q"), index.len()), (vec!["c".to_owned()], 1));
    }
}
