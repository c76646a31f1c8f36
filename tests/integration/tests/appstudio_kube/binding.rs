//! SnapshotEnvironmentBinding → one GitOpsDeployment per component, ported from the
//! original's binding end-to-end cases. The test plays the repository generator
//! (writing `status.components` and `gitopsRepoConditions`) and the core (writing
//! the GitOpsDeployments' sync and health); `binding_core` has the case that needs
//! the real core (a component at a path the repository lacks).

use std::sync::Arc;
use std::time::Duration;

use gitops_appstudio::api::{
    Application, ApplicationSpec, BindingComponent, BindingStatusGitOpsDeployment, Condition,
    SnapshotEnvironmentBinding, SnapshotEnvironmentBindingSpec,
};
use gitops_appstudio::binding::{BOUND_TO_ANNOTATION, IMMUTABLE_FIELD_CHANGED};
use gitops_appstudio::context::Settings;
use gitops_appstudio::metrics::Metrics;
use gitops_appstudio::names::sha256_hex;
use gitops_writer::api::GitOpsDeployment;
use kube::ResourceExt;
use kube::api::DeleteParams;
use serde_json::{Value, json};

use super::environment::{bound_pair, claim_env, credentials, credentials_env};
use super::{Ground, ground, ground_counted, reconciled_since_now};
use crate::support::eventually;
use gitops_appstudio::api::{DeploymentTarget, Environment, EnvironmentSpec};
use gitops_appstudio::names::MANAGED_ENVIRONMENT_SECRET_TYPE;

const REPO: &str = "https://git.example.invalid/org/gitops-repo";
const APP: &str = "new-demo-app";

pub(crate) async fn application(g: &Ground, name: &str) {
    g.create(&Application::new(name, ApplicationSpec { display_name: name.to_owned(), ..ApplicationSpec::default() }))
        .await;
}

pub(crate) async fn plain_env(g: &Ground, name: &str) {
    g.create(&Environment::new(name, EnvironmentSpec { display_name: name.to_owned(), ..EnvironmentSpec::default() }))
        .await;
}

pub(crate) async fn binding(
    g: &Ground,
    name: &str,
    app: &str,
    env: &str,
    components: &[&str],
) -> SnapshotEnvironmentBinding {
    g.create(&SnapshotEnvironmentBinding::new(
        name,
        SnapshotEnvironmentBindingSpec {
            application: app.to_owned(),
            environment: env.to_owned(),
            snapshot: "my-snapshot".into(),
            components: components
                .iter()
                .map(|c| BindingComponent { name: (*c).to_owned(), configuration: None })
                .collect(),
        },
    ))
    .await
}

pub(crate) fn overlay(component: &str, env: &str) -> String {
    format!("components/{component}/overlays/{env}")
}

/// Plays the repository generator: `(component, path)` into `status.components`.
pub(crate) async fn generator_writes(g: &Ground, binding: &str, components: &[(&str, &str)]) {
    let components: Vec<Value> = components
        .iter()
        .map(|(name, path)| {
            json!({"name": name, "gitopsRepository": {"url": REPO, "branch": "main", "path": path,
                "generatedResources": ["deployment.yaml"], "commitID": "1f2e3d4c"}})
        })
        .collect();
    g.patch_status::<SnapshotEnvironmentBinding>(binding, json!({"components": components})).await;
}

/// Plays the core: a deployment's sync and health as the writer reports them.
pub(crate) async fn core_reports(g: &Ground, deployment: &str, sync: &str, health: &str) {
    g.patch_status::<GitOpsDeployment>(
        deployment,
        json!({"sync": {"status": sync, "revision": "1f2e3d4c"}, "health": {"status": health}}),
    )
    .await;
}

async fn deployment_where(
    g: &Ground,
    name: &str,
    what: &str,
    check: impl Fn(&GitOpsDeployment) -> bool,
) -> GitOpsDeployment {
    eventually(what, || async { g.get::<GitOpsDeployment>(name).await.filter(|d| check(d)) }).await
}

async fn gone(g: &Ground, name: &str, what: &str) {
    eventually(what, || async { g.get::<GitOpsDeployment>(name).await.is_none().then_some(()) }).await;
}

pub(crate) async fn binding_where(
    g: &Ground,
    name: &str,
    what: &str,
    check: impl Fn(&SnapshotEnvironmentBinding) -> bool,
) -> SnapshotEnvironmentBinding {
    eventually(what, || async { g.get::<SnapshotEnvironmentBinding>(name).await.filter(|b| check(b)) }).await
}

