//! The layer's side of the home-role hand-off: its webhook lets only who could grant
//! the home role (`admin`) make deployments go into the namespace itself — an
//! Environment without a cluster, a binding or PromotionRun into one — and lets
//! anyone with the AppStudio rights do the rest. And every reference resolves in the
//! referring object's own namespace, whatever another namespace holds of the same
//! name.

use gitops_appstudio::api::{
    DeploymentTarget, DeploymentTargetClaim, DeploymentTargetClaimSpec, Environment, EnvironmentSpec,
    ManualPromotionConfiguration, PromotionRun, PromotionRunSpec, Snapshot, SnapshotComponent,
    SnapshotEnvironmentBinding, SnapshotEnvironmentBindingSpec, SnapshotSpec,
};
use gitops_appstudio::binding::snapshot::{SNAPSHOT_USED_ANNOTATION, SnapshotUsed};
use gitops_appstudio::context::Settings;
use gitops_appstudio::environment::{CLAIM_NOT_FOUND, SECRET_NOT_FOUND};
use gitops_appstudio::names::MANAGED_ENVIRONMENT_SECRET_TYPE;
use gitops_shared::tenancy::{NamespacePolicy, REASON_NAMESPACE_NOT_SERVED};
use gitops_testkit::cluster::TestCluster;
use gitops_writer::api::{GitOpsDeployment, GitOpsDeploymentManagedEnvironment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::binding::{application, binding as binding_of, generator_writes};
use super::environment::{bound_pair, claim_env, credentials, credentials_env};
use super::promotion::{error_message, run, run_where};
use super::webhook::{serve_webhook, serve_webhook_with};
use super::{Ground, ground, ground_with};
use crate::support::eventually;

/// A ServiceAccount of the ground's namespace with the AppStudio rights and
/// `cluster_role` bound there; its client.
async fn person(g: &Ground, name: &str, cluster_role: &str) -> kube::Client {
    let cluster = TestCluster::get().await;
    let rules = json!([{
        "apiGroups": ["appstudio.redhat.com"],
        "resources": ["environments", "snapshotenvironmentbindings", "snapshotenvironmentbindings/status",
                      "promotionruns", "snapshots"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]
    }]);
    let identity = cluster.namespace_identity(g.ns(), name, rules).await;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-{cluster_role}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": g.ns()}]
    }))
    .expect("RoleBinding");
    g.api::<RoleBinding>().create(&PostParams::default(), &binding).await.expect("bind the cluster role");
    let client = cluster.client_with_token(&identity.token).await;
    // A real API server's authorizer sees a new binding a moment later.
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), g.ns());
    eventually("the cluster role in effect", || async { configmaps.list(&ListParams::default()).await.ok() }).await;
    client
}

/// Whether `result` is the home-role refusal.
fn refused_home<T: std::fmt::Debug>(result: Result<T, kube::Error>, case: &str) -> String {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 && status.message.contains("may not grant") => {
            status.message
        }
        other => panic!("{case}: expected the home-role refusal, got {other:?}"),
    }
}

fn home_env(name: &str) -> Environment {
    Environment::new(
        name,
        EnvironmentSpec {
            display_name: name.into(),
            deployment_strategy: "Manual".into(),
            ..EnvironmentSpec::default()
        },
    )
}

fn binding(name: &str, environment: &str) -> SnapshotEnvironmentBinding {
    SnapshotEnvironmentBinding::new(
        name,
        SnapshotEnvironmentBindingSpec {
            application: "app".into(),
            environment: environment.into(),
            snapshot: "s1".into(),
            ..SnapshotEnvironmentBindingSpec::default()
        },
    )
}

fn promotion(name: &str, target: &str) -> PromotionRun {
    PromotionRun::new(
        name,
        PromotionRunSpec {
            snapshot: "s1".into(),
            application: "app".into(),
            manual_promotion: ManualPromotionConfiguration { target_environment: target.into() },
            ..PromotionRunSpec::default()
        },
    )
}

