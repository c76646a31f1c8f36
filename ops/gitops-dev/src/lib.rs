//! `gitops-dev`, the developers' tool, as a library: `up` runs the whole service
//! locally on the test kit, `bench` measures the queue, the Kubernetes emulator and
//! the service end to end, under faults, through the loss of an engine instance and
//! through a long stretch of churn (memory). Every command returns what to print, so tests run the code
//! the binary runs.

pub mod bench;
pub mod cli;
pub mod heap_profile;
pub mod up;

use cli::{BenchCommand, Command};

/// What a `gitops-dev` command could not do; the source chain carries the detail.
#[derive(Debug, thiserror::Error)]
pub enum DevToolError {
    #[error("the queue benchmark failed")]
    QueueBench { source: bench::queue::BenchError },
    #[error("the Kubernetes benchmark failed")]
    KubeBench { source: bench::kube::KubeBenchError },
    #[error("the end-to-end benchmark failed")]
    E2eBench { source: bench::e2e::E2eBenchError },
    #[error("the AppStudio benchmark failed")]
    AppStudioBench { source: bench::appstudio::AppStudioBenchError },
    #[error("the chaos benchmark failed")]
    ChaosBench { source: bench::chaos::ChaosBenchError },
    #[error("the failover benchmark failed")]
    FailoverBench { source: bench::failover::FailoverBenchError },
    #[error("the soak benchmark failed")]
    SoakBench { source: bench::soak::SoakBenchError },
    #[error("the local service failed")]
    Up { source: up::DevError },
    #[error("interrupted by a signal; the benchmark's processes were stopped")]
    Interrupted,
}

/// Runs one command; returns what to print on stdout.
pub async fn run(command: Command) -> Result<String, DevToolError> {
    match command {
        Command::Bench(args) => {
            // SIGTERM or SIGINT drops the benchmark, and with it its stack: the writer
            // and agent children are killed and PostgreSQL stopped, never left behind.
            let signalled = tokio_util::sync::CancellationToken::new();
            tokio::spawn(gitops_shared::serve::cancel_on_signal(signalled.clone()));
            tokio::select! {
                result = bench(args.command) => result,
                () = signalled.cancelled() => Err(DevToolError::Interrupted),
            }
        }
        Command::Up(args) => {
            let log = args.log_file();
            up::up(&args.dir, &args.shape(), |info| {
                use std::io::Write as _;
                // The stack keeps running (and stops on SIGTERM) whoever reads this.
                let _ = write!(std::io::stdout(), "ready\n{}", info.summary(log.as_deref()));
                let _ = std::io::stdout().flush();
            })
            .await
            .map_err(|source| DevToolError::Up { source })?;
            Ok(String::new())
        }
    }
}

/// Runs one benchmark; returns its JSON.
async fn bench(command: BenchCommand) -> Result<String, DevToolError> {
    match command {
        BenchCommand::Queue(args) => {
            let report =
                bench::queue::queue_bench(&args.into()).await.map_err(|source| DevToolError::QueueBench { source })?;
            Ok(format!("{}\n", report.to_json()))
        }
        BenchCommand::Kube(args) => {
            let report =
                bench::kube::kube_bench(&args.into()).await.map_err(|source| DevToolError::KubeBench { source })?;
            Ok(format!("{}\n", serde_json::to_string(&report).unwrap_or_default()))
        }
        BenchCommand::E2e(args) => {
            let report =
                bench::e2e::e2e_bench(&args.into()).await.map_err(|source| DevToolError::E2eBench { source })?;
            Ok(format!("{}\n", serde_json::to_string(&report).unwrap_or_default()))
        }
        BenchCommand::AppStudio(args) => {
            let report = bench::appstudio::appstudio_bench(&args.into())
                .await
                .map_err(|source| DevToolError::AppStudioBench { source })?;
            Ok(format!("{}\n", serde_json::to_string(&report).unwrap_or_default()))
        }
        BenchCommand::Chaos(args) => {
            let report =
                bench::chaos::chaos_bench(&args.into()).await.map_err(|source| DevToolError::ChaosBench { source })?;
            Ok(format!("{}\n", serde_json::to_string(&report).unwrap_or_default()))
        }
        BenchCommand::Soak(args) => {
            let report =
                bench::soak::soak_bench(&args.into()).await.map_err(|source| DevToolError::SoakBench { source })?;
            Ok(format!("{}\n", serde_json::to_string(&report).unwrap_or_default()))
        }
        BenchCommand::Failover(args) => {
            let report = bench::failover::failover_bench(&args.into())
                .await
                .map_err(|source| DevToolError::FailoverBench { source })?;
            Ok(format!("{}\n", serde_json::to_string(&report).unwrap_or_default()))
        }
    }
}
