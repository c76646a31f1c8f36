//! The whole agent (`run_agent`, as the binary runs it) against PostgreSQL and the
//! Argo CD stand-in on the test tier's API server: status flows back into
//! `application_state`, drift is put right by the sweep, orphans go and foreign
//! objects stay, the deletion cap and dry-run hold, a restart in the middle of a
//! held sync completes the work once, and the HTTP endpoints answer. Tests wait on
//! the agent's counters and on rows and objects, never on time.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gitops_agent::engine::argocd::application_resource;
use gitops_agent::names::{self, APPLICATION_ID_LABEL, MANAGED_BY_LABEL, MANAGED_BY_VALUE, TENANT_ID_LABEL};
use gitops_agent::{AgentConfig, AgentHandle, run_agent};
use gitops_shared::crypto::SecretBox;
use gitops_shared::db::application::{ApplicationIntent, application_upsert_in_txn};
use gitops_shared::db::engine_instance::engine_instance_add;
use gitops_shared::db::tenant::tenant_upsert_locked_in_txn;
use gitops_shared::model::{EngineInstanceId, ManagedEnvironmentId, ResourceType, SyncType, TenantId};
use gitops_shared::queue::operation_enqueue_in_txn;
use gitops_testkit::TestDb;
use gitops_testkit::argocd::{
    self, COMPARISON_ERROR_KNOB, HEALTH_KNOB, SYNC_KNOB, StandinOptions, app_project_crd, application_crd,
};
use gitops_testkit::cluster::{TestCluster, TestNamespace};
use gitops_testkit::proxy::TcpProxy;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::{
    WATCH_RETURN_DEADLINE, api_server_address, eventually, eventually_within, intent, through_kube_proxy,
};

const INSTANCE: &str = "argocd-1";

struct Env {
    db: TestDb,
    client: Client,
    kube: kube::Client,
    ns: TestNamespace,
    instance: EngineInstanceId,
    tenant: TenantId,
    /// The tenant's home environment (every application row has one).
    home: ManagedEnvironmentId,
    secrets: SecretBox,
    kubeconfig: std::path::PathBuf,
    standin: CancellationToken,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.standin.cancel();
    }
}

/// A running agent.
struct Agent {
    cancel: CancellationToken,
    task: JoinHandle<Result<(), gitops_agent::AgentError>>,
    handle: AgentHandle,
}

impl Agent {
    fn sweeps(&self) -> u64 {
        self.handle.metrics(INSTANCE).sweeps()
    }

    /// Waits until `more` sweeps have finished after now (so at least one started
    /// after the caller's change).
    async fn wait_sweeps(&self, more: u64) {
        let target = self.sweeps() + more;
        eventually("sweeps", || async { (self.sweeps() >= target).then_some(()) }).await;
    }

    /// Cancels the token (SIGTERM's path) and expects a clean exit.
    async fn stop(self) {
        self.cancel.cancel();
        let result = tokio::time::timeout(crate::support::DEADLINE, self.task).await.expect("the agent stops in time");
        result.expect("agent task").expect("a clean exit");
    }
}

async fn env(purpose: &str) -> Env {
    let cluster = TestCluster::get().await;
    cluster.install_crds(vec![application_crd(), app_project_crd()]).await.expect("install the Argo CD CRDs");
    let ns = cluster.namespace(purpose).await;
    let kube = cluster.admin().await;
    let standin = CancellationToken::new();
    tokio::spawn({
        let (kube, name, cancel) = (kube.clone(), ns.name().to_owned(), standin.clone());
        async move { argocd::run(kube, &name, StandinOptions::default(), cancel).await }
    });
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let instance = engine_instance_add(&client, INSTANCE, ns.name(), 1000).await.expect("add instance");
    let txn = client.transaction().await.expect("begin");
    let tenant = tenant_upsert_locked_in_txn(&txn, Uuid::new_v4(), "team-a", Some(instance)).await.expect("tenant").id;
    txn.commit().await.expect("commit");
    let key = SecretBox::generate_key("k1").expect("key");
    let secrets = SecretBox::from_config(Some(&key), Some("k1")).expect("secrets");
    let home = crate::support::home_environment(&mut client, &secrets, instance, tenant, "team-a").await;
    // The agent acts with an identity that may touch only its Argo CD namespace.
    let kubeconfig =
        cluster.namespace_identity(ns.name(), "gitops-agent", crate::support::agent_rbac_rules()).await.kubeconfig;
    Env { db, client, kube, ns, instance, tenant, home, secrets, kubeconfig, standin }
}

