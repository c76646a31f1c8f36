//! The tenancy boundary, end to end on the test tier's API server (writer, agent and
//! the Argo CD stand-in): namespaces that are not served get a condition and nothing
//! else; the home identity follows the operator's ClusterRole and leaves the objects
//! of earlier versions behind; without the admission webhook nobody's home
//! deployment is taken on trust; with it, only someone who could grant the home role
//! in the namespace gets a deployment (or a sync run) there; and nobody holding
//! `edit` in a tenant namespace can act as its home identity.
//! Tests wait on conditions and rows with deadlines, never on time.

use std::sync::Arc;

use gitops_testkit::admission;
use gitops_testkit::cluster::TestCluster;
use gitops_writer::api::{GitOpsDeployment, GitOpsDeploymentSyncRun};
use gitops_writer::controller::{
    CONDITION, FINALIZER, HOME_IDENTITY, REASON_ACCEPTED, REASON_HOME_UNAVAILABLE, REASON_REQUESTER_UNVERIFIED,
    home_account_name,
};
use gitops_writer::metrics::WriterMetrics;
use gitops_writer::webhook::WebhookSettings;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use uuid::Uuid;

use crate::support::writer::{Env, env, spec};
use crate::support::{eventually, short_id};

const HOME_URL: &str = "https://home.example.invalid";
const REPO: &str = "https://git.example.invalid/org/repo.git";

/// Waits for the writer's condition on `name` in `namespace` at its generation.
async fn condition_in(kube: &kube::Client, namespace: &str, name: &str) -> (String, String, String) {
    let api: Api<GitOpsDeployment> = Api::namespaced(kube.clone(), namespace);
    eventually("the writer's condition", || async {
        let object = api.get_opt(name).await.ok()??;
        let condition = object.status.as_ref()?.conditions.iter().find(|c| c.type_ == CONDITION)?.clone();
        (condition.observed_generation == object.metadata.generation)
            .then(|| (condition.status, condition.reason.unwrap_or_default(), condition.message.unwrap_or_default()))
    })
    .await
}

async fn create_in(
    kube: &kube::Client,
    namespace: &str,
    name: &str,
    spec: serde_json::Value,
) -> Result<GitOpsDeployment, kube::Error> {
    let object: GitOpsDeployment = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeployment",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("GitOpsDeployment");
    Api::namespaced(kube.clone(), namespace).create(&PostParams::default(), &object).await
}

