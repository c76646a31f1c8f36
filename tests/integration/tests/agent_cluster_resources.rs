//! `clusterResources: true` is scoped to its environment: such an environment gets
//! an AppProject of its own (its destinations only, every cluster-scoped kind
//! whitelisted), its Applications and cluster Secret name that project, the
//! tenant's main project whitelists nothing, and each repository credential is
//! copied once per project. Proven against the Argo CD stand-in, which refuses
//! cluster-scoped resources a project does not whitelist and gives a project-scoped
//! repository Secret to Applications of that project only — through the switch on
//! and off, an environment's and a tenant's deletion, and a move to another instance.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gitops_agent::engine::argocd::{ArgoCdEngine, app_project_resource, application_resource};
use gitops_agent::names;
use gitops_agent::reconcile::Reconciler;
use gitops_shared::db::engine_instance::{EngineInstance, engine_instance_add, engine_instance_by_name};
use gitops_shared::model::{ManagedEnvironmentId, ResourceType, TenantId};
use gitops_shared::queue::Outcome;
use gitops_testkit::argocd::{self, NOT_VALID_MESSAGE, StandinOptions};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::agent_reconcile::{API_URL, APP_STATE, Env, REPO_A, destinations, env};
use crate::support::{DEADLINE, eventually};

/// The path whose last segment makes the stand-in deploy a ClusterRole.
const CLUSTER_PATH: &str = "deploy/cluster-rbac";
const ALL_KINDS: &str = r#"[{"group":"*","kind":"*"}]"#;

/// Reconciles on each of `reconcilers` until no operation is left anywhere; every
/// outcome must be Done or a retry that later succeeds.
async fn settle(client: &tokio_postgres::Client, reconcilers: &[(&EngineInstance, &Reconciler)]) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut busy = false;
        let mut failed = Vec::new();
        for (instance, reconciler) in reconcilers {
            for (kind, id, outcome) in crate::support::reconcile_due(client, instance.id, reconciler).await {
                busy = true;
                if !matches!(outcome, Outcome::Done) {
                    failed.push(format!("{kind} {id}: {outcome:?}"));
                }
            }
        }
        let waiting: i64 = client
            .query_one("SELECT count(*) FROM operation WHERE state IN ('waiting', 'claimed')", &[])
            .await
            .expect("count")
            .get(0);
        if !busy && waiting == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "operations did not settle; last failures: {failed:?}");
        if !busy {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Sets an environment's `clusterResources` as the writer would store a new
/// generation, with its operation.
async fn set_cluster_resources(env: &mut Env, tenant: TenantId, environment: ManagedEnvironmentId, on: bool) {
    env.client
        .execute(
            "UPDATE managed_environment SET cluster_resources = $2, generation = generation + 1 WHERE id = $1",
            &[&environment, &on],
        )
        .await
        .expect("update the environment");
    env.enqueue(tenant, ResourceType::ManagedEnvironment, environment.0).await;
}

/// The names of the objects of `api` labelled with `tenant`, sorted.
async fn tenant_objects<K>(api: &Api<K>, tenant: TenantId, extra: &str) -> Vec<String>
where
    K: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    let selector = format!("{}={}{extra}", names::TENANT_ID_LABEL, tenant.0);
    let mut names: Vec<String> = api
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("list")
        .items
        .iter()
        .filter_map(|o| o.meta().name.clone())
        .collect();
    names.sort();
    names
}

async fn repository_secrets(api: &Api<Secret>, tenant: TenantId) -> Vec<String> {
    tenant_objects(api, tenant, ",argocd.argoproj.io/secret-type=repository").await
}

/// The `project` of each repository Secret of `tenant`, sorted.
async fn repository_projects(api: &Api<Secret>, tenant: TenantId) -> Vec<String> {
    let selector = format!("{}={},argocd.argoproj.io/secret-type=repository", names::TENANT_ID_LABEL, tenant.0);
    let mut projects: Vec<String> = api
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("list")
        .items
        .iter()
        .map(|s| String::from_utf8(s.data.as_ref().expect("data")["project"].0.clone()).expect("utf8"))
        .collect();
    projects.sort();
    projects
}

