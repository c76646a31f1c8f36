//! The agent's last line of defence, against PostgreSQL and the Argo CD stand-in on
//! the test tier's API server: rows written straight into the database that aim at
//! an engine namespace or `kube-system` of the home cluster never become Argo CD
//! objects (the operation ends refused, the counter counts), an Application such a
//! row left behind is removed without Argo CD pruning it (the stand-in's `hang`
//! knob would hold a deletion that went through the resources finalizer forever),
//! the sweep does not bring it back, and a tenant's own cluster elsewhere may use
//! any namespace name. Hosts are under `.invalid` and never contacted.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use gitops_agent::destination::{DestinationConfig, DestinationGuard, RefusedKind};
use gitops_agent::engine::argocd::{ArgoCdEngine, app_project_resource, application_resource};
use gitops_agent::metrics::Metrics;
use gitops_agent::names;
use gitops_agent::reconcile::Reconciler;
use gitops_agent::{AgentConfig, run_agent};
use gitops_shared::crypto::SecretBox;
use gitops_shared::db::application::{ApplicationIntent, application_upsert_in_txn};
use gitops_shared::db::credential::{
    ClusterCredentials, ManagedEnvironmentIntent, RepositoryCredentialIntent, RepositoryCredentials,
    managed_environment_upsert_in_txn, repository_credential_upsert_in_txn,
};
use gitops_shared::db::engine_instance::{EngineInstance, engine_instance_add};
use gitops_shared::db::tenant::tenant_upsert_locked_in_txn;
use gitops_shared::model::{ManagedEnvironmentId, ResourceType, SyncType, TenantId};
use gitops_shared::queue::{Failure, Outcome, operation_enqueue_in_txn};
use gitops_testkit::TestDb;
use gitops_testkit::argocd::{self, FINALIZER_KNOB, RESOURCES_FINALIZER};
use gitops_testkit::cluster::TestNamespace;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::{HOME_API_URL, eventually, home_environment, intent};

/// Another registered engine instance's namespace (never created: only its row).
const OTHER_ENGINE_NAMESPACE: &str = "argocd-elsewhere";
/// A tenant's own cluster, not the home cluster.
const REMOTE_API_URL: &str = "https://tenant-cluster.example.invalid:6443";
const REPO: &str = "https://git.example.invalid/team-a/app.git";
/// The operator's extra reserved pattern in these tests.
const RESERVED_PATTERN: &str = "infra-*";

struct Env {
    db: TestDb,
    client: Client,
    kube: kube::Client,
    ns: TestNamespace,
    instance: EngineInstance,
    secrets: SecretBox,
    metrics: Arc<Metrics>,
    reconciler: Reconciler,
    kubeconfig: std::path::PathBuf,
    tenant: TenantId,
    home: ManagedEnvironmentId,
    cancel: CancellationToken,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

fn destination_config() -> DestinationConfig {
    DestinationConfig {
        home_api_urls: vec![HOME_API_URL.to_owned()],
        service_namespaces: BTreeSet::from(["gitops-service".to_owned()]),
        reserved_namespaces: vec![RESERVED_PATTERN.parse().expect("pattern")],
    }
}

async fn env(purpose: &str) -> Env {
    let ground = crate::support::agent_ground(purpose).await;
    let crate::support::AgentGround {
        db,
        mut client,
        kube,
        agent_kube,
        agent_kubeconfig,
        ns,
        instance,
        secrets,
        cancel,
    } = ground;
    engine_instance_add(&client, "argocd-2", OTHER_ENGINE_NAMESPACE, 1000).await.expect("add another instance");
    let engine = Arc::new(ArgoCdEngine::new(agent_kube, ns.name()));
    let metrics = Arc::new(Metrics::default());
    let guard = DestinationGuard::new(&destination_config(), ns.name(), metrics.clone()).expect("valid settings");
    let reconciler =
        Reconciler::new(db.pool(4), engine, secrets.clone(), instance.clone()).with_destinations(Arc::new(guard));
    let txn = client.transaction().await.expect("begin");
    let tenant =
        tenant_upsert_locked_in_txn(&txn, Uuid::new_v4(), "team-a", Some(instance.id)).await.expect("tenant").id;
    txn.commit().await.expect("commit");
    let home = home_environment(&mut client, &secrets, instance.id, tenant, "team-a").await;
    let kubeconfig = agent_kubeconfig;
    Env { db, client, kube, ns, instance, secrets, metrics, reconciler, kubeconfig, tenant, home, cancel }
}

impl Env {
    fn apps(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.kube.clone(), self.ns.name(), &application_resource())
    }