impl Env {
    fn config(&self) -> AgentConfig {
        let mut config = AgentConfig::new(self.db.url(), INSTANCE.into(), self.secrets.clone());
        config.kubeconfig = Some(self.kubeconfig.clone());
        config.metrics_address = "127.0.0.1:0".parse().expect("address");
        config.sweep.interval = Duration::from_millis(300);
        config.lease = Duration::from_secs(20);
        config.poll_interval = Duration::from_secs(1);
        config.concurrency = 4;
        config
    }

    fn start(&self, config: AgentConfig) -> Agent {
        let cancel = CancellationToken::new();
        let handle = config.handle.clone();
        let task = tokio::spawn(run_agent(config, cancel.clone()));
        Agent { cancel, task, handle }
    }

    fn apps(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.kube.clone(), self.ns.name(), &application_resource())
    }

    /// A manual application row with its operation, as the writer writes it.
    async fn application(&mut self) -> (i64, String) {
        self.application_with(|_| {}).await
    }

    /// [`Env::application`], its intent changed by `change` first.
    async fn application_with(&mut self, change: impl FnOnce(&mut ApplicationIntent)) -> (i64, String) {
        let uid = Uuid::new_v4();
        let mut intent = intent(uid, 1);
        intent.sync_type = SyncType::Manual;
        intent.managed_environment_id = Some(self.home);
        change(&mut intent);
        let txn = self.client.transaction().await.expect("begin");
        let id = application_upsert_in_txn(&txn, self.tenant, &intent).await.expect("upsert").expect("new row").0;
        operation_enqueue_in_txn(&txn, self.instance, self.tenant, ResourceType::Application, id)
            .await
            .expect("enqueue");
        txn.commit().await.expect("commit");
        (id, names::application_name(uid))
    }

    async fn object(&self, name: &str) -> Option<DynamicObject> {
        self.apps().get_opt(name).await.expect("read Application")
    }

    async fn wait_object(&self, name: &str, what: &str, check: impl Fn(&DynamicObject) -> bool) -> DynamicObject {
        eventually(what, || async { self.object(name).await.filter(|o| check(o)) }).await
    }

    async fn annotate(&self, name: &str, key: &str, value: Option<&str>) {
        let patch = json!({"metadata": {"annotations": {key: value}}});
        self.apps().patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("annotate");
    }

    /// An Application the agent did not make, in its namespace.
    async fn create_app(&self, name: &str, labels: BTreeMap<String, String>) {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "project": "default",
                "source": {"repoURL": "https://git.example.invalid/x.git", "path": "p", "targetRevision": "HEAD"},
                "destination": {"server": "https://cluster.example.invalid", "namespace": "x"},
            },
        }))
        .expect("Application");
        self.apps().create(&PostParams::default(), &object).await.expect("create Application");
    }

    /// `(seq, sync, health, conditions)` of the application's state row.
    async fn state(&self, id: i64) -> Option<(i64, Option<String>, Option<String>, Value)> {
        let row = self
            .client
            .query_opt(
                "SELECT seq, sync_status, health_status, conditions FROM application_state WHERE application_id = $1",
                &[&id],
            )
            .await
            .expect("read state")?;
        Some((row.get(0), row.get(1), row.get(2), row.get(3)))
    }
}

fn owned_labels(id: i64, tenant: TenantId) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned()),
        (APPLICATION_ID_LABEL.to_owned(), id.to_string()),
        (TENANT_ID_LABEL.to_owned(), tenant.0.to_string()),
    ])
}

/// `(state, synced_revision)` of a sync operation row.
async fn sync_state(client: &Client, id: i64) -> (String, Option<String>) {
    let row = client
        .query_one("SELECT state::text, synced_revision FROM sync_operation WHERE id = $1", &[&id])
        .await
        .expect("sync state");
    (row.get(0), row.get(1))
}

