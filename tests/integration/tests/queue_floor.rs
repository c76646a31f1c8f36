//! The fair claim order and claim floors: a quiet tenant is not stuck behind a noisy
//! one, a held snapshot does not make the claim walk what was claimed before, and
//! what an optimistic floor passed over is claimed after the next safe floor.

use std::time::Duration;

use gitops_shared::model::{EngineInstanceId, OperationId, TenantId};
use gitops_shared::queue::{
    CLAIM_SQL, ClaimedOperation, Floor, RetryPolicy, operation_claim, operation_complete, operation_complete_and_claim,
    operation_lease_floor, operation_next_lease_expiry, operation_reclaim_expired, operation_safe_floor,
};
use gitops_testkit::TestDb;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::*;

const LEASE: Duration = Duration::from_secs(60);

/// Inserts `count` waiting operations of `tenant`, for resources `first..first+count`.
async fn enqueue_many(client: &Client, instance: EngineInstanceId, tenant: TenantId, first: i64, count: i64) {
    client
        .execute(
            "INSERT INTO operation (engine_instance_id, tenant_id, resource_type, resource_id)
             SELECT $1, $2, 'application', g FROM generate_series($3::bigint, $3 + $4 - 1) g",
            &[&instance.0, &tenant.0, &first, &count],
        )
        .await
        .expect("enqueue");
}

/// A safe floor found from the start, with nobody writing.
async fn safe_floor(client: &Client, instance: EngineInstanceId) -> Floor {
    operation_safe_floor(client, instance, Floor::FROM_START, Duration::from_secs(5))
        .await
        .expect("safe floor")
        .expect("nobody is writing")
}

/// The resources of what one claim from `floor` took, in order.
async fn claim_from(client: &Client, instance: EngineInstanceId, floor: Floor) -> Vec<i64> {
    let round = operation_complete_and_claim(client, instance, "agent", 64, LEASE, floor, &[]).await.expect("claim");
    let mut claimed: Vec<i64> = round.claimed.iter().map(|op| op.resource_id).collect();
    claimed.sort_unstable();
    claimed
}

/// An operator's REPEATABLE READ session that looked at the queue and stays open
/// until its ROLLBACK: nothing written meanwhile can be cleaned up.
async fn hold_snapshot(db: &TestDb) -> Client {
    let holder = db.connect().await;
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM operation")
        .await
        .expect("hold a snapshot");
    holder
}

/// Resource 1's operation, claimed; its next one waits behind it.
async fn claim_one_and_queue_its_next(client: &Client, fx: &Fixture) -> Vec<ClaimedOperation> {
    enqueue_many(client, fx.instance, fx.tenant, 1, 1).await;
    let busy = operation_claim(client, fx.instance, "agent", 1, LEASE).await.expect("claim");
    enqueue_many(client, fx.instance, fx.tenant, 1, 1).await;
    busy
}

fn done(ops: &[ClaimedOperation]) -> Vec<(OperationId, Uuid)> {
    ops.iter().map(|op| (op.id, op.lease.token())).collect()
}

#[tokio::test]
async fn a_quiet_tenants_operation_is_claimed_in_the_next_batch_while_a_noisy_tenant_has_thousands_waiting() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    let quiet = new_tenant(&mut client, fx.instance).await;
    enqueue_many(&client, fx.instance, fx.tenant, 1, 5000).await;
    enqueue_many(&client, fx.instance, quiet, 100_001, 1).await;

    let first = operation_claim(&client, fx.instance, "agent", 64, LEASE).await.expect("claim");
    assert_eq!(first.len(), 64);
    assert!(first.iter().any(|op| op.tenant_id == quiet), "the quiet tenant waits behind 5,000 operations");
    // The noisy tenant's own operations keep their order.
    let noisy: Vec<i64> = first.iter().filter(|op| op.tenant_id == fx.tenant).map(|op| op.resource_id).collect();
    assert_eq!(noisy, (1..=63).collect::<Vec<_>>());

    // Later, with 4,937 of the noisy tenant's still waiting, the quiet tenant writes again.
    enqueue_many(&client, fx.instance, quiet, 100_002, 1).await;
    let second = operation_claim(&client, fx.instance, "agent", 64, LEASE).await.expect("claim");
    assert!(
        second.iter().any(|op| op.tenant_id == quiet && op.resource_id == 100_002),
        "claimed in the next batch: {:?}",
        second.iter().map(|op| (op.tenant_id, op.resource_id)).collect::<Vec<_>>()
    );
}

