//! The command line of `gitops-dev`, as clap types and nothing else: `up` (the whole
//! service locally, on the test kit's throwaway PostgreSQL, Kubernetes emulator and
//! Argo CD stand-in) and `bench` (programs that print figures as JSON). It is a
//! developer's tool built on the test kit; the operators' `gitopsctl` links none of it.

use clap::{Args, Parser, Subcommand};
use gitops_shared::config;

use crate::bench::queue::QueueBenchConfig;

#[derive(Debug, Parser)]
#[command(name = "gitops-dev", version, about = "Run the GitOps service locally, and its benchmarks")]
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
    /// Run the whole service locally: a throwaway PostgreSQL, the Kubernetes emulator,
    /// the Argo CD stand-in, one writer (its admission webhook registered) and one
    /// agent, each child on free ports. Prints `ready` and a summary (kubeconfig, env
    /// file, each child's metrics/health URL and log) when a GitOpsDeployment can be
    /// applied; stops on Ctrl-C or SIGTERM. `--kubeconfig` runs against an existing
    /// cluster instead of the emulator.
    Up(UpArgs),
    /// Benchmarks: programs that print figures as JSON on stdout.
    Bench(BenchArgs),
}

#[derive(Debug, Clone, Args)]
pub struct UpArgs {
    /// Directory for the kubeconfig, the env file and the logs (created if missing;
    /// the default `.gitops-dev` is git-ignored at the top of the checkout).
    #[arg(long, env = "GITOPS_DEV_DIR", default_value = ".gitops-dev")]
    pub dir: std::path::PathBuf,
    /// Log the emulator, the stand-in and gitops-dev itself on stderr instead of
    /// into DIR/gitops-dev.log.
    #[arg(long, env = "GITOPS_DEV_VERBOSE")]
    pub verbose: bool,
    /// Run the writer, the agent (and the stand-in) against this existing cluster
    /// (kind, k3d; a cluster only you use) instead of the emulator. Its API server
    /// cannot call a webhook on this machine's loopback, so the admission webhook is
    /// not registered and home deployments are accepted unverified: anyone who may
    /// create a GitOpsDeployment there deploys with the home identity's rights. Needs
    /// --allow-unverified-home to say so.
    #[arg(long, env = "GITOPS_DEV_KUBECONFIG", requires = "allow_unverified_home")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Accept that, with --kubeconfig, deployments into a tenant's own namespace are
    /// not checked against who asked for them.
    #[arg(long, env = "GITOPS_DEV_ALLOW_UNVERIFIED_HOME", requires = "kubeconfig")]
    pub allow_unverified_home: bool,
    /// Do not run the Argo CD stand-in (nor install Argo CD's CRDs): the cluster
    /// runs a real Argo CD. Needs --kubeconfig.
    #[arg(long, env = "GITOPS_DEV_NO_STANDIN", requires = "kubeconfig")]
    pub no_standin: bool,
    /// The namespace of Argo CD's Applications (the engine instance's namespace).
    #[arg(long, env = "GITOPS_DEV_ARGOCD_NAMESPACE", default_value = crate::up::DEV_ARGOCD_NAMESPACE)]
    pub argocd_namespace: String,
    /// Engine instances, each with its Argo CD stand-in and agent: `argocd-1`
    /// (namespace `argocd`), then `argocd-2`, … (namespaces of the same names).
    #[arg(long, env = "GITOPS_DEV_INSTANCES", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=8))]
    pub instances: u16,
    /// The Argo CD version the stand-ins of every instance but the first play (the
    /// first plays the stand-in's default), so a rollout can be tried.
    #[arg(long, env = "GITOPS_DEV_NEW_VERSION", default_value = "v3.0.1")]
    pub new_version: String,
}

impl UpArgs {
    /// The stack `up` runs.
    pub fn shape(&self) -> crate::up::StackShape {
        let UpArgs {
            dir: _,
            verbose: _,
            kubeconfig,
            allow_unverified_home: _,
            no_standin,
            argocd_namespace,
            instances,
            new_version,
        } = self;
        let instances = usize::from(*instances).max(1);
        // The first instance plays the stand-in's default version, the others the new one.
        let mut versions = vec![gitops_testkit::argocd::StandinOptions::default().version];
        versions.resize(instances, new_version.clone());
        crate::up::StackShape {
            kubeconfig: kubeconfig.clone(),
            standin: !no_standin,
            argocd_namespace: Some(argocd_namespace.clone()),
            instances,
            versions,
            ..Default::default()
        }
    }

