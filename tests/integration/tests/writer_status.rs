//! The writer's status loop (`run_status_loop`) against PostgreSQL and the test
//! tier's API server: observed state arrives in GitOpsDeployment status, an
//! unchanged row is not patched again, the cursor waits for transactions still in
//! flight, shards this writer does not own are left alone, an object recreated
//! under the same name (another UID) is not patched, and an object that refuses its
//! status holds back no other (it is retried on its own). Shard ownership is
//! claimed directly in SQL; tests wait on rows and objects, never on time.

use std::sync::Arc;

use gitops_shared::crypto::SecretBox;
use gitops_shared::db::application::application_upsert_in_txn;
use gitops_shared::db::engine_instance::engine_instance_add;
use gitops_shared::db::tenant::tenant_upsert_locked_in_txn;
use gitops_shared::listen::Listener;
use gitops_shared::model::{EngineInstanceId, TenantId};
use gitops_shared::signal::Signal;
use gitops_testkit::TestDb;
use gitops_testkit::cluster::{TestCluster, TestNamespace};
use gitops_writer::api::{DeploymentSource, GitOpsDeployment, GitOpsDeploymentSpec, GitOpsDeploymentStatus};
use gitops_writer::context::WriterContext;
use gitops_writer::status::{InFlightSyncs, run_status_loop, scan_shards};
use kube::api::{Api, PostParams};
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::{eventually, intent};

const WRITER: &str = "writer-under-test";
const OWNED: i32 = 7;
const FOREIGN: i32 = 8;