/// Edits `name`'s annotations, so the binding controller looks at it again.
pub(crate) async fn nudge(g: &Ground, name: &str, round: u32) {
    g.patch::<SnapshotEnvironmentBinding>(name, json!({"metadata": {"annotations": {"nudge": round.to_string()}}}))
        .await;
}

pub(crate) fn deployed(binding: &SnapshotEnvironmentBinding) -> Option<Condition> {
    binding
        .status
        .as_ref()?
        .component_deployment_conditions
        .iter()
        .find(|c| c.type_ == "AllComponentsDeployed")
        .cloned()
}

fn binding_condition(binding: &SnapshotEnvironmentBinding, type_: &str) -> Option<Condition> {
    binding.status.as_ref()?.binding_conditions.iter().find(|c| c.type_ == type_).cloned()
}

#[tokio::test]
async fn deployments_follow_the_component_status_and_report_back() {
    let g = ground("as-seb-follow").await;
    plain_env(&g, "staging").await;
    application(&g, APP).await;
    let seb = binding(&g, "appa-staging-binding", APP, "staging", &["component-a", "component-b"]).await;
    generator_writes(
        &g,
        "appa-staging-binding",
        &[("component-a", &overlay("component-a", "staging")), ("component-b", &overlay("component-b", "staging"))],
    )
    .await;
    let (a, b) = (
        "appa-staging-binding-new-demo-app-staging-component-a",
        "appa-staging-binding-new-demo-app-staging-component-b",
    );
    for (name, component) in [(a, "component-a"), (b, "component-b")] {
        let deployment = deployment_where(&g, name, "the component's GitOpsDeployment", |_| true).await;
        assert_eq!(deployment.spec.source.repo_url, REPO);
        assert_eq!(deployment.spec.source.path, overlay(component, "staging"));
        assert_eq!(deployment.spec.source.target_revision.as_deref(), Some("main"));
        assert_eq!(deployment.spec.type_, "automated");
        assert_eq!(deployment.spec.destination, Default::default(), "no cluster: the namespace itself");
        let owner = &deployment.owner_references()[0];
        assert_eq!((owner.name.as_str(), Some(&owner.uid)), ("appa-staging-binding", seb.metadata.uid.as_ref()));
        assert_eq!((owner.controller, owner.block_owner_deletion), (Some(true), Some(true)));
        let labels = deployment.labels();
        assert_eq!(labels.get("appstudio.openshift.io/application").map(String::as_str), Some(APP));
        assert_eq!(labels.get("appstudio.openshift.io/component").map(String::as_str), Some(component));
        assert_eq!(labels.get("appstudio.openshift.io/environment").map(String::as_str), Some("staging"));
    }

    // The core reports both Synced/Healthy: the binding says so, sorted by component.
    core_reports(&g, a, "Synced", "Healthy").await;
    core_reports(&g, b, "Synced", "Healthy").await;
    let synced = binding_where(&g, "appa-staging-binding", "2 of 2 components deployed", |b| {
        deployed(b).is_some_and(|c| c.message == "2 of 2 components deployed")
    })
    .await;
    let status = synced.status.expect("status");
    assert_eq!(
        status.gitops_deployments,
        vec![
            BindingStatusGitOpsDeployment {
                component_name: "component-a".into(),
                gitops_deployment: a.into(),
                sync_status: "Synced".into(),
                health: "Healthy".into(),
                commit_id: "1f2e3d4c".into(),
            },
            BindingStatusGitOpsDeployment {
                component_name: "component-b".into(),
                gitops_deployment: b.into(),
                sync_status: "Synced".into(),
                health: "Healthy".into(),
                commit_id: "1f2e3d4c".into(),
            },
        ]
    );
    assert_eq!(status.component_deployment_conditions.len(), 1);
    let condition = &status.component_deployment_conditions[0];
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("True", "CommitsSynced"));

    // The repository generator moves component-a: its deployment follows.
    generator_writes(
        &g,
        "appa-staging-binding",
        &[("component-a", "moved/a"), ("component-b", &overlay("component-b", "staging"))],
    )
    .await;
    deployment_where(&g, a, "the new path", |d| d.spec.source.path == "moved/a").await;

    // Edits by hand are reverted: the source path, and the layer's labels.
    g.patch::<GitOpsDeployment>(a, json!({"spec": {"source": {"path": "edited/by/hand"}}})).await;
    g.patch::<GitOpsDeployment>(
        b,
        json!({"metadata": {"labels": {"appstudio.openshift.io/component": null, "team": "x"}}}),
    )
    .await;
    deployment_where(&g, a, "the path edit reverted", |d| d.spec.source.path == "moved/a").await;
    let labelled = deployment_where(&g, b, "the label restored", |d| {
        d.labels().get("appstudio.openshift.io/component").map(String::as_str) == Some("component-b")
    })
    .await;
    assert_eq!(labelled.labels().get("team").map(String::as_str), Some("x"), "foreign labels are kept");

    // A deleted deployment is recreated.
    g.api::<GitOpsDeployment>().delete(a, &DeleteParams::default()).await.expect("delete");
    eventually("the deployment recreated", || async {
        let deployment = g.get::<GitOpsDeployment>(a).await?;
        (deployment.metadata.deletion_timestamp.is_none() && deployment.spec.source.path == "moved/a").then_some(())
    })
    .await;

    // A component no longer listed loses its deployment; the other stays.
    generator_writes(&g, "appa-staging-binding", &[("component-a", "moved/a")]).await;
    gone(&g, b, "component-b's deployment deleted").await;
    assert!(g.get::<GitOpsDeployment>(a).await.is_some(), "component-a's deployment stays");
    binding_where(&g, "appa-staging-binding", "the status lists one", |b| {
        b.status.as_ref().is_some_and(|s| s.gitops_deployments.len() == 1)
    })
    .await;

    // No components at all: every deployment goes, and the binding says it waits.
    g.patch_status::<SnapshotEnvironmentBinding>("appa-staging-binding", json!({"components": null})).await;
    gone(&g, a, "component-a's deployment deleted").await;
    let waiting = binding_where(&g, "appa-staging-binding", "the waiting condition", |b| {
        binding_condition(b, "ErrorOccurred").is_some_and(|c| c.status == "True")
    })
    .await;
    assert_eq!(
        binding_condition(&waiting, "ErrorOccurred").expect("ErrorOccurred").message,
        "SnapshotEventBinding Component status is required to generate GitOps deployment, waiting for the \
         Application Service controller to finish reconciling binding 'appa-staging-binding'"
    );
}

