//! PromotionRun, manual: ported from the original's promotion cases, plus the fixes
//! (OutOfSync is not done, the timeout applies, a generated binding outlives its run,
//! one active promotion per application and namespace).

use std::time::Duration;

use gitops_appstudio::api::{
    Component, ComponentSpec, PromotionRun, PromotionRunCondition, PromotionRunEnvironmentStatus, PromotionRunSpec,
    Snapshot, SnapshotEnvironmentBinding, SnapshotSpec,
};
use gitops_appstudio::context::Settings;
use gitops_appstudio::names::MANAGED_ENVIRONMENT_SECRET_TYPE;
use gitops_appstudio::promotion::{ACTIVE_PROMOTION_EXISTS, GENERATED_BY_LABEL, TARGET_INVALID};
use kube::ResourceExt;
use kube::api::DeleteParams;

use super::binding::{application, binding, binding_where, core_reports, deployed, generator_writes, plain_env};
use super::environment::{credentials, credentials_env};
use super::{Ground, ground, ground_with};
use crate::support::eventually;

pub(crate) const APP: &str = "new-demo-app";

pub(crate) fn run(name: &str, target: &str) -> PromotionRun {
    let mut run = PromotionRun::new(
        name,
        PromotionRunSpec { snapshot: "my-snapshot".into(), application: APP.into(), ..PromotionRunSpec::default() },
    );
    run.spec.manual_promotion.target_environment = target.to_owned();
    run
}

pub(crate) async fn snapshot(g: &Ground) {
    g.create(&Snapshot::new("my-snapshot", SnapshotSpec { application: APP.into(), ..SnapshotSpec::default() })).await;
}

pub(crate) async fn component(g: &Ground, name: &str) {
    g.create(&Component::new(
        name,
        ComponentSpec { component_name: name.into(), application: APP.into(), ..ComponentSpec::default() },
    ))
    .await;
}

/// Staging (credentials to another namespace) and prod (the namespace itself), the
/// application, the Snapshot and a binding per environment whose one deployment the
/// core reports Synced/Healthy.
async fn promotion_ground(purpose: &str, settings: Settings) -> Ground {
    let g = ground_with(purpose, settings).await;
    g.secret("creds", MANAGED_ENVIRONMENT_SECRET_TYPE, "k").await;
    g.create(&credentials_env("staging", credentials("creds", "staging-namespace"))).await;
    plain_env(&g, "prod").await;
    application(&g, APP).await;
    snapshot(&g).await;
    for env in ["staging", "prod"] {
        let name = format!("appa-{env}-binding");
        binding(&g, &name, APP, env, &["component-a"]).await;
        generator_writes(&g, &name, &[("component-a", &format!("components/component-a/overlays/{env}"))]).await;
        let deployment = format!("{name}-{APP}-{env}-component-a");
        eventually("the binding's deployment", || async {
            g.get::<gitops_writer::api::GitOpsDeployment>(&deployment).await.map(|_| ())
        })
        .await;
        core_reports(&g, &deployment, "Synced", "Healthy").await;
        binding_where(&g, &name, "the binding deployed", |b| {
            deployed(b).is_some_and(|c| c.message == "1 of 1 components deployed")
                && b.status.as_ref().is_some_and(|s| s.gitops_deployments.iter().all(|d| d.health == "Healthy"))
        })
        .await;
    }
    g
}

pub(crate) async fn run_where(
    g: &Ground,
    name: &str,
    what: &str,
    check: impl Fn(&PromotionRun) -> bool,
) -> PromotionRun {
    eventually(what, || async { g.get::<PromotionRun>(name).await.filter(|r| check(r)) }).await
}

pub(crate) fn error_message(run: &PromotionRun) -> Option<String> {
    run.status.as_ref()?.conditions.iter().find(|c| c.type_ == "ErrorOccurred" && c.status == "True")?.message.clone()
}

fn without_times(conditions: &[PromotionRunCondition]) -> Vec<PromotionRunCondition> {
    conditions
        .iter()
        .map(|c| PromotionRunCondition { last_probe_time: None, last_transition_time: None, ..c.clone() })
        .collect()
}

#[tokio::test]
async fn a_manual_promotion_completes_once_the_binding_is_synced_and_healthy() {
    let g = promotion_ground("as-promo-manual", Settings::default()).await;
    g.create(&run("promote-to-prod", "prod")).await;
    let done = run_where(&g, "promote-to-prod", "the promotion complete", |r| {
        r.status.as_ref().is_some_and(|s| s.state == "Complete")
    })
    .await;
    let status = done.status.expect("status");
    assert_eq!(status.completion_result.as_deref(), Some("Success"));
    assert_eq!(status.active_bindings, vec!["appa-prod-binding".to_owned()]);
    assert_eq!(
        status.environment_status,
        vec![PromotionRunEnvironmentStatus {
            step: 1,
            environment_name: "prod".into(),
            status: "Success".into(),
            display_status: "All GitOpsDeployments are Synced/Healthy".into(),
        }]
    );
    assert_eq!(
        without_times(&status.conditions),
        vec![PromotionRunCondition { type_: "ErrorOccurred".into(), status: "False".into(), ..Default::default() }]
    );
    assert!(status.promotion_start_time.is_some());

    // An invalid request: no target (automated promotion is `promotion_automated`'s).
    g.create(&run("no-target", "")).await;
    let refused = run_where(&g, "no-target", "the empty target refused", |r| error_message(r).is_some()).await;
    assert_eq!(error_message(&refused).as_deref(), Some(TARGET_INVALID));
}