    /// Where in-process logs go: `None` on stderr (`--verbose`).
    pub fn log_file(&self) -> Option<std::path::PathBuf> {
        (!self.verbose).then(|| self.dir.join("gitops-dev.log"))
    }
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
    /// Measure the AppStudio layer: bindings of many namespaces to every component
    /// deployed, then simultaneous promotions (the benchmark plays the repository
    /// generator); with the layer's peak memory.
    #[command(name = "appstudio")]
    AppStudio(AppStudioBenchArgs),
    /// Measure the service under faults: writers and agents killed at random and
    /// PostgreSQL stopped once while tenants work; prints takeover times, how soon
    /// status is current after the database returns, convergence, and anything
    /// lost, duplicated or stale.
    Chaos(ChaosBenchArgs),
    /// Measure the loss of one of three engine instances under load: how soon it is
    /// detected, its tenants placed elsewhere and their deployments healthy again,
    /// whether two instances ever held one deployment, and the lost instance's
    /// clean-up when it comes back.
    Failover(FailoverBenchArgs),
    /// Measure memory through a long stretch of churn: tenants change and recreate
    /// deployments for M minutes while each process's memory, heap, threads and open
    /// files, the queue and the tables are sampled; then convergence is checked.
    Soak(SoakBenchArgs),
}

#[derive(Debug, Clone, Args)]
pub struct AppStudioBenchArgs {
    /// Namespaces, each with one Application.
    #[arg(long, env = "GITOPS_BENCH_NAMESPACES", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub namespaces: u64,
    /// Components of each Application.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=50))]
    pub components: u64,
    /// Environments of each namespace, each with a binding of the Application.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=20))]
    pub environments: u64,
    /// Namespaces that promote a second Snapshot into their last Environment at once.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub promotions: u64,
    /// Requests in flight while creating.
    #[arg(long, env = "GITOPS_BENCH_CONCURRENCY", default_value_t = 32,
          value_parser = clap::value_parser!(u64).range(1..=512))]
    pub concurrency: u64,
    /// Seconds to wait for every binding, and again for every promotion.
    #[arg(long, env = "GITOPS_BENCH_DEADLINE", default_value_t = 900,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub deadline_s: u64,
    /// Run directory: kubeconfig, env file and the children's logs (default:
    /// gitops-bench-appstudio in the temp directory).
    #[arg(long, env = "GITOPS_BENCH_DIR", default_value_os_t = std::env::temp_dir().join("gitops-bench-appstudio"))]
    pub dir: std::path::PathBuf,
}

