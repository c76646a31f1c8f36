//! The writer's optional connection check of managed environments, end to end
//! against the test tier's own API server (emulator or real, both on loopback): an
//! allowed environment with a valid token is `Succeeded`, a bad token
//! `Unauthorized`, a closed loopback port or an untrusted server certificate
//! `ConnectionFailed`; an environment on the
//! deny list, off the allow list, or under an empty allow list is
//! `ConnectionCheckDenied` and nothing is contacted (a listener of the test's own
//! sees no connection). Every environment is stored whatever the check says, and no
//! condition message carries the token. Checks off is covered by
//! `writer_credentials`. Tests wait on conditions with deadlines, never on time.

use std::net::TcpListener;

use gitops_testkit::cluster::TestCluster;
use gitops_writer::api::{Condition, GitOpsDeploymentManagedEnvironment};
use gitops_writer::controller::connection::{
    ConnectionPolicy, Destination, REASON_CONNECTION_CHECK_DENIED, REASON_CONNECTION_FAILED, REASON_SUCCEEDED,
    REASON_UNAUTHORIZED,
};
use gitops_writer::controller::{CONDITION, CONNECTION_CONDITION, REASON_ACCEPTED};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::eventually;

const BAD_TOKEN: &str = "n0t-a-valid-t0ken-s3cret";

/// The test tier's API server as a tenant would name it, and a token it accepts
/// (which may list ConfigMaps in the tenant namespace).
pub(crate) struct Server {
    pub(crate) url: String,
    /// `host:port` as written in the URL.
    pub(crate) authority: String,
    pub(crate) ca_data: Option<String>,
    pub(crate) insecure: bool,
    pub(crate) token: String,
}

/// The writer end-to-end environment, the server, and the writer's policy.
struct Env {
    base: crate::support::writer::Env,
    server: Server,
}

impl std::ops::Deref for Env {
    type Target = crate::support::writer::Env;

    fn deref(&self) -> &Self::Target {
        &self.base
    }
}

/// Patterns from text (the flags' syntax).
fn destinations(patterns: &[String]) -> Vec<Destination> {
    patterns.iter().map(|p| p.parse().unwrap_or_else(|e| panic!("{e}"))).collect()
}

/// The environment; `policy` builds the writer's policy from the server's authority.
async fn env(purpose: &str, policy: impl FnOnce(&Server) -> ConnectionPolicy) -> Env {
    let base = crate::support::writer::env(purpose).await;
    let server = server(base.tenant.name()).await;
    let policy = policy(&server);
    // The test servers are on loopback, which tenants may not aim the engine at
    // unless the operator allows it (`writer_credentials_private_api_urls_are_refused`).
    base.writer_for("writer-a", vec![base.tenant.name().to_owned()], |config| {
        config.connection_check = Some(policy);
        config.api_url_allow_private = true;
    });
    Env { base, server }
}

/// The test tier's API server: URL, CA (base64, as in a kubeconfig), whether TLS is
/// unverified, and a token that may list ConfigMaps in `namespace`.
pub(crate) async fn server(namespace: &str) -> Server {
    let cluster = TestCluster::get().await;
    let kubeconfig = kube::config::Kubeconfig::read_from(cluster.kubeconfig_path()).expect("the test kubeconfig");
    let context = kubeconfig.current_context.clone().unwrap_or_default();
    let cluster_name = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .unwrap_or_default();
    let named = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .or_else(|| kubeconfig.clusters.first())
        .and_then(|c| c.cluster.clone())
        .expect("a cluster in the test kubeconfig");
    let url = named.server.clone().expect("the cluster's server URL").trim_end_matches('/').to_owned();
    let ca_data = named.certificate_authority_data.clone().or_else(|| {
        let path = named.certificate_authority.as_ref()?;
        let pem = std::fs::read(path).unwrap_or_else(|error| panic!("read {path}: {error}"));
        // ByteString serialises as base64, as kubeconfig data fields are.
        serde_json::to_value(k8s_openapi::ByteString(pem)).ok()?.as_str().map(str::to_owned)
    });
    let authority =
        url.strip_prefix("https://").expect("an https server").split('/').next().unwrap_or_default().to_owned();
    // Enough for the check's namespaced list, in the environments' one namespace.
    let rules = json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]);
    let token = cluster.namespace_identity(namespace, "connection-check", rules).await.token;
    Server { url, authority, ca_data, insecure: named.insecure_skip_tls_verify.unwrap_or(false), token }
}

/// A port on 127.0.0.1 that nothing listens on.
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

impl Env {
    fn environments(&self) -> Api<GitOpsDeploymentManagedEnvironment> {
        Api::namespaced(self.kube.clone(), self.tenant.name())
    }

