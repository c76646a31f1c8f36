//! The writer's credential controllers end to end, with an in-process agent and the
//! Argo CD stand-in: a managed environment becomes an Argo CD cluster Secret and a
//! repository credential a repository Secret, both in the tenant's project; each
//! refused kubeconfig feature has its own reason and writes nothing; a deployment
//! cannot name another namespace's environment; a rotated Secret is sealed again
//! and reaches Argo CD; deleting an environment removes its cluster Secret. Tests
//! wait on conditions and rows with deadlines, never on time.

use std::io::Write;
use std::sync::{Arc, Mutex};

use gitops_agent::names;
use gitops_testkit::cluster::{TestCluster, TestNamespace};
use gitops_writer::api::{GitOpsDeploymentManagedEnvironment, GitOpsDeploymentRepositoryCredential};
use gitops_writer::controller::{
    CONDITION, CONNECTION_CONDITION, REASON_ACCEPTED, REASON_CONNECTION_CHECK_DISABLED, REASON_SECRET_NOT_FOUND,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_postgres::Client;

use crate::support::eventually;

const TOKEN: &str = "tok3n-s3cret-value";
const CA: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==";

/// A Secret's data as text.
type Data = std::collections::BTreeMap<String, String>;

/// The writer end-to-end environment plus a second tenant namespace.
struct Env {
    base: crate::support::writer::Env,
    other: TestNamespace,
}

impl std::ops::Deref for Env {
    type Target = crate::support::writer::Env;

    fn deref(&self) -> &Self::Target {
        &self.base
    }
}

/// Stand-in, agent and one writer for the tenant and the other namespace.
async fn env(purpose: &str) -> Env {
    let base = crate::support::writer::env(purpose).await;
    let other = TestCluster::get().await.namespace(&format!("{purpose}-other")).await;
    base.writer_for("writer-a", vec![base.tenant.name().to_owned(), other.name().to_owned()], |_| {});
    Env { base, other }
}

fn kubeconfig(user: &str, cluster_extra: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://cluster.example.invalid:6443
    certificate-authority-data: {CA}
{cluster_extra}
users:
- name: u
  user:
{user}
"
    )
}

impl Env {
    fn environments(&self, namespace: &str) -> Api<GitOpsDeploymentManagedEnvironment> {
        Api::namespaced(self.kube.clone(), namespace)
    }

    fn credentials(&self) -> Api<GitOpsDeploymentRepositoryCredential> {
        Api::namespaced(self.kube.clone(), self.tenant.name())
    }

    fn secrets(&self, namespace: &str) -> Api<Secret> {
        Api::namespaced(self.kube.clone(), namespace)
    }

    async fn put_secret(&self, namespace: &str, name: &str, data: serde_json::Value) {
        let secret: Secret =
            serde_json::from_value(json!({"metadata": {"name": name}, "stringData": data})).expect("Secret");
        let patch = PatchParams::apply("writer-credentials-test").force();
        self.secrets(namespace).patch(name, &patch, &Patch::Apply(&secret)).await.expect("apply Secret");
    }

    async fn create_environment(
        &self,
        namespace: &str,
        name: &str,
        secret: &str,
    ) -> GitOpsDeploymentManagedEnvironment {
        self.create_environment_at(namespace, name, secret, "https://cluster.example.invalid:6443").await
    }

    async fn create_environment_at(
        &self,
        namespace: &str,
        name: &str,
        secret: &str,
        api_url: &str,
    ) -> GitOpsDeploymentManagedEnvironment {
        let object: GitOpsDeploymentManagedEnvironment = serde_json::from_value(json!({
            "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeploymentManagedEnvironment",
            "metadata": {"name": name},
            "spec": {"apiURL": api_url, "credentialsSecret": secret},
        }))
        .expect("environment");
        self.environments(namespace).create(&PostParams::default(), &object).await.expect("create environment")
    }

    /// The writer's condition (status, reason) at the environment's generation.
    async fn environment_condition(&self, name: &str) -> (String, String) {
        eventually("the environment's condition", || async {
            let object = self.environments(self.tenant.name()).get_opt(name).await.ok()??;
            let condition = object.status.as_ref()?.conditions.iter().find(|c| c.type_ == CONDITION)?.clone();
            (condition.observed_generation == object.metadata.generation)
                .then(|| (condition.status, condition.reason.unwrap_or_default()))
        })
        .await
    }