    fn secret_api(&self) -> Api<Secret> {
        Api::namespaced(self.kube.clone(), self.ns.name())
    }

    async fn get(&self, api: &Api<DynamicObject>, name: &str) -> Option<Value> {
        api.get_opt(name).await.expect("read").map(|o| serde_json::to_value(o).expect("json"))
    }

    async fn enqueue(&mut self, resource_type: ResourceType, id: i64) {
        let txn = self.client.transaction().await.expect("begin");
        operation_enqueue_in_txn(&txn, self.instance.id, self.tenant, resource_type, id).await.expect("enqueue");
        txn.commit().await.expect("commit");
    }

    /// An application row (with its operation) written straight into the database.
    async fn application(&mut self, uid: Uuid, change: impl FnOnce(&mut ApplicationIntent)) -> i64 {
        let mut intent = intent(uid, 1);
        intent.repo_url = REPO.into();
        intent.sync_type = SyncType::Manual;
        intent.managed_environment_id = Some(self.home);
        change(&mut intent);
        let txn = self.client.transaction().await.expect("begin");
        let id = application_upsert_in_txn(&txn, self.tenant, &intent).await.expect("upsert").expect("changed").0;
        operation_enqueue_in_txn(&txn, self.instance.id, self.tenant, ResourceType::Application, id)
            .await
            .expect("enqueue");
        txn.commit().await.expect("commit");
        id
    }

    /// A managed environment of the tenant (not its home one) with its operation.
    async fn environment(&mut self, api_url: &str, namespaces: &[&str]) -> (ManagedEnvironmentId, Uuid) {
        let uid = Uuid::new_v4();
        let intent = ManagedEnvironmentIntent {
            resource_uid: uid,
            resource_name: "cluster".into(),
            generation: 1,
            api_url: api_url.into(),
            allow_insecure_skip_tls_verify: false,
            namespaces: namespaces.iter().map(|s| (*s).to_owned()).collect(),
            cluster_resources: false,
            secret_name: "kubeconfig".into(),
            secret_resource_version: Some("1".into()),
            credentials: ClusterCredentials { bearer_token: Some("tenant-token".into()), ..Default::default() },
        };
        let txn = self.client.transaction().await.expect("begin");
        let id = managed_environment_upsert_in_txn(&txn, &self.secrets, self.tenant, &intent)
            .await
            .expect("upsert")
            .expect("new");
        operation_enqueue_in_txn(&txn, self.instance.id, self.tenant, ResourceType::ManagedEnvironment, id.0)
            .await
            .expect("enqueue");
        txn.commit().await.expect("commit");
        (id, uid)
    }

    /// Claims every due operation, reconciles it and records the outcome as the
    /// consumer does (retries come due at once).
    async fn reconcile(&self) -> Vec<(ResourceType, i64, Outcome)> {
        crate::support::reconcile_due(&self.client, self.instance.id, &self.reconciler).await
    }

    /// `(state, tenant_message)` of the last operation of a resource.
    async fn operation(&self, resource_type: ResourceType, id: i64) -> (String, Option<String>) {
        let row = self
            .client
            .query_one(
                "SELECT state::text, tenant_message FROM operation_log
                  WHERE resource_type = $1 AND resource_id = $2 ORDER BY id DESC LIMIT 1",
                &[&resource_type, &id],
            )
            .await
            .expect("operation");
        (row.get(0), row.get(1))
    }

    /// An Application as an earlier agent version would have made it for row `id`:
    /// owned labels, Argo CD's resources finalizer, and the stand-in's `hang` knob,
    /// so a deletion through that finalizer would never finish.
    async fn leftover_application(&self, name: &str, id: i64, namespace: &str, finalizers: &[&str]) {
        let labels = names::labels(self.tenant, &[(names::APPLICATION_ID_LABEL, id.to_string())]);
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": name, "labels": labels, "finalizers": finalizers,
                         "annotations": {FINALIZER_KNOB: "hang"}},
            "spec": {
                "project": names::project_name(self.tenant),
                "source": {"repoURL": REPO, "path": "deploy/app", "targetRevision": "HEAD"},
                "destination": {"server": names::environment_server(HOME_API_URL, self.home), "namespace": namespace},
            },
        }))
        .expect("Application");
        self.apps().create(&PostParams::default(), &object).await.expect("create the leftover Application");
    }

    async fn wait_gone(&self, name: &str, what: &str) {
        eventually(what, || async { self.get(&self.apps(), name).await.is_none().then_some(()) }).await;
    }
}

