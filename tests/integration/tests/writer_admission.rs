//! Mistakes refused at apply time, on the test tier's API server: the CRD schemas
//! refuse what a schema can say (required fields, allowed values, forms, lengths),
//! naming the field; the writer's admission webhook refuses the rest with the
//! reason its controllers would write (fields the service sets, `..` in a path, a
//! namespace without an environment, a sync run of an automated deployment, an
//! apiURL at a metadata address), lets
//! deletes and metadata-only changes through, and — failing closed — refuses
//! applies while no writer answers, deletes still proceeding.

use std::sync::Arc;

use gitops_testkit::admission;
use gitops_writer::controller::REASON_ACCEPTED;
use gitops_writer::validate::reason;
use gitops_writer::webhook::WebhookSettings;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::support::writer::{env, spec};
use crate::support::{eventually, short_id};

const REPO: &str = "https://git.example.invalid/org/repo.git";

fn resource(plural: &str, kind: &str) -> ApiResource {
    ApiResource {
        group: "managed-gitops.redhat.com".into(),
        version: "v1alpha1".into(),
        api_version: "managed-gitops.redhat.com/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn api(kube: &kube::Client, namespace: &str, plural: &str, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(kube.clone(), namespace, &resource(plural, kind))
}

async fn create(
    kube: &kube::Client,
    namespace: &str,
    (plural, kind): (&str, &str),
    name: &str,
    spec: Value,
) -> Result<DynamicObject, kube::Error> {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": kind,
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("object");
    api(kube, namespace, plural, kind).create(&PostParams::default(), &object).await
}

/// A tenant kind as (plural, kind).
type Kind = (&'static str, &'static str);

const DEPLOYMENT: Kind = ("gitopsdeployments", "GitOpsDeployment");
const SYNC_RUN: Kind = ("gitopsdeploymentsyncruns", "GitOpsDeploymentSyncRun");
const ENVIRONMENT: Kind = ("gitopsdeploymentmanagedenvironments", "GitOpsDeploymentManagedEnvironment");
const CREDENTIAL: Kind = ("gitopsdeploymentrepositorycredentials", "GitOpsDeploymentRepositoryCredential");

/// The refusal's (code, message); panics when the object was accepted.
fn refusal(result: Result<DynamicObject, kube::Error>, case: &str) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message),
        other => panic!("{case}: expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn writer_admission_schemas_refuse_mistakes_naming_the_field() {
    // No writer: what is refused here, the API server refuses on its own.
    let env = env("wa-schema").await;
    let ns = env.tenant.name();
    let automated = |path: &str| json!({"source": {"repoURL": REPO, "path": path}, "type": "automated"});
    let cases: Vec<(&str, Kind, Value, &str)> = vec![
        ("type", DEPLOYMENT, json!({"source": {"repoURL": REPO, "path": "p"}, "type": "Automatic"}), "spec.type"),
        ("no-type", DEPLOYMENT, json!({"source": {"repoURL": REPO, "path": "p"}}), "spec.type"),
        ("no-path", DEPLOYMENT, json!({"source": {"repoURL": REPO}, "type": "manual"}), "spec.source.path"),
        ("no-source", DEPLOYMENT, json!({"type": "manual"}), "spec.source"),
        (
            "ftp",
            DEPLOYMENT,
            json!({"source": {"repoURL": "ftp://h.invalid/r", "path": "p"}, "type": "manual"}),
            "spec.source.repoURL",
        ),
        ("root", DEPLOYMENT, automated("/etc"), "spec.source.path"),
        ("long", DEPLOYMENT, automated(&"a".repeat(1025)), "spec.source.path"),
        (
            "revision",
            DEPLOYMENT,
            json!({"source": {"repoURL": REPO, "path": "p", "targetRevision": "--upload-pack=x"}, "type": "manual"}),
            "spec.source.targetRevision",
        ),
        (
            "upper-ns",
            DEPLOYMENT,
            json!({"source": {"repoURL": REPO, "path": "p"}, "destination": {"environment": "e", "namespace": "Prod"}, "type": "manual"}),
            "spec.destination.namespace",
        ),
        (
            "option",
            DEPLOYMENT,
            json!({"source": {"repoURL": REPO, "path": "p"}, "type": "manual", "syncPolicy": {"syncOptions": ["Prune=false"]}}),
            "spec.syncPolicy.syncOptions",
        ),
        ("no-revision", SYNC_RUN, json!({"gitopsDeploymentName": "web"}), "spec.revisionID"),
        (
            "bad-name",
            SYNC_RUN,
            json!({"gitopsDeploymentName": "Web", "revisionID": "main"}),
            "spec.gitopsDeploymentName",
        ),
        ("http", ENVIRONMENT, json!({"apiURL": "http://api.example.invalid", "credentialsSecret": "s"}), "spec.apiURL"),
        ("no-secret", ENVIRONMENT, json!({"apiURL": "https://api.example.invalid"}), "spec.credentialsSecret"),
        (
            "ns-list",
            ENVIRONMENT,
            json!({"apiURL": "https://api.example.invalid", "credentialsSecret": "s", "namespaces": ["ok", "Not_OK"]}),
            "spec.namespaces",
        ),
        ("git", CREDENTIAL, json!({"repository": "git://h.invalid/r", "secret": "s"}), "spec.repository"),
    ];
    for (name, kind, spec, field) in cases {
        let (code, message) = refusal(create(&env.kube, ns, kind, name, spec).await, name);
        assert_eq!(code, 422, "{name}: {message}");
        assert!(message.contains(field), "{name}: {message:?} names {field}");
    }
    // What the original accepted still is (an empty optional field is absent).
    let fine = json!({"source": {"repoURL": "git@git.example.invalid:org/repo.git", "path": ".", "targetRevision": ""},
                      "destination": {"environment": "", "namespace": ""}, "type": "manual",
                      "syncPolicy": {"syncOptions": ["CreateNamespace=true"]}});
    create(&env.kube, ns, DEPLOYMENT, "fine", fine).await.expect("a valid deployment");
    // Fields the service sets survive pruning, so they can be refused by name.
    let given = json!({"source": {"repoURL": REPO, "path": "p"}, "type": "manual", "project": "default",
                       "destination": {"server": "https://api.example.invalid", "name": "c"}});
    let stored = create(&env.kube, ns, DEPLOYMENT, "given", given).await.expect("no schema rule against them");
    assert_eq!(stored.data["spec"]["project"], "default");
    assert_eq!(stored.data["spec"]["destination"]["server"], "https://api.example.invalid");
    // With no webhook registered, the writer's validation is the safety net.
    let _writer = env.writer("writer-a");
    let (status, why, message) = env.condition("given").await;
    assert_eq!((status.as_str(), why.as_str()), ("True", reason::FIELD_SET_BY_SERVICE), "{message}");
    assert!(message.contains("spec.project"), "{message}");
    assert_eq!(env.rows("given").await, 0, "nothing stored for it");
}