#[tokio::test]
async fn long_names_use_the_shorter_forms() {
    let g = ground("as-seb-names").await;
    let (env, app) = ("e".repeat(63), "a".repeat(63));
    plain_env(&g, &env).await;
    application(&g, &app).await;
    let long_binding = "b".repeat(111);
    binding(&g, &long_binding, &app, &env, &["component-a"]).await;
    generator_writes(&g, &long_binding, &[("component-a", "path/a")]).await;
    let short = format!("{long_binding}-component-a");
    deployment_where(&g, &short, "<binding>-<component>", |d| d.spec.source.path == "path/a").await;
    assert!(g.get::<GitOpsDeployment>(&format!("{long_binding}-{app}-{env}-component-a")).await.is_none());

    // (Another Environment: one binding per application and environment.)
    let other_env = "f".repeat(63);
    plain_env(&g, &other_env).await;
    let longer_binding = "abcde".repeat(50);
    binding(&g, &longer_binding, &app, &other_env, &["component-a"]).await;
    generator_writes(&g, &longer_binding, &[("component-a", "path/a")]).await;
    let long = format!("{longer_binding}-component-a");
    let hashed = format!("{}-{}", &long[..180], sha256_hex(&long));
    deployment_where(&g, &hashed, "the hashed name", |_| true).await;
    binding_where(&g, &longer_binding, "the hashed name in the status", |b| {
        b.status.as_ref().is_some_and(|s| s.gitops_deployments.iter().any(|d| d.gitops_deployment == hashed))
    })
    .await;
    assert!(g.get::<GitOpsDeployment>(&long).await.is_none(), "the over-long name is never tried");
}

