//! The `gitops-writer` binary: parses the command line, logs to stderr and runs
//! the library. Exit codes: 0 success, 1 failure, 2 usage.

use std::process::ExitCode;

use clap::Parser;
use gitops_shared::telemetry::{finish_command, init_logging};
use gitops_writer::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    // clap prints usage errors and exits with 2 itself.
    let cli = Cli::parse();
    init_logging();
    finish_command(gitops_writer::execute(cli.command).await, |_| false)
}