#[tokio::test]
async fn only_who_could_grant_the_home_role_makes_appstudio_deployments_go_home() {
    let g = ground("as-tenancy").await;
    let _served = serve_webhook(&g).await;
    let editor = person(&g, "editor", "edit").await;
    let owner = person(&g, "owner", "admin").await;

    // An Environment without a cluster: the owner may, the editor may not.
    let message = refused_home(g.try_create_as(&editor, &home_env("home")).await, "the editor's home Environment");
    assert!(message.contains("Environment home makes deployments go into this namespace itself"), "{message}");
    g.try_create_as(&owner, &home_env("home")).await.expect("the owner's home Environment");
    // With a cluster, anyone with the AppStudio rights.
    let mut remote = credentials("creds", "team");
    remote.api_url = "https://api.example.invalid:6443".into();
    g.try_create_as(&editor, &credentials_env("remote", remote)).await.expect("the editor's remote Environment");

    // Bindings: into the remote Environment anyone; into the home one, or one that
    // does not exist yet (it may come without a cluster), only the owner.
    g.try_create_as(&editor, &binding("to-remote", "remote")).await.expect("a binding to the remote Environment");
    refused_home(g.try_create_as(&editor, &binding("to-home", "home")).await, "the editor's home binding");
    refused_home(g.try_create_as(&editor, &binding("to-later", "later")).await, "a binding to a missing Environment");
    g.try_create_as(&owner, &binding("to-home", "home")).await.expect("the owner's home binding");
    let bindings: Api<SnapshotEnvironmentBinding> = Api::namespaced(editor.clone(), g.ns());
    let repoint = json!({"spec": {"snapshot": "s2"}});
    refused_home(
        bindings.patch("to-home", &PatchParams::default(), &Patch::Merge(&repoint)).await,
        "the editor re-pointing a home binding",
    );
    bindings
        .patch("to-remote", &PatchParams::default(), &Patch::Merge(&repoint))
        .await
        .expect("the editor re-points a remote binding");
    // The repository generator's report says what a home binding deploys: writing it
    // is the owner's (or a generator's that could grant the role); the rest of the
    // status, and a remote binding's report, anyone's.
    let report = json!({"status": {"components": [{"name": "c", "gitopsRepository": {
        "url": "https://git.example.invalid/evil.git", "branch": "main", "path": "p",
        "generatedResources": [], "commitID": "c1"}}]}});
    refused_home(
        bindings.patch_status("to-home", &PatchParams::default(), &Patch::Merge(&report)).await,
        "the editor writing a home binding's report",
    );
    bindings
        .patch_status("to-remote", &PatchParams::default(), &Patch::Merge(&report))
        .await
        .expect("the editor writes a remote binding's report");
    let conditions = json!({"status": {"gitopsRepoConditions": []}});
    bindings
        .patch_status("to-home", &PatchParams::default(), &Patch::Merge(&conditions))
        .await
        .expect("other status fields are not the home role's business");
    Api::<SnapshotEnvironmentBinding>::namespaced(owner.clone(), g.ns())
        .patch_status("to-home", &PatchParams::default(), &Patch::Merge(&report))
        .await
        .expect("the owner writes a home binding's report");

    // PromotionRuns likewise, by their target.
    refused_home(g.try_create_as(&editor, &promotion("editor-home", "home")).await, "the editor's promotion home");
    g.try_create_as(&editor, &promotion("editor-remote", "remote")).await.expect("the editor's remote promotion");
    g.try_create_as(&owner, &promotion("owner-home", "home")).await.expect("the owner's home promotion");

    // Taking the cluster away sends the remote bindings home: the owner's to do.
    let environments: Api<Environment> = Api::namespaced(editor.clone(), g.ns());
    let drop_cluster = json!({"spec": {"unstableConfigurationFields": null}});
    refused_home(
        environments.patch("remote", &PatchParams::default(), &Patch::Merge(&drop_cluster)).await,
        "the editor taking the cluster away",
    );
    environments
        .patch("remote", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"displayName": "Remote"}})))
        .await
        .expect("other changes are the editor's");
    // A home Environment joining the automated promotion graph decides whose runs
    // deploy into it: the owner's to do too.
    let join = json!({"spec": {"parentEnvironment": "remote", "deploymentStrategy": "AppStudioAutomated"}});
    refused_home(
        environments.patch("home", &PatchParams::default(), &Patch::Merge(&join)).await,
        "the editor attaching a home Environment to the graph",
    );
    let remote = g.get::<Environment>("remote").await.expect("remote");
    assert!(remote.spec.unstable_configuration_fields.is_some(), "the cluster is still there");
    assert!(g.get::<SnapshotEnvironmentBinding>("to-later").await.is_none());
}