struct Env {
    db: TestDb,
    client: Client,
    ns: TestNamespace,
    kube: kube::Client,
    instance: EngineInstanceId,
    cancel: CancellationToken,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Env {
    async fn start() -> Env {
        let db = TestDb::migrated().await;
        let client = db.connect().await;
        let cluster = TestCluster::get().await;
        cluster.install_crds(gitops_writer::api::crds()).await.expect("install the writer's CRDs");
        let ns = cluster.namespace("status").await;
        let kube = cluster.admin().await;
        let instance = engine_instance_add(&client, "argocd-1", "argocd", 1000).await.expect("add instance");
        client
            .execute(
                "UPDATE writer_shard SET writer_id = $2, lease_expires_at = now() + interval '1 hour' WHERE shard = $1",
                &[&OWNED, &WRITER],
            )
            .await
            .expect("claim the shard");
        client
            .execute(
                "UPDATE writer_shard SET writer_id = 'another-writer', lease_expires_at = now() + interval '1 hour'
                  WHERE shard = $1",
                &[&FOREIGN],
            )
            .await
            .expect("give a shard to another writer");
        Env { db, client, ns, kube, instance, cancel: CancellationToken::new() }
    }

    fn context(&self) -> Arc<WriterContext> {
        self.context_as(self.kube.clone())
    }

    /// A writer context whose Kubernetes calls go out as `kube`.
    fn context_as(&self, kube: kube::Client) -> Arc<WriterContext> {
        let key = SecretBox::generate_key("k1").expect("a key");
        Arc::new(WriterContext {
            pool: self.db.pool(4),
            kube: kube.clone(),
            secrets: SecretBox::from_config(Some(&key), Some("k1")).expect("keys"),
            writer_id: WRITER.to_owned(),
            metrics: Arc::default(),
            connection_check: None,
            repository_check: None,
            api_url_allow_private: false,
            home: Default::default(),
            queue: Default::default(),
            served: gitops_writer::tenancy::ServedNamespaces::new(Default::default()),
            home_status: gitops_writer::controller::HomeStatus::new(),
            allow_unverified_home: false,
            appstudio_identity: None,
            events: Arc::new(gitops_writer::events::TenantEvents::new(kube, WRITER)),
        })
    }

    /// Starts the loop over `shards` (the shard list as the ownership task would
    /// publish it; ownership itself is checked in SQL).
    async fn run_loop(&self, shards: Vec<i32>) {
        self.run_loop_as(shards, self.context()).await;
    }

    async fn run_loop_as(&self, shards: Vec<i32>, ctx: Arc<WriterContext>) {
        let listener = Listener::start(&self.db.url(), &[Signal::status()], self.cancel.clone()).expect("listener");
        let (_tx, rx) = tokio::sync::watch::channel(shards);
        let cancel = self.cancel.clone();
        tokio::spawn(async move {
            let _keep = _tx;
            run_status_loop(ctx, rx, listener, cancel).await.expect("the status loop ends cleanly");
        });
    }

    async fn tenant(&mut self, shard: i32) -> TenantId {
        let txn = self.client.transaction().await.expect("begin");
        let tenant = tenant_upsert_locked_in_txn(&txn, Uuid::new_v4(), self.ns.name(), Some(self.instance))
            .await
            .expect("tenant");
        txn.execute("UPDATE tenant SET writer_shard = $1 WHERE id = $2", &[&shard, &tenant.id.0]).await.expect("shard");
        txn.commit().await.expect("commit");
        tenant.id
    }

    fn deployments(&self) -> Api<GitOpsDeployment> {
        Api::namespaced(self.kube.clone(), self.ns.name())
    }

    /// A GitOpsDeployment object and its application row (keyed by `row_uid`, the
    /// object's own UID unless given).
    async fn deployment(&mut self, tenant: TenantId, name: &str, row_uid: Option<Uuid>) -> i64 {
        let source = DeploymentSource {
            repo_url: "https://git.example.invalid/org/repo.git".into(),
            path: "apps/web".into(),
            target_revision: None,
        };
        let spec = GitOpsDeploymentSpec { source, type_: "automated".into(), ..GitOpsDeploymentSpec::default() };
        let object = self
            .deployments()
            .create(&PostParams::default(), &GitOpsDeployment::new(name, spec))
            .await
            .expect("create");
        let uid = object.metadata.uid.as_deref().and_then(|u| u.parse().ok()).expect("a UID");
        let mut app = intent(row_uid.unwrap_or(uid), 1);
        app.resource_name = name.to_owned();
        let txn = self.client.transaction().await.expect("begin");
        let id = application_upsert_in_txn(&txn, tenant, &app).await.expect("upsert").expect("a new row");
        txn.commit().await.expect("commit");
        id.0
    }

    async fn status(&self, name: &str) -> (Option<GitOpsDeploymentStatus>, String) {
        let object = self.deployments().get(name).await.expect("get");
        (object.status, object.metadata.resource_version.unwrap_or_default())
    }

    async fn cursor(&self, shard: i32) -> i64 {
        self.client
            .query_one("SELECT status_xid::text::bigint FROM writer_shard WHERE shard = $1", &[&shard])
            .await
            .expect("cursor")
            .get(0)
    }

    /// Waits until the cursor has passed transaction `xid`.
    async fn wait_cursor(&self, shard: i32, xid: i64) {
        eventually("the status cursor", || async { (self.cursor(shard).await > xid).then_some(()) }).await;
    }
}

const STATE_UPSERT: &str = "
INSERT INTO application_state (application_id, tenant_id, sync_status, sync_revision, health_status, health_message)
SELECT id, tenant_id, $2, 'abc123', $3, $4 FROM application WHERE id = $1
ON CONFLICT (application_id) DO UPDATE
   SET sync_status = EXCLUDED.sync_status, health_status = EXCLUDED.health_status,
       health_message = EXCLUDED.health_message, updated_at = now()
RETURNING changed_xid::text::bigint";

async fn observe(client: &Client, application: i64, sync: &str, health: &str) -> i64 {
    client.query_one(STATE_UPSERT, &[&application, &sync, &health, &None::<String>]).await.expect("state").get(0)
}

fn sync_of(status: &Option<GitOpsDeploymentStatus>) -> Option<(String, String)> {
    let status = status.as_ref()?;
    Some((status.sync.as_ref()?.status.clone(), status.health.as_ref()?.status.clone()))
}

#[tokio::test]
async fn status_arrives_once_and_only_for_owned_shards_and_matching_objects() {
    let mut env = Env::start().await;
    let mine = env.tenant(OWNED).await;
    let theirs = env.tenant(FOREIGN).await;
    let web = env.deployment(mine, "web", None).await;
    let other = env.deployment(theirs, "other", None).await;
    let stale = env.deployment(mine, "stale", Some(Uuid::new_v4())).await;
    env.run_loop(vec![FOREIGN, OWNED]).await;

    observe(&env.client, other, "Synced", "Healthy").await;
    observe(&env.client, stale, "Synced", "Healthy").await;
    let seq = observe(&env.client, web, "Synced", "Healthy").await;
    let status = eventually("status on web", || async {
        let (status, _) = env.status("web").await;
        sync_of(&status).filter(|s| s.0 == "Synced").map(|_| status)
    })
    .await;
    let status = status.expect("a status");
    assert_eq!(status.sync.and_then(|s| s.revision).as_deref(), Some("abc123"));
    env.wait_cursor(OWNED, seq).await;

    // Unchanged content in a new transaction: read, compared, not patched.
    let (_, version) = env.status("web").await;
    let again: i64 = env
        .client
        .query_one(
            "UPDATE application_state SET updated_at = now() WHERE application_id = $1 RETURNING changed_xid::text::bigint",
            &[&web],
        )
        .await
        .expect("touch")
        .get(0);
    assert!(again > seq);
    env.wait_cursor(OWNED, again).await;
    assert_eq!(env.status("web").await.1, version, "an unchanged status is not patched");

    // A row whose object was recreated (another UID) is passed over, not patched.
    assert_eq!(env.status("stale").await.0, None);
    // Nothing of a shard another writer owns, even when listed.
    assert_eq!(env.status("other").await.0, None);
    assert_eq!(env.cursor(FOREIGN).await, 0);
    let report = scan_shards(&env.context(), &[FOREIGN], &mut InFlightSyncs::default()).await.expect("scan");
    assert_eq!(report.rows, 0, "a shard not owned is not read");
}

#[tokio::test]
async fn the_cursor_waits_for_transactions_in_flight() {
    let mut env = Env::start().await;
    let mine = env.tenant(OWNED).await;
    let early = env.deployment(mine, "early", None).await;
    let late = env.deployment(mine, "late", None).await;
    let first = observe(&env.client, early, "OutOfSync", "Progressing").await;
    env.run_loop(vec![OWNED]).await;
    env.wait_cursor(OWNED, first).await;

    // The interleaving that defeats a sequence-number cursor: a transaction that got
    // its id first commits a higher sequence number while a younger one, which took
    // a lower sequence number, is still open.
    let mut older = env.db.connect().await;
    let older_txn = older.transaction().await.expect("begin");
    older_txn.query_one("SELECT pg_current_xact_id()", &[]).await.expect("take an xid");
    let mut holder = env.db.connect().await;
    let txn = holder.transaction().await.expect("begin");
    let held: i64 =
        txn.query_one(STATE_UPSERT, &[&early, &"Synced", &"Degraded", &Some("boom")]).await.expect("held").get(0);
    let held_seq: i64 = txn
        .query_one("SELECT seq FROM application_state WHERE application_id = $1", &[&early])
        .await
        .expect("held seq")
        .get(0);
    let committed: i64 =
        older_txn.query_one(STATE_UPSERT, &[&late, &"Synced", &"Healthy", &None::<String>]).await.expect("late").get(0);
    let committed_seq: i64 = older_txn
        .query_one("SELECT seq FROM application_state WHERE application_id = $1", &[&late])
        .await
        .expect("late seq")
        .get(0);
    older_txn.commit().await.expect("commit the older transaction");
    assert!(committed < held && committed_seq > held_seq, "older xid {committed} with the higher seq");
    eventually("status on late", || async { sync_of(&env.status("late").await.0).filter(|s| s.1 == "Healthy") }).await;
    // Handled, but the cursor stays at or before the open transaction.
    let cursor = env.cursor(OWNED).await;
    assert!(cursor <= held, "cursor {cursor} passed the transaction {held} still in flight");
    assert_eq!(sync_of(&env.status("early").await.0).map(|s| s.1).as_deref(), Some("Progressing"));

    txn.commit().await.expect("commit the held transaction");
    eventually("status on early", || async { sync_of(&env.status("early").await.0).filter(|s| s.1 == "Degraded") })
        .await;
    env.wait_cursor(OWNED, held).await;
}

#[tokio::test]
async fn sync_runs_follow_their_sync_request_to_the_end() {
    use gitops_writer::api::{GitOpsDeploymentSyncRun, GitOpsDeploymentSyncRunSpec};
    use gitops_writer::status::render::SYNC_RUN_CONDITION;

    let mut env = Env::start().await;
    let mine = env.tenant(OWNED).await;
    let web = env.deployment(mine, "web", None).await;
    let runs: Api<GitOpsDeploymentSyncRun> = Api::namespaced(env.kube.clone(), env.ns.name());
    let spec = GitOpsDeploymentSyncRunSpec { gitops_deployment_name: "web".into(), revision_id: "main".into() };
    let run = runs.create(&PostParams::default(), &GitOpsDeploymentSyncRun::new("sync-1", spec)).await.expect("create");
    let uid: Uuid = run.metadata.uid.as_deref().and_then(|u| u.parse().ok()).expect("a UID");
    let sync: i64 = env
        .client
        .query_one(
            "INSERT INTO sync_operation (tenant_id, resource_uid, resource_name, generation, deployment_name,
                                         application_id, revision, state)
             VALUES ($1, $2, 'sync-1', 1, 'web', $3, 'main', 'running') RETURNING id",
            &[&mine.0, &uid, &web],
        )
        .await
        .expect("sync request")
        .get(0);
    env.run_loop(vec![OWNED]).await;
    observe(&env.client, web, "OutOfSync", "Progressing").await;

