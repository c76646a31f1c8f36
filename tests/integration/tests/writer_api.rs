//! The tenant CRDs: the YAML checked in under ops/crds/ is exactly what the
//! writer's Rust types generate (so nobody edits it by hand or forgets to
//! regenerate it), and the test tier's API server accepts the CRDs and stores
//! objects whose every semantic rule is left to the writer. ("kube" in the second
//! test's name puts it in the real-Kubernetes tier of ops/test too.)

use std::collections::BTreeSet;
use std::path::PathBuf;

use gitops_testkit::cluster::TestCluster;
use gitops_writer::api::{
    Condition, DeploymentHealth, DeploymentSource, DeploymentSync, GitOpsDeployment,
    GitOpsDeploymentManagedEnvironment, GitOpsDeploymentManagedEnvironmentSpec, GitOpsDeploymentRepositoryCredential,
    GitOpsDeploymentRepositoryCredentialSpec, GitOpsDeploymentSpec, GitOpsDeploymentStatus, GitOpsDeploymentSyncRun,
    GitOpsDeploymentSyncRunSpec,
};
use kube::api::{Api, Patch, PatchParams, PostParams};

const REGENERATE: &str = "run `cargo run -p gitopsctl -- crds` in the workspace root and commit ops/crds/";

fn crd_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ops/crds")
}

#[test]
fn writer_api_checked_in_crd_yaml_matches_the_rust_types() {
    let generated = gitops_writer::api::crd_files().expect("render the CRDs");
    assert_eq!(generated.len(), 4, "four tenant CRDs");
    let dir = crd_dir();
    for (name, yaml) in &generated {
        let path = dir.join(name);
        let checked_in = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("{} is missing ({error}): {REGENERATE}", path.display()));
        assert!(checked_in == *yaml, "{} differs from what writer/src/api generates: {REGENERATE}", path.display());
    }
    let expected: BTreeSet<String> = generated.into_iter().map(|(name, _)| name).collect();
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .expect("read ops/crds")
        .map(|entry| entry.expect("a directory entry").file_name().to_string_lossy().into_owned())
        // kustomization.yaml makes the folder a kustomize base (ops/deploy/writer uses it).
        .filter(|name| name.ends_with(".yaml") && name != "kustomization.yaml")
        .collect();
    assert_eq!(present, expected, "ops/crds/ holds a CRD the Rust types no longer generate: {REGENERATE}");
}

#[tokio::test]
async fn writer_api_kube_accepts_the_crds_and_keeps_metacharacters_as_text() {
    let cluster = TestCluster::get().await;
    cluster.install_crds(gitops_writer::api::crds()).await.expect("install the tenant CRDs");
    let namespace = cluster.namespace("writer-api").await;
    let client = cluster.admin().await;
    let ns = namespace.name();

    // Shell and SQL metacharacters are plain text where a field allows them (what
    // the schemas refuse: `writer_admission`).
    let mut deployment = GitOpsDeployment::new(
        "web",
        GitOpsDeploymentSpec {
            source: DeploymentSource {
                repo_url: "https://git.example.invalid/x".into(),
                path: "apps/it's; rm -rf $(x)".into(),
                target_revision: None,
            },
            type_: "manual".into(),
            ..Default::default()
        },
    );
    deployment.metadata.namespace = Some(ns.to_owned());
    let deployments: Api<GitOpsDeployment> = Api::namespaced(client.clone(), ns);
    let created = deployments.create(&PostParams::default(), &deployment).await.expect("create a GitOpsDeployment");
    assert_eq!(created.spec.source.path, "apps/it's; rm -rf $(x)");
    assert_eq!(created.spec.type_, "manual");

    let status = GitOpsDeploymentStatus {
        conditions: vec![Condition {
            type_: "ErrorOccurred".into(),
            status: "True".into(),
            reason: Some("InvalidRepositoryURL".into()),
            message: Some("spec.source.repoURL must be a Git repository URL".into()),
            observed_generation: created.metadata.generation,
            ..Default::default()
        }],
        sync: Some(DeploymentSync { status: "Unknown".into(), revision: None }),
        health: Some(DeploymentHealth { status: "Missing".into(), message: None }),
        operation_state: Some(serde_json::json!({"phase": "Running", "syncResult": {"revision": "abc"}})),
        observed_generation: created.metadata.generation,
        ..Default::default()
    };
    let patched = deployments
        .patch_status("web", &PatchParams::default(), &Patch::Merge(serde_json::json!({"status": status})))
        .await
        .expect("patch the status subresource");
    assert_eq!(patched.status, Some(status), "status round-trips, operationState kept as reported");
    assert_eq!(patched.spec, created.spec, "a status patch leaves the spec alone");

    let runs: Api<GitOpsDeploymentSyncRun> = Api::namespaced(client.clone(), ns);
    let mut run = GitOpsDeploymentSyncRun::new(
        "sync-1",
        GitOpsDeploymentSyncRunSpec { gitops_deployment_name: "web".into(), revision_id: "main".into() },
    );
    run.metadata.namespace = Some(ns.to_owned());
    assert_eq!(runs.create(&PostParams::default(), &run).await.expect("create a SyncRun").spec, run.spec);

    let environments: Api<GitOpsDeploymentManagedEnvironment> = Api::namespaced(client.clone(), ns);
    let mut environment = GitOpsDeploymentManagedEnvironment::new(
        "staging",
        GitOpsDeploymentManagedEnvironmentSpec {
            api_url: "https://cluster.example.invalid:6443".into(),
            credentials_secret: "staging-kubeconfig".into(),
            allow_insecure_skip_tls_verify: Some(true),
            namespaces: Some(vec!["web".into()]),
            cluster_resources: Some(false),
            create_new_service_account: Some(true),
        },
    );
    environment.metadata.namespace = Some(ns.to_owned());
    let stored = environments.create(&PostParams::default(), &environment).await.expect("create an environment");
    assert_eq!(stored.spec, environment.spec);

    let credentials: Api<GitOpsDeploymentRepositoryCredential> = Api::namespaced(client, ns);
    let mut credential = GitOpsDeploymentRepositoryCredential::new(
        "repo",
        GitOpsDeploymentRepositoryCredentialSpec {
            repository: "https://git.example.invalid/team".into(),
            secret: "repo-secret".into(),
        },
    );
    credential.metadata.namespace = Some(ns.to_owned());
    let stored = credentials.create(&PostParams::default(), &credential).await.expect("create a repository credential");
    assert_eq!(stored.spec, credential.spec);
}
