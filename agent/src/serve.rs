//! Serving one engine instance inside an agent process: its own connection pool
//! and LISTEN connection (an instance whose database work or Argo CD stalls holds up
//! nothing of the others), its queue consumer driving the reconciler, its status
//! watcher, heartbeat loop and sweep. Every process serving the instance claims its
//! operations; the sweep and the heartbeat's singleton duties run only in the
//! holder of the instance's duty lease (`crate::heartbeat`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gitops_shared::db;
use gitops_shared::db::engine_instance::{EngineInstance, InstanceEpoch};
use gitops_shared::listen::Listener;
use gitops_shared::queue::{ClaimedOperation, Consumer, ConsumerConfig, Handler, Outcome};
use gitops_shared::signal::Signal;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::AgentError;
use crate::destination::DestinationGuard;
use crate::engine::Engine;
use crate::engine::argocd::ArgoCdEngine;
use crate::engine::self_fence::{HeartbeatClock, SelfFencing};
use crate::heartbeat::{Duty, Heartbeats, heartbeat, heartbeat_loop, hold_duty, release_duty};
use crate::metrics::Metrics;
use crate::reconcile::Reconciler;
use crate::registry::Registry;
use crate::run::AgentConfig;
use crate::sweep::Sweeper;

/// How long a failed consumer waits before it starts over.
const CONSUMER_RESTART: Duration = Duration::from_secs(2);
/// The longest any agent statement waits for a lock: a killed agent's sessions hold
/// what they locked until their statement ends, and its claims are taken back by
/// another agent only once nothing holds them.
pub(crate) const LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// What every instance of a process shares.
pub(crate) struct Process {
    pub(crate) config: AgentConfig,
    pub(crate) kube: kube::Client,
    pub(crate) registry: Arc<Registry>,
}