/// How many entries of the claim's index one claim statement reads (dead ones
/// included: an entry is counted before its row's visibility is checked); the claim
/// is rolled back.
async fn claim_index_reads(client: &mut Client, instance: EngineInstanceId, floor: Floor) -> i64 {
    let before = index_reads(client, "operation_claim_idx").await;
    let txn = client.transaction().await.expect("begin");
    let no_ids: Vec<i64> = Vec::new();
    let no_tokens: Vec<Uuid> = Vec::new();
    txn.query(CLAIM_SQL, &[&instance.0, &64i64, &"agent", &60.0f64, &floor.0, &no_ids, &no_tokens])
        .await
        .expect("claim");
    txn.rollback().await.expect("roll back");
    index_reads(client, "operation_claim_idx").await - before
}

/// Entries of `index` (one of the queue table's) read by scans so far, this
/// connection's included.
async fn index_reads(client: &Client, index: &str) -> i64 {
    let reads = all_index_reads(client).await;
    reads.iter().find(|(name, _)| name == index).unwrap_or_else(|| panic!("no index {index} in {reads:?}")).1
}

/// Entries read so far by scans of each index of the queue table, this connection's
/// included.
async fn all_index_reads(client: &Client) -> Vec<(String, i64)> {
    client.execute("SELECT pg_stat_force_next_flush()", &[]).await.expect("flush statistics");
    client
        .query(
            "SELECT indexrelname::text, idx_tup_read FROM pg_stat_user_indexes
              WHERE relname = 'operation' ORDER BY indexrelname",
            &[],
        )
        .await
        .expect("read statistics")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

#[tokio::test]
async fn an_enqueue_and_a_safe_floor_read_one_entry_however_long_the_backlog() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    enqueue_many(&client, fx.instance, fx.tenant, 1, 5000).await;
    client.batch_execute("ANALYZE operation").await.expect("analyze");

    // The next key of a tenant with 5,000 waiting: the top of its range only.
    let before = index_reads(&client, "operation_tenant_last_key_idx").await;
    enqueue_many(&client, fx.instance, fx.tenant, 5001, 1).await;
    let read = index_reads(&client, "operation_tenant_last_key_idx").await - before;
    assert!(read <= 2, "the key of one enqueue read {read} entries");
    let keys: Vec<i64> = client
        .query("SELECT queue_key FROM operation WHERE resource_id IN (5000, 5001) ORDER BY resource_id", &[])
        .await
        .expect("keys")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(keys[1], keys[0] + 1, "the tenant's next key follows its last");

    // The lowest live key: the first entry from the floor.
    let before = index_reads(&client, "operation_claim_idx").await;
    safe_floor(&client, fx.instance).await;
    let read = index_reads(&client, "operation_claim_idx").await - before;
    assert!(read <= 2, "the safe floor read {read} entries");
}

#[tokio::test]
async fn a_tenants_next_key_reads_its_own_last_entry_however_far_another_tenant_ran_ahead() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    let mut tenants = vec![fx.tenant];
    for _ in 0..3 {
        tenants.push(new_tenant(&mut client, fx.instance).await);
    }
    // Four tenants writing in turn, as the statistics see them; then one tenant runs
    // 3,000 operations ahead, so that every key above the quiet tenant's last is the
    // busy tenant's.
    client.batch_execute("ALTER TABLE operation SET (autovacuum_enabled = off)").await.expect("no autovacuum");
    for round in 0..250 {
        for (i, tenant) in tenants.iter().enumerate() {
            enqueue_many(&client, fx.instance, *tenant, 1_000_000 * (i as i64 + 1) + round, 1).await;
        }
    }
    client.batch_execute("ANALYZE operation").await.expect("analyze");
    enqueue_many(&client, fx.instance, tenants[0], 1, 3000).await;
    // Statistics as a held snapshot can leave them: the tenant's key index with far
    // more pages for its entries than the claim index (its entries are added in the
    // middle, the claim index's at its end), so that the claim index, with the tenant
    // filtered from its rows, looks as cheap.
    client
        .batch_execute("UPDATE pg_class SET reltuples = 1 WHERE relname LIKE 'operation_tenant%'")
        .await
        .expect("set the statistics");

    // A session of its own, which plans the key trigger's lookup with these
    // statistics: the first executions with their values, later ones once for all.
    let writer = db.connect().await;
    let quiet = tenants[1];
    let last = 2_000_000 + 250 + 8;
    enqueue_many(&writer, fx.instance, quiet, 2_000_000 + 250, 8).await;
    let before = all_index_reads(&writer).await;
    enqueue_many(&writer, fx.instance, quiet, last, 1).await;
    let after = all_index_reads(&writer).await;
    let read: i64 = after.iter().zip(&before).map(|((_, after), (_, before))| after - before).sum();
    assert!(read <= 2, "the quiet tenant's next key read {read} index entries: {after:?}");
    let keys: Vec<i64> = writer
        .query(
            "SELECT queue_key FROM operation WHERE tenant_id = $1 AND resource_id IN ($2, $3) ORDER BY resource_id",
            &[&quiet.0, &(last - 1), &last],
        )
        .await
        .expect("keys")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(keys[1], keys[0] + 1, "the quiet tenant's next key follows its last");
}

