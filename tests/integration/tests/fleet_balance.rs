//! Automatic balancing, as the writers' fleet watch runs it: an instance degraded past
//! the grace is cordoned and drained by ordinary moves; rebalancing starts above its
//! threshold and, while its moves run, goes on down to half of it; and however many
//! writers take a step at once, the fleet never has more moves in progress than the
//! limit.

use std::time::Duration;

use gitops_shared::db::engine_instance::{
    engine_instance_add, engine_instance_heartbeat, engine_instance_list, engine_instance_progress,
};
use gitops_shared::db::fleet_balance::{BalanceSettings, balance_step};
use gitops_shared::model::EngineInstanceId;
use gitops_testkit::TestDb;
use tokio_postgres::Client;
use uuid::Uuid;

/// A live instance whose Argo CD makes progress.
async fn instance(client: &Client, name: &str, capacity: i32) -> EngineInstanceId {
    let id = engine_instance_add(client, name, &format!("argo-{name}"), capacity).await.expect("add");
    engine_instance_heartbeat(client, id).await.expect("heartbeat");
    engine_instance_progress(client, id).await.expect("progress");
    id
}

async fn tenants(client: &Client, on: EngineInstanceId, count: usize, prefix: &str) {
    for i in 0..count {
        client
            .execute(
                "INSERT INTO tenant (namespace_uid, namespace_name, engine_instance_id) VALUES ($1, $2, $3)",
                &[&Uuid::new_v4(), &format!("{prefix}-{i}"), &on.0],
            )
            .await
            .expect("tenant");
    }
}

/// Every move in progress ends (as the agents would finish them).
async fn finish_moves(client: &Client) {
    client
        .execute(
            "UPDATE tenant SET moving_from = NULL, move_state = NULL, move_reason = NULL WHERE move_state IS NOT NULL",
            &[],
        )
        .await
        .expect("moves end");
}

/// Balancing that drains instances degraded for a minute, three moves at a time.
fn draining() -> BalanceSettings {
    BalanceSettings {
        degraded_grace: Some(Duration::from_secs(60)),
        rebalance_threshold: None,
        max_concurrent_moves: 3,
    }
}

/// `instance`'s Argo CD last made progress `ago` (a PostgreSQL interval) ago.
async fn stalled(client: &Client, instance: EngineInstanceId, ago: &str) {
    client
        .execute(
            "UPDATE engine_instance SET progress_at = now() - ($2::text)::interval WHERE id = $1",
            &[&instance.0, &ago],
        )
        .await
        .expect("stall");
}

async fn moving(client: &Client) -> i64 {
    client.query_one("SELECT count(*) FROM tenant WHERE move_state IS NOT NULL", &[]).await.expect("count").get(0)
}

#[tokio::test]
async fn an_instance_degraded_past_the_grace_is_cordoned_and_drained_within_the_move_limit() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let a = instance(&client, "a", 10).await;
    instance(&client, "b", 10).await;
    instance(&client, "c", 10).await;
    tenants(&client, a, 4, "team").await;
    let settings = draining();

    // Degraded, but not yet for the grace: nothing happens.
    stalled(&client, a, "120 seconds").await;
    let step = balance_step(&mut client, settings).await.expect("step");
    assert!(step.drained.is_empty() && step.moves.is_empty(), "{step:?}");

    // Past the default degraded window (90 s) plus the grace: cordoned, three moves.
    stalled(&client, a, "10 minutes").await;
    let step = balance_step(&mut client, settings).await.expect("step");
    assert_eq!(step.drained, ["a"]);
    assert_eq!(step.moves.len(), 3, "{step:?}");
    assert!(step.moves.iter().all(|m| m.from == "a" && m.reason == "degraded" && m.to != "a"));
    assert!(step.moves.iter().any(|m| m.to == "b") && step.moves.iter().any(|m| m.to == "c"), "spread: {step:?}");
    let listed = engine_instance_list(&client).await.expect("list");
    assert!(listed.iter().any(|i| i.name == "a" && i.cordoned), "a is cordoned");

    // The limit holds while they run; once they end, the last tenant moves.
    assert!(balance_step(&mut client, settings).await.expect("step").moves.is_empty());
    finish_moves(&client).await;
    let step = balance_step(&mut client, settings).await.expect("step");
    assert_eq!(step.moves.len(), 1, "{step:?}");
    finish_moves(&client).await;
    let left: i64 = client
        .query_one("SELECT count(*) FROM tenant WHERE engine_instance_id = $1", &[&a.0])
        .await
        .expect("count")
        .get(0);
    assert_eq!(left, 0, "a is empty");
}

