//! The fair claim order and claim floors: a quiet tenant is not stuck behind a noisy
//! one, a held snapshot does not make the claim walk what was claimed before, and
//! what an optimistic floor passed over is claimed after the next safe floor.

use std::time::Duration;

use gitops_shared::model::{EngineInstanceId, OperationId, TenantId};
use gitops_shared::queue::{
    CLAIM_SQL, ClaimedOperation, Floor, operation_claim, operation_complete, operation_complete_and_claim,
    operation_safe_floor,
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
async fn safe_floor(client: &mut Client, instance: EngineInstanceId) -> Floor {
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

const INDEX_READS: &str = "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = $1";

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

/// Entries of `index` read by scans so far, this connection's included.
async fn index_reads(client: &Client, index: &str) -> i64 {
    client.execute("SELECT pg_stat_force_next_flush()", &[]).await.expect("flush statistics");
    client.query_one(INDEX_READS, &[&index]).await.expect("read statistics").get(0)
}

#[tokio::test]
async fn an_enqueue_and_a_safe_floor_read_one_entry_however_long_the_backlog() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    enqueue_many(&client, fx.instance, fx.tenant, 1, 5000).await;
    client.batch_execute("ANALYZE operation").await.expect("analyze");

    // The next key of a tenant with 5,000 waiting: the top of its range only.
    let before = index_reads(&client, "operation_tenant_key_idx").await;
    enqueue_many(&client, fx.instance, fx.tenant, 5001, 1).await;
    let read = index_reads(&client, "operation_tenant_key_idx").await - before;
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
    safe_floor(&mut client, fx.instance).await;
    let read = index_reads(&client, "operation_claim_idx").await - before;
    assert!(read <= 2, "the safe floor read {read} entries");
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
    let dead: i64 =
        client.query_one("SELECT count(*) FROM operation WHERE state = 'completed'", &[]).await.expect("count").get(0);
    assert_eq!(dead, 6000);

    // From the start the claim reads the 6,000 entries the claimed operations left
    // behind; from the floor, the last batch's and the new work's.
    let from_start = claim_index_reads(&mut client, fx.instance, Floor::FROM_START).await;
    let from_floor = claim_index_reads(&mut client, fx.instance, floor).await;
    assert!(from_start >= 6000, "from the start the claim read {from_start} entries");
    assert!(from_floor <= 250, "from the floor the claim read {from_floor} entries");
    // The safe floor finds the same place, and the claim from it takes the new work.
    let safe = safe_floor(&mut client, fx.instance).await;
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
    enqueue_many(&client, fx.instance, fx.tenant, 1, 1).await;
    let busy = operation_claim(&client, fx.instance, "agent", 1, LEASE).await.expect("claim");
    enqueue_many(&client, fx.instance, fx.tenant, 1, 2).await;

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

    let safe = safe_floor(&mut client, fx.instance).await;
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

    let safe = safe_floor(&mut client, fx.instance).await;
    assert_eq!(claim_from(&client, fx.instance, safe).await, vec![7]);
}

#[tokio::test]
async fn a_safe_floor_waits_for_a_writer_in_flight_and_gives_up_after_its_wait() {
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
    let attempt = operation_safe_floor(&mut client, fx.instance, Floor::FROM_START, Duration::from_millis(50))
        .await
        .expect("safe floor");
    assert_eq!(attempt, None, "no floor is safe while an operation is being written");
    txn.commit().await.expect("commit");
    let safe = safe_floor(&mut client, fx.instance).await;
    assert_eq!(claim_from(&client, fx.instance, safe).await, vec![9]);
}
