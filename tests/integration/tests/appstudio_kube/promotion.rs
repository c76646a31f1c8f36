//! PromotionRun, manual: ported from the original's promotion cases, plus the fixes
//! (OutOfSync is not done, the timeout applies, a generated binding outlives its run
//! and wakes it through its label, a run without Components says so, one active
//! promotion per application and namespace), and the controller's re-check of what
//! the webhook keeps fixed (a run's spec, a Snapshot's application and components).

use std::time::Duration;

use gitops_appstudio::api::{
    Component, ComponentSpec, PromotionRun, PromotionRunCondition, PromotionRunEnvironmentStatus, PromotionRunSpec,
    Snapshot, SnapshotComponent, SnapshotEnvironmentBinding, SnapshotSpec,
};
use gitops_appstudio::binding::IMMUTABLE_FIELD_CHANGED;
use gitops_appstudio::binding::snapshot::{SNAPSHOT_USED_ANNOTATION, SnapshotUsed};
use gitops_appstudio::context::Settings;
use gitops_appstudio::names::MANAGED_ENVIRONMENT_SECRET_TYPE;
use gitops_appstudio::promotion::{
    ACTIVE_PROMOTION_EXISTS, GENERATED_BY_LABEL, SPEC_ANNOTATION, TARGET_INVALID, WAITING_FOR_DEPLOYMENTS,
};
use gitops_writer::api::GitOpsDeployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

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

const GENERATED: &str = "new-demo-app-prod-generated-binding";

/// prod (the namespace itself), the application, the Snapshot and Component `comp1`:
/// a run to prod generates its binding.
async fn generating_ground(g: &Ground) {
    plain_env(g, "prod").await;
    application(g, APP).await;
    snapshot(g).await;
    component(g, "comp1").await;
}

/// Plays the repository generator and the core for the generated binding of prod:
/// its one deployment is Synced and Healthy.
async fn generated_binding_deploys(g: &Ground) -> String {
    generator_writes(g, GENERATED, &[("comp1", "components/comp1/overlays/prod")]).await;
    let deployment = format!("{GENERATED}-{APP}-prod-comp1");
    eventually("the generated binding's deployment", || async { g.get::<GitOpsDeployment>(&deployment).await }).await;
    core_reports(g, &deployment, "Synced", "Healthy").await;
    deployment
}

fn succeeded(run: &PromotionRun) -> bool {
    run.status.as_ref().is_some_and(|s| s.completion_result.as_deref() == Some("Success"))
}

/// The original's generated binding had no owner and its `Owns` watch never fired;
/// a poll hid that. Here the poll (and the resync) is an hour: only the binding's
/// watch, through the label naming the run, can bring the run on within the deadline.
/// Deleting the run afterwards leaves the binding and its deployment.
#[tokio::test]
async fn the_generated_binding_wakes_its_run_through_its_label_and_outlives_it() {
    let hour = Duration::from_secs(3600);
    let settings = Settings { promotion_poll: hour, resync_interval: hour, ..Settings::default() };
    let g = ground_with("as-promo-label", settings).await;
    generating_ground(&g).await;
    g.create(&run("promote", "prod")).await;
    let generated =
        eventually("the generated binding", || async { g.get::<SnapshotEnvironmentBinding>(GENERATED).await }).await;
    assert_eq!(generated.labels().get(GENERATED_BY_LABEL).map(String::as_str), Some("promote"));
    assert!(generated.owner_references().is_empty(), "no owner: deleting the run must not collect it");
    run_where(&g, "promote", "the run waiting for the generator", |r| {
        r.status.as_ref().is_some_and(|s| {
            s.active_bindings == [GENERATED]
                && s.environment_status.iter().any(|e| e.display_status == WAITING_FOR_DEPLOYMENTS)
        })
    })
    .await;

    let deployment = generated_binding_deploys(&g).await;
    run_where(&g, "promote", "the run woken by its binding", succeeded).await;

    // A dependent of the run, to know the garbage collector has acted on its deletion.
    let run = g.get::<PromotionRun>("promote").await.expect("the run");
    let mut owner = run.controller_owner_ref(&()).expect("an owner reference");
    owner.controller = None;
    owner.block_owner_deletion = Some(true);
    let mut witness = ConfigMap::default();
    witness.metadata.name = Some("run-dependent".into());
    witness.metadata.owner_references = Some(vec![owner]);
    g.api::<ConfigMap>().create(&PostParams::default(), &witness).await.expect("the run's dependent");
    g.api::<PromotionRun>().delete("promote", &DeleteParams::foreground()).await.expect("delete the run");
    eventually("the run and its dependent gone", || async {
        let gone =
            g.get::<PromotionRun>("promote").await.is_none() && g.get::<ConfigMap>("run-dependent").await.is_none();
        gone.then_some(())
    })
    .await;
    assert!(g.get::<SnapshotEnvironmentBinding>(GENERATED).await.is_some(), "the binding outlives the run");
    assert!(g.get::<GitOpsDeployment>(&deployment).await.is_some(), "so does its deployment");
}

