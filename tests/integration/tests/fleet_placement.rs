//! Capacity is a hard limit, raced with real connections: many namespaces placed at
//! once onto instances with a few free slots never pass any instance's capacity;
//! those left over learn that the fleet is full, and are placed once a slot frees.
//! A cordoned instance takes no new tenant; its tenants stay. Even a placement
//! written by hand past the capacity is refused by the database.

use std::time::Duration;

use gitops_shared::db::engine_instance::{
    engine_instance_add, engine_instance_cordon, engine_instance_heartbeat, engine_instance_list,
};
use gitops_shared::db::placement::{Unplaced, placement_choose_in_txn};
use gitops_shared::db::tenant::tenant_upsert_locked_in_txn;
use gitops_shared::model::EngineInstanceId;
use gitops_testkit::TestDb;
use uuid::Uuid;

const HEALTHY_WITHIN: Duration = Duration::from_secs(60);

/// Places a new namespace as the writer does: choose, then upsert, in one
/// transaction, run again on a serialization failure.
async fn place(url: &str, name: String) -> Result<EngineInstanceId, Unplaced> {
    let mut client = gitops_shared::db::connect(url, "placement-race").await.expect("connect");
    let name = std::sync::Arc::new(name);
    gitops_shared::db::in_txn_retrying(&mut client, |txn| {
        let name = name.clone();
        Box::pin(async move {
            let chosen = match placement_choose_in_txn(txn, HEALTHY_WITHIN).await? {
                Ok(chosen) => chosen,
                Err(why) => return Ok(Err(why)),
            };
            let tenant = tenant_upsert_locked_in_txn(txn, Uuid::new_v4(), &name, Some(chosen)).await?;
            Ok(Ok(tenant.engine_instance_id.expect("placed")))
        })
    })
    .await
    .expect("the placement transaction")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn placements_racing_for_the_last_slots_never_pass_capacity() {
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    let small = engine_instance_add(&client, "small", "argo-small", 3).await.expect("add");
    let other = engine_instance_add(&client, "other", "argo-other", 4).await.expect("add");
    for id in [small, other] {
        engine_instance_heartbeat(&client, id).await.expect("heartbeat");
    }
    let url = db.url();
    let racers: Vec<_> = (0..20)
        .map(|i| {
            tokio::spawn({
                let url = url.clone();
                async move { place(&url, format!("team-{i}")).await }
            })
        })
        .collect();
    let mut placed = Vec::new();
    let mut refused = Vec::new();
    for racer in racers {
        match racer.await.expect("a racer") {
            Ok(instance) => placed.push(instance),
            Err(why) => refused.push(why),
        }
    }
    assert_eq!(placed.len(), 7, "exactly the free slots were taken: {placed:?}");
    assert_eq!(placed.iter().filter(|i| **i == small).count(), 3);
    assert_eq!(placed.iter().filter(|i| **i == other).count(), 4);
    assert!(refused.iter().all(|why| *why == Unplaced::Full), "the rest learn the fleet is full: {refused:?}");
    let counted: i64 = client
        .query_one("SELECT count(*) FROM tenant WHERE engine_instance_id = $1", &[&small.0])
        .await
        .expect("count")
        .get(0);
    let listed = engine_instance_list(&client).await.expect("list");
    assert_eq!(listed.iter().find(|i| i.id == small).map(|i| i.tenants), Some(counted), "the counter agrees");

    // By hand past the capacity: the database refuses.
    let error = client
        .execute(
            "INSERT INTO tenant (namespace_uid, namespace_name, engine_instance_id) VALUES ($1, 'by-hand', $2)",
            &[&Uuid::new_v4(), &small.0],
        )
        .await
        .expect_err("past the capacity");
    let message = error.as_db_error().map(|e| e.message().to_owned()).unwrap_or_default();
    assert!(message.contains("is full"), "{error:?}");

    // A slot frees: the next placement takes it.
    client
        .execute(
            "DELETE FROM tenant WHERE id = (SELECT min(id) FROM tenant WHERE engine_instance_id = $1)",
            &[&small.0],
        )
        .await
        .expect("free a slot");
    assert_eq!(place(&url, "late".into()).await, Ok(small));
}

#[tokio::test]
async fn a_cordoned_instance_takes_no_new_tenants_and_keeps_its_own() {
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    let a = engine_instance_add(&client, "a", "argo-a", 10).await.expect("add");
    engine_instance_heartbeat(&client, a).await.expect("heartbeat");
    let url = db.url();
    assert_eq!(place(&url, "first".into()).await, Ok(a));
    engine_instance_cordon(&client, "a", true).await.expect("cordon");
    assert_eq!(place(&url, "second".into()).await, Err(Unplaced::Full), "cordoned: no room for new tenants");
    let listed = engine_instance_list(&client).await.expect("list");
    assert_eq!(listed.iter().map(|i| (i.tenants, i.cordoned)).collect::<Vec<_>>(), [(1, true)], "its tenant stays");
    assert!(engine_instance_cordon(&client, "nope", true).await.is_err(), "an unknown instance is an error");
    engine_instance_cordon(&client, "a", false).await.expect("uncordon");
    assert_eq!(place(&url, "second".into()).await, Ok(a));

    // No live instance at all is told apart from a full fleet.
    client.execute("UPDATE engine_instance SET heartbeat_at = now() - interval '1 hour'", &[]).await.expect("age");
    assert_eq!(place(&url, "third".into()).await, Err(Unplaced::Unavailable));
}

#[tokio::test]
async fn writer_fleet_full_namespace_waits_with_a_reason_and_is_placed_once_there_is_room() {
    use gitops_writer::controller::{CONDITION, REASON_ACCEPTED, REASON_NO_ENGINE};

    let env = crate::support::writer::env("fleet-full").await;
    engine_instance_cordon(&env.client, crate::support::writer::INSTANCE, true).await.expect("cordon");
    let _writer = env.writer("writer-a");
    let name = format!("web-{}", crate::support::short_id());
    env.create(&name, crate::support::writer::spec("https://git.example.invalid/a.git", "apps/web")).await;
    let condition = |reason: &'static str| {
        let env = &env;
        let name = name.clone();
        async move {
            crate::support::eventually(&format!("condition {reason}"), || async {
                let object = env.deployments().get_opt(&name).await.ok()??;
                let condition = object.status?.conditions.into_iter().find(|c| c.type_ == CONDITION)?;
                (condition.reason.as_deref() == Some(reason)).then_some(condition.message.unwrap_or_default())
            })
            .await
        }
    };
    let message = condition(REASON_NO_ENGINE).await;
    assert!(message.contains("closed to new tenants"), "the tenant reads why: {message}");
    let tenants: i64 = env
        .client
        .query_one("SELECT count(*) FROM tenant WHERE engine_instance_id IS NOT NULL", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(tenants, 0, "nothing placed on a cordoned instance");

    engine_instance_cordon(&env.client, crate::support::writer::INSTANCE, false).await.expect("uncordon");
    condition(REASON_ACCEPTED).await;
}

/// Two live instances and a tenant with one application row placed on the first.
async fn moving_fixture(
    db: &TestDb,
) -> (tokio_postgres::Client, EngineInstanceId, EngineInstanceId, gitops_shared::model::TenantId) {
    let client = db.connect().await;
    let a = engine_instance_add(&client, "a", "argo-a", 10).await.expect("add");
    let b = engine_instance_add(&client, "b", "argo-b", 10).await.expect("add");
    for id in [a, b] {
        engine_instance_heartbeat(&client, id).await.expect("heartbeat");
    }
    let row = client
        .query_one(
            "INSERT INTO tenant (namespace_uid, namespace_name, engine_instance_id) VALUES ($1, 'team-a', $2) RETURNING id",
            &[&Uuid::new_v4(), &a.0],
        )
        .await
        .expect("tenant");
    let tenant = gitops_shared::model::TenantId(row.get(0));
    (client, a, b, tenant)
}

/// Enqueues application `id` of `tenant` on `instance` in a transaction of its own.
async fn enqueue(
    client: &mut tokio_postgres::Client,
    instance: EngineInstanceId,
    tenant: gitops_shared::model::TenantId,
    id: i64,
) {
    use gitops_shared::model::ResourceType;
    let txn = client.transaction().await.expect("begin");
    gitops_shared::queue::operation_enqueue_in_txn(&txn, instance, tenant, ResourceType::Application, id)
        .await
        .expect("enqueue");
    txn.commit().await.expect("commit");
}

#[tokio::test]
async fn a_move_parks_the_tenants_operations_until_the_source_lets_go() {
    use gitops_shared::db::tenant_move::{tenant_move, tenant_placements, tenant_release_confirm_in_txn};
    use gitops_shared::model::ResourceType;
    use gitops_shared::queue::{operation_claim, operation_complete};

    let db = TestDb::migrated().await;
    let (mut client, a, b, tenant) = moving_fixture(&db).await;
    let lease = Duration::from_secs(30);
    enqueue(&mut client, a, tenant, 1).await;

    tenant_move(&mut client, "team-a", "b", "test").await.expect("move");
    let placed = tenant_placements(&client, Some("team-a"), None).await.expect("placement");
    assert_eq!(
        (placed[0].instance.as_deref(), placed[0].moving_from.as_deref(), placed[0].move_state.as_deref()),
        (Some("b"), Some("a"), Some("releasing"))
    );
    // The waiting operation went to the target, parked; a new one is parked too.
    enqueue(&mut client, b, tenant, 2).await;
    let parked: i64 = client
        .query_one("SELECT count(*) FROM operation WHERE engine_instance_id = $1 AND run_after = 'infinity'", &[&b.0])
        .await
        .expect("count")
        .get(0);
    assert_eq!(parked, 2);
    // Even brought forward by hand, the target may not claim them while the source holds on.
    client
        .execute("UPDATE operation SET run_after = now() WHERE resource_type = 'application'", &[])
        .await
        .expect("unpark");
    assert!(
        operation_claim(&client, b, "b-agent", 10, lease).await.expect("claim").is_empty(),
        "nothing for the target"
    );
    // The source gets the release, and nothing else of the tenant.
    let release = operation_claim(&client, a, "a-agent", 10, lease).await.expect("claim");
    assert_eq!(release.iter().map(|op| op.resource_type).collect::<Vec<_>>(), [ResourceType::Tenant]);

    // A second move while this one runs is refused with the reason.
    let again = tenant_move(&mut client, "team-a", "a", "test").await.expect_err("already moving");
    assert!(again.to_string().contains("already moving"), "{again}");

    // The source lets go: the target gets the adoption and the operations.
    let txn = client.transaction().await.expect("begin");
    assert!(tenant_release_confirm_in_txn(&txn, tenant, a).await.expect("confirm"));
    txn.commit().await.expect("commit");
    // The adoption waits for the release's operation to end.
    let claimed = operation_claim(&client, b, "b-agent", 10, lease).await.expect("claim");
    assert!(claimed.iter().all(|op| op.resource_type != ResourceType::Tenant), "not while the release runs");
    let done: Vec<_> = release.iter().map(|op| (op.id, op.lease.token())).collect();
    operation_complete(&client, &done).await.expect("complete the release");
    let mut claimed = claimed;
    claimed.extend(operation_claim(&client, b, "b-agent", 10, lease).await.expect("claim"));
    let mut kinds: Vec<(ResourceType, i64)> = claimed.iter().map(|op| (op.resource_type, op.resource_id)).collect();
    kinds.sort_by_key(|(kind, id)| (kind.to_string(), *id));
    assert_eq!(
        kinds,
        [(ResourceType::Application, 1), (ResourceType::Application, 2), (ResourceType::Tenant, tenant.0)]
    );
}

#[tokio::test]
async fn a_move_is_refused_with_its_reason() {
    use gitops_shared::db::tenant_move::tenant_move;

    let db = TestDb::migrated().await;
    let (mut client, _a, _b, _tenant) = moving_fixture(&db).await;
    let refused = |error: gitops_shared::db::DbError| error.to_string();
    let mut reasons = Vec::new();
    reasons.push(refused(tenant_move(&mut client, "nobody", "b", "t").await.expect_err("unknown tenant")));
    reasons.push(refused(tenant_move(&mut client, "team-a", "zzz", "t").await.expect_err("unknown instance")));
    reasons.push(refused(tenant_move(&mut client, "team-a", "a", "t").await.expect_err("same instance")));
    engine_instance_cordon(&client, "b", true).await.expect("cordon");
    reasons.push(refused(tenant_move(&mut client, "team-a", "b", "t").await.expect_err("cordoned")));
    engine_instance_cordon(&client, "b", false).await.expect("uncordon");
    client.execute("UPDATE engine_instance SET capacity = 1, tenants = 1 WHERE name = 'b'", &[]).await.expect("fill");
    reasons.push(refused(tenant_move(&mut client, "team-a", "b", "t").await.expect_err("full")));
    let expected = ["no tenant in namespace", "no engine instance", "is on \"a\" already", "is cordoned", "is full"];
    for (reason, expected) in reasons.iter().zip(expected) {
        assert!(reason.contains(expected), "{reason:?} should say {expected:?}");
    }
    let placed: Option<i64> = client
        .query_one("SELECT moving_from FROM tenant WHERE namespace_name = 'team-a'", &[])
        .await
        .expect("row")
        .get(0);
    assert_eq!(placed, None, "nothing moved");
}

#[tokio::test]
async fn instance_health_follows_heartbeats_and_argocd_progress() {
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    let id = engine_instance_add(&client, "a", "argo-a", 10).await.expect("add");
    let health = || async {
        let listed = engine_instance_list(&client).await.expect("list");
        listed.into_iter().find(|i| i.id == id).map(|i| i.health).unwrap_or_default()
    };
    assert_eq!(health().await, "lost", "no agent ever reported");
    engine_instance_heartbeat(&client, id).await.expect("heartbeat");
    assert_eq!(health().await, "healthy", "a heartbeat and no progress report yet (an older agent)");
    let set = |heartbeat: &str, progress: &str| {
        let sql = format!(
            "UPDATE engine_instance SET heartbeat_at = now() - interval '{heartbeat}', \
             progress_at = now() - interval '{progress}' WHERE id = {}",
            id.0
        );
        let client = &client;
        async move { client.batch_execute(&sql).await.expect("set") }
    };
    set("5 seconds", "10 seconds").await;
    assert_eq!(health().await, "healthy");
    set("5 seconds", "5 minutes").await;
    assert_eq!(health().await, "degraded", "the API answers, Argo CD does not refresh");
    set("5 minutes", "5 seconds").await;
    assert_eq!(health().await, "lost", "no agent reaches the API");
    // The windows are settings of the database.
    client.batch_execute("SET gitops.instance_lost_after = '10 minutes'").await.expect("set");
    assert_eq!(health().await, "healthy");
    // A degraded instance gets no new tenants.
    set("1 second", "5 minutes").await;
    assert_eq!(place(&db.url(), "new".into()).await, Err(Unplaced::Full));
}

#[tokio::test]
async fn rebalance_moves_tenants_from_the_fullest_to_the_emptiest_within_the_move_budget() {
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    let full = engine_instance_add(&client, "full", "argo-full", 10).await.expect("add");
    let empty = engine_instance_add(&client, "empty", "argo-empty", 10).await.expect("add");
    let cordoned = engine_instance_add(&client, "closed", "argo-closed", 10).await.expect("add");
    for id in [full, empty, cordoned] {
        engine_instance_heartbeat(&client, id).await.expect("heartbeat");
    }
    engine_instance_cordon(&client, "closed", true).await.expect("cordon");
    for i in 0..8 {
        client
            .execute(
                "INSERT INTO tenant (namespace_uid, namespace_name, engine_instance_id) VALUES ($1, $2, $3)",
                &[&Uuid::new_v4(), &format!("team-{i}"), &full.0],
            )
            .await
            .expect("tenant");
    }
    let url = db.url();
    // Loads 0.8 and 0: three moves bring them to 0.5 / 0.3, a fourth would not help
    // beyond the threshold; the budget allows two now.
    let moved = gitopsctl::instance::rebalance(&url, 0.25, 2).await.expect("rebalance");
    assert_eq!(moved.len(), 2, "{moved:?}");
    assert!(moved.iter().all(|(_, from, to)| from == "full" && to == "empty"), "{moved:?}");
    // Those two still run: the budget is spent.
    assert!(gitopsctl::instance::rebalance(&url, 0.25, 2).await.expect("rebalance").is_empty());
    client.execute("UPDATE tenant SET moving_from = NULL, move_state = NULL", &[]).await.expect("moves end");
    let moved = gitopsctl::instance::rebalance(&url, 0.25, 5).await.expect("rebalance");
    assert_eq!(moved.len(), 1, "{moved:?}");
    let listed = engine_instance_list(&client).await.expect("list");
    let tenants = |name: &str| listed.iter().find(|i| i.name == name).map(|i| i.tenants);
    assert_eq!((tenants("full"), tenants("empty"), tenants("closed")), (Some(5), Some(3), Some(0)));
}

#[tokio::test]
async fn a_move_fails_the_tenants_pending_and_running_syncs_with_instance_moved() {
    use gitops_shared::db::tenant_move::tenant_move;

    let db = TestDb::migrated().await;
    let (mut client, _a, _b, tenant) = moving_fixture(&db).await;
    let application = crate::support::application_row(&client, tenant.0).await;
    for (name, state) in [("running", "running"), ("pending", "pending"), ("done", "succeeded")] {
        client
            .execute(
                "INSERT INTO sync_operation (tenant_id, resource_uid, resource_name, generation, deployment_name,
                                             application_id, revision, state)
                 VALUES ($1, gen_random_uuid(), $2, 1, 'app', $3, 'main', $4::text::sync_operation_state)",
                &[&tenant.0, &name, &application, &state],
            )
            .await
            .expect("sync");
    }
    tenant_move(&mut client, "team-a", "b", "rebalance").await.expect("move");
    let rows = client
        .query("SELECT resource_name, state::text, failure_reason FROM sync_operation ORDER BY resource_name", &[])
        .await
        .expect("syncs");
    let syncs: Vec<(String, String, Option<String>)> =
        rows.iter().map(|row| (row.get(0), row.get(1), row.get(2))).collect();
    let moved = Some("InstanceMoved".to_owned());
    assert_eq!(
        syncs,
        [
            ("done".to_owned(), "succeeded".to_owned(), None),
            ("pending".to_owned(), "failed".to_owned(), moved.clone()),
            ("running".to_owned(), "failed".to_owned(), moved),
        ]
    );
}