/// A minimal HTTP/1.1 GET: (status code, body).
async fn get(address: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect to the agent");
    let request = format!("GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("a status line");
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn agent_status_flows_into_application_state_with_increasing_seq() {
    let mut env = env("agent-status").await;
    let agent = env.start(env.config());
    let (id, name) = env.application().await;

    // A manual Application never synced: OutOfSync, as Argo CD reports it.
    let (first, ..) = eventually("OutOfSync and Healthy recorded", || async {
        env.state(id)
            .await
            .filter(|(_, sync, health, _)| sync.as_deref() == Some("OutOfSync") && health.as_deref() == Some("Healthy"))
    })
    .await;

    env.annotate(&name, HEALTH_KNOB, Some("Degraded")).await;
    let (second, ..) = eventually("Degraded recorded", || async {
        env.state(id).await.filter(|(_, _, health, _)| health.as_deref() == Some("Degraded"))
    })
    .await;
    assert!(second > first, "a change takes a new sequence number: {first} then {second}");

    env.annotate(&name, COMPARISON_ERROR_KNOB, Some("repository not found")).await;
    let (third, sync, ..) = eventually("ComparisonError recorded", || async {
        env.state(id).await.filter(|(_, sync, _, conditions)| {
            sync.as_deref() == Some("Unknown")
                && conditions.as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "ComparisonError"))
        })
    })
    .await;
    assert!(third > second, "{second} then {third}");
    assert_eq!(sync.as_deref(), Some("Unknown"));

    // Nothing changes any more: sweeps re-apply the Application and the stand-in
    // re-reports, but no row is written (the sequence number stays).
    agent.wait_sweeps(3).await;
    assert_eq!(env.state(id).await.expect("state").0, third, "unchanged status is not written again");
    agent.stop().await;
}

/// `url` with its host and port replaced by the proxy's on 127.0.0.1.
fn through_proxy(url: &str, proxy: &TcpProxy) -> String {
    let config: tokio_postgres::Config = url.parse().expect("a database URL");
    let user = config.get_user().unwrap_or("postgres");
    let database = config.get_dbname().unwrap_or("postgres");
    let password = config.get_password().map(|p| format!(":{}", String::from_utf8_lossy(p))).unwrap_or_default();
    format!("postgres://{user}{password}@127.0.0.1:{}/{database}", proxy.port())
}

/// The database address of `url` (the test server listens on loopback).
fn database_address(url: &str) -> std::net::SocketAddr {
    let config: tokio_postgres::Config = url.parse().expect("a database URL");
    let port = config.get_ports().first().copied().unwrap_or(5432);
    match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => {
            let ip: std::net::IpAddr = host.parse().expect("the test server is addressed by IP");
            std::net::SocketAddr::new(ip, port)
        }
        other => panic!("the test server is not reached over TCP: {other:?}"),
    }
}

#[tokio::test]
async fn agent_status_observed_while_the_database_is_away_is_recorded_when_it_returns() {
    let mut env = env("ar-outage").await;
    let proxy = TcpProxy::start(database_address(&env.db.url())).await.expect("start the proxy");
    let mut config = env.config();
    config.database_url = through_proxy(&env.db.url(), &proxy).into();
    // One sweep at start only: a later one would re-apply the Application and make
    // Argo CD report it again, hiding a dropped observation.
    config.sweep.interval = Duration::from_secs(3600);
    let agent = env.start(config);
    let (id, name) = env.application().await;
    eventually("Healthy recorded", || async {
        env.state(id).await.filter(|(_, _, health, _)| health.as_deref() == Some("Healthy"))
    })
    .await;

    proxy.cut();
    let errors = agent.handle.metrics(INSTANCE).status_errors.load(Ordering::Relaxed);
    env.annotate(&name, HEALTH_KNOB, Some("Degraded")).await;
    eventually("the status write failing", || async {
        (agent.handle.metrics(INSTANCE).status_errors.load(Ordering::Relaxed) > errors).then_some(())
    })
    .await;
    assert_ne!(env.state(id).await.expect("state").2.as_deref(), Some("Degraded"), "not written while away");

    proxy.restore();
    eventually("Degraded recorded once the database is back", || async {
        env.state(id).await.filter(|(_, _, health, _)| health.as_deref() == Some("Degraded"))
    })
    .await;
    agent.stop().await;
}

