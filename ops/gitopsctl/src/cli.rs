//! The command line of `gitopsctl`, as clap types and nothing else, so that the
//! binary, its `--help` and the library agree on one definition. Every flag can
//! also be set from the environment variable named in its help.

use clap::{Args, Parser, Subcommand};
use gitops_shared::config;

use crate::bench::queue::QueueBenchConfig;

/// The number of failed operations `queue failed` lists unless told otherwise.
const FAILED_LIMIT_DEFAULT: i64 = 100;

#[derive(Debug, Parser)]
#[command(
    name = "gitopsctl",
    version,
    about = "Operate the GitOps service: schema, engine instances, queue, secrets, benchmarks"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
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
    /// Rotate the encryption of stored secrets.
    Secrets(SecretsArgs),
    /// Benchmarks: programs that print figures as JSON on stdout.
    Bench(BenchArgs),
    /// Write the tenant CustomResourceDefinitions, generated from the writer's
    /// Rust types, as YAML files (one per CRD).
    Crds(CrdsArgs),
    /// Run the whole service locally for development: a throwaway PostgreSQL, the
    /// Kubernetes emulator, the Argo CD stand-in, one writer and one agent. Prints
    /// `ready` when a GitOpsDeployment can be applied; stops on Ctrl-C or SIGTERM.
    Dev(DevArgs),
}

#[derive(Debug, Clone, Args)]
pub struct DevArgs {
    /// Directory for the kubeconfig, the env file and the children's logs
    /// (created if missing).
    #[arg(long, env = "GITOPS_DEV_DIR", default_value = ".gitops-dev")]
    pub dir: std::path::PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct CrdsArgs {
    /// Directory to write into (created if missing); existing files are replaced.
    #[arg(long, env = "GITOPS_CRDS_DIR", default_value = "ops/crds")]
    pub out: std::path::PathBuf,
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
    },
    /// List engine instances: namespace, capacity, tenants, age of the last heartbeat.
    List,
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
}

#[derive(Debug, Args)]
pub struct QueueArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Without a subcommand: queue depth per instance and state, expired leases,
    /// completions in the last hour.
    #[command(subcommand)]
    pub command: Option<QueueCommand>,
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

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Measure the operation queue: enqueue, drain and overlap rates and claim
    /// latency against the server's bare commit rate.
    Queue(QueueBenchArgs),
    /// Measure the Kubernetes API emulator with many Argo CD Applications:
    /// create, list (whole, paged, by label) and watch.
    Kube(KubeBenchArgs),
    /// Measure the whole service on the emulator (as `dev` runs it): GitOpsDeployments
    /// to Argo CD Applications and back to a sync status, and, with `--noisy`,
    /// quiet tenants' latency while one tenant floods updates.
    E2e(E2eBenchArgs),
}

#[derive(Debug, Clone, Args)]
pub struct E2eBenchArgs {
    /// Tenant namespaces the deployments are spread over.
    #[arg(long, env = "GITOPS_BENCH_TENANTS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub tenants: u64,
    /// GitOpsDeployments to create (at least one per tenant).
    #[arg(long, env = "GITOPS_BENCH_DEPLOYMENTS", default_value_t = 2500,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub deployments: u64,
    /// Updates one noisy tenant makes while quiet tenants' changes are timed.
    #[arg(long, env = "GITOPS_BENCH_NOISY", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub noisy: Option<u64>,
    /// Requests in flight while creating and flooding.
    #[arg(long, env = "GITOPS_BENCH_CONCURRENCY", default_value_t = 32,
          value_parser = clap::value_parser!(u64).range(1..=512))]
    pub concurrency: u64,
    /// Seconds to wait for every Application, and again for every sync status.
    #[arg(long, env = "GITOPS_BENCH_DEADLINE", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub deadline_s: u64,
    /// Run directory: kubeconfig, env file (with the run's development key) and the
    /// writer's and agent's logs (default: gitops-bench-e2e in the temp directory).
    #[arg(long, env = "GITOPS_BENCH_DIR", default_value_os_t = std::env::temp_dir().join("gitops-bench-e2e"))]
    pub dir: std::path::PathBuf,
}

