//! The `gitops-writer` binary: parses the command line, logs to stderr and runs
//! the library. Exit codes: 0 success, 1 failure, 2 usage.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use gitops_shared::telemetry::{finish_command, init_logging_as, version_line};
use gitops_writer::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    // clap prints usage errors and exits with 2 itself.
    // `--version`: the version and the Git revision this binary was built from.
    let version = version_line(env!("CARGO_PKG_VERSION"), option_env!("GITOPS_REVISION"));
    let matches = Cli::command().version(&*version.leak()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    init_logging_as(cli.log_format);
    finish_command(gitops_writer::execute(cli.command).await, |_| false)
}