    let condition = |reason: &'static str| {
        let runs = runs.clone();
        async move {
            let run = runs.get("sync-1").await.expect("get");
            let conditions = run.status.map(|s| s.conditions).unwrap_or_default();
            conditions.into_iter().find(|c| c.type_ == SYNC_RUN_CONDITION && c.reason.as_deref() == Some(reason))
        }
    };
    let running = eventually("a Running condition", || condition("Running")).await;
    assert_eq!(running.status, "False");
    // The agent records the end of a sync after the application state announced it:
    // no new application_state row here, yet the SyncRun must still finish.
    env.client
        .execute("UPDATE sync_operation SET state = 'succeeded', synced_revision = 'abc123' WHERE id = $1", &[&sync])
        .await
        .expect("finish the sync");
    let done = eventually("a Succeeded condition", || condition("Succeeded")).await;
    assert_eq!((done.status.as_str(), done.message.as_deref()), ("True", Some("synced to revision abc123")));
    let run = runs.get("sync-1").await.expect("get");
    let conditions = run.status.map(|s| s.conditions).unwrap_or_default();
    let ready = conditions.iter().find(|c| c.type_ == "Ready").expect("a Ready condition");
    assert_eq!((ready.status.as_str(), ready.reason.as_deref()), ("True", Some("Succeeded")), "kubectl wait works");
}

