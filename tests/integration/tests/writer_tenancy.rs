//! Tenants and their namespaces, end to end (writer, agent and the Argo CD
//! stand-in on the test tier's API server): a deployment into the tenant's own
//! namespace reaches it through a ServiceAccount (in the service's home namespace)
//! whose token works in that namespace and nowhere else, renewed before it expires and made again when someone else
//! deletes or changes it; a deleted tenant namespace takes its
//! tenant with it — rows tombstoned and confirmed, Argo CD objects and project gone —
//! and one made again under the same name is a new tenant.
//! Tests wait on conditions and rows with deadlines, never on time.

use std::time::Duration;

use gitops_agent::names;
use gitops_testkit::cluster::TestCluster;
use gitops_writer::api::GitOpsDeploymentRepositoryCredential;
use gitops_writer::controller::{CONDITION, HOME_IDENTITY, REASON_ACCEPTED, home_account_name};
use gitops_writer::validate::reason::INVALID_DESTINATION_NAMESPACE;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use uuid::Uuid;

use std::sync::{Arc, OnceLock};

use gitops_testkit::proxy::TcpProxy;

use crate::support::writer::{Env, env, spec};
use crate::support::{
    WATCH_RETURN_DEADLINE, api_server_address, eventually, eventually_within, sample, through_kube_proxy,
};

/// The home cluster as Argo CD would reach it; never contacted by the tests.
const HOME_URL: &str = "https://home.example.invalid";
/// How long a deleted tenant namespace may take to go (see its one use).
const NAMESPACE_DELETION_DEADLINE: Duration = Duration::from_secs(180);
const REPO: &str = "https://git.example.invalid/org/repo.git";

impl Env {
    /// The Argo CD cluster Secret of the tenant's home environment: (data, bearer token).
    async fn home_secret(&self, check: impl Fn(&str) -> bool) -> (std::collections::BTreeMap<String, String>, String) {
        self.home_secret_in(self.argocd.name(), check).await
    }

    /// (id, expiry in seconds since the epoch) of the tenant's home environment.
    async fn home_row(&self) -> (i64, i64) {
        let row = self
            .client
            .query_one(
                "SELECT e.id, extract(epoch FROM c.expires_at)::bigint FROM managed_environment e
                   JOIN cluster_credential c ON c.managed_environment_id = e.id
                  WHERE e.home AND e.row_state = 'active'",
                &[],
            )
            .await
            .expect("one home environment");
        (row.get(0), row.get(1))
    }

    async fn tenant_id(&self) -> i64 {
        let uid = self.namespace_uid().await;
        self.client.query_one("SELECT id FROM tenant WHERE namespace_uid = $1", &[&uid]).await.expect("tenant").get(0)
    }
}

/// Whether a request was refused by authorization.
fn forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(status)) if status.code == 403)
}

