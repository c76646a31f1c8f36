//! Purging rows confirmed deleted: exactly the old `deleted` rows of the owned
//! shards go, in foreign-key order, and nothing still referenced or still queued;
//! a row another transaction holds or revives is never purged (raced on real
//! connections); the writer's purge loop purges the shards it owns; and an agent
//! completes, quietly, the operations of rows that were purged.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream, StreamExt};
use gitops_agent::engine::{
    ApplicationSpec, ClusterSpec, Engine, EngineError, OperationView, OwnedObject, ProjectSpec, Removal,
    RepositorySpec, StatusEvent, SyncRequest,
};
use gitops_agent::reconcile::Reconciler;
use gitops_shared::crypto::SecretBox;
use gitops_shared::db::engine_instance::{engine_instance_add, engine_instance_by_name};
use gitops_shared::db::purge::{PURGE_STATEMENTS, PurgeReport, purge_deleted};
use gitops_shared::model::{OperationState, ResourceType, RowState};
use gitops_shared::queue::{Handler, Outcome, operation_claim, operation_complete};
use gitops_testkit::TestDb;
use gitops_writer::purge::{PurgeSettings, run_purge_loop};
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::support::eventually;

const OWNED: i32 = 1;
const OTHER: i32 = 2;
const NOW: Duration = Duration::ZERO;
const BATCH: i64 = 100;

async fn instance(client: &Client) -> i64 {
    engine_instance_add(client, "argocd-1", "argocd", 1000).await.expect("add instance").0
}

async fn tenant(client: &Client, instance: i64, shard: i32, state: RowState) -> i64 {
    client
        .query_one(
            "INSERT INTO tenant (namespace_uid, namespace_name, engine_instance_id, writer_shard, row_state)
             VALUES (gen_random_uuid(), 'team-' || $2::int, $1, $2, $3) RETURNING id",
            &[&instance, &shard, &state],
        )
        .await
        .expect("tenant")
        .get(0)
}

async fn application(client: &Client, tenant: i64, state: RowState, environment: Option<i64>) -> i64 {
    client
        .query_one(
            "INSERT INTO application (tenant_id, resource_uid, resource_name, generation, repo_url, path,
                                      managed_environment_id, destination_namespace, sync_type, row_state)
             VALUES ($1, gen_random_uuid(), 'app', 1, 'https://git.example.invalid/r.git', 'p', $2, 'team',
                     'manual', $3) RETURNING id",
            &[&tenant, &environment, &state],
        )
        .await
        .expect("application")
        .get(0)
}

/// An environment with its cluster credential.
async fn environment(client: &Client, tenant: i64, state: RowState) -> i64 {
    let id: i64 = client
        .query_one(
            "INSERT INTO managed_environment (tenant_id, resource_uid, resource_name, generation, api_url, row_state)
             VALUES ($1, gen_random_uuid(), 'env', 1, 'https://cluster.example.invalid', $2) RETURNING id",
            &[&tenant, &state],
        )
        .await
        .expect("environment")
        .get(0);
    client
        .execute(
            "INSERT INTO cluster_credential (tenant_id, managed_environment_id, secret_name, key_id, ciphertext)
             VALUES ($1, $2, 'secret', 'k1', '\\x00')",
            &[&tenant, &id],
        )
        .await
        .expect("cluster credential");
    id
}

async fn repository_credential(client: &Client, tenant: i64, state: RowState) -> i64 {
    client
        .query_one(
            "INSERT INTO repository_credential (tenant_id, resource_uid, resource_name, generation, repo_url,
                                                secret_name, row_state)
             VALUES ($1, gen_random_uuid(), 'repo', 1, 'https://git.example.invalid/r.git', 'secret', $2)
             RETURNING id",
            &[&tenant, &state],
        )
        .await
        .expect("repository credential")
        .get(0)
}

async fn sync_operation(client: &Client, tenant: i64, state: RowState, application: Option<i64>) -> i64 {
    client
        .query_one(
            "INSERT INTO sync_operation (tenant_id, resource_uid, resource_name, generation, deployment_name,
                                         application_id, revision, row_state)
             VALUES ($1, gen_random_uuid(), 'run', 1, 'app', $2, 'HEAD', $3) RETURNING id",
            &[&tenant, &application, &state],
        )
        .await
        .expect("sync operation")
        .get(0)
}