    /// A kubeconfig for `server` (the environment's apiURL) with `token`, with or
    /// without the test server's CA.
    fn kubeconfig(&self, server: &str, token: &str, with_ca: bool) -> String {
        let mut cluster = json!({"server": server});
        if let Some(ca) = self.server.ca_data.as_ref().filter(|_| with_ca) {
            cluster["certificate-authority-data"] = json!(ca);
        }
        if self.server.insecure {
            cluster["insecure-skip-tls-verify"] = json!(true);
        }
        json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": cluster}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        })
        .to_string()
    }

    /// A Secret with a kubeconfig using `token`, then an environment at `api_url`.
    async fn create(&self, name: &str, api_url: &str, token: &str) {
        self.create_with(name, api_url, self.kubeconfig(api_url, token, true)).await;
    }

    async fn create_with(&self, name: &str, api_url: &str, kubeconfig: String) {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-kubeconfig")},
            "stringData": {"kubeconfig": kubeconfig},
        }))
        .expect("Secret");
        let patch = PatchParams::apply("writer-connection-test").force();
        Api::<Secret>::namespaced(self.kube.clone(), self.tenant.name())
            .patch(&format!("{name}-kubeconfig"), &patch, &Patch::Apply(&secret))
            .await
            .expect("apply Secret");
        let object: GitOpsDeploymentManagedEnvironment = serde_json::from_value(json!({
            "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeploymentManagedEnvironment",
            "metadata": {"name": name},
            "spec": {"apiURL": api_url, "credentialsSecret": format!("{name}-kubeconfig"),
                     "namespaces": [self.tenant.name()]},
        }))
        .expect("environment");
        self.environments().create(&PostParams::default(), &object).await.expect("create environment");
    }

    /// The connection condition, once the environment is accepted at its generation.
    async fn connection(&self, name: &str) -> Condition {
        eventually("the connection condition", || async {
            let object = self.environments().get_opt(name).await.ok()??;
            let conditions = object.status?.conditions;
            let accepted = conditions.iter().any(|c| {
                c.type_ == CONDITION
                    && c.reason.as_deref() == Some(REASON_ACCEPTED)
                    && c.observed_generation == object.metadata.generation
            });
            let connection = conditions.into_iter().find(|c| c.type_ == CONNECTION_CONDITION)?;
            accepted.then_some(connection)
        })
        .await
    }

    /// Waits for the condition; asserts its status and reason, that the environment
    /// is stored, and that the message carries no token. Returns the message.
    async fn expect(&self, name: &str, status: &str, reason: &str) -> String {
        let condition = self.connection(name).await;
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_deref()),
            (status, Some(reason)),
            "{name}: {condition:?}"
        );
        let message = condition.message.unwrap_or_default();
        assert!(!message.is_empty(), "{name}: a message");
        for secret in [self.server.token.as_str(), BAD_TOKEN] {
            assert!(!message.contains(secret), "{name}: no token in {message:?}");
        }
        let rows: i64 = self
            .client
            .query_one(
                "SELECT count(*) FROM managed_environment WHERE resource_name = $1 AND row_state = 'active'",
                &[&name],
            )
            .await
            .expect("count")
            .get(0);
        assert_eq!(rows, 1, "{name}: the environment is stored whatever the check says");
        message
    }
}

/// Asserts that nothing connected to `listener` (non-blocking accept).
fn assert_not_contacted(listener: &TcpListener) {
    listener.set_nonblocking(true).expect("non-blocking");
    match listener.accept() {
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
        Ok((_, peer)) => panic!("the writer connected from {peer} to a destination it may not contact"),
        Err(error) => panic!("accept: {error}"),
    }
}