    async fn environment_rows(&self, name: &str) -> i64 {
        self.client
            .query_one("SELECT count(*) FROM managed_environment WHERE resource_name = $1", &[&name])
            .await
            .expect("count")
            .get(0)
    }

    /// The data of a Secret in the Argo CD namespace, once it exists and `check` holds.
    async fn argocd_secret(&self, name: &str, check: impl Fn(&Data) -> bool) -> Data {
        eventually("the Argo CD Secret", || async {
            let secret = self.secrets(self.argocd.name()).get_opt(name).await.ok()??;
            let data: Data = secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                .collect();
            check(&data).then_some(data)
        })
        .await
    }
}

async fn sealed(client: &Client) -> Vec<u8> {
    let row = client.query_one("SELECT ciphertext FROM repository_credential", &[]).await.expect("row");
    row.get::<_, Option<Vec<u8>>>(0).expect("sealed")
}

fn uid_of(meta: &kube::api::ObjectMeta) -> uuid::Uuid {
    uuid::Uuid::parse_str(meta.uid.as_deref().expect("uid")).expect("uuid")
}

/// Log lines of this thread's tasks (the tests run on a current-thread runtime).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn writer_credentials_environment_becomes_a_cluster_secret_and_goes_on_delete() {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let env = env("wc-env").await;
    let tenant = env.tenant.name().to_owned();
    // The deployment names the environment before it exists: refused, then accepted.
    let deployments: Api<gitops_writer::api::GitOpsDeployment> = Api::namespaced(env.kube.clone(), &tenant);
    let deployment: gitops_writer::api::GitOpsDeployment = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeployment", "metadata": {"name": "web"},
        "spec": {"source": {"repoURL": "https://git.example.invalid/org/repo.git", "path": "apps"},
                 "destination": {"environment": "prod", "namespace": "web"}, "type": "automated"},
    }))
    .expect("deployment");
    deployments.create(&PostParams::default(), &deployment).await.expect("create deployment");
    eventually("EnvironmentNotFound", || async {
        let object = deployments.get_opt("web").await.ok()??;
        let condition = object.status?.conditions.into_iter().find(|c| c.type_ == CONDITION)?;
        (condition.reason.as_deref() == Some("EnvironmentNotFound")).then_some(())
    })
    .await;

    let created = env.create_environment(&tenant, "prod", "prod-kubeconfig").await;
    assert_eq!(env.environment_condition("prod").await, ("True".to_owned(), REASON_SECRET_NOT_FOUND.to_owned()));
    assert_eq!(env.environment_rows("prod").await, 0, "nothing is written without the Secret");
    env.put_secret(&tenant, "prod-kubeconfig", json!({"kubeconfig": kubeconfig(&format!("    token: {TOKEN}"), "")}))
        .await;
    eventually("the environment accepted", || async {
        (env.environment_condition("prod").await == ("False".to_owned(), REASON_ACCEPTED.to_owned())).then_some(())
    })
    .await;
    let object = env.environments(&tenant).get("prod").await.expect("read");
    let connection = object.status.expect("status").conditions.into_iter().find(|c| c.type_ == CONNECTION_CONDITION);
    let connection = connection.expect("the connection condition");
    assert_eq!(
        (connection.status.as_str(), connection.reason.as_deref()),
        ("Unknown", Some(REASON_CONNECTION_CHECK_DISABLED))
    );

    let cluster_secret = names::cluster_secret_name(uid_of(&created.metadata));
    let data = env.argocd_secret(&cluster_secret, |d| d.contains_key("config")).await;
    assert!(data["config"].contains(TOKEN), "the cluster Secret carries the token");
    assert!(data.get("project").is_some_and(|p| !p.is_empty()), "{:?}", data.keys());
    eventually("the deployment accepted once the environment exists", || async {
        let object = deployments.get_opt("web").await.ok()??;
        let condition = object.status?.conditions.into_iter().find(|c| c.type_ == CONDITION)?;
        (condition.reason.as_deref() == Some(REASON_ACCEPTED)).then_some(())
    })
    .await;
    deployments.delete("web", &DeleteParams::default()).await.expect("delete deployment");
    eventually("the deployment gone", || async { deployments.get_opt("web").await.ok()?.is_none().then_some(()) })
        .await;

    env.environments(&tenant).delete("prod", &DeleteParams::default()).await.expect("delete environment");
    eventually("the cluster Secret gone", || async {
        env.secrets(env.argocd.name()).get_opt(&cluster_secret).await.ok()?.is_none().then_some(())
    })
    .await;
    let logs = String::from_utf8_lossy(&logs.0.lock().expect("logs")).into_owned();
    assert!(!logs.is_empty(), "logs were captured");
    assert!(!logs.contains(TOKEN), "no secret material in the logs");
}

