//! `gitops-dev bench queue`: how fast the operation queue takes and hands out work
//! on durable PostgreSQL, set against what the same server commits at all.
//!
//! Phases, each on a migrated scratch database with one engine instance and one
//! tenant per producer (figures in `QueueBenchReport`):
//! 1. baseline — (a) bare one-row commits; (b) the writer's enqueue transaction
//!    with `signal_raise` switched off by `gitops.bench_skip_signal`.
//! 2. enqueue — the same transaction with its signalling step, no agent running.
//! 3. drain — that enqueue run's backlog, claimed by the agents.
//!    1 to 3 alternate `ROUNDS` times (a CHECKPOINT and empty tables before each
//!    run, so no run pays for another's dirty pages); medians are reported.
//! 4. overlap — producers (as fast as they can, or at `--rate`) and idle agents
//!    together; claim latency is read back from the operation table.
//!
//! 5. half load — phase 4 again with producers on a schedule at half the enqueue
//!    rate of phase 2: claim latency when the agents are not the bottleneck.
//! 6. fairness — one tenant's 5,000 operations wait, another tenant writes one; the
//!    agents start: in which of its agent's claim batches the quiet tenant's
//!    operation went.
//!
//! Phases 4 and 5 report commits per operation (Δ`xact_commit` of the database over
//! the operations, the enqueue transactions included). With `--rate` only phases 1
//! and 4 run. With `--hold-snapshot` the phases above are the clean figures, and
//! `held` measures 3–5 again while a snapshot is held (see `held.rs`). Every
//! measured run of phases 1–5 also notes the machine's steal and I/O wait (`host`).

mod agent;
mod held;
mod producer;
mod report;
mod scratch;
mod stats;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use gitops_shared::db::engine_instance::engine_instance_add;
use gitops_shared::db::{self, DbError};
use gitops_shared::model::{EngineInstanceId, OperationState};
use gitops_testkit::PgError;
use tokio_postgres::Client;

use super::cpu::HostTicks;
use agent::{CountingHandler, ReadyAgents, RunningAgents};
use producer::{Committed, Producer, Work};
pub use report::{HalfLoad, HeldReport, LatencyMs, PhaseHost, QueueBenchReport, RecoveryRun};
use scratch::Scratch;

/// What to run.
#[derive(Debug, Clone)]
pub struct QueueBenchConfig {
    /// Operations per measured run.
    pub operations: u64,
    pub agents: usize,
    pub producers: usize,
    /// Open-loop arrival rate (operations per second, in total), or as fast as possible.
    pub rate: Option<f64>,
    /// A server to create the scratch database on; a throwaway one otherwise.
    pub server_url: Option<String>,
    /// Operations an agent claims per statement.
    pub batch: i64,
    /// Measure again while a REPEATABLE READ transaction is held (`held.rs`).
    pub hold_snapshot: bool,
    /// Operations pushed through while the snapshot is held, before measuring.
    pub preload: u64,
}

/// Why the benchmark stopped. Lost or doubled operations are figures, not errors.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("could not start a throwaway PostgreSQL")]
    StartServer { source: PgError },
    #[error("could not {step}")]
    Db { step: &'static str, source: DbError },
    #[error("agent {agent} failed")]
    Agent { agent: usize, source: DbError },
    #[error("a benchmark task panicked")]
    Task { source: tokio::task::JoinError },
    #[error("{0}")]
    Invalid(String),
}

impl BenchError {
    fn db(step: &'static str) -> impl FnOnce(DbError) -> BenchError {
        move |source| BenchError::Db { step, source }
    }
}

/// Runs of phases 1 and 2 whose median is reported.
const ROUNDS: usize = 3;

/// How often the end of a phase is polled for.
const POLL_EVERY: Duration = Duration::from_millis(2);

/// A phase whose operations make no progress for this long is given up; what is
/// left counts as lost.
const STALL_TIMEOUT: Duration = Duration::from_secs(30);

const INSTANCE_NAME: &str = "bench";

const CREATE_BASELINE: &str = "CREATE TABLE bench_baseline (v bigint)";

// Every table a run writes, listed (not CASCADE) so nothing else is emptied.
const CLEAR: &str = "TRUNCATE operation, operation_history, application_state, sync_operation, rollout_baseline, application, bench_baseline";

