//! The agent's reconciler against PostgreSQL and the Argo CD stand-in on the test
//! tier's API server (the emulator, or the cluster in GITOPS_TEST_KUBECONFIG): rows
//! and operations in, exactly the expected Argo CD objects out, per resource type,
//! across two tenants, through deletion (also a hanging one) and for sync runs.
//! Operations are claimed and handed to the Reconciler directly.

use std::sync::Arc;
use std::time::Duration;

use gitops_agent::engine::argocd::{ArgoCdEngine, app_project_resource, application_resource};
use gitops_agent::names;
use gitops_agent::reconcile::Reconciler;
use gitops_shared::crypto::SecretBox;
use gitops_shared::db::application::application_upsert_in_txn;
use gitops_shared::db::credential::{
    ClusterCredentials, ManagedEnvironmentIntent, RepositoryCredentialIntent, RepositoryCredentials,
    managed_environment_upsert_in_txn, repository_credential_upsert_in_txn,
};
use gitops_shared::db::engine_instance::EngineInstance;
use gitops_shared::db::tenant::tenant_upsert_locked_in_txn;
use gitops_shared::model::{ManagedEnvironmentId, ResourceType, SyncType, TenantId};
use gitops_shared::queue::{Outcome, operation_enqueue_in_txn};
use gitops_testkit::TestDb;
use gitops_testkit::argocd::fake_revision;
use gitops_testkit::cluster::TestNamespace;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::{HOME_API_URL, eventually, home_environment, intent};

pub(crate) const REPO_A: &str = "https://git.example.invalid/team-a/private.git";
pub(crate) const API_URL: &str = "https://cluster.example.invalid:6443";

pub(crate) struct Env {
    pub(crate) _db: TestDb,
    pub(crate) client: Client,
    pub(crate) kube: kube::Client,
    pub(crate) ns: TestNamespace,
    pub(crate) instance: EngineInstance,
    pub(crate) secrets: SecretBox,
    pub(crate) reconciler: Reconciler,
    pub(crate) cancel: CancellationToken,
    /// Each tenant's home environment (every application row has an environment).
    pub(crate) homes: std::collections::HashMap<TenantId, ManagedEnvironmentId>,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

pub(crate) async fn env(purpose: &str, stuck_after: Duration) -> Env {
    let ground = crate::support::agent_ground(purpose).await;
    let engine = Arc::new(ArgoCdEngine::new(ground.agent_kube, ground.ns.name()));
    let reconciler = Reconciler::new(ground.db.pool(4), engine, ground.secrets.clone(), ground.instance.clone())
        .with_stuck_deletion_after(stuck_after);
    let crate::support::AgentGround { db, client, kube, ns, instance, secrets, cancel, .. } = ground;
    Env { _db: db, client, kube, ns, instance, secrets, reconciler, cancel, homes: Default::default() }
}

impl Env {
    pub(crate) fn apps(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.kube.clone(), self.ns.name(), &application_resource())
    }