#[tokio::test]
async fn writer_credentials_each_refused_kubeconfig_feature_has_its_reason() {
    let env = env("wc-refused").await;
    let tenant = env.tenant.name().to_owned();
    let cases = [
        (
            "exec",
            kubeconfig("    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh", ""),
            "KubeconfigExecPluginNotAllowed",
        ),
        (
            "auth-provider",
            kubeconfig("    token: t\n    auth-provider:\n      name: gcp", ""),
            "KubeconfigAuthProviderNotAllowed",
        ),
        ("file-path", kubeconfig("    tokenFile: /var/run/secrets/token", ""), "KubeconfigFilePathNotAllowed"),
        ("basic-auth", kubeconfig("    username: admin\n    password: hunter2", ""), "KubeconfigBasicAuthNotAllowed"),
        (
            "proxy",
            kubeconfig("    token: t", "    proxy-url: http://proxy.example.invalid:3128"),
            "KubeconfigProxyNotAllowed",
        ),
    ];
    for (name, config, _) in &cases {
        env.put_secret(&tenant, &format!("{name}-kubeconfig"), json!({"kubeconfig": config})).await;
        env.create_environment(&tenant, name, &format!("{name}-kubeconfig")).await;
    }
    for (name, _, want) in &cases {
        assert_eq!(env.environment_condition(name).await, ("True".to_owned(), (*want).to_owned()), "{name}");
        assert_eq!(env.environment_rows(name).await, 0, "{name} wrote nothing");
    }
    let credentials: i64 =
        env.client.query_one("SELECT count(*) FROM cluster_credential", &[]).await.expect("count").get(0);
    assert_eq!(credentials, 0);
}

#[tokio::test]
async fn writer_credentials_another_namespaces_environment_is_refused() {
    let env = env("wc-cross").await;
    let other = env.other.name().to_owned();
    env.put_secret(&other, "kc", json!({"kubeconfig": kubeconfig("    token: t", "")})).await;
    env.create_environment(&other, "theirs", "kc").await;
    eventually("the other namespace's environment stored", || async {
        (env.environment_rows("theirs").await == 1).then_some(())
    })
    .await;
    // Same name in the tenant's namespace resolves only there: absent, so refused.
    let deployments: Api<gitops_writer::api::GitOpsDeployment> = Api::namespaced(env.kube.clone(), env.tenant.name());
    let deployment: gitops_writer::api::GitOpsDeployment = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeployment", "metadata": {"name": "sneaky"},
        "spec": {"source": {"repoURL": "https://git.example.invalid/org/repo.git", "path": "apps"},
                 "destination": {"environment": "theirs"}, "type": "automated"},
    }))
    .expect("deployment");
    deployments.create(&PostParams::default(), &deployment).await.expect("create deployment");
    eventually("EnvironmentNotFound", || async {
        let object = deployments.get_opt("sneaky").await.ok()??;
        let condition = object.status?.conditions.into_iter().find(|c| c.type_ == CONDITION)?;
        (condition.reason.as_deref() == Some("EnvironmentNotFound")).then_some(())
    })
    .await;
    let rows: i64 = env
        .client
        .query_one("SELECT count(*) FROM application WHERE resource_name = 'sneaky'", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, 0);
}

