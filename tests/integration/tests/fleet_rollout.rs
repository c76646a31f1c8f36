//! Rollouts raced with real connections: rollouts started at once never share a
//! tenant (each tenant is in at most one active rollout and moves to that
//! rollout's target), two to the same target leave exactly one; and the rest of
//! the fleet leaves them alone: operators' moves of a cohort tenant or onto a
//! rollout's target are refused, placement skips the target, balancing does not
//! move a cohort tenant. An abort waits for the moves in flight, and a rollout
//! rolling back can be neither aborted again nor promoted. An abort made while a
//! step is under way is not overwritten by the step. A rollback brings its tenants
//! home even when their source was cordoned or filled up meanwhile (their slots
//! are held), and a placement that chose an instance just before a rollout to it
//! started lands elsewhere. A wave does not wait for deployments the tenant edits
//! during it (they are excluded from the verdict).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gitops_shared::db::application::application_upsert_in_txn;
use gitops_shared::db::engine_instance::{engine_instance_add, engine_instance_heartbeat};
use gitops_shared::db::fleet_balance::{BalanceSettings, balance_step};
use gitops_shared::db::placement::placement_choose_in_txn;
use gitops_shared::db::rollout::{
    Cohort, RolloutRequest, rollout_abort, rollout_list, rollout_promote, rollout_start, rollout_step,
};
use gitops_shared::db::tenant::tenant_upsert_locked_in_txn;
use gitops_shared::db::tenant_move::tenant_move;
use gitops_shared::db::{DbError, in_txn_retrying};
use gitops_shared::model::{EngineInstanceId, TenantId};
use gitops_testkit::TestDb;
use tokio::sync::Barrier;
use uuid::Uuid;

use crate::support::intent;

fn request(target: &str, tenants: u32) -> RolloutRequest {
    RolloutRequest {
        target: target.to_owned(),
        cohort: Cohort::Tenants(tenants),
        from: None,
        bake: Duration::from_secs(60),
        max_regressions: None,
        wave_size: None,
    }
}

/// Registers instance `name` (Argo CD namespace `argo-<name>`) and heartbeats it.
async fn live_instance(client: &tokio_postgres::Client, name: &str, capacity: i32) -> EngineInstanceId {
    let id = engine_instance_add(client, name, &format!("argo-{name}"), capacity).await.expect("add");
    engine_instance_heartbeat(client, id).await.expect("heartbeat");
    id
}

