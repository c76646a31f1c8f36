//! The consumer loop shared by agents (and the queue benchmark): wake on a signal
//! or a timer, claim batches, run a handler under each lease, record outcomes,
//! and go to sleep through the signal protocol without losing a wake-up.
//!
//! Beside it runs the upkeep: reclaiming expired leases and pruning. It wakes when
//! the first claimed lease of the instance is due to expire (and every
//! `reclaim_every` at least), so an operation whose claimer crashed is back in the
//! queue a moment after its lease ends, even while the consumer is busy with a
//! batch. Reclaiming changes nothing about fencing: a late completion or renewal by
//! the former claimer presents a lease token that no longer matches.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::Notify;
use tokio_postgres::types::Type;
use tokio_util::sync::CancellationToken;

use super::{
    ClaimedOperation, Failure, Floor, LeaseKeeper, RetryPolicy, operation_complete, operation_complete_and_claim,
    operation_fail, operation_next_lease_expiry, operation_prune, operation_reclaim_expired, operation_safe_floor,
};
use crate::db::{DbError, DbPool, PooledClient, held_or_pooled, pooled};
use crate::listen::Listener;
use crate::model::EngineInstanceId;
use crate::signal::{Signal, SleepAttempt};

/// What a handler made of one operation.
#[derive(Debug, Clone)]
pub enum Outcome {
    Done,
    Failed(Failure),
}

/// Reconciles one claimed operation. It must be idempotent: it reconciles to the
/// current rows and must not depend on why it was called.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, op: &ClaimedOperation) -> impl Future<Output = Outcome> + Send;
}

/// How a consumer claims and how long it may hold work.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    pub instance: EngineInstanceId,
    /// Written to `operation.claimed_by`: which process holds a lease.
    pub claimer: String,
    /// Operations claimed per statement.
    pub batch: i64,
    /// Operations handled at once.
    pub concurrency: usize,
    /// Lease length; renewed every third of it while work goes on.
    pub lease_for: Duration,
    /// Work stops this long before the local lease deadline.
    pub margin: Duration,
    /// Scan at least this often even without a notification.
    pub poll_interval: Duration,
    pub retry: RetryPolicy,
    /// How often expired leases are looked for at least (and finished operations
    /// pruned); they are also looked for as soon as the first claimed lease of the
    /// instance is due to expire.
    pub reclaim_every: Duration,
    /// Finished operations older than this are pruned (None: never).
    pub retention: Option<Duration>,
    /// Dead letters older than this are pruned (None: never).
    pub failed_retention: Option<Duration>,
    /// After a claim that did not fill its batch, wait this long before the next: work
    /// gathers meanwhile, so that under light load a claim (one commit, which also
    /// records the last batch's completions) takes several operations, not one.
    pub linger: Duration,
    /// How long the linger may grow. Claims that bring fewer than [`LINGER_YIELD`]
    /// operations double it up to this (several agents share the work, or little
    /// arrives); claims that bring twice that halve it back towards `linger`. So
    /// agents added to an instance do not multiply its claims (and commits) per
    /// operation, while one agent under load keeps the short pause.
    pub linger_max: Duration,
    /// Claims in a row that find nothing before the consumer goes to sleep.
    pub idle_polls: u32,
    /// How often, at least, the claim floor is made safe (see `queue::floor`).
    pub floor_sync_every: Duration,
}

impl ConsumerConfig {
    /// Defaults that suit an agent on a laptop and in production alike.
    pub fn new(instance: EngineInstanceId, claimer: impl Into<String>) -> Self {
        ConsumerConfig {
            instance,
            claimer: claimer.into(),
            batch: 64,
            concurrency: 16,
            lease_for: Duration::from_secs(60),
            margin: Duration::from_secs(5),
            poll_interval: Duration::from_secs(30),
            retry: RetryPolicy::default(),
            reclaim_every: Duration::from_secs(10),
            retention: Some(Duration::from_secs(24 * 3600)),
            failed_retention: Some(Duration::from_secs(7 * 24 * 3600)),
            linger: Duration::from_millis(10),
            linger_max: Duration::from_millis(15),
            idle_polls: 3,
            floor_sync_every: Duration::from_secs(1),
        }
    }
}

/// A claim that brings fewer operations than this lengthens the linger.
pub const LINGER_YIELD: usize = 8;

