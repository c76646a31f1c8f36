//! `run_agent`: the wiring of a running agent. Start-up checks (schema, a
//! registered instance, encryption keys), then, until the token is cancelled: the
//! heartbeat, the LISTEN connection, the queue consumer driving the reconciler, the
//! status watcher, the sweep and the HTTP endpoints. On cancel the consumer stops
//! claiming and finishes the batch in hand; everything else stops after it.

use crate::engine::ProgressStamp;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use gitops_shared::config::DatabaseUrl;
use gitops_shared::crypto::SecretBox;
use gitops_shared::db::engine_instance::{EngineInstance, InstanceEpoch, engine_instance_heartbeat};
use gitops_shared::db::{self, DbPool, pooled};
use gitops_shared::listen::Listener;
use gitops_shared::queue::{ClaimedOperation, Consumer, ConsumerConfig, Handler, Outcome};
use gitops_shared::signal::Signal;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::destination::{DestinationConfig, DestinationGuard};
use crate::engine::argocd::ArgoCdEngine;
use crate::engine::self_fence::{HeartbeatClock, SelfFencing};
use crate::engine::{AdoptionSettings, Engine};
use crate::metrics::Metrics;
use crate::reconcile::Reconciler;
use crate::sweep::{SweepConfig, Sweeper};
use crate::{AgentError, connect, instance};

const APPLICATION_NAME: &str = "gitops-agent";
/// How long a failed consumer waits before it starts over.
const CONSUMER_RESTART: Duration = Duration::from_secs(2);
/// The longest any agent statement waits for a lock: a killed agent's sessions hold
/// what they locked until their statement ends, and its claims are taken back by
/// another agent only once nothing holds them.
const LOCK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long without a heartbeat until the agent stops writing to Argo CD: below
/// the default lost window (60 s) plus the default failover grace (2 min).
pub const DEFAULT_SELF_FENCE_AFTER: Duration = Duration::from_secs(90);

/// What a test or the binary may observe of a running agent.
#[derive(Debug, Clone, Default)]
pub struct AgentHandle {
    pub metrics: Arc<Metrics>,
    http_address: Arc<OnceLock<SocketAddr>>,
}

impl AgentHandle {
    /// The address the HTTP endpoints listen on, once bound.
    pub fn http_address(&self) -> Option<SocketAddr> {
        self.http_address.get().copied()
    }
}

/// Everything `run_agent` needs; the CLI builds it from flags and environment.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub database_url: DatabaseUrl,
    /// A direct connection for LISTEN (default: `database_url`).
    pub listen_database_url: Option<DatabaseUrl>,
    pub instance: String,
    /// None: as kube infers it (`KUBECONFIG`, `~/.kube/config`, in-cluster).
    pub kubeconfig: Option<PathBuf>,
    /// Where `/metrics`, `/healthz` and `/readyz` listen (port 0: any free port).
    pub metrics_address: SocketAddr,
    pub sweep: SweepConfig,
    /// Destinations refused on the home cluster, whatever the rows say.
    pub destinations: DestinationConfig,
    pub lease: Duration,
    pub concurrency: usize,
    /// Completed and superseded operations older than this are pruned.
    pub completed_retention: Duration,
    /// Dead letters older than this are pruned.
    pub failed_retention: Duration,
    /// A deletion Argo CD has not finished after this long is reported as stuck.
    pub stuck_deletion_after: Duration,
    /// Scan the queue at least this often without a notification.
    pub poll_interval: Duration,
    pub heartbeat_interval: Duration,
    /// Writes to Argo CD stop while the last heartbeat is older than this (well
    /// below `gitops.instance_lost_after` plus the writers' failover grace).
    pub self_fence_after: Duration,
    pub secrets: SecretBox,
    /// Written to `operation.claimed_by`.
    pub claimer: String,
    pub handle: AgentHandle,
}

