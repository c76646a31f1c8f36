//! `gitops-writer run`: checks keys and schema, then runs the shard keeper, the
//! controllers and the status loop until cancelled. Tests call [`run_writer`] with a
//! config to run the same code in-process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use gitops_shared::crypto::SecretBox;
use gitops_shared::db;
use gitops_shared::listen::Listener;
use gitops_shared::signal::Signal;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::context::WriterContext;
use crate::controller::connection::ConnectionPolicy;
use crate::controller::{ControllerSettings, HomeSettings, HomeStatus, run_controllers};
use crate::metrics::WriterMetrics;
use crate::purge::PurgeSettings;
use crate::shard::{ShardConfig, ShardKeeper};
use crate::tenancy::{ServedNamespaces, TenancySettings};
use crate::webhook::WebhookSettings;
use crate::{APPLICATION_NAME, WriterError, connect};

/// The default port of the writer's HTTP endpoint.
pub const DEFAULT_METRICS_PORT: u16 = 9465;

/// Everything `run` needs.
#[derive(Clone)]
pub struct WriterConfig {
    pub database_url: String,
    /// For LISTEN (a direct connection when the pool goes through a pooler).
    pub listen_database_url: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub secrets: SecretBox,
    /// Names this process in the shard leases.
    pub writer_id: String,
    /// Only these namespaces (empty: all).
    pub namespaces: Vec<String>,
    pub pool_size: usize,
    pub shards: ShardConfig,
    pub controllers: ControllerSettings,
    /// Home-cluster access for tenants' own namespaces; without a CA, the CA the
    /// writer itself trusts for its Kubernetes API is used.
    pub home: HomeSettings,
    /// The metrics of this writer (tests read them).
    pub metrics: Arc<WriterMetrics>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (port 0: any).
    pub metrics_address: SocketAddr,
    /// Set to the address actually bound (tests use port 0).
    pub http_address: Arc<OnceLock<SocketAddr>>,
    /// When rows confirmed deleted are purged from the owned shards.
    pub purge: PurgeSettings,
    /// How often the engine instances' health is read (and tenants told of changes).
    pub fleet_watch_interval: std::time::Duration,
    /// Failing over lost instances (None: off).
    pub failover: Option<crate::fleet::FailoverSettings>,
    /// Draining degraded instances and rebalancing (None: off).
    pub balance: Option<gitops_shared::db::fleet_balance::BalanceSettings>,
    /// The automatic scale-up (None, the default: off).
    pub scale_up: Option<crate::scale_up::ScaleUpSettings>,
    /// Where environment connection checks may go; `None` (the default): checks are off.
    pub connection_check: Option<ConnectionPolicy>,
    /// Repository credential validation; `None` (the default): off.
    pub repository_check: Option<crate::controller::repository_check::RepositoryCheckSettings>,
    /// Accept environments whose apiURL is a loopback, link-local or cloud metadata
    /// address (off: refused with `APIURLNotAllowed`).
    pub api_url_allow_private: bool,
    /// Which namespaces are tenants.
    pub tenancy: TenancySettings,
    /// The admission webhook; `None`: not served (home deployments then find no
    /// approval and are refused, unless `allow_unverified_home`).
    pub webhook: Option<WebhookSettings>,
    /// Accept home deployments without a verified requester.
    pub allow_unverified_home: bool,
    /// The AppStudio layer's username, whose home deployments owned by a binding
    /// are approved (`--appstudio-identity`).
    pub appstudio_identity: Option<String>,
    /// How often the home role and namespace (and the webhook registration) are checked.
    pub home_check_every: std::time::Duration,
    /// Set to the webhook's bound address (tests use port 0).
    pub webhook_address: Arc<OnceLock<SocketAddr>>,
}

