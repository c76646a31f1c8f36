//! The layer's CRDs: the YAML under ops/crds/appstudio* is what the Rust types
//! generate, and the test tier's API server serves them with the original's field
//! names and short names.

use std::collections::BTreeSet;
use std::path::PathBuf;

use gitops_appstudio::api::{
    self, DeploymentTargetClass, DeploymentTargetClassSpec, Environment, EnvironmentSpec,
    UnstableEnvironmentConfiguration,
};
use gitops_testkit::cluster::TestCluster;
use kube::api::{Api, DeleteParams, PostParams};

const REGENERATE: &str = "run `cargo run -p gitopsctl -- crds` in the workspace root and commit ops/crds/";

fn checked_in(dir: &str, generated: Vec<(String, String)>) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ops/crds").join(dir);
    for (name, yaml) in &generated {
        let path = dir.join(name);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("{} is missing ({error}): {REGENERATE}", path.display()));
        assert!(text == *yaml, "{} differs from what appstudio/src/api generates: {REGENERATE}", path.display());
    }
    let expected: BTreeSet<String> = generated.into_iter().map(|(name, _)| name).collect();
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("read {}: {error}", dir.display()))
        .map(|entry| entry.expect("a directory entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml") && name != "kustomization.yaml")
        .collect();
    assert_eq!(present, expected, "{} holds a CRD the Rust types no longer generate: {REGENERATE}", dir.display());
}

#[test]
fn checked_in_crds_match_the_rust_types() {
    checked_in(api::CRD_SUBDIR, api::render_crd_files(api::crds()).expect("render the CRDs"));
    checked_in(api::FIXTURE_CRD_SUBDIR, api::render_crd_files(api::fixture_crds()).expect("render the fixtures"));
}

#[tokio::test]
async fn the_tier_serves_the_crds_with_the_originals_fields() {
    let cluster = TestCluster::get().await;
    cluster.install_crds(api::crds()).await.expect("install the AppStudio CRDs");
    cluster.install_crds(api::fixture_crds()).await.expect("install the fixture CRDs");
    let namespace = cluster.namespace("appstudio-crds").await;
    let client = cluster.admin().await;

    // What a Go client of the original sends (every non-omitempty field) is stored
    // and read back unchanged, JSON names included.
    let mut environment = Environment::new("staging", EnvironmentSpec::default());
    environment.spec.unstable_configuration_fields = Some(UnstableEnvironmentConfiguration::default());
    environment.spec.unstable_configuration_fields.as_mut().expect("set").kubernetes_credentials.api_url =
        "https://127.0.0.1:6443".into();
    let environments = Api::<Environment>::namespaced(client.clone(), namespace.name());
    let stored = environments.create(&PostParams::default(), &environment).await.expect("create the Environment");
    assert_eq!(stored.spec, environment.spec);

    // Without the fields the original's CRD requires, the API server refuses it.
    let incomplete = serde_json::json!({
        "apiVersion": api::API_VERSION, "kind": "Environment",
        "metadata": {"name": "incomplete"},
        "spec": {"unstableConfigurationFields": {"apiURL": "https://127.0.0.1:6443"}}
    });
    let raw = Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        namespace.name(),
        &kube::api::ApiResource::erase::<Environment>(&()),
    );
    let refused = raw
        .create(&PostParams::default(), &serde_json::from_value(incomplete).expect("an object"))
        .await
        .expect_err("an Environment without the required fields is refused");
    assert!(matches!(&refused, kube::Error::Api(status) if status.code == 422), "{refused}");

    // The class is cluster-scoped.
    let classes = Api::<DeploymentTargetClass>::all(client.clone());
    let name = format!("{}-class", namespace.name());
    let class = DeploymentTargetClass::new(
        &name,
        DeploymentTargetClassSpec {
            provisioner: "appstudio.redhat.com/devsandbox".into(),
            reclaim_policy: "Retain".into(),
            ..DeploymentTargetClassSpec::default()
        },
    );
    let stored = classes.create(&PostParams::default(), &class).await.expect("create the class");
    assert_eq!(stored.metadata.namespace, None);
    classes.delete(&name, &DeleteParams::default()).await.expect("delete the class");
}
