//! The agent: serves engine (Argo CD) instances — one process serves those named,
//! or every instance of a host cluster — claims their operations and reconciles
//! Argo CD to the current rows, reports Application status back, sweeps for drift
//! and serves one metrics endpoint. A library so tests drive the code the binary
//! runs (`run::run_agent`).

pub mod destination;
pub mod engine;
pub mod fence;
pub mod heartbeat;
pub mod http;
pub mod metrics;
pub mod names;
pub mod reconcile;
pub mod registry;
pub mod run;
pub mod serve;
pub mod status;
pub mod sweep;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args, CommandFactory, Parser, Subcommand};
use gitops_shared::config::{self, DatabaseUrl, redact_database_url};
use gitops_shared::crypto::{CryptoError, SecretBox};
use gitops_shared::db::engine_instance::{EngineInstance, engine_instance_by_name};
use gitops_shared::db::{self, DbError};
use gitops_shared::tenancy::NamePattern;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

pub use run::{AgentConfig, AgentHandle, Served, run_agent};

pub(crate) const APPLICATION_NAME: &str = "gitops-agent";

/// The host cluster whose instances `gitops-agent run --host-cluster` serves.
pub const HOST_CLUSTER: &str = "GITOPS_AGENT_HOST_CLUSTER";

pub use gitops_shared::config::ENGINE_INSTANCE;

/// The namespace the agent's pod runs in (from the downward API): one of the
/// service's namespaces, never a destination on the home cluster.
pub const POD_NAMESPACE: &str = "POD_NAMESPACE";

#[derive(Debug, Parser)]
#[command(name = "gitops-agent", version, about = "The GitOps service's agent for Argo CD instances")]
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
    /// Serve engine instances registered with `gitopsctl instance add` or `provision`.
    Run(RunArgs),
}