#[tokio::test]
async fn a_move_between_instances_that_track_resources_differently_is_refused() {
    use gitops_shared::db::engine_instance::engine_instance_adoption_settings;
    use gitops_shared::db::tenant_move::tenant_move;

    let db = TestDb::migrated().await;
    let (mut client, a, b, _tenant) = moving_fixture(&db).await;
    let label = "app.kubernetes.io/instance";
    // Not reported by one side: nothing to compare, the move would go.
    engine_instance_adoption_settings(&client, a, "annotation", label, "").await.expect("settings");
    // Reported and different: refused, naming both and what differs.
    engine_instance_adoption_settings(&client, b, "label", label, "").await.expect("settings");
    let refused = tenant_move(&mut client, "team-a", "b", "test").await.expect_err("refused");
    let message = refused.to_string();
    assert!(message.contains("track resources by") && message.contains("\"annotation\""), "{message}");
    engine_instance_adoption_settings(&client, b, "annotation", label, "other-install").await.expect("settings");
    let refused = tenant_move(&mut client, "team-a", "b", "test").await.expect_err("refused");
    assert!(refused.to_string().contains("installationID"), "{refused}");
    // The same settings: the move starts.
    engine_instance_adoption_settings(&client, b, "annotation", label, "").await.expect("settings");
    tenant_move(&mut client, "team-a", "b", "test").await.expect("the move starts");
}