async fn signal_sleeping(client: &Client) -> bool {
    client
        .query_one("SELECT sleeping FROM signal WHERE kind = 'status' AND ref_id = 0", &[])
        .await
        .expect("the status signal")
        .get(0)
}

/// A writer at work keeps the shared signal awake, so an agent's commit for another
/// writer's shard goes out without a notification; the busy writer owes that one. It
/// pays with the scan of its spell that finds rows of its own, and when it goes back
/// to sleep.
#[tokio::test]
async fn a_busy_writer_relays_the_wakeups_its_spell_silenced() {
    let mut env = Env::start().await;
    let mine = env.tenant(OWNED).await;
    let theirs = env.tenant(FOREIGN).await;
    let web = env.deployment(mine, "web", None).await;
    let other = env.deployment(theirs, "other", None).await;
    let seen = env.db.connect().await;
    env.run_loop(vec![OWNED]).await;
    eventually("the idle writer asleep", || async { signal_sleeping(&seen).await.then_some(()) }).await;

    // An agent in flight (holding the signal's lock, with no transaction id that
    // would hold rows back): this writer cannot go back to sleep until it ends.
    let mut agent = env.db.connect().await;
    let in_flight = agent.transaction().await.expect("begin");
    in_flight.execute("SELECT signal_raise('status', 0)", &[]).await.expect("raise");
    // A row for this writer wakes it; it marks the signal awake and scans on.
    observe(&env.client, web, "Synced", "Healthy").await;
    eventually("status on web", || async { sync_of(&env.status("web").await.0).filter(|s| s.1 == "Healthy") }).await;
    eventually("the busy writer marks the signal awake", || async { (!signal_sleeping(&seen).await).then_some(()) })
        .await;

    let listener = Listener::start(&env.db.url(), &[Signal::status()], env.cancel.clone()).expect("listener");
    assert!(listener.wait_connected(crate::support::DEADLINE).await, "the test's LISTEN connection is up");
    let mut wake = listener.subscribe(&Signal::status()).expect("subscribed");
    wake.borrow_and_update();
    // The other writer's row and one of this writer's commit unannounced; the scan
    // that finds this writer's row relays.
    observe(&env.client, other, "Synced", "Degraded").await;
    observe(&env.client, web, "Synced", "Progressing").await;
    eventually("a relay after the unannounced commits", || async {
        wake.has_changed().expect("the listener runs").then_some(())
    })
    .await;
    eventually("status on web", || async { sync_of(&env.status("web").await.0).filter(|s| s.1 == "Progressing") })
        .await;
    assert!(!signal_sleeping(&seen).await, "still awake: the agent is in flight");

    // Unannounced again; the agent goes away without a commit of its own, and the
    // writer, going back to sleep, notifies.
    observe(&env.client, other, "Synced", "Healthy").await;
    wake.borrow_and_update();
    in_flight.rollback().await.expect("rollback");
    eventually("a notification when the writer goes back to sleep", || async {
        wake.has_changed().expect("the listener runs").then_some(())
    })
    .await;
    eventually("the writer asleep again", || async { signal_sleeping(&seen).await.then_some(()) }).await;
}