#[tokio::test]
async fn with_a_snapshot_held_the_claim_starts_past_the_entries_of_what_was_claimed() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    let held = hold_snapshot(&db).await;

    enqueue_many(&client, fx.instance, fx.tenant, 1, 6000).await;
    let mut floor = Floor::FROM_START;
    let mut handed_in = Vec::new();
    loop {
        let round = operation_complete_and_claim(&client, fx.instance, "agent", 200, LEASE, floor, &handed_in)
            .await
            .expect("claim");
        assert_eq!(round.completed, handed_in.len() as u64, "every completion handed in is recorded");
        if round.claimed.is_empty() {
            break;
        }
        floor = floor.max(Floor(round.lowest_key.expect("a key")));
        handed_in = done(&round.claimed);
    }
    enqueue_many(&client, fx.instance, fx.tenant, 10_001, 10).await;
    let dead: i64 = client
        .query_one("SELECT count(*) FROM operation_history WHERE state = 'completed'", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(dead, 6000);

    // From the start the claim reads the 6,000 entries the claimed operations left
    // behind; from the floor, the last batch's and the new work's.
    let from_start = claim_index_reads(&mut client, fx.instance, Floor::FROM_START).await;
    let from_floor = claim_index_reads(&mut client, fx.instance, floor).await;
    assert!(from_start >= 6000, "from the start the claim read {from_start} entries");
    assert!(from_floor <= 250, "from the floor the claim read {from_floor} entries");
    // The safe floor finds the same place, and the claim from it takes the new work.
    let safe = safe_floor(&client, fx.instance).await;
    assert_eq!(claim_from(&client, fx.instance, safe).await, (10_001..=10_010).collect::<Vec<_>>());
    held.batch_execute("ROLLBACK").await.expect("release the snapshot");
}

#[tokio::test]
async fn after_a_full_batch_the_next_claim_starts_where_it_ended() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    let held = hold_snapshot(&db).await;
    enqueue_many(&client, fx.instance, fx.tenant, 1, 600).await;

    // A full batch out of a backlog: the next scan starts at its highest key, and
    // does not visit the 200 entries it left behind again.
    let full = operation_complete_and_claim(&client, fx.instance, "agent", 200, LEASE, Floor::FROM_START, &[])
        .await
        .expect("claim");
    assert_eq!(full.claimed.len(), 200);
    let next = full.next_floor(200).expect("a floor");
    assert_eq!(next, Floor(full.highest_key.expect("a key")));
    let from_lowest = claim_index_reads(&mut client, fx.instance, Floor(full.lowest_key.expect("a key"))).await;
    let from_next = claim_index_reads(&mut client, fx.instance, next).await;
    assert!(from_lowest >= 200 + 64, "from the batch's lowest key the claim read {from_lowest} entries");
    assert!(from_next <= 64 + 2, "from where the batch ended the claim read {from_next} entries");
    assert_eq!(claim_from(&client, fx.instance, next).await, (201..=264).collect::<Vec<_>>());

    // A batch that was not full reached the end of the due work: the next scan
    // starts at its lowest key, where operations written meanwhile get theirs.
    let rest =
        operation_complete_and_claim(&client, fx.instance, "agent", 1000, LEASE, next, &[]).await.expect("claim");
    assert_eq!(rest.claimed.len(), 336);
    assert_eq!(rest.next_floor(1000), Some(Floor(rest.lowest_key.expect("a key"))));
    held.batch_execute("ROLLBACK").await.expect("release the snapshot");
}