const CHECKPOINT: &str = "CHECKPOINT";

// Operations of the current phase are those past its mark (ids only grow).
const COUNT_IN_STATE: &str = "SELECT count(*) FROM operation WHERE state = $1 AND id > $2";

// Finished operations are in operation_history.
const COUNT_FINISHED: &str = "SELECT count(*) FROM operation_history WHERE state = $1 AND id > $2";

const MARK: &str = "
SELECT greatest((SELECT coalesce(max(id), 0) FROM operation), (SELECT coalesce(max(id), 0) FROM operation_history))";

// `created_at` is clock_timestamp() at the insert, `claimed_at` at the claim.
const CLAIM_TIMES: &str =
    "SELECT id, created_at, claimed_at FROM operation_history WHERE state = 'completed' AND id > $1";

// How many operations of the phase were claimed before the quiet tenant's ($2): by
// the agent that claimed it, and by all agents. A claim stamps its rows one by one
// in id order, so the quiet operation, written last, is stamped last in its batch,
// and the stamps of batches other agents claimed at the same time fall among its
// batch's: counted over all agents, batches that ran beside the quiet one's look as
// if they went before it.
const CLAIMED_BEFORE_QUIET: &str = "
SELECT count(*) FILTER (WHERE o.claimed_by = q.claimed_by), count(*)
  FROM operation_history o, operation_history q
 WHERE q.id = $2 AND o.id > $1 AND o.claimed_at < q.claimed_at";

/// The noisy tenant's backlog in the fairness phase.
const NOISY_BACKLOG: u64 = 5_000;

/// Runs the benchmark on a scratch database and drops the database afterwards.
pub async fn queue_bench(config: &QueueBenchConfig) -> Result<QueueBenchReport, BenchError> {
    let scratch = Scratch::create(config.server_url.as_deref()).await?;
    let outcome = run(config, scratch.url()).await;
    scratch.remove().await;
    outcome
}

/// The state the phases share.
struct Bench<'a> {
    config: &'a QueueBenchConfig,
    url: &'a str,
    /// Set-up, clearing, checkpoints and polling: never a producer's or agent's.
    admin: Client,
    instance: EngineInstanceId,
    producers: Vec<Producer>,
    handler: Arc<CountingHandler>,
    lost: u64,
    /// The highest operation id before the current phase.
    mark: i64,
    /// `clean`, `held` or `recovery`: which part of the run the phases belong to.
    stage: &'static str,
    /// The machine's steal and I/O wait over each measured phase, in order.
    host: Vec<PhaseHost>,
}

/// What one overlap run measured.
struct Overlap {
    per_s: f64,
    latency_ms: LatencyMs,
    commits_per_op: f64,
}