#[tokio::test]
async fn the_destination_follows_the_environments_mode() {
    let g = ground("as-seb-destination").await;
    application(&g, APP).await;
    g.secret("creds", MANAGED_ENVIRONMENT_SECRET_TYPE, "k").await;
    g.create(&credentials_env("staging", credentials("creds", "namespace1"))).await;
    binding(&g, "seb", APP, "staging", &["component-a"]).await;
    generator_writes(&g, "seb", &[("component-a", "path/a")]).await;
    let name = "seb-new-demo-app-staging-component-a";
    let at = |namespace: &'static str| {
        move |d: &GitOpsDeployment| {
            d.spec.destination.namespace.as_deref() == Some(namespace)
                && d.spec.destination.environment.as_deref() == Some("managed-environment-staging")
        }
    };
    deployment_where(&g, name, "the target namespace", at("namespace1")).await;
    g.patch::<Environment>(
        "staging",
        json!({"spec": {"unstableConfigurationFields": {"targetNamespace": "namespace2"}}}),
    )
    .await;
    deployment_where(&g, name, "the new target namespace", at("namespace2")).await;

    // Switched to a claim: the bound target's default namespace.
    g.secret("dt-secret", "Opaque", "k").await;
    bound_pair(&g, "dtc", "dt", "space-one", "dt-secret").await;
    g.patch::<Environment>(
        "staging",
        json!({"spec": {"unstableConfigurationFields": null,
            "configuration": {"target": {"deploymentTargetClaim": {"claimName": "dtc"}}}}}),
    )
    .await;
    deployment_where(&g, name, "the target's default namespace", at("space-one")).await;
    g.patch::<DeploymentTarget>("dt", json!({"spec": {"kubernetesCredentials": {"defaultNamespace": "space-two"}}}))
        .await;
    deployment_where(&g, name, "the target's new default namespace", at("space-two")).await;

    // Back to credentials.
    let mut back = credentials("creds", "namespace1");
    back.allow_insecure_skip_tls_verify = false;
    g.patch::<Environment>(
        "staging",
        json!({"spec": {"unstableConfigurationFields": serde_json::to_value(&back).expect("json"),
            "configuration": {"target": {"deploymentTargetClaim": {"claimName": ""}}}}}),
    )
    .await;
    deployment_where(&g, name, "the credentials' namespace again", at("namespace1")).await;

    // A claim that does not exist: the original's message.
    g.create(&claim_env("prod", "dtc-doesnt-exist")).await;
    binding(&g, "seb-prod", APP, "prod", &["component-a"]).await;
    generator_writes(&g, "seb-prod", &[("component-a", "path/a")]).await;
    let refused = binding_where(&g, "seb-prod", "the missing claim reported", |b| {
        binding_condition(b, "Reconciled").is_some_and(|c| c.reason == "ErrorGeneratingGitOpsDeployment")
    })
    .await;
    assert_eq!(
        binding_condition(&refused, "ErrorOccurred").expect("ErrorOccurred").message,
        "DeploymentTargetClaim referenced by Environment does not exist."
    );
    assert_eq!(
        binding_condition(&refused, "Reconciled").expect("Reconciled").reason,
        "ErrorGeneratingGitOpsDeployment"
    );
}

#[tokio::test]
async fn appstudio_labels_of_the_binding_are_copied_and_follow() {
    let g = ground("as-seb-labels").await;
    plain_env(&g, "staging").await;
    application(&g, APP).await;
    binding(&g, "seb", APP, "staging", &["component-a"]).await;
    g.patch::<SnapshotEnvironmentBinding>(
        "seb",
        json!({"metadata": {"labels": {"appstudio.openshift.io": "testing", "unrelated": "value"}}}),
    )
    .await;
    generator_writes(&g, "seb", &[("component-a", "path/a")]).await;
    let name = "seb-new-demo-app-staging-component-a";
    let copied = deployment_where(&g, name, "the appstudio label copied", |d| {
        d.labels().get("appstudio.openshift.io").map(String::as_str) == Some("testing")
    })
    .await;
    assert!(!copied.labels().contains_key("unrelated"), "other labels are not copied");
    g.patch::<SnapshotEnvironmentBinding>(
        "seb",
        json!({"metadata": {"labels": {"appstudio.openshift.io": "changed"}}}),
    )
    .await;
    deployment_where(&g, name, "the new value", |d| {
        d.labels().get("appstudio.openshift.io").map(String::as_str) == Some("changed")
    })
    .await;
    g.patch::<SnapshotEnvironmentBinding>("seb", json!({"metadata": {"labels": {"appstudio.openshift.io": null}}}))
        .await;
    let removed =
        deployment_where(&g, name, "the label removed", |d| !d.labels().contains_key("appstudio.openshift.io")).await;
    assert_eq!(removed.labels().get("appstudio.openshift.io/component").map(String::as_str), Some("component-a"));
}

