//! The queue under real concurrency: racing consumers, stalled lease holders, a
//! crashed claimer's operation taken back while a consumer is busy, a lost LISTEN
//! connection, and bursts of changes to one resource.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use gitops_shared::listen::Listener;
use gitops_shared::model::{OperationState, ResourceType};
use gitops_shared::queue::{
    ClaimedOperation, Consumer, ConsumerConfig, ConsumerStats, Handler, Outcome, RetryPolicy, operation_claim,
    operation_complete, operation_reclaim_expired, operation_renew,
};
use gitops_shared::signal::Signal;
use gitops_testkit::TestDb;
use tokio_util::sync::CancellationToken;

use crate::support::*;

/// Records when each operation was handled.
#[derive(Default)]
struct Recorder {
    intervals: Mutex<Vec<(i64, i64, Instant, Instant)>>,
}

impl Handler for Recorder {
    async fn handle(&self, op: &ClaimedOperation) -> Outcome {
        let start = Instant::now();
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
        self.intervals.lock().expect("lock").push((op.resource_id, op.id.0, start, Instant::now()));
        Outcome::Done
    }
}

fn config(fx: &Fixture, name: &str) -> ConsumerConfig {
    let mut config = ConsumerConfig::new(fx.instance, name);
    config.batch = 16;
    config.concurrency = 8;
    config.poll_interval = Duration::from_secs(3600);
    config.reclaim_every = Duration::from_secs(3600);
    config.retention = None;
    config
}

/// Starts a consumer in the background; returns its stats and its listener.
fn spawn_consumer<H: Handler>(
    db: &TestDb,
    config: ConsumerConfig,
    handler: Arc<H>,
    listen_url: &str,
    cancel: &CancellationToken,
) -> (Arc<ConsumerStats>, Listener, tokio::task::JoinHandle<()>) {
    let signal = Signal::operations(config.instance);
    let listener = Listener::start(listen_url, &[signal], cancel.clone()).expect("listener");
    let consumer = Consumer::new(db.pool(4), listener.clone(), config, handler);
    let stats = consumer.stats();
    let cancel = cancel.clone();
    let task = tokio::spawn(async move { consumer.run(cancel).await.expect("consumer run") });
    (stats, listener, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_consumers_complete_every_operation_once_and_never_overlap_on_a_resource() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    let cancel = CancellationToken::new();
    let recorder = Arc::new(Recorder::default());
    let mut tasks = Vec::new();
    for n in 0..4 {
        let (_, _, task) =
            spawn_consumer(&db, config(&fx, &format!("agent-{n}")), recorder.clone(), &db.url(), &cancel);
        tasks.push(task);
    }
    // 40 resources; 6 producers change them at random, 600 changes in all.
    let mut apps = Vec::new();
    for _ in 0..40 {
        apps.push(new_application(&mut client, &fx).await);
    }
    let apps = Arc::new(apps);
    let mut producers = Vec::new();
    for p in 0..6 {
        let url = db.url();
        let apps = apps.clone();
        let fx = Fixture { instance: fx.instance, tenant: fx.tenant };
        producers.push(tokio::spawn(async move {
            let mut client = gitops_shared::db::connect(&url, "producer").await.expect("connect");
            for i in 0..100usize {
                let app = apps[(i * 7 + p * 13) % apps.len()];
                enqueue(&mut client, &fx, app).await;
            }
        }));
    }
    for producer in producers {
        producer.await.expect("producer");
    }
    eventually("every operation to finish", || async {
        let open: i64 = client
            .query_one("SELECT count(*) FROM operation WHERE state IN ('waiting', 'claimed')", &[])
            .await
            .expect("count")
            .get(0);
        (open == 0).then_some(())
    })
    .await;
    cancel.cancel();
    for task in tasks {
        task.await.expect("consumer task");
    }

    let intervals = recorder.intervals.lock().expect("lock").clone();
    let rows = client.query("SELECT id, state FROM operation_log", &[]).await.expect("operations");
    let mut handled: HashMap<i64, usize> = HashMap::new();
    for (_, op, _, _) in &intervals {
        *handled.entry(*op).or_default() += 1;
    }
    for row in &rows {
        let id: i64 = row.get(0);
        assert_eq!(row.get::<_, OperationState>(1), OperationState::Completed, "operation {id}");
        assert_eq!(handled.get(&id), Some(&1), "operation {id} handled exactly once");
    }
    assert_eq!(handled.len(), rows.len(), "no handled operation is missing from the table");
    assert!(rows.len() > 40, "changes made while operations ran produced new operations");

    let mut by_resource: HashMap<i64, Vec<(Instant, Instant)>> = HashMap::new();
    for (resource, _, start, end) in intervals {
        by_resource.entry(resource).or_default().push((start, end));
    }
    for (resource, mut spans) in by_resource {
        spans.sort();
        for pair in spans.windows(2) {
            assert!(pair[1].0 >= pair[0].1, "resource {resource} was handled by two holders at once");
        }
    }
}

/// The claim goes with its parameter types in one exchange. A column of a type the
/// connection had not looked up yet would need the lookup in the middle of that
/// exchange, which never completes once the batch's rows fill the connection's
/// buffer. A brand-new connection has looked up nothing; a full batch of rows fills it.
#[tokio::test]
async fn a_full_batch_claimed_on_a_connection_that_has_run_nothing_yet_comes_back() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    let mut applications = Vec::new();
    for _ in 0..300 {
        applications.push(new_application(&mut client, &fx).await);
    }
    let fresh = db.connect().await;
    let claim = operation_claim(&fresh, fx.instance, "fresh", 300, Duration::from_secs(30));
    let claimed = tokio::time::timeout(Duration::from_secs(60), claim)
        .await
        .expect("the claim answered within its deadline")
        .expect("claim");
    let mut got: Vec<i64> = claimed.iter().map(|op| op.resource_id).collect();
    got.sort_unstable();
    applications.sort_unstable();
    assert_eq!(got, applications, "every operation, once");
    assert!(claimed.iter().all(|op| op.resource_type == ResourceType::Application && op.tenant_id == fx.tenant));
}