#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("served").required(true).args(["instance", "host_cluster"])))]
pub struct RunArgs {
    /// PostgreSQL URL or key/value connection string.
    #[arg(long, env = config::DATABASE_URL, hide_env_values = true)]
    pub database_url: DatabaseUrl,
    /// A direct PostgreSQL connection for LISTEN, when DATABASE_URL goes through a
    /// transaction-mode pooler (default: DATABASE_URL).
    #[arg(long, env = config::LISTEN_DATABASE_URL, hide_env_values = true)]
    pub listen_database_url: Option<DatabaseUrl>,
    /// Names of the engine instances to serve (repeat or separate with commas); each
    /// must be registered when the agent starts.
    #[arg(long, env = ENGINE_INSTANCE, value_delimiter = ',')]
    pub instance: Vec<String>,
    /// Serve every engine instance registered with this host cluster
    /// (`gitopsctl instance add --host-cluster`, `instance provision
    /// --host-cluster`), including those registered later; instead of --instance.
    #[arg(long, env = HOST_CLUSTER, conflicts_with = "instance")]
    pub host_cluster: Option<String>,
    /// How often the served instances are looked up again: new instances of the
    /// host cluster are picked up, deregistered ones dropped, failed ones retried.
    #[arg(long, env = "GITOPS_AGENT_INSTANCES_REFRESH", default_value = "30s", value_parser = parse_duration)]
    pub instances_refresh: Duration,
    /// How long the process holding an instance's duties (its sweep, heartbeat and
    /// health probe) keeps them without renewing; renewed every heartbeat interval
    /// while its Argo CD answers, then another process serving the instance takes
    /// them. Keep it at least two heartbeat intervals long, and below
    /// `gitops.instance_lost_after` minus one interval (a killed holder's instance
    /// gets no heartbeat until its lease ends).
    #[arg(long, env = "GITOPS_AGENT_DUTY_LEASE", default_value = "30s", value_parser = parse_duration)]
    pub duty_lease: Duration,
    /// Kubeconfig of the cluster where the Argo CD instance runs (default: as kube
    /// infers it: KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "GITOPS_AGENT_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Address of /metrics, /healthz and /readyz: one for the process, every
    /// instance's series labelled `instance`.
    #[arg(long, env = "GITOPS_AGENT_METRICS_ADDRESS", default_value = "127.0.0.1:9464")]
    pub metrics_address: SocketAddr,
    /// Time between sweeps (one also runs at start), e.g. 300s, 5m.
    #[arg(long, env = "GITOPS_AGENT_SWEEP_INTERVAL", default_value = "300s", value_parser = parse_duration)]
    pub sweep_interval: Duration,
    /// Orphaned objects one sweep may queue for deletion; above it the sweep deletes none.
    #[arg(long, env = "GITOPS_AGENT_SWEEP_MAX_DELETIONS", default_value_t = 50)]
    pub sweep_max_deletions: usize,
    /// Objects a sweep lists (and holds) at a time: its memory is a page, not the instance.
    #[arg(long, env = "GITOPS_AGENT_SWEEP_PAGE_SIZE", default_value_t = crate::sweep::PAGE_SIZE)]
    pub sweep_page_size: u32,
    /// Sweeps only report what they would enqueue.
    #[arg(long, env = "GITOPS_AGENT_SWEEP_DRY_RUN")]
    pub sweep_dry_run: bool,
    /// Lease on a claimed operation (renewed while work goes on), e.g. 60s.
    #[arg(long, env = "GITOPS_AGENT_LEASE", default_value = "60s", value_parser = parse_duration)]
    pub lease: Duration,
    /// How often the agent probes its Argo CD instance and heartbeats (an instance
    /// is lost after `gitops.instance_lost_after` without one, default 60 s).
    #[arg(long, env = "GITOPS_AGENT_HEARTBEAT_INTERVAL", default_value = "15s", value_parser = parse_duration)]
    pub heartbeat_interval: Duration,
    /// How long the agent may go without writing a heartbeat before it stops writing
    /// to Argo CD (until the next one): keep it below `gitops.instance_lost_after`
    /// plus the writers' --failover-grace, so a cut-off agent stops before its
    /// tenants move.
    #[arg(long, env = "GITOPS_AGENT_SELF_FENCE_AFTER", default_value = "90s", value_parser = parse_duration)]
    pub self_fence_after: Duration,
    /// Operations reconciled at once.
    #[arg(long, env = "GITOPS_AGENT_CONCURRENCY", default_value_t = 16)]
    pub concurrency: usize,
    /// How long completed and superseded operations are kept (for `gitopsctl queue`
    /// history and the inspection queries) before they are pruned, e.g. 24h or 5m.
    #[arg(long, env = "GITOPS_AGENT_COMPLETED_RETENTION", default_value = "24h", value_parser = parse_duration)]
    pub completed_retention: Duration,
    /// How long failed operations (dead letters) are kept before they are pruned,
    /// e.g. 7d.
    #[arg(long, env = "GITOPS_AGENT_FAILED_RETENTION", default_value = "7d", value_parser = parse_duration)]
    pub failed_retention: Duration,
    /// How long Argo CD may take to delete an Application (its resources finalizer)
    /// before the tenant's resource says the deletion is stuck (`DeletionStuck`).
    #[arg(long, env = "GITOPS_AGENT_STUCK_DELETION_AFTER", default_value = "10m", value_parser = parse_duration)]
    pub stuck_deletion_after: Duration,
    /// Further API URLs of the home cluster (the tenants' own cluster, and the one
    /// Argo CD runs in): repeat or separate with commas. The in-cluster names
    /// (https://kubernetes.default.svc[.cluster.local], https://kubernetes.default)
    /// are always home. No destination there may be a reserved namespace.
    #[arg(long = "home-api-url", env = "GITOPS_HOME_API_URLS", value_delimiter = ',', value_parser = destination::parse_home_api_url)]
    pub home_api_urls: Vec<String>,
    /// Namespaces the service's own components run in (plus POD_NAMESPACE, when set):
    /// never destinations on the home cluster.
    #[arg(long, env = "GITOPS_SERVICE_NAMESPACES", value_delimiter = ',')]
    pub service_namespaces: Vec<String>,
    /// Further namespace patterns (`infra-*`) that are never destinations on the home
    /// cluster, besides kube-*, default, the service's and every engine instance's.
    #[arg(long, env = "GITOPS_RESERVED_NAMESPACES", value_delimiter = ',')]
    pub reserved_namespaces: Vec<NamePattern>,
}

/// Durations as every binary takes them (`30s`, `5m`, `1m30s`; a bare number is seconds).
pub use gitops_shared::config::parse_duration;