async fn application_state(client: &Client, tenant: i64, application: i64) {
    client
        .execute("INSERT INTO application_state (application_id, tenant_id) VALUES ($1, $2)", &[&application, &tenant])
        .await
        .expect("application state");
}

async fn operation(client: &Client, instance: i64, tenant: i64, kind: ResourceType, id: i64, state: OperationState) {
    if matches!(state, OperationState::Completed | OperationState::Superseded) {
        client
            .execute(
                "INSERT INTO operation_history (id, engine_instance_id, tenant_id, resource_type, resource_id, state)
                 VALUES (nextval('operation_id_seq'), $1, $2, $3, $4, $5::operation_state)",
                &[&instance, &tenant, &kind, &id, &state],
            )
            .await
            .expect("finished operation");
        return;
    }
    client
        .execute(
            "INSERT INTO operation (engine_instance_id, tenant_id, resource_type, resource_id, state,
                                    lease_token, lease_expires_at, completed_at)
             VALUES ($1, $2, $3, $4, $5::operation_state,
                     CASE WHEN $5::operation_state = 'claimed' THEN gen_random_uuid() END,
                     CASE WHEN $5::operation_state = 'claimed' THEN now() + interval '1 minute' END,
                     CASE WHEN $5::operation_state IN ('completed', 'failed', 'superseded') THEN now() END)",
            &[&instance, &tenant, &kind, &id, &state],
        )
        .await
        .expect("operation");
}

/// The row state of row `id` of `table` (None: purged). `table` is one of the
/// test's own constants.
async fn state(client: &Client, table: &str, id: i64) -> Option<RowState> {
    client
        .query_opt(&format!("SELECT row_state FROM {table} WHERE id = $1"), &[&id])
        .await
        .expect("read row state")
        .map(|row| row.get(0))
}

async fn count(client: &Client, query: &str) -> i64 {
    client.query_one(query, &[]).await.expect("count").get(0)
}

#[tokio::test]
async fn purge_statements_prepare_against_the_schema() {
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    for (action, statement) in PURGE_STATEMENTS {
        client.prepare(statement).await.unwrap_or_else(|e| panic!("{action}: {e}"));
    }
}