#[tokio::test]
async fn agent_that_cannot_reach_argocd_is_not_ready_and_catches_up_when_it_can_again() {
    let mut env = env("ar-reach").await;
    let mut config = env.config();
    config.heartbeat_interval = Duration::from_millis(200);
    // No sweep after the first: its enqueue would bring the backed-off change forward too.
    config.sweep.interval = Duration::from_secs(3600);
    let agent = env.start(config);
    let metrics = agent.handle.metrics(INSTANCE);
    let address = eventually("the HTTP address", || async { agent.handle.http_address() }).await;
    eventually("ready", || async { (get(address, "/readyz").await.0 == 200).then_some(()) }).await;

    // The agent's access to its Argo CD namespace goes away.
    let binding = crate::support::revoke_agent_access(&env.kube, env.ns.name()).await;
    let body = eventually("not ready", || async {
        let (status, body) = get(address, "/readyz").await;
        (status == 503).then_some(body)
    })
    .await;
    assert!(body.contains("argocd_reachable=false"), "{body}");
    let beats = metrics.heartbeats.load(Ordering::Relaxed);
    let probes = metrics.argocd_probes.load(Ordering::Relaxed);
    eventually("two more probes", || async {
        (metrics.argocd_probes.load(Ordering::Relaxed) >= probes + 2).then_some(())
    })
    .await;
    assert_eq!(metrics.heartbeats.load(Ordering::Relaxed), beats, "no heartbeat while Argo CD does not answer");

    // A change meanwhile fails for the instance's sake and backs off (here: an hour).
    let (id, name) = env.application().await;
    eventually("the operation backed off", || async {
        let backed_off = env
            .client
            .execute(
                "UPDATE operation SET run_after = now() + interval '1 hour'
                  WHERE resource_type = 'application' AND resource_id = $1 AND state = 'waiting' AND attempts > 0",
                &[&id],
            )
            .await
            .ok()?;
        (backed_off == 1).then_some(())
    })
    .await;
    let message: String = env
        .client
        .query_one(
            "SELECT tenant_message FROM operation WHERE resource_type = 'application' AND resource_id = $1",
            &[&id],
        )
        .await
        .expect("row")
        .get(0);
    assert!(message.contains("unavailable"), "the tenant reads why: {message}");

    // Access comes back: ready again, and the backed-off change is made at once.
    crate::support::restore_agent_access(&env.kube, env.ns.name(), binding).await;
    eventually("ready again", || async { (get(address, "/readyz").await.0 == 200).then_some(()) }).await;
    env.wait_object(&name, "the Application made without waiting out the backoff", |_| true).await;
    agent.stop().await;
}

#[tokio::test]
async fn agent_sweep_does_not_retry_a_generation_argo_cd_refused_but_tries_the_next() {
    let mut env = env("ar-stalled").await;
    let agent = env.start(env.config());
    // Aimed at a reserved namespace of the home cluster: refused for good.
    let (id, name) = env.application_with(|intent| intent.destination_namespace = "kube-system".into()).await;
    let operations = |state: &'static str| {
        let client = &env.client;
        async move {
            let row = client
                .query_one(
                    "SELECT count(*) AS n FROM operation_log
                      WHERE resource_type = 'application' AND resource_id = $1 AND state::text = $2",
                    &[&id, &state],
                )
                .await
                .expect("count");
            row.get::<_, i64>("n")
        }
    };
    eventually("the refusal dead-lettered", || async { (operations("failed").await == 1).then_some(()) }).await;
    let stalled: bool = env
        .client
        .query_one("SELECT agent_stalled FROM application_state WHERE application_id = $1", &[&id])
        .await
        .expect("state")
        .get(0);
    assert!(stalled, "the tenant's resource reads Stalled");
    // A sweep planned before the failure was recorded may have tried once more;
    // from the next one on, the refused generation is left alone.
    agent.wait_sweeps(1).await;
    eventually("no attempt in flight", || async {
        (operations("waiting").await + operations("claimed").await == 0).then_some(())
    })
    .await;
    let failed = operations("failed").await;
    agent.wait_sweeps(3).await;
    let retried = operations("waiting").await + operations("claimed").await + operations("completed").await;
    assert_eq!((retried, operations("failed").await), (0, failed), "the sweep left the refused generation alone");

    // The tenant fixes it: a new generation is tried, and made.
    env.client
        .execute("UPDATE application SET generation = 2, destination_namespace = 'team-a' WHERE id = $1", &[&id])
        .await
        .expect("a new generation");
    env.wait_object(&name, "the Application of the next generation", |_| true).await;
    agent.stop().await;
}

#[tokio::test]
async fn agent_sweep_restores_drift_removes_orphans_and_leaves_foreign_objects() {
    let mut env = env("agent-drift").await;
    let agent = env.start(env.config());
    let (id, name) = env.application().await;
    let original = env.wait_object(&name, "the Application", |_| true).await;

    // Deleted behind the agent's back: back, as a new object.
    env.apps().delete(&name, &DeleteParams::default()).await.expect("delete");
    let old_uid = original.metadata.uid.clone();
    env.wait_object(&name, "the Application restored", |o| o.metadata.uid != old_uid).await;

    // Edited behind the agent's back: put right.
    let edit = json!({"spec": {"source": {"path": "tampered"}}});
    env.apps().patch(&name, &PatchParams::default(), &Patch::Merge(&edit)).await.expect("edit");
    env.wait_object(&name, "the edit undone", |o| o.data["spec"]["source"]["path"] == "deploy/app").await;

    // An orphan (our labels, no row) goes; a foreign look-alike stays.
    let orphan = names::application_name(Uuid::new_v4());
    env.create_app(&orphan, owned_labels(id + 1000, env.tenant)).await;
    let foreign = names::application_name(Uuid::new_v4());
    let mut foreign_labels = owned_labels(id + 2000, env.tenant);
    foreign_labels.insert(MANAGED_BY_LABEL.to_owned(), "someone-else".to_owned());
    env.create_app(&foreign, foreign_labels).await;
    eventually("the orphan deleted", || async { env.object(&orphan).await.is_none().then_some(()) }).await;
    agent.wait_sweeps(2).await;
    assert!(env.object(&foreign).await.is_some(), "a foreign object is never touched");
    assert!(env.object(&name).await.is_some(), "the owned Application stays");
    assert!(agent.handle.metrics(INSTANCE).sweep_deletions_enqueued.load(Ordering::Relaxed) >= 1);
    agent.stop().await;
}