    pub(crate) fn projects(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.kube.clone(), self.ns.name(), &app_project_resource())
    }

    pub(crate) fn secret_api(&self) -> Api<Secret> {
        Api::namespaced(self.kube.clone(), self.ns.name())
    }

    pub(crate) async fn tenant(&mut self, namespace: &str) -> TenantId {
        let txn = self.client.transaction().await.expect("begin");
        let tenant =
            tenant_upsert_locked_in_txn(&txn, Uuid::new_v4(), namespace, Some(self.instance.id)).await.expect("tenant");
        txn.commit().await.expect("commit");
        let home = home_environment(&mut self.client, &self.secrets, self.instance.id, tenant.id, namespace).await;
        self.homes.insert(tenant.id, home);
        tenant.id
    }

    /// The server string of a tenant's home environment.
    pub(crate) fn home_server(&self, tenant: TenantId) -> String {
        names::environment_server(HOME_API_URL, self.homes[&tenant])
    }

    pub(crate) async fn enqueue(&mut self, tenant: TenantId, resource_type: ResourceType, id: i64) {
        let txn = self.client.transaction().await.expect("begin");
        operation_enqueue_in_txn(&txn, self.instance.id, tenant, resource_type, id).await.expect("enqueue");
        txn.commit().await.expect("commit");
    }

    /// Claims every due operation, reconciles it and records the outcome as the
    /// consumer does (retries come due at once).
    pub(crate) async fn reconcile(&self) -> Vec<(ResourceType, i64, Outcome)> {
        crate::support::reconcile_due(&self.client, self.instance.id, &self.reconciler).await
    }

    /// Reconciles until every operation completed.
    pub(crate) async fn reconcile_done(&self) {
        for (resource_type, id, outcome) in self.reconcile().await {
            assert!(matches!(outcome, Outcome::Done), "{resource_type} {id}: {outcome:?}");
        }
    }

    pub(crate) async fn application(
        &mut self,
        tenant: TenantId,
        generation: i64,
        uid: Uuid,
        change: impl FnOnce(&mut gitops_shared::db::application::ApplicationIntent),
    ) -> i64 {
        let mut intent = intent(uid, generation);
        intent.managed_environment_id = self.homes.get(&tenant).copied();
        change(&mut intent);
        let txn = self.client.transaction().await.expect("begin");
        let id = application_upsert_in_txn(&txn, tenant, &intent).await.expect("upsert").expect("changed").0;
        operation_enqueue_in_txn(&txn, self.instance.id, tenant, ResourceType::Application, id).await.expect("enqueue");
        txn.commit().await.expect("commit");
        id
    }

    pub(crate) async fn environment(
        &mut self,
        tenant: TenantId,
        token: &str,
        namespaces: &[&str],
    ) -> (ManagedEnvironmentId, Uuid) {
        let uid = Uuid::new_v4();
        let intent = ManagedEnvironmentIntent {
            resource_uid: uid,
            resource_name: "cluster".into(),
            generation: 1,
            api_url: API_URL.into(),
            allow_insecure_skip_tls_verify: false,
            namespaces: namespaces.iter().map(|s| (*s).to_owned()).collect(),
            cluster_resources: false,
            secret_name: "kubeconfig".into(),
            secret_resource_version: Some("1".into()),
            credentials: ClusterCredentials { bearer_token: Some(token.into()), ..Default::default() },
        };
        let txn = self.client.transaction().await.expect("begin");
        let id = managed_environment_upsert_in_txn(&txn, &self.secrets, tenant, &intent)
            .await
            .expect("upsert")
            .expect("new");
        operation_enqueue_in_txn(&txn, self.instance.id, tenant, ResourceType::ManagedEnvironment, id.0)
            .await
            .expect("enqueue");
        txn.commit().await.expect("commit");
        (id, uid)
    }

    pub(crate) async fn repository_credential(&mut self, tenant: TenantId, password: &str) -> Uuid {
        let uid = Uuid::new_v4();
        let intent = RepositoryCredentialIntent {
            resource_uid: uid,
            resource_name: "repo".into(),
            generation: 1,
            repo_url: REPO_A.into(),
            secret_name: "git".into(),
            secret_resource_version: Some("1".into()),
            credentials: Some(RepositoryCredentials {
                username: Some("git".into()),
                password: Some(password.into()),
                ..Default::default()
            }),
        };
        let txn = self.client.transaction().await.expect("begin");
        let id = repository_credential_upsert_in_txn(&txn, &self.secrets, tenant, &intent)
            .await
            .expect("upsert")
            .expect("new");
        operation_enqueue_in_txn(&txn, self.instance.id, tenant, ResourceType::RepositoryCredential, id.0)
            .await
            .expect("enqueue");
        txn.commit().await.expect("commit");
        uid
    }

    /// Re-enqueues and reconciles the application until its row is confirmed deleted.
    pub(crate) async fn until_deleted(&mut self, tenant: TenantId, id: i64) {
        let deadline = std::time::Instant::now() + crate::support::DEADLINE;
        while self.row_state(APP_STATE, id).await != "deleted" {
            assert!(std::time::Instant::now() < deadline, "timed out waiting for the deletion of application {id}");
            self.enqueue(tenant, ResourceType::Application, id).await;
            self.reconcile().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub(crate) async fn get(&self, api: &Api<DynamicObject>, name: &str) -> Option<Value> {
        api.get_opt(name).await.expect("read").map(|o| serde_json::to_value(o).expect("json"))
    }

    pub(crate) async fn secret_data(&self, name: &str) -> (Value, std::collections::BTreeMap<String, String>) {
        let secret = self.secret_api().get(name).await.expect("secret");
        let data = secret
            .data
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8(v.0).expect("utf8")))
            .collect();
        (json!(secret.metadata.labels), data)
    }

    pub(crate) async fn wait_app(&self, name: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        eventually(what, || async { self.get(&self.apps(), name).await.filter(|app| check(app)) }).await
    }

    pub(crate) async fn row_state(&self, table_query: &str, id: i64) -> String {
        self.client.query_one(table_query, &[&id]).await.expect("row").get(0)
    }
}