#[tokio::test]
async fn purge_removes_exactly_the_old_deleted_rows_of_owned_shards() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let c = &client;
    let instance = instance(c).await;
    let t = tenant(c, instance, OWNED, RowState::Active).await;

    // One row per table in each state: only the deleted ones may go.
    let mut kept = Vec::new();
    let mut purged = Vec::new();
    for state in [RowState::Active, RowState::Deleting, RowState::Deleted] {
        let rows = [
            ("application", application(c, t, state, None).await),
            ("managed_environment", environment(c, t, state).await),
            ("repository_credential", repository_credential(c, t, state).await),
            ("sync_operation", sync_operation(c, t, state, None).await),
        ];
        if state == RowState::Deleted { purged.extend(rows) } else { kept.extend(rows) }
    }
    // Observed state and cluster credentials go with their rows.
    let app_with_state = application(c, t, RowState::Deleted, None).await;
    application_state(c, t, app_with_state).await;
    purged.push(("application", app_with_state));

    // An environment still used by a live application stays; one used only by an
    // application purged in the same round goes (applications go first).
    let env_in_use = environment(c, t, RowState::Deleted).await;
    let user = application(c, t, RowState::Active, Some(env_in_use)).await;
    kept.extend([("managed_environment", env_in_use), ("application", user)]);
    let env_freed = environment(c, t, RowState::Deleted).await;
    let freed_by = application(c, t, RowState::Deleted, Some(env_freed)).await;
    purged.extend([("managed_environment", env_freed), ("application", freed_by)]);

    // A deleted sync run of a deleted application goes first, then the application;
    // a live sync run keeps its deleted application.
    let synced = application(c, t, RowState::Deleted, None).await;
    let its_run = sync_operation(c, t, RowState::Deleted, Some(synced)).await;
    purged.extend([("application", synced), ("sync_operation", its_run)]);
    let held = application(c, t, RowState::Deleted, None).await;
    let live_run = sync_operation(c, t, RowState::Active, Some(held)).await;
    kept.extend([("application", held), ("sync_operation", live_run)]);

    // Rows with a waiting or claimed operation stay; a finished operation holds nothing.
    let waiting = application(c, t, RowState::Deleted, None).await;
    operation(c, instance, t, ResourceType::Application, waiting, OperationState::Waiting).await;
    let claimed = repository_credential(c, t, RowState::Deleted).await;
    operation(c, instance, t, ResourceType::RepositoryCredential, claimed, OperationState::Claimed).await;
    let claimed_env = environment(c, t, RowState::Deleted).await;
    operation(c, instance, t, ResourceType::ManagedEnvironment, claimed_env, OperationState::Claimed).await;
    let waiting_run = sync_operation(c, t, RowState::Deleted, None).await;
    operation(c, instance, t, ResourceType::SyncOperation, waiting_run, OperationState::Waiting).await;
    let finished = application(c, t, RowState::Deleted, None).await;
    operation(c, instance, t, ResourceType::Application, finished, OperationState::Completed).await;
    operation(c, instance, t, ResourceType::Application, finished, OperationState::Failed).await;
    kept.extend([
        ("application", waiting),
        ("repository_credential", claimed),
        ("managed_environment", claimed_env),
        ("sync_operation", waiting_run),
    ]);
    purged.push(("application", finished));

    // Tenants: deleted and empty goes; deleted with rows left stays (and so do its
    // deleted rows' neighbours); deleted and emptied this round goes; active stays;
    // a deleted tenant with a waiting operation stays.
    let empty = tenant(c, instance, OWNED, RowState::Deleted).await;
    let not_empty = tenant(c, instance, OWNED, RowState::Deleted).await;
    let remaining = application(c, not_empty, RowState::Deleting, None).await;
    let emptied = tenant(c, instance, OWNED, RowState::Deleted).await;
    let last_app = application(c, emptied, RowState::Deleted, None).await;
    let last_env = environment(c, emptied, RowState::Deleted).await;
    let queued = tenant(c, instance, OWNED, RowState::Deleted).await;
    operation(c, instance, queued, ResourceType::Tenant, queued, OperationState::Waiting).await;
    kept.extend([("tenant", t), ("tenant", not_empty), ("application", remaining), ("tenant", queued)]);
    purged.extend([
        ("tenant", empty),
        ("tenant", emptied),
        ("application", last_app),
        ("managed_environment", last_env),
    ]);

    // Another shard's deleted rows are not this purge's.
    let other = tenant(c, instance, OTHER, RowState::Deleted).await;
    let other_app = application(c, other, RowState::Deleted, None).await;
    let other_env = environment(c, other, RowState::Deleted).await;
    kept.extend([("tenant", other), ("application", other_app), ("managed_environment", other_env)]);

    // Within the grace period nothing goes.
    let early = purge_deleted(&mut client, &[OWNED], Duration::from_secs(3600), BATCH).await.expect("purge");
    assert_eq!(early, PurgeReport::default());
    // Nor with no shards owned.
    assert_eq!(purge_deleted(&mut client, &[], NOW, BATCH).await.expect("purge"), PurgeReport::default());

    let report = purge_deleted(&mut client, &[OWNED], NOW, BATCH).await.expect("purge");
    let c = &client;
    for (table, id) in &purged {
        assert_eq!(state(c, table, *id).await, None, "{table} {id} must be purged");
    }
    for (table, id) in &kept {
        assert!(state(c, table, *id).await.is_some(), "{table} {id} must be kept");
    }
    let expected = |table: &str| purged.iter().filter(|(t, _)| *t == table).count() as u64;
    assert_eq!(
        report,
        PurgeReport {
            sync_operations: expected("sync_operation"),
            applications: expected("application"),
            repository_credentials: expected("repository_credential"),
            managed_environments: expected("managed_environment"),
            tenants: expected("tenant"),
        }
    );
    assert_eq!(count(c, "SELECT count(*) FROM application_state").await, 0, "observed state cascades");
    assert_eq!(
        count(
            c,
            "SELECT count(*) FROM cluster_credential c
                   WHERE NOT EXISTS (SELECT 1 FROM managed_environment e WHERE e.id = c.managed_environment_id)"
        )
        .await,
        0
    );
    // Credentials of kept environments are kept.
    assert_eq!(
        count(c, "SELECT count(*) FROM cluster_credential").await,
        count(c, "SELECT count(*) FROM managed_environment").await
    );
    // A second round finds nothing more.
    assert_eq!(purge_deleted(&mut client, &[OWNED], NOW, BATCH).await.expect("purge"), PurgeReport::default());
    // The other shard's owner purges its rows.
    let theirs = purge_deleted(&mut client, &[OTHER], NOW, BATCH).await.expect("purge");
    assert_eq!((theirs.applications, theirs.managed_environments, theirs.tenants), (1, 1, 1));
}

