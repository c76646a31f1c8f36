//! The layer's admission webhook, served in-process on loopback with a throwaway
//! certificate and registered for the ground's namespace only: the original's
//! webhook cases (§2.8 of the research notes) in its words, what this service adds
//! (https and public API URLs, DeploymentTargets, `parentEnvironment` cycles), what
//! it lets through (status, the mutable fields), and failing closed.

use std::sync::Arc;

use gitops_appstudio::api::{
    DeploymentTarget, DeploymentTargetKubernetesClusterCredentials, DeploymentTargetSpec, Environment, EnvironmentSpec,
    ManualPromotionConfiguration, PromotionRun, PromotionRunSpec, Snapshot, SnapshotComponent,
    SnapshotEnvironmentBinding, SnapshotEnvironmentBindingSpec, SnapshotSpec,
};
use gitops_appstudio::metrics::Metrics;
use gitops_appstudio::webhook::{HomeCheck, Reviewer, rules};
use gitops_shared::tenancy::NamespacePolicy;
use gitops_testkit::admission;
use k8s_openapi::api::core::v1::Namespace;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::environment::{credentials, credentials_env};
use super::{Ground, ground};
use crate::support::{eventually, short_id};

/// The refusal's message; panics when the request was accepted.
fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>, case: &str) -> String {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{case}: {status:?}");
            status.message
        }
        other => panic!("{case}: expected a refusal, got {other:?}"),
    }
}

async fn try_patch<K>(g: &Ground, name: &str, patch: serde_json::Value) -> Result<K, kube::Error>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    g.api::<K>().patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await
}

fn named_env(name: &str, parent: Option<&str>) -> Environment {
    Environment::new(
        name,
        EnvironmentSpec {
            display_name: name.to_owned(),
            deployment_strategy: "AppStudioAutomated".into(),
            parent_environment: parent.map(str::to_owned),
            ..EnvironmentSpec::default()
        },
    )
}

fn binding(name: &str, application: &str, environment: &str) -> SnapshotEnvironmentBinding {
    SnapshotEnvironmentBinding::new(
        name,
        SnapshotEnvironmentBindingSpec {
            application: application.into(),
            environment: environment.into(),
            snapshot: "s1".into(),
            ..SnapshotEnvironmentBindingSpec::default()
        },
    )
}