#[tokio::test]
async fn writer_tenancy_own_namespace_gets_credentials_scoped_to_it() {
    let env = env("wt-home").await;
    let cluster = TestCluster::get().await;
    let other = cluster.namespace("wt-home-other").await;
    let _writer = env.writer_for("writer-a", vec![env.tenant.name().to_owned()], |c| c.home.api_url = HOME_URL.into());
    let tenant = env.tenant.name().to_owned();
    let created = env.create("web", spec(REPO, "apps/web")).await;
    let (status, reason, _) = env.condition("web").await;
    assert_eq!((status.as_str(), reason.as_str()), ("False", REASON_ACCEPTED));

    // The identity: a ServiceAccount in the service's home namespace, bound in the
    // tenant namespace (only) to the home ClusterRole; nothing else in the namespace.
    let account = home_account_name(env.namespace_uid().await);
    let accounts: Api<ServiceAccount> = Api::namespaced(env.kube.clone(), env.home.name());
    accounts.get(&account).await.expect("the home ServiceAccount in the home namespace");
    let in_tenant: Api<ServiceAccount> = Api::namespaced(env.kube.clone(), &tenant);
    assert!(
        in_tenant.get_opt(HOME_IDENTITY).await.expect("read").is_none(),
        "no ServiceAccount in the tenant namespace"
    );
    assert!(Api::<Role>::namespaced(env.kube.clone(), &tenant).get_opt(HOME_IDENTITY).await.expect("read").is_none());
    let binding = Api::<RoleBinding>::namespaced(env.kube.clone(), &tenant)
        .get(HOME_IDENTITY)
        .await
        .expect("the home RoleBinding");
    assert_eq!((binding.role_ref.kind.as_str(), binding.role_ref.name.as_str()), ("ClusterRole", "admin"));
    let subjects = binding.subjects.expect("subjects");
    assert_eq!(subjects.len(), 1);
    assert_eq!(
        (subjects[0].name.as_str(), subjects[0].namespace.as_deref()),
        (account.as_str(), Some(env.home.name()))
    );

    // The application goes through the home environment; Argo CD gets its cluster Secret.
    let (home, _) = env.home_row().await;
    let row =
        env.client.query_one("SELECT managed_environment_id FROM application", &[]).await.expect("application row");
    assert_eq!(row.get::<_, Option<i64>>(0), Some(home));
    let server = names::environment_server(HOME_URL, gitops_shared::model::ManagedEnvironmentId(home));
    let (data, token) = env.home_secret(|_| true).await;
    assert_eq!((data["server"].as_str(), data["namespaces"].as_str()), (server.as_str(), tenant.as_str()));
    assert_eq!(data["clusterResources"], "false");
    let uid = Uuid::parse_str(created.metadata.uid.as_deref().expect("uid")).expect("uuid");
    let app = eventually("the Application", || async {
        let app: DynamicObject = env.apps().get_opt(&names::application_name(uid)).await.ok()??;
        Some(serde_json::to_value(app).expect("json"))
    })
    .await;
    assert_eq!(app["spec"]["destination"], json!({"server": server, "namespace": tenant}));
    // Status back names the namespace and no environment (the home one has no resource).
    let reconciled = eventually("the reconciled state in the status", || async {
        env.deployments().get("web").await.ok()?.status?.reconciled_state
    })
    .await;
    assert_eq!(reconciled.destination.namespace.as_deref(), Some(tenant.as_str()));
    assert_eq!(reconciled.destination.environment, None);

    // The token works in the tenant namespace and nowhere else.
    let scoped = cluster.client_with_token(&token).await;
    Api::<ConfigMap>::namespaced(scoped.clone(), &tenant).list(&ListParams::default()).await.expect("in its namespace");
    assert!(forbidden(Api::<ConfigMap>::namespaced(scoped.clone(), other.name()).list(&ListParams::default()).await));
    assert!(forbidden(Api::<Namespace>::all(scoped.clone()).list(&ListParams::default()).await));
    assert!(forbidden(Api::<ConfigMap>::all(scoped.clone()).list(&ListParams::default()).await));
    // `admin` is aggregated: custom resources nobody aggregated into it (Argo CD's
    // Applications, the service's own kinds) cannot be deployed into the namespace.
    let apps = Api::<DynamicObject>::namespaced_with(
        scoped.clone(),
        &tenant,
        &gitops_agent::engine::argocd::application_resource(),
    );
    assert!(
        forbidden(apps.list(&ListParams::default()).await),
        "no right on a custom resource not aggregated into admin"
    );
    let made: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": "x"}, "spec": {}
    }))
    .expect("Application");
    assert!(forbidden(apps.create(&PostParams::default(), &made).await), "nor may the home identity create one");
    assert!(forbidden(env.deployments_with(scoped).list(&ListParams::default()).await));

    // Without an environment, only the tenant's own namespace is a destination.
    let elsewhere = json!({"source": {"repoURL": REPO, "path": "apps/x"}, "destination": {"namespace": other.name()}, "type": "automated"});
    env.create("elsewhere", elsewhere).await;
    let (status, reason, message) = env.condition("elsewhere").await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", INVALID_DESTINATION_NAMESPACE), "{message}");
    assert_eq!(env.rows("elsewhere").await, 0);
}

