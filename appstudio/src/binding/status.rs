//! The status the layer writes on a binding: one `gitopsDeployments` entry per
//! component, sorted, and exactly one `AllComponentsDeployed` condition.

use gitops_writer::api::GitOpsDeployment;

use crate::api::{BindingStatusGitOpsDeployment, Condition};
use crate::condition::{FALSE, TRUE, condition};

pub const ALL_COMPONENTS_DEPLOYED: &str = "AllComponentsDeployed";
pub const COMMITS_SYNCED: &str = "CommitsSynced";
pub const COMMITS_UNSYNCED: &str = "CommitsUnsynced";
pub const SYNCED: &str = "Synced";

/// The entry of one component's deployment (`live` None: not created yet).
pub fn deployment_entry(component: &str, name: &str, live: Option<&GitOpsDeployment>) -> BindingStatusGitOpsDeployment {
    let status = live.and_then(|d| d.status.as_ref());
    let sync = status.and_then(|s| s.sync.as_ref());
    BindingStatusGitOpsDeployment {
        component_name: component.to_owned(),
        gitops_deployment: name.to_owned(),
        sync_status: sync.map(|s| s.status.clone()).unwrap_or_default(),
        health: status.and_then(|s| s.health.as_ref()).map(|h| h.status.clone()).unwrap_or_default(),
        commit_id: sync.and_then(|s| s.revision.clone()).unwrap_or_default(),
    }
}

/// `"<synced> of <total> components deployed"`: True (`CommitsSynced`) when all are
/// synced, else False (`CommitsUnsynced`). Health does not count.
pub fn components_deployed(entries: &[BindingStatusGitOpsDeployment]) -> Condition {
    let synced = entries.iter().filter(|e| e.sync_status == SYNCED).count();
    let total = entries.len();
    let (status, reason) = if synced == total { (TRUE, COMMITS_SYNCED) } else { (FALSE, COMMITS_UNSYNCED) };
    condition(ALL_COMPONENTS_DEPLOYED, status, reason, &format!("{synced} of {total} components deployed"))
}

/// The deployment conditions after this reconcile: exactly one, its transition time
/// kept when nothing else changed.
pub fn deployment_conditions(old: &[Condition], new: Condition, now: &str) -> Vec<Condition> {
    let mut conditions: Vec<Condition> =
        old.iter().filter(|c| c.type_ == ALL_COMPONENTS_DEPLOYED).take(1).cloned().collect();
    if old.len() > 1 {
        conditions.clear();
    }
    crate::condition::upsert(&mut conditions, new, now);
    conditions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(sync: &str) -> BindingStatusGitOpsDeployment {
        BindingStatusGitOpsDeployment { sync_status: sync.into(), ..BindingStatusGitOpsDeployment::default() }
    }

    #[test]
    fn n_of_m_counts_synced_only() {
        let all = components_deployed(&[entry("Synced"), entry("Synced")]);
        assert_eq!((all.status.as_str(), all.reason.as_str()), (TRUE, COMMITS_SYNCED));
        assert_eq!(all.message, "2 of 2 components deployed");
        let some = components_deployed(&[entry("Synced"), entry("OutOfSync")]);
        assert_eq!((some.status.as_str(), some.reason.as_str()), (FALSE, COMMITS_UNSYNCED));
        assert_eq!(some.message, "1 of 2 components deployed");
    }

    #[test]
    fn exactly_one_condition_remains() {
        let mut stale = components_deployed(&[entry("Synced")]);
        stale.last_transition_time = "t0".into();
        let two = vec![stale.clone(), stale.clone()];
        let conditions = deployment_conditions(&two, components_deployed(&[entry("Synced")]), "t1");
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, "t1", "a list of several is reset");
        let kept = deployment_conditions(&[stale], components_deployed(&[entry("Synced")]), "t2");
        assert_eq!(kept[0].last_transition_time, "t0", "unchanged keeps its time");
    }

    #[test]
    fn an_entry_reads_sync_health_and_revision() {
        let mut deployment = GitOpsDeployment::new("d", Default::default());
        deployment.status = Some(gitops_writer::api::GitOpsDeploymentStatus {
            sync: Some(gitops_writer::api::DeploymentSync { status: "Synced".into(), revision: Some("abc".into()) }),
            health: Some(gitops_writer::api::DeploymentHealth { status: "Healthy".into(), message: None }),
            ..Default::default()
        });
        let entry = deployment_entry("c", "d", Some(&deployment));
        assert_eq!(
            (entry.sync_status.as_str(), entry.health.as_str(), entry.commit_id.as_str()),
            ("Synced", "Healthy", "abc")
        );
        assert_eq!(deployment_entry("c", "d", None).sync_status, "");
    }
}