#[tokio::test]
async fn agent_sweep_deletion_cap_and_dry_run_hold() {
    let mut env = env("agent-cap").await;
    let orphans: Vec<String> = (0..2).map(|_| names::application_name(Uuid::new_v4())).collect();
    for (i, orphan) in orphans.iter().enumerate() {
        env.create_app(orphan, owned_labels(9000 + i as i64, env.tenant)).await;
    }

    // A cap of 1 with two orphans: the sweep refuses both.
    let mut config = env.config();
    config.sweep.max_deletions = 1;
    let agent = env.start(config);
    agent.wait_sweeps(3).await;
    assert!(agent.handle.metrics(INSTANCE).sweep_deletions_refused.load(Ordering::Relaxed) >= 2);
    assert_eq!(agent.handle.metrics(INSTANCE).sweep_deletions_enqueued.load(Ordering::Relaxed), 0);
    for orphan in &orphans {
        assert!(env.object(orphan).await.is_some(), "nothing beyond the cap is deleted");
    }
    let metrics = get(agent.handle.http_address().expect("bound"), "/metrics").await.1;
    assert!(metrics.contains("gitops_agent_sweep_deletions_refused_total"), "{metrics}");
    agent.stop().await;

    // Dry run: reported, nothing enqueued, nothing deleted.
    let mut config = env.config();
    config.sweep.dry_run = true;
    let agent = env.start(config);
    let (_, name) = env.application().await;
    agent.wait_sweeps(3).await;
    assert!(agent.handle.metrics(INSTANCE).sweep_dry_run_skipped.load(Ordering::Relaxed) >= 2);
    let queued: i64 = env
        .client
        .query_one("SELECT count(*) FROM operation_log WHERE resource_id >= 9000", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(queued, 0, "a dry run enqueues nothing");
    for orphan in &orphans {
        assert!(env.object(orphan).await.is_some(), "a dry run deletes nothing");
    }
    // The writer's own operation is still handled in dry-run mode.
    env.wait_object(&name, "the Application", |_| true).await;
    agent.stop().await;
}

#[tokio::test]
async fn agent_restart_during_a_held_sync_completes_it_once() {
    let mut env = env("agent-restart").await;
    let agent = env.start(env.config());
    let (id, name) = env.application().await;
    env.wait_object(&name, "the Application", |_| true).await;
    env.annotate(&name, SYNC_KNOB, Some("hold")).await;

    let row = env
        .client
        .query_one(
            "INSERT INTO sync_operation (tenant_id, resource_uid, resource_name, generation, deployment_name,
                                         application_id, revision)
             VALUES ($1, $2, 'run-1', 1, 'app', $3, 'v2') RETURNING id, correlation_id",
            &[&env.tenant.0, &Uuid::new_v4(), &id],
        )
        .await
        .expect("sync row");
    let sync_id: i64 = row.get(0);
    let txn = env.client.transaction().await.expect("begin");
    operation_enqueue_in_txn(&txn, env.instance, env.tenant, ResourceType::SyncOperation, sync_id)
        .await
        .expect("enqueue");
    txn.commit().await.expect("commit");

    env.wait_object(&name, "a held, running sync", |o| o.data["status"]["operationState"]["phase"] == "Running").await;
    eventually("the sync recorded running", || async {
        (sync_state(&env.client, sync_id).await.0 == "running").then_some(())
    })
    .await;

    // Stop the agent while the sync is held, release it while the agent is away.
    agent.stop().await;
    env.annotate(&name, SYNC_KNOB, None).await;
    env.wait_object(&name, "the sync finished", |o| o.data["status"]["operationState"]["phase"] == "Succeeded").await;

    let agent = env.start(env.config());
    let (state, revision) = eventually("the sync recorded succeeded", || async {
        let (state, revision) = sync_state(&env.client, sync_id).await;
        (state == "succeeded").then_some((state, revision))
    })
    .await;
    assert_eq!(state, "succeeded");
    assert_eq!(
        revision.as_deref(),
        Some(argocd::fake_revision("https://git.example.invalid/team/repo.git", "deploy/app", "v2").as_str())
    );
    agent.wait_sweeps(2).await;
    let object = env.object(&name).await.expect("Application");
    let history = object.data["status"]["history"].as_array().cloned().unwrap_or_default();
    let ours: Vec<_> = history
        .iter()
        .filter(|h| h["revision"] == revision.clone().map(Value::String).unwrap_or(Value::Null))
        .collect();
    assert_eq!(ours.len(), 1, "the sync ran once: {history:?}");
    assert!(object.data.get("operation").is_none(), "no sync requested again");
    let failed: i64 =
        env.client.query_one("SELECT count(*) FROM operation WHERE state = 'failed'", &[]).await.expect("count").get(0);
    assert_eq!(failed, 0);
    agent.stop().await;
}