pub(crate) fn destinations(project: &Value) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = project["spec"]["destinations"]
        .as_array()
        .expect("destinations")
        .iter()
        .map(|d| (d["server"].as_str().unwrap_or("").to_owned(), d["namespace"].as_str().unwrap_or("").to_owned()))
        .collect();
    pairs.sort();
    pairs
}

pub(crate) const APP_STATE: &str = "SELECT row_state::text FROM application WHERE id = $1";

#[tokio::test]
async fn agent_application_create_update_delete() {
    let mut env = env("agent-app", Duration::from_secs(600)).await;
    let tenant = env.tenant("team-a").await;
    let uid = Uuid::new_v4();
    let id = env.application(tenant, 1, uid, |i| i.sync_type = SyncType::Manual).await;
    env.reconcile_done().await;

    let name = names::application_name(uid);
    let project = names::project_name(tenant);
    let app = env
        .wait_app(&name, "an OutOfSync Application (its project admits it; never synced)", |a| {
            a["status"]["sync"]["status"] == "OutOfSync"
        })
        .await;
    assert_eq!(app["metadata"]["namespace"], env.ns.name());
    assert_eq!(app["metadata"]["labels"][names::APPLICATION_ID_LABEL], id.to_string());
    assert_eq!(app["metadata"]["labels"][names::TENANT_ID_LABEL], tenant.0.to_string());
    assert_eq!(app["metadata"]["finalizers"], json!(["resources-finalizer.argocd.argoproj.io"]));
    assert_eq!(app["spec"]["project"], project.as_str());
    assert_eq!(app["spec"]["destination"], json!({"server": env.home_server(tenant), "namespace": "team-a"}));
    assert_eq!(app["spec"]["source"]["repoURL"], "https://git.example.invalid/team/repo.git");
    assert_eq!(app["spec"]["syncPolicy"], json!({}));
    assert!(app.get("operation").is_none());
    let proj = env.get(&env.projects(), &project).await.expect("AppProject");
    assert_eq!(proj["spec"]["sourceRepos"], json!(["https://git.example.invalid/team/repo.git"]));
    assert_eq!(destinations(&proj), [(env.home_server(tenant), "team-a".to_owned())]);
    assert_eq!(proj["spec"]["clusterResourceWhitelist"], json!([]));

    // Update: automated with CreateNamespace.
    env.application(tenant, 2, uid, |i| i.create_namespace = true).await;
    env.reconcile_done().await;
    let app = env.get(&env.apps(), &name).await.expect("Application");
    assert_eq!(
        app["spec"]["syncPolicy"],
        json!({
            "automated": {"prune": true, "selfHeal": true, "allowEmpty": true},
            "retry": {"limit": -1, "backoff": {"duration": "5s", "factor": 2, "maxDuration": "3m"}},
            "syncOptions": ["PrunePropagationPolicy=background", "CreateNamespace=true"],
        })
    );

    // Delete: tombstone → Application gone → row confirmed.
    env.client.execute("UPDATE application SET row_state = 'deleting' WHERE id = $1", &[&id]).await.expect("tombstone");
    env.until_deleted(tenant, id).await;
    assert!(env.get(&env.apps(), &name).await.is_none(), "the Application is gone once the row is deleted");
    let proj = env.get(&env.projects(), &project).await.expect("AppProject");
    assert_eq!(proj["spec"]["sourceRepos"], json!([]), "the project no longer admits the deleted source");
}

