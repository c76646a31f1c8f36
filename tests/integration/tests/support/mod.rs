//! Fixtures shared by the tests: an engine instance, tenants, intents and their
//! operations, and waiting on conditions with deadlines (never on time alone).

pub mod children;
pub mod shard;
pub mod writer;

use std::future::Future;
use std::time::{Duration, Instant};

use gitops_shared::db::application::{ApplicationIntent, application_upsert_in_txn};
use gitops_shared::db::engine_instance::engine_instance_add;
use gitops_shared::db::tenant::tenant_upsert_locked_in_txn;
use gitops_shared::model::{EngineInstanceId, OperationState, ResourceType, SyncType, TenantId};
use gitops_shared::queue::{Enqueued, operation_enqueue_in_txn};
use tokio_postgres::Client;
use uuid::Uuid;

/// How long a condition may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Polls `check` until it returns Some or `DEADLINE` passes (then panics with `what`).
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(DEADLINE, what, check).await
}

/// How long a watch may take to come back after a long loss of the API server:
/// kube's watcher backs off up to 30 s between failed attempts, once while
/// reconnecting and once more after the 410 Gone that sends it to list again.
pub const WATCH_RETURN_DEADLINE: Duration = Duration::from_secs(150);

/// [`eventually`] with a deadline of its own.
pub async fn eventually_within<T, F, Fut>(deadline: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + deadline;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One engine instance and one tenant on it.
pub struct Fixture {
    pub instance: EngineInstanceId,
    pub tenant: TenantId,
}

pub async fn fixture(client: &mut Client) -> Fixture {
    let instance = engine_instance_add(client, "argocd-1", "argocd", 1000).await.expect("add instance");
    let tenant = new_tenant(client, instance).await;
    Fixture { instance, tenant }
}

pub async fn new_tenant(client: &mut Client, instance: EngineInstanceId) -> TenantId {
    let txn = client.transaction().await.expect("begin");
    let tenant = tenant_upsert_locked_in_txn(&txn, Uuid::new_v4(), "team-a", Some(instance)).await.expect("tenant");
    txn.commit().await.expect("commit");
    tenant.id
}

pub fn intent(uid: Uuid, generation: i64) -> ApplicationIntent {
    ApplicationIntent {
        resource_uid: uid,
        resource_name: format!("app-{}", &uid.simple().to_string()[..8]),
        generation,
        repo_url: "https://git.example.invalid/team/repo.git".into(),
        path: "deploy/app".into(),
        target_revision: "HEAD".into(),
        managed_environment_id: None,
        destination_namespace: "team-a".into(),
        sync_type: SyncType::Automated,
        create_namespace: false,
        wait_for_pruning: false,
    }
}

/// The API URL of the home environments that tests write directly.
pub const HOME_API_URL: &str = "https://home.example.invalid";

/// A home environment for `tenant` with its operation, as the writer makes one for
/// deployments into the tenant's own `namespace` (every application row has an
/// environment; the agent refuses one without).
pub async fn home_environment(
    client: &mut Client,
    secrets: &gitops_shared::crypto::SecretBox,
    instance: EngineInstanceId,
    tenant: TenantId,
    namespace: &str,
) -> gitops_shared::model::ManagedEnvironmentId {
    use gitops_shared::db::credential::{
        ClusterCredentials, ManagedEnvironmentIntent, managed_environment_upsert_in_txn,
    };
    let intent = ManagedEnvironmentIntent {
        resource_uid: Uuid::new_v4(),
        resource_name: namespace.to_owned(),
        generation: 1,
        api_url: HOME_API_URL.into(),
        allow_insecure_skip_tls_verify: false,
        namespaces: vec![namespace.to_owned()],
        cluster_resources: false,
        secret_name: "gitops-service-argocd".into(),
        secret_resource_version: Some("1".into()),
        credentials: ClusterCredentials { bearer_token: Some("home-token".into()), ..Default::default() },
    };
    let txn = client.transaction().await.expect("begin");
    let id = managed_environment_upsert_in_txn(&txn, secrets, tenant, &intent).await.expect("upsert").expect("new");
    txn.execute("UPDATE managed_environment SET home = true WHERE id = $1", &[&id]).await.expect("home");
    operation_enqueue_in_txn(&txn, instance, tenant, ResourceType::ManagedEnvironment, id.0).await.expect("enqueue");
    txn.commit().await.expect("commit");
    id
}

/// Writes a new application intent with its operation, as the writer does.
pub async fn new_application(client: &mut Client, fx: &Fixture) -> i64 {
    let txn = client.transaction().await.expect("begin");
    let id = application_upsert_in_txn(&txn, fx.tenant, &intent(Uuid::new_v4(), 1))
        .await
        .expect("upsert")
        .expect("a new row");
    operation_enqueue_in_txn(&txn, fx.instance, fx.tenant, ResourceType::Application, id.0).await.expect("enqueue");
    txn.commit().await.expect("commit");
    id.0
}

/// Enqueues an operation for an existing application in its own transaction.
pub async fn enqueue(client: &mut Client, fx: &Fixture, application: i64) -> Enqueued {
    let txn = client.transaction().await.expect("begin");
    let outcome = operation_enqueue_in_txn(&txn, fx.instance, fx.tenant, ResourceType::Application, application)
        .await
        .expect("enqueue");
    txn.commit().await.expect("commit");
    outcome
}

/// Counts operations by state.
/// Sessions waiting for an advisory lock (the queue's signal lock) now.
pub async fn waiting_advisory_locks(client: &Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted", &[])
        .await
        .expect("pg_locks")
        .get(0)
}

pub async fn count_in_state(client: &Client, state: OperationState) -> i64 {
    let sql = match state {
        OperationState::Completed | OperationState::Superseded => {
            "SELECT count(*) FROM operation_history WHERE state = $1"
        }
        _ => "SELECT count(*) FROM operation WHERE state = $1",
    };
    client.query_one(sql, &[&state]).await.expect("count").get(0)
}

/// A bare LISTEN connection that reports (channel, payload) of each notification.
pub struct RawListener {
    pub rx: tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
    _client: Client,
}

impl RawListener {
    pub async fn start(url: &str, channel: &str) -> RawListener {
        use futures_util::StreamExt;
        let (client, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let tokio_postgres::AsyncMessage::Notification(n) = message {
                    let _ = tx.send((n.channel().to_owned(), n.payload().to_owned()));
                }
            }
        });
        client.batch_execute(&format!("LISTEN \"{channel}\"")).await.expect("listen");
        RawListener { rx, _client: client }
    }

    /// The next notification's payload (panics after `DEADLINE`).
    pub async fn next_payload(&mut self) -> String {
        tokio::time::timeout(DEADLINE, self.rx.recv())
            .await
            .expect("a notification within the deadline")
            .expect("listener alive")
            .1
    }
}

