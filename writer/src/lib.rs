//! The writer: watches the tenants' resources and writes their intent, together
//! with the operations that carry it to the agents, into PostgreSQL: `migrate`, and
//! `run` (shard leases, the GitOpsDeployment and SyncRun controllers, the status
//! loop). A library so tests drive the code the binary runs.

pub mod api;
pub mod context;
pub mod controller;
pub mod events;
pub mod fleet;
pub mod http;
pub mod metrics;
pub mod provision;
pub mod purge;
pub mod rollout;
pub mod run;
pub mod scale_up;
pub mod shard;
pub mod status;
pub mod tenancy;
pub mod validate;
pub mod webhook;
pub mod work_queue;

use clap::{Args, Parser, Subcommand};
use std::time::Duration;

use gitops_shared::config::{self, DatabaseUrl, parse_duration, redact_database_url};
use gitops_shared::crypto::{CryptoError, SecretBox};
use gitops_shared::db::{self, DbError, MigrationReport};
use tokio_postgres::Client;

pub(crate) const APPLICATION_NAME: &str = "gitops-writer";

#[derive(Debug, Parser)]
#[command(name = "gitops-writer", version, about = "The GitOps service's writer: tenant intent into PostgreSQL")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format on stderr: `text`, or `json` (one object per line, for log
    /// collectors). The level comes from RUST_LOG (`info` by default).
    #[arg(long, global = true, env = gitops_shared::telemetry::LOG_FORMAT, default_value_t)]
    pub log_format: gitops_shared::telemetry::LogFormat,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the schema migrations this binary embeds and print the resulting version.
    Migrate(DbArgs),
    /// Run the writer. Needs the encryption keys (GITOPS_ENCRYPTION_KEYS,
    /// GITOPS_ENCRYPTION_ACTIVE_KEY) and a schema at least as new as this binary's.
    Run(Box<RunArgs>),
}