/// What `status_retry` holds for an application: attempts and the last error.
async fn retry_of(client: &Client, application: i64) -> Option<(i32, String)> {
    client
        .query_opt(
            "SELECT attempts, last_error FROM status_retry WHERE kind = 'application' AND row_id = $1",
            &[&application],
        )
        .await
        .expect("read status_retry")
        .map(|row| (row.get("attempts"), row.get("last_error")))
}

/// A resource that refuses its status (here the API server forbids the writer to
/// patch that one object) holds back no other tenant resource of its shard: the
/// cursor passes it and the row after it gets its status, while the refused one
/// waits in `status_retry`. Once the writer may patch it, it gets its status too and
/// its retry goes.
#[tokio::test]
async fn a_resource_that_refuses_its_status_holds_back_no_other() {
    let mut env = Env::start().await;
    let cluster = TestCluster::get().await;
    let mine = env.tenant(OWNED).await;
    let refused = env.deployment(mine, "refused", None).await;
    let web = env.deployment(mine, "web", None).await;

    // The writer's identity may read every GitOpsDeployment of the namespace but
    // patch the status of `web` only.
    let account = "status-writer";
    let rules = serde_json::json!([
        {"apiGroups": ["managed-gitops.redhat.com"], "resources": ["gitopsdeployments"], "verbs": ["get"]},
        {"apiGroups": ["managed-gitops.redhat.com"], "resources": ["gitopsdeployments/status"],
         "resourceNames": ["web"], "verbs": ["patch"]}
    ]);
    let identity = cluster.namespace_identity(env.ns.name(), account, rules).await;
    let writer = cluster.client_with_token(&identity.token).await;
    env.run_loop_as(vec![OWNED], env.context_as(writer)).await;

    // The refused row comes first in the feed.
    let refused_xid = observe(&env.client, refused, "Synced", "Healthy").await;
    let web_xid = observe(&env.client, web, "Synced", "Healthy").await;
    assert!(refused_xid < web_xid);
    eventually("status on web, past the refused row", || async {
        sync_of(&env.status("web").await.0).filter(|s| s.1 == "Healthy")
    })
    .await;
    env.wait_cursor(OWNED, web_xid).await;
    let (attempts, error) =
        eventually("the refused row waiting in status_retry", || retry_of(&env.client, refused)).await;
    assert!(attempts >= 1);
    assert!(error.starts_with(&format!("{}/refused: ", env.ns.name())), "names the resource: {error}");
    assert_eq!(env.status("refused").await.0, None, "nothing written where refused");

    // Let the writer patch it: a retry brings its status.
    let rules = serde_json::json!([{"apiGroups": ["managed-gitops.redhat.com"],
        "resources": ["gitopsdeployments/status"], "resourceNames": ["refused"], "verbs": ["patch"]}]);
    cluster.grant(env.ns.name(), "status-writer-refused", rules, (env.ns.name(), account)).await;
    eventually("status on the refused deployment after the grant", || async {
        sync_of(&env.status("refused").await.0).filter(|s| s.1 == "Healthy")
    })
    .await;
    eventually("its retry gone", || async { retry_of(&env.client, refused).await.is_none().then_some(()) }).await;
}
