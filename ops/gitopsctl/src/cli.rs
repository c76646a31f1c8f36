//! The command line of `gitopsctl`, as clap types and nothing else, so that the
//! binary, its `--help` and the library agree on one definition. Every flag can
//! also be set from the environment variable named in its help.

use clap::{Args, Parser, Subcommand};
use gitops_shared::config;

/// The number of failed operations `queue failed` lists unless told otherwise.
const FAILED_LIMIT_DEFAULT: i64 = 100;

#[derive(Debug, Parser)]
#[command(
    name = "gitopsctl",
    version,
    about = "Operate the GitOps service: schema, engine instances, queue, tenants, secrets"
)]
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
    /// Register, list and remove engine (Argo CD) instances.
    Instance(InstanceArgs),
    /// Show the operation queue; list or retry failed operations.
    Queue(QueueArgs),
    /// What the service does for tenants, for review.
    Tenant(TenantArgs),
    /// Canary rollouts of a new Argo CD version onto an instance.
    Rollout(RolloutArgs),
    /// Rotate the encryption of stored secrets.
    Secrets(SecretsArgs),
    /// Write the tenant CustomResourceDefinitions, generated from the writer's
    /// Rust types, as YAML files (one per CRD), and the AppStudio layer's into
    /// `appstudio/` (its development fixtures into `appstudio-fixtures/`) beside them;
    /// `crds check` lists stored objects that stricter CRDs would strand.
    Crds(CrdsArgs),
}

#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CrdsArgs {
    /// Directory to write into (created if missing); existing files are replaced.
    #[arg(long, env = "GITOPS_CRDS_DIR", default_value = "ops/crds")]
    pub out: std::path::PathBuf,
    #[command(subcommand)]
    pub command: Option<CrdsCommand>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum CrdsCommand {
    /// List the stored tenant resources (all namespaces) that the writer's rules
    /// refuse — every one a stricter schema could refuse. Run before applying new
    /// CRDs: Kubernetes 1.20 refuses any update of such an object once the stricter
    /// schema is served, even removing its finalizer. Exits with 1 when any is found.
    Check {
        /// The cluster with the tenant resources (default: as kube infers it).
        #[arg(long, env = "GITOPS_KUBECONFIG")]
        kubeconfig: Option<std::path::PathBuf>,
        /// Apply the writer's `--api-url-allow-private` (environments at loopback,
        /// link-local or metadata addresses are then not listed).
        #[arg(long, env = "GITOPS_WRITER_API_URL_ALLOW_PRIVATE")]
        api_url_allow_private: bool,
    },
}

/// Where the database is. Optional for clap (so it may be given before or after a
/// subcommand); commands that need it say so when it is missing.
#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// PostgreSQL URL or key/value connection string.
    #[arg(long, global = true, env = config::DATABASE_URL, hide_env_values = true)]
    pub database_url: Option<config::DatabaseUrl>,
}

#[derive(Debug, Args)]
pub struct InstanceArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(subcommand)]
    pub command: InstanceCommand,
}