async fn label_namespace(kube: &kube::Client, namespace: &str, key: &str, value: Option<&str>) {
    let patch = json!({"metadata": {"labels": {key: value}}});
    Api::<Namespace>::all(kube.clone())
        .patch(namespace, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("label the namespace");
}

/// The value of a sample in the writer's metrics.
fn gauge(metrics: &WriterMetrics, series: &str) -> Option<f64> {
    metrics.render().lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn writer_boundary_namespaces_not_served_get_a_condition_and_nothing_else() {
    let env = env("wb-scope").await;
    let cluster = TestCluster::get().await;
    let unselected = cluster.namespace("wb-scope-unsel").await;
    let tenant = env.tenant.name().to_owned();
    let label = format!("wb-tenant-{}", short_id());
    label_namespace(&env.kube, &tenant, &label, Some("yes")).await;
    let reserved = ["kube-system".to_owned(), "default".to_owned(), env.argocd.name().to_owned()];
    let mut scope = vec![tenant.clone(), unselected.name().to_owned()];
    scope.extend(reserved.iter().cloned());
    let metrics = Arc::new(WriterMetrics::default());
    let _writer = env.writer_for("writer-a", scope, |c| {
        c.home.api_url = HOME_URL.into();
        c.tenancy.selector = Some(format!("{label}=yes").parse().expect("a selector"));
        c.metrics = metrics.clone();
    });
    let name = format!("wb-{}", short_id());
    create_in(&env.kube, &tenant, &name, spec(REPO, "apps/web")).await.expect("create in the tenant namespace");
    create_in(&env.kube, unselected.name(), &name, spec(REPO, "apps/x")).await.expect("create unselected");
    for namespace in &reserved {
        create_in(&env.kube, namespace, &name, spec(REPO, "apps/x")).await.expect("create in a reserved namespace");
    }

    assert_eq!(condition_in(&env.kube, &tenant, &name).await.1, REASON_ACCEPTED);
    let (status, reason, message) = condition_in(&env.kube, unselected.name(), &name).await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", "NamespaceNotServed"), "{message}");
    for namespace in &reserved {
        let (status, reason, message) = condition_in(&env.kube, namespace, &name).await;
        assert_eq!((status.as_str(), reason.as_str()), ("True", "NamespaceReserved"), "{namespace}: {message}");
    }
    // Nothing else: no finalizer, no row, no identity, no Argo CD object.
    for namespace in reserved.iter().map(String::as_str).chain([unselected.name()]) {
        let object: GitOpsDeployment = Api::namespaced(env.kube.clone(), namespace).get(&name).await.expect("read");
        assert!(!object.metadata.finalizers.unwrap_or_default().iter().any(|f| f == FINALIZER), "{namespace}");
        let bindings: Api<RoleBinding> = Api::namespaced(env.kube.clone(), namespace);
        assert!(bindings.get_opt(HOME_IDENTITY).await.expect("read").is_none(), "no home binding in {namespace}");
    }
    // Events too: the served one's acceptance is published, the refusals elsewhere are not.
    let events_about = |namespace: String| {
        let (kube, name) = (env.kube.clone(), name.clone());
        async move {
            let events: Api<Event> = Api::namespaced(kube, &namespace);
            let list = events.list(&Default::default()).await.expect("list events");
            list.items
                .into_iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str()))
                .map(|e| e.reason.unwrap_or_default())
                .collect::<Vec<String>>()
        }
    };
    eventually("the acceptance published", || async {
        events_about(tenant.clone()).await.iter().any(|r| r == "Accepted").then_some(())
    })
    .await;
    for namespace in reserved.iter().cloned().chain([unselected.name().to_owned()]) {
        let published = events_about(namespace.clone()).await;
        assert!(published.is_empty(), "no Event in unserved {namespace}: {published:?}");
    }
    assert_eq!(env.rows(&name).await, 1, "only the tenant namespace's deployment is stored");
    eventually("one Application", || async {
        (env.apps().list(&Env::tenant_apps_params()).await.ok()?.items.len() == 1).then_some(())
    })
    .await;
    eventually("the unserved namespaces counted", || async {
        (gauge(&metrics, "gitops_writer_unserved_namespaces")? >= 4.0).then_some(())
    })
    .await;

    // A namespace that stops being served keeps its rows and Argo CD objects, marked.
    label_namespace(&env.kube, &tenant, &label, None).await;
    let (status, reason, _) = eventually("the deployment marked", || async {
        let found = condition_in(&env.kube, &tenant, &name).await;
        (found.1 == "NamespaceNotServed").then_some(found)
    })
    .await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", "NamespaceNotServed"));
    let state: String = env
        .client
        .query_one("SELECT row_state::text FROM application WHERE resource_name = $1", &[&name])
        .await
        .expect("the row")
        .get(0);
    assert_eq!(state, "active", "a selector change deletes nothing");
    assert_eq!(env.apps().list(&Env::tenant_apps_params()).await.expect("list").items.len(), 1);

    for namespace in &reserved {
        let _ = Api::<GitOpsDeployment>::namespaced(env.kube.clone(), namespace)
            .delete(&name, &DeleteParams::default())
            .await;
    }
}

