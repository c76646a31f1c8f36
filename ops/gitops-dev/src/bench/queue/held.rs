//! `--hold-snapshot`: the queue measured again while an operator's session holds a
//! snapshot, and after it lets go.
//!
//! 1. Empty tables (the last TRUNCATE: nothing is truncated or vacuumed while the
//!    snapshot is held), then a REPEATABLE READ transaction in the benchmark's
//!    database runs every `sql/inspect/` query, as an operator looking at the queue
//!    would, and stays open.
//! 2. `--preload` operations go through the queue (producers and agents together), so
//!    that the queue's tables carry the dead row versions a long-held snapshot keeps.
//!    Each is enqueued alone, for a resource with no application row (`Work::Operation`):
//!    the writer's transaction would also leave one live application row per
//!    operation, and the held runs would meet an application table ten times the
//!    size of the clean runs' and measure that instead of the snapshot.
//! 3. Drain, overlap and half load are measured as in the clean phases (each after a
//!    CHECKPOINT), without emptying anything: enqueue and drain, as there, `ROUNDS`
//!    times, and their medians reported, so that the held and the clean drain (a
//!    phase of about a second) are compared median to median, not one run to a
//!    median. The dead tuples of the queue's tables are read.
//! 4. The transaction ends. Every `RECOVERY_EVERY` a backlog is enqueued and drained,
//!    until the drain rate is back to `RECOVERED` of the clean one (or
//!    `RECOVERY_GIVE_UP` passed); autovacuum runs as configured, nothing is vacuumed
//!    by hand.

use std::time::{Duration, Instant};

use gitops_shared::db::{self, DbError};
use tokio_postgres::IsolationLevel;

use super::producer::{self, Work};
use super::report::{self, HeldReport, RecoveryRun};
use super::{Bench, BenchError, ROUNDS, stats};

/// The operator's queries, as they are shipped.
const INSPECT: [(&str, &str); 6] = [
    ("expired_leases", include_str!("../../../../../sql/inspect/expired_leases.sql")),
    ("failed_operations", include_str!("../../../../../sql/inspect/failed_operations.sql")),
    ("oldest_snapshot", include_str!("../../../../../sql/inspect/oldest_snapshot.sql")),
    ("oldest_waiting", include_str!("../../../../../sql/inspect/oldest_waiting.sql")),
    ("queue_depth", include_str!("../../../../../sql/inspect/queue_depth.sql")),
    ("throughput_last_hour", include_str!("../../../../../sql/inspect/throughput_last_hour.sql")),
];

const RECOVERY_EVERY: Duration = Duration::from_secs(10);
const RECOVERY_GIVE_UP: Duration = Duration::from_secs(180);
const RECOVERED: f64 = 0.95;

/// The clean figures of the same sitting.
pub struct Clean {
    pub drain_per_s: f64,
    pub enqueue_per_s: f64,
    pub overlap_per_s: f64,
    pub claim_p99_ms: f64,
}

/// Runs steps 1–4.
pub async fn measure(bench: &mut Bench<'_>, clean: &Clean) -> Result<HeldReport, BenchError> {
    bench.fresh_run().await?;
    let mut holder = db::connect(bench.url, "gitops-bench-operator").await.map_err(BenchError::db("connect"))?;
    let held = holder
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .start()
        .await
        .map_err(DbError::query("begin the operator's transaction"))
        .map_err(BenchError::db("hold a snapshot"))?;
    for (name, query) in INSPECT {
        held.batch_execute(query)
            .await
            .map_err(DbError::query("run an inspect query"))
            .map_err(BenchError::db("hold a snapshot"))?;
        tracing::debug!(query = name, "inspect query ran in the held transaction");
    }

    bench.stage = "held";
    let preloaded = preload(bench).await?;
    let (mut enqueues, mut drains) = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
    for round in 1..=ROUNDS {
        let (enqueue, drain) = backlog_and_drain(bench, round).await?;
        enqueues.push(enqueue);
        drains.push(drain);
    }
    let (enqueue_per_s, drain_per_s) = (report::median(&enqueues), report::median(&drains));
    let overlap = bench.overlap(None, false).await?;
    let half_load = bench.half_load(clean.enqueue_per_s, false).await?;
    let dead_tuples = stats::dead_tuples(&bench.admin).await?;
    held.rollback()
        .await
        .map_err(DbError::query("end the operator's transaction"))
        .map_err(BenchError::db("release the snapshot"))?;
    let released = Instant::now();
    drop(holder);
    bench.stage = "recovery";
    let (recovery, recovery_s) = recover(bench, clean, released).await?;
    Ok(HeldReport {
        preloaded,
        enqueue_per_s,
        drain_per_s,
        overlap_per_s: overlap.per_s,
        latency_ms: overlap.latency_ms,
        commits_per_op: overlap.commits_per_op,
        half_load,
        dead_tuples,
        drain_ratio: report::ratio(drain_per_s, clean.drain_per_s),
        overlap_ratio: report::ratio(overlap.per_s, clean.overlap_per_s),
        claim_p99_ratio: report::ratio(overlap.latency_ms.p99, clean.claim_p99_ms),
        recovery_s,
        recovery,
    })
}

/// Step 2: `preload` operations through producers and agents together.
async fn preload(bench: &mut Bench<'_>) -> Result<u64, BenchError> {
    let n = bench.config.preload;
    bench.set_mark().await?;
    let agents = bench.agents().await?.start();
    let outcome = async {
        producer::run_closed(&mut bench.producers, n, Work::Operation).await?;
        bench.wait_settled(&agents, n).await
    }
    .await;
    agents.stop().await?;
    outcome?;
    tracing::info!(phase = "preload", operations = n, "run done");
    Ok(n)
}

/// A backlog of `operations` enqueued with the agents stopped, then drained;
/// returns both rates.
async fn backlog_and_drain(bench: &mut Bench<'_>, round: usize) -> Result<(f64, f64), BenchError> {
    bench.checkpoint().await;
    bench.set_mark().await?;
    let phase = if bench.stage == "recovery" { "recovery enqueue" } else { "held enqueue" };
    let enqueue_per_s = bench.timed(Work::Enqueue, phase, round).await?;
    bench.expect_backlog().await?;
    Ok((enqueue_per_s, bench.drain().await?))
}

/// Step 4: returns every run, and when the first one reached `RECOVERED` of the
/// clean drain rate (seconds after the release; None if none did in time).
async fn recover(
    bench: &mut Bench<'_>,
    clean: &Clean,
    released: Instant,
) -> Result<(Vec<RecoveryRun>, Option<f64>), BenchError> {
    let mut runs = Vec::new();
    let mut next = released;
    while released.elapsed() < RECOVERY_GIVE_UP {
        tokio::time::sleep_until(next.into()).await;
        next += RECOVERY_EVERY;
        let (_, drain_per_s) = backlog_and_drain(bench, runs.len() + 1).await?;
        let after_s = report::round(released.elapsed().as_secs_f64(), 1);
        let operation_dead = stats::dead_tuples(&bench.admin)
            .await?
            .into_iter()
            .find(|table| table.table == "operation")
            .map_or(0, |table| table.n_dead_tup);
        tracing::info!(phase = "recovery", after_s, drain_per_s, operation_dead, "run done");
        runs.push(RecoveryRun { after_s, drain_per_s, operation_n_dead_tup: operation_dead });
        if drain_per_s >= RECOVERED * clean.drain_per_s {
            return Ok((runs, Some(after_s)));
        }
    }
    Ok((runs, None))
}