#[tokio::test]
async fn writer_tenancy_home_token_is_renewed_before_it_expires() {
    let env = env("wt-renew").await;
    // Every token is due at once: each scan renews it.
    let _writer = env.writer_for("writer-a", vec![env.tenant.name().to_owned()], |c| {
        c.home.api_url = HOME_URL.into();
        c.home.renew_before = c.home.token_lifetime;
        c.home.renew_every = Duration::from_millis(200);
    });
    env.create("web", spec(REPO, "apps/web")).await;
    assert_eq!(env.condition("web").await.1, REASON_ACCEPTED);
    let (_, first_token) = env.home_secret(|_| true).await;
    let (home, first_expiry) = env.home_row().await;
    eventually("a later expiry", || async { (env.home_row().await.1 > first_expiry).then_some(()) }).await;
    let (_, renewed) = env.home_secret(|token| token != first_token).await;
    assert_eq!(env.home_row().await.0, home, "renewal keeps the environment, only its credentials change");
    let scoped = TestCluster::get().await.client_with_token(&renewed).await;
    Api::<ConfigMap>::namespaced(scoped, env.tenant.name())
        .list(&ListParams::default())
        .await
        .expect("the new token works");
}

#[tokio::test]
async fn writer_tenancy_home_identity_changed_by_someone_else_is_made_again() {
    let env = env("wt-repair").await;
    let _writer = env.writer_for("writer-a", vec![env.tenant.name().to_owned()], |c| c.home.api_url = HOME_URL.into());
    let tenant = env.tenant.name().to_owned();
    env.create("web", spec(REPO, "apps/web")).await;
    assert_eq!(env.condition("web").await.1, REASON_ACCEPTED);
    let (_, first_token) = env.home_secret(|_| true).await;
    let bindings: Api<RoleBinding> = Api::namespaced(env.kube.clone(), &tenant);
    let accounts: Api<ServiceAccount> = Api::namespaced(env.kube.clone(), env.home.name());
    let account = home_account_name(env.namespace_uid().await);

    // The binding's subjects changed by someone else come back as the writer made them.
    let other = json!({"subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": tenant}]});
    bindings.patch(HOME_IDENTITY, &PatchParams::default(), &Patch::Merge(&other)).await.expect("change the binding");
    eventually("the binding restored", || async {
        let binding = bindings.get(HOME_IDENTITY).await.ok()?;
        (binding.subjects?.first()?.name == account).then_some(())
    })
    .await;

    // A deleted binding and ServiceAccount are made again; the old token dies with
    // its ServiceAccount, so Argo CD gets a new one that works.
    bindings.delete(HOME_IDENTITY, &DeleteParams::default()).await.expect("delete the RoleBinding");
    let old_uid = accounts.get(&account).await.expect("ServiceAccount").metadata.uid;
    accounts.delete(&account, &DeleteParams::default()).await.expect("delete the ServiceAccount");
    eventually("a new ServiceAccount and binding", || async {
        let made = accounts.get_opt(&account).await.ok()??;
        bindings.get_opt(HOME_IDENTITY).await.ok()??;
        (made.metadata.uid != old_uid).then_some(())
    })
    .await;
    // (A token requested between the two deletions may reach Argo CD first; the one
    // for the new ServiceAccount follows it.)
    let cluster = TestCluster::get().await;
    eventually("a new token in Argo CD that works", || async {
        let (_, token) = env.home_secret(|token| token != first_token).await;
        let scoped = cluster.client_with_token(&token).await;
        Api::<ConfigMap>::namespaced(scoped, &tenant).list(&ListParams::default()).await.ok()
    })
    .await;
    let scoped = cluster.client_with_token(&first_token).await;
    let refused = Api::<ConfigMap>::namespaced(scoped, &tenant).list(&ListParams::default()).await;
    assert!(
        matches!(refused, Err(kube::Error::Api(status)) if status.code == 401),
        "the old token died with its ServiceAccount"
    );
}

