//! Automated promotion on the real core: the layer's GitOpsDeployments go through
//! the writer, the agent and the Argo CD stand-in, and the commit each reports is
//! the one the stand-in synced. The test plays only the repository generator: it
//! writes the bindings' `status.components` and "pushes" to the stand-in's branch
//! head (a ConfigMap in its namespace, see `gitops_testkit::argocd`), so a step is
//! seen to wait for the commit the binding reports, and to complete once the core
//! has synced it.

use std::sync::Arc;
use std::time::Duration;

use gitops_appstudio::api::{
    Environment, EnvironmentSpec, PromotionRun, PromotionRunEnvironmentStatus, SnapshotEnvironmentBinding,
};
use gitops_appstudio::context::Settings;
use gitops_appstudio::metrics::Metrics;
use gitops_appstudio::names::binding_deployment_name;
use gitops_appstudio::promotion::generated_binding_name;
use gitops_testkit::argocd::push_head;
use gitops_writer::api::GitOpsDeployment;
use serde_json::json;

use super::binding::{application, binding_where};
use super::promotion::{APP, component, run, run_where, snapshot};
use super::{Ground, ground_on_core};
use crate::support::eventually;
use crate::support::writer::env;

const REPOSITORY: &str = "https://git.example.invalid/org/gitops.git";
const BRANCH: &str = "main";
const COMPONENTS: [&str; 2] = ["component-a", "component-b"];
/// The commit the branch is at when the run starts, and the one pushed later.
const X: &str = "1111111111111111111111111111111111111111";
const Y: &str = "2222222222222222222222222222222222222222";

fn environment(name: &str, parent: &str) -> Environment {
    Environment::new(
        name,
        EnvironmentSpec {
            display_name: name.to_owned(),
            deployment_strategy: "AppStudioAutomated".to_owned(),
            parent_environment: (!parent.is_empty()).then(|| parent.to_owned()),
            ..EnvironmentSpec::default()
        },
    )
}

/// Plays the repository generator on `env`'s generated binding: every component's
/// overlay committed at `commit`.
async fn generator_reports(g: &Ground, env: &str, commit: &str) {
    let binding = generated_binding_name(APP, env);
    eventually(&format!("the binding of {env}"), || async { g.get::<SnapshotEnvironmentBinding>(&binding).await })
        .await;
    let components: Vec<serde_json::Value> = COMPONENTS
        .iter()
        .map(|component| {
            json!({"name": component, "gitopsRepository": {
                "url": REPOSITORY, "branch": BRANCH, "path": format!("components/{component}/overlays/{env}"),
                "generatedResources": ["deployment.yaml"], "commitID": commit}})
        })
        .collect();
    g.patch_status::<SnapshotEnvironmentBinding>(&binding, json!({"components": components})).await;
}

/// Waits until the layer reports every deployment of `env`'s binding Synced and
/// Healthy at `commit` (as the core wrote it on the GitOpsDeployments), with the
/// repository generator's report at `reported`.
async fn deployed_at(g: &Ground, env: &str, commit: &str, reported: &str) -> SnapshotEnvironmentBinding {
    let binding = generated_binding_name(APP, env);
    binding_where(g, &binding, &format!("{env}'s deployments Synced and Healthy at {commit}"), |b| {
        b.status.as_ref().is_some_and(|s| {
            s.components.len() == COMPONENTS.len()
                && s.components.iter().all(|c| c.gitops_repository.commit_id == reported)
                && s.gitops_deployments.len() == COMPONENTS.len()
                && s.gitops_deployments
                    .iter()
                    .all(|d| d.sync_status == "Synced" && d.health == "Healthy" && d.commit_id == commit)
        })
    })
    .await
}

fn entry(run: &PromotionRun, env: &str) -> Option<PromotionRunEnvironmentStatus> {
    run.status.as_ref()?.environment_status.iter().find(|e| e.environment_name == env).cloned()
}

fn complete(run: &PromotionRun) -> bool {
    run.status.as_ref().is_some_and(|s| s.state == "Complete")
}

fn promotion_reconciles(metrics: &Metrics) -> u64 {
    super::reconciles(metrics, "promotion")
}