/// A namespace the core does not serve (here: without the selector's label) gets
/// nothing from the layer: its objects are refused at apply time with the core's
/// words, and those that got in before get the core's condition and nothing else —
/// until the namespace is selected.
#[tokio::test]
async fn namespaces_the_core_does_not_serve_get_nothing_from_the_layer() {
    let tenancy = NamespacePolicy {
        selector: Some("gitops-test/appstudio-tenant=yes".parse().expect("a selector")),
        ..NamespacePolicy::default()
    };
    let settings = Settings { tenancy: tenancy.clone(), ..Settings::default() };
    let g = ground_with("as-unserved", settings).await;
    g.secret("creds", MANAGED_ENVIRONMENT_SECRET_TYPE, "k").await;
    g.create(&credentials_env("early", credentials("creds", "team"))).await;
    g.create(&binding("early-binding", "early")).await;
    let reason = eventually("the Environment's condition", || async {
        let env = g.get::<Environment>("early").await?;
        let conditions = env.status?.conditions;
        conditions.into_iter().find(|c| c.type_ == "Reconciled").map(|c| (c.reason, c.message))
    })
    .await;
    assert_eq!(reason.0, REASON_NAMESPACE_NOT_SERVED);
    assert!(reason.1.contains("not one of the GitOps service's tenant namespaces"), "{}", reason.1);
    let reason = eventually("the binding's condition", || async {
        let binding = g.get::<SnapshotEnvironmentBinding>("early-binding").await?;
        let conditions = binding.status?.binding_conditions;
        conditions.into_iter().find(|c| c.type_ == "Reconciled").map(|c| c.reason)
    })
    .await;
    assert_eq!(reason, REASON_NAMESPACE_NOT_SERVED);
    assert!(g.get::<GitOpsDeploymentManagedEnvironment>("managed-environment-early").await.is_none());

    let served = serve_webhook_with(&g, tenancy).await;
    assert!(
        served.first_refusal.contains("not one of the GitOps service's tenant namespaces"),
        "{}",
        served.first_refusal
    );
    let mut public = credentials("creds", "team");
    public.api_url = "https://api.example.invalid:6443".into();
    let late = credentials_env("late", public);
    let refused = g.api::<Environment>().create(&PostParams::default(), &late).await;
    assert!(matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403), "{refused:?}");

    // Selected: the layer takes the namespace up by itself.
    let label = json!({"metadata": {"labels": {"gitops-test/appstudio-tenant": "yes"}}});
    Api::<Namespace>::all(g.client.clone())
        .patch(g.ns(), &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("select the namespace");
    eventually("the ManagedEnvironment made", || async {
        g.get::<GitOpsDeploymentManagedEnvironment>("managed-environment-early").await
    })
    .await;
    g.create(&late).await;
}

/// The Environment condition of `reason`'s `Reconciled`, once there.
async fn environment_refused(g: &Ground, name: &str, reason: &str) -> String {
    eventually("the Environment's condition", || async {
        let env = g.get::<Environment>(name).await?;
        let conditions = env.status?.conditions;
        conditions.into_iter().find(|c| c.type_ == "Reconciled" && c.reason == reason).map(|c| c.message)
    })
    .await
}