#[tokio::test]
async fn purge_runs_batch_after_batch_and_honours_the_grace_period() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let instance = instance(&client).await;
    let t = tenant(&client, instance, OWNED, RowState::Active).await;
    for _ in 0..23 {
        application(&client, t, RowState::Deleted, None).await;
    }
    let recent = application(&client, t, RowState::Deleted, None).await;
    client
        .execute("UPDATE application SET updated_at = now() - interval '2 hours' WHERE id <> $1", &[&recent])
        .await
        .expect("age the rows");
    let report = purge_deleted(&mut client, &[OWNED], Duration::from_secs(3600), 4).await.expect("purge");
    assert_eq!(report.applications, 23);
    assert_eq!(state(&client, "application", recent).await, Some(RowState::Deleted));
    assert_eq!(count(&client, "SELECT count(*) FROM application").await, 1);
}

#[tokio::test]
async fn purge_skips_rows_another_transaction_holds() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let mut other = db.connect().await;
    let instance = instance(&client).await;
    let t = tenant(&client, instance, OWNED, RowState::Active).await;
    let revived = application(&client, t, RowState::Deleted, None).await;
    let referenced = application(&client, t, RowState::Deleted, None).await;

    // A writer revives one row and has not committed yet: the purge does not wait
    // for it and does not take it.
    let txn = other.transaction().await.expect("begin");
    txn.execute("UPDATE application SET row_state = 'active', updated_at = now() WHERE id = $1", &[&revived])
        .await
        .expect("revive");
    let report = purge_deleted(&mut client, &[OWNED], NOW, BATCH).await.expect("purge");
    assert_eq!(report.applications, 1, "only the row nobody holds");
    assert_eq!(state(&client, "application", referenced).await, None);
    txn.commit().await.expect("commit");
    assert_eq!(purge_deleted(&mut client, &[OWNED], NOW, BATCH).await.expect("purge"), PurgeReport::default());
    assert_eq!(state(&client, "application", revived).await, Some(RowState::Active));

    // A transaction inserting a row that references a deleted one (it holds a key
    // share lock on it): the row stays while that transaction runs.
    let env = environment(&client, t, RowState::Deleted).await;
    let txn = other.transaction().await.expect("begin");
    txn.execute("SELECT 1 FROM managed_environment WHERE id = $1 FOR KEY SHARE", &[&env]).await.expect("lock");
    assert_eq!(purge_deleted(&mut client, &[OWNED], NOW, BATCH).await.expect("purge").managed_environments, 0);
    assert_eq!(state(&client, "managed_environment", env).await, Some(RowState::Deleted));
    txn.rollback().await.expect("rollback");
    assert_eq!(purge_deleted(&mut client, &[OWNED], NOW, BATCH).await.expect("purge").managed_environments, 1);
}

#[tokio::test]
async fn purge_never_removes_a_row_revived_concurrently() {
    const ROWS: usize = 300;
    let db = TestDb::migrated().await;
    let mut purger = db.connect().await;
    let reviver = db.connect().await;
    let instance = instance(&purger).await;
    let t = tenant(&purger, instance, OWNED, RowState::Active).await;
    let mut ids = Vec::with_capacity(ROWS);
    for _ in 0..ROWS {
        ids.push(application(&purger, t, RowState::Deleted, None).await);
    }
    let done = CancellationToken::new();
    // The purge walks up from the lowest id in small batches while the reviver
    // walks down from the highest, so they meet somewhere in the middle.
    let purge = async {
        let mut purged = 0;
        loop {
            let finished = done.is_cancelled();
            purged += purge_deleted(&mut purger, &[OWNED], NOW, 3).await.expect("purge").applications;
            if finished {
                return purged;
            }
            tokio::task::yield_now().await;
        }
    };
    let revive = async {
        let mut revived = Vec::new();
        for id in ids.iter().rev().step_by(2) {
            let changed = reviver
                .execute(
                    "UPDATE application SET row_state = 'active', updated_at = now()
                      WHERE id = $1 AND row_state = 'deleted'",
                    &[id],
                )
                .await
                .expect("revive");
            if changed == 1 {
                revived.push(*id);
            }
        }
        done.cancel();
        revived
    };
    let (purged, revived) = tokio::join!(purge, revive);
    for id in &revived {
        assert_eq!(state(&reviver, "application", *id).await, Some(RowState::Active), "revived row {id} was purged");
    }
    let left = count(&reviver, "SELECT count(*) FROM application").await;
    let active = count(&reviver, "SELECT count(*) FROM application WHERE row_state = 'active'").await;
    assert_eq!(active, revived.len() as i64);
    assert_eq!(left, active, "every row not revived was purged");
    assert_eq!(purged as usize + revived.len(), ROWS);
}