#[tokio::test]
async fn agent_endpoints_answer_and_cancel_exits_cleanly() {
    let env = env("agent-http").await;
    let agent = env.start(env.config());
    let address = eventually("the HTTP endpoints bound", || async { agent.handle.http_address() }).await;
    assert_eq!(get(address, "/healthz").await, (200, "ok\n".to_owned()));
    eventually("ready", || async { (get(address, "/readyz").await.0 == 200).then_some(()) }).await;
    agent.wait_sweeps(1).await;
    let (status, metrics) = get(address, "/metrics").await;
    assert_eq!(status, 200);
    for name in [
        "gitops_agent_operations_claimed_total{instance=\"argocd-1\",resource_type=\"application\"}",
        "gitops_agent_instances_served 1",
        "gitops_agent_reconcile_duration_seconds_bucket",
        "gitops_agent_claim_lag_seconds_count",
        "gitops_agent_queue_depth",
        "gitops_agent_listen_reconnects_total",
        "gitops_agent_sweep_runs_total",
        "gitops_agent_sweep_deletions_refused_total",
    ] {
        assert!(metrics.contains(name), "{name} missing from:\n{metrics}");
    }
    assert_eq!(get(address, "/nope").await.0, 404);
    agent.stop().await;
    assert!(tokio::net::TcpStream::connect(address).await.is_err(), "the endpoints are gone after shutdown");

    // An unknown instance is refused at start.
    let mut config = env.config();
    config.serve = gitops_agent::Served::Instances(vec!["nope".into()]);
    let refused = run_agent(config, CancellationToken::new()).await;
    assert!(matches!(refused, Err(gitops_agent::AgentError::UnknownInstance { .. })), "{refused:?}");
}

#[tokio::test]
async fn agent_reports_how_its_argocd_tracks_resources() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Patch, PatchParams};

    let env = env("ar-track").await;
    let mut config = env.config();
    config.heartbeat_interval = Duration::from_millis(200);
    let agent = env.start(config);
    let settings = || async {
        let row = env
            .client
            .query_one(
                "SELECT tracking_method, instance_label_key, installation_id FROM engine_instance WHERE id = $1",
                &[&env.instance.0],
            )
            .await
            .ok()?;
        let values: (Option<String>, Option<String>, Option<String>) = (row.get(0), row.get(1), row.get(2));
        Some(values)
    };
    // No argocd-cm: Argo CD's defaults.
    eventually("the defaults recorded", || async {
        let (tracking, label, installation) = settings().await?;
        (tracking.as_deref() == Some("label")
            && label.as_deref() == Some("app.kubernetes.io/instance")
            && installation.as_deref() == Some(""))
        .then_some(())
    })
    .await;
    // The instance's settings change: the agent reports them.
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "argocd-cm"},
        "data": {"application.resourceTrackingMethod": "annotation", "installationID": "prod-a"},
    }))
    .expect("ConfigMap");
    Api::<ConfigMap>::namespaced(env.kube.clone(), env.ns.name())
        .patch("argocd-cm", &PatchParams::apply("agent-run-test").force(), &Patch::Apply(&cm))
        .await
        .expect("apply argocd-cm");
    eventually("the instance's settings recorded", || async {
        let (tracking, _, installation) = settings().await?;
        (tracking.as_deref() == Some("annotation") && installation.as_deref() == Some("prod-a")).then_some(())
    })
    .await;
    agent.stop().await;
}