#[tokio::test]
async fn agent_credentials_and_destinations_stay_with_their_tenant() {
    let mut env = env("agent-tenants", Duration::from_secs(600)).await;
    let a = env.tenant("team-a").await;
    let b = env.tenant("team-b").await;
    let (env_a, env_a_uid) = env.environment(a, "token-a", &["team-a-dev"]).await;
    let (env_b, env_b_uid) = env.environment(b, "token-b", &["team-b-dev"]).await;
    let repo_a = env.repository_credential(a, "password-a").await;
    let app_a = Uuid::new_v4();
    env.application(a, 1, app_a, |i| {
        i.repo_url = REPO_A.into();
        i.managed_environment_id = Some(env_a);
        i.destination_namespace = "team-a-dev".into();
    })
    .await;
    // Tenant B names A's private repository and A's API server.
    let app_b = Uuid::new_v4();
    env.application(b, 1, app_b, |i| {
        i.repo_url = REPO_A.into();
        i.managed_environment_id = Some(env_b);
        i.destination_namespace = "team-b-dev".into();
    })
    .await;
    env.reconcile_done().await;

    let server_a = names::environment_server(API_URL, env_a);
    let server_b = names::environment_server(API_URL, env_b);
    assert_ne!(server_a, server_b);
    for (uid, tenant, server, token) in [(env_a_uid, a, &server_a, "token-a"), (env_b_uid, b, &server_b, "token-b")] {
        let (labels, data) = env.secret_data(&names::cluster_secret_name(uid)).await;
        assert_eq!(labels["argocd.argoproj.io/secret-type"], "cluster");
        assert_eq!(labels[names::TENANT_ID_LABEL], tenant.0.to_string());
        assert_eq!(&data["server"], server);
        assert_eq!(data["project"], names::project_name(tenant));
        assert_eq!(data["clusterResources"], "false");
        let config: Value = serde_json::from_str(&data["config"]).expect("config");
        assert_eq!(config, json!({"bearerToken": token, "tlsClientConfig": {"insecure": false}}));
    }
    let (labels, data) = env.secret_data(&names::repository_secret_name(repo_a)).await;
    assert_eq!(labels["argocd.argoproj.io/secret-type"], "repository");
    assert_eq!((data["url"].as_str(), data["type"].as_str(), data["password"].as_str()), (REPO_A, "git", "password-a"));
    assert_eq!(data["project"], names::project_name(a), "A's credentials serve A's project only");
    let secrets = env
        .secret_api()
        .list(&ListParams::default().labels("argocd.argoproj.io/secret-type=repository"))
        .await
        .expect("list");
    assert_eq!(secrets.items.len(), 1, "B got no repository credentials");

    let project_a = env.get(&env.projects(), &names::project_name(a)).await.expect("project A");
    let project_b = env.get(&env.projects(), &names::project_name(b)).await.expect("project B");
    assert_eq!(
        destinations(&project_a),
        [(server_a.clone(), "team-a-dev".to_owned()), (env.home_server(a), "team-a".to_owned())]
    );
    assert_eq!(
        destinations(&project_b),
        [(server_b.clone(), "team-b-dev".to_owned()), (env.home_server(b), "team-b".to_owned())]
    );
    // B's Application cannot read A's private repository: A's credentials serve A's project only.
    let app = env
        .wait_app(&names::application_name(app_b), "B's Application unable to read A's repository", |a| {
            a["status"]["conditions"][0]["type"] == "ComparisonError"
        })
        .await;
    assert!(
        app["status"]["conditions"][0]["message"].as_str().unwrap_or("").contains("authentication required"),
        "{app}"
    );
    assert_eq!(app["status"]["sync"]["status"], "Unknown");
    assert_eq!(app["spec"]["project"], names::project_name(b));
    assert_eq!(app["spec"]["destination"], json!({"server": server_b, "namespace": "team-b-dev"}));
    env.wait_app(&names::application_name(app_a), "A's Application Synced", |a| {
        a["status"]["sync"]["status"] == "Synced"
    })
    .await;

    // An Application of B's project aimed at A's environment is refused by Argo CD.
    let intruder = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "intruder"},
        "spec": {"project": names::project_name(b), "source": {"repoURL": REPO_A, "path": "x"},
                 "destination": {"server": server_a, "namespace": "team-a-dev"}},
    });
    env.apps().patch("intruder", &PatchParams::apply("test").force(), &Patch::Apply(&intruder)).await.expect("create");
    let refused = env
        .wait_app("intruder", "the intruder refused", |a| a["status"]["conditions"][0]["type"] == "InvalidSpecError")
        .await;
    assert!(refused["status"]["conditions"][0]["message"].as_str().unwrap_or("").contains("do not match"));

    // Deleting A's environment removes its Secret and its destination.
    env.client
        .execute("UPDATE managed_environment SET row_state = 'deleting' WHERE id = $1", &[&env_a])
        .await
        .expect("tombstone");
    env.client
        .execute("UPDATE application SET row_state = 'deleted' WHERE tenant_id = $1", &[&a.0])
        .await
        .expect("apps gone");
    env.enqueue(a, ResourceType::ManagedEnvironment, env_a.0).await;
    env.reconcile_done().await;
    assert!(env.secret_api().get_opt(&names::cluster_secret_name(env_a_uid)).await.expect("read").is_none());
    assert_eq!(
        env.row_state("SELECT row_state::text FROM managed_environment WHERE id = $1", env_a.0).await,
        "deleted"
    );
    let project_a = env.get(&env.projects(), &names::project_name(a)).await.expect("project A");
    assert_eq!(destinations(&project_a), [(env.home_server(a), "team-a".to_owned())]);
}