#[tokio::test]
async fn writer_credentials_repository_credential_rotates() {
    let env = env("wc-repo").await;
    let tenant = env.tenant.name().to_owned();
    env.put_secret(&tenant, "git", json!({"username": "bot", "password": "first-pass"})).await;
    let object: GitOpsDeploymentRepositoryCredential = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeploymentRepositoryCredential",
        "metadata": {"name": "git"},
        "spec": {"repository": "https://git.example.invalid/org/repo.git", "secret": "git"},
    }))
    .expect("repository credential");
    let created = env.credentials().create(&PostParams::default(), &object).await.expect("create");
    let name = names::repository_secret_name(uid_of(&created.metadata));
    let data = env.argocd_secret(&name, |d| d.get("password").is_some_and(|p| p == "first-pass")).await;
    assert_eq!(data.get("url").map(String::as_str), Some("https://git.example.invalid/org/repo.git"));
    assert!(data.get("project").is_some_and(|p| !p.is_empty()));
    let before = sealed(&env.client).await;
    assert!(!String::from_utf8_lossy(&before).contains("first-pass"), "stored sealed");

    env.put_secret(&tenant, "git", json!({"username": "bot", "password": "second-pass"})).await;
    env.argocd_secret(&name, |d| d.get("password").is_some_and(|p| p == "second-pass")).await;
    assert_ne!(sealed(&env.client).await, before, "the rotation sealed again");

    // Wrong Secret type and an invalid URL have their reasons.
    let wrong: Secret = serde_json::from_value(json!({
        "metadata": {"name": "docker"}, "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": "{}"},
    }))
    .expect("Secret");
    env.secrets(&tenant).create(&PostParams::default(), &wrong).await.expect("create Secret");
    for (name, repository, secret, want) in [
        ("wrong-type", "https://git.example.invalid/org/a.git", "docker", "SecretWrongType"),
        ("bad-url", "https://u:p@git.example.invalid/org/a.git", "git", "InvalidRepositoryURL"),
        ("missing", "https://git.example.invalid/org/b.git", "nope", REASON_SECRET_NOT_FOUND),
    ] {
        let object: GitOpsDeploymentRepositoryCredential = serde_json::from_value(json!({
            "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeploymentRepositoryCredential",
            "metadata": {"name": name}, "spec": {"repository": repository, "secret": secret},
        }))
        .expect("repository credential");
        env.credentials().create(&PostParams::default(), &object).await.expect("create");
        let reason = eventually("the condition", || async {
            let object = env.credentials().get_opt(name).await.ok()??;
            let condition = object.status?.conditions.into_iter().find(|c| c.type_ == CONDITION)?;
            condition.reason
        })
        .await;
        assert_eq!(reason, want, "{name}");
    }
}

/// (status, reason) of the kstatus condition `type_` when it speaks of the object's generation.
fn kstatus_of(
    meta: &kube::api::ObjectMeta,
    conditions: &[gitops_writer::api::Condition],
    type_: &str,
) -> Option<(String, String)> {
    let condition = conditions.iter().find(|c| c.type_ == type_)?;
    (condition.observed_generation == meta.generation)
        .then(|| (condition.status.clone(), condition.reason.clone().unwrap_or_default()))
}

