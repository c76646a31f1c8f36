//! `run_agent`: the wiring of a running agent process. Start-up checks (schema,
//! the named instances registered, encryption keys), one Kubernetes client and one
//! HTTP endpoint for the process, then, until the token is cancelled, one serving
//! task per instance (`crate::serve`): those named with `--instance`, or every
//! instance registered for the `--host-cluster`, looked up again every
//! `instances_refresh` so that instances registered later are picked up and
//! deregistered ones dropped. An instance whose serving fails is tried again at
//! the next look-up; the others go on. On cancel every instance's consumer stops
//! claiming and finishes the batch in hand; everything else stops after it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use gitops_shared::config::DatabaseUrl;
use gitops_shared::crypto::SecretBox;
use gitops_shared::db::engine_instance::{EngineInstance, check_host_cluster, engine_instance_list};
use gitops_shared::db::{self, DbPool, pooled};
use gitops_shared::model::EngineInstanceId;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::destination::DestinationConfig;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::serve::{LOCK_TIMEOUT, Process, serve_instance};
use crate::sweep::SweepConfig;
use crate::{APPLICATION_NAME, AgentError, connect, instance};

/// How long without a heartbeat until the agent stops writing to Argo CD: below
/// the default lost window (60 s) plus the default failover grace (2 min).
pub const DEFAULT_SELF_FENCE_AFTER: Duration = Duration::from_secs(90);

/// The default duty lease: two default heartbeat intervals, so a killed holder's duties
/// are taken over (and the heartbeat written again) well within the default
/// `gitops.instance_lost_after` (60 s).
pub const DEFAULT_DUTY_LEASE: Duration = Duration::from_secs(30);

/// The instances an agent process serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Served {
    /// These, by name; each must be registered when the process starts.
    Instances(Vec<String>),
    /// Every instance registered with this host cluster, now or later.
    HostCluster(String),
}

impl Served {
    fn wants(&self, instance: &EngineInstance) -> bool {
        match self {
            Served::Instances(names) => names.contains(&instance.name),
            Served::HostCluster(host) => instance.host_cluster.as_deref() == Some(host.as_str()),
        }
    }
}

/// What a test or the binary may observe of a running agent.
#[derive(Debug, Clone, Default)]
pub struct AgentHandle {
    registry: Arc<Registry>,
    http_address: Arc<OnceLock<SocketAddr>>,
}

impl AgentHandle {
    /// The metrics of instance `name` (the same before, while and after it is served).
    pub fn metrics(&self, name: &str) -> Arc<Metrics> {
        self.registry.metrics(name)
    }

    /// The instances the process serves now.
    pub fn instances(&self) -> Vec<String> {
        self.registry.names()
    }

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
    /// Which instances to serve.
    pub serve: Served,
    /// How often the served instances are looked up again (host cluster: new ones
    /// picked up; either way: deregistered ones dropped, failed ones retried).
    pub instances_refresh: Duration,
    /// The duty lease of an instance (its sweep, heartbeat, health probe): renewed
    /// every heartbeat interval, so keep it several intervals long.
    pub duty_lease: Duration,
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
            serve: Served::Instances(vec![instance]),
            instances_refresh: Duration::from_secs(30),
            duty_lease: DEFAULT_DUTY_LEASE,
            kubeconfig: None,
            metrics_address: SocketAddr::from(([127, 0, 0, 1], 9464)),
            sweep: SweepConfig {
                interval: Duration::from_secs(300),
                max_deletions: 50,
                dry_run: false,
                page_size: crate::sweep::PAGE_SIZE,
            },
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
    match &config.serve {
        Served::Instances(names) => {
            if names.is_empty() {
                return Err(AgentError::NothingToServe);
            }
            for name in names {
                instance(&client, name).await?;
            }
        }
        Served::HostCluster(host) => {
            check_host_cluster(host).map_err(|source| AgentError::HostCluster { source })?;
            tracing::info!(host.cluster = %host, "serving every instance of the host cluster");
        }
    }
    drop(client);
    // Settings every instance uses are refused at start, not at each instance.
    crate::destination::HomeClusters::new(config.destinations.home_api_urls.iter().map(String::as_str))
        .map_err(|message| AgentError::Destinations { message })?;
    let pool = db::pool_with_lock_timeout(config.database_url.expose(), 2, APPLICATION_NAME, Some(LOCK_TIMEOUT))
        .map_err(|source| AgentError::Pool { source })?;
    let kube = kube_client(config.kubeconfig.as_ref()).await?;
    let registry = config.handle.registry.clone();
    if let Served::Instances(names) = &config.serve {
        registry.expect(names.iter().cloned());
    }
    let http = crate::http::bind(config.metrics_address)
        .await
        .map_err(|source| AgentError::Bind { address: config.metrics_address, source })?;
    let bound = http.local_addr().map_err(|source| AgentError::Bind { address: config.metrics_address, source })?;
    let _ = config.handle.http_address.set(bound);
    tracing::info!(address = %bound, "serving /metrics, /healthz and /readyz");
    let http_cancel = CancellationToken::new();
    let endpoints = crate::registry::Endpoints { registry: registry.clone(), pool: pool.clone() };
    let http_task = tokio::spawn(crate::http::serve(http, endpoints, http_cancel.clone()));

