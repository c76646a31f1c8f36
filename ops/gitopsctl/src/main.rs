//! The `gitopsctl` binary: parses the command line, sets up logging to stderr and
//! runs the command from the library. Exit codes: 0 success, 1 failure, 2 usage.

use std::process::ExitCode;

use clap::Parser;
use gitops_shared::telemetry::{finish_command, init_logging};
use gitopsctl::cli::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    // clap prints usage errors and exits with 2 itself.
    let cli = Cli::parse();
    init_logging();
    finish_command(gitopsctl::run(cli.command).await, gitopsctl::CtlError::is_usage)
}