#[tokio::test]
async fn writer_boundary_home_role_changes_converge_and_old_identities_go() {
    let env = env("wb-role").await;
    let tenant = env.tenant.name().to_owned();
    // What an earlier version left in the tenant namespace.
    let labels = json!({"app.kubernetes.io/managed-by": "gitops-writer"});
    let post = PostParams::default();
    let old_account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": HOME_IDENTITY, "labels": labels}})).expect("ServiceAccount");
    Api::<ServiceAccount>::namespaced(env.kube.clone(), &tenant)
        .create(&post, &old_account)
        .await
        .expect("old account");
    let old_role: Role = serde_json::from_value(json!({
        "metadata": {"name": HOME_IDENTITY, "labels": labels},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
    }))
    .expect("Role");
    Api::<Role>::namespaced(env.kube.clone(), &tenant).create(&post, &old_role).await.expect("old role");
    let old_binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": HOME_IDENTITY, "labels": labels},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": HOME_IDENTITY},
        "subjects": [{"kind": "ServiceAccount", "name": HOME_IDENTITY, "namespace": tenant}]
    }))
    .expect("RoleBinding");
    let bindings: Api<RoleBinding> = Api::namespaced(env.kube.clone(), &tenant);
    bindings.create(&post, &old_binding).await.expect("old binding");

    let writer = env.writer_for("writer-a", vec![tenant.clone()], |c| c.home.api_url = HOME_URL.into());
    env.create("web", spec(REPO, "apps/web")).await;
    assert_eq!(env.condition("web").await.1, REASON_ACCEPTED);
    eventually("the old Role and ServiceAccount gone, the binding on the ClusterRole", || async {
        let role = Api::<Role>::namespaced(env.kube.clone(), &tenant).get_opt(HOME_IDENTITY).await.ok()?;
        let account = Api::<ServiceAccount>::namespaced(env.kube.clone(), &tenant).get_opt(HOME_IDENTITY).await.ok()?;
        let binding = bindings.get_opt(HOME_IDENTITY).await.ok()??;
        (role.is_none()
            && account.is_none()
            && binding.role_ref.kind == "ClusterRole"
            && binding.role_ref.name == "admin")
            .then_some(())
    })
    .await;

    // Another role: the binding is replaced (roleRef is immutable) and the token
    // Argo CD holds acts with the new role.
    writer.cancel();
    let writer = env.writer_for("writer-b", vec![tenant.clone()], |c| {
        c.home.api_url = HOME_URL.into();
        c.home.cluster_role = "view".into();
    });
    eventually("the binding on view", || async {
        (bindings.get_opt(HOME_IDENTITY).await.ok()??.role_ref.name == "view").then_some(())
    })
    .await;
    let account = home_account_name(env_namespace_uid(&env).await);
    let cluster = TestCluster::get().await;
    let token = request_token(&env, &account).await;
    let acting = cluster.client_with_token(&token).await;
    Api::<ConfigMap>::namespaced(acting.clone(), &tenant).list(&ListParams::default()).await.expect("view lists");
    let made: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "x"}})).expect("ConfigMap");
    let refused = Api::<ConfigMap>::namespaced(acting, &tenant).create(&post, &made).await;
    assert!(matches!(refused, Err(kube::Error::Api(s)) if s.code == 403), "view may not create");

    // A role that does not exist: nothing is bound, the writer is not ready, and
    // deployments say why.
    writer.cancel();
    let bound = Arc::new(std::sync::OnceLock::new());
    let _writer = env.writer_for("writer-c", vec![tenant.clone()], |c| {
        c.home.api_url = HOME_URL.into();
        c.home.cluster_role = format!("missing-{}", short_id());
        c.http_address = bound.clone();
    });
    let address = eventually("the writer's HTTP endpoint", || async { bound.get().copied() }).await;
    let (code, body) = crate::support::http_get(address, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("home_identity_possible=false"), "{body}");
    env.create("web2", spec(REPO, "apps/web2")).await;
    let (status, reason, _) = env.condition("web2").await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", REASON_HOME_UNAVAILABLE));
    assert_eq!(
        bindings.get(HOME_IDENTITY).await.expect("binding").role_ref.name,
        "view",
        "a missing role binds nothing"
    );
    assert_eq!(env.rows("web2").await, 0);
}

async fn env_namespace_uid(env: &Env) -> Uuid {
    let namespace = Api::<Namespace>::all(env.kube.clone()).get(env.tenant.name()).await.expect("namespace");
    namespace.metadata.uid.as_deref().and_then(|u| u.parse().ok()).expect("a namespace UID")
}

/// A token of the tenant's home ServiceAccount, as the admin asks for one.
async fn request_token(env: &Env, account: &str) -> String {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"expirationSeconds": 3600}})).expect("TokenRequest");
    Api::<ServiceAccount>::namespaced(env.kube.clone(), env.home.name())
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .expect("a token")
        .status
        .map(|s| s.token)
        .unwrap_or_default()
}