    let refresh = config.instances_refresh.max(Duration::from_millis(100));
    let process = Arc::new(Process { config, kube, registry });
    let mut serving = Serving::default();
    loop {
        serving.reap();
        match wanted(&pool, &process.config.serve).await {
            Ok(instances) => serving.follow(&process, instances, &cancel),
            Err(error) => tracing::warn!(%error, "could not look up the instances to serve; serving those in hand"),
        }
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(refresh) => {}
        }
    }
    // Every instance's token is a child of `cancel`: they drain now.
    while serving.tasks.join_next().await.is_some() {}
    http_cancel.cancel();
    let _ = http_task.await;
    tracing::info!("agent stopped");
    Ok(())
}

/// The registered instances `serve` asks for.
async fn wanted(pool: &DbPool, serve: &Served) -> Result<Vec<EngineInstance>, db::DbError> {
    let client = pooled(pool).await?;
    Ok(engine_instance_list(&client).await?.into_iter().filter(|i| serve.wants(i)).collect())
}

/// The instances being served, each with the token that stops it.
#[derive(Default)]
struct Serving {
    running: BTreeMap<EngineInstanceId, (u64, String, CancellationToken)>,
    tasks: JoinSet<(EngineInstanceId, u64)>,
    /// Numbers the serving tasks, so a finished one is told from its successor.
    started: u64,
}

impl Serving {
    /// Forgets instances whose serving ended (failed: they start again when wanted).
    fn reap(&mut self) {
        while let Some(done) = self.tasks.try_join_next() {
            if let Ok((id, serial)) = done
                && self.running.get(&id).is_some_and(|(s, _, _)| *s == serial)
            {
                self.running.remove(&id);
            }
        }
    }

    /// Starts serving the wanted instances not served yet; stops the others.
    fn follow(&mut self, process: &Arc<Process>, wanted: Vec<EngineInstance>, cancel: &CancellationToken) {
        let ids: Vec<EngineInstanceId> = wanted.iter().map(|i| i.id).collect();
        let gone: Vec<EngineInstanceId> = self.running.keys().filter(|id| !ids.contains(id)).copied().collect();
        for id in gone {
            if let Some((_, name, token)) = self.running.remove(&id) {
                tracing::info!(instance.name = %name, "instance deregistered or moved to another host cluster; no longer serving it");
                token.cancel();
            }
        }
        for instance in wanted {
            if self.running.contains_key(&instance.id) || cancel.is_cancelled() {
                continue;
            }
            self.started += 1;
            let (serial, id, name) = (self.started, instance.id, instance.name.clone());
            let token = cancel.child_token();
            let span = tracing::info_span!("instance", instance.name = %name);
            let task = serve_instance(process.clone(), instance, token.clone());
            self.tasks.spawn(tracing::Instrument::instrument(
                async move {
                    if let Err(error) = task.await {
                        tracing::error!(error = %gitops_shared::telemetry::error_chain(&error),
                            "serving the instance failed; trying again at the next look-up");
                    }
                    (id, serial)
                },
                span,
            ));
            self.running.insert(id, (serial, name, token));
        }
    }
}

async fn kube_client(path: Option<&PathBuf>) -> Result<kube::Client, AgentError> {
    let mut config = match path {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).map_err(|source| AgentError::Kubeconfig { path: path.clone(), source })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|source| AgentError::Kubeconfig { path: path.clone(), source })?
        }
        None => kube::Config::infer().await.map_err(|source| AgentError::InferKube { source })?,
    };
    // The cluster's API is reached directly. kube takes proxy variables from the
    // environment (often set on hosts for other traffic) into the config, and this
    // build speaks no proxy protocol: every request would fail.
    config.proxy_url = None;
    kube::Client::try_from(config).map_err(|source| AgentError::KubeClient { source })
}