impl AgentConfig {
    /// Defaults for everything but the connection, the instance and the keys.
    pub fn new(database_url: impl Into<DatabaseUrl>, instance: String, secrets: SecretBox) -> Self {
        AgentConfig {
            database_url: database_url.into(),
            listen_database_url: None,
            instance,
            kubeconfig: None,
            metrics_address: SocketAddr::from(([127, 0, 0, 1], 9464)),
            sweep: SweepConfig { interval: Duration::from_secs(300), max_deletions: 50, dry_run: false },
            destinations: DestinationConfig::default(),
            lease: Duration::from_secs(60),
            concurrency: 16,
            completed_retention: Duration::from_secs(24 * 3600),
            failed_retention: Duration::from_secs(7 * 24 * 3600),
            stuck_deletion_after: crate::reconcile::DEFAULT_STUCK_DELETION_AFTER,
            poll_interval: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(15),
            self_fence_after: DEFAULT_SELF_FENCE_AFTER,
            secrets,
            claimer: default_claimer(),
            handle: AgentHandle::default(),
        }
    }
}

/// `<host>-<pid>-<random>`: unique per process, readable in psql.
pub fn default_claimer() -> String {
    let host = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| APPLICATION_NAME.into());
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &random[..8])
}

/// Runs the agent until `cancel` fires; returns Ok after a clean shutdown.
pub async fn run_agent(config: AgentConfig, cancel: CancellationToken) -> Result<(), AgentError> {
    let client = connect(config.database_url.expose()).await?;
    let schema = db::check_schema(&client).await.map_err(|source| AgentError::Schema { source })?;
    tracing::info!(schema.found = schema.found, schema.required = schema.required, "database schema checked");
    let instance = instance(&client, &config.instance).await?;
    drop(client);
    let guard = DestinationGuard::new(&config.destinations, &instance.argocd_namespace, config.handle.metrics.clone())
        .map_err(|message| AgentError::Destinations { message })?;
    tracing::info!(instance.id = %instance.id, instance.name = %instance.name, argocd.ns = %instance.argocd_namespace,
        "serving engine instance");
    let pool = db::pool_with_lock_timeout(
        config.database_url.expose(),
        config.concurrency + 4,
        APPLICATION_NAME,
        Some(LOCK_TIMEOUT),
    )
    .map_err(|source| AgentError::Pool { source })?;
    let kube = kube_client(config.kubeconfig.as_ref()).await?;
    let clock = HeartbeatClock::new();
    heartbeat(&pool, &instance, &config.handle.metrics, &clock)
        .await
        .map_err(|source| AgentError::Heartbeat { source })?;

    let metrics = config.handle.metrics.clone();
    let background = CancellationToken::new();
    let listen_url = config.listen_database_url.as_ref().unwrap_or(&config.database_url).expose();
    let listener = Listener::start(listen_url, &[Signal::operations(instance.id)], background.clone())
        .map_err(|source| AgentError::Listen { source })?;
    metrics.attach_listener(listener.clone());
    let http = crate::http::bind(config.metrics_address)
        .await
        .map_err(|source| AgentError::Bind { address: config.metrics_address, source })?;
    let bound = http.local_addr().map_err(|source| AgentError::Bind { address: config.metrics_address, source })?;
    let _ = config.handle.http_address.set(bound);
    tracing::info!(address = %bound, "serving /metrics, /healthz and /readyz");

    let argocd: Arc<dyn Engine> = Arc::new(ArgoCdEngine::new(kube.clone(), instance.argocd_namespace.clone()));
    let engine: Arc<dyn Engine> = Arc::new(SelfFencing::new(argocd, clock.clone(), config.self_fence_after));
    let mut tasks = JoinSet::new();
    let endpoints = crate::http::Endpoints { metrics: metrics.clone(), listener: listener.clone(), pool: pool.clone() };
    tasks.spawn(crate::http::serve(http, endpoints, background.clone()));
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
    tracing::info!("agent stopped");
    Ok(())
}

async fn kube_client(path: Option<&PathBuf>) -> Result<kube::Client, AgentError> {
    let config = match path {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).map_err(|source| AgentError::Kubeconfig { path: path.clone(), source })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|source| AgentError::Kubeconfig { path: path.clone(), source })?
        }
        None => kube::Config::infer().await.map_err(|source| AgentError::InferKube { source })?,
    };
    kube::Client::try_from(config).map_err(|source| AgentError::KubeClient { source })
}

async fn heartbeat(
    pool: &DbPool,
    instance: &EngineInstance,
    metrics: &Metrics,
    clock: &HeartbeatClock,
) -> Result<(), db::DbError> {
    let client = pooled(pool).await?;
    engine_instance_heartbeat(&client, instance.id).await?;
    clock.beat();
    metrics.heartbeats.fetch_add(1, Ordering::Relaxed);
    let (depth, dead) = gitops_shared::queue::operation_waiting_count(&client, instance.id).await?;
    metrics.queue_depth.store(depth, Ordering::Relaxed);
    metrics.dead_letters.store(dead, Ordering::Relaxed);
    Ok(())
}

