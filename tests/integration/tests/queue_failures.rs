//! Failures: backoff, dead letters with both messages, reviving them, and an
//! operation that keeps crashing its claimer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use gitops_shared::listen::Listener;
use gitops_shared::model::OperationState;
use gitops_shared::queue::{
    ClaimedOperation, Consumer, ConsumerConfig, FailOutcome, Failure, Handler, Outcome, RetryOutcome, RetryPolicy,
    operation_claim, operation_fail, operation_reclaim_expired, operation_retry,
};
use gitops_shared::signal::Signal;
use gitops_testkit::TestDb;
use tokio_util::sync::CancellationToken;

use crate::support::*;

fn transient() -> Failure {
    Failure::Transient {
        operator_error: "apply Application: connection refused (https://10.1.2.3:6443)".into(),
        tenant_message: "Argo CD is unavailable (password=hunter2 at https://argocd.argocd.svc)".into(),
    }
}

#[tokio::test]
async fn transient_failures_back_off_to_the_cap_for_ever_and_permanent_ones_end_failed() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    new_application(&mut client, &fx).await;
    let policy = RetryPolicy { max_attempts: 3, base: Duration::from_secs(10), cap: Duration::from_secs(15) };

    let mut delays = Vec::new();
    // Twice the expiry limit: transient failures are never dead-lettered.
    for attempt in 1..=7 {
        // Make the retry due now so the test does not wait for the backoff.
        client.execute("UPDATE operation SET run_after = now() WHERE state = 'waiting'", &[]).await.expect("due");
        let op =
            operation_claim(&client, fx.instance, "agent", 1, Duration::from_secs(30)).await.expect("claim").remove(0);
        assert_eq!(op.attempts, attempt);
        let failure = if attempt < 7 {
            transient()
        } else {
            Failure::Permanent {
                operator_error: "apply Application: 422 spec.source.path is invalid (https://10.1.2.3:6443)".into(),
                tenant_message: "Argo CD refused the deployment's path (token=hunter2 at https://argocd.argocd.svc)"
                    .into(),
            }
        };
        let outcome = operation_fail(&client, &op, &failure, &policy).await.expect("fail");
        if attempt < 7 {
            let FailOutcome::Retrying { after } = outcome else { panic!("attempt {attempt}: {outcome:?}") };
            let row = client
                .query_one(
                    "SELECT state, extract(epoch FROM run_after - now())::float8 FROM operation WHERE id = $1",
                    &[&op.id.0],
                )
                .await
                .expect("row");
            assert_eq!(row.get::<_, OperationState>(0), OperationState::Waiting);
            let scheduled = row.get::<_, f64>(1);
            assert!((scheduled - after.as_secs_f64()).abs() < 1.0, "run_after matches the backoff");
            let message: String = client
                .query_one("SELECT tenant_message FROM operation WHERE id = $1", &[&op.id.0])
                .await
                .expect("row")
                .get(0);
            assert!(message.contains("Argo CD is unavailable") && !message.contains("hunter2"), "{message}");
            delays.push(after);
        } else {
            assert_eq!(outcome, FailOutcome::Failed);
        }
    }
    assert!(delays[0] >= Duration::from_secs(5) && delays[0] < Duration::from_secs(10), "{delays:?}");
    for delay in &delays[1..] {
        assert!(*delay >= Duration::from_millis(7500) && *delay < Duration::from_secs(15), "capped: {delays:?}");
    }

    let row = client
        .query_one("SELECT state, operator_error, tenant_message, attempts FROM operation", &[])
        .await
        .expect("row");
    assert_eq!(row.get::<_, OperationState>(0), OperationState::Failed);
    let operator_error: String = row.get(1);
    let tenant_message: String = row.get(2);
    assert!(operator_error.contains("422") && operator_error.contains("10.1.2.3"), "{operator_error}");
    assert!(tenant_message.contains("Argo CD refused"), "{tenant_message}");
    assert!(!tenant_message.contains("hunter2") && !tenant_message.contains("argocd.svc"), "{tenant_message}");

    // An operator revives it: attempts reset, due now.
    let op_id =
        gitops_shared::model::OperationId(client.query_one("SELECT id FROM operation", &[]).await.expect("id").get(0));
    assert_eq!(operation_retry(&mut client, op_id).await.expect("retry"), RetryOutcome::Requeued);
    assert_eq!(operation_retry(&mut client, op_id).await.expect("retry"), RetryOutcome::NotFailed);
    let op = operation_claim(&client, fx.instance, "agent", 1, Duration::from_secs(30)).await.expect("claim");
    assert_eq!(op.len(), 1);
    assert_eq!(op[0].attempts, 1);
}

#[tokio::test]
async fn a_conflict_is_retried_at_once() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    new_application(&mut client, &fx).await;
    let op = operation_claim(&client, fx.instance, "agent", 1, Duration::from_secs(30)).await.expect("claim").remove(0);
    let conflict =
        Failure::Conflict { operator_error: "409 Conflict".into(), tenant_message: "changed meanwhile".into() };
    let outcome = operation_fail(&client, &op, &conflict, &RetryPolicy::default()).await.expect("fail");
    assert_eq!(outcome, FailOutcome::Retrying { after: Duration::ZERO });
    let again = operation_claim(&client, fx.instance, "agent", 1, Duration::from_secs(30)).await.expect("claim");
    assert_eq!(again.len(), 1, "due at once");
}

