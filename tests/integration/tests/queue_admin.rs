//! What operators see and do: the summary, the inspect queries, pruning, and the
//! plan of the claim query.

use std::time::Duration;

use gitops_shared::model::OperationState;
use gitops_shared::queue::{
    CLAIM_SQL, COMPLETE_SQL, FAIL_DEAD_SQL, FAIL_RETRY_SQL, NEXT_LEASE_EXPIRY_SQL, RENEW_SQL, operation_claim,
    operation_complete, operation_next_lease_expiry, operation_prune, queue_summary, xmin_horizon_holder,
};
use gitops_testkit::TestDb;
use tokio_postgres::IsolationLevel;

use crate::support::*;

#[tokio::test]
async fn the_claim_query_walks_its_partial_index_not_finished_rows() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    // Many finished operations and a few waiting ones, as in a long-running queue.
    fill_after_finished(
        &client,
        &fx,
        "INSERT INTO operation (engine_instance_id, tenant_id, resource_type, resource_id)
             SELECT {i}, {t}, 'application', g FROM generate_series(20001, 20010) g;
             ANALYZE operation;",
    )
    .await;
    // Consumers keep the claim prepared, so its plan may become the generic one
    // (planned without the parameters' values): both must read the same indexes.
    let (no_ids, no_tokens) = (Vec::<i64>::new(), Vec::<uuid::Uuid>::new());
    for plan_cache_mode in ["force_custom_plan", "force_generic_plan"] {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
            [&fx.instance.0, &10i64, &"agent", &30.0f64, &0i64, &no_ids, &no_tokens];
        let plan = explain(&mut client, CLAIM_SQL, &params, plan_cache_mode).await;
        assert!(plan.contains("operation_claim_idx"), "{plan_cache_mode}: claim must use operation_claim_idx:\n{plan}");
        // The scan starts at the claimer's floor: a bound on the index, not a filter.
        assert!(
            plan.lines().any(|line| line.contains("Index Cond") && line.contains("queue_key >= ")),
            "{plan_cache_mode}: the floor must bound the index scan:\n{plan}"
        );
        assert!(
            plan.contains("operation_one_claimed_idx"),
            "{plan_cache_mode}: the claimed-resource check must use its index:\n{plan}"
        );
        assert!(!plan.contains("Seq Scan on operation"), "{plan_cache_mode}: no sequential scan:\n{plan}");
    }
}

#[tokio::test]
async fn lease_checked_writes_find_their_rows_by_primary_key() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    // Statistics that see many finished operations and a handful of claimed ones:
    // the claimed-key and claimed-resource indexes look nearly empty to the planner, which
    // then preferred reading one of them whole to probing the ids it cannot see in a
    // generic plan (while a snapshot is held, that read visits every dead entry).
    fill_after_finished(
        &client,
        &fx,
        "INSERT INTO operation (engine_instance_id, tenant_id, resource_type, resource_id, state,
                                    lease_token, lease_expires_at)
             SELECT {i}, {t}, 'application', g, 'claimed', gen_random_uuid(), now() + interval '30 seconds'
               FROM generate_series(20001, 20005) g;
             ANALYZE operation;",
    )
    .await;
    let ids: Vec<i64> = vec![20_001, 20_002];
    let tokens: Vec<uuid::Uuid> = vec![uuid::Uuid::new_v4(), uuid::Uuid::new_v4()];
    let (id, token, text, lease_s, floor, limit) = (20_001i64, tokens[0], "x", 30.0f64, 0i64, 10i64);
    let statements: [(&str, &str, Vec<&(dyn tokio_postgres::types::ToSql + Sync)>); 5] = [
        ("claim", CLAIM_SQL, vec![&fx.instance.0, &limit, &text, &lease_s, &floor, &ids, &tokens]),
        ("complete", COMPLETE_SQL, vec![&ids, &tokens]),
        ("renew", RENEW_SQL, vec![&ids, &tokens, &lease_s]),
        ("dead-letter", FAIL_DEAD_SQL, vec![&id, &token, &text, &text]),
        ("retry", FAIL_RETRY_SQL, vec![&id, &token, &text, &text, &lease_s]),
    ];
    for (name, sql, params) in &statements {
        for plan_cache_mode in ["force_custom_plan", "force_generic_plan"] {
            let plan = explain(&mut client, sql, params, plan_cache_mode).await;
            let by_id = if name.ends_with("letter") || *name == "retry" {
                "Index Cond: (id = "
            } else {
                "Index Cond: (id = ANY ("
            };
            assert!(
                plan.lines().any(|line| line.trim_start().starts_with(by_id)),
                "{name}, {plan_cache_mode}: the lease check must probe the primary key:\n{plan}"
            );
            assert!(
                !plan.contains("operation_claimed_key_idx"),
                "{name}, {plan_cache_mode}: no claimed-key index:\n{plan}"
            );
            assert_eq!(whole_index_reads(&plan), Vec::<String>::new(), "{name}, {plan_cache_mode}:\n{plan}");
            assert!(!plan.contains("Seq Scan on operation"), "{name}, {plan_cache_mode}: no sequential scan:\n{plan}");
        }
    }
}