#[tokio::test]
async fn writer_boundary_without_the_webhook_home_deployments_are_not_taken_on_trust() {
    let env = env("wb-unverified").await;
    let tenant = env.tenant.name().to_owned();
    // Stored while the operator had opted out.
    let before = env.writer_for("writer-a", vec![tenant.clone()], |c| c.home.api_url = HOME_URL.into());
    env.create("kept", spec(REPO, "apps/kept")).await;
    let manual = json!({"source": {"repoURL": REPO, "path": "apps/m"}, "destination": {}, "type": "manual"});
    env.create("manual", manual).await;
    assert_eq!(env.condition("kept").await.1, REASON_ACCEPTED);
    assert_eq!(env.condition("manual").await.1, REASON_ACCEPTED);
    before.cancel();

    let _writer = env.writer_for("writer-b", vec![tenant.clone()], |c| {
        c.home.api_url = HOME_URL.into();
        c.allow_unverified_home = false;
    });
    env.create("new", spec(REPO, "apps/new")).await;
    let (status, reason, message) = env.condition("new").await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", REASON_REQUESTER_UNVERIFIED), "{message}");
    assert_eq!(env.rows("new").await, 0);

    // The stored one keeps running as stored; its change is not applied.
    let patch = json!({"spec": {"source": {"path": "apps/changed"}}});
    env.deployments().patch("kept", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("change");
    let (_, reason, message) = env.condition("kept").await;
    assert_eq!(reason, REASON_REQUESTER_UNVERIFIED, "{message}");
    let path: String = env
        .client
        .query_one("SELECT path FROM application WHERE resource_name = 'kept' AND row_state = 'active'", &[])
        .await
        .expect("the row")
        .get(0);
    assert_eq!(path, "apps/kept");

    // A sync run chooses what runs with the home role: refused too.
    let run: GitOpsDeploymentSyncRun = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeploymentSyncRun",
        "metadata": {"name": "sync"}, "spec": {"gitopsDeploymentName": "manual", "revisionID": "main"},
    }))
    .expect("SyncRun");
    let runs: Api<GitOpsDeploymentSyncRun> = Api::namespaced(env.kube.clone(), &tenant);
    runs.create(&PostParams::default(), &run).await.expect("create the run");
    let reason = eventually("the run refused", || async {
        let run = runs.get_opt("sync").await.ok()??;
        run.status?.conditions.into_iter().find(|c| c.type_ == CONDITION)?.reason
    })
    .await;
    assert_eq!(reason, REASON_REQUESTER_UNVERIFIED);
    let stored: i64 = env.client.query_one("SELECT count(*) FROM sync_operation", &[]).await.expect("count").get(0);
    assert_eq!(stored, 0);

    // What was stored before is there for the operator to review.
    let listed = gitopsctl::tenant::home_deployments(&env.db.url()).await.expect("list home deployments");
    let names: Vec<(&str, &str)> = listed.iter().map(|r| (r.namespace.as_str(), r.name.as_str())).collect();
    assert_eq!(names, [(tenant.as_str(), "kept"), (tenant.as_str(), "manual")]);
    assert_eq!(listed[0].path, "apps/kept");
}

/// A ServiceAccount of the tenant namespace holding `cluster_role` there (by a
/// RoleBinding) plus the right to create and read the tenant resources: a client.
async fn person(env: &Env, name: &str, cluster_role: &str) -> kube::Client {
    let cluster = TestCluster::get().await;
    let rules = json!([{
        "apiGroups": ["managed-gitops.redhat.com"],
        "resources": ["gitopsdeployments", "gitopsdeploymentsyncruns"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]
    }]);
    let identity = cluster.namespace_identity(env.tenant.name(), name, rules).await;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-{cluster_role}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": env.tenant.name()}]
    }))
    .expect("RoleBinding");
    Api::<RoleBinding>::namespaced(env.kube.clone(), env.tenant.name())
        .create(&PostParams::default(), &binding)
        .await
        .expect("bind the cluster role");
    let client = cluster.client_with_token(&identity.token).await;
    // A real API server's authorizer sees a new binding a moment later.
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), env.tenant.name());
    eventually("the cluster role in effect", || async { configmaps.list(&ListParams::default()).await.ok() }).await;
    client
}