/// Two namespaces holding the same names — Environment `env`, claim `claim`, target
/// `target`, Secret `target-creds`, Snapshot `my-snapshot`, binding `binding` — each
/// with its own values: each namespace's ManagedEnvironment, copied Secret,
/// deployments and recorded Snapshot come from its own objects, never the other's;
/// and a name that exists only in the other namespace is not found.
#[tokio::test]
async fn every_reference_resolves_in_its_own_namespace() {
    let grounds = [ground("as-tenancy-a").await, ground("as-tenancy-b").await];
    let sides = ["a", "b"];
    let url = |port: u16| format!("https://127.0.0.1:{port}");
    for ((g, side), port) in grounds.iter().zip(sides).zip([7443, 7444]) {
        g.secret("target-creds", "Opaque", &format!("kubeconfig of {side}")).await;
        bound_pair(g, "claim", "target", &format!("team-{side}"), "target-creds").await;
        g.patch::<DeploymentTarget>("target", json!({"spec": {"kubernetesCredentials": {"apiURL": url(port)}}})).await;
        g.create(&claim_env("env", "claim")).await;
        application(g, "app").await;
        let image = format!("registry.example.invalid/{side}:1");
        let component = SnapshotComponent { name: "c".into(), container_image: image, source: None };
        let spec = SnapshotSpec { application: "app".into(), components: vec![component], ..SnapshotSpec::default() };
        g.create(&Snapshot::new("my-snapshot", spec)).await;
        binding_of(g, "binding", "app", "env", &["c"]).await;
        generator_writes(g, "binding", &[("c", "components/c/overlays/env")]).await;
    }

    for ((g, side), port) in grounds.iter().zip(sides).zip([7443, 7444]) {
        let managed = eventually("the ManagedEnvironment", || async {
            g.get::<GitOpsDeploymentManagedEnvironment>("managed-environment-env").await
        })
        .await;
        assert_eq!(managed.spec.api_url, url(port), "in {side}: the target's URL is its own namespace's");
        assert_eq!(managed.spec.credentials_secret, "managed-environment-secret-env");
        let copy =
            eventually("the copied Secret", || async { g.get::<Secret>("managed-environment-secret-env").await }).await;
        let kubeconfig = copy.data.unwrap_or_default().get("kubeconfig").map(|b| b.0.clone());
        assert_eq!(kubeconfig, Some(format!("kubeconfig of {side}").into_bytes()), "in {side}: its own credentials");
        let deployment =
            eventually("the binding's deployment", || async { g.get::<GitOpsDeployment>("binding-app-env-c").await })
                .await;
        assert_eq!(deployment.spec.destination.namespace, Some(format!("team-{side}")), "in {side}");
        assert_eq!(deployment.spec.destination.environment.as_deref(), Some("managed-environment-env"));
        let used = eventually("the binding's Snapshot recorded", || async {
            let binding = g.get::<SnapshotEnvironmentBinding>("binding").await?;
            serde_json::from_str::<SnapshotUsed>(binding.annotations().get(SNAPSHOT_USED_ANNOTATION)?).ok()
        })
        .await;
        let snapshot = g.get::<Snapshot>("my-snapshot").await.expect("the Snapshot");
        assert_eq!(Some(used.uid), snapshot.uid(), "in {side}: the binding's Snapshot is its own namespace's");
        assert_eq!(used.components[0].container_image, format!("registry.example.invalid/{side}:1"));
    }

    // Names that exist only in b are not found from a.
    let [a, b] = &grounds;
    b.create(&DeploymentTargetClaim::new(
        "claim-of-b",
        DeploymentTargetClaimSpec { deployment_target_class_name: "test-class".into(), target_name: None },
    ))
    .await;
    b.secret("secret-of-b", MANAGED_ENVIRONMENT_SECRET_TYPE, "kubeconfig of b").await;
    b.create(&Snapshot::new("snapshot-of-b", SnapshotSpec { application: "app".into(), ..SnapshotSpec::default() }))
        .await;
    a.create(&claim_env("claims-from-b", "claim-of-b")).await;
    environment_refused(a, "claims-from-b", CLAIM_NOT_FOUND).await;
    a.create(&credentials_env("creds-from-b", credentials("secret-of-b", "team"))).await;
    let message = environment_refused(a, "creds-from-b", SECRET_NOT_FOUND).await;
    assert!(message.contains("secret-of-b"), "{message}");
    assert!(a.get::<GitOpsDeploymentManagedEnvironment>("managed-environment-creds-from-b").await.is_none());
    let mut promotion = run("promote", "env");
    promotion.spec.application = "app".into();
    promotion.spec.snapshot = "snapshot-of-b".into();
    a.create(&promotion).await;
    let refused = run_where(a, "promote", "the Snapshot not found", |r| error_message(r).is_some()).await;
    assert_eq!(
        error_message(&refused).as_deref(),
        Some("Snapshot: snapshot-of-b referred in Binding: binding does not exist.")
    );
}