/// The index scans of `plan` (EXPLAIN text) that have no index condition: they read
/// the whole index.
fn whole_index_reads(plan: &str) -> Vec<String> {
    let lines: Vec<&str> = plan.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter(|(_, line)| line.contains("Scan using "))
        .filter(|(at, _)| !lines.get(at + 1).is_some_and(|next| next.trim_start().starts_with("Index Cond: ")))
        .map(|(_, line)| line.trim().to_owned())
        .collect()
}

#[tokio::test]
async fn the_next_lease_expiry_reads_the_claimed_operations_from_the_lease_floor() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    assert_eq!(operation_next_lease_expiry(&client, fx.instance).await.expect("nothing claimed"), None);
    // Many finished operations and a few claimed ones, one of them expired already.
    fill_after_finished(
        &client,
        &fx,
        "INSERT INTO operation (engine_instance_id, tenant_id, resource_type, resource_id, state,
                                    lease_token, lease_expires_at)
             SELECT {i}, {t}, 'application', g, 'claimed', gen_random_uuid(),
                    now() + (g - 20000) * interval '1 minute'
               FROM generate_series(20001, 20010) g;
             ANALYZE operation;",
    )
    .await;
    let next = operation_next_lease_expiry(&client, fx.instance).await.expect("next expiry").expect("claimed");
    assert!(
        next > Duration::from_secs(50) && next <= Duration::from_secs(60),
        "the earliest of the claimed leases, a minute away: {next:?}"
    );
    client
        .execute("UPDATE operation SET lease_expires_at = now() - interval '1 second' WHERE resource_id = 20005", &[])
        .await
        .expect("expire one");
    let next = operation_next_lease_expiry(&client, fx.instance).await.expect("next expiry");
    assert_eq!(next, Some(Duration::ZERO), "an expired lease is due now");

    let floor = 0i64;
    for plan_cache_mode in ["force_custom_plan", "force_generic_plan"] {
        let plan = explain(&mut client, NEXT_LEASE_EXPIRY_SQL, &[&fx.instance.0, &floor], plan_cache_mode).await;
        assert!(
            plan.lines().any(|line| line.contains("Index Cond") && line.contains("queue_key >= ")),
            "{plan_cache_mode}: the lease floor must bound a scan of operation_claimed_key_idx:\n{plan}"
        );
        assert!(plan.contains("operation_claimed_key_idx"), "{plan_cache_mode}:\n{plan}");
        assert!(!plan.contains("Seq Scan on operation"), "{plan_cache_mode}: no sequential scan:\n{plan}");
    }
}