impl Env {
    /// A sweeper of the test's instance, paging `page_size` objects at a time.
    fn sweeper(&self, page_size: u32) -> gitops_agent::sweep::Sweeper {
        use gitops_agent::engine::argocd::ArgoCdEngine;
        gitops_agent::sweep::Sweeper {
            engine: std::sync::Arc::new(ArgoCdEngine::new(self.kube.clone(), self.ns.name())),
            pool: self.db.pool(2),
            instance: self.instance,
            config: gitops_agent::sweep::SweepConfig {
                interval: Duration::from_secs(3600),
                max_deletions: 50,
                dry_run: false,
                page_size,
            },
            metrics: std::sync::Arc::default(),
            duty: None,
        }
    }

    /// Operation rows by state: (waiting or claimed, all).
    async fn operation_counts(&self) -> (i64, i64) {
        let row = self
            .client
            .query_one(
                "SELECT count(*) FILTER (WHERE state IN ('waiting', 'claimed')) AS busy, count(*) AS all FROM operation",
                &[],
            )
            .await
            .expect("count operations");
        (row.get("busy"), row.get("all"))
    }

    /// `count` applications made by a running agent (its first sweep included),
    /// with nothing left in the queue; the agent is stopped before returning.
    async fn settled_fleet(&mut self, count: usize) -> Vec<(i64, String)> {
        let mut config = self.config();
        config.sweep.interval = Duration::from_secs(3600);
        let agent = self.start(config);
        let mut apps = Vec::new();
        for _ in 0..count {
            apps.push(self.application().await);
        }
        // The start-up sweep, however early it finished: the next one is an hour away.
        eventually("the first sweep", || async { (agent.sweeps() >= 1).then_some(()) }).await;
        for (_, name) in &apps {
            self.wait_object(name, "the Application", |_| true).await;
        }
        eventually("the queue drained", || async { (self.operation_counts().await.0 == 0).then_some(()) }).await;
        agent.stop().await;
        apps
    }

    /// Waiting operations, as (resource type, id), in order.
    async fn waiting(&self) -> Vec<(String, i64)> {
        let rows = self
            .client
            .query(
                "SELECT resource_type::text, resource_id FROM operation WHERE state = 'waiting'
                  ORDER BY resource_type, resource_id",
                &[],
            )
            .await
            .expect("waiting operations");
        rows.iter().map(|row| (row.get(0), row.get(1))).collect()
    }
}

#[tokio::test]
async fn agent_sweep_of_an_unchanged_fleet_enqueues_nothing() {
    let mut env = env("ar-unchanged").await;
    let apps = env.settled_fleet(12).await;
    let (_, before) = env.operation_counts().await;
    // Pages of 5: the Applications take three, the project and the cluster Secret one each.
    let plan = env.sweeper(5).sweep_once().await.expect("sweep");
    assert_eq!(plan.listed, apps.len() + 2, "every object listed: {plan:?}");
    assert!(
        plan.deletions.is_empty() && plan.restores.is_empty() && plan.resyncs.is_empty() && plan.refused == 0,
        "nothing differs: {plan:?}"
    );
    assert_eq!(env.operation_counts().await, (0, before), "nothing enqueued");
}