fn assert_refused(outcome: Option<&(ResourceType, i64, Outcome)>, what: &str) -> String {
    match outcome {
        Some((_, _, Outcome::Failed(Failure::Permanent { tenant_message, operator_error }))) => {
            assert!(tenant_message.contains("reserved"), "{what}: {tenant_message}");
            assert!(!operator_error.contains("tenant-token"), "{what}: no credentials in errors");
            tenant_message.clone()
        }
        other => panic!("{what}: expected a permanent refusal, got {other:?}"),
    }
}

fn destinations(project: &Value) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = project["spec"]["destinations"]
        .as_array()
        .expect("destinations")
        .iter()
        .map(|d| (d["server"].as_str().unwrap_or("").to_owned(), d["namespace"].as_str().unwrap_or("").to_owned()))
        .collect();
    pairs.sort();
    pairs
}

#[tokio::test]
async fn agent_refuses_engine_and_system_namespaces_of_the_home_cluster() {
    let mut env = env("agent-dest-refuse").await;
    let engine_ns = env.ns.name().to_owned();
    // Through the tenant's home environment: its own instance's namespace, another
    // instance's, kube-system, a service namespace and an operator pattern.
    let forbidden = [engine_ns.as_str(), OTHER_ENGINE_NAMESPACE, "kube-system", "gitops-service", "infra-db"];
    let mut rows = Vec::new();
    for namespace in forbidden {
        let uid = Uuid::new_v4();
        rows.push((env.application(uid, |i| i.destination_namespace = namespace.into()).await, uid, namespace));
    }
    // An environment that is not flagged home but reaches the home cluster by a
    // spelling of the in-cluster URL, listing kube-system.
    let (in_cluster, in_cluster_uid) = env.environment("HTTPS://Kubernetes.Default.SVC:443/", &["kube-system"]).await;
    let through_url = Uuid::new_v4();
    let through_url_id = env
        .application(through_url, |i| {
            i.managed_environment_id = Some(in_cluster);
            i.destination_namespace = "kube-system".into();
        })
        .await;
    // And one that is fine.
    let allowed = Uuid::new_v4();
    let allowed_id = env.application(allowed, |_| {}).await;

    let outcomes = env.reconcile().await;
    let outcome = |resource_type, id| outcomes.iter().find(|(t, i, _)| *t == resource_type && *i == id);
    for (id, uid, namespace) in &rows {
        let message = assert_refused(outcome(ResourceType::Application, *id), namespace);
        assert!(message.contains(namespace), "the tenant reads which namespace: {message}");
        assert!(env.get(&env.apps(), &names::application_name(*uid)).await.is_none(), "no Application for {namespace}");
        let (state, tenant_message) = env.operation(ResourceType::Application, *id).await;
        assert_eq!(state, "failed", "{namespace}: a refusal is a dead letter, not retried");
        assert!(tenant_message.is_some_and(|m| m.contains("reserved")), "{namespace}: the tenant reads why");
    }
    assert_refused(outcome(ResourceType::Application, through_url_id), "a home URL in another spelling");
    assert_refused(outcome(ResourceType::ManagedEnvironment, in_cluster.0), "a cluster Secret for kube-system at home");
    assert!(env.get(&env.apps(), &names::application_name(through_url)).await.is_none());
    let cluster_secret = env.secret_api().get_opt(&names::cluster_secret_name(in_cluster_uid)).await.expect("read");
    assert!(cluster_secret.is_none(), "no cluster Secret reaching kube-system of the home cluster");
    assert!(matches!(outcome(ResourceType::Application, allowed_id), Some((_, _, Outcome::Done))), "{outcomes:?}");
    env.get(&env.apps(), &names::application_name(allowed)).await.expect("the allowed Application exists");

    assert_eq!(env.metrics.destinations_refused(RefusedKind::Application), 6);
    assert_eq!(env.metrics.destinations_refused(RefusedKind::ClusterSecret), 1);
    let text = env.metrics.render();
    assert!(text.contains("gitops_agent_destinations_refused_total{kind=\"application\"} 6"), "{text}");
    assert!(text.contains("gitops_agent_destinations_refused_total{kind=\"cluster_secret\"} 1"), "{text}");

    // The project never lists a reserved namespace of the home cluster, even when an
    // environment row names one (refused destinations are counted too).
    let project = env
        .get(
            &Api::namespaced_with(env.kube.clone(), env.ns.name(), &app_project_resource()),
            &names::project_name(env.tenant),
        )
        .await
        .expect("project");
    assert_eq!(destinations(&project), [(names::environment_server(HOME_API_URL, env.home), "team-a".to_owned())]);
    assert!(env.metrics.destinations_refused(RefusedKind::ProjectDestination) > 0);
}