/// Flags of `run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// A direct PostgreSQL URL for LISTEN when --database-url goes through a pooler
    /// (the deprecated GITOPS_LISTEN_DATABASE_URL is still read, with a warning).
    #[arg(long, env = config::LISTEN_DATABASE_URL, hide_env_values = true)]
    pub listen_database_url: Option<DatabaseUrl>,
    /// Kubeconfig of the cluster with the tenant resources (default: as kube infers it).
    #[arg(long, env = "GITOPS_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Concurrent reconciles.
    #[arg(long, env = "GITOPS_WRITER_WORKERS", default_value_t = 16)]
    pub workers: usize,
    /// Handle only these namespaces (comma-separated; default: all).
    #[arg(long, env = "GITOPS_WRITER_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// This writer's id in the shard leases (default: host name and a random suffix).
    #[arg(long, env = "GITOPS_WRITER_ID")]
    pub writer_id: Option<String>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "GITOPS_WRITER_METRICS_ADDRESS", default_value = "127.0.0.1:9465")]
    pub metrics_address: std::net::SocketAddr,
    /// Most GitOpsDeployments per namespace.
    #[arg(long, env = "GITOPS_WRITER_MAX_DEPLOYMENTS", default_value_t = 500)]
    pub max_deployments: i64,
    /// The home cluster's API server as Argo CD reaches it (for deployments into the
    /// tenant's own namespace).
    #[arg(long, env = "GITOPS_WRITER_HOME_API_URL", default_value = "https://kubernetes.default.svc")]
    pub home_api_url: String,
    /// PEM CA bundle that verifies --home-api-url (default: the CA the writer trusts
    /// for its own Kubernetes API).
    #[arg(long, env = "GITOPS_WRITER_HOME_CA_FILE")]
    pub home_ca_file: Option<std::path::PathBuf>,
    /// Lifetime of the tokens of tenants' home ServiceAccounts, e.g. 1h (at least
    /// 10m; a bare number is seconds); a token is renewed when a third of it is left.
    /// Default 1h. (`--home-token-seconds` and GITOPS_WRITER_HOME_TOKEN_SECONDS are
    /// deprecated spellings.)
    #[arg(long, alias = "home-token-seconds", env = "GITOPS_WRITER_HOME_TOKEN_LIFETIME", value_parser = parse_duration)]
    pub home_token_lifetime: Option<Duration>,
    /// How long a row stays confirmed deleted before it is purged from the database,
    /// e.g. 10m (a bare number is seconds). Default 10m. (GITOPS_WRITER_PURGE_AFTER_SECONDS
    /// is a deprecated spelling.)
    #[arg(long, env = "GITOPS_WRITER_PURGE_AFTER", value_parser = parse_duration)]
    pub purge_after: Option<Duration>,
    /// How often the rows of the owned shards are compared with the tenant resources
    /// (anti-entropy; also at start and whenever shards are gained), e.g. 5m.
    #[arg(long, env = "GITOPS_WRITER_RESYNC_INTERVAL", value_parser = parse_duration, default_value = "5m")]
    pub resync_interval: Duration,
    /// Most rows one anti-entropy pass may tombstone; with more candidates it
    /// tombstones none and reports the refusal (a mass deletion is never a repair).
    #[arg(long, env = "GITOPS_WRITER_RESYNC_MAX_TOMBSTONES", default_value_t = 50)]
    pub resync_max_tombstones: usize,
    /// How long an engine instance may stay lost (no agent reaches its Argo CD)
    /// before it is fenced and its tenants are placed on healthy instances, e.g. 2m.
    #[arg(long, env = "GITOPS_WRITER_FAILOVER_GRACE", value_parser = parse_duration, default_value = "2m")]
    pub failover_grace: Duration,
    /// Most tenants re-placed per failover step (a step every few seconds, every
    /// second while tenants are left).
    #[arg(long, env = "GITOPS_WRITER_FAILOVER_BATCH", default_value_t = 20,
          value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub failover_batch: i64,
    /// Move tenants from the fullest to the emptiest open, healthy instance while
    /// their loads (tenants / capacity) differ by more than this, 0 to 1 (e.g. 0.2);
    /// once started, down to half of it. Off when unset.
    #[arg(long, env = "GITOPS_WRITER_REBALANCE_THRESHOLD", value_parser = parse_threshold)]
    pub rebalance_threshold: Option<f64>,
    /// Most tenant moves the writers start to be in progress at once (rebalancing and
    /// draining instances degraded past the failover grace; operators' moves count).
    #[arg(long, env = "GITOPS_WRITER_MAX_CONCURRENT_MOVES", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..=1_000))]
    pub max_concurrent_moves: u64,
    /// Check that each GitOpsDeploymentManagedEnvironment's apiURL answers with its
    /// credentials (GET /version), reported in its ConnectionInitializationSucceeded
    /// condition. Off by default: the writer then contacts no tenant API server.
    #[arg(long, env = "GITOPS_WRITER_CONNECTION_CHECK")]
    pub connection_check: bool,
    /// Destinations the writer itself may contact for tenants (connection checks)
    /// (comma-separated): `host`, `*.domain`, `10.0.0.0/8`, `[fd00::/8]`, `*`, each
    /// optionally with `:port`. Matched on the URL's host as written, without DNS.
    /// Empty: nothing is contacted. `--connection-check-allow` is the older name.
    #[arg(
        long = "egress-allow",
        visible_alias = "connection-check-allow",
        env = "GITOPS_WRITER_CONNECTION_CHECK_ALLOW",
        value_delimiter = ','
    )]
    pub connection_check_allow: Vec<controller::connection::Destination>,
    /// Destinations the writer never contacts, even when allowed (same syntax).
    /// `--connection-check-deny` is the older name.
    #[arg(
        long = "egress-deny",
        visible_alias = "connection-check-deny",
        env = "GITOPS_WRITER_CONNECTION_CHECK_DENY",
        value_delimiter = ','
    )]
    pub connection_check_deny: Vec<controller::connection::Destination>,
    /// Validate each GitOpsDeploymentRepositoryCredential against its repository
    /// (`git ls-remote` with the credentials, on every change and every 10 minutes),
    /// reported in its ValidRepositoryURL and ValidRepositoryCredential conditions.
    /// Only repositories the egress lists allow are contacted. Off by default: the
    /// writer then contacts no repository. Needs `git` (and `ssh` for SSH URLs).
    #[arg(long, env = "GITOPS_WRITER_REPOSITORY_CHECK")]
    pub repository_check: bool,
    /// OpenSSH known-hosts file the SSH host keys of repositories are verified against
    /// (entries as `ssh-keyscan` writes them, `[host]:port` for ports other than 22).
    /// Without it, SSH repositories are not contacted.
    #[arg(long, env = "GITOPS_WRITER_REPOSITORY_KNOWN_HOSTS")]
    pub repository_known_hosts: Option<std::path::PathBuf>,
    /// PEM CA bundle trusted for HTTPS repositories instead of the system's.
    #[arg(long, env = "GITOPS_WRITER_REPOSITORY_CA_FILE")]
    pub repository_ca_file: Option<std::path::PathBuf>,
    /// Let tenants aim the GitOps engine at loopback, link-local and cloud metadata
    /// addresses in an environment's apiURL (single-tenant or test installations
    /// only). Separate from the egress lists, which say whom the writer contacts.
    #[arg(long, env = "GITOPS_WRITER_API_URL_ALLOW_PRIVATE")]
    pub api_url_allow_private: bool,
    #[command(flatten)]
    pub tenancy: TenancyArgs,
    #[command(flatten)]
    pub webhook: WebhookArgs,
    #[command(flatten)]
    pub scale_up: ScaleUpArgs,
}