async fn run(config: &QueueBenchConfig, url: &str) -> Result<QueueBenchReport, BenchError> {
    let mut admin = db::connect(url, "gitops-bench").await.map_err(BenchError::db("connect"))?;
    db::migrate(&mut admin).await.map_err(BenchError::db("migrate the scratch database"))?;
    let instance = engine_instance_add(&admin, INSTANCE_NAME, "argocd", 1000)
        .await
        .map_err(BenchError::db("register the engine instance"))?;
    admin
        .batch_execute(CREATE_BASELINE)
        .await
        .map_err(DbError::query("create the baseline table"))
        .map_err(BenchError::db("create the baseline table"))?;
    let mut producers = Vec::with_capacity(config.producers);
    for index in 0..config.producers {
        producers.push(Producer::connect(url, instance, index).await?);
    }
    let mut bench = Bench {
        config,
        url,
        admin,
        instance,
        producers,
        handler: Arc::new(CountingHandler::default()),
        lost: 0,
        mark: 0,
        stage: "clean",
        host: Vec::new(),
    };

    let n = config.operations;
    let (mut baseline, mut no_notify, mut enqueue, mut drain) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        bench.fresh_run().await?;
        baseline.push(bench.timed(Work::Baseline, "baseline", round).await?);
        bench.fresh_run().await?;
        bench.skip_signal(true).await?;
        no_notify.push(bench.timed(Work::Enqueue, "no-notify enqueue", round).await?);
        bench.skip_signal(false).await?;
        bench.expect_backlog().await?;
        if config.rate.is_none() {
            bench.fresh_run().await?;
            enqueue.push(bench.timed(Work::Enqueue, "enqueue", round).await?);
            bench.expect_backlog().await?;
            drain.push(bench.drain().await?);
        }
    }
    // Each round's pair ran back to back, so its ratio is less exposed to a noisy
    // machine than the ratio of medians; logged to judge the latter.
    let paired: Vec<f64> = no_notify.iter().zip(&enqueue).map(|(quiet, signalled)| signalled / quiet).collect();
    if !paired.is_empty() {
        tracing::info!(?paired, median = report::median(&paired), "enqueue / no-notify enqueue, per round");
    }
    let drain_per_s = config.rate.is_none().then(|| report::median(&drain));
    let overlap = bench.overlap(config.rate, true).await?;
    let enqueue_median = report::median(&enqueue);
    let half_load = match config.rate {
        None => Some(bench.half_load(enqueue_median, true).await?),
        Some(_) => None,
    };
    let quiet_claim_batches = match config.rate {
        None => bench.fairness().await?,
        Some(_) => None,
    };
    let held = match (config.hold_snapshot, drain_per_s) {
        (true, Some(clean_drain)) => {
            let clean = held::Clean {
                drain_per_s: clean_drain,
                enqueue_per_s: enqueue_median,
                overlap_per_s: overlap.per_s,
                claim_p99_ms: overlap.latency_ms.p99,
            };
            Some(held::measure(&mut bench, &clean).await?)
        }
        _ => None,
    };
    Ok(QueueBenchReport {
        operations: n,
        agents: config.agents,
        producers: config.producers,
        rate: config.rate,
        baseline_commit_per_s: report::median(&baseline),
        no_notify_enqueue_per_s: report::median(&no_notify),
        enqueue_per_s: config.rate.is_none().then_some(enqueue_median),
        drain_per_s,
        overlap_per_s: overlap.per_s,
        latency_ms: overlap.latency_ms,
        commits_per_op: overlap.commits_per_op,
        half_load,
        quiet_claim_batches,
        held,
        host: bench.host,
        double_completions: bench.handler.double_completions(),
        lost: bench.lost,
    })
}

