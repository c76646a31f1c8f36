//! Bench agents: real queue `Consumer`s, each with its own claimer name, LISTEN
//! connection and pool, whose handler does nothing but count what it is given —
//! so the benchmark measures the queue, and catches an operation handed out twice.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use gitops_shared::db::{self, DbError};
use gitops_shared::listen::Listener;
use gitops_shared::model::EngineInstanceId;
use gitops_shared::queue::{ClaimedOperation, Consumer, ConsumerConfig, ConsumerStats, Handler, Outcome};
use gitops_shared::signal::Signal;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::BenchError;

/// Connections in each agent's pool: claims and completions take one at a time,
/// the lease keeper an occasional second.
const POOL_SIZE: usize = 4;

const LISTEN_TIMEOUT: Duration = Duration::from_secs(10);

/// The no-op handler: counts how often it saw each operation id.
#[derive(Debug, Default)]
pub struct CountingHandler {
    seen: Mutex<HashMap<i64, u32>>,
}

impl CountingHandler {
    /// Operations handed to the handler more than once.
    pub fn double_completions(&self) -> u64 {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.values().filter(|&&count| count > 1).count() as u64
    }
}

impl Handler for CountingHandler {
    fn handle(&self, op: &ClaimedOperation) -> impl Future<Output = Outcome> + Send {
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner).entry(op.id.0).or_default() += 1;
        std::future::ready(Outcome::Done)
    }
}

/// Agents connected and ready, not yet consuming.
pub struct ReadyAgents {
    consumers: Vec<Consumer<CountingHandler>>,
    cancel: CancellationToken,
}

/// Agents consuming until stopped.
pub struct RunningAgents {
    tasks: Vec<JoinHandle<Result<(), DbError>>>,
    stats: Vec<Arc<ConsumerStats>>,
    cancel: CancellationToken,
}

impl ReadyAgents {
    /// Builds `count` consumers of `instance`, with their LISTEN connections up and
    /// a pooled connection open, so that starting them costs no connection set-up.
    pub async fn prepare(
        url: &str,
        instance: EngineInstanceId,
        count: usize,
        batch: i64,
        handler: &Arc<CountingHandler>,
    ) -> Result<Self, BenchError> {
        let cancel = CancellationToken::new();
        let signal = Signal::operations(instance);
        let mut consumers = Vec::with_capacity(count);
        for index in 0..count {
            match Self::consumer(url, instance, signal, index, batch, handler, &cancel).await {
                Ok(consumer) => consumers.push(consumer),
                Err(error) => {
                    // Stops the listeners already started.
                    cancel.cancel();
                    return Err(error);
                }
            }
        }
        Ok(ReadyAgents { consumers, cancel })
    }

    async fn consumer(
        url: &str,
        instance: EngineInstanceId,
        signal: Signal,
        index: usize,
        batch: i64,
        handler: &Arc<CountingHandler>,
        cancel: &CancellationToken,
    ) -> Result<Consumer<CountingHandler>, BenchError> {
        let listener = Listener::start(url, &[signal], cancel.clone()).map_err(BenchError::db("start a listener"))?;
        if !listener.wait_connected(LISTEN_TIMEOUT).await {
            return Err(BenchError::Invalid(format!(
                "agent {index}: LISTEN connection not up within {LISTEN_TIMEOUT:?}"
            )));
        }
        let pool = db::pool(url, POOL_SIZE, "gitops-bench-agent").map_err(BenchError::db("build an agent pool"))?;
        drop(db::pooled(&pool).await.map_err(BenchError::db("open an agent connection"))?);
        let mut config = ConsumerConfig::new(instance, format!("bench-agent-{index}"));
        config.batch = batch;
        config.poll_interval = Duration::from_secs(1);
        config.retention = None;
        Ok(Consumer::new(pool, listener, config, handler.clone()))
    }

    /// Starts consuming.
    pub fn start(self) -> RunningAgents {
        let stats = self.consumers.iter().map(Consumer::stats).collect();
        let tasks = self
            .consumers
            .into_iter()
            .map(|consumer| {
                let cancel = self.cancel.clone();
                tokio::spawn(async move { consumer.run(cancel).await })
            })
            .collect();
        RunningAgents { tasks, stats, cancel: self.cancel }
    }
}

impl RunningAgents {
    /// Operations completed so far, over all agents.
    pub fn completed(&self) -> u64 {
        self.stats.iter().map(|s| s.completed.load(Ordering::Relaxed)).sum()
    }

    /// Waits until every agent has gone to sleep once (found the queue empty and
    /// set its signal), so producers start against idle agents.
    pub async fn wait_asleep(&self, within: Duration) -> Result<(), BenchError> {
        let deadline = Instant::now() + within;
        while self.stats.iter().any(|s| s.sleeps.load(Ordering::Relaxed) == 0) {
            if Instant::now() >= deadline {
                return Err(BenchError::Invalid(format!("the agents did not go idle within {within:?}")));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    /// Stops the agents (in-flight batches finish) and reports an agent's error.
    pub async fn stop(self) -> Result<(), BenchError> {
        self.cancel.cancel();
        for (index, (task, stats)) in self.tasks.into_iter().zip(&self.stats).enumerate() {
            let result = task.await.map_err(|source| BenchError::Task { source })?;
            tracing::info!(
                agent = index,
                claimed = stats.claimed.load(Ordering::Relaxed),
                completed = stats.completed.load(Ordering::Relaxed),
                scans = stats.scans.load(Ordering::Relaxed),
                sleeps = stats.sleeps.load(Ordering::Relaxed),
                lease_lost = stats.lease_lost.load(Ordering::Relaxed),
                "agent stopped"
            );
            result.map_err(|source| BenchError::Agent { agent: index, source })?;
        }
        Ok(())
    }
}