#[tokio::test]
async fn out_of_sync_is_not_done_and_the_timeout_fails_the_run() {
    let settings = Settings { promotion_timeout: Duration::from_secs(3), ..Settings::default() };
    let g = promotion_ground("as-promo-wait", settings).await;
    let deployment = format!("appa-prod-binding-{APP}-prod-component-a");
    // The original counted OutOfSync as done and completed with Success.
    core_reports(&g, &deployment, "OutOfSync", "Healthy").await;
    binding_where(&g, "appa-prod-binding", "the binding sees OutOfSync", |b| {
        b.status.as_ref().is_some_and(|s| s.gitops_deployments.iter().any(|d| d.sync_status == "OutOfSync"))
    })
    .await;
    g.create(&run("promote-to-prod", "prod")).await;
    let failed = run_where(&g, "promote-to-prod", "the run to time out", |r| {
        r.status.as_ref().is_some_and(|s| s.state == "Complete")
    })
    .await;
    let status = failed.status.as_ref().expect("status");
    assert_eq!(status.completion_result.as_deref(), Some("Failure"));
    assert_eq!(status.environment_status[0].status, "Failed");
    assert_eq!(status.environment_status[0].display_status, "Promotion Failed. Could not be completed in 3 Seconds.");
    assert_eq!(error_message(&failed).as_deref(), Some("Promotion Failed. Could not be completed in 3 Seconds."));
}

#[tokio::test]
async fn a_waiting_run_completes_when_its_deployments_become_healthy() {
    let g = promotion_ground("as-promo-resume", Settings::default()).await;
    let deployment = format!("appa-prod-binding-{APP}-prod-component-a");
    core_reports(&g, &deployment, "Synced", "Progressing").await;
    binding_where(&g, "appa-prod-binding", "the binding sees Progressing", |b| {
        b.status.as_ref().is_some_and(|s| s.gitops_deployments.iter().any(|d| d.health == "Progressing"))
    })
    .await;
    g.create(&run("promote-to-prod", "prod")).await;
    let waiting = run_where(&g, "promote-to-prod", "the run waiting", |r| {
        r.status.as_ref().is_some_and(|s| s.state == "Waiting")
    })
    .await;
    assert_eq!(
        waiting.status.expect("status").environment_status[0].display_status,
        format!("Waiting for following GitOpsDeployments to be Synced/Healthy: {deployment}")
    );
    // A second run of the application waits for the first.
    let mut second = run("second", "staging");
    second.spec.snapshot = "my-snapshot".into();
    g.create(&second).await;
    let blocked = run_where(&g, "second", "the second run blocked", |r| error_message(r).is_some()).await;
    assert_eq!(error_message(&blocked).as_deref(), Some(ACTIVE_PROMOTION_EXISTS));

    // The binding's watch brings the run on as soon as the deployment is healthy.
    core_reports(&g, &deployment, "Synced", "Healthy").await;
    run_where(&g, "promote-to-prod", "the run complete", |r| {
        r.status.as_ref().is_some_and(|s| s.completion_result.as_deref() == Some("Success"))
    })
    .await;
    run_where(&g, "second", "the second run complete once the first is", |r| {
        r.status.as_ref().is_some_and(|s| s.completion_result.as_deref() == Some("Success"))
    })
    .await;
}

#[tokio::test]
async fn a_binding_is_generated_only_when_none_exists_and_outlives_its_run() {
    let g = ground("as-promo-generate").await;
    plain_env(&g, "prod").await;
    plain_env(&g, "staging").await;
    application(&g, APP).await;
    application(&g, "other-app").await;
    snapshot(&g).await;
    component(&g, "comp1").await;
    // Bindings that do not match: another environment, another application.
    binding(&g, "staging-binding", APP, "staging", &["comp1"]).await;
    binding(&g, "other-binding", "other-app", "prod", &["comp1"]).await;

    g.create(&run("promote", "prod")).await;
    let generated = eventually("the generated binding", || async {
        g.get::<SnapshotEnvironmentBinding>("new-demo-app-prod-generated-binding").await
    })
    .await;
    assert_eq!(generated.spec.snapshot, "my-snapshot");
    assert_eq!(generated.spec.components.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["comp1"]);
    assert_eq!(generated.labels().get(GENERATED_BY_LABEL).map(String::as_str), Some("promote"));
    assert_eq!(generated.labels().get("appstudio.environment").map(String::as_str), Some("prod"));
    assert!(generated.owner_references().is_empty(), "no owner: deleting the run must not collect it");
    run_where(&g, "promote", "the generated binding active", |r| {
        r.status.as_ref().is_some_and(|s| s.active_bindings == ["new-demo-app-prod-generated-binding"])
    })
    .await;

    g.api::<PromotionRun>().delete("promote", &DeleteParams::foreground()).await.expect("delete the run");
    eventually("the run gone", || async { g.get::<PromotionRun>("promote").await.is_none().then_some(()) }).await;
    assert!(
        g.get::<SnapshotEnvironmentBinding>("new-demo-app-prod-generated-binding").await.is_some(),
        "the binding outlives the run"
    );

    // With a binding for (application, staging), a run to staging uses it.
    g.create(&run("to-staging", "staging")).await;
    run_where(&g, "to-staging", "the existing binding used", |r| {
        r.status.as_ref().is_some_and(|s| s.active_bindings == ["staging-binding"])
    })
    .await;
    assert!(g.get::<SnapshotEnvironmentBinding>("new-demo-app-staging-generated-binding").await.is_none());
}