#[tokio::test]
async fn a_pooled_claim_keeps_its_generic_plan_and_its_setting_to_its_own_transaction() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    for _ in 0..3 {
        new_application(&mut client, &fx).await;
    }
    let pool = gitops_shared::db::pool(&db.url(), 1, "claim-test").expect("pool");
    let pooled = gitops_shared::db::pooled(&pool).await.expect("a pooled connection");
    for expected in [1, 1, 1, 0] {
        let round = gitops_shared::queue::operation_complete_and_claim(
            &*pooled,
            fx.instance,
            "agent",
            1,
            Duration::from_secs(30),
            gitops_shared::queue::Floor::FROM_START,
            &[],
        )
        .await
        .expect("claim");
        assert_eq!(round.claimed.len(), expected);
    }
    // Committed, and the connection is back outside any transaction with its own setting.
    assert_eq!(count_in_state(&client, OperationState::Claimed).await, 3);
    let row = pooled
        .query_one(
            "SELECT current_setting('plan_cache_mode') AS mode, current_setting('enable_sort') AS sort,
                    pg_current_xact_id_if_assigned() IS NULL AS idle",
            &[],
        )
        .await
        .expect("the session");
    assert_eq!(row.get::<_, String>("mode"), "auto", "the setting ended with the claim's transaction");
    assert_eq!(row.get::<_, String>("sort"), "on", "so did the claim's order setting");
    assert!(row.get::<_, bool>("idle"), "no transaction left open");
    let row = pooled
        .query_one(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements
              WHERE statement LIKE '%FOR UPDATE OF o SKIP LOCKED%' AND statement NOT LIKE '%pg_prepared_statements%'",
            &[],
        )
        .await
        .expect("the kept claim");
    assert_eq!(
        (row.get::<_, i64>("generic_plans"), row.get::<_, i64>("custom_plans")),
        (4, 0),
        "every claim on the generic plan"
    );
}

#[tokio::test]
async fn the_summary_and_the_inspect_queries_show_the_queue() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    for _ in 0..3 {
        new_application(&mut client, &fx).await;
    }
    let claimed = operation_claim(&client, fx.instance, "agent", 1, Duration::from_secs(30)).await.expect("claim");
    operation_complete(&client, &[(claimed[0].id, claimed[0].lease.token())]).await.expect("complete");
    let summary = queue_summary(&client).await.expect("summary");
    let count = |state| summary.rows.iter().find(|r| r.state == state).map(|r| r.operations);
    assert_eq!(count(OperationState::Waiting), Some(2));
    assert_eq!(count(OperationState::Completed), None, "the depth is what is in the queue, not its history");
    assert!(summary.rows.iter().all(|r| r.instance == "argocd-1"));
    assert_eq!(summary.completed_last_hour, 1, "the history holds the completed operation");
    assert_eq!(summary.expired_leases, 0);

    // Every inspect query runs against the schema and says what it shows.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sql/inspect");
    let mut files: Vec<_> = std::fs::read_dir(&dir).expect("sql/inspect").map(|e| e.expect("entry").path()).collect();
    files.sort();
    assert!(files.len() >= 5, "inspect queries: {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        assert!(text.starts_with("-- "), "{} must open with a comment saying what it shows", file.display());
        client.batch_execute(&text).await.unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    }
}