#[tokio::test]
async fn repository_generator_conditions_gate_the_binding() {
    let g = ground("as-seb-gate").await;
    plain_env(&g, "staging").await;
    application(&g, APP).await;
    binding(&g, "seb", APP, "staging", &["component-a"]).await;
    let waiting = binding_where(&g, "seb", "waiting for the repository generator", |b| {
        binding_condition(b, "ErrorOccurred").is_some_and(|c| c.status == "True")
    })
    .await;
    assert!(
        binding_condition(&waiting, "ErrorOccurred")
            .expect("condition")
            .message
            .contains("waiting for the Application Service controller")
    );

    let repo_condition = |status: &str| {
        json!([{"type": "GitOpsResourcesGenerated", "status": status, "reason": "Generated", "message": "",
            "lastTransitionTime": "2024-01-01T00:00:00Z"}])
    };
    generator_writes(&g, "seb", &[("component-a", "path/a")]).await;
    g.patch_status::<SnapshotEnvironmentBinding>("seb", json!({"gitopsRepoConditions": repo_condition("False")})).await;
    let not_ready = binding_where(&g, "seb", "GitOpsRepoNotReady", |b| {
        binding_condition(b, "Reconciled").is_some_and(|c| c.reason == "GitOpsRepoNotReady")
    })
    .await;
    let error = binding_condition(&not_ready, "ErrorOccurred").expect("ErrorOccurred");
    assert_eq!(error.status, "True");
    assert_eq!(error.message, "Cannot Reconcile Binding 'seb', since GitOps Repo Conditions status is false.");

    g.patch_status::<SnapshotEnvironmentBinding>("seb", json!({"gitopsRepoConditions": repo_condition("True")})).await;
    let ready = binding_where(&g, "seb", "ErrorOccurred False", |b| {
        binding_condition(b, "ErrorOccurred").is_some_and(|c| c.status == "False")
    })
    .await;
    assert_eq!(binding_condition(&ready, "ErrorOccurred").expect("ErrorOccurred").message, "");
    assert_eq!(binding_condition(&ready, "Reconciled").expect("Reconciled").status, "True");
    deployment_where(&g, "seb-new-demo-app-staging-component-a", "the deployment once ready", |_| true).await;

    // Two entries for one component: refused, with the original's message.
    generator_writes(&g, "seb", &[("component-a", "path/a"), ("component-a", "path/b")]).await;
    let duplicate = binding_where(&g, "seb", "DuplicateComponents", |b| {
        binding_condition(b, "Reconciled").is_some_and(|c| c.reason == "DuplicateComponents")
    })
    .await;
    assert_eq!(
        binding_condition(&duplicate, "ErrorOccurred").expect("ErrorOccurred").message,
        "duplicate component keys found in status field in component-a"
    );
}

/// How long a binding outlives its Application in [`a_binding_outlives_its_application_by_the_delay`]
/// (the original's 3 minutes): long enough that the binding is still young when the
/// test has seen the layer look at it without its Application, short for the test.
const ORPHAN_DELAY: Duration = Duration::from_secs(5);

/// The original deletes a binding whose Application is gone once the binding is
/// older than a delay (the Application may simply not be created yet). Both sides:
/// a reconcile that began after the Application was deleted leaves the binding and
/// its deployment in place (with no delay it would have deleted them), and after the
/// delay the binding goes, its deployment with it (garbage collection).
#[tokio::test]
async fn a_binding_outlives_its_application_by_the_delay() {
    let metrics = Arc::new(Metrics::default());
    let settings = Settings { orphan_binding_delay: ORPHAN_DELAY, ..Settings::default() };
    let g = ground_counted("as-seb-orphan", settings, metrics.clone()).await;
    plain_env(&g, "staging").await;
    application(&g, APP).await;
    let created = binding(&g, "seb", APP, "staging", &["component-a"]).await;
    generator_writes(&g, "seb", &[("component-a", "path/a")]).await;
    let deployment = "seb-new-demo-app-staging-component-a";
    deployment_where(&g, deployment, "the binding's deployment", |_| true).await;

    g.api::<Application>().delete(APP, &DeleteParams::default()).await.expect("delete the Application");
    eventually("the Application gone", || async { g.get::<Application>(APP).await.is_none().then_some(()) }).await;
    reconciled_since_now(&metrics, "binding", |round| nudge(&g, "seb", round)).await;
    let kept = g.get::<SnapshotEnvironmentBinding>("seb").await;
    let age = created
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|created| k8s_openapi::jiff::Timestamp::now().duration_since(created.0));
    assert!(
        kept.is_some_and(|b| b.metadata.deletion_timestamp.is_none()),
        "the binding is kept while younger than the delay (its age: {age:?})"
    );
    assert!(g.get::<GitOpsDeployment>(deployment).await.is_some(), "its deployment stays meanwhile");

    let failures = reconcile_failures(&metrics);
    eventually("the binding deleted after the delay", || async {
        g.get::<SnapshotEnvironmentBinding>("seb").await.is_none().then_some(())
    })
    .await;
    gone(&g, deployment, "its deployment collected with it").await;
    // The deletion reached the controller (a binding made after it has been
    // reconciled since) and was no failed reconcile of a binding no longer there.
    application(&g, APP).await;
    binding(&g, "later", APP, "staging", &["component-a"]).await;
    reconciled_since_now(&metrics, "binding", |round| nudge(&g, "later", round)).await;
    assert_eq!(reconcile_failures(&metrics), failures, "no failed reconcile for the deleted binding");
}