impl Bench<'_> {
    /// Empty tables and a checkpoint: every run starts from the same place.
    async fn fresh_run(&mut self) -> Result<(), BenchError> {
        self.admin
            .batch_execute(CLEAR)
            .await
            .map_err(DbError::query("clear the tables"))
            .map_err(BenchError::db("clear the tables"))?;
        self.checkpoint().await;
        self.set_mark().await
    }

    /// Later counts look at operations written from now on only.
    async fn set_mark(&mut self) -> Result<(), BenchError> {
        let row =
            self.admin.query_one(MARK, &[]).await.map_err(DbError::query("mark")).map_err(BenchError::db("mark"))?;
        self.mark = row.get(0);
        Ok(())
    }

    /// Flushes dirty pages now rather than in the middle of a measured run. A
    /// server where this role may not checkpoint is measured without.
    async fn checkpoint(&self) {
        if let Err(error) = self.admin.batch_execute(CHECKPOINT).await {
            tracing::warn!(%error, "CHECKPOINT refused; runs may include checkpoint work");
        }
    }

    async fn skip_signal(&self, skip: bool) -> Result<(), BenchError> {
        for producer in &self.producers {
            producer.skip_signal(skip).await?;
        }
        Ok(())
    }

    /// One closed-loop run of `operations` transactions; returns its rate.
    async fn timed(&mut self, work: Work, phase: &'static str, round: usize) -> Result<f64, BenchError> {
        let n = self.config.operations;
        let host = HostTicks::now();
        let (elapsed, _) = producer::run_closed(&mut self.producers, n, work).await?;
        self.record_host(phase, host);
        let per_s = report::per_second(n, elapsed);
        tracing::info!(phase, round, per_s, elapsed_ms = elapsed.as_millis() as u64, "run done");
        Ok(per_s)
    }

    /// After an enqueue run every operation waits; a shortfall is lost.
    async fn expect_backlog(&mut self) -> Result<(), BenchError> {
        let waiting = self.count_in_state(OperationState::Waiting).await?;
        self.count_lost("enqueue", waiting);
        Ok(())
    }

    /// Phase 3: agents drain the backlog the enqueue run before it left.
    async fn drain(&mut self) -> Result<f64, BenchError> {
        self.checkpoint().await;
        let ready = self.agents().await?;
        let (started, host) = (Instant::now(), HostTicks::now());
        let agents = ready.start();
        let finished = self.wait_settled(&agents, self.config.operations).await;
        self.record_host("drain", host);
        agents.stop().await?;
        let finished = finished?;
        let per_s = report::per_second(self.config.operations, finished - started);
        tracing::info!(phase = "drain", per_s, elapsed_ms = (finished - started).as_millis() as u64, "run done");
        let completed = self.count_in_state(OperationState::Completed).await?;
        self.count_lost("drain", completed);
        Ok(per_s)
    }

    /// Phase 4: producers (at `rate`, or as fast as they go) and agents together,
    /// from idle agents, on empty tables when `fresh`.
    async fn overlap(&mut self, rate: Option<f64>, fresh: bool) -> Result<Overlap, BenchError> {
        let n = self.config.operations;
        if fresh {
            self.fresh_run().await?;
        } else {
            // As a fresh run does, without emptying anything: no run pays for the
            // dirty pages of the one before, nor meets a timed checkpoint they bring on.
            self.checkpoint().await;
            self.set_mark().await?;
        }
        let commits_before = stats::commits(&self.admin, &self.producers).await?;
        let agents = self.agents().await?.start();
        let outcome = async {
            agents.wait_asleep(Duration::from_secs(10)).await?;
            let (started, host) = (Instant::now(), HostTicks::now());
            let committed = match rate {
                None => producer::run_closed(&mut self.producers, n, Work::Enqueue).await?.1,
                Some(rate) => producer::run_scheduled(&mut self.producers, n, rate, started).await?,
            };
            let finished = self.wait_settled(&agents, n).await?;
            // Scheduled at half the enqueue rate unless the user set the rate.
            self.record_host(if rate.is_some() && self.config.rate.is_none() { "half load" } else { "overlap" }, host);
            Ok::<_, BenchError>((finished - started, committed))
        }
        .await;
        agents.stop().await?;
        let (elapsed, committed) = outcome?;
        let per_s = report::per_second(n, elapsed);
        stats::agents_gone(&self.admin).await?;
        let commits = stats::commits(&self.admin, &self.producers).await? - commits_before;
        let commits_per_op = report::ratio(commits as f64, n as f64);
        tracing::info!(
            phase = "overlap",
            ?rate,
            per_s,
            commits_per_op,
            elapsed_ms = elapsed.as_millis() as u64,
            "run done"
        );
        let completed = self.count_in_state(OperationState::Completed).await?;
        self.count_lost("overlap", completed);
        Ok(Overlap { per_s, latency_ms: self.claim_latency(&committed).await?, commits_per_op })
    }

    /// Phase 5: the overlap at half the enqueue rate.
    async fn half_load(&mut self, enqueue_per_s: f64, fresh: bool) -> Result<HalfLoad, BenchError> {
        let rate = (enqueue_per_s / 2.0).max(1.0);
        let overlap = self.overlap(Some(rate), fresh).await?;
        Ok(HalfLoad {
            rate: report::round(rate, 1),
            overlap_per_s: overlap.per_s,
            latency_ms: overlap.latency_ms,
            commits_per_op: overlap.commits_per_op,
        })
    }

    /// Phase 6: 5,000 operations of one tenant wait, then one of another; returns in
    /// which claim batch the latter went (1 = the first). None with one producer.
    async fn fairness(&mut self) -> Result<Option<u64>, BenchError> {
        if self.producers.len() < 2 {
            return Ok(None);
        }
        self.fresh_run().await?;
        producer::run_closed(&mut self.producers[..1], NOISY_BACKLOG, Work::Enqueue).await?;
        let quiet = self.producers[1].enqueue(NOISY_BACKLOG).await.map_err(BenchError::db("enqueue"))?;
        let agents = self.agents().await?.start();
        let settled = self.wait_settled(&agents, NOISY_BACKLOG + 1).await;
        agents.stop().await?;
        settled?;
        let row = self
            .admin
            .query_one(CLAIMED_BEFORE_QUIET, &[&self.mark, &quiet.id.0])
            .await
            .map_err(DbError::query("find the quiet tenant's claim"))
            .map_err(BenchError::db("measure fairness"))?;
        let (by_its_agent, by_all): (i64, i64) = (row.get(0), row.get(1));
        let batch = u64::try_from(self.config.batch).unwrap_or(1).max(1);
        let batches = u64::try_from(by_its_agent).unwrap_or(0) / batch + 1;
        tracing::info!(
            phase = "fairness",
            claimed_before_by_its_agent = by_its_agent,
            claimed_before_by_all_agents = by_all,
            batches,
            "run done"
        );
        Ok(Some(batches))
    }

    /// `claimed_at − created_at` of every completed operation, for the report. Logs
    /// where it goes: the producer's own insert-to-commit (its COMMIT and WAL
    /// flush; nobody can claim the operation before), and the pickup after the
    /// commit was acknowledged (negative when an agent claimed it before the
    /// acknowledgement reached the producer).
    async fn claim_latency(&self, committed: &[Committed]) -> Result<LatencyMs, BenchError> {
        let rows = self
            .admin
            .query(CLAIM_TIMES, &[&self.mark])
            .await
            .map_err(DbError::query("read claim times"))
            .map_err(BenchError::db("read claim times"))?;
        let committed_at: HashMap<i64, SystemTime> = committed.iter().map(|c| (c.id.0, c.at)).collect();
        let (mut latency, mut to_commit, mut to_claim) = (Vec::new(), Vec::new(), Vec::new());
        for row in &rows {
            let (id, created, claimed): (i64, SystemTime, SystemTime) = (row.get(0), row.get(1), row.get(2));
            latency.push(report::millis(created, claimed));
            if let Some(&acked) = committed_at.get(&id) {
                to_commit.push(report::millis(created, acked));
                to_claim.push(report::millis(acked, claimed));
            }
        }
        tracing::info!(phase = "overlap", insert_to_commit_ack_ms = ?report::latency(to_commit), "latency breakdown");
        tracing::info!(phase = "overlap", commit_ack_to_claim_ms = ?report::latency(to_claim), "latency breakdown");
        Ok(report::latency(latency))
    }

    async fn agents(&self) -> Result<ReadyAgents, BenchError> {
        ReadyAgents::prepare(self.url, self.instance, self.config.agents, self.config.batch, &self.handler).await
    }

    /// Waits until the agents have completed `target` operations; returns when that
    /// was seen. Counted in the agents, not polled from the database, so that waiting
    /// adds no transactions to the figures. Gives up (the rest counts as lost) after
    /// `STALL_TIMEOUT` without progress.
    async fn wait_settled(&self, agents: &RunningAgents, target: u64) -> Result<Instant, BenchError> {
        let (mut last_completed, mut last_progress) = (agents.completed(), Instant::now());
        loop {
            let completed = agents.completed();
            let now = Instant::now();
            if completed >= target {
                return Ok(now);
            }
            if completed != last_completed {
                (last_completed, last_progress) = (completed, now);
            } else if now - last_progress > STALL_TIMEOUT {
                tracing::warn!(completed, "no progress for {STALL_TIMEOUT:?}; giving up on this phase");
                return Ok(now);
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    async fn count_in_state(&self, state: OperationState) -> Result<u64, BenchError> {
        let count: i64 = self
            .admin
            .query_one(
                match state {
                    OperationState::Completed | OperationState::Superseded => COUNT_FINISHED,
                    _ => COUNT_IN_STATE,
                },
                &[&state, &self.mark],
            )
            .await
            .map_err(DbError::query("count operations"))
            .map_err(BenchError::db("count operations"))?
            .get(0);
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Notes the machine's steal and I/O wait since `since`, over a phase of the
    /// current stage.
    fn record_host(&mut self, phase: &'static str, since: HostTicks) {
        let share = HostTicks::now().since(since);
        let stage = self.stage;
        let run = self.host.iter().filter(|h| h.stage == stage && h.phase == phase).count() + 1;
        self.host.push(PhaseHost { stage, phase, run, share });
    }

    fn count_lost(&mut self, phase: &'static str, found: u64) {
        self.count_lost_of(phase, self.config.operations, found);
    }

    fn count_lost_of(&mut self, phase: &'static str, expected: u64, found: u64) {
        let lost = expected.saturating_sub(found);
        if lost > 0 {
            tracing::warn!(phase, lost, found, "operations are missing");
        }
        self.lost += lost;
    }
}