#[tokio::test]
async fn writer_credentials_ready_follows_the_agent_through_an_argocd_outage() {
    let env = env("wc-ready").await;
    let tenant = env.tenant.name().to_owned();
    env.put_secret(&tenant, "prod-kubeconfig", json!({"kubeconfig": kubeconfig(&format!("    token: {TOKEN}"), "")}))
        .await;
    env.put_secret(&tenant, "git", json!({"username": "bot", "password": "pass"})).await;
    env.create_environment(&tenant, "prod", "prod-kubeconfig").await;
    let credential: GitOpsDeploymentRepositoryCredential = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeploymentRepositoryCredential",
        "metadata": {"name": "git"},
        "spec": {"repository": "https://git.example.invalid/org/repo.git", "secret": "git"},
    }))
    .expect("repository credential");
    env.credentials().create(&PostParams::default(), &credential).await.expect("create");
    let environment_ready = |want: (&'static str, &'static str)| {
        let env = &env;
        async move {
            eventually(&format!("the environment {want:?}"), || async {
                let object = env.environments(env.tenant.name()).get_opt("prod").await.ok()??;
                let conditions = object.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
                let ready = kstatus_of(&object.metadata, &conditions, "Ready")?;
                (ready.0 == want.0 && ready.1 == want.1).then_some(conditions)
            })
            .await
        }
    };
    let credential_ready = |want: (&'static str, &'static str)| {
        let env = &env;
        async move {
            eventually(&format!("the credential {want:?}"), || async {
                let object = env.credentials().get_opt("git").await.ok()??;
                let conditions = object.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
                let ready = kstatus_of(&object.metadata, &conditions, "Ready")?;
                (ready.0 == want.0 && ready.1 == want.1).then_some(conditions)
            })
            .await
        }
    };
    let conditions = environment_ready(("True", "Ready")).await;
    assert!(conditions.iter().any(|c| c.type_ == CONDITION && c.status == "False"), "ErrorOccurred stays");
    credential_ready(("True", "Ready")).await;

    // The agent loses Argo CD; the tenant changes both: neither is Ready, and each says why.
    let binding = crate::support::revoke_agent_access(&env.kube, env.argocd.name()).await;
    let patch = json!({"spec": {"namespaces": ["web"]}});
    env.environments(&tenant).patch("prod", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
    let patch = json!({"spec": {"repository": "https://git.example.invalid/org/other.git"}});
    env.credentials().patch("git", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
    for conditions in [
        environment_ready(("False", "ArgoCDUnavailable")).await,
        credential_ready(("False", "ArgoCDUnavailable")).await,
    ] {
        let of = |t: &str| conditions.iter().find(|c| c.type_ == t).map(|c| c.status.clone());
        assert_eq!((of("Reconciling"), of("Stalled")), (Some("True".into()), Some("False".into())), "retried");
        let ready = conditions.iter().find(|c| c.type_ == "Ready").and_then(|c| c.message.clone());
        assert!(ready.is_some_and(|m| m.contains("unavailable")), "the tenant reads why: {conditions:?}");
    }

    // Access comes back: the new generations reach Argo CD and Ready follows.
    crate::support::restore_agent_access(&env.kube, env.argocd.name(), binding).await;
    environment_ready(("True", "Ready")).await;
    credential_ready(("True", "Ready")).await;
}

/// A kubeconfig with a context per cluster, the current one naming another
/// cluster: the environment stores the token of the context for its apiURL; a
/// kubeconfig with no context for it is refused.
#[tokio::test]
async fn writer_credentials_kubeconfig_context_is_the_one_for_the_api_url() {
    let env = env("wc-context").await;
    let tenant = env.tenant.name().to_owned();
    let two = "current-context: other
clusters:
- name: other
  cluster: {server: 'https://other.example.invalid:6443'}
- name: mine
  cluster: {server: 'https://CLUSTER.example.invalid:6443/'}
contexts:
- name: other
  context: {cluster: other, user: other-admin}
- name: mine
  context: {cluster: mine, user: mine-admin}
users:
- name: other-admin
  user: {token: not-this-token}
- name: mine-admin
  user: {token: the-matching-token}
";
    env.put_secret(&tenant, "two-contexts", json!({"kubeconfig": two})).await;
    let created = env.create_environment(&tenant, "prod", "two-contexts").await;
    assert_eq!(env.environment_condition("prod").await, ("False".to_owned(), REASON_ACCEPTED.to_owned()));
    let cluster_secret = names::cluster_secret_name(uid_of(&created.metadata));
    let data = env.argocd_secret(&cluster_secret, |d| d.contains_key("config")).await;
    assert!(data["config"].contains("the-matching-token"), "the token of the context for apiURL");
    assert!(!data["config"].contains("not-this-token"), "never the current context's");

    let elsewhere = two.replace("https://CLUSTER.example.invalid:6443/", "https://elsewhere.example.invalid");
    env.put_secret(&tenant, "no-match", json!({"kubeconfig": elsewhere})).await;
    env.create_environment(&tenant, "nomatch", "no-match").await;
    assert_eq!(
        env.environment_condition("nomatch").await,
        ("True".to_owned(), gitops_writer::validate::reason::UNABLE_TO_LOCATE_CONTEXT.to_owned())
    );
    assert_eq!(env.environment_rows("nomatch").await, 0, "nothing stored");
}

/// Without `--api-url-allow-private`, environments may not aim the engine at
/// loopback, link-local or metadata addresses, in any spelling; nothing is stored
/// for them and nothing is contacted.
#[tokio::test]
async fn writer_credentials_private_api_urls_are_refused() {
    let env = env("wc-private").await;
    let tenant = env.tenant.name().to_owned();
    let cases = [
        ("loopback", "https://127.0.0.1:6443"),
        ("short", "https://127.1"),
        ("decimal", "https://2130706433"),
        ("mapped", "https://[::ffff:127.0.0.1]:6443"),
        ("metadata", "https://169.254.169.254"),
        ("localhost", "https://localhost:6443"),
    ];
    for (name, url) in cases {
        let config =
            format!("clusters: [{{name: c, cluster: {{server: '{url}'}}}}]\nusers: [{{name: u, user: {{token: t}}}}]");
        env.put_secret(&tenant, &format!("{name}-kubeconfig"), json!({"kubeconfig": config})).await;
        env.create_environment_at(&tenant, name, &format!("{name}-kubeconfig"), url).await;
    }
    for (name, url) in cases {
        assert_eq!(
            env.environment_condition(name).await,
            ("True".to_owned(), gitops_writer::validate::reason::API_URL_NOT_ALLOWED.to_owned()),
            "{url}"
        );
        assert_eq!(env.environment_rows(name).await, 0, "{url}: nothing stored");
    }
}