#[tokio::test]
async fn what_an_optimistic_floor_passed_over_is_claimed_after_the_next_safe_floor() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    // Resource 1 is being worked on when its next operation arrives; resource 2 is free.
    let busy = claim_one_and_queue_its_next(&client, &fx).await;
    enqueue_many(&client, fx.instance, fx.tenant, 2, 1).await;

    let round = operation_complete_and_claim(&client, fx.instance, "agent", 10, LEASE, Floor::FROM_START, &[])
        .await
        .expect("claim");
    assert_eq!(round.claimed.iter().map(|op| op.resource_id).collect::<Vec<_>>(), vec![2]);
    let optimistic = Floor(round.lowest_key.expect("a key"));
    // Resource 1 is free now, but below the optimistic floor.
    operation_complete(&client, &done(&busy)).await.expect("complete");
    let passed =
        operation_complete_and_claim(&client, fx.instance, "agent", 10, LEASE, optimistic, &[]).await.expect("claim");
    assert!(passed.claimed.is_empty(), "the optimistic floor passes over resource 1's operation");

    let safe = safe_floor(&client, fx.instance).await;
    assert!(safe < optimistic, "the safe floor goes back to the operation passed over");
    assert_eq!(claim_from(&client, fx.instance, safe).await, vec![1]);
}

#[tokio::test]
async fn a_retry_whose_backoff_ended_gets_its_place_from_the_safe_floor() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    client
        .execute(
            "INSERT INTO operation (engine_instance_id, tenant_id, resource_type, resource_id, run_after)
             VALUES ($1, $2, 'application', 7, now() + interval '1 hour')",
            &[&fx.instance.0, &fx.tenant.0],
        )
        .await
        .expect("a retry in its backoff");
    let key: Option<i64> = client.query_one("SELECT queue_key FROM operation", &[]).await.expect("read the key").get(0);
    assert_eq!(key, None, "an operation that is not due has no place in the queue");
    // Its backoff ends by the clock, not by a write: the key trigger does not see it.
    client
        .batch_execute(
            "SET session_replication_role = replica;
             UPDATE operation SET run_after = now() - interval '1 second';
             RESET session_replication_role;",
        )
        .await
        .expect("end the backoff");
    let before = operation_complete_and_claim(&client, fx.instance, "agent", 10, LEASE, Floor::FROM_START, &[])
        .await
        .expect("claim");
    assert!(before.claimed.is_empty(), "without a key it is not in the claim's index");

    let safe = safe_floor(&client, fx.instance).await;
    assert_eq!(claim_from(&client, fx.instance, safe).await, vec![7]);
}

#[tokio::test]
async fn a_safe_floor_waits_for_a_writer_in_flight_until_its_wait_ends_and_then_sees_its_operation() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    // A writer's transaction that has made an operation waiting and not committed.
    let mut writer = db.connect().await;
    let txn = writer.transaction().await.expect("begin");
    txn.execute(
        "INSERT INTO operation (engine_instance_id, tenant_id, resource_type, resource_id) VALUES ($1, $2, 'application', 9)",
        &[&fx.instance.0, &fx.tenant.0],
    )
    .await
    .expect("enqueue");
    let attempt = operation_safe_floor(&client, fx.instance, Floor::FROM_START, Duration::from_millis(50))
        .await
        .expect("safe floor");
    assert_eq!(attempt, None, "no floor is safe while an operation is being written");
    // Asked again with time to wait, it waits for the writer and then sees its operation.
    let floor_client = db.connect().await;
    let instance = fx.instance;
    let finding = tokio::spawn(async move {
        operation_safe_floor(&floor_client, instance, Floor::FROM_START, Duration::from_secs(60)).await
    });
    eventually("the safe floor to wait for the writer's lock", || async {
        (waiting_advisory_locks(&client).await == 1).then_some(())
    })
    .await;
    assert!(!finding.is_finished(), "no floor while the writer is in flight");
    txn.commit().await.expect("commit");
    let safe = finding.await.expect("join").expect("safe floor").expect("the writer ended within the wait");
    assert_eq!(claim_from(&client, fx.instance, safe).await, vec![9], "the floor does not pass over it");
}