#[tokio::test]
async fn automated_promotion_completes_only_at_the_commit_the_core_synced() {
    let core = env("as-core-head").await;
    let _writer = core.writer("writer-a");
    let metrics = Arc::new(Metrics::default());
    let settings = Settings { promotion_poll: Duration::from_millis(300), ..Settings::default() };
    let g = ground_on_core(core, settings, metrics.clone()).await;
    let argocd = g.core().expect("the core").argocd.name().to_owned();
    // The branch is at X before anything is deployed.
    push_head(&g.client, &argocd, REPOSITORY, BRANCH, X).await.expect("push X");
    g.create(&environment("dev", "")).await;
    g.create(&environment("staging", "dev")).await;
    application(&g, APP).await;
    for component_name in COMPONENTS {
        component(&g, component_name).await;
    }
    snapshot(&g).await;
    let mut automated = run("auto", "");
    automated.spec.automated_promotion.initial_environment = "dev".to_owned();
    g.create(&automated).await;

    // Step 1: dev, reported and synced at X.
    generator_reports(&g, "dev", X).await;
    deployed_at(&g, "dev", X, X).await;
    run_where(&g, "auto", "dev promoted", |r| entry(r, "dev").is_some_and(|e| e.status == "Success")).await;

    // Step 2: the generator has pushed Y for staging and says so; the stand-in has
    // not seen it yet, so the core deploys X, Synced and Healthy.
    generator_reports(&g, "staging", Y).await;
    deployed_at(&g, "staging", X, Y).await;
    // Promotion reconciles that started after the layer reported staging Synced and
    // Healthy at X (the third counted from here began after this read) leave the
    // step waiting for Y.
    let seen = promotion_reconciles(&metrics);
    eventually("three more promotion reconciles", || async {
        let run = g.get::<PromotionRun>("auto").await.expect("the run");
        assert!(!complete(&run), "complete while the deployments are at X: {:?}", run.status);
        (promotion_reconciles(&metrics) >= seen + 3).then_some(())
    })
    .await;
    let waiting = g.get::<PromotionRun>("auto").await.expect("the run");
    assert!(!complete(&waiting), "complete while the deployments are at X: {:?}", waiting.status);
    let staging = entry(&waiting, "staging").expect("staging's entry");
    assert_eq!((staging.step, staging.status.as_str()), (2, "In Progress"), "{staging:?}");
    let staging_binding = generated_binding_name(APP, "staging");
    for component_name in COMPONENTS {
        let deployment = binding_deployment_name(&staging_binding, APP, "staging", component_name);
        assert!(
            staging.display_status.starts_with("Waiting for following GitOpsDeployments to be Synced/Healthy: ")
                && staging.display_status.contains(&deployment),
            "{staging:?}"
        );
    }

    // The push reaches the stand-in: the core syncs Y and the step completes.
    push_head(&g.client, &argocd, REPOSITORY, BRANCH, Y).await.expect("push Y");
    let done = run_where(&g, "auto", "the run complete", complete).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.completion_result.as_deref(), Some("Success"), "{status:?}");
    let mut steps: Vec<(i64, String, String)> =
        status.environment_status.iter().map(|e| (e.step, e.environment_name.clone(), e.status.clone())).collect();
    steps.sort();
    assert_eq!(steps, [(1, "dev".to_owned(), "Success".to_owned()), (2, "staging".to_owned(), "Success".to_owned())]);
    assert_eq!(status.active_bindings, vec![staging_binding.clone()]);
    // What completed it is the core's report of Y on the deployments themselves.
    for component_name in COMPONENTS {
        let deployment = binding_deployment_name(&staging_binding, APP, "staging", component_name);
        let deployment = g.get::<GitOpsDeployment>(&deployment).await.expect("the deployment");
        let status = deployment.status.expect("the core's status");
        let sync = status.sync.expect("sync");
        assert_eq!((sync.status.as_str(), sync.revision.as_deref()), ("Synced", Some(Y)), "{component_name}");
        assert_eq!(status.health.map(|h| h.status).as_deref(), Some("Healthy"), "{component_name}");
    }
}