/// Which namespaces are tenants: the operator's selection, shared by the writer and
/// the AppStudio layer (same flags, same variables), so both serve the same ones.
#[derive(Debug, Clone, Args)]
pub struct NamespaceSelectionArgs {
    /// Serve only namespaces whose labels match this selector (e.g.
    /// `gitops.example.com/tenant=true`). Default: any labels.
    #[arg(long, env = "GITOPS_TENANT_NAMESPACE_SELECTOR")]
    pub tenant_namespace_selector: Option<gitops_shared::tenancy::LabelSelector>,
    /// Serve only namespaces whose names match one of these patterns (comma-separated,
    /// `*` matches any run of characters). Default: any name.
    #[arg(long, env = "GITOPS_TENANT_NAMESPACES", value_delimiter = ',')]
    pub tenant_namespaces: Vec<gitops_shared::tenancy::NamePattern>,
    /// More namespaces that are never tenants (patterns, comma-separated), besides
    /// `kube-*`, `default`, the service's own and every engine instance's.
    #[arg(long, env = "GITOPS_RESERVED_NAMESPACES", value_delimiter = ',')]
    pub reserved_namespaces: Vec<gitops_shared::tenancy::NamePattern>,
    /// The namespaces the service's own components run in (comma-separated; the
    /// process's own, from POD_NAMESPACE, and the home namespace are always included).
    #[arg(long, env = "GITOPS_SERVICE_NAMESPACES", value_delimiter = ',')]
    pub service_namespaces: Vec<String>,
}

/// Who is a tenant, and what the service does in a tenant's own namespace.
#[derive(Debug, Clone, Args)]
pub struct TenancyArgs {
    #[command(flatten)]
    pub namespaces: NamespaceSelectionArgs,
    /// The writer's own namespace (set from the downward API); never a tenant.
    #[arg(long, env = "POD_NAMESPACE", hide = true)]
    pub pod_namespace: Option<String>,
    /// The ClusterRole Argo CD acts with in a tenant's own namespace (bound there
    /// only). It must exist; without it the writer binds nothing and is not ready.
    #[arg(long, env = "GITOPS_WRITER_HOME_CLUSTER_ROLE", default_value = controller::DEFAULT_HOME_CLUSTER_ROLE)]
    pub home_cluster_role: String,
    /// The namespace, owned by the service, of the tenants' home ServiceAccounts.
    #[arg(long, env = "GITOPS_WRITER_HOME_NAMESPACE", default_value = controller::DEFAULT_HOME_NAMESPACE)]
    pub home_namespace: String,
    /// Accept deployments into tenants' own namespaces (and sync runs of them) that the
    /// admission webhook did not approve, i.e. without checking that the requester
    /// could grant the home role there.
    /// Only for clusters where everyone who may create GitOpsDeployments is trusted.
    #[arg(long, env = "GITOPS_WRITER_ALLOW_UNVERIFIED_HOME_DEPLOYMENTS")]
    pub allow_unverified_home_deployments: bool,
    /// The AppStudio layer's username, e.g.
    /// `system:serviceaccount:gitops-service:gitops-appstudio`. A home deployment
    /// it creates or changes is approved when its controlling owner is a
    /// SnapshotEnvironmentBinding of the namespace: the layer's webhook checked
    /// whoever made that binding (and its Environment) go home. Set it only with the
    /// layer's webhook installed.
    #[arg(long, env = "GITOPS_WRITER_APPSTUDIO_IDENTITY")]
    pub appstudio_identity: Option<String>,
}

