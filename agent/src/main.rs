//! The `gitops-agent` binary: parses the command line, logs to stderr and runs
//! the library. Exit codes: 0 success, 1 failure, 2 usage.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use gitops_agent::Cli;
use gitops_shared::telemetry::{init_logging_as, print_error_chain, version_line};

/// jemalloc: its statistics give the `process_heap_allocated_bytes` metric, and
/// it returns freed memory to the system steadily under churn.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    gitops_shared::process::heap_statistics_from_jemalloc();
    // `--version`: the version and the Git revision this binary was built from.
    let version = version_line(env!("CARGO_PKG_VERSION"), option_env!("GITOPS_REVISION"));
    let matches = Cli::command().version(&*version.leak()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    init_logging_as(cli.log_format);
    match gitops_agent::execute(cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            print_error_chain(&error);
            ExitCode::FAILURE
        }
    }
}