#[tokio::test]
async fn agent_hanging_deletion_is_retried_and_reported() {
    let mut env = env("agent-hang", Duration::ZERO).await;
    let tenant = env.tenant("team-a").await;
    let uid = Uuid::new_v4();
    let id = env.application(tenant, 1, uid, |_| {}).await;
    env.reconcile_done().await;
    let name = names::application_name(uid);
    let hang = json!({"metadata": {"annotations": {"standin.gitops.test/finalizer": "hang"}}});
    env.apps().patch(&name, &PatchParams::default(), &Patch::Merge(&hang)).await.expect("hang knob");

    env.client.execute("UPDATE application SET row_state = 'deleting' WHERE id = $1", &[&id]).await.expect("tombstone");
    env.enqueue(tenant, ResourceType::Application, id).await;
    let outcomes = env.reconcile().await;
    assert!(
        matches!(outcomes.as_slice(), [(_, _, Outcome::Failed(gitops_shared::queue::Failure::Transient { .. }))]),
        "{outcomes:?}"
    );
    assert_eq!(env.row_state(APP_STATE, id).await, "deleting", "not confirmed while the Application is there");
    let app = env.get(&env.apps(), &name).await.expect("still present");
    assert!(app["metadata"]["deletionTimestamp"].is_string());
    let message: Option<String> = env
        .client
        .query_one("SELECT deletion_message FROM application WHERE id = $1", &[&id])
        .await
        .expect("row")
        .get(0);
    assert!(message.is_some_and(|m| m.contains("finalizer")), "the stuck deletion is reported on the row");

    let release = json!({"metadata": {"annotations": {"standin.gitops.test/finalizer": null}}});
    env.apps().patch(&name, &PatchParams::default(), &Patch::Merge(&release)).await.expect("release");
    env.until_deleted(tenant, id).await;
    let message: Option<String> = env
        .client
        .query_one("SELECT deletion_message FROM application WHERE id = $1", &[&id])
        .await
        .expect("row")
        .get(0);
    assert_eq!(message, None);
}

const NEW_SYNC: &str = "
INSERT INTO sync_operation (tenant_id, resource_uid, resource_name, generation, deployment_name, application_id, revision)
VALUES ($1, $2, 'run', 1, 'app', $3, $4) RETURNING id, correlation_id";

async fn sync_row(env: &Env, id: i64) -> (String, Option<String>, bool) {
    let row = env
        .client
        .query_one(
            "SELECT state::text, synced_revision, finished_at IS NOT NULL FROM sync_operation WHERE id = $1",
            &[&id],
        )
        .await
        .expect("sync row");
    (row.get(0), row.get(1), row.get(2))
}