/// Probes in a row that must pass, after one failed, before the agent reports its
/// instance reachable (a heartbeat) or Argo CD making progress again: coming back
/// takes several probes, never one. Losing it takes `gitops.instance_lost_after`
/// without a heartbeat, and degrading `gitops.instance_degraded_after` without
/// progress, several probes too at the default 15 s interval. (Argo CD stamps
/// `reconciledAt` to the second: probes less than a second apart cannot see progress
/// in a row.)
const RECOVERY_PROBES: u32 = 3;

/// Whether to report a probe that passed: always while none failed, and after a
/// failure only once `need` passed in a row.
#[derive(Debug, Clone, Copy)]
struct Debounce {
    need: u32,
    streak: u32,
    /// Whether the previous probe was reported as passed.
    reported: bool,
    /// Whether the one before it was.
    reported_before: bool,
}

impl Debounce {
    /// Settled: nothing failed yet.
    fn new(need: u32) -> Self {
        Debounce { need, streak: need, reported: true, reported_before: true }
    }

    /// Takes a probe's outcome; returns whether to report it as passed.
    fn observe(&mut self, passed: bool) -> bool {
        self.streak = if passed { self.streak.saturating_add(1) } else { 0 };
        self.reported_before = self.reported;
        self.reported = self.streak >= self.need;
        self.reported
    }

    /// Whether the probe before the last one was reported as passed (false right
    /// after a recovery).
    fn reported_before(&self) -> bool {
        self.reported_before
    }
}

/// What the heartbeat loop works with.
struct Heartbeats {
    pool: DbPool,
    engine: Arc<dyn Engine>,
    instance: EngineInstance,
    /// Kept current: read again whenever the instance is found unfenced.
    epoch: InstanceEpoch,
    /// Told of every heartbeat written (writes to Argo CD stop while it is old).
    clock: HeartbeatClock,
    every: Duration,
    metrics: Arc<Metrics>,
}

/// Beats while the Argo CD namespace's API answers: an agent that cannot reach it
/// writes no heartbeat and is not ready. When it answers again, the instance's
/// backed-off operations are made due at once instead of at their next retry.
async fn heartbeat_loop(beats: Heartbeats, cancel: CancellationToken) {
    let Heartbeats { pool, engine, instance, epoch, clock, every, metrics } = beats;
    // The progress probe's last stamp, and whether an unstamped probe was counted once.
    let mut last_stamp: Option<String> = None;
    let mut unstamped_counted = false;
    let (mut reachable, mut progressing) = (Debounce::new(RECOVERY_PROBES), Debounce::new(RECOVERY_PROBES));
    // The adoption settings last recorded.
    let mut reported: Option<AdoptionSettings> = None;
    // The version last recorded (outer None: not yet).
    let mut reported_version: Option<Option<String>> = None;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let was_reachable = metrics.argocd_reachable.load(Ordering::Relaxed);
        let probe = engine.probe().await;
        metrics.argocd_probes.fetch_add(1, Ordering::Relaxed);
        if let Err(error) = probe {
            if was_reachable {
                tracing::error!(error = %gitops_shared::telemetry::error_chain(&error), argocd.ns = %instance.argocd_namespace,
                    "the Argo CD namespace's API does not answer this agent: not ready, no heartbeat");
            }
            reachable.observe(false);
            metrics.argocd_reachable.store(false, Ordering::Relaxed);
            continue;
        }
        metrics.argocd_reachable.store(true, Ordering::Relaxed);
        // The instance is reported live again only after a few answers in a row.
        if !reachable.observe(true) {
            continue;
        }
        if !reachable.reported_before() {
            match recovered(&pool, &instance).await {
                Ok(due) => tracing::info!(
                    operations = due,
                    "the Argo CD namespace's API answers again; waiting operations made due"
                ),
                Err(error) => tracing::warn!(%error, "could not make waiting operations due"),
            }
        }
        if let Err(error) = heartbeat(&pool, &instance, &metrics, &clock).await {
            tracing::warn!(%error, "heartbeat failed");
        }
        report_adoption_settings(&pool, engine.as_ref(), &instance, &mut reported).await;
        report_version(&pool, engine.as_ref(), &instance, &mut reported_version).await;
        if let Err(error) = crate::fence::clean_up_if_fenced(&pool, engine.as_ref(), &epoch, &metrics).await {
            tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error), "fenced: clean-up failed; retrying");
        }
        // Argo CD itself: did its application controller refresh the probe since the
        // last look? An unstamped probe counts once (the grace starts when it is made).
        let progressed = match engine.probe_progress().await {
            Ok(ProgressStamp::Unsupported) => true,
            Ok(ProgressStamp::Unstamped) => !std::mem::replace(&mut unstamped_counted, true),
            Ok(ProgressStamp::Stamp(stamp)) => last_stamp.replace(stamp.clone()).as_ref() != Some(&stamp),
            Err(error) => {
                tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error), "the progress probe failed");
                false
            }
        };
        metrics.argocd_progressing.store(progressed, Ordering::Relaxed);
        // Progress after a stall counts once seen in a few probes in a row.
        if progressing.observe(progressed)
            && let Err(error) = progress(&pool, &instance).await
        {
            tracing::warn!(%error, "could not record Argo CD's progress");
        }
    }
}