#[derive(Debug, Subcommand)]
pub enum InstanceCommand {
    /// Register an engine instance that agents will serve.
    Add {
        /// Instance name (a DNS label); agents are started with `--instance NAME`.
        name: String,
        /// Namespace Argo CD runs in on that instance's cluster (a DNS label).
        #[arg(long, env = "GITOPS_ARGOCD_NAMESPACE")]
        argocd_namespace: String,
        /// How many tenants may be placed on the instance.
        #[arg(long, env = "GITOPS_INSTANCE_CAPACITY", default_value_t = 1000,
              value_parser = clap::value_parser!(i32).range(1..))]
        capacity: i32,
        /// The cluster the instance's Argo CD runs on (a DNS label): agents started
        /// with `--host-cluster` of that name serve it.
        #[arg(long, env = "GITOPS_HOST_CLUSTER")]
        host_cluster: Option<String>,
    },
    /// List engine instances: namespace, capacity, tenants, the Argo CD version its
    /// agents read from it, health (healthy,
    /// degraded: Argo CD stuck, lost: no agent reaches it), whether new tenants may go
    /// there, age of the last heartbeat.
    List,
    /// Close an instance to new tenants (its tenants stay).
    Cordon {
        /// Instance name.
        name: String,
    },
    /// Open a cordoned instance to new tenants again.
    Uncordon {
        /// Instance name.
        name: String,
    },
    /// Cordon an instance and move every tenant off it, each to the open instance
    /// with the most room.
    Drain {
        /// Instance name.
        name: String,
    },
    /// Even out the load (tenants relative to capacity) of the open, healthy
    /// instances: move tenants from the fullest to the emptiest while their loads
    /// differ by more than the threshold, at most --max-moves at a time.
    Rebalance {
        /// Loads may differ by this much (a fraction of capacity, 0.1 = 10 points).
        #[arg(long, default_value_t = 0.1)]
        threshold: f64,
        /// Moves in progress at most (those already running count).
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
        max_moves: u32,
    },
    /// Create an Argo CD instance on the host cluster (KUBECONFIG): its namespace, a
    /// Role and RoleBinding for the agents there, and an `ArgoCD` resource of the
    /// Argo CD Operator; wait until the operator reports it Available, and register it.
    Provision {
        /// Instance name (a DNS label).
        name: String,
        /// Its namespace (default: the name).
        #[arg(long)]
        namespace: Option<String>,
        /// The Argo CD version (default: the operator's).
        #[arg(long)]
        version: Option<String>,
        /// How many tenants may be placed on it.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i32).range(1..))]
        capacity: i32,
        /// The agents' ServiceAccounts (NAMESPACE/NAME; repeat or comma-separate),
        /// bound to the agents' Role in the new namespace.
        #[arg(
            long,
            env = "GITOPS_AGENT_SERVICE_ACCOUNTS",
            value_delimiter = ',',
            default_value = "argocd/gitops-agent"
        )]
        agent_service_account: Vec<String>,
        /// How long to wait for the operator.
        #[arg(long, default_value = "5m", value_parser = config::parse_duration)]
        wait: std::time::Duration,
        /// The name of this host cluster (a DNS label), recorded on the instance:
        /// agents started with `--host-cluster` of that name serve it without a new
        /// Deployment.
        #[arg(long, env = "GITOPS_HOST_CLUSTER")]
        host_cluster: Option<String>,
    },
    /// Drain an instance made by `provision`, wait until its tenants moved, remove
    /// its registration and operation history, and delete its ArgoCD and namespace.
    Decommission {
        /// Instance name.
        name: String,
        /// How long to wait for its tenants to move.
        #[arg(long, default_value = "10m", value_parser = config::parse_duration)]
        wait: std::time::Duration,
    },
    /// Remove an engine instance that has no tenants and no operations left.
    Remove {
        /// Instance name.
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct TenantArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(subcommand)]
    pub command: TenantCommand,
}

#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// List every deployment into a tenant's own namespace (each acts there with the
    /// home ClusterRole): the ones stored before requesters were checked at
    /// admission deserve a review.
    HomeDeployments,
    /// List tenants: namespace, instance, a move in progress, deployments.
    List {
        /// Only the tenants on (or moving from) this instance.
        #[arg(long)]
        instance: Option<String>,
    },
    /// Show one tenant's placement and move.
    Show {
        /// The tenant's namespace.
        namespace: String,
    },
    /// Move a tenant to another instance: the current one releases its Argo CD
    /// objects without pruning what they deployed, then the target adopts them.
    Move {
        /// The tenant's namespace.
        namespace: String,
        /// The instance to move it to (not cordoned, with room).
        #[arg(long)]
        to: String,
    },
}

#[derive(Debug, Args)]
pub struct RolloutArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(subcommand)]
    pub command: RolloutCommand,
}

/// Which tenants a rollout starts with (exactly one).
#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false)]
pub struct CohortArgs {
    /// This many tenants, the oldest first.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub tenants: Option<u32>,
    /// This percentage of the tenants that may move (rounded up, at least one).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub percent: Option<u32>,
    /// Exactly these tenants (their namespaces, comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub namespaces: Option<Vec<String>>,
}

#[derive(Debug, Subcommand)]
pub enum RolloutCommand {
    /// Move a canary cohort onto an instance (running the new Argo CD version) and
    /// watch its deployments for the bake time; rolls back by itself when their
    /// health or sync gets worse than before the move.
    Start {
        /// The instance to roll out to (it takes no other new tenants meanwhile).
        #[arg(long)]
        to: String,
        #[command(flatten)]
        cohort: CohortArgs,
        /// Only tenants of this instance (default: of every other instance).
        #[arg(long)]
        from: Option<String>,
        /// How long each wave's deployments are watched after they moved.
        #[arg(long, env = "GITOPS_ROLLOUT_BAKE", default_value = "10m", value_parser = config::parse_duration)]
        bake: std::time::Duration,
        /// Regressions tolerated per wave; one more rolls back (default: 10% of the
        /// wave's deployments, at least 1).
        #[arg(long, env = "GITOPS_ROLLOUT_MAX_REGRESSIONS")]
        max_regressions: Option<u32>,
        /// Tenants per promotion wave (default: the canary's size).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        wave_size: Option<u32>,
    },
    /// Move the source instances' remaining tenants too, in waves, each baked and
    /// checked like the canary (after the canary passed).
    Promote {
        /// The rollout's id.
        id: i64,
        /// Tenants per wave (default: as set at start).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        wave_size: Option<u32>,
    },
    /// Move every tenant the rollout moved back to where it came from.
    Abort {
        /// The rollout's id.
        id: i64,
        /// Why (shown by `rollout status`).
        #[arg(long, default_value = "no reason given")]
        reason: String,
    },
    /// Every rollout, or one with its waves, their results and its tenants.
    Status {
        /// The rollout's id.
        id: Option<i64>,
    },
}