fn whitelist(project: &Value) -> Value {
    project["spec"]["clusterResourceWhitelist"].clone()
}

async fn repository_credential_id(env: &Env, uid: Uuid) -> i64 {
    env.client
        .query_one("SELECT id FROM repository_credential WHERE resource_uid = $1", &[&uid])
        .await
        .expect("row")
        .get(0)
}

#[tokio::test]
async fn agent_cluster_resources_are_scoped_to_their_environment() {
    let mut env = env("agent-cluster-scope", Duration::from_secs(600)).await;
    let a = env.tenant("team-a").await;
    let b = env.tenant("team-b").await;
    let (e1, e1_uid) = env.environment(a, "token-a", &["team-a-ops"]).await;
    env.client
        .execute("UPDATE managed_environment SET cluster_resources = true WHERE id = $1", &[&e1])
        .await
        .expect("clusterResources: true");
    let (eb, _) = env.environment(b, "token-b", &["team-b-dev"]).await;
    env.repository_credential(a, "password-a").await;
    // The same cluster-scoped manifests through E1, through A's own namespace, and by B.
    let through_e1 = Uuid::new_v4();
    env.application(a, 1, through_e1, |i| {
        i.repo_url = REPO_A.into();
        i.path = CLUSTER_PATH.into();
        i.managed_environment_id = Some(e1);
        i.destination_namespace = "team-a-ops".into();
    })
    .await;
    let through_home = Uuid::new_v4();
    env.application(a, 1, through_home, |i| {
        i.repo_url = REPO_A.into();
        i.path = CLUSTER_PATH.into();
    })
    .await;
    let by_b = Uuid::new_v4();
    env.application(b, 1, by_b, |i| {
        i.repo_url = REPO_A.into();
        i.path = CLUSTER_PATH.into();
        i.managed_environment_id = Some(eb);
        i.destination_namespace = "team-b-dev".into();
    })
    .await;
    settle(&env.client, &[(&env.instance, &env.reconciler)]).await;

    let main_a = names::project_name(a);
    let own_e1 = names::environment_project_name(a, e1);
    let server_e1 = names::environment_server(API_URL, e1);
    // Through E1: its own project, which whitelists cluster resources; the sync succeeds.
    let app = env
        .wait_app(&names::application_name(through_e1), "the ClusterRole through E1 synced", |a| {
            a["status"]["sync"]["status"] == "Synced"
        })
        .await;
    assert_eq!(app["spec"]["project"], own_e1.as_str());
    assert_eq!(app["status"]["resources"][0]["kind"], "ClusterRole");
    // Through A's own namespace: the main project, which whitelists nothing; refused.
    let app = env
        .wait_app(&names::application_name(through_home), "the ClusterRole through the home namespace refused", |a| {
            a["status"]["operationState"]["message"].as_str().is_some_and(|m| m.starts_with(NOT_VALID_MESSAGE))
        })
        .await;
    assert_eq!(app["spec"]["project"], main_a.as_str());
    assert_eq!(
        app["status"]["operationState"]["syncResult"]["resources"][0]["message"],
        format!("resource rbac.authorization.k8s.io:ClusterRole is not permitted in project {main_a}")
    );
    assert_ne!(app["status"]["sync"]["status"], "Synced");

    // The projects: the main one lists no E1 destination and whitelists nothing.
    let main = env.get(&env.projects(), &main_a).await.expect("A's main project");
    assert_eq!(whitelist(&main), json!([]));
    assert_eq!(destinations(&main), [(env.home_server(a), "team-a".to_owned())]);
    let own = env.get(&env.projects(), &own_e1).await.expect("E1's project");
    assert_eq!(whitelist(&own), serde_json::from_str::<Value>(ALL_KINDS).expect("json"));
    assert_eq!(destinations(&own), [(server_e1.clone(), "team-a-ops".to_owned())]);
    assert_eq!(own["spec"]["sourceRepos"], main["spec"]["sourceRepos"]);
    let (_, cluster) = env.secret_data(&names::cluster_secret_name(e1_uid)).await;
    assert_eq!((cluster["project"].as_str(), cluster["clusterResources"].as_str()), (own_e1.as_str(), "true"));
    // A's repository credential serves each of A's projects, B's none.
    assert_eq!(repository_projects(&env.secret_api(), a).await, [main_a.clone(), own_e1.clone()]);
    assert!(repository_secrets(&env.secret_api(), b).await.is_empty());

    // B cannot read A's private repository, nor reach A's environment from its project.
    let app = env
        .wait_app(&names::application_name(by_b), "B refused A's repository", |a| {
            a["status"]["conditions"][0]["type"] == "ComparisonError"
        })
        .await;
    assert_eq!(app["spec"]["project"], names::project_name(b));
    assert!(app["status"]["conditions"][0]["message"].as_str().unwrap_or("").contains("authentication required"));
    for project in tenant_objects(&env.projects(), b, "").await {
        let project = env.get(&env.projects(), &project).await.expect("B's project");
        assert!(destinations(&project).iter().all(|(server, _)| *server != server_e1), "{project}");
        assert_eq!(whitelist(&project), json!([]), "B allows no cluster resources anywhere");
    }
    let intruder = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "intruder"},
        "spec": {"project": names::project_name(b), "source": {"repoURL": REPO_A, "path": CLUSTER_PATH},
                 "destination": {"server": server_e1, "namespace": "team-a-ops"}},
    });
    env.apps().patch("intruder", &PatchParams::apply("test").force(), &Patch::Apply(&intruder)).await.expect("create");
    let refused = env
        .wait_app("intruder", "the intruder refused", |a| a["status"]["conditions"][0]["type"] == "InvalidSpecError")
        .await;
    assert!(refused["status"]["conditions"][0]["message"].as_str().unwrap_or("").contains("do not match"));
}