#[tokio::test]
async fn the_writer_purge_loop_purges_the_shards_it_owns() {
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    let instance = instance(&client).await;
    let mine = tenant(&client, instance, OWNED, RowState::Active).await;
    let theirs = tenant(&client, instance, OTHER, RowState::Active).await;
    let my_deleted = application(&client, mine, RowState::Deleted, None).await;
    let my_active = application(&client, mine, RowState::Active, None).await;
    let their_deleted = application(&client, theirs, RowState::Deleted, None).await;
    let (shards, owned) = tokio::sync::watch::channel(vec![OWNED]);
    let cancel = CancellationToken::new();
    let settings = PurgeSettings { interval: Duration::from_millis(10), after: NOW, batch: BATCH };
    let task = tokio::spawn(run_purge_loop(db.pool(2), owned, settings, cancel.clone()));
    eventually("the owned shard's deleted row purged", || async {
        state(&client, "application", my_deleted).await.is_none().then_some(())
    })
    .await;
    assert_eq!(state(&client, "application", their_deleted).await, Some(RowState::Deleted));
    // The shard changes hands: now its rows are this writer's to purge.
    shards.send_replace(vec![OTHER]);
    eventually("the newly owned shard's deleted row purged", || async {
        state(&client, "application", their_deleted).await.is_none().then_some(())
    })
    .await;
    assert_eq!(state(&client, "application", my_active).await, Some(RowState::Active));
    cancel.cancel();
    task.await.expect("the purge loop stops when cancelled");
}

/// An engine that has nothing and records what it was asked to create.
#[derive(Debug, Default)]
struct EmptyEngine {
    applied: Mutex<Vec<String>>,
}

impl EmptyEngine {
    fn applied(&self, what: &str) -> BoxFuture<'_, Result<(), EngineError>> {
        self.applied.lock().expect("lock").push(what.to_owned());
        Box::pin(async { Ok(()) })
    }
}

impl Engine for EmptyEngine {
    fn apply_project<'a>(&'a self, spec: &'a ProjectSpec) -> BoxFuture<'a, Result<(), EngineError>> {
        self.applied(&spec.name)
    }
    fn delete_project<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
        Box::pin(async { Ok(Removal::Gone) })
    }
    fn apply_application<'a>(&'a self, spec: &'a ApplicationSpec) -> BoxFuture<'a, Result<(), EngineError>> {
        self.applied(&spec.name)
    }
    fn delete_application<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
        Box::pin(async { Ok(Removal::Gone) })
    }
    fn apply_cluster<'a>(&'a self, spec: &'a ClusterSpec) -> BoxFuture<'a, Result<(), EngineError>> {
        self.applied(&spec.name)
    }
    fn delete_cluster<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
        Box::pin(async { Ok(Removal::Gone) })
    }
    fn apply_repository<'a>(&'a self, spec: &'a RepositorySpec) -> BoxFuture<'a, Result<(), EngineError>> {
        self.applied(&spec.name)
    }
    fn delete_repository<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
        Box::pin(async { Ok(Removal::Gone) })
    }
    fn operation<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<OperationView>, EngineError>> {
        Box::pin(async { Ok(None) })
    }
    fn request_sync<'a>(&'a self, request: &'a SyncRequest) -> BoxFuture<'a, Result<(), EngineError>> {
        self.applied(&request.application)
    }
    fn withdraw_sync<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), EngineError>> {
        Box::pin(async { Ok(()) })
    }
    fn terminate<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), EngineError>> {
        Box::pin(async { Ok(()) })
    }
    fn list_owned(&self) -> BoxFuture<'_, Result<Vec<OwnedObject>, EngineError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn status_events(&self) -> BoxStream<'_, Result<StatusEvent, EngineError>> {
        stream::pending().boxed()
    }
}

