//! Automated promotion (which the original refused): a Snapshot goes from the
//! initial Environment down the `parentEnvironment` graph through the
//! `AppStudioAutomated` Environments, one step per generation with siblings
//! together, each step gated on its deployments Synced and Healthy **at the commit
//! the binding reports** — the test plays the repository generator (binding status,
//! with a commit per environment) and the core (deployment status, with the revision
//! Argo CD synced).

use std::time::Duration;

use gitops_appstudio::api::{Environment, EnvironmentSpec, PromotionRun, PromotionRunEnvironmentStatus};
use gitops_appstudio::context::Settings;
use gitops_appstudio::names::binding_deployment_name;
use gitops_appstudio::promotion::generated_binding_name;
use gitops_writer::api::GitOpsDeployment;
use serde_json::json;

use super::binding::application;
use super::promotion::{APP, component, error_message, run, run_where, snapshot};
use super::{Ground, ground_with};
use crate::support::eventually;

fn env(name: &str, parent: &str, strategy: &str) -> Environment {
    Environment::new(
        name,
        EnvironmentSpec {
            display_name: name.to_owned(),
            deployment_strategy: strategy.to_owned(),
            parent_environment: (!parent.is_empty()).then(|| parent.to_owned()),
            ..EnvironmentSpec::default()
        },
    )
}

/// dev (manual) → staging, qa (automated) → prod (automated); sandbox (manual)
/// under dev, and one automated Environment under it, are not the run's.
async fn graph_ground(purpose: &str, settings: Settings) -> Ground {
    let g = ground_with(purpose, settings).await;
    for (name, parent, strategy) in [
        ("dev", "", "Manual"),
        ("staging", "dev", "AppStudioAutomated"),
        ("qa", "dev", "AppStudioAutomated"),
        ("prod", "staging", "AppStudioAutomated"),
        ("sandbox", "dev", "Manual"),
        ("after-sandbox", "sandbox", "AppStudioAutomated"),
    ] {
        g.create(&env(name, parent, strategy)).await;
    }
    application(&g, APP).await;
    component(&g, "component-a").await;
    snapshot(&g).await;
    g
}

fn automated_run(name: &str, initial: &str) -> PromotionRun {
    let mut run = run(name, "");
    run.spec.automated_promotion.initial_environment = initial.to_owned();
    run
}

/// Plays the repository generator on the binding the run generated for `env`
/// (commit `commit`), then the core on its deployment (Synced and Healthy at
/// `synced`).
async fn serve(g: &Ground, env: &str, commit: &str, synced: &str) {
    let binding = generated_binding_name(APP, env);
    eventually(&format!("the binding of {env}"), || async {
        g.get::<gitops_appstudio::api::SnapshotEnvironmentBinding>(&binding).await.map(|_| ())
    })
    .await;
    let components = json!([{"name": "component-a", "gitopsRepository": {
        "url": "https://git.example.invalid/org/gitops.git", "branch": "main",
        "path": format!("components/component-a/overlays/{env}"),
        "generatedResources": ["deployment.yaml"], "commitID": commit}}]);
    g.patch_status::<gitops_appstudio::api::SnapshotEnvironmentBinding>(&binding, json!({"components": components}))
        .await;
    report(g, env, synced).await;
}

/// Plays the core: `env`'s deployment Synced and Healthy at `revision`.
async fn report(g: &Ground, env: &str, revision: &str) {
    let binding = generated_binding_name(APP, env);
    let deployment = binding_deployment_name(&binding, APP, env, "component-a");
    eventually(&format!("the deployment of {env}"), || async { g.get::<GitOpsDeployment>(&deployment).await }).await;
    g.patch_status::<GitOpsDeployment>(
        &deployment,
        json!({"sync": {"status": "Synced", "revision": revision}, "health": {"status": "Healthy"}}),
    )
    .await;
}

fn entry(run: &PromotionRun, env: &str) -> Option<PromotionRunEnvironmentStatus> {
    run.status.as_ref()?.environment_status.iter().find(|e| e.environment_name == env).cloned()
}

fn succeeded(run: &PromotionRun, env: &str) -> bool {
    entry(run, env).is_some_and(|e| e.status == "Success")
}