#[tokio::test]
async fn a_stalled_holder_loses_its_lease_stops_before_its_deadline_and_cannot_complete() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    new_application(&mut client, &fx).await;
    let lease = Duration::from_millis(800);
    let margin = Duration::from_millis(200);

    let stalled = operation_claim(&client, fx.instance, "stalled", 1, lease).await.expect("claim").remove(0);
    // The stalled holder's work never finishes on its own; the lease stops it in time.
    let stopped = stalled.lease.run(margin, std::future::pending::<()>()).await;
    assert!(stopped.is_err(), "work stops when the lease runs out");
    assert!(Instant::now() < stalled.lease.deadline(), "it stopped before its local deadline");

    let reclaimer = tokio::sync::Mutex::new(db.connect().await);
    eventually("the expired lease to be reclaimed", || async {
        let n = operation_reclaim_expired(&mut *reclaimer.lock().await, fx.instance, &RetryPolicy::default(), 10)
            .await
            .expect("reclaim");
        (n == 1).then_some(())
    })
    .await;
    let taken = operation_claim(&client, fx.instance, "rescuer", 1, Duration::from_secs(30)).await.expect("claim");
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].id, stalled.id, "the same operation, under a new lease");
    assert_eq!(taken[0].attempts, 2);

    let late = operation_complete(&client, &[(stalled.id, stalled.lease.token())]).await.expect("late complete");
    assert!(late.is_empty(), "the former holder's completion is rejected");
    let renewed = operation_renew(&client, &[&stalled], lease).await.expect("renew");
    assert!(renewed.is_empty(), "and so is its renewal");
    let done = operation_complete(&client, &[(taken[0].id, taken[0].lease.token())]).await.expect("complete");
    assert_eq!(done, vec![taken[0].id]);
    let row = client
        .query_one("SELECT state, claimed_by FROM operation_log WHERE id = $1", &[&taken[0].id.0])
        .await
        .expect("row");
    assert_eq!(row.get::<_, OperationState>(0), OperationState::Completed);
    assert_eq!(row.get::<_, String>(1), "rescuer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_enqueued_while_the_listener_is_down_are_processed_after_it_reconnects() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    let proxy = Proxy::start(server_addr(&db.url())).await;
    let cancel = CancellationToken::new();
    let recorder = Arc::new(Recorder::default());
    let (stats, listener, task) =
        spawn_consumer(&db, config(&fx, "agent"), recorder.clone(), &proxy.url_for(&db.url()), &cancel);
    assert!(listener.wait_connected(DEADLINE).await);

    let asleep = || stats.asleep.load(std::sync::atomic::Ordering::SeqCst);
    eventually("the consumer to fall asleep at start", || async { asleep().then_some(()) }).await;
    new_application(&mut client, &fx).await;
    eventually("the first operation to complete", || async {
        (count_in_state(&client, OperationState::Completed).await == 1).then_some(())
    })
    .await;
    eventually("the consumer to fall asleep again", || async { asleep().then_some(()) }).await;

    // Kill the listener's backend and keep it from reconnecting.
    proxy.set_down(true);
    let killed: i64 = client
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
              WHERE application_name = 'gitops-listener' AND datname = current_database()",
            &[],
        )
        .await
        .expect("terminate")
        .get(0);
    let sessions: Vec<String> = client
        .query("SELECT coalesce(application_name, '') || '@' || coalesce(datname, '') FROM pg_stat_activity", &[])
        .await
        .expect("sessions")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        killed,
        1,
        "the listener's backend: {sessions:?}, connected {} reconnects {}",
        listener.is_connected(),
        listener.reconnects()
    );
    eventually("the listener to notice", || async { (!listener.is_connected()).then_some(()) }).await;
    new_application(&mut client, &fx).await;
    new_application(&mut client, &fx).await;
    assert_eq!(count_in_state(&client, OperationState::Waiting).await, 2, "nobody woke up for them");

    proxy.set_down(false);
    eventually("the operations sent while down to complete", || async {
        (count_in_state(&client, OperationState::Completed).await == 3).then_some(())
    })
    .await;
    assert!(listener.reconnects() >= 1);
    cancel.cancel();
    task.await.expect("consumer");
}