#[tokio::test]
async fn agent_completes_operations_of_purged_rows_quietly() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let instance_id = instance(&client).await;
    let t = tenant(&client, instance_id, OWNED, RowState::Deleted).await;
    let resources = [
        (ResourceType::Application, application(&client, t, RowState::Deleted, None).await),
        (ResourceType::ManagedEnvironment, environment(&client, t, RowState::Deleted).await),
        (ResourceType::RepositoryCredential, repository_credential(&client, t, RowState::Deleted).await),
        (ResourceType::SyncOperation, sync_operation(&client, t, RowState::Deleted, None).await),
        (ResourceType::Tenant, t),
    ];
    let report = purge_deleted(&mut client, &[OWNED], NOW, BATCH).await.expect("purge");
    assert_eq!(report.total(), 5, "everything purged: {report:?}");

    // Operations for the purged rows turn up anyway (an operator retries old dead
    // letters, or a re-enqueue raced the purge).
    for (kind, id) in resources {
        operation(&client, instance_id, t, kind, id, OperationState::Waiting).await;
    }
    let engine = Arc::new(EmptyEngine::default());
    let key = SecretBox::generate_key("k1").expect("key");
    let secrets = SecretBox::from_config(Some(&key), Some("k1")).expect("secrets");
    let instance = engine_instance_by_name(&client, "argocd-1").await.expect("instance");
    let reconciler = Reconciler::new(db.pool(2), engine.clone(), secrets, instance.clone());
    let ops = operation_claim(&client, instance.id, "test", 10, Duration::from_secs(60)).await.expect("claim");
    assert_eq!(ops.len(), 5);
    let mut outcomes = BTreeMap::new();
    for op in &ops {
        let outcome = reconciler.handle(op).await;
        outcomes.insert(op.resource_type.as_str(), matches!(outcome, Outcome::Done));
        if matches!(outcome, Outcome::Done) {
            operation_complete(&client, &[(op.id, op.lease.token())]).await.expect("complete");
        }
    }
    assert!(outcomes.values().all(|done| *done), "every operation done: {outcomes:?}");
    assert!(engine.applied.lock().expect("lock").is_empty(), "nothing created for purged rows");
    assert_eq!(count(&client, "SELECT count(*) FROM operation_history WHERE state = 'completed'").await, 5);
}

/// What the admission webhook approved is found by UID and generation only, recorded
/// once however often the API server retries, and forgotten after its retention.
#[tokio::test]
async fn admission_approvals_are_found_by_generation_and_purged_when_old() {
    use gitops_shared::db::admission_approval::{
        ApprovedKind, STATEMENTS, admission_approval_exists, admission_approval_purge, admission_approval_record,
    };
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    for statement in STATEMENTS {
        client.prepare(statement).await.unwrap_or_else(|e| panic!("prepare {statement}: {e}"));
    }
    let (uid, other) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    admission_approval_record(&client, uid, 2, ApprovedKind::Deployment, "alice").await.expect("record");
    admission_approval_record(&client, uid, 2, ApprovedKind::Deployment, "alice").await.expect("record again");
    admission_approval_record(&client, other, 1, ApprovedKind::SyncRun, "bob").await.expect("record");
    assert!(admission_approval_exists(&client, uid, 2).await.expect("read"));
    assert!(!admission_approval_exists(&client, uid, 1).await.expect("read"), "another generation is not approved");
    assert!(!admission_approval_exists(&client, uuid::Uuid::new_v4(), 2).await.expect("read"));

    client
        .execute(
            "UPDATE admission_approval SET approved_at = now() - interval '2 days' WHERE resource_uid = $1",
            &[&uid],
        )
        .await
        .expect("age one approval");
    let purged = admission_approval_purge(&client, Duration::from_secs(24 * 3600), 100).await.expect("purge");
    assert_eq!(purged, 1);
    assert!(!admission_approval_exists(&client, uid, 2).await.expect("read"));
    assert!(admission_approval_exists(&client, other, 1).await.expect("read"), "a fresh approval stays");
}