/// Drains every due operation of `instance` through claims that complete the last
/// batch, as a consumer does, and returns the floor it ended at.
async fn claim_and_complete_all(client: &Client, instance: EngineInstanceId, batch: i64) -> Floor {
    let (mut floor, mut handed_in) = (Floor::FROM_START, Vec::new());
    loop {
        let round = operation_complete_and_claim(client, instance, "agent", batch, LEASE, floor, &handed_in)
            .await
            .expect("claim");
        if round.claimed.is_empty() {
            return floor;
        }
        floor = floor.max(round.next_floor(batch).expect("a floor"));
        handed_in = done(&round.claimed);
    }
}

/// A snapshot held (the returned connection's) while `operations` operations went
/// through the queue: each left its entries in the queue's indexes, which the
/// snapshot keeps.
async fn held_queue_after(db: &TestDb, client: &Client, fx: &Fixture, operations: i64) -> Client {
    let held = hold_snapshot(db).await;
    enqueue_many(client, fx.instance, fx.tenant, 1, operations).await;
    claim_and_complete_all(client, fx.instance, 200).await;
    held
}

#[tokio::test]
async fn with_a_snapshot_held_a_consumer_that_starts_and_the_lease_upkeep_begin_at_the_instances_floors() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    let held = held_queue_after(&db, &client, &fx, 6000).await;

    // The first safe floor of the instance reads the 6,000 entries claims left in the
    // claim index; a consumer that starts afterwards begins where that one ended.
    let before = index_reads(&client, "operation_claim_idx").await;
    let first = safe_floor(&client, fx.instance).await;
    let first_reads = index_reads(&client, "operation_claim_idx").await - before;
    let before = index_reads(&client, "operation_claim_idx").await;
    let second = safe_floor(&client, fx.instance).await;
    let second_reads = index_reads(&client, "operation_claim_idx").await - before;
    assert!(first_reads >= 6000, "the first safe floor read {first_reads} entries");
    assert!(second_reads <= 300, "a starting consumer's safe floor read {second_reads} entries");
    assert_eq!(second, first);

    // The same for the lease upkeep and the entries claims left in the claimed-key index.
    let before = index_reads(&client, "operation_claimed_key_idx").await;
    assert_eq!(operation_next_lease_expiry(&client, fx.instance).await.expect("next expiry"), None);
    let first_reads = index_reads(&client, "operation_claimed_key_idx").await - before;
    let before = index_reads(&client, "operation_claimed_key_idx").await;
    assert_eq!(operation_next_lease_expiry(&client, fx.instance).await.expect("next expiry"), None);
    let second_reads = index_reads(&client, "operation_claimed_key_idx").await - before;
    // Each lookup reads from the lease floor twice: to raise it, and for the expiry.
    assert!(first_reads >= 6000, "the first lookup read {first_reads} entries");
    assert!(second_reads <= 2 * 300, "the next lookup read {second_reads} entries");

    // What is claimed afterwards is above the lease floor: its expired lease is found.
    enqueue_many(&client, fx.instance, fx.tenant, 10_001, 5).await;
    assert_eq!(claim_from(&client, fx.instance, second).await, (10_001..=10_005).collect::<Vec<_>>());
    client
        .execute("UPDATE operation SET lease_expires_at = now() - interval '1 second' WHERE resource_id = 10003", &[])
        .await
        .expect("expire one lease");
    let before = index_reads(&client, "operation_claimed_key_idx").await;
    let reclaimed =
        operation_reclaim_expired(&mut client, fx.instance, &RetryPolicy::default(), 10).await.expect("reclaim");
    let reads = index_reads(&client, "operation_claimed_key_idx").await - before;
    assert_eq!(reclaimed, 1);
    assert!(reads <= 2 * (300 + 5), "the reclaim read {reads} entries");
    held.batch_execute("ROLLBACK").await.expect("release the snapshot");
}