/// The layer's webhook served for one ground's namespace; `stop` ends it.
pub(crate) struct Served {
    pub(crate) marker: String,
    pub(crate) stop: CancellationToken,
    pub(crate) server: tokio::task::JoinHandle<()>,
    pub(crate) metrics: Arc<Metrics>,
    dir: std::path::PathBuf,
    /// What the webhook said to the probe (a 64-character Environment name).
    pub(crate) first_refusal: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Serves the webhook (loopback API URLs refused, home role `admin`, the layer's
/// own identity a name nobody in the tests has) and registers it for `g`'s
/// namespace; returns once the API server calls it.
pub(crate) async fn serve_webhook(g: &Ground) -> Served {
    serve_webhook_with(g, NamespacePolicy::default()).await
}

/// As [`serve_webhook`], serving the namespaces `tenancy` selects.
pub(crate) async fn serve_webhook_with(g: &Ground, tenancy: NamespacePolicy) -> Served {
    let marker = format!("as-webhook-{}", short_id());
    let patch = json!({"metadata": {"labels": {"gitops-test/appstudio-webhook": marker}}});
    Api::<Namespace>::all(g.client.clone())
        .patch(g.ns(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("label the namespace");
    let dir = std::env::temp_dir().join(format!("gitops-appstudio-webhook-{}", short_id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let cert = admission::serving_cert(&dir).expect("a certificate");
    let settings = gitops_writer::webhook::WebhookSettings {
        address: "127.0.0.1:0".parse().expect("address"),
        cert_file: cert.cert_file.clone(),
        key_file: cert.key_file.clone(),
    };
    let (socket, acceptor) = gitops_writer::webhook::bind(&settings).await.expect("bind the webhook");
    let address = socket.local_addr().expect("its address");
    let metrics = Arc::new(Metrics::default());
    // Loopback API URLs stay refused: the webhook runs as a production install's.
    let home = HomeCheck::new(g.client.clone(), "admin".into(), "system:serviceaccount:gitops-service:nobody".into());
    let reviewer = Reviewer {
        client: g.client.clone(),
        allow_private: false,
        namespace: None,
        metrics: metrics.clone(),
        home,
        tenancy,
    };
    let stop = CancellationToken::new();
    let server = tokio::spawn(gitops_writer::webhook::serve(socket, acceptor, Arc::new(reviewer), stop.clone()));
    let configuration = admission::appstudio_configuration(
        &marker,
        &format!("https://{address}/validate"),
        &cert.ca_pem,
        Some(("gitops-test/appstudio-webhook", &marker)),
    );
    admission::register(&g.client, &configuration).await.expect("register the webhook");
    // A real API server calls a new webhook a moment after it is registered.
    let long_name = "e".repeat(64);
    let message = eventually("the webhook in effect", || async {
        match g.try_create_as(&g.client, &named_env(&long_name, None)).await {
            Ok(_) => {
                let _ = g.api::<Environment>().delete(&long_name, &Default::default()).await;
                None
            }
            // Refused by this webhook, for its name or for its namespace.
            Err(kube::Error::Api(status)) if status.message.contains("appstudio-resources.appstudio.redhat.com") => {
                Some(status.message)
            }
            Err(other) => panic!("not this webhook's refusal: {other:?}"),
        }
    })
    .await;
    Served { marker, stop, server, metrics, dir, first_refusal: message }
}

#[tokio::test]
async fn the_webhook_refuses_in_the_originals_words_and_fails_closed() {
    let g = ground("as-webhook").await;
    let mut served = serve_webhook(&g).await;
    let long_name = "e".repeat(64);
    let message = &served.first_refusal;
    assert!(
        message.contains(&format!("invalid environment name: {long_name}, an environment resource name")),
        "{message}"
    );

    // Environments: the API URL on create and on update, the ingress domain.
    let mut bad_url = credentials("creds", "team");
    bad_url.api_url = "api/test-url.com:6443".into();
    let message =
        refused(g.try_create_as(&g.client, &credentials_env("relative", bad_url)).await, "a relative API URL");
    assert!(message.contains(rules::API_URL_SENTENCE), "{message}");
    let message = refused(
        g.try_create_as(&g.client, &credentials_env("loopback", credentials("creds", "team"))).await,
        "loopback",
    );
    assert!(message.contains("spec.unstableConfigurationFields.apiURL points at a loopback"), "{message}");
    let mut public = credentials("creds", "team");
    public.api_url = "https://api.example.invalid:6443".into();
    g.try_create_as(&g.client, &credentials_env("staging", public)).await.expect("a valid Environment is accepted");
    let patch = json!({"spec": {"unstableConfigurationFields": {"apiURL": "http://api.example.invalid:6443"}}});
    let message = refused(try_patch::<Environment>(&g, "staging", patch).await, "http on update");
    assert!(message.contains(rules::API_URL_SENTENCE), "{message}");
    let patch = json!({"spec": {"unstableConfigurationFields": {"clusterType": "Kubernetes"}}});
    let message = refused(try_patch::<Environment>(&g, "staging", patch).await, "Kubernetes without ingress");
    assert!(message.contains("ingress domain cannot be empty if cluster is of type Kubernetes"), "{message}");
    try_patch::<Environment>(&g, "staging", json!({"spec": {"displayName": "Staging"}}))
        .await
        .expect("other fields change freely");

    // parentEnvironment: a chain is fine, a cycle through the changed Environment is not.
    g.try_create_as(&g.client, &named_env("dev", None)).await.expect("dev");
    g.try_create_as(&g.client, &named_env("qa", Some("dev"))).await.expect("qa after dev");
    let message = refused(
        try_patch::<Environment>(&g, "dev", json!({"spec": {"parentEnvironment": "qa"}})).await,
        "a parent cycle",
    );
    assert!(message.contains("(dev → qa → dev)"), "{message}");

    // DeploymentTargets: https and public, as Environments.
    let target = |url: &str| {
        DeploymentTarget::new(
            "target",
            DeploymentTargetSpec {
                deployment_target_class_name: "test-class".into(),
                kubernetes_credentials: DeploymentTargetKubernetesClusterCredentials {
                    default_namespace: "team".into(),
                    api_url: url.into(),
                    cluster_credentials_secret: "creds".into(),
                    allow_insecure_skip_tls_verify: false,
                },
                claim_ref: None,
            },
        )
    };
    let message = refused(g.try_create_as(&g.client, &target("http://api.example.invalid")).await, "an http target");
    assert!(message.contains(rules::API_URL_SENTENCE), "{message}");
    g.try_create_as(&g.client, &target("https://api.example.invalid")).await.expect("an https target");

    // Bindings: one per (application, environment); application and environment fixed.
    g.try_create_as(&g.client, &binding("first", "app", "staging")).await.expect("the first binding");
    let message =
        refused(g.try_create_as(&g.client, &binding("second", "app", "staging")).await, "a duplicate binding");
    assert_eq!(
        message,
        "admission webhook \"appstudio-resources.appstudio.redhat.com\" denied the request: invalid \
         SnapshotEnvironmentBinding: duplicate combination of Application (app) and Environment (staging). \
         Duplicated by: first"
    );
    g.try_create_as(&g.client, &binding("other-app", "app2", "staging")).await.expect("another application's binding");
    let message = refused(
        try_patch::<SnapshotEnvironmentBinding>(&g, "first", json!({"spec": {"application": "app3"}})).await,
        "a new application",
    );
    assert!(message.contains("application field cannot be updated to app3"), "{message}");
    let message = refused(
        try_patch::<SnapshotEnvironmentBinding>(&g, "first", json!({"spec": {"environment": "prod"}})).await,
        "a new environment",
    );
    assert!(message.contains("environment field cannot be updated to prod"), "{message}");
    try_patch::<SnapshotEnvironmentBinding>(&g, "first", json!({"spec": {"snapshot": "s2"}}))
        .await
        .expect("the snapshot changes freely");
    g.patch_status::<SnapshotEnvironmentBinding>("first", json!({"gitopsRepoConditions": []})).await;

    // Snapshots: application and components fixed, the display fields not.
    let snapshot = Snapshot::new(
        "snap",
        SnapshotSpec {
            application: "app".into(),
            components: vec![SnapshotComponent {
                name: "c1".into(),
                container_image: "quay.invalid/c1:1".into(),
                ..SnapshotComponent::default()
            }],
            ..SnapshotSpec::default()
        },
    );
    g.try_create_as(&g.client, &snapshot).await.expect("a Snapshot");
    let image = json!({"spec": {"components": [{"name": "c1", "containerImage": "quay.invalid/c1:2"}]}});
    let message = refused(try_patch::<Snapshot>(&g, "snap", image).await, "a new image");
    assert!(
        message.contains("components cannot be updated to [{Name:c1 ContainerImage:quay.invalid/c1:2}]"),
        "{message}"
    );
    let message =
        refused(try_patch::<Snapshot>(&g, "snap", json!({"spec": {"application": "app2"}})).await, "a new application");
    assert!(message.contains("application field cannot be updated to app2"), "{message}");
    try_patch::<Snapshot>(&g, "snap", json!({"spec": {"displayName": "shown"}})).await.expect("display fields change");

    // PromotionRuns: the spec is fixed.
    let run = PromotionRun::new(
        "promote",
        PromotionRunSpec {
            snapshot: "snap".into(),
            application: "app".into(),
            manual_promotion: ManualPromotionConfiguration { target_environment: "qa".into() },
            ..PromotionRunSpec::default()
        },
    );
    g.try_create_as(&g.client, &run).await.expect("a PromotionRun");
    let patch = json!({"spec": {"manualPromotion": {"targetEnvironment": "prod"}}});
    let message = refused(try_patch::<PromotionRun>(&g, "promote", patch).await, "a new target");
    assert!(
        message.contains(
            "spec cannot be updated to {Snapshot:snap Application:app ManualPromotion:{TargetEnvironment:prod} \
             AutomatedPromotion:{InitialEnvironment:}}"
        ),
        "{message}"
    );
    let staging = g.get::<Environment>("staging").await.expect("staging");
    assert_eq!(staging.spec.display_name, "Staging");
    assert!(g.get::<SnapshotEnvironmentBinding>("second").await.is_none(), "the duplicate was not stored");
    let rendered = served.metrics.render();
    assert!(
        rendered.lines().any(|line| line.starts_with(
            "gitops_appstudio_admission_reviews_total{kind=\"SnapshotEnvironmentBinding\",outcome=\"denied\"} "
        ) && !line.ends_with(" 0")),
        "{rendered}"
    );

    // Fails closed: with nobody answering, nothing of these kinds is stored.
    served.stop.cancel();
    let marker = served.marker.clone();
    let server = std::mem::replace(&mut served.server, tokio::spawn(async {}));
    let _ = server.await;
    let message = eventually("the webhook unreachable", || async {
        match g.try_create_as(&g.client, &named_env("after", None)).await {
            Ok(_) => {
                let _ = g.api::<Environment>().delete("after", &Default::default()).await;
                None
            }
            Err(kube::Error::Api(status)) => Some(status.message),
            Err(other) => panic!("not an API refusal: {other:?}"),
        }
    })
    .await;
    assert!(message.contains("appstudio-resources.appstudio.redhat.com"), "{message}");
    admission::unregister(&g.client, &marker).await;
}