/// Blocks on its first call until released; counts calls.
struct Gate {
    calls: Mutex<u32>,
    entered: tokio::sync::Notify,
    release: tokio::sync::Semaphore,
}

impl Gate {
    /// A gate that holds every caller until released.
    fn closed() -> Arc<Gate> {
        Arc::new(Gate {
            calls: Mutex::new(0),
            entered: tokio::sync::Notify::new(),
            release: tokio::sync::Semaphore::new(0),
        })
    }
}

impl Handler for Gate {
    async fn handle(&self, _op: &ClaimedOperation) -> Outcome {
        let first = {
            let mut calls = self.calls.lock().expect("lock");
            *calls += 1;
            *calls == 1
        };
        if first {
            self.entered.notify_one();
            let _permit = self.release.acquire().await;
        }
        Outcome::Done
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_changes_during_a_reconcile_cause_at_most_one_more() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    let cancel = CancellationToken::new();
    let gate = Gate::closed();
    let entered = gate.entered.notified();
    let (_, _, task) = spawn_consumer(&db, config(&fx, "agent"), gate.clone(), &db.url(), &cancel);
    let app = new_application(&mut client, &fx).await;
    tokio::time::timeout(DEADLINE, entered).await.expect("the reconcile started");
    for _ in 0..100 {
        enqueue(&mut client, &fx, app).await;
    }
    gate.release.add_permits(1);
    eventually("the queue to empty", || async {
        let open: i64 = client
            .query_one("SELECT count(*) FROM operation WHERE state IN ('waiting', 'claimed')", &[])
            .await
            .expect("count")
            .get(0);
        (open == 0).then_some(())
    })
    .await;
    cancel.cancel();
    task.await.expect("consumer");
    let calls = *gate.calls.lock().expect("lock");
    assert_eq!(calls, 2, "one reconcile in progress, one for all hundred changes");
    let operations: i64 = client.query_one("SELECT count(*) FROM operation_log", &[]).await.expect("count").get(0);
    assert_eq!(operations, 2);
}

/// Two sweeps of one instance that enqueue the same resources, handed them in
/// opposite orders (as plans of different moments list them): inserted one way,
/// they would wait for each other's batch and deadlock; neither fails, and each
/// resource has exactly one waiting operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_sweeps_enqueue_the_same_resources_without_deadlock() {
    use gitops_agent::sweep::{ResourceTypeKey, Target, enqueue_targets};

    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    for round in 0..5i64 {
        let ids = round * 1000..round * 1000 + 400;
        let forward: Vec<Target> = ids
            .clone()
            .map(|id| Target { resource_type: ResourceTypeKey::Application, resource_id: id, tenant_id: fx.tenant })
            .collect();
        let backward: Vec<Target> = forward.iter().rev().copied().collect();
        let race = |targets: Vec<Target>| {
            let db = &db;
            async move {
                let mut client = db.connect().await;
                enqueue_targets(&mut client, fx.instance, targets).await
            }
        };
        let (a, b) = tokio::join!(race(forward), race(backward));
        a.expect("the first sweep's enqueue");
        b.expect("the second sweep's enqueue");
        let row = client
            .query_one(
                "SELECT count(*) AS operations, count(DISTINCT resource_id) AS resources FROM operation
                  WHERE state = 'waiting' AND resource_id >= $1 AND resource_id < $2",
                &[&ids.start, &ids.end],
            )
            .await
            .expect("count");
        let (operations, resources): (i64, i64) = (row.get("operations"), row.get("resources"));
        assert_eq!((operations, resources), (400, 400), "round {round}: one waiting operation per resource");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_claimers_operation_is_back_within_a_second_of_its_lease_while_the_consumer_is_busy() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    let abandoned_app = new_application(&mut client, &fx).await;
    new_application(&mut client, &fx).await;
    // A claimer that crashes: it claims the first operation, then never renews,
    // completes or fails it.
    let lease = Duration::from_secs(2);
    let crashed = operation_claim(&client, fx.instance, "crashed", 1, lease).await.expect("claim").remove(0);
    assert_eq!(crashed.resource_id, abandoned_app);
    let expires: SystemTime = client
        .query_one("SELECT lease_expires_at FROM operation WHERE id = $1", &[&crashed.id])
        .await
        .expect("the lease")
        .get("lease_expires_at");

    // The consumer claims the other operation and stays in its handler. Its timers do
    // not fire within the test: only the lease coming due wakes its upkeep.
    let cancel = CancellationToken::new();
    let gate = Gate::closed();
    let entered = gate.entered.notified();
    let (stats, _, task) = spawn_consumer(&db, config(&fx, "rescuer"), gate.clone(), &db.url(), &cancel);
    tokio::time::timeout(DEADLINE, entered).await.expect("the consumer is busy with the other operation");

    let row = eventually("the abandoned operation to be taken back", || async {
        let row = client
            .query_one("SELECT state, run_after, operator_error FROM operation WHERE id = $1", &[&crashed.id])
            .await
            .expect("the operation");
        (row.get::<_, OperationState>("state") != OperationState::Claimed).then_some(row)
    })
    .await;
    assert_eq!(row.get::<_, OperationState>("state"), OperationState::Waiting, "back in the queue, not handled yet");
    let reclaimed_at: SystemTime = row.get("run_after");
    assert!(reclaimed_at >= expires, "taken back only once the lease ran out");
    let late = reclaimed_at.duration_since(expires).expect("after the expiry");
    assert!(late <= Duration::from_secs(1), "taken back {late:?} after the lease ran out, within a second");
    assert!(row.get::<_, String>("operator_error").contains("lease expired"));
    assert_eq!(*gate.calls.lock().expect("lock"), 1, "the consumer was still in its first handler meanwhile");
    assert_eq!(stats.reclaimed.load(std::sync::atomic::Ordering::Relaxed), 1);

    // The crashed claimer's token is no longer good.
    let late_complete = operation_complete(&client, &[(crashed.id, crashed.lease.token())]).await.expect("complete");
    assert!(late_complete.is_empty(), "the former claimer's completion is rejected");
    assert!(operation_renew(&client, &[&crashed], lease).await.expect("renew").is_empty());

    gate.release.add_permits(1);
    eventually("both operations to complete", || async {
        (count_in_state(&client, OperationState::Completed).await == 2).then_some(())
    })
    .await;
    let row = client
        .query_one("SELECT claimed_by, attempts FROM operation_log WHERE id = $1", &[&crashed.id])
        .await
        .expect("the operation");
    assert_eq!(row.get::<_, String>("claimed_by"), "rescuer");
    assert_eq!(row.get::<_, i32>("attempts"), 2);
    cancel.cancel();
    task.await.expect("consumer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_ended_by_a_deadlock_is_sent_again_with_its_completions() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    // The first completion the database is asked to record fails as a deadlock would:
    // the whole claim statement that carried it rolls back.
    client
        .batch_execute(
            "CREATE SEQUENCE completions_seen;
             CREATE FUNCTION deadlock_once() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF nextval('completions_seen') = 1 THEN
                     RAISE EXCEPTION 'deadlock detected (injected)' USING ERRCODE = 'deadlock_detected';
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER deadlock_once BEFORE INSERT ON operation_history
                FOR EACH ROW WHEN (NEW.state = 'completed') EXECUTE FUNCTION deadlock_once();",
        )
        .await
        .expect("inject a deadlock");
    let cancel = CancellationToken::new();
    let recorder = Arc::new(Recorder::default());
    let (stats, _, task) = spawn_consumer(&db, config(&fx, "agent"), recorder.clone(), &db.url(), &cancel);
    for _ in 0..3 {
        new_application(&mut client, &fx).await;
    }
    eventually("every operation to complete", || async {
        (count_in_state(&client, OperationState::Completed).await == 3).then_some(())
    })
    .await;
    let seen: i64 = client.query_one("SELECT last_value FROM completions_seen", &[]).await.expect("sequence").get(0);
    assert!(seen > 1, "the injected deadlock fired and the completions were recorded after it");
    let handled: Vec<i64> = recorder.intervals.lock().expect("lock").iter().map(|r| r.1).collect();
    assert_eq!(handled.len(), 3, "each operation handled once, not again after its lease ran out: {handled:?}");
    assert_eq!(stats.lease_lost.load(std::sync::atomic::Ordering::Relaxed), 0);
    cancel.cancel();
    task.await.expect("the consumer kept running");
}