/// Waits until the registered webhook refuses `editor` (who holds `edit`) a home
/// deployment. A real API server calls a new webhook a moment after it is
/// registered: until it does, what the editor creates is let in (and taken away
/// again here).
async fn until_the_webhook_refuses(env: &Env, tenant: &str, editor: &kube::Client) {
    let deployments: Api<GitOpsDeployment> = Api::namespaced(env.kube.clone(), tenant);
    eventually("the webhook in effect", || async {
        match create_in(editor, tenant, "probe", spec(REPO, "apps/probe")).await {
            Ok(_) => {
                let strip = json!({"metadata": {"finalizers": null}});
                let _ = deployments.patch("probe", &PatchParams::default(), &Patch::Merge(&strip)).await;
                let _ = deployments.delete("probe", &Default::default()).await;
                None
            }
            // In effect once it refuses the editor; anything else (the last probe still
            // going, a call that timed out on a busy machine) is looked at again.
            Err(kube::Error::Api(status)) if status.code == 403 && status.message.contains("may not grant") => Some(()),
            Err(_) => None,
        }
    })
    .await;
}

fn forbidden_with<T: std::fmt::Debug>(result: Result<T, kube::Error>, needle: &str) -> bool {
    match result {
        Err(kube::Error::Api(status)) => {
            let matched = status.code == 403 && status.message.contains(needle);
            if !matched {
                eprintln!("expected a 403 naming {needle:?}, got {} {:?}", status.code, status.message);
            }
            matched
        }
        other => panic!("expected a refusal naming {needle:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn writer_boundary_webhook_lets_in_only_who_could_grant_the_home_role() {
    let env = env("wb-webhook").await;
    let cluster = TestCluster::get().await;
    let tenant = env.tenant.name().to_owned();
    let marker = format!("wb-webhook-{}", short_id());
    let unselected = cluster.namespace("wb-webhook-unsel").await;
    label_namespace(&env.kube, &tenant, "gitops-test/webhook", Some(&marker)).await;
    label_namespace(&env.kube, &tenant, &marker, Some("tenant")).await;
    label_namespace(&env.kube, unselected.name(), "gitops-test/webhook", Some(&marker)).await;
    let dir = std::env::temp_dir().join(format!("gitops-webhook-{}", short_id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let cert = admission::serving_cert(&dir).expect("a certificate");
    let bound = Arc::new(std::sync::OnceLock::new());
    let metrics = Arc::new(WriterMetrics::default());
    let _writer = env.writer_for("writer-a", vec![tenant.clone(), unselected.name().to_owned()], |c| {
        c.home.api_url = HOME_URL.into();
        c.allow_unverified_home = false;
        c.tenancy.selector = Some(format!("{marker}=tenant").parse().expect("selector"));
        c.webhook = Some(WebhookSettings {
            address: "127.0.0.1:0".parse().expect("address"),
            cert_file: cert.cert_file.clone(),
            key_file: cert.key_file.clone(),
        });
        c.webhook_address = bound.clone();
        c.metrics = metrics.clone();
    });
    let address = eventually("the webhook listening", || async { bound.get().copied() }).await;
    let editor = person(&env, "editor", "edit").await;
    let owner = person(&env, "owner", "admin").await;

    // Created while the webhook is not registered: nobody checked who asked, and the
    // writer does not take it on trust — not even once the webhook is registered.
    create_in(&editor, &tenant, "early", spec(REPO, "apps/early")).await.expect("no webhook yet");
    let (_, reason, _) = env.condition("early").await;
    assert_eq!(reason, REASON_REQUESTER_UNVERIFIED);

    let url = format!("https://{address}/validate");
    let configuration = admission::configuration(&marker, &url, &cert.ca_pem, Some(("gitops-test/webhook", &marker)));
    admission::register(&env.kube, &configuration).await.expect("register the webhook");
    until_the_webhook_refuses(&env, &tenant, &editor).await;

    // Someone holding `edit` may not deploy with the home role (`admin`).
    let refused = create_in(&editor, &tenant, "by-editor", spec(REPO, "apps/e")).await;
    assert!(forbidden_with(refused, "may not grant"));
    // A namespace admin may (it holds every permission of `admin`, though not `bind`).
    // A dry run is checked the same way, and records no approval: nothing was stored.
    let approvals = || async {
        env.client.query_one("SELECT count(*) FROM admission_approval", &[]).await.expect("count").get::<_, i64>(0)
    };
    let before = approvals().await;
    let dry = PostParams { dry_run: true, ..PostParams::default() };
    let object: GitOpsDeployment = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeployment",
        "metadata": {"name": "dry"}, "spec": spec(REPO, "apps/d"),
    }))
    .expect("GitOpsDeployment");
    Api::<GitOpsDeployment>::namespaced(owner.clone(), &tenant).create(&dry, &object).await.expect("a dry run");
    let refused = Api::<GitOpsDeployment>::namespaced(editor.clone(), &tenant).create(&dry, &object).await;
    assert!(forbidden_with(refused, "may not grant"), "a dry run is refused like the real thing");
    assert_eq!(approvals().await, before, "a dry run records no approval");
    create_in(&owner, &tenant, "by-owner", spec(REPO, "apps/o")).await.expect("the admin's deployment");
    assert_eq!(approvals().await, before + 1, "the real create is approved");
    let manual = json!({"source": {"repoURL": REPO, "path": "apps/m"}, "destination": {}, "type": "manual"});
    create_in(&owner, &tenant, "manual", manual).await.expect("the admin's manual deployment");
    assert_eq!(env.condition("by-owner").await.1, REASON_ACCEPTED, "verified requesters are accepted");
    // The editor may not change it either, nor run a sync of it.
    let patch = json!({"spec": {"source": {"path": "apps/mine"}}});
    let changed = Api::<GitOpsDeployment>::namespaced(editor.clone(), &tenant)
        .patch("by-owner", &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    assert!(forbidden_with(changed, "may not grant"));
    let run: GitOpsDeploymentSyncRun = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeploymentSyncRun",
        "metadata": {"name": "sync"}, "spec": {"gitopsDeploymentName": "manual", "revisionID": "evil"},
    }))
    .expect("SyncRun");
    let refused =
        Api::<GitOpsDeploymentSyncRun>::namespaced(editor.clone(), &tenant).create(&PostParams::default(), &run).await;
    assert!(forbidden_with(refused, "may not grant"));
    Api::<GitOpsDeploymentSyncRun>::namespaced(owner.clone(), &tenant)
        .create(&PostParams::default(), &run)
        .await
        .expect("the admin's sync run");
    // Metadata-only changes pass, so finalizers can always be released.
    let labelled = json!({"metadata": {"labels": {"team": "a"}}});
    Api::<GitOpsDeployment>::namespaced(editor.clone(), &tenant)
        .patch("by-owner", &PatchParams::default(), &Patch::Merge(&labelled))
        .await
        .expect("a label change");
    // Pointing the deployment elsewhere (invalid: its stored row still goes home) does
    // not open a way to sync it: the run is let in, unapproved, and refused.
    let elsewhere = json!({"spec": {"destination": {"environment": "nope"}}});
    Api::<GitOpsDeployment>::namespaced(editor.clone(), &tenant)
        .patch("manual", &PatchParams::default(), &Patch::Merge(&elsewhere))
        .await
        .expect("a change to another environment is not the home role's business");
    let (status, reason, _) = env.condition("manual").await;
    assert_eq!(status, "True", "{reason}: the environment does not exist");
    let sneaky: GitOpsDeploymentSyncRun = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeploymentSyncRun",
        "metadata": {"name": "sneaky"}, "spec": {"gitopsDeploymentName": "manual", "revisionID": "evil"},
    }))
    .expect("SyncRun");
    let runs: Api<GitOpsDeploymentSyncRun> = Api::namespaced(editor.clone(), &tenant);
    runs.create(&PostParams::default(), &sneaky).await.expect("let in without an approval");
    let reason = eventually("the unapproved run refused", || async {
        let run = runs.get_opt("sneaky").await.ok()??;
        run.status?.conditions.into_iter().find(|c| c.type_ == CONDITION)?.reason
    })
    .await;
    assert_eq!(reason, REASON_REQUESTER_UNVERIFIED);
    let sneaky_rows: i64 = env
        .client
        .query_one("SELECT count(*) FROM sync_operation WHERE resource_name = 'sneaky'", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(sneaky_rows, 0);

    // The early deployment stays refused until someone who may changes it.
    assert_eq!(env.rows("early").await, 0);
    let checked = json!({"spec": {"source": {"path": "apps/early-checked"}}});
    Api::<GitOpsDeployment>::namespaced(owner.clone(), &tenant)
        .patch("early", &PatchParams::default(), &Patch::Merge(&checked))
        .await
        .expect("the admin's change");
    assert_eq!(env.condition("early").await.1, REASON_ACCEPTED);

    // A namespace the service does not serve is refused at apply time.
    let refused = create_in(&env.kube, unselected.name(), "x", spec(REPO, "apps/x")).await;
    assert!(forbidden_with(refused, "not one of the GitOps service's tenant namespaces"));
    assert!(metrics.admission_reviews("GitOpsDeployment", "denied") >= 3);
    admission::unregister(&env.kube, &marker).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The AppStudio layer's home deployments (`--appstudio-identity`): approved when a
/// binding of the namespace controls them — the layer's webhook checked whoever
/// made that binding go home — and judged like anyone's otherwise.
#[tokio::test]
async fn writer_boundary_webhook_approves_the_appstudio_layer_only_for_its_bindings() {
    let env = env("wb-appstudio").await;
    let cluster = TestCluster::get().await;
    cluster.install_crds(gitops_appstudio::api::crds()).await.expect("install the AppStudio CRDs");
    let tenant = env.tenant.name().to_owned();
    let marker = format!("wb-appstudio-{}", short_id());
    label_namespace(&env.kube, &tenant, "gitops-test/webhook", Some(&marker)).await;
    let dir = std::env::temp_dir().join(format!("gitops-webhook-{}", short_id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let cert = admission::serving_cert(&dir).expect("a certificate");
    let bound = Arc::new(std::sync::OnceLock::new());
    let identity = format!("system:serviceaccount:{tenant}:layer");
    let _writer = env.writer_for("writer-a", vec![tenant.clone()], |c| {
        c.home.api_url = HOME_URL.into();
        c.allow_unverified_home = false;
        c.appstudio_identity = Some(identity.clone());
        c.webhook = Some(WebhookSettings {
            address: "127.0.0.1:0".parse().expect("address"),
            cert_file: cert.cert_file.clone(),
            key_file: cert.key_file.clone(),
        });
        c.webhook_address = bound.clone();
    });
    let address = eventually("the webhook listening", || async { bound.get().copied() }).await;
    // The layer and a tenant's editor both hold `edit`, not the home role.
    let layer = person(&env, "layer", "edit").await;
    let editor = person(&env, "editor", "edit").await;
    let url = format!("https://{address}/validate");
    let configuration = admission::configuration(&marker, &url, &cert.ca_pem, Some(("gitops-test/webhook", &marker)));
    admission::register(&env.kube, &configuration).await.expect("register the webhook");
    until_the_webhook_refuses(&env, &tenant, &editor).await;

    let binding: gitops_appstudio::api::SnapshotEnvironmentBinding = serde_json::from_value(json!({
        "apiVersion": "appstudio.redhat.com/v1alpha1", "kind": "SnapshotEnvironmentBinding",
        "metadata": {"name": "shop-development"},
        "spec": {"application": "shop", "environment": "development", "snapshot": "s1", "components": []},
    }))
    .expect("a binding");
    let binding = Api::<gitops_appstudio::api::SnapshotEnvironmentBinding>::namespaced(env.kube.clone(), &tenant)
        .create(&PostParams::default(), &binding)
        .await
        .expect("the binding (its creator checked by the layer's webhook)");
    let uid = binding.metadata.uid.clone().expect("a uid");
    let owned = |name: &str, uid: &str| -> GitOpsDeployment {
        serde_json::from_value(json!({
            "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeployment",
            "metadata": {"name": name, "ownerReferences": [{
                "apiVersion": "appstudio.redhat.com/v1alpha1", "kind": "SnapshotEnvironmentBinding",
                "name": "shop-development", "uid": uid, "controller": true}]},
            "spec": spec(REPO, &format!("apps/{name}")),
        }))
        .expect("GitOpsDeployment")
    };
    let as_layer: Api<GitOpsDeployment> = Api::namespaced(layer.clone(), &tenant);
    as_layer.create(&PostParams::default(), &owned("by-layer", &uid)).await.expect("the layer's deployment");
    assert_eq!(env.condition("by-layer").await.1, REASON_ACCEPTED, "approved, so the writer takes it");
    let patch = json!({"spec": {"source": {"path": "apps/by-layer-2"}}});
    as_layer.patch("by-layer", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("the layer's change");

    // Not owned by a binding, owned by one that is not there, or asked by someone
    // else: judged like anyone's.
    let refused = create_in(&layer, &tenant, "layer-unowned", spec(REPO, "apps/u")).await;
    assert!(forbidden_with(refused, "may not grant"), "an unowned deployment of the layer's");
    let stranger = Uuid::new_v4().to_string();
    let refused = as_layer.create(&PostParams::default(), &owned("layer-stale", &stranger)).await;
    assert!(forbidden_with(refused, "may not grant"), "owned by another binding of that name");
    let as_editor: Api<GitOpsDeployment> = Api::namespaced(editor.clone(), &tenant);
    let refused = as_editor.create(&PostParams::default(), &owned("editor-owned", &uid)).await;
    assert!(forbidden_with(refused, "may not grant"), "the editor claiming the binding's ownership");
    let theirs = json!({"spec": {"source": {"path": "apps/editors-choice"}}});
    let refused = as_editor.patch("by-layer", &PatchParams::default(), &Patch::Merge(&theirs)).await;
    assert!(forbidden_with(refused, "may not grant"), "the editor changing the layer's deployment");
    admission::unregister(&env.kube, &marker).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn writer_boundary_edit_in_the_tenant_namespace_cannot_act_as_the_home_identity() {
    let env = env("wb-steal").await;
    let tenant = env.tenant.name().to_owned();
    let _writer = env.writer_for("writer-a", vec![tenant.clone()], |c| c.home.api_url = HOME_URL.into());
    env.create("web", spec(REPO, "apps/web")).await;
    assert_eq!(env.condition("web").await.1, REASON_ACCEPTED);
    let account = home_account_name(env_namespace_uid(&env).await);
    let editor = person(&env, "editor", "edit").await;

    // No token of it anywhere the editor can read, and none to request.
    let in_tenant = Api::<Secret>::namespaced(editor.clone(), &tenant)
        .list(&ListParams::default())
        .await
        .expect("edit reads Secrets");
    assert!(
        !in_tenant.items.iter().any(|s| {
            s.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.get("kubernetes.io/service-account.name") == Some(&account))
        }),
        "no token Secret of the home account in the tenant namespace"
    );
    let home_secrets = Api::<Secret>::namespaced(editor.clone(), env.home.name()).list(&ListParams::default()).await;
    assert!(
        matches!(home_secrets, Err(kube::Error::Api(s)) if s.code == 403),
        "the home namespace's Secrets are out of reach"
    );
    use k8s_openapi::api::authentication::v1::TokenRequest;
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"expirationSeconds": 3600}})).expect("TokenRequest");
    let minted = Api::<ServiceAccount>::namespaced(editor.clone(), env.home.name())
        .create_token_request(&account, &PostParams::default(), &request)
        .await;
    assert!(matches!(minted, Err(kube::Error::Api(s)) if s.code == 403), "no token can be requested for it");

    let cluster = TestCluster::get().await;
    if cluster.is_real() {
        // Impersonating it (edit may impersonate the namespace's own ServiceAccounts).
        let mut config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(cluster.kubeconfig_path()).expect("kubeconfig"),
            &Default::default(),
        )
        .await
        .expect("config");
        let identity = cluster.namespace_identity(&tenant, "impostor", json!([])).await;
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "impostor-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"kind": "ServiceAccount", "name": "impostor", "namespace": tenant}]
        }))
        .expect("RoleBinding");
        Api::<RoleBinding>::namespaced(env.kube.clone(), &tenant)
            .create(&PostParams::default(), &binding)
            .await
            .expect("bind");
        config.auth_info = kube::config::AuthInfo {
            token: Some(identity.token.clone().into()),
            impersonate: Some(format!("system:serviceaccount:{}:{account}", env.home.name())),
            ..Default::default()
        };
        let impersonating = kube::Client::try_from(config).expect("client");
        let listed = Api::<ConfigMap>::namespaced(impersonating, &tenant).list(&ListParams::default()).await;
        assert!(
            matches!(listed, Err(kube::Error::Api(s)) if s.code == 403),
            "impersonating the home account is refused"
        );
        // A Pod of the tenant namespace cannot run as it (ServiceAccounts are per namespace).
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": "steal"},
            "spec": {"serviceAccountName": account, "containers": [{"name": "c", "image": "example.invalid/x"}]}
        }))
        .expect("Pod");
        let created = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(editor, &tenant)
            .create(&PostParams::default(), &pod)
            .await;
        assert!(created.is_err(), "no Pod runs as the home account: {created:?}");
    }
}
