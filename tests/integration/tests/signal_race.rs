//! The wake-up invariant of the signal protocol, with an enqueuer held at each
//! point of the race by keeping its transaction open (not by luck of timing):
//! an operation committed after the consumer's last scan began either notifies,
//! or is found by a scan that starts after it commits.

use gitops_shared::db;
use gitops_shared::model::OperationState;
use gitops_shared::queue::operation_claim;
use gitops_shared::signal::{Signal, SleepAttempt};
use gitops_testkit::TestDb;
use std::time::Duration;

use crate::support::*;

const LEASE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn enqueuer_in_flight_blocks_sleep_and_the_final_scan_finds_its_operation() {
    let db = TestDb::migrated().await;
    let mut consumer = db.connect().await;
    let fx = fixture(&mut consumer).await;
    let signal = Signal::operations(fx.instance);
    let mut listener = RawListener::start(&db.url(), &signal.channel()).await;
    let app = new_application(&mut consumer, &fx).await;
    // Drain what the fixture enqueued; the consumer is awake.
    signal.mark_awake(&consumer).await.expect("awake");
    let first = operation_claim(&consumer, fx.instance, "c", 10, LEASE).await.expect("claim");
    assert_eq!(first.len(), 1);

    // The enqueuer reads sleeping = false (no notification) and holds its transaction.
    let mut enqueuer = db.connect().await;
    let second_app = new_application_uncommitted(&mut enqueuer, &fx).await;
    let held = enqueuer; // the transaction is still open on this connection

    // The consumer cannot go to sleep while the enqueuer is in flight.
    assert_eq!(signal.try_sleep(&mut consumer).await.expect("try"), SleepAttempt::EnqueuerInFlight);
    // Its rescan does not see the uncommitted operation yet.
    assert!(operation_claim(&consumer, fx.instance, "c", 10, LEASE).await.expect("claim").is_empty());

    held.batch_execute("COMMIT").await.expect("commit the enqueuer");
    assert_eq!(signal.try_sleep(&mut consumer).await.expect("try"), SleepAttempt::Asleep);
    let found = operation_claim(&consumer, fx.instance, "c", 10, LEASE).await.expect("claim");
    assert_eq!(found.len(), 1, "the scan after sleeping is committed finds the operation");
    assert_eq!(found[0].resource_id, second_app);
    let _ = app;

    // And it was the scan, not a notification: the next thing on the channel is our marker.
    notify_marker(&consumer, &signal.channel()).await;
    assert_eq!(listener.next_payload().await, "marker");
}

#[tokio::test]
async fn enqueuer_arriving_while_the_consumer_commits_sleep_waits_and_then_notifies() {
    let db = TestDb::migrated().await;
    let mut consumer = db.connect().await;
    let fx = fixture(&mut consumer).await;
    let signal = Signal::operations(fx.instance);
    signal.mark_awake(&consumer).await.expect("awake");
    let mut listener = RawListener::start(&db.url(), &signal.channel()).await;

    // The consumer holds the exclusive lock and has set sleeping, not yet committed.
    let txn = consumer.transaction().await.expect("begin");
    assert_eq!(signal.try_sleep_in_txn(&txn).await.expect("try"), SleepAttempt::Asleep);

    let url = db.url();
    let fx_copy = Fixture { instance: fx.instance, tenant: fx.tenant };
    let enqueuer = tokio::spawn(async move {
        let mut client = db::connect(&url, "enqueuer").await.expect("connect");
        new_application(&mut client, &fx_copy).await
    });
    let observer = db.connect().await;
    eventually("the enqueuer to wait for the signal lock", || async {
        (waiting_advisory_locks(&observer).await == 1).then_some(())
    })
    .await;
    txn.commit().await.expect("commit sleep");
    let app = enqueuer.await.expect("enqueuer task");
    assert_eq!(listener.next_payload().await, "", "the enqueuer saw sleeping and notified");
    let found = operation_claim(&observer, fx.instance, "c", 10, LEASE).await.expect("claim");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].resource_id, app);
}

#[tokio::test]
async fn consumer_waking_after_an_enqueuer_decided_to_notify_still_gets_the_notification() {
    let db = TestDb::migrated().await;
    let mut consumer = db.connect().await;
    let fx = fixture(&mut consumer).await;
    let signal = Signal::operations(fx.instance);
    assert_eq!(signal.try_sleep(&mut consumer).await.expect("try"), SleepAttempt::Asleep);
    let mut listener = RawListener::start(&db.url(), &signal.channel()).await;

    let mut enqueuer = db.connect().await;
    new_application_uncommitted(&mut enqueuer, &fx).await;
    // Another consumer wakes and marks the signal awake while the enqueuer is open.
    signal.mark_awake(&consumer).await.expect("awake");
    enqueuer.batch_execute("COMMIT").await.expect("commit");
    assert_eq!(listener.next_payload().await, "", "the enqueuer's notification is delivered at commit");
    assert_eq!(count_in_state(&consumer, OperationState::Waiting).await, 1);
}