#[tokio::test]
async fn agent_cluster_resources_switch_projects_and_leave_nothing_behind() {
    let mut env = env("agent-cluster-switch", Duration::from_secs(600)).await;
    let a = env.tenant("team-a").await;
    let (e1, e1_uid) = env.environment(a, "token-a", &["team-a-ops"]).await;
    let repo = env.repository_credential(a, "password-a").await;
    let app_uid = Uuid::new_v4();
    let app_id = env
        .application(a, 1, app_uid, |i| {
            i.repo_url = REPO_A.into();
            i.path = CLUSTER_PATH.into();
            i.managed_environment_id = Some(e1);
            i.destination_namespace = "team-a-ops".into();
        })
        .await;
    settle(&env.client, &[(&env.instance, &env.reconciler)]).await;
    let (main_a, own_e1) = (names::project_name(a), names::environment_project_name(a, e1));
    let server_e1 = names::environment_server(API_URL, e1);
    let app_name = names::application_name(app_uid);
    // Off: one project, one repository Secret; the ClusterRole is refused.
    assert_eq!(tenant_objects(&env.projects(), a, "").await, [main_a.as_str()]);
    assert_eq!(app_project(&env, &app_name).await, main_a);
    env.wait_app(&app_name, "the ClusterRole refused in the main project", |a| {
        a["status"]["operationState"]["message"].as_str().is_some_and(|m| m.starts_with(NOT_VALID_MESSAGE))
    })
    .await;

    for round in 0..2 {
        // On: the environment's project appears, the Application moves to it and syncs.
        set_cluster_resources(&mut env, a, e1, true).await;
        settle(&env.client, &[(&env.instance, &env.reconciler)]).await;
        assert_eq!(tenant_objects(&env.projects(), a, "").await, [main_a.clone(), own_e1.clone()], "round {round}");
        assert_eq!(app_project(&env, &app_name).await, own_e1);
        let main = env.get(&env.projects(), &main_a).await.expect("main");
        assert!(destinations(&main).iter().all(|(server, _)| *server != server_e1), "{main}");
        assert_eq!(repository_projects(&env.secret_api(), a).await, [main_a.clone(), own_e1.clone()]);
        let (_, cluster) = env.secret_data(&names::cluster_secret_name(e1_uid)).await;
        assert_eq!(cluster["project"], own_e1);
        env.wait_app(&app_name, "the ClusterRole synced in E1's project", |a| {
            a["status"]["operationState"]["phase"] == "Succeeded" && a["status"]["sync"]["status"] == "Synced"
        })
        .await;

        if round == 1 {
            break;
        }
        // Off again: back to the main project; E1's project and its repository copy are gone.
        set_cluster_resources(&mut env, a, e1, false).await;
        settle(&env.client, &[(&env.instance, &env.reconciler)]).await;
        assert_eq!(tenant_objects(&env.projects(), a, "").await, [main_a.as_str()]);
        assert_eq!(app_project(&env, &app_name).await, main_a);
        let main = env.get(&env.projects(), &main_a).await.expect("main");
        assert!(destinations(&main).contains(&(server_e1.clone(), "team-a-ops".to_owned())));
        assert_eq!(repository_projects(&env.secret_api(), a).await, [main_a.as_str()]);
        let (_, cluster) = env.secret_data(&names::cluster_secret_name(e1_uid)).await;
        assert_eq!(cluster["project"], main_a);
    }

    // The environment deleted (its Application first): its project and copies go.
    env.client.execute("UPDATE application SET row_state = 'deleting' WHERE id = $1", &[&app_id]).await.expect("app");
    env.until_deleted(a, app_id).await;
    env.client
        .execute("UPDATE managed_environment SET row_state = 'deleting' WHERE id = $1", &[&e1])
        .await
        .expect("environment");
    env.enqueue(a, ResourceType::ManagedEnvironment, e1.0).await;
    settle(&env.client, &[(&env.instance, &env.reconciler)]).await;
    assert_eq!(env.row_state(APP_STATE, app_id).await, "deleted");
    assert_eq!(tenant_objects(&env.projects(), a, "").await, [main_a.as_str()]);
    assert_eq!(repository_projects(&env.secret_api(), a).await, [main_a.as_str()]);

    // The tenant deleted with a second such environment: every project goes.
    let (e2, _) = env.environment(a, "token-a2", &["team-a-infra"]).await;
    set_cluster_resources(&mut env, a, e2, true).await;
    settle(&env.client, &[(&env.instance, &env.reconciler)]).await;
    assert_eq!(tenant_objects(&env.projects(), a, "").await.len(), 2);
    assert_eq!(repository_secrets(&env.secret_api(), a).await.len(), 2);
    let repo_id = repository_credential_id(&env, repo).await;
    for (table, resource_type, id) in [
        ("managed_environment", ResourceType::ManagedEnvironment, e2.0),
        ("managed_environment", ResourceType::ManagedEnvironment, env.homes[&a].0),
        ("repository_credential", ResourceType::RepositoryCredential, repo_id),
    ] {
        let statement = format!("UPDATE {table} SET row_state = 'deleting' WHERE id = $1");
        env.client.execute(&statement, &[&id]).await.expect("deleting");
        env.enqueue(a, resource_type, id).await;
    }
    env.client.execute("UPDATE tenant SET row_state = 'deleting' WHERE id = $1", &[&a.0]).await.expect("tenant");
    env.enqueue(a, ResourceType::Tenant, a.0).await;
    settle(&env.client, &[(&env.instance, &env.reconciler)]).await;
    let tenant_state: String =
        env.client.query_one("SELECT row_state::text FROM tenant WHERE id = $1", &[&a.0]).await.expect("tenant").get(0);
    assert_eq!(tenant_state, "deleted");
    assert!(tenant_objects(&env.projects(), a, "").await.is_empty(), "no project left");
    assert!(tenant_objects(&env.secret_api(), a, "").await.is_empty(), "no Secret left");
}