/// Labels the tenant namespace so that only this test's webhook configuration
/// selects it (tests share one API server).
async fn select(kube: &kube::Client, namespace: &str, marker: &str) {
    let patch = json!({"metadata": {"labels": {"gitops-test/webhook": marker}}});
    Api::<Namespace>::all(kube.clone())
        .patch(namespace, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("label the namespace");
}

#[tokio::test]
async fn writer_admission_webhook_refuses_what_a_schema_cannot_and_fails_closed() {
    let env = env("wa-webhook").await;
    let ns = env.tenant.name().to_owned();
    let marker = format!("wa-webhook-{}", short_id());
    select(&env.kube, &ns, &marker).await;
    let dir = std::env::temp_dir().join(format!("gitops-webhook-{}", short_id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let cert = admission::serving_cert(&dir).expect("a certificate");
    let bound = Arc::new(std::sync::OnceLock::new());
    let writer = env.writer_for("writer-a", vec![ns.clone()], |c| {
        c.webhook = Some(WebhookSettings {
            address: "127.0.0.1:0".parse().expect("address"),
            cert_file: cert.cert_file.clone(),
            key_file: cert.key_file.clone(),
        });
        c.webhook_address = bound.clone();
    });
    let address = eventually("the webhook listening", || async { bound.get().copied() }).await;

    // Stored before the webhook is registered: the writer refuses it later.
    let early = json!({"source": {"repoURL": REPO, "path": "a/../b"}, "type": "automated"});
    create(&env.kube, &ns, DEPLOYMENT, "early", early).await.expect("no webhook yet");
    assert_eq!(env.condition("early").await.1, reason::INVALID_PATH);

    let url = format!("https://{address}/validate");
    let configuration = admission::configuration(&marker, &url, &cert.ca_pem, Some(("gitops-test/webhook", &marker)));
    admission::register(&env.kube, &configuration).await.expect("register the webhook");
    // A real API server calls a new webhook a moment after it is registered.
    let deployments: Api<DynamicObject> = api(&env.kube, &ns, DEPLOYMENT.0, DEPLOYMENT.1);
    eventually("the webhook in effect", || async {
        let probe = json!({"source": {"repoURL": REPO, "path": "p"}, "type": "manual", "project": "x"});
        match create(&env.kube, &ns, DEPLOYMENT, "probe", probe).await {
            Ok(_) => {
                let strip = json!({"metadata": {"finalizers": null}});
                let _ = deployments.patch("probe", &PatchParams::default(), &Patch::Merge(&strip)).await;
                let _ = deployments.delete("probe", &DeleteParams::default()).await;
                None
            }
            Err(kube::Error::Api(status)) if status.code == 409 => None,
            Err(_) => Some(()),
        }
    })
    .await;

    create(&env.kube, &ns, DEPLOYMENT, "auto", spec(REPO, "apps/auto")).await.expect("a valid deployment");
    // (name, kind, spec, reason, field)
    let cases: Vec<(&str, Kind, Value, &str, &str)> = vec![
        (
            "project",
            DEPLOYMENT,
            json!({"source": {"repoURL": REPO, "path": "p"}, "type": "manual", "project": "default"}),
            reason::FIELD_SET_BY_SERVICE,
            "spec.project",
        ),
        (
            "server",
            DEPLOYMENT,
            json!({"source": {"repoURL": REPO, "path": "p"}, "type": "manual",
                   "destination": {"server": "https://api.example.invalid"}}),
            reason::FIELD_SET_BY_SERVICE,
            "spec.destination.server",
        ),
        (
            "name",
            DEPLOYMENT,
            json!({"source": {"repoURL": REPO, "path": "p"}, "type": "manual", "destination": {"name": "in-cluster"}}),
            reason::FIELD_SET_BY_SERVICE,
            "spec.destination.name",
        ),
        (
            "dotdot",
            DEPLOYMENT,
            json!({"source": {"repoURL": REPO, "path": "a/../../etc"}, "type": "manual"}),
            reason::INVALID_PATH,
            "spec.source.path",
        ),
        (
            "elsewhere",
            DEPLOYMENT,
            json!({"source": {"repoURL": REPO, "path": "p"}, "type": "manual", "destination": {"namespace": "kube-system"}}),
            reason::INVALID_DESTINATION_NAMESPACE,
            "spec.destination.namespace",
        ),
        (
            "password",
            DEPLOYMENT,
            json!({"source": {"repoURL": "https://u:p@git.example.invalid/r", "path": "p"}, "type": "manual"}),
            reason::INVALID_REPOSITORY_URL,
            "spec.source.repoURL",
        ),
        (
            "run-auto",
            SYNC_RUN,
            json!({"gitopsDeploymentName": "auto", "revisionID": "main"}),
            "DeploymentAutomated",
            "auto",
        ),
        (
            "user-in-url",
            ENVIRONMENT,
            json!({"apiURL": "https://admin@api.example.invalid", "credentialsSecret": "s"}),
            reason::INVALID_API_URL,
            "spec.apiURL",
        ),
        (
            "metadata-url",
            ENVIRONMENT,
            json!({"apiURL": "https://169.254.169.254", "credentialsSecret": "s"}),
            reason::API_URL_NOT_ALLOWED,
            "spec.apiURL",
        ),
        (
            "cred-password",
            CREDENTIAL,
            json!({"repository": "https://u:p@git.example.invalid/r", "secret": "s"}),
            reason::INVALID_REPOSITORY_URL,
            "spec.repository",
        ),
    ];
    for (name, kind, spec, why, field) in cases {
        let (code, message) = refusal(create(&env.kube, &ns, kind, name, spec).await, name);
        assert_eq!(code, 422, "{name}: {message}");
        assert!(message.contains(why) && message.contains(field), "{name}: {message:?}");
        assert!(!message.contains(":p@"), "{name}: the password is not echoed: {message}");
    }
    // Changing a valid object into an invalid one is refused the same way.
    let into_project = json!({"spec": {"project": "default"}});
    let changed = deployments.patch("auto", &PatchParams::default(), &Patch::Merge(&into_project)).await;
    let (code, message) = refusal(changed, "update");
    assert!(code == 422 && message.contains("spec.project"), "{message}");
    // Metadata-only changes and deletes of an invalid object pass.
    let labelled = json!({"metadata": {"labels": {"team": "a"}}});
    deployments.patch("early", &PatchParams::default(), &Patch::Merge(&labelled)).await.expect("a label change");
    deployments.delete("early", &DeleteParams::default()).await.expect("delete the invalid one");
    eventually("'early' gone", || async { deployments.get_opt("early").await.ok()?.is_none().then_some(()) }).await;
    assert_eq!(env.condition("auto").await.1, REASON_ACCEPTED);

    // The writer down: applies are refused with a clear message, deletes proceed.
    env.stop_writer(writer, "writer-a").await;
    let refused = eventually("applies refused while no writer answers", || async {
        let probe = spec(REPO, "apps/later");
        match create(&env.kube, &ns, DEPLOYMENT, "later", probe).await {
            Ok(_) => {
                let _ = deployments.delete("later", &DeleteParams::default()).await;
                None
            }
            Err(kube::Error::Api(status)) => Some(status),
            Err(other) => panic!("not an API refusal: {other:?}"),
        }
    })
    .await;
    assert!(refused.message.contains("tenant-resources.managed-gitops.redhat.com"), "{}", refused.message);
    deployments.delete("auto", &DeleteParams::default()).await.expect("a delete proceeds");
    let deleting = deployments.get("auto").await.expect("held by the writer's finalizer");
    assert!(deleting.metadata.deletion_timestamp.is_some(), "marked for deletion");
    admission::unregister(&env.kube, &marker).await;
}

/// `gitopsctl crds check` lists the stored objects the writer's rules refuse (all
/// that a stricter schema could refuse), in every namespace; deleting one while
/// the served schema still admits it releases its finalizer, as the upgrade
/// procedure asks.
#[tokio::test]
async fn writer_admission_kube_crds_check_lists_what_the_rules_refuse() {
    let env = env("wa-crdcheck").await;
    let ns = env.tenant.name().to_owned();
    let _writer = env.writer("writer-a");
    create(&env.kube, &ns, DEPLOYMENT, "fine", spec(REPO, "apps/fine")).await.expect("valid");
    create(&env.kube, &ns, DEPLOYMENT, "dotdot", spec(REPO, "a/../b")).await.expect("admitted by the schema");
    let given = json!({"source": {"repoURL": REPO, "path": "p"}, "type": "manual", "project": "default"});
    create(&env.kube, &ns, DEPLOYMENT, "given", given).await.expect("admitted by the schema");
    let metadata = json!({"apiURL": "https://169.254.169.254", "credentialsSecret": "s"});
    create(&env.kube, &ns, ENVIRONMENT, "metadata", metadata).await.expect("admitted by the schema");
    assert_eq!(env.condition("dotdot").await.1, reason::INVALID_PATH, "the writer has its finalizer on it");

    let mine = |refused: Vec<gitopsctl::crds::Refused>| {
        let mut found: Vec<(String, &str)> =
            refused.into_iter().filter(|r| r.namespace == ns).map(|r| (r.name, r.reason)).collect();
        found.sort();
        found
    };
    let refused = gitopsctl::crds::check(env.kube.clone(), false).await.expect("check");
    assert_eq!(
        mine(refused),
        [
            ("dotdot".to_owned(), reason::INVALID_PATH),
            ("given".to_owned(), reason::FIELD_SET_BY_SERVICE),
            ("metadata".to_owned(), reason::API_URL_NOT_ALLOWED),
        ]
    );
    let allowed = gitopsctl::crds::check(env.kube.clone(), true).await.expect("check");
    assert!(!mine(allowed).iter().any(|(name, _)| name == "metadata"), "--api-url-allow-private");
    // The command line: a refusal (exit 1) whose table names them.
    let command = gitopsctl::cli::Command::Crds(gitopsctl::cli::CrdsArgs {
        out: std::path::PathBuf::from("unused"),
        command: Some(gitopsctl::cli::CrdsCommand::Check {
            kubeconfig: Some(env.kubeconfig.clone()),
            api_url_allow_private: false,
        }),
    });
    let message = gitopsctl::run(command).await.expect_err("refused objects").to_string();
    assert!(message.contains("dotdot") && message.contains("InvalidPath") && message.contains(&ns), "{message}");

    // Deleted while the served schema admits it: the writer releases its finalizer.
    let deployments = api(&env.kube, &ns, DEPLOYMENT.0, DEPLOYMENT.1);
    deployments.delete("dotdot", &DeleteParams::default()).await.expect("delete");
    eventually("'dotdot' gone", || async { deployments.get_opt("dotdot").await.ok()?.is_none().then_some(()) }).await;
    let after = gitopsctl::crds::check(env.kube.clone(), false).await.expect("check");
    assert!(!mine(after).iter().any(|(name, _)| name == "dotdot"));
}

/// A typo'd field (`destinaton`) is pruned by the API server before admission, so
/// neither the schema nor the webhook sees it; kubectl refuses it against the
/// served OpenAPI. Real tier only until the emulator serves OpenAPI for CRDs;
/// skipped, saying so, without kubectl.
#[tokio::test]
async fn writer_admission_kube_kubectl_refuses_a_typo_and_explains_every_field() {
    let cluster = gitops_testkit::cluster::TestCluster::get().await;
    if !cluster.is_real() {
        eprintln!("skipped: the emulator does not serve OpenAPI for CRDs yet");
        return;
    }
    if std::process::Command::new("kubectl").arg("version").arg("--client").output().is_err() {
        eprintln!("skipped: no kubectl installed");
        return;
    }
    let env = env("wa-typo").await;
    let dir = std::env::temp_dir().join(format!("gitops-typo-{}", short_id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let manifest = dir.join("typo.yaml");
    let yaml = format!(
        "apiVersion: managed-gitops.redhat.com/v1alpha1\nkind: GitOpsDeployment\nmetadata: {{name: typo, namespace: {}}}\n\
         spec:\n  source: {{repoURL: '{REPO}', path: apps/a}}\n  destinaton: {{namespace: x}}\n  type: automated\n",
        env.tenant.name()
    );
    std::fs::write(&manifest, yaml).expect("write the manifest");
    let kubectl = |args: &[&str]| {
        let mut command = std::process::Command::new("kubectl");
        command.arg("--kubeconfig").arg(&env.kubeconfig).arg("--cache-dir").arg(dir.join("cache")).args(args);
        command.output().expect("run kubectl")
    };
    let refused = kubectl(&["apply", "-f", manifest.to_str().expect("a path")]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("unknown field \"destinaton\""), "{stderr}");
    // `kubectl explain` shows the descriptions, down to the fields the service sets.
    let explained = kubectl(&["explain", "gitopsdeployment.spec.destination.server"]);
    let stdout = String::from_utf8_lossy(&explained.stdout);
    assert!(stdout.contains("Set by the service"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}