#[derive(Debug, Args)]
pub struct QueueArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Without a subcommand: queue depth per instance and state, expired leases,
    /// completions in the last hour.
    #[command(subcommand)]
    pub command: Option<QueueCommand>,
    /// Name the session (or slot, standby, prepared transaction) holding the
    /// database's oldest snapshot once it is older than this: while it is held,
    /// nothing the queue leaves behind can be cleaned up.
    #[arg(long, env = "GITOPS_SNAPSHOT_THRESHOLD", default_value = "5m", value_parser = config::parse_duration)]
    pub snapshot_threshold: std::time::Duration,
}

#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Put a failed operation (or every failed one) back in the queue.
    Retry {
        /// Id of the failed operation.
        #[arg(required_unless_present = "all_failed", conflicts_with = "all_failed")]
        id: Option<i64>,
        /// Retry every failed operation. Deliberately not read from the
        /// environment: it is the command's object, not configuration.
        #[arg(long)]
        all_failed: bool,
    },
    /// Remove a failed operation (or every failed one) for good; its resource is
    /// reconciled again at its next change.
    Discard {
        /// Id of the failed operation.
        #[arg(required_unless_present = "all_failed", conflicts_with = "all_failed")]
        id: Option<i64>,
        /// Discard every failed operation (never read from the environment).
        #[arg(long)]
        all_failed: bool,
    },
    /// List failed operations with the operator's and the tenant's message.
    Failed {
        /// At most this many, oldest id first.
        #[arg(long, env = "GITOPS_QUEUE_FAILED_LIMIT", default_value_t = FAILED_LIMIT_DEFAULT,
              value_parser = clap::value_parser!(i64).range(1..))]
        limit: i64,
    },
}

#[derive(Debug, Args)]
pub struct SecretsArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(subcommand)]
    pub command: SecretsCommand,
}

#[derive(Debug, Subcommand)]
pub enum SecretsCommand {
    /// Re-seal every stored secret with the active key. Reads the keys from
    /// GITOPS_ENCRYPTION_KEYS and GITOPS_ENCRYPTION_ACTIVE_KEY (never from flags,
    /// which other users can see in the process list).
    Reencrypt,
    /// Print a new random key as `ID:base64key`, to append to GITOPS_ENCRYPTION_KEYS.
    GenerateKey {
        /// Key id: 1–32 characters of a-z, 0-9, '-' or '_'.
        id: String,
    },
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_database_url_may_follow_a_subcommand() {
        let cli = Cli::try_parse_from(["gitopsctl", "queue", "retry", "12", "--database-url", "postgres://h/db"])
            .expect("parses");
        let Command::Queue(args) = cli.command else { panic!("not a queue command") };
        assert_eq!(args.db.database_url.as_ref().map(|u| u.expose()), Some("postgres://h/db"));
        assert!(matches!(args.command, Some(QueueCommand::Retry { id: Some(12), all_failed: false })));
    }

    #[test]
    fn a_rollout_starts_with_exactly_one_cohort() {
        let start = |extra: &[&str]| {
            let mut args = vec!["gitopsctl", "rollout", "start", "--to", "argocd-2"];
            args.extend_from_slice(extra);
            Cli::try_parse_from(args)
        };
        assert!(start(&[]).is_err());
        assert!(start(&["--tenants", "2", "--percent", "10"]).is_err());
        assert!(start(&["--percent", "101"]).is_err());
        let cli = start(&["--namespaces", "a,b", "--bake", "5s"]).expect("parses");
        let Command::Rollout(RolloutArgs { command: RolloutCommand::Start { cohort, bake, .. }, .. }) = cli.command
        else {
            panic!("not a rollout start")
        };
        assert_eq!(cohort.namespaces, Some(vec!["a".to_owned(), "b".to_owned()]));
        assert_eq!(bake, std::time::Duration::from_secs(5));
    }

    #[test]
    fn retry_needs_exactly_one_of_id_and_all_failed() {
        assert!(Cli::try_parse_from(["gitopsctl", "queue", "retry"]).is_err());
        assert!(Cli::try_parse_from(["gitopsctl", "queue", "retry", "3", "--all-failed"]).is_err());
        assert!(Cli::try_parse_from(["gitopsctl", "queue", "retry", "--all-failed"]).is_ok());
        assert!(Cli::try_parse_from(["gitopsctl", "queue", "discard"]).is_err());
        assert!(Cli::try_parse_from(["gitopsctl", "queue", "discard", "3", "--all-failed"]).is_err());
        assert!(Cli::try_parse_from(["gitopsctl", "queue", "discard", "3"]).is_ok());
    }
}