/// Records how the instance's Argo CD tracks what it deploys, when it changed (moves
/// between instances that differ are refused).
async fn report_adoption_settings(
    pool: &DbPool,
    engine: &dyn Engine,
    instance: &EngineInstance,
    reported: &mut Option<AdoptionSettings>,
) {
    let settings = match engine.adoption_settings().await {
        Ok(Some(settings)) => settings,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error), "could not read Argo CD's tracking settings");
            return;
        }
    };
    if reported.as_ref() == Some(&settings) {
        return;
    }
    let recorded = async {
        let client = pooled(pool).await?;
        gitops_shared::db::engine_instance::engine_instance_adoption_settings(
            &client,
            instance.id,
            &settings.tracking_method,
            &settings.instance_label_key,
            &settings.installation_id,
        )
        .await
    }
    .await;
    match recorded {
        Ok(_) => {
            tracing::info!(tracking = %settings.tracking_method, instance_label = %settings.instance_label_key,
                "Argo CD's tracking settings recorded");
            *reported = Some(settings);
        }
        Err(error) => tracing::warn!(%error, "could not record Argo CD's tracking settings"),
    }
}

/// Records the Argo CD version the instance runs, when it changed (or at start).
async fn report_version(
    pool: &DbPool,
    engine: &dyn Engine,
    instance: &EngineInstance,
    reported: &mut Option<Option<String>>,
) {
    let version = match engine.version().await {
        Ok(version) => version,
        Err(error) => {
            tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error), "could not read Argo CD's version");
            return;
        }
    };
    if reported.as_ref() == Some(&version) {
        return;
    }
    let recorded = async {
        let client = pooled(pool).await?;
        gitops_shared::db::engine_instance::engine_instance_version(&client, instance.id, version.as_deref()).await
    }
    .await;
    match recorded {
        Ok(()) => {
            tracing::info!(argocd.version = version.as_deref().unwrap_or("unknown"), "Argo CD's version recorded");
            *reported = Some(version);
        }
        Err(error) => tracing::warn!(%error, "could not record Argo CD's version"),
    }
}

async fn progress(pool: &DbPool, instance: &EngineInstance) -> Result<(), db::DbError> {
    let client = pooled(pool).await?;
    gitops_shared::db::engine_instance::engine_instance_progress(&client, instance.id).await
}

async fn recovered(pool: &DbPool, instance: &EngineInstance) -> Result<u64, db::DbError> {
    let client = pooled(pool).await?;
    gitops_shared::queue::operation_make_due(&client, instance.id).await
}

/// The reconciler with its metrics and a tracing span per operation.
struct Instrumented<H> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_is_reported_again_only_after_three_probes_in_a_row() {
        let mut probe = Debounce::new(RECOVERY_PROBES);
        assert!(probe.observe(true) && probe.reported_before(), "settled at start");
        assert!(!probe.observe(false));
        assert!(!probe.observe(true) && !probe.observe(true), "two in a row are not enough");
        assert!(!probe.observe(false), "a failure starts over");
        assert!(!probe.observe(true) && !probe.observe(true));
        assert!(probe.observe(true) && !probe.reported_before(), "the third reports, as a recovery");
        assert!(probe.observe(true) && probe.reported_before());
    }
}