/// Sends `NOTIFY channel, 'marker'` from its own connection and commits.
pub async fn notify_marker(client: &Client, channel: &str) {
    client.execute("SELECT pg_notify($1, 'marker')", &[&channel]).await.expect("marker");
}

/// A TCP proxy on loopback in front of PostgreSQL that a test can take down: while
/// down it drops new connections at once (open ones are left to the test to end).
pub struct Proxy {
    pub addr: std::net::SocketAddr,
    down: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
}

impl Proxy {
    pub async fn start(target: std::net::SocketAddr) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let down = std::sync::Arc::new(tokio::sync::watch::channel(false).0);
        let state = down.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if *state.borrow() {
                    continue; // dropped: connection refused in effect
                }
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else { return };
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        });
        Proxy { addr, down }
    }

    pub fn set_down(&self, down: bool) {
        self.down.send_replace(down);
    }

    /// `url` with its host and port replaced by the proxy's.
    pub fn url_for(&self, url: &str) -> String {
        let config: tokio_postgres::Config = url.parse().expect("url");
        let port = config.get_ports().first().copied().unwrap_or(5432);
        url.replacen(&format!("127.0.0.1:{port}"), &self.addr.to_string(), 1)
    }
}

/// The server address behind a test database URL.
pub fn server_addr(url: &str) -> std::net::SocketAddr {
    let config: tokio_postgres::Config = url.parse().expect("url");
    let port = config.get_ports().first().copied().unwrap_or(5432);
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

/// What the agent may do, and only in its Argo CD namespace: the RBAC rules the
/// agent tests give it on both Kubernetes tiers (the deploy manifests grant the same).
pub fn agent_rbac_rules() -> serde_json::Value {
    serde_json::json!([
        {"apiGroups": ["argoproj.io"], "resources": ["applications", "appprojects"], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["argocd-cm"], "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["statefulsets"], "resourceNames": ["argocd-application-controller"], "verbs": ["get"]}
    ])
}

/// What the writer may do, cluster-wide (a ClusterRole: its tenants are in every
/// namespace): the tenant resources and their status, the credential Secrets and
/// namespaces it reads; the home ServiceAccounts and their tokens; in each tenant
/// namespace the RoleBinding of the home ClusterRole — which it may bind (`bind`,
/// limited to that role by name) without holding its rights — and the removal of
/// the `*/*` Roles earlier versions made; SubjectAccessReviews for the admission
/// webhook.
/// `ops/deploy/writer-clusterrole.yaml` grants exactly these.
pub fn writer_rbac_rules() -> serde_json::Value {
    let resources = [
        "gitopsdeployments",
        "gitopsdeploymentsyncruns",
        "gitopsdeploymentmanagedenvironments",
        "gitopsdeploymentrepositorycredentials",
    ];
    let status: Vec<String> = resources.iter().map(|r| format!("{r}/status")).collect();
    serde_json::json!([
        {"apiGroups": ["managed-gitops.redhat.com"], "resources": resources, "verbs": ["get", "list", "watch", "patch", "update"]},
        {"apiGroups": ["managed-gitops.redhat.com"], "resources": status, "verbs": ["get", "patch", "update"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["get", "list", "watch", "delete"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["get", "bind"], "resourceNames": ["admin"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["appstudio.redhat.com"], "resources": ["snapshotenvironmentbindings"], "verbs": ["get"]}
    ])
}

/// A Deployment's container: the metrics listener (address from its environment)
/// listens beyond loopback on the port named `metrics`, which both probes use.
pub fn assert_probes_reach_metrics(container: &serde_json::Value, address: Option<&str>) {
    let address = address.expect("a metrics address");
    let port: u16 = address.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).expect("a port");
    assert!(!address.starts_with("127.") && !address.starts_with("[::1]"), "{address} is loopback-only");
    let ports = container["ports"].as_array().expect("ports");
    let metrics = ports.iter().find(|p| p["name"] == "metrics").expect("a metrics port");
    assert_eq!(metrics["containerPort"], u64::from(port));
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["port"], "metrics");
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], "metrics");
}

/// The objects kustomize renders from `ops/deploy/<dir>` (a base, an overlay), by
/// `Kind/name`: what an operator applies, so the tests check that rather than the
/// files it is made of. The renderer is `$GITOPS_KUSTOMIZE` (a command line, e.g.
/// `kustomize build`), else `kubectl kustomize` (its kustomize must be ≥ 3.7, for
/// components); `ops/test` checks that one is there.
pub fn rendered_install(dir: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ops/deploy").join(dir);
    let command = std::env::var("GITOPS_KUSTOMIZE").unwrap_or_else(|_| "kubectl kustomize".to_owned());
    let mut words = command.split_whitespace();
    let program = words.next().expect("GITOPS_KUSTOMIZE names a command");
    let output = std::process::Command::new(program).args(words).arg(&root).output().unwrap_or_else(|e| {
        panic!("run `{command}` ({e}): install kubectl or kustomize ≥ 3.7, or set GITOPS_KUSTOMIZE")
    });
    assert!(
        output.status.success(),
        "`{command} {}` failed: {}",
        root.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("kustomize prints UTF-8");
    let objects: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{dir} renders YAML that does not parse: {e}"));
    let mut by_name = std::collections::BTreeMap::new();
    for object in objects {
        let key = format!(
            "{}/{}",
            object["kind"].as_str().expect("a kind"),
            object["metadata"]["name"].as_str().expect("a name")
        );
        assert!(by_name.insert(key.clone(), object).is_none(), "{dir} renders {key} twice");
    }
    by_name
}

/// Every `protocol/port` a NetworkPolicy's egress rules open, sorted; a rule that
/// opens every port is `any`.
pub fn egress_ports(policy: &serde_json::Value) -> Vec<String> {
    let mut ports = std::collections::BTreeSet::new();
    for rule in policy["egress"].as_array().expect("egress rules") {
        let Some(list) = rule["ports"].as_array() else {
            ports.insert("any".to_owned());
            continue;
        };
        for port in list {
            ports.insert(format!("{}/{}", port["protocol"].as_str().unwrap_or("TCP"), port["port"]));
        }
    }
    ports.into_iter().collect()
}

/// Claims every due operation of `instance`, hands each to `reconciler` and records
/// the outcome as the consumer does (retries come due at once): the agent's work,
/// one round, without its loop.
pub async fn reconcile_due(
    client: &Client,
    instance: EngineInstanceId,
    reconciler: &gitops_agent::reconcile::Reconciler,
) -> Vec<(gitops_shared::model::ResourceType, i64, gitops_shared::queue::Outcome)> {
    use gitops_shared::queue::{Handler, Outcome, RetryPolicy, operation_claim, operation_complete, operation_fail};
    let policy = RetryPolicy { max_attempts: 1000, base: Duration::from_millis(1), cap: Duration::from_millis(1) };
    let ops = operation_claim(client, instance, "test", 100, Duration::from_secs(60)).await.expect("claim");
    let mut outcomes = Vec::new();
    for op in ops {
        let outcome = reconciler.handle(&op).await;
        match &outcome {
            Outcome::Done => {
                operation_complete(client, &[(op.id, op.lease.token())]).await.expect("complete");
            }
            Outcome::Failed(failure) => {
                operation_fail(client, &op, failure, &policy).await.expect("fail");
            }
        }
        outcomes.push((op.resource_type, op.resource_id, outcome));
    }
    outcomes
}

/// What the agent's reconciler tests stand on: the Argo CD stand-in over a namespace
/// of their own, a migrated database with that namespace registered as instance
/// `argocd-1`, encryption keys, and a client acting as the agent may (its
/// `agent_rbac_rules` in that namespace only).
pub struct AgentGround {
    pub db: gitops_testkit::TestDb,
    pub client: Client,
    /// The admin's client.
    pub kube: kube::Client,
    /// The agent's client.
    pub agent_kube: kube::Client,
    pub agent_kubeconfig: std::path::PathBuf,
    pub ns: gitops_testkit::cluster::TestNamespace,
    pub instance: gitops_shared::db::engine_instance::EngineInstance,
    pub secrets: gitops_shared::crypto::SecretBox,
    pub cancel: tokio_util::sync::CancellationToken,
}

pub async fn agent_ground(purpose: &str) -> AgentGround {
    use gitops_testkit::argocd::{self, StandinOptions, app_project_crd, application_crd};
    let cluster = gitops_testkit::cluster::TestCluster::get().await;
    cluster.install_crds(vec![application_crd(), app_project_crd()]).await.expect("install the Argo CD CRDs");
    let ns = cluster.namespace(purpose).await;
    let kube = cluster.admin().await;
    let cancel = tokio_util::sync::CancellationToken::new();
    tokio::spawn({
        let (kube, name, cancel) = (kube.clone(), ns.name().to_owned(), cancel.clone());
        async move { argocd::run(kube, &name, StandinOptions::default(), cancel).await }
    });
    let db = gitops_testkit::TestDb::migrated().await;
    let client = db.connect().await;
    engine_instance_add(&client, "argocd-1", ns.name(), 1000).await.expect("add instance");
    let instance =
        gitops_shared::db::engine_instance::engine_instance_by_name(&client, "argocd-1").await.expect("instance");
    let key = gitops_shared::crypto::SecretBox::generate_key("k1").expect("key");
    let secrets = gitops_shared::crypto::SecretBox::from_config(Some(&key), Some("k1")).expect("secrets");
    // The agent acts with an identity that may touch only its Argo CD namespace.
    let identity = cluster.namespace_identity(ns.name(), "gitops-agent", agent_rbac_rules()).await;
    let agent_kube = cluster.client_with_token(&identity.token).await;
    AgentGround { db, client, kube, agent_kube, agent_kubeconfig: identity.kubeconfig, ns, instance, secrets, cancel }
}

/// A plain HTTP/1.1 GET on loopback: (status code, body).
pub async fn http_get(address: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect to the writer");
    let request = format!("GET {path} HTTP/1.1\r\nHost: writer\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let code = response.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("a status code");
    (code, response.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned())
}

/// Eight random hex characters, to keep object names of one test apart.
pub fn short_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}

/// Takes the agent's rights in `namespace` away: deletes its RoleBinding and returns
/// it for [`restore_agent_access`].
pub async fn revoke_agent_access(kube: &kube::Client, namespace: &str) -> k8s_openapi::api::rbac::v1::RoleBinding {
    let bindings: kube::Api<k8s_openapi::api::rbac::v1::RoleBinding> = kube::Api::namespaced(kube.clone(), namespace);
    let binding = bindings.get("gitops-agent").await.expect("the agent's RoleBinding");
    bindings.delete("gitops-agent", &Default::default()).await.expect("delete the RoleBinding");
    binding
}

/// Gives back what [`revoke_agent_access`] took.
pub async fn restore_agent_access(
    kube: &kube::Client,
    namespace: &str,
    binding: k8s_openapi::api::rbac::v1::RoleBinding,
) {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let bindings: kube::Api<k8s_openapi::api::rbac::v1::RoleBinding> = kube::Api::namespaced(kube.clone(), namespace);
    let metadata = ObjectMeta { name: binding.metadata.name.clone(), ..ObjectMeta::default() };
    let binding = k8s_openapi::api::rbac::v1::RoleBinding { metadata, ..binding };
    bindings.create(&Default::default(), &binding).await.expect("recreate the RoleBinding");
}

/// A manual application row `app` of tenant `tenant` (deploying into `team-a`).
pub async fn application_row(client: &tokio_postgres::Client, tenant: i64) -> i64 {
    client
        .query_one(
            "INSERT INTO application (tenant_id, resource_uid, resource_name, generation, repo_url, path,
                                      destination_namespace, sync_type)
             VALUES ($1, gen_random_uuid(), 'app', 1, 'https://git.example.invalid/r.git', 'p', 'team-a', 'manual')
             RETURNING id",
            &[&tenant],
        )
        .await
        .expect("application")
        .get(0)
}

/// The API server's address in `kubeconfig` (the test tiers listen on loopback).
pub fn api_server_address(kubeconfig: &std::path::Path) -> std::net::SocketAddr {
    let document = kube::config::Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
    let server = document.clusters.first().and_then(|c| c.cluster.as_ref()).and_then(|c| c.server.clone());
    let (host, port) = host_and_port(&server.expect("a server"));
    let ip: std::net::IpAddr = host.trim_start_matches('[').trim_end_matches(']').parse().expect("an IP address");
    std::net::SocketAddr::new(ip, port)
}

/// `https://HOST:PORT/…` → (HOST, PORT).
fn host_and_port(server: &str) -> (String, u16) {
    let authority = server.trim_start_matches("https://").split('/').next().unwrap_or_default();
    let (host, port) = authority.rsplit_once(':').expect("a port");
    (host.to_owned(), port.parse().expect("a port number"))
}

/// `kubeconfig` with its server replaced by `proxy`, written next to it (JSON is YAML).
pub fn through_kube_proxy(kubeconfig: &std::path::Path, proxy: &gitops_testkit::proxy::TcpProxy) -> std::path::PathBuf {
    let mut document = kube::config::Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
    for named in &mut document.clusters {
        if let Some(cluster) = named.cluster.as_mut()
            && let Some(server) = &cluster.server
        {
            let (host, _) = host_and_port(server);
            cluster.server = Some(format!("https://{host}:{}", proxy.port()));
        }
    }
    let path = kubeconfig.with_extension(format!("proxied-{}", proxy.port()));
    std::fs::write(&path, serde_json::to_vec(&document).expect("serialise")).expect("write the kubeconfig");
    path
}

/// The value of the sample `series` (name and labels, exactly) in a Prometheus text body.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .find(|(name, _)| *name == series)
        .and_then(|(_, value)| value.parse().ok())
}