impl From<E2eBenchArgs> for crate::bench::e2e::E2eBenchConfig {
    fn from(args: E2eBenchArgs) -> Self {
        // Bounded by the parsers above.
        let size = |value: u64| usize::try_from(value).unwrap_or(usize::MAX);
        crate::bench::e2e::E2eBenchConfig {
            tenants: size(args.tenants),
            deployments: size(args.deployments),
            noisy: args.noisy.map(size),
            concurrency: size(args.concurrency),
            deadline: std::time::Duration::from_secs(args.deadline_s),
            dir: args.dir,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct KubeBenchArgs {
    /// Applications to create.
    #[arg(long, env = "GITOPS_BENCH_OBJECTS", default_value_t = 25_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub objects: u64,
    /// Create requests in flight.
    #[arg(long, env = "GITOPS_BENCH_CONCURRENCY", default_value_t = 16,
          value_parser = clap::value_parser!(u64).range(1..=512))]
    pub concurrency: u64,
    /// Measure this cluster instead of a fresh in-process emulator.
    #[arg(long, env = "GITOPS_BENCH_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
}

impl From<KubeBenchArgs> for crate::bench::kube::KubeBenchConfig {
    fn from(args: KubeBenchArgs) -> Self {
        crate::bench::kube::KubeBenchConfig {
            objects: usize::try_from(args.objects).unwrap_or(25_000),
            concurrency: usize::try_from(args.concurrency).unwrap_or(16),
            kubeconfig: args.kubeconfig,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct QueueBenchArgs {
    /// Operations per measured run.
    #[arg(long, env = "GITOPS_BENCH_OPERATIONS", default_value_t = 20_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub operations: u64,
    /// Consumers (agents) draining the queue.
    #[arg(long, env = "GITOPS_BENCH_AGENTS", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(1..=64))]
    pub agents: u64,
    /// Producers (writers), each on its own connection and tenant.
    #[arg(long, env = "GITOPS_BENCH_PRODUCERS", default_value_t = 8,
          value_parser = clap::value_parser!(u64).range(1..=256))]
    pub producers: u64,
    /// Open-loop arrival rate in operations per second, over all producers. Without
    /// it, producers enqueue as fast as they can.
    #[arg(long, env = "GITOPS_BENCH_RATE", value_parser = positive_rate)]
    pub rate: Option<f64>,
    /// A PostgreSQL server to benchmark on (a scratch database is created and
    /// dropped). Without it, a throwaway durable server is started. Read from its
    /// own variable, not DATABASE_URL, so a benchmark never lands on the database a
    /// shell happens to point at.
    #[arg(long, env = "GITOPS_BENCH_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<config::DatabaseUrl>,
    /// Operations an agent claims per statement.
    #[arg(long, env = "GITOPS_BENCH_BATCH", default_value_t = 256,
          value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub batch: i64,
}

impl From<QueueBenchArgs> for QueueBenchConfig {
    fn from(args: QueueBenchArgs) -> Self {
        QueueBenchConfig {
            operations: args.operations,
            // Bounded by the parsers above.
            agents: usize::try_from(args.agents).unwrap_or(1),
            producers: usize::try_from(args.producers).unwrap_or(1),
            rate: args.rate,
            server_url: args.database_url.map(|url| url.expose().to_owned()),
            batch: args.batch,
        }
    }
}

fn positive_rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text.parse().map_err(|_| format!("{text:?} is not a number"))?;
    if rate.is_finite() && rate > 0.0 {
        Ok(rate)
    } else {
        Err("the rate must be a positive number of operations per second".to_owned())
    }
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
    fn retry_needs_exactly_one_of_id_and_all_failed() {
        assert!(Cli::try_parse_from(["gitopsctl", "queue", "retry"]).is_err());
        assert!(Cli::try_parse_from(["gitopsctl", "queue", "retry", "3", "--all-failed"]).is_err());
        assert!(Cli::try_parse_from(["gitopsctl", "queue", "retry", "--all-failed"]).is_ok());
    }

    #[test]
    fn bench_e2e_reads_tenants_deployments_and_noisy() {
        let cli = Cli::try_parse_from([
            "gitopsctl",
            "bench",
            "e2e",
            "--tenants",
            "100",
            "--deployments",
            "500",
            "--noisy",
            "5000",
        ])
        .expect("parses");
        let Command::Bench(BenchArgs { command: BenchCommand::E2e(args) }) = cli.command else {
            panic!("not bench e2e")
        };
        let config = crate::bench::e2e::E2eBenchConfig::from(args);
        assert_eq!((config.tenants, config.deployments, config.noisy), (100, 500, Some(5000)));
        assert!(Cli::try_parse_from(["gitopsctl", "bench", "e2e", "--tenants", "0"]).is_err());
    }

    #[test]
    fn rates_must_be_positive() {
        assert_eq!(positive_rate("250.5"), Ok(250.5));
        assert!(positive_rate("0").is_err());
        assert!(positive_rate("-3").is_err());
        assert!(positive_rate("inf").is_err());
        assert!(positive_rate("fast").is_err());
    }
}