/// The automatic scale-up (off unless --scale-up-below is set): the writers
/// provision the next engine instance when the open instances' free slots fall
/// below the threshold, one at a time in the whole fleet.
#[derive(Debug, Clone, Args)]
pub struct ScaleUpArgs {
    /// Provision an instance when the open instances' free tenant slots fall below
    /// this many. Off when unset. Needs the Argo CD Operator and the writer's
    /// rights of ops/deploy/components/scale-up.
    #[arg(long, env = "GITOPS_WRITER_SCALE_UP_BELOW", value_parser = clap::value_parser!(i64).range(1..))]
    pub scale_up_below: Option<i64>,
    /// New instances are named (and their namespaces) `<prefix>-<n>`.
    #[arg(long, env = "GITOPS_WRITER_SCALE_UP_PREFIX", default_value = "argocd-auto")]
    pub scale_up_prefix: String,
    /// Tenants a new instance takes.
    #[arg(long, env = "GITOPS_WRITER_SCALE_UP_CAPACITY", default_value_t = 1000,
          value_parser = clap::value_parser!(i32).range(1..))]
    pub scale_up_capacity: i32,
    /// The Argo CD version of new instances (default: the operator's).
    #[arg(long, env = "GITOPS_WRITER_SCALE_UP_VERSION")]
    pub scale_up_version: Option<String>,
    /// The host cluster new instances are registered with: agents started with
    /// `--host-cluster` of that name serve them.
    #[arg(long, env = "GITOPS_WRITER_SCALE_UP_HOST_CLUSTER")]
    pub scale_up_host_cluster: Option<String>,
    /// The agents' ServiceAccounts (NAMESPACE/NAME; comma-separated) bound to the
    /// agents' Role in a new instance's namespace.
    #[arg(
        long,
        env = "GITOPS_WRITER_SCALE_UP_AGENT_SERVICE_ACCOUNTS",
        value_delimiter = ',',
        default_value = "argocd/gitops-agent"
    )]
    pub scale_up_agent_service_account: Vec<String>,
    /// How long to wait for the operator to report a new instance Available.
    #[arg(long, env = "GITOPS_WRITER_SCALE_UP_WAIT", value_parser = parse_duration, default_value = "10m")]
    pub scale_up_wait: Duration,
}

impl ScaleUpArgs {
    /// The settings, or None when the scale-up is off.
    pub fn settings(self) -> Option<crate::scale_up::ScaleUpSettings> {
        let ScaleUpArgs {
            scale_up_below,
            scale_up_prefix,
            scale_up_capacity,
            scale_up_version,
            scale_up_host_cluster,
            scale_up_agent_service_account,
            scale_up_wait,
        } = self;
        Some(crate::scale_up::ScaleUpSettings {
            below_free: scale_up_below?,
            name_prefix: scale_up_prefix,
            capacity: scale_up_capacity,
            version: scale_up_version,
            host_cluster: scale_up_host_cluster,
            agents: scale_up_agent_service_account,
            wait: scale_up_wait,
            lease: crate::scale_up::DEFAULT_LEASE,
        })
    }
}

/// The validating admission webhook (served when a certificate is given).
#[derive(Debug, Clone, Args)]
pub struct WebhookArgs {
    /// PEM certificate (chain) of the webhook's HTTPS server; read again when it changes.
    #[arg(long, env = "GITOPS_WRITER_WEBHOOK_CERT_FILE", requires = "webhook_key_file")]
    pub webhook_cert_file: Option<std::path::PathBuf>,
    /// PEM private key of the webhook's HTTPS server.
    #[arg(long, env = "GITOPS_WRITER_WEBHOOK_KEY_FILE", requires = "webhook_cert_file")]
    pub webhook_key_file: Option<std::path::PathBuf>,
    /// Address the webhook listens on.
    #[arg(long, env = "GITOPS_WRITER_WEBHOOK_ADDRESS", default_value = "0.0.0.0:9443")]
    pub webhook_address: std::net::SocketAddr,
}

#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// PostgreSQL URL or key/value connection string.
    #[arg(long, env = config::DATABASE_URL, hide_env_values = true)]
    pub database_url: DatabaseUrl,
}

