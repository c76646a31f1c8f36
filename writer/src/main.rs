//! The `gitops-writer` binary: parses the command line, logs to stderr and runs
//! the library. Exit codes: 0 success, 1 failure, 2 usage.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use gitops_shared::telemetry::{finish_command, init_logging_as, version_line};
use gitops_writer::Cli;

/// jemalloc: its statistics give the `process_heap_allocated_bytes` metric, and
/// it returns freed memory to the system steadily under churn.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    gitops_shared::process::heap_statistics_from_jemalloc();
    // clap prints usage errors and exits with 2 itself.
    // `--version`: the version and the Git revision this binary was built from.
    let version = version_line(env!("CARGO_PKG_VERSION"), option_env!("GITOPS_REVISION"));
    let matches = Cli::command().version(&*version.leak()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    init_logging_as(cli.log_format);
    finish_command(gitops_writer::execute(cli.command).await, |_| false)
}