/// A degraded instance with nowhere to drain to is left open: a cordon would keep
/// new tenants off it after it recovers. Once another instance can take its
/// tenants, it is cordoned and drained.
#[tokio::test]
async fn a_degraded_instance_with_nowhere_to_drain_to_stays_open_until_there_is() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let solo = instance(&client, "solo", 10).await;
    tenants(&client, solo, 2, "team").await;
    let settings = draining();
    stalled(&client, solo, "10 minutes").await;
    let step = balance_step(&mut client, settings).await.expect("step");
    assert!(step.drained.is_empty() && step.moves.is_empty(), "{step:?}");
    assert_eq!(step.stranded, ["solo"]);
    let listed = engine_instance_list(&client).await.expect("list");
    assert!(listed.iter().any(|i| i.name == "solo" && !i.cordoned), "solo stays open");

    instance(&client, "b", 10).await;
    let step = balance_step(&mut client, settings).await.expect("step");
    assert_eq!(step.drained, ["solo"]);
    assert!(step.stranded.is_empty(), "{step:?}");
    assert_eq!(step.moves.len(), 2, "{step:?}");
    assert!(step.moves.iter().all(|m| m.from == "solo" && m.to == "b"), "{step:?}");
}

#[tokio::test]
async fn rebalancing_starts_above_its_threshold_and_goes_on_to_half_of_it() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let x = instance(&client, "x", 10).await;
    let y = instance(&client, "y", 10).await;
    tenants(&client, x, 6, "x").await;
    tenants(&client, y, 3, "y").await;
    let settings = BalanceSettings { degraded_grace: None, rebalance_threshold: Some(0.4), max_concurrent_moves: 5 };

    // 0.6 against 0.3: within the threshold.
    assert!(balance_step(&mut client, settings).await.expect("step").moves.is_empty());
    // 0.8 against 0.3: one move brings it to 0.7 / 0.4, within 0.4.
    tenants(&client, x, 2, "x-more").await;
    let step = balance_step(&mut client, settings).await.expect("step");
    assert_eq!(
        step.moves.iter().map(|m| (m.from.as_str(), m.to.as_str(), m.reason)).collect::<Vec<_>>(),
        [("x", "y", "rebalance")]
    );
    // While it runs the rebalance goes on to half the threshold: 0.7 / 0.4 → 0.6 / 0.5.
    let step = balance_step(&mut client, settings).await.expect("step");
    assert_eq!(step.moves.len(), 1, "{step:?}");
    // Once its moves ended, 0.1 apart is well within the threshold.
    finish_moves(&client).await;
    assert!(balance_step(&mut client, settings).await.expect("step").moves.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_balancing_at_once_never_pass_the_move_limit() {
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    let full = instance(&client, "full", 100).await;
    for name in ["e1", "e2", "e3"] {
        instance(&client, name, 100).await;
    }
    tenants(&client, full, 40, "team").await;
    let settings = BalanceSettings { degraded_grace: None, rebalance_threshold: Some(0.05), max_concurrent_moves: 4 };
    for _round in 0..3 {
        let steps = (0..8).map(|_| {
            let url = db.url();
            tokio::spawn(async move {
                let mut client = gitops_shared::db::connect(&url, "balancer").await.expect("connect");
                balance_step(&mut client, settings).await.expect("step")
            })
        });
        let mut started = 0;
        for step in steps {
            started += step.await.expect("balancer").moves.len();
        }
        assert!(started <= 4, "{started} moves started by writers at once");
        assert!(moving(&client).await <= 4, "more than the limit in progress");
        finish_moves(&client).await;
    }
    let listed = engine_instance_list(&client).await.expect("list");
    assert!(listed.iter().all(|i| i.tenants <= i64::from(i.capacity)));
    let on_full = listed.iter().find(|i| i.name == "full").map(|i| i.tenants);
    assert!(on_full < Some(40), "tenants moved off the full instance: {on_full:?}");
}