#[tokio::test]
async fn pruning_removes_old_finished_operations_in_batches_and_keeps_dead_letters() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    fill(
        &client,
        &fx,
        "INSERT INTO operation_history (id, engine_instance_id, tenant_id, resource_type, resource_id, state, completed_at)
             SELECT nextval('operation_id_seq'), {i}, {t}, 'application', g, 'completed', now() - interval '2 days'
               FROM generate_series(1, 250) g;
             INSERT INTO operation (engine_instance_id, tenant_id, resource_type, resource_id, state, completed_at)
             SELECT {i}, {t}, 'application', g, 'failed', now() - interval '2 days' FROM generate_series(251, 260) g;
             INSERT INTO operation_history (id, engine_instance_id, tenant_id, resource_type, resource_id, state, completed_at)
             SELECT nextval('operation_id_seq'), {i}, {t}, 'application', g, 'completed', now()
               FROM generate_series(261, 270) g;
             -- Finished in the queue table by an agent of the release before V25.
             INSERT INTO operation (engine_instance_id, tenant_id, resource_type, resource_id, state, completed_at)
             SELECT {i}, {t}, 'application', g, 'completed', now() - interval '2 days' FROM generate_series(271, 275) g;",
    )
    .await;
    let day = Duration::from_secs(24 * 3600);
    assert_eq!(operation_prune(&client, Some(day), None, 100).await.expect("prune"), 105);
    let legacy: i64 =
        client.query_one("SELECT count(*) FROM operation WHERE state = 'completed'", &[]).await.expect("count").get(0);
    assert_eq!(legacy, 0, "what an older agent finished in the queue table is pruned too");
    assert_eq!(operation_prune(&client, Some(day), None, 100).await.expect("prune"), 100);
    assert_eq!(operation_prune(&client, Some(day), None, 100).await.expect("prune"), 50);
    assert_eq!(operation_prune(&client, Some(day), None, 100).await.expect("prune"), 0);
    assert_eq!(count_in_state(&client, OperationState::Failed).await, 10, "dead letters kept without a retention");
    assert_eq!(count_in_state(&client, OperationState::Completed).await, 10);
    let week = Duration::from_secs(7 * 24 * 3600);
    assert_eq!(operation_prune(&client, Some(day), Some(week), 100).await.expect("prune"), 0, "younger than a week");
    assert_eq!(operation_prune(&client, Some(day), Some(day), 100).await.expect("prune"), 10);
    assert_eq!(count_in_state(&client, OperationState::Failed).await, 0, "past their retention");
    assert_eq!(count_in_state(&client, OperationState::Completed).await, 10);
}

#[tokio::test]
async fn gitopsctl_discards_dead_letters_one_or_all_and_nothing_else() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    fill(
        &client,
        &fx,
        "INSERT INTO operation (engine_instance_id, tenant_id, resource_type, resource_id, state, completed_at)
             SELECT {i}, {t}, 'application', g, 'failed', now() FROM generate_series(1, 3) g;
             INSERT INTO operation (engine_instance_id, tenant_id, resource_type, resource_id)
             VALUES ({i}, {t}, 'application', 4);",
    )
    .await;
    let ids: Vec<i64> = client
        .query("SELECT id FROM operation ORDER BY resource_id", &[])
        .await
        .expect("ids")
        .iter()
        .map(|row| row.get("id"))
        .collect();
    let out = gitopsctl::queue::discard(&db.url(), ids[0]).await.expect("discard one");
    assert_eq!(out, format!("operation {} discarded\n", ids[0]));
    let waiting = gitopsctl::queue::discard(&db.url(), ids[3]).await;
    assert!(matches!(waiting, Err(gitopsctl::error::CtlError::NotFailed { .. })), "a waiting one stays: {waiting:?}");
    let out = gitopsctl::queue::discard_all_failed(&db.url()).await.expect("discard all");
    assert_eq!(out, "2 failed operations discarded\n");
    assert_eq!(count_in_state(&client, OperationState::Failed).await, 0);
    assert_eq!(count_in_state(&client, OperationState::Waiting).await, 1);
}

/// Inserts operations with `sql`, where `{i}` and `{t}` stand for the fixture's
/// instance and tenant ids.
async fn fill(client: &tokio_postgres::Client, fx: &Fixture, sql: &str) {
    let sql = sql.replace("{i}", &fx.instance.0.to_string()).replace("{t}", &fx.tenant.0.to_string());
    client.batch_execute(&sql).await.expect("fill");
}