#[tokio::test]
async fn permanent_failures_are_dead_lettered_at_once_and_a_newer_change_supersedes_a_retry() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    let app = new_application(&mut client, &fx).await;
    let policy = RetryPolicy::default();
    let op = operation_claim(&client, fx.instance, "agent", 1, Duration::from_secs(30)).await.expect("claim").remove(0);
    // A change arrives while the operation runs; the failed attempt leaves the work to it.
    enqueue(&mut client, &fx, app).await;
    assert_eq!(operation_fail(&client, &op, &transient(), &policy).await.expect("fail"), FailOutcome::Superseded);

    let op = operation_claim(&client, fx.instance, "agent", 1, Duration::from_secs(30)).await.expect("claim").remove(0);
    let permanent = Failure::Permanent {
        operator_error: "Application spec rejected: 422".into(),
        tenant_message: "The deployment's path is not allowed".into(),
    };
    assert_eq!(operation_fail(&client, &op, &permanent, &policy).await.expect("fail"), FailOutcome::Failed);
    assert_eq!(count_in_state(&client, OperationState::Failed).await, 1);
    assert_eq!(count_in_state(&client, OperationState::Superseded).await, 1);
    // A new change after a dead letter is queued normally.
    assert!(matches!(enqueue(&mut client, &fx, app).await, gitops_shared::queue::Enqueued::New(_)));
    // Reviving the dead one while a newer one waits supersedes it instead.
    let failed: i64 =
        client.query_one("SELECT id FROM operation WHERE state = 'failed'", &[]).await.expect("id").get(0);
    assert_eq!(
        operation_retry(&mut client, gitops_shared::model::OperationId(failed)).await.expect("retry"),
        RetryOutcome::Superseded
    );
    assert_eq!(count_in_state(&client, OperationState::Superseded).await, 2, "filed in the history");
    assert_eq!(count_in_state(&client, OperationState::Failed).await, 0);
}

#[tokio::test]
async fn an_operation_that_keeps_crashing_its_claimer_ends_failed() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    new_application(&mut client, &fx).await;
    let policy = RetryPolicy { max_attempts: 3, ..RetryPolicy::default() };
    let reclaimer = tokio::sync::Mutex::new(db.connect().await);
    for crash in 1..=3 {
        // Each claimer "crashes": it never completes, renews or fails.
        let claimed =
            operation_claim(&client, fx.instance, &format!("crashing-{crash}"), 1, Duration::from_millis(300))
                .await
                .expect("claim");
        assert_eq!(claimed.len(), 1, "crash {crash}: the operation is claimable again");
        eventually("the lease to expire and be reclaimed", || async {
            let n = operation_reclaim_expired(&mut *reclaimer.lock().await, fx.instance, &policy, 10)
                .await
                .expect("reclaim");
            (n == 1).then_some(())
        })
        .await;
    }
    let row = client.query_one("SELECT state, operator_error, tenant_message FROM operation", &[]).await.expect("row");
    assert_eq!(row.get::<_, OperationState>(0), OperationState::Failed);
    assert!(row.get::<_, String>(1).contains("lease expired 3 times"));
    assert!(!row.get::<_, String>(2).is_empty());
}

/// Fails transiently `TRANSIENT_CALLS` times, then permanently, until told to succeed.
struct Flaky {
    succeed: AtomicBool,
    calls: AtomicU32,
}

const TRANSIENT_CALLS: u32 = 6;

impl Handler for Flaky {
    async fn handle(&self, _op: &ClaimedOperation) -> Outcome {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.succeed.load(Ordering::SeqCst) {
            Outcome::Done
        } else if call <= TRANSIENT_CALLS {
            Outcome::Failed(transient())
        } else {
            Outcome::Failed(Failure::Permanent {
                operator_error: "refused".into(),
                tenant_message: "Argo CD refused the deployment".into(),
            })
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_retries_transient_failures_past_the_limit_and_an_operator_retry_revives_a_dead_letter() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    let cancel = CancellationToken::new();
    let mut config = ConsumerConfig::new(fx.instance, "agent");
    config.retry = RetryPolicy { max_attempts: 4, base: Duration::from_millis(20), cap: Duration::from_millis(80) };
    config.poll_interval = Duration::from_secs(3600);
    let listener = Listener::start(&db.url(), &[Signal::operations(fx.instance)], cancel.clone()).expect("listener");
    let flaky = Arc::new(Flaky { succeed: AtomicBool::new(false), calls: AtomicU32::new(0) });
    let consumer = Consumer::new(db.pool(4), listener, config, flaky.clone());
    let run_cancel = cancel.clone();
    let task = tokio::spawn(async move { consumer.run(run_cancel).await.expect("run") });

    new_application(&mut client, &fx).await;
    eventually("the operation to be dead-lettered", || async {
        (count_in_state(&client, OperationState::Failed).await == 1).then_some(())
    })
    .await;
    assert_eq!(
        flaky.calls.load(Ordering::SeqCst),
        TRANSIENT_CALLS + 1,
        "transient failures past max_attempts were retried (without a notification); the permanent one ended it"
    );

    flaky.succeed.store(true, Ordering::SeqCst);
    let report = gitopsctl::queue::retry_all_failed(&db.url()).await.expect("gitopsctl queue retry --all-failed");
    assert_eq!((report.requeued, report.superseded), (1, 0));
    eventually("the revived operation to complete", || async {
        (count_in_state(&client, OperationState::Completed).await == 1).then_some(())
    })
    .await;
    cancel.cancel();
    task.await.expect("consumer");
}