/// Why the agent stopped. Messages name the step; sources carry the detail.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("could not connect to {database}")]
    Connect { database: String, source: DbError },
    #[error("refusing to start against this database")]
    Schema { source: DbError },
    #[error("engine instance {name:?} is not registered; register it with `gitopsctl instance add` first")]
    UnknownInstance { name: String },
    #[error("nothing to serve: name instances with --instance or a host cluster with --host-cluster")]
    NothingToServe,
    #[error("invalid --host-cluster")]
    HostCluster { source: DbError },
    #[error("could not look up engine instance {name:?}")]
    LookUpInstance { name: String, source: DbError },
    #[error("refusing to start without encryption keys")]
    Keys { source: CryptoError },
    #[error("could not build the connection pool")]
    Pool { source: DbError },
    #[error("could not heartbeat the engine instance")]
    Heartbeat { source: DbError },
    #[error("could not start the LISTEN connection")]
    Listen { source: DbError },
    #[error("could not listen on {address}")]
    Bind { address: SocketAddr, source: std::io::Error },
    #[error("could not read kubeconfig {path}")]
    Kubeconfig { path: PathBuf, source: kube::config::KubeconfigError },
    #[error("could not find a Kubernetes configuration")]
    InferKube { source: kube::config::InferConfigError },
    #[error("could not build a Kubernetes client")]
    KubeClient { source: kube::Error },
    #[error("invalid destination settings: {message}")]
    Destinations { message: String },
}

/// Every environment variable `gitops-agent run` reads: its flags' and the
/// encryption keys' (read by `SecretBox::from_env`). Deployment manifests are
/// checked against this list.
pub fn run_env_vars() -> Vec<String> {
    let mut names =
        vec![config::ENCRYPTION_KEYS.to_owned(), config::ENCRYPTION_ACTIVE_KEY.to_owned(), POD_NAMESPACE.to_owned()];
    let cli = Cli::command();
    // The global flags (`--log-format`) and those of `run`.
    let run = cli.find_subcommand("run").into_iter().flat_map(|run| run.get_arguments());
    names.extend(
        cli.get_arguments().chain(run).filter_map(|arg| arg.get_env()).map(|env| env.to_string_lossy().into_owned()),
    );
    names
}

/// Runs one command.
pub async fn execute(command: Command) -> Result<(), AgentError> {
    match command {
        Command::Run(args) => run(&args).await,
    }
}

/// Builds the configuration from `args` and the environment's keys, then runs
/// until SIGTERM or SIGINT.
pub async fn run(args: &RunArgs) -> Result<(), AgentError> {
    let RunArgs {
        database_url,
        listen_database_url,
        instance,
        host_cluster,
        instances_refresh,
        duty_lease,
        kubeconfig,
        metrics_address,
        sweep_interval,
        sweep_max_deletions,
        sweep_page_size,
        sweep_dry_run,
        lease,
        heartbeat_interval,
        self_fence_after,
        concurrency,
        completed_retention,
        failed_retention,
        stuck_deletion_after,
        home_api_urls: _,
        service_namespaces: _,
        reserved_namespaces: _,
    } = args;
    let secrets = SecretBox::from_env().map_err(|source| AgentError::Keys { source })?;
    let mut config = AgentConfig::new(database_url.clone(), String::new(), secrets);
    config.serve = match host_cluster {
        Some(host) => Served::HostCluster(host.trim().to_owned()),
        None => Served::Instances(
            instance.iter().map(|name| name.trim().to_owned()).filter(|name| !name.is_empty()).collect(),
        ),
    };
    config.instances_refresh = *instances_refresh;
    config.duty_lease = *duty_lease;
    config.listen_database_url = listen_database_url.clone();
    config.kubeconfig = kubeconfig.clone();
    config.metrics_address = *metrics_address;
    config.sweep.interval = *sweep_interval;
    config.sweep.max_deletions = *sweep_max_deletions;
    config.sweep.dry_run = *sweep_dry_run;
    config.sweep.page_size = (*sweep_page_size).max(1);
    config.lease = *lease;
    config.heartbeat_interval = *heartbeat_interval;
    config.self_fence_after = *self_fence_after;
    config.concurrency = *concurrency;
    config.completed_retention = *completed_retention;
    config.failed_retention = *failed_retention;
    config.stuck_deletion_after = *stuck_deletion_after;
    // The three destination settings are read by `destinations`.
    config.destinations = destinations(args, std::env::var(POD_NAMESPACE).ok());
    let cancel = CancellationToken::new();
    tokio::spawn(gitops_shared::serve::cancel_on_signal(cancel.clone()));
    run_agent(config, cancel).await
}

/// The destination settings of `args`; `pod_namespace` (the agent's own) joins the
/// service's namespaces.
pub fn destinations(args: &RunArgs, pod_namespace: Option<String>) -> destination::DestinationConfig {
    let mut service_namespaces: BTreeSet<String> =
        args.service_namespaces.iter().map(|ns| ns.trim().to_owned()).filter(|ns| !ns.is_empty()).collect();
    service_namespaces.extend(pod_namespace.map(|ns| ns.trim().to_owned()).filter(|ns| !ns.is_empty()));
    destination::DestinationConfig {
        home_api_urls: args.home_api_urls.clone(),
        service_namespaces,
        reserved_namespaces: args.reserved_namespaces.clone(),
    }
}