/// The project the Application `name` names.
async fn app_project(env: &Env, name: &str) -> String {
    let app = env.get(&env.apps(), name).await.expect("the Application");
    app["spec"]["project"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn agent_tenant_move_takes_environment_projects_along() {
    let mut env = env("agent-cluster-move", Duration::from_secs(600)).await;
    let a = env.tenant("team-a").await;
    let (e1, _) = env.environment(a, "token-a", &["team-a-ops"]).await;
    set_cluster_resources(&mut env, a, e1, true).await;
    env.repository_credential(a, "password-a").await;
    let app_uid = Uuid::new_v4();
    env.application(a, 1, app_uid, |i| {
        i.repo_url = REPO_A.into();
        i.path = CLUSTER_PATH.into();
        i.managed_environment_id = Some(e1);
        i.destination_namespace = "team-a-ops".into();
    })
    .await;
    settle(&env.client, &[(&env.instance, &env.reconciler)]).await;
    let (main_a, own_e1) = (names::project_name(a), names::environment_project_name(a, e1));
    assert_eq!(tenant_objects(&env.projects(), a, "").await, [main_a.clone(), own_e1.clone()]);

    // A second instance: its own namespace, stand-in and agent identity.
    let cluster = gitops_testkit::cluster::TestCluster::get().await;
    let target_ns = cluster.namespace("agent-cluster-move-to").await;
    tokio::spawn({
        let (kube, name, cancel) = (env.kube.clone(), target_ns.name().to_owned(), env.cancel.clone());
        async move { argocd::run(kube, &name, StandinOptions::default(), cancel).await }
    });
    engine_instance_add(&env.client, "argocd-2", target_ns.name(), 1000).await.expect("add instance");
    let target = engine_instance_by_name(&env.client, "argocd-2").await.expect("instance");
    let identity =
        cluster.namespace_identity(target_ns.name(), "gitops-agent", crate::support::agent_rbac_rules()).await;
    let target_kube = cluster.client_with_token(&identity.token).await;
    let target_reconciler = Reconciler::new(
        env._db.pool(4),
        Arc::new(ArgoCdEngine::new(target_kube, target_ns.name())),
        env.secrets.clone(),
        target.clone(),
    );

    gitops_shared::db::tenant_move::tenant_move(&mut env.client, "team-a", "argocd-2", "test").await.expect("move");
    settle(&env.client, &[(&env.instance, &env.reconciler), (&target, &target_reconciler)]).await;

    let source_projects: Api<DynamicObject> =
        Api::namespaced_with(env.kube.clone(), env.ns.name(), &app_project_resource());
    let target_projects: Api<DynamicObject> =
        Api::namespaced_with(env.kube.clone(), target_ns.name(), &app_project_resource());
    let target_apps: Api<DynamicObject> =
        Api::namespaced_with(env.kube.clone(), target_ns.name(), &application_resource());
    let target_secrets: Api<Secret> = Api::namespaced(env.kube.clone(), target_ns.name());
    assert!(tenant_objects(&source_projects, a, "").await.is_empty(), "nothing of the tenant left on the source");
    assert!(tenant_objects(&env.secret_api(), a, "").await.is_empty());
    assert!(tenant_objects(&env.apps(), a, "").await.is_empty());
    assert_eq!(tenant_objects(&target_projects, a, "").await, [main_a.clone(), own_e1.clone()]);
    let own = eventually("E1's project on the target", || async {
        target_projects.get_opt(&own_e1).await.expect("read").map(|p| serde_json::to_value(p).expect("json"))
    })
    .await;
    assert_eq!(whitelist(&own), serde_json::from_str::<Value>(ALL_KINDS).expect("json"));
    assert_eq!(repository_projects(&target_secrets, a).await, [main_a.clone(), own_e1.clone()]);
    let app = eventually("the ClusterRole synced on the target", || async {
        let app = target_apps.get_opt(&names::application_name(app_uid)).await.expect("read")?;
        let app = serde_json::to_value(app).expect("json");
        (app["status"]["sync"]["status"] == "Synced").then_some(app)
    })
    .await;
    assert_eq!(app["spec"]["project"], own_e1);
}