/// The linger after a claim that brought `claimed` operations, from the one before:
/// doubled (up to `linger_max`) when the claim brought fewer than [`LINGER_YIELD`],
/// halved (down to `linger`) when it brought twice that or more, else kept.
pub fn adapt_linger(current: Duration, claimed: usize, config: &ConsumerConfig) -> Duration {
    let floor = config.linger;
    let ceiling = config.linger_max.max(floor);
    if claimed < LINGER_YIELD {
        (current * 2).clamp(floor, ceiling)
    } else if claimed >= 2 * LINGER_YIELD {
        (current / 2).clamp(floor, ceiling)
    } else {
        current.clamp(floor, ceiling)
    }
}

/// Counters a consumer keeps (for metrics and tests).
#[derive(Debug, Default)]
pub struct ConsumerStats {
    pub claimed: AtomicU64,
    pub completed: AtomicU64,
    pub failed: AtomicU64,
    pub lease_lost: AtomicU64,
    /// Expired leases handled (requeued, merged or dead-lettered) by this consumer.
    pub reclaimed: AtomicU64,
    pub scans: AtomicU64,
    pub sleeps: AtomicU64,
    /// True while the consumer waits for a notification or its timer.
    pub asleep: AtomicBool,
}

/// A consumer of one engine instance's operations.
pub struct Consumer<H> {
    pool: DbPool,
    listener: Listener,
    config: ConsumerConfig,
    handler: Arc<H>,
    stats: Arc<ConsumerStats>,
    /// Woken by the upkeep when it put operations back in the queue.
    requeued: Notify,
    /// Where claims start, and since when it was last made safe.
    floor: std::sync::Mutex<FloorState>,
}

#[derive(Debug, Clone, Copy)]
struct FloorState {
    /// Where the next claim starts (optimistic).
    claim_from: Floor,
    /// The last safe floor: where the next safe floor's scan starts.
    safe: Floor,
    synced_at: Option<Instant>,
}

/// Pauses between attempts to sleep while an enqueuer is in flight.
const PAUSE_MIN: Duration = Duration::from_millis(1);
const PAUSE_MAX: Duration = Duration::from_millis(5);

/// Tries of a claim that the database ends as a conflict (deadlock, serialization
/// failure) before the consumer gives up and stops.
const CLAIM_ATTEMPTS: u32 = 5;

/// How soon the upkeep tries again after a failed round.
const UPKEEP_RETRY: Duration = Duration::from_secs(1);

/// How long after a lease is due the upkeep looks for it: enough for the database
/// clock to have passed it.
const LEASE_EXPIRY_MARGIN: Duration = Duration::from_millis(100);

// Only operations without a key wait for a time (`operation_delayed_idx`).
const NEXT_DUE: &str = "SELECT min(run_after) AS due FROM operation
                         WHERE engine_instance_id = $1 AND state = 'waiting' AND queue_key IS NULL";

/// How long a safe floor waits for transactions writing operations to end.
const FLOOR_LOCK_WAIT: Duration = Duration::from_millis(100);

impl<H: Handler> Consumer<H> {
    pub fn new(pool: DbPool, listener: Listener, config: ConsumerConfig, handler: Arc<H>) -> Self {
        let floor = FloorState { claim_from: Floor::FROM_START, safe: Floor::FROM_START, synced_at: None };
        Consumer {
            pool,
            listener,
            config,
            handler,
            stats: Arc::new(ConsumerStats::default()),
            requeued: Notify::new(),
            floor: std::sync::Mutex::new(floor),
        }
    }

    pub fn stats(&self) -> Arc<ConsumerStats> {
        self.stats.clone()
    }

    /// Runs until `cancel` fires; the batch in hand is finished first. The upkeep
    /// runs beside the claiming and stops with it.
    pub async fn run(&self, cancel: CancellationToken) -> Result<(), DbError> {
        let upkeep_stop = cancel.child_token();
        let consume = async {
            let result = self.consume(&cancel).await;
            upkeep_stop.cancel();
            result
        };
        let (result, ()) = tokio::join!(consume, self.upkeep_loop(&upkeep_stop));
        result
    }