#[tokio::test]
async fn writer_connection_allowed_server_answers_and_failures_have_their_reasons() {
    let closed = closed_port();
    let env = env("wconn-allow", |server| {
        ConnectionPolicy::new(destinations(&[server.authority.clone(), format!("127.0.0.1:{closed}")]), vec![])
    })
    .await;
    // A live listener of the test's own, not on the allow list.
    let unlisted = TcpListener::bind("127.0.0.1:0").expect("bind");
    let unlisted_url = format!("https://127.0.0.1:{}", unlisted.local_addr().expect("address").port());
    let url = env.server.url.clone();
    let token = env.server.token.clone();
    env.create("ok", &url, &token).await;
    env.create("bad-token", &url, BAD_TOKEN).await;
    // A token the API server accepts, but that may list nothing: /version answers
    // anyone, the namespaced list is what proves the credentials.
    let nobody = TestCluster::get().await.namespace_identity(env.tenant.name(), "nobody", json!([])).await;
    env.create("no-rights", &url, &nobody.token).await;
    env.create("closed", &format!("https://127.0.0.1:{closed}"), &token).await;
    if !env.server.insecure {
        // Without the CA, the server's certificate is not trusted.
        env.create_with("no-ca", &url, env.kubeconfig(&url, &token, false)).await;
    }
    env.create("unlisted", "https://cluster.example.invalid:6443", &token).await;
    env.create("unlisted-local", &unlisted_url, &token).await;

    env.expect("ok", "True", REASON_SUCCEEDED).await;
    let refused = env.expect("bad-token", "False", REASON_UNAUTHORIZED).await;
    assert!(refused.contains("401"), "{refused}");
    let forbidden = env.expect("no-rights", "False", REASON_UNAUTHORIZED).await;
    assert!(forbidden.contains("403") && forbidden.contains("ConfigMaps"), "{forbidden}");
    assert!(!forbidden.contains(&nobody.token), "no token in {forbidden}");
    let closed = env.expect("closed", "False", REASON_CONNECTION_FAILED).await;
    assert!(closed.contains("refused the connection"), "{closed}");
    if !env.server.insecure {
        let untrusted = env.expect("no-ca", "False", REASON_CONNECTION_FAILED).await;
        assert!(untrusted.contains("TLS"), "{untrusted}");
    }
    let denied = env.expect("unlisted", "False", REASON_CONNECTION_CHECK_DENIED).await;
    assert!(denied.contains("not on the writer's connection-check allow list"), "{denied}");
    env.expect("unlisted-local", "False", REASON_CONNECTION_CHECK_DENIED).await;
    assert_not_contacted(&unlisted);
}

#[tokio::test]
async fn writer_connection_deny_list_wins_and_nothing_is_contacted() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let local = format!("127.0.0.1:{}", listener.local_addr().expect("address").port());
    let env = env("wconn-deny", |server| {
        // Both are allowed, and denied too: the deny list wins.
        let both = [server.authority.clone(), local.clone()];
        ConnectionPolicy::new(destinations(&both), destinations(&both))
    })
    .await;
    let (url, token) = (env.server.url.clone(), env.server.token.clone());
    env.create("denied", &url, &token).await;
    env.create("denied-local", &format!("https://{local}"), &token).await;
    let message = env.expect("denied", "False", REASON_CONNECTION_CHECK_DENIED).await;
    assert!(message.contains("deny list"), "{message}");
    env.expect("denied-local", "False", REASON_CONNECTION_CHECK_DENIED).await;
    assert_not_contacted(&listener);
}

#[tokio::test]
async fn writer_connection_check_without_allow_list_contacts_nothing() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let local = format!("https://127.0.0.1:{}", listener.local_addr().expect("address").port());
    let env = env("wconn-empty", |_| ConnectionPolicy::new(vec![], vec![])).await;
    let (url, token) = (env.server.url.clone(), env.server.token.clone());
    env.create("server", &url, &token).await;
    env.create("local", &local, &token).await;
    let message = env.expect("server", "False", REASON_CONNECTION_CHECK_DENIED).await;
    assert!(message.contains("allow list is empty"), "{message}");
    env.expect("local", "False", REASON_CONNECTION_CHECK_DENIED).await;
    assert_not_contacted(&listener);
}

#[tokio::test]
async fn writer_connection_a_name_is_checked_by_the_addresses_it_resolves_to() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let env = env("wconn-named", |server| {
        let server_port = server.authority.rsplit(':').next().unwrap_or_default().to_owned();
        // Names only: `localhost` resolves to loopback, which no address entry names
        // for the listener; the server's port also gets its loopback addresses.
        ConnectionPolicy::new(
            destinations(&[
                format!("localhost:{port}"),
                format!("localhost:{server_port}"),
                format!("127.0.0.0/8:{server_port}"),
                format!("[::1]:{server_port}"),
            ]),
            vec![],
        )
    })
    .await;
    let token = env.server.token.clone();
    let server_port = env.server.authority.rsplit(':').next().unwrap_or_default().to_owned();
    env.create("by-name", &format!("https://localhost:{port}"), &token).await;
    let message = env.expect("by-name", "False", REASON_CONNECTION_CHECK_DENIED).await;
    assert!(message.contains("loopback"), "{message}");
    assert_not_contacted(&listener);
    // Allowed by name and by address: the check connects to the checked address
    // (with the name as the TLS server name) and succeeds.
    if !env.server.insecure {
        let url = format!("https://localhost:{server_port}");
        env.create_with("named-server", &url, env.kubeconfig(&url, &token, true)).await;
        env.expect("named-server", "True", REASON_SUCCEEDED).await;
    }
}