#[tokio::test]
async fn a_sleeping_consumer_is_notified_once_per_burst_and_an_awake_one_not_at_all() {
    let db = TestDb::migrated().await;
    let mut consumer = db.connect().await;
    let fx = fixture(&mut consumer).await;
    let signal = Signal::operations(fx.instance);
    let mut listener = RawListener::start(&db.url(), &signal.channel()).await;
    signal.mark_awake(&consumer).await.expect("awake");
    for _ in 0..20 {
        new_application(&mut consumer, &fx).await;
    }
    notify_marker(&consumer, &signal.channel()).await;
    assert_eq!(listener.next_payload().await, "marker", "no notification while the consumer is awake");
    assert_eq!(signal.try_sleep(&mut consumer).await.expect("try"), SleepAttempt::Asleep);
    new_application(&mut consumer, &fx).await;
    assert_eq!(listener.next_payload().await, "", "a sleeping consumer is woken");
}

/// With several agents, one going to sleep sets the instance's flag while others
/// still claim: a claim that takes work clears it (its claimer scans on), so the
/// enqueuers stop notifying; a claim that finds nothing leaves it set.
#[tokio::test]
async fn a_claim_that_takes_work_stops_notifications_and_one_that_finds_none_does_not() {
    let db = TestDb::migrated().await;
    let mut sleeper = db.connect().await;
    let fx = fixture(&mut sleeper).await;
    let claimer = db.connect().await;
    let signal = Signal::operations(fx.instance);
    let mut listener = RawListener::start(&db.url(), &signal.channel()).await;
    let lease = Duration::from_secs(30);

    assert_eq!(signal.try_sleep(&mut sleeper).await.expect("try"), SleepAttempt::Asleep);
    new_application(&mut sleeper, &fx).await;
    assert_eq!(listener.next_payload().await, "", "the sleeper is woken");
    assert_eq!(operation_claim(&claimer, fx.instance, "other", 10, lease).await.expect("claim").len(), 1);
    new_application(&mut sleeper, &fx).await;
    notify_marker(&sleeper, &signal.channel()).await;
    assert_eq!(listener.next_payload().await, "marker", "no notification once a claim took work");

    assert_eq!(operation_claim(&claimer, fx.instance, "other", 10, lease).await.expect("claim").len(), 1);
    assert_eq!(signal.try_sleep(&mut sleeper).await.expect("try"), SleepAttempt::Asleep);
    assert!(operation_claim(&claimer, fx.instance, "other", 10, lease).await.expect("claim").is_empty());
    new_application(&mut sleeper, &fx).await;
    assert_eq!(listener.next_payload().await, "", "a claim that found nothing leaves the sleeper to be woken");
}

#[tokio::test]
async fn enqueue_is_atomic_with_the_intent_rolled_back_means_no_operation_and_no_notification() {
    let db = TestDb::migrated().await;
    let mut consumer = db.connect().await;
    let fx = fixture(&mut consumer).await;
    let signal = Signal::operations(fx.instance);
    assert_eq!(signal.try_sleep(&mut consumer).await.expect("try"), SleepAttempt::Asleep);
    let mut listener = RawListener::start(&db.url(), &signal.channel()).await;

    let mut writer = db.connect().await;
    new_application_uncommitted(&mut writer, &fx).await;
    writer.batch_execute("ROLLBACK").await.expect("rollback");
    notify_marker(&consumer, &signal.channel()).await;
    assert_eq!(listener.next_payload().await, "marker", "the rolled-back enqueue sent nothing");
    let rows: i64 = consumer
        .query_one("SELECT (SELECT count(*) FROM operation_log) + (SELECT count(*) FROM application)", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, 0, "neither the intent nor its operation exists");
}

/// Begins a transaction on `client` with a new intent and its operation, and leaves
/// it open (commit or roll back with `batch_execute`). Returns the application id.
async fn new_application_uncommitted(client: &mut tokio_postgres::Client, fx: &Fixture) -> i64 {
    use gitops_shared::db::application::application_upsert_in_txn;
    use gitops_shared::model::ResourceType;
    use gitops_shared::queue::operation_enqueue_in_txn;
    let txn = client.transaction().await.expect("begin");
    let id = application_upsert_in_txn(&txn, fx.tenant, &intent(uuid::Uuid::new_v4(), 1))
        .await
        .expect("upsert")
        .expect("new row");
    operation_enqueue_in_txn(&txn, fx.instance, fx.tenant, ResourceType::Application, id.0).await.expect("enqueue");
    // Keep the transaction open past this function: forget the guard that would roll it back.
    std::mem::forget(txn);
    id.0
}
