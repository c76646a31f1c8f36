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
    assert!(message.contains("full or closed to new tenants"), "the tenant reads why: {message}");
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