#[tokio::test]
async fn agent_sweep_enqueues_a_drifted_a_missing_an_older_and_an_orphaned_object() {
    let mut env = env("ar-drifted").await;
    let apps = env.settled_fleet(5).await;
    let (edited, deleted, older) = (&apps[0], &apps[1], &apps[2]);

    // Edited behind the agent's back.
    let edit = json!({"spec": {"source": {"path": "tampered"}}});
    env.apps().patch(&edited.1, &PatchParams::default(), &Patch::Merge(&edit)).await.expect("edit");
    // Deleted behind its back (the stand-in lets it go once it pruned).
    env.apps().delete(&deleted.1, &DeleteParams::default()).await.expect("delete");
    eventually("the Application gone", || async { env.object(&deleted.1).await.is_none().then_some(()) }).await;
    // Its row moved on, and the operation that should have followed was lost.
    env.client.execute("UPDATE application SET generation = 2 WHERE id = $1", &[&older.0]).await.expect("generation");
    // Ours by its labels, with no row.
    let orphan_id = apps.iter().map(|(id, _)| id).max().expect("apps") + 1000;
    env.create_app(&names::application_name(Uuid::new_v4()), owned_labels(orphan_id, env.tenant)).await;

    let plan = env.sweeper(2).sweep_once().await.expect("sweep");
    let ids = |targets: &[gitops_agent::sweep::Target]| targets.iter().map(|t| t.resource_id).collect::<Vec<_>>();
    let mut resyncs = vec![edited.0, older.0];
    resyncs.sort();
    assert_eq!(ids(&plan.resyncs), resyncs, "the edited and the older object: {plan:?}");
    assert_eq!(ids(&plan.restores), vec![deleted.0], "the missing object: {plan:?}");
    assert_eq!(ids(&plan.deletions), vec![orphan_id], "the orphan: {plan:?}");
    let mut expected: Vec<(String, i64)> =
        [edited.0, deleted.0, older.0, orphan_id].iter().map(|id| ("application".to_owned(), *id)).collect();
    expected.sort();
    assert_eq!(env.waiting().await, expected, "exactly those enqueued");

    // The agent puts them right, and the next sweep finds nothing.
    let agent = env.start(env.config());
    env.wait_object(&edited.1, "the edit undone", |o| o.data["spec"]["source"]["path"] == "deploy/app").await;
    env.wait_object(&deleted.1, "the Application restored", |_| true).await;
    env.wait_object(&older.1, "the next generation applied", |o| {
        o.metadata.annotations.as_ref().and_then(|a| a.get(names::GENERATION_ANNOTATION)).map(String::as_str)
            == Some("2")
    })
    .await;
    eventually("the queue drained", || async { (env.operation_counts().await.0 == 0).then_some(()) }).await;
    agent.stop().await;
    let plan = env.sweeper(2).sweep_once().await.expect("sweep");
    assert!(
        plan.deletions.is_empty() && plan.restores.is_empty() && plan.resyncs.is_empty(),
        "all put right: {plan:?}"
    );
}

#[tokio::test]
async fn agent_status_watch_survives_410_gone_and_acts_on_what_changed_in_the_gap() {
    let mut env = env("ar-relist").await;
    let proxy = TcpProxy::start(api_server_address(&env.kubeconfig)).await.expect("start the proxy");
    let mut config = env.config();
    let proxied = through_kube_proxy(&env.kubeconfig, &proxy);
    config.kubeconfig = Some(proxied.clone());
    let agent = env.start(config);
    let (changed, changed_name) = env.application().await;
    let (deleted, deleted_name) = env.application().await;
    for id in [changed, deleted] {
        eventually("status recorded", || async {
            env.state(id).await.filter(|(_, _, health, _)| health.as_deref() == Some("Healthy"))
        })
        .await;
    }
    // Someone else's Application, written to while the agent is away.
    env.create_app("filler", BTreeMap::new()).await;
    let relists = || agent.handle.metrics(INSTANCE).status_relists.load(Ordering::Relaxed);
    let relists_before = relists();
    let original_uid = env.object(&deleted_name).await.expect("the Application").metadata.uid;

    // The agent loses the API server; meanwhile one Application changes and one goes.
    proxy.cut();
    let since =
        env.apps().list_metadata(&ListParams::default().limit(1)).await.expect("list").metadata.resource_version;
    env.annotate(&changed_name, HEALTH_KNOB, Some("Degraded")).await;
    env.wait_object(&changed_name, "Argo CD reports it Degraded", |o| {
        o.data["status"]["health"]["status"] == "Degraded"
    })
    .await;
    env.apps().delete(&deleted_name, &DeleteParams::default()).await.expect("delete");
    eventually("the Application gone", || async { env.object(&deleted_name).await.is_none().then_some(()) }).await;
    // The API server's history moves past where the agent's watch stopped, so the
    // watch resumes into 410 Gone.
    let loss = TestCluster::get()
        .await
        .lose_history(&env.apps(), &since.expect("a resourceVersion"), |n| {
            let n = n.to_string();
            let env = &env;
            async move { env.annotate("filler", "gitops-test/write", Some(&n)).await }
        })
        .await;
    proxy.restore();

    eventually_within(WATCH_RETURN_DEADLINE, "the change recorded", || async {
        env.state(changed).await.filter(|(_, _, health, _)| health.as_deref() == Some("Degraded"))
    })
    .await;
    env.wait_object(&deleted_name, "the deleted Application restored", |o| o.metadata.uid != original_uid).await;
    eventually_within(WATCH_RETURN_DEADLINE, &format!("the watch relisted after 410 ({loss:?})"), || async {
        (relists() > relists_before).then_some(())
    })
    .await;
    assert!(!agent.task.is_finished(), "the agent kept running through the gap");
    assert!(env.object("filler").await.is_some(), "someone else's Application stays");
    agent.stop().await;
    let _ = std::fs::remove_file(proxied);
}
