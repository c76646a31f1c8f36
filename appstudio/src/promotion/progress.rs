//! How far a manual promotion has got, decided without I/O and with the time given,
//! so the timeout is tested with an injected clock.
//!
//! Unlike the original, a deployment counts as done only when Synced *and* Healthy,
//! and at the commit the repository generator reported for its component (else the
//! old Snapshot, still Synced and Healthy, would pass for the new one); and the
//! timeout applies while the deployments are still being created too.

use std::time::Duration;

use crate::api::{BindingStatusComponent, BindingStatusGitOpsDeployment};

pub const SYNCED: &str = "Synced";
pub const HEALTHY: &str = "Healthy";

/// What the binding's deployments say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Fewer deployments reported than components bound.
    Creating,
    /// These deployments are not yet Synced and Healthy at the reported commit.
    Waiting(Vec<String>),
    /// All are.
    Done,
    /// The limit passed first.
    TimedOut,
}

/// The promotion's progress at `elapsed` since it started, with `limit`.
pub fn progress(
    bound_components: usize,
    components: &[BindingStatusComponent],
    deployments: &[BindingStatusGitOpsDeployment],
    elapsed: Duration,
    limit: Duration,
) -> Progress {
    let state = if deployments.len() != bound_components || deployments.is_empty() {
        Progress::Creating
    } else {
        let waiting: Vec<String> =
            deployments.iter().filter(|d| !done(d, components)).map(|d| d.gitops_deployment.clone()).collect();
        if waiting.is_empty() { Progress::Done } else { Progress::Waiting(waiting) }
    };
    match state {
        Progress::Done => Progress::Done,
        _ if elapsed > limit => Progress::TimedOut,
        other => other,
    }
}

fn done(deployment: &BindingStatusGitOpsDeployment, components: &[BindingStatusComponent]) -> bool {
    let expected_commit = components
        .iter()
        .find(|c| c.name == deployment.component_name)
        .map(|c| c.gitops_repository.commit_id.as_str())
        .filter(|commit| !commit.is_empty());
    deployment.sync_status == SYNCED
        && deployment.health == HEALTHY
        && expected_commit.is_none_or(|commit| commit == deployment.commit_id)
}

/// The limit as the timeout message says it ("10 Minutes", or seconds when not whole minutes).
pub fn limit_text(limit: Duration) -> String {
    let seconds = limit.as_secs();
    if seconds > 0 && seconds.is_multiple_of(60) {
        format!("{} Minutes", seconds / 60)
    } else {
        format!("{seconds} Seconds")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::BindingComponentGitOpsRepository;

    fn deployment(name: &str, sync: &str, health: &str, commit: &str) -> BindingStatusGitOpsDeployment {
        BindingStatusGitOpsDeployment {
            component_name: name.into(),
            gitops_deployment: format!("d-{name}"),
            sync_status: sync.into(),
            health: health.into(),
            commit_id: commit.into(),
        }
    }

    fn component(name: &str, commit: &str) -> BindingStatusComponent {
        BindingStatusComponent {
            name: name.into(),
            gitops_repository: BindingComponentGitOpsRepository { commit_id: commit.into(), ..Default::default() },
            ..Default::default()
        }
    }

    const LIMIT: Duration = Duration::from_secs(600);

    #[test]
    fn only_synced_and_healthy_at_the_reported_commit_is_done() {
        let components = [component("a", "c2"), component("b", "")];
        let at = |a: BindingStatusGitOpsDeployment, b: BindingStatusGitOpsDeployment| {
            progress(2, &components, &[a, b], Duration::from_secs(1), LIMIT)
        };
        assert_eq!(
            at(deployment("a", "Synced", "Healthy", "c2"), deployment("b", "Synced", "Healthy", "x")),
            Progress::Done
        );
        // The original counted OutOfSync (and Unknown, and empty) as done.
        assert_eq!(
            at(deployment("a", "OutOfSync", "Healthy", "c2"), deployment("b", "Synced", "Healthy", "x")),
            Progress::Waiting(vec!["d-a".into()])
        );
        assert_eq!(
            at(deployment("a", "", "", ""), deployment("b", "Synced", "Progressing", "x")),
            Progress::Waiting(vec!["d-a".into(), "d-b".into()])
        );
        assert_eq!(
            at(deployment("a", "Synced", "Healthy", "c1"), deployment("b", "Synced", "Healthy", "x")),
            Progress::Waiting(vec!["d-a".into()]),
            "still at the old commit"
        );
    }

    #[test]
    fn the_timeout_applies_while_creating_and_waiting_but_not_once_done() {
        let late = LIMIT + Duration::from_secs(1);
        assert_eq!(progress(2, &[], &[], Duration::ZERO, LIMIT), Progress::Creating);
        assert_eq!(progress(2, &[], &[], late, LIMIT), Progress::TimedOut);
        let waiting = [deployment("a", "OutOfSync", "Healthy", "")];
        assert_eq!(progress(1, &[], &waiting, late, LIMIT), Progress::TimedOut);
        let done = [deployment("a", "Synced", "Healthy", "")];
        assert_eq!(progress(1, &[], &done, late, LIMIT), Progress::Done);
        assert_eq!(progress(1, &[], &done, LIMIT, LIMIT), Progress::Done);
    }

    #[test]
    fn the_limit_reads_in_minutes_when_whole() {
        assert_eq!(limit_text(LIMIT), "10 Minutes");
        assert_eq!(limit_text(Duration::from_secs(3)), "3 Seconds");
    }
}