/// The binding controller's failed reconciles, from the layer's metrics.
fn reconcile_failures(metrics: &Metrics) -> f64 {
    let series = "gitops_appstudio_reconcile_failures_total{controller=\"binding\"}";
    crate::support::sample(&metrics.render(), series).expect("the binding failure count")
}

/// Of two bindings for one application and environment only the older acts; the
/// other reports the duplicate and generates nothing.
#[tokio::test]
async fn only_the_oldest_duplicate_binding_acts() {
    let g = ground("as-seb-duplicates").await;
    plain_env(&g, "staging").await;
    application(&g, APP).await;
    binding(&g, "first", APP, "staging", &["component-a"]).await;
    generator_writes(&g, "first", &[("component-a", "path/a")]).await;
    deployment_where(&g, "first-new-demo-app-staging-component-a", "the first binding's deployment", |_| true).await;

    binding(&g, "second", APP, "staging", &["component-a"]).await;
    generator_writes(&g, "second", &[("component-a", "path/a")]).await;
    let duplicate = binding_where(&g, "second", "the duplicate reported", |b| {
        binding_condition(b, "Reconciled").is_some_and(|c| c.reason == "DuplicateBinding")
    })
    .await;
    assert!(
        binding_condition(&duplicate, "ErrorOccurred")
            .expect("ErrorOccurred")
            .message
            .ends_with("Duplicated by: first")
    );
    assert!(g.get::<GitOpsDeployment>("second-new-demo-app-staging-component-a").await.is_none());
}

/// Where no webhook keeps a binding's application and environment fixed, the
/// controller does: a binding moved to another environment gets the webhook's words
/// as a condition and generates nothing there, its deployments stay, and moving it
/// back resumes it.
#[tokio::test]
async fn a_binding_moved_to_another_environment_is_refused_by_the_controller() {
    let g = ground("as-seb-moved").await;
    plain_env(&g, "staging").await;
    plain_env(&g, "prod").await;
    application(&g, APP).await;
    binding(&g, "appa-binding", APP, "staging", &["component-a"]).await;
    generator_writes(&g, "appa-binding", &[("component-a", &overlay("component-a", "staging"))]).await;
    let staging = "appa-binding-new-demo-app-staging-component-a";
    deployment_where(&g, staging, "the staging deployment", |_| true).await;
    binding_where(&g, "appa-binding", "what the binding is for recorded", |b| {
        b.annotations().get(BOUND_TO_ANNOTATION).map(String::as_str) == Some("new-demo-app/staging")
    })
    .await;

    g.patch::<SnapshotEnvironmentBinding>("appa-binding", json!({"spec": {"environment": "prod"}})).await;
    let moved = binding_where(&g, "appa-binding", "the move refused", |b| {
        binding_condition(b, "Reconciled").is_some_and(|c| c.reason == IMMUTABLE_FIELD_CHANGED)
    })
    .await;
    let message = binding_condition(&moved, "Reconciled").expect("Reconciled").message;
    assert!(message.starts_with("environment field cannot be updated to prod"), "{message}");
    assert!(g.get::<GitOpsDeployment>(staging).await.is_some(), "the staging deployment stays");
    assert!(g.get::<GitOpsDeployment>("appa-binding-new-demo-app-prod-component-a").await.is_none());

    g.patch::<SnapshotEnvironmentBinding>("appa-binding", json!({"spec": {"environment": "staging"}})).await;
    binding_where(&g, "appa-binding", "the binding resumed", |b| {
        binding_condition(b, "Reconciled").is_some_and(|c| c.reason != IMMUTABLE_FIELD_CHANGED)
    })
    .await;
}