impl WriterConfig {
    pub fn new(database_url: String, secrets: SecretBox, writer_id: String) -> Self {
        WriterConfig {
            database_url,
            listen_database_url: None,
            kubeconfig: None,
            secrets,
            writer_id,
            namespaces: Vec::new(),
            pool_size: 16,
            shards: ShardConfig::default(),
            controllers: ControllerSettings::default(),
            home: HomeSettings::default(),
            metrics: Arc::new(WriterMetrics::default()),
            metrics_address: SocketAddr::from(([127, 0, 0, 1], DEFAULT_METRICS_PORT)),
            http_address: Arc::new(OnceLock::new()),
            purge: PurgeSettings::default(),
            fleet_watch_interval: crate::fleet::FLEET_WATCH_INTERVAL,
            failover: Some(crate::fleet::FailoverSettings::default()),
            balance: None,
            scale_up: None,
            connection_check: None,
            repository_check: None,
            api_url_allow_private: false,
            tenancy: TenancySettings::default(),
            webhook: None,
            allow_unverified_home: false,
            appstudio_identity: None,
            home_check_every: std::time::Duration::from_secs(10),
            webhook_address: Arc::new(OnceLock::new()),
        }
    }
}

/// Runs the writer until `cancel` fires.
pub async fn run_writer(config: WriterConfig, cancel: CancellationToken) -> Result<(), WriterError> {
    let client = connect(&config.database_url).await?;
    let schema = db::check_schema(&client).await.map_err(|source| WriterError::Schema { source })?;
    tracing::info!(schema.found = schema.found, schema.required = schema.required, "database schema checked");
    drop(client);
    let pool = db::pool(&config.database_url, config.pool_size, APPLICATION_NAME)
        .map_err(|source| WriterError::Connect { database: db_name(&config.database_url), source })?;
    let (kube, kube_ca) = kube_client(config.kubeconfig.as_ref()).await?;
    let mut home = config.home.clone();
    if home.ca_data.is_none() {
        home.ca_data = kube_ca.as_deref().and_then(HomeSettings::ca_from_der);
    }
    let served = ServedNamespaces::new(config.tenancy.clone());
    served
        .refresh(&pool)
        .await
        .map_err(|source| WriterError::Connect { database: db_name(&config.database_url), source })?;
    let home_status = HomeStatus::new();
    let webhook = match &config.webhook {
        Some(settings) => Some(crate::webhook::bind(settings).await?),
        None => None,
    };
    let events = Arc::new(crate::events::TenantEvents::new(kube.clone(), &config.writer_id));
    let ctx = Arc::new(WriterContext {
        pool: pool.clone(),
        kube,
        events,
        secrets: config.secrets.clone(),
        writer_id: config.writer_id.clone(),
        metrics: config.metrics.clone(),
        home,
        queue: crate::work_queue::WorkQueue::new(),
        connection_check: config.connection_check.clone(),
        repository_check: config.repository_check.clone(),
        api_url_allow_private: config.api_url_allow_private,
        served: served.clone(),
        home_status: home_status.clone(),
        allow_unverified_home: config.allow_unverified_home,
        appstudio_identity: config.appstudio_identity.clone(),
    });
    let listen_url = config.listen_database_url.as_deref().unwrap_or(&config.database_url);
    let listener = Listener::start(listen_url, &[Signal::status()], cancel.clone())
        .map_err(|source| WriterError::Connect { database: db_name(listen_url), source })?;
    let http = TcpListener::bind(config.metrics_address)
        .await
        .map_err(|source| WriterError::Bind { address: config.metrics_address, source })?;
    let bound = http.local_addr().map_err(|source| WriterError::Bind { address: config.metrics_address, source })?;
    let _ = config.http_address.set(bound);
    tracing::info!(address = %bound, "serving /metrics, /healthz and /readyz");
    let endpoints = crate::http::Endpoints {
        metrics: config.metrics.clone(),
        listener: listener.clone(),
        pool: pool.clone(),
        home_status: home_status.clone(),
    };
    // No shard is taken before the watchers have listed: a writer whose Kubernetes API
    // does not answer would hold shards it cannot serve.
    let (keeper, shards) =
        ShardKeeper::new(pool, config.writer_id.clone(), config.shards, config.metrics.ready_watch());
    // The controllers start knowing whether home identities can be made.
    crate::controller::check_once(&ctx.kube, &ctx.home, &home_status).await;
    let mut tasks = JoinSet::new();
    tasks.spawn(crate::http::serve(http, endpoints, cancel.clone()));
    if let Some((socket, acceptor)) = webhook {
        if let Ok(address) = socket.local_addr() {
            let _ = config.webhook_address.set(address);
            tracing::info!(%address, "serving the admission webhook");
        }
        tasks.spawn(crate::webhook::serve(
            socket,
            acceptor,
            crate::webhook::writer_reviewer(ctx.clone()),
            cancel.clone(),
        ));
    } else if config.allow_unverified_home {
        tracing::warn!(
            "no admission webhook: deployments into tenants' own namespaces are accepted without checking who asked"
        );
    } else {
        tracing::warn!(
            "no admission webhook: deployments into tenants' own namespaces are refused (RequesterUnverified)"
        );
    }
    tasks.spawn(crate::controller::check_loop(
        ctx.kube.clone(),
        ctx.home.clone(),
        home_status,
        config.home_check_every,
        cancel.clone(),
    ));
    tasks.spawn(served.refresh_loop(ctx.pool.clone(), cancel.clone()));
    // The keeper releases its leases after the others stopped writing.
    let keeper_cancel = CancellationToken::new();
    let keeper_task = tokio::spawn(keeper.run(keeper_cancel.clone()));
    tasks.spawn(run_controllers(
        ctx.clone(),
        config.controllers,
        shards.clone(),
        config.namespaces.clone(),
        cancel.clone(),
    ));
    tasks.spawn({
        let (ctx, shards, cancel) = (ctx.clone(), shards.clone(), cancel.clone());
        async move {
            if let Err(error) = crate::status::run_status_loop(ctx, shards, listener, cancel.clone()).await {
                tracing::error!(%error, "the status loop stopped");
                cancel.cancel();
            }
        }
    });
    tasks.spawn(crate::purge::run_purge_loop(ctx.pool.clone(), shards.clone(), config.purge, cancel.clone()));
    tasks.spawn(crate::fleet::run_fleet_watch(
        ctx.pool.clone(),
        crate::fleet::HomeIdentities { kube: ctx.kube.clone(), namespace: ctx.home.namespace.clone() },
        shards.clone(),
        ctx.metrics.clone(),
        crate::fleet::FleetWatch {
            every: config.fleet_watch_interval,
            failover: config.failover,
            balance: config.balance,
            healthy_within: config.controllers.healthy_within,
            scale_up: config.scale_up.clone().map(|settings| crate::scale_up::ScaleUp {
                settings,
                kube: ctx.kube.clone(),
                holder: config.writer_id.clone(),
                running: None,
            }),
        },
        cancel.clone(),
    ));
    tracing::info!(writer.id = %config.writer_id, "writer running");
    while tasks.join_next().await.is_some() {}
    keeper_cancel.cancel();
    let _ = keeper_task.await;
    Ok(())
}

fn db_name(url: &str) -> String {
    gitops_shared::config::redact_database_url(url)
}

/// The client, and the CA certificates (DER) it trusts, if any were configured.
async fn kube_client(path: Option<&PathBuf>) -> Result<(kube::Client, Option<Vec<Vec<u8>>>), WriterError> {
    let mut config = match path {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).map_err(|source| WriterError::Kubeconfig { path: path.clone(), source })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|source| WriterError::Kubeconfig { path: path.clone(), source })?
        }
        None => kube::Config::infer().await.map_err(|source| WriterError::InferKube { source })?,
    };
    // The cluster's API is reached directly. kube takes proxy variables from the
    // environment (often set on hosts for other traffic) into the config, and this
    // build speaks no proxy protocol: every request would fail.
    config.proxy_url = None;
    let ca = config.root_cert.clone();
    let client = kube::Client::try_from(config).map_err(|source| WriterError::KubeClient { source })?;
    Ok((client, ca))
}

/// A writer id for this process: host name (when set) and a random suffix.
pub fn default_writer_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "writer".to_owned());
    format!("{host}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}