#[tokio::test]
async fn agent_removes_a_reserved_application_without_pruning() {
    let mut env = env("agent-dest-release").await;
    // Active row: the Application an earlier version made goes, its finalizer
    // never honoured (with the `hang` knob the stand-in would hold it forever).
    let active = Uuid::new_v4();
    let active_id = env.application(active, |i| i.destination_namespace = "kube-system".into()).await;
    let active_name = names::application_name(active);
    env.leftover_application(&active_name, active_id, "kube-system", &[RESOURCES_FINALIZER]).await;
    // Deleting row: removed without pruning too, and the deletion confirmed.
    let engine_ns = env.ns.name().to_owned();
    let deleting = Uuid::new_v4();
    let deleting_id = env.application(deleting, |i| i.destination_namespace = engine_ns.clone()).await;
    env.client
        .execute("UPDATE application SET row_state = 'deleting' WHERE id = $1", &[&deleting_id])
        .await
        .expect("tombstone");
    let deleting_name = names::application_name(deleting);
    let keep = "example.invalid/keep";
    env.leftover_application(&deleting_name, deleting_id, &engine_ns, &[RESOURCES_FINALIZER, keep]).await;
    // No row at all: an orphan aimed at kube-system.
    let orphan_name = "gitops-orphan-kube-system";
    env.leftover_application(orphan_name, 999_999, "kube-system", &[RESOURCES_FINALIZER]).await;
    env.enqueue(ResourceType::Application, 999_999).await;

    let outcomes = env.reconcile().await;
    let outcome = |id| outcomes.iter().find(|(t, i, _)| *t == ResourceType::Application && *i == id);
    assert_refused(outcome(active_id), "the active row");
    env.wait_gone(&active_name, "the refused Application removed").await;
    env.wait_gone(orphan_name, "the orphan removed").await;

    // The deleting one is held only by the foreign finalizer: Argo CD's is gone and
    // was removed before the delete, so the stand-in never saw a deletion to prune.
    let held = env.get(&env.apps(), &deleting_name).await.expect("held by the foreign finalizer");
    assert!(held["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(held["metadata"]["finalizers"], json!([keep]));
    let conditions = held["status"]["conditions"].as_array().cloned().unwrap_or_default();
    assert!(conditions.iter().all(|c| c["type"] != argocd::DELETION_ERROR), "never pruning: {conditions:?}");
    let release = json!({"metadata": {"finalizers": null}});
    env.apps().patch(&deleting_name, &PatchParams::default(), &Patch::Merge(&release)).await.expect("release");
    env.wait_gone(&deleting_name, "the deleting Application gone").await;
    let deadline = std::time::Instant::now() + crate::support::DEADLINE;
    loop {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for the deletion to be confirmed");
        let state: String = env
            .client
            .query_one("SELECT row_state::text FROM application WHERE id = $1", &[&deleting_id])
            .await
            .expect("row")
            .get(0);
        if state == "deleted" {
            break;
        }
        env.enqueue(ResourceType::Application, deleting_id).await;
        let again = env.reconcile().await;
        assert!(again.iter().all(|(_, _, o)| !matches!(o, Outcome::Failed(Failure::Permanent { .. }))), "{again:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(env.metrics.destinations_refused(RefusedKind::Application) >= 3);
}

#[tokio::test]
async fn agent_allows_any_namespace_on_other_clusters_and_keeps_secrets_project_scoped() {
    let mut env = env("agent-dest-remote").await;
    let (remote, remote_uid) = env.environment(REMOTE_API_URL, &["kube-system"]).await;
    let uid = Uuid::new_v4();
    env.application(uid, |i| {
        i.managed_environment_id = Some(remote);
        i.destination_namespace = "kube-system".into();
    })
    .await;
    let repo_uid = Uuid::new_v4();
    let repo = RepositoryCredentialIntent {
        resource_uid: repo_uid,
        resource_name: "repo".into(),
        generation: 1,
        repo_url: REPO.into(),
        secret_name: "git".into(),
        secret_resource_version: Some("1".into()),
        credentials: Some(RepositoryCredentials {
            username: Some("git".into()),
            password: Some("pw".into()),
            ..Default::default()
        }),
    };
    let txn = env.client.transaction().await.expect("begin");
    let repo_id =
        repository_credential_upsert_in_txn(&txn, &env.secrets, env.tenant, &repo).await.expect("upsert").expect("new");
    operation_enqueue_in_txn(&txn, env.instance.id, env.tenant, ResourceType::RepositoryCredential, repo_id.0)
        .await
        .expect("enqueue");
    txn.commit().await.expect("commit");

    let outcomes = env.reconcile().await;
    assert!(outcomes.iter().all(|(_, _, o)| matches!(o, Outcome::Done)), "{outcomes:?}");
    let name = names::application_name(uid);
    let server = names::environment_server(REMOTE_API_URL, remote);
    let app = eventually("the Application on the tenant's cluster admitted by its project", || async {
        env.get(&env.apps(), &name).await.filter(|a| a["status"]["sync"]["status"] == "OutOfSync")
    })
    .await;
    assert_eq!(app["spec"]["destination"], json!({"server": server, "namespace": "kube-system"}));
    assert_eq!(app["spec"]["project"], names::project_name(env.tenant));
    for kind in RefusedKind::ALL {
        assert_eq!(env.metrics.destinations_refused(kind), 0, "{kind:?}");
    }

    // Every credential Secret names the tenant's project, so no other project's
    // Applications can use it.
    let project = names::project_name(env.tenant);
    let secrets = [
        (names::cluster_secret_name(remote_uid), "cluster"),
        (names::repository_secret_name(repo_uid), "repository"),
        (names::cluster_secret_name(home_uid(&env).await), "cluster"),
    ];
    for (secret, kind) in secrets {
        let found = env.secret_api().get(&secret).await.expect("secret");
        let labels = found.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("argocd.argoproj.io/secret-type").map(String::as_str), Some(kind), "{secret}");
        let data = found.data.unwrap_or_default();
        let scoped = data.get("project").map(|v| String::from_utf8_lossy(&v.0).into_owned());
        assert_eq!(
            scoped.as_deref(),
            Some(project.as_str()),
            "{kind} Secret {secret} is scoped to the tenant's project"
        );
    }
}

async fn home_uid(env: &Env) -> Uuid {
    env.client
        .query_one("SELECT resource_uid FROM managed_environment WHERE id = $1", &[&env.home])
        .await
        .expect("home row")
        .get(0)
}

#[tokio::test]
async fn agent_sweep_does_not_bring_back_a_refused_application() {
    let mut env = env("agent-dest-sweep").await;
    let uid = Uuid::new_v4();
    let id = env.application(uid, |i| i.destination_namespace = "infra-db".into()).await;
    let name = names::application_name(uid);
    env.leftover_application(&name, id, "infra-db", &[RESOURCES_FINALIZER]).await;

    let mut config = AgentConfig::new(env.db.url(), "argocd-1".into(), env.secrets.clone());
    config.kubeconfig = Some(env.kubeconfig.clone());
    config.metrics_address = "127.0.0.1:0".parse().expect("address");
    config.sweep.interval = Duration::from_millis(300);
    config.poll_interval = Duration::from_secs(1);
    config.concurrency = 2;
    config.destinations = destination_config();
    let handle = config.handle.clone();
    let cancel = CancellationToken::new();
    let agent = tokio::spawn(run_agent(config, cancel.clone()));

    env.wait_gone(&name, "the refused Application removed (its finalizer would hang)").await;
    let metrics = handle.metrics("argocd-1");
    eventually("the refusal counted", || async {
        (metrics.destinations_refused(RefusedKind::Application) > 0).then_some(())
    })
    .await;
    // The refusal is permanent at this generation: the row reads Stalled, and two
    // more sweeps neither bring the Application back nor queue the row again.
    eventually("the row stalled", || async {
        let row = env
            .client
            .query_opt("SELECT agent_stalled FROM application_state WHERE application_id = $1", &[&id])
            .await
            .ok()??;
        row.get::<_, bool>(0).then_some(())
    })
    .await;
    let target = metrics.sweeps() + 2;
    eventually("two more sweeps", || async { (metrics.sweeps() >= target).then_some(()) }).await;
    assert!(env.get(&env.apps(), &name).await.is_none(), "the sweep did not bring it back");
    let (state, message) = env.operation(ResourceType::Application, id).await;
    assert!(state == "failed" || state == "waiting" || state == "claimed", "{state}");
    if state == "failed" {
        assert!(message.is_some_and(|m| m.contains("infra-db") && m.contains("reserved")));
    }
    assert!(metrics.render().contains("gitops_agent_destinations_refused_total{kind=\"application\"}"));

    cancel.cancel();
    tokio::time::timeout(crate::support::DEADLINE, agent).await.expect("stops").expect("task").expect("clean exit");
}