/// Environment variables older versions read, still honoured with a warning: (old,
/// new).
pub const DEPRECATED_ENV: &[(&str, &str)] = &[
    ("GITOPS_LISTEN_DATABASE_URL", config::LISTEN_DATABASE_URL),
    ("GITOPS_WRITER_HOME_TOKEN_SECONDS", "GITOPS_WRITER_HOME_TOKEN_LIFETIME"),
    ("GITOPS_WRITER_PURGE_AFTER_SECONDS", "GITOPS_WRITER_PURGE_AFTER"),
];

/// The shortest home token lifetime (TokenRequest's own minimum).
pub const MIN_HOME_TOKEN_LIFETIME: Duration = Duration::from_secs(600);
const DEFAULT_HOME_TOKEN_LIFETIME: Duration = Duration::from_secs(3600);
const DEFAULT_PURGE_AFTER: Duration = Duration::from_secs(600);

/// Every environment variable `gitops-writer run` reads: its flags' (from the
/// command-line definition), the encryption keys' and the deprecated spellings.
/// Deployment manifests are checked against this list.
pub fn run_env_vars() -> Vec<String> {
    use clap::CommandFactory;
    let mut names = vec![config::ENCRYPTION_KEYS.to_owned(), config::ENCRYPTION_ACTIVE_KEY.to_owned()];
    names.extend(DEPRECATED_ENV.iter().map(|(old, _)| (*old).to_owned()));
    let cli = Cli::command();
    // The global flags (`--log-format`) and those of `run`.
    let run = cli.find_subcommand("run").into_iter().flat_map(|run| run.get_arguments());
    names.extend(
        cli.get_arguments().chain(run).filter_map(|arg| arg.get_env()).map(|env| env.to_string_lossy().into_owned()),
    );
    names
}

/// A setting given by its flag or current variable, else by a deprecated variable
/// (warned about), else the default.
fn current_or_deprecated<T>(
    given: Option<T>,
    old: &str,
    parse: impl Fn(&str) -> Result<T, String>,
    default: T,
) -> Result<T, WriterError> {
    if let Some(value) = given {
        return Ok(value);
    }
    let Some(new) = DEPRECATED_ENV.iter().find(|(o, _)| *o == old).map(|(_, new)| *new) else { return Ok(default) };
    match config::deprecated_env(old, new) {
        Some((text, warning)) => {
            tracing::warn!("{warning}");
            parse(&text).map_err(|message| WriterError::Setting { name: old.to_owned(), message })
        }
        None => Ok(default),
    }
}

/// A rebalance threshold: a load difference between 0 and 1.
fn parse_threshold(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(value) if value > 0.0 && value <= 1.0 => Ok(value),
        _ => Err(format!("{text:?} is not a load difference between 0 and 1 (e.g. 0.2)")),
    }
}

/// Why the writer stopped. Messages name the step; sources carry the detail.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    #[error("refusing to start without usable encryption keys")]
    Keys { source: CryptoError },
    #[error("could not connect to {database}")]
    Connect { database: String, source: DbError },
    #[error("could not migrate the database")]
    Migrate { source: DbError },
    #[error("refusing to start against this database")]
    Schema { source: DbError },
    #[error("could not listen on {address}")]
    Bind { address: std::net::SocketAddr, source: std::io::Error },
    #[error("could not read the kubeconfig {path}")]
    Kubeconfig { path: std::path::PathBuf, source: kube::config::KubeconfigError },
    #[error("could not find a Kubernetes configuration")]
    InferKube { source: kube::config::InferConfigError },
    #[error("could not build a Kubernetes client")]
    KubeClient { source: kube::Error },
    #[error("could not read the home CA file {path}")]
    HomeCa { path: std::path::PathBuf, source: std::io::Error },
    #[error("could not set up the admission webhook")]
    Webhook { source: webhook::WebhookError },
    #[error("invalid setting {name}: {message}")]
    Setting { name: String, message: String },
}

/// Runs one command; returns what to print on stdout.
pub async fn execute(command: Command) -> Result<String, WriterError> {
    match command {
        Command::Migrate(args) => Ok(render_migration(&migrate(args.database_url.expose()).await?)),
        Command::Run(args) => run(*args).await.map(|()| String::new()),
    }
}