#[tokio::test]
async fn writer_tenancy_home_binding_deleted_while_the_watch_was_away_is_made_again() {
    let env = env("wt-relist").await;
    let tenant = env.tenant.name().to_owned();
    let proxy = TcpProxy::start(api_server_address(&env.kubeconfig)).await.expect("start the proxy");
    let proxied = through_kube_proxy(&env.kubeconfig, &proxy);
    let address = Arc::new(OnceLock::new());
    let _writer = env.writer_for("writer-a", vec![tenant.clone()], |c| {
        c.home.api_url = HOME_URL.into();
        c.kubeconfig = Some(proxied.clone());
        c.http_address = address.clone();
    });
    env.create("web", spec(REPO, "apps/web")).await;
    assert_eq!(env.condition("web").await.1, REASON_ACCEPTED);
    let bindings: Api<RoleBinding> = Api::namespaced(env.kube.clone(), &tenant);
    let original = eventually("the home RoleBinding", || async { bindings.get_opt(HOME_IDENTITY).await.ok()? }).await;
    // Someone else's binding, written to while the writer is away.
    let filler: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "filler"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
    }))
    .expect("a RoleBinding");
    bindings.create(&PostParams::default(), &filler).await.expect("create the filler RoleBinding");
    let address = *address.get().expect("the endpoint is bound");
    let relists = || async {
        let (_, metrics) = crate::support::http_get(address, "/metrics").await;
        sample(&metrics, "gitops_writer_watch_relists_total{watch=\"home_identity\"}").expect("the relist series")
    };
    let relists_before = relists().await;

    // The writer loses the API server; meanwhile its binding is deleted, and the API
    // server's history moves past where the writer's watch stopped (410 Gone).
    proxy.cut();
    let since = bindings.list_metadata(&ListParams::default().limit(1)).await.expect("list").metadata.resource_version;
    bindings.delete(HOME_IDENTITY, &DeleteParams::default()).await.expect("delete the home RoleBinding");
    let loss = TestCluster::get()
        .await
        .lose_history(&bindings, &since.expect("a resourceVersion"), |n| {
            let patch = json!({"metadata": {"annotations": {"gitops-test/write": n.to_string()}}});
            let bindings = &bindings;
            async move {
                bindings.patch("filler", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("write");
            }
        })
        .await;
    proxy.restore();

    eventually_within(WATCH_RETURN_DEADLINE, "the home RoleBinding made again", || async {
        let made = bindings.get_opt(HOME_IDENTITY).await.ok()??;
        (made.metadata.uid != original.metadata.uid).then_some(())
    })
    .await;
    eventually_within(WATCH_RETURN_DEADLINE, &format!("the watch relisted after 410 ({loss:?})"), || async {
        (relists().await > relists_before).then_some(())
    })
    .await;
    let _ = std::fs::remove_file(proxied);
}