/// The original logged the error of a run with nothing to promote and never looked
/// again; here the run says why, and goes on once a Component appears.
#[tokio::test]
async fn a_run_of_an_application_without_components_says_so_and_goes_on_once_it_has_one() {
    let g = ground("as-promo-nocomp").await;
    plain_env(&g, "prod").await;
    application(&g, APP).await;
    snapshot(&g).await;
    g.create(&run("promote", "prod")).await;
    let stuck = run_where(&g, "promote", "the run's condition", |r| error_message(r).is_some()).await;
    let conditions = without_times(&stuck.status.expect("status").conditions);
    assert_eq!(
        conditions,
        vec![PromotionRunCondition {
            type_: "ErrorOccurred".into(),
            status: "True".into(),
            reason: Some("ErrorOccurred".into()),
            message: Some(format!("no Components of Application {APP} to promote to Environment prod")),
            ..Default::default()
        }]
    );
    assert!(g.get::<SnapshotEnvironmentBinding>(GENERATED).await.is_none());

    component(&g, "comp1").await;
    eventually("the binding generated", || async { g.get::<SnapshotEnvironmentBinding>(GENERATED).await }).await;
    run_where(&g, "promote", "the condition cleared", |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "ErrorOccurred" && c.status == "False"))
    })
    .await;
}

/// The original counted active promotions cluster-wide: of two namespaces with an
/// application of the same name, one run waited for the other's. Here each namespace
/// has its own: both runs are active at once and both complete.
#[tokio::test]
async fn same_named_applications_in_two_namespaces_promote_at_once() {
    let grounds = [ground("as-promo-ns-a").await, ground("as-promo-ns-b").await];
    for g in &grounds {
        generating_ground(g).await;
        g.create(&run("promote", "prod")).await;
    }
    // Neither can complete before the generator writes, so both are unfinished while
    // each gets past the check.
    for g in &grounds {
        let active = run_where(g, "promote", "the run active", |r| {
            r.status.as_ref().is_some_and(|s| s.active_bindings == [GENERATED] && s.state != "Complete")
        })
        .await;
        assert_eq!(error_message(&active), None, "in {}", g.ns());
    }
    for g in &grounds {
        generated_binding_deploys(g).await;
    }
    for g in &grounds {
        run_where(g, "promote", "the run complete", succeeded).await;
    }
}

/// Without the webhook, a run whose spec changed after it started does not follow
/// it: it records the spec it started with, reports `ImmutableFieldChanged` with the
/// webhook's words, leaves the binding alone, and goes on once the spec is back.
#[tokio::test]
async fn a_changed_run_spec_is_refused_by_the_controller() {
    let g = promotion_ground("as-promo-immutable", Settings::default()).await;
    g.create(&Snapshot::new("other-snapshot", SnapshotSpec { application: APP.into(), ..SnapshotSpec::default() }))
        .await;
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
    let recorded: PromotionRunSpec =
        serde_json::from_str(waiting.annotations().get(SPEC_ANNOTATION).expect("the spec recorded"))
            .expect("the recorded spec");
    assert_eq!(recorded, run("promote-to-prod", "prod").spec);

    g.patch::<PromotionRun>("promote-to-prod", json!({"spec": {"snapshot": "other-snapshot"}})).await;
    let refused = run_where(&g, "promote-to-prod", "the change refused", |r| {
        r.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| c.reason.as_deref() == Some(IMMUTABLE_FIELD_CHANGED) && c.status == "True")
        })
    })
    .await;
    let message = error_message(&refused).expect("the refusal");
    assert!(
        message.starts_with(
            "spec cannot be updated to {Snapshot:other-snapshot Application:new-demo-app \
             ManualPromotion:{TargetEnvironment:prod} AutomatedPromotion:{InitialEnvironment:}}; "
        ),
        "{message}"
    );
    let bound = g.get::<SnapshotEnvironmentBinding>("appa-prod-binding").await.expect("the binding");
    assert_eq!(bound.spec.snapshot, "my-snapshot", "the binding is not pointed at the changed spec's Snapshot");

    g.patch::<PromotionRun>("promote-to-prod", json!({"spec": {"snapshot": "my-snapshot"}})).await;
    core_reports(&g, &deployment, "Synced", "Healthy").await;
    run_where(&g, "promote-to-prod", "the run complete once the spec is back", succeeded).await;
}