#[tokio::test]
async fn automated_promotion_walks_the_environment_graph_a_step_at_a_time() {
    let g = graph_ground("as-auto-walk", Settings::default()).await;
    g.create(&automated_run("auto", "dev")).await;

    // Step 1: dev alone; the next step waits for it.
    serve(&g, "dev", "c-dev", "c-dev").await;
    run_where(&g, "auto", "dev promoted", |r| succeeded(r, "dev")).await;

    // Step 2: staging and qa together. qa's deployment is Synced and Healthy, but at
    // an older commit than the repository generator reported: not done.
    serve(&g, "staging", "c-staging", "c-staging").await;
    serve(&g, "qa", "c-qa", "c-old").await;
    let waiting = run_where(&g, "auto", "qa waiting for its commit", |r| {
        succeeded(r, "staging") && entry(r, "qa").is_some_and(|e| e.display_status.starts_with("Waiting for following"))
    })
    .await;
    assert_eq!(entry(&waiting, "qa").map(|e| e.step), Some(2));
    assert!(entry(&waiting, "prod").is_none(), "step 3 waits for all of step 2");
    report(&g, "qa", "c-qa").await;

    // Step 3: prod; then the run is complete.
    serve(&g, "prod", "c-prod", "c-prod").await;
    let done =
        run_where(&g, "auto", "the run complete", |r| r.status.as_ref().is_some_and(|s| s.state == "Complete")).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.completion_result.as_deref(), Some("Success"), "{status:?}");
    let mut steps: Vec<(i64, String, String)> =
        status.environment_status.iter().map(|e| (e.step, e.environment_name.clone(), e.status.clone())).collect();
    steps.sort();
    let expect = |step: i64, env: &str| (step, env.to_owned(), "Success".to_owned());
    assert_eq!(steps, vec![expect(1, "dev"), expect(2, "qa"), expect(2, "staging"), expect(3, "prod")]);
    assert_eq!(status.active_bindings, vec![generated_binding_name(APP, "prod")], "the last step's bindings");
    for untouched in ["sandbox", "after-sandbox"] {
        let binding = generated_binding_name(APP, untouched);
        assert!(
            g.get::<gitops_appstudio::api::SnapshotEnvironmentBinding>(&binding).await.is_none(),
            "{untouched} is promoted by hand"
        );
    }
    assert_eq!(error_message(&done), None);
}

#[tokio::test]
async fn automated_promotion_stops_at_the_first_step_that_fails() {
    // Long enough for step 1 to be served on a busy machine.
    let settings = Settings { promotion_timeout: Duration::from_secs(10), ..Settings::default() };
    let g = graph_ground("as-auto-fail", settings).await;
    g.create(&automated_run("auto", "dev")).await;
    serve(&g, "dev", "c-dev", "c-dev").await;
    // Nothing of step 2 (qa, staging) is ever deployed: it times out, the first of
    // its Environments (qa) failing it.
    let failed =
        run_where(&g, "auto", "the run failed", |r| r.status.as_ref().is_some_and(|s| s.state == "Complete")).await;
    let status = failed.status.clone().expect("status");
    assert_eq!(status.completion_result.as_deref(), Some("Failure"), "{status:?}");
    let qa = entry(&failed, "qa").expect("qa's entry");
    assert_eq!((qa.step, qa.status.as_str()), (2, "Failed"), "{status:?}");
    assert_eq!(qa.display_status, "Promotion Failed. Could not be completed in 10 Seconds.");
    assert!(succeeded(&failed, "dev"));
    assert!(entry(&failed, "prod").is_none(), "no step after a failed one");
    assert!(
        g.get::<gitops_appstudio::api::SnapshotEnvironmentBinding>(&generated_binding_name(APP, "prod"))
            .await
            .is_none()
    );
}

#[tokio::test]
async fn a_parent_cycle_stops_an_automated_promotion_before_it_starts() {
    let g = ground_with("as-auto-cycle", Settings::default()).await;
    // Made without the webhook, which would refuse the second.
    g.create(&env("a", "b", "AppStudioAutomated")).await;
    g.create(&env("b", "a", "AppStudioAutomated")).await;
    application(&g, APP).await;
    component(&g, "component-a").await;
    snapshot(&g).await;
    g.create(&automated_run("auto", "a")).await;
    let refused = run_where(&g, "auto", "the cycle reported", |r| error_message(r).is_some()).await;
    let message = error_message(&refused).expect("a message");
    assert!(message.contains("cycle"), "{message}");
    // Ended, so later runs of the application are not held up behind it.
    let status = refused.status.clone().expect("status");
    assert_eq!((status.state.as_str(), status.completion_result.as_deref()), ("Complete", Some("Failure")));
    assert!(
        g.get::<gitops_appstudio::api::SnapshotEnvironmentBinding>(&generated_binding_name(APP, "a")).await.is_none()
    );
}