#[tokio::test]
async fn racing_claimers_writers_and_upkeep_never_raise_a_floor_past_live_work() {
    const CLAIMERS: usize = 3;
    const ROUNDS: usize = 40;
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    enqueue_many(&client, fx.instance, fx.tenant, 1, 1000).await;
    let stop = tokio_util::sync::CancellationToken::new();

    // Writers keep adding work; the upkeep keeps raising the lease floor.
    let writer = {
        let (mut conn, stop) = (db.connect().await, stop.clone());
        let fx_instance = fx.instance;
        let tenant = new_tenant(&mut conn, fx.instance).await;
        tokio::spawn(async move {
            let mut next = 100_000;
            while !stop.is_cancelled() {
                enqueue_many(&conn, fx_instance, tenant, next, 7).await;
                next += 7;
            }
        })
    };
    let upkeep = {
        let (conn, stop, instance) = (db.connect().await, stop.clone(), fx.instance);
        tokio::spawn(async move {
            let mut syncs = 0u64;
            while !stop.is_cancelled() {
                operation_lease_floor(&conn, instance).await.expect("lease floor");
                syncs += 1;
            }
            syncs
        })
    };
    // Claimers keep half of each batch claimed (work in progress) and complete the
    // rest with the next claim; each makes its floor safe every few rounds.
    let mut claimers = Vec::new();
    for index in 0..CLAIMERS {
        let (conn, instance) = (db.connect().await, fx.instance);
        claimers.push(tokio::spawn(async move {
            let name = format!("agent-{index}");
            let (mut floor, mut handed_in) = (Floor::FROM_START, Vec::new());
            for round in 0..ROUNDS {
                if round % 4 == 0 {
                    let safe =
                        operation_safe_floor(&conn, instance, Floor::FROM_START, LEASE).await.expect("safe floor");
                    floor = safe.unwrap_or(floor);
                }
                let claimed = operation_complete_and_claim(&conn, instance, &name, 20, LEASE, floor, &handed_in)
                    .await
                    .expect("claim");
                floor = claimed.next_floor(20).unwrap_or(floor);
                handed_in = done(&claimed.claimed[claimed.claimed.len() / 2..]);
            }
        }));
    }
    for claimer in claimers {
        claimer.await.expect("claimer");
    }
    stop.cancel();
    writer.await.expect("writer");
    assert!(upkeep.await.expect("upkeep") > 0, "the upkeep ran while claims went on");

    let row = client
        .query_one(
            "SELECT (SELECT min(queue_key) FROM operation WHERE state = 'claimed') AS claimed,
                    (SELECT min(queue_key) FROM operation WHERE state = 'waiting' AND queue_key IS NOT NULL) AS waiting,
                    (SELECT count(*) FROM operation WHERE state = 'claimed') AS claimed_count,
                    operation_mark('floor', $1) AS floor, operation_mark('lease_floor', $1) AS lease_floor",
            &[&fx.instance.0],
        )
        .await
        .expect("read the floors");
    let (claimed, waiting): (Option<i64>, Option<i64>) = (row.get("claimed"), row.get("waiting"));
    let (claimed_count, floor, lease_floor): (i64, i64, i64) =
        (row.get("claimed_count"), row.get("floor"), row.get("lease_floor"));
    assert!(claimed_count > 0, "work in progress was left claimed");
    assert!(claimed.is_some_and(|key| key >= lease_floor), "lowest claimed key {claimed:?}, lease floor {lease_floor}");
    assert!(waiting.is_none_or(|key| key >= floor), "lowest waiting key {waiting:?}, claim floor {floor}");
    // And the upkeep finds every claimed operation once their leases expire.
    client
        .execute("UPDATE operation SET lease_expires_at = now() - interval '1 second' WHERE state = 'claimed'", &[])
        .await
        .expect("expire every lease");
    let reclaimed =
        operation_reclaim_expired(&mut client, fx.instance, &RetryPolicy::default(), 100_000).await.expect("reclaim");
    assert_eq!(reclaimed, u64::try_from(claimed_count).expect("a count"));
}

