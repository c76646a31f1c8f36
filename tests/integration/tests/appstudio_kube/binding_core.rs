//! A binding's `AllComponentsDeployed` condition on the real core: the layer's
//! GitOpsDeployments go through the writer, the agent and the Argo CD stand-in, and
//! the sync each reports is what the stand-in compared. The test plays only the
//! repository generator. The stand-in has no Git, so a path the repository lacks is
//! told to it the way Argo CD reports one: its comparison-error knob (an annotation
//! on the Argo CD Application, which the agent's server-side apply leaves alone)
//! makes the comparison fail, sync `Unknown`, condition `ComparisonError`.

use std::sync::Arc;

use gitops_appstudio::api::SnapshotEnvironmentBinding;
use gitops_appstudio::binding::status::{COMMITS_SYNCED, COMMITS_UNSYNCED};
use gitops_appstudio::context::Settings;
use gitops_appstudio::metrics::Metrics;
use gitops_appstudio::names::binding_deployment_name;
use gitops_testkit::argocd::{COMPARISON_ERROR, COMPARISON_ERROR_KNOB};
use gitops_writer::api::GitOpsDeployment;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::binding::{application, binding, binding_where, deployed, generator_writes, nudge, overlay, plain_env};
use super::{Ground, ground_on_core, reconciled_since_now};
use crate::support::eventually;
use crate::support::writer::env;

const APP: &str = "new-demo-app";
const ENV: &str = "staging";
const BINDING: &str = "appa-staging-binding";
/// The original points component B at component C's overlay, which the repository lacks.
const MISSING: &str = "components/componentC/overlays/staging";

/// Sets (Some) or removes (None) the comparison-error knob on the Argo CD
/// Application of `deployment`.
async fn comparison_error(g: &Ground, deployment: &str, message: Option<&str>) {
    let core = g.core().expect("the core");
    let application = core.application_of(deployment).await;
    let patch = json!({"metadata": {"annotations": {COMPARISON_ERROR_KNOB: message}}});
    core.apps().patch(&application, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("set the knob");
}

/// Waits until the core reports `deployment` compared at `path` and passing `check`.
async fn core_reported(
    g: &Ground,
    deployment: &str,
    path: &str,
    what: &str,
    check: impl Fn(&GitOpsDeployment) -> bool,
) -> GitOpsDeployment {
    eventually(what, || async {
        let object = g.get::<GitOpsDeployment>(deployment).await?;
        let status = object.status.as_ref()?;
        (status.reconciled_state.as_ref()?.source.path == path && check(&object)).then_some(object)
    })
    .await
}

fn sync_status(deployment: &GitOpsDeployment) -> Option<&str> {
    Some(deployment.status.as_ref()?.sync.as_ref()?.status.as_str())
}

fn comparison_error_message(deployment: &GitOpsDeployment) -> Option<String> {
    let status = deployment.status.as_ref()?;
    status.conditions.iter().find(|c| c.type_ == COMPARISON_ERROR)?.message.clone()
}

/// `(component, sync status)` of the binding's status, sorted by component.
fn entries(binding: &SnapshotEnvironmentBinding) -> Vec<(String, String)> {
    let status = binding.status.as_ref().map(|s| s.gitops_deployments.as_slice()).unwrap_or_default();
    status.iter().map(|d| (d.component_name.clone(), d.sync_status.clone())).collect()
}

fn both(a: &str, b: &str) -> Vec<(String, String)> {
    vec![("component-a".to_owned(), a.to_owned()), ("component-b".to_owned(), b.to_owned())]
}

/// The original's binding case 3: pointing component B at a path the repository
/// lacks gives `1 of 2` False/`CommitsUnsynced`, which stays while nothing changes
/// (the original's "Consistently 1m": reconciles that began after that state leave
/// it), and pointing it back gives `2 of 2` True/`CommitsSynced` again.
#[tokio::test]
async fn a_component_at_a_path_the_repository_lacks_is_not_counted_deployed() {
    let core = env("as-core-seb").await;
    let _writer = core.writer("writer-a");
    let metrics = Arc::new(Metrics::default());
    let g = ground_on_core(core, Settings::default(), metrics.clone()).await;
    plain_env(&g, ENV).await;
    application(&g, APP).await;
    binding(&g, BINDING, APP, ENV, &["component-a", "component-b"]).await;
    let (path_a, path_b) = (overlay("component-a", ENV), overlay("component-b", ENV));
    generator_writes(&g, BINDING, &[("component-a", &path_a), ("component-b", &path_b)]).await;
    let b = binding_deployment_name(BINDING, APP, ENV, "component-b");

    let synced = binding_where(&g, BINDING, "2 of 2 components deployed", |s| {
        deployed(s).is_some_and(|c| c.message == "2 of 2 components deployed") && entries(s) == both("Synced", "Synced")
    })
    .await;
    let condition = deployed(&synced).expect("condition");
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("True", COMMITS_SYNCED));

    // The generator points B at the missing path; once Argo CD compares it there,
    // the comparison fails.
    generator_writes(&g, BINDING, &[("component-a", &path_a), ("component-b", MISSING)]).await;
    core_reported(&g, &b, MISSING, "B compared at the missing path", |_| true).await;
    let message = format!(
        "Failed to load target state: failed to generate manifest for source 1 of 1: rpc error: code = Unknown \
         desc = {MISSING}: app path does not exist"
    );
    comparison_error(&g, &b, Some(&message)).await;
    let failed = core_reported(&g, &b, MISSING, "B's comparison error reported by the core", |d| {
        sync_status(d) == Some("Unknown") && comparison_error_message(d).is_some()
    })
    .await;
    assert_eq!(comparison_error_message(&failed).as_deref(), Some(message.as_str()));
    let is_unsynced = |s: &SnapshotEnvironmentBinding| {
        entries(s) == both("Synced", "Unknown")
            && deployed(s).is_some_and(|c| {
                (c.status.as_str(), c.reason.as_str(), c.message.as_str())
                    == ("False", COMMITS_UNSYNCED, "1 of 2 components deployed")
            })
    };
    binding_where(&g, BINDING, "1 of 2 components deployed", is_unsynced).await;

    // It stays so: reconciles that began after that state leave it.
    reconciled_since_now(&metrics, "binding", |round| nudge(&g, BINDING, round)).await;
    let kept = g.get::<SnapshotEnvironmentBinding>(BINDING).await.expect("the binding");
    assert!(is_unsynced(&kept), "{:?}", kept.status);
    assert_eq!(deployed(&kept).expect("condition").message, "1 of 2 components deployed");

    // Pointed back at a path the repository has: 2 of 2 again.
    generator_writes(&g, BINDING, &[("component-a", &path_a), ("component-b", &path_b)]).await;
    core_reported(&g, &b, &path_b, "B compared at its own path again", |_| true).await;
    comparison_error(&g, &b, None).await;
    let again = binding_where(&g, BINDING, "2 of 2 again", |s| {
        deployed(s).is_some_and(|c| c.status == "True") && entries(s) == both("Synced", "Synced")
    })
    .await;
    let condition = deployed(&again).expect("condition");
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str(), condition.message.as_str()),
        ("True", COMMITS_SYNCED, "2 of 2 components deployed")
    );
}