/// Serves `instance` until `cancel` fires; returns Ok after its in-flight work
/// drained. An error ends only this instance's serving (the process retries it).
pub(crate) async fn serve_instance(
    process: Arc<Process>,
    instance: EngineInstance,
    cancel: CancellationToken,
) -> Result<(), AgentError> {
    let config = &process.config;
    let metrics = process.registry.metrics(&instance.name);
    let guard = DestinationGuard::new(&config.destinations, &instance.argocd_namespace, metrics.clone())
        .map_err(|message| AgentError::Destinations { message })?;
    tracing::info!(instance.id = %instance.id, argocd.ns = %instance.argocd_namespace, "serving engine instance");
    let pool = db::pool_with_lock_timeout(
        config.database_url.expose(),
        config.concurrency + 4,
        crate::APPLICATION_NAME,
        Some(LOCK_TIMEOUT),
    )
    .map_err(|source| AgentError::Pool { source })?;
    let clock = HeartbeatClock::new();
    let duty = Duty::default();
    // The duties go to the first process to ask; the others only claim.
    let held = hold_duty(&pool, &instance, &config.claimer, config.duty_lease, &duty, &metrics)
        .await
        .map_err(|source| AgentError::Heartbeat { source })?;
    if held {
        heartbeat(&pool, &instance, &metrics, &clock).await.map_err(|source| AgentError::Heartbeat { source })?;
    } else {
        clock.beat();
    }

    let background = CancellationToken::new();
    let listen_url = config.listen_database_url.as_ref().unwrap_or(&config.database_url).expose();
    let listener = Listener::start(listen_url, &[Signal::operations(instance.id)], background.clone())
        .map_err(|source| AgentError::Listen { source })?;
    metrics.attach_listener(listener.clone());
    process.registry.serving(&instance.name, listener.clone());

    let argocd: Arc<dyn Engine> = Arc::new(ArgoCdEngine::new(process.kube.clone(), instance.argocd_namespace.clone()));
    let engine: Arc<dyn Engine> = Arc::new(SelfFencing::new(argocd, clock.clone(), config.self_fence_after));
    let mut tasks = JoinSet::new();
    // Status is written at this epoch; the heartbeat loop keeps it current.
    let epoch = InstanceEpoch::new(instance.id, instance.epoch);
    let beats = Heartbeats {
        pool: pool.clone(),
        engine: engine.clone(),
        instance: instance.clone(),
        epoch: epoch.clone(),
        clock,
        every: config.heartbeat_interval,
        metrics: metrics.clone(),
        holder: config.claimer.clone(),
        lease: config.duty_lease,
        duty: duty.clone(),
    };
    tasks.spawn(heartbeat_loop(beats, background.clone()));
    tasks.spawn(crate::status::run_status_watcher(
        engine.clone(),
        epoch.clone(),
        pool.clone(),
        metrics.clone(),
        background.clone(),
    ));
    let sweeper = Sweeper {
        engine: engine.clone(),
        pool: pool.clone(),
        instance: instance.id,
        config: config.sweep.clone(),
        metrics: metrics.clone(),
        duty: Some(duty.clone()),
    };
    tasks.spawn(sweeper.run(background.clone()));

    let reconciler = Reconciler::new(pool.clone(), engine, config.secrets.clone(), instance.clone())
        .with_destinations(Arc::new(guard))
        .with_epoch(epoch)
        .with_stuck_deletion_after(config.stuck_deletion_after);
    let handler = Arc::new(Instrumented { inner: reconciler, metrics: metrics.clone() });
    let mut consumer_config = ConsumerConfig::new(instance.id, config.claimer.clone());
    consumer_config.concurrency = config.concurrency.max(1);
    consumer_config.batch = i64::try_from(config.concurrency.max(1) * 2).unwrap_or(64);
    consumer_config.lease_for = config.lease;
    consumer_config.margin = (config.lease / 12).max(Duration::from_millis(500));
    consumer_config.poll_interval = config.poll_interval;
    consumer_config.retention = Some(config.completed_retention);
    consumer_config.failed_retention = Some(config.failed_retention);
    let consumer = Consumer::new(pool.clone(), listener.clone(), consumer_config, handler);
    metrics.attach_consumer(consumer.stats());
    listener.wait_connected(Duration::from_secs(10)).await;

    while !cancel.is_cancelled() {
        match consumer.run(cancel.clone()).await {
            Ok(()) => break,
            Err(error) => {
                tracing::warn!(%error, retry_in_ms = CONSUMER_RESTART.as_millis() as u64, "queue consumer stopped; restarting");
                tokio::select! {
                    () = cancel.cancelled() => break,
                    () = tokio::time::sleep(CONSUMER_RESTART) => {}
                }
            }
        }
    }
    tracing::info!("stopped claiming; in-flight operations finished");
    background.cancel();
    while tasks.join_next().await.is_some() {}
    release_duty(&pool, &instance, &config.claimer, &duty).await;
    metrics.duty_held.store(false, Ordering::Relaxed);
    process.registry.stopped(&instance.name);
    tracing::info!("stopped serving the instance");
    Ok(())
}

/// The reconciler with its metrics and a tracing span per operation.
pub(crate) struct Instrumented<H> {
    inner: H,
    metrics: Arc<Metrics>,
}

impl<H: Handler> Handler for Instrumented<H> {
    async fn handle(&self, op: &ClaimedOperation) -> Outcome {
        let of_type = self.metrics.of(op.resource_type);
        of_type.claimed.fetch_add(1, Ordering::Relaxed);
        let lag = op.claimed_at.duration_since(op.created_at).unwrap_or(Duration::ZERO);
        self.metrics.claim_lag.observe(lag);
        let span = tracing::info_span!(
            "reconcile",
            operation.id = %op.id,
            resource.type = %op.resource_type,
            resource.id = op.resource_id,
            tenant.id = %op.tenant_id,
            attempts = op.attempts,
        );
        let started = Instant::now();
        let outcome = tracing::Instrument::instrument(self.inner.handle(op), span.clone()).await;
        let took = started.elapsed();
        of_type.duration.observe(took);
        let _entered = span.enter();
        match &outcome {
            Outcome::Done => {
                of_type.completed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(took_ms = took.as_millis() as u64, "reconciled");
            }
            Outcome::Failed(_) => {
                of_type.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        outcome
    }
}