/// Applies every embedded migration not yet applied, on a dedicated connection.
pub async fn migrate(database_url: &str) -> Result<MigrationReport, WriterError> {
    let mut client = connect(database_url).await?;
    db::migrate(&mut client).await.map_err(|source| WriterError::Migrate { source })
}

/// One line per applied migration, then the resulting version.
pub fn render_migration(report: &MigrationReport) -> String {
    let mut out: String = report.applied.iter().map(|name| format!("applied {name}\n")).collect();
    if report.applied.is_empty() {
        out.push_str("no migrations to apply\n");
    }
    out.push_str(&format!("schema version {}\n", report.version));
    out
}

/// Checks the keys, then runs the writer until SIGTERM or Ctrl-C. The configuration
/// is built by taking the arguments apart, so a flag that is not used does not compile.
pub async fn run(args: RunArgs) -> Result<(), WriterError> {
    let RunArgs {
        db: DbArgs { database_url },
        listen_database_url,
        kubeconfig,
        workers,
        namespaces,
        writer_id,
        metrics_address,
        max_deployments,
        home_api_url,
        home_ca_file,
        home_token_lifetime,
        purge_after,
        resync_interval,
        resync_max_tombstones,
        failover_grace,
        failover_batch,
        rebalance_threshold,
        max_concurrent_moves,
        connection_check,
        connection_check_allow,
        connection_check_deny,
        repository_check,
        repository_known_hosts,
        repository_ca_file,
        api_url_allow_private,
        tenancy,
        webhook,
        scale_up,
    } = args;
    let secrets = SecretBox::from_env().map_err(|source| WriterError::Keys { source })?;
    tracing::info!(active_key = secrets.active_key_id(), "encryption keys loaded");
    let writer_id = writer_id.unwrap_or_else(run::default_writer_id);
    let mut config = run::WriterConfig::new(database_url.expose().to_owned(), secrets, writer_id);
    config.listen_database_url = current_or_deprecated(
        listen_database_url.map(Some),
        "GITOPS_LISTEN_DATABASE_URL",
        |text| Ok(Some(DatabaseUrl::new(text))),
        None,
    )?
    .map(|url| url.expose().to_owned());
    config.kubeconfig = kubeconfig;
    config.namespaces = namespaces;
    config.controllers.workers = workers;
    config.metrics_address = metrics_address;
    config.controllers.max_deployments = max_deployments;
    config.controllers.resync_interval = resync_interval;
    config.controllers.resync_max_tombstones = resync_max_tombstones;
    config.failover = Some(crate::fleet::FailoverSettings { grace: failover_grace, batch: failover_batch });
    config.balance = Some(gitops_shared::db::fleet_balance::BalanceSettings {
        degraded_grace: Some(failover_grace),
        rebalance_threshold,
        max_concurrent_moves: usize::try_from(max_concurrent_moves).unwrap_or(5),
    });
    config.scale_up = scale_up.settings();
    config.home.api_url = home_api_url;
    let lifetime = current_or_deprecated(
        home_token_lifetime,
        "GITOPS_WRITER_HOME_TOKEN_SECONDS",
        parse_duration,
        DEFAULT_HOME_TOKEN_LIFETIME,
    )?;
    if lifetime < MIN_HOME_TOKEN_LIFETIME {
        return Err(WriterError::Setting {
            name: "--home-token-lifetime".to_owned(),
            message: format!("{lifetime:?} is shorter than the 10 minutes TokenRequest allows"),
        });
    }
    config.home.token_lifetime = lifetime;
    config.home.renew_before = lifetime / 3;
    if let Some(path) = home_ca_file {
        use base64::Engine as _;
        let pem = std::fs::read(&path).map_err(|source| WriterError::HomeCa { path: path.clone(), source })?;
        config.home.ca_data = Some(base64::engine::general_purpose::STANDARD.encode(pem));
    }
    config.purge.after =
        current_or_deprecated(purge_after, "GITOPS_WRITER_PURGE_AFTER_SECONDS", parse_duration, DEFAULT_PURGE_AFTER)?;
    let egress = controller::connection::ConnectionPolicy::new(connection_check_allow, connection_check_deny);
    config.repository_check = repository_check.then(|| controller::repository_check::RepositoryCheckSettings {
        known_hosts: repository_known_hosts,
        ca_file: repository_ca_file,
        ..controller::repository_check::RepositoryCheckSettings::new(egress.clone())
    });
    config.connection_check = connection_check.then_some(egress);
    config.api_url_allow_private = api_url_allow_private;
    let TenancyArgs {
        namespaces:
            NamespaceSelectionArgs { tenant_namespace_selector, tenant_namespaces, reserved_namespaces, service_namespaces },
        pod_namespace,
        home_cluster_role,
        home_namespace,
        allow_unverified_home_deployments,
        appstudio_identity,
    } = tenancy;
    let mut service: std::collections::BTreeSet<String> = service_namespaces.into_iter().collect();
    service.extend(pod_namespace.filter(|ns| !ns.is_empty()));
    service.insert(home_namespace.clone());
    config.tenancy = tenancy::TenancySettings {
        selector: tenant_namespace_selector,
        patterns: tenant_namespaces,
        service_namespaces: service,
        reserved: reserved_namespaces,
    };
    config.home.cluster_role = home_cluster_role;
    config.home.namespace = home_namespace;
    config.allow_unverified_home = allow_unverified_home_deployments;
    config.appstudio_identity = appstudio_identity.filter(|name| !name.is_empty());
    let WebhookArgs { webhook_cert_file, webhook_key_file, webhook_address } = webhook;
    config.webhook = webhook_cert_file.zip(webhook_key_file).map(|(cert_file, key_file)| webhook::WebhookSettings {
        address: webhook_address,
        cert_file,
        key_file,
    });
    let cancel = tokio_util::sync::CancellationToken::new();
    tokio::spawn(gitops_shared::serve::cancel_on_signal(cancel.clone()));
    run::run_writer(config, cancel).await
}