#[tokio::test]
async fn an_operation_claimed_after_waiting_behind_its_resource_is_found_by_the_lease_upkeep() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    // Resource 1 is being worked on when its next operation arrives, which waits.
    let busy = claim_one_and_queue_its_next(&client, &fx).await;
    // Later work, with higher keys, is claimed past it; then resource 1 is free.
    enqueue_many(&client, fx.instance, fx.tenant, 2, 10).await;
    assert_eq!(claim_from(&client, fx.instance, Floor::FROM_START).await, (2..=11).collect::<Vec<_>>());
    operation_complete(&client, &done(&busy)).await.expect("complete");

    // Every claimed key is now above the waiting one's; the lease floor stays below it.
    let lease_floor = operation_lease_floor(&client, fx.instance).await.expect("lease floor");
    let waiting_key: i64 = client
        .query_one("SELECT queue_key FROM operation WHERE state = 'waiting'", &[])
        .await
        .expect("the waiting key")
        .get(0);
    assert!(lease_floor <= waiting_key, "lease floor {lease_floor} is past the waiting key {waiting_key}");

    let safe = safe_floor(&client, fx.instance).await;
    assert_eq!(claim_from(&client, fx.instance, safe).await, vec![1]);
    client
        .execute("UPDATE operation SET lease_expires_at = now() - interval '1 second' WHERE resource_id = 1", &[])
        .await
        .expect("expire its lease");
    let reclaimed =
        operation_reclaim_expired(&mut client, fx.instance, &RetryPolicy::default(), 10).await.expect("reclaim");
    assert_eq!(reclaimed, 1, "the expired lease is found");
}

/// The indexes that scans read since `before`, with how many entries.
async fn index_reads_since(client: &Client, before: &[(String, i64)]) -> Vec<(String, i64)> {
    all_index_reads(client)
        .await
        .into_iter()
        .zip(before)
        .map(|((index, now), (_, then))| (index, now - then))
        .filter(|(_, read)| *read > 0)
        .collect()
}

#[tokio::test]
async fn statistics_taken_while_the_queue_was_empty_do_not_turn_its_scans_into_reads_of_a_whole_index() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    // 6,000 operations through the queue while the snapshot keeps every entry they
    // left, the instance's floor past them (as the agents' safe floors raise it), then
    // the table analysed with nothing waiting, as autovacuum does when the agents have
    // caught up: the statistics say the queue is empty.
    let held = held_queue_after(&db, &client, &fx, 6000).await;
    safe_floor(&client, fx.instance).await;
    client.batch_execute("VACUUM ANALYZE operation").await.expect("analyze");
    enqueue_many(&client, fx.instance, fx.tenant, 10_001, 500).await;

    // An enqueue finds its tenant's next key at the top of the tenant's range.
    let before = all_index_reads(&client).await;
    enqueue_many(&client, fx.instance, fx.tenant, 20_001, 1).await;
    let read = index_reads_since(&client, &before).await;
    assert!(read.iter().all(|(_, n)| *n <= 2), "one enqueue read {read:?}");

    // The safe floor walks from the instance's floor to the first live entry (the
    // last batch's entries, and the slack below it), not the index's 6,500.
    let before = all_index_reads(&client).await;
    let floor = safe_floor(&client, fx.instance).await;
    let read = index_reads_since(&client, &before).await;
    assert!(read.iter().all(|(index, n)| index == "operation_claim_idx" && *n <= 1000), "the safe floor read {read:?}");

    // Pooled claims (the agents' generic plan) walk the claim's index from the floor
    // and stop at their batch; each hands its rows back so the next reads as far.
    let pool = gitops_shared::db::pool(&db.url(), 1, "claim-test").expect("pool");
    let pooled = gitops_shared::db::pooled(&pool).await.expect("a pooled connection");
    for _ in 0..3 {
        let before = all_index_reads(&client).await;
        let round =
            operation_complete_and_claim(&*pooled, fx.instance, "agent", 64, LEASE, floor, &[]).await.expect("claim");
        assert_eq!(round.claimed.len(), 64, "a full batch is waiting");
        let read = index_reads_since(&client, &before).await;
        assert!(
            read.iter().all(|(index, n)| index != "operation_one_waiting_idx" && *n <= 1200),
            "a claim of 64 read {read:?}"
        );
        let ids: Vec<i64> = round.claimed.iter().map(|op| op.id.0).collect();
        client
            .execute("UPDATE operation SET state = 'waiting', claimed_by = NULL WHERE id = ANY($1)", &[&ids])
            .await
            .expect("hand the batch back");
    }
    held.batch_execute("ROLLBACK").await.expect("release the snapshot");
}