#[tokio::test]
async fn writer_tenancy_deleted_namespace_takes_its_tenant_along() {
    let env = env("wt-gone").await;
    let _writer = env.writer_for("writer-a", vec![env.tenant.name().to_owned()], |c| c.home.api_url = HOME_URL.into());
    let tenant = env.tenant.name().to_owned();
    env.create("web", spec(REPO, "apps/web")).await;
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "git"}, "stringData": {"username": "bot", "password": "pw"}}),
    )
    .expect("Secret");
    Api::<Secret>::namespaced(env.kube.clone(), &tenant)
        .patch("git", &PatchParams::apply("writer-tenancy-test").force(), &Patch::Apply(&secret))
        .await
        .expect("apply Secret");
    let credential: GitOpsDeploymentRepositoryCredential = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeploymentRepositoryCredential",
        "metadata": {"name": "repo"}, "spec": {"repository": REPO, "secret": "git"},
    }))
    .expect("credential");
    let credentials: Api<GitOpsDeploymentRepositoryCredential> = Api::namespaced(env.kube.clone(), &tenant);
    credentials.create(&PostParams::default(), &credential).await.expect("create credential");
    assert_eq!(env.condition("web").await.1, REASON_ACCEPTED);
    eventually("the credential accepted", || async {
        let object = credentials.get_opt("repo").await.ok()??;
        let condition = object.status?.conditions.into_iter().find(|c| c.type_ == CONDITION)?;
        (condition.reason.as_deref() == Some(REASON_ACCEPTED)).then_some(())
    })
    .await;
    let tenant_id = env.tenant_id().await;
    let selector = format!("{}={tenant_id}", names::TENANT_ID_LABEL);
    let argocd_secrets: Api<Secret> = Api::namespaced(env.kube.clone(), env.argocd.name());
    let projects = Api::<DynamicObject>::namespaced_with(
        env.kube.clone(),
        env.argocd.name(),
        &gitops_agent::engine::argocd::app_project_resource(),
    );
    let project = names::project_name(gitops_shared::model::TenantId(tenant_id));
    eventually("the tenant's Argo CD objects", || async {
        let secrets = argocd_secrets.list(&ListParams::default().labels(&selector)).await.ok()?;
        let apps = env.apps().list(&ListParams::default().labels(&selector)).await.ok()?;
        let project = projects.get_opt(&project).await.ok()?;
        (secrets.items.len() == 2 && apps.items.len() == 1 && project.is_some()).then_some(())
    })
    .await;

    Api::<Namespace>::all(env.kube.clone())
        .delete(&tenant, &DeleteParams::background())
        .await
        .expect("delete the namespace");

    eventually("the tenant confirmed deleted", || async {
        let row = env.client.query_one("SELECT row_state::text FROM tenant WHERE id = $1", &[&tenant_id]).await.ok()?;
        (row.get::<_, String>(0) == "deleted").then_some(())
    })
    .await;
    for table in ["application", "managed_environment", "repository_credential"] {
        let live: i64 = env
            .client
            .query_one(
                &format!("SELECT count(*) FROM {table} WHERE tenant_id = $1 AND row_state <> 'deleted'"),
                &[&tenant_id],
            )
            .await
            .expect("count")
            .get(0);
        assert_eq!(live, 0, "every {table} row of the tenant is confirmed deleted");
    }
    let secrets = argocd_secrets.list(&ListParams::default().labels(&selector)).await.expect("list Secrets");
    assert!(secrets.items.is_empty(), "the tenant's cluster and repository Secrets are gone");
    assert!(env.apps().list(&ListParams::default().labels(&selector)).await.expect("list").items.is_empty());
    assert!(projects.get_opt(&project).await.expect("read").is_none(), "the tenant's AppProject is gone");
    // On a real cluster the controller-manager's namespace controller empties the
    // namespace, walking every resource type the server serves, for every test's
    // namespace at once: slower than anything of ours while the suite runs.
    eventually_within(NAMESPACE_DELETION_DEADLINE, "the namespace gone", || async {
        Api::<Namespace>::all(env.kube.clone()).get_opt(&tenant).await.ok()?.is_none().then_some(())
    })
    .await;

    // Made again under the same name, it is a new tenant with nothing of the old one.
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": tenant}})).expect("Namespace");
    Api::<Namespace>::all(env.kube.clone()).create(&PostParams::default(), &namespace).await.expect("recreate");
    env.create("web", spec(REPO, "apps/again")).await;
    assert_eq!(env.condition("web").await.1, REASON_ACCEPTED);
    let tenants: Vec<(i64, String)> = env
        .client
        .query("SELECT id, row_state::text FROM tenant WHERE namespace_name = $1 ORDER BY id", &[&tenant])
        .await
        .expect("tenants")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(tenants.len(), 2, "{tenants:?}");
    assert_eq!(tenants[0], (tenant_id, "deleted".to_owned()));
    assert_eq!(tenants[1].1, "active");
    let paths: Vec<String> = env
        .client
        .query("SELECT path FROM application WHERE tenant_id = $1 AND row_state = 'active'", &[&tenants[1].0])
        .await
        .expect("applications")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(paths, ["apps/again"], "the new tenant has only its own deployment");
}