/// Places a tenant of namespace `namespace` on `instance`.
async fn place(client: &mut tokio_postgres::Client, namespace: String, instance: EngineInstanceId) {
    in_txn_retrying(client, |txn| {
        let namespace = namespace.clone();
        Box::pin(async move { tenant_upsert_locked_in_txn(txn, Uuid::new_v4(), &namespace, Some(instance)).await })
    })
    .await
    .expect("tenant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rollouts_racing_for_tenants_never_share_one() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let source = live_instance(&client, "source", 100).await;
    for name in ["blue", "green", "spare"] {
        live_instance(&client, name, 100).await;
    }
    for i in 0..12 {
        place(&mut client, format!("team-{i:02}"), source).await;
    }

    // Four racers: two to each target, each asking for 8 of the 12 tenants.
    let barrier = Arc::new(Barrier::new(4));
    let racers: Vec<_> = ["blue", "green", "blue", "green"]
        .into_iter()
        .map(|target| {
            let (url, barrier) = (db.url(), barrier.clone());
            tokio::spawn(async move {
                let mut client = gitops_shared::db::connect(&url, "rollout-race").await.expect("connect");
                barrier.wait().await;
                (target, rollout_start(&mut client, request(target, 8)).await)
            })
        })
        .collect();
    let mut cohorts: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut refused = Vec::new();
    for racer in racers {
        match racer.await.expect("a racer") {
            (target, Ok(started)) => {
                assert!(cohorts.insert(target, started.cohort).is_none(), "two rollouts to {target} started");
            }
            (_, Err(DbError::InvalidMove { message })) => refused.push(message),
            (_, Err(error)) => panic!("a racer failed: {error:?}"),
        }
    }
    assert!(!cohorts.is_empty(), "a rollout started");
    assert_eq!(cohorts.len() + refused.len(), 4);
    assert!(refused.len() >= 2, "at most one rollout per target: {refused:?}");
    // No tenant in two cohorts, 12 tenants at most, and each one moving to its rollout's target.
    let mut all: Vec<&String> = cohorts.values().flatten().collect();
    let total = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), total, "a tenant in two cohorts: {cohorts:?}");
    let rows = client
        .query(
            "SELECT t.namespace_name, e.name, count(rt.rollout_id) FILTER (WHERE rt.active) AS rollouts
               FROM tenant t JOIN engine_instance e ON e.id = t.engine_instance_id
               LEFT JOIN rollout_tenant rt ON rt.tenant_id = t.id
              GROUP BY 1, 2",
            &[],
        )
        .await
        .expect("placements");
    for row in &rows {
        let (namespace, instance, rollouts): (String, String, i64) = (row.get(0), row.get(1), row.get(2));
        assert!(rollouts <= 1, "{namespace} in {rollouts} rollouts");
        let target = cohorts.iter().find(|(_, cohort)| cohort.contains(&namespace)).map(|(target, _)| *target);
        assert_eq!(instance, target.unwrap_or("source"), "{namespace} is where its rollout (if any) sends it");
        assert_eq!(rollouts, i64::from(target.is_some()));
    }

    // The rest of the fleet leaves them alone.
    let (target, cohort) = cohorts.iter().next().expect("a cohort");
    let member = cohort[0].clone();
    let error = tenant_move(&mut client, &member, "spare", "operator").await.expect_err("a cohort tenant stays");
    assert!(error.to_string().contains("in rollout"), "{error}");
    let free: Vec<String> = rows.iter().map(|row| row.get::<_, String>(0)).filter(|ns| !all.contains(&ns)).collect();
    if let Some(free) = free.first() {
        let error = tenant_move(&mut client, free, target, "operator").await.expect_err("the target takes no others");
        assert!(error.to_string().contains("target of a rollout"), "{error}");
    }
    let chosen = in_txn_retrying(&mut client, |txn| {
        Box::pin(async move { placement_choose_in_txn(txn, Duration::from_secs(60)).await })
    })
    .await
    .expect("choose")
    .expect("an instance");
    let name: String =
        client.query_one("SELECT name FROM engine_instance WHERE id = $1", &[&chosen.0]).await.expect("name").get(0);
    assert!(!cohorts.contains_key(name.as_str()), "placement chose a rollout's target {name}");
    // Balancing never takes a rollout's target (nor moves its tenants).
    let step = balance_step(
        &mut client,
        BalanceSettings { degraded_grace: None, rebalance_threshold: Some(0.0), max_concurrent_moves: 100 },
    )
    .await
    .expect("balance");
    assert!(step.moves.iter().all(|m| !cohorts.contains_key(m.to.as_str())), "{:?}", step.moves);
    assert!(step.moves.iter().all(|m| !all.contains(&&m.namespace)), "{:?}", step.moves);

    // An abort while the cohort still moves: rolling back, which waits for the moves
    // in flight; a second abort or a promotion is refused with the rollout's state.
    let id = rollout_list(&client, None).await.expect("list").into_iter().find(|r| r.target == *target).expect("it").id;
    rollout_abort(&client, id, "test").await.expect("abort");
    let step = rollout_step(&mut client).await.expect("a step");
    assert!(step.active.contains(&(id, "rolling_back".to_owned())), "{step:?}");
    let again = rollout_abort(&client, id, "test").await.expect_err("aborted already");
    assert!(again.to_string().contains("is rolling_back"), "{again}");
    let promote = rollout_promote(&client, id, None).await.expect_err("not promotable");
    assert!(promote.to_string().contains("is rolling_back"), "{promote}");
    let missing = rollout_abort(&client, 9999, "test").await.expect_err("no such rollout");
    assert!(missing.to_string().contains("not found"), "{missing}");
    let still: i64 = client
        .query_one("SELECT count(*) FROM rollout_tenant WHERE rollout_id = $1 AND active", &[&id])
        .await
        .expect("count")
        .get(0);
    assert_eq!(still, i64::try_from(cohorts[*target].len()).expect("count"), "its tenants stay its own");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_abort_during_a_step_is_not_overwritten_by_it() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let source = live_instance(&client, "source", 100).await;
    live_instance(&client, "target", 100).await;
    for i in 0..2 {
        place(&mut client, format!("team-{i}"), source).await;
    }
    let started = rollout_start(&mut client, request("target", 2)).await.expect("start");
    assert_eq!(started.cohort.len(), 2);
    let id = rollout_list(&client, None).await.expect("list")[0].id;
    // The moves arrive (as the agents would finish them); the next step records the
    // arrivals and starts the bake. It is held in the middle, after it read the
    // rollout as moving: another session holds one of the rows it updates.
    client
        .execute("UPDATE tenant SET move_state = NULL, moving_from = NULL WHERE move_state IS NOT NULL", &[])
        .await
        .expect("moves done");
    let mut holder = db.connect().await;
    let hold = holder.transaction().await.expect("begin");
    hold.query("SELECT 1 FROM rollout_tenant WHERE rollout_id = $1 FOR UPDATE", &[&id]).await.expect("hold");
    let step = {
        let url = db.url();
        tokio::spawn(async move {
            let mut client = gitops_shared::db::connect(&url, "rollout-step").await.expect("connect");
            rollout_step(&mut client).await
        })
    };
    let waiting = |application: &'static str| {
        let client = &client;
        async move {
            let blocked: i64 = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
                    &[&application],
                )
                .await
                .expect("sessions")
                .get(0);
            (blocked > 0).then_some(())
        }
    };
    crate::support::eventually("the step to wait for the held row", || waiting("rollout-step")).await;
    let abort = {
        let url = db.url();
        tokio::spawn(async move {
            let client = gitops_shared::db::connect(&url, "rollout-abort").await.expect("connect");
            rollout_abort(&client, id, "mid-step").await
        })
    };
    crate::support::eventually("the abort to wait for the step", || waiting("rollout-abort")).await;
    hold.rollback().await.expect("release");
    let stepped = step.await.expect("join").expect("the step");
    assert!(stepped.active.contains(&(id, "baking".to_owned())), "the step finished as it began: {stepped:?}");
    abort.await.expect("join").expect("the abort applies after the step");
    let rollout = rollout_list(&client, Some(id)).await.expect("list").pop().expect("the rollout");
    assert_eq!(rollout.state, "rolling_back", "the abort stands: {rollout:?}");
    let step = rollout_step(&mut client).await.expect("a step");
    assert!(step.active.contains(&(id, "rolling_back".to_owned())), "{step:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_returns_tenants_to_a_source_cordoned_since() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let source = live_instance(&client, "source", 10).await;
    for name in ["target", "spare"] {
        live_instance(&client, name, 100).await;
    }
    for i in 0..2 {
        place(&mut client, format!("team-{i}"), source).await;
    }
    let started = rollout_start(&mut client, request("target", 1)).await.expect("start");
    let moved = started.cohort[0].clone();
    client
        .execute("UPDATE tenant SET move_state = NULL, moving_from = NULL WHERE move_state IS NOT NULL", &[])
        .await
        .expect("move done");
    // Meanwhile the source was cordoned: an ordinary move there is refused.
    client.execute("UPDATE engine_instance SET cordoned = true WHERE id = $1", &[&source]).await.expect("cordon");
    assert_eq!(started.cohort.len(), 1);
    let other = ["team-0", "team-1"].into_iter().find(|ns| *ns != moved).expect("the other tenant");
    tenant_move(&mut client, other, "spare", "operator").await.expect("an ordinary move elsewhere");
    client.execute("UPDATE tenant SET move_state = NULL, moving_from = NULL WHERE move_state IS NOT NULL AND namespace_name = $1", &[&other]).await.expect("move done");
    let back = tenant_move(&mut client, other, "source", "operator").await.expect_err("the source is cordoned");
    assert!(back.to_string().contains("cordoned"), "{back}");
    let id = rollout_list(&client, None).await.expect("list")[0].id;
    rollout_abort(&client, id, "test").await.expect("abort");
    rollout_step(&mut client).await.expect("a step");
    let row = client
        .query_one(
            "SELECT e.name, t.move_state FROM tenant t JOIN engine_instance e ON e.id = t.engine_instance_id
              WHERE t.namespace_name = $1",
            &[&moved],
        )
        .await
        .expect("the tenant");
    let (instance, state): (String, Option<String>) = (row.get(0), row.get(1));
    assert_eq!(instance, "source", "the rollback moves it home");
    assert_eq!(state.as_deref(), Some("releasing"), "by the move protocol");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_finds_its_tenants_slots_on_a_source_that_filled_up_meanwhile() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let source = live_instance(&client, "source", 2).await;
    live_instance(&client, "target", 100).await;
    for i in 0..2 {
        place(&mut client, format!("team-{i}"), source).await;
    }
    let started = rollout_start(&mut client, request("target", 1)).await.expect("start");
    let moved = started.cohort[0].clone();
    client
        .execute("UPDATE tenant SET move_state = NULL, moving_from = NULL WHERE move_state IS NOT NULL", &[])
        .await
        .expect("move done");
    async fn held(client: &tokio_postgres::Client, source: EngineInstanceId) -> (i32, i32) {
        let row = client
            .query_one("SELECT tenants, reserved FROM engine_instance WHERE id = $1", &[&source])
            .await
            .expect("source");
        (row.get(0), row.get(1))
    }
    assert_eq!(held(&client, source).await, (1, 1), "one tenant left, one slot held for the tenant that moved");

    // A new tenant finds the source full: neither placement nor a direct insert
    // takes the held slot, and nothing else has room.
    let txn = client.transaction().await.expect("begin");
    let chosen = placement_choose_in_txn(&txn, Duration::from_secs(60)).await.expect("choose");
    assert!(chosen.is_err(), "only the rollout's target has room, and it takes no other tenants: {chosen:?}");
    let refused = tenant_upsert_locked_in_txn(&txn, Uuid::new_v4(), "newcomer", Some(source))
        .await
        .expect_err("the held slot is not free");
    assert!(server_message(&refused).contains("full"), "{refused:?}");
    drop(txn);
    let refused = tenant_move(&mut client, "team-1", "source", "operator").await.expect_err("on it already");
    assert!(refused.to_string().contains("already"), "{refused}");

    let id = started.id;
    rollout_abort(&client, id, "test").await.expect("abort");
    rollout_step(&mut client).await.expect("a step");
    let row = client
        .query_one(
            "SELECT e.name FROM tenant t JOIN engine_instance e ON e.id = t.engine_instance_id WHERE t.namespace_name = $1",
            &[&moved],
        )
        .await
        .expect("the tenant");
    assert_eq!(row.get::<_, String>(0), "source", "the rollback takes the held slot");
    assert_eq!(held(&client, source).await, (2, 0), "the slot became the tenant's again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_that_chose_an_instance_before_a_rollout_to_it_started_lands_elsewhere() {
    let db = TestDb::migrated().await;
    let mut placing = db.connect().await;
    let mut operator = db.connect().await;
    let source = live_instance(&placing, "a-source", 10).await;
    let target = live_instance(&placing, "b-target", 10).await;
    live_instance(&placing, "c-other", 10).await;
    place(&mut placing, "team-0".to_owned(), source).await;
    place(&mut placing, "team-1".to_owned(), source).await;
    client_fill(&mut placing, "c-other", 1).await;

    // The placement chose the empty target, and has not written yet.
    let txn = placing.transaction().await.expect("begin");
    let chosen = placement_choose_in_txn(&txn, Duration::from_secs(60)).await.expect("choose").expect("room");
    assert_eq!(chosen, target, "the emptiest instance");
    // Meanwhile a rollout to it starts.
    rollout_start(&mut operator, request("b-target", 1)).await.expect("start");
    let refused = tenant_upsert_locked_in_txn(&txn, Uuid::new_v4(), "newcomer", Some(chosen))
        .await
        .expect_err("the target of a rollout takes no other tenants");
    assert!(refused.is_retryable_conflict(), "the placement runs again: {refused}");
    assert!(server_message(&refused).contains("target of a rollout"), "{refused:?}");
    drop(txn);

    // Run again, as the writer does, it chooses another instance.
    let placed = in_txn_retrying(&mut placing, |txn| {
        Box::pin(async move {
            let instance = placement_choose_in_txn(txn, Duration::from_secs(60)).await?.expect("room");
            tenant_upsert_locked_in_txn(txn, Uuid::new_v4(), "newcomer", Some(instance)).await?;
            Ok(instance)
        })
    })
    .await
    .expect("placed");
    assert_ne!(placed, target);
    // And an operator's move raced the same way is refused by the database too.
    let refused = placing
        .execute(
            "UPDATE tenant SET engine_instance_id = $1, moving_from = engine_instance_id, move_state = 'releasing'
              WHERE namespace_name = 'newcomer'",
            &[&target],
        )
        .await
        .expect_err("the trigger refuses");
    let message = refused.as_db_error().map(|e| e.message().to_owned()).unwrap_or_default();
    assert!(message.contains("target of a rollout"), "{refused:?}");
}

/// What the database said, for an error from a statement.
fn server_message(error: &DbError) -> String {
    match error {
        DbError::Query { source, .. } => source.as_db_error().map(|e| e.message().to_owned()).unwrap_or_default(),
        _ => String::new(),
    }
}

/// Places `n` tenants on instance `name`.
async fn client_fill(client: &mut tokio_postgres::Client, name: &str, n: usize) {
    let id: EngineInstanceId =
        client.query_one("SELECT id FROM engine_instance WHERE name = $1", &[&name]).await.expect("instance").get(0);
    for i in 0..n {
        place(client, format!("{name}-tenant-{i}"), id).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wave_bakes_without_waiting_for_deployments_edited_since_their_baseline() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let source = live_instance(&client, "source", 10).await;
    let target = live_instance(&client, "target", 10).await;
    place(&mut client, "team-0".to_owned(), source).await;
    let tenant: i64 =
        client.query_one("SELECT id FROM tenant WHERE namespace_name = 'team-0'", &[]).await.expect("tenant").get(0);
    // Two deployments, both applied and healthy on the source.
    let mut applications = Vec::new();
    for _ in 0..2 {
        let txn = client.transaction().await.expect("begin");
        let id = application_upsert_in_txn(&txn, TenantId(tenant), &intent(Uuid::new_v4(), 1))
            .await
            .expect("upsert")
            .expect("new row")
            .0;
        txn.execute(
            "INSERT INTO application_state (application_id, tenant_id, health_status, sync_status, applied_generation)
             VALUES ($1, $2, 'Healthy', 'Synced', 1)",
            &[&id, &tenant],
        )
        .await
        .expect("state");
        txn.commit().await.expect("commit");
        applications.push(id);
    }
    let mut zero_bake = request("target", 1);
    zero_bake.bake = Duration::ZERO;
    let started = rollout_start(&mut client, zero_bake).await.expect("start");
    client
        .execute("UPDATE tenant SET move_state = NULL, moving_from = NULL WHERE move_state IS NOT NULL", &[])
        .await
        .expect("move done");
    // On the target the first is applied again; the second the tenant keeps editing.
    client
        .execute("UPDATE application_state SET applied_generation = 1 WHERE application_id = $1", &[&applications[0]])
        .await
        .expect("applied");
    client
        .execute("UPDATE application SET generation = generation + 5 WHERE id = $1", &[&applications[1]])
        .await
        .expect("edited");
    let step = rollout_step(&mut client).await.expect("a step");
    assert!(step.active.contains(&(started.id, "baking".to_owned())), "the wave bakes: {step:?}");
    let step = rollout_step(&mut client).await.expect("a step");
    assert!(step.active.contains(&(started.id, "waiting".to_owned())), "the canary passed: {step:?}");
    let verdicts: BTreeMap<i64, String> = client
        .query("SELECT application_id, verdict FROM rollout_baseline WHERE rollout_id = $1", &[&started.id])
        .await
        .expect("verdicts")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(verdicts[&applications[0]], "ok");
    assert_eq!(verdicts[&applications[1]], "excluded", "edited during the move: not judged");
    let on: EngineInstanceId =
        client.query_one("SELECT engine_instance_id FROM tenant WHERE id = $1", &[&tenant]).await.expect("t").get(0);
    assert_eq!(on, target);
}