fn snapshot_of(image: &str) -> Snapshot {
    Snapshot::new(
        "my-snapshot",
        SnapshotSpec {
            application: APP.into(),
            components: vec![SnapshotComponent { name: "comp1".into(), container_image: image.into(), source: None }],
            ..SnapshotSpec::default()
        },
    )
}

/// Without the webhook, a Snapshot changed after a binding used it is reported on
/// the binding (`ImmutableFieldChanged`, the webhook's words) instead of deployed:
/// the generator's later report is not acted on until the Snapshot is back.
#[tokio::test]
async fn a_binding_whose_snapshot_changed_reports_it_instead_of_deploying() {
    let g = ground("as-promo-snapshot").await;
    plain_env(&g, "prod").await;
    application(&g, APP).await;
    let snapshot = g.create(&snapshot_of("registry.example.invalid/comp1:1")).await;
    binding(&g, "appa-binding", APP, "prod", &["comp1"]).await;
    generator_writes(&g, "appa-binding", &[("comp1", "path/one")]).await;
    let deployment = format!("appa-binding-{APP}-prod-comp1");
    let used = binding_where(&g, "appa-binding", "the Snapshot recorded", |b| {
        b.annotations().contains_key(SNAPSHOT_USED_ANNOTATION)
    })
    .await;
    let used: SnapshotUsed =
        serde_json::from_str(&used.annotations()[SNAPSHOT_USED_ANNOTATION]).expect("the recorded Snapshot");
    assert_eq!((used.snapshot.as_str(), used.uid.as_str()), ("my-snapshot", snapshot.uid().expect("uid").as_str()));
    eventually("the deployment at the first path", || async {
        g.get::<GitOpsDeployment>(&deployment).await.filter(|d| d.spec.source.path == "path/one")
    })
    .await;

    let changed =
        json!({"spec": {"components": [{"name": "comp1", "containerImage": "registry.example.invalid/comp1:2"}]}});
    g.patch::<Snapshot>("my-snapshot", changed).await;
    // Any reconcile that sees this report reads the Snapshot after the change.
    generator_writes(&g, "appa-binding", &[("comp1", "path/two")]).await;
    let refused = binding_where(&g, "appa-binding", "the change reported", |b| {
        b.status.as_ref().is_some_and(|s| {
            s.binding_conditions.iter().any(|c| c.type_ == "Reconciled" && c.reason == IMMUTABLE_FIELD_CHANGED)
        })
    })
    .await;
    let message = refused.status.expect("status").binding_conditions.into_iter().find(|c| c.type_ == "Reconciled");
    let message = message.expect("Reconciled").message;
    assert!(
        message.starts_with(
            "Snapshot my-snapshot: components cannot be updated to \
             [{Name:comp1 ContainerImage:registry.example.invalid/comp1:2}]"
        ),
        "{message}"
    );
    let kept = g.get::<GitOpsDeployment>(&deployment).await.expect("the deployment stays");
    assert_eq!(kept.spec.source.path, "path/one", "the later report is not deployed");

    g.patch::<Snapshot>(
        "my-snapshot",
        json!({"spec": {"components": [{"name": "comp1", "containerImage": "registry.example.invalid/comp1:1"}]}}),
    )
    .await;
    eventually("the later report deployed once the Snapshot is back", || async {
        g.get::<GitOpsDeployment>(&deployment).await.filter(|d| d.spec.source.path == "path/two")
    })
    .await;
}
