//! The `gitops-dev` binary: parses the command line, logs to stderr and runs the
//! command from the library. Exit codes: 0 success, 1 failure, 2 usage.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use gitops_dev::cli::Cli;
use gitops_shared::telemetry::{finish_command, init_logging_as, init_logging_into, version_line};

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
    // `up` is quiet unless --verbose: the emulator's and stand-in's logs go to a file.
    let log_file = match &cli.command {
        gitops_dev::cli::Command::Up(args) => args.log_file(),
        // A long soak would fill the terminal: its progress is on stderr, the rest in the run directory.
        gitops_dev::cli::Command::Bench(gitops_dev::cli::BenchArgs {
            command: gitops_dev::cli::BenchCommand::Soak(args),
        }) => {
            let _ = std::fs::create_dir_all(&args.dir);
            Some(args.dir.join("gitops-dev.log"))
        }
        _ => None,
    };
    match log_file {
        Some(path) => {
            if let Err(error) = init_logging_into(cli.log_format, &path) {
                eprintln!("could not open the log file {}: {error}", path.display());
                return ExitCode::FAILURE;
            }
        }
        None => init_logging_as(cli.log_format),
    }
    finish_command(gitops_dev::run(cli.command).await, |_| false)
}