#[tokio::test]
async fn agent_sync_operation_synced_and_recorded() {
    let mut env = env("agent-sync", Duration::from_secs(600)).await;
    let tenant = env.tenant("team-a").await;
    let uid = Uuid::new_v4();
    let app = env.application(tenant, 1, uid, |i| i.sync_type = SyncType::Manual).await;
    env.reconcile_done().await;
    let name = names::application_name(uid);
    env.wait_app(&name, "OutOfSync (never synced)", |a| a["status"]["sync"]["status"] == "OutOfSync").await;

    let row = env.client.query_one(NEW_SYNC, &[&tenant.0, &Uuid::new_v4(), &app, &"v2"]).await.expect("sync row");
    let (sync, correlation): (i64, Uuid) = (row.get(0), row.get(1));
    env.enqueue(tenant, ResourceType::SyncOperation, sync).await;
    env.reconcile_done().await;
    assert_eq!(sync_row(&env, sync).await.0, "running");

    let done =
        env.wait_app(&name, "the sync succeeded", |a| a["status"]["operationState"]["phase"] == "Succeeded").await;
    assert_eq!(
        done["status"]["operationState"]["operation"]["info"],
        json!([{"name": "correlation-id", "value": correlation.to_string()}])
    );
    env.enqueue(tenant, ResourceType::SyncOperation, sync).await;
    env.reconcile_done().await;
    let revision = fake_revision("https://git.example.invalid/team/repo.git", "deploy/app", "v2");
    assert_eq!(sync_row(&env, sync).await, ("succeeded".to_owned(), Some(revision), true));
    // Reconciling a finished sync again requests nothing.
    env.enqueue(tenant, ResourceType::SyncOperation, sync).await;
    env.reconcile_done().await;
    assert!(env.get(&env.apps(), &name).await.expect("app").get("operation").is_none());
}

#[tokio::test]
async fn agent_held_sync_survives_reapply_and_is_terminated() {
    let mut env = env("agent-hold", Duration::from_secs(600)).await;
    let tenant = env.tenant("team-a").await;
    let uid = Uuid::new_v4();
    let app = env.application(tenant, 1, uid, |i| i.sync_type = SyncType::Manual).await;
    env.reconcile_done().await;
    let name = names::application_name(uid);
    let hold = json!({"metadata": {"annotations": {"standin.gitops.test/sync": "hold"}}});
    env.apps().patch(&name, &PatchParams::default(), &Patch::Merge(&hold)).await.expect("hold knob");

    let row = env.client.query_one(NEW_SYNC, &[&tenant.0, &Uuid::new_v4(), &app, &"v3"]).await.expect("sync row");
    let (sync, correlation): (i64, Uuid) = (row.get(0), row.get(1));
    env.enqueue(tenant, ResourceType::SyncOperation, sync).await;
    env.reconcile_done().await;
    let running = env.wait_app(&name, "a running sync", |a| a["status"]["operationState"]["phase"] == "Running").await;
    let started = running["status"]["operationState"]["startedAt"].clone();

    // An ordinary re-apply (and a repeated sync reconcile) neither repeats nor cancels it.
    env.enqueue(tenant, ResourceType::Application, app).await;
    env.enqueue(tenant, ResourceType::SyncOperation, sync).await;
    env.reconcile_done().await;
    let after = env.get(&env.apps(), &name).await.expect("app");
    assert_eq!(after["status"]["operationState"]["phase"], "Running");
    assert_eq!(after["status"]["operationState"]["startedAt"], started);
    assert_eq!(after["status"]["operationState"]["operation"]["info"][0]["value"], correlation.to_string());
    assert_eq!(sync_row(&env, sync).await.0, "running");

    env.client
        .execute("UPDATE sync_operation SET terminate_requested = true WHERE id = $1", &[&sync])
        .await
        .expect("terminate");
    env.enqueue(tenant, ResourceType::SyncOperation, sync).await;
    env.reconcile_done().await;
    assert_eq!(sync_row(&env, sync).await.0, "terminating");
    env.wait_app(&name, "the sync terminated", |a| a["status"]["operationState"]["message"] == "Operation terminated")
        .await;
    env.enqueue(tenant, ResourceType::SyncOperation, sync).await;
    env.reconcile_done().await;
    let (state, _, finished) = sync_row(&env, sync).await;
    assert_eq!((state.as_str(), finished), ("terminated", true));
}