pub(crate) async fn connect(url: &str) -> Result<Client, WriterError> {
    let database = redact_database_url(url);
    tracing::debug!(%database, "connecting");
    db::connect(url, APPLICATION_NAME).await.map_err(|source| WriterError::Connect { database, source })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn run_args(extra: &[&str]) -> RunArgs {
        let mut argv = vec!["gitops-writer", "run", "--database-url", "postgres://u:pw@127.0.0.1/db"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).expect("parses").command {
            Command::Run(args) => *args,
            Command::Migrate(_) => panic!("not run"),
        }
    }

    #[test]
    fn durations_take_units_and_the_old_flag_still_works() {
        let args = run_args(&["--home-token-seconds", "900", "--purge-after", "1m30s"]);
        assert_eq!(args.home_token_lifetime, Some(Duration::from_secs(900)), "a bare number is seconds");
        assert_eq!(args.purge_after, Some(Duration::from_secs(90)));
        assert_eq!(run_args(&["--home-token-lifetime", "2h"]).home_token_lifetime, Some(Duration::from_secs(7200)));
        assert!(Cli::try_parse_from(["gitops-writer", "run", "--database-url", "x", "--purge-after", "soon"]).is_err());
    }

    #[test]
    fn repository_validation_is_off_unless_asked_for() {
        let off = run_args(&[]);
        assert!(!off.repository_check && off.repository_known_hosts.is_none() && off.repository_ca_file.is_none());
        let on = run_args(&[
            "--repository-check",
            "--repository-known-hosts",
            "/etc/gitops/known_hosts",
            "--repository-ca-file",
            "/etc/gitops/ca.pem",
            "--egress-allow",
            "git.example.com",
        ]);
        assert!(on.repository_check);
        assert_eq!(on.repository_known_hosts.as_deref(), Some(std::path::Path::new("/etc/gitops/known_hosts")));
        assert_eq!(on.repository_ca_file.as_deref(), Some(std::path::Path::new("/etc/gitops/ca.pem")));
        assert_eq!(on.connection_check_allow.len(), 1);
    }

    #[test]
    fn the_arguments_never_show_the_password() {
        let args = run_args(&["--listen-database-url", "postgres://u:listenpw@127.0.0.1/db"]);
        let shown = format!("{args:?}");
        assert!(!shown.contains("pw@") && !shown.contains("listenpw"), "{shown}");
    }

    #[test]
    fn the_variables_read_include_the_shared_and_deprecated_names() {
        let names = run_env_vars();
        for name in [config::DATABASE_URL, config::LISTEN_DATABASE_URL, "GITOPS_LISTEN_DATABASE_URL", "POD_NAMESPACE"] {
            assert!(names.iter().any(|n| n == name), "{name} missing from {names:?}");
        }
    }
}