impl From<AppStudioBenchArgs> for crate::bench::appstudio::AppStudioBenchConfig {
    fn from(args: AppStudioBenchArgs) -> Self {
        // Bounded by the parsers above.
        let size = |value: u64| usize::try_from(value).unwrap_or(usize::MAX);
        crate::bench::appstudio::AppStudioBenchConfig {
            namespaces: size(args.namespaces),
            components: size(args.components),
            environments: size(args.environments),
            promotions: size(args.promotions),
            concurrency: size(args.concurrency),
            deadline: std::time::Duration::from_secs(args.deadline_s),
            dir: args.dir,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct SoakBenchArgs {
    /// Minutes of churn.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=10_080))]
    pub minutes: u64,
    /// Tenant namespaces.
    #[arg(long, env = "GITOPS_BENCH_TENANTS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub tenants: u64,
    /// GitOpsDeployments per tenant.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    pub per_tenant: u64,
    /// Path changes per round.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub changes: u64,
    /// Seconds between rounds of path changes.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub change_every_s: u64,
    /// Deployments deleted (each replaced by a new one) per round.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub recreates: u64,
    /// Seconds between rounds of deletions.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub recreate_every_s: u64,
    /// The agent's sweep interval, in seconds (the memory verdict's window).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub sweep_every_s: u64,
    /// Seconds between samples.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub sample_every_s: u64,
    /// The agent's completed-operation retention, e.g. 5m (default: the agent's).
    #[arg(long, value_parser = gitops_shared::config::parse_duration)]
    pub completed_retention: Option<std::time::Duration>,
    /// Replays a run's random choices.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seconds to wait for convergence, before and after the churn.
    #[arg(long, env = "GITOPS_BENCH_DEADLINE", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub deadline_s: u64,
    /// Run directory: kubeconfig, env file and the children's logs (default:
    /// gitops-bench-soak in the temp directory).
    #[arg(long, env = "GITOPS_BENCH_DIR", default_value_os_t = std::env::temp_dir().join("gitops-bench-soak"))]
    pub dir: std::path::PathBuf,
}

impl From<SoakBenchArgs> for crate::bench::soak::SoakBenchConfig {
    fn from(args: SoakBenchArgs) -> Self {
        // Bounded by the parsers above.
        let size = |value: u64| usize::try_from(value).unwrap_or(usize::MAX);
        let secs = std::time::Duration::from_secs;
        crate::bench::soak::SoakBenchConfig {
            tenants: size(args.tenants),
            per_tenant: size(args.per_tenant),
            duration: secs(args.minutes * 60),
            changes: size(args.changes),
            change_every: secs(args.change_every_s),
            recreates: size(args.recreates),
            recreate_every: secs(args.recreate_every_s),
            sweep_every: secs(args.sweep_every_s),
            sample_every: secs(args.sample_every_s),
            completed_retention: args.completed_retention,
            seed: args.seed,
            deadline: secs(args.deadline_s),
            dir: args.dir,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct FailoverBenchArgs {
    /// Tenant namespaces the deployments are spread over.
    #[arg(long, env = "GITOPS_BENCH_TENANTS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(3..=10_000))]
    pub tenants: u64,
    /// GitOpsDeployments (at least one per tenant).
    #[arg(long, env = "GITOPS_BENCH_DEPLOYMENTS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(3..=100_000))]
    pub deployments: u64,
    /// The agents' heartbeat interval, in seconds.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub heartbeat_s: u64,
    /// Seconds without a heartbeat until an instance is lost (the database setting
    /// gitops.instance_lost_after, for this run).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..=3600))]
    pub heartbeat_timeout_s: u64,
    /// Seconds an instance stays lost before it is fenced and its tenants move (the
    /// writer's --failover-grace, for this run).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub grace_s: u64,
    /// Seconds to wait for each phase.
    #[arg(long, env = "GITOPS_BENCH_DEADLINE", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub deadline_s: u64,
    /// Run directory: kubeconfig, env file and the children's logs (default:
    /// gitops-bench-failover in the temp directory).
    #[arg(long, env = "GITOPS_BENCH_DIR", default_value_os_t = std::env::temp_dir().join("gitops-bench-failover"))]
    pub dir: std::path::PathBuf,
}

impl From<FailoverBenchArgs> for crate::bench::failover::FailoverBenchConfig {
    fn from(args: FailoverBenchArgs) -> Self {
        // Bounded by the parsers above.
        let size = |value: u64| usize::try_from(value).unwrap_or(usize::MAX);
        crate::bench::failover::FailoverBenchConfig {
            tenants: size(args.tenants),
            deployments: size(args.deployments),
            heartbeat: std::time::Duration::from_secs(args.heartbeat_s),
            heartbeat_timeout: std::time::Duration::from_secs(args.heartbeat_timeout_s),
            grace: std::time::Duration::from_secs(args.grace_s),
            deadline: std::time::Duration::from_secs(args.deadline_s),
            dir: args.dir,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct ChaosBenchArgs {
    /// Tenant namespaces the deployments are spread over.
    #[arg(long, env = "GITOPS_BENCH_TENANTS", default_value_t = 50,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub tenants: u64,
    /// GitOpsDeployments to create before the chaos (at least one per tenant).
    #[arg(long, env = "GITOPS_BENCH_DEPLOYMENTS", default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub deployments: u64,
    /// Writers run (at least two: one takes over from another).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..=16))]
    pub writers: u64,
    /// Agents run (at least two).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..=16))]
    pub agents: u64,
    /// Seconds of chaos (kills every 1.5-4 s; PostgreSQL stopped once half-way).
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u64).range(10..=86_400))]
    pub chaos_s: u64,
    /// The agents' operation lease, in seconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..=600))]
    pub agent_lease_s: u64,
    /// Applications turned Degraded in Argo CD while PostgreSQL is down.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub degraded: u64,
    /// Deployments changed at once right before each kill (so agents hold claims).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub burst: u64,
    /// Replays a run's random choices (printed on stderr and in the report).
    #[arg(long, env = "GITOPS_CHAOS_SEED")]
    pub seed: Option<u64>,
    /// Seconds to wait for convergence, before and after the chaos.
    #[arg(long, env = "GITOPS_BENCH_DEADLINE", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub deadline_s: u64,
    /// Run directory: kubeconfig, env file and the children's logs (default:
    /// gitops-bench-chaos in the temp directory).
    #[arg(long, env = "GITOPS_BENCH_DIR", default_value_os_t = std::env::temp_dir().join("gitops-bench-chaos"))]
    pub dir: std::path::PathBuf,
}

impl From<ChaosBenchArgs> for crate::bench::chaos::ChaosBenchConfig {
    fn from(args: ChaosBenchArgs) -> Self {
        // Bounded by the parsers above.
        let size = |value: u64| usize::try_from(value).unwrap_or(usize::MAX);
        crate::bench::chaos::ChaosBenchConfig {
            tenants: size(args.tenants),
            deployments: size(args.deployments),
            writers: size(args.writers),
            agents: size(args.agents),
            chaos: std::time::Duration::from_secs(args.chaos_s),
            agent_lease: std::time::Duration::from_secs(args.agent_lease_s),
            degraded: size(args.degraded),
            burst: size(args.burst),
            seed: args.seed,
            deadline: std::time::Duration::from_secs(args.deadline_s),
            dir: args.dir,
        }
    }
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
    /// Keep the least watch and list history the service works with instead of the
    /// API server's (75 s / 100 events, 5 min): the stack's RSS is then its live
    /// objects' footprint, to compare with a run at the defaults.
    #[arg(long, env = "GITOPS_BENCH_MINIMAL_HISTORY")]
    pub minimal_history: bool,
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
            minimal_history: args.minimal_history,
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
    /// Writes measured one at a time once the objects exist (cost per write and per watch event).
    #[arg(long, env = "GITOPS_BENCH_STEADY_WRITES", default_value_t = 2_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub steady_writes: u64,
}

impl From<KubeBenchArgs> for crate::bench::kube::KubeBenchConfig {
    fn from(args: KubeBenchArgs) -> Self {
        crate::bench::kube::KubeBenchConfig {
            objects: usize::try_from(args.objects).unwrap_or(25_000),
            concurrency: usize::try_from(args.concurrency).unwrap_or(16),
            kubeconfig: args.kubeconfig,
            steady_writes: usize::try_from(args.steady_writes).unwrap_or(2_000),
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
    /// Measure drain, overlap and half load again while a REPEATABLE READ
    /// transaction (which first runs every `sql/inspect/` query) is held open in the
    /// benchmark's database, then how soon the drain recovers after it ends.
    #[arg(long, env = "GITOPS_BENCH_HOLD_SNAPSHOT", conflicts_with = "rate")]
    pub hold_snapshot: bool,
    /// Operations pushed through the queue while the snapshot is held, before the
    /// held figures are measured.
    #[arg(long, env = "GITOPS_BENCH_PRELOAD", default_value_t = 200_000, requires = "hold_snapshot",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub preload: u64,
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
            hold_snapshot: args.hold_snapshot,
            preload: args.preload,
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
    fn bench_e2e_reads_tenants_deployments_and_noisy() {
        let cli = Cli::try_parse_from([
            "gitops-dev",
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
        assert!(Cli::try_parse_from(["gitops-dev", "bench", "e2e", "--tenants", "0"]).is_err());
    }

    #[test]
    fn an_existing_cluster_needs_unverified_home_deployments_accepted_by_name() {
        let refused = Cli::try_parse_from(["gitops-dev", "up", "--kubeconfig", "kc"]).expect_err("needs the flag");
        assert!(refused.to_string().contains("--allow-unverified-home"), "{refused}");
        let cli =
            Cli::try_parse_from(["gitops-dev", "up", "--kubeconfig", "kc", "--allow-unverified-home"]).expect("parses");
        let Command::Up(args) = cli.command else { panic!("not up") };
        assert_eq!(args.shape().kubeconfig.as_deref(), Some(std::path::Path::new("kc")));
        assert!(Cli::try_parse_from(["gitops-dev", "up", "--allow-unverified-home"]).is_err(), "only with a cluster");
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
