//! The `gitops-appstudio` binary: parses the command line, logs to stderr and runs
//! the library. Exit codes: 0 success, 1 failure, 2 usage.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use gitops_appstudio::cli::Cli;
use gitops_shared::telemetry::{finish_command, init_logging_as, version_line};

/// jemalloc, as the writer and the agent: its statistics give the
/// `process_heap_allocated_bytes` metric, and it returns freed memory to the system
/// steadily (the C library's allocator kept the layer's watch churn resident and
/// spent a quarter of its CPU time in malloc and free).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    gitops_shared::process::heap_statistics_from_jemalloc();
    let version = version_line(env!("CARGO_PKG_VERSION"), option_env!("GITOPS_REVISION"));
    let matches = Cli::command().version(&*version.leak()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    init_logging_as(cli.log_format);
    finish_command(gitops_appstudio::cli::execute(cli.command).await, |_| false)
}