    async fn consume(&self, cancel: &CancellationToken) -> Result<(), DbError> {
        let signal = Signal::operations(self.config.instance);
        let mut wake = self
            .listener
            .subscribe(&signal)
            .ok_or_else(|| DbError::NotListening { channel: signal.channel().to_string() })?;
        while !cancel.is_cancelled() {
            // Arm before scanning: a notification from now on makes `changed` return.
            wake.borrow_and_update();
            {
                let client = pooled(&self.pool).await?;
                if let Err(error) = signal.mark_awake(&client).await {
                    tracing::debug!(%error, "could not mark the signal awake");
                }
            }
            self.sync_floor(true).await?;
            self.drain(cancel, self.config.idle_polls).await?;
            if cancel.is_cancelled() {
                break;
            }
            self.fall_asleep(&signal, cancel).await?;
            // Scan once more after `sleeping` is committed (see `signal`), from a
            // floor that passes over nothing.
            self.sync_floor(true).await?;
            if self.drain(cancel, 0).await? > 0 {
                continue;
            }
            let timeout = self.sleep_for().await;
            self.stats.sleeps.fetch_add(1, Ordering::Relaxed);
            self.stats.asleep.store(true, Ordering::SeqCst);
            tokio::select! {
                () = cancel.cancelled() => break,
                _ = wake.changed() => {}
                () = self.requeued.notified() => {}
                () = tokio::time::sleep(timeout) => {}
            }
            self.stats.asleep.store(false, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Sets the signal to sleeping, scanning again while enqueuers are in flight.
    /// An in-flight enqueuer commits within milliseconds, so the pause between
    /// tries stays short; it starts over whenever a scan finds work.
    async fn fall_asleep(&self, signal: &Signal, cancel: &CancellationToken) -> Result<(), DbError> {
        let mut pause = PAUSE_MIN;
        loop {
            let attempt = {
                let mut client = pooled(&self.pool).await?;
                signal.try_sleep(&mut client).await?
            };
            match attempt {
                SleepAttempt::Asleep => return Ok(()),
                SleepAttempt::EnqueuerInFlight => {
                    if self.drain(cancel, 0).await? > 0 {
                        pause = PAUSE_MIN;
                    } else {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(PAUSE_MAX);
                    }
                    if cancel.is_cancelled() {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// How long to sleep: until the poll interval or the next retry that comes due,
    /// whichever is first.
    async fn sleep_for(&self) -> Duration {
        let mut timeout = self.config.poll_interval;
        if let Ok(client) = pooled(&self.pool).await
            && let Ok(rows) = client.query_typed(NEXT_DUE, &[(&self.config.instance.0, Type::INT8)]).await
            && let Some(row) = rows.first()
            && let Ok(Some(due)) = row.try_get::<_, Option<SystemTime>>("due")
        {
            let until = due.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO);
            timeout = timeout.min(until + Duration::from_millis(5));
        }
        timeout
    }

    /// Reclaims expired leases and prunes, until `stop`: at once, when the first
    /// claimed lease of the instance is due to expire, and every `reclaim_every`.
    /// The upkeep holds its own connection, so that taking back a crashed claimer's
    /// operations never waits for a pool busy with handlers; a failed round drops it.
    async fn upkeep_loop(&self, stop: &CancellationToken) {
        let mut next_prune = Instant::now();
        let mut held: Option<PooledClient> = None;
        while !stop.is_cancelled() {
            let reclaimed = self.reclaim(&mut held).await;
            if reclaimed.is_some_and(|reclaimed| reclaimed > 0) {
                self.requeued.notify_one();
            }
            if Instant::now() >= next_prune {
                self.prune(&mut held).await;
                next_prune = Instant::now() + self.config.reclaim_every;
            }
            // After a failure (its connection is replaced), wait a second, not at
            // once: an expired lease that cannot be reclaimed would otherwise be tried
            // over and over.
            let wait = match reclaimed {
                Some(_) => self.next_reclaim(&mut held).await,
                None => self.config.reclaim_every.min(UPKEEP_RETRY),
            };
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Handles the expired leases of the instance; returns how many (None: it failed,
    /// and said so).
    async fn reclaim(&self, held: &mut Option<PooledClient>) -> Option<u64> {
        let outcome = async {
            let client = held_or_pooled(&self.pool, held).await?;
            operation_reclaim_expired(client, self.config.instance, &self.config.retry, 1000).await
        }
        .await;
        match outcome {
            Ok(reclaimed) => {
                if reclaimed > 0 {
                    self.stats.reclaimed.fetch_add(reclaimed, Ordering::Relaxed);
                    tracing::info!(reclaimed, "reclaimed operations whose lease expired");
                }
                Some(reclaimed)
            }
            Err(error) => {
                *held = None;
                tracing::warn!(%error, "could not reclaim expired leases");
                None
            }
        }
    }

    async fn prune(&self, held: &mut Option<PooledClient>) {
        let outcome = async {
            let client = held_or_pooled(&self.pool, held).await?;
            operation_prune(client, self.config.retention, self.config.failed_retention, 10_000).await
        }
        .await;
        if let Err(error) = outcome {
            *held = None;
            tracing::warn!(%error, "could not prune finished operations");
        }
    }

    /// How long until the upkeep looks for expired leases again: just after the first
    /// claimed lease of the instance is due, or after `reclaim_every`.
    async fn next_reclaim(&self, held: &mut Option<PooledClient>) -> Duration {
        let next = async {
            let client = held_or_pooled(&self.pool, held).await?;
            operation_next_lease_expiry(client, self.config.instance).await
        }
        .await;
        match next {
            Ok(Some(expires_in)) => self.config.reclaim_every.min(expires_in + LEASE_EXPIRY_MARGIN),
            Ok(None) => self.config.reclaim_every,
            Err(error) => {
                *held = None;
                tracing::warn!(%error, "could not find the next lease expiry");
                self.config.reclaim_every.min(UPKEEP_RETRY)
            }
        }
    }

    fn floor(&self) -> FloorState {
        *self.floor.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn update_floor(&self, update: impl FnOnce(&mut FloorState)) {
        update(&mut self.floor.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    }

    /// Makes the claim floor safe (see `queue::floor`), when `force`d or when the last
    /// time is `floor_sync_every` ago. A floor that could not be made safe now (writers
    /// kept the lock) is tried again on the next round; claims keep their floor.
    async fn sync_floor(&self, force: bool) -> Result<(), DbError> {
        let state = self.floor();
        if !force && state.synced_at.is_some_and(|at| at.elapsed() < self.config.floor_sync_every) {
            return Ok(());
        }
        let client = pooled(&self.pool).await?;
        match operation_safe_floor(&client, self.config.instance, state.safe, FLOOR_LOCK_WAIT).await? {
            Some(safe) => self.update_floor(|floor| {
                *floor = FloorState { claim_from: safe, safe, synced_at: Some(Instant::now()) };
            }),
            None => tracing::debug!("writers held the queue lock; the claim floor is made safe later"),
        }
        Ok(())
    }

    /// Claims and handles batches until `idle_polls + 1` claims in a row find nothing;
    /// returns how many were claimed. Each claim records the previous batch's
    /// completions; a claim that did not fill its batch is followed by the linger
    /// ([`adapt_linger`]).
    async fn drain(&self, cancel: &CancellationToken, idle_polls: u32) -> Result<u64, DbError> {
        let mut total = 0;
        let mut linger = self.config.linger;
        let mut done: Vec<(crate::model::OperationId, uuid::Uuid)> = Vec::new();
        let mut idle = 0;
        while !cancel.is_cancelled() {
            self.sync_floor(false).await?;
            self.stats.scans.fetch_add(1, Ordering::Relaxed);
            let round = self.claim(&done).await?;
            self.count_completed(done.len() as u64, round.completed);
            done.clear();
            if let Some(next) = round.next_floor(self.config.batch) {
                self.update_floor(|floor| floor.claim_from = floor.claim_from.max(next));
            }
            let claimed = round.claimed.len();
            if claimed == 0 {
                idle += 1;
                if idle > idle_polls {
                    break;
                }
            } else {
                idle = 0;
                total += claimed as u64;
                self.stats.claimed.fetch_add(claimed as u64, Ordering::Relaxed);
                done = self.handle_batch(round.claimed).await?;
            }
            if (claimed as i64) < self.config.batch && !linger.is_zero() {
                tokio::select! {
                    () = cancel.cancelled() => {}
                    () = tokio::time::sleep(linger) => {}
                }
            }
            linger = adapt_linger(linger, claimed, &self.config);
        }
        if !done.is_empty() {
            let client = pooled(&self.pool).await?;
            let completed = operation_complete(&client, &done).await?;
            self.count_completed(done.len() as u64, completed.len() as u64);
        }
        Ok(total)
    }

    /// One claim that also records `done`. A claim the database ended as a deadlock
    /// or serialization failure rolled back whole (nothing recorded, nothing claimed):
    /// it is sent again, so that the completions in hand are not dropped for their
    /// leases to run out.
    async fn claim(&self, done: &[(crate::model::OperationId, uuid::Uuid)]) -> Result<super::ClaimRound, DbError> {
        let mut attempt = 1;
        loop {
            let client = pooled(&self.pool).await?;
            let round = operation_complete_and_claim(
                &*client,
                self.config.instance,
                &self.config.claimer,
                self.config.batch,
                self.config.lease_for,
                self.floor().claim_from,
                done,
            )
            .await;
            match round {
                Err(error) if error.is_retryable_conflict() && attempt < CLAIM_ATTEMPTS => {
                    tracing::info!(%error, attempt, "a claim met a conflict; sending it again");
                    drop(client);
                    tokio::time::sleep(PAUSE_MIN * attempt).await;
                    attempt += 1;
                }
                round => return round,
            }
        }
    }

    fn count_completed(&self, handed_in: u64, completed: u64) {
        self.stats.completed.fetch_add(completed, Ordering::Relaxed);
        let lost = handed_in.saturating_sub(completed);
        if lost > 0 {
            self.stats.lease_lost.fetch_add(lost, Ordering::Relaxed);
            tracing::warn!(lost, "completions refused: the lease had passed to another claimer");
        }
    }

    async fn handle_one(&self, op: ClaimedOperation, margin: Duration) -> (ClaimedOperation, Option<Outcome>) {
        let outcome = op.lease.run(margin, self.handler.handle(&op)).await.ok();
        (op, outcome)
    }

    /// Runs a batch under its leases and records its failures; returns the operations
    /// done, for the next claim to complete.
    async fn handle_batch(
        &self,
        batch: Vec<ClaimedOperation>,
    ) -> Result<Vec<(crate::model::OperationId, uuid::Uuid)>, DbError> {
        let _keeper = LeaseKeeper::start(self.pool.clone(), batch.clone(), self.config.lease_for);
        let margin = self.config.margin;
        let mut results: Vec<(ClaimedOperation, Option<Outcome>)> = Vec::with_capacity(batch.len());
        let mut running = FuturesUnordered::new();
        for op in batch {
            if running.len() >= self.config.concurrency.max(1)
                && let Some(result) = running.next().await
            {
                results.push(result);
            }
            running.push(self.handle_one(op, margin));
        }
        while let Some(result) = running.next().await {
            results.push(result);
        }
        let mut done = Vec::with_capacity(results.len());
        let mut client = None;
        for (op, outcome) in &results {
            match outcome {
                None => {
                    self.stats.lease_lost.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(operation.id = %op.id, "stopped: the lease ended before the work finished");
                }
                Some(Outcome::Done) => done.push((op.id, op.lease.token())),
                Some(Outcome::Failed(failure)) => {
                    let client = match &mut client {
                        Some(client) => client,
                        None => client.insert(pooled(&self.pool).await?),
                    };
                    let result = operation_fail(client, op, failure, &self.config.retry).await?;
                    self.stats.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(operation.id = %op.id, ?result, "operation failed");
                }
            }
            op.lease.end();
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ConsumerConfig {
        ConsumerConfig::new(EngineInstanceId(1), "agent-0")
    }

    #[test]
    fn the_linger_grows_while_claims_bring_little_and_shrinks_when_they_bring_plenty() {
        let config = config();
        let (short, long) = (config.linger, config.linger_max);
        assert!(long > short);
        let mut linger = short;
        linger = adapt_linger(linger, LINGER_YIELD - 1, &config);
        assert_eq!(linger, (short * 2).min(long));
        for _ in 0..10 {
            linger = adapt_linger(linger, 0, &config);
        }
        assert_eq!(linger, long, "never past linger_max");
        assert_eq!(adapt_linger(linger, LINGER_YIELD, &config), long, "a middling claim keeps it");
        for _ in 0..10 {
            linger = adapt_linger(linger, 2 * LINGER_YIELD, &config);
        }
        assert_eq!(linger, short, "never under linger");
    }

    #[test]
    fn a_linger_max_below_the_linger_leaves_the_linger_fixed() {
        let mut config = config();
        config.linger_max = Duration::ZERO;
        assert_eq!(adapt_linger(config.linger, 0, &config), config.linger);
        config.linger = Duration::ZERO;
        assert_eq!(adapt_linger(Duration::ZERO, 0, &config), Duration::ZERO, "no linger stays none");
    }
}