/// The registered instance called `name`; an unknown name is refused.
pub async fn instance(client: &Client, name: &str) -> Result<EngineInstance, AgentError> {
    match engine_instance_by_name(client, name).await {
        Ok(instance) => Ok(instance),
        Err(DbError::NotFound { .. }) => Err(AgentError::UnknownInstance { name: name.to_owned() }),
        Err(source) => Err(AgentError::LookUpInstance { name: name.to_owned(), source }),
    }
}

async fn connect(url: &str) -> Result<Client, AgentError> {
    let database = redact_database_url(url);
    tracing::debug!(%database, "connecting");
    db::connect(url, APPLICATION_NAME).await.map_err(|source| AgentError::Connect { database, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("300s"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("5 days").is_err());
    }

    #[test]
    fn run_reads_its_flags_and_keys_from_the_environment() {
        let names = run_env_vars();
        for name in [
            config::DATABASE_URL,
            ENGINE_INSTANCE,
            "GITOPS_AGENT_METRICS_ADDRESS",
            config::ENCRYPTION_KEYS,
            "GITOPS_HOME_API_URLS",
            "GITOPS_SERVICE_NAMESPACES",
            "GITOPS_RESERVED_NAMESPACES",
            POD_NAMESPACE,
        ] {
            assert!(names.iter().any(|n| n == name), "{name} missing from {names:?}");
        }
    }

    #[test]
    fn destination_flags_take_lists_and_the_pod_namespace() {
        let cli = Cli::try_parse_from([
            "gitops-agent",
            "run",
            "--database-url",
            "postgres://localhost/x",
            "--instance",
            "argocd-1",
            "--home-api-url",
            "https://api.home.example.invalid:6443,https://10.0.0.1",
            "--home-api-url",
            "https://home.example.invalid",
            "--service-namespaces",
            "gitops, gitops-writer",
            "--reserved-namespaces",
            "infra-*,vault",
        ])
        .expect("valid flags");
        let Command::Run(args) = cli.command;
        let config = destinations(&args, Some("gitops-agents".into()));
        assert_eq!(config.home_api_urls.len(), 3);
        assert_eq!(
            config.service_namespaces.iter().map(String::as_str).collect::<Vec<_>>(),
            ["gitops", "gitops-agents", "gitops-writer"]
        );
        assert_eq!(
            config.reserved_namespaces.iter().map(NamePattern::as_str).collect::<Vec<_>>(),
            ["infra-*", "vault"]
        );
        assert!(run_with(&["--home-api-url", "home"]).is_err(), "a home URL that cannot be read is refused at start");
        assert!(run_with(&["--reserved-namespaces", "Infra"]).is_err());
    }

    /// `gitops-agent run` with a database and an instance, and `extra` flags.
    fn run_with(extra: &[&str]) -> Result<Cli, clap::Error> {
        let mut argv = vec!["gitops-agent", "run", "--database-url", "postgres://localhost/x", "--instance", "i"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv)
    }

    #[test]
    fn retention_of_finished_operations_is_a_setting() {
        let parse = |extra: &[&str]| {
            let Command::Run(args) = run_with(extra).expect("valid flags").command;
            (args.completed_retention, args.failed_retention)
        };
        let day = Duration::from_secs(24 * 3600);
        assert_eq!(parse(&[]), (day, 7 * day), "a day of history, a week of dead letters by default");
        assert_eq!(
            parse(&["--completed-retention", "5m", "--failed-retention", "2d"]),
            (Duration::from_secs(300), 2 * day)
        );
        assert!(
            run_with(&["--completed-retention", "soon"]).is_err(),
            "a retention that cannot be read is refused at start"
        );
    }

    #[test]
    fn an_agent_serves_named_instances_or_a_host_cluster() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["gitops-agent", "run", "--database-url", "postgres://localhost/x"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv).map(|cli| {
                let Command::Run(args) = cli.command;
                (args.instance, args.host_cluster)
            })
        };
        assert_eq!(parse(&["--instance", "a,b"]).expect("two names"), (vec!["a".into(), "b".into()], None));
        assert_eq!(parse(&["--host-cluster", "east"]).expect("a host cluster"), (vec![], Some("east".into())));
        assert!(parse(&[]).is_err(), "one of the two is required");
        assert!(parse(&["--instance", "a", "--host-cluster", "east"]).is_err(), "not both");
    }
}