/// 20,000 finished operations (resources 1–20,000) in the history, and 20,000 waiting
/// on a busy neighbour instance, as a long-running queue of a fleet has, then `sql`
/// as `fill` runs it.
async fn fill_after_finished(client: &tokio_postgres::Client, fx: &Fixture, sql: &str) {
    let finished =
        "INSERT INTO operation_history (id, engine_instance_id, tenant_id, resource_type, resource_id, state)
                    SELECT nextval('operation_id_seq'), {i}, {t}, 'application', g, 'completed'
                      FROM generate_series(1, 20000) g;
                    INSERT INTO engine_instance (name, argocd_namespace) VALUES ('busy-neighbour', 'argocd');
                    INSERT INTO operation (engine_instance_id, tenant_id, resource_type, resource_id)
                    SELECT (SELECT id FROM engine_instance WHERE name = 'busy-neighbour'), {t}, 'application', g
                      FROM generate_series(100001, 120000) g;";
    fill(client, fx, &format!("{finished}\n{sql}")).await;
}

/// The plan of `sql` with `params` as EXPLAIN prints it, planned as
/// `plan_cache_mode` (`force_custom_plan` or `force_generic_plan`) says: consumers
/// keep their statements prepared, so the generic plan is the one that runs.
async fn explain(
    client: &mut tokio_postgres::Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    plan_cache_mode: &str,
) -> String {
    let txn = client.transaction().await.expect("begin");
    txn.batch_execute(&format!("SET LOCAL plan_cache_mode = {plan_cache_mode}")).await.expect("plan mode");
    let plan: Vec<String> = txn
        .query(&format!("EXPLAIN {sql}"), params)
        .await
        .unwrap_or_else(|e| panic!("explain: {e}\n{sql}"))
        .iter()
        .map(|row| row.get(0))
        .collect();
    txn.rollback().await.expect("rollback");
    plan.join("\n")
}

#[tokio::test]
async fn gitopsctl_names_the_session_holding_the_oldest_snapshot_once_past_the_threshold() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    new_application(&mut client, &fx).await;
    // An operator's psql left in a REPEATABLE READ transaction after a look at the queue.
    let mut held = gitops_shared::db::connect(&db.url(), "held-by-an-operator").await.expect("connect");
    let pid: i32 = held.query_one("SELECT pg_backend_pid()", &[]).await.expect("pid").get(0);
    let txn = held.build_transaction().isolation_level(IsolationLevel::RepeatableRead).start().await.expect("begin");
    txn.query_one("SELECT count(*) FROM operation", &[]).await.expect("look at the queue");
    // Transactions that come after it make its snapshot old in XIDs.
    for _ in 0..5 {
        client.query_one("SELECT txid_current()", &[]).await.expect("a transaction id");
    }
    let holder = eventually("the held snapshot to be the oldest", || async {
        let holder = xmin_horizon_holder(&client).await.expect("holder")?;
        (holder.pid == Some(pid) && holder.age_xids >= 5).then_some(holder)
    })
    .await;
    assert_eq!(holder.kind, "session");
    assert_eq!(holder.name, "held-by-an-operator");
    assert_eq!(holder.state.as_deref(), Some("idle in transaction"));

    let (summary, found) = gitopsctl::queue::summary(&db.url()).await.expect("summary");
    let found = found.expect("a holder");
    let named = gitopsctl::queue::render_summary(&summary, Some(&found), Duration::ZERO);
    assert!(named.contains(&format!("pid {pid} (held-by-an-operator")), "names the holder:\n{named}");
    let quiet = gitopsctl::queue::render_summary(&summary, Some(&found), Duration::from_secs(3600));
    assert!(!quiet.contains("oldest snapshot"), "says nothing below the threshold:\n{quiet}");

    txn.rollback().await.expect("end it");
    eventually("no session of the database to hold a snapshot", || async {
        let holder = xmin_horizon_holder(&client).await.expect("holder");
        holder.is_none_or(|h| h.pid != Some(pid)).then_some(())
    })
    .await;
}
